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
/// Slot name of a half parameter's f32 master copy (multi-precision).
const MASTER_SLOT: &str = "master_weight";

/// One parameter's optimizer state: how many updates it has had, and its buffers (moments,
/// velocity) in the optimizer's slot order, each shaped as the parameter in the state dtype
/// ([`state_dtype`]: f32 for f32 and half parameters, as PyTorch keeps it, f64 for f64).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ParamState {
    pub(crate) step: u64,
    pub(crate) slots: Vec<TensorData>,
    /// The f32 master copy of a half parameter under multi-precision (AMP O2): the update
    /// runs on it and the parameter is its rounding.
    pub(crate) master: Option<TensorData>,
}

/// Elements below which a parameter's update runs on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;
/// Elements per chunk of a large parameter's update.
const CHUNK: usize = 1 << 14;

/// A parameter element type the update rules run on (through f64, or f32 itself).
trait Real: bytemuck::Pod + Send + Sync {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    /// The parameter and gradient as f32 slices, when they are (the f32 update path).
    fn f32s<'a>(p: &'a mut [Self], g: &'a [Self]) -> Option<(&'a mut [f32], &'a [f32])>;
}

impl Real for f32 {
    const DTYPE: DType = DType::F32;
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
    const DTYPE: DType = DType::F64;
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

/// [`Rule::update_f32`] on f32 parameter `p` and f32 slots in place; with L2 decay `wd` the
/// gradient goes through blocks of [`STEP_BLOCK`] elements on the stack (`g + wd·p`).
fn run_f32(rule: &impl Rule, lr: f64, t: u64, wd: f64, p: &mut [f32], g: &[f32], slots: &mut [&mut [f32]]) {
    #[cfg(target_arch = "x86_64")]
    if wd != 0.0 && std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // Safety: the features were detected on this host.
        return unsafe { run_f32_avx2(rule, lr, t, wd, p, g, slots) };
    }
    run_f32_body(rule, lr, t, wd, p, g, slots)
}

/// [`run_f32`] compiled for AVX2 (the decayed gradient blocks vectorize 8 wide).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_f32_avx2(rule: &impl Rule, lr: f64, t: u64, wd: f64, p: &mut [f32], g: &[f32], slots: &mut [&mut [f32]]) {
    run_f32_body(rule, lr, t, wd, p, g, slots)
}

#[inline(always)]
fn run_f32_body(rule: &impl Rule, lr: f64, t: u64, wd: f64, p: &mut [f32], g: &[f32], slots: &mut [&mut [f32]]) {
    if wd == 0.0 {
        return rule.update_f32(lr, t, p, g, slots);
    }
    let wd = wd as f32;
    let mut gb = [0f32; STEP_BLOCK];
    let mut at = 0;
    while at < p.len() {
        let n = STEP_BLOCK.min(p.len() - at);
        let (pb, gb) = (&mut p[at..at + n], &mut gb[..n]);
        gb.iter_mut()
            .zip(&g[at..at + n])
            .zip(pb.iter())
            .for_each(|((b, g), p)| *b = g + wd * p);
        let mut block: Vec<&mut [f32]> = slots.iter_mut().map(|s| &mut s[at..at + n]).collect();
        rule.update_f32(lr, t, pb, gb, &mut block);
        at += n;
    }
}

/// Elements converted to f64 at a time by [`apply_chunked`] (on the stack).
const STEP_BLOCK: usize = 512;

/// Count one more step in `state` and apply `rule` to `p` (with L2 decay `wd` added to its
/// gradient `g`) and `state`'s slots, in place. An f32 parameter with f32 slots and a rule
/// with an f32 form computes in f32 on the buffers themselves ([`run_f32`]); otherwise blocks
/// of [`STEP_BLOCK`] elements go through f64 on the stack and are stored back in the
/// parameter's and the slots' dtypes. A large parameter is split in chunks over the thread
/// pool (every rule is element-wise, so the result is the same). False (nothing changed) when
/// the slots are neither f32 nor f64 buffers, which a state made or checked here never is.
#[must_use]
fn apply_chunked<T: Real, R: Rule>(rule: &R, lr: f64, wd: f64, state: &mut ParamState, p: &mut [T], g: &[T]) -> bool {
    let t = state.step + 1;
    let f32_slots = state.slots.iter().all(|s| s.dtype() == DType::F32);
    if f32_slots
        && R::F32
        && let Some((p, g)) = T::f32s(p, g)
        && let Some(mut slots) = typed_slots::<f32>(&mut state.slots)
    {
        for_chunks(p, g, &mut slots, |p, g, s| run_f32(rule, lr, t, wd, p, g, s));
    } else if f32_slots && let Some(mut slots) = typed_slots::<f32>(&mut state.slots) {
        for_chunks(p, g, &mut slots, |p, g, s| run_f64(rule, lr, t, wd, p, g, s));
    } else if let Some(mut slots) = typed_slots::<f64>(&mut state.slots) {
        for_chunks(p, g, &mut slots, |p, g, s| run_f64(rule, lr, t, wd, p, g, s));
    } else {
        return false;
    }
    state.step = t;
    true
}

