//! Helpers shared by the reference backend's tests: one-op graphs and tolerance checks.
#![allow(dead_code)]

use oar_backend_reference::run_graph;
use oar_ir::{BackendError, DType, Graph, Op, TensorData, TensorType, Weights};
use std::collections::BTreeMap;

/// An f32 tensor.
pub fn f32s(shape: &[usize], v: &[f64]) -> TensorData {
    TensorData::from_f64_slice(DType::F32, shape.to_vec(), v).unwrap()
}

/// A tensor of any dtype from f64 values.
pub fn tensor(dtype: DType, shape: &[usize], v: &[f64]) -> TensorData {
    TensorData::from_f64_slice(dtype, shape.to_vec(), v).unwrap()
}

/// An i64 tensor.
pub fn i64s(shape: &[usize], v: &[i64]) -> TensorData {
    TensorData::from_vec(shape.to_vec(), v.to_vec()).unwrap()
}

/// A bool tensor.
pub fn bools(shape: &[usize], v: &[bool]) -> TensorData {
    TensorData::from_vec(shape.to_vec(), v.to_vec()).unwrap()
}

/// Run `op` on `inputs` (graph inputs `x0`, `x1`, ...); all of its results.
pub fn try_op(op: Op, inputs: &[TensorData]) -> Result<Vec<TensorData>, BackendError> {
    let mut g = Graph::new("t");
    let mut feed = BTreeMap::new();
    let mut vals = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        let name = format!("x{i}");
        vals.push(g.add_input(&name, t.tensor_type()).unwrap());
        feed.insert(name, t.clone());
    }
    let outs = g.add_op(op, &vals)?;
    for (i, v) in outs.iter().enumerate() {
        g.add_output(&format!("y{i}"), *v).unwrap();
    }
    Ok(run_graph(&g, &Weights::new(), &feed)?
        .into_iter()
        .map(|(_, t)| t)
        .collect())
}

/// Run `op` and return its only result; panics (test failure) on error.
pub fn op1(op: Op, inputs: &[TensorData]) -> TensorData {
    let mut outs = try_op(op, inputs).unwrap();
    assert_eq!(outs.len(), 1);
    outs.remove(0)
}

/// The runtime error of `op` on `inputs`, as text.
pub fn op_err(op: Op, inputs: &[TensorData]) -> String {
    match try_op(op, inputs) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

/// Run a whole graph with named inputs.
pub fn run(g: &Graph, weights: &Weights, inputs: &[(&str, TensorData)]) -> Result<Vec<TensorData>, BackendError> {
    let feed: BTreeMap<String, TensorData> = inputs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    Ok(run_graph(g, weights, &feed)?.into_iter().map(|(_, t)| t).collect())
}

/// Assert shape and values within `rel` relative (or `rel` absolute near zero) tolerance;
/// NaNs must match NaNs.
pub fn assert_close(got: &TensorData, shape: &[usize], want: &[f64], rel: f64) {
    assert_eq!(got.shape(), shape, "shape of {got:?}");
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{got:?}");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= rel * b.abs().max(1.0);
        assert!(ok, "element {i}: got {a}, want {b} (tol {rel}); all: {g:?}");
    }
}

/// Assert exact values and dtype.
pub fn assert_exact(got: &TensorData, dtype: DType, shape: &[usize], want: &[f64]) {
    assert_eq!(got.dtype(), dtype, "{got:?}");
    assert_close(got, shape, want, 0.0);
}

/// The type of a static tensor.
pub fn ty(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::of(dtype, shape)
}
