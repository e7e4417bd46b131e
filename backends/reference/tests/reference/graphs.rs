//! Whole-graph behaviour: the Backend trait, symbolic dims, generators, weights, and the
//! errors for bad inputs and hostile shapes.

use crate::common::*;
use oar_backend_reference::{ReferenceBackend, run_graph};
use oar_ir::ops::random_stream::{standard_normal, uniform};
use oar_ir::ops::{ArgReduce, Broadcast, Iota, Random, Reduce, Softmax};
use oar_ir::ops::{RandomDist, ReduceOp};
use oar_ir::{Backend, BackendError, DType, Dim, Float, Graph, Op, TensorType, Weights};
use std::collections::BTreeMap;

fn sym_graph() -> Graph {
    // x[N, 3] → (sum over axis 1, iota over [N], x + w)
    let mut g = Graph::new("sym");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(3)]))
        .unwrap();
    let s = g
        .add_op1(
            Op::Reduce(Reduce {
                op: ReduceOp::Sum,
                axes: vec![1],
                keepdim: false,
            }),
            &[x],
        )
        .unwrap();
    let i = g
        .add_op1(
            Op::Iota(Iota {
                shape: vec![Dim::sym("N")],
                axis: 0,
                dtype: DType::I32,
            }),
            &[],
        )
        .unwrap();
    let w = g.add_param("w", ty(DType::F32, &[3])).unwrap();
    let y = g.binary(oar_ir::ops::BinaryOp::Add, x, w).unwrap();
    g.add_output("s", s).unwrap();
    g.add_output("i", i).unwrap();
    g.add_output("y", y).unwrap();
    g
}

fn weights() -> Weights {
    [("w".to_string(), f32s(&[3], &[1.0, 2.0, 3.0]))].into()
}

#[test]
fn backend_trait_compiles_and_runs_symbolic_shapes() {
    let b = ReferenceBackend::new();
    assert_eq!(b.name(), "reference");
    let exe = b.compile(&sym_graph(), &weights()).unwrap();
    for n in [1usize, 4] {
        let x = f32s(&[n, 3], &vec![1.0; 3 * n]);
        let out = exe.run(&[("x".to_string(), x)].into()).unwrap();
        assert_eq!(out.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["s", "i", "y"]);
        assert_close(&out[0].1, &[n], &vec![3.0; n], 0.0);
        assert_exact(
            &out[1].1,
            DType::I32,
            &[n],
            &(0..n).map(|v| v as f64).collect::<Vec<_>>(),
        );
        assert_close(&out[2].1, &[n, 3], &[2.0, 3.0, 4.0].repeat(n), 0.0);
    }
}

#[test]
fn bad_inputs_and_weights_are_typed_errors() {
    let g = sym_graph();
    let w = weights();
    let e = run(&g, &w, &[]).unwrap_err();
    assert!(
        matches!(e, BackendError::MissingInput { ref name, .. } if name == "x"),
        "{e}"
    );
    let e = run(&g, &w, &[("x", f32s(&[2, 4], &[0.0; 8]))]).unwrap_err();
    assert!(
        matches!(e, BackendError::InputMismatch { ref name, .. } if name == "x"),
        "{e}"
    );
    let e = run(&g, &w, &[("x", tensor(DType::F64, &[2, 3], &[0.0; 6]))]).unwrap_err();
    assert!(matches!(e, BackendError::InputMismatch { .. }), "{e}");
    let e = run(&g, &w, &[("x", f32s(&[1, 3], &[0.0; 3])), ("z", f32s(&[1], &[0.0]))]).unwrap_err();
    assert!(matches!(e, BackendError::UnknownInput { .. }), "{e}");
    let e = run(&g, &Weights::new(), &[("x", f32s(&[1, 3], &[0.0; 3]))]).unwrap_err();
    assert!(matches!(e, BackendError::Weight { ref name, .. } if name == "w"), "{e}");
    let bad: Weights = [("w".to_string(), f32s(&[4], &[0.0; 4]))].into();
    let e = run(&g, &bad, &[("x", f32s(&[1, 3], &[0.0; 3]))]).unwrap_err();
    assert!(matches!(e, BackendError::Weight { .. }), "{e}");
    let e = ReferenceBackend
        .compile(&g, &bad)
        .err()
        .expect("weight mismatch at compile time");
    assert!(matches!(e, BackendError::Weight { .. }), "{e}");
}

