//! What every optimizer shares: the parameter list, learning rate, L2 decay, clipping, and
//! per-parameter state with its `state_dict` encoding.

use super::{GradClip, LearningRate, Params};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData, TensorType};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// State-dict key of a fixed learning rate.
const LR_KEY: &str = "@lr";
/// State-dict key of a scheduler's epoch.
const EPOCH_KEY: &str = "@lr_scheduler.last_epoch";
/// Prefix of the graph params that hold optimizer state in a static training step.
pub const OPT_PREFIX: &str = "@opt/";
/// Slot name of the per-parameter step counter.
const STEP_SLOT: &str = "step";

/// One parameter's optimizer state: how many updates it has had, and its buffers (moments,
/// velocity) in the optimizer's slot order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ParamState {
    pub(crate) step: u64,
    pub(crate) slots: Vec<Vec<f64>>,
}

/// Elements below which a parameter's update runs on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;
/// Elements per chunk of a large parameter's update.
const CHUNK: usize = 1 << 14;

/// A parameter element type the update rules run on (through f64, or f32 itself).
trait Real: bytemuck::Pod + Send + Sync {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    /// The parameter and gradient as f32 slices, when they are (the f32 update path).
    fn f32s<'a>(p: &'a mut [Self], g: &'a [Self]) -> Option<(&'a mut [f32], &'a [f32])>;
}

impl Real for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn f32s<'a>(p: &'a mut [f32], g: &'a [f32]) -> Option<(&'a mut [f32], &'a [f32])> {
        Some((p, g))
    }
}

impl Real for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn f32s<'a>(_: &'a mut [f64], _: &'a [f64]) -> Option<(&'a mut [f32], &'a [f32])> {
        None
    }
}

/// An optimizer's element-wise update rule: `update(lr, step, param, grad, slots)` on a block
/// of elements (`step` already counts this step), in f64 for every dtype, and for f32
/// parameters in f32 arithmetic as PyTorch's optimizers compute (vectorized at the host's
/// width), when the rule has that form ([`Rule::F32`]).
pub(crate) trait Rule: Sync {
    /// Whether [`Rule::update_f32`] is implemented.
    const F32: bool = false;
    fn update(&self, lr: f64, step: u64, p: &mut [f64], g: &[f64], slots: &mut [&mut [f64]]);
    fn update_f32(&self, _lr: f64, _step: u64, _p: &mut [f32], _g: &[f32], _slots: &mut [&mut [f32]]) {}
}

/// Most slots a rule keeps (Adam's two moments).
const MAX_SLOTS: usize = 2;

/// [`Rule::update_f32`] on f32 parameter `p` in place, blocks of [`STEP_BLOCK`] elements: the
/// gradient (with L2 decay `wd` added) and the slots (f64 holding f32 values: exact both ways)
/// go through f32 blocks on the stack.
fn run_f32(rule: &impl Rule, lr: f64, t: u64, wd: f64, p: &mut [f32], g: &[f32], slots: &mut [&mut [f64]]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // Safety: the features were detected on this host.
        return unsafe { run_f32_avx2(rule, lr, t, wd, p, g, slots) };
    }
    run_f32_body(rule, lr, t, wd, p, g, slots)
}

/// [`run_f32`] compiled for AVX2 (the conversions of the slots vectorize 4 and 8 wide).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_f32_avx2(rule: &impl Rule, lr: f64, t: u64, wd: f64, p: &mut [f32], g: &[f32], slots: &mut [&mut [f64]]) {
    run_f32_body(rule, lr, t, wd, p, g, slots)
}

#[inline(always)]
fn run_f32_body(rule: &impl Rule, lr: f64, t: u64, wd: f64, p: &mut [f32], g: &[f32], slots: &mut [&mut [f64]]) {
    let (mut gb, mut sb) = ([0f32; STEP_BLOCK], [[0f32; STEP_BLOCK]; MAX_SLOTS]);
    let wd = wd as f32;
    let mut at = 0;
    while at < p.len() {
        let n = STEP_BLOCK.min(p.len() - at);
        let (pb, gb) = (&mut p[at..at + n], &mut gb[..n]);
        gb.copy_from_slice(&g[at..at + n]);
        if wd != 0.0 {
            gb.iter_mut().zip(pb.iter()).for_each(|(g, p)| *g += wd * p);
        }
        let (used, _) = sb.split_at_mut(slots.len());
        for (b, s) in used.iter_mut().zip(slots.iter()) {
            b[..n].iter_mut().zip(&s[at..at + n]).for_each(|(b, s)| *b = *s as f32);
        }
        let mut block: [&mut [f32]; MAX_SLOTS] = {
            let [a, b] = &mut sb;
            [&mut a[..n], &mut b[..n]]
        };
        rule.update_f32(lr, t, pb, gb, &mut block[..slots.len()]);
        for (b, s) in block.iter().zip(slots.iter_mut()) {
            s[at..at + n].iter_mut().zip(b.iter()).for_each(|(s, b)| *s = *b as f64);
        }
        at += n;
    }
}

