//! Canonicalization: put ops in one normal form so later passes (CSE, fusion, rules) see fewer
//! shapes of the same computation, and drop ops that do nothing.
//!
//! Rules, each one step:
//! - a commutative binary op with a constant on the left and a non-constant on the right
//!   swaps its operands (`add(1, x)` → `add(x, 1)`);
//! - identities are removed: a reshape/broadcast to the input's own type, a permute by the
//!   identity permutation, a cast to the same dtype, a slice that takes every element, a pad by
//!   zero everywhere, a concat of one operand, a reduction over no axes.
//!
//! Reduce axes need no sorting here: the type rule only accepts sorted, unique axes.

use crate::regions::rewrite_regions;
use crate::rewrite::{is_constant, replace_node};
use crate::{Pass, PassError, StepBudget, StepRun};
use oar_ir::ops::{Pad, Permute, Reduce, Slice};
use oar_ir::{Dim, Graph, IrError, NodeId, Op, ValueId};

/// The canonicalization pass (see the module docs for its rules).
#[derive(Clone, Copy, Debug, Default)]
pub struct Canonicalize;

/// What to do with one node.
enum Rewrite {
    /// Replace the node's single output by this value (the op is an identity).
    Forward(ValueId),
    /// Rebuild the node with its two operands swapped.
    Swap,
}

/// True if the slice `op` of an operand typed `x` keeps every element in order.
fn slice_is_identity(ranges: &[oar_ir::ops::SliceRange], dims: &[Dim]) -> bool {
    ranges.len() == dims.len()
        && ranges.iter().zip(dims).all(|(r, d)| match d {
            Dim::Static(n) => {
                let (start, len) = r.resolve(*n);
                start == 0 && len == *n && (r.step == 1 || *n <= 1)
            }
            _ => r.is_full(),
        })
}

fn rule(graph: &Graph, node: NodeId) -> Option<Rewrite> {
    let n = graph.node(node);
    let ins = n.inputs();
    let out_ty = n.outputs().first()?;
    let same_type = |i: usize| ins.get(i).is_some_and(|&v| graph.value_type(v) == out_ty);
    let forward = |cond: bool| (cond && same_type(0)).then(|| Rewrite::Forward(ins[0]));
    match &n.op {
        Op::Binary(b) if b.is_commutative() => {
            (is_constant(graph, ins[0]) && !is_constant(graph, ins[1])).then_some(Rewrite::Swap)
        }
        Op::Reshape(_) | Op::Broadcast(_) | Op::Cast(_) => forward(true),
        Op::Permute(Permute { perm }) => forward(perm.iter().enumerate().all(|(i, &p)| i == p)),
        Op::Slice(Slice { ranges }) => forward(slice_is_identity(ranges, graph.value_type(ins[0]).shape.dims())),
        Op::Pad(Pad { before, after, .. }) => forward(before.iter().chain(after).all(|&p| p == 0)),
        Op::Concat(_) => forward(ins.len() == 1),
        Op::Reduce(Reduce { axes, .. }) => forward(axes.is_empty()),
        _ => None,
    }
}

/// Apply the rules to `graph` (not its regions) until none fires or the budget runs out.
fn canonicalize_once(graph: &mut Graph, budget: &mut StepBudget) -> Result<bool, IrError> {
    let mut changed = false;
    for node in graph.topo_order() {
        let Some(rewrite) = rule(graph, node) else { continue };
        if !budget.take() {
            break;
        }
        match rewrite {
            Rewrite::Forward(v) => replace_node(graph, node, &[v])?,
            Rewrite::Swap => {
                let n = graph.node(node);
                let (op, a, b) = (n.op.clone(), n.inputs()[0], n.inputs()[1]);
                let swapped = graph.add_op1(op, &[b, a])?;
                replace_node(graph, node, &[swapped])?;
            }
        }
        changed = true;
    }
    Ok(changed)
}

fn canonicalize(graph: &mut Graph, budget: &mut StepBudget) -> Result<bool, IrError> {
    // Removing one identity can expose another (a cast of a reshape of x), and the walk above
    // visits each node once, so repeat; every rule shrinks the graph or fixes an operand
    // order, so this ends.
    let mut changed = false;
    while canonicalize_once(graph, budget)? {
        changed = true;
    }
    let in_regions = rewrite_regions(graph, &mut |r| canonicalize(r, budget))?;
    Ok(changed || in_regions)
}

impl Pass for Canonicalize {
    fn name(&self) -> &'static str {
        "canonicalize"
    }

    fn description(&self) -> &'static str {
        "constants to the right of commutative ops; remove identity reshape/permute/broadcast/cast/slice/pad"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        Ok(self.run_steps(graph, None)?.changed)
    }

    fn run_steps(&self, graph: &mut Graph, max_steps: Option<usize>) -> Result<StepRun, PassError> {
        let mut budget = StepBudget::new(max_steps);
        canonicalize(graph, &mut budget).map_err(|e| PassError::ir(self.name(), e))?;
        Ok(budget.run())
    }
}
