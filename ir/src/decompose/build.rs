//! Small builders the decompositions share, on top of [`Emitter`]'s own helpers.

use crate::ops::SliceRange;
use crate::{DType, Dim, Emitter, IrError, Op};

/// Result of applying one op through an emitter.
pub(super) type V<E> = Result<<E as Emitter>::Value, <E as Emitter>::Error>;

/// The dtype of a value.
pub(super) fn dtype<E: Emitter>(g: &E, v: E::Value) -> DType {
    g.value_type(v).dtype
}

/// The dims of a value.
pub(super) fn dims<E: Emitter>(g: &E, v: E::Value) -> Vec<Dim> {
    g.value_type(v).shape.0
}

/// A scalar constant with the dtype of `like`.
pub(super) fn scalar_like<E: Emitter>(g: &mut E, like: E::Value, value: f64) -> V<E> {
    let d = dtype(g, like);
    g.add_scalar(d, value)
}

/// Strided slice with one range per axis.
pub(super) fn slice<E: Emitter>(g: &mut E, x: E::Value, ranges: Vec<SliceRange>) -> V<E> {
    g.add_op1(Op::Slice { ranges }, &[x])
}

/// `where(c, a, b)`.
pub(super) fn select<E: Emitter>(g: &mut E, c: E::Value, a: E::Value, b: E::Value) -> V<E> {
    g.add_op1(Op::Where, &[c, a, b])
}

/// Reshape to `dims` (no op when the shape already matches).
pub(super) fn reshape<E: Emitter>(g: &mut E, x: E::Value, dims: Vec<Dim>) -> V<E> {
    g.reshape(x, &crate::Shape(dims))
}

/// The smallest value of a dtype, used as the identity of max (−inf for floats).
pub(super) fn lowest(d: DType) -> f64 {
    match d {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => f64::NEG_INFINITY,
        DType::I8 => i8::MIN as f64,
        DType::I32 => i32::MIN as f64,
        // i64::MIN is a power of two, so it is exact in f64.
        DType::I64 => i64::MIN as f64,
        DType::U8 | DType::Bool => 0.0,
    }
}

/// A type error raised by a decomposition itself (operands the rule accepts but the
/// decomposition cannot express).
pub(super) fn unsupported(op: &str, detail: String) -> IrError {
    IrError::Type {
        op: op.to_string(),
        value: "<new>".into(),
        detail,
    }
}
