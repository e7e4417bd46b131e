//! Building cases: a deterministic generator, value domains, and a graph builder that records
//! the inputs and weights it draws.

use super::CaseData;
use oar_ir::{DType, Dim, Graph, Op, TensorData, TensorType, ValueId, Weights};
use std::collections::BTreeMap;

/// Errors while building a case are plain text (they are harness bugs, shown in the table).
pub(crate) type R<T> = Result<T, String>;

/// Turn any displayable error into the harness's error text.
pub(crate) fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The suite's base seed: every case mixes it with a hash of its name, so a case draws the same
/// numbers whatever else runs (filters, order, other cases added).
pub const SUITE_SEED: u64 = 0x0A12_C0DE_5EED_2024;

/// A SplitMix64 generator (small, fast, and identical on every platform).
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    /// The generator for the case called `name`.
    pub fn for_case(name: &str) -> Rng {
        // FNV-1a of the name.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h ^ SUITE_SEED)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
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

/// Where a tensor's values are drawn from. Integer dtypes draw integers (the range clamped to
/// the dtype's), bool draws fair coins (except for [`Domain::Values`]).
#[derive(Clone, Debug)]
pub(crate) enum Domain {
    /// Uniform in `[lo, hi)` (integers: `[ceil(lo), floor(hi)]`).
    Range(f64, f64),
    /// Like `Range`, with `|x| ≥ min_abs` (divisors, reciprocals).
    AwayFromZero(f64, f64, f64),
    /// Integer-valued in `[lo, hi]` whatever the dtype (ties for comparisons and argmax).
    Ints(i64, i64),
    /// These values first (cycled if the tensor is smaller), then draws from the inner domain.
    WithSpecials(Vec<f64>, Box<Domain>),
    /// Exactly these values, cycled.
    Values(Vec<f64>),
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

impl Domain {
    /// The usual domain: `[-1, 1)` for floats, small integers for ints.
    pub fn standard() -> Domain {
        Domain::Range(-1.0, 1.0)
    }

    fn draw(&self, dtype: DType, rng: &mut Rng, i: usize) -> f64 {
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

    /// `n` values for `dtype`.
    pub fn sample(&self, dtype: DType, rng: &mut Rng, n: usize) -> Vec<f64> {
        (0..n).map(|i| self.draw(dtype, rng, i)).collect()
    }
}

/// Static dims.
pub(crate) fn dims(shape: &[usize]) -> Vec<Dim> {
    shape.iter().map(|&n| Dim::Static(n)).collect()
}

/// A graph under construction with the inputs and weights it will run on.
pub(crate) struct Builder {
    pub g: Graph,
    inputs: BTreeMap<String, TensorData>,
    weights: Weights,
    pub rng: Rng,
}

impl Builder {
    /// A builder for the case called `name` (its generator is seeded from the name).
    pub fn new(name: &str) -> Builder {
        let graph_name: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        Builder {
            g: Graph::new(&graph_name),
            inputs: BTreeMap::new(),
            weights: Weights::new(),
            rng: Rng::for_case(name),
        }
    }

    /// A tensor drawn from `dom`.
    pub fn data(&mut self, dtype: DType, shape: &[usize], dom: &Domain) -> R<TensorData> {
        let n = shape.iter().product();
        let v = dom.sample(dtype, &mut self.rng, n);
        TensorData::from_f64_slice(dtype, shape.to_vec(), &v).map_err(s)
    }

    /// A graph input fed with values drawn from `dom`.
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[usize], dom: &Domain) -> R<ValueId> {
        let t = self.data(dtype, shape, dom)?;
        self.input_data(name, t)
    }

    /// A graph input fed with `t` (its type is `t`'s).
    pub fn input_data(&mut self, name: &str, t: TensorData) -> R<ValueId> {
        let v = self.g.add_input(name, t.tensor_type()).map_err(s)?;
        self.inputs.insert(name.to_string(), t);
        Ok(v)
    }

    /// A graph input with symbolic dims (`ty`) fed with `t`.
    pub fn input_typed(&mut self, name: &str, ty: TensorType, t: TensorData) -> R<ValueId> {
        let v = self.g.add_input(name, ty).map_err(s)?;
        self.inputs.insert(name.to_string(), t);
        Ok(v)
    }

    /// A named parameter with values drawn from `dom`.
    pub fn param(&mut self, name: &str, dtype: DType, shape: &[usize], dom: &Domain) -> R<ValueId> {
        let t = self.data(dtype, shape, dom)?;
        let v = self.g.add_param(name, t.tensor_type()).map_err(s)?;
        self.weights.insert(name.to_string(), t);
        Ok(v)
    }

    /// A constant drawn from `dom`.
    pub fn constant(&mut self, dtype: DType, shape: &[usize], dom: &Domain) -> R<ValueId> {
        let t = self.data(dtype, shape, dom)?;
        Ok(self.g.add_constant(t))
    }

    /// A scalar constant.
    pub fn scalar(&mut self, dtype: DType, v: f64) -> ValueId {
        self.g.add_scalar(dtype, v)
    }

    /// Add a one-output op.
    pub fn op(&mut self, op: Op, inputs: &[ValueId]) -> R<ValueId> {
        self.g.add_op1(op, inputs).map_err(s)
    }

    /// Add an op with any number of outputs.
    pub fn ops(&mut self, op: Op, inputs: &[ValueId]) -> R<Vec<ValueId>> {
        self.g.add_op(op, inputs).map_err(s)
    }

    /// Add an op holding regions.
    pub fn region_op(&mut self, op: Op, inputs: &[ValueId], regions: Vec<Graph>) -> R<Vec<ValueId>> {
        self.g.add_region_op(op, inputs, regions).map_err(s)
    }

    /// Add a named output.
    pub fn out(&mut self, name: &str, v: ValueId) -> R<()> {
        self.g.add_output(name, v).map_err(s)
    }

    /// Add every value as an output `y0, y1, ...`.
    pub fn outs(&mut self, vs: &[ValueId]) -> R<()> {
        for (i, v) in vs.iter().enumerate() {
            self.out(&format!("y{i}"), *v)?;
        }
        Ok(())
    }

    /// The finished case (the graph is verified by the backends).
    pub fn finish(self) -> CaseData {
        CaseData {
            graph: self.g,
            weights: self.weights,
            inputs: self.inputs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_respect_dtypes_and_are_deterministic() {
        let mut a = Rng::for_case("x");
        let mut b = Rng::for_case("x");
        assert_eq!(a.next_u64(), b.next_u64());
        let v = Domain::Range(-10.0, 300.0).sample(DType::U8, &mut a, 200);
        assert!(v.iter().all(|&x| (0.0..=255.0).contains(&x) && x.fract() == 0.0));
        let v = Domain::AwayFromZero(-3.0, 3.0, 1.0).sample(DType::I32, &mut a, 200);
        assert!(v.iter().all(|&x| x != 0.0));
        let v = Domain::Range(-1.0, 1.0).sample(DType::Bool, &mut a, 50);
        assert!(v.iter().all(|&x| x == 0.0 || x == 1.0));
    }
}
