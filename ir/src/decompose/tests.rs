//! Structural tests of the decompositions: every composite expands into primitives of the
//! composite's exact output types, and bad operands get the composite's own type error.
//! (Numerical agreement with the native ops is tested against the reference backend.)

use super::*;
use crate::ops::Reduction;
use crate::ops::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm, Conv2d, CrossEntropy, Dropout, Gelu, LayerNorm,
    LogSoftmax, MaxPool2d, ScaledDotProductAttention, Softmax,
};
use crate::{DType, Dim, Float, Graph, Shape, TensorType};

fn f32t(d: &[usize]) -> TensorType {
    TensorType::of(DType::F32, d)
}

fn nsym(rest: &[usize]) -> TensorType {
    let mut d = vec![Dim::sym("N")];
    d.extend(rest.iter().map(|&n| Dim::Static(n)));
    TensorType::new(DType::F32, d)
}

/// Decompose `op` on fresh inputs of `types`; check types, primitiveness, and that the graph
/// with the decomposition as outputs verifies.
fn check(op: Composite, types: &[TensorType]) -> Graph {
    let mut g = Graph::new("t");
    let ins: Vec<_> = types
        .iter()
        .enumerate()
        .map(|(i, t)| g.add_input(&format!("x{i}"), t.clone()).unwrap())
        .collect();
    let want = infer_types(&Op::Composite(op.clone()), types, &[]).unwrap();
    let outs = decompose(&op, &mut g, &ins).unwrap_or_else(|e| panic!("{}: {e}", op.name()));
    let got: Vec<_> = outs.iter().map(|v| g.value_type(*v).clone()).collect();
    assert_eq!(got, want, "{}", op.name());
    for (i, v) in outs.iter().enumerate() {
        g.add_output(&format!("y{i}"), *v).unwrap();
    }
    crate::verify(&g).unwrap();
    assert!(g.node_ids().all(|n| g.node(n).op.is_primitive()), "{}", op.name());
    g
}

#[test]
fn every_composite_decomposes_to_its_types() {
    check(Composite::Linear, &[nsym(&[4]), f32t(&[4, 3]), f32t(&[3])]);
    check(Composite::Linear, &[f32t(&[4]), f32t(&[4, 3])]);
    let conv = Composite::Conv2d(Conv2d {
        stride: [2, 1],
        padding: [1, 0, 1, 2],
        dilation: [1, 2],
        groups: 2,
    });
    check(conv, &[nsym(&[4, 7, 7]), f32t(&[6, 2, 3, 3]), f32t(&[6])]);
    for ceil_mode in [false, true] {
        let mp = Composite::MaxPool2d(MaxPool2d {
            kernel: [3, 2],
            stride: [2, 2],
            padding: [1, 0, 1, 1],
            ceil_mode,
        });
        check(mp.clone(), &[nsym(&[2, 8, 7])]);
        check(mp.clone(), &[TensorType::of(DType::I32, &[1, 2, 8, 7])]);
        check(mp, &[TensorType::of(DType::Bool, &[1, 2, 8, 7])]);
        for count_include_pad in [false, true] {
            let ap = Composite::AvgPool2d(AvgPool2d {
                kernel: [3, 3],
                stride: [2, 2],
                padding: [1, 1, 1, 1],
                ceil_mode,
                count_include_pad,
            });
            check(ap, &[nsym(&[2, 8, 7])]);
        }
    }
    for output_size in [[2, 3], [3, 5], [1, 1], [8, 7]] {
        check(
            Composite::AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size }),
            &[nsym(&[2, 6, 7])],
        );
        check(
            Composite::AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size }),
            &[nsym(&[2, 6, 7])],
        );
    }
    check(
        Composite::AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size: [2, 2] }),
        &[TensorType::of(DType::Bool, &[1, 1, 5, 5])],
    );
    for training in [false, true] {
        let bn = Composite::BatchNorm(BatchNorm {
            epsilon: Float(1e-5),
            momentum: Float(0.9),
            training,
        });
        let c = f32t(&[3]);
        let g = check(
            bn.clone(),
            &[nsym(&[3, 4, 4]), c.clone(), c.clone(), c.clone(), c.clone()],
        );
        assert_eq!(g.outputs().len(), if training { 3 } else { 1 });
        check(bn, &[nsym(&[3]), c.clone(), c.clone(), c.clone(), c]);
    }
    let ln = Composite::LayerNorm(LayerNorm {
        normalized_ndim: 2,
        epsilon: Float(1e-5),
    });
    check(ln.clone(), &[nsym(&[3, 4])]);
    check(ln, &[nsym(&[3, 4]), f32t(&[3, 4]), f32t(&[3, 4])]);
    check(Composite::Softmax(Softmax { axis: 1 }), &[nsym(&[5])]);
    check(Composite::LogSoftmax(LogSoftmax { axis: 0 }), &[nsym(&[5])]);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let labels = TensorType::new(DType::I32, vec![Dim::sym("N")]);
        check(
            Composite::CrossEntropy(CrossEntropy { reduction }),
            &[nsym(&[5]), labels],
        );
    }
    check(Composite::Relu, &[TensorType::of(DType::I32, &[3])]);
    check(Composite::Gelu(Gelu { approximate: true }), &[nsym(&[3])]);
    check(Composite::Gelu(Gelu { approximate: false }), &[nsym(&[3])]);
    check(Composite::Silu, &[nsym(&[3])]);
    check(Composite::Sigmoid, &[TensorType::of(DType::F16, &[3])]);
    for training in [false, true] {
        let d = Composite::Dropout(Dropout {
            p: Float(0.25),
            training,
            seed: 7,
        });
        check(d, &[nsym(&[3])]);
    }
    check(
        Composite::Embedding,
        &[
            TensorType::new(DType::I64, vec![Dim::sym("N"), Dim::Static(2)]),
            f32t(&[10, 4]),
        ],
    );
    for causal in [false, true] {
        let sdpa = Composite::ScaledDotProductAttention(ScaledDotProductAttention { causal, scale: None });
        let (q, k, v) = (nsym(&[2, 3, 4]), nsym(&[2, 5, 4]), nsym(&[2, 5, 6]));
        check(sdpa.clone(), &[q.clone(), k.clone(), v.clone()]);
        check(
            sdpa.clone(),
            &[q.clone(), k.clone(), v.clone(), TensorType::of(DType::Bool, &[3, 5])],
        );
        check(sdpa, &[q, k, v, f32t(&[1, 3, 5])]);
    }
}

