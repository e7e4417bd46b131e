//! Composite ops: each has a decomposition into primitives (see `crate::decompose`).

use super::Float;
use serde::{Deserialize, Serialize};

/// How a loss reduces over the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reduction {
    /// Mean over the batch.
    Mean,
    /// Sum over the batch.
    Sum,
    /// One loss per sample.
    None,
}

impl Reduction {
    /// Text-format name.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Mean => "mean",
            Reduction::Sum => "sum",
            Reduction::None => "none",
        }
    }
}

/// Composite ops. Operand conventions are documented per variant; layouts follow Paddle 2
/// (NCHW images, `Linear` weight `[in, out]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Composite {
    /// `linear(x[.., in], w[in, out], b[out]?) = x @ w + b`.
    Linear,
    /// `conv2d(x[N,C,H,W], w[O,C/g,kh,kw], b[O]?)`.
    Conv2d {
        /// (sh, sw)
        stride: [usize; 2],
        /// (top, left, bottom, right)
        padding: [usize; 4],
        /// (dh, dw)
        dilation: [usize; 2],
        /// groups
        groups: usize,
    },
    /// `max_pool2d(x[N,C,H,W])`; padding is implicit -inf.
    MaxPool2d {
        /// (kh, kw)
        kernel: [usize; 2],
        /// (sh, sw)
        stride: [usize; 2],
        /// (top, left, bottom, right)
        padding: [usize; 4],
        /// Use ceil instead of floor for the output size.
        ceil_mode: bool,
    },
    /// `avg_pool2d(x[N,C,H,W])`.
    AvgPool2d {
        /// (kh, kw)
        kernel: [usize; 2],
        /// (sh, sw)
        stride: [usize; 2],
        /// (top, left, bottom, right)
        padding: [usize; 4],
        /// Use ceil instead of floor for the output size.
        ceil_mode: bool,
        /// Divide by the window clipped to the padded input (true, PyTorch's rule) or only by
        /// the in-bounds elements (false; Paddle's `exclusive=True`).
        count_include_pad: bool,
    },
    /// `adaptive_avg_pool2d(x[N,C,H,W]) -> [N,C,oh,ow]` (PyTorch's window rule).
    AdaptiveAvgPool2d {
        /// (oh, ow)
        output_size: [usize; 2],
    },
    /// `adaptive_max_pool2d(x[N,C,H,W]) -> [N,C,oh,ow]`.
    AdaptiveMaxPool2d {
        /// (oh, ow)
        output_size: [usize; 2],
    },
    /// `batch_norm(x[N,C,*], scale[C], bias[C], running_mean[C], running_var[C])`.
    /// Training: normalizes with batch statistics and returns `(y, new_running_mean,
    /// new_running_var)` with Paddle's rule `r = momentum * r + (1 - momentum) * batch_stat`
    /// (biased batch variance). Inference: normalizes with the running stats, returns `y`.
    BatchNorm {
        /// Added to the variance.
        epsilon: Float,
        /// Running-stat momentum (Paddle convention, default 0.9).
        momentum: Float,
        /// Training or inference mode.
        training: bool,
    },
    /// `layer_norm(x, weight?, bias?)` over the last `normalized_ndim` axes; weight and bias
    /// (both or neither) have the shape of those axes.
    LayerNorm {
        /// Number of trailing axes normalized.
        normalized_ndim: usize,
        /// Added to the variance.
        epsilon: Float,
    },
    /// `softmax(x)` along `axis`.
    Softmax {
        /// Axis.
        axis: usize,
    },
    /// `log_softmax(x)` along `axis`.
    LogSoftmax {
        /// Axis.
        axis: usize,
    },
    /// `cross_entropy(logits[N,C], labels[N] (int))`: `-log_softmax(logits)[label]`, reduced.
    CrossEntropy {
        /// Mean, sum or none over N.
        reduction: Reduction,
    },
    /// `max(x, 0)`.
    Relu,
    /// GELU; `approximate` uses the tanh formula.
    Gelu {
        /// tanh approximation.
        approximate: bool,
    },
    /// `x * sigmoid(x)`.
    Silu,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// Dropout with Paddle's `upscale_in_train`: in training, zero with probability `p` and
    /// scale the rest by `1/(1-p)`; identity otherwise.
    Dropout {
        /// Drop probability in `[0, 1)`.
        p: Float,
        /// Training mode.
        training: bool,
        /// Seed of the mask.
        seed: u64,
    },
    /// `embedding(indices (int), weight[V, D]) -> indices.shape ++ [D]`.
    Embedding,
    /// Scaled dot-product attention `softmax(q kᵀ · scale + mask) v` with
    /// `q[.., L, E]`, `k[.., S, E]`, `v[.., S, Ev]`, optional `mask` broadcastable to
    /// `[.., L, S]` (bool: true keeps; float: added).
    ScaledDotProductAttention {
        /// Mask out positions where key index > query index.
        causal: bool,
        /// Scale; `None` means `1/sqrt(E)`.
        scale: Option<Float>,
    },
}

impl Composite {
    /// Every composite's mnemonic, in declaration order (kept equal to [`Composite::name`] by
    /// a test in `decompose`).
    pub const NAMES: &'static [&'static str] = &[
        "linear",
        "conv2d",
        "max_pool2d",
        "avg_pool2d",
        "adaptive_avg_pool2d",
        "adaptive_max_pool2d",
        "batch_norm",
        "layer_norm",
        "softmax",
        "log_softmax",
        "cross_entropy",
        "relu",
        "gelu",
        "silu",
        "sigmoid",
        "dropout",
        "embedding",
        "sdpa",
    ];

    /// The mnemonic used in the text format.
    pub fn name(&self) -> &'static str {
        use Composite::*;
        match self {
            Linear => "linear",
            Conv2d { .. } => "conv2d",
            MaxPool2d { .. } => "max_pool2d",
            AvgPool2d { .. } => "avg_pool2d",
            AdaptiveAvgPool2d { .. } => "adaptive_avg_pool2d",
            AdaptiveMaxPool2d { .. } => "adaptive_max_pool2d",
            BatchNorm { .. } => "batch_norm",
            LayerNorm { .. } => "layer_norm",
            Softmax { .. } => "softmax",
            LogSoftmax { .. } => "log_softmax",
            CrossEntropy { .. } => "cross_entropy",
            Relu => "relu",
            Gelu { .. } => "gelu",
            Silu => "silu",
            Sigmoid => "sigmoid",
            Dropout { .. } => "dropout",
            Embedding => "embedding",
            ScaledDotProductAttention { .. } => "sdpa",
        }
    }
}
