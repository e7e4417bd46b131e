//! Common-subexpression elimination: two nodes with equal ops (compared structurally through
//! the ops' `Hash`/`Eq`, never through strings) and the same operands compute the same values,
//! so the later one is replaced by the earlier one.
//!
//! Random draws (`random`, `dropout`) are never merged: two draws are two samples even if their
//! attributes agree. Nodes with regions are not merged either; their regions are cleaned up
//! recursively, each on its own (a region sees only its own values). Operands of commutative
//! binary ops are compared as a set, so `add(a, b)` and `add(b, a)` merge. Each merged node is
//! one step.

use crate::regions::rewrite_regions;
use crate::rewrite::replace_node;
use crate::{Pass, PassError, StepBudget, StepRun};
use oar_ir::{Composite, Graph, IrError, NodeId, Op, ValueId};
use std::collections::HashMap;

/// The CSE pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cse;

/// True for ops that must never be merged.
fn unmergeable(graph: &Graph, node: NodeId) -> bool {
    let n = graph.node(node);
    !n.regions.is_empty()
        || matches!(
            n.op,
            Op::Input(_) | Op::Param(_) | Op::Random(_) | Op::Composite(Composite::Dropout(_))
        )
}

/// The key under which equal computations meet.
fn key(graph: &Graph, node: NodeId) -> (Op, Vec<ValueId>) {
    let n = graph.node(node);
    let mut operands = n.inputs().to_vec();
    if matches!(&n.op, Op::Binary(b) if b.is_commutative()) {
        operands.sort();
    }
    (n.op.clone(), operands)
}

fn cse(graph: &mut Graph, budget: &mut StepBudget) -> Result<bool, IrError> {
    let mut seen: HashMap<(Op, Vec<ValueId>), NodeId> = HashMap::new();
    let mut changed = false;
    // Topological order: operands are merged before their users are keyed.
    for node in graph.topo_order() {
        if unmergeable(graph, node) {
            continue;
        }
        let k = key(graph, node);
        let Some(&first) = seen.get(&k) else {
            seen.insert(k, node);
            continue;
        };
        if !budget.take() {
            break;
        }
        let outs = graph.node(first).outputs().len() as u32;
        let values: Vec<_> = (0..outs).map(|output| ValueId { node: first, output }).collect();
        replace_node(graph, node, &values)?;
        changed = true;
    }
    let in_regions = rewrite_regions(graph, &mut |r| cse(r, budget))?;
    Ok(changed || in_regions)
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn description(&self) -> &'static str {
        "merge nodes with equal ops and operands (never random draws or ops with regions)"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        Ok(self.run_steps(graph, None)?.changed)
    }

    fn run_steps(&self, graph: &mut Graph, max_steps: Option<usize>) -> Result<StepRun, PassError> {
        let mut budget = StepBudget::new(max_steps);
        cse(graph, &mut budget).map_err(|e| PassError::ir(self.name(), e))?;
        Ok(budget.run())
    }
}
