//! Vector-Jacobian products of the primitives, written with other ops (so eager autograd and
//! static backward graphs share them, and the backward of a traced step is itself a graph).

use super::conv_grad::{conv_grad_input, conv_grad_weight};
use crate::emit::Emitter;
use crate::ops::{BinaryOp, Op, ReduceOp, ScatterReduce, SliceRange, UnaryOp};
use crate::{Dim, IrError, Shape, TensorType};

fn unsupported(op: &Op, why: &str) -> IrError {
    IrError::Type {
        op: op.name().into(),
        value: "<vjp>".into(),
        detail: why.into(),
    }
}

/// Gradients of `op`'s inputs given the cotangents of its outputs (`None` = zero).
/// `wants[i]` says whether input `i` needs a gradient; unwanted or non-differentiable inputs
/// get `None`. Composites must be decomposed first; control flow is not differentiable yet.
pub fn vjp<E: Emitter>(
    e: &mut E,
    op: &Op,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    wants: &[bool],
) -> Result<Vec<Option<E::Value>>, E::Error> {
    let n = inputs.len();
    let none = vec![None; n];
    if !wants.iter().any(|&w| w) {
        return Ok(none);
    }
    // Only single-output primitives are differentiable; their cotangent is cotangents[0].
    let g = match cotangents.first() {
        Some(Some(g)) => *g,
        _ => return Ok(none),
    };
    let ty = |e: &E, v: E::Value| e.value_type(v);
    let want = |i: usize| wants.get(i).copied().unwrap_or(false);
    Ok(match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant(_) | Op::Iota { .. } | Op::Random { .. } => none,
        Op::ArgReduce { .. } => none,
        Op::Unary(u) => vec![unary(e, *u, inputs[0], outputs[0], g)?],
        Op::Binary(b) => binary(e, *b, inputs[0], inputs[1], outputs[0], g, want(0), want(1))?,
        Op::Where => {
            let zero = e.add_scalar(ty(e, g).dtype, 0.0)?;
            let ga = if want(1) {
                let w = e.add_op1(Op::Where, &[inputs[0], g, zero])?;
                Some(e.sum_to(w, &ty(e, inputs[1]).shape)?)
            } else {
                None
            };
            let gb = if want(2) {
                let w = e.add_op1(Op::Where, &[inputs[0], zero, g])?;
                Some(e.sum_to(w, &ty(e, inputs[2]).shape)?)
            } else {
                None
            };
            vec![None, ga, gb]
        }
        Op::Reduce { op: r, axes, keepdim } => vec![Some(reduce(e, *r, axes, *keepdim, inputs[0], outputs[0], g)?)],
        Op::Reshape { .. } => vec![Some(e.reshape(g, &ty(e, inputs[0]).shape)?)],
        Op::Permute { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(e.permute(g, inv)?)]
        }
        Op::Broadcast { .. } => vec![Some(e.sum_to(g, &ty(e, inputs[0]).shape)?)],
        Op::Slice { ranges } => vec![Some(slice_grad(e, ranges, inputs[0], g)?)],
        Op::Pad { before, .. } => {
            let shape = ty(e, inputs[0]).shape;
            let ranges = shape
                .0
                .iter()
                .zip(before)
                .map(|(d, &b)| match d {
                    Dim::Static(n) => SliceRange::new(b as i64, (b + n) as i64),
                    Dim::Sym(_) => SliceRange::FULL,
                })
                .collect();
            vec![Some(e.add_op1(Op::Slice { ranges }, &[g])?)]
        }
        Op::Concat { axis } => {
            let mut offset = 0i64;
            let mut out = Vec::with_capacity(n);
            for (i, &x) in inputs.iter().enumerate() {
                let t = ty(e, x);
                let len = match &t.shape.0[*axis] {
                    Dim::Static(l) => *l as i64,
                    Dim::Sym(_) => i64::MAX - offset,
                };
                if want(i) {
                    let mut ranges = vec![SliceRange::FULL; t.rank()];
                    ranges[*axis] = SliceRange::new(offset, offset.saturating_add(len));
                    out.push(Some(e.add_op1(Op::Slice { ranges }, &[g])?));
                } else {
                    out.push(None);
                }
                offset = offset.saturating_add(len);
            }
            out
        }
        Op::Gather { axis } => {
            let zeros = e.full(&ty(e, inputs[0]), 0.0)?;
            let scatter = Op::Scatter {
                axis: *axis,
                reduce: ScatterReduce::Add,
            };
            vec![Some(e.add_op1(scatter, &[zeros, inputs[1], g])?), None]
        }
        Op::Scatter { axis, reduce } => {
            let gdata = match reduce {
                ScatterReduce::Add => g,
                ScatterReduce::Replace => {
                    let zeros = e.full(&ty(e, inputs[2]), 0.0)?;
                    let scatter = Op::Scatter {
                        axis: *axis,
                        reduce: ScatterReduce::Replace,
                    };
                    e.add_op1(scatter, &[g, inputs[1], zeros])?
                }
            };
            let gupd = if want(2) {
                Some(e.add_op1(Op::Gather { axis: *axis }, &[g, inputs[1]])?)
            } else {
                None
            };
            vec![Some(gdata), None, gupd]
        }
        Op::Cast { .. } => {
            let from = ty(e, inputs[0]).dtype;
            if from.is_float() && ty(e, g).dtype.is_float() {
                vec![Some(e.cast(g, from)?)]
            } else {
                none
            }
        }
        Op::MatMul => {
            let (a, b) = (inputs[0], inputs[1]);
            let ga = if want(0) {
                let bt = e.transpose_last(b)?;
                let m = e.add_op1(Op::MatMul, &[g, bt])?;
                Some(e.sum_to(m, &ty(e, a).shape)?)
            } else {
                None
            };
            let gb = if want(1) {
                let at = e.transpose_last(a)?;
                let m = e.add_op1(Op::MatMul, &[at, g])?;
                Some(e.sum_to(m, &ty(e, b).shape)?)
            } else {
                None
            };
            vec![ga, gb]
        }
        Op::Conv { .. } => {
            let gx = if want(0) {
                Some(conv_grad_input(e, op, inputs[0], inputs[1], g)?)
            } else {
                None
            };
            let gw = if want(1) {
                Some(conv_grad_weight(e, op, inputs[0], inputs[1], g)?)
            } else {
                None
            };
            vec![gx, gw]
        }
        Op::Composite(_) => return Err(unsupported(op, "decompose composites before differentiating").into()),
        Op::Cond | Op::While => {
            return Err(unsupported(op, "gradients through control flow are not supported yet").into());
        }
    })
}

