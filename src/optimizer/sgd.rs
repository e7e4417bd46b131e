//! Plain and momentum gradient descent.

use super::core::{Core, Rule, TracedUpdate, impl_optimizer};
use super::{LearningRate, Params};
use crate::error::Result;
use crate::tensor::Tensor;

/// Stochastic gradient descent: `p -= lr * g`.
pub struct SGD {
    core: Core,
}

impl SGD {
    /// SGD over `params` (`layer.parameters()` or `layer.named_parameters()`) with a fixed
    /// learning rate or a scheduler.
    pub fn new(params: impl Into<Params>, learning_rate: impl Into<LearningRate>) -> SGD {
        SGD {
            core: Core::new("SGD", params.into(), learning_rate.into(), &[]),
        }
    }

    fn check_hyper(&self) -> Result<()> {
        Ok(())
    }

    fn hyper(&self) -> SgdHyper {
        SgdHyper
    }
}

#[derive(Clone, Copy)]
struct SgdHyper;

impl Rule for SgdHyper {
    const F32: bool = true;

    fn update(&self, lr: f64, _: u64, p: &mut [f64], g: &[f64], _: &mut [&mut [f64]]) {
        p.iter_mut().zip(g).for_each(|(p, g)| *p -= lr * g);
    }

    fn update_f32(&self, lr: f64, _: u64, p: &mut [f32], g: &[f32], _: &mut [&mut [f32]]) {
        let lr = lr as f32;
        p.iter_mut().zip(g).for_each(|(p, g)| *p -= lr * g);
    }
}

impl SgdHyper {
    fn traced_update(&self, u: &TracedUpdate) -> Result<(Tensor, Vec<Tensor>)> {
        Ok(((&u.param - &(&u.lr * &u.grad)?)?, vec![]))
    }
}

impl_optimizer!(SGD, l2);

/// Momentum SGD (Paddle `Momentum`, PyTorch `SGD(momentum=..)` without dampening):
/// `v = mu * v + g`, then `p -= lr * v`, or with Nesterov `p -= lr * (g + mu * v)`.
pub struct Momentum {
    core: Core,
    momentum: f64,
    use_nesterov: bool,
}

impl Momentum {
    /// Momentum over `params` with `momentum` 0.9 and no Nesterov (Paddle's defaults).
    pub fn new(params: impl Into<Params>, learning_rate: impl Into<LearningRate>) -> Momentum {
        Momentum {
            core: Core::new("Momentum", params.into(), learning_rate.into(), &["velocity"]),
            momentum: 0.9,
            use_nesterov: false,
        }
    }

    /// The momentum factor `mu`.
    pub fn momentum(mut self, momentum: f64) -> Self {
        self.momentum = momentum;
        self
    }

    /// Use Nesterov momentum.
    pub fn use_nesterov(mut self, on: bool) -> Self {
        self.use_nesterov = on;
        self
    }

    fn check_hyper(&self) -> Result<()> {
        if !(self.momentum.is_finite() && self.momentum >= 0.0) {
            return Err(self
                .core
                .invalid(format!("momentum must be finite and >= 0, got {}", self.momentum)));
        }
        Ok(())
    }

    fn hyper(&self) -> MomentumHyper {
        MomentumHyper {
            mu: self.momentum,
            nesterov: self.use_nesterov,
        }
    }
}

#[derive(Clone, Copy)]
struct MomentumHyper {
    mu: f64,
    nesterov: bool,
}

impl Rule for MomentumHyper {
    const F32: bool = true;

    fn update(&self, lr: f64, _: u64, p: &mut [f64], g: &[f64], slots: &mut [&mut [f64]]) {
        let v = &mut *slots[0];
        for ((p, g), v) in p.iter_mut().zip(g).zip(v.iter_mut()) {
            *v = self.mu * *v + g;
            *p -= if self.nesterov {
                lr * (g + self.mu * *v)
            } else {
                lr * *v
            };
        }
    }

    fn update_f32(&self, lr: f64, _: u64, p: &mut [f32], g: &[f32], slots: &mut [&mut [f32]]) {
        let (lr, mu) = (lr as f32, self.mu as f32);
        let v = &mut *slots[0];
        for ((p, g), v) in p.iter_mut().zip(g).zip(v.iter_mut()) {
            *v = mu * *v + g;
            *p -= if self.nesterov { lr * (g + mu * *v) } else { lr * *v };
        }
    }
}

impl MomentumHyper {
    fn traced_update(&self, u: &TracedUpdate) -> Result<(Tensor, Vec<Tensor>)> {
        let v = (&(&u.slots[0] * self.mu)? + &u.grad)?;
        let dir = if self.nesterov {
            (&u.grad + &(&v * self.mu)?)?
        } else {
            v.clone()
        };
        Ok(((&u.param - &(&u.lr * &dir)?)?, vec![v]))
    }
}

impl_optimizer!(Momentum, l2);
