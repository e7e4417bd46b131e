//! 2-d pooling: max/avg with kernel, stride, padding and ceil mode, and adaptive max/avg.
//!
//! Windows follow PyTorch. Regular pooling: output `i` covers `[i*s - pad_before,
//! i*s - pad_before + k)`, clipped to the input; with `ceil_mode` the last window must start
//! inside the input or the leading padding. Max ignores the (implicit -inf) padding and
//! propagates NaN. Average divides by the in-bounds count, or with `count_include_pad` by the
//! window clipped to the padded extent `[-pad_before, size + pad_after)` (PyTorch's divisor,
//! which differs from `kh*kw` only for ceil-mode windows hanging past the padding).
//! Adaptive pooling: output `i` covers `[floor(i*in/out), ceil((i+1)*in/out))`.

use crate::value::{Data, Res, Site, Value};
use ndarray::{ArrayD, IxDyn};

/// One window along one axis: in-bounds `[start, end)` and its count_include_pad length.
#[derive(Clone, Copy, Debug)]
struct Win {
    start: usize,
    end: usize,
    padded_len: usize,
}

/// Windows of a regular pooling along one axis.
fn windows(site: &Site, inp: usize, k: usize, s: usize, pb: usize, pa: usize, ceil: bool) -> Res<Vec<Win>> {
    let total = inp.checked_add(pb).and_then(|t| t.checked_add(pa)).unwrap_or(0);
    if k == 0 || s == 0 || total < k {
        return Err(site.err(format!(
            "pool window {k} stride {s} does not fit size {inp} padded ({pb}, {pa})"
        )));
    }
    let avail = total - k;
    let mut out = if ceil { avail.div_ceil(s) + 1 } else { avail / s + 1 };
    if ceil && (out - 1).checked_mul(s).is_none_or(|start| start >= inp + pb) {
        out -= 1;
    }
    let mut v = Vec::with_capacity(out);
    for i in 0..out {
        let hs = (i * s) as i64 - pb as i64;
        let he = hs.saturating_add(k as i64).min(inp.saturating_add(pa) as i64);
        let (start, end) = (hs.max(0) as usize, he.clamp(0, inp as i64) as usize);
        if start >= end {
            return Err(site.err(format!("pool window {i} on an axis of size {inp} holds no element")));
        }
        v.push(Win {
            start,
            end,
            padded_len: (he - hs) as usize,
        });
    }
    Ok(v)
}

/// Windows of adaptive pooling along one axis.
fn adaptive_windows(site: &Site, inp: usize, out: usize) -> Res<Vec<Win>> {
    if inp == 0 || out == 0 {
        return Err(site.err(format!("adaptive pooling from size {inp} to {out}")));
    }
    Ok((0..out)
        .map(|i| {
            let (start, end) = (i * inp / out, ((i + 1) * inp).div_ceil(out));
            Win {
                start,
                end,
                padded_len: end - start,
            }
        })
        .collect())
}

