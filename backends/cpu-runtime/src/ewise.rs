//! Elementwise and reduction kernels on f32 at the host's full vector width, for eager ops.
//!
//! Cranelift's x64 backend emits 128-bit vectors only, so the generated one-op kernels of eager
//! mode run 4 lanes where the host has 8 (AVX2) or 16 (AVX-512). These kernels are one generic
//! body each, instantiated under `#[target_feature]` for AVX-512 and for AVX2+FMA and once
//! without (other hosts), the instance chosen at run time ([`Simd`]), as the row kernels are
//! ([`crate::rows`]). Large tensors are split across threads ([`par_units`]).
//!
//! Semantics are the reference's: `add sub mul div sqrt neg abs` are IEEE-exact (the same bits
//! as the reference's f64 evaluation rounded once); `max`/`min` propagate NaN; `exp` is the row
//! kernels' polynomial (≤ 2 ulp, below `2^-125` flushed to 0); `log` is Cephes' (≤ 2 ulp);
//! `tanh` is Cephes' (a polynomial below 0.625, `1 - 2/(e^{2|x|} + 1)` above; ≤ 3 ulp);
//! `sigmoid` is `1/(1 + e^{-x})`; `relu` keeps NaN; `sin`/`cos` are Cephes' (≤ 2 ulp; past
//! |x| = 8192 reduced in f64); `erf` is a fitted polynomial below 1 and
//! `1 - e^{-x²}/x · R(1/x²)` above (≤ 3 ulp); `gelu` is `x · h` for x < 0 and `x · (1 - h)`
//! above, `h = erfc(|x|/√2)/2` in one base-2 formula ([`gelu`]; ≤ 6 ulp for x > 0), and the
//! tanh form is `x · sigmoid(2z)` — neither cancels in the negative tail, where the
//! reference's own f64 formula rounds to 0; `silu` is `x/(1 + e^{-x})`. Sums accumulate in f32
//! lanes over blocks of [`SUM_BLOCK`] elements and add the block sums in f64 (the reference
//! sums in f64), in a fixed order: every thread count gives the same bits.

use crate::par::par_units;
use crate::rows::exp;
use crate::simd::{Simd, instances};

/// Lanes of the sum accumulators (four AVX-512 vectors: independent add chains).
const L: usize = 64;
/// Elements summed in f32 lanes before the block's sum joins the f64 total.
pub const SUM_BLOCK: usize = 4096;
/// Elements per task for cheap ops (a pool wake-up costs more below it).
const TASK_CHEAP: usize = 1 << 15;
/// Elements per task for transcendental ops.
const TASK_COSTLY: usize = 1 << 14;

/// A unary elementwise op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    /// `-x`
    Neg,
    /// `|x|`
    Abs,
    /// `√x`
    Sqrt,
    /// `e^x`
    Exp,
    /// `ln x`
    Log,
    /// `tanh x`
    Tanh,
    /// `max(x, 0)`, NaN kept
    Relu,
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// `sin x`
    Sin,
    /// `cos x`
    Cos,
    /// `erf x`
    Erf,
    /// `x / 2 · (1 + erf(x / √2))`
    Gelu,
    /// `x / 2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`
    GeluTanh,
    /// `x · sigmoid(x)`
    Silu,
}

impl Unary {
    fn costly(self) -> bool {
        !matches!(self, Unary::Neg | Unary::Abs | Unary::Sqrt | Unary::Relu)
    }
}

/// A binary elementwise op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a · b`
    Mul,
    /// `a / b`
    Div,
    /// larger, NaN if either is
    Max,
    /// smaller, NaN if either is
    Min,
}

/// One operand of a binary op, as the output's elements index it.
#[derive(Clone, Copy, Debug)]
pub enum Side<'a, T = f32> {
    /// One element per output element.
    Full(&'a [T]),
    /// One value for every output element.
    Scalar(T),
    /// A row repeated: output element `i` takes `row[i % row.len()]` (a bias over the last
    /// axes).
    Row(&'a [T]),
    /// A column repeated along the last axes: output element `i` takes
    /// `col[(first + i / inner) % col.len()]` — a value per row or channel (`[R, 1]` against
    /// `[R, K]`, `[C, 1, 1]` against `[N, C, H, W]`). `first` is 0 for a whole output.
    Column {
        /// one value per run of `inner` output elements, repeated
        col: &'a [T],
        /// output elements sharing one value (≥ 1)
        inner: usize,
        /// the value of the first run
        first: usize,
    },
}

impl<T: Copy> Side<'_, T> {
    /// The part of this operand for output elements `lo..hi` (`Row`: `lo` a multiple of the
    /// row; `Column`: of `inner`).
    fn part(self, lo: usize, hi: usize) -> Self {
        match self {
            Side::Full(v) => Side::Full(&v[lo..hi]),
            Side::Column { col, inner, first } => Side::Column {
                col,
                inner,
                first: (first + lo / inner) % col.len(),
            },
            other => other,
        }
    }

    /// The operand of output element `i`.
    #[inline(always)]
    fn at(self, i: usize) -> T {
        match self {
            Side::Full(v) => v[i],
            Side::Scalar(s) => s,
            Side::Row(r) => r[i % r.len()],
            Side::Column { col, inner, first } => col[(first + i / inner) % col.len()],
        }
    }
}

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// Σ
    Sum,
    /// Σ / n
    Mean,
    /// the largest element, NaN if any is (at least one element)
    Max,
    /// the smallest element, NaN if any is (at least one element)
    Min,
}

/// A comparison (IEEE: every one but `Ne` is false when a side is NaN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
}

/// `out = op(x)`; `x` and `out` of equal length.
pub fn unary(op: Unary, x: &[f32], out: &mut [f32], threads: usize) {
    assert_eq!(x.len(), out.len(), "unary kernel: operand and result lengths");
    let task = if op.costly() { TASK_COSTLY } else { TASK_CHEAP };
    split(out, task, 1, threads, |lo, o| {
        let x = &x[lo..lo + o.len()];
        unary_host(op, x, o)
    });
}

/// `out = op(a, b)`; a `Full` side has `out.len()` elements, a `Row` side a length dividing it,
/// a `Column` side's `inner` divides it.
pub fn binary(op: Binary, a: Side, b: Side, out: &mut [f32], threads: usize) {
    let align = sides_align(a, b, out.len());
    // Tasks hold whole rows (a multiple of the row length).
    split(out, TASK_CHEAP, align, threads, |lo, o| {
        let (a, b) = (a.part(lo, lo + o.len()), b.part(lo, lo + o.len()));
        binary_host(op, a, b, o)
    });
}

/// `out = op(a, b)` as 0/1 bytes (a bool tensor's elements); sides as [`binary`]'s.
pub fn compare(op: Compare, a: Side, b: Side, out: &mut [u8], threads: usize) {
    let align = sides_align(a, b, out.len());
    split(out, TASK_CHEAP, align, threads, |lo, o| {
        let (a, b) = (a.part(lo, lo + o.len()), b.part(lo, lo + o.len()));
        compare_host(op, a, b, o)
    });
}

/// Whether [`unary_f64`] computes `op` (the IEEE-exact ones).
pub fn unary_f64_supported(op: Unary) -> bool {
    matches!(op, Unary::Neg | Unary::Abs | Unary::Sqrt | Unary::Relu)
}

/// [`unary`] on f64 for the ops of [`unary_f64_supported`] (others panic: callers check).
pub fn unary_f64(op: Unary, x: &[f64], out: &mut [f64], threads: usize) {
    assert_eq!(x.len(), out.len(), "unary kernel: operand and result lengths");
    assert!(unary_f64_supported(op), "unary kernel: no f64 {op:?}");
    split(out, TASK_CHEAP, 1, threads, |lo, o| {
        let x = &x[lo..lo + o.len()];
        unary_f64_host(op, x, o)
    });
}

/// [`binary`] on f64.
pub fn binary_f64(op: Binary, a: Side<f64>, b: Side<f64>, out: &mut [f64], threads: usize) {
    let align = sides_align(a, b, out.len());
    split(out, TASK_CHEAP, align, threads, |lo, o| {
        let (a, b) = (a.part(lo, lo + o.len()), b.part(lo, lo + o.len()));
        binary_f64_host(op, a, b, o)
    });
}

/// [`compare`] on f64.
pub fn compare_f64(op: Compare, a: Side<f64>, b: Side<f64>, out: &mut [u8], threads: usize) {
    let align = sides_align(a, b, out.len());
    split(out, TASK_CHEAP, align, threads, |lo, o| {
        let (a, b) = (a.part(lo, lo + o.len()), b.part(lo, lo + o.len()));
        compare_f64_host(op, a, b, o)
    });
}

/// A 16-bit float format, its elements held as their bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// IEEE binary16
    F16,
    /// bfloat16
    Bf16,
}

impl Half {
    /// The format of `dt`, `None` for the other dtypes.
    pub fn of(dt: oar_ir::DType) -> Option<Half> {
        match dt {
            oar_ir::DType::F16 => Some(Half::F16),
            oar_ir::DType::BF16 => Some(Half::Bf16),
            _ => None,
        }
    }
}

