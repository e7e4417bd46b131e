//! Movement ops: reshape, permute, broadcast, slice, pad, concat.

use crate::elementwise::view_as;
use crate::value::{Data, Res, Site, Value, float_to_int, map_data};
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use oar_ir::ops::SliceRange;

/// Same elements in row-major order, new shape.
pub(crate) fn reshape(site: &Site, x: &Value, shape: &[usize]) -> Res<Value> {
    let n: usize = shape.iter().product();
    if n != x.shape().iter().product::<usize>() {
        return Err(site.err(format!("cannot reshape {:?} to {shape:?}", x.shape())));
    }
    let data = map_data!(&x.data, a => {
        let flat: Vec<_> = a.iter().cloned().collect();
        ArrayD::from_shape_vec(IxDyn(shape), flat).map_err(|e| site.err(e.to_string()))?
    });
    Ok(x.with(data))
}

/// Output axis `i` is input axis `perm[i]`.
pub(crate) fn permute(site: &Site, x: &Value, perm: &[usize]) -> Res<Value> {
    let rank = x.shape().len();
    let mut seen = vec![false; rank];
    if perm.len() != rank || perm.iter().any(|&p| p >= rank || std::mem::replace(&mut seen[p], true)) {
        return Err(site.err(format!("{perm:?} is not a permutation of {rank} axes")));
    }
    let data = map_data!(&x.data, a => a.view().permuted_axes(IxDyn(perm)).as_standard_layout().into_owned());
    Ok(x.with(data))
}

/// numpy `broadcast_to`.
pub(crate) fn broadcast(site: &Site, x: &Value, shape: &[usize]) -> Res<Value> {
    let data = map_data!(&x.data, a => view_as(site, a, shape)?.to_owned());
    Ok(x.with(data))
}

/// First index, count and step of a Python slice of an axis of `size` (no overflow).
pub(crate) fn resolve_range(r: &SliceRange, size: usize) -> (usize, usize, usize) {
    let size_i = size as i64;
    let clamp = |v: i64| {
        if v < 0 {
            v.saturating_add(size_i).max(0)
        } else {
            v.min(size_i)
        }
    };
    let (s, e) = (clamp(r.start), clamp(r.end));
    let step = r.step.max(1);
    let n = if e > s { (e - s - 1) / step + 1 } else { 0 };
    (s as usize, n as usize, step as usize)
}

/// Strided slice with Python semantics.
pub(crate) fn slice(site: &Site, x: &Value, ranges: &[SliceRange]) -> Res<Value> {
    let shape = x.shape().to_vec();
    if ranges.len() != shape.len() {
        return Err(site.err(format!("{} slice ranges for shape {shape:?}", ranges.len())));
    }
    let slices: Vec<Slice> = ranges
        .iter()
        .zip(&shape)
        .map(|(r, &size)| {
            let (s, n, step) = resolve_range(r, size);
            // End just past the last taken element keeps ndarray within bounds.
            let end = if n == 0 { s } else { s + (n - 1) * step + 1 };
            Slice::new(s as isize, Some(end as isize), step as isize)
        })
        .collect();
    let data = map_data!(&x.data, a => a.slice_each_axis(|ax| slices[ax.axis.index()]).to_owned());
    Ok(x.with(data))
}

/// Constant padding; the fill value converts like a cast (saturating for ints).
pub(crate) fn pad(site: &Site, x: &Value, before: &[usize], after: &[usize], value: f64) -> Res<Value> {
    let shape = x.shape().to_vec();
    if before.len() != shape.len() || after.len() != shape.len() {
        return Err(site.err(format!("pad widths do not match shape {shape:?}")));
    }
    let mut out_shape = Vec::with_capacity(shape.len());
    for i in 0..shape.len() {
        let n = shape[i].checked_add(before[i]).and_then(|n| n.checked_add(after[i]));
        out_shape.push(n.ok_or_else(|| site.err("padded size overflows"))?);
    }
    site.check_size(x.dtype, &out_shape, "padded tensor")?;
    let inner = |ax: ndarray::AxisDescription| {
        Slice::from(before[ax.axis.index()]..before[ax.axis.index()] + shape[ax.axis.index()])
    };
    fn fill<T: Clone>(
        a: &ArrayD<T>,
        shape: &[usize],
        v: T,
        inner: impl Fn(ndarray::AxisDescription) -> Slice,
    ) -> ArrayD<T> {
        let mut out = ArrayD::from_elem(IxDyn(shape), v);
        out.slice_each_axis_mut(inner).assign(a);
        out
    }
    let data = match &x.data {
        Data::F(a) => Data::F(fill(a, &out_shape, value, inner)),
        Data::I(a) => Data::I(fill(a, &out_shape, float_to_int(x.dtype, value), inner)),
        Data::B(a) => Data::B(fill(a, &out_shape, value != 0.0, inner)),
    };
    Ok(x.with(data))
}

/// Concatenate along `axis`.
pub(crate) fn concat(site: &Site, xs: &[&Value], axis: usize) -> Res<Value> {
    let first = xs.first().ok_or_else(|| site.err("concat needs at least one input"))?;
    if axis >= first.shape().len() {
        return Err(site.err(format!("axis {axis} out of range for {:?}", first.shape())));
    }
    let fail = |e: ndarray::ShapeError| site.err(format!("cannot concat along axis {axis}: {e}"));
    let mismatch = || site.err("concat operands have different dtypes");
    let data = match &first.data {
        Data::F(_) => {
            let v: Option<Vec<_>> = xs
                .iter()
                .map(|x| if let Data::F(a) = &x.data { Some(a.view()) } else { None })
                .collect();
            Data::F(ndarray::concatenate(Axis(axis), &v.ok_or_else(mismatch)?).map_err(fail)?)
        }
        Data::I(_) => {
            let v: Option<Vec<_>> = xs
                .iter()
                .map(|x| if let Data::I(a) = &x.data { Some(a.view()) } else { None })
                .collect();
            Data::I(ndarray::concatenate(Axis(axis), &v.ok_or_else(mismatch)?).map_err(fail)?)
        }
        Data::B(_) => {
            let v: Option<Vec<_>> = xs
                .iter()
                .map(|x| if let Data::B(a) = &x.data { Some(a.view()) } else { None })
                .collect();
            Data::B(ndarray::concatenate(Axis(axis), &v.ok_or_else(mismatch)?).map_err(fail)?)
        }
    };
    Ok(first.with(data))
}