/// Apply `f(window elements, count_include_pad divisor)` over every 2-d window of x[N,C,H,W].
fn pool2d<T: Copy>(site: &Site, x: &ArrayD<T>, wh: &[Win], ww: &[Win], f: impl Fn(&[T], usize) -> T) -> Res<ArrayD<T>> {
    let s = x.shape();
    if s.len() != 4 {
        return Err(site.err(format!("pooling needs x[N,C,H,W], got {s:?}")));
    }
    let (planes, h, w) = (s[0] * s[1], s[2], s[3]);
    let flat: Vec<T> = x.iter().copied().collect();
    let mut out = Vec::with_capacity(planes * wh.len() * ww.len());
    let mut buf = Vec::new();
    for p in 0..planes {
        for a in wh {
            for b in ww {
                buf.clear();
                for i in a.start..a.end.min(h) {
                    let row = (p * h + i) * w;
                    buf.extend_from_slice(&flat[row + b.start..row + b.end.min(w)]);
                }
                out.push(f(&buf, a.padded_len * b.padded_len));
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[s[0], s[1], wh.len(), ww.len()]), out).map_err(|e| site.err(e.to_string()))
}

fn max_f(v: &[f64]) -> f64 {
    v.iter().fold(f64::NEG_INFINITY, |m, &x| {
        if m.is_nan() || x.is_nan() { f64::NAN } else { m.max(x) }
    })
}

/// Max over windows of any dtype.
fn max_pool(site: &Site, x: &Value, wh: &[Win], ww: &[Win]) -> Res<Value> {
    let data = match &x.data {
        Data::F(a) => Data::F(pool2d(site, a, wh, ww, |v, _| max_f(v))?),
        Data::I(a) => Data::I(pool2d(site, a, wh, ww, |v, _| {
            v.iter().copied().max().unwrap_or(i64::MIN)
        })?),
        Data::B(a) => Data::B(pool2d(site, a, wh, ww, |v, _| v.iter().any(|&b| b))?),
    };
    Ok(x.with(data))
}

/// Average over windows (float only).
fn avg_pool(site: &Site, x: &Value, wh: &[Win], ww: &[Win], include_pad: bool) -> Res<Value> {
    let a = x.as_f(site, "avg pool input")?;
    let out = pool2d(site, a, wh, ww, |v, padded| {
        let div = if include_pad { padded } else { v.len() };
        v.iter().sum::<f64>() / div as f64
    })?;
    Ok(x.with(Data::F(out)))
}

fn hw(site: &Site, x: &Value) -> Res<(usize, usize)> {
    match x.shape() {
        [_, _, h, w] => Ok((*h, *w)),
        s => Err(site.err(format!("pooling needs x[N,C,H,W], got {s:?}"))),
    }
}

/// Kernel, stride, padding (top, left, bottom, right) and ceil mode of a regular pool.
pub(crate) struct PoolSpec {
    /// (kh, kw)
    pub kernel: [usize; 2],
    /// (sh, sw)
    pub stride: [usize; 2],
    /// (top, left, bottom, right)
    pub padding: [usize; 4],
    /// ceil instead of floor for the output size
    pub ceil_mode: bool,
}

fn spec_windows(site: &Site, x: &Value, p: &PoolSpec) -> Res<(Vec<Win>, Vec<Win>)> {
    let (h, w) = hw(site, x)?;
    Ok((
        windows(
            site,
            h,
            p.kernel[0],
            p.stride[0],
            p.padding[0],
            p.padding[2],
            p.ceil_mode,
        )?,
        windows(
            site,
            w,
            p.kernel[1],
            p.stride[1],
            p.padding[1],
            p.padding[3],
            p.ceil_mode,
        )?,
    ))
}

/// `max_pool2d`.
pub(crate) fn max_pool2d(site: &Site, x: &Value, p: &PoolSpec) -> Res<Value> {
    let (wh, ww) = spec_windows(site, x, p)?;
    max_pool(site, x, &wh, &ww)
}

/// `avg_pool2d`.
pub(crate) fn avg_pool2d(site: &Site, x: &Value, p: &PoolSpec, count_include_pad: bool) -> Res<Value> {
    let (wh, ww) = spec_windows(site, x, p)?;
    avg_pool(site, x, &wh, &ww, count_include_pad)
}

/// `adaptive_max_pool2d` / `adaptive_avg_pool2d`.
pub(crate) fn adaptive_pool2d(site: &Site, x: &Value, out: [usize; 2], max: bool) -> Res<Value> {
    let (h, w) = hw(site, x)?;
    let (wh, ww) = (adaptive_windows(site, h, out[0])?, adaptive_windows(site, w, out[1])?);
    if max {
        max_pool(site, x, &wh, &ww)
    } else {
        avg_pool(site, x, &wh, &ww, false)
    }
}
