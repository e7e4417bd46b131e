//! Gather and scatter along one axis (ONNX Gather and its transpose).
//!
//! Negative indices count from the end; an index outside `[-n, n)` is a runtime error.
//! `scatter(replace)` applies updates in row-major order of `updates`, so with repeated
//! indices the last one wins; `scatter(add)` sums them.

use crate::value::{Data, Res, Site, Value};
use ndarray::{ArrayD, IxDyn};
use oar_ir::ops::ScatterReduce;

/// Indices normalized to `[0, n)`.
pub(crate) fn normalize_indices(site: &Site, idx: &Value, n: usize, what: &str) -> Res<Vec<usize>> {
    let a = idx.as_i(site, "indices")?;
    let n_i = n as i64;
    a.iter()
        .map(|&k| {
            let j = if k < 0 { k + n_i } else { k };
            if (0..n_i).contains(&j) {
                Ok(j as usize)
            } else {
                Err(site.err(format!("index {k} is out of range for {what} of size {n}")))
            }
        })
        .collect()
}

/// `(outer, n, inner)` around `axis` of `shape`.
fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

/// Gather's output shape: `data[..axis] ++ indices ++ data[axis+1..]`.
fn gather_shape(data: &[usize], idx: &[usize], axis: usize) -> Vec<usize> {
    let mut s = data[..axis].to_vec();
    s.extend_from_slice(idx);
    s.extend_from_slice(&data[axis + 1..]);
    s
}

fn gather_flat<T: Clone>(flat: &[T], ks: &[usize], (outer, n, inner): (usize, usize, usize)) -> Vec<T> {
    let mut out = Vec::with_capacity(outer * ks.len() * inner);
    for o in 0..outer {
        for &k in ks {
            let start = (o * n + k) * inner;
            out.extend_from_slice(&flat[start..start + inner]);
        }
    }
    out
}

/// `gather(data, indices)` along `axis`.
pub(crate) fn gather(site: &Site, data: &Value, idx: &Value, axis: usize) -> Res<Value> {
    let shape = data.shape().to_vec();
    if axis >= shape.len() {
        return Err(site.err(format!("axis {axis} out of range for {shape:?}")));
    }
    let ks = normalize_indices(site, idx, shape[axis], &format!("axis {axis}"))?;
    let out_shape = gather_shape(&shape, idx.shape(), axis);
    site.check_size(data.dtype, &out_shape, "gathered tensor")?;
    let parts = split(&shape, axis);
    let build = |e: ndarray::ShapeError| site.err(e.to_string());
    let out = match &data.data {
        Data::F(a) => Data::F(
            ArrayD::from_shape_vec(
                IxDyn(&out_shape),
                gather_flat(&a.iter().copied().collect::<Vec<_>>(), &ks, parts),
            )
            .map_err(build)?,
        ),
        Data::I(a) => Data::I(
            ArrayD::from_shape_vec(
                IxDyn(&out_shape),
                gather_flat(&a.iter().copied().collect::<Vec<_>>(), &ks, parts),
            )
            .map_err(build)?,
        ),
        Data::B(a) => Data::B(
            ArrayD::from_shape_vec(
                IxDyn(&out_shape),
                gather_flat(&a.iter().copied().collect::<Vec<_>>(), &ks, parts),
            )
            .map_err(build)?,
        ),
    };
    Ok(data.with(out))
}

fn scatter_flat<T: Copy>(
    flat: &mut [T],
    upd: &[T],
    ks: &[usize],
    (outer, n, inner): (usize, usize, usize),
    combine: impl Fn(T, T) -> T,
) {
    let mut u = 0;
    for o in 0..outer {
        for &k in ks {
            let start = (o * n + k) * inner;
            for j in 0..inner {
                flat[start + j] = combine(flat[start + j], upd[u]);
                u += 1;
            }
        }
    }
}

/// `scatter(data, indices, updates)` along `axis`.
pub(crate) fn scatter(
    site: &Site,
    data: &Value,
    idx: &Value,
    upd: &Value,
    axis: usize,
    reduce: ScatterReduce,
) -> Res<Value> {
    let shape = data.shape().to_vec();
    if axis >= shape.len() {
        return Err(site.err(format!("axis {axis} out of range for {shape:?}")));
    }
    let want = gather_shape(&shape, idx.shape(), axis);
    if upd.shape() != want.as_slice() || upd.dtype != data.dtype {
        return Err(site.err(format!(
            "updates {}{:?} must be {}{want:?}",
            upd.dtype,
            upd.shape(),
            data.dtype
        )));
    }
    let ks = normalize_indices(site, idx, shape[axis], &format!("axis {axis}"))?;
    let parts = split(&shape, axis);
    let add = reduce == ScatterReduce::Add;
    let build = |e: ndarray::ShapeError| site.err(e.to_string());
    let out = match (&data.data, &upd.data) {
        (Data::F(a), Data::F(u)) => {
            let mut flat: Vec<f64> = a.iter().copied().collect();
            let upd: Vec<f64> = u.iter().copied().collect();
            scatter_flat(&mut flat, &upd, &ks, parts, |x, y| if add { x + y } else { y });
            Data::F(ArrayD::from_shape_vec(IxDyn(&shape), flat).map_err(build)?)
        }
        (Data::I(a), Data::I(u)) => {
            let mut flat: Vec<i64> = a.iter().copied().collect();
            let upd: Vec<i64> = u.iter().copied().collect();
            scatter_flat(
                &mut flat,
                &upd,
                &ks,
                parts,
                |x, y| if add { x.wrapping_add(y) } else { y },
            );
            Data::I(ArrayD::from_shape_vec(IxDyn(&shape), flat).map_err(build)?)
        }
        (Data::B(a), Data::B(u)) => {
            // Adding bools is logical or.
            let mut flat: Vec<bool> = a.iter().copied().collect();
            let upd: Vec<bool> = u.iter().copied().collect();
            scatter_flat(&mut flat, &upd, &ks, parts, |x, y| if add { x | y } else { y });
            Data::B(ArrayD::from_shape_vec(IxDyn(&shape), flat).map_err(build)?)
        }
        _ => return Err(site.err("data and updates have different dtypes")),
    };
    Ok(data.with(out))
}
