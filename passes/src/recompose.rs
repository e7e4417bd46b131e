//! Recomposition: primitive-op patterns that spell a composite op, rewritten to that composite,
//! so a backend with a native kernel for it runs one kernel instead of the chain.
//!
//! Exporters write some composites out as primitive ops: PyTorch's ONNX export (opset < 20)
//! writes `F.gelu` as `x · (1 + erf(x / √2)) · 0.5`, and the tanh form as
//! `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`. Recognized (any association of the
//! product and order of commutative operands; `x / √2` or `x · (1/√2)`; `x³` as `pow(x, 3)`,
//! `x · x · x` or `x · x²`; constants scalar or uniform, within 1e-6 relative of the exact
//! value):
//!
//! | pattern | composite |
//! |---|---|
//! | `0.5 · x · (1 + erf(x / √2))` | `gelu` |
//! | `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))` | `gelu {approximate}` |
//!
//! Only float values whose intermediate results have no other reader (and are no graph
//! output) are rewritten, and the result must have `x`'s type. The composite equals the chain
//! up to float rounding (its definition is the same formula). The cpu backend runs this pass
//! when it keeps `gelu` whole.

use crate::{Pass, PassError};
use oar_ir::ops::{BinaryOp, Gelu, UnaryOp};
use oar_ir::{Composite, Graph, NodeId, Op, ValueId};

/// The recomposition pass (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Recompose;

impl Pass for Recompose {
    fn name(&self) -> &'static str {
        "recompose"
    }

    fn description(&self) -> &'static str {
        "primitive-op spellings of gelu (erf and tanh forms) rewritten to the composite"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let mut changed = false;
        for n in graph.topo_order() {
            if graph.get(n).is_none() {
                continue;
            }
            if let Some((x, out, approximate)) = gelu(graph, n) {
                let y = graph
                    .add_op1(Op::Composite(Composite::Gelu(Gelu { approximate })), &[x])
                    .map_err(|e| PassError::ir(self.name(), e))?;
                graph
                    .replace_all_uses(out, y)
                    .map_err(|e| PassError::ir(self.name(), e))?;
                changed = true;
            }
        }
        if changed {
            graph.remove_dead_nodes();
        }
        Ok(changed)
    }
}

/// The uniform value of a constant (scalar or splat) `v`.
fn constant(g: &Graph, v: ValueId) -> Option<f64> {
    let Op::Constant(t) = &g.node(v.node).op else {
        return None;
    };
    if t.is_empty() || t.len() > 4096 {
        return None;
    }
    let vals = t.to_f64_vec();
    vals.iter().all(|&x| x == vals[0]).then_some(vals[0])
}

/// True if `v` is a constant within 1e-6 relative of `want`.
fn is_const(g: &Graph, v: ValueId, want: f64) -> bool {
    constant(g, v).is_some_and(|c| (c - want).abs() <= 1e-6 * want.abs())
}

/// The binary op and operands of the node defining `v`.
fn binary(g: &Graph, v: ValueId) -> Option<(BinaryOp, ValueId, ValueId)> {
    let node = g.get(v.node)?;
    match (&node.op, node.inputs()) {
        (Op::Binary(b), &[a, c]) => Some((*b, a, c)),
        _ => None,
    }
}

/// For a commutative `op` node defining `v` with a constant `want` on either side: the other
/// operand.
fn with_const(g: &Graph, v: ValueId, op: BinaryOp, want: f64) -> Option<ValueId> {
    let (b, l, r) = binary(g, v)?;
    if b != op {
        return None;
    }
    if is_const(g, r, want) {
        Some(l)
    } else if is_const(g, l, want) {
        Some(r)
    } else {
        None
    }
}

/// The single reader of `v`, when `v` has exactly one use and is no graph output.
fn sole_reader(g: &Graph, v: ValueId) -> Option<ValueId> {
    let users = g.users(v);
    let [(n, _)] = users.as_slice() else { return None };
    let output = g.outputs().iter().any(|o| o.value == v);
    (!output && g.node(*n).outputs().len() == 1).then_some(ValueId::first(*n))
}

/// Whether `v` is `x³`: `pow(x, 3)`, `x · x · x` or `x · x²` in any order.
fn is_cube(g: &Graph, v: ValueId, x: ValueId) -> bool {
    let is_square = |s: ValueId| matches!(binary(g, s), Some((BinaryOp::Mul, a, b)) if a == x && b == x);
    match binary(g, v) {
        Some((BinaryOp::Pow, a, e)) => a == x && is_const(g, e, 3.0),
        Some((BinaryOp::Mul, a, b)) => (a == x && is_square(b)) || (b == x && is_square(a)),
        _ => false,
    }
}