#[test]
fn unbound_symbols_and_huge_shapes_are_refused() {
    let mut g = Graph::new("t");
    let r = g
        .add_op1(
            Op::Random(Random {
                dist: RandomDist::Uniform {
                    low: Float(0.0),
                    high: Float(1.0),
                },
                shape: vec![Dim::sym("M")],
                dtype: DType::F32,
                seed: 1,
            }),
            &[],
        )
        .unwrap();
    g.add_output("r", r).unwrap();
    let e = run(&g, &Weights::new(), &[]).unwrap_err().to_string();
    assert!(e.contains("random") && e.contains("`M`") && e.contains("%0"), "{e}");

    let huge = 1usize << 40;
    let mut g = Graph::new("t");
    let i = g
        .add_op1(
            Op::Iota(Iota {
                shape: vec![Dim::Static(huge), Dim::Static(huge)],
                axis: 0,
                dtype: DType::I64,
            }),
            &[],
        )
        .unwrap();
    g.add_output("i", i).unwrap();
    let e = run(&g, &Weights::new(), &[]).unwrap_err().to_string();
    assert!(e.contains("iota") && e.contains("too large"), "{e}");

    let mut g = Graph::new("t");
    let x = g.add_input("x", ty(DType::F32, &[1])).unwrap();
    let b = g
        .add_op1(
            Op::Broadcast(Broadcast {
                shape: vec![Dim::Static(1 << 20), Dim::Static(1 << 20)],
            }),
            &[x],
        )
        .unwrap();
    g.add_output("b", b).unwrap();
    let e = run(&g, &Weights::new(), &[("x", f32s(&[1], &[1.0]))])
        .unwrap_err()
        .to_string();
    assert!(e.contains("broadcast") && e.contains("too large"), "{e}");
}

#[test]
fn invalid_graphs_are_rejected_before_running() {
    // Each graph is fine alone, but the param `w` has two types across the graph and its
    // region: the verifier (run by run_graph and compile) rejects it.
    let t = ty(DType::F32, &[2]);
    let mut then = Graph::new("then");
    let a = then.add_input("a", t.clone()).unwrap();
    let w2 = then.add_param("w", ty(DType::F32, &[2])).unwrap();
    let s = then.binary(oar_ir::ops::BinaryOp::Add, a, w2).unwrap();
    then.add_output("r", s).unwrap();
    let mut els = Graph::new("else");
    let b = els.add_input("a", t.clone()).unwrap();
    els.add_output("r", b).unwrap();
    let mut g = Graph::new("main");
    let p = g.add_input("p", ty(DType::Bool, &[])).unwrap();
    let x = g.add_input("x", t).unwrap();
    let w3 = g.add_param("w", ty(DType::F32, &[3])).unwrap();
    let y = g.add_region_op(Op::Cond, &[p, x], vec![then, els]).unwrap();
    g.add_output("y", y[0]).unwrap();
    g.add_output("w", w3).unwrap();
    let feed = [("p", bools(&[], &[false])), ("x", f32s(&[2], &[1.0, 2.0]))];
    let e = run(&g, &weights(), &feed).unwrap_err();
    assert!(
        matches!(e, BackendError::Graph(oar_ir::IrError::ParamConflict { .. })),
        "{e}"
    );
    assert!(matches!(
        ReferenceBackend.compile(&g, &weights()),
        Err(BackendError::Graph(_))
    ));
}