/// The slots as `S` slices (`None` when one is not `S`'s dtype, or not aligned for it).
fn typed_slots<S: Real>(slots: &mut [TensorData]) -> Option<Vec<&mut [S]>> {
    slots
        .iter_mut()
        .map(|s| {
            if s.dtype() != S::DTYPE {
                return None;
            }
            if s.is_empty() {
                // An empty buffer's pointer need not be aligned.
                return Some(&mut [][..]);
            }
            bytemuck::try_cast_slice_mut::<u8, S>(s.bytes_mut()).ok()
        })
        .collect()
}

/// `f(p, g, slots)` on the whole parameter, or on chunks of [`CHUNK`] elements across the
/// thread pool when it is large.
fn for_chunks<T: Send + Sync, S: Send>(
    p: &mut [T],
    g: &[T],
    slots: &mut [&mut [S]],
    f: impl Fn(&mut [T], &[T], &mut [&mut [S]]) + Sync,
) {
    use rayon::prelude::*;
    if p.len() < PARALLEL_MIN_ELEMENTS || rayon::current_num_threads() < 2 {
        return f(p, g, slots);
    }
    let mut parts: Vec<Vec<&mut [S]>> = (0..p.len().div_ceil(CHUNK)).map(|_| Vec::new()).collect();
    for s in slots.iter_mut() {
        for (c, part) in s.chunks_mut(CHUNK).enumerate() {
            parts[c].push(part);
        }
    }
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(parts.par_iter_mut())
        .for_each(|((p, g), slots)| f(p, g, slots));
}

/// [`Rule::update`] on blocks of [`STEP_BLOCK`] elements converted to f64 on the stack; the
/// results are stored back in `T` and `S` (rounded once).
fn run_f64<T: Real, S: Real>(rule: &impl Rule, lr: f64, t: u64, wd: f64, p: &mut [T], g: &[T], slots: &mut [&mut [S]]) {
    let (mut pb, mut gb) = ([0f64; STEP_BLOCK], [0f64; STEP_BLOCK]);
    let mut sb = vec![[0f64; STEP_BLOCK]; slots.len()];
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
        for (b, s) in sb.iter_mut().zip(slots.iter()) {
            b[..n].iter_mut().zip(&s[at..at + n]).for_each(|(b, s)| *b = s.to_f64());
        }
        let mut block: Vec<&mut [f64]> = sb.iter_mut().map(|b| &mut b[..n]).collect();
        rule.update(lr, t, pb, gb, &mut block);
        for (b, s) in block.iter().zip(slots.iter_mut()) {
            s[at..at + n]
                .iter_mut()
                .zip(b.iter())
                .for_each(|(s, b)| *s = S::from_f64(*b));
        }
        for j in 0..n {
            p[at + j] = T::from_f64(pb[j]);
        }
        at += n;
    }
}

/// [`apply_chunked`] on a parameter's own bytes `p` and its gradient's bytes `g` as `T`;
/// false (nothing changed) when they are not aligned for `T` or their lengths differ from the
/// state's.
fn apply_to_bytes<T: Real>(rule: &impl Rule, lr: f64, wd: f64, state: &mut ParamState, p: &mut [u8], g: &[u8]) -> bool {
    let (Ok(p), Ok(g)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(p),
        bytemuck::try_cast_slice::<u8, T>(g),
    ) else {
        return false;
    };
    if p.len() != g.len() || state.slots.iter().any(|s| s.len() != p.len()) {
        return false;
    }
    apply_chunked(rule, lr, wd, state, p, g)
}

/// The state of a parameter of `dtype` and `shape`, created (step 0, zero slots) on first use.
fn param_state<'a>(
    state: &'a mut Option<ParamState>,
    slots: usize,
    dtype: DType,
    shape: &[usize],
) -> Result<&'a mut ParamState> {
    if state.is_none() {
        *state = Some(fresh_state(slots, dtype, shape)?);
    }
    state
        .as_mut()
        .ok_or_else(|| Error::invalid("optimizer", "internal: no parameter state"))
}