/// `n` as the `erf` or `tanh` of a GELU: (x, the value equal to `gelu(x)`, approximate).
fn gelu(g: &Graph, n: NodeId) -> Option<(ValueId, ValueId, bool)> {
    let node = g.node(n);
    let (approximate, arg) = match (&node.op, node.inputs()) {
        (Op::Unary(UnaryOp::Erf), &[a]) => (false, a),
        (Op::Unary(UnaryOp::Tanh), &[a]) => (true, a),
        _ => return None,
    };
    let x = if approximate {
        // √(2/π) · (x + 0.044715 · x³)
        let s = with_const(g, arg, BinaryOp::Mul, (2.0 / std::f64::consts::PI).sqrt())?;
        let (BinaryOp::Add, a, b) = binary(g, s)? else {
            return None;
        };
        let cubic =
            |x: ValueId, c: ValueId| with_const(g, c, BinaryOp::Mul, 0.044715).is_some_and(|c3| is_cube(g, c3, x));
        match () {
            _ if cubic(a, b) => a,
            _ if cubic(b, a) => b,
            _ => return None,
        }
    } else {
        // x / √2 or x · (1/√2)
        match binary(g, arg)? {
            (BinaryOp::Div, x, c) if is_const(g, c, std::f64::consts::SQRT_2) => x,
            _ => with_const(g, arg, BinaryOp::Mul, std::f64::consts::FRAC_1_SQRT_2)?,
        }
    };
    let ty = g.value_type(x);
    if !ty.dtype.is_float() {
        return None;
    }
    // 1 + inner, then the product with x and 0.5 in any association.
    let inner = ValueId::first(n);
    let one_plus = sole_reader(g, inner)?;
    if with_const(g, one_plus, BinaryOp::Add, 1.0) != Some(inner) {
        return None;
    }
    let m = sole_reader(g, one_plus)?;
    let (BinaryOp::Mul, a, b) = binary(g, m)? else {
        return None;
    };
    let other = if a == one_plus { b } else { a };
    let out = if other == x {
        // (x · (1 + inner)) · 0.5
        let m2 = sole_reader(g, m)?;
        (with_const(g, m2, BinaryOp::Mul, 0.5) == Some(m)).then_some(m2)?
    } else if with_const(g, other, BinaryOp::Mul, 0.5) == Some(x) {
        // (0.5 · x) · (1 + inner)
        m
    } else if with_const(g, m, BinaryOp::Mul, 0.5) == Some(one_plus) {
        // x · ((1 + inner) · 0.5)
        let m2 = sole_reader(g, m)?;
        let (BinaryOp::Mul, a, b) = binary(g, m2)? else {
            return None;
        };
        ((a == m && b == x) || (a == x && b == m)).then_some(m2)?
    } else {
        return None;
    };
    (g.value_type(out) == ty).then_some((x, out, approximate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::{DType, TensorData, TensorType, Weights};
    use std::collections::BTreeMap;

    fn scalar(g: &mut Graph, v: f64) -> ValueId {
        g.add_scalar(DType::F32, v)
    }

    /// A graph computing gelu of its input by `build`, with the result as the output.
    fn graph(build: impl Fn(&mut Graph, ValueId) -> ValueId) -> Graph {
        let mut g = Graph::new("gelu");
        let x = g.add_input("x", TensorType::of(DType::F32, &[4, 8])).unwrap();
        let y = build(&mut g, x);
        g.add_output("y", y).unwrap();
        g
    }

    fn gelus(g: &Graph) -> Vec<bool> {
        g.topo_order()
            .into_iter()
            .filter_map(|n| match &g.node(n).op {
                Op::Composite(Composite::Gelu(Gelu { approximate })) => Some(*approximate),
                _ => None,
            })
            .collect()
    }

    /// Runs the pass and checks the graph's values on a fixed input against the graph before,
    /// with the reference evaluator.
    fn recomposed(mut g: Graph) -> Graph {
        let xs: Vec<f64> = (0..32).map(|i| (i as f64 - 16.0) * 0.37).collect();
        let x = TensorData::from_f64_slice(DType::F32, vec![4, 8], &xs).unwrap();
        let feeds = BTreeMap::from([("x".to_string(), x)]);
        let run = |g: &Graph| oar_backend_reference::run_graph(g, &Weights::new(), &feeds).unwrap();
        let before = run(&g);
        Recompose.run(&mut g).unwrap();
        let after = run(&g);
        for (a, b) in before[0].1.to_f64_vec().iter().zip(after[0].1.to_f64_vec()) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + a.abs()), "{a} vs {b}");
        }
        g
    }

    /// PyTorch's export: `mul(mul(x, add(erf(div(x, √2)), 1)), 0.5)`.
    fn torch_erf(g: &mut Graph, x: ValueId) -> ValueId {
        let c = scalar(g, std::f64::consts::SQRT_2);
        let d = g.binary(BinaryOp::Div, x, c).unwrap();
        let e = g.unary(UnaryOp::Erf, d).unwrap();
        let one = scalar(g, 1.0);
        let a = g.binary(BinaryOp::Add, e, one).unwrap();
        let m = g.binary(BinaryOp::Mul, x, a).unwrap();
        let h = scalar(g, 0.5);
        g.binary(BinaryOp::Mul, m, h).unwrap()
    }

    #[test]
    fn erf_forms_become_gelu() {
        let g = recomposed(graph(torch_erf));
        assert_eq!(gelus(&g), vec![false]);
        assert_eq!(g.node_count(), 2, "input and gelu remain");
        // BERT's: (x · 0.5) · (1 + erf(x · (1/√2))), constants on the left.
        let g = recomposed(graph(|g, x| {
            let h = scalar(g, 0.5);
            let hx = g.binary(BinaryOp::Mul, h, x).unwrap();
            let c = scalar(g, std::f64::consts::FRAC_1_SQRT_2);
            let d = g.binary(BinaryOp::Mul, c, x).unwrap();
            let e = g.unary(UnaryOp::Erf, d).unwrap();
            let one = scalar(g, 1.0);
            let a = g.binary(BinaryOp::Add, one, e).unwrap();
            g.binary(BinaryOp::Mul, hx, a).unwrap()
        }));
        assert_eq!(gelus(&g), vec![false]);
        // x · ((1 + erf(x / √2)) · 0.5)
        let g = recomposed(graph(|g, x| {
            let c = scalar(g, std::f64::consts::SQRT_2);
            let d = g.binary(BinaryOp::Div, x, c).unwrap();
            let e = g.unary(UnaryOp::Erf, d).unwrap();
            let one = scalar(g, 1.0);
            let a = g.binary(BinaryOp::Add, e, one).unwrap();
            let h = scalar(g, 0.5);
            let q = g.binary(BinaryOp::Mul, a, h).unwrap();
            g.binary(BinaryOp::Mul, x, q).unwrap()
        }));
        assert_eq!(gelus(&g), vec![false]);
    }

    #[test]
    fn tanh_forms_become_approximate_gelu() {
        for cube in 0..3 {
            let g = recomposed(graph(|g, x| {
                let x3 = match cube {
                    0 => {
                        let three = scalar(g, 3.0);
                        g.binary(BinaryOp::Pow, x, three).unwrap()
                    }
                    1 => {
                        let x2 = g.binary(BinaryOp::Mul, x, x).unwrap();
                        g.binary(BinaryOp::Mul, x2, x).unwrap()
                    }
                    _ => {
                        let x2 = g.binary(BinaryOp::Mul, x, x).unwrap();
                        g.binary(BinaryOp::Mul, x, x2).unwrap()
                    }
                };
                let k = scalar(g, 0.044715);
                let c = g.binary(BinaryOp::Mul, x3, k).unwrap();
                let s = g.binary(BinaryOp::Add, x, c).unwrap();
                let r = scalar(g, (2.0 / std::f64::consts::PI).sqrt());
                let a = g.binary(BinaryOp::Mul, s, r).unwrap();
                let t = g.unary(UnaryOp::Tanh, a).unwrap();
                let one = scalar(g, 1.0);
                let p = g.binary(BinaryOp::Add, t, one).unwrap();
                let h = scalar(g, 0.5);
                let hx = g.binary(BinaryOp::Mul, x, h).unwrap();
                g.binary(BinaryOp::Mul, hx, p).unwrap()
            }));
            assert_eq!(gelus(&g), vec![true], "cube form {cube}");
        }
    }

    #[test]
    fn near_misses_stay() {
        // A wrong constant, an intermediate another op reads, an intermediate that is an output.
        let wrong = graph(|g, x| {
            let c = scalar(g, 1.5);
            let d = g.binary(BinaryOp::Div, x, c).unwrap();
            let e = g.unary(UnaryOp::Erf, d).unwrap();
            let one = scalar(g, 1.0);
            let a = g.binary(BinaryOp::Add, e, one).unwrap();
            let m = g.binary(BinaryOp::Mul, x, a).unwrap();
            let h = scalar(g, 0.5);
            g.binary(BinaryOp::Mul, m, h).unwrap()
        });
        assert!(gelus(&recomposed(wrong)).is_empty());
        let shared = graph(|g, x| {
            let y = torch_erf(g, x);
            let e = g
                .topo_order()
                .into_iter()
                .find(|&n| matches!(g.node(n).op, Op::Unary(UnaryOp::Erf)))
                .unwrap();
            g.binary(BinaryOp::Add, y, ValueId::first(e)).unwrap()
        });
        assert!(gelus(&recomposed(shared)).is_empty());
        let mut out = graph(torch_erf);
        let e = out
            .topo_order()
            .into_iter()
            .find(|&n| matches!(out.node(n).op, Op::Unary(UnaryOp::Erf)))
            .unwrap();
        out.add_output("erf", ValueId::first(e)).unwrap();
        assert!(gelus(&recomposed(out)).is_empty());
    }
}
