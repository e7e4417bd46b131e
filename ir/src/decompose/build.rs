//! Small builders the decompositions share: typed shorthands for adding primitives.

use crate::ops::{BinaryOp, ReduceOp, SliceRange, UnaryOp};
use crate::{DType, Dim, Graph, IrError, Op, ValueId};

/// Result of adding one primitive.
pub(super) type V = Result<ValueId, IrError>;

/// The dtype of a value.
pub(super) fn dtype(g: &Graph, v: ValueId) -> DType {
    g.value_type(v).dtype
}

/// The dims of a value.
pub(super) fn dims(g: &Graph, v: ValueId) -> Vec<Dim> {
    g.value_type(v).shape.0.clone()
}

/// A scalar constant with the dtype of `like`.
pub(super) fn scalar_like(g: &mut Graph, like: ValueId, value: f64) -> ValueId {
    let d = dtype(g, like);
    g.add_scalar(d, value)
}

/// `a op b`.
pub(super) fn bin(g: &mut Graph, op: BinaryOp, a: ValueId, b: ValueId) -> V {
    g.binary(op, a, b)
}

/// `a op s` with `s` a scalar of `a`'s dtype.
pub(super) fn bin_scalar(g: &mut Graph, op: BinaryOp, a: ValueId, s: f64) -> V {
    let c = scalar_like(g, a, s);
    g.binary(op, a, c)
}

/// `op(x)`.
pub(super) fn un(g: &mut Graph, op: UnaryOp, x: ValueId) -> V {
    g.unary(op, x)
}

/// A reduction over sorted `axes`.
pub(super) fn reduce(g: &mut Graph, op: ReduceOp, x: ValueId, axes: Vec<usize>, keepdim: bool) -> V {
    g.add_op1(Op::Reduce { op, axes, keepdim }, &[x])
}

/// Reshape to `shape`.
pub(super) fn reshape(g: &mut Graph, x: ValueId, shape: Vec<Dim>) -> V {
    g.add_op1(Op::Reshape { shape }, &[x])
}

/// Strided slice with one range per axis.
pub(super) fn slice(g: &mut Graph, x: ValueId, ranges: Vec<SliceRange>) -> V {
    g.add_op1(Op::Slice { ranges }, &[x])
}

/// `where(c, a, b)`.
pub(super) fn select(g: &mut Graph, c: ValueId, a: ValueId, b: ValueId) -> V {
    g.add_op1(Op::Where, &[c, a, b])
}

/// Cast to `to` (no node when the dtype already matches).
pub(super) fn cast(g: &mut Graph, x: ValueId, to: DType) -> V {
    if dtype(g, x) == to {
        return Ok(x);
    }
    g.add_op1(Op::Cast { to }, &[x])
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
