//! Normalizations: `batch_norm` (training and inference) and `layer_norm`. Variances are
//! biased (divide by the count).

use super::super::rules::{R, arity, arity_range, elements, float};
use super::{V, composite_def, one, reshape, vector_of};
use crate::eval::{EvalCx, Res, Value, array};
use crate::ops::{BinaryOp, Float, OpDef, ReduceOp, UnaryOp, op_struct};
use crate::{Dim, Emitter, Graph, Shape, TensorType};

op_struct! {
    /// `batch_norm(x[N,C,*], scale[C], bias[C], running_mean[C], running_var[C])`.
    /// Training: normalizes with batch statistics and returns `(y, new_running_mean,
    /// new_running_var)` with Paddle's rule `r = momentum * r + (1 - momentum) * batch_stat`
    /// (biased batch variance). Inference: normalizes with the running stats, returns `y`.
    BatchNorm "batch_norm" {
        /// Added to the variance.
        epsilon: Float,
        /// Running-stat momentum (Paddle convention, default 0.9).
        momentum: Float,
        /// Training or inference mode.
        training: bool,
    }
}

op_struct! {
    /// `layer_norm(x, weight?, bias?)` over the last `normalized_ndim` axes; weight and bias
    /// (both or neither) have the shape of those axes.
    LayerNorm "layer_norm" {
        /// Number of trailing axes normalized.
        normalized_ndim: usize,
        /// Added to the variance.
        epsilon: Float,
    }
}

impl OpDef for BatchNorm {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 5)?;
        let x = &inputs[0];
        float(x)?;
        if x.rank() < 2 {
            return Err(format!("batch_norm needs x[N,C,..], got {x}"));
        }
        let ch = &x.shape.0[1];
        for (t, what) in inputs[1..].iter().zip(["scale", "bias", "running_mean", "running_var"]) {
            vector_of(t, ch, what, x)?;
        }
        Ok(if self.training {
            vec![x.clone(), inputs[3].clone(), inputs[4].clone()]
        } else {
            vec![x.clone()]
        })
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(8 * elements(inputs.first()?)?)
    }

    fn mode(&self) -> Option<String> {
        Some(format!("batch_norm/{}", if self.training { "train" } else { "eval" }))
    }

    fn modes() -> Vec<String> {
        vec!["batch_norm/train".into(), "batch_norm/eval".into()]
    }

    /// Training reduces over every axis but the channel axis with `reduce_mean`, so a
    /// symbolic batch dim needs no element count.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        Some(batch_norm(
            g,
            x,
            &types[0],
            self.epsilon.0,
            self.momentum.0,
            self.training,
        ))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        batch_norm_eval(cx, ins, self.epsilon.0, self.momentum.0, self.training)
    }
}

impl OpDef for LayerNorm {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[1, 3])?;
        let x = &inputs[0];
        float(x)?;
        let k = self.normalized_ndim;
        if k == 0 || k > x.rank() {
            return Err(format!("layer_norm over {k} trailing axes of {x}"));
        }
        let tail = Shape(x.shape.0[x.rank() - k..].to_vec());
        for t in &inputs[1..] {
            if t.shape != tail || t.dtype != x.dtype {
                return Err(format!("layer_norm weight/bias must be {}{tail}, got {t}", x.dtype));
            }
        }
        Ok(vec![x.clone()])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(8 * elements(inputs.first()?)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(layer_norm(g, x, &types[0], self.normalized_ndim, self.epsilon.0))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[1, 3])?;
        let (k, eps) = (self.normalized_ndim, self.epsilon.0);
        let x = ins[0].as_f(site, "layer_norm input")?;
        if k == 0 || k > x.ndim() {
            return Err(site.err(format!("normalizes {k} trailing axes of {:?}", x.shape())));
        }
        let inner: usize = x.shape()[x.ndim() - k..].iter().product();
        let affine = match ins {
            [_, w, b] => {
                let (w, b) = (w.as_f(site, "weight")?, b.as_f(site, "bias")?);
                if w.len() != inner || b.len() != inner {
                    return Err(site.err("weight/bias do not match the normalized shape"));
                }
                Some((
                    w.iter().copied().collect::<Vec<_>>(),
                    b.iter().copied().collect::<Vec<_>>(),
                ))
            }
            _ => None,
        };
        let flat: Vec<f64> = x.iter().copied().collect();
        let mut out = Vec::with_capacity(flat.len());
        for row in flat.chunks(inner.max(1)) {
            let (mean, var) = moments(row);
            let inv = 1.0 / (var + eps).sqrt();
            for (j, &v) in row.iter().enumerate() {
                let y = (v - mean) * inv;
                out.push(match &affine {
                    Some((w, b)) => y * w[j] + b[j],
                    None => y,
                });
            }
        }
        Ok(vec![Value::float(ins[0].dtype, array(site, x.shape(), out)?)])
    }
}

