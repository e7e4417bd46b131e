//! Reverse-mode differentiation: [`vjp`] applies an op's own gradient rule
//! ([`OpDef::vjp`], in its family's module), shared by eager autograd and static graphs, and
//! [`append_backward`] extends a graph with the gradient of a scalar.

use crate::emit::Emitter;
use crate::ops::{BinaryOp, Op, OpDef, VjpArgs};
use crate::{Graph, IrError, NodeId, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// Gradients of `op`'s inputs given the cotangents of its outputs (`None` = zero).
/// `wants[i]` says whether input `i` needs a gradient; unwanted or non-differentiable inputs
/// get `None`. Composites must be decomposed first; control flow is not differentiable yet.
pub fn vjp<E: Emitter>(
    e: &mut E,
    op: &Op,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    wants: &[bool],
) -> Result<Vec<Option<E::Value>>, E::Error> {
    let none = vec![None; inputs.len()];
    if !wants.iter().any(|&w| w) {
        return Ok(none);
    }
    // Only single-output primitives are differentiable; their cotangent is cotangents[0].
    let g = match cotangents.first() {
        Some(Some(g)) => *g,
        _ => return Ok(none),
    };
    let args = VjpArgs {
        inputs,
        outputs,
        g,
        wants,
    };
    op.vjp(e, &args)
}

/// Append to `graph` the nodes computing `d loss / d wrt[i]` for each `wrt[i]` (`None` when the
/// loss does not depend on it). `loss` may have any shape: its cotangent is all ones (so the
/// result is the gradient of `sum(loss)`). Composite ops must be decomposed first.
pub fn append_backward(graph: &mut Graph, loss: ValueId, wrt: &[ValueId]) -> Result<Vec<Option<ValueId>>, IrError> {
    let order = graph.topo_order();
    // Nodes on a path from some `wrt` to `loss`.
    let mut depends: BTreeSet<NodeId> = wrt.iter().map(|v| v.node).collect();
    for &n in &order {
        if graph.node(n).inputs().iter().any(|v| depends.contains(&v.node)) {
            depends.insert(n);
        }
    }
    let mut reaches: BTreeSet<NodeId> = BTreeSet::from([loss.node]);
    for &n in order.iter().rev() {
        if reaches.contains(&n) {
            reaches.extend(graph.node(n).inputs().iter().map(|v| v.node));
        }
    }
    let ty = Graph::value_type(graph, loss).clone();
    let seed = graph.full(&ty, 1.0)?;
    let mut cot: BTreeMap<ValueId, ValueId> = BTreeMap::from([(loss, seed)]);
    for &n in order.iter().rev() {
        if !(depends.contains(&n) && reaches.contains(&n)) {
            continue;
        }
        let node = graph.node(n);
        let outs: Vec<ValueId> = (0..node.outputs().len() as u32)
            .map(|output| ValueId { node: n, output })
            .collect();
        let cts: Vec<Option<ValueId>> = outs.iter().map(|v| cot.get(v).copied()).collect();
        if cts.iter().all(Option::is_none) {
            continue;
        }
        let inputs = node.inputs().to_vec();
        let wants: Vec<bool> = inputs.iter().map(|v| depends.contains(&v.node)).collect();
        let op = node.op.clone();
        let grads = vjp(graph, &op, &inputs, &outs, &cts, &wants)?;
        for (x, gx) in inputs.into_iter().zip(grads) {
            if let Some(gx) = gx {
                let acc = match cot.get(&x) {
                    Some(&prev) => graph.binary(BinaryOp::Add, prev, gx)?,
                    None => gx,
                };
                cot.insert(x, acc);
            }
        }
    }
    Ok(wrt.iter().map(|v| cot.get(v).copied()).collect())
}