/// Elements converted to f64 at a time by [`apply_chunked`] (on the stack).
const STEP_BLOCK: usize = 512;

/// Count one more step in `state` and apply `rule` to `p` (with L2 decay `wd` added to its
/// gradient `g`) and `state`'s slots, in place: blocks of [`STEP_BLOCK`] elements go through
/// f64 on the stack (f32 for an f32 parameter and a rule with an f32 form, [`run_f32`]), and a large parameter is split in
/// chunks over the thread pool (every rule is element-wise, so the result is the same). With
/// `round` (an f32 parameter) the slots are rounded to f32 after the update — exactly what a
/// saved state holds, so a restore resumes bit for bit.
fn apply_chunked<T: Real, R: Rule>(
    rule: &R,
    lr: f64,
    wd: f64,
    state: &mut ParamState,
    p: &mut [T],
    g: &[T],
    round: bool,
) {
    use rayon::prelude::*;
    state.step += 1;
    let t = state.step;
    let run = |p: &mut [T], g: &[T], slots: &mut [&mut [f64]]| {
        if R::F32
            && slots.len() <= MAX_SLOTS
            && let Some((p, g)) = T::f32s(p, g)
        {
            return run_f32(rule, lr, t, wd, p, g, slots);
        }
        let (mut pb, mut gb) = ([0f64; STEP_BLOCK], [0f64; STEP_BLOCK]);
        let mut at = 0;
        while at < p.len() {
            let n = STEP_BLOCK.min(p.len() - at);
            let (pb, gb) = (&mut pb[..n], &mut gb[..n]);
            for j in 0..n {
                pb[j] = p[at + j].to_f64();
                gb[j] = g[at + j].to_f64();
            }
            if wd != 0.0 {
                gb.iter_mut().zip(pb.iter()).for_each(|(g, p)| *g += wd * p);
            }
            let mut block: Vec<&mut [f64]> = slots.iter_mut().map(|s| &mut s[at..at + n]).collect();
            rule.update(lr, t, pb, gb, &mut block);
            if round {
                block
                    .iter_mut()
                    .for_each(|s| s.iter_mut().for_each(|x| *x = *x as f32 as f64));
            }
            for j in 0..n {
                p[at + j] = T::from_f64(pb[j]);
            }
            at += n;
        }
    };
    if p.len() < PARALLEL_MIN_ELEMENTS || rayon::current_num_threads() < 2 {
        let mut slots: Vec<&mut [f64]> = state.slots.iter_mut().map(|s| s.as_mut_slice()).collect();
        run(p, g, &mut slots);
        return;
    }
    let mut parts: Vec<Vec<&mut [f64]>> = (0..p.len().div_ceil(CHUNK)).map(|_| Vec::new()).collect();
    for s in state.slots.iter_mut() {
        for (c, part) in s.chunks_mut(CHUNK).enumerate() {
            parts[c].push(part);
        }
    }
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(parts.par_iter_mut())
        .for_each(|((p, g), slots)| run(p, g, slots));
}

/// [`apply_chunked`] on a parameter's own bytes `p` and its gradient's bytes `g` as `T`;
/// false (nothing changed) when they are not aligned for `T` or their lengths differ from the
/// state's.
#[allow(clippy::too_many_arguments)]
fn apply_to_bytes<T: Real>(
    rule: &impl Rule,
    lr: f64,
    wd: f64,
    state: &mut ParamState,
    p: &mut [u8],
    g: &[u8],
    round: bool,
) -> bool {
    let (Ok(p), Ok(g)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(p),
        bytemuck::try_cast_slice::<u8, T>(g),
    ) else {
        return false;
    };
    if p.len() != g.len() || state.slots.iter().any(|s| s.len() != p.len()) {
        return false;
    }
    apply_chunked(rule, lr, wd, state, p, g, round);
    true
}

