//! Decompositions of composite ops into primitives.

use crate::{Composite, Graph, IrError, ValueId};

/// Insert the primitive ops computing `op(inputs)` into `graph`; returns the op's outputs.
pub fn decompose(op: &Composite, graph: &mut Graph, inputs: &[ValueId]) -> Result<Vec<ValueId>, IrError> {
    let _ = (op, graph, inputs);
    todo!("decompositions")
}
