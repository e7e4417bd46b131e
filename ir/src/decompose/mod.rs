//! Decompositions of composite ops into primitives: each composite's own
//! [`OpDef::decompose`](crate::ops::OpDef::decompose) (in its family's module) rewrites it into the
//! closed primitive set. [`decompose`] checks the operands with the composite's type rule first
//! and checks afterwards that the primitives produce exactly the composite's output types, so a
//! decomposition can never silently change a graph.

use crate::ops::{OpDef, infer_types};
use crate::{Composite, Emitter, IrError, Op, TensorType};

/// The mnemonics of every composite op, in table order (for keep-lists and listings).
pub fn composite_names() -> &'static [&'static str] {
    Composite::names()
}

/// Apply the primitive ops computing `op(inputs)` through `e` (a [`Graph`](crate::Graph) records
/// them, an eager context computes them); returns the op's outputs.
///
/// Fails with the composite's own type error if the operands do not fit its rule.
pub fn decompose<E: Emitter>(op: &Composite, e: &mut E, inputs: &[E::Value]) -> Result<Vec<E::Value>, E::Error> {
    let name = op.name();
    let types: Vec<TensorType> = inputs.iter().map(|v| e.value_type(*v)).collect();
    let want = infer_types(&Op::Composite(op.clone()), &types, &[]).map_err(|detail| IrError::Type {
        op: name.to_string(),
        value: "<new>".into(),
        detail,
    })?;
    let outs = op.decompose(e, inputs, &types, &want).unwrap_or_else(|| {
        Err(IrError::Type {
            op: name.to_string(),
            value: "<new>".into(),
            detail: "has no decomposition".into(),
        }
        .into())
    })?;
    let got: Vec<TensorType> = outs.iter().map(|v| e.value_type(*v)).collect();
    if got != want {
        // A bug in a decomposition, reported as an error rather than a corrupted graph.
        let show = |ts: &[TensorType]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
        return Err(IrError::Type {
            op: name.to_string(),
            value: "<new>".into(),
            detail: format!(
                "decomposition produced ({}) but the op yields ({})",
                show(&got),
                show(&want)
            ),
        }
        .into());
    }
    Ok(outs)
}

#[cfg(test)]
mod tests;
