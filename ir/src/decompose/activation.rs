//! Elementwise activations, softmax/log_softmax, and dropout.

use super::build::{V, scalar_like, select};
use crate::ops::{BinaryOp, RandomDist, ReduceOp, UnaryOp};
use crate::{DType, Emitter, Float, Op, TensorType};

/// `max(x, 0)`.
pub(super) fn relu<E: Emitter>(g: &mut E, x: E::Value) -> V<E> {
    g.binary_scalar(BinaryOp::Max, x, 0.0)
}

/// `1 / (1 + exp(-x))`.
pub(super) fn sigmoid<E: Emitter>(g: &mut E, x: E::Value) -> V<E> {
    let n = g.unary(UnaryOp::Neg, x)?;
    let e = g.unary(UnaryOp::Exp, n)?;
    let d = g.binary_scalar(BinaryOp::Add, e, 1.0)?;
    g.unary(UnaryOp::Recip, d)
}

/// `x * sigmoid(x)`.
pub(super) fn silu<E: Emitter>(g: &mut E, x: E::Value) -> V<E> {
    let s = sigmoid(g, x)?;
    g.binary(BinaryOp::Mul, x, s)
}

/// GELU: `0.5 x (1 + erf(x / √2))`, or with `approximate` the tanh form
/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
pub(super) fn gelu<E: Emitter>(g: &mut E, x: E::Value, approximate: bool) -> V<E> {
    let inner = if approximate {
        let x2 = g.binary(BinaryOp::Mul, x, x)?;
        let x3 = g.binary(BinaryOp::Mul, x2, x)?;
        let c = g.binary_scalar(BinaryOp::Mul, x3, 0.044715)?;
        let s = g.binary(BinaryOp::Add, x, c)?;
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let a = g.binary_scalar(BinaryOp::Mul, s, k)?;
        g.unary(UnaryOp::Tanh, a)?
    } else {
        let a = g.binary_scalar(BinaryOp::Mul, x, std::f64::consts::FRAC_1_SQRT_2)?;
        g.unary(UnaryOp::Erf, a)?
    };
    let one_plus = g.binary_scalar(BinaryOp::Add, inner, 1.0)?;
    let half_x = g.binary_scalar(BinaryOp::Mul, x, 0.5)?;
    g.binary(BinaryOp::Mul, half_x, one_plus)
}

/// `x - max(x)` along `axis`, the shift that keeps `exp` from overflowing.
fn shifted<E: Emitter>(g: &mut E, x: E::Value, axis: usize) -> V<E> {
    let m = g.reduce(ReduceOp::Max, x, vec![axis], true)?;
    g.binary(BinaryOp::Sub, x, m)
}

/// `exp(x - m) / Σ exp(x - m)` with `m = max(x)` along `axis`.
pub(super) fn softmax<E: Emitter>(g: &mut E, x: E::Value, axis: usize) -> V<E> {
    let z = shifted(g, x, axis)?;
    let e = g.unary(UnaryOp::Exp, z)?;
    let s = g.reduce(ReduceOp::Sum, e, vec![axis], true)?;
    g.binary(BinaryOp::Div, e, s)
}

/// `(x - m) - log Σ exp(x - m)` with `m = max(x)` along `axis`.
pub(super) fn log_softmax<E: Emitter>(g: &mut E, x: E::Value, axis: usize) -> V<E> {
    let z = shifted(g, x, axis)?;
    let e = g.unary(UnaryOp::Exp, z)?;
    let s = g.reduce(ReduceOp::Sum, e, vec![axis], true)?;
    let l = g.unary(UnaryOp::Log, s)?;
    g.binary(BinaryOp::Sub, z, l)
}

/// Dropout (`upscale_in_train`): keep where a uniform `[0, 1)` draw with the op's seed is
/// `≥ p`, scaling kept values by `1 / (1 - p)`; in inference the input itself. The draw is
/// made in f64 whatever x's dtype, so the mask is exactly the shared generator's (a draw
/// rounded to f32 could round up to `p` and flip an element).
pub(super) fn dropout<E: Emitter>(g: &mut E, x: E::Value, xt: &TensorType, p: f64, training: bool, seed: u64) -> V<E> {
    if !training {
        return Ok(x);
    }
    let random = Op::Random {
        dist: RandomDist::Uniform {
            low: Float(0.0),
            high: Float(1.0),
        },
        shape: xt.shape.0.clone(),
        dtype: DType::F64,
        seed,
    };
    let u = g.add_op1(random, &[])?;
    let keep = g.binary_scalar(BinaryOp::Ge, u, p)?;
    let scaled = g.binary_scalar(BinaryOp::Div, x, 1.0 - p)?;
    let zero = scalar_like(g, x, 0.0)?;
    select(g, keep, scaled, zero)
}