fn unary<E: Emitter>(
    e: &mut E,
    u: UnaryOp,
    x: E::Value,
    y: E::Value,
    g: E::Value,
) -> Result<Option<E::Value>, E::Error> {
    use BinaryOp::{Div, Mul, Sub};
    let dtype = e.value_type(x).dtype;
    Ok(Some(match u {
        UnaryOp::Neg => e.unary(UnaryOp::Neg, g)?,
        UnaryOp::Abs => {
            let s = e.unary(UnaryOp::Sign, x)?;
            e.binary(Mul, g, s)?
        }
        UnaryOp::Exp => e.binary(Mul, g, y)?,
        UnaryOp::Log => e.binary(Div, g, x)?,
        UnaryOp::Sqrt => {
            let two_y = e.binary_scalar(Mul, y, 2.0)?;
            e.binary(Div, g, two_y)?
        }
        UnaryOp::Rsqrt => {
            // d/dx x^-1/2 = -1/2 · x^-1/2 / x
            let t = e.binary(Div, y, x)?;
            let t = e.binary_scalar(Mul, t, -0.5)?;
            e.binary(Mul, g, t)?
        }
        UnaryOp::Recip => {
            let yy = e.binary(Mul, y, y)?;
            let t = e.binary(Mul, g, yy)?;
            e.unary(UnaryOp::Neg, t)?
        }
        UnaryOp::Sin => {
            let c = e.unary(UnaryOp::Cos, x)?;
            e.binary(Mul, g, c)?
        }
        UnaryOp::Cos => {
            let s = e.unary(UnaryOp::Sin, x)?;
            let t = e.binary(Mul, g, s)?;
            e.unary(UnaryOp::Neg, t)?
        }
        UnaryOp::Tanh => {
            let yy = e.binary(Mul, y, y)?;
            let one = e.add_scalar(dtype, 1.0)?;
            let d = e.binary(Sub, one, yy)?;
            e.binary(Mul, g, d)?
        }
        UnaryOp::Erf => {
            // d/dx erf(x) = 2/√π · exp(-x²)
            let xx = e.binary(Mul, x, x)?;
            let nxx = e.unary(UnaryOp::Neg, xx)?;
            let ex = e.unary(UnaryOp::Exp, nxx)?;
            let d = e.binary_scalar(Mul, ex, std::f64::consts::FRAC_2_SQRT_PI)?;
            e.binary(Mul, g, d)?
        }
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign | UnaryOp::Not => return Ok(None),
    }))
}

