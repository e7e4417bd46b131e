//! Control flow: cond and while (sum, Collatz), and the while iteration cap.

use crate::common::*;
use oar_backend_reference::{RunOptions, run_graph_with};
use oar_ir::ops::BinaryOp;
use oar_ir::{DType, Graph, Op, TensorType, ValueId, Weights};
use std::collections::BTreeMap;

fn scalar(dtype: DType) -> TensorType {
    ty(dtype, &[])
}

/// A region taking `types` and returning what `body` builds from its arguments.
fn region(name: &str, types: &[TensorType], body: impl FnOnce(&mut Graph, &[ValueId]) -> Vec<ValueId>) -> Graph {
    let mut g = Graph::new(name);
    let args: Vec<ValueId> = types
        .iter()
        .enumerate()
        .map(|(i, t)| g.add_input(&format!("a{i}"), t.clone()).unwrap())
        .collect();
    for (i, v) in body(&mut g, &args).into_iter().enumerate() {
        g.add_output(&format!("r{i}"), v).unwrap();
    }
    g
}

#[test]
fn cond_picks_a_branch() {
    let t = ty(DType::F32, &[2]);
    let then = region("then", std::slice::from_ref(&t), |g, a| {
        let two = g.add_scalar(DType::F32, 2.0);
        vec![g.binary(BinaryOp::Mul, a[0], two).unwrap()]
    });
    let els = region("else", std::slice::from_ref(&t), |g, a| {
        let one = g.add_scalar(DType::F32, 1.0);
        vec![g.binary(BinaryOp::Sub, a[0], one).unwrap()]
    });
    let mut g = Graph::new("main");
    let p = g.add_input("p", scalar(DType::Bool)).unwrap();
    let x = g.add_input("x", t).unwrap();
    let y = g.add_region_op(Op::Cond, &[p, x], vec![then, els]).unwrap();
    g.add_output("y", y[0]).unwrap();
    let xs = f32s(&[2], &[3.0, -1.0]);
    let yes = run(&g, &Weights::new(), &[("p", bools(&[], &[true])), ("x", xs.clone())]).unwrap();
    assert_close(&yes[0], &[2], &[6.0, -2.0], 0.0);
    let no = run(&g, &Weights::new(), &[("p", bools(&[], &[false])), ("x", xs)]).unwrap();
    assert_close(&no[0], &[2], &[2.0, -2.0], 0.0);
}

/// `while i < n: (i, acc) = (i + 1, acc + i)`.
fn sum_loop() -> Graph {
    let ts = [scalar(DType::I64), scalar(DType::I64), scalar(DType::I64)];
    let cond = region("cond", &ts, |g, a| vec![g.binary(BinaryOp::Lt, a[0], a[2]).unwrap()]);
    let body = region("body", &ts, |g, a| {
        let one = g.add_scalar(DType::I64, 1.0);
        vec![
            g.binary(BinaryOp::Add, a[0], one).unwrap(),
            g.binary(BinaryOp::Add, a[1], a[0]).unwrap(),
            a[2],
        ]
    });
    let mut g = Graph::new("main");
    let n = g.add_input("n", scalar(DType::I64)).unwrap();
    let zero = g.add_scalar(DType::I64, 0.0);
    let outs = g.add_region_op(Op::While, &[zero, zero, n], vec![cond, body]).unwrap();
    g.add_output("i", outs[0]).unwrap();
    g.add_output("acc", outs[1]).unwrap();
    g
}

