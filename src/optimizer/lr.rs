//! Learning-rate schedules (Paddle's `paddle.optimizer.lr`).
//!
//! A scheduler is a cheap handle: clones share one epoch counter, so the copy given to an
//! optimizer and the copy the training loop calls `step()` on stay in sync, as in Paddle.
//! Every schedule is a closed-form function of the epoch (`lr_at`), which makes its state just
//! `last_epoch` and lets it be saved and restored exactly.

use super::LearningRate;
use crate::error::{Error, Result};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The shared epoch counter of a scheduler (clones share it).
#[derive(Clone, Default)]
pub struct EpochCounter(Arc<AtomicU64>);

impl EpochCounter {
    /// The current epoch.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Set the epoch.
    pub fn set(&self, epoch: u64) {
        self.0.store(epoch, Ordering::Relaxed)
    }
}

impl fmt::Debug for EpochCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EpochCounter({})", self.get())
    }
}

/// A learning-rate schedule with a current epoch (Paddle's `LRScheduler`). Epoch 0 is the
/// state right after construction; each `step()` moves one epoch on.
pub trait LRScheduler: Send + Sync {
    /// The learning rate at `epoch` (a pure function of the epoch).
    fn lr_at(&self, epoch: u64) -> f64;

    /// The shared epoch counter.
    fn counter(&self) -> &EpochCounter;

    /// The current epoch (Paddle's `last_epoch`).
    fn last_epoch(&self) -> u64 {
        self.counter().get()
    }

    /// Jump to `epoch` (used when restoring state).
    fn set_last_epoch(&self, epoch: u64) {
        self.counter().set(epoch)
    }

    /// Advance one epoch.
    fn step(&self) {
        self.set_last_epoch(self.last_epoch().saturating_add(1))
    }

    /// The learning rate at the current epoch.
    fn get_lr(&self) -> f64 {
        self.lr_at(self.last_epoch())
    }
}

fn check_lr(op: &str, name: &str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(op, format!("{name} must be finite and >= 0, got {v}")))
    }
}

/// `lr = learning_rate * gamma ^ floor(epoch / step_size)`.
#[derive(Clone, Debug)]
pub struct StepDecay {
    learning_rate: f64,
    step_size: u64,
    gamma: f64,
    epoch: EpochCounter,
}

impl StepDecay {
    /// Decay by `gamma` every `step_size` epochs (Paddle's default gamma is 0.1).
    pub fn new(learning_rate: f64, step_size: u64, gamma: f64) -> Result<StepDecay> {
        check_lr("StepDecay", "learning_rate", learning_rate)?;
        if step_size == 0 {
            return Err(Error::invalid("StepDecay", "step_size must be > 0"));
        }
        if !gamma.is_finite() {
            return Err(Error::invalid(
                "StepDecay",
                format!("gamma must be finite, got {gamma}"),
            ));
        }
        Ok(StepDecay {
            learning_rate,
            step_size,
            gamma,
            epoch: EpochCounter::default(),
        })
    }
}

impl LRScheduler for StepDecay {
    fn lr_at(&self, epoch: u64) -> f64 {
        self.learning_rate * self.gamma.powf((epoch / self.step_size) as f64)
    }
    fn counter(&self) -> &EpochCounter {
        &self.epoch
    }
}

/// Cosine annealing: `eta_min + (learning_rate - eta_min) * (1 + cos(pi * epoch / t_max)) / 2`.
///
/// Paddle computes the same curve recursively; the closed form here agrees up to rounding.
#[derive(Clone, Debug)]
pub struct CosineAnnealingDecay {
    learning_rate: f64,
    t_max: u64,
    eta_min: f64,
    epoch: EpochCounter,
}

impl CosineAnnealingDecay {
    /// Anneal from `learning_rate` to `eta_min` over `t_max` epochs.
    pub fn new(learning_rate: f64, t_max: u64, eta_min: f64) -> Result<CosineAnnealingDecay> {
        check_lr("CosineAnnealingDecay", "learning_rate", learning_rate)?;
        check_lr("CosineAnnealingDecay", "eta_min", eta_min)?;
        if t_max == 0 {
            return Err(Error::invalid("CosineAnnealingDecay", "T_max must be > 0"));
        }
        Ok(CosineAnnealingDecay {
            learning_rate,
            t_max,
            eta_min,
            epoch: EpochCounter::default(),
        })
    }
}

impl LRScheduler for CosineAnnealingDecay {
    fn lr_at(&self, epoch: u64) -> f64 {
        let phase = std::f64::consts::PI * epoch as f64 / self.t_max as f64;
        self.eta_min + (self.learning_rate - self.eta_min) * (1.0 + phase.cos()) / 2.0
    }
    fn counter(&self) -> &EpochCounter {
        &self.epoch
    }
}

/// Linear warmup from `start_lr` to `end_lr` over `warmup_steps` epochs, then the wrapped
/// learning rate (a constant, or a schedule started at its epoch 0).
#[derive(Clone)]
pub struct LinearWarmup {
    learning_rate: LearningRate,
    warmup_steps: u64,
    start_lr: f64,
    end_lr: f64,
    epoch: EpochCounter,
}

impl fmt::Debug for LinearWarmup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinearWarmup")
            .field("warmup_steps", &self.warmup_steps)
            .field("start_lr", &self.start_lr)
            .field("end_lr", &self.end_lr)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl LinearWarmup {
    /// Warm up, then follow `learning_rate` (an `f64` or any scheduler).
    pub fn new(
        learning_rate: impl Into<LearningRate>,
        warmup_steps: u64,
        start_lr: f64,
        end_lr: f64,
    ) -> Result<LinearWarmup> {
        check_lr("LinearWarmup", "start_lr", start_lr)?;
        check_lr("LinearWarmup", "end_lr", end_lr)?;
        let learning_rate = learning_rate.into();
        if let LearningRate::Fixed(v) = learning_rate {
            check_lr("LinearWarmup", "learning_rate", v)?;
        }
        Ok(LinearWarmup {
            learning_rate,
            warmup_steps,
            start_lr,
            end_lr,
            epoch: EpochCounter::default(),
        })
    }
}

impl LRScheduler for LinearWarmup {
    fn lr_at(&self, epoch: u64) -> f64 {
        if epoch < self.warmup_steps {
            return self.start_lr + (self.end_lr - self.start_lr) * epoch as f64 / self.warmup_steps as f64;
        }
        match &self.learning_rate {
            LearningRate::Fixed(v) => *v,
            LearningRate::Scheduler(s) => s.lr_at(epoch - self.warmup_steps),
        }
    }
    fn counter(&self) -> &EpochCounter {
        &self.epoch
    }
    // Keep the wrapped scheduler's own epoch in step, as Paddle does, so its `get_lr` agrees.
    fn set_last_epoch(&self, epoch: u64) {
        self.epoch.set(epoch);
        if let LearningRate::Scheduler(s) = &self.learning_rate {
            s.set_last_epoch(epoch.saturating_sub(self.warmup_steps));
        }
    }
}
