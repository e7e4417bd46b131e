//! The quantization rewrite: products between dequantized 8-bit values whose result is
//! quantized again run on the integers.
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
//! `matmul_integer` natively). Conditions: `a`'s scale is per tensor; `w` is 8-bit with a
//! per-tensor scale or one per output channel (matmul/linear: columns, axis 1 of a `[K, N]`
//! weight; conv2d: axis 0); the product has no other reader; the output scale is per tensor.
//! Everything else — pooling, reshapes, additions between quantized tensors — stays in float
//! between its own dequantize and quantize, as the model wrote it.
//!
//! The result is the float path's up to rounding: the float product of dequantized values is
//! exact integer arithmetic scaled, rounded once in f32 before quantization; the integer path
//! rounds once in the requantization. Outputs may differ by one quantization step where a
//! value sits on a rounding boundary.

use crate::{Pass, PassError};
use oar_ir::ops::{BinaryOp, ConvInteger, DequantizeLinear, QuantizeLinear, Requantize, UnaryOp};
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
        for q in graph.topo_order() {
            if let Some(m) = matched(graph, q) {
                rewrite(graph, q, m).map_err(|e| PassError::ir(self.name(), e))?;
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
    out_scale: ValueId,
    out_zero: Option<ValueId>,
    dtype: DType,
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

fn matched(g: &Graph, qn: NodeId) -> Option<Match> {
    let n = g.node(qn);
    let Op::Composite(Composite::QuantizeLinear(QuantizeLinear { dtype, .. })) = &n.op else {
        return None;
    };
    let (y, out_scale, out_zero) = (n.inputs()[0], n.inputs()[1], n.inputs().get(2).copied());
    if !per_tensor(g, out_scale) || g.users(y).len() != 1 || g.outputs().iter().any(|o| o.value == y) {
        return None;
    }
    let p = g.node(y.node);
    let ins = p.inputs();
    let (product, bias) = match &p.op {
        Op::MatMul => (Product::MatMul, None),
        Op::Composite(Composite::Linear) => (Product::MatMul, ins.get(2).copied()),
        Op::Composite(Composite::Conv2d(c)) => (
            Product::Conv(ConvInteger {
                stride: c.stride.to_vec(),
                pad_before: c.padding[..2].to_vec(),
                pad_after: c.padding[2..].to_vec(),
                dilation: c.dilation.to_vec(),
                groups: c.groups,
            }),
            ins.get(2).copied(),
        ),
        _ => return None,
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
        out_scale,
        out_zero,
        dtype: *dtype,
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

fn rewrite(g: &mut Graph, qn: NodeId, m: Match) -> Result<(), IrError> {
    let out = oar_ir::ValueId::first(qn);
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
    let mut acc = acc;
    if let Some(b) = m.bias {
        // The bias in units of the sums: exact for a bias quantized with that scale.
        let b = g.binary(BinaryOp::Div, b, unit)?;
        let b = g.unary(UnaryOp::Round, b)?;
        let b = g.cast(b, DType::I32)?;
        let b = match conv_rank {
            Some(r) => channel_dims(g, b, r)?,
            None => b,
        };
        acc = g.binary(BinaryOp::Add, acc, b)?;
    }
    let sy = scalar(g, m.out_scale)?;
    let mult = g.binary(BinaryOp::Div, unit, sy)?;
    let mut rq = vec![acc, mult];
    if let Some(z) = m.out_zero {
        rq.push(scalar(g, z)?);
    }
    let axis = if g.value_type(mult).rank() == 0 { 0 } else { axis };
    let y = g.add_op1(
        Op::Composite(Composite::Requantize(Requantize { axis, dtype: m.dtype })),
        &rq,
    )?;
    g.replace_all_uses(out, y)
}
