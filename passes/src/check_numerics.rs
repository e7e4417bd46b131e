//! Numeric checking of a pipeline against the reference backend.
//!
//! Before the first pass the graph runs on seeded random inputs (symbolic dims bound to small
//! sizes) and random weights for params not given; after each pass it runs again and the
//! outputs are compared elementwise: `|got - want| ≤ atol + rtol·|want|` (both NaN, or equal
//! infinities, count as equal). The pass manager names the first pass that breaks this and,
//! for passes that count their rewrites, bisects the smallest step count that breaks it.

use oar_backend_reference::run_graph;
use oar_ir::backend::check_inputs;
use oar_ir::ops::Param;
use oar_ir::ops::random_stream::uniform;
use oar_ir::{DType, Graph, Op, TensorData, TensorType, Weights};
use std::collections::BTreeMap;

/// Default relative tolerance for f32/f64/ints (halves get [`HALF_RTOL`]).
pub const DEFAULT_RTOL: f64 = 1e-4;
/// Default absolute tolerance for f32/f64/ints (halves get [`HALF_ATOL`]).
pub const DEFAULT_ATOL: f64 = 1e-5;
/// Default relative tolerance for f16/bf16.
pub const HALF_RTOL: f64 = 1e-2;
/// Default absolute tolerance for f16/bf16.
pub const HALF_ATOL: f64 = 1e-3;
/// Largest tensor (elements) the check generates; bigger ones are an error, not a slow run.
pub const MAX_GENERATED_ELEMENTS: usize = 1 << 24;

/// Settings of the numerics check (see the module docs).
#[derive(Clone, Debug)]
pub struct NumericsCheck {
    tolerance: Option<(f64, f64)>,
    seed: u64,
    default_dim: usize,
    binds: BTreeMap<String, usize>,
    inputs: BTreeMap<String, TensorData>,
    weights: Weights,
}

impl Default for NumericsCheck {
    fn default() -> Self {
        NumericsCheck {
            tolerance: None,
            seed: 0x0a4_5eed,
            default_dim: 2,
            binds: BTreeMap::new(),
            inputs: BTreeMap::new(),
            weights: Weights::new(),
        }
    }
}

impl NumericsCheck {
    /// Default settings: per-dtype tolerances, unbound symbols of size 2, a fixed seed.
    pub fn new() -> NumericsCheck {
        NumericsCheck::default()
    }

    /// Use `rtol`/`atol` for every dtype.
    pub fn tolerance(mut self, rtol: f64, atol: f64) -> Self {
        self.tolerance = Some((rtol, atol));
        self
    }

    /// The seed of the generated inputs and weights.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Size of symbolic dims that are not bound (also the range `[0, size)` of int inputs).
    pub fn default_dim(mut self, size: usize) -> Self {
        self.default_dim = size.max(1);
        self
    }

    /// Bind symbol `sym` to `size` in generated inputs and weights (use the sizes that a
    /// `specialize-shapes` pass in the pipeline binds, so the inputs fit after it).
    pub fn bind(mut self, sym: &str, size: usize) -> Self {
        self.binds.insert(sym.to_string(), size);
        self
    }

    /// Use these inputs instead of generated ones (the others are still generated).
    pub fn inputs(mut self, inputs: BTreeMap<String, TensorData>) -> Self {
        self.inputs = inputs;
        self
    }

    /// Use these weights instead of generated ones (the others are still generated).
    pub fn weights(mut self, weights: Weights) -> Self {
        self.weights = weights;
        self
    }

    /// `(rtol, atol)` for outputs of `dtype`.
    pub fn tolerance_for(&self, dtype: DType) -> (f64, f64) {
        match (self.tolerance, dtype) {
            (Some(t), _) => t,
            (None, DType::F16 | DType::BF16) => (HALF_RTOL, HALF_ATOL),
            (None, _) => (DEFAULT_RTOL, DEFAULT_ATOL),
        }
    }

    /// A seeded random tensor of type `ty` (symbols bound or of the default size); `salt`
    /// (e.g. the input's name) picks the stream.
    pub fn random_tensor(&self, ty: &TensorType, salt: &str) -> Result<TensorData, String> {
        let shape: Vec<usize> = ty
            .shape
            .dims()
            .iter()
            .map(|d| {
                d.eval(&|s| Some(self.binds.get(s).copied().unwrap_or(self.default_dim)))
                    .unwrap_or(self.default_dim)
            })
            .collect();
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= MAX_GENERATED_ELEMENTS)
            .ok_or_else(|| {
                format!("`{salt}`: {ty} is too large to generate (limit {MAX_GENERATED_ELEMENTS} elements)")
            })?;
        let seed = salt.bytes().fold(self.seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        let values: Vec<f64> = (0..n as u64)
            .map(|i| {
                let u = uniform(seed, i);
                match ty.dtype {
                    DType::Bool => (u < 0.5) as u8 as f64,
                    d if d.is_float() => 2.0 * u - 1.0,
                    _ => (u * self.default_dim as f64).floor(),
                }
            })
            .collect();
        TensorData::from_f64_slice(ty.dtype, shape, &values).map_err(|e| format!("`{salt}`: {e}"))
    }
}