#[test]
fn iota_and_random_follow_the_documented_algorithm() {
    let i = op1(
        Op::Iota(Iota {
            shape: vec![Dim::Static(2), Dim::Static(3)],
            axis: 1,
            dtype: DType::F32,
        }),
        &[],
    );
    assert_close(&i, &[2, 3], &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0], 0.0);
    let j = op1(
        Op::Iota(Iota {
            shape: vec![Dim::Static(2), Dim::Static(2)],
            axis: 0,
            dtype: DType::I64,
        }),
        &[],
    );
    assert_exact(&j, DType::I64, &[2, 2], &[0.0, 0.0, 1.0, 1.0]);
    let rnd = |dist, shape: &[usize], dtype, seed| {
        op1(
            Op::Random(Random {
                dist,
                shape: shape.iter().map(|&d| Dim::Static(d)).collect(),
                dtype,
                seed,
            }),
            &[],
        )
    };
    let uni = RandomDist::Uniform {
        low: Float(-2.0),
        high: Float(3.0),
    };
    let u = rnd(uni, &[4, 5], DType::F32, 9);
    let want: Vec<f64> = (0..20).map(|k| (-2.0 + 5.0 * uniform(9, k)) as f32 as f64).collect();
    assert_close(&u, &[4, 5], &want, 0.0);
    // Element i depends only on (seed, i): a smaller shape is a prefix.
    let prefix = rnd(uni, &[7], DType::F32, 9);
    assert_close(&prefix, &[7], &want[..7], 0.0);
    let norm = RandomDist::Normal {
        mean: Float(1.0),
        std: Float(0.5),
    };
    let nrm = rnd(norm, &[6], DType::F64, 3);
    let want: Vec<f64> = (0..6).map(|k| 1.0 + 0.5 * standard_normal(3, k)).collect();
    assert_close(&nrm, &[6], &want, 0.0);
    assert_ne!(rnd(uni, &[4], DType::F32, 1), rnd(uni, &[4], DType::F32, 2));
}

#[test]
fn outputs_follow_graph_order_and_names() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty(DType::F32, &[1])).unwrap();
    let y = g.unary(oar_ir::ops::UnaryOp::Neg, x).unwrap();
    g.add_output("second", y).unwrap();
    g.add_output("first", x).unwrap();
    let out = run_graph(
        &g,
        &Weights::new(),
        &BTreeMap::from([("x".to_string(), f32s(&[1], &[2.0]))]),
    )
    .unwrap();
    assert_eq!(out[0].0, "second");
    assert_eq!(out[1].0, "first");
    assert_eq!(out[0].1, f32s(&[1], &[-2.0]));
}

#[test]
fn zero_sized_symbolic_dims_give_errors_or_empty_results() {
    use oar_ir::ops::ArgReduceOp;
    let mut g = Graph::new("t");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(3)]))
        .unwrap();
    let sm = g
        .add_op1(Op::Composite(oar_ir::Composite::Softmax(Softmax { axis: 0 })), &[x])
        .unwrap();
    let am = g
        .add_op1(
            Op::ArgReduce(ArgReduce {
                op: ArgReduceOp::ArgMax,
                axis: 0,
                keepdim: false,
            }),
            &[x],
        )
        .unwrap();
    g.add_output("sm", sm).unwrap();
    g.add_output("am", am).unwrap();
    let e = run(&g, &Weights::new(), &[("x", f32s(&[0, 3], &[]))])
        .unwrap_err()
        .to_string();
    assert!(e.contains("argmax") && e.contains("empty"), "{e}");
    let ok = run(&g, &Weights::new(), &[("x", f32s(&[2, 3], &[0.0; 6]))]).unwrap();
    assert_close(&ok[0], &[2, 3], &[0.5; 6], 0.0);
    assert_exact(&ok[1], DType::I64, &[3], &[0.0; 3]);
}
