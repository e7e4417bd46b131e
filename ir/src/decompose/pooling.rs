//! Pooling as sums/maxima of strided slices (fixed windows) or of per-cell slices (adaptive).

use super::build::{V, dims, lowest, reshape, slice, unsupported};
use crate::ops::{BinaryOp, ReduceOp, SliceRange};
use crate::{DType, Dim, Emitter, Op, TensorData, TensorType};

/// The window of a fixed-size pooling.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    /// (kh, kw)
    pub kernel: [usize; 2],
    /// (sh, sw)
    pub stride: [usize; 2],
    /// (top, left, bottom, right)
    pub padding: [usize; 4],
}

/// Static spatial sizes `(in, out)` for axes H and W.
fn spatial(x: &TensorType, y: &TensorType, op: &str) -> Result<[(usize, usize); 2], crate::IrError> {
    let get = |t: &TensorType, i: usize| t.shape.0[2 + i].as_static();
    let mut r = [(0, 0); 2];
    for (i, slot) in r.iter_mut().enumerate() {
        *slot = match (get(x, i), get(y, i)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(unsupported(op, format!("needs static spatial dims, got {x}"))),
        };
    }
    Ok(r)
}

/// Pad `x` (with `fill`) so that every one of the `out` windows lies inside, then return the
/// `kh * kw` strided slices whose elementwise combination is the pooling.
fn window_slices<E: Emitter>(
    g: &mut E,
    x: E::Value,
    sizes: [(usize, usize); 2],
    w: Window,
    fill: f64,
    op: &str,
) -> Result<Vec<E::Value>, E::Error> {
    let mut after = [0usize; 2];
    for i in 0..2 {
        let (inp, out) = sizes[i];
        let padded = inp + w.padding[i] + w.padding[i + 2];
        // ceil_mode: the last window may hang past the explicit padding; extend with `fill`.
        let need = (out - 1) * w.stride[i] + w.kernel[i];
        after[i] = w.padding[i + 2] + need.saturating_sub(padded);
    }
    let padded = if w.padding[..2].iter().chain(&after).any(|&p| p > 0) {
        let pad = Op::Pad {
            before: vec![0, 0, w.padding[0], w.padding[1]],
            after: vec![0, 0, after[0], after[1]],
            value: crate::Float(fill),
        };
        g.add_op1(pad, &[x])?
    } else {
        x
    };
    let range = |start: usize, i: usize| SliceRange {
        start: start as i64,
        end: (start + (sizes[i].1 - 1) * w.stride[i] + 1) as i64,
        step: w.stride[i] as i64,
    };
    let mut parts = Vec::with_capacity(w.kernel[0] * w.kernel[1]);
    for di in 0..w.kernel[0] {
        for dj in 0..w.kernel[1] {
            let ranges = vec![SliceRange::FULL, SliceRange::FULL, range(di, 0), range(dj, 1)];
            parts.push(slice(g, padded, ranges)?);
        }
    }
    if parts.is_empty() {
        return Err(unsupported(op, "empty pooling window".into()).into());
    }
    Ok(parts)
}

/// Combine values pairwise with `op` (a balanced tree keeps the dependency chains short).
fn combine<E: Emitter>(g: &mut E, op: BinaryOp, mut vals: Vec<E::Value>) -> V<E> {
    while vals.len() > 1 {
        let mut next = Vec::with_capacity(vals.len().div_ceil(2));
        for pair in vals.chunks(2) {
            next.push(match pair {
                [a, b] => g.binary(op, *a, *b)?,
                [a] => *a,
                _ => unreachable!("chunks(2)"),
            });
        }
        vals = next;
    }
    Ok(vals[0])
}

/// `max_pool2d`: maximum of the window slices of the input padded with the dtype's lowest value.
pub(super) fn max_pool2d<E: Emitter>(
    g: &mut E,
    x: E::Value,
    xt: &TensorType,
    yt: &TensorType,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
) -> V<E> {
    let sizes = spatial(xt, yt, "max_pool2d")?;
    let w = Window {
        kernel,
        stride,
        padding,
    };
    let parts = window_slices(g, x, sizes, w, lowest(xt.dtype), "max_pool2d")?;
    // Bool has no numeric max; "any" is its maximum.
    let op = if xt.dtype == DType::Bool {
        BinaryOp::Or
    } else {
        BinaryOp::Max
    };
    combine(g, op, parts)
}

