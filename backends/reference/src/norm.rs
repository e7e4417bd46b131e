//! Normalizations and losses: batch_norm, layer_norm, softmax, log_softmax, cross_entropy.
//!
//! Variances are biased (divide by the count). Softmax subtracts the lane max first.

use crate::value::{Res, Site, Value};
use ndarray::{ArrayD, Axis, IxDyn};
use oar_ir::ops::Reduction;

/// Softmax (or log-softmax) of each lane along `axis`.
pub(crate) fn softmax_f64(a: &ArrayD<f64>, axis: usize, log: bool) -> ArrayD<f64> {
    let mut out = a.clone();
    for mut lane in out.lanes_mut(Axis(axis)) {
        let max = lane.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f64 = lane.iter().map(|&v| (v - max).exp()).sum();
        if log {
            let lse = sum.ln();
            lane.mapv_inplace(|v| v - max - lse);
        } else {
            lane.mapv_inplace(|v| (v - max).exp() / sum);
        }
    }
    out
}

/// `softmax` / `log_softmax` along `axis`.
pub(crate) fn softmax(site: &Site, x: &Value, axis: usize, log: bool) -> Res<Value> {
    let a = x.as_f(site, "softmax input")?;
    if axis >= a.ndim() {
        return Err(site.err(format!("axis {axis} out of range for {:?}", a.shape())));
    }
    Ok(Value::float(x.dtype, softmax_f64(a, axis, log)))
}

/// `cross_entropy(logits[N,C], labels[N])`; a label outside `[0, C)` is an error.
pub(crate) fn cross_entropy(site: &Site, logits: &Value, labels: &Value, reduction: Reduction) -> Res<Value> {
    let x = logits.as_f(site, "logits")?;
    let l = labels.as_i(site, "labels")?;
    let (n, c) = match x.shape() {
        [n, c] if l.shape() == [*n] => (*n, *c),
        s => {
            return Err(site.err(format!(
                "needs logits[N,C] and labels[N], got {s:?} and {:?}",
                l.shape()
            )));
        }
    };
    let logp = softmax_f64(x, 1, true);
    let mut losses = Vec::with_capacity(n);
    for (i, &label) in l.iter().enumerate() {
        if label < 0 || label as u64 >= c as u64 {
            return Err(site.err(format!("label {label} at row {i} is out of range for {c} classes")));
        }
        losses.push(-logp[[i, label as usize]]);
    }
    let out = match reduction {
        Reduction::None => ArrayD::from_shape_vec(IxDyn(&[n]), losses),
        Reduction::Sum => Ok(ArrayD::from_elem(IxDyn(&[]), losses.iter().sum())),
        Reduction::Mean => Ok(ArrayD::from_elem(IxDyn(&[]), losses.iter().sum::<f64>() / n as f64)),
    };
    Ok(Value::float(logits.dtype, out.map_err(|e| site.err(e.to_string()))?))
}

/// Mean and biased variance of a slice.
fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var)
}

/// `layer_norm(x, weight?, bias?)` over the last `k` axes.
pub(crate) fn layer_norm(site: &Site, ins: &[&Value], k: usize, eps: f64) -> Res<Value> {
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
    let a = ArrayD::from_shape_vec(x.raw_dim(), out).map_err(|e| site.err(e.to_string()))?;
    Ok(Value::float(ins[0].dtype, a))
}

/// `batch_norm(x[N,C,*], scale, bias, running_mean, running_var)`.
pub(crate) fn batch_norm(site: &Site, ins: &[&Value], eps: f64, momentum: f64, training: bool) -> Res<Vec<Value>> {
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
    let y = Value::float(
        dtype,
        ArrayD::from_shape_vec(IxDyn(&shape), y).map_err(|e| site.err(e.to_string()))?,
    );
    if !training {
        return Ok(vec![y]);
    }
    let update = |k: usize, pick: fn(&(f64, f64)) -> f64| {
        let v: Vec<f64> = (0..c)
            .map(|ch| momentum * vecs[k][ch] + (1.0 - momentum) * pick(&stats[ch]))
            .collect();
        ArrayD::from_shape_vec(IxDyn(&[c]), v).map_err(|e| site.err(e.to_string()))
    };
    Ok(vec![
        y,
        Value::float(rmean.dtype, update(2, |s| s.0)?),
        Value::float(rvar.dtype, update(3, |s| s.1)?),
    ])
}