/// The state of a parameter of `len` elements, created (step 0, zero slots) on first use.
fn param_state(state: &mut Option<ParamState>, slots: usize, len: usize) -> &mut ParamState {
    state.get_or_insert_with(|| ParamState {
        step: 0,
        slots: vec![vec![0.0; len]; slots],
    })
}

/// The dtype state is kept in for a parameter of `dtype` (f32 master state for half types).
fn state_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 { DType::F64 } else { DType::F32 }
}

/// Device-held state as host state (downloads the slots).
fn host_state(d: &DeviceState) -> Result<ParamState> {
    Ok(ParamState {
        step: d.step,
        slots: d
            .slots
            .iter()
            .map(|s| Ok(s.try_data()?.to_f64_vec()))
            .collect::<Result<_>>()?,
    })
}

/// The values a traced update rule reads.
pub(crate) struct TracedUpdate {
    pub(crate) lr: Tensor,
    pub(crate) param: Tensor,
    pub(crate) grad: Tensor,
    pub(crate) step: Tensor,
    pub(crate) slots: Vec<Tensor>,
}

impl TracedUpdate {
    /// A scalar of the parameter's dtype.
    pub(crate) fn scalar(&self, v: f64) -> Result<Tensor> {
        Ok(Tensor::from_data(TensorData::from_f64_slice(
            self.param.dtype(),
            vec![],
            &[v],
        )?))
    }
}

pub(crate) struct Core {
    /// The optimizer's name, for errors.
    pub(crate) op: &'static str,
    names: Vec<String>,
    params: Vec<Tensor>,
    pub(crate) lr: LearningRate,
    pub(crate) weight_decay: f64,
    pub(crate) grad_clip: Option<Arc<dyn GradClip>>,
    slots: &'static [&'static str],
    state: Vec<Option<ParamState>>,
    /// The state of parameters updated on their device ([`Core::device_step`]), kept there.
    device_state: Vec<Option<DeviceState>>,
}

/// A parameter's optimizer state on its device: the step count and the slots as tensors
/// there (in the state dtype).
#[derive(Clone)]
struct DeviceState {
    step: u64,
    slots: Vec<Tensor>,
}

impl Core {
    pub(crate) fn new(op: &'static str, params: Params, lr: LearningRate, slots: &'static [&'static str]) -> Core {
        let n = params.tensors.len();
        Core {
            op,
            names: params.names,
            params: params.tensors,
            lr,
            weight_decay: 0.0,
            grad_clip: None,
            slots,
            state: vec![None; n],
            device_state: vec![None; n],
        }
    }

    pub(crate) fn params(&self) -> &[Tensor] {
        &self.params
    }

    pub(crate) fn invalid(&self, detail: impl Into<String>) -> Error {
        Error::invalid(self.op, detail)
    }

    /// Checks shared by every optimizer, run before any parameter changes.
    fn check(&self, lr: f64) -> Result<()> {
        if !lr.is_finite() || lr < 0.0 {
            return Err(self.invalid(format!("learning rate must be finite and >= 0, got {lr}")));
        }
        if !self.weight_decay.is_finite() || self.weight_decay < 0.0 {
            return Err(self.invalid(format!(
                "weight_decay must be finite and >= 0, got {}",
                self.weight_decay
            )));
        }
        let mut seen = BTreeSet::new();
        for (name, p) in self.names.iter().zip(&self.params) {
            if !seen.insert(name) {
                return Err(self.invalid(format!("two parameters are named `{name}`")));
            }
            if !p.dtype().is_float() {
                return Err(self.invalid(format!("parameter `{name}` is {}, not a float", p.tensor_type())));
            }
        }
        Ok(())
    }

    /// One optimizer step: gather gradients of trainable parameters that have one, clip them,
    /// add L2 decay, then apply the element-wise rule `update(lr, step, param, grad, slots)` to
    /// each (`step` already counts this step; large parameters in chunks across threads) and
    /// write the results back.
    pub(crate) fn step(&mut self, rule: &impl Rule) -> Result<()> {
        let lr = self.lr.value();
        self.check(lr)?;
        let on_device = self.on_device();
        self.pull_device_state(on_device)?;
        let mut which = Vec::new();
        let mut grads = Vec::new();
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            if p.stop_gradient() || (on_device && !p.device().is_cpu()) {
                continue;
            }
            let g = g.try_data()?;
            if g.shape() != p.shape().as_slice() {
                return Err(self.grad_mismatch(i, g.tensor_type()));
            }
            which.push(i);
            grads.push(g);
        }
        if let Some(clip) = &self.grad_clip {
            // Clipping looks at every gradient at once: host vectors.
            let mut host: Vec<Vec<f64>> = grads.iter().map(TensorData::to_f64_vec).collect();
            clip.clip(&mut host)?;
            for (&i, g) in which.iter().zip(host) {
                self.host_update(rule, lr, i, g)?;
            }
            return Ok(());
        }
        for (&i, g) in which.iter().zip(&grads) {
            let p = &self.params[i];
            let dtype = p.dtype();
            let state = param_state(&mut self.state[i], self.slots.len(), g.len());
            let (wd, round) = (self.weight_decay, state_dtype(dtype) == DType::F32);
            // The parameter's own memory, updated in place (copied first if something else
            // still shares it, e.g. a tensor from `.data()`).
            let done = p.with_host_data_mut(|d| match dtype {
                DType::F32 => apply_to_bytes::<f32>(rule, lr, wd, state, d.bytes_mut(), g.bytes(), round),
                DType::F64 => apply_to_bytes::<f64>(rule, lr, wd, state, d.bytes_mut(), g.bytes(), round),
                _ => false,
            });
            if done != Some(true) {
                self.host_update(rule, lr, i, g.to_f64_vec())?;
            }
        }
        Ok(())
    }