/// Elements widened to f32 at a time by the half-precision kernels (they stay in L1).
const HALF_CHUNK: usize = 1024;

/// [`unary`] on 16-bit floats: each chunk of [`HALF_CHUNK`] elements widened to f32, computed
/// by the f32 kernel and rounded back (to nearest, ties to even; NaN stays NaN) — what the
/// compiled kernels do for these formats, at the host's vector width.
pub fn unary_half(op: Unary, half: Half, x: &[u16], out: &mut [u16], threads: usize) {
    assert_eq!(x.len(), out.len(), "unary kernel: operand and result lengths");
    let task = if op.costly() { TASK_COSTLY } else { TASK_CHEAP };
    split(out, task, 1, threads, |lo, o| {
        let x = &x[lo..lo + o.len()];
        unary_half_host(op, half, x, o)
    });
}

/// [`binary`] on 16-bit floats, as [`unary_half`]: a row or column side is widened once, full
/// sides chunk by chunk.
pub fn binary_half(op: Binary, half: Half, a: Side<u16>, b: Side<u16>, out: &mut [u16], threads: usize) {
    let align = sides_align(a, b, out.len());
    let wide = |s: Side<u16>| -> Vec<f32> {
        let v = match s {
            Side::Row(r) => r,
            Side::Column { col, .. } => col,
            Side::Full(_) | Side::Scalar(_) => return Vec::new(),
        };
        let mut w = vec![0f32; v.len()];
        widen(half, v, &mut w);
        w
    };
    let (wa, wb) = (wide(a), wide(b));
    split(out, TASK_CHEAP, align, threads, |lo, o| {
        binary_half_host(op, half, (a, &wa), (b, &wb), lo, align, o)
    });
}

/// 16-bit floats widened to f32 (exact).
#[inline(always)]
pub(crate) fn widen(half: Half, src: &[u16], dst: &mut [f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    match half {
        Half::F16 => {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("f16c") {
                // Safety: F16C (and so AVX) was detected.
                return unsafe { f16c::widen(src, dst) };
            }
            src.reinterpret_cast::<half::f16>().convert_to_f32_slice(dst)
        }
        Half::Bf16 => {
            for (d, &h) in dst.iter_mut().zip(src) {
                *d = f32::from_bits(u32::from(h) << 16);
            }
        }
    }
}

/// f16 ⇄ f32 eight lanes at a time with F16C (`half`'s slice conversions call a function per
/// four elements).
#[cfg(target_arch = "x86_64")]
mod f16c {
    use std::arch::x86_64::*;

    /// # Safety
    /// The host has F16C.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn widen(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let (mut s, mut d) = (src[..n].chunks_exact(8), dst[..n].chunks_exact_mut(8));
        for (s, d) in (&mut s).zip(&mut d) {
            // Safety: `s` holds 8 u16s (16 bytes), `d` 8 f32s; unaligned loads and stores.
            unsafe { _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast()))) };
        }
        for (o, &h) in d.into_remainder().iter_mut().zip(s.remainder()) {
            *o = half::f16::from_bits(h).to_f32();
        }
    }

    /// Rounded to nearest, ties to even.
    ///
    /// # Safety
    /// The host has F16C.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let (mut s, mut d) = (src[..n].chunks_exact(8), dst[..n].chunks_exact_mut(8));
        for (s, d) in (&mut s).zip(&mut d) {
            // Safety: as in `widen`.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
                _mm_storeu_si128(d.as_mut_ptr().cast(), h);
            }
        }
        for (o, &v) in d.into_remainder().iter_mut().zip(s.remainder()) {
            *o = half::f16::from_f32(v).to_bits();
        }
    }
}

/// f32 rounded to 16-bit floats: to nearest, ties to even; NaN stays NaN (`half`'s rounding).
#[inline(always)]
pub(crate) fn narrow(half: Half, src: &[f32], dst: &mut [u16]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    match half {
        Half::F16 => {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("f16c") {
                // Safety: F16C (and so AVX) was detected.
                return unsafe { f16c::narrow(src, dst) };
            }
            dst.reinterpret_cast_mut::<half::f16>().convert_from_f32_slice(src)
        }
        Half::Bf16 => {
            let n = src.len().min(dst.len());
            let mut done = 0;
            #[cfg(target_arch = "x86_64")]
            if n >= 16 {
                use crate::simd::Simd;
                done = match Simd::detect() {
                    // Safety: `Simd::detect` found AVX-512F.
                    Simd::Avx512 => unsafe { bf16v::narrow_avx512(&src[..n], &mut dst[..n]) },
                    // Safety: `Simd::detect` found AVX2.
                    Simd::Avx2Fma => unsafe { bf16v::narrow_avx2(&src[..n], &mut dst[..n]) },
                    Simd::Baseline => 0,
                };
            }
            for (d, &v) in dst[done..n].iter_mut().zip(&src[done..n]) {
                *d = bf16_bits(v);
            }
        }
    }
}

/// `v` rounded to bf16 (to nearest, ties to even; a NaN quieted, its sign and high payload
/// kept), as bits.
#[inline(always)]
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    if v.is_nan() {
        ((x >> 16) | 0x40) as u16
    } else {
        (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16
    }
}

/// f32 → bf16 rounding [`bf16_bits`] sixteen or eight lanes at a time.
#[cfg(target_arch = "x86_64")]
pub(crate) mod bf16v {
    use std::arch::x86_64::*;

    /// Sixteen f32 bit patterns rounded to bf16, each in the low half of its lane.
    ///
    /// # Safety
    /// The host has AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn round16(x: __m512i) -> __m512i {
        let hi = _mm512_srli_epi32::<16>(x);
        let lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
        let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb));
        let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7fff_ffff));
        let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f80_0000));
        _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)))
    }

    /// Rounds the first multiple of 16 elements; returns how many.
    ///
    /// # Safety
    /// The host has AVX-512F; `dst` is at least as long as `src`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn narrow_avx512(src: &[f32], dst: &mut [u16]) -> usize {
        let n = src.len() / 16 * 16;
        assert!(dst.len() >= n);
        for i in (0..n).step_by(16) {
            // Safety: 16 f32s at `src[i..]` and 16 u16s at `dst[i..]` (checked above).
            unsafe {
                let x = _mm512_loadu_si512(src.as_ptr().add(i).cast());
                _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi16(round16(x)));
            }
        }
        n
    }

    /// Eight f32 bit patterns rounded to bf16, each in the low half of its lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn round8(x: __m256i) -> __m256i {
        let hi = _mm256_srli_epi32::<16>(x);
        let lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
        let r = _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb));
        let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
        _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan)
    }

    /// Rounds the first multiple of 16 elements; returns how many.
    ///
    /// # Safety
    /// The host has AVX2; `dst` is at least as long as `src`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn narrow_avx2(src: &[f32], dst: &mut [u16]) -> usize {
        let n = src.len() / 16 * 16;
        assert!(dst.len() >= n);
        for i in (0..n).step_by(16) {
            // Safety: 16 f32s at `src[i..]` and 16 u16s at `dst[i..]` (checked above).
            unsafe {
                let a = round8(_mm256_loadu_si256(src.as_ptr().add(i).cast()));
                let b = round8(_mm256_loadu_si256(src.as_ptr().add(i + 8).cast()));
                // packus works within 128-bit halves: [a0-3 b0-3 | a4-7 b4-7] → reorder.
                let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b));
                _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), packed);
            }
        }
        n
    }
}

/// The sides' lengths checked against `n` output elements; the length tasks are multiples
/// of (a row, a column's run; 1 without them).
fn sides_align<T: Copy>(a: Side<T>, b: Side<T>, n: usize) -> usize {
    let mut align = 1;
    for s in [a, b] {
        let unit = match s {
            Side::Full(v) => {
                assert_eq!(v.len(), n, "binary kernel: operand and result lengths");
                1
            }
            Side::Row(r) => {
                assert!(
                    !r.is_empty() && n.is_multiple_of(r.len()),
                    "binary kernel: row of {} for {n}",
                    r.len()
                );
                r.len()
            }
            Side::Column { col, inner, first } => {
                assert!(
                    !col.is_empty() && inner > 0 && n.is_multiple_of(inner) && first < col.len(),
                    "binary kernel: column of {} by {inner} for {n}",
                    col.len()
                );
                inner
            }
            Side::Scalar(_) => 1,
        };
        align = lcm(align, unit);
    }
    align
}

fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