#[allow(clippy::too_many_arguments)]
fn binary<E: Emitter>(
    e: &mut E,
    b: BinaryOp,
    x: E::Value,
    y: E::Value,
    out: E::Value,
    g: E::Value,
    want_x: bool,
    want_y: bool,
) -> Result<Vec<Option<E::Value>>, E::Error> {
    use BinaryOp::*;
    let (sx, sy) = (e.value_type(x).shape, e.value_type(y).shape);
    let dtype = e.value_type(g).dtype;
    if b.is_comparison() || b.is_logical() || !dtype.is_float() {
        return Ok(vec![None, None]);
    }
    // Each side's raw (broadcast-shaped) gradient, then summed back to its operand's shape.
    let (gx, gy) = match b {
        Add => (Some(g), Some(g)),
        Sub => (Some(g), if want_y { Some(e.unary(UnaryOp::Neg, g)?) } else { None }),
        Mul => (
            if want_x { Some(e.binary(Mul, g, y)?) } else { None },
            if want_y { Some(e.binary(Mul, g, x)?) } else { None },
        ),
        Div => {
            let gx = e.binary(Div, g, y)?;
            let gy = if want_y {
                let t = e.binary(Mul, gx, out)?;
                Some(e.unary(UnaryOp::Neg, t)?)
            } else {
                None
            };
            (Some(gx), gy)
        }
        Pow => {
            let gx = if want_x {
                let ym1 = e.binary_scalar(Sub, y, 1.0)?;
                let p = e.binary(Pow, x, ym1)?;
                let t = e.binary(Mul, y, p)?;
                Some(e.binary(Mul, g, t)?)
            } else {
                None
            };
            let gy = if want_y {
                let l = e.unary(UnaryOp::Log, x)?;
                let t = e.binary(Mul, out, l)?;
                Some(e.binary(Mul, g, t)?)
            } else {
                None
            };
            (gx, gy)
        }
        Max | Min => {
            // The larger (smaller) side takes the gradient; ties split it evenly (as PyTorch).
            let (wins_x, wins_y) = if b == Max { (Gt, Lt) } else { (Lt, Gt) };
            let zero = e.add_scalar(dtype, 0.0)?;
            let half = e.binary_scalar(Mul, g, 0.5)?;
            let tie = e.binary(Eq, x, y)?;
            let tied = e.add_op1(Op::Where, &[tie, half, zero])?;
            let side = |e: &mut E, cmp: BinaryOp| -> Result<E::Value, E::Error> {
                let c = e.binary(cmp, x, y)?;
                e.add_op1(Op::Where, &[c, g, tied])
            };
            (
                if want_x { Some(side(e, wins_x)?) } else { None },
                if want_y { Some(side(e, wins_y)?) } else { None },
            )
        }
        Rem => {
            // a mod b = a - floor(a/b)·b
            let gy = if want_y {
                let q = e.binary(Div, x, y)?;
                let f = e.unary(UnaryOp::Floor, q)?;
                let t = e.binary(Mul, g, f)?;
                Some(e.unary(UnaryOp::Neg, t)?)
            } else {
                None
            };
            (Some(g), gy)
        }
        Eq | Ne | Lt | Le | Gt | Ge | And | Or | Xor => (None, None),
    };
    let gx = match gx.filter(|_| want_x) {
        Some(v) => Some(e.sum_to(v, &sx)?),
        None => None,
    };
    let gy = match gy.filter(|_| want_y) {
        Some(v) => Some(e.sum_to(v, &sy)?),
        None => None,
    };
    Ok(vec![gx, gy])
}

/// Shape of a reduced value with `keepdim = true`.
fn keep_shape(s: &Shape, axes: &[usize]) -> Shape {
    Shape(
        s.0.iter()
            .enumerate()
            .map(|(i, d)| if axes.contains(&i) { Dim::Static(1) } else { d.clone() })
            .collect(),
    )
}

