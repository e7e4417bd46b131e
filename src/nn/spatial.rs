//! Layers that resize or pad the spatial grid: `Upsample` and `Pad` (constant, reflect,
//! replicate, circular).

use super::Layer;
use super::functional::{self as F, Interpolation};
use super::util::ctx;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// How an [`Upsample`] picks its output size.
#[derive(Clone, Debug, PartialEq)]
enum Target {
    Size(Vec<usize>),
    Scale(Vec<f64>),
}

/// Resample the spatial axes of `x[N, C, *S]` (Paddle's and PyTorch's `Upsample`): to a fixed
/// `size`, or by a `scale_factor`, with `mode` nearest (default), nearest-exact, linear or
/// bicubic and, for the last two, `.align_corners(true)`.
pub struct Upsample {
    target: Target,
    mode: Interpolation,
    align_corners: bool,
}

impl Upsample {
    /// To a fixed spatial `size`.
    pub fn size(size: &[usize]) -> Upsample {
        Upsample {
            target: Target::Size(size.to_vec()),
            mode: Interpolation::Nearest,
            align_corners: false,
        }
    }

    /// By `scale_factor` per spatial axis.
    pub fn scale(scale_factor: &[f64]) -> Upsample {
        Upsample {
            target: Target::Scale(scale_factor.to_vec()),
            mode: Interpolation::Nearest,
            align_corners: false,
        }
    }

    /// The interpolation (`"nearest"`, `"nearest-exact"`, `"bilinear"`, `"bicubic"`, ...).
    pub fn mode(mut self, mode: &str) -> Result<Upsample> {
        self.mode = mode.parse()?;
        Ok(self)
    }

    /// Align the corner pixels of input and output (linear and cubic modes).
    pub fn align_corners(mut self, on: bool) -> Upsample {
        self.align_corners = on;
        self
    }
}

impl Layer for Upsample {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (size, scale) = match &self.target {
            Target::Size(s) => (Some(s.as_slice()), None),
            Target::Scale(f) => (None, Some(f.as_slice())),
        };
        let y = F::interpolate(x, size, scale, self.mode, self.align_corners);
        ctx(|| format!("Upsample({:?}, mode={:?})", self.target, self.mode), y)
    }
}

/// Pad the trailing axes (Paddle's `Pad1D/2D/3D`, PyTorch's `ReflectionPad2d` & co.):
/// `padding` lists `(before, after)` pairs from the last axis backwards; `mode` is
/// `constant` (with `.value(v)`), `reflect`, `replicate` or `circular`.
pub struct Pad {
    padding: Vec<usize>,
    mode: String,
    value: f64,
}

impl Pad {
    /// Padding `[left, right, top, bottom, ...]` in `mode`.
    pub fn new(padding: &[usize], mode: &str) -> Result<Pad> {
        if !padding.len().is_multiple_of(2) || padding.is_empty() {
            return Err(Error::invalid(
                "Pad",
                format!("padding {padding:?} must be (before, after) pairs"),
            ));
        }
        if !["constant", "reflect", "replicate", "circular"].contains(&mode) {
            return Err(Error::invalid(
                "Pad",
                format!("unknown mode `{mode}` (constant, reflect, replicate, circular)"),
            ));
        }
        Ok(Pad {
            padding: padding.to_vec(),
            mode: mode.to_string(),
            value: 0.0,
        })
    }

    /// The fill value of constant padding (default 0).
    pub fn value(mut self, value: f64) -> Pad {
        self.value = value;
        self
    }
}

impl Layer for Pad {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = F::pad(x, &self.padding, &self.mode, self.value);
        ctx(|| format!("Pad(padding={:?}, mode={})", self.padding, self.mode), y)
    }
}