// ---- decompositions ------------------------------------------------------------------

/// A per-channel vector `[C]` reshaped to `[C, 1, ..]` so it broadcasts against `x[N, C, ..]`.
fn per_channel<E: Emitter>(g: &mut E, v: E::Value, xt: &TensorType) -> V<E> {
    if xt.rank() == 2 {
        return Ok(v);
    }
    let mut shape = vec![xt.shape.0[1].clone()];
    shape.extend(std::iter::repeat_n(Dim::Static(1), xt.rank() - 2));
    reshape(g, v, shape)
}

/// `(x - mean) * (scale * rsqrt(var + eps)) + bias`, with the per-channel factor computed on
/// `[C]` before broadcasting.
fn normalize<E: Emitter>(
    g: &mut E,
    x: E::Value,
    xt: &TensorType,
    stats: [E::Value; 2],
    sb: [E::Value; 2],
    eps: f64,
) -> V<E> {
    let ve = g.binary_scalar(BinaryOp::Add, stats[1], eps)?;
    let inv = g.unary(UnaryOp::Rsqrt, ve)?;
    let factor = g.binary(BinaryOp::Mul, sb[0], inv)?;
    let mean_b = per_channel(g, stats[0], xt)?;
    let factor_b = per_channel(g, factor, xt)?;
    let bias_b = per_channel(g, sb[1], xt)?;
    let centered = g.binary(BinaryOp::Sub, x, mean_b)?;
    let scaled = g.binary(BinaryOp::Mul, centered, factor_b)?;
    g.binary(BinaryOp::Add, scaled, bias_b)
}

/// `momentum * running + (1 - momentum) * batch` (Paddle's running-stat rule).
fn blend<E: Emitter>(g: &mut E, running: E::Value, batch: E::Value, momentum: f64) -> V<E> {
    let a = g.binary_scalar(BinaryOp::Mul, running, momentum)?;
    let b = g.binary_scalar(BinaryOp::Mul, batch, 1.0 - momentum)?;
    g.binary(BinaryOp::Add, a, b)
}

fn batch_norm<E: Emitter>(
    g: &mut E,
    x: &[E::Value],
    xt: &TensorType,
    eps: f64,
    momentum: f64,
    training: bool,
) -> Result<Vec<E::Value>, E::Error> {
    let sb = [x[1], x[2]];
    if !training {
        return Ok(vec![normalize(g, x[0], xt, [x[3], x[4]], sb, eps)?]);
    }
    let axes: Vec<usize> = (0..xt.rank()).filter(|&a| a != 1).collect();
    let mean = g.reduce(ReduceOp::Mean, x[0], axes.clone(), false)?;
    let mean_b = per_channel(g, mean, xt)?;
    let centered = g.binary(BinaryOp::Sub, x[0], mean_b)?;
    let sq = g.binary(BinaryOp::Mul, centered, centered)?;
    // Biased variance, as Paddle uses both for normalizing and for the running stat.
    let var = g.reduce(ReduceOp::Mean, sq, axes, false)?;
    let y = normalize(g, x[0], xt, [mean, var], sb, eps)?;
    let rm = blend(g, x[3], mean, momentum)?;
    let rv = blend(g, x[4], var, momentum)?;
    Ok(vec![y, rm, rv])
}