fn reduce<E: Emitter>(
    e: &mut E,
    r: ReduceOp,
    axes: &[usize],
    _keepdim: bool,
    x: E::Value,
    y: E::Value,
    g: E::Value,
) -> Result<E::Value, E::Error> {
    use BinaryOp::{Div, Eq, Mul};
    let xt: TensorType = e.value_type(x);
    let ks = keep_shape(&xt.shape, axes);
    let gk = e.reshape(g, &ks)?;
    let gb = e.broadcast_to(gk, &xt.shape)?;
    Ok(match r {
        ReduceOp::Sum => gb,
        ReduceOp::Mean => {
            let count: Option<usize> = axes.iter().map(|&a| xt.shape.0[a].as_static()).product();
            match count {
                Some(c) => e.binary_scalar(Div, gb, c as f64)?,
                None => {
                    // A symbolic reduced axis: count the elements at run time.
                    let ones = e.full(&xt, 1.0)?;
                    let c = e.reduce(ReduceOp::Sum, ones, axes.to_vec(), true)?;
                    e.binary(Div, gb, c)?
                }
            }
        }
        ReduceOp::Max | ReduceOp::Min => {
            // Split evenly among the elements equal to the extremum.
            let yk = e.reshape(y, &ks)?;
            let hit = e.binary(Eq, x, yk)?;
            let mask = e.cast(hit, xt.dtype)?;
            let count = e.reduce(ReduceOp::Sum, mask, axes.to_vec(), true)?;
            let share = e.binary(Div, gk, count)?;
            e.binary(Mul, mask, share)?
        }
        ReduceOp::Prod => {
            // ∂/∂xᵢ Πx = Πx / xᵢ (undefined where xᵢ = 0, as in the naive rule).
            let yk = e.reshape(y, &ks)?;
            let t = e.binary(Mul, gk, yk)?;
            e.binary(Div, t, x)?
        }
    })
}

/// Gradient of a strided slice: place `g` back into zeros of the input's shape.
fn slice_grad<E: Emitter>(e: &mut E, ranges: &[SliceRange], x: E::Value, g: E::Value) -> Result<E::Value, E::Error> {
    let xt = e.value_type(x);
    let mut cur = g;
    for (axis, (r, d)) in ranges.iter().zip(&xt.shape.0).enumerate() {
        let size = match d {
            Dim::Static(n) => *n,
            Dim::Sym(_) => continue, // only full slices are allowed on symbolic axes
        };
        let (start, count) = r.resolve(size);
        let step = r.step.max(1) as usize;
        let ct = e.value_type(cur);
        if step > 1 && count > 0 {
            // Interleave zeros: [.., n, ..] → [.., n, step, ..] padded → [.., n·step, ..].
            let mut dims = ct.shape.0.clone();
            dims.insert(axis + 1, Dim::Static(1));
            let r1 = e.reshape(cur, &Shape(dims))?;
            let before = vec![0; ct.rank() + 1];
            let mut after = vec![0; ct.rank() + 1];
            after[axis + 1] = step - 1;
            let zero = crate::Float(0.0);
            let p = e.add_op1(
                Op::Pad {
                    before,
                    after,
                    value: zero,
                },
                &[r1],
            )?;
            let mut flat = ct.shape.0.clone();
            flat[axis] = Dim::Static(count * step);
            cur = e.reshape(p, &Shape(flat))?;
        }
        let ct = e.value_type(cur);
        let len = ct.shape.0[axis].as_static().unwrap_or(0);
        let mut before = vec![0; ct.rank()];
        let mut after = vec![0; ct.rank()];
        before[axis] = start;
        if start + len <= size {
            after[axis] = size - start - len;
        } else {
            // The interleaved tail ran past the end: trim it first.
            let mut ranges = vec![SliceRange::FULL; ct.rank()];
            ranges[axis] = SliceRange::new(0, (size - start) as i64);
            cur = e.add_op1(Op::Slice { ranges }, &[cur])?;
        }
        if before[axis] + after[axis] > 0 {
            cur = e.add_op1(
                Op::Pad {
                    before,
                    after,
                    value: crate::Float(0.0),
                },
                &[cur],
            )?;
        }
    }
    Ok(cur)
}
