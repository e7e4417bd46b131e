//! Adam and AdamW, with PyTorch's bias correction.

use super::core::{Core, Rule, TracedUpdate, impl_optimizer};
use super::{LearningRate, Params};
use crate::error::Result;
use crate::tensor::{Tensor, apply};
use oar_ir::Op;
use oar_ir::ops::{AdamUpdate, Composite, Float};

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
}

impl Rule for AdamHyper {
    const F32: bool = true;

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

    fn update_f32(&self, lr: f64, step: u64, p: &mut [f32], g: &[f32], slots: &mut [&mut [f32]]) {
        let [m, v] = slots else {
            unreachable!("Adam keeps two slots")
        };
        // The runtime's kernel: one pass at the host's vector width, the constants in f64.
        oar_cpu_runtime::optim::adam_f32_in_place(&self.op(), lr, step as f64, p, g, [m, v], 1);
    }
}

impl AdamHyper {
    /// The op computing this update (for static training steps and the runtime's kernel).
    fn op(&self) -> AdamUpdate {
        AdamUpdate {
            beta1: Float(self.beta1),
            beta2: Float(self.beta2),
            epsilon: Float(self.epsilon),
            weight_decay: Float(self.decoupled),
        }
    }

    /// The same update as [`AdamHyper::update`] as one `adam_update` op (for static training
    /// steps: the cpu backend runs it as one pass per parameter).
    fn traced_update(&self, u: &TracedUpdate) -> Result<(Tensor, Vec<Tensor>)> {
        let op = Op::Composite(Composite::AdamUpdate(self.op()));
        let mut outs = apply(op, &[&u.param, &u.grad, &u.slots[0], &u.slots[1], &u.lr, &u.step])?.into_iter();
        match (outs.next(), outs.next(), outs.next()) {
            (Some(p), Some(m), Some(v)) => Ok((p, vec![m, v])),
            _ => Err(crate::Error::invalid("adam_update", "internal: three results expected")),
        }
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
