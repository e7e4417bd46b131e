//! Normalizations: batch_norm (training and inference) and layer_norm.

use super::build::{V, bin, bin_scalar, reduce, reshape, un};
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use crate::{Dim, Graph, IrError, TensorType, ValueId};

/// A per-channel vector `[C]` reshaped to `[C, 1, ..]` so it broadcasts against `x[N, C, ..]`.
fn per_channel(g: &mut Graph, v: ValueId, xt: &TensorType) -> V {
    if xt.rank() == 2 {
        return Ok(v);
    }
    let mut shape = vec![xt.shape.0[1].clone()];
    shape.extend(std::iter::repeat_n(Dim::Static(1), xt.rank() - 2));
    reshape(g, v, shape)
}

/// `(x - mean) * (scale * rsqrt(var + eps)) + bias`, with the per-channel factor computed on
/// `[C]` before broadcasting.
fn normalize(g: &mut Graph, x: ValueId, xt: &TensorType, mean: ValueId, var: ValueId, sb: [ValueId; 2], eps: f64) -> V {
    let ve = bin_scalar(g, BinaryOp::Add, var, eps)?;
    let inv = un(g, UnaryOp::Rsqrt, ve)?;
    let factor = bin(g, BinaryOp::Mul, sb[0], inv)?;
    let mean_b = per_channel(g, mean, xt)?;
    let factor_b = per_channel(g, factor, xt)?;
    let bias_b = per_channel(g, sb[1], xt)?;
    let centered = bin(g, BinaryOp::Sub, x, mean_b)?;
    let scaled = bin(g, BinaryOp::Mul, centered, factor_b)?;
    bin(g, BinaryOp::Add, scaled, bias_b)
}

/// `momentum * running + (1 - momentum) * batch` (Paddle's running-stat rule).
fn blend(g: &mut Graph, running: ValueId, batch: ValueId, momentum: f64) -> V {
    let a = bin_scalar(g, BinaryOp::Mul, running, momentum)?;
    let b = bin_scalar(g, BinaryOp::Mul, batch, 1.0 - momentum)?;
    bin(g, BinaryOp::Add, a, b)
}

/// `batch_norm(x, scale, bias, running_mean, running_var)`. Training reduces over every axis
/// but the channel axis with `reduce_mean`, so a symbolic batch dim needs no element count.
pub(super) fn batch_norm(
    g: &mut Graph,
    x: &[ValueId],
    xt: &TensorType,
    eps: f64,
    momentum: f64,
    training: bool,
) -> Result<Vec<ValueId>, IrError> {
    let sb = [x[1], x[2]];
    if !training {
        return Ok(vec![normalize(g, x[0], xt, x[3], x[4], sb, eps)?]);
    }
    let axes: Vec<usize> = (0..xt.rank()).filter(|&a| a != 1).collect();
    let mean = reduce(g, ReduceOp::Mean, x[0], axes.clone(), false)?;
    let mean_b = per_channel(g, mean, xt)?;
    let centered = bin(g, BinaryOp::Sub, x[0], mean_b)?;
    let sq = bin(g, BinaryOp::Mul, centered, centered)?;
    // Biased variance, as Paddle uses both for normalizing and for the running stat.
    let var = reduce(g, ReduceOp::Mean, sq, axes, false)?;
    let y = normalize(g, x[0], xt, mean, var, sb, eps)?;
    let rm = blend(g, x[3], mean, momentum)?;
    let rv = blend(g, x[4], var, momentum)?;
    Ok(vec![y, rm, rv])
}

/// `layer_norm(x, weight?, bias?)` over the trailing `n` axes.
pub(super) fn layer_norm(g: &mut Graph, x: &[ValueId], xt: &TensorType, n: usize, eps: f64) -> V {
    let axes: Vec<usize> = (xt.rank() - n..xt.rank()).collect();
    let mean = reduce(g, ReduceOp::Mean, x[0], axes.clone(), true)?;
    let centered = bin(g, BinaryOp::Sub, x[0], mean)?;
    let sq = bin(g, BinaryOp::Mul, centered, centered)?;
    let var = reduce(g, ReduceOp::Mean, sq, axes, true)?;
    let ve = bin_scalar(g, BinaryOp::Add, var, eps)?;
    let inv = un(g, UnaryOp::Rsqrt, ve)?;
    let y = bin(g, BinaryOp::Mul, centered, inv)?;
    match (x.get(1), x.get(2)) {
        (Some(&w), Some(&b)) => {
            let yw = bin(g, BinaryOp::Mul, y, w)?;
            bin(g, BinaryOp::Add, yw, b)
        }
        _ => Ok(y),
    }
}
