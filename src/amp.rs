//! Automatic mixed precision (Paddle 2's `paddle.amp`, PyTorch's `torch.autocast` and
//! `GradScaler`).
//!
//! Inside an [`auto_cast`] scope every op decides its precision from one table
//! ([`oar_passes::amp`], documented in docs/AMP.md): matrix products and convolutions run in
//! f16/bf16 (with f32 accumulation), numerically sensitive ops (exp, log, softmax, losses,
//! norms, sums and means) in f32, and the rest in their operands' widest dtype. Casts are
//! ordinary ops, so gradients flow through them back to f32 parameters, and a traced scope
//! (`jit::to_static`) records them: the graph equals what the `amp` pass makes of the f32 graph.
//!
//! ```no_run
//! use oar::amp::{self, AmpLevel, GradScaler};
//! use oar::nn::Layer;
//! use oar::optimizer::Optimizer;
//! # fn demo(model: &dyn Layer, opt: &mut dyn Optimizer, x: &oar::Tensor, y: &oar::Tensor) -> oar::Result<()> {
//! let mut scaler = GradScaler::new();
//! let loss = {
//!     let _amp = amp::auto_cast(AmpLevel::O1, oar::DType::BF16)?;
//!     oar::nn::functional::cross_entropy(&model.forward(x)?, y, oar::nn::Reduction::Mean)?
//! };
//! scaler.scale(&loss)?.backward()?;
//! scaler.step(opt)?; // unscales, skips the step on inf/NaN
//! scaler.update()?;
//! opt.clear_grad();
//! # Ok(()) }
//! ```
//!
//! Level O2 ([`decorate`]) stores the model's parameters in the low dtype and has the optimizer
//! keep f32 master weights; everything but the deny list then runs in low precision.

use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::optimizer::Optimizer;
use crate::tensor::Tensor;
use oar_ir::{DType, Op, TensorData};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use oar_passes::amp::{AmpClass, AmpConfig, AmpLevel, default_class};

thread_local! {
    /// The innermost scope's configuration (`None`: AMP off).
    static CURRENT: RefCell<Option<Arc<AmpConfig>>> = const { RefCell::new(None) };
}

/// Restores the enclosing AMP state when dropped.
#[must_use = "the AMP scope ends when the guard drops"]
pub struct AutoCastGuard {
    prev: Option<Arc<AmpConfig>>,
}

impl Drop for AutoCastGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

fn amp_error(detail: String) -> Error {
    Error::invalid("auto_cast", detail)
}

/// Enter an AMP scope at `level` with low dtype `dtype` (f16 or bf16) and the default lists,
/// until the guard drops (`let _amp = amp::auto_cast(AmpLevel::O1, DType::BF16)?;`).
pub fn auto_cast(level: AmpLevel, dtype: DType) -> Result<AutoCastGuard> {
    Ok(auto_cast_with(AmpConfig::new(level, dtype).map_err(amp_error)?))
}

/// Enter an AMP scope with a full configuration (custom allow and deny lists:
/// `AmpConfig::new(AmpLevel::O1, DType::F16)?.allow(["layer_norm"])?.deny(["matmul"])?`).
pub fn auto_cast_with(config: AmpConfig) -> AutoCastGuard {
    set(Some(Arc::new(config)))
}

/// Run `f` inside an AMP scope.
pub fn with_auto_cast<T>(level: AmpLevel, dtype: DType, f: impl FnOnce() -> T) -> Result<T> {
    let _g = auto_cast(level, dtype)?;
    Ok(f())
}

/// Turn AMP off until the guard drops (PyTorch's `autocast(enabled=False)` inside a scope).
pub fn disable() -> AutoCastGuard {
    set(None)
}

/// The configuration in effect on this thread, if any.
pub fn current() -> Option<Arc<AmpConfig>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// True inside an [`auto_cast`] scope.
pub fn is_enabled() -> bool {
    CURRENT.with(|c| c.borrow().is_some())
}

fn set(config: Option<Arc<AmpConfig>>) -> AutoCastGuard {
    let prev = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), config));
    AutoCastGuard { prev }
}

