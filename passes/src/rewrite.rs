//! Small graph edits shared by the rewriting passes.

use oar_ir::{Graph, IrError, NodeId, Op, ValueId};

/// Point every use of `node`'s outputs at `values` (one per output) and remove `node`.
pub(crate) fn replace_node(graph: &mut Graph, node: NodeId, values: &[ValueId]) -> Result<(), IrError> {
    for (i, v) in values.iter().enumerate() {
        graph.replace_all_uses(ValueId { node, output: i as u32 }, *v)?;
    }
    graph.remove_node(node)
}

/// True if `v` is defined by a constant node.
pub(crate) fn is_constant(graph: &Graph, v: ValueId) -> bool {
    matches!(graph.node(v.node).op, Op::Constant(_))
}
