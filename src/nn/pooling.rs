//! Pooling layers over images `x[N,C,H,W]`: `MaxPool2D`, `AvgPool2D`, `AdaptiveAvgPool2D`,
//! `AdaptiveMaxPool2D`. None has parameters.

use super::Layer;
use super::functional::{self as F, Pad2d, Pair};
use super::util::ctx;
use crate::error::Result;
use crate::tensor::Tensor;

/// 2-d max pooling; `stride` defaults to the kernel size, padding is implicit −∞.
pub struct MaxPool2D {
    kernel: [usize; 2],
    stride: Option<[usize; 2]>,
    padding: [usize; 4],
    ceil_mode: bool,
}

impl MaxPool2D {
    /// Max pooling with window `kernel` (`2` or `[kh, kw]`).
    pub fn new(kernel: impl Into<Pair>) -> MaxPool2D {
        MaxPool2D {
            kernel: kernel.into().0,
            stride: None,
            padding: [0; 4],
            ceil_mode: false,
        }
    }

    /// Stride (default: the kernel size).
    pub fn stride(mut self, s: impl Into<Pair>) -> MaxPool2D {
        self.stride = Some(s.into().0);
        self
    }

    /// Padding (`1`, `[ph, pw]` or `[top, left, bottom, right]`).
    pub fn padding(mut self, p: impl Into<Pad2d>) -> MaxPool2D {
        self.padding = p.into().0;
        self
    }

    /// Round the output size up instead of down.
    pub fn ceil_mode(mut self, on: bool) -> MaxPool2D {
        self.ceil_mode = on;
        self
    }
}

impl Layer for MaxPool2D {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = F::max_pool2d(x, self.kernel, self.stride.map(Pair), self.padding, self.ceil_mode);
        ctx(|| format!("MaxPool2D(kernel={:?})", self.kernel), y)
    }
}

/// 2-d average pooling; `exclusive` (Paddle's default `true`) divides by the in-bounds
/// elements of each window only.
pub struct AvgPool2D {
    kernel: [usize; 2],
    stride: Option<[usize; 2]>,
    padding: [usize; 4],
    ceil_mode: bool,
    exclusive: bool,
}

impl AvgPool2D {
    /// Average pooling with window `kernel`.
    pub fn new(kernel: impl Into<Pair>) -> AvgPool2D {
        AvgPool2D {
            kernel: kernel.into().0,
            stride: None,
            padding: [0; 4],
            ceil_mode: false,
            exclusive: true,
        }
    }

    /// Stride (default: the kernel size).
    pub fn stride(mut self, s: impl Into<Pair>) -> AvgPool2D {
        self.stride = Some(s.into().0);
        self
    }

    /// Padding (`1`, `[ph, pw]` or `[top, left, bottom, right]`).
    pub fn padding(mut self, p: impl Into<Pad2d>) -> AvgPool2D {
        self.padding = p.into().0;
        self
    }

    /// Round the output size up instead of down.
    pub fn ceil_mode(mut self, on: bool) -> AvgPool2D {
        self.ceil_mode = on;
        self
    }

    /// Divide by in-bounds elements only (`true`) or by the whole padded window (`false`).
    pub fn exclusive(mut self, on: bool) -> AvgPool2D {
        self.exclusive = on;
        self
    }
}

impl Layer for AvgPool2D {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = F::avg_pool2d(
            x,
            self.kernel,
            self.stride.map(Pair),
            self.padding,
            self.ceil_mode,
            self.exclusive,
        );
        ctx(|| format!("AvgPool2D(kernel={:?})", self.kernel), y)
    }
}

/// Adaptive average pooling to a fixed output size (PyTorch's window rule).
pub struct AdaptiveAvgPool2D {
    output_size: [usize; 2],
}

impl AdaptiveAvgPool2D {
    /// Pool to `output_size` (`1` or `[oh, ow]`).
    pub fn new(output_size: impl Into<Pair>) -> AdaptiveAvgPool2D {
        AdaptiveAvgPool2D {
            output_size: output_size.into().0,
        }
    }
}

impl Layer for AdaptiveAvgPool2D {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = F::adaptive_avg_pool2d(x, self.output_size);
        ctx(|| format!("AdaptiveAvgPool2D(output_size={:?})", self.output_size), y)
    }
}

/// Adaptive max pooling to a fixed output size.
pub struct AdaptiveMaxPool2D {
    output_size: [usize; 2],
}

impl AdaptiveMaxPool2D {
    /// Pool to `output_size` (`1` or `[oh, ow]`).
    pub fn new(output_size: impl Into<Pair>) -> AdaptiveMaxPool2D {
        AdaptiveMaxPool2D {
            output_size: output_size.into().0,
        }
    }
}

impl Layer for AdaptiveMaxPool2D {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = F::adaptive_max_pool2d(x, self.output_size);
        ctx(|| format!("AdaptiveMaxPool2D(output_size={:?})", self.output_size), y)
    }
}