    /// The update of parameter `i` through host vectors (any dtype or device): gradient `g`
    /// (already clipped; clip first, then decay: Paddle's `apply_gradients` order), and the
    /// result written back as a new value.
    fn host_update(&mut self, rule: &impl Rule, lr: f64, i: usize, g: Vec<f64>) -> Result<()> {
        let p = self.params[i].try_data()?;
        let state = param_state(&mut self.state[i], self.slots.len(), p.len());
        let round = state_dtype(p.dtype()) == DType::F32;
        if p.dtype() == DType::F32 {
            // In f32, as the in-place path computes an f32 parameter: the same bits.
            let mut value: Vec<f32> = p.to_f64_vec().iter().map(|&v| v as f32).collect();
            let g: Vec<f32> = g.iter().map(|&v| v as f32).collect();
            apply_chunked(rule, lr, self.weight_decay, state, &mut value, &g, round);
            return self.params[i].set_data(TensorData::from_vec(p.shape().to_vec(), value)?);
        }
        let mut value = p.to_f64_vec();
        apply_chunked(rule, lr, self.weight_decay, state, &mut value, &g, round);
        self.params[i].set_data(TensorData::from_f64_slice(p.dtype(), p.shape().to_vec(), &value)?)
    }

    /// True when parameters on a device are updated there ([`Core::device_step`]): some
    /// parameter lives on a device and no gradient clipping (which runs on the host) is set.
    pub(crate) fn on_device(&self) -> bool {
        self.grad_clip.is_none() && self.params.iter().any(|p| !p.device().is_cpu())
    }

    /// Bring device-held state back to the host state (a parameter moved back to the CPU,
    /// clipping was turned on, or a state dict is wanted).
    /// `on_device` is [`Core::on_device`]'s answer for this step.
    fn pull_device_state(&mut self, on_device: bool) -> Result<()> {
        for (i, p) in self.params.iter().enumerate() {
            if on_device && !p.device().is_cpu() {
                continue;
            }
            if let Some(ds) = self.device_state[i].take() {
                self.state[i] = Some(host_state(&ds)?);
            }
        }
        Ok(())
    }

    /// The error for parameter `i` whose gradient has another shape.
    fn grad_mismatch(&self, i: usize, grad: TensorType) -> Error {
        self.invalid(format!(
            "parameter `{}` is {} but its gradient is {grad}",
            self.names[i],
            self.params[i].tensor_type()
        ))
    }

