//! Generators: `iota`, and the counter-based random numbers shared by `random` and `dropout`.
//!
//! # The random-number algorithm (every backend must reproduce it bit for bit)
//!
//! Element `i` (row-major flat index of the output) of a tensor drawn with `seed` depends
//! only on `(seed, i)`, never on evaluation order:
//!
//! 1. `bits(seed, i) = mix64(seed + (i + 1) * 0x9E3779B97F4A7C15)` (wrapping u64 arithmetic),
//!    i.e. the `i`-th output of the standard SplitMix64 generator seeded with `seed`, where
//!    `mix64(z) = { z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) *
//!    0x94D049BB133111EB; z ^ (z >> 31) }`.
//! 2. `uniform(seed, i) = (bits(seed, i) >> 11) * 2^-53`, an f64 in `[0, 1)`.
//! 3. `Uniform { low, high }`: `low + (high - low) * uniform(seed, i)` in f64, then rounded to
//!    the output dtype (rounding to a narrow dtype can reach `high`).
//! 4. `Normal { mean, std }` (Box–Muller, cosine branch):
//!    `u1 = uniform(seed, 2i)`, `u2 = uniform(seed, 2i + 1)`,
//!    `mean + std * sqrt(-2 ln(1 - u1)) * cos(2π u2)` in f64, then rounded to the dtype.
//! 5. `dropout(p, seed)` keeps element `i` iff `uniform(seed, i) >= p`; kept elements are
//!    `x / (1 - p)` (computed in f64, rounded to the dtype), dropped ones are 0.

use crate::value::{Data, Res, Site, Value};
use ndarray::{ArrayD, IxDyn};
use oar_ir::DType;
use oar_ir::ops::RandomDist;

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The `i`-th 64 random bits of stream `seed`.
pub fn bits(seed: u64, i: u64) -> u64 {
    mix64(seed.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)))
}

/// The `i`-th uniform f64 in `[0, 1)` of stream `seed`.
pub fn uniform(seed: u64, i: u64) -> f64 {
    (bits(seed, i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The `i`-th standard normal of stream `seed` (Box–Muller on uniforms `2i` and `2i + 1`).
pub fn standard_normal(seed: u64, i: u64) -> f64 {
    let u1 = uniform(seed, i.wrapping_mul(2));
    let u2 = uniform(seed, i.wrapping_mul(2).wrapping_add(1));
    (-2.0 * (1.0 - u1).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// `iota`: each element is its index along `axis`.
pub(crate) fn iota(site: &Site, shape: &[usize], axis: usize, dtype: DType) -> Res<Value> {
    if axis >= shape.len() {
        return Err(site.err(format!("axis {axis} out of range for {shape:?}")));
    }
    site.check_size(dtype, shape, "iota output")?;
    let data = if dtype.is_float() {
        Data::F(ArrayD::from_shape_fn(IxDyn(shape), |ix| ix[axis] as f64))
    } else if dtype.is_int() {
        Data::I(ArrayD::from_shape_fn(IxDyn(shape), |ix| ix[axis] as i64))
    } else {
        return Err(site.err(format!("iota needs a numeric dtype, got {dtype}")));
    };
    Ok(Value { dtype, data })
}

/// `random`: a tensor of `dtype` drawn from `dist` with `seed`.
pub(crate) fn random(site: &Site, dist: &RandomDist, shape: &[usize], dtype: DType, seed: u64) -> Res<Value> {
    if !dtype.is_float() {
        return Err(site.err(format!("random needs a float dtype, got {dtype}")));
    }
    site.check_size(dtype, shape, "random output")?;
    let n: usize = shape.iter().product();
    let v: Vec<f64> = match *dist {
        RandomDist::Uniform { low, high } => (0..n as u64)
            .map(|i| low.0 + (high.0 - low.0) * uniform(seed, i))
            .collect(),
        RandomDist::Normal { mean, std } => (0..n as u64)
            .map(|i| mean.0 + std.0 * standard_normal(seed, i))
            .collect(),
    };
    let a = ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| site.err(e.to_string()))?;
    Ok(Value::float(dtype, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // First outputs of SplitMix64 seeded with 0 (the published reference sequence).
        assert_eq!(bits(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(bits(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(bits(0, 2), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn uniform_and_normal_statistics() {
        let n = 20_000u64;
        let us: Vec<f64> = (0..n).map(|i| uniform(7, i)).collect();
        assert!(us.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = us.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        let zs: Vec<f64> = (0..n).map(|i| standard_normal(7, i)).collect();
        let m = zs.iter().sum::<f64>() / n as f64;
        let var = zs.iter().map(|z| (z - m) * (z - m)).sum::<f64>() / n as f64;
        assert!(m.abs() < 0.03 && (var - 1.0).abs() < 0.05, "{m} {var}");
        assert_ne!(uniform(1, 0), uniform(2, 0));
    }
}
