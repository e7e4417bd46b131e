//! Scaled dot-product attention: `softmax(q kᵀ · scale + mask) v`, where a bool mask keeps
//! `true` positions (others get -inf), a float mask is added, and `causal` masks key index
//! `j > i` for query index `i` (top-left aligned, like PyTorch). A row with every key masked
//! yields NaN (PyTorch).

use super::super::contraction::{matmul_f64, matmul_type};
use super::super::rules::{R, arity_range, float, out_elements, same_dtype};
use super::activation::{softmax, softmax_f64};
use super::{V, composite_def, lowest, one, scalar_like, select};
use crate::eval::{Data, EvalCx, Res, Value, broadcast_dims, view_as};
use crate::ops::{BinaryOp, Broadcast, Float, OpDef, Permute, ReduceOp, UnaryOp, op_struct};
use crate::shape::broadcasts_to;
use crate::{DType, Dim, Emitter, Graph, Op, Shape, TensorType};

op_struct! {
    /// Scaled dot-product attention `softmax(q kᵀ · scale + mask) v` with `q[.., L, E]`,
    /// `k[.., S, E]`, `v[.., S, Ev]`, optional `mask` broadcastable to `[.., L, S]` (bool:
    /// true keeps; float: added).
    ScaledDotProductAttention "sdpa" {
        /// Mask out positions where key index > query index.
        causal: bool,
        /// Scale; `None` means `1/sqrt(E)`.
        scale: Option<Float>,
    }
}

fn transpose_last(s: &Shape) -> Option<Shape> {
    let r = s.rank();
    if r < 2 {
        return None;
    }
    let mut d = s.0.clone();
    d.swap(r - 1, r - 2);
    Some(Shape(d))
}

impl OpDef for ScaledDotProductAttention {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[3, 4])?;
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        float(q)?;
        same_dtype(q, k)?;
        same_dtype(q, v)?;
        let kt = TensorType::new(
            k.dtype,
            transpose_last(&k.shape).ok_or_else(|| format!("attention key must have rank ≥ 2, got {k}"))?,
        );
        let scores = matmul_type(q, &kt).map_err(|e| format!("attention q·kᵀ: {e}"))?;
        if let Some(m) = inputs.get(3) {
            if m.dtype != DType::Bool && m.dtype != q.dtype {
                return Err(format!("attention mask must be bool or {}, got {m}", q.dtype));
            }
            if !broadcasts_to(&m.shape, &scores.shape) {
                return Err(format!("attention mask {m} does not broadcast to scores {scores}"));
            }
        }
        Ok(vec![
            matmul_type(&scores, v).map_err(|e| format!("attention weights·v: {e}"))?,
        ])
    }

    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        let last = |t: &TensorType, from_end: usize| -> Option<u64> {
            let s = &t.shape.0;
            Some(s.get(s.len().checked_sub(from_end)?)?.as_static()? as u64)
        };
        let (e, s, ev) = (last(&inputs[0], 1)?, last(&inputs[1], 2)?, last(&inputs[2], 1)?);
        let rows = out_elements(outputs)? / ev.max(1);
        Some(rows * s * (2 * e + 2 * ev + 5))
    }

    fn mode(&self) -> Option<String> {
        Some(format!("sdpa/{}", if self.causal { "causal" } else { "full" }))
    }

    fn modes() -> Vec<String> {
        vec!["sdpa/causal".into(), "sdpa/full".into()]
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(sdpa(g, x, types, self.causal, self.scale.map(|s| s.0)))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        Ok(vec![sdpa_eval(cx, ins, self.causal, self.scale.map(|s| s.0))?])
    }
}

/// Matmuls around a masked, numerically stable softmax.
fn sdpa<E: Emitter>(g: &mut E, x: &[E::Value], types: &[TensorType], causal: bool, scale: Option<f64>) -> V<E> {
    let (q, k, v) = (x[0], x[1], x[2]);
    let (qt, kt) = (&types[0], &types[1]);
    let rk = kt.rank();
    let mut perm: Vec<usize> = (0..rk).collect();
    perm.swap(rk - 1, rk - 2);
    let k_t = g.add_op1(Op::Permute(Permute { perm }), &[k])?;
    let scores = g.add_op1(Op::MatMul, &[q, k_t])?;
    let e = &qt.shape.0[qt.rank() - 1];
    let scaled = match (scale, e) {
        (Some(s), _) => g.binary_scalar(BinaryOp::Mul, scores, s)?,
        (None, Dim::Static(n)) => g.binary_scalar(BinaryOp::Mul, scores, 1.0 / (*n as f64).sqrt())?,
        (None, _) => {
            // E is only known at run time: count it by summing ones of shape [E].
            let one = scalar_like(g, q, 1.0)?;
            let ones = g.add_op1(Op::Broadcast(Broadcast { shape: vec![e.clone()] }), &[one])?;
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
        let qi = super::iota(g, ls.clone(), 0, DType::I64)?;
        let ki = super::iota(g, ls, 1, DType::I64)?;
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

fn sdpa_eval(cx: &dyn EvalCx, ins: &[&Value], causal: bool, scale: Option<f64>) -> Res<Value> {
    let site = cx.site();
    let (q, k, v) = match ins {
        [q, k, v] | [q, k, v, _] => (q.as_f(site, "q")?, k.as_f(site, "k")?, v.as_f(site, "v")?),
        _ => return Err(site.err(format!("expects 3 or 4 operands, got {}", ins.len()))),
    };
    let rk = k.ndim();
    if q.ndim() < 2 || rk < 2 {
        return Err(site.err(format!(
            "q and k need rank ≥ 2, got {:?} and {:?}",
            q.shape(),
            k.shape()
        )));
    }
    let e = q.shape()[q.ndim() - 1];
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    // Refuse oversized scores before allocating them.
    let (rq, l, sk) = (q.ndim(), q.shape()[q.ndim() - 2], k.shape()[rk - 2]);
    let mut scores_shape = broadcast_dims(site, &q.shape()[..rq - 2], &k.shape()[..rk - 2])?;
    scores_shape.extend([l, sk]);
    site.check_size(ins[0].dtype, &scores_shape, "attention scores")?;
    let mut kt = k.view();
    kt.swap_axes(rk - 1, rk - 2);
    let mut scores = matmul_f64(site, q, &kt.to_owned())?;
    scores.mapv_inplace(|s| s * scale);
    let r = scores.ndim();
    if causal {
        for (ix, s) in scores.indexed_iter_mut() {
            if ix[r - 1] > ix[r - 2] {
                *s = f64::NEG_INFINITY;
            }
        }
    }
    if let Some(m) = ins.get(3) {
        let shape = scores.shape().to_vec();
        match &m.data {
            Data::B(mask) => {
                let mv = view_as(site, mask, &shape)?;
                scores.zip_mut_with(&mv, |s, &keep| {
                    if !keep {
                        *s = f64::NEG_INFINITY;
                    }
                });
            }
            Data::F(mask) => {
                let mv = view_as(site, mask, &shape)?;
                scores.zip_mut_with(&mv, |s, &add| *s += add);
            }
            Data::I(_) => return Err(site.err(format!("mask must be bool or float, got {}", m.dtype))),
        }
    }
    let probs = softmax_f64(&scores, r - 1, false);
    Ok(Value::float(ins[0].dtype, matmul_f64(site, &probs, v)?))
}