    /// The device form of [`Core::step`] for parameters on a device: the optimizer's tensor-op
    /// update rule (the one `to_static` records) runs as eager ops there, with the state kept on
    /// the device, so a step moves nothing through the host. The same gradient checks and
    /// L2 decay as the host step; computed in the parameter's dtype.
    pub(crate) fn device_step(
        &mut self,
        update: impl Fn(&TracedUpdate) -> Result<(Tensor, Vec<Tensor>)>,
    ) -> Result<()> {
        let lr = self.lr.value();
        self.check(lr)?;
        let _g = crate::autograd::no_grad();
        for i in 0..self.params.len() {
            let p = self.params[i].clone();
            let device = p.device();
            if device.is_cpu() || p.stop_gradient() {
                continue;
            }
            let Some(grad) = p.grad() else { continue };
            if grad.shape() != p.shape() {
                return Err(self.grad_mismatch(i, grad.tensor_type()));
            }
            let dtype = state_dtype(p.dtype());
            let st = match self.device_state[i].take() {
                Some(st) => st,
                None => {
                    let host = self.state[i].take();
                    let slots = (0..self.slots.len())
                        .map(|j| {
                            let t = match &host {
                                Some(h) => {
                                    Tensor::from_data(TensorData::from_f64_slice(dtype, p.shape(), &h.slots[j])?)
                                }
                                None => crate::tensor::zeros(&p.shape(), dtype)?,
                            };
                            t.to(&device)
                        })
                        .collect::<Result<_>>()?;
                    DeviceState {
                        step: host.map_or(0, |h| h.step),
                        slots,
                    }
                }
            };
            let grad = if self.weight_decay != 0.0 {
                (&grad + &(&p * self.weight_decay)?)?
            } else {
                grad
            };
            let scalar = |v: f64| -> Result<Tensor> {
                Tensor::from_data(TensorData::from_f64_slice(p.dtype(), vec![], &[v])?).to(&device)
            };
            let next = st.step + 1;
            let args = TracedUpdate {
                lr: scalar(lr)?,
                param: p.detach(),
                grad,
                step: scalar(next as f64)?,
                slots: st.slots.iter().map(|s| s.cast(p.dtype())).collect::<Result<_>>()?,
            };
            let (new_p, new_slots) = update(&args)?;
            p.set_value(&new_p.cast(p.dtype())?.to(&device)?)?;
            self.device_state[i] = Some(DeviceState {
                step: next,
                slots: new_slots
                    .iter()
                    .map(|s| s.cast(dtype)?.to(&device))
                    .collect::<Result<_>>()?,
            });
        }
        Ok(())
    }

    /// True when a gradient is a traced value: `to_static` is recording a training step.
    pub(crate) fn is_traced(&self) -> bool {
        self.params.iter().any(|p| p.grad().is_some_and(|g| g.is_traced()))
    }

    /// The traced form of [`Core::step`]: the update is recorded with tensor ops, and the
    /// learning rate, each parameter's step counter and its slots become named graph params
    /// (`@opt/@lr`, `@opt/<param>.step`, `@opt/<param>.<slot>`) whose new values are graph
    /// outputs. `update(lr, param, grad, step, slots)` returns the new param and slots; `lr`
    /// and `step` are scalars of the param's dtype, `step` already counting this update.
    pub(crate) fn traced_step(
        &mut self,
        update: impl Fn(&TracedUpdate) -> Result<(Tensor, Vec<Tensor>)>,
    ) -> Result<()> {
        let lr = self.lr.value();
        self.check(lr)?;
        if self.grad_clip.is_some() {
            return Err(self.invalid("gradient clipping inside a static training step is not supported yet"));
        }
        let ctx = crate::jit::current().ok_or_else(|| self.invalid("traced gradients outside of to_static"))?;
        let _g = crate::autograd::no_grad();
        let lr_t = Tensor::scalar(lr);
        ctx.register_named(&lr_t, &format!("{OPT_PREFIX}{LR_KEY}"));
        for (i, p) in self.params.iter().enumerate() {
            let Some(grad) = p.grad() else { continue };
            if p.stop_gradient() {
                continue;
            }
            let name = &self.names[i];
            let st = self.state[i].clone().unwrap_or_else(|| ParamState {
                step: 0,
                slots: vec![vec![0.0; p.numel()]; self.slots.len()],
            });
            let step = Tensor::scalar(st.step as f64);
            ctx.register_named(&step, &format!("{OPT_PREFIX}{name}.{STEP_SLOT}"));
            let mut slots = Vec::with_capacity(self.slots.len());
            for (slot, vals) in self.slots.iter().zip(&st.slots) {
                let t = Tensor::from_data(TensorData::from_f64_slice(state_dtype(p.dtype()), p.shape(), vals)?);
                ctx.register_named(&t, &format!("{OPT_PREFIX}{name}.{slot}"));
                slots.push(t);
            }
            let grad = if self.weight_decay != 0.0 {
                (&grad + &(p * self.weight_decay)?)?
            } else {
                grad
            };
            let next = (&step + 1.0)?;
            let args = TracedUpdate {
                lr: lr_t.cast(p.dtype())?,
                param: p.clone(),
                grad,
                step: next.cast(p.dtype())?,
                slots: slots.iter().map(|s| s.cast(p.dtype())).collect::<Result<_>>()?,
            };
            let (new_p, new_slots) = update(&args)?;
            p.assign(&new_p.cast(p.dtype())?)?;
            step.assign(&next)?;
            for (s, n) in slots.iter().zip(new_slots) {
                s.assign(&n.cast(s.dtype())?)?;
            }
        }
        Ok(())
    }

