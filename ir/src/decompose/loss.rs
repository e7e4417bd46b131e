//! Losses: cross_entropy through log_softmax and a one-hot mask.

use super::activation::log_softmax;
use super::build::{V, dims, reshape, scalar_like, select};
use crate::ops::{BinaryOp, ReduceOp, Reduction, UnaryOp};
use crate::{Dim, Emitter, Op, TensorType};

/// `-log_softmax(logits)[n, labels[n]]`, reduced over `N` by mean, sum or not at all. The
/// label's entry is picked with a one-hot mask `iota == labels` (a select, not a gather, so
/// the whole loss stays elementwise plus reductions). A label outside `[0, C)` matches no
/// class and contributes 0, where the reference backend reports an error.
pub(super) fn cross_entropy<E: Emitter>(
    g: &mut E,
    logits: E::Value,
    labels: E::Value,
    lt: &TensorType,
    reduction: Reduction,
) -> V<E> {
    let ls = log_softmax(g, logits, 1)?;
    let shape = dims(g, logits);
    let classes = g.add_op1(
        Op::Iota {
            shape: shape.clone(),
            axis: 1,
            dtype: lt.dtype,
        },
        &[],
    )?;
    let col = reshape(g, labels, vec![shape[0].clone(), Dim::Static(1)])?;
    let one_hot = g.binary(BinaryOp::Eq, classes, col)?;
    let zero = scalar_like(g, ls, 0.0)?;
    let picked = select(g, one_hot, ls, zero)?;
    let per_sample = g.reduce(ReduceOp::Sum, picked, vec![1], false)?;
    let loss = g.unary(UnaryOp::Neg, per_sample)?;
    match reduction {
        Reduction::None => Ok(loss),
        Reduction::Sum => g.reduce(ReduceOp::Sum, loss, vec![0], false),
        Reduction::Mean => g.reduce(ReduceOp::Mean, loss, vec![0], false),
    }
}