/// `layer_norm(x, weight?, bias?)` over the trailing `n` axes.
fn layer_norm<E: Emitter>(g: &mut E, x: &[E::Value], xt: &TensorType, n: usize, eps: f64) -> V<E> {
    let axes: Vec<usize> = (xt.rank() - n..xt.rank()).collect();
    let mean = g.reduce(ReduceOp::Mean, x[0], axes.clone(), true)?;
    let centered = g.binary(BinaryOp::Sub, x[0], mean)?;
    let sq = g.binary(BinaryOp::Mul, centered, centered)?;
    let var = g.reduce(ReduceOp::Mean, sq, axes, true)?;
    let ve = g.binary_scalar(BinaryOp::Add, var, eps)?;
    let inv = g.unary(UnaryOp::Rsqrt, ve)?;
    let y = g.binary(BinaryOp::Mul, centered, inv)?;
    match (x.get(1), x.get(2)) {
        (Some(&w), Some(&b)) => {
            let yw = g.binary(BinaryOp::Mul, y, w)?;
            g.binary(BinaryOp::Add, yw, b)
        }
        _ => Ok(y),
    }
}

// ---- reference -------------------------------------------------------------------------

/// Mean and biased variance of a slice.
pub(crate) fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var)
}

fn batch_norm_eval(cx: &dyn EvalCx, ins: &[&Value], eps: f64, momentum: f64, training: bool) -> Res<Vec<Value>> {
    let site = cx.site();
    let [x, scale, bias, rmean, rvar] = ins else {
        return Err(site.err(format!("expects 5 operands, got {}", ins.len())));
    };
    let dtype = x.dtype;
    let xa = x.as_f(site, "input")?;
    let shape = xa.shape().to_vec();
    if shape.len() < 2 {
        return Err(site.err(format!("needs x[N,C,..], got {shape:?}")));
    }
    let (n, c, r) = (shape[0], shape[1], shape[2..].iter().product::<usize>());
    let vecs: Vec<Vec<f64>> = [scale, bias, rmean, rvar]
        .iter()
        .zip(["scale", "bias", "running_mean", "running_var"])
        .map(|(v, what)| {
            let a = v.as_f(site, what)?;
            if a.len() != c {
                return Err(site.err(format!("{what} has {} elements, x has {c} channels", a.len())));
            }
            Ok(a.iter().copied().collect())
        })
        .collect::<Res<_>>()?;
    let flat: Vec<f64> = xa.iter().copied().collect();
    let at = |b: usize, ch: usize, j: usize| (b * c + ch) * r + j;
    let mut stats = Vec::with_capacity(c);
    for ch in 0..c {
        stats.push(if training {
            let vals: Vec<f64> = (0..n)
                .flat_map(|b| (0..r).map(move |j| (b, j)))
                .map(|(b, j)| flat[at(b, ch, j)])
                .collect();
            moments(&vals)
        } else {
            (vecs[2][ch], vecs[3][ch])
        });
    }
    let mut y = flat.clone();
    for b in 0..n {
        for (ch, &(mean, var)) in stats.iter().enumerate() {
            let inv = 1.0 / (var + eps).sqrt();
            for j in 0..r {
                let i = at(b, ch, j);
                y[i] = (flat[i] - mean) * inv * vecs[0][ch] + vecs[1][ch];
            }
        }
    }
    let y = Value::float(dtype, array(site, &shape, y)?);
    if !training {
        return Ok(vec![y]);
    }
    let update = |k: usize, pick: fn(&(f64, f64)) -> f64| {
        let v: Vec<f64> = (0..c)
            .map(|ch| momentum * vecs[k][ch] + (1.0 - momentum) * pick(&stats[ch]))
            .collect();
        array(site, &[c], v)
    };
    Ok(vec![
        y,
        Value::float(rmean.dtype, update(2, |s| s.0)?),
        Value::float(rvar.dtype, update(3, |s| s.1)?),
    ])
}
