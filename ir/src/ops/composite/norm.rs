//! Normalizations: `batch_norm` (training and inference), `layer_norm`, `group_norm` and
//! `instance_norm`. Variances are biased (divide by the count).

use super::super::rules::{R, arity, arity_range, elements, float};
use super::super::sample::{Sample, input};
use super::{V, composite_def, one, reshape, vector_of};
use crate::eval::{EvalCx, Res, Value, array};
use crate::ops::{BinaryOp, Composite, Float, OpDef, ReduceOp, UnaryOp, op_struct};
use crate::{DType, Dim, Emitter, Graph, Op, Shape, TensorType};

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

op_struct! {
    /// `group_norm(x[N,C,*], weight[C]?, bias[C]?)`: each sample's channels split into
    /// `num_groups` groups, each group normalized over its channels and spatial positions,
    /// then a per-channel affine (weight and bias both or neither).
    GroupNorm "group_norm" {
        /// Number of groups (divides C).
        num_groups: usize,
        /// Added to the variance.
        epsilon: Float,
    }
}

op_struct! {
    /// `instance_norm(x[N,C,*], weight[C]?, bias[C]?)`: each (sample, channel) normalized over
    /// its spatial positions, then a per-channel affine (no running statistics).
    InstanceNorm "instance_norm" {
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

/// The rule group_norm and instance_norm share: float `x[N, C, *]` (rank ≥ `min_rank`) and an
/// optional per-channel weight and bias.
fn channel_norm_rule(op: &str, inputs: &[TensorType], min_rank: usize) -> R {
    arity_range(inputs, &[1, 3])?;
    let x = &inputs[0];
    float(x)?;
    if x.rank() < min_rank {
        return Err(format!("{op} needs x[N,C,..] of rank ≥ {min_rank}, got {x}"));
    }
    for (t, what) in inputs[1..].iter().zip(["weight", "bias"]) {
        vector_of(t, &x.shape.0[1], &format!("{op} {what}"), x)?;
    }
    Ok(vec![x.clone()])
}

impl OpDef for GroupNorm {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        let out = channel_norm_rule("group_norm", inputs, 2)?;
        let x = &inputs[0];
        let c = x.shape.0[1]
            .as_static()
            .ok_or_else(|| format!("group_norm needs static channels, got {x}"))?;
        if self.num_groups == 0 || c % self.num_groups != 0 {
            return Err(format!(
                "group_norm: {} groups do not divide {c} channels of {x}",
                self.num_groups
            ));
        }
        if !x.shape.0[2..].iter().all(|d| d.as_static().is_some()) {
            return Err(format!("group_norm needs static spatial dims, got {x}"));
        }
        Ok(out)
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(8 * elements(inputs.first()?)?)
    }

    /// `x` viewed as `[N, G, C/G·S]`, normalized over its last axis, viewed back, then the
    /// per-channel affine.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let xt = &types[0];
        let mut run = || -> V<E> {
            let rest: usize = xt.shape.0[1..].iter().filter_map(Dim::as_static).product();
            let groups = self.num_groups;
            let grouped = vec![xt.shape.0[0].clone(), Dim::Static(groups), Dim::Static(rest / groups)];
            let xg = reshape(g, x[0], grouped)?;
            let y = normalize_axes(g, xg, vec![2], self.epsilon.0)?;
            let y = reshape(g, y, xt.shape.0.clone())?;
            channel_affine(g, y, xt, x.get(1).copied(), x.get(2).copied())
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        channel_norm_eval(cx, ins, Some(self.num_groups), self.epsilon.0)
    }

    fn samples() -> Vec<Sample> {
        let gn = |num_groups| {
            Op::Composite(Composite::GroupNorm(GroupNorm {
                num_groups,
                epsilon: Float(1e-5),
            }))
        };
        let f = DType::F32;
        vec![
            Sample::new(
                "group_norm/f32/affine",
                gn(3),
                vec![input(f, &[2, 6, 3, 2]), input(f, &[6]), input(f, &[6])],
            ),
            Sample::new("group_norm/f64/plain", gn(2), vec![input(DType::F64, &[3, 4, 5])]),
            Sample::new("group_norm/f32/one_group", gn(1), vec![input(f, &[2, 4, 3])]),
        ]
    }
}

impl OpDef for InstanceNorm {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        channel_norm_rule("instance_norm", inputs, 3)
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(8 * elements(inputs.first()?)?)
    }

    /// Normalized over the spatial axes (a symbolic size is counted by `reduce_mean`), then
    /// the per-channel affine.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let xt = &types[0];
        let mut run = || -> V<E> {
            let y = normalize_axes(g, x[0], (2..xt.rank()).collect(), self.epsilon.0)?;
            channel_affine(g, y, xt, x.get(1).copied(), x.get(2).copied())
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let c = ins.first().and_then(|x| x.shape().get(1)).copied().unwrap_or(1);
        channel_norm_eval(cx, ins, Some(c), self.epsilon.0)
    }

    fn samples() -> Vec<Sample> {
        let op = Op::Composite(Composite::InstanceNorm(InstanceNorm { epsilon: Float(1e-5) }));
        let f = DType::F32;
        vec![
            Sample::new(
                "instance_norm/f32/affine",
                op.clone(),
                vec![input(f, &[2, 3, 4, 3]), input(f, &[3]), input(f, &[3])],
            ),
            Sample::new("instance_norm/f64/1d", op, vec![input(DType::F64, &[2, 3, 5])]),
        ]
    }
}

