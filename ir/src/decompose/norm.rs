//! Normalizations: batch_norm (training and inference) and layer_norm.

use super::build::{V, reshape};
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use crate::{Dim, Emitter, TensorType};

/// A per-channel vector `[C]` reshaped to `[C, 1, ..]` so it broadcasts against `x[N, C, ..]`.
fn per_channel<E: Emitter>(g: &mut E, v: E::Value, xt: &TensorType) -> V<E> {
    if xt.rank() == 2 {
        return Ok(v);
    }
    let mut shape = vec![xt.shape.0[1].clone()];
    shape.extend(std::iter::repeat_n(Dim::Static(1), xt.rank() - 2));
    reshape(g, v, shape)
}

/// `(x - mean) * (scale * rsqrt(var + eps)) + bias`, with the per-channel factor computed on
/// `[C]` before broadcasting.
fn normalize<E: Emitter>(
    g: &mut E,
    x: E::Value,
    xt: &TensorType,
    mean: E::Value,
    var: E::Value,
    sb: [E::Value; 2],
    eps: f64,
) -> V<E> {
    let ve = g.binary_scalar(BinaryOp::Add, var, eps)?;
    let inv = g.unary(UnaryOp::Rsqrt, ve)?;
    let factor = g.binary(BinaryOp::Mul, sb[0], inv)?;
    let mean_b = per_channel(g, mean, xt)?;
    let factor_b = per_channel(g, factor, xt)?;
    let bias_b = per_channel(g, sb[1], xt)?;
    let centered = g.binary(BinaryOp::Sub, x, mean_b)?;
    let scaled = g.binary(BinaryOp::Mul, centered, factor_b)?;
    g.binary(BinaryOp::Add, scaled, bias_b)
}

/// `momentum * running + (1 - momentum) * batch` (Paddle's running-stat rule).
fn blend<E: Emitter>(g: &mut E, running: E::Value, batch: E::Value, momentum: f64) -> V<E> {
    let a = g.binary_scalar(BinaryOp::Mul, running, momentum)?;
    let b = g.binary_scalar(BinaryOp::Mul, batch, 1.0 - momentum)?;
    g.binary(BinaryOp::Add, a, b)
}

/// `batch_norm(x, scale, bias, running_mean, running_var)`. Training reduces over every axis
/// but the channel axis with `reduce_mean`, so a symbolic batch dim needs no element count.
pub(super) fn batch_norm<E: Emitter>(
    g: &mut E,
    x: &[E::Value],
    xt: &TensorType,
    eps: f64,
    momentum: f64,
    training: bool,
) -> Result<Vec<E::Value>, E::Error> {
    let sb = [x[1], x[2]];
    if !training {
        return Ok(vec![normalize(g, x[0], xt, x[3], x[4], sb, eps)?]);
    }
    let axes: Vec<usize> = (0..xt.rank()).filter(|&a| a != 1).collect();
    let mean = g.reduce(ReduceOp::Mean, x[0], axes.clone(), false)?;
    let mean_b = per_channel(g, mean, xt)?;
    let centered = g.binary(BinaryOp::Sub, x[0], mean_b)?;
    let sq = g.binary(BinaryOp::Mul, centered, centered)?;
    // Biased variance, as Paddle uses both for normalizing and for the running stat.
    let var = g.reduce(ReduceOp::Mean, sq, axes, false)?;
    let y = normalize(g, x[0], xt, mean, var, sb, eps)?;
    let rm = blend(g, x[3], mean, momentum)?;
    let rv = blend(g, x[4], var, momentum)?;
    Ok(vec![y, rm, rv])
}

/// `layer_norm(x, weight?, bias?)` over the trailing `n` axes.
pub(super) fn layer_norm<E: Emitter>(g: &mut E, x: &[E::Value], xt: &TensorType, n: usize, eps: f64) -> V<E> {
    let axes: Vec<usize> = (xt.rank() - n..xt.rank()).collect();
    let mean = g.reduce(ReduceOp::Mean, x[0], axes.clone(), true)?;
    let centered = g.binary(BinaryOp::Sub, x[0], mean)?;
    let sq = g.binary(BinaryOp::Mul, centered, centered)?;
    let var = g.reduce(ReduceOp::Mean, sq, axes, true)?;
    let ve = g.binary_scalar(BinaryOp::Add, var, eps)?;
    let inv = g.unary(UnaryOp::Rsqrt, ve)?;
    let y = g.binary(BinaryOp::Mul, centered, inv)?;
    match (x.get(1), x.get(2)) {
        (Some(&w), Some(&b)) => {
            let yw = g.binary(BinaryOp::Mul, y, w)?;
            g.binary(BinaryOp::Add, yw, b)
        }
        _ => Ok(y),
    }
}
