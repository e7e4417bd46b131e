//! Rewriting the regions of a control-flow node.
//!
//! `Graph` hands out nodes read-only, so a node whose regions change is replaced by a fresh
//! node with the same op and operands and the new regions; its uses move to the new node.

use oar_ir::{Graph, IrError, NodeId, ValueId};

/// Replace `node` by a copy holding `regions` (which must keep the region signatures).
pub(crate) fn replace_regions(graph: &mut Graph, node: NodeId, regions: Vec<Graph>) -> Result<(), IrError> {
    let old = graph.node(node);
    let (op, inputs, n) = (old.op.clone(), old.inputs().to_vec(), old.outputs().len());
    let new = graph.add_region_op(op, &inputs, regions)?;
    for (i, v) in new.iter().enumerate().take(n) {
        graph.replace_all_uses(ValueId { node, output: i as u32 }, *v)?;
    }
    graph.remove_node(node)
}

/// Run `f` on a copy of every region of every node that has regions; nodes whose regions `f`
/// changed are replaced. Returns whether any region changed.
pub(crate) fn rewrite_regions(
    graph: &mut Graph,
    f: &mut dyn FnMut(&mut Graph) -> Result<bool, IrError>,
) -> Result<bool, IrError> {
    let mut changed = false;
    let with_regions: Vec<NodeId> = graph
        .topo_order()
        .into_iter()
        .filter(|&n| !graph.node(n).regions.is_empty())
        .collect();
    for node in with_regions {
        let mut regions = graph.node(node).regions.clone();
        let mut any = false;
        for r in &mut regions {
            any |= f(r)?;
        }
        if any {
            replace_regions(graph, node, regions)?;
            changed = true;
        }
    }
    Ok(changed)
}