/// The operands of `op` cast as the active scope's table says, or `None` when nothing changes
/// (no scope, or every operand already in the dtype the op runs in). Called by every eager op.
pub(crate) fn cast_operands(op: &Op, inputs: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    let Some(config) = CURRENT.with(|c| c.borrow().clone()) else {
        return Ok(None);
    };
    let types: Vec<(DType, usize)> = inputs.iter().map(|t| (t.dtype(), t.ndim())).collect();
    let plan = config.plan(op, &types);
    if plan.iter().all(Option::is_none) {
        return Ok(None);
    }
    let _off = disable();
    inputs
        .iter()
        .zip(plan)
        .map(|(t, to)| match to {
            Some(d) => t.cast(d),
            None => Ok((*t).clone()),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Level O2 (Paddle's `paddle.amp.decorate`): store every float parameter of `model` in
/// `dtype` (f16 or bf16; buffers such as batch-norm statistics stay as they are) and have
/// `optimizer` keep f32 master weights for them, so small updates are not lost to rounding.
/// Use the model inside `auto_cast(AmpLevel::O2, dtype)`.
pub fn decorate(model: &dyn Layer, optimizer: &mut dyn Optimizer, dtype: DType) -> Result<()> {
    AmpConfig::new(AmpLevel::O2, dtype).map_err(|e| Error::invalid("decorate", e))?;
    let params = model.parameters();
    for p in &params {
        if !optimizer.parameters().iter().any(|q| q.is(p)) {
            return Err(Error::invalid(
                "decorate",
                format!(
                    "a parameter of the model ({}) is not one of the optimizer's",
                    p.tensor_type()
                ),
            ));
        }
    }
    optimizer.set_multi_precision(true)?;
    let _ng = crate::autograd::no_grad();
    let _off = disable();
    for p in params {
        if p.dtype() == DType::F32 {
            let low = p.detach().cast(dtype)?;
            p.replace_storage(low.storage());
        }
    }
    Ok(())
}

/// Dynamic loss scaling (PyTorch's `GradScaler`, Paddle's `GradScaler`): the loss is multiplied
/// by a scale before backward so small f16 gradients do not flush to zero; [`GradScaler::step`]
/// divides the gradients by it, skips the optimizer step when any is inf or NaN and then
/// [`GradScaler::update`] halves the scale; after `growth_interval` good steps in a row it
/// doubles.
///
/// It works in traced training steps too (`jit::to_static_train_step`): the scale and the
/// good-step count become state of the graph (`@amp/scale`, `@amp/good_steps`, written back
/// after every call, so [`GradScaler::get_scale`] follows), the overflow test is a graph value,
/// and the optimizer's update is selected away on overflow.
#[derive(Debug)]
pub struct GradScaler {
    enabled: bool,
    /// The scale, an f32 scalar (powers of two times the initial scale, exact).
    scale: Tensor,
    /// Good steps in a row, an f32 scalar.
    good_steps: Tensor,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u64,
    /// Set by `unscale_`/`step` for this iteration: whether a gradient overflowed (a bool
    /// scalar; traced inside a static step).
    found_inf: Option<Tensor>,
}

/// Graph-state names of a traced scaler.
const SCALE_KEY: &str = "@amp/scale";
const GOOD_STEPS_KEY: &str = "@amp/good_steps";

impl Clone for GradScaler {
    /// An independent scaler with the same state.
    fn clone(&self) -> GradScaler {
        GradScaler {
            scale: Tensor::from_data(self.scale.data()),
            good_steps: Tensor::from_data(self.good_steps.data()),
            found_inf: None,
            ..*self
        }
    }
}

impl Default for GradScaler {
    fn default() -> GradScaler {
        GradScaler::new()
    }
}

fn scalar_f32(v: f64) -> Tensor {
    Tensor::scalar(v as f32)
}

impl GradScaler {
    /// Initial scale 2^16, ×2 after 2000 good steps, ×0.5 on inf/NaN.
    pub fn new() -> GradScaler {
        GradScaler {
            enabled: true,
            scale: scalar_f32(65536.0),
            good_steps: scalar_f32(0.0),
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            found_inf: None,
        }
    }

    /// The initial scale (finite, > 0, at most f32's largest value).
    pub fn init_scale(self, scale: f64) -> Result<GradScaler> {
        if !(scale.is_finite() && scale > 0.0 && scale <= f64::from(f32::MAX)) {
            return Err(Error::invalid(
                "GradScaler",
                format!("init_scale must be finite, > 0 and fit f32, got {scale}"),
            ));
        }
        self.scale.set_data(TensorData::scalar(scale as f32))?;
        Ok(self)
    }

    /// The factor the scale grows by after `growth_interval` good steps (> 1).
    pub fn growth_factor(mut self, f: f64) -> Result<GradScaler> {
        if !(f.is_finite() && f > 1.0) {
            return Err(Error::invalid(
                "GradScaler",
                format!("growth_factor must be finite and > 1, got {f}"),
            ));
        }
        self.growth_factor = f;
        Ok(self)
    }

    /// The factor the scale shrinks by on a step with inf/NaN gradients (in (0, 1)).
    pub fn backoff_factor(mut self, f: f64) -> Result<GradScaler> {
        if !(f > 0.0 && f < 1.0) {
            return Err(Error::invalid(
                "GradScaler",
                format!("backoff_factor must be in (0, 1), got {f}"),
            ));
        }
        self.backoff_factor = f;
        Ok(self)
    }

    /// Good steps in a row before the scale grows (1 ..= 2^24).
    pub fn growth_interval(mut self, n: u64) -> Result<GradScaler> {
        if n == 0 || n > 1 << 24 {
            return Err(Error::invalid(
                "GradScaler",
                format!("growth_interval must be in 1..=16777216, got {n}"),
            ));
        }
        self.growth_interval = n;
        Ok(self)
    }

    /// A scaler that does nothing (scale 1, never skips): the same loop runs in f32.
    pub fn enabled(mut self, on: bool) -> GradScaler {
        self.enabled = on;
        self
    }

    /// The current scale (after a static step, the value that step left).
    pub fn get_scale(&self) -> f64 {
        if !self.enabled {
            return 1.0;
        }
        self.scale.item().unwrap_or(f64::NAN)
    }

    fn good(&self) -> u64 {
        self.good_steps.item().map_or(0, |v| v as u64)
    }

    /// `loss × scale`, to call `backward` on.
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        if !self.enabled {
            return Ok(loss.clone());
        }
        let _off = disable();
        if loss.is_traced() {
            let ctx = crate::jit::current()
                .ok_or_else(|| Error::invalid("GradScaler", "a traced loss outside of to_static"))?;
            ctx.register_named(&self.scale, SCALE_KEY);
            ctx.register_named(&self.good_steps, GOOD_STEPS_KEY);
            return loss * &self.scale.cast(loss.dtype())?;
        }
        loss * self.get_scale()
    }

    /// Divide every gradient of `optimizer`'s parameters by the scale (in place) and note
    /// whether any is inf or NaN. Call it before clipping gradients; [`GradScaler::step`] then
    /// does not unscale again. Unscaling twice in one iteration is an error.
    pub fn unscale_(&mut self, optimizer: &dyn Optimizer) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        if self.found_inf.is_some() {
            return Err(Error::invalid(
                "GradScaler",
                "unscale_ was already called for this step (call update() after step())",
            ));
        }
        let _off = disable();
        let _ng = crate::autograd::no_grad();
        // As tensor ops (eager kernels, or graph ops inside a static step): g / scale, and a
        // sum of g · 0 over every gradient, which is NaN exactly when some gradient element
        // is inf or NaN.
        let inv = (&scalar_f32(1.0) / &self.scale)?;
        let mut poison = scalar_f32(0.0);
        for p in optimizer.parameters() {
            let Some(g) = p.grad() else { continue };
            let zeroed = (&g * 0.0)?.cast(DType::F32)?.sum(&[], false)?;
            poison = (&poison + &zeroed.to(&poison.device())?)?;
            p.set_grad(Some((&g * &inv.cast(g.dtype())?.to(&g.device())?)?));
        }
        self.found_inf = Some(poison.not_equal(&poison)?);
        Ok(())
    }

    /// Unscale (unless [`GradScaler::unscale_`] already did) and run `optimizer.step()` unless a
    /// gradient is inf or NaN. Returns whether the step ran (inside a static step: `true`, the
    /// update being selected in the graph).
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        if !self.enabled {
            optimizer.step()?;
            return Ok(true);
        }
        if self.found_inf.is_none() {
            self.unscale_(optimizer)?;
        }
        let Some(found) = self.found_inf.clone() else {
            return Err(Error::invalid(
                "GradScaler",
                "internal: no overflow test after unscale_",
            ));
        };
        if found.is_traced() {
            optimizer.skip_traced_step_if(Some(found))?;
            let stepped = optimizer.step();
            optimizer.skip_traced_step_if(None)?;
            stepped?;
            return Ok(true);
        }
        if found.item()? != 0.0 {
            return Ok(false);
        }
        optimizer.step()?;
        Ok(true)
    }

    /// Adjust the scale after a step: ×backoff if this step's gradients overflowed, ×growth
    /// after `growth_interval` good steps in a row.
    pub fn update(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let Some(found) = self.found_inf.take() else {
            return Ok(());
        };
        let _off = disable();
        let _ng = crate::autograd::no_grad();
        if found.is_traced() {
            let s = &self.scale;
            let good = (&self.good_steps + 1.0)?;
            let grow = good.greater_equal(&scalar_f32(self.growth_interval as f64))?;
            let zero = scalar_f32(0.0);
            let grown = Tensor::where_(&grow, &(s * self.growth_factor)?, s)?;
            let scale = Tensor::where_(&found, &(s * self.backoff_factor)?, &grown)?;
            let good = Tensor::where_(&found, &zero, &Tensor::where_(&grow, &zero, &good)?)?;
            self.scale.assign(&scale)?;
            self.good_steps.assign(&good)?;
            return Ok(());
        }
        let (mut scale, mut good) = (self.get_scale(), self.good());
        if found.item()? != 0.0 {
            scale *= self.backoff_factor;
            good = 0;
        } else {
            good += 1;
            if good >= self.growth_interval {
                let grown = scale * self.growth_factor;
                if grown <= f64::from(f32::MAX) {
                    scale = grown;
                }
                good = 0;
            }
        }
        self.scale.set_data(TensorData::scalar(scale as f32))?;
        self.good_steps.set_data(TensorData::scalar(good as f32))?;
        Ok(())
    }

    /// Scale, growth counter and factors, to save with a checkpoint.
    pub fn state_dict(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([
            ("scale".to_string(), self.scale.item().unwrap_or(f64::NAN)),
            ("growth_factor".to_string(), self.growth_factor),
            ("backoff_factor".to_string(), self.backoff_factor),
            ("growth_interval".to_string(), self.growth_interval as f64),
            ("good_steps".to_string(), self.good() as f64),
        ])
    }

    /// Restore a [`GradScaler::state_dict`]; nothing changes if an entry is missing or invalid.
    pub fn load_state_dict(&mut self, state: &BTreeMap<String, f64>) -> Result<()> {
        let get = |k: &str| {
            state
                .get(k)
                .copied()
                .ok_or_else(|| Error::invalid("GradScaler", format!("state dict has no `{k}`")))
        };
        let count = |k: &str| -> Result<u64> {
            let v = get(k)?;
            if v >= 0.0 && v.fract() == 0.0 && v <= 16777216.0 {
                Ok(v as u64)
            } else {
                Err(Error::invalid(
                    "GradScaler",
                    format!("`{k}` must be a whole number in 0..=2^24, got {v}"),
                ))
            }
        };
        let next = GradScaler::new()
            .enabled(self.enabled)
            .init_scale(get("scale")?)?
            .growth_factor(get("growth_factor")?)?
            .backoff_factor(get("backoff_factor")?)?
            .growth_interval(count("growth_interval")?)?;
        let good = count("good_steps")?;
        // Everything checked: write into this scaler's own tensors (a static step may hold them).
        self.scale.set_data(next.scale.data())?;
        self.good_steps.set_data(TensorData::scalar(good as f32))?;
        self.growth_factor = next.growth_factor;
        self.backoff_factor = next.backoff_factor;
        self.growth_interval = next.growth_interval;
        self.found_inf = None;
        Ok(())
    }
}