    pub(crate) fn state_dict(&self) -> BTreeMap<String, TensorData> {
        let mut out = BTreeMap::new();
        match &self.lr {
            LearningRate::Fixed(v) => {
                out.insert(LR_KEY.to_string(), TensorData::scalar(*v));
            }
            LearningRate::Scheduler(s) => {
                out.insert(EPOCH_KEY.to_string(), TensorData::scalar(s.last_epoch() as i64));
            }
        }
        let from_device: Vec<Option<ParamState>> = self
            .device_state
            .iter()
            .map(|d| d.as_ref().and_then(|d| host_state(d).ok()))
            .collect();
        for (((name, p), st), dst) in self.names.iter().zip(&self.params).zip(&self.state).zip(&from_device) {
            let Some(st) = st.as_ref().or(dst.as_ref()) else {
                continue;
            };
            let (dtype, shape) = (state_dtype(p.dtype()), p.shape());
            out.insert(format!("{name}.{STEP_SLOT}"), TensorData::scalar(st.step as i64));
            for (slot, vals) in self.slots.iter().zip(&st.slots) {
                let d = TensorData::from_f64_slice(dtype, shape.clone(), vals).expect("state matches its parameter");
                out.insert(format!("{name}.{slot}"), d);
            }
        }
        out
    }

    pub(crate) fn set_state_dict(&mut self, state: &BTreeMap<String, TensorData>) -> Result<()> {
        let bad = |detail: String| Error::invalid(&format!("{}.set_state_dict", self.op), detail);
        let index: BTreeMap<&str, usize> = self.names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        let mut new_state: Vec<Option<ParamState>> = vec![None; self.params.len()];
        let mut new_lr = None;
        let mut new_epoch = None;
        let scalar_i64 = |key: &str, d: &TensorData| -> Result<u64> {
            match d.to_vec::<i64>().ok().filter(|_| d.shape().is_empty()).map(|v| v[0]) {
                Some(v) if v >= 0 => Ok(v as u64),
                _ => Err(bad(format!("`{key}` must be a non-negative i64 scalar, got {d:?}"))),
            }
        };
        for (key, d) in state {
            match (key.as_str(), &self.lr) {
                (LR_KEY, LearningRate::Fixed(_)) => {
                    match d.to_vec::<f64>().ok().filter(|_| d.shape().is_empty()) {
                        Some(v) => new_lr = Some(v[0]),
                        None => return Err(bad(format!("`{key}` must be an f64 scalar, got {d:?}"))),
                    }
                    continue;
                }
                (EPOCH_KEY, LearningRate::Scheduler(_)) => {
                    new_epoch = Some(scalar_i64(key, d)?);
                    continue;
                }
                (LR_KEY | EPOCH_KEY, _) => {
                    return Err(bad(format!(
                        "`{key}` does not fit this optimizer's learning rate ({:?})",
                        self.lr
                    )));
                }
                _ => {}
            }
            let (name, slot) = key
                .rsplit_once('.')
                .ok_or_else(|| bad(format!("unexpected entry `{key}`")))?;
            let &i = index
                .get(name)
                .ok_or_else(|| bad(format!("`{key}` names no parameter of this optimizer")))?;
            let p = &self.params[i];
            let st = new_state[i].get_or_insert_with(|| ParamState {
                step: u64::MAX,
                slots: vec![Vec::new(); self.slots.len()],
            });
            if slot == STEP_SLOT {
                st.step = scalar_i64(key, d)?;
                continue;
            }
            let j = self
                .slots
                .iter()
                .position(|s| *s == slot)
                .ok_or_else(|| bad(format!("unexpected entry `{key}` ({} keeps {:?})", self.op, self.slots)))?;
            let want = (state_dtype(p.dtype()), p.shape());
            if (d.dtype(), d.shape().to_vec()) != want {
                return Err(bad(format!(
                    "`{key}` is {} but parameter `{name}` ({}) needs {}{:?}",
                    d.tensor_type(),
                    p.tensor_type(),
                    want.0,
                    want.1
                )));
            }
            st.slots[j] = d.to_f64_vec();
        }
        for (i, st) in new_state.iter().enumerate() {
            if let Some(st) = st {
                let n = self.params[i].numel();
                if st.step == u64::MAX || st.slots.iter().any(|s| s.len() != n) {
                    return Err(bad(format!(
                        "the state of parameter `{}` is incomplete (needs `{STEP_SLOT}` and {:?})",
                        self.names[i], self.slots
                    )));
                }
            }
        }
        // Everything checked: now change the optimizer.
        self.state = new_state;
        self.device_state = vec![None; self.params.len()];
        if let Some(v) = new_lr {
            self.lr = LearningRate::Fixed(v);
        }
        if let (Some(e), LearningRate::Scheduler(s)) = (new_epoch, &self.lr) {
            s.set_last_epoch(e);
        }
        Ok(())
    }

