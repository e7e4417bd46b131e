//! Adam and AdamW, with PyTorch's bias correction.

use super::core::{Core, TracedUpdate, impl_optimizer};
use super::{LearningRate, Params};
use crate::error::Result;
use crate::tensor::Tensor;

const SLOTS: &[&str] = &["moment1", "moment2"];

/// Adam's hyperparameters and update, shared by [`Adam`] and [`AdamW`].
#[derive(Clone, Copy, Debug)]
struct AdamHyper {
    beta1: f64,
    beta2: f64,
    epsilon: f64,
    /// Decoupled decay (AdamW's `coeff`); 0 for Adam.
    decoupled: f64,
}

impl AdamHyper {
    const DEFAULT: AdamHyper = AdamHyper {
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
        decoupled: 0.0,
    };

    fn check(&self, core: &Core) -> Result<()> {
        for (name, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return Err(core.invalid(format!("{name} must be in [0, 1), got {v}")));
            }
        }
        if !(self.epsilon.is_finite() && self.epsilon >= 0.0) {
            return Err(core.invalid(format!("epsilon must be finite and >= 0, got {}", self.epsilon)));
        }
        if !(self.decoupled.is_finite() && self.decoupled >= 0.0) {
            return Err(core.invalid(format!("weight decay must be finite and >= 0, got {}", self.decoupled)));
        }
        Ok(())
    }

    /// PyTorch's form: `p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`; AdamW
    /// first shrinks `p *= 1 - lr * coeff`.
    fn update(&self, lr: f64, step: u64, p: &mut [f64], g: &[f64], slots: &mut [&mut [f64]]) {
        let t = step as f64;
        let bc1 = 1.0 - self.beta1.powf(t);
        let bc2_sqrt = (1.0 - self.beta2.powf(t)).sqrt();
        let step_size = lr / bc1;
        let decay = 1.0 - lr * self.decoupled;
        let [m, v] = slots else {
            unreachable!("Adam keeps two slots")
        };
        for (((p, g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            *p *= decay;
            *m = self.beta1 * *m + (1.0 - self.beta1) * g;
            *v = self.beta2 * *v + (1.0 - self.beta2) * g * g;
            *p -= step_size * *m / (v.sqrt() / bc2_sqrt + self.epsilon);
        }
    }
}

impl AdamHyper {
    /// The same update as [`AdamHyper::update`], with tensor ops (for static training steps).
    fn traced_update(&self, u: &TracedUpdate) -> Result<(Tensor, Vec<Tensor>)> {
        let (g, m, v) = (&u.grad, &u.slots[0], &u.slots[1]);
        let bc1 = u.scalar(self.beta1)?.pow(&u.step)?.scale(-1.0, 1.0)?;
        let bc2_sqrt = u.scalar(self.beta2)?.pow(&u.step)?.scale(-1.0, 1.0)?.sqrt()?;
        let p = if self.decoupled != 0.0 {
            (&u.param * &(&u.lr * -self.decoupled)?.scale(1.0, 1.0)?)?
        } else {
            u.param.clone()
        };
        let m = (&(m * self.beta1)? + &(g * (1.0 - self.beta1))?)?;
        let v = (&(v * self.beta2)? + &(&(g * g)? * (1.0 - self.beta2))?)?;
        let denom = (&(&v.sqrt()? / &bc2_sqrt)? + self.epsilon)?;
        let step = (&(&u.lr / &bc1)? * &m)?;
        let p = (&p - &(&step / &denom)?)?;
        Ok((p, vec![m, v]))
    }
}

macro_rules! adam_builders {
    ($t:ty) => {
        impl $t {
            /// Decay rate of the first moment (default 0.9).
            pub fn beta1(mut self, beta1: f64) -> Self {
                self.hyper.beta1 = beta1;
                self
            }

            /// Decay rate of the second moment (default 0.999).
            pub fn beta2(mut self, beta2: f64) -> Self {
                self.hyper.beta2 = beta2;
                self
            }

            /// Added to the denominator for stability (default 1e-8).
            pub fn epsilon(mut self, epsilon: f64) -> Self {
                self.hyper.epsilon = epsilon;
                self
            }

            fn check_hyper(&self) -> Result<()> {
                self.hyper.check(&self.core)
            }

            fn hyper(&self) -> AdamHyper {
                self.hyper
            }
        }
    };
}

/// Adam (Kingma & Ba) with bias correction; `weight_decay` adds L2 decay to the gradient.
pub struct Adam {
    core: Core,
    hyper: AdamHyper,
}

impl Adam {
    /// Adam over `params` with betas (0.9, 0.999) and epsilon 1e-8.
    pub fn new(params: impl Into<Params>, learning_rate: impl Into<LearningRate>) -> Adam {
        Adam {
            core: Core::new("Adam", params.into(), learning_rate.into(), SLOTS),
            hyper: AdamHyper::DEFAULT,
        }
    }
}

adam_builders!(Adam);
impl_optimizer!(Adam, l2);

/// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay `p -= lr * coeff * p`.
pub struct AdamW {
    core: Core,
    hyper: AdamHyper,
}

impl AdamW {
    /// AdamW over `params` with betas (0.9, 0.999), epsilon 1e-8 and `coeff` 0.01 (Paddle's
    /// defaults).
    pub fn new(params: impl Into<Params>, learning_rate: impl Into<LearningRate>) -> AdamW {
        AdamW {
            core: Core::new("AdamW", params.into(), learning_rate.into(), SLOTS),
            hyper: AdamHyper {
                decoupled: 0.01,
                ..AdamHyper::DEFAULT
            },
        }
    }

    /// The decoupled decay coefficient (Paddle's `weight_decay`/`coeff`; default 0.01).
    pub fn weight_decay(mut self, coeff: f64) -> Self {
        self.hyper.decoupled = coeff;
        self
    }

    /// Alias of [`AdamW::weight_decay`], under the name Paddle's kernel uses.
    pub fn coeff(self, coeff: f64) -> Self {
        self.weight_decay(coeff)
    }
}

adam_builders!(AdamW);
impl_optimizer!(AdamW);
