//! The quantization rewrite: products between dequantized 8-bit values run on the integers.
//!
//! `quantize_linear(P(dequantize_linear(a), dequantize_linear(w), bias?), s_y, z_y)` where `P`
//! is `matmul`, `linear` or `conv2d` (the shape QDQ models — from QAT, PTQ or onnxruntime's
//! quantizer — give every quantized layer) becomes
//!
//! ```text
//! requantize(P_integer(a_q, w_q, z_a, z_w) + round(bias / (s_a·s_w)), s_a·s_w / s_y, z_y)
//! ```
//!
//! with `P_integer` = `matmul_integer` or `conv_integer` (exact i32 sums; the cpu runtime runs
//! `matmul_integer` natively); a product whose result is not quantized again (a QAT model's
//! layer, which quantizes inputs and weights only) becomes `f32(P_integer(..)) · s_a·s_w + bias`.
//! Conditions: `a`'s scale is per tensor; `w` is 8-bit with a per-tensor scale or one per
//! output channel (matmul/linear: columns, axis 1 of a `[K, N]` weight; conv2d: axis 0); for the
//! requantized form the product has no other reader and the output scale is per tensor.
//! Everything else — pooling, reshapes, additions between quantized tensors — stays in float
//! between its own dequantize and quantize, as the model wrote it.
//!
//! The result is the float path's up to rounding: the float product of dequantized values is
//! exact integer arithmetic scaled, rounded once in f32 before quantization; the integer path
//! rounds once in the requantization. Outputs may differ by one quantization step where a
//! value sits on a rounding boundary.

use crate::{Pass, PassError};
use oar_ir::ops::{
    BinaryOp, ConvInteger, DequantizeLinear, FakeQuant, QuantizeLinear, Requantize, UnaryOp, quant_range,
};
use oar_ir::{Composite, DType, Dim, Emitter, Graph, IrError, NodeId, Op, ValueId};

/// The quantization rewrite pass (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Quantize;

impl Pass for Quantize {
    fn name(&self) -> &'static str {
        "quantize"
    }

    fn description(&self) -> &'static str {
        "dequantize -> matmul/linear/conv2d -> quantize into matmul_integer/conv_integer + requantize"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let mut changed = false;
        for p in graph.topo_order() {
            if let Some(m) = matched(graph, p) {
                rewrite(graph, m).map_err(|e| PassError::ir(self.name(), e))?;
                changed = true;
            }
        }
        if changed {
            graph.remove_dead_nodes();
        }
        Ok(changed)
    }
}

/// A dequantized operand: the integers, their scale and zero point, and the scale's axis.
struct Dq {
    q: ValueId,
    scale: ValueId,
    zero: Option<ValueId>,
    axis: usize,
}

/// The product kinds the pass rewrites.
enum Product {
    MatMul,
    Conv(ConvInteger),
}

struct Match {
    product: Product,
    a: Dq,
    w: Dq,
    bias: Option<ValueId>,
    /// The product's value.
    y: ValueId,
    /// The quantization of its result (its only reader), if it is quantized: the quantize
    /// node, its scale and zero point, and its dtype.
    quantized: Option<(NodeId, ValueId, Option<ValueId>, DType)>,
}

fn dq(g: &Graph, v: ValueId) -> Option<Dq> {
    let n = g.node(v.node);
    let Op::Composite(Composite::DequantizeLinear(DequantizeLinear { axis })) = &n.op else {
        return None;
    };
    let ins = n.inputs();
    let q = ins[0];
    if !matches!(g.value_type(q).dtype, DType::I8 | DType::U8) || g.value_type(ins[1]).dtype != DType::F32 {
        return None;
    }
    Some(Dq {
        q,
        scale: ins[1],
        zero: ins.get(2).copied(),
        axis: *axis,
    })
}

/// Per tensor: a scalar or a one-element vector.
fn per_tensor(g: &Graph, v: ValueId) -> bool {
    let s = &g.value_type(v).shape.0;
    s.is_empty() || s.as_slice() == [Dim::Static(1)]
}

/// Per tensor, or per channel along `axis` of the weight.
fn per_channel_ok(g: &Graph, d: &Dq, axis: usize) -> bool {
    per_tensor(g, d.scale) || d.axis == axis
}

