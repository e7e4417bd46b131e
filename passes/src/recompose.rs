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
//! | `softmax((q · a) (permute(k) · b) · c [+ mask]) v` (softmax on the last axis; `a`, `b`, `c` optional constants, `c` also a divisor) | `sdpa {scale = a·b·c}` (with `mask`) |
//!
//! The attention pattern is what PyTorch exports for `scaled_dot_product_attention` and
//! `nn.MultiheadAttention` (`q` and `kᵀ` each scaled by `√scale`), and what hand-written
//! attention spells (`q kᵀ / √d`). Only float values whose intermediate results have no other
//! reader (and are no graph output) are rewritten, and the result keeps its type. Each
//! composite equals the chain up to float rounding (its definition is the same formula). The
//! cpu backend runs this pass for the composites it keeps whole ([`Recompose::only`]).

use crate::{Pass, PassError};
use oar_ir::ops::{BinaryOp, Gelu, ScaledDotProductAttention, UnaryOp};
use oar_ir::{Composite, Float, Graph, NodeId, Op, ValueId};

/// The recomposition pass (see the module docs): every composite it knows, or only some.
#[derive(Clone, Debug)]
pub struct Recompose {
    gelu: bool,
    sdpa: bool,
}

impl Default for Recompose {
    fn default() -> Recompose {
        Recompose { gelu: true, sdpa: true }
    }
}

impl Recompose {
    /// Produce only the composites named in `names` (`gelu`, `sdpa`; others are ignored);
    /// `None` when that leaves none.
    pub fn only(names: &[&str]) -> Option<Recompose> {
        let r = Recompose {
            gelu: names.contains(&"gelu"),
            sdpa: names.contains(&"sdpa"),
        };
        (r.gelu || r.sdpa).then_some(r)
    }
}

impl Pass for Recompose {
    fn name(&self) -> &'static str {
        "recompose"
    }

    fn description(&self) -> &'static str {
        "primitive-op spellings of gelu (erf and tanh forms) and of attention rewritten to gelu and sdpa"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let (mut changed, mut added) = (false, false);
        let err = |e| PassError::ir("recompose", e);
        for n in graph.topo_order() {
            if graph.get(n).is_none() {
                continue;
            }
            let (op, ins, out) = if let Some((x, out, approximate)) = self.gelu.then(|| gelu(graph, n)).flatten() {
                (Composite::Gelu(Gelu { approximate }), vec![x], out)
            } else if let Some(a) = self.sdpa.then(|| attention(graph, n)).flatten() {
                let op = ScaledDotProductAttention {
                    causal: false,
                    scale: Some(Float(a.scale)),
                };
                (Composite::ScaledDotProductAttention(op), a.inputs, a.out)
            } else {
                continue;
            };
            // The matchers checked operand types; a composite whose type differs is not used.
            let y = graph.add_op1(Op::Composite(op), &ins).map_err(err)?;
            added = true;
            if graph.value_type(y) != graph.value_type(out) {
                continue;
            }
            graph.replace_all_uses(out, y).map_err(err)?;
            changed = true;
        }
        if added {
            graph.remove_dead_nodes();
        }
        Ok(changed)
    }
}

/// An attention pattern: sdpa's operands, its scale, and the value it replaces.
struct Attention {
    inputs: Vec<ValueId>,
    scale: f64,
    out: ValueId,
}

/// `v` less a constant factor: `(x, factor)` for `x · c`, `c · x` or `x / c`, else `(v, 1)`.
fn unscaled(g: &Graph, v: ValueId) -> (ValueId, f64) {
    match binary(g, v) {
        Some((BinaryOp::Mul, x, c)) if let Some(s) = constant(g, c) => (x, s),
        Some((BinaryOp::Mul, c, x)) if let Some(s) = constant(g, c) => (x, s),
        Some((BinaryOp::Div, x, c)) if let Some(s) = constant(g, c).filter(|s| *s != 0.0) => (x, 1.0 / s),
        _ => (v, 1.0),
    }
}

