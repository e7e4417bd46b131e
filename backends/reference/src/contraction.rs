//! Contractions: batched matmul (batch dims broadcast) and N-d convolution.
//!
//! Float matmul uses ndarray's `dot` (matrixmultiply) on f64; integer matmul wraps.
//! Convolution is a direct loop (cross-correlation, like every framework's "conv").

use crate::elementwise::broadcast_dims;
use crate::value::{Data, Res, Site, Value};
use ndarray::{Array2, ArrayD, ArrayView2, Axis, Ix2, IxDyn};

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// For each output batch index, the batch index into an operand with batch dims `own`
/// broadcast to `out` (size-1 dims repeat).
fn batch_map(own: &[usize], out: &[usize]) -> Vec<usize> {
    let total: usize = out.iter().product();
    let off = out.len() - own.len();
    let own_strides = strides(own);
    (0..total)
        .map(|flat| {
            let mut rem = flat;
            let mut idx = 0;
            for (d, &size) in out.iter().enumerate().rev() {
                let i = rem % size;
                rem /= size;
                if d >= off && own[d - off] != 1 {
                    idx += i * own_strides[d - off];
                }
            }
            idx
        })
        .collect()
}

/// Batched product of `a[.., m, k]` and `b[.., k, n]` for any element type.
fn batched<T: Clone + Default>(
    site: &Site,
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    mm: impl Fn(ArrayView2<T>, ArrayView2<T>) -> Array2<T>,
) -> Res<ArrayD<T>> {
    let (ra, rb) = (a.ndim(), b.ndim());
    if ra < 2 || rb < 2 {
        return Err(site.err(format!("matmul needs rank ≥ 2, got {:?} x {:?}", a.shape(), b.shape())));
    }
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    if k != k2 {
        return Err(site.err(format!("matmul inner dims differ: {:?} x {:?}", a.shape(), b.shape())));
    }
    let (ba, bb) = (&a.shape()[..ra - 2], &b.shape()[..rb - 2]);
    let batch = broadcast_dims(site, ba, bb)?;
    let mut out_shape = batch.clone();
    out_shape.extend([m, n]);
    let fail = |e: ndarray::ShapeError| site.err(e.to_string());
    let a3 = a
        .as_standard_layout()
        .into_shape_with_order(IxDyn(&[ba.iter().product(), m, k]))
        .map_err(fail)?;
    let b3 = b
        .as_standard_layout()
        .into_shape_with_order(IxDyn(&[bb.iter().product(), k, n]))
        .map_err(fail)?;
    let (ia, ib) = (batch_map(ba, &batch), batch_map(bb, &batch));
    let mut out = Vec::with_capacity(ia.len() * m * n);
    for (&i, &j) in ia.iter().zip(&ib) {
        let x = a3.index_axis(Axis(0), i).into_dimensionality::<Ix2>().map_err(fail)?;
        let y = b3.index_axis(Axis(0), j).into_dimensionality::<Ix2>().map_err(fail)?;
        out.extend(mm(x, y).iter().cloned());
    }
    ArrayD::from_shape_vec(IxDyn(&out_shape), out).map_err(fail)
}

/// Batched float matmul on f64 arrays (used by composites too).
pub(crate) fn matmul_f64(site: &Site, a: &ArrayD<f64>, b: &ArrayD<f64>) -> Res<ArrayD<f64>> {
    batched(site, a, b, |x, y| x.dot(&y))
}

/// Integer matmul with wrapping accumulation.
fn int_mm(x: ArrayView2<i64>, y: ArrayView2<i64>) -> Array2<i64> {
    let (m, k, n) = (x.nrows(), x.ncols(), y.ncols());
    Array2::from_shape_fn((m, n), |(i, j)| {
        (0..k).fold(0i64, |acc, p| acc.wrapping_add(x[(i, p)].wrapping_mul(y[(p, j)])))
    })
}

/// `matmul(a, b)`.
pub(crate) fn matmul(site: &Site, a: &Value, b: &Value) -> Res<Value> {
    let data = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) if a.dtype == b.dtype => Data::F(matmul_f64(site, x, y)?),
        (Data::I(x), Data::I(y)) if a.dtype == b.dtype => Data::I(batched(site, x, y, int_mm)?),
        _ => return Err(site.err(format!("matmul is not defined for {} x {}", a.dtype, b.dtype))),
    };
    Ok(a.with(data))
}

/// Convolution attributes (one entry per spatial axis).
pub(crate) struct ConvSpec<'a> {
    /// Stride.
    pub stride: &'a [usize],
    /// Padding before.
    pub pad_before: &'a [usize],
    /// Padding after.
    pub pad_after: &'a [usize],
    /// Dilation.
    pub dilation: &'a [usize],
    /// Groups.
    pub groups: usize,
}