fn matched(g: &Graph, pn: NodeId) -> Option<Match> {
    let p = g.node(pn);
    let y = ValueId::first(pn);
    let ins = p.inputs();
    let (product, bias) = match &p.op {
        Op::MatMul => (Product::MatMul, None),
        Op::Composite(Composite::Linear) => (Product::MatMul, ins.get(2).copied()),
        Op::Composite(Composite::Conv2d(c)) => (Product::Conv(ConvInteger::of(c.conv())), ins.get(2).copied()),
        _ => return None,
    };
    if g.value_type(y).dtype != DType::F32 {
        return None;
    }
    // Quantized again when its only reader quantizes it per tensor.
    let users = g.users(y);
    let quantized = match users.as_slice() {
        [(u, 0)] if !g.outputs().iter().any(|o| o.value == y) => {
            let n = g.node(*u);
            match &n.op {
                Op::Composite(Composite::QuantizeLinear(QuantizeLinear { dtype, .. }))
                    if per_tensor(g, n.inputs()[1]) =>
                {
                    Some((*u, n.inputs()[1], n.inputs().get(2).copied(), *dtype))
                }
                _ => None,
            }
        }
        _ => None,
    };
    let (a, w) = (dq(g, ins[0])?, dq(g, ins[1])?);
    let w_rank = g.value_type(w.q).rank();
    let (w_axis, ok_rank) = match product {
        Product::MatMul => (1, w_rank == 2 && g.value_type(a.q).rank() >= 2),
        Product::Conv(_) => (0, true),
    };
    if !ok_rank || !per_tensor(g, a.scale) || !per_channel_ok(g, &w, w_axis) {
        return None;
    }
    Some(Match {
        product,
        a,
        w,
        bias,
        y,
        quantized,
    })
}

/// A per-tensor value as a scalar (a `[1]` vector reshaped).
fn scalar(g: &mut Graph, v: ValueId) -> Result<ValueId, IrError> {
    if g.value_type(v).rank() == 0 {
        return Ok(v);
    }
    g.reshape(v, &oar_ir::Shape(vec![]))
}

/// A per-channel parameter `[C]` (or a scalar) shaped to broadcast over axis 1 of a rank-`r`
/// result.
fn channel_dims(g: &mut Graph, v: ValueId, rank: usize) -> Result<ValueId, IrError> {
    let t = g.value_type(v);
    if t.rank() == 0 {
        return Ok(v);
    }
    let mut d = vec![Dim::Static(1); rank];
    d[1] = t.shape.0[0].clone();
    g.reshape(v, &oar_ir::Shape(d))
}

fn rewrite(g: &mut Graph, m: Match) -> Result<(), IrError> {
    let za = match m.a.zero {
        Some(z) => scalar(g, z)?,
        None => {
            let dt = g.value_type(m.a.q).dtype;
            g.add_scalar(dt, 0.0)
        }
    };
    let sa = scalar(g, m.a.scale)?;
    let (sw, zw) = if per_tensor(g, m.w.scale) {
        let z = match m.w.zero {
            Some(z) => Some(scalar(g, z)?),
            None => None,
        };
        (scalar(g, m.w.scale)?, z)
    } else {
        (m.w.scale, m.w.zero)
    };
    let mut ins = vec![m.a.q, m.w.q, za];
    ins.extend(zw);
    let (acc, axis, conv_rank) = match &m.product {
        Product::MatMul => {
            let acc = g.add_op1(Op::Composite(Composite::MatMulInteger), &ins)?;
            let r = g.value_type(acc).rank();
            (acc, r - 1, None)
        }
        Product::Conv(c) => {
            let acc = g.add_op1(Op::Composite(Composite::ConvInteger(c.clone())), &ins)?;
            let r = g.value_type(acc).rank();
            (acc, 1, Some(r))
        }
    };
    // s_a · s_w: the scale of one unit of the i32 sums (per channel where w's is).
    let unit = g.binary(BinaryOp::Mul, sa, sw)?;
    let per_axis = |g: &mut Graph, v: ValueId| match conv_rank {
        Some(r) => channel_dims(g, v, r),
        None => Ok(v),
    };
    let Some((qn, out_scale, out_zero, dtype)) = m.quantized else {
        // Dequantized: the sums times their unit (per channel along the result's axis), then
        // the float bias, as the float product computes them.
        let f = g.cast(acc, DType::F32)?;
        let u = per_axis(g, unit)?;
        let mut y = g.binary(BinaryOp::Mul, f, u)?;
        if let Some(b) = m.bias {
            let b = per_axis(g, b)?;
            y = g.binary(BinaryOp::Add, y, b)?;
        }
        return g.replace_all_uses(m.y, y);
    };
    let mut acc = acc;
    if let Some(b) = m.bias {
        // The bias in units of the sums: exact for a bias quantized with that scale.
        let b = g.binary(BinaryOp::Div, b, unit)?;
        let b = g.unary(UnaryOp::Round, b)?;
        let b = g.cast(b, DType::I32)?;
        let b = per_axis(g, b)?;
        acc = g.binary(BinaryOp::Add, acc, b)?;
    }
    let sy = scalar(g, out_scale)?;
    let mult = g.binary(BinaryOp::Div, unit, sy)?;
    let mut rq = vec![acc, mult];
    if let Some(z) = out_zero {
        rq.push(scalar(g, z)?);
    }
    let axis = if g.value_type(mult).rank() == 0 { 0 } else { axis };
    let y = g.add_op1(Op::Composite(Composite::Requantize(Requantize { axis, dtype })), &rq)?;
    g.replace_all_uses(ValueId::first(qn), y)
}