/// `out[r] = op(x[r·n .. (r+1)·n])` for each of `out.len()` rows of `n` elements.
pub fn reduce_rows(op: Reduce, x: &[f32], n: usize, out: &mut [f32], threads: usize) {
    assert_eq!(
        x.len(),
        out.len() * n,
        "reduce kernel: {} elements for {} rows of {n}",
        x.len(),
        out.len()
    );
    if n == 0 {
        assert!(
            matches!(op, Reduce::Sum | Reduce::Mean),
            "reduce kernel: {op:?} of empty rows"
        );
        out.fill(if op == Reduce::Mean { f32::NAN } else { 0.0 });
        return;
    }
    let rows_per_task = TASK_CHEAP.div_ceil(n).max(1);
    split(out, rows_per_task, 1, threads, |r0, o| {
        for (i, y) in o.iter_mut().enumerate() {
            let row = &x[(r0 + i) * n..(r0 + i + 1) * n];
            *y = match op {
                Reduce::Max | Reduce::Min => extreme_host(op == Reduce::Max, row),
                _ => finish(op, sum_host(row), n),
            };
        }
    });
}

/// `op` over all of `x` (split across threads in blocks; the same bits for any thread count).
pub fn reduce_all(op: Reduce, x: &[f32], threads: usize) -> f32 {
    if x.is_empty() {
        assert!(
            matches!(op, Reduce::Sum | Reduce::Mean),
            "reduce kernel: {op:?} of nothing"
        );
        return if op == Reduce::Mean { f32::NAN } else { 0.0 };
    }
    if let Reduce::Max | Reduce::Min = op {
        let max = op == Reduce::Max;
        let tasks = x.len().div_ceil(TASK_CHEAP);
        let mut partial = vec![0f32; tasks];
        split(&mut partial, 1, 1, if tasks > 1 { threads } else { 1 }, |t0, p| {
            for (i, y) in p.iter_mut().enumerate() {
                let t = t0 + i;
                *y = extreme_host(max, &x[t * TASK_CHEAP..((t + 1) * TASK_CHEAP).min(x.len())]);
            }
        });
        return extreme_body::<false>(max, &partial);
    }
    // Per-task partial sums over whole SUM_BLOCKs, added in task order.
    let per_task = (TASK_CHEAP / SUM_BLOCK).max(1) * SUM_BLOCK;
    let tasks = x.len().div_ceil(per_task);
    let mut partial = vec![0f64; tasks];
    let ptr = crate::contraction::SendPtr(partial.as_mut_ptr());
    par_units(
        tasks,
        if tasks > 1 { threads } else { 1 },
        || (),
        |_, t| {
            let part = &x[t * per_task..((t + 1) * per_task).min(x.len())];
            let s = sum_host(part);
            // Safety: each task writes its own element.
            unsafe { *ptr.get().add(t) = s };
        },
    );
    finish(op, partial.iter().sum(), x.len())
}

fn finish(op: Reduce, sum: f64, n: usize) -> f32 {
    match op {
        Reduce::Mean => (sum / n as f64) as f32,
        _ => sum as f32,
    }
}

/// Run `f(first_element, part)` on parts of `out` of at least `task` elements (a multiple of
/// `align`), in parallel when there are several. Large outputs split into two parts per
/// thread, not into many `task`-sized ones: long contiguous streams keep the hardware
/// prefetchers ahead (1M-element add, two threads: ~10% faster), and the second part still
/// balances a thread that joins late.
fn split<T: Copy + Send>(out: &mut [T], task: usize, align: usize, threads: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let task = task.max(out.len() / (2 * threads.max(1)));
    let per = task.div_ceil(align).max(1) * align;
    let tasks = out.len().div_ceil(per);
    if tasks <= 1 || threads <= 1 {
        f(0, out);
        return;
    }
    let len = out.len();
    let ptr = crate::contraction::SendPtr(out.as_mut_ptr());
    par_units(
        tasks,
        threads,
        || (),
        |_, t| {
            let lo = t * per;
            let hi = (lo + per).min(len);
            // Safety: tasks write disjoint ranges of `out`.
            let part = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(lo), hi - lo) };
            f(lo, part);
        },
    );
}

instances!(unary_body, unary_host, unary_avx2, unary_avx512, (op: Unary, x: &[f32], out: &mut [f32]) -> ());
instances!(binary_body, binary_host, binary_avx2, binary_avx512, (op: Binary, a: Side, b: Side, out: &mut [f32]) -> ());
instances!(compare_body, compare_host, compare_avx2, compare_avx512, (op: Compare, a: Side, b: Side, out: &mut [u8]) -> ());
instances!(extreme_body, extreme_host, extreme_avx2, extreme_avx512, (max: bool, x: &[f32]) -> f32);
instances!(unary_f64_body, unary_f64_host, unary_f64_avx2, unary_f64_avx512, (op: Unary, x: &[f64], out: &mut [f64]) -> ());
instances!(binary_f64_body, binary_f64_host, binary_f64_avx2, binary_f64_avx512, (op: Binary, a: Side<f64>, b: Side<f64>, out: &mut [f64]) -> ());
instances!(compare_f64_body, compare_f64_host, compare_f64_avx2, compare_f64_avx512, (op: Compare, a: Side<f64>, b: Side<f64>, out: &mut [u8]) -> ());
instances!(unary_half_body, unary_half_host, unary_half_avx2, unary_half_avx512, (op: Unary, half: Half, x: &[u16], out: &mut [u16]) -> ());
instances!(binary_half_body, binary_half_host, binary_half_avx2, binary_half_avx512,
    (op: Binary, half: Half, a: (Side<u16>, &[f32]), b: (Side<u16>, &[f32]), lo: usize, align: usize, out: &mut [u16]) -> ());
/// Σ x on this host: AVX2 intrinsics on x86-64 hosts with AVX2 (AVX-512 ones too: a sum is
/// bound by memory, which 256-bit loads saturate), else the generic body.
fn sum_host(x: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if Simd::detect() != Simd::Baseline {
        // Safety: AVX2 was detected (both other instances have it).
        return unsafe { sum_avx2(x) };
    }
    sum_body::<false>(x)
}

/// [`sum_body`]'s blocks with eight 8-lane accumulators (64 elements per iteration, as eight
/// independent add chains); each block's lanes are added as a fixed tree, then its tail in
/// f64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(x: &[f32]) -> f64 {
    use std::arch::x86_64::*;
    let mut total = 0f64;
    for block in x.chunks(SUM_BLOCK) {
        let mut acc = [_mm256_setzero_ps(); 8];
        let chunks = block.chunks_exact(L);
        let tail = chunks.remainder();
        for c in chunks {
            for (k, a) in acc.iter_mut().enumerate() {
                let v: &[f32; 8] = c[8 * k..8 * k + 8].try_into().expect("8 lanes");
                // Safety: `v` is 8 readable f32s.
                *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(v.as_ptr()) });
            }
        }
        let q0 = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let q1 = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        let v = _mm256_add_ps(q0, q1);
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_shuffle_ps::<1>(h, h));
        let mut s = f64::from(_mm_cvtss_f32(h));
        for &v in tail {
            s += f64::from(v);
        }
        total += s;
    }
    total
}

/// `a · b + c`, fused when the instance has FMA.
#[inline(always)]
fn madd<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F { a.mul_add(b, c) } else { a * b + c }
}

#[inline(always)]
fn map<T: Copy, O>(x: &[T], out: &mut [O], f: impl Fn(T) -> O) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
}

#[inline(always)]
fn unary_body<const F: bool>(op: Unary, x: &[f32], out: &mut [f32]) {
    match op {
        Unary::Neg => map(x, out, |v| -v),
        Unary::Abs => map(x, out, f32::abs),
        Unary::Sqrt => map(x, out, f32::sqrt),
        Unary::Exp => map(x, out, exp::<F>),
        Unary::Log => map(x, out, log::<F>),
        Unary::Tanh => map(x, out, tanh::<F>),
        // `v > 0 || v is NaN`: v, else +0.
        Unary::Relu => map(x, out, |v| if v > 0.0 || v.is_nan() { v } else { 0.0 }),
        Unary::Sigmoid => map(x, out, |v| 1.0 / (1.0 + exp::<F>(-v))),
        Unary::Sin => {
            map(x, out, sin_reduced::<F, false>);
            trig_fixup(x, out, f64::sin);
        }
        Unary::Cos => {
            map(x, out, sin_reduced::<F, true>);
            trig_fixup(x, out, f64::cos);
        }
        Unary::Erf => map(x, out, |v| {
            let a = v.abs();
            let y = if a < 1.0 {
                erf_small::<F>(a)
            } else {
                1.0 - erfc_large::<F>(a)
            };
            if v.is_nan() { v } else { y.copysign(v) }
        }),
        // x · Φ(x), the negative side as x · erfc(|x|/√2) / 2: no cancellation.
        Unary::Gelu => map(x, out, gelu::<F>),
        // 1 + tanh z = 2 · sigmoid(2z), so the tanh form is x · sigmoid(2z).
        Unary::GeluTanh => map(x, out, |v| {
            let z = GELU_K * madd::<F>(0.044_715 * v * v, v, v);
            v / (1.0 + exp::<F>(-2.0 * z))
        }),
        Unary::Silu => map(x, out, |v| v / (1.0 + exp::<F>(-v))),
    }
}

/// √(2/π)
const GELU_K: f32 = 0.797_884_6;

