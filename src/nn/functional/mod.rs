//! `nn::functional`: the functional API. Each function is one IR composite (or primitive), so
//! eager code, tracing and every backend share one definition.

mod args;
mod conv;
pub(crate) mod loss;
mod quant;
mod vision;

pub use args::{Pad2d, Pair};
pub use conv::conv1d;
pub use loss::{binary_cross_entropy_with_logits, mse_loss, nll_loss};
pub use oar_ir::ops::Reduction;
pub use quant::{dequantize_linear, fake_quant, quantize_linear};
pub use vision::{Interpolation, conv_transpose, group_norm, instance_norm, interpolate, pad};

use crate::error::{Error, Result};
use crate::tensor::{Tensor, apply, apply1};
use oar_ir::ops::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm, BinaryOp, Conv2d, CrossEntropy, Dropout, Gelu,
    LayerNorm, LogSoftmax, MaxPool2d, ScaledDotProductAttention, Softmax,
};
use oar_ir::{Composite, Float, Op};

fn composite1(c: Composite, inputs: &[&Tensor]) -> Result<Tensor> {
    apply1(Op::Composite(c), inputs)
}

fn with_optional<'a>(mut v: Vec<&'a Tensor>, extra: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    v.extend(extra);
    v
}

/// `x @ weight + bias` with Paddle's weight layout `[in, out]`.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    composite1(Composite::Linear, &with_optional(vec![x, weight], bias))
}

/// 2-d convolution of `x[N,C,H,W]` with `weight[O,C/groups,kh,kw]`.
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: impl Into<Pair>,
    padding: impl Into<Pad2d>,
    dilation: impl Into<Pair>,
    groups: usize,
) -> Result<Tensor> {
    let c = Composite::Conv2d(Conv2d {
        stride: stride.into().0,
        padding: padding.into().0,
        dilation: dilation.into().0,
        groups,
    });
    composite1(c, &with_optional(vec![x, weight], bias))
}

/// 2-d max pooling; `stride` defaults to the kernel size.
pub fn max_pool2d(
    x: &Tensor,
    kernel: impl Into<Pair>,
    stride: Option<Pair>,
    padding: impl Into<Pad2d>,
    ceil_mode: bool,
) -> Result<Tensor> {
    let kernel = kernel.into().0;
    let c = Composite::MaxPool2d(MaxPool2d {
        kernel,
        stride: stride.map_or(kernel, |s| s.0),
        padding: padding.into().0,
        ceil_mode,
    });
    composite1(c, &[x])
}

/// 2-d average pooling; `exclusive` (Paddle's default true) divides by in-bounds elements only.
pub fn avg_pool2d(
    x: &Tensor,
    kernel: impl Into<Pair>,
    stride: Option<Pair>,
    padding: impl Into<Pad2d>,
    ceil_mode: bool,
    exclusive: bool,
) -> Result<Tensor> {
    let kernel = kernel.into().0;
    let c = Composite::AvgPool2d(AvgPool2d {
        kernel,
        stride: stride.map_or(kernel, |s| s.0),
        padding: padding.into().0,
        ceil_mode,
        count_include_pad: !exclusive,
    });
    composite1(c, &[x])
}

/// Adaptive average pooling to `output_size`.
pub fn adaptive_avg_pool2d(x: &Tensor, output_size: impl Into<Pair>) -> Result<Tensor> {
    composite1(
        Composite::AdaptiveAvgPool2d(AdaptiveAvgPool2d {
            output_size: output_size.into().0,
        }),
        &[x],
    )
}

/// Adaptive max pooling to `output_size`.
pub fn adaptive_max_pool2d(x: &Tensor, output_size: impl Into<Pair>) -> Result<Tensor> {
    composite1(
        Composite::AdaptiveMaxPool2d(AdaptiveMaxPool2d {
            output_size: output_size.into().0,
        }),
        &[x],
    )
}

/// Batch normalization of `x[N,C,..]`. In training it normalizes with batch statistics and
/// updates `running_mean`/`running_var` in place (`r = momentum·r + (1−momentum)·batch`).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    training: bool,
    momentum: f64,
    epsilon: f64,
) -> Result<Tensor> {
    let c = Composite::BatchNorm(BatchNorm {
        epsilon: Float(epsilon),
        momentum: Float(momentum),
        training,
    });
    let mut outs = apply(Op::Composite(c), &[x, weight, bias, running_mean, running_var])?;
    if training {
        running_mean.assign(&outs[1])?;
        running_var.assign(&outs[2])?;
    }
    Ok(outs.swap_remove(0))
}

/// Layer normalization over the last `normalized_ndim` axes, with optional affine weight/bias
/// (both or neither).
pub fn layer_norm(
    x: &Tensor,
    normalized_ndim: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    epsilon: f64,
) -> Result<Tensor> {
    let c = Composite::LayerNorm(LayerNorm {
        normalized_ndim,
        epsilon: Float(epsilon),
    });
    match (weight, bias) {
        (Some(w), Some(b)) => composite1(c, &[x, w, b]),
        (None, None) => composite1(c, &[x]),
        _ => Err(Error::invalid("layer_norm", "give both weight and bias, or neither")),
    }
}

