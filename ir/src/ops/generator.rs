//! Generators: `iota` and `random` (counter-based, the same numbers on every backend). Their
//! shape and dtype are the result type's, so the text states them once.

use super::rules::{R, arity, check_axes, out_elements};
use super::{Float, Grads, OpDef, OpFamily, OpText, VjpArgs};
use crate::eval::{Data, EvalCx, Res, Value, array};
use crate::text::{Attrs, ParseError, single_result};
use crate::{DType, Dim, Emitter, Graph, TensorType};
use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};

/// The random-number algorithm every backend must reproduce bit for bit.
///
/// Element `i` (row-major flat index of the output) of a tensor drawn with `seed` depends
/// only on `(seed, i)`, never on evaluation order:
///
/// 1. `bits(seed, i) = mix64(seed + (i + 1) * 0x9E3779B97F4A7C15)` (wrapping u64 arithmetic),
///    i.e. the `i`-th output of the standard SplitMix64 generator seeded with `seed`, where
///    `mix64(z) = { z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) *
///    0x94D049BB133111EB; z ^ (z >> 31) }`.
/// 2. `uniform(seed, i) = (bits(seed, i) >> 11) * 2^-53`, an f64 in `[0, 1)`.
/// 3. `Uniform { low, high }`: `low + (high - low) * uniform(seed, i)` in f64, then rounded to
///    the output dtype (rounding to a narrow dtype can reach `high`).
/// 4. `Normal { mean, std }` (Box–Muller, cosine branch):
///    `u1 = uniform(seed, 2i)`, `u2 = uniform(seed, 2i + 1)`,
///    `mean + std * sqrt(-2 ln(1 - u1)) * cos(2π u2)` in f64, then rounded to the dtype.
/// 5. `dropout(p, seed)` keeps element `i` iff `uniform(seed, i) >= p`; kept elements are
///    `x / (1 - p)` (computed in f64, rounded to the dtype), dropped ones are 0.
pub mod random_stream {
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
}

/// `iota`: each element is its index along `axis`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Iota {
    /// Output shape.
    pub shape: Vec<Dim>,
    /// Axis whose index is the value.
    pub axis: usize,
    /// Output dtype.
    pub dtype: DType,
}

/// A random distribution for [`Random`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RandomDist {
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound.
        low: Float,
        /// Upper bound.
        high: Float,
    },
    /// Normal with `mean` and standard deviation `std`.
    Normal {
        /// Mean.
        mean: Float,
        /// Standard deviation.
        std: Float,
    },
}

/// Random numbers from a seeded, counter-based generator ([`random_stream`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Random {
    /// The distribution.
    pub dist: RandomDist,
    /// Output shape.
    pub shape: Vec<Dim>,
    /// Output dtype (a float type).
    pub dtype: DType,
    /// The seed; the same seed gives the same numbers on every backend.
    pub seed: u64,
}

impl OpText for Iota {
    fn mnemonics() -> &'static [&'static str] {
        &["iota"]
    }
    fn name(&self) -> &'static str {
        "iota"
    }
    fn print_attrs(&self) -> Vec<(&'static str, String)> {
        vec![("axis", self.axis.to_string())]
    }
    fn parse(name: &str, attrs: &mut Attrs, results: &[TensorType]) -> Result<Self, ParseError> {
        let t = single_result(attrs, name, results)?;
        Ok(Iota {
            shape: t.shape.0.clone(),
            axis: attrs.get("axis")?,
            dtype: t.dtype,
        })
    }
}

impl OpText for Random {
    fn mnemonics() -> &'static [&'static str] {
        &["random"]
    }
    fn name(&self) -> &'static str {
        "random"
    }
    fn print_attrs(&self) -> Vec<(&'static str, String)> {
        let f = |x: &Float| crate::text::AttrValue::print(x).unwrap_or_default();
        let mut v = match &self.dist {
            RandomDist::Uniform { low, high } => vec![("dist", "uniform".into()), ("low", f(low)), ("high", f(high))],
            RandomDist::Normal { mean, std } => vec![("dist", "normal".into()), ("mean", f(mean)), ("std", f(std))],
        };
        v.push(("seed", self.seed.to_string()));
        v
    }
    fn parse(name: &str, attrs: &mut Attrs, results: &[TensorType]) -> Result<Self, ParseError> {
        let t = single_result(attrs, name, results)?;
        let dist = match attrs.get::<Distribution>("dist")? {
            Distribution::Uniform => RandomDist::Uniform {
                low: attrs.get("low")?,
                high: attrs.get("high")?,
            },
            Distribution::Normal => RandomDist::Normal {
                mean: attrs.get("mean")?,
                std: attrs.get("std")?,
            },
        };
        Ok(Random {
            dist,
            shape: t.shape.0.clone(),
            dtype: t.dtype,
            seed: attrs.get("seed")?,
        })
    }
}

super::named_enum!(
    /// The `dist` attribute of `random`.
    Distribution {
        /// [`RandomDist::Uniform`]
        Uniform => "uniform",
        /// [`RandomDist::Normal`]
        Normal => "normal",
    }
);
crate::text::word_attr!(Distribution);

impl OpDef for Iota {
    fn family(&self) -> OpFamily {
        OpFamily::Generator
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 0)?;
        check_axes(&[self.axis], self.shape.len())?;
        if !self.dtype.is_numeric() {
            return Err(format!("iota needs a numeric dtype, got {}", self.dtype));
        }
        Ok(vec![TensorType::new(self.dtype, self.shape.clone())])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    fn vjp<E: Emitter>(&self, _: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        Ok(a.none())
    }

