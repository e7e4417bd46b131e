//! Creating tensors: constants, ranges and seeded random numbers.

use super::Tensor;
use crate::error::{Error, Result};
use oar_ir::tensor_data::checked_byte_len;
use oar_ir::{DType, Dim, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Mutex;

static RNG: Mutex<Option<StdRng>> = Mutex::new(None);

/// Seed the global generator behind [`rand`], [`randn`], initializers and shuffling.
pub fn seed(seed: u64) {
    *RNG.lock().unwrap_or_else(|e| e.into_inner()) = Some(StdRng::seed_from_u64(seed));
}

thread_local! {
    /// A generator that stands in for the global one on this thread while a
    /// [`with_sample_rng`] scope runs (a seeded `DataLoader` loading one sample).
    static SAMPLE_RNG: std::cell::RefCell<Option<StdRng>> = const { std::cell::RefCell::new(None) };
}

/// Draw from the global generator (seeded from the OS until [`seed`] is called), or from this
/// thread's per-sample generator inside [`with_sample_rng`].
pub(crate) fn with_rng<T>(f: impl FnOnce(&mut StdRng) -> T) -> T {
    SAMPLE_RNG.with(|local| {
        if let Some(r) = local.borrow_mut().as_mut() {
            return f(r);
        }
        let mut g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        f(g.get_or_insert_with(StdRng::from_os_rng))
    })
}

/// Run `f` with every draw on this thread (random transforms, [`rand`], dropout masks) taken
/// from a generator seeded with `seed` instead of the global one; the global generator is
/// untouched. A seeded `DataLoader` wraps each sample's loading in it, so augmentations depend
/// on the seed, the epoch and the sample, not on which worker thread loads it.
pub(crate) fn with_sample_rng<T>(seed: u64, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<StdRng>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            SAMPLE_RNG.with(|local| *local.borrow_mut() = prev);
        }
    }
    let prev = SAMPLE_RNG.with(|local| local.borrow_mut().replace(StdRng::seed_from_u64(seed)));
    let _restore = Restore(prev);
    f()
}

/// Run `f` with every draw on this thread taken from `generator` (as [`with_sample_rng`]), and
/// give back the generator as `f` left it: named generator states that persist across scopes
/// (`distributed::RngTracker`).
pub(crate) fn with_generator<T>(generator: StdRng, f: impl FnOnce() -> T) -> (T, StdRng) {
    /// Puts the previous generator back, also when `f` panics; yields the scope's generator.
    struct Restore(Option<Option<StdRng>>);
    impl Restore {
        fn swap_back(&mut self) -> Option<StdRng> {
            let prev = self.0.take()?;
            SAMPLE_RNG.with(|local| std::mem::replace(&mut *local.borrow_mut(), prev))
        }
    }
    impl Drop for Restore {
        fn drop(&mut self) {
            self.swap_back();
        }
    }
    let prev = SAMPLE_RNG.with(|local| local.borrow_mut().replace(generator));
    let mut restore = Restore(Some(prev));
    let out = f();
    let after = restore
        .swap_back()
        .expect("the scope's generator is in place until it ends");
    (out, after)
}

fn count(op: &str, shape: &[usize], dtype: DType) -> Result<usize> {
    super::intercept::check_sizes(op, shape.iter().copied())?;
    checked_byte_len(dtype, shape).map_err(|e| Error::invalid(op, e.to_string()))?;
    Ok(shape.iter().product())
}

/// A tensor of `value` (converted to `dtype`).
pub fn full(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
    count("full", shape, dtype)?;
    Ok(Tensor::from_data(TensorData::full(dtype, shape.to_vec(), value)?))
}

/// A tensor of `value` with dims that may be symbolic while tracing (`[N, 128]`, from
/// [`Tensor::dims`]): a broadcast scalar in the traced graph, an ordinary tensor eagerly.
pub fn full_dims(dims: &[Dim], value: f64, dtype: DType) -> Result<Tensor> {
    match dims.iter().map(Dim::as_static).collect::<Option<Vec<usize>>>() {
        Some(shape) => full(&shape, value, dtype),
        None => full(&[], value, dtype)?.broadcast_to_dims(dims),
    }
}

/// Zeros with dims that may be symbolic (see [`full_dims`]).
pub fn zeros_dims(dims: &[Dim], dtype: DType) -> Result<Tensor> {
    full_dims(dims, 0.0, dtype)
}

/// A tensor of zeros.
pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
    full(shape, 0.0, dtype)
}

/// A tensor of ones.
pub fn ones(shape: &[usize], dtype: DType) -> Result<Tensor> {
    full(shape, 1.0, dtype)
}

/// `start, start + step, ...` up to (excluding) `end`, as in `paddle.arange`.
pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
        return Err(Error::invalid(
            "arange",
            format!("start={start}, end={end}, step={step} do not form a range"),
        ));
    }
    let n = ((end - start) / step).ceil().max(0.0);
    if n > (1u64 << 40) as f64 {
        return Err(Error::invalid("arange", format!("{n} elements is too many")));
    }
    let n = n as usize;
    count("arange", &[n], dtype)?;
    let v: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
    Ok(Tensor::from_data(TensorData::from_f64_slice(dtype, vec![n], &v)?))
}

/// `num` evenly spaced values from `start` to `stop` inclusive.
pub fn linspace(start: f64, stop: f64, num: usize, dtype: DType) -> Result<Tensor> {
    count("linspace", &[num], dtype)?;
    let v: Vec<f64> = match num {
        0 => vec![],
        1 => vec![start],
        _ => (0..num)
            .map(|i| start + (stop - start) * i as f64 / (num - 1) as f64)
            .collect(),
    };
    Ok(Tensor::from_data(TensorData::from_f64_slice(dtype, vec![num], &v)?))
}

fn random(op: &str, shape: &[usize], dtype: DType, draw: impl Fn(&mut StdRng) -> f64) -> Result<Tensor> {
    if !dtype.is_float() {
        return Err(Error::invalid(op, format!("needs a float dtype, got {dtype}")));
    }
    let n = count(op, shape, dtype)?;
    let v: Vec<f64> = with_rng(|r| (0..n).map(|_| draw(r)).collect());
    Ok(Tensor::from_data(TensorData::from_f64_slice(
        dtype,
        shape.to_vec(),
        &v,
    )?))
}

/// Uniform random numbers in `[0, 1)`.
pub fn rand(shape: &[usize], dtype: DType) -> Result<Tensor> {
    random("rand", shape, dtype, |r| r.random::<f64>())
}

/// Standard normal random numbers.
pub fn randn(shape: &[usize], dtype: DType) -> Result<Tensor> {
    random("randn", shape, dtype, |r| {
        r.sample::<f64, _>(rand_distr::StandardNormal)
    })
}

/// Uniform random numbers in `[low, high)`.
pub fn uniform(shape: &[usize], low: f64, high: f64, dtype: DType) -> Result<Tensor> {
    random("uniform", shape, dtype, |r| low + (high - low) * r.random::<f64>())
}

/// Normal random numbers with `mean` and `std`.
pub fn normal(shape: &[usize], mean: f64, std: f64, dtype: DType) -> Result<Tensor> {
    random("normal", shape, dtype, |r| {
        mean + std * r.sample::<f64, _>(rand_distr::StandardNormal)
    })
}