/// Every param of `graph` and its regions.
fn params(graph: &Graph, out: &mut BTreeMap<String, TensorType>) {
    for id in graph.node_ids() {
        let n = graph.node(id);
        if let Op::Param(Param { name, ty }) = &n.op {
            out.entry(name.clone()).or_insert_with(|| ty.clone());
        }
        for r in &n.regions {
            params(r, out);
        }
    }
}

/// How outputs after a pass differ from the baseline.
#[derive(Clone, Debug)]
pub(crate) struct Mismatch {
    pub output: String,
    pub max_abs_err: f64,
    pub detail: String,
}

/// The inputs, weights and baseline outputs of one checked pipeline run.
pub(crate) struct Checker {
    cfg: NumericsCheck,
    inputs: BTreeMap<String, TensorData>,
    weights: Weights,
    baseline: Vec<(String, TensorData)>,
}

impl Checker {
    /// Generate what is missing and run `graph` for the baseline.
    pub(crate) fn new(cfg: &NumericsCheck, graph: &Graph) -> Result<Checker, String> {
        let mut inputs = cfg.inputs.clone();
        for (name, ty) in graph.input_specs() {
            if !inputs.contains_key(&name) {
                inputs.insert(name.clone(), cfg.random_tensor(&ty, &name)?);
            }
        }
        let mut weights = cfg.weights.clone();
        let mut declared = BTreeMap::new();
        params(graph, &mut declared);
        for (name, ty) in declared {
            if let std::collections::btree_map::Entry::Vacant(e) = weights.entry(name) {
                let t = cfg.random_tensor(&ty, &format!("param {}", e.key()))?;
                e.insert(t);
            }
        }
        let baseline = run_graph(graph, &weights, &inputs)
            .map_err(|e| format!("the input graph does not run on the reference backend: {e}"))?;
        Ok(Checker {
            cfg: cfg.clone(),
            inputs,
            weights,
            baseline,
        })
    }

    /// Run `graph` and compare with the baseline. `Err` if the inputs no longer fit its
    /// signature (the check cannot judge the pass).
    pub(crate) fn compare(&self, graph: &Graph) -> Result<Option<Mismatch>, String> {
        check_inputs(graph, &self.inputs).map_err(|e| {
            format!(
                "the generated inputs no longer fit the graph ({e}); bind the same symbols in the check as in \
                 specialize-shapes"
            )
        })?;
        let got = match run_graph(graph, &self.weights, &self.inputs) {
            Ok(got) => got,
            Err(e) => {
                return Ok(Some(Mismatch {
                    output: "<graph>".into(),
                    max_abs_err: f64::NAN,
                    detail: format!("cannot be computed: the reference backend fails on the rewritten graph: {e}"),
                }));
            }
        };
        if got.len() != self.baseline.len() {
            return Ok(Some(Mismatch {
                output: "<graph>".into(),
                max_abs_err: f64::NAN,
                detail: format!("count changed: {} outputs, expected {}", got.len(), self.baseline.len()),
            }));
        }
        for ((name, want), (got_name, got)) in self.baseline.iter().zip(&got) {
            if let Some(m) = self.compare_one(name, got_name, want, got) {
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    fn compare_one(&self, name: &str, got_name: &str, want: &TensorData, got: &TensorData) -> Option<Mismatch> {
        let mismatch = |max_abs_err: f64, detail: String| {
            Some(Mismatch {
                output: name.to_string(),
                max_abs_err,
                detail,
            })
        };
        if got_name != name {
            return mismatch(f64::NAN, format!("was renamed to `{got_name}`"));
        }
        if got.tensor_type() != want.tensor_type() {
            let (g, w) = (got.tensor_type(), want.tensor_type());
            return mismatch(f64::NAN, format!("changed type: {g}, expected {w}"));
        }
        let (rtol, atol) = self.cfg.tolerance_for(want.dtype());
        let (w, g) = (want.to_f64_vec(), got.to_f64_vec());
        let mut max_err = 0.0f64;
        let mut first_bad = None;
        for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
            if a == b || (a.is_nan() && b.is_nan()) {
                continue;
            }
            let err = (a - b).abs();
            max_err = if err.is_nan() { f64::INFINITY } else { max_err.max(err) };
            let within = err <= atol + rtol * b.abs();
            if !within && first_bad.is_none() {
                first_bad = Some((i, a, b));
            }
        }
        let (i, a, b) = first_bad?;
        mismatch(
            max_err,
            format!(
                "differs by up to {max_err:e}; first at element {i}: got {a}, expected {b} (rtol {rtol:e}, atol {atol:e})"
            ),
        )
    }
}