#[test]
fn symbolic_head_dim_gets_a_runtime_scale() {
    let t = |d: &str| TensorType::new(DType::F32, vec![Dim::Static(3), Dim::sym(d)]);
    let sdpa = Composite::ScaledDotProductAttention(ScaledDotProductAttention {
        causal: true,
        scale: None,
    });
    let g = check(sdpa, &[t("E"), t("E"), t("E")]);
    assert!(g.node_ids().any(|n| matches!(g.node(n).op, Op::Broadcast(_))));
}

#[test]
fn dropout_in_inference_is_the_input_itself() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", f32t(&[4])).unwrap();
    let d = Composite::Dropout(Dropout {
        p: Float(0.5),
        training: false,
        seed: 1,
    });
    assert_eq!(decompose(&d, &mut g, &[x]).unwrap(), vec![x]);
    assert_eq!(g.node_count(), 1);
}

#[test]
fn bad_operands_get_the_composites_type_error() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", f32t(&[2, 4])).unwrap();
    let w = g.add_input("w", f32t(&[5, 3])).unwrap();
    let e = decompose(&Composite::Linear, &mut g, &[x, w]).unwrap_err().to_string();
    assert!(
        e.contains("linear") && e.contains("f32[2,4]") && e.contains("f32[5,3]"),
        "{e}"
    );
    let i = g.add_input("i", TensorType::new(DType::I32, Shape::of(&[2]))).unwrap();
    let e = decompose(&Composite::Softmax(Softmax { axis: 0 }), &mut g, &[i])
        .unwrap_err()
        .to_string();
    assert!(e.contains("softmax") && e.contains("i32[2]"), "{e}");
    let e = decompose(&Composite::Softmax(Softmax { axis: 3 }), &mut g, &[x])
        .unwrap_err()
        .to_string();
    assert!(e.contains("axis 3"), "{e}");
    assert_eq!(g.node_count(), 3, "a failed decomposition adds nothing");
}

#[test]
fn composite_names_match_the_ops() {
    let ops = [
        Composite::Linear,
        Composite::Relu,
        Composite::Silu,
        Composite::Sigmoid,
        Composite::Embedding,
        Composite::Softmax(Softmax { axis: 0 }),
        Composite::ScaledDotProductAttention(ScaledDotProductAttention {
            causal: false,
            scale: None,
        }),
    ];
    for op in ops {
        assert!(composite_names().contains(&op.name()), "{}", op.name());
    }
    // Every composite that declares samples is listed, and no name is listed twice.
    for s in Composite::all_samples() {
        assert!(composite_names().contains(&s.op.name()), "{}", s.name);
    }
    let mut names = composite_names().to_vec();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), composite_names().len(), "duplicate composite names");
}