// ---- decompositions ------------------------------------------------------------------

/// `(x - mean) · rsqrt(var + eps)` with mean and biased variance over `axes` (kept).
fn normalize_axes<E: Emitter>(g: &mut E, x: E::Value, axes: Vec<usize>, eps: f64) -> V<E> {
    let mean = g.reduce(ReduceOp::Mean, x, axes.clone(), true)?;
    let centered = g.binary(BinaryOp::Sub, x, mean)?;
    let sq = g.binary(BinaryOp::Mul, centered, centered)?;
    let var = g.reduce(ReduceOp::Mean, sq, axes, true)?;
    let ve = g.binary_scalar(BinaryOp::Add, var, eps)?;
    let inv = g.unary(UnaryOp::Rsqrt, ve)?;
    g.binary(BinaryOp::Mul, centered, inv)
}

/// `y · w + b` with `w`, `b` of shape `[C]` on the channel axis (both or neither).
fn channel_affine<E: Emitter>(
    g: &mut E,
    y: E::Value,
    xt: &TensorType,
    w: Option<E::Value>,
    b: Option<E::Value>,
) -> V<E> {
    let (Some(w), Some(b)) = (w, b) else { return Ok(y) };
    let w = per_channel(g, w, xt)?;
    let b = per_channel(g, b, xt)?;
    let yw = g.binary(BinaryOp::Mul, y, w)?;
    g.binary(BinaryOp::Add, yw, b)
}

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

/// group_norm / instance_norm: each sample's channels in `groups` groups (instance norm: one
/// channel each), normalized over the group's channels and positions, then the affine.
fn channel_norm_eval(cx: &dyn EvalCx, ins: &[&Value], groups: Option<usize>, eps: f64) -> Res<Vec<Value>> {
    let site = cx.site();
    crate::eval::arity(site, ins, &[1, 3])?;
    let x = ins[0].as_f(site, "input")?;
    let shape = x.shape().to_vec();
    if shape.len() < 2 {
        return Err(site.err(format!("needs x[N,C,..], got {shape:?}")));
    }
    let (c, r) = (shape[1], shape[2..].iter().product::<usize>());
    let groups = groups.unwrap_or(c);
    if groups == 0 || c % groups != 0 {
        return Err(site.err(format!("{groups} groups do not divide {c} channels")));
    }
    let affine = match ins {
        [_, w, b] => {
            let (w, b) = (w.as_f(site, "weight")?, b.as_f(site, "bias")?);
            if w.len() != c || b.len() != c {
                return Err(site.err(format!("weight/bias must have {c} elements")));
            }
            Some((
                w.iter().copied().collect::<Vec<_>>(),
                b.iter().copied().collect::<Vec<_>>(),
            ))
        }
        _ => None,
    };
    let flat: Vec<f64> = x.iter().copied().collect();
    let per_group = c / groups * r;
    let mut out = Vec::with_capacity(flat.len());
    for (gi, block) in flat.chunks(per_group.max(1)).enumerate() {
        let (mean, var) = moments(block);
        let inv = 1.0 / (var + eps).sqrt();
        for (j, &v) in block.iter().enumerate() {
            let ch = (gi % groups) * (c / groups) + j / r.max(1);
            let y = (v - mean) * inv;
            out.push(match &affine {
                Some((w, b)) => y * w[ch] + b[ch],
                None => y,
            });
        }
    }
    Ok(vec![Value::float(ins[0].dtype, array(site, &shape, out)?)])
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
