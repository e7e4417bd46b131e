//! Decompositions of composite ops into primitives, written once against [`Emitter`] so they
//! build graphs (static mode) and compute tensors (eager mode) alike.

use crate::{Composite, Emitter};

/// Apply the primitive ops computing `op(inputs)`; returns the op's outputs.
pub fn decompose<E: Emitter>(op: &Composite, e: &mut E, inputs: &[E::Value]) -> Result<Vec<E::Value>, E::Error> {
    let _ = (op, e, inputs);
    todo!("decompositions")
}
