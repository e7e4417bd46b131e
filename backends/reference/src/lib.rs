//! oar's reference backend: the oracle every other backend and every pass is tested against.
//! It interprets graphs (and fused kernel programs) by running each op's own reference
//! evaluation (`OpDef::eval`, defined with the op in `oar_ir::ops`): primitives, composites
//! (computed natively, not through their decompositions) and control flow.
//!
//! Numerics: floats are computed in f64 and rounded to their dtype after every op; integers
//! in i64 and wrapped to their dtype (see `oar_ir::eval`). Random numbers come from the
//! counter-based SplitMix64 stream of `oar_ir::ops::random_stream`, so results never depend on
//! evaluation order.

mod interp;
mod kernels_exec;

pub use kernels_exec::{run_kernel, run_kernel_program, run_kernel_program_planned};

use interp::Interp;
use oar_ir::backend::check_inputs;
use oar_ir::eval::Value;
use oar_ir::ops::Param;
use oar_ir::{Backend, BackendError, Executable, Graph, Op, TensorData, Weights};
use std::collections::BTreeMap;

/// A `while` loop running more iterations than this is an error (see [`RunOptions`]).
pub const DEFAULT_MAX_WHILE_ITERATIONS: u64 = 1_000_000;

/// Settings of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// A `while` loop running more iterations than this returns an error instead of hanging.
    pub max_while_iterations: u64,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            max_while_iterations: DEFAULT_MAX_WHILE_ITERATIONS,
        }
    }
}

/// The reference backend (registry name `reference`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReferenceBackend;

impl ReferenceBackend {
    /// The backend.
    pub fn new() -> Self {
        ReferenceBackend
    }
}

/// A verified graph with its weights, ready to interpret.
struct ReferenceExecutable {
    graph: Graph,
    weights: Weights,
    options: RunOptions,
}

impl Executable for ReferenceExecutable {
    fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        execute(&self.graph, &self.weights, inputs, &self.options)
    }
}

impl Backend for ReferenceBackend {
    fn name(&self) -> &str {
        "reference"
    }

    fn description(&self) -> &str {
        "plain interpreter of every op; the oracle other backends are tested against"
    }

    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        oar_ir::verify(graph)?;
        check_weights(graph, weights)?;
        Ok(Box::new(ReferenceExecutable {
            graph: graph.clone(),
            weights: weights.clone(),
            options: RunOptions::default(),
        }))
    }
}

/// Every param (in the graph and its regions) has a weight of the declared dtype and rank,
/// with matching static dims.
fn check_weights(graph: &Graph, weights: &Weights) -> Result<(), BackendError> {
    for id in graph.node_ids() {
        let node = graph.node(id);
        if let Op::Param(Param { name, ty }) = &node.op {
            let weight = |detail: String| BackendError::Weight {
                name: name.clone(),
                detail,
            };
            let t = weights
                .get(name)
                .ok_or_else(|| weight(format!("no weight given (expected {ty})")))?;
            let dims_ok = t.shape().len() == ty.rank()
                && ty
                    .shape
                    .dims()
                    .iter()
                    .zip(t.shape())
                    .all(|(d, &n)| d.as_static().is_none_or(|s| s == n));
            if t.dtype() != ty.dtype || !dims_ok {
                return Err(weight(format!("expected {ty}, got {}", t.tensor_type())));
            }
        }
        for r in &node.regions {
            check_weights(r, weights)?;
        }
    }
    Ok(())
}

/// Run one op (no regions) on concrete inputs, as a one-node graph: what eager mode and
/// constant folding use when they need the oracle's answer for a single op.
pub fn run_op(op: &Op, inputs: &[TensorData]) -> Result<Vec<TensorData>, BackendError> {
    let mut g = Graph::new(op.name());
    let mut feeds = BTreeMap::new();
    let mut args = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        let name = format!("x{i}");
        args.push(g.add_input(&name, t.tensor_type())?);
        feeds.insert(name, t.clone());
    }
    for (i, v) in g.add_op(op.clone(), &args)?.into_iter().enumerate() {
        g.add_output(&format!("y{i}"), v)?;
    }
    Ok(run_graph(&g, &Weights::new(), &feeds)?
        .into_iter()
        .map(|(_, t)| t)
        .collect())
}

/// Run a graph once (verify, check inputs, evaluate). Outputs in graph output order.
pub fn run_graph(
    graph: &Graph,
    weights: &Weights,
    inputs: &BTreeMap<String, TensorData>,
) -> Result<Vec<(String, TensorData)>, BackendError> {
    run_graph_with(graph, weights, inputs, &RunOptions::default())
}

/// [`run_graph`] with explicit [`RunOptions`].
pub fn run_graph_with(
    graph: &Graph,
    weights: &Weights,
    inputs: &BTreeMap<String, TensorData>,
    options: &RunOptions,
) -> Result<Vec<(String, TensorData)>, BackendError> {
    oar_ir::verify(graph)?;
    execute(graph, weights, inputs, options)
}

/// Evaluate a verified graph.
fn execute(
    graph: &Graph,
    weights: &Weights,
    inputs: &BTreeMap<String, TensorData>,
    options: &RunOptions,
) -> Result<Vec<(String, TensorData)>, BackendError> {
    let binds = check_inputs(graph, inputs)?;
    let mut args = Vec::with_capacity(graph.inputs().len());
    for (name, _) in graph.input_specs() {
        let t = inputs.get(&name).ok_or_else(|| BackendError::MissingInput {
            name: name.clone(),
            expected: "a value".into(),
        })?;
        args.push(Value::from_tensor(t).map_err(|detail| BackendError::Runtime {
            op: "input".into(),
            value: name.clone(),
            detail,
        })?);
    }
    let interp = Interp {
        weights,
        max_while_iterations: options.max_while_iterations,
    };
    // Belt and braces: a bug in an op implementation must surface as an error naming the
    // graph, not take down the process that asked the oracle.
    let values = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| interp.eval(graph, &args, binds))).map_err(
        |panic| BackendError::Runtime {
            op: "<interpreter>".into(),
            value: graph.name().to_string(),
            detail: format!(
                "internal error (please report): {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("panic")
            ),
        },
    )??;
    graph
        .outputs()
        .iter()
        .zip(values)
        .map(|(o, v)| {
            let t = v.to_tensor().map_err(|detail| BackendError::Runtime {
                op: "output".into(),
                value: o.name.clone(),
                detail,
            })?;
            Ok((o.name.clone(), t))
        })
        .collect()
}
