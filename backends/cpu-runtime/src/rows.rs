//! Row kernels: `softmax`, `log_softmax` and `layer_norm`, the composites the cpu backend keeps
//! whole (`oar_backend_cpu` lowers them to native steps) because a row at a time they take two
//! or three passes over memory that is already in cache, where their decompositions take a
//! reduction kernel per statistic and an epilogue that recomputes `exp`.
//!
//! f32 rows run one generic body, instantiated for AVX-512, AVX2+FMA and the baseline and
//! chosen at run time ([`Simd`]). The body works on blocks of [`L`] lanes (one AVX-512 vector,
//! two AVX2 vectors) with per-lane partial sums added in lane order afterwards, so every
//! instance with FMA gives the same bits. `exp` is a Cephes-style polynomial (≤ 2 ulp on the
//! normal range; results below `2^-125` flush to zero — an absolute error under `3e-38`).
//! Statistics: the softmax sum accumulates in f32 lanes (positive terms); the layer-norm mean
//! in f32 lanes shifted by the row's first element and is subtracted as a pair of f32s (a row
//! of large, nearly equal values keeps its digits), its variance in f32 lanes over centered
//! values. f64 rows compute as the reference does (std `exp`/`ln`, f64 sums); f16/bf16 rows
//! widen to f32, run the f32 body and round once.
//!
//! A softmax over an axis that is not the last (`inner > 1`) runs column blocks: the statistics
//! of `inner` columns at once, vectorized across the columns.

use crate::par::par_units;
use crate::simd::Simd;
use oar_ir::{Composite, DType};
use std::borrow::Cow;

/// Lanes per block.
const L: usize = 16;
/// Elements per task when rows are split across threads (below it the split costs more than it
/// saves).
const TASK_ELEMS: usize = 1 << 16;

/// Which row op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RowOp {
    /// `exp(x - max) / Σ exp(x - max)`.
    Softmax,
    /// `(x - max) - ln Σ exp(x - max)`.
    LogSoftmax,
    /// `(x - mean) / sqrt(var + eps)` (biased variance), then `· w + b` when given.
    LayerNorm { eps: f64 },
}

/// The geometry of a row op: `outer` blocks of `n` (the reduced extent) × `inner` (elements
/// between consecutive reduced ones; 1 for contiguous rows).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
}

/// The row op computing composite `c` and the operand counts it takes (`None`: not a row op).
pub(crate) fn of(c: &Composite) -> Option<(RowOp, &'static [usize])> {
    match c {
        Composite::Softmax(_) => Some((RowOp::Softmax, &[1])),
        Composite::LogSoftmax(_) => Some((RowOp::LogSoftmax, &[1])),
        Composite::LayerNorm(l) => Some((RowOp::LayerNorm { eps: l.epsilon.0 }, &[1, 3])),
        _ => None,
    }
}

/// The row op of composite `c` and its geometry on an input of `shape`: softmax rows along its
/// axis; layer-norm rows over its normalized trailing axes.
pub(crate) fn geometry(c: &Composite, shape: &[usize]) -> Result<(RowOp, Rows), String> {
    let (op, _) = of(c).ok_or_else(|| format!("`{}` is not a row op", c.name()))?;
    let axis = match c {
        Composite::Softmax(s) => s.axis,
        Composite::LogSoftmax(s) => s.axis,
        Composite::LayerNorm(l) => shape.len().saturating_sub(l.normalized_ndim),
        _ => usize::MAX,
    };
    if axis >= shape.len().max(1) {
        return Err(format!("axis {axis} out of range for shape {shape:?}"));
    }
    let outer = shape[..axis].iter().product();
    let g = match op {
        RowOp::LayerNorm { .. } => Rows {
            outer,
            n: shape[axis..].iter().product(),
            inner: 1,
        },
        _ => Rows {
            outer,
            n: shape.get(axis).copied().unwrap_or(1),
            inner: shape[(axis + 1).min(shape.len())..].iter().product(),
        },
    };
    Ok((op, g))
}

