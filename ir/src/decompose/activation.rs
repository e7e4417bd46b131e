//! Elementwise activations, softmax/log_softmax, and dropout.

use super::build::{V, bin, bin_scalar, reduce, scalar_like, select, un};
use crate::ops::{BinaryOp, RandomDist, ReduceOp, UnaryOp};
use crate::{DType, Float, Graph, Op, TensorType, ValueId};

/// `max(x, 0)`.
pub(super) fn relu(g: &mut Graph, x: ValueId) -> V {
    bin_scalar(g, BinaryOp::Max, x, 0.0)
}

/// `1 / (1 + exp(-x))`.
pub(super) fn sigmoid(g: &mut Graph, x: ValueId) -> V {
    let n = un(g, UnaryOp::Neg, x)?;
    let e = un(g, UnaryOp::Exp, n)?;
    let d = bin_scalar(g, BinaryOp::Add, e, 1.0)?;
    un(g, UnaryOp::Recip, d)
}

/// `x * sigmoid(x)`.
pub(super) fn silu(g: &mut Graph, x: ValueId) -> V {
    let s = sigmoid(g, x)?;
    bin(g, BinaryOp::Mul, x, s)
}

/// GELU: `0.5 x (1 + erf(x / √2))`, or with `approximate` the tanh form
/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
pub(super) fn gelu(g: &mut Graph, x: ValueId, approximate: bool) -> V {
    let inner = if approximate {
        let x2 = bin(g, BinaryOp::Mul, x, x)?;
        let x3 = bin(g, BinaryOp::Mul, x2, x)?;
        let c = bin_scalar(g, BinaryOp::Mul, x3, 0.044715)?;
        let s = bin(g, BinaryOp::Add, x, c)?;
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let a = bin_scalar(g, BinaryOp::Mul, s, k)?;
        un(g, UnaryOp::Tanh, a)?
    } else {
        let a = bin_scalar(g, BinaryOp::Mul, x, std::f64::consts::FRAC_1_SQRT_2)?;
        un(g, UnaryOp::Erf, a)?
    };
    let one_plus = bin_scalar(g, BinaryOp::Add, inner, 1.0)?;
    let half_x = bin_scalar(g, BinaryOp::Mul, x, 0.5)?;
    bin(g, BinaryOp::Mul, half_x, one_plus)
}

/// `x - max(x)` along `axis`, the shift that keeps `exp` from overflowing.
fn shifted(g: &mut Graph, x: ValueId, axis: usize) -> V {
    let m = reduce(g, ReduceOp::Max, x, vec![axis], true)?;
    bin(g, BinaryOp::Sub, x, m)
}

/// `exp(x - m) / Σ exp(x - m)` with `m = max(x)` along `axis`.
pub(super) fn softmax(g: &mut Graph, x: ValueId, axis: usize) -> V {
    let z = shifted(g, x, axis)?;
    let e = un(g, UnaryOp::Exp, z)?;
    let s = reduce(g, ReduceOp::Sum, e, vec![axis], true)?;
    bin(g, BinaryOp::Div, e, s)
}

/// `(x - m) - log Σ exp(x - m)` with `m = max(x)` along `axis`.
pub(super) fn log_softmax(g: &mut Graph, x: ValueId, axis: usize) -> V {
    let z = shifted(g, x, axis)?;
    let e = un(g, UnaryOp::Exp, z)?;
    let s = reduce(g, ReduceOp::Sum, e, vec![axis], true)?;
    let l = un(g, UnaryOp::Log, s)?;
    bin(g, BinaryOp::Sub, z, l)
}

/// Dropout (`upscale_in_train`): keep where a uniform `[0, 1)` draw with the op's seed is
/// `≥ p`, scaling kept values by `1 / (1 - p)`; in inference the input itself. The draw is
/// made in f64 whatever x's dtype, so the mask is exactly the shared generator's (a draw
/// rounded to f32 could round up to `p` and flip an element).
pub(super) fn dropout(g: &mut Graph, x: ValueId, xt: &TensorType, p: f64, training: bool, seed: u64) -> V {
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
    let keep = bin_scalar(g, BinaryOp::Ge, u, p)?;
    let scaled = bin_scalar(g, BinaryOp::Div, x, 1.0 - p)?;
    let zero = scalar_like(g, x, 0.0);
    select(g, keep, scaled, zero)
}