/// Step 0 and zero slots for a parameter of `dtype` and `shape`.
fn fresh_state(slots: usize, dtype: DType, shape: &[usize]) -> Result<ParamState> {
    let zero = TensorData::full(state_dtype(dtype), shape.to_vec(), 0.0)?;
    Ok(ParamState {
        step: 0,
        slots: vec![zero; slots],
        master: None,
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
        slots: d.slots.iter().map(|s| s.try_data()).collect::<Result<_>>()?,
        master: None,
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
    /// Keep f32 master weights for f16/bf16 parameters (AMP O2, Paddle's `multi_precision`).
    pub(crate) multi_precision: bool,
    /// A traced bool scalar: where true, a traced step keeps the old values.
    pub(crate) traced_skip: Option<Tensor>,
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
            multi_precision: false,
            traced_skip: None,
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
    pub(crate) fn step<R: Rule>(&mut self, rule: &R) -> Result<()> {
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
        // f32 parameters under a rule with an f32 form: one pass over all of them at once.
        let rest = if R::F32 {
            self.multi_tensor_f32(rule, lr, &which, &grads)?
        } else {
            (0..which.len()).collect()
        };
        for (&i, g) in rest.iter().map(|&k| (&which[k], &grads[k])) {
            let p = &self.params[i];
            let dtype = p.dtype();
            let state = param_state(&mut self.state[i], self.slots.len(), dtype, g.shape())?;
            let wd = self.weight_decay;
            // The parameter's own memory, updated in place (copied first if something else
            // still shares it, e.g. a tensor from `.data()`).
            let done = p.with_host_data_mut(|d| match dtype {
                DType::F32 => apply_to_bytes::<f32>(rule, lr, wd, state, d.bytes_mut(), g.bytes()),
                DType::F64 => apply_to_bytes::<f64>(rule, lr, wd, state, d.bytes_mut(), g.bytes()),
                _ => false,
            });
            if done != Some(true) {
                self.host_update(rule, lr, i, g.to_f64_vec())?;
            }
        }
        Ok(())
    }

    /// The multi-tensor form of the in-place step (PyTorch's `foreach`/fused optimizers): the
    /// f32 host parameters among `which` (gradients `grads`, f32 state) are updated together —
    /// every parameter's chunks of [`CHUNK`] elements in one parallel pass, so small parameters
    /// share the threads with large ones and a step costs one dispatch, not one per parameter.
    /// Returns the positions in `which` it left to the one-by-one path.
    fn multi_tensor_f32<R: Rule>(
        &mut self,
        rule: &R,
        lr: f64,
        which: &[usize],
        grads: &[TensorData],
    ) -> Result<Vec<usize>> {
        use rayon::prelude::*;
        let mut rest = Vec::new();
        let mut batch: Vec<usize> = Vec::new();
        for (k, (&i, g)) in which.iter().zip(grads).enumerate() {
            let p = &self.params[i];
            let repeated = batch.iter().any(|&b| self.params[which[b]].is(p));
            if p.dtype() != DType::F32 || g.dtype() != DType::F32 || repeated {
                rest.push(k);
                continue;
            }
            param_state(&mut self.state[i], self.slots.len(), DType::F32, g.shape())?;
            batch.push(k);
        }
        let tensors: Vec<Tensor> = batch.iter().map(|&k| self.params[which[k]].clone()).collect();
        let mut guards = Vec::with_capacity(batch.len());
        let mut held = Vec::with_capacity(batch.len());
        for (&k, t) in batch.iter().zip(&tensors) {
            match t.host_data_mut() {
                Some(guard) => {
                    guards.push(guard);
                    held.push(k);
                }
                None => rest.push(k),
            }
        }
        // Each held parameter's state, borrowed apart from the others.
        let mut states: Vec<Option<&mut ParamState>> = self.state.iter_mut().map(Option::as_mut).collect();
        struct Item<'a> {
            t: u64,
            p: &'a mut [f32],
            g: &'a [f32],
            slots: Vec<&'a mut [f32]>,
        }
        let mut items: Vec<Item> = Vec::new();
        let mut stepped = Vec::new();
        for (guard, &k) in guards.iter_mut().zip(&held) {
            let i = which[k];
            let state = states[i].take();
            let data = guard.data();
            let (Some(state), Some(data)) = (state, data) else {
                rest.push(k);
                continue;
            };
            let t = state.step + 1;
            let (Ok(p), Ok(g), Some(slots)) = (
                bytemuck::try_cast_slice_mut::<u8, f32>(data.bytes_mut()),
                bytemuck::try_cast_slice::<u8, f32>(grads[k].bytes()),
                typed_slots::<f32>(&mut state.slots),
            ) else {
                rest.push(k);
                continue;
            };
            if p.len() != g.len() || slots.iter().any(|s| s.len() != p.len()) {
                rest.push(k);
                continue;
            }
            let mut slot_chunks: Vec<std::slice::ChunksMut<f32>> =
                slots.into_iter().map(|s| s.chunks_mut(CHUNK)).collect();
            for (p, g) in p.chunks_mut(CHUNK).zip(g.chunks(CHUNK)) {
                let slots = slot_chunks.iter_mut().filter_map(Iterator::next).collect();
                items.push(Item { t, p, g, slots });
            }
            stepped.push(&mut state.step);
        }
        let wd = self.weight_decay;
        let total: usize = items.iter().map(|it| it.p.len()).sum();
        let run = |it: &mut Item| run_f32(rule, lr, it.t, wd, it.p, it.g, &mut it.slots);
        if total < PARALLEL_MIN_ELEMENTS || rayon::current_num_threads() < 2 {
            items.iter_mut().for_each(run);
        } else {
            items.par_iter_mut().for_each(run);
        }
        for step in stepped {
            *step += 1;
        }
        rest.sort_unstable();
        Ok(rest)
    }

    /// The update of parameter `i` through host vectors (any dtype or device): gradient `g`
    /// (already clipped; clip first, then decay: Paddle's `apply_gradients` order), and the
    /// result written back as a new value.
    fn host_update(&mut self, rule: &impl Rule, lr: f64, i: usize, g: Vec<f64>) -> Result<()> {
        let p = self.params[i].try_data()?;
        let state = param_state(&mut self.state[i], self.slots.len(), p.dtype(), p.shape())?;
        if self.multi_precision && matches!(p.dtype(), DType::F16 | DType::BF16) {
            // The update on the f32 master copy (made from the parameter on first use), the
            // parameter its rounding.
            let master = match state.master.take() {
                Some(m) => m,
                None => TensorData::from_f64_slice(DType::F32, p.shape().to_vec(), &p.to_f64_vec())?,
            };
            let mut value: Vec<f32> = master.to_vec::<f32>()?;
            let g: Vec<f32> = g.iter().map(|&v| v as f32).collect();
            if !apply_chunked(rule, lr, self.weight_decay, state, &mut value, &g) {
                return Err(self.bad_state(i));
            }
            let wide: Vec<f64> = value.iter().map(|&v| f64::from(v)).collect();
            let rounded = TensorData::from_f64_slice(p.dtype(), p.shape().to_vec(), &wide)?;
            let master = TensorData::from_vec(p.shape().to_vec(), value)?;
            state.master = Some(master);
            return self.params[i].set_data(rounded);
        }
        if p.dtype() == DType::F32 {
            // In f32, as the in-place path computes an f32 parameter: the same bits.
            let mut value: Vec<f32> = p.to_vec::<f32>()?;
            let g: Vec<f32> = g.iter().map(|&v| v as f32).collect();
            if !apply_chunked(rule, lr, self.weight_decay, state, &mut value, &g) {
                return Err(self.bad_state(i));
            }
            return self.params[i].set_data(TensorData::from_vec(p.shape().to_vec(), value)?);
        }
        let mut value = p.to_f64_vec();
        if !apply_chunked(rule, lr, self.weight_decay, state, &mut value, &g) {
            return Err(self.bad_state(i));
        }
        self.params[i].set_data(TensorData::from_f64_slice(p.dtype(), p.shape().to_vec(), &value)?)
    }

    /// True when parameters on a device are updated there ([`Core::device_step`]): some
    /// parameter lives on a device and no gradient clipping (which runs on the host) is set.
    pub(crate) fn on_device(&self) -> bool {
        self.grad_clip.is_none() && !self.multi_precision && self.params.iter().any(|p| !p.device().is_cpu())
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

    /// The error for parameter `i` whose state buffers are not f32 or f64.
    fn bad_state(&self, i: usize) -> Error {
        self.invalid(format!(
            "internal: the state of parameter `{}` is not in f32 or f64 buffers",
            self.names[i]
        ))
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
                                Some(h) => Tensor::from_data(h.slots[j].clone()),
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
            let st = match &self.state[i] {
                Some(st) => st.clone(),
                None => fresh_state(self.slots.len(), p.dtype(), &p.shape())?,
            };
            let step = Tensor::scalar(st.step as f64);
            ctx.register_named(&step, &format!("{OPT_PREFIX}{name}.{STEP_SLOT}"));
            let mut slots = Vec::with_capacity(self.slots.len());
            for (slot, vals) in self.slots.iter().zip(&st.slots) {
                let t = Tensor::from_data(vals.clone());
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
            // Where the skip condition holds, every value stays as it was.
            let keep = |old: &Tensor, new: Tensor| match &self.traced_skip {
                Some(skip) => Tensor::where_(skip, old, &new),
                None => Ok(new),
            };
            p.assign(&keep(p, new_p.cast(p.dtype())?)?)?;
            step.assign(&keep(&step, next)?)?;
            for (s, n) in slots.iter().zip(new_slots) {
                s.assign(&keep(s, n.cast(s.dtype())?)?)?;
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
        for ((name, st), dst) in self.names.iter().zip(&self.state).zip(&from_device) {
            let Some(st) = st.as_ref().or(dst.as_ref()) else {
                continue;
            };
            out.insert(format!("{name}.{STEP_SLOT}"), TensorData::scalar(st.step as i64));
            for (slot, vals) in self.slots.iter().zip(&st.slots) {
                out.insert(format!("{name}.{slot}"), vals.clone());
            }
            if let Some(m) = &st.master {
                out.insert(format!("{name}.{MASTER_SLOT}"), m.clone());
            }
        }
        out
    }

    pub(crate) fn set_state_dict(&mut self, state: &BTreeMap<String, TensorData>) -> Result<()> {
        let bad = |detail: String| Error::invalid(&format!("{}.set_state_dict", self.op), detail);
        let index: BTreeMap<&str, usize> = self.names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        // Per parameter: its step (once given) and its slots (as they are given).
        let mut steps: Vec<Option<u64>> = vec![None; self.params.len()];
        let mut slots: Vec<Option<Vec<Option<TensorData>>>> = vec![None; self.params.len()];
        let mut masters: Vec<Option<TensorData>> = vec![None; self.params.len()];
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
            let given = slots[i].get_or_insert_with(|| vec![None; self.slots.len()]);
            if slot == STEP_SLOT {
                steps[i] = Some(scalar_i64(key, d)?);
                continue;
            }
            if slot == MASTER_SLOT {
                if (d.dtype(), d.shape()) != (DType::F32, p.shape().as_slice()) || !p.dtype().is_float() {
                    return Err(bad(format!(
                        "`{key}` is {} but parameter `{name}` ({}) needs an f32 master copy of its shape",
                        d.tensor_type(),
                        p.tensor_type()
                    )));
                }
                masters[i] = Some(d.clone());
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
            given[j] = Some(d.clone());
        }
        let mut new_state: Vec<Option<ParamState>> = vec![None; self.params.len()];
        for (i, given) in slots.into_iter().enumerate() {
            let Some(given) = given else { continue };
            let complete: Option<Vec<TensorData>> = given.into_iter().collect();
            match (steps[i], complete) {
                (Some(step), Some(slots)) => {
                    new_state[i] = Some(ParamState {
                        step,
                        slots,
                        master: masters[i].take(),
                    })
                }
                _ => {
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

    /// Turn f32 master weights for half parameters on or off (off drops the master copies).
    pub(crate) fn set_multi_precision(&mut self, on: bool) -> Result<()> {
        if self.is_traced() {
            return Err(self.invalid("multi-precision (f32 master weights) is not supported in a traced step yet"));
        }
        if !on {
            for st in self.state.iter_mut().flatten() {
                st.master = None;
            }
        }
        self.multi_precision = on;
        Ok(())
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
            fn set_multi_precision(&mut self, on: bool) -> $crate::Result<()> {
                self.core.set_multi_precision(on)
            }
            fn skip_traced_step_if(&mut self, cond: Option<$crate::Tensor>) -> $crate::Result<()> {
                if cond.as_ref().is_some_and(|c| !c.is_traced()) {
                    return Err(self.core.invalid("skip_traced_step_if takes a traced condition"));
                }
                self.core.traced_skip = cond;
                Ok(())
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