/// `out = op(x)` for `x`, `out` (and the layer-norm affine `w`, `b` of `n` elements) holding
/// elements of `dtype` as bytes (any alignment). Layer norm needs `inner == 1`.
pub(crate) fn run(
    op: RowOp,
    dtype: DType,
    g: Rows,
    x: &[u8],
    affine: Option<(&[u8], &[u8])>,
    out: &mut [u8],
    threads: usize,
) -> Result<(), String> {
    let len = g
        .outer
        .checked_mul(g.n)
        .and_then(|v| v.checked_mul(g.inner))
        .ok_or("row geometry overflows")?;
    let size = dtype.size_bytes();
    if x.len() != len * size || out.len() != len * size {
        return Err(format!(
            "buffers of {} and {} bytes for {len} {dtype} elements",
            x.len(),
            out.len()
        ));
    }
    if let Some((w, b)) = affine
        && (w.len() != g.n * size || b.len() != g.n * size)
    {
        return Err(format!(
            "layer_norm weight/bias of {} and {} bytes for rows of {}",
            w.len(),
            b.len(),
            g.n
        ));
    }
    if matches!(op, RowOp::LayerNorm { .. }) && g.inner != 1 {
        return Err("layer_norm over non-contiguous rows".into());
    }
    if len == 0 {
        return Ok(());
    }
    match dtype {
        DType::F32 => {
            let x = floats::<f32>(x);
            let affine = affine.map(|(w, b)| (floats::<f32>(w), floats::<f32>(b)));
            let affine = affine.as_ref().map(|(w, b)| (&w[..], &b[..]));
            with_floats_mut::<f32>(out, |o| run_f32(op, g, &x, affine, o, threads));
        }
        DType::F64 => {
            let x = floats::<f64>(x);
            let affine = affine.map(|(w, b)| (floats::<f64>(w), floats::<f64>(b)));
            let affine = affine.as_ref().map(|(w, b)| (&w[..], &b[..]));
            with_floats_mut::<f64>(out, |o| run_f64(op, g, &x, affine, o));
        }
        DType::F16 | DType::BF16 => {
            // Through f32 (the runtime's half conversions), rounded once at the end.
            let widen = |b: &[u8]| {
                let mut w = vec![0u8; b.len() * 2];
                crate::native::half_convert(dtype, DType::F32, b, &mut w);
                w
            };
            let affine = affine.map(|(w, b)| (widen(w), widen(b)));
            let mut o = vec![0u8; len * 4];
            let aff = affine.as_ref().map(|(w, b)| (&w[..], &b[..]));
            run(op, DType::F32, g, &widen(x), aff, &mut o, threads)?;
            crate::native::half_convert(DType::F32, dtype, &o, out);
        }
        other => return Err(format!("row op on {other}")),
    }
    Ok(())
}

/// The elements of `b`: borrowed when aligned (as buffers are), else copied.
fn floats<T: bytemuck::Pod>(b: &[u8]) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice(b) {
        Ok(v) => Cow::Borrowed(v),
        Err(_) => Cow::Owned(
            b.chunks_exact(size_of::<T>())
                .map(bytemuck::pod_read_unaligned)
                .collect(),
        ),
    }
}

/// `f` on the elements of `out` (in place when aligned, else through a copy).
fn with_floats_mut<T: bytemuck::Pod>(out: &mut [u8], f: impl FnOnce(&mut [T])) {
    match bytemuck::try_cast_slice_mut(out) {
        Ok(v) => f(v),
        Err(_) => {
            let mut v = vec![<T as bytemuck::Zeroable>::zeroed(); out.len() / size_of::<T>()];
            f(&mut v);
            out.copy_from_slice(bytemuck::cast_slice(&v));
        }
    }
}