/// Softmax along `axis` (negative counts from the end).
pub fn softmax(x: &Tensor, axis: i64) -> Result<Tensor> {
    let axis = crate::tensor::norm_axis("softmax", axis, x.ndim())?;
    composite1(Composite::Softmax(Softmax { axis }), &[x])
}

/// Log-softmax along `axis`.
pub fn log_softmax(x: &Tensor, axis: i64) -> Result<Tensor> {
    let axis = crate::tensor::norm_axis("log_softmax", axis, x.ndim())?;
    composite1(Composite::LogSoftmax(LogSoftmax { axis }), &[x])
}

/// Cross-entropy of `logits[N,C]` against integer `labels[N]`; a label outside `0..C` is an
/// error naming it.
pub fn cross_entropy(logits: &Tensor, labels: &Tensor, reduction: Reduction) -> Result<Tensor> {
    if let [_, classes] = logits.shape()[..]
        && !labels.is_traced()
    {
        loss::check_labels("cross_entropy", labels, classes)?;
    }
    composite1(Composite::CrossEntropy(CrossEntropy { reduction }), &[logits, labels])
}

/// `max(x, 0)`.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    composite1(Composite::Relu, &[x])
}

/// GELU (exact erf form, or the tanh approximation).
pub fn gelu(x: &Tensor, approximate: bool) -> Result<Tensor> {
    composite1(Composite::Gelu(Gelu { approximate }), &[x])
}

/// `min(max(x, 0), 6)` (PyTorch `relu6`, Paddle `relu6`). Built from `max` and `min`, so at
/// the kinks 0 and 6 the gradient is ½ (the mean of the one-sided slopes; PyTorch gives 0).
pub fn relu6(x: &Tensor) -> Result<Tensor> {
    x.binary_scalar(BinaryOp::Max, 0.0)?.binary_scalar(BinaryOp::Min, 6.0)
}

/// `relu6(x + 3) / 6` (PyTorch `hardsigmoid`; Paddle's default `slope = 1/6, offset = ½`).
/// Evaluated in PyTorch's order, so values match it bit for bit; at the kinks ±3 the gradient
/// is 1/12 (the mean of the one-sided slopes; PyTorch gives 0).
pub fn hardsigmoid(x: &Tensor) -> Result<Tensor> {
    relu6(&x.binary_scalar(BinaryOp::Add, 3.0)?)?.binary_scalar(BinaryOp::Div, 6.0)
}

/// `x · relu6(x + 3) / 6` (PyTorch and Paddle `hardswish`). Evaluated in PyTorch's order, so
/// values match it bit for bit; at the kinks ±3 the gradient is the mean of the one-sided
/// slopes (−¼ at −3, 5/4 at 3; PyTorch gives −½ and 3/2).
pub fn hardswish(x: &Tensor) -> Result<Tensor> {
    x.multiply(&relu6(&x.binary_scalar(BinaryOp::Add, 3.0)?)?)?
        .binary_scalar(BinaryOp::Div, 6.0)
}

/// `x · sigmoid(x)`.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    composite1(Composite::Silu, &[x])
}

/// `1 / (1 + e^-x)`.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    composite1(Composite::Sigmoid, &[x])
}

/// Hyperbolic tangent.
pub fn tanh(x: &Tensor) -> Result<Tensor> {
    x.tanh()
}

/// Dropout with Paddle's `upscale_in_train`: in training, zero each element with probability
/// `p` and scale the rest by `1/(1-p)`; identity otherwise. The mask comes from the global
/// generator (`oar::seed`).
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    let seed = crate::tensor::with_rng(rand::Rng::random::<u64>);
    composite1(
        Composite::Dropout(Dropout {
            p: Float(p),
            training: true,
            seed,
        }),
        &[x],
    )
}

/// One-hot rows of `depth` classes for integer `indices` (`indices.shape ++ [depth]`), as
/// `dtype`; a negative index counts from the end, one out of range gives a zero row.
pub fn one_hot(indices: &Tensor, depth: usize, dtype: oar_ir::DType) -> Result<Tensor> {
    composite1(Composite::OneHot(oar_ir::ops::OneHot { depth, dtype }), &[indices])
}

/// Einstein summation (`"bij,bjk->bik"`, `"ii->i"`, `"...ij->...ji"`), as numpy and PyTorch.
pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
    let c = Composite::Einsum(oar_ir::ops::Einsum {
        equation: equation.to_string(),
    });
    composite1(c, operands)
}

/// Rows of `weight[V, D]` selected by integer `indices`.
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    composite1(Composite::Embedding, &[indices, weight])
}

/// `softmax(q kᵀ · scale + mask) v`; `mask` is bool (true keeps) or additive.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    let c = Composite::ScaledDotProductAttention(ScaledDotProductAttention {
        causal,
        scale: scale.map(Float),
    });
    composite1(c, &with_optional(vec![q, k, v], mask))
}