/// Past this magnitude `sin`/`cos` reduce in f64 ([`trig_fixup`]): the three-part π/4 of
/// [`sin_reduced`] keeps its error at an ulp up to here.
const TRIG_LIMIT: f32 = 8192.0;

/// `sin x` (`COS`: `cos x`) for `|x| ≤` [`TRIG_LIMIT`], Cephes' `sinf`/`cosf`: `j` the
/// nearest even multiple of π/4 to `|x|`, `r = |x| - j·π/4` in three parts (exact products),
/// then the sine or cosine polynomial on `r` by the octant, the sign by octant and input.
#[inline(always)]
fn sin_reduced<const F: bool, const COS: bool>(x: f32) -> f32 {
    let a = x.abs();
    let mut j = (a * 1.273_239_5) as i32;
    j = j.wrapping_add(1) & !1;
    let y = j as f32;
    let r = madd::<F>(y, -0.785_156_25, a);
    let r = madd::<F>(y, -2.418_756_5e-4, r);
    let r = madd::<F>(y, -3.774_895e-8, r);
    let z = r * r;
    let mut ps = -1.951_529_6e-4;
    ps = madd::<F>(ps, z, 8.332_161e-3);
    ps = madd::<F>(ps, z, -1.666_665_5e-1);
    let sin_r = madd::<F>(ps * z, r, r);
    let mut pc = 2.443_315_7e-5;
    pc = madd::<F>(pc, z, -1.388_731_6e-3);
    pc = madd::<F>(pc, z, 4.166_664_6e-2);
    let cos_r = madd::<F>(pc * z, z, madd::<F>(z, -0.5, 1.0));
    // Octant j/2 (mod 4): sin x = sin r, cos r, -sin r, -cos r; cos x one octant on.
    let q = if COS { j / 2 + 1 } else { j / 2 };
    let v = if q & 1 == 1 { cos_r } else { sin_r };
    let negative = (q & 2 == 2) != (!COS && x < 0.0);
    if negative { -v } else { v }
}

/// Elements past [`TRIG_LIMIT`] (and inf/NaN) by the f64 function, rounded once. The check
/// is one vector pass; the f64 calls sit behind a function LLVM cannot inline, so it does not
/// if-convert the loop into a call per element (it did: `sin` is a pure intrinsic).
#[inline(always)]
fn trig_fixup(x: &[f32], out: &mut [f32], f: fn(f64) -> f64) {
    // `&`, not `all`: no early exit, so the check vectorizes.
    if x.iter().fold(true, |ok, v| ok & (v.abs() <= TRIG_LIMIT)) {
        return;
    }
    #[cold]
    #[inline(never)]
    fn slow(x: &[f32], out: &mut [f32], f: fn(f64) -> f64) {
        for (o, &v) in out.iter_mut().zip(x) {
            if v.is_nan() || v.abs() > TRIG_LIMIT {
                *o = f(f64::from(v)) as f32;
            }
        }
    }
    slow(x, out, f)
}

/// `gelu x = x · Φ(x)` with `h = 1 - Φ(|x|) = erfc(|x|/√2) / 2` in one formula,
/// `h = u · 2^{Q(u) - x²·log2(e)/2}`, `u = 1/(2√2 + |x|)`, Q of degree 9 fitted by
/// `tools/fit_erf.py`; then `x · h` for x < 0 (no cancellation in the negative tail) and
/// `x · (1 - h)` above. `2^y` is `2^n · (1 + r·E(r))` with `n` the nearest integer, the
/// scale added to the exponent bits (y stays in `[-125, 1]`; below, h is flushed to 0).
/// About 19 multiply-adds per element — the cost of GELU is those, so the exponent is kept
/// in base 2 (no `ln 2` reduction) and `0.5` and `√2` are folded into the fit. Errors
/// (the tool's report): ≤ 6 ulp for x > 0, relative ≤ 7.7e-7 on `[-3, 0)` and ≤ 7.3e-6
/// beyond (the rounding of `y`).
#[inline(always)]
#[allow(clippy::approx_constant)]
fn gelu<const F: bool>(v: f32) -> f32 {
    // 1.5 · 2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let u = 1.0 / (v.abs() + 2.828_427);
    let mut q = 2_294.118_2;
    q = madd::<F>(q, u, -3_775.274_2);
    q = madd::<F>(q, u, 2_209.608);
    q = madd::<F>(q, u, -416.469_3);
    q = madd::<F>(q, u, -49.674_755);
    q = madd::<F>(q, u, 5.527_642_7);
    q = madd::<F>(q, u, 0.477_006_58);
    q = madd::<F>(q, u, 4.510_843);
    q = madd::<F>(q, u, 4.072_981);
    q = madd::<F>(q, u, -1.325_620_7);
    // -log2(e) / 2
    let y = madd::<F>(v * -0.721_347_5, v, q);
    let t = y + MAGIC;
    let r = y - (t - MAGIC);
    let mut e = 1.333_351_8e-3;
    e = madd::<F>(e, r, 9.666_245e-3);
    e = madd::<F>(e, r, 5.550_500_4e-2);
    e = madd::<F>(e, r, 0.240_223_51);
    e = madd::<F>(e, r, 0.693_147_1);
    let p = madd::<F>(e, r, 1.0);
    // p · 2^n: n (t's low bits, exactly while |n| < 2^22) added to p's exponent.
    let n = t.to_bits().wrapping_sub(MAGIC.to_bits());
    let scaled = f32::from_bits(p.to_bits().wrapping_add(n << 23));
    let h = if y < -125.0 { 0.0 } else { u * scaled };
    v * if v < 0.0 { h } else { 1.0 - h }
}

/// `erf a` for `0 ≤ a < 1`: `a · P(a²)`, P fitted (weighted least squares, iterated towards
/// minimax) by `tools/fit_erf.py`; ≤ 2 ulp.
#[inline(always)]
#[allow(clippy::approx_constant)]
fn erf_small<const F: bool>(a: f32) -> f32 {
    let z = a * a;
    let mut p = 7.854_221e-5;
    p = madd::<F>(p, z, -8.010_311e-4);
    p = madd::<F>(p, z, 5.188_342_6e-3);
    p = madd::<F>(p, z, -2.685_382e-2);
    p = madd::<F>(p, z, 0.112_835_854);
    p = madd::<F>(p, z, -3.761_262_6e-1);
    // The fit's constant term: 2/√π less one ulp.
    p = madd::<F>(p, z, 1.128_379_1);
    p * a
}

/// `erfc a` for `a ≥ 1`: `e^{-a²} / a · R(1/a²)`, R fitted on `[1, 4]` by `tools/fit_erf.py`
/// (beyond 4 `erf` is 1 in f32, and this tends to the asymptotic `e^{-a²} / (a√π)`).
#[inline(always)]
fn erfc_large<const F: bool>(a: f32) -> f32 {
    let z = a * a;
    // One division: 1/a, and 1/a² from it.
    let ia = 1.0 / a;
    let u = ia * ia;
    let mut r = -0.126_676_53;
    r = madd::<F>(r, u, 0.696_419_84);
    r = madd::<F>(r, u, -1.682_409);
    r = madd::<F>(r, u, 2.369_335);
    r = madd::<F>(r, u, -2.193_737);
    r = madd::<F>(r, u, 1.455_897_3);
    r = madd::<F>(r, u, -0.772_518_8);
    r = madd::<F>(r, u, 0.397_908_45);
    r = madd::<F>(r, u, -0.280_797_24);
    r = madd::<F>(r, u, 0.564_161_5);
    // e^{-a²} underflows to 0 past a ≈ 10.
    exp::<F>(-z) * r * ia
}

/// Cephes `logf`: `x = m · 2^e` with `m` in `[√½, √2)`, `ln x = ln m + e · ln 2` with `ln(1 + f)`
/// a degree-9 polynomial; subnormals are scaled by `2^23` first. `ln 0 = -inf`, `ln x = NaN` for
/// `x < 0`, `ln inf = inf`, NaN stays NaN.
#[inline(always)]
fn log<const F: bool>(x: f32) -> f32 {
    let tiny = x < f32::MIN_POSITIVE;
    let xs = if tiny { x * 8_388_608.0 } else { x };
    let bits = xs.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 126 - if tiny { 23 } else { 0 };
    // The mantissa in [0.5, 1).
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let low = m < std::f32::consts::FRAC_1_SQRT_2;
    if low {
        e -= 1;
    }
    let f = if low { m + m - 1.0 } else { m - 1.0 };
    let ef = e as f32;
    let z = f * f;
    let mut p = 7.037_683_6e-2;
    p = madd::<F>(p, f, -1.151_461e-1);
    p = madd::<F>(p, f, 1.167_699_9e-1);
    p = madd::<F>(p, f, -1.242_014_1e-1);
    p = madd::<F>(p, f, 1.424_932_3e-1);
    p = madd::<F>(p, f, -1.666_805_8e-1);
    p = madd::<F>(p, f, 2.000_071_5e-1);
    p = madd::<F>(p, f, -2.499_999_4e-1);
    p = madd::<F>(p, f, 3.333_333e-1);
    let mut y = p * f * z;
    y = madd::<F>(ef, -2.121_944_4e-4, y);
    y = madd::<F>(z, -0.5, y);
    let r = madd::<F>(ef, 0.693_359_4, f + y);
    if x == 0.0 {
        f32::NEG_INFINITY
    } else if x < 0.0 || x.is_nan() {
        f32::NAN
    } else if x == f32::INFINITY {
        f32::INFINITY
    } else {
        r
    }
}

