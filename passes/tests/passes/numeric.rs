//! The decompose pass end to end: a small model (params, a `cond` region, a loss) gives the
//! same numbers on the reference backend before and after `decompose, dce`.
//! Tolerance: |a - b| ≤ 1e-5 · (|b| + max|b|) per element (f32; the decomposition rounds
//! after every primitive, the native composites once).

use oar_backend_reference::run_graph;
use oar_ir::ops::Reduction;
use oar_ir::ops::{CrossEntropy, Gelu, LayerNorm, Softmax};
use oar_ir::{Composite, DType, Dim, Float, Graph, Op, TensorData, TensorType, ValueId, Weights};
use oar_passes::{Dce, Decompose, PassManager};
use std::collections::BTreeMap;

fn f32t(d: &[usize]) -> TensorType {
    TensorType::of(DType::F32, d)
}

fn comp(g: &mut Graph, c: Composite, ins: &[ValueId]) -> ValueId {
    g.add_op1(Op::Composite(c), ins).unwrap()
}

/// `cond(p, h)` applying `then` or `else_` to `h`.
fn branch(g: &mut Graph, p: ValueId, h: ValueId, then: Composite, else_: Composite) -> ValueId {
    let ty = g.value_type(h).clone();
    let region = |c: Composite| {
        let mut r = Graph::new("branch");
        let a = r.add_input("a", ty.clone()).unwrap();
        let y = r.add_op1(Op::Composite(c), &[a]).unwrap();
        r.add_output("y", y).unwrap();
        r
    };
    g.add_region_op(Op::Cond, &[p, h], vec![region(then), region(else_)])
        .unwrap()[0]
}

fn model() -> Graph {
    let mut g = Graph::new("model");
    let n = Dim::sym("N");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![n.clone(), Dim::Static(4)]))
        .unwrap();
    let labels = g.add_input("labels", TensorType::new(DType::I64, vec![n])).unwrap();
    let p = g.add_input("p", TensorType::of(DType::Bool, &[])).unwrap();
    let w1 = g.add_param("fc1.weight", f32t(&[4, 8])).unwrap();
    let b1 = g.add_param("fc1.bias", f32t(&[8])).unwrap();
    let lw = g.add_param("ln.weight", f32t(&[8])).unwrap();
    let lb = g.add_param("ln.bias", f32t(&[8])).unwrap();
    let w2 = g.add_param("fc2.weight", f32t(&[8, 3])).unwrap();
    let h = comp(&mut g, Composite::Linear, &[x, w1, b1]);
    let ln = Composite::LayerNorm(LayerNorm {
        normalized_ndim: 1,
        epsilon: Float(1e-5),
    });
    let h = comp(&mut g, ln, &[h, lw, lb]);
    let h = branch(
        &mut g,
        p,
        h,
        Composite::Gelu(Gelu { approximate: false }),
        Composite::Silu,
    );
    let logits = comp(&mut g, Composite::Linear, &[h, w2]);
    let probs = comp(&mut g, Composite::Softmax(Softmax { axis: 1 }), &[logits]);
    let ce = Composite::CrossEntropy(CrossEntropy {
        reduction: Reduction::Mean,
    });
    let loss = comp(&mut g, ce, &[logits, labels]);
    g.add_output("probs", probs).unwrap();
    g.add_output("loss", loss).unwrap();
    g
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

#[test]
fn decomposed_model_computes_the_same() {
    let g = model();
    let mut d = g.clone();
    let mut pm = PassManager::new();
    pm.add(Decompose::all()).add(Dce).verify_each(true);
    let report = pm.run(&mut d).unwrap();
    assert!(report.changed());
    assert!(d.node_ids().all(|n| {
        d.node(n).op.is_primitive()
            && d.node(n)
                .regions
                .iter()
                .all(|r| r.node_ids().all(|m| r.node(m).op.is_primitive()))
    }));
    let mut weights = Weights::new();
    for (i, (name, v)) in g.params().into_iter().enumerate() {
        let shape = g.value_type(v).shape.as_static().unwrap();
        let n = shape.iter().product();
        weights.insert(name, TensorData::from_vec(shape, values(n, 11 + i as u64)).unwrap());
    }
    for take_then in [true, false] {
        let mut inputs = BTreeMap::new();
        inputs.insert(
            "x".to_string(),
            TensorData::from_vec(vec![5, 4], values(20, 3)).unwrap(),
        );
        inputs.insert(
            "labels".to_string(),
            TensorData::from_vec(vec![5], vec![0i64, 2, 1, 1, 0]).unwrap(),
        );
        inputs.insert(
            "p".to_string(),
            TensorData::from_f64_slice(DType::Bool, vec![], &[f64::from(take_then)]).unwrap(),
        );
        let native = run_graph(&g, &weights, &inputs).unwrap();
        let dec = run_graph(&d, &weights, &inputs).unwrap();
        for ((name, a), (_, b)) in native.iter().zip(&dec) {
            assert_eq!(a.tensor_type(), b.tensor_type(), "{name}");
            let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
            let scale = a.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 1e-5 * (x.abs() + scale),
                    "{name} then={take_then}: {x} vs {y}"
                );
            }
        }
    }
}
