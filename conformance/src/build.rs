//! Building cases: a deterministic generator, value domains, and a graph builder that records
//! the inputs and weights it draws.

use super::CaseData;
pub(crate) use oar_ir::ops::sample::Domain;
use oar_ir::ops::sample::SampleRng;
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

/// The suite's generator: `oar_ir`'s sample generator seeded with [`SUITE_SEED`] and the
/// case's name.
pub(crate) struct Rng;

impl Rng {
    /// The generator for the case called `name`.
    pub fn for_case(name: &str) -> SampleRng {
        SampleRng::for_case(name, SUITE_SEED)
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
    pub rng: SampleRng,
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
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|i| dom.draw(dtype, &mut self.rng, i)).collect();
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

    fn sample(d: &Domain, dtype: DType, rng: &mut SampleRng, n: usize) -> Vec<f64> {
        (0..n).map(|i| d.draw(dtype, rng, i)).collect()
    }

    #[test]
    fn domains_respect_dtypes_and_are_deterministic() {
        let mut a = Rng::for_case("x");
        let mut b = Rng::for_case("x");
        assert_eq!(a.next_u64(), b.next_u64());
        let v = sample(&Domain::Range(-10.0, 300.0), DType::U8, &mut a, 200);
        assert!(v.iter().all(|&x| (0.0..=255.0).contains(&x) && x.fract() == 0.0));
        let v = sample(&Domain::AwayFromZero(-3.0, 3.0, 1.0), DType::I32, &mut a, 200);
        assert!(v.iter().all(|&x| x != 0.0));
        let v = sample(&Domain::Range(-1.0, 1.0), DType::Bool, &mut a, 50);
        assert!(v.iter().all(|&x| x == 0.0 || x == 1.0));
    }
}
