//! Spatial ops of segmentation, detection and generative models: transposed convolution,
//! interpolation, padding modes, group and instance normalization.

use super::composite1;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::ops::{
    BorderPad, ConvTranspose, CoordMode, GroupNorm, InstanceNorm, NearestMode, PadMode, Resize, ResizeMode,
};
use oar_ir::{Composite, Float};

/// Transposed convolution ("deconvolution") of `x[N, Cin, *S]` with `weight[Cin, Cout/groups,
/// *K]`, any number of spatial axes. `padding`, `output_padding` and `dilation` have one entry
/// per spatial axis (`padding` is removed on both sides, as PyTorch and Paddle do).
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[usize],
    padding: &[usize],
    output_padding: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<Tensor> {
    let c = Composite::ConvTranspose(ConvTranspose {
        stride: stride.to_vec(),
        pad_before: padding.to_vec(),
        pad_after: padding.to_vec(),
        output_padding: output_padding.to_vec(),
        dilation: dilation.to_vec(),
        groups,
    });
    composite1(c, &super::with_optional(vec![x, weight], bias))
}

/// How [`interpolate`] resamples (PyTorch's and Paddle's mode names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interpolation {
    /// `nearest`: the source element at `floor(i · in/out)`.
    Nearest,
    /// `nearest-exact`: the source element whose center is nearest.
    NearestExact,
    /// `linear` / `bilinear` / `trilinear` by the number of spatial axes.
    Linear,
    /// `bicubic` (Keys' kernel, a = -0.75).
    Cubic,
}

impl std::str::FromStr for Interpolation {
    type Err = Error;
    fn from_str(s: &str) -> Result<Interpolation> {
        Ok(match s {
            "nearest" => Interpolation::Nearest,
            "nearest-exact" | "nearest_exact" => Interpolation::NearestExact,
            "linear" | "bilinear" | "trilinear" => Interpolation::Linear,
            "bicubic" | "cubic" => Interpolation::Cubic,
            _ => {
                return Err(Error::invalid(
                    "interpolate",
                    format!("unknown mode `{s}` (nearest, nearest-exact, linear, bilinear, trilinear, bicubic)"),
                ));
            }
        })
    }
}

/// Resample the spatial axes of `x[N, C, *S]` to `size`, or by `scale_factor` (one of the
/// two; one entry per spatial axis), as PyTorch's `interpolate`. `align_corners` applies to
/// the linear and cubic modes.
pub fn interpolate(
    x: &Tensor,
    size: Option<&[usize]>,
    scale_factor: Option<&[f64]>,
    mode: Interpolation,
    align_corners: bool,
) -> Result<Tensor> {
    let spatial = x.ndim().checked_sub(2).filter(|&s| s > 0).ok_or_else(|| {
        Error::invalid(
            "interpolate",
            format!("expects x[N, C, *spatial], got {}", x.tensor_type()),
        )
    })?;
    let shape = x.shape();
    let (sizes, scales) = match (size, scale_factor) {
        (Some(s), None) if s.len() == spatial => (s.to_vec(), Vec::new()),
        (None, Some(f)) if f.len() == spatial && f.iter().all(|&v| v > 0.0 && v.is_finite()) => (
            shape[2..]
                .iter()
                .zip(f)
                .map(|(&n, &k)| (n as f64 * k).floor() as usize)
                .collect(),
            f.iter().map(|&k| Float(k)).collect(),
        ),
        _ => {
            return Err(Error::invalid(
                "interpolate",
                format!(
                    "give size or a positive scale_factor with {spatial} entries (one per spatial axis of {})",
                    x.tensor_type()
                ),
            ));
        }
    };
    let (mode, coordinate, nearest) = match (mode, align_corners) {
        (Interpolation::Nearest, _) => (ResizeMode::Nearest, CoordMode::Asymmetric, NearestMode::Floor),
        (Interpolation::NearestExact, _) => (ResizeMode::Nearest, CoordMode::HalfPixel, NearestMode::RoundPreferCeil),
        (Interpolation::Linear, true) => (ResizeMode::Linear, CoordMode::AlignCorners, NearestMode::Floor),
        (Interpolation::Linear, false) => (ResizeMode::Linear, CoordMode::HalfPixel, NearestMode::Floor),
        (Interpolation::Cubic, true) => (ResizeMode::Cubic, CoordMode::AlignCorners, NearestMode::Floor),
        (Interpolation::Cubic, false) => (ResizeMode::Cubic, CoordMode::HalfPixel, NearestMode::Floor),
    };
    let c = Composite::Resize(Resize {
        sizes,
        scales,
        mode,
        coordinate,
        nearest,
        cubic_a: Float(-0.75),
        exclude_outside: false,
    });
    composite1(c, &[x])
}

/// Pad `x` as PyTorch's and Paddle's `pad`: `pad` lists `(before, after)` pairs from the last
/// axis backwards (`[left, right, top, bottom, ...]`); `mode` is `constant` (filled with
/// `value`), `reflect`, `replicate` or `circular`.
pub fn pad(x: &Tensor, pad: &[usize], mode: &str, value: f64) -> Result<Tensor> {
    let rank = x.ndim();
    if !pad.len().is_multiple_of(2) || pad.len() / 2 > rank {
        return Err(Error::invalid(
            "pad",
            format!(
                "pad {pad:?} must hold (before, after) pairs for at most the {rank} axes of {}",
                x.tensor_type()
            ),
        ));
    }
    let (mut before, mut after) = (vec![0; rank], vec![0; rank]);
    for (k, pair) in pad.chunks(2).enumerate() {
        before[rank - 1 - k] = pair[0];
        after[rank - 1 - k] = pair[1];
    }
    let mode = match mode {
        "constant" => {
            let pairs: Vec<(usize, usize)> = before.into_iter().zip(after).collect();
            return x.pad(&pairs, value);
        }
        "reflect" => PadMode::Reflect,
        "replicate" | "edge" => PadMode::Replicate,
        "circular" | "wrap" => PadMode::Circular,
        _ => {
            return Err(Error::invalid(
                "pad",
                format!("unknown mode `{mode}` (constant, reflect, replicate, circular)"),
            ));
        }
    };
    composite1(Composite::BorderPad(BorderPad { before, after, mode }), &[x])
}

fn affine<'a>(op: &str, x: &'a Tensor, w: Option<&'a Tensor>, b: Option<&'a Tensor>) -> Result<Vec<&'a Tensor>> {
    match (w, b) {
        (Some(w), Some(b)) => Ok(vec![x, w, b]),
        (None, None) => Ok(vec![x]),
        _ => Err(Error::invalid(op, "give both weight and bias, or neither")),
    }
}

/// Group normalization of `x[N, C, *]`: the channels in `num_groups` groups, each normalized
/// over its channels and positions, then the per-channel `weight`/`bias` (both or neither).
pub fn group_norm(
    x: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    epsilon: f64,
) -> Result<Tensor> {
    let c = Composite::GroupNorm(GroupNorm {
        num_groups,
        epsilon: Float(epsilon),
    });
    composite1(c, &affine("group_norm", x, weight, bias)?)
}

/// Instance normalization of `x[N, C, *]`: each (sample, channel) normalized over its
/// positions, then the per-channel `weight`/`bias` (both or neither).
pub fn instance_norm(x: &Tensor, weight: Option<&Tensor>, bias: Option<&Tensor>, epsilon: f64) -> Result<Tensor> {
    let c = Composite::InstanceNorm(InstanceNorm {
        epsilon: Float(epsilon),
    });
    composite1(c, &affine("instance_norm", x, weight, bias)?)
}
