//! Sample invocations of ops (in the spirit of PyTorch's OpInfo): an op definition lists a few
//! `(op, input dtypes/shapes/domains)` samples ([`super::OpDef::samples`]), and every harness
//! runs all of them — the conformance kit on every backend, gradient checks, fixture tools —
//! so a new op is tested everywhere by being defined.

use super::Op;
use crate::{DType, TensorData};

/// Where a sample input's values are drawn from. Integer dtypes draw integers (the range
/// clamped to the dtype's), bool draws fair coins (except for [`Domain::Values`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Domain {
    /// Uniform in `[lo, hi)` (integers: `[ceil(lo), floor(hi)]`).
    Range(f64, f64),
    /// Like `Range`, with `|x| ≥ min_abs` (divisors, reciprocals).
    AwayFromZero(f64, f64, f64),
    /// Integer-valued in `[lo, hi]` whatever the dtype (ties for comparisons and sorting).
    Ints(i64, i64),
    /// These values first (cycled if the tensor is smaller), then draws from the inner domain.
    WithSpecials(Vec<f64>, Box<Domain>),
    /// Exactly these values, cycled.
    Values(Vec<f64>),
}

impl Domain {
    /// The usual domain: `[-1, 1)` for floats, small integers for ints.
    pub fn standard() -> Domain {
        Domain::Range(-1.0, 1.0)
    }

    /// One value for element `i` of a tensor of `dtype`.
    pub fn draw(&self, dtype: DType, rng: &mut SampleRng, i: usize) -> f64 {
        match self {
            Domain::Values(v) => v[i % v.len()],
            Domain::WithSpecials(v, rest) => {
                if i < v.len() {
                    v[i]
                } else {
                    rest.draw(dtype, rng, i)
                }
            }
            _ if dtype == DType::Bool => (rng.next_u64() & 1) as f64,
            Domain::Ints(lo, hi) => {
                let (dlo, dhi) = int_range(if dtype.is_float() { DType::I32 } else { dtype });
                rng.int((*lo as f64).max(dlo) as i64, (*hi as f64).min(dhi) as i64) as f64
            }
            Domain::Range(lo, hi) if dtype.is_int() => {
                let (dlo, dhi) = int_range(dtype);
                rng.int(lo.ceil().max(dlo) as i64, hi.floor().min(dhi) as i64) as f64
            }
            Domain::Range(lo, hi) => rng.uniform(*lo, *hi),
            Domain::AwayFromZero(lo, hi, min_abs) => loop {
                let v = Domain::Range(*lo, *hi).draw(dtype, rng, i);
                if v.abs() >= *min_abs {
                    break v;
                }
            },
        }
    }

    /// A tensor of `dtype` and `shape` drawn from this domain.
    pub fn tensor(&self, dtype: DType, shape: &[usize], rng: &mut SampleRng) -> TensorData {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|i| self.draw(dtype, rng, i)).collect();
        TensorData::from_f64_slice(dtype, shape.to_vec(), &v).expect("values fit the dtype")
    }
}

/// The smallest and largest value of an integer dtype, as f64.
fn int_range(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::I8 => (-128.0, 127.0),
        DType::U8 => (0.0, 255.0),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::Bool => (0.0, 1.0),
        _ => (-(2f64.powi(62)), 2f64.powi(62)),
    }
}

/// A SplitMix64 generator (small, fast, identical on every platform), seeded per sample name
/// so a sample draws the same numbers whatever else runs.
#[derive(Clone, Debug)]
pub struct SampleRng(u64);

impl SampleRng {
    /// The generator for the case called `name`, mixed with `seed`.
    pub fn for_case(name: &str, seed: u64) -> SampleRng {
        // FNV-1a of the name.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        SampleRng(h ^ seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        super::random_stream::mix64(self.0)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in `[lo, hi]` (inclusive).
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        let span = (hi - lo) as u64 + 1;
        lo + (self.next_u64() % span) as i64
    }
}

/// One input of a sample.
#[derive(Clone, Debug)]
pub struct SampleInput {
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Where its values come from.
    pub domain: Domain,
}

/// One sample invocation of an op.
#[derive(Clone, Debug)]
pub struct Sample {
    /// A unique name, `mnemonic/what` (`group_norm/f32/affine`).
    pub name: String,
    /// The op.
    pub op: Op,
    /// Its operands.
    pub inputs: Vec<SampleInput>,
    /// Whether gradient checks should differentiate it (float operands, a smooth op there).
    pub grad: bool,
}

impl Sample {
    /// A sample of `op` on `inputs`, differentiated by gradient checks.
    pub fn new(name: impl Into<String>, op: Op, inputs: Vec<SampleInput>) -> Sample {
        Sample {
            name: name.into(),
            op,
            inputs,
            grad: true,
        }
    }

    /// The same sample, skipped by gradient checks (integer outputs, non-smooth points).
    pub fn no_grad(mut self) -> Sample {
        self.grad = false;
        self
    }
}

/// An input of `dtype` and `shape` drawn from `[-1, 1)`.
pub fn input(dtype: DType, shape: &[usize]) -> SampleInput {
    SampleInput {
        dtype,
        shape: shape.to_vec(),
        domain: Domain::standard(),
    }
}

/// An input of `dtype` and `shape` drawn from `domain`.
pub fn input_in(dtype: DType, shape: &[usize], domain: Domain) -> SampleInput {
    SampleInput {
        dtype,
        shape: shape.to_vec(),
        domain,
    }
}
