//! Reductions (sum, max, min, prod, mean) and arg-reductions (first occurrence).
//!
//! Float max/min propagate NaN; argmax/argmin treat NaN as the extremum and return the first
//! NaN (numpy). Integer sum/prod wrap. Sum of nothing is 0, product 1, mean NaN; max/min of
//! nothing is an error (numpy: "zero-size array ... has no identity").

use crate::value::{Data, Res, Site, Value};
use ndarray::{ArrayD, IxDyn};
use oar_ir::DType;
use oar_ir::ops::{ArgReduceOp, ReduceOp};

/// The rows of `a` to reduce: `a` with the kept axes first, flattened to `[outer][inner]`;
/// returns the rows and the output shape.
fn rows<T: Clone>(site: &Site, a: &ArrayD<T>, axes: &[usize], keepdim: bool) -> Res<(Vec<Vec<T>>, Vec<usize>)> {
    let rank = a.ndim();
    if axes.iter().any(|&x| x >= rank) {
        return Err(site.err(format!("axes {axes:?} out of range for rank {rank}")));
    }
    let kept: Vec<usize> = (0..rank).filter(|i| !axes.contains(i)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let inner: usize = axes.iter().map(|&i| a.shape()[i]).product();
    let outer: usize = kept.iter().map(|&i| a.shape()[i]).product();
    let flat: Vec<T> = a.view().permuted_axes(IxDyn(&perm)).iter().cloned().collect();
    let rows = (0..outer).map(|o| flat[o * inner..(o + 1) * inner].to_vec()).collect();
    let mut shape = Vec::new();
    for (i, &d) in a.shape().iter().enumerate() {
        if !axes.contains(&i) {
            shape.push(d);
        } else if keepdim {
            shape.push(1);
        }
    }
    Ok((rows, shape))
}

fn build<T>(site: &Site, shape: Vec<usize>, v: Vec<T>) -> Res<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| site.err(e.to_string()))
}

/// `reduce_*` over `axes`.
pub(crate) fn reduce(site: &Site, op: ReduceOp, x: &Value, axes: &[usize], keepdim: bool) -> Res<Value> {
    let empty = || site.err(format!("{} over an empty axis has no identity", op.name()));
    let data = match &x.data {
        Data::F(a) => {
            let (rows, shape) = rows(site, a, axes, keepdim)?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                out.push(match op {
                    ReduceOp::Sum => r.iter().sum(),
                    ReduceOp::Prod => r.iter().product(),
                    ReduceOp::Mean => r.iter().sum::<f64>() / r.len() as f64,
                    ReduceOp::Max | ReduceOp::Min => {
                        let first = *r.first().ok_or_else(empty)?;
                        r.iter().fold(first, |acc, &v| {
                            if acc.is_nan() || v.is_nan() {
                                f64::NAN
                            } else if op == ReduceOp::Max {
                                acc.max(v)
                            } else {
                                acc.min(v)
                            }
                        })
                    }
                });
            }
            Data::F(build(site, shape, out)?)
        }
        Data::I(a) if op != ReduceOp::Mean => {
            let (rows, shape) = rows(site, a, axes, keepdim)?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                out.push(match op {
                    ReduceOp::Sum => r.iter().fold(0i64, |s, &v| s.wrapping_add(v)),
                    ReduceOp::Prod => r.iter().fold(1i64, |s, &v| s.wrapping_mul(v)),
                    ReduceOp::Max => *r.iter().max().ok_or_else(empty)?,
                    _ => *r.iter().min().ok_or_else(empty)?,
                });
            }
            Data::I(build(site, shape, out)?)
        }
        _ => return Err(site.err(format!("{} is not defined for {}", op.name(), x.dtype))),
    };
    Ok(x.with(data))
}

/// Index of the first extremum in `r`; `better(v, best)` says `v` beats `best`.
fn arg<T: Copy>(r: &[T], better: impl Fn(T, T) -> bool) -> Option<i64> {
    let mut best = 0usize;
    for i in 1..r.len() {
        if better(r[i], r[best]) {
            best = i;
        }
    }
    (!r.is_empty()).then_some(best as i64)
}

/// `argmax` / `argmin` along `axis`, as i64.
pub(crate) fn arg_reduce(site: &Site, op: ArgReduceOp, x: &Value, axis: usize, keepdim: bool) -> Res<Value> {
    let max = op == ArgReduceOp::ArgMax;
    let empty = || site.err(format!("{} over an empty axis {axis}", op.name()));
    let (out, shape) = match &x.data {
        Data::F(a) => {
            let (rows, shape) = rows(site, a, &[axis], keepdim)?;
            // NaN beats everything except an earlier NaN.
            let better = |v: f64, b: f64| !b.is_nan() && (v.is_nan() || if max { v > b } else { v < b });
            let out: Option<Vec<i64>> = rows.iter().map(|r| arg(r, better)).collect();
            (out, shape)
        }
        Data::I(a) => {
            let (rows, shape) = rows(site, a, &[axis], keepdim)?;
            let out: Option<Vec<i64>> = rows
                .iter()
                .map(|r| arg(r, |v, b| if max { v > b } else { v < b }))
                .collect();
            (out, shape)
        }
        Data::B(a) => {
            let (rows, shape) = rows(site, a, &[axis], keepdim)?;
            let out: Option<Vec<i64>> = rows
                .iter()
                .map(|r| arg(r, |v, b| if max { v & !b } else { !v & b }))
                .collect();
            (out, shape)
        }
    };
    Ok(Value::int(DType::I64, build(site, shape, out.ok_or_else(empty)?)?))
}