/// Split `outer` blocks of `per` elements each into tasks of about [`TASK_ELEMS`] elements and
/// run `f(first_block, x_part, out_part)` on each, in parallel when there are several.
fn split_blocks<T: Copy + Send + Sync>(
    outer: usize,
    per: usize,
    x: &[T],
    out: &mut [T],
    threads: usize,
    f: impl Fn(usize, &[T], &mut [T]) + Sync,
) {
    let blocks_per_task = TASK_ELEMS.div_ceil(per.max(1)).max(1);
    let tasks = outer.div_ceil(blocks_per_task);
    if tasks <= 1 || threads <= 1 {
        f(0, x, out);
        return;
    }
    let out_ptr = crate::contraction::SendPtr(out.as_mut_ptr());
    par_units(
        tasks,
        threads,
        || (),
        |_, t| {
            let lo = t * blocks_per_task;
            let hi = (lo + blocks_per_task).min(outer);
            // Safety: tasks write disjoint block ranges of `out`.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(lo * per), (hi - lo) * per) };
            f(lo, &x[lo * per..hi * per], o);
        },
    );
}

fn run_f32(op: RowOp, g: Rows, x: &[f32], affine: Option<(&[f32], &[f32])>, out: &mut [f32], threads: usize) {
    let simd = Simd::detect();
    let per = g.n * g.inner;
    split_blocks(g.outer, per, x, out, threads, |_, x, out| {
        #[cfg(target_arch = "x86_64")]
        {
            // Safety: the features were detected on this host.
            match simd {
                Simd::Avx512 => return unsafe { blocks_avx512(op, g, x, affine, out) },
                Simd::Avx2Fma => return unsafe { blocks_avx2(op, g, x, affine, out) },
                Simd::Baseline => {}
            }
        }
        let _ = simd;
        blocks::<false>(op, g, x, affine, out)
    });
}

/// Softmax of each contiguous row of `n` elements of `x` into `out`, on this thread, at the
/// host's vector width (for kernels that softmax blocks of their own, as attention does).
pub(crate) fn softmax_rows_f32(x: &[f32], out: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    let g = Rows {
        outer: x.len() / n,
        n,
        inner: 1,
    };
    #[cfg(target_arch = "x86_64")]
    {
        // Safety: the features were detected on this host.
        match Simd::detect() {
            Simd::Avx512 => return unsafe { blocks_avx512(RowOp::Softmax, g, x, None, out) },
            Simd::Avx2Fma => return unsafe { blocks_avx2(RowOp::Softmax, g, x, None, out) },
            Simd::Baseline => {}
        }
    }
    blocks::<false>(RowOp::Softmax, g, x, None, out)
}