#[test]
fn while_sums_and_respects_the_cap() {
    let g = sum_loop();
    let out = run(&g, &Weights::new(), &[("n", i64s(&[], &[10]))]).unwrap();
    assert_exact(&out[0], DType::I64, &[], &[10.0]);
    assert_exact(&out[1], DType::I64, &[], &[45.0]);
    // Zero iterations: the initial values come back.
    let none = run(&g, &Weights::new(), &[("n", i64s(&[], &[0]))]).unwrap();
    assert_exact(&none[1], DType::I64, &[], &[0.0]);
    let feed: BTreeMap<String, _> = [("n".to_string(), i64s(&[], &[1000]))].into();
    let opts = RunOptions {
        max_while_iterations: 100,
    };
    let e = run_graph_with(&g, &Weights::new(), &feed, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("while") && e.contains("exceeded 100"), "{e}");
    let ok = run_graph_with(
        &g,
        &Weights::new(),
        &[("n".to_string(), i64s(&[], &[100]))].into(),
        &opts,
    )
    .unwrap();
    assert_exact(&ok[1].1, DType::I64, &[], &[4950.0]);
}

#[test]
fn while_runs_collatz() {
    // steps until n == 1; n = n/2 if even else 3n + 1. Collatz(27) takes 111 steps.
    let ts = [scalar(DType::I64), scalar(DType::I64)];
    let cond = region("cond", &ts, |g, a| {
        let one = g.add_scalar(DType::I64, 1.0);
        vec![g.binary(BinaryOp::Ne, a[0], one).unwrap()]
    });
    let body = region("body", &ts, |g, a| {
        let (one, two, three, zero) = (
            g.add_scalar(DType::I64, 1.0),
            g.add_scalar(DType::I64, 2.0),
            g.add_scalar(DType::I64, 3.0),
            g.add_scalar(DType::I64, 0.0),
        );
        let r = g.binary(BinaryOp::Rem, a[0], two).unwrap();
        let even = g.binary(BinaryOp::Eq, r, zero).unwrap();
        let half = g.binary(BinaryOp::Div, a[0], two).unwrap();
        let t = g.binary(BinaryOp::Mul, a[0], three).unwrap();
        let odd = g.binary(BinaryOp::Add, t, one).unwrap();
        let next = g.add_op1(Op::Where, &[even, half, odd]).unwrap();
        vec![next, g.binary(BinaryOp::Add, a[1], one).unwrap()]
    });
    let mut g = Graph::new("main");
    let n = g.add_input("n", scalar(DType::I64)).unwrap();
    let zero = g.add_scalar(DType::I64, 0.0);
    let outs = g.add_region_op(Op::While, &[n, zero], vec![cond, body]).unwrap();
    g.add_output("steps", outs[1]).unwrap();
    let out = run(&g, &Weights::new(), &[("n", i64s(&[], &[27]))]).unwrap();
    assert_exact(&out[0], DType::I64, &[], &[111.0]);
}

#[test]
fn regions_read_params_from_the_weights() {
    let t = ty(DType::F32, &[2]);
    let then = region("then", std::slice::from_ref(&t), |g, a| {
        let w = g.add_param("w", ty(DType::F32, &[2])).unwrap();
        vec![g.binary(BinaryOp::Add, a[0], w).unwrap()]
    });
    let els = region("else", std::slice::from_ref(&t), |_, a| vec![a[0]]);
    let mut g = Graph::new("main");
    let p = g.add_input("p", scalar(DType::Bool)).unwrap();
    let x = g.add_input("x", t).unwrap();
    let y = g.add_region_op(Op::Cond, &[p, x], vec![then, els]).unwrap();
    g.add_output("y", y[0]).unwrap();
    let w: Weights = [("w".to_string(), f32s(&[2], &[10.0, 20.0]))].into();
    let out = run(&g, &w, &[("p", bools(&[], &[true])), ("x", f32s(&[2], &[1.0, 2.0]))]).unwrap();
    assert_close(&out[0], &[2], &[11.0, 22.0], 0.0);
    let e = run(
        &g,
        &Weights::new(),
        &[("p", bools(&[], &[true])), ("x", f32s(&[2], &[1.0, 2.0]))],
    )
    .unwrap_err();
    assert!(
        matches!(e, oar_ir::BackendError::Weight { ref name, .. } if name == "w"),
        "{e}"
    );
}