/// Cephes `tanhf`: `x + x³·P(x²)` for `|x| < 0.625`, else `±(1 - 2/(e^{2|x|} + 1))`.
#[inline(always)]
fn tanh<const F: bool>(x: f32) -> f32 {
    let z = x * x;
    let mut p = -5.704_988_7e-3;
    p = madd::<F>(p, z, 2.063_908_8e-2);
    p = madd::<F>(p, z, -5.373_971_6e-2);
    p = madd::<F>(p, z, 0.133_314_42);
    p = madd::<F>(p, z, -0.333_332_8);
    let small = madd::<F>(p * z, x, x);
    let a = x.abs();
    // e^{2|x|} overflows past 44; tanh is 1 in f32 long before.
    let e = exp::<F>(if a > 40.0 { 80.0 } else { a + a });
    let big = (1.0 - 2.0 / (e + 1.0)).copysign(x);
    if a < 0.625 || x.is_nan() { small } else { big }
}

#[inline(always)]
fn zip_with<T: Copy, O>(a: &[T], b: &[T], out: &mut [O], f: impl Fn(T, T) -> O) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

#[inline(always)]
fn apply2<T: Copy, O: Copy>(a: Side<T>, b: Side<T>, out: &mut [O], f: impl Fn(T, T) -> O + Copy) {
    match (a, b) {
        (Side::Full(a), Side::Full(b)) => zip_with(a, b, out, f),
        (Side::Full(a), Side::Scalar(s)) => map(a, out, |x| f(x, s)),
        (Side::Scalar(s), Side::Full(b)) => map(b, out, |y| f(s, y)),
        (Side::Full(a), Side::Row(r)) => {
            for (o, a) in out.chunks_exact_mut(r.len()).zip(a.chunks_exact(r.len())) {
                zip_with(a, r, o, f);
            }
        }
        (Side::Row(r), Side::Full(b)) => {
            for (o, b) in out.chunks_exact_mut(r.len()).zip(b.chunks_exact(r.len())) {
                zip_with(r, b, o, f);
            }
        }
        (Side::Scalar(x), Side::Scalar(y)) => out.fill(f(x, y)),
        (Side::Row(r), Side::Scalar(s)) => {
            for o in out.chunks_exact_mut(r.len()) {
                map(r, o, |x| f(x, s));
            }
        }
        (Side::Scalar(s), Side::Row(r)) => {
            for o in out.chunks_exact_mut(r.len()) {
                map(r, o, |y| f(s, y));
            }
        }
        (Side::Row(p), Side::Row(q)) => {
            for o in out.chunks_exact_mut(p.len()) {
                zip_with(p, q, o, f);
            }
        }
        // A column's value is a scalar over each run of `inner` elements.
        (Side::Full(a), Side::Column { col, inner, first }) => {
            let runs = out.chunks_exact_mut(inner).zip(a.chunks_exact(inner));
            for ((o, a), &s) in runs.zip(col[first..].iter().chain(col.iter().cycle())) {
                map(a, o, |x| f(x, s));
            }
        }
        (Side::Column { col, inner, first }, Side::Full(b)) => {
            let runs = out.chunks_exact_mut(inner).zip(b.chunks_exact(inner));
            for ((o, b), &s) in runs.zip(col[first..].iter().chain(col.iter().cycle())) {
                map(b, o, |y| f(s, y));
            }
        }
        (Side::Column { col, inner, first }, Side::Scalar(t)) => {
            for (o, &s) in out
                .chunks_exact_mut(inner)
                .zip(col[first..].iter().chain(col.iter().cycle()))
            {
                o.fill(f(s, t));
            }
        }
        (Side::Scalar(t), Side::Column { col, inner, first }) => {
            for (o, &s) in out
                .chunks_exact_mut(inner)
                .zip(col[first..].iter().chain(col.iter().cycle()))
            {
                o.fill(f(t, s));
            }
        }
        // Column against a row or a column: element by element (not made by eager dispatch).
        (a @ (Side::Row(_) | Side::Column { .. }), b @ Side::Column { .. })
        | (a @ Side::Column { .. }, b @ Side::Row(_)) => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f(a.at(i), b.at(i));
            }
        }
    }
}

/// The float element types of the binary and comparison bodies.
trait Real:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    const NAN: Self;
    fn nan(self) -> bool;
}

impl Real for f32 {
    const NAN: f32 = f32::NAN;
    #[inline(always)]
    fn nan(self) -> bool {
        self.is_nan()
    }
}

impl Real for f64 {
    const NAN: f64 = f64::NAN;
    #[inline(always)]
    fn nan(self) -> bool {
        self.is_nan()
    }
}

#[inline(always)]
fn binary_of<T: Real>(op: Binary, a: Side<T>, b: Side<T>, out: &mut [T]) {
    match op {
        Binary::Add => apply2(a, b, out, |x, y| x + y),
        Binary::Sub => apply2(a, b, out, |x, y| x - y),
        Binary::Mul => apply2(a, b, out, |x, y| x * y),
        Binary::Div => apply2(a, b, out, |x, y| x / y),
        Binary::Max => apply2(a, b, out, |x, y| {
            let m = if x > y { x } else { y };
            if x.nan() || y.nan() { T::NAN } else { m }
        }),
        Binary::Min => apply2(a, b, out, |x, y| {
            let m = if x < y { x } else { y };
            if x.nan() || y.nan() { T::NAN } else { m }
        }),
    }
}

#[inline(always)]
fn compare_of<T: Real>(op: Compare, a: Side<T>, b: Side<T>, out: &mut [u8]) {
    match op {
        Compare::Eq => apply2(a, b, out, |x, y| u8::from(x == y)),
        Compare::Ne => apply2(a, b, out, |x, y| u8::from(x != y)),
        Compare::Lt => apply2(a, b, out, |x, y| u8::from(x < y)),
        Compare::Le => apply2(a, b, out, |x, y| u8::from(x <= y)),
        Compare::Gt => apply2(a, b, out, |x, y| u8::from(x > y)),
        Compare::Ge => apply2(a, b, out, |x, y| u8::from(x >= y)),
    }
}

#[inline(always)]
fn binary_body<const F: bool>(op: Binary, a: Side, b: Side, out: &mut [f32]) {
    binary_of(op, a, b, out)
}

#[inline(always)]
fn compare_body<const F: bool>(op: Compare, a: Side, b: Side, out: &mut [u8]) {
    compare_of(op, a, b, out)
}

#[inline(always)]
fn binary_f64_body<const F: bool>(op: Binary, a: Side<f64>, b: Side<f64>, out: &mut [f64]) {
    binary_of(op, a, b, out)
}

#[inline(always)]
fn compare_f64_body<const F: bool>(op: Compare, a: Side<f64>, b: Side<f64>, out: &mut [u8]) {
    compare_of(op, a, b, out)
}

#[inline(always)]
fn unary_f64_body<const F: bool>(op: Unary, x: &[f64], out: &mut [f64]) {
    match op {
        Unary::Neg => map(x, out, |v| -v),
        Unary::Abs => map(x, out, f64::abs),
        Unary::Sqrt => map(x, out, f64::sqrt),
        Unary::Relu => map(x, out, |v| if v > 0.0 || v.is_nan() { v } else { 0.0 }),
        other => unreachable!("unary_f64 checks its op ({other:?})"),
    }
}

#[inline(always)]
fn unary_half_body<const F: bool>(op: Unary, half: Half, x: &[u16], out: &mut [u16]) {
    let (mut a, mut o) = ([0f32; HALF_CHUNK], [0f32; HALF_CHUNK]);
    for (xc, oc) in x.chunks(HALF_CHUNK).zip(out.chunks_mut(HALF_CHUNK)) {
        let n = xc.len();
        widen(half, xc, &mut a[..n]);
        unary_body::<F>(op, &a[..n], &mut o[..n]);
        narrow(half, &o[..n], oc);
    }
}

/// Side `s` for output elements `c0..c0 + n` as f32: its widened row or column (`wide`), its
/// scalar, or `None` for a full side, whose elements are widened into `buf`.
#[inline(always)]
fn half_side<'w>(
    half: Half,
    s: Side<u16>,
    wide: &'w [f32],
    buf: &mut [f32],
    c0: usize,
    n: usize,
) -> Option<Side<'w, f32>> {
    Some(match s {
        Side::Full(v) => {
            widen(half, &v[c0..c0 + n], &mut buf[..n]);
            return None;
        }
        Side::Scalar(h) => {
            let mut w = [0f32];
            widen(half, &[h], &mut w);
            Side::Scalar(w[0])
        }
        Side::Row(_) => Side::Row(wide),
        Side::Column { inner, first, .. } => Side::Column {
            col: wide,
            inner,
            first,
        }
        .part(c0, c0 + n),
    })
}