/// [`softmax_rows_f32`] in f64 (as the reference computes it).
pub(crate) fn softmax_rows_f64(x: &[f64], out: &mut [f64], n: usize) {
    if n == 0 {
        return;
    }
    let g = Rows {
        outer: x.len() / n,
        n,
        inner: 1,
    };
    run_f64(RowOp::Softmax, g, x, None, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn blocks_avx512(op: RowOp, g: Rows, x: &[f32], affine: Option<(&[f32], &[f32])>, out: &mut [f32]) {
    blocks::<true>(op, g, x, affine, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn blocks_avx2(op: RowOp, g: Rows, x: &[f32], affine: Option<(&[f32], &[f32])>, out: &mut [f32]) {
    blocks::<true>(op, g, x, affine, out)
}

/// Every block of `x` (whole blocks of `g.n × g.inner`) into `out`.
#[inline(always)]
fn blocks<const F: bool>(op: RowOp, g: Rows, x: &[f32], affine: Option<(&[f32], &[f32])>, out: &mut [f32]) {
    let per = g.n * g.inner;
    let mut scratch = Vec::new();
    for (xb, ob) in x.chunks_exact(per).zip(out.chunks_exact_mut(per)) {
        match op {
            RowOp::Softmax | RowOp::LogSoftmax if g.inner == 1 => softmax_row::<F>(xb, ob, op == RowOp::LogSoftmax),
            RowOp::Softmax | RowOp::LogSoftmax => {
                softmax_columns::<F>(xb, ob, g.inner, op == RowOp::LogSoftmax, &mut scratch)
            }
            RowOp::LayerNorm { eps } => layer_norm_row::<F>(xb, ob, eps, affine),
        }
    }
}

/// `a · b + c`, fused when the instance has FMA.
#[inline(always)]
fn madd<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F { a.mul_add(b, c) } else { a * b + c }
}

/// `exp(x)`: `2^n · p(r)` with `n = round(x·log2 e)`, `r = x - n·ln 2` (in two parts) and a
/// degree-7 polynomial `p` (Cephes `expf`); `2^n` is built in the exponent bits as `2 · 2^(n-1)`
/// so `n = 128` (x up to ln(f32::MAX)) stays finite. NaN stays NaN; below [`EXP_LO`] gives 0.
#[inline(always)]
pub(crate) fn exp<const F: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 1.5 · 2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let t = madd::<F>(x, LOG2E, MAGIC);
    let n = t - MAGIC;
    let r = madd::<F>(n, -LN2_HI, x);
    let r = madd::<F>(n, -LN2_LO, r);
    let mut p = 1.987_569_1e-4;
    p = madd::<F>(p, r, 1.398_199_9e-3);
    p = madd::<F>(p, r, 8.333_452e-3);
    p = madd::<F>(p, r, 4.166_579_6e-2);
    p = madd::<F>(p, r, 0.166_666_65);
    p = madd::<F>(p, r, 0.5);
    let p = madd::<F>(p * r, r, r) + 1.0;
    // 2^(n-1) from t's bits (t = MAGIC + n exactly while |n| < 2^22).
    let scale = f32::from_bits((t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(126)) << 23);
    let y = (p + p) * scale;
    if x < EXP_LO {
        0.0
    } else if x > EXP_HI {
        f32::INFINITY
    } else {
        y
    }
}

/// Below it `exp` flushes to 0 (`2^(n-1)` would leave the normal range).
const EXP_LO: f32 = -86.9;
/// Above it `exp` overflows.
const EXP_HI: f32 = 88.722_83;

/// `x` as whole blocks of [`L`] and the tail (`slice::as_chunks`, for the MSRV).
#[inline(always)]
fn lane_blocks(x: &[f32]) -> (impl Iterator<Item = &[f32; L]> + Clone, &[f32]) {
    let blocks = x.chunks_exact(L);
    let tail = blocks.remainder();
    (blocks.map(|b| <&[f32; L]>::try_from(b).expect("whole blocks")), tail)
}

/// Sum of the lanes in lane order (a fixed order: the same bits on every instance).
#[inline(always)]
fn lane_sum<T: Copy + std::ops::Add<Output = T>>(v: [T; L]) -> T {
    let mut s = v[0];
    for &x in &v[1..] {
        s = s + x;
    }
    s
}

#[inline(always)]
fn max_of(a: f32, b: f32) -> f32 {
    if b > a { b } else { a }
}

/// Softmax (or log-softmax) of one contiguous row. A NaN is not taken as the maximum but makes
/// the sum NaN, so the row is NaN as the reference's is; `+inf` gives `inf - inf` likewise.
#[inline(always)]
fn softmax_row<const F: bool>(x: &[f32], out: &mut [f32], log: bool) {
    let mut lanes = [f32::NEG_INFINITY; L];
    let (blocks, tail) = lane_blocks(x);
    for c in blocks.clone() {
        for i in 0..L {
            lanes[i] = max_of(lanes[i], c[i]);
        }
    }
    let mut m = f32::NEG_INFINITY;
    for v in lanes.into_iter().chain(tail.iter().copied()) {
        m = max_of(m, v);
    }
    let split = x.len() - tail.len();
    let mut sums = [0f32; L];
    let mut tail_sum = 0f32;
    if log {
        for c in blocks {
            for i in 0..L {
                sums[i] += exp::<F>(c[i] - m);
            }
        }
        for &v in tail {
            tail_sum += exp::<F>(v - m);
        }
        let lse = ((lane_sum(sums) + tail_sum) as f64).ln() as f32;
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (v - m) - lse;
        }
    } else {
        for (o, c) in out[..split].chunks_exact_mut(L).zip(blocks) {
            let o = <&mut [f32; L]>::try_from(o).expect("whole blocks");
            for i in 0..L {
                let e = exp::<F>(c[i] - m);
                o[i] = e;
                sums[i] += e;
            }
        }
        for (o, &v) in out[split..].iter_mut().zip(tail) {
            *o = exp::<F>(v - m);
            tail_sum += *o;
        }
        let r = (1.0 / (lane_sum(sums) + tail_sum) as f64) as f32;
        for o in out.iter_mut() {
            *o *= r;
        }
    }
}

/// Softmax (or log-softmax) along the first axis of a `[n, inner]` block: `inner` columns at
/// once (the loops over a row of columns vectorize).
#[inline(always)]
fn softmax_columns<const F: bool>(x: &[f32], out: &mut [f32], inner: usize, log: bool, scratch: &mut Vec<f32>) {
    scratch.clear();
    scratch.resize(2 * inner, 0.0);
    let (m, s) = scratch.split_at_mut(inner);
    m.fill(f32::NEG_INFINITY);
    for row in x.chunks_exact(inner) {
        for (m, &v) in m.iter_mut().zip(row) {
            *m = max_of(*m, v);
        }
    }
    for (orow, row) in out.chunks_exact_mut(inner).zip(x.chunks_exact(inner)) {
        for ((o, s), (&v, &m)) in orow.iter_mut().zip(s.iter_mut()).zip(row.iter().zip(m.iter())) {
            let e = exp::<F>(v - m);
            *o = e;
            *s += e;
        }
    }
    if log {
        for (m, s) in m.iter_mut().zip(s.iter()) {
            // m + ln s: what each column subtracts.
            *m += (*s as f64).ln() as f32;
        }
        for (orow, row) in out.chunks_exact_mut(inner).zip(x.chunks_exact(inner)) {
            for (o, (&v, &m)) in orow.iter_mut().zip(row.iter().zip(m.iter())) {
                *o = v - m;
            }
        }
    } else {
        for s in s.iter_mut() {
            *s = (1.0 / *s as f64) as f32;
        }
        for orow in out.chunks_exact_mut(inner) {
            for (o, &r) in orow.iter_mut().zip(s.iter()) {
                *o *= r;
            }
        }
    }
}

/// Layer norm of one contiguous row (and the affine when given).
#[inline(always)]
fn layer_norm_row<const F: bool>(x: &[f32], out: &mut [f32], eps: f64, affine: Option<(&[f32], &[f32])>) {
    let n = x.len();
    let (blocks, tail) = lane_blocks(x);
    // Σ (x - x₀) in f32 lanes: shifted by the first element, the terms are the row's spread,
    // not its magnitude, so a row of large, nearly equal values keeps its digits.
    let shift = x.first().copied().unwrap_or(0.0);
    let mut sums = [0f32; L];
    for c in blocks.clone() {
        for i in 0..L {
            sums[i] += c[i] - shift;
        }
    }
    let total = (lane_sum(sums) + tail.iter().map(|&v| v - shift).sum::<f32>()) as f64;
    // The mean as hi + lo: `(v - hi) - lo` is exact to f32 rounding even where v and the mean
    // are large and close (v - hi is exact there), which `v - (mean as f32)` is not.
    let mean = shift as f64 + total / n as f64;
    let (hi, lo) = (mean as f32, (mean - (mean as f32) as f64) as f32);
    let mut sq = [0f32; L];
    for c in blocks {
        for i in 0..L {
            let d = (c[i] - hi) - lo;
            sq[i] = madd::<F>(d, d, sq[i]);
        }
    }
    let mut tail_sq = 0f32;
    for &v in tail {
        let d = (v - hi) - lo;
        tail_sq = madd::<F>(d, d, tail_sq);
    }
    let var = (lane_sum(sq) + tail_sq) as f64 / n as f64;
    let inv = (1.0 / (var + eps).sqrt()) as f32;
    match affine {
        Some((w, b)) => {
            for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(w).zip(b) {
                *o = madd::<F>(((v - hi) - lo) * inv, w, b);
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = ((v - hi) - lo) * inv;
            }
        }
    }
}

/// f64 blocks, computed as the reference computes them.
fn run_f64(op: RowOp, g: Rows, x: &[f64], affine: Option<(&[f64], &[f64])>, out: &mut [f64]) {
    let per = g.n * g.inner;
    let mut col = vec![0f64; g.n];
    for (xb, ob) in x.chunks_exact(per).zip(out.chunks_exact_mut(per)) {
        for j in 0..g.inner {
            for (i, c) in col.iter_mut().enumerate() {
                *c = xb[i * g.inner + j];
            }
            match op {
                RowOp::Softmax | RowOp::LogSoftmax => {
                    let m = col.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let s: f64 = col.iter().map(|v| (v - m).exp()).sum();
                    for (i, &v) in col.iter().enumerate() {
                        ob[i * g.inner + j] = if op == RowOp::LogSoftmax {
                            (v - m) - s.ln()
                        } else {
                            (v - m).exp() / s
                        };
                    }
                }
                RowOp::LayerNorm { eps } => {
                    let nf = g.n as f64;
                    let mean = col.iter().sum::<f64>() / nf;
                    let var = col.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / nf;
                    let inv = 1.0 / (var + eps).sqrt();
                    for (i, &v) in col.iter().enumerate() {
                        let y = (v - mean) * inv;
                        ob[i * g.inner + j] = match affine {
                            Some((w, b)) => y * w[i] + b[i],
                            None => y,
                        };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn from_bytes(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn run32(op: RowOp, g: Rows, x: &[f32], affine: Option<(&[f32], &[f32])>, threads: usize) -> Vec<f32> {
        let mut out = vec![0u8; x.len() * 4];
        let aff = affine.map(|(w, b)| (to_bytes(w), to_bytes(b)));
        run(
            op,
            DType::F32,
            g,
            &to_bytes(x),
            aff.as_ref().map(|(w, b)| (&w[..], &b[..])),
            &mut out,
            threads,
        )
        .unwrap();
        from_bytes(&out)
    }

    /// f64 softmax / log-softmax of every lane (the definition, computed independently).
    fn expect(x: &[f32], g: Rows, log: bool) -> Vec<f64> {
        let mut out = vec![0f64; x.len()];
        for o in 0..g.outer {
            for j in 0..g.inner {
                let at = |i: usize| o * g.n * g.inner + i * g.inner + j;
                let m = (0..g.n).map(|i| x[at(i)] as f64).fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = (0..g.n).map(|i| (x[at(i)] as f64 - m).exp()).sum();
                for i in 0..g.n {
                    let z = x[at(i)] as f64 - m;
                    out[at(i)] = if log { z - s.ln() } else { z.exp() / s };
                }
            }
        }
        out
    }

    fn close(got: &[f32], want: &[f64], rtol: f64, atol: f64) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g as f64 - w).abs() <= atol + rtol * w.abs(),
                "element {i}: got {g}, want {w}"
            );
        }
    }

    /// A deterministic spread of values in about [-scale, scale].
    fn data(len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as f32 * 0.618_034).fract() - 0.5) * 2.0 * scale)
            .collect()
    }

    #[test]
    fn exp_matches_std_within_two_ulp_and_handles_the_edges() {
        for i in 0..200_000 {
            let x = -86.0 + i as f32 * (174.0 / 200_000.0);
            let (got, want) = (exp::<true>(x), (x as f64).exp());
            let ulp = (want as f32).abs() * f32::EPSILON;
            assert!(
                (got as f64 - want).abs() <= 2.0 * ulp as f64,
                "exp({x}) = {got}, want {want}"
            );
            // The unfused instance differs by rounding only.
            let u = exp::<false>(x);
            assert!((u as f64 - want).abs() <= 3.0 * ulp as f64, "unfused exp({x}) = {u}");
        }
        assert_eq!(exp::<true>(0.0), 1.0);
        assert_eq!(exp::<true>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp::<true>(-100.0), 0.0);
        assert_eq!(exp::<true>(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp::<true>(89.0), f32::INFINITY);
        assert!(exp::<true>(88.72).is_finite());
        assert!(exp::<true>(f32::NAN).is_nan());
    }

    #[test]
    fn softmax_rows_match_the_definition_with_tails_and_threads() {
        // Row lengths around the lane block, large enough rows to split across tasks.
        for (outer, n) in [(1, 1), (3, 5), (2, 16), (4, 17), (3, 33), (40, 1000), (300, 257)] {
            let g = Rows { outer, n, inner: 1 };
            let x = data(outer * n, 20.0);
            for log in [false, true] {
                let op = if log { RowOp::LogSoftmax } else { RowOp::Softmax };
                let want = expect(&x, g, log);
                for threads in [1, 2] {
                    close(&run32(op, g, &x, None, threads), &want, 2e-6, 1e-7);
                }
            }
        }
    }

    #[test]
    fn softmax_columns_match_the_definition() {
        for (outer, n, inner) in [(1, 3, 2), (2, 7, 19), (3, 64, 5)] {
            let g = Rows { outer, n, inner };
            let x = data(outer * n * inner, 10.0);
            close(
                &run32(RowOp::Softmax, g, &x, None, 2),
                &expect(&x, g, false),
                2e-6,
                1e-7,
            );
            close(
                &run32(RowOp::LogSoftmax, g, &x, None, 2),
                &expect(&x, g, true),
                2e-6,
                2e-6,
            );
        }
    }

    #[test]
    fn softmax_of_special_values() {
        let g = Rows {
            outer: 4,
            n: 3,
            inner: 1,
        };
        let inf = f32::INFINITY;
        let x = [
            0.0,
            f32::NEG_INFINITY,
            0.0,
            1.0,
            f32::NAN,
            2.0,
            1.0,
            inf,
            2.0,
            -inf,
            -inf,
            -inf,
        ];
        let y = run32(RowOp::Softmax, g, &x, None, 1);
        assert_eq!(&y[..3], &[0.5, 0.0, 0.5]);
        // A NaN, +inf, or a row of -inf makes the row NaN (as the reference's).
        assert!(y[3..].iter().all(|v| v.is_nan()), "{y:?}");
        // Huge logits do not overflow.
        let y = run32(
            RowOp::Softmax,
            Rows {
                outer: 1,
                n: 2,
                inner: 1,
            },
            &[1e30, 1e30],
            None,
            1,
        );
        assert_eq!(y, [0.5, 0.5]);
    }

    #[test]
    fn layer_norm_matches_hand_computed_values_and_keeps_digits() {
        // [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
        let inv = 1.0 / (1.25f64 + 1e-5).sqrt();
        let want: Vec<f64> = [1.0, 2.0, 3.0, 4.0].iter().map(|v| (v - 2.5) * inv).collect();
        let g = Rows {
            outer: 1,
            n: 4,
            inner: 1,
        };
        let op = RowOp::LayerNorm { eps: 1e-5 };
        close(&run32(op, g, &[1.0, 2.0, 3.0, 4.0], None, 1), &want, 1e-6, 1e-6);
        let (w, b) = ([2.0, 1.0, 0.5, 0.0], [0.0, 1.0, -1.0, 3.0]);
        let want_aff: Vec<f64> = (0..4).map(|i| want[i] * w[i] as f64 + b[i] as f64).collect();
        close(
            &run32(op, g, &[1.0, 2.0, 3.0, 4.0], Some((&w, &b)), 1),
            &want_aff,
            1e-6,
            1e-6,
        );
        // Large nearly equal values over a long row (f64 mean): the centered values survive.
        let n = 1000;
        let x: Vec<f32> = (0..n).map(|i| 4096.0 + (i % 7) as f32 * 0.25).collect();
        let m = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = x.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n as f64;
        let want: Vec<f64> = x.iter().map(|&v| (v as f64 - m) / (var + 1e-5).sqrt()).collect();
        let g = Rows { outer: 1, n, inner: 1 };
        close(&run32(op, g, &x, None, 1), &want, 1e-5, 1e-5);
    }

    #[test]
    fn layer_norm_rows_match_the_definition_with_tails_and_threads() {
        for (outer, n) in [(1, 1), (3, 5), (32, 32), (4, 17), (3, 33), (300, 257)] {
            let g = Rows { outer, n, inner: 1 };
            let x = data(outer * n, 3.0);
            let (w, b) = (data(n, 1.5), data(n + 1, 0.5)[1..].to_vec());
            let mut want = vec![0f64; x.len()];
            for (xr, wr) in x.chunks(n).zip(want.chunks_mut(n)) {
                let m = xr.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                let var = xr.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n as f64;
                for i in 0..n {
                    wr[i] = (xr[i] as f64 - m) / (var + 1e-5).sqrt() * w[i] as f64 + b[i] as f64;
                }
            }
            for threads in [1, 2] {
                let got = run32(RowOp::LayerNorm { eps: 1e-5 }, g, &x, Some((&w, &b)), threads);
                close(&got, &want, 3e-7, 3e-7);
            }
        }
    }

    #[test]
    fn f64_and_half_rows() {
        let g = Rows {
            outer: 2,
            n: 3,
            inner: 2,
        };
        let x: Vec<f64> = (0..12).map(|i| i as f64 * 0.5 - 3.0).collect();
        let mut out = vec![0u8; 96];
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        run(RowOp::Softmax, DType::F64, g, &bytes, None, &mut out, 1).unwrap();
        let got: Vec<f64> = out.chunks_exact(8).map(bytemuck::pod_read_unaligned).collect();
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        for (g, w) in got.iter().zip(expect(&x32, g, false)) {
            assert!((g - w).abs() < 1e-15, "{g} vs {w}");
        }
        let bytes: Vec<u8> = x
            .iter()
            .flat_map(|&v| half::bf16::from_f64(v).to_bits().to_le_bytes())
            .collect();
        let mut out = vec![0u8; 24];
        run(RowOp::LogSoftmax, DType::BF16, g, &bytes, None, &mut out, 1).unwrap();
        for (c, w) in out.chunks_exact(2).zip(expect(&x32, g, true)) {
            let v = half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64();
            assert!((v - w).abs() <= w.abs() / 128.0, "{v} vs {w}");
        }
    }

    #[test]
    fn bad_geometry_is_an_error() {
        let fails = |dtype, outer, n| {
            let g = Rows { outer, n, inner: 1 };
            run(RowOp::Softmax, dtype, g, &[0; 8], None, &mut [0; 8], 1).unwrap_err()
        };
        assert!(fails(DType::F32, 2, 3).contains("6 f32 elements"));
        assert!(fails(DType::I32, 1, 2).contains("i32"));
    }
}