/// Whether `v` is a matmul, possibly times a constant.
fn is_product(g: &Graph, v: ValueId) -> bool {
    let (p, _) = unscaled(g, v);
    matches!(g.get(p.node).map(|n| &n.op), Some(Op::MatMul))
}

/// `n` as the softmax of an attention: `softmax(scaled q kᵀ [+ mask]) v`.
fn attention(g: &Graph, n: NodeId) -> Option<Attention> {
    let node = g.node(n);
    let Op::Composite(Composite::Softmax(sm)) = &node.op else {
        return None;
    };
    let &[s] = node.inputs() else { return None };
    let rank = g.value_type(s).rank();
    if rank < 2 || sm.axis != rank - 1 || !g.value_type(s).dtype.is_float() {
        return None;
    }
    // The probabilities' one reader: matmul(p, v).
    let out = sole_reader(g, ValueId::first(n))?;
    let (Op::MatMul, &[p, v]) = (&g.node(out.node).op, g.node(out.node).inputs()) else {
        return None;
    };
    if p != ValueId::first(n) {
        return None;
    }
    // An additive mask, then the scaled product.
    let (scores, mask) = match binary(g, s) {
        Some((BinaryOp::Add, a, b)) if sole_reader(g, a) == Some(s) && is_product(g, a) => (a, Some(b)),
        Some((BinaryOp::Add, a, b)) if sole_reader(g, b) == Some(s) && is_product(g, b) => (b, Some(a)),
        _ => (s, None),
    };
    let (prod, c) = unscaled(g, scores);
    if prod != scores && sole_reader(g, prod) != Some(scores) {
        return None;
    }
    let (Op::MatMul, &[qa, kb]) = (&g.node(prod.node).op, g.node(prod.node).inputs()) else {
        return None;
    };
    let (q, a) = unscaled(g, qa);
    let (kt, b) = unscaled(g, kb);
    let Op::Permute(perm) = &g.node(kt.node).op else {
        return None;
    };
    let k = g.node(kt.node).inputs()[0];
    let mut swap: Vec<usize> = (0..rank).collect();
    swap.swap(rank - 2, rank - 1);
    // q, k and v of one rank and dtype with the same leading dims (the native kernel's case).
    let (tq, tk, tv) = (g.value_type(q), g.value_type(k), g.value_type(v));
    let lead = |t: &oar_ir::TensorType| t.shape.0[..rank - 2].to_vec();
    let fits = perm.perm == swap
        && [tq, tk, tv].iter().all(|t| t.rank() == rank && t.dtype == tq.dtype)
        && lead(tq) == lead(tk)
        && lead(tq) == lead(tv)
        // A mask broadcasts into the scores, never widens them (sdpa's rule).
        && mask.is_none_or(|m| g.value_type(m).dtype == tq.dtype && g.value_type(s) == g.value_type(scores));
    let scale = a * b * c;
    (fits && scale.is_finite()).then(|| Attention {
        inputs: [q, k, v].into_iter().chain(mask).collect(),
        scale,
        out,
    })
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
    fn recomposed(g: Graph) -> Graph {
        let xs: Vec<f64> = (0..32).map(|i| (i as f64 - 16.0) * 0.37).collect();
        let x = TensorData::from_f64_slice(DType::F32, vec![4, 8], &xs).unwrap();
        checked_run(g, &BTreeMap::from([("x".to_string(), x)]))
    }

    /// Runs the pass on `g` and checks its first output on `feeds` against the graph before
    /// (the reference evaluator, 1e-6).
    fn checked_run(mut g: Graph, feeds: &BTreeMap<String, TensorData>) -> Graph {
        let run = |g: &Graph| oar_backend_reference::run_graph(g, &Weights::new(), feeds).unwrap();
        let before = run(&g);
        Recompose::default().run(&mut g).unwrap();
        let after = run(&g);
        for (a, b) in before[0].1.to_f64_vec().iter().zip(after[0].1.to_f64_vec()) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + a.abs()), "{a} vs {b}");
        }
        g
    }

    /// PyTorch's export: `mul(mul(x, add(erf(div(x, √2)), 1)), 0.5)`.
    fn torch_erf(g: &mut Graph, x: ValueId) -> ValueId {
        erf_form(g, x, std::f64::consts::SQRT_2)
    }

    /// `mul(mul(x, add(erf(div(x, c)), 1)), 0.5)`.
    fn erf_form(g: &mut Graph, x: ValueId, divisor: f64) -> ValueId {
        let c = scalar(g, divisor);
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

    /// Attention over q, k, v `[2, 5, 4]` (and a float mask `[5, 5]`) built by `build`; the pass's
    /// result, checked against the graph before on fixed inputs (1e-6).
    fn attention_graph(build: impl Fn(&mut Graph, [ValueId; 4]) -> ValueId) -> Graph {
        let mut g = Graph::new("attention");
        let t = TensorType::of(DType::F32, &[2, 5, 4]);
        let ins = ["q", "k", "v"].map(|n| g.add_input(n, t.clone()).unwrap());
        let mask = g.add_input("mask", TensorType::of(DType::F32, &[5, 5])).unwrap();
        let y = build(&mut g, [ins[0], ins[1], ins[2], mask]);
        g.add_output("y", y).unwrap();
        let data = |n: usize, seed: f64| {
            let v: Vec<f64> = (0..n).map(|i| ((i as f64 + seed) * 0.731).sin() * 2.0).collect();
            v
        };
        let mut feeds = BTreeMap::new();
        for (i, name) in ["q", "k", "v"].iter().enumerate() {
            let t = TensorData::from_f64_slice(DType::F32, vec![2, 5, 4], &data(40, i as f64 * 7.0)).unwrap();
            feeds.insert(name.to_string(), t);
        }
        let m: Vec<f64> = (0..25).map(|i| if i % 5 > i / 5 { -1e4 } else { 0.0 }).collect();
        feeds.insert(
            "mask".into(),
            TensorData::from_f64_slice(DType::F32, vec![5, 5], &m).unwrap(),
        );
        checked_run(g, &feeds)
    }

    fn transposed(g: &mut Graph, k: ValueId) -> ValueId {
        g.add_op1(Op::Permute(oar_ir::ops::Permute { perm: vec![0, 2, 1] }), &[k])
            .unwrap()
    }

    fn softmax(g: &mut Graph, x: ValueId) -> ValueId {
        g.add_op1(
            Op::Composite(Composite::Softmax(oar_ir::ops::Softmax { axis: 2 })),
            &[x],
        )
        .unwrap()
    }

    /// The sdpa nodes of `g`: (scale, operands).
    fn sdpas(g: &Graph) -> Vec<(f64, usize)> {
        g.topo_order()
            .into_iter()
            .filter_map(|n| match &g.node(n).op {
                Op::Composite(Composite::ScaledDotProductAttention(a)) => {
                    Some((a.scale.unwrap().0, g.node(n).inputs().len()))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn attention_forms_become_sdpa() {
        // PyTorch's export: q and kᵀ each scaled by √scale.
        let g = attention_graph(|g, [q, k, v, _]| {
            let s = scalar(g, 0.5f32.sqrt().into());
            let qs = g.binary(BinaryOp::Mul, q, s).unwrap();
            let kt = transposed(g, k);
            let s = scalar(g, 0.5f32.sqrt().into());
            let ks = g.binary(BinaryOp::Mul, kt, s).unwrap();
            let sc = g.add_op1(Op::MatMul, &[qs, ks]).unwrap();
            let p = softmax(g, sc);
            g.add_op1(Op::MatMul, &[p, v]).unwrap()
        });
        let found = sdpas(&g);
        assert_eq!(found.len(), 1);
        assert!((found[0].0 - 0.5).abs() < 1e-6 && found[0].1 == 3, "{found:?}");
        // Hand-written: q kᵀ / √d + mask.
        let g = attention_graph(|g, [q, k, v, mask]| {
            let kt = transposed(g, k);
            let sc = g.add_op1(Op::MatMul, &[q, kt]).unwrap();
            let d = scalar(g, 2.0);
            let sc = g.binary(BinaryOp::Div, sc, d).unwrap();
            let sc = g.binary(BinaryOp::Add, sc, mask).unwrap();
            let p = softmax(g, sc);
            g.add_op1(Op::MatMul, &[p, v]).unwrap()
        });
        assert_eq!(sdpas(&g), vec![(0.5, 4)]);
        // No scale at all.
        let g = attention_graph(|g, [q, k, v, _]| {
            let kt = transposed(g, k);
            let sc = g.add_op1(Op::MatMul, &[q, kt]).unwrap();
            let p = softmax(g, sc);
            g.add_op1(Op::MatMul, &[p, v]).unwrap()
        });
        assert_eq!(sdpas(&g), vec![(1.0, 3)]);
    }

    /// A mask that widens the scores (`[2, 1, 5] + [2, 3, 5]`) is no sdpa mask: the pattern
    /// stays, and the pass does not fail on it.
    #[test]
    fn a_widening_mask_stays() {
        let mut g = Graph::new("widening");
        let q = g.add_input("q", TensorType::of(DType::F32, &[2, 1, 4])).unwrap();
        let k = g.add_input("k", TensorType::of(DType::F32, &[2, 5, 4])).unwrap();
        let v = g.add_input("v", TensorType::of(DType::F32, &[2, 5, 4])).unwrap();
        let mask = g.add_input("mask", TensorType::of(DType::F32, &[2, 3, 5])).unwrap();
        let kt = transposed(&mut g, k);
        let sc = g.add_op1(Op::MatMul, &[q, kt]).unwrap();
        let sc = g.binary(BinaryOp::Add, sc, mask).unwrap();
        let p = softmax(&mut g, sc);
        let y = g.add_op1(Op::MatMul, &[p, v]).unwrap();
        g.add_output("y", y).unwrap();
        assert!(!Recompose::default().run(&mut g).unwrap());
        assert!(sdpas(&g).is_empty());
    }

    #[test]
    fn attention_near_misses_stay() {
        // Probabilities read twice (returned beside the result); k not transposed (q qᵀ is not
        // a permute of k); softmax over another axis.
        let g = attention_graph(|g, [q, k, v, _]| {
            let kt = transposed(g, k);
            let sc = g.add_op1(Op::MatMul, &[q, kt]).unwrap();
            let p = softmax(g, sc);
            let y = g.add_op1(Op::MatMul, &[p, v]).unwrap();
            g.add_output("p", p).unwrap();
            y
        });
        assert!(sdpas(&g).is_empty());
        let g = attention_graph(|g, [q, _, v, _]| {
            let s = scalar(g, 2.0);
            let qt = transposed(g, q);
            let qt = g.binary(BinaryOp::Mul, qt, s).unwrap();
            let qt = g.binary(BinaryOp::Add, qt, s).unwrap();
            let sc = g.add_op1(Op::MatMul, &[q, qt]).unwrap();
            let p = softmax(g, sc);
            g.add_op1(Op::MatMul, &[p, v]).unwrap()
        });
        assert!(sdpas(&g).is_empty());
        let g = attention_graph(|g, [q, k, v, _]| {
            let kt = transposed(g, k);
            let sc = g.add_op1(Op::MatMul, &[q, kt]).unwrap();
            let p = g
                .add_op1(
                    Op::Composite(Composite::Softmax(oar_ir::ops::Softmax { axis: 1 })),
                    &[sc],
                )
                .unwrap();
            g.add_op1(Op::MatMul, &[p, v]).unwrap()
        });
        assert!(sdpas(&g).is_empty());
    }

    #[test]
    fn near_misses_stay() {
        // A wrong constant, an intermediate another op reads, an intermediate that is an output.
        let wrong = graph(|g, x| erf_form(g, x, 1.5));
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
