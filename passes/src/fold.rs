//! Constant folding: an op whose operands are all constants is evaluated once, at compile time,
//! by the reference backend (the oracle, so folding cannot disagree with it), and replaced by
//! the constants it produced.
//!
//! Skipped: leaves and nullary generators (`iota`, `random` — folding them only grows the IR;
//! `random` and `dropout` must stay draws), control flow, results larger than the size limit, results with
//! symbolic shapes, and ops the backend fails on (e.g. integer division by zero, which must
//! stay a runtime error). Each folded node is one step.

use crate::regions::rewrite_regions;
use crate::rewrite::{is_constant, replace_node};
use crate::{Pass, PassError, StepBudget, StepRun};
use oar_ir::{Composite, Graph, IrError, NodeId, Op};

/// Default cap on the bytes a folded op may produce (1 MiB).
pub const DEFAULT_FOLD_LIMIT_BYTES: usize = 1 << 20;

/// The constant-folding pass.
#[derive(Clone, Copy, Debug)]
pub struct Fold {
    limit_bytes: usize,
}

impl Default for Fold {
    fn default() -> Fold {
        Fold {
            limit_bytes: DEFAULT_FOLD_LIMIT_BYTES,
        }
    }
}

impl Fold {
    /// Fold results of at most [`DEFAULT_FOLD_LIMIT_BYTES`] bytes.
    pub fn new() -> Fold {
        Fold::default()
    }

    /// Fold results of at most `limit_bytes` bytes (all outputs of the op together).
    pub fn with_limit(limit_bytes: usize) -> Fold {
        Fold { limit_bytes }
    }

    /// True if `node` is worth folding: all operands constant, a foldable op, a small result.
    fn foldable(&self, graph: &Graph, node: NodeId) -> bool {
        let n = graph.node(node);
        let op_ok = !matches!(
            n.op,
            Op::Input(_)
                | Op::Param(_)
                | Op::Constant(_)
                | Op::Iota(_)
                | Op::Random(_)
                | Op::Collective(_)
                | Op::Composite(Composite::Dropout(_))
        ) && n.regions.is_empty()
            && !n.inputs().is_empty();
        if !op_ok || !n.inputs().iter().all(|&v| is_constant(graph, v)) {
            return false;
        }
        let bytes = n.outputs().iter().try_fold(0usize, |acc, t| {
            let elems = t.shape.num_elements()?;
            acc.checked_add(elems.checked_mul(t.dtype.size_bytes())?)
        });
        bytes.is_some_and(|b| b <= self.limit_bytes)
    }

    fn fold(&self, graph: &mut Graph, budget: &mut StepBudget) -> Result<bool, IrError> {
        let mut changed = false;
        for node in graph.topo_order() {
            if budget.exhausted() {
                break;
            }
            if !self.foldable(graph, node) {
                continue;
            }
            let Some(values) = evaluate(graph, node) else { continue };
            if !budget.take() {
                break;
            }
            let consts: Vec<_> = values.into_iter().map(|t| graph.add_constant(t)).collect();
            replace_node(graph, node, &consts)?;
            changed = true;
        }
        let in_regions = rewrite_regions(graph, &mut |r| self.fold(r, budget))?;
        Ok(changed || in_regions)
    }
}

/// Run `node` alone (its constant operands copied into a one-op graph) on the reference
/// backend; `None` if the backend refuses or the results do not match the node's types.
fn evaluate(graph: &Graph, node: NodeId) -> Option<Vec<oar_ir::TensorData>> {
    let n = graph.node(node);
    let mut operands = Vec::with_capacity(n.inputs().len());
    for v in n.inputs() {
        let Op::Constant(t) = &graph.node(v.node).op else {
            return None;
        };
        operands.push(t.clone());
    }
    let values = oar_backend_reference::run_op(&n.op, &operands).ok()?;
    let types_match =
        values.len() == n.outputs().len() && values.iter().zip(n.outputs()).all(|(t, ty)| t.tensor_type() == *ty);
    types_match.then_some(values)
}

impl Pass for Fold {
    fn name(&self) -> &'static str {
        "fold"
    }

    fn description(&self) -> &'static str {
        "evaluate ops whose operands are all constants (reference backend) and replace them by constants"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        Ok(self.run_steps(graph, None)?.changed)
    }

    fn run_steps(&self, graph: &mut Graph, max_steps: Option<usize>) -> Result<StepRun, PassError> {
        let mut budget = StepBudget::new(max_steps);
        self.fold(graph, &mut budget)
            .map_err(|e| PassError::ir(self.name(), e))?;
        Ok(budget.run())
    }
}