/// N-d convolution `x[N, C, *S]` ⋆ `w[O, C/groups, *K]` → `[N, O, *out]` on f64 arrays.
pub(crate) fn conv_f64(site: &Site, x: &ArrayD<f64>, w: &ArrayD<f64>, spec: &ConvSpec) -> Res<ArrayD<f64>> {
    let (xs, ws) = (x.shape(), w.shape());
    let sp = xs.len().saturating_sub(2);
    let bad = |what: &str| site.err(format!("conv {what}: x {xs:?}, w {ws:?}"));
    if sp == 0 || ws.len() != xs.len() {
        return Err(bad("needs x[N,C,*S] and w[O,C/g,*K] of equal rank ≥ 3"));
    }
    if [
        spec.stride.len(),
        spec.pad_before.len(),
        spec.pad_after.len(),
        spec.dilation.len(),
    ]
    .iter()
    .any(|&l| l != sp)
    {
        return Err(bad("attributes need one entry per spatial axis"));
    }
    let (n, c, o, cg) = (xs[0], xs[1], ws[0], ws[1]);
    let g = spec.groups;
    if g == 0 || c % g != 0 || o % g != 0 || cg != c / g || spec.stride.contains(&0) || spec.dilation.contains(&0) {
        return Err(bad(&format!("channels/groups/stride/dilation (groups {g})")));
    }
    let (sin, kdims) = (&xs[2..], &ws[2..]);
    let mut sout = Vec::with_capacity(sp);
    for i in 0..sp {
        let span = kdims[i]
            .checked_sub(1)
            .and_then(|k| k.checked_mul(spec.dilation[i]))
            .map(|s| s + 1);
        let padded = sin[i]
            .checked_add(spec.pad_before[i])
            .and_then(|v| v.checked_add(spec.pad_after[i]));
        match (span, padded) {
            (Some(s), Some(p)) if p >= s => sout.push((p - s) / spec.stride[i] + 1),
            _ => return Err(bad(&format!("window does not fit on spatial axis {i}"))),
        }
    }
    let mut out_shape = vec![n, o];
    out_shape.extend(&sout);
    site.check_size(oar_ir::DType::F64, &out_shape, "conv output")?;
    let xf: Vec<f64> = x.iter().copied().collect();
    let wf: Vec<f64> = w.iter().copied().collect();
    let (sin_n, k_n, out_n): (usize, usize, usize) =
        (sin.iter().product(), kdims.iter().product(), sout.iter().product());
    let (sin_str, k_str, out_str) = (strides(sin), strides(kdims), strides(&sout));
    let og = o / g;
    let mut out = vec![0.0f64; n * o * out_n];
    // Input offset (within one channel plane) per kernel position for the current output
    // position; None where the tap falls in the padding.
    let mut taps: Vec<Option<usize>> = vec![None; k_n];
    for p in 0..out_n {
        for (kp, tap) in taps.iter_mut().enumerate() {
            let mut off = 0usize;
            let mut inside = true;
            for d in 0..sp {
                let op = (p / out_str[d]) % sout[d];
                let kd = (kp / k_str[d]) % kdims[d];
                let pos = (op * spec.stride[d] + kd * spec.dilation[d]) as i64 - spec.pad_before[d] as i64;
                if pos < 0 || pos >= sin[d] as i64 {
                    inside = false;
                    break;
                }
                off += pos as usize * sin_str[d];
            }
            *tap = inside.then_some(off);
        }
        for b in 0..n {
            for oc in 0..o {
                let grp = oc / og;
                let mut acc = 0.0;
                for cl in 0..cg {
                    let xbase = (b * c + grp * cg + cl) * sin_n;
                    let wbase = (oc * cg + cl) * k_n;
                    for (kp, tap) in taps.iter().enumerate() {
                        if let Some(off) = tap {
                            acc += xf[xbase + off] * wf[wbase + kp];
                        }
                    }
                }
                out[(b * o + oc) * out_n + p] = acc;
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&out_shape), out).map_err(|e| site.err(e.to_string()))
}

/// `conv(x, w)`.
pub(crate) fn conv(site: &Site, x: &Value, w: &Value, spec: &ConvSpec) -> Res<Value> {
    let xa = x.as_f(site, "conv input")?;
    let wa = w.as_f(site, "conv weight")?;
    Ok(x.with(Data::F(conv_f64(site, xa, wa, spec)?)))
}