/// Output elements `lo..lo + out.len()` of a half binary op; each side with its row or
/// column widened (empty for full and scalar sides). `lo` and the chunks are multiples of
/// `align`.
#[inline(always)]
fn binary_half_body<const F: bool>(
    op: Binary,
    half: Half,
    (a, wa): (Side<u16>, &[f32]),
    (b, wb): (Side<u16>, &[f32]),
    lo: usize,
    align: usize,
    out: &mut [u16],
) {
    let ch = (HALF_CHUNK / align).max(1) * align;
    let mut bufs = [vec![0f32; ch], vec![0f32; ch], vec![0f32; ch]];
    let [ba, bb, bo] = &mut bufs;
    for (k, oc) in out.chunks_mut(ch).enumerate() {
        let (c0, n) = (lo + k * ch, oc.len());
        let sa = half_side(half, a, wa, ba, c0, n).unwrap_or(Side::Full(&ba[..n]));
        let sb = half_side(half, b, wb, bb, c0, n).unwrap_or(Side::Full(&bb[..n]));
        binary_body::<F>(op, sa, sb, &mut bo[..n]);
        narrow(half, &bo[..n], oc);
    }
}

/// The largest (`max`) or smallest element of a non-empty `x`, NaN if any element is: L lanes
/// of running extremes (vector max/min) and of NaN flags, then the lanes.
#[inline(always)]
fn extreme_body<const F: bool>(max: bool, x: &[f32]) -> f32 {
    #[inline(always)]
    fn run<const MAX: bool>(x: &[f32]) -> f32 {
        let pick = |acc: f32, v: f32| {
            if MAX {
                if acc > v { acc } else { v }
            } else if acc < v {
                acc
            } else {
                v
            }
        };
        let mut lanes = [x[0]; L];
        let mut nan = [0u32; L];
        let chunks = x.chunks_exact(L);
        let tail = chunks.remainder();
        for c in chunks {
            for i in 0..L {
                lanes[i] = pick(lanes[i], c[i]);
                nan[i] |= u32::from(c[i].is_nan());
            }
        }
        // The lanes halved in a tree (vector ops, not 64 dependent scalar steps).
        let mut w = L;
        while w > 1 {
            w /= 2;
            for i in 0..w {
                lanes[i] = pick(lanes[i], lanes[i + w]);
                nan[i] |= nan[i + w];
            }
        }
        let mut best = lanes[0];
        let mut any_nan = nan[0] != 0 || x[0].is_nan();
        for &v in tail {
            best = pick(best, v);
            any_nan |= v.is_nan();
        }
        if any_nan { f32::NAN } else { best }
    }
    if max { run::<true>(x) } else { run::<false>(x) }
}