    fn eval(&self, cx: &dyn EvalCx, _: &[&Value]) -> Res<Vec<Value>> {
        let (site, shape, axis, dtype) = (cx.site(), cx.resolve(&self.shape)?, self.axis, self.dtype);
        if axis >= shape.len() {
            return Err(site.err(format!("axis {axis} out of range for {shape:?}")));
        }
        site.check_size(dtype, &shape, "iota output")?;
        let data = if dtype.is_float() {
            Data::F(ArrayD::from_shape_fn(IxDyn(&shape), |ix| ix[axis] as f64))
        } else if dtype.is_int() {
            Data::I(ArrayD::from_shape_fn(IxDyn(&shape), |ix| ix[axis] as i64))
        } else {
            return Err(site.err(format!("iota needs a numeric dtype, got {dtype}")));
        };
        Ok(vec![Value { dtype, data }])
    }
}

impl OpDef for Random {
    fn family(&self) -> OpFamily {
        OpFamily::Generator
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 0)?;
        if !self.dtype.is_float() {
            return Err(format!("random needs a float dtype, got {}", self.dtype));
        }
        match self.dist {
            RandomDist::Uniform { low, high } if low.0.partial_cmp(&high.0).is_none_or(|o| o.is_gt()) => {
                return Err(format!("uniform bounds low={low} > high={high}"));
            }
            RandomDist::Normal { std, .. } if std.0.partial_cmp(&0.0).is_none_or(|o| o.is_lt()) => {
                return Err(format!("normal std={std} must be ≥ 0"));
            }
            _ => {}
        }
        Ok(vec![TensorType::new(self.dtype, self.shape.clone())])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        out_elements(outputs)
    }

    fn vjp<E: Emitter>(&self, _: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        Ok(a.none())
    }

    fn mode(&self) -> Option<String> {
        Some(match self.dist {
            RandomDist::Uniform { .. } => "random/uniform".into(),
            RandomDist::Normal { .. } => "random/normal".into(),
        })
    }

    fn modes() -> Vec<String> {
        vec!["random/uniform".into(), "random/normal".into()]
    }

    fn eval(&self, cx: &dyn EvalCx, _: &[&Value]) -> Res<Vec<Value>> {
        use random_stream::{standard_normal, uniform};
        let (site, shape, dtype, seed) = (cx.site(), cx.resolve(&self.shape)?, self.dtype, self.seed);
        if !dtype.is_float() {
            return Err(site.err(format!("random needs a float dtype, got {dtype}")));
        }
        site.check_size(dtype, &shape, "random output")?;
        let n: usize = shape.iter().product();
        let v: Vec<f64> = match self.dist {
            RandomDist::Uniform { low, high } => (0..n as u64)
                .map(|i| low.0 + (high.0 - low.0) * uniform(seed, i))
                .collect(),
            RandomDist::Normal { mean, std } => (0..n as u64)
                .map(|i| mean.0 + std.0 * standard_normal(seed, i))
                .collect(),
        };
        Ok(vec![Value::float(dtype, array(site, &shape, v)?)])
    }
}

/// Store `f(i)` for the flat indices `first..` into `out` (little-endian elements of `dtype`):
/// floats rounded from f64, integers wrapped from i64 — bit for bit what the reference's
/// [`Value::to_tensor`] gives for the same f64 / i64 values.
fn store_elements(dtype: DType, first: usize, out: &mut [u8], f: impl Fn(usize) -> f64) {
    use half::{bf16, f16};
    macro_rules! store {
        ($w:expr, |$v:ident| $conv:expr) => {
            for (k, c) in out.chunks_exact_mut($w).enumerate() {
                let $v = f(first + k);
                c.copy_from_slice(&$conv.to_le_bytes());
            }
        };
    }
    match dtype {
        DType::F32 => store!(4, |v| (v as f32)),
        DType::F64 => store!(8, |v| v),
        DType::F16 => store!(2, |v| f16::from_f64(v)),
        DType::BF16 => store!(2, |v| bf16::from_f64(v)),
        DType::I8 => store!(1, |v| (v as i64 as i8)),
        DType::U8 => store!(1, |v| (v as i64 as u8)),
        DType::I32 => store!(4, |v| (v as i64 as i32)),
        DType::I64 => store!(8, |v| (v as i64)),
        DType::Bool => store!(1, |v| u8::from(v != 0.0)),
    }
}

impl Iota {
    /// Elements `first..first + out.len() / size` of this iota with the bound `shape`, written
    /// as `self.dtype` into `out` — what [`OpDef::eval`] computes, without the f64 tensor, for
    /// backends that fill their own buffers (in parallel chunks if they like).
    pub fn write_elements(&self, shape: &[usize], first: usize, out: &mut [u8]) {
        let inner: usize = shape.get(self.axis + 1..).map_or(1, |s| s.iter().product());
        let n = shape.get(self.axis).copied().unwrap_or(1).max(1);
        store_elements(self.dtype, first, out, |i| ((i / inner.max(1)) % n) as f64);
    }
}

impl Random {
    /// Elements `first..first + out.len() / size` of this random tensor, written as
    /// `self.dtype` into `out` — the same numbers [`OpDef::eval`] gives (element `i` depends
    /// only on the seed and `i`, see [`random_stream`]).
    pub fn write_elements(&self, first: usize, out: &mut [u8]) {
        use random_stream::{standard_normal, uniform};
        let seed = self.seed;
        match self.dist {
            RandomDist::Uniform { low, high } => store_elements(self.dtype, first, out, |i| {
                low.0 + (high.0 - low.0) * uniform(seed, i as u64)
            }),
            RandomDist::Normal { mean, std } => store_elements(self.dtype, first, out, |i| {
                mean.0 + std.0 * standard_normal(seed, i as u64)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::random_stream::*;

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
