//! Gradient clipping: Paddle's `ClipGradBy*` (used by an optimizer on the gradients it applies,
//! leaving `.grad()` untouched) and PyTorch's `clip_grad_norm_` (rewrites `.grad()` in place).

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::TensorData;

/// A rule that rescales the gradients an optimizer is about to apply (one `Vec` per parameter
/// that has a gradient, in parameter order).
pub trait GradClip: Send + Sync {
    /// Clip `grads` in place.
    fn clip(&self, grads: &mut [Vec<f64>]) -> Result<()>;
}

fn check_positive(op: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("the clip bound must be finite and > 0, got {v}"),
        ))
    }
}

fn sum_squares(g: &[f64]) -> f64 {
    g.iter().map(|x| x * x).sum()
}

/// Scale all gradients together by `clip_norm / max(global_norm, clip_norm)`, where
/// `global_norm` is the 2-norm of every gradient concatenated.
#[derive(Clone, Copy, Debug)]
pub struct ClipGradByGlobalNorm {
    clip_norm: f64,
}

impl ClipGradByGlobalNorm {
    /// Clip to a global 2-norm of at most `clip_norm`.
    pub fn new(clip_norm: f64) -> ClipGradByGlobalNorm {
        ClipGradByGlobalNorm { clip_norm }
    }
}

impl GradClip for ClipGradByGlobalNorm {
    fn clip(&self, grads: &mut [Vec<f64>]) -> Result<()> {
        check_positive("ClipGradByGlobalNorm", self.clip_norm)?;
        let norm = grads.iter().map(|g| sum_squares(g)).sum::<f64>().sqrt();
        if norm > self.clip_norm {
            let scale = self.clip_norm / norm;
            grads.iter_mut().flatten().for_each(|x| *x *= scale);
        }
        Ok(())
    }
}

/// Scale each gradient separately so its own 2-norm is at most `clip_norm`.
#[derive(Clone, Copy, Debug)]
pub struct ClipGradByNorm {
    clip_norm: f64,
}

impl ClipGradByNorm {
    /// Clip each gradient to a 2-norm of at most `clip_norm`.
    pub fn new(clip_norm: f64) -> ClipGradByNorm {
        ClipGradByNorm { clip_norm }
    }
}

impl GradClip for ClipGradByNorm {
    fn clip(&self, grads: &mut [Vec<f64>]) -> Result<()> {
        check_positive("ClipGradByNorm", self.clip_norm)?;
        for g in grads {
            let norm = sum_squares(g).sqrt();
            if norm > self.clip_norm {
                let scale = self.clip_norm / norm;
                g.iter_mut().for_each(|x| *x *= scale);
            }
        }
        Ok(())
    }
}

/// Clamp every gradient element into `[min, max]`.
#[derive(Clone, Copy, Debug)]
pub struct ClipGradByValue {
    min: f64,
    max: f64,
}

impl ClipGradByValue {
    /// Clamp into `[min, max]` (Paddle: `min` defaults to `-max`).
    pub fn new(min: f64, max: f64) -> ClipGradByValue {
        ClipGradByValue { min, max }
    }
}

impl GradClip for ClipGradByValue {
    fn clip(&self, grads: &mut [Vec<f64>]) -> Result<()> {
        if self.min.is_nan() || self.max.is_nan() || self.min > self.max {
            return Err(Error::invalid(
                "ClipGradByValue",
                format!("need min <= max, got [{}, {}]", self.min, self.max),
            ));
        }
        grads
            .iter_mut()
            .flatten()
            .for_each(|x| *x = x.clamp(self.min, self.max));
        Ok(())
    }
}

/// PyTorch's `clip_grad_norm_`: if the global 2-norm of the parameters' gradients exceeds
/// `max_norm`, scale every `.grad()` in place by `max_norm / (norm + 1e-6)`. Returns the norm
/// before clipping. Parameters without a gradient are ignored.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<f64> {
    check_positive("clip_grad_norm", max_norm)?;
    let grads: Vec<(&Tensor, Tensor)> = params.iter().filter_map(|p| p.grad().map(|g| (p, g))).collect();
    let norm = grads
        .iter()
        .map(|(_, g)| g.try_data().map(|d| sum_squares(&d.to_f64_vec())))
        .sum::<Result<f64>>()?
        .sqrt();
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        for (p, g) in grads {
            let d = g.try_data()?;
            let scaled: Vec<f64> = d.to_f64_vec().into_iter().map(|x| x * coef).collect();
            let new = TensorData::from_f64_slice(d.dtype(), d.shape().to_vec(), &scaled)?;
            p.set_grad(Some(Tensor::from_data(new).to(&g.device())?));
        }
    }
    Ok(norm)
}
