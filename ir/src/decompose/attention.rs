//! Scaled dot-product attention: matmuls around a masked, numerically stable softmax.

use super::activation::softmax;
use super::build::{V, lowest, scalar_like, select};
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Dim, Emitter, Op, TensorType};

/// `softmax(q kᵀ · scale + mask) v`; `mask` is bool (true keeps) or float (added); `causal`
/// masks key index > query index.
pub(super) fn sdpa<E: Emitter>(
    g: &mut E,
    x: &[E::Value],
    types: &[TensorType],
    causal: bool,
    scale: Option<f64>,
) -> V<E> {
    let (q, k, v) = (x[0], x[1], x[2]);
    let (qt, kt) = (&types[0], &types[1]);
    let rk = kt.rank();
    let mut perm: Vec<usize> = (0..rk).collect();
    perm.swap(rk - 1, rk - 2);
    let k_t = g.add_op1(Op::Permute { perm }, &[k])?;
    let scores = g.add_op1(Op::MatMul, &[q, k_t])?;
    let e = &qt.shape.0[qt.rank() - 1];
    let scaled = match (scale, e) {
        (Some(s), _) => g.binary_scalar(BinaryOp::Mul, scores, s)?,
        (None, Dim::Static(n)) => g.binary_scalar(BinaryOp::Mul, scores, 1.0 / (*n as f64).sqrt())?,
        (None, Dim::Sym(_)) => {
            // E is only known at run time: count it by summing ones of shape [E].
            let one = scalar_like(g, q, 1.0)?;
            let ones = g.add_op1(Op::Broadcast { shape: vec![e.clone()] }, &[one])?;
            let n = g.reduce(ReduceOp::Sum, ones, vec![0], false)?;
            let r = g.unary(UnaryOp::Rsqrt, n)?;
            g.binary(BinaryOp::Mul, scores, r)?
        }
    };
    let st = g.value_type(scaled);
    let neg_inf = g.add_scalar(st.dtype, lowest(st.dtype))?;
    let mut s = scaled;
    if causal {
        let r = st.rank();
        let ls = st.shape.0[r - 2..].to_vec();
        let qi = g.add_op1(
            Op::Iota {
                shape: ls.clone(),
                axis: 0,
                dtype: DType::I64,
            },
            &[],
        )?;
        let ki = g.add_op1(
            Op::Iota {
                shape: ls,
                axis: 1,
                dtype: DType::I64,
            },
            &[],
        )?;
        let future = g.binary(BinaryOp::Gt, ki, qi)?;
        s = select(g, future, neg_inf, s)?;
    }
    if let Some(&m) = x.get(3) {
        s = if g.value_type(m).dtype == DType::Bool {
            select(g, m, s, neg_inf)?
        } else {
            g.binary(BinaryOp::Add, s, m)?
        };
    }
    let last = st.rank() - 1;
    let p = softmax(g, s, last)?;
    g.add_op1(Op::MatMul, &[p, v])
}