/// `fake_quant` into the quantize → dequantize pair it simulates, so a QAT or PTQ model traced
/// to a graph (`to_static`) becomes a QDQ graph the [`Quantize`] pass runs on the integers:
/// `fake_quant(x, s, z) [qmin, qmax]` → `dequantize_linear(max(quantize_linear(x, s, i(z)), qmin),
/// s, i(z))` with `i(z)` the float zero point cast to the 8-bit type whose range holds
/// `[qmin, qmax]` (u8 for `[0, 255]`, i8 for `[-128, 127]` and the symmetric `[-127, 127]`,
/// whose lower bound the `max` keeps). The same values: the clamp to `[qmin, qmax]` is the
/// saturation (and the `max`). Other ranges stay fake.
#[derive(Clone, Copy, Debug, Default)]
pub struct FakeQuantToQdq;

impl Pass for FakeQuantToQdq {
    fn name(&self) -> &'static str {
        "fake-quant-to-qdq"
    }

    fn description(&self) -> &'static str {
        "fake_quant into quantize_linear -> dequantize_linear pairs (i8/u8 ranges), for the quantize pass"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let mut changed = false;
        for n in graph.topo_order() {
            let node = graph.node(n);
            let Op::Composite(Composite::FakeQuant(FakeQuant { axis, qmin, qmax })) = &node.op else {
                continue;
            };
            let (axis, qmin, qmax) = (*axis, *qmin, *qmax);
            let ins = node.inputs().to_vec();
            let Some(dtype) = [DType::U8, DType::I8].into_iter().find(|&d| {
                quant_range(d).is_some_and(|(lo, hi)| lo <= qmin && qmax == hi && (qmin == lo || d == DType::I8))
            }) else {
                continue;
            };
            let run = |g: &mut Graph| -> Result<ValueId, IrError> {
                let z = match ins.get(2) {
                    Some(&z) => g.cast(z, dtype)?,
                    None => g.add_scalar(dtype, 0.0),
                };
                let q = g.add_op1(
                    Op::Composite(Composite::QuantizeLinear(QuantizeLinear { axis, dtype })),
                    &[ins[0], ins[1], z],
                )?;
                let q = match quant_range(dtype) {
                    Some((lo, _)) if lo < qmin => {
                        let floor = g.add_scalar(dtype, qmin as f64);
                        g.binary(BinaryOp::Max, q, floor)?
                    }
                    _ => q,
                };
                g.add_op1(
                    Op::Composite(Composite::DequantizeLinear(DequantizeLinear { axis })),
                    &[q, ins[1], z],
                )
            };
            let y = run(graph).map_err(|e| PassError::ir(self.name(), e))?;
            graph
                .replace_all_uses(ValueId::first(n), y)
                .map_err(|e| PassError::ir(self.name(), e))?;
            changed = true;
        }
        if changed {
            graph.remove_dead_nodes();
        }
        Ok(changed)
    }
}