/// `avg_pool2d`: sum of the window slices of the zero-padded input over a per-cell divisor,
/// a constant since the spatial shape is static. The divisor follows PyTorch (as the reference
/// backend does): the window clipped to the input (`count_include_pad = false`) or to the
/// padded extent `[-pad_before, size + pad_after)`, which is `kh * kw` except for ceil-mode
/// windows hanging past the padding.
pub(super) fn avg_pool2d<E: Emitter>(
    g: &mut E,
    x: E::Value,
    xt: &TensorType,
    yt: &TensorType,
    w: Window,
    count_include_pad: bool,
) -> V<E> {
    let sizes = spatial(xt, yt, "avg_pool2d")?;
    let parts = window_slices(g, x, sizes, w, 0.0, "avg_pool2d")?;
    let sum = combine(g, BinaryOp::Add, parts)?;
    let count = |i: usize, o: usize| {
        let start = (o * w.stride[i]) as i64 - w.padding[i] as i64;
        let end = start + w.kernel[i] as i64;
        let (lo, hi) = if count_include_pad {
            (start, (sizes[i].0 + w.padding[i + 2]) as i64)
        } else {
            (0, sizes[i].0 as i64)
        };
        (end.min(hi) - start.max(lo)).max(0) as f64
    };
    let (oh, ow) = (sizes[0].1, sizes[1].1);
    let mut div = Vec::with_capacity(oh * ow);
    for i in 0..oh {
        for j in 0..ow {
            div.push(count(0, i) * count(1, j));
        }
    }
    if div.iter().all(|&d| d == div[0]) {
        return g.binary_scalar(BinaryOp::Div, sum, div[0]);
    }
    let data = TensorData::from_f64_slice(xt.dtype, vec![oh, ow], &div)
        .map_err(|e| unsupported("avg_pool2d", format!("divisor constant: {e}")))?;
    let div = g.add_constant(data)?;
    g.binary(BinaryOp::Div, sum, div)
}

/// Adaptive pooling, one spatial axis at a time (a mean/max over a rectangle is the mean/max
/// over rows of the mean/max over columns). PyTorch's windows: `[⌊i·in/out⌋, ⌈(i+1)·in/out⌉)`.
pub(super) fn adaptive_pool2d<E: Emitter>(g: &mut E, x: E::Value, xt: &TensorType, out: [usize; 2], max: bool) -> V<E> {
    // Bool has no numeric reduction: take the max as u8 and cast back.
    let x0 = if xt.dtype == DType::Bool {
        g.cast(x, DType::U8)?
    } else {
        x
    };
    let op = if max { ReduceOp::Max } else { ReduceOp::Mean };
    let mut y = x0;
    for (i, &o) in out.iter().enumerate() {
        y = adaptive_axis(g, y, 2 + i, o, op)?;
    }
    g.cast(y, xt.dtype)
}

fn adaptive_axis<E: Emitter>(g: &mut E, x: E::Value, axis: usize, out: usize, op: ReduceOp) -> V<E> {
    let d = dims(g, x);
    let inp = d[axis]
        .as_static()
        .ok_or_else(|| unsupported("adaptive_pool2d", "needs a static spatial axis".into()))?;
    if inp == out {
        return Ok(x);
    }
    if inp % out == 0 {
        // Equal, disjoint windows: split the axis into [out, in/out] and reduce the inner part.
        let mut split = d[..axis].to_vec();
        split.extend([Dim::Static(out), Dim::Static(inp / out)]);
        split.extend(d[axis + 1..].iter().cloned());
        let r = reshape(g, x, split)?;
        return g.reduce(op, r, vec![axis + 1], false);
    }
    let mut cells = Vec::with_capacity(out);
    for i in 0..out {
        let start = i * inp / out;
        let end = ((i + 1) * inp).div_ceil(out);
        let mut ranges = vec![SliceRange::FULL; d.len()];
        ranges[axis] = SliceRange::new(start as i64, end as i64);
        let s = slice(g, x, ranges)?;
        cells.push(g.reduce(op, s, vec![axis], true)?);
    }
    g.add_op1(Op::Concat { axis }, &cells)
}