    pub(crate) fn clear_grad(&self) {
        self.params.iter().for_each(Tensor::clear_grad);
    }
}

/// Implements [`super::Optimizer`] for a type with a `core: Core` field and an `update` method.
macro_rules! impl_optimizer {
    ($t:ty, l2) => {
        $crate::optimizer::core::impl_optimizer!($t);

        impl $t {
            /// L2 regularization: `coeff * param` is added to each gradient (after clipping).
            pub fn weight_decay(mut self, coeff: f64) -> Self {
                self.core.weight_decay = coeff;
                self
            }
        }
    };
    ($t:ty) => {
        impl $crate::optimizer::Optimizer for $t {
            fn step(&mut self) -> $crate::Result<()> {
                self.check_hyper()?;
                let hyper = self.hyper();
                if self.core.is_traced() {
                    return self.core.traced_step(|u| hyper.traced_update(u));
                }
                if self.core.on_device() {
                    self.core.device_step(|u| hyper.traced_update(u))?;
                }
                self.core.step(&hyper)
            }
            fn clear_grad(&self) {
                self.core.clear_grad()
            }
            fn get_lr(&self) -> f64 {
                self.core.lr.value()
            }
            fn set_lr(&mut self, lr: f64) {
                self.core.lr = $crate::optimizer::LearningRate::Fixed(lr);
            }
            fn state_dict(&self) -> std::collections::BTreeMap<String, oar_ir::TensorData> {
                self.core.state_dict()
            }
            fn set_state_dict(
                &mut self,
                state: &std::collections::BTreeMap<String, oar_ir::TensorData>,
            ) -> $crate::Result<()> {
                self.core.set_state_dict(state)
            }
            fn parameters(&self) -> &[$crate::Tensor] {
                self.core.params()
            }
        }

        impl $t {
            /// Clip gradients (e.g. [`crate::optimizer::ClipGradByGlobalNorm`]) before each update.
            pub fn grad_clip(mut self, clip: impl $crate::optimizer::GradClip + 'static) -> Self {
                self.core.grad_clip = Some(std::sync::Arc::new(clip));
                self
            }

            /// The learning-rate scheduler, if the optimizer follows one.
            pub fn lr_scheduler(&self) -> Option<std::sync::Arc<dyn $crate::optimizer::lr::LRScheduler>> {
                match &self.core.lr {
                    $crate::optimizer::LearningRate::Scheduler(s) => Some(s.clone()),
                    $crate::optimizer::LearningRate::Fixed(_) => None,
                }
            }
        }
    };
}
pub(crate) use impl_optimizer;
