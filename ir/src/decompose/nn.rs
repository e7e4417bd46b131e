//! Layers built on contractions and indexing: linear, conv2d, embedding.

use super::build::{V, reshape};
use crate::ops::BinaryOp;
use crate::{Dim, Emitter, Op, TensorType};

/// `x @ w (+ b)`; a rank-1 `x` is lifted to a row matrix because matmul needs rank ≥ 2.
pub(super) fn linear<E: Emitter>(g: &mut E, x: &[E::Value], types: &[TensorType]) -> V<E> {
    let (xt, wt) = (&types[0], &types[1]);
    let y = if xt.rank() == 1 {
        let row = reshape(g, x[0], vec![Dim::Static(1), xt.shape.0[0].clone()])?;
        let y = g.add_op1(Op::MatMul, &[row, x[1]])?;
        reshape(g, y, vec![wt.shape.0[1].clone()])?
    } else {
        g.add_op1(Op::MatMul, &[x[0], x[1]])?
    };
    match x.get(2) {
        // The bias [out] broadcasts against the trailing axis.
        Some(&b) => g.binary(BinaryOp::Add, y, b),
        None => Ok(y),
    }
}

/// Conv (padding is `(top, left, bottom, right)`), then the bias as `[O, 1, 1]`.
pub(super) fn conv2d<E: Emitter>(
    g: &mut E,
    x: &[E::Value],
    stride: [usize; 2],
    padding: [usize; 4],
    dilation: [usize; 2],
    groups: usize,
) -> V<E> {
    let conv = Op::Conv {
        stride: stride.to_vec(),
        pad_before: padding[..2].to_vec(),
        pad_after: padding[2..].to_vec(),
        dilation: dilation.to_vec(),
        groups,
    };
    let y = g.add_op1(conv, &[x[0], x[1]])?;
    match x.get(2) {
        Some(&b) => {
            let o = g.value_type(b).shape.0[0].clone();
            let b = reshape(g, b, vec![o, Dim::Static(1), Dim::Static(1)])?;
            g.binary(BinaryOp::Add, y, b)
        }
        None => Ok(y),
    }
}

/// `weight[indices]`: a gather on axis 0 gives `indices.shape ++ [D]`.
pub(super) fn embedding<E: Emitter>(g: &mut E, x: &[E::Value]) -> V<E> {
    g.add_op1(Op::Gather { axis: 0 }, &[x[1], x[0]])
}
