//! Optimizers (Paddle 2's `paddle.optimizer`): SGD, Momentum, Adam, AdamW, gradient clipping and
//! learning-rate schedules.
//!
//! An optimizer holds [`Tensor`] handles (e.g. `layer.parameters()`), reads each one's `.grad()`
//! in [`Optimizer::step`] and writes the new value in place with [`Tensor::set_data`]. The update
//! math runs in f64 on the host and is rounded to the parameter's dtype; optimizer state
//! (moments, velocities) is kept in f64 for f64 parameters and in f32 otherwise, rounded after
//! every step, so a saved and restored state resumes bit for bit.
//!
//! ```no_run
//! use oar::optimizer::{Adam, Optimizer, lr::{LRScheduler, StepDecay}};
//! # fn demo(model: &dyn oar::nn::Layer, x: &oar::Tensor) -> oar::Result<()> {
//! let sched = StepDecay::new(1e-3, 10, 0.5)?;
//! let mut opt = Adam::new(model.parameters(), sched.clone());
//! let loss = model.forward(x)?.mean(&[], false)?;
//! loss.backward()?;
//! opt.step()?;
//! opt.clear_grad();
//! sched.step();
//! # Ok(()) }
//! ```

mod adam;
mod clip;
mod core;
pub mod lr;
mod sgd;

pub use adam::{Adam, AdamW};
pub use clip::{ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue, GradClip, clip_grad_norm};
pub use core::OPT_PREFIX;
pub use sgd::{Momentum, SGD};

use crate::error::Result;
use crate::tensor::Tensor;
use lr::LRScheduler;
use oar_ir::TensorData;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// What every optimizer does (Paddle's `Optimizer` API).
pub trait Optimizer {
    /// Apply one update to every parameter that has a gradient (others are skipped).
    fn step(&mut self) -> Result<()>;

    /// Forget every parameter's gradient (Paddle `clear_grad`, PyTorch `zero_grad`).
    fn clear_grad(&self);

    /// The learning rate the next `step` uses.
    fn get_lr(&self) -> f64;

    /// Use a fixed learning rate from now on (this replaces any scheduler).
    fn set_lr(&mut self, lr: f64);

    /// Moments, step counters and learning-rate state, keyed `<param>.<slot>` (`param_0.moment1`,
    /// or the parameter's name when built from named parameters) plus `@lr` / `@lr_scheduler.*`.
    fn state_dict(&self) -> BTreeMap<String, TensorData>;

    /// Restore a [`Optimizer::state_dict`]; nothing changes if any entry is unknown or mismatched.
    fn set_state_dict(&mut self, state: &BTreeMap<String, TensorData>) -> Result<()>;

    /// The parameters this optimizer updates.
    fn parameters(&self) -> &[Tensor];

    /// Keep f32 master weights for f16/bf16 parameters (Paddle's `multi_precision`; set by
    /// [`crate::amp::decorate`] for AMP O2): each update runs on the master copy and the
    /// parameter becomes its rounding, so updates smaller than the half dtype's step add up.
    /// The master copies are part of the state dict (`<param>.master_weight`).
    fn set_multi_precision(&mut self, on: bool) -> Result<()>;

    /// Inside a static training step: make the next traced `step` keep every parameter and
    /// state value where the bool scalar `cond` is true (`GradScaler` skipping an overflowing
    /// step in the graph); `None` clears it. Not for eager steps.
    #[doc(hidden)]
    fn skip_traced_step_if(&mut self, cond: Option<Tensor>) -> Result<()>;

    /// Paddle's `minimize`: backpropagate `loss`, then `step`.
    fn minimize(&mut self, loss: &Tensor) -> Result<()> {
        loss.backward()?;
        self.step()
    }
}

/// A fixed learning rate or a shared scheduler.
#[derive(Clone)]
pub enum LearningRate {
    /// A constant.
    Fixed(f64),
    /// A schedule; the optimizer reads its `get_lr()` at every step.
    Scheduler(Arc<dyn LRScheduler>),
}

impl LearningRate {
    /// The current value.
    pub fn value(&self) -> f64 {
        match self {
            LearningRate::Fixed(v) => *v,
            LearningRate::Scheduler(s) => s.get_lr(),
        }
    }
}

impl fmt::Debug for LearningRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LearningRate::Fixed(v) => write!(f, "Fixed({v})"),
            LearningRate::Scheduler(s) => write!(f, "Scheduler(epoch {}, lr {})", s.last_epoch(), s.get_lr()),
        }
    }
}

impl From<f64> for LearningRate {
    fn from(v: f64) -> Self {
        LearningRate::Fixed(v)
    }
}

impl<S: LRScheduler + 'static> From<S> for LearningRate {
    fn from(s: S) -> Self {
        LearningRate::Scheduler(Arc::new(s))
    }
}

impl From<Arc<dyn LRScheduler>> for LearningRate {
    fn from(s: Arc<dyn LRScheduler>) -> Self {
        LearningRate::Scheduler(s)
    }
}

/// The parameters given to an optimizer, with the names its state is keyed by.
#[derive(Clone)]
pub struct Params {
    names: Vec<String>,
    tensors: Vec<Tensor>,
}

impl From<Vec<Tensor>> for Params {
    fn from(tensors: Vec<Tensor>) -> Self {
        let names = (0..tensors.len()).map(|i| format!("param_{i}")).collect();
        Params { names, tensors }
    }
}

impl From<&[Tensor]> for Params {
    fn from(tensors: &[Tensor]) -> Self {
        Params::from(tensors.to_vec())
    }
}

impl From<Vec<(String, Tensor)>> for Params {
    fn from(named: Vec<(String, Tensor)>) -> Self {
        let (names, tensors) = named.into_iter().unzip();
        Params { names, tensors }
    }
}
