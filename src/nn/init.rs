//! Parameter initializers (Paddle's `nn.initializer`, PyTorch's `nn.init`): each fills an
//! existing tensor in place with `set_data`, drawing from the global generator (`oar::seed`
//! makes them reproducible).
//!
//! Fans follow Paddle's rule, which matches oar's weight layouts: a 2-d weight is `[in, out]`
//! (`fan_in = shape[0]`, `fan_out = shape[1]`); a conv weight `[O, C/groups, k..]` has
//! `fan_in = C/groups · ∏k` and `fan_out = O · ∏k`; a 1-d tensor has both fans equal to its
//! length and a 0-d tensor has both equal to 1.

use crate::error::{Error, Result};
use crate::tensor::{self, Tensor};

/// `(fan_in, fan_out)` of a weight of `shape` (see the module docs for the rule).
pub fn fans(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (*n, *n),
        [i, o] => (*i, *o),
        [o, i, rest @ ..] => {
            let field: usize = rest.iter().product();
            (i * field, o * field)
        }
    }
}

/// The recommended gain for a nonlinearity (PyTorch/Paddle `calculate_gain`): `linear`,
/// `conv1d`, `conv2d`, `sigmoid` → 1; `tanh` → 5/3; `relu` → √2; `leaky_relu` → √(2/(1+slope²))
/// with `param` the negative slope (default 0.01); `selu` → 3/4.
pub fn calculate_gain(nonlinearity: &str, param: Option<f64>) -> Result<f64> {
    Ok(match nonlinearity {
        "linear" | "conv1d" | "conv2d" | "conv3d" | "sigmoid" => 1.0,
        "tanh" => 5.0 / 3.0,
        "relu" => 2f64.sqrt(),
        "leaky_relu" => {
            let s = param.unwrap_or(0.01);
            (2.0 / (1.0 + s * s)).sqrt()
        }
        "selu" => 0.75,
        other => {
            return Err(Error::invalid(
                "calculate_gain",
                format!("unknown nonlinearity `{other}`"),
            ));
        }
    })
}

/// Check `t` can be filled with random floats; `None` when it has no elements (nothing to do).
fn target(op: &str, t: &Tensor) -> Result<Option<Vec<usize>>> {
    if !t.dtype().is_float() {
        return Err(Error::invalid(
            op,
            format!("can only fill float tensors, got {}", t.tensor_type()),
        ));
    }
    let shape = t.shape();
    Ok((t.numel() > 0).then_some(shape))
}

fn check_finite(op: &str, what: &str, v: f64) -> Result<()> {
    if !v.is_finite() {
        return Err(Error::invalid(op, format!("{what} = {v} is not finite")));
    }
    Ok(())
}

/// Fill with `U(low, high)`.
pub fn uniform(t: &Tensor, low: f64, high: f64) -> Result<()> {
    check_finite("init.uniform", "low", low)?;
    check_finite("init.uniform", "high", high)?;
    if low > high {
        return Err(Error::invalid("init.uniform", format!("low {low} > high {high}")));
    }
    let Some(shape) = target("init.uniform", t)? else {
        return Ok(());
    };
    t.set_data(tensor::uniform(&shape, low, high, t.dtype())?.data())
}

/// Fill with `N(mean, std²)`.
pub fn normal(t: &Tensor, mean: f64, std: f64) -> Result<()> {
    check_finite("init.normal", "mean", mean)?;
    check_finite("init.normal", "std", std)?;
    if std < 0.0 {
        return Err(Error::invalid("init.normal", format!("std {std} must be ≥ 0")));
    }
    let Some(shape) = target("init.normal", t)? else {
        return Ok(());
    };
    t.set_data(tensor::normal(&shape, mean, std, t.dtype())?.data())
}

/// Fill with `value` (any dtype; converted).
pub fn constant(t: &Tensor, value: f64) -> Result<()> {
    t.set_data(tensor::full(&t.shape(), value, t.dtype())?.data())
}

/// Xavier/Glorot uniform: `U(-a, a)` with `a = gain · √(6 / (fan_in + fan_out))`.
pub fn xavier_uniform(t: &Tensor, gain: f64) -> Result<()> {
    let (i, o) = fans(&t.shape());
    let a = gain * (6.0 / (i + o).max(1) as f64).sqrt();
    uniform(t, -a.abs(), a.abs())
}

/// Xavier/Glorot normal: `N(0, std²)` with `std = gain · √(2 / (fan_in + fan_out))`.
pub fn xavier_normal(t: &Tensor, gain: f64) -> Result<()> {
    let (i, o) = fans(&t.shape());
    normal(t, 0.0, gain.abs() * (2.0 / (i + o).max(1) as f64).sqrt())
}

/// Kaiming/He uniform for a (leaky) ReLU with `negative_slope` (0 for ReLU, Paddle's default):
/// `U(-a, a)` with `a = gain · √(3 / fan_in)`, `gain = √(2 / (1 + slope²))`.
pub fn kaiming_uniform(t: &Tensor, negative_slope: f64) -> Result<()> {
    let gain = calculate_gain("leaky_relu", Some(negative_slope))?;
    let a = gain * (3.0 / fans(&t.shape()).0.max(1) as f64).sqrt();
    uniform(t, -a, a)
}

/// Kaiming/He normal: `N(0, std²)` with `std = gain / √fan_in`, `gain = √(2 / (1 + slope²))`.
pub fn kaiming_normal(t: &Tensor, negative_slope: f64) -> Result<()> {
    let gain = calculate_gain("leaky_relu", Some(negative_slope))?;
    normal(t, 0.0, gain / (fans(&t.shape()).0.max(1) as f64).sqrt())
}
