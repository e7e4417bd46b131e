//! Adam and AdamW, with PyTorch's bias correction.

use super::core::{Core, Rule, TracedUpdate, impl_optimizer};
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
}

/// f32 Adam on a block: the same formula as [`AdamHyper::update`] in f32 (constants computed in
/// f64 once), one body compiled for AVX2+FMA and for the baseline, chosen at run time.
#[inline(always)]
fn adam_f32(k: [f32; 6], p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    let [beta1, beta2, step_size, bc2_sqrt, eps, decay] = k;
    let n = p.len().min(g.len()).min(m.len()).min(v.len());
    let (p, g, m, v) = (&mut p[..n], &g[..n], &mut m[..n], &mut v[..n]);
    for i in 0..n {
        let gi = g[i];
        let pi = p[i] * decay;
        let mi = beta1 * m[i] + (1.0 - beta1) * gi;
        let vi = beta2 * v[i] + (1.0 - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step_size * mi / (vi.sqrt() / bc2_sqrt + eps);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn adam_f32_avx2(k: [f32; 6], p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    adam_f32(k, p, g, m, v)
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
        let t = step as f64;
        let k = [
            self.beta1 as f32,
            self.beta2 as f32,
            (lr / (1.0 - self.beta1.powf(t))) as f32,
            (1.0 - self.beta2.powf(t)).sqrt() as f32,
            self.epsilon as f32,
            (1.0 - lr * self.decoupled) as f32,
        ];
        let [m, v] = slots else {
            unreachable!("Adam keeps two slots")
        };
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // Safety: the features were detected on this host.
            return unsafe { adam_f32_avx2(k, p, g, m, v) };
        }
        adam_f32(k, p, g, m, v)
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
