//! Losses: cross_entropy through log_softmax and a one-hot mask.

use super::activation::log_softmax;
use super::build::{V, bin, dims, reduce, reshape, scalar_like, select, un};
use crate::ops::{BinaryOp, ReduceOp, Reduction, UnaryOp};
use crate::{Dim, Graph, Op, TensorType, ValueId};

/// `-log_softmax(logits)[n, labels[n]]`, reduced over `N` by mean, sum or not at all. The
/// label's entry is picked with a one-hot mask `iota == labels` (a select, not a gather, so
/// the whole loss stays elementwise plus reductions). A label outside `[0, C)` matches no
/// class and contributes 0, where the reference backend reports an error.
pub(super) fn cross_entropy(
    g: &mut Graph,
    logits: ValueId,
    labels: ValueId,
    lt: &TensorType,
    reduction: Reduction,
) -> V {
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
    let one_hot = bin(g, BinaryOp::Eq, classes, col)?;
    let zero = scalar_like(g, ls, 0.0);
    let picked = select(g, one_hot, ls, zero)?;
    let per_sample = reduce(g, ReduceOp::Sum, picked, vec![1], false)?;
    let loss = un(g, UnaryOp::Neg, per_sample)?;
    match reduction {
        Reduction::None => Ok(loss),
        Reduction::Sum => reduce(g, ReduceOp::Sum, loss, vec![0], false),
        Reduction::Mean => reduce(g, ReduceOp::Mean, loss, vec![0], false),
    }
}