/// Σ x: [`L`] f32 lanes per [`SUM_BLOCK`], block sums added in f64 (the portable body; x86-64
/// hosts with AVX2 run [`sum_avx2`]).
#[inline(always)]
fn sum_body<const F: bool>(x: &[f32]) -> f64 {
    let mut total = 0f64;
    for block in x.chunks(SUM_BLOCK) {
        let mut lanes = [0f32; L];
        let chunks = block.chunks_exact(L);
        let tail = chunks.remainder();
        for c in chunks {
            for i in 0..L {
                lanes[i] += c[i];
            }
        }
        // The lanes halved in a fixed tree (vector adds; every instance gives the same bits),
        // then the tail in f64.
        let mut w = L;
        while w > 1 {
            w /= 2;
            for i in 0..w {
                lanes[i] += lanes[i + w];
            }
        }
        let mut s = f64::from(lanes[0]);
        for &v in tail {
            s += f64::from(v);
        }
        total += s;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values over every range the kernels treat differently: tiny, around the tanh switch,
    /// large, past exp's limits, ±0, ±inf and NaN.
    fn probe() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            0.624,
            0.626,
            -0.626,
            1.0,
            -1.0,
            9.0,
            -9.0,
            40.5,
            88.0,
            88.8,
            -87.0,
            -104.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            1.4e-45,
            // Either side of log's mantissa switch at √½.
            f32::from_bits(std::f32::consts::FRAC_1_SQRT_2.to_bits() - 1),
            f32::from_bits(std::f32::consts::FRAC_1_SQRT_2.to_bits() + 1),
            1.0000001,
            0.99999994,
        ];
        let mut s = 12345u64;
        for _ in 0..3000 {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            v.push(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0);
            // And positive values over the whole exponent range (for log).
            v.push(f32::from_bits(((s >> 7) as u32) & 0x7f7f_ffff));
        }
        v
    }

    fn ulps(a: f32, b: f32) -> u32 {
        if a.is_nan() || b.is_nan() {
            return if a.is_nan() && b.is_nan() { 0 } else { u32::MAX };
        }
        if a == b {
            return 0;
        }
        let key = |x: f32| {
            let i = x.to_bits() as i32;
            if i < 0 { i32::MIN.wrapping_sub(i) } else { i }
        };
        key(a).abs_diff(key(b))
    }

    fn reference(op: Unary, v: f64) -> f64 {
        match op {
            Unary::Neg => -v,
            Unary::Abs => v.abs(),
            Unary::Sqrt => v.sqrt(),
            Unary::Exp => v.exp(),
            Unary::Log => v.ln(),
            Unary::Tanh => v.tanh(),
            Unary::Relu if v.is_nan() => v,
            Unary::Relu => v.max(0.0),
            Unary::Sigmoid => 1.0 / (1.0 + (-v).exp()),
            Unary::Sin => v.sin(),
            Unary::Cos => v.cos(),
            Unary::Erf => libm::erf(v),
            // The definitions, written without their cancellation for x < 0 (the reference's
            // `1 + erf` rounds the tail to 0 in f64 too, these kernels do not).
            Unary::Gelu => 0.5 * v * libm::erfc(-v / std::f64::consts::SQRT_2),
            Unary::GeluTanh => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                v / (1.0 + (-2.0 * k * (v + 0.044715 * v * v * v)).exp())
            }
            Unary::Silu => v / (1.0 + (-v).exp()),
        }
    }

    /// Every instance (baseline, AVX2, AVX-512 where the host has them) against f64.
    #[test]
    fn unary_ops_match_f64_within_their_ulp_bounds_on_every_instance() {
        let x = probe();
        for (op, bound) in [
            (Unary::Neg, 0),
            (Unary::Abs, 0),
            (Unary::Sqrt, 0),
            (Unary::Relu, 0),
            (Unary::Exp, 2),
            (Unary::Log, 2),
            (Unary::Tanh, 3),
            (Unary::Sigmoid, 3),
            (Unary::Sin, 2),
            (Unary::Cos, 2),
            (Unary::Erf, 3),
            (Unary::Gelu, 6),
            (Unary::GeluTanh, 4),
            (Unary::Silu, 4),
        ] {
            let mut outs = vec![vec![0f32; x.len()]; 3];
            unary_body::<false>(op, &x, &mut outs[0]);
            let simd = Simd::detect();
            if simd != Simd::Baseline {
                unary_avx2(op, &x, &mut outs[1]);
            } else {
                outs[1] = outs[0].clone();
            }
            if simd == Simd::Avx512 {
                unary_avx512(op, &x, &mut outs[2]);
            } else {
                outs[2] = outs[1].clone();
            }
            for (k, out) in outs.iter().enumerate() {
                for (&v, &y) in x.iter().zip(out) {
                    let want = reference(op, f64::from(v)) as f32;
                    // exp flushes results below 2^-125 to 0 (documented).
                    let flushed = matches!(op, Unary::Exp | Unary::Sigmoid | Unary::Silu) && want.abs() < 2e-38;
                    if flushed {
                        assert!(y.abs() < 3e-38, "{op:?}({v}) = {y}, want {want}");
                        continue;
                    }
                    // GELU's negative tail is a product of e^{-z} with z rounded to f32 (and, for
                    // the erf form, a fit extrapolated past 4): relative error ≤ 3e-5 there, where
                    // values are below 1e-3 (x < -3.2); below 1e-30 absolute.
                    if matches!(op, Unary::Gelu | Unary::GeluTanh) && v < 0.0 {
                        let (y, w) = (f64::from(y), reference(op, f64::from(v)));
                        let ok = if w.is_nan() {
                            y.is_nan()
                        } else if w.abs() < 1e-30 {
                            (y - w).abs() <= 1e-30
                        } else {
                            (y - w).abs() <= 3e-5 * w.abs() && (w.abs() < 1e-3 || ulps(y as f32, want) <= 16)
                        };
                        assert!(ok, "{op:?}({v}) instance {k}: {y} vs {w}");
                        continue;
                    }
                    assert!(ulps(y, want) <= bound, "{op:?}({v}) instance {k}: {y} vs {want}");
                }
            }
        }
    }

    /// Comparisons give IEEE's answers (NaN: false but for `!=`) with every side kind, on every
    /// instance and thread count.
    #[test]
    fn comparisons_follow_ieee_with_every_side_kind() {
        let x = probe();
        let n = x.len() / 10 * 10;
        let (a, b) = (&x[..n], &x[1..n + 1]);
        let (row, scalar) = (&x[3..13], f32::NAN);
        type Rule = fn(f32, f32) -> bool;
        let ops: [(Compare, Rule); 6] = [
            (Compare::Eq, |p, q| p == q),
            (Compare::Ne, |p, q| p != q),
            (Compare::Lt, |p, q| p < q),
            (Compare::Le, |p, q| p <= q),
            (Compare::Gt, |p, q| p > q),
            (Compare::Ge, |p, q| p >= q),
        ];
        for (op, f) in ops {
            for (sa, sb) in [
                (Side::Full(a), Side::Full(b)),
                (Side::Full(a), Side::Row(row)),
                (Side::Row(row), Side::Full(b)),
                (Side::Full(a), Side::Scalar(0.5)),
                (Side::Scalar(scalar), Side::Full(b)),
                (Side::Full(a), Side::Full(a)),
                (
                    Side::Full(a),
                    Side::Column {
                        col: row,
                        inner: 5,
                        first: 0,
                    },
                ),
                (
                    Side::Column {
                        col: row,
                        inner: 2,
                        first: 3,
                    },
                    Side::Full(b),
                ),
                (
                    Side::Column {
                        col: row,
                        inner: 2,
                        first: 3,
                    },
                    Side::Scalar(0.5),
                ),
            ] {
                let value = |s: Side, i: usize| s.at(i);
                for threads in [1, 2, 3] {
                    let mut out = vec![7u8; n];
                    compare(op, sa, sb, &mut out, threads);
                    for (i, &o) in out.iter().enumerate() {
                        let want = u8::from(f(value(sa, i), value(sb, i)));
                        assert_eq!(o, want, "{op:?} at {i}: {} vs {}", value(sa, i), value(sb, i));
                    }
                }
            }
        }
    }

    /// Max / min over rows and over everything: the scalar fold's value, NaN wherever a NaN
    /// is (first, middle, tail of a row), any thread count.
    #[test]
    fn max_and_min_reductions_find_the_extreme_and_propagate_nan() {
        let mut x: Vec<f32> = probe().into_iter().filter(|v| !v.is_nan()).collect();
        x.truncate(6000);
        let fold = |max: bool, v: &[f32]| {
            if v.iter().any(|v| v.is_nan()) {
                return f32::NAN;
            }
            v.iter()
                .copied()
                .fold(v[0], |a, b| if (b > a) == max && b != a { b } else { a })
        };
        for &n in &[1usize, 7, 64, 100, 1000] {
            let rows = x.len() / n;
            let data = &x[..rows * n];
            for op in [Reduce::Max, Reduce::Min] {
                let max = op == Reduce::Max;
                for threads in [1, 2] {
                    let mut out = vec![0f32; rows];
                    reduce_rows(op, data, n, &mut out, threads);
                    for (r, &o) in out.iter().enumerate() {
                        let want = fold(max, &data[r * n..(r + 1) * n]);
                        assert!(
                            o == want || (o.is_nan() && want.is_nan()),
                            "{op:?} row {r} of {n}: {o} vs {want}"
                        );
                    }
                    let all = reduce_all(op, data, threads);
                    assert_eq!(all, fold(max, data), "{op:?} of all {}", data.len());
                }
            }
        }
        // A NaN anywhere wins, on every instance.
        for at in [0, 5, 64, 100, 5999] {
            let mut y = x.clone();
            y[at] = f32::NAN;
            for op in [Reduce::Max, Reduce::Min] {
                assert!(reduce_all(op, &y, 2).is_nan(), "{op:?} with a NaN at {at}");
                let mut out = vec![0f32; 60];
                reduce_rows(op, &y, 100, &mut out, 1);
                assert!(out[at / 100].is_nan(), "{op:?} row with a NaN at {at}");
                assert!(out.iter().enumerate().all(|(r, v)| r == at / 100 || !v.is_nan()));
            }
        }
    }

    #[test]
    fn binary_ops_are_exact_with_every_broadcast_and_across_threads() {
        let x = probe();
        let n = x.len() / 10 * 10;
        let a = &x[..n];
        let b: Vec<f32> = a.iter().rev().copied().collect();
        let row: Vec<f32> = b[..10].to_vec();
        let eval = |op: Binary, p: f32, q: f32| -> f32 {
            let (p, q) = (f64::from(p), f64::from(q));
            (match op {
                Binary::Add => p + q,
                Binary::Sub => p - q,
                Binary::Mul => p * q,
                Binary::Div => p / q,
                Binary::Max if p.is_nan() || q.is_nan() => f64::NAN,
                Binary::Max => p.max(q),
                Binary::Min if p.is_nan() || q.is_nan() => f64::NAN,
                Binary::Min => p.min(q),
            }) as f32
        };
        for op in [
            Binary::Add,
            Binary::Sub,
            Binary::Mul,
            Binary::Div,
            Binary::Max,
            Binary::Min,
        ] {
            for (sa, sb, pick) in [
                (
                    Side::Full(a),
                    Side::Full(&b),
                    (|i: usize, a: &[f32], b: &[f32], _: &[f32]| (a[i], b[i]))
                        as fn(usize, &[f32], &[f32], &[f32]) -> (f32, f32),
                ),
                (Side::Full(a), Side::Scalar(2.5), |i, a, _, _| (a[i], 2.5)),
                (Side::Scalar(-3.0), Side::Full(&b), |i, _, b, _| (-3.0, b[i])),
                (Side::Full(a), Side::Row(&row), |i, a, _, r| (a[i], r[i % 10])),
                (Side::Row(&row), Side::Full(&b), |i, _, b, r| (r[i % 10], b[i])),
                // A value per run of 5, the runs cycling through the column from its fourth.
                (
                    Side::Full(a),
                    Side::Column {
                        col: &row,
                        inner: 5,
                        first: 3,
                    },
                    |i, a, _, r| (a[i], r[(3 + i / 5) % 10]),
                ),
                (
                    Side::Column {
                        col: &row,
                        inner: 2,
                        first: 0,
                    },
                    Side::Full(&b),
                    |i, _, b, r| (r[(i / 2) % 10], b[i]),
                ),
                (
                    Side::Scalar(1.5),
                    Side::Column {
                        col: &row,
                        inner: 10,
                        first: 9,
                    },
                    |i, _, _, r| (1.5, r[(9 + i / 10) % 10]),
                ),
                (
                    Side::Row(&row[..5]),
                    Side::Column {
                        col: &row,
                        inner: 5,
                        first: 1,
                    },
                    |i, _, _, r| (r[i % 5], r[(1 + i / 5) % 10]),
                ),
            ] {
                for threads in [1, 3] {
                    let mut out = vec![0f32; n];
                    binary(op, sa, sb, &mut out, threads);
                    for (i, &y) in out.iter().enumerate() {
                        let (p, q) = pick(i, a, &b, &row);
                        let want = eval(op, p, q);
                        assert!(ulps(y, want) == 0, "{op:?}({p}, {q}) = {y}, want {want}");
                    }
                }
            }
        }
    }

    /// Large outputs at every offset from a cache line, split in tasks across threads: every
    /// element is written once, with its own operands, and nothing outside.
    #[test]
    fn split_outputs_at_any_alignment_cover_every_element_once() {
        let n = 100_003;
        let a: Vec<f32> = (0..n + 16).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n + 16).map(|i| 0.5 * i as f32).collect();
        for skip in 0..16 {
            let mut out = vec![f32::NAN; n + 16];
            let o = &mut out[skip..skip + n];
            binary(
                Binary::Add,
                Side::Full(&a[skip..skip + n]),
                Side::Full(&b[skip..skip + n]),
                o,
                3,
            );
            assert!(
                o.iter().enumerate().all(|(i, &y)| y == 1.5 * (skip + i) as f32),
                "offset {skip}"
            );
            assert!(
                out[..skip].iter().chain(&out[skip + n..]).all(|v| v.is_nan()),
                "wrote outside"
            );
            let mut u = vec![0f32; n];
            unary(Unary::Neg, &a[skip..skip + n], &mut u, 2);
            assert!(u.iter().enumerate().all(|(i, &y)| y == -((skip + i) as f32)));
        }
    }

    #[test]
    fn sums_are_close_to_f64_and_the_same_bits_for_any_thread_count() {
        // 1M + 7 values of mixed sign and magnitude; rows of 1000 and one whole.
        let n = (1 << 20) + 7;
        let mut s = 99u64;
        let x: Vec<f32> = (0..n)
            .map(|i| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.3) * if i % 7 == 0 { 1000.0 } else { 1.0 }
            })
            .collect();
        let exact: f64 = x.iter().map(|&v| f64::from(v)).sum();
        let abs: f64 = x.iter().map(|&v| f64::from(v).abs()).sum();
        let one = reduce_all(Reduce::Sum, &x, 1);
        assert_eq!(one.to_bits(), reduce_all(Reduce::Sum, &x, 4).to_bits());
        // f32 lanes over blocks of 4096: error ≪ n·eps·Σ|x|.
        assert!((f64::from(one) - exact).abs() <= 1e-6 * abs, "{one} vs {exact}");
        let mean = reduce_all(Reduce::Mean, &x, 2);
        assert!((f64::from(mean) - exact / n as f64).abs() <= 1e-6 * abs / n as f64);
        let rows = 1000;
        let m = n / rows;
        let mut out1 = vec![0f32; m];
        let mut out3 = vec![0f32; m];
        reduce_rows(Reduce::Mean, &x[..rows * m], rows, &mut out1, 1);
        reduce_rows(Reduce::Mean, &x[..rows * m], rows, &mut out3, 3);
        assert_eq!(out1, out3);
        for (r, &y) in out1.iter().enumerate() {
            let row = &x[r * rows..(r + 1) * rows];
            let want = row.iter().map(|&v| f64::from(v)).sum::<f64>() / rows as f64;
            let scale = row.iter().map(|&v| f64::from(v).abs()).sum::<f64>() / rows as f64;
            assert!(
                (f64::from(y) - want).abs() <= 1e-6 * scale + 1e-30,
                "row {r}: {y} vs {want}"
            );
        }
        // Empty: sum 0, mean NaN (as the reference: 0/0).
        assert_eq!(reduce_all(Reduce::Sum, &[], 2), 0.0);
        assert!(reduce_all(Reduce::Mean, &[], 2).is_nan());
    }

    /// bf16 rounding is `half`'s (nearest, ties to even, NaN kept quiet) on every f32 class:
    /// ties both ways, the largest finite values (rounding to inf), subnormals, NaNs.
    #[test]
    fn bf16_rounding_is_halfs() {
        let mut bits: Vec<u32> = vec![
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0x7f7f_ffff,
            0x7f7f_8000,
            0x0000_8000,
            0x0001_8000,
            0x7fc0_0001,
            0x7f80_0001,
            0xff80_0001,
            0x7f80_0000,
            0xff80_0000,
            0x8000_0000,
        ];
        let mut s = 1u64;
        for _ in 0..100_000 {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            bits.push((s >> 32) as u32);
        }
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut got = vec![0u16; src.len()];
        narrow(Half::Bf16, &src, &mut got);
        for ((&v, &g), &b) in src.iter().zip(&got).zip(&bits) {
            let want = half::bf16::from_f32(v).to_bits();
            assert_eq!(g, want, "{b:#010x}");
        }
        // Each vector path of this host on its own (`narrow` takes the widest).
        #[cfg(target_arch = "x86_64")]
        {
            type Path = unsafe fn(&[f32], &mut [u16]) -> usize;
            let mut paths: Vec<(&str, Path)> = Vec::new();
            if std::arch::is_x86_feature_detected!("avx512f") {
                paths.push(("avx512", bf16v::narrow_avx512));
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                paths.push(("avx2", bf16v::narrow_avx2));
            }
            for (name, path) in paths {
                let mut v = vec![0u16; src.len()];
                // Safety: the host has the path's instructions (detected above).
                let done = unsafe { path(&src, &mut v) };
                assert_eq!(done, src.len() / 16 * 16, "{name}");
                assert_eq!(v[..done], got[..done], "{name}");
            }
        }
        let mut back = vec![0f32; got.len()];
        widen(Half::Bf16, &got, &mut back);
        for (&g, &w) in got.iter().zip(&back) {
            assert_eq!(w.to_bits(), half::bf16::from_bits(g).to_f32().to_bits());
        }
    }

    /// Half binary and unary kernels over several tasks and chunks, with row, column and scalar
    /// sides: each element the f32 op of the widened operands, rounded once (`half`'s
    /// conversions), on every instance and thread count.
    #[test]
    fn half_kernels_widen_compute_and_round_each_element() {
        let n = 3 * 40_000;
        let x = probe();
        let vals: Vec<f32> = (0..n)
            .map(|i| x[i % x.len()] * if i % 3 == 0 { 1e-3 } else { 1.0 })
            .collect();
        for half in [Half::F16, Half::Bf16] {
            let to = |v: f32| match half {
                Half::F16 => half::f16::from_f32(v).to_bits(),
                Half::Bf16 => half::bf16::from_f32(v).to_bits(),
            };
            let from = |h: u16| match half {
                Half::F16 => half::f16::from_bits(h).to_f32(),
                Half::Bf16 => half::bf16::from_bits(h).to_f32(),
            };
            let a: Vec<u16> = vals.iter().map(|&v| to(v)).collect();
            let b: Vec<u16> = vals.iter().rev().map(|&v| to(v)).collect();
            // A row of 600 (not a divisor of the chunk) and a column of 7 values over runs of 40.
            let (row, col) = (&b[..600], &b[..7]);
            type At<'a> = Box<dyn Fn(usize) -> u16 + 'a>;
            let sides: [(Side<u16>, At); 4] = [
                (Side::Full(&b), Box::new(|i| b[i])),
                (Side::Row(row), Box::new(|i| row[i % 600])),
                (
                    Side::Column {
                        col,
                        inner: 40,
                        first: 0,
                    },
                    Box::new(|i| col[(i / 40) % 7]),
                ),
                (Side::Scalar(b[5]), Box::new(|_| b[5])),
            ];
            for (side, at) in &sides {
                for op in [Binary::Add, Binary::Div, Binary::Max] {
                    for threads in [1, 2] {
                        let mut out = vec![0u16; n];
                        binary_half(op, half, Side::Full(&a), *side, &mut out, threads);
                        for (i, &o) in out.iter().enumerate() {
                            let (p, q) = (from(a[i]), from(at(i)));
                            let mut w = [0f32];
                            binary_body::<false>(op, Side::Scalar(p), Side::Scalar(q), &mut w);
                            let want = to(w[0]);
                            assert!(
                                o == want || (from(o).is_nan() && from(want).is_nan()),
                                "{half:?} {op:?} {i}"
                            );
                        }
                    }
                }
            }
            for op in [Unary::Exp, Unary::Gelu, Unary::Sqrt] {
                let mut out = vec![0u16; n];
                unary_half(op, half, &a, &mut out, 2);
                let mut wide = vec![0f32; n];
                let aw: Vec<f32> = a.iter().map(|&h| from(h)).collect();
                unary_host(op, &aw, &mut wide);
                for (i, (&o, &w)) in out.iter().zip(&wide).enumerate() {
                    assert!(o == to(w) || (from(o).is_nan() && w.is_nan()), "{half:?} {op:?} {i}");
                }
            }
        }
    }

    /// f64 kernels: IEEE results, NaN propagating through max/min, on every side kind.
    #[test]
    fn f64_kernels_are_ieee() {
        let x: Vec<f64> = probe().iter().map(|&v| f64::from(v) * 1.000_000_1).collect();
        let n = x.len() / 10 * 10;
        let (a, b) = (&x[..n], &x[1..n + 1]);
        for threads in [1, 2] {
            for op in [
                Binary::Add,
                Binary::Sub,
                Binary::Mul,
                Binary::Div,
                Binary::Max,
                Binary::Min,
            ] {
                let mut out = vec![0f64; n];
                binary_f64(op, Side::Full(a), Side::Row(&b[..10]), &mut out, threads);
                for i in 0..n {
                    let (p, q) = (a[i], b[i % 10]);
                    let want = match op {
                        Binary::Add => p + q,
                        Binary::Sub => p - q,
                        Binary::Mul => p * q,
                        Binary::Div => p / q,
                        _ if p.is_nan() || q.is_nan() => f64::NAN,
                        // The reference's rule (it decides ±0 too).
                        Binary::Max => {
                            if p > q {
                                p
                            } else {
                                q
                            }
                        }
                        _ => {
                            if p < q {
                                p
                            } else {
                                q
                            }
                        }
                    };
                    assert!(
                        out[i].to_bits() == want.to_bits() || (out[i].is_nan() && want.is_nan()),
                        "{op:?} {p} {q}"
                    );
                }
            }
            let mut lt = vec![0u8; n];
            compare_f64(Compare::Lt, Side::Full(a), Side::Scalar(0.5), &mut lt, threads);
            assert!(lt.iter().zip(a).all(|(&l, &v)| (l == 1) == (v < 0.5)));
            let mut out = vec![0f64; n];
            unary_f64(Unary::Sqrt, a, &mut out, threads);
            assert!(
                out.iter()
                    .zip(a)
                    .all(|(o, v)| o.to_bits() == v.sqrt().to_bits() || (o.is_nan() && v.is_nan()))
            );
        }
    }
}
