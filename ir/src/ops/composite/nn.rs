//! Layers built on matmul and indexing: `linear`, `embedding`.

use super::super::contraction::matmul;
use super::super::rules::{R, arity, arity_range, check_index, out_elements};
use super::{composite_def, one, reshape, vector_of};
use crate::eval::{EvalCx, Res, Value};
use crate::ops::binary::eval as binary;
use crate::ops::indexing::gather;
use crate::ops::movement::reshape as reshape_value;
use crate::ops::{BinaryOp, Gather, OpDef, op_struct};
use crate::{Dim, Emitter, Graph, Op, TensorType};

op_struct! {
    /// `linear(x[.., in], w[in, out], b[out]?) = x @ w + b`.
    Linear "linear"
}

op_struct! {
    /// `embedding(indices (int), weight[V, D]) -> indices.shape ++ [D]`.
    Embedding "embedding"
}

impl OpDef for Linear {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[2, 3])?;
        let (x, w) = (&inputs[0], &inputs[1]);
        super::super::rules::same_dtype(x, w)?;
        if x.rank() < 1 || w.rank() != 2 || x.shape.0[x.rank() - 1] != w.shape.0[0] {
            return Err(format!("linear needs x[.., in] and w[in, out], got {x} and {w}"));
        }
        if let Some(b) = inputs.get(2) {
            vector_of(b, &w.shape.0[1], "linear bias", x)?;
        }
        let mut s = x.shape.0.clone();
        *s.last_mut().expect("rank ≥ 1") = w.shape.0[1].clone();
        Ok(vec![TensorType::new(x.dtype, s)])
    }

    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        let k = inputs.get(1)?.shape.0[0].as_static()? as u64;
        let out = out_elements(outputs)?;
        Some(
            2u64.saturating_mul(k)
                .saturating_mul(out)
                .saturating_add(if inputs.len() > 2 { out } else { 0 }),
        )
    }

    /// `x @ w (+ b)`; a rank-1 `x` is lifted to a row matrix because matmul needs rank ≥ 2.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || {
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
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2, 3])?;
        let (x, w) = (ins[0], ins[1]);
        let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
        let bad = || site.err(format!("needs x[.., in] and w[in, out], got {xs:?} and {ws:?}"));
        let (Some(&inn), [win, out]) = (xs.last(), ws.as_slice()) else {
            return Err(bad());
        };
        if inn != *win {
            return Err(bad());
        }
        let rows = xs[..xs.len() - 1].iter().product();
        let y = matmul(site, &reshape_value(site, x, &[rows, inn])?, w)?;
        let mut out_shape = xs.clone();
        *out_shape.last_mut().unwrap_or(&mut 0) = *out;
        let y = reshape_value(site, &y, &out_shape)?;
        Ok(vec![match ins.get(2) {
            Some(b) => binary(site, BinaryOp::Add, &y, b)?,
            None => y,
        }])
    }
}

impl OpDef for Embedding {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 2)?;
        let (idx, w) = (&inputs[0], &inputs[1]);
        check_index(idx)?;
        if w.rank() != 2 {
            return Err(format!("embedding weight must be [V, D], got {w}"));
        }
        let mut s = idx.shape.0.clone();
        s.push(w.shape.0[1].clone());
        Ok(vec![TensorType::new(w.dtype, s)])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    /// `weight[indices]`: a gather on axis 0 gives `indices.shape ++ [D]`.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(g.add_op1(Op::Gather(Gather { axis: 0 }), &[x[1], x[0]]))
    }

    /// Rows of `weight[V, D]` picked by `indices`; an index outside `[0, V)` is an error
    /// (negative indices do not wrap, as in PyTorch and Paddle).
    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2])?;
        let (idx, w) = (ins[0], ins[1]);
        let ia = idx.as_i(site, "indices")?;
        let v = match w.shape() {
            [v, _] => *v,
            s => return Err(site.err(format!("weight must be [V, D], got {s:?}"))),
        };
        if let Some(bad) = ia.iter().find(|&&k| k < 0 || k as u64 >= v as u64) {
            return Err(site.err(format!("index {bad} is out of range for {v} embeddings")));
        }
        Ok(vec![gather(site, w, idx, 0)?])
    }
}
