//! `Dropout` (Paddle's `upscale_in_train`) and `Flatten`.

use super::Layer;
use super::functional as F;
use super::util::ctx;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// In training, zeros each element with probability `p` and scales the rest by `1/(1-p)`;
/// identity in eval mode. Masks come from the global generator (`oar::seed`).
pub struct Dropout {
    p: f64,
    training: bool,
}

impl Dropout {
    /// Dropout with drop probability `p` in `[0, 1)`, in training mode.
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid("Dropout", format!("p = {p} is not in [0, 1)")));
        }
        Ok(Dropout { p, training: true })
    }

    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.p
    }
}

impl Layer for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ctx(
            || format!("Dropout(p={})", self.p),
            F::dropout(x, self.p, self.training),
        )
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// Flattens axes `start_axis..=stop_axis` into one (Paddle's defaults: 1 and −1).
#[derive(Clone, Copy, Debug)]
pub struct Flatten {
    start_axis: i64,
    stop_axis: i64,
}

impl Flatten {
    /// Flatten `start_axis..=stop_axis` (negative counts from the end).
    pub fn new(start_axis: i64, stop_axis: i64) -> Flatten {
        Flatten { start_axis, stop_axis }
    }
}

impl Default for Flatten {
    fn default() -> Flatten {
        Flatten::new(1, -1)
    }
}

impl Layer for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ctx(
            || format!("Flatten(start_axis={}, stop_axis={})", self.start_axis, self.stop_axis),
            x.flatten(self.start_axis, self.stop_axis),
        )
    }
}
