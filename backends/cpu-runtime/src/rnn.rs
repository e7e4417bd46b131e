//! `lstm_seq`, a whole LSTM layer's recurrence, as one native kernel forward and one backward
//! (the cpu backend keeps the composite whole; eager mode calls [`lstm_seq_vjp`] for its
//! gradient), instead of a matrix product and a cell per step and the reverse of each.
//!
//! Forward, per step: the gates start as that step's rows of `xg`, `h w_hhᵀ` is added by one
//! `gemm` (reading the previous step's `h` where it was written, in `y`), then the cell runs
//! in place. Backward needs each step's gate activations and cell state; they are recomputed
//! rather than saved: every step's previous `h` is known from `y`, so all the gates come from
//! one large product `xg + h_prev w_hhᵀ` over all steps at once, and the cell states from a
//! cheap element-wise pass. The backward recurrence then takes one small product per step
//! (`dh_prev = dz w_hh`), and the weight gradient is one large product at the end
//! (`dw_hh = dzᵀ h_prev` over all steps) — where a step-by-step tape takes two products per
//! step and adds a `[4H, H]` gradient per step.
//!
//! The element-wise parts run one generic body instantiated for AVX-512, AVX2+FMA and the
//! baseline ([`Simd`]); f32 uses the row kernels' polynomial `exp` (`σ(x) = 1 / (1 + e^-x)`,
//! `tanh x = ±(1 − e^-2|x|) / (1 + e^-2|x|)`, absolute errors below 2e-7), f64 the standard
//! library's.

use crate::contraction::gemm_parallelism;
use crate::simd::Simd;
use gemm::Parallelism;
use oar_ir::{DType, TensorData};
use std::ops::{Add, Mul, Sub};

/// An element type the kernels compute in.
pub(crate) trait Real:
    Copy + Send + Sync + Default + 'static + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    /// `1 / (1 + e^-x)`.
    fn sigmoid<const F: bool>(self) -> Self;
    /// `tanh x`.
    fn tanh_<const F: bool>(self) -> Self;
}

impl Real for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    #[inline(always)]
    fn sigmoid<const F: bool>(self) -> f32 {
        1.0 / (1.0 + crate::rows::exp::<F>(-self))
    }
    #[inline(always)]
    fn tanh_<const F: bool>(self) -> f32 {
        let e = crate::rows::exp::<F>(-2.0 * self.abs());
        ((1.0 - e) / (1.0 + e)).copysign(self)
    }
}

impl Real for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    #[inline(always)]
    fn sigmoid<const F: bool>(self) -> f64 {
        1.0 / (1.0 + (-self).exp())
    }
    #[inline(always)]
    fn tanh_<const F: bool>(self) -> f64 {
        self.tanh()
    }
}

/// The sizes of one `lstm_seq`: batch `n`, steps `t`, hidden size `h`, and the direction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seq {
    pub n: usize,
    pub t: usize,
    pub h: usize,
    pub reverse: bool,
}

impl Seq {
    /// The sizes of `lstm_seq` on `xg[N, T, 4H]` with a state `[N, H]`.
    pub(crate) fn of(xg: &[usize], state: &[usize], reverse: bool) -> Result<Seq, String> {
        match (xg, state) {
            ([n, t, g], [n2, h]) if n == n2 && *g == 4 * h && *t > 0 => Ok(Seq {
                n: *n,
                t: *t,
                h: *h,
                reverse,
            }),
            _ => Err(format!(
                "lstm_seq needs xg[N, T, 4H] and a state [N, H], got {xg:?} and {state:?}"
            )),
        }
    }

    /// The steps in the order the recurrence runs them.
    fn steps(self) -> Vec<usize> {
        if self.reverse {
            (0..self.t).rev().collect()
        } else {
            (0..self.t).collect()
        }
    }
}

/// The operands `xg, w_hh, h0, c0`.
type Operands<'a, T> = (&'a [T], &'a [T], &'a [T], &'a [T]);
/// The cotangents of the results `y, h, c` (`None`: zero).
type Cotangents<'a, T> = (Option<&'a [T]>, Option<&'a [T]>, Option<&'a [T]>);

/// A matrix operand: base pointer, row stride, column stride (elements).
type Mat<T> = (*const T, usize, usize);

/// `dst[m×n]` (row stride `drs`) `= (acc ? dst : 0) + lhs[m×k] · rhs[k×n]`.
///
/// # Safety
/// Every element the strides address for these sizes is valid; `dst` overlaps neither operand.
#[allow(clippy::too_many_arguments)]
unsafe fn mm<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    drs: usize,
    acc: bool,
    lhs: Mat<T>,
    rhs: Mat<T>,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: `dst` as it is, or zeros.
        if !acc {
            for i in 0..m {
                // Safety: row `i` of `dst` holds `n` elements.
                unsafe { std::slice::from_raw_parts_mut(dst.add(i * drs), n).fill(T::ZERO) };
            }
        }
        return;
    }
    // Unit axes get tidy strides, so gemm's layout checks see the contiguous case.
    let tidy = |len: usize, s: usize| if len == 1 { 1 } else { s as isize };
    // Safety: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            if m == 1 { n as isize } else { drs as isize },
            acc,
            lhs.0,
            tidy(k, lhs.2),
            tidy(m, lhs.1),
            rhs.0,
            tidy(n, rhs.2),
            tidy(k, rhs.1),
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            par,
        );
    }
}

/// One step of the cell on one row: gate pre-activations `z[4H]` (i, f, g, o), the state `c[H]`
/// updated in place, the new `h` into `hy[H]`.
#[inline(always)]
fn cell_forward<T: Real, const F: bool>(z: &[T], c: &mut [T], hy: &mut [T]) {
    let h = c.len();
    let (zi, rest) = z.split_at(h);
    let (zf, rest) = rest.split_at(h);
    let (zg, zo) = rest.split_at(h);
    for (((((c, hy), &zi), &zf), &zg), &zo) in c.iter_mut().zip(hy.iter_mut()).zip(zi).zip(zf).zip(zg).zip(zo) {
        let cn = zf.sigmoid::<F>() * *c + zi.sigmoid::<F>() * zg.tanh_::<F>();
        *c = cn;
        *hy = zo.sigmoid::<F>() * cn.tanh_::<F>();
    }
}

/// Activations in place on one row of gate pre-activations (σ, σ, tanh, σ).
#[inline(always)]
fn activate<T: Real, const F: bool>(z: &mut [T], h: usize) {
    let (if_, rest) = z.split_at_mut(2 * h);
    let (g, o) = rest.split_at_mut(h);
    // Separate loops (a chained iterator would not vectorize).
    for v in if_.iter_mut() {
        *v = v.sigmoid::<F>();
    }
    for v in o.iter_mut() {
        *v = v.sigmoid::<F>();
    }
    for v in g.iter_mut() {
        *v = v.tanh_::<F>();
    }
}

/// One step of the cell's gradient on one row: activations `a[4H]`, this step's state `c`,
/// the previous state `cp`, the cotangent of this step's `h` (`dh`) and of its `c` (`dc`,
/// replaced by the previous state's); the gate pre-activations' cotangent into `dz[4H]`.
#[inline(always)]
fn cell_backward<T: Real, const F: bool>(a: &[T], c: &[T], cp: &[T], dh: &[T], dc: &mut [T], dz: &mut [T]) {
    let h = c.len();
    // Slices of exactly `h`, so the loop below indexes without bounds checks (and vectorizes).
    let (ai, af, ag, ao) = (&a[..h], &a[h..2 * h], &a[2 * h..3 * h], &a[3 * h..4 * h]);
    let (cp, dh, dc) = (&cp[..h], &dh[..h], &mut dc[..h]);
    let (dzi, rest) = dz[..4 * h].split_at_mut(h);
    let (dzf, rest) = rest.split_at_mut(h);
    let (dzg, dzo) = rest.split_at_mut(h);
    let one = T::ONE;
    for j in 0..h {
        let (i, f, g, o) = (ai[j], af[j], ag[j], ao[j]);
        let tc = c[j].tanh_::<F>();
        let dht = dh[j];
        let dct = dc[j] + dht * o * (one - tc * tc);
        dzi[j] = dct * g * i * (one - i);
        dzf[j] = dct * cp[j] * f * (one - f);
        dzg[j] = dct * i * (one - g * g);
        dzo[j] = dht * tc * o * (one - o);
        dc[j] = dct * f;
    }
}

/// `w[R, C]` transposed (row-major `[C, R]`).
fn transposed<T: Real>(w: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut t = vec![T::ZERO; rows * cols];
    for (c, out) in t.chunks_exact_mut(rows).enumerate() {
        for (r, o) in out.iter_mut().enumerate() {
            *o = w[r * cols + c];
        }
    }
    t
}

/// The forward recurrence: `y[N, T, H]`, the last `h` and `c` from `xg`, `w[4H, H]`, `h0`, `c0`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn forward<T: Real, const F: bool>(
    s: Seq,
    xg: &[T],
    w: &[T],
    h0: &[T],
    c0: &[T],
    y: &mut [T],
    h_out: &mut [T],
    c_out: &mut [T],
) {
    let (n, t, h, g4) = (s.n, s.t, s.h, 4 * s.h);
    let mut gates = vec![T::ZERO; n * g4];
    // w_hhᵀ once, row-major: gemm then reads it in place each step (transposed inside, it
    // is a column-major left operand) instead of packing w_hh every step.
    let wt = transposed(w, g4, h);
    c_out.copy_from_slice(c0);
    let mut prev: Option<usize> = None;
    for st in s.steps() {
        for r in 0..n {
            gates[r * g4..(r + 1) * g4].copy_from_slice(&xg[(r * t + st) * g4..][..g4]);
        }
        let hp: Mat<T> = match prev {
            None => (h0.as_ptr(), h, 1),
            // Safety: step `p`'s rows of `y` were written by the previous iteration.
            Some(p) => (unsafe { y.as_ptr().add(p * h) }, t * h, 1),
        };
        // gates += h_prev · w_hhᵀ.
        // Safety: the operands are live for these sizes; `gates` is separate scratch.
        unsafe {
            mm(
                n,
                g4,
                h,
                gates.as_mut_ptr(),
                g4,
                true,
                hp,
                (wt.as_ptr(), g4, 1),
                Parallelism::None,
            )
        };
        for r in 0..n {
            let c = &mut c_out[r * h..(r + 1) * h];
            cell_forward::<T, F>(&gates[r * g4..(r + 1) * g4], c, &mut y[(r * t + st) * h..][..h]);
        }
        prev = Some(st);
    }
    let last = prev.unwrap_or(0);
    for r in 0..n {
        h_out[r * h..(r + 1) * h].copy_from_slice(&y[(r * t + last) * h..][..h]);
    }
}

/// The cotangents of `lstm_seq`'s operands `(dxg, dw, dh0, dc0)` given its operands, its
/// result `y` and the cotangents of `y`, the last `h` and the last `c` (`None`: zero).
#[inline(always)]
fn backward<T: Real, const F: bool>(
    s: Seq,
    (xg, w, h0, c0): Operands<T>,
    y: &[T],
    (dy, dh_last, dc_last): Cotangents<T>,
    threads: usize,
) -> [Vec<T>; 4] {
    let (n, t, h, g4) = (s.n, s.t, s.h, 4 * s.h);
    let steps = s.steps();
    // Each step's previous h, [N, T, H].
    let mut hprev = vec![T::ZERO; n * t * h];
    for (k, &st) in steps.iter().enumerate() {
        for r in 0..n {
            let src = match k {
                0 => &h0[r * h..(r + 1) * h],
                _ => &y[(r * t + steps[k - 1]) * h..][..h],
            };
            hprev[(r * t + st) * h..][..h].copy_from_slice(src);
        }
    }
    // All gates at once: a = act(xg + h_prev · w_hhᵀ), [N, T, 4H].
    let mut a = xg.to_vec();
    let rows = n * t;
    let par = |flops: usize| gemm_parallelism(flops, threads);
    // Safety: the operands are live for these sizes; `a` is a separate buffer.
    let wt = transposed(w, g4, h);
    unsafe {
        mm(
            rows,
            g4,
            h,
            a.as_mut_ptr(),
            g4,
            true,
            (hprev.as_ptr(), h, 1),
            (wt.as_ptr(), g4, 1),
            par(rows * g4 * h),
        )
    };
    for z in a.chunks_exact_mut(g4) {
        activate::<T, F>(z, h);
    }
    // Each step's cell state, [N, T, H].
    let mut cs = vec![T::ZERO; n * t * h];
    let mut cp = vec![T::ZERO; h];
    for (k, &st) in steps.iter().enumerate() {
        for r in 0..n {
            let z = &a[(r * t + st) * g4..][..g4];
            cp.copy_from_slice(match k {
                0 => &c0[r * h..(r + 1) * h],
                _ => &cs[(r * t + steps[k - 1]) * h..][..h],
            });
            let (zi, zf, zg) = (&z[..h], &z[h..2 * h], &z[2 * h..3 * h]);
            for ((((c, &cp), &i), &f), &g) in cs[(r * t + st) * h..][..h].iter_mut().zip(&cp).zip(zi).zip(zf).zip(zg) {
                *c = f * cp + i * g;
            }
        }
    }
    // The recurrence backwards: dz (the cotangent of xg) step by step.
    let mut dz = vec![T::ZERO; n * t * g4];
    let mut dh = dh_last.map_or_else(|| vec![T::ZERO; n * h], <[T]>::to_vec);
    let mut dc = dc_last.map_or_else(|| vec![T::ZERO; n * h], <[T]>::to_vec);
    for (k, &st) in steps.iter().enumerate().rev() {
        for r in 0..n {
            let row = r * t + st;
            let cp = match k {
                0 => &c0[r * h..(r + 1) * h],
                _ => &cs[(r * t + steps[k - 1]) * h..][..h],
            };
            let dh = &mut dh[r * h..(r + 1) * h];
            if let Some(dy) = dy {
                dh.iter_mut().zip(&dy[row * h..][..h]).for_each(|(d, &y)| *d = *d + y);
            }
            cell_backward::<T, F>(
                &a[row * g4..][..g4],
                &cs[row * h..][..h],
                cp,
                dh,
                &mut dc[r * h..(r + 1) * h],
                &mut dz[row * g4..][..g4],
            );
        }
        // dh_prev = dz_step · w_hh.
        // Safety: the operands are live for these sizes; `dh` is separate from both.
        unsafe {
            mm(
                n,
                h,
                g4,
                dh.as_mut_ptr(),
                h,
                false,
                (dz.as_ptr().add(st * g4), t * g4, 1),
                (w.as_ptr(), h, 1),
                Parallelism::None,
            )
        };
    }
    // dw_hh = dzᵀ · h_prev over all steps, [4H, H].
    let mut dw = vec![T::ZERO; g4 * h];
    // Safety: as above.
    unsafe {
        mm(
            g4,
            h,
            rows,
            dw.as_mut_ptr(),
            h,
            false,
            (dz.as_ptr(), 1, g4),
            (hprev.as_ptr(), h, 1),
            par(g4 * h * rows),
        )
    };
    [dz, dw, dh, dc]
}

// [`forward`] and [`backward`] instantiated per instruction set.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn forward_avx512<T: Real>(
    s: Seq,
    xg: &[T],
    w: &[T],
    h0: &[T],
    c0: &[T],
    y: &mut [T],
    h_out: &mut [T],
    c_out: &mut [T],
) {
    forward::<T, true>(s, xg, w, h0, c0, y, h_out, c_out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn forward_avx2<T: Real>(
    s: Seq,
    xg: &[T],
    w: &[T],
    h0: &[T],
    c0: &[T],
    y: &mut [T],
    h_out: &mut [T],
    c_out: &mut [T],
) {
    forward::<T, true>(s, xg, w, h0, c0, y, h_out, c_out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn backward_avx512<T: Real>(
    s: Seq,
    ins: Operands<T>,
    y: &[T],
    cts: Cotangents<T>,
    threads: usize,
) -> [Vec<T>; 4] {
    backward::<T, true>(s, ins, y, cts, threads)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn backward_avx2<T: Real>(s: Seq, ins: Operands<T>, y: &[T], cts: Cotangents<T>, threads: usize) -> [Vec<T>; 4] {
    backward::<T, true>(s, ins, y, cts, threads)
}

/// The forward kernel on typed slices, for the host's instruction set.
#[allow(clippy::too_many_arguments)]
fn run_forward<T: Real>(s: Seq, xg: &[T], w: &[T], h0: &[T], c0: &[T], y: &mut [T], h_out: &mut [T], c_out: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    {
        // Safety: the features were detected on this host.
        match Simd::detect() {
            Simd::Avx512 => return unsafe { forward_avx512(s, xg, w, h0, c0, y, h_out, c_out) },
            Simd::Avx2Fma => return unsafe { forward_avx2(s, xg, w, h0, c0, y, h_out, c_out) },
            Simd::Baseline => {}
        }
    }
    forward::<T, false>(s, xg, w, h0, c0, y, h_out, c_out)
}

/// The backward kernel on typed slices, for the host's instruction set.
fn run_backward<T: Real>(s: Seq, ins: Operands<T>, y: &[T], cts: Cotangents<T>, threads: usize) -> [Vec<T>; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        // Safety: the features were detected on this host.
        match Simd::detect() {
            Simd::Avx512 => return unsafe { backward_avx512(s, ins, y, cts, threads) },
            Simd::Avx2Fma => return unsafe { backward_avx2(s, ins, y, cts, threads) },
            Simd::Baseline => {}
        }
    }
    backward::<T, false>(s, ins, y, cts, threads)
}

/// Whether the native kernels compute `lstm_seq` in this dtype.
pub fn lstm_seq_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64)
}

/// The forward kernel on the bytes of the operands `xg, w_hh, h0, c0` and the results
/// `y, h, c` (f32 or f64 as `dtype`; the slices hold [`Seq`]'s sizes).
pub(crate) fn run_native(s: Seq, dtype: DType, ins: [&[u8]; 4], outs: [&mut [u8]; 3]) -> Result<(), String> {
    fn typed<T: Real + bytemuck::Pod>(s: Seq, ins: [&[u8]; 4], outs: [&mut [u8]; 3]) -> Result<(), String> {
        fn cast<T: bytemuck::Pod>(b: &[u8]) -> Result<&[T], String> {
            if b.is_empty() {
                return Ok(&[]);
            }
            bytemuck::try_cast_slice(b).map_err(|e| format!("lstm_seq operand: {e}"))
        }
        fn cast_mut<T: bytemuck::Pod>(b: &mut [u8]) -> Result<&mut [T], String> {
            if b.is_empty() {
                return Ok(&mut []);
            }
            bytemuck::try_cast_slice_mut(b).map_err(|e| format!("lstm_seq result: {e}"))
        }
        let [y, h, c] = outs;
        let (y, h, c) = (cast_mut::<T>(y)?, cast_mut::<T>(h)?, cast_mut::<T>(c)?);
        let (xg, w, h0, c0) = (
            cast::<T>(ins[0])?,
            cast::<T>(ins[1])?,
            cast::<T>(ins[2])?,
            cast::<T>(ins[3])?,
        );
        let (state, g4) = (s.n * s.h, 4 * s.h);
        let fits = xg.len() == s.n * s.t * g4
            && w.len() == g4 * s.h
            && h0.len() == state
            && c0.len() == state
            && y.len() == s.n * s.t * s.h
            && h.len() == state
            && c.len() == state;
        if !fits {
            return Err(format!("lstm_seq buffers do not hold {s:?}"));
        }
        run_forward(s, xg, w, h0, c0, y, h, c);
        Ok(())
    }
    match dtype {
        DType::F32 => typed::<f32>(s, ins, outs),
        DType::F64 => typed::<f64>(s, ins, outs),
        other => Err(format!("lstm_seq has no native kernel in {other}")),
    }
}

/// Typed elements of `t` (f32/f64, which [`TensorData`] keeps aligned).
fn elems<T: bytemuck::Pod>(t: &TensorData) -> Result<&[T], String> {
    if t.bytes().is_empty() {
        // An empty buffer's pointer need not be aligned.
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(t.bytes()).map_err(|e| format!("lstm_seq: unaligned operand: {e}"))
}

/// The gradient of `lstm_seq` (`reverse` as its attribute) for eager autograd: the operands
/// `xg, w_hh, h0, c0`, the result `y` and the cotangents of `y`, the last `h` and the last `c`
/// (`None`: unused) give the cotangents of the operands `wants` marks. f32 and f64
/// ([`lstm_seq_dtype`]).
pub fn lstm_seq_vjp(
    reverse: bool,
    ins: &[TensorData],
    y: &TensorData,
    cts: &[Option<TensorData>],
    wants: &[bool],
    threads: usize,
) -> Result<Vec<Option<TensorData>>, String> {
    let [xg, w, h0, c0] = ins else {
        return Err(format!("lstm_seq takes 4 operands, got {}", ins.len()));
    };
    if cts.len() != 3 {
        return Err(format!("lstm_seq has 3 results, got {} cotangents", cts.len()));
    }
    let s = Seq::of(xg.shape(), h0.shape(), reverse)?;
    let dtype = xg.dtype();
    let fits = |t: &TensorData, shape: &[usize]| t.dtype() == dtype && t.shape() == shape;
    let (state, yshape) = ([s.n, s.h], [s.n, s.t, s.h]);
    let shapes_ok = fits(w, &[4 * s.h, s.h])
        && fits(h0, &state)
        && fits(c0, &state)
        && fits(y, &yshape)
        && cts
            .iter()
            .zip([&yshape[..], &state, &state])
            .all(|(c, sh)| c.as_ref().is_none_or(|c| fits(c, sh)));
    if !shapes_ok {
        return Err(format!(
            "lstm_seq gradient: operands, result and cotangents do not match xg {:?} ({dtype})",
            xg.shape()
        ));
    }
    fn typed<T: Real + bytemuck::Pod>(
        s: Seq,
        ins: [&TensorData; 4],
        y: &TensorData,
        cts: &[Option<TensorData>],
        threads: usize,
    ) -> Result<[Vec<T>; 4], String> {
        let ct = |i: usize| cts[i].as_ref().map(elems::<T>).transpose();
        Ok(run_backward::<T>(
            s,
            (elems(ins[0])?, elems(ins[1])?, elems(ins[2])?, elems(ins[3])?),
            elems(y)?,
            (ct(0)?, ct(1)?, ct(2)?),
            threads,
        ))
    }
    let four = [xg, w, h0, c0];
    let grads: Vec<TensorData> = match dtype {
        DType::F32 => typed::<f32>(s, four, y, cts, threads)?
            .into_iter()
            .zip(four)
            .map(|(g, x)| TensorData::from_vec(x.shape().to_vec(), g))
            .collect::<Result<_, _>>(),
        DType::F64 => typed::<f64>(s, four, y, cts, threads)?
            .into_iter()
            .zip(four)
            .map(|(g, x)| TensorData::from_vec(x.shape().to_vec(), g))
            .collect::<Result<_, _>>(),
        other => return Err(format!("lstm_seq has no native gradient in {other}")),
    }
    .map_err(|e| e.to_string())?;
    Ok(grads
        .into_iter()
        .zip(wants.iter().copied().chain(std::iter::repeat(false)))
        .map(|(g, want)| want.then_some(g))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    /// `lstm_seq` by its definition, in f64: `(y, h, c)`.
    fn naive(s: Seq, xg: &[f64], w: &[f64], h0: &[f64], c0: &[f64]) -> [Vec<f64>; 3] {
        let (n, t, h) = (s.n, s.t, s.h);
        let (mut hs, mut cs) = (h0.to_vec(), c0.to_vec());
        let mut y = vec![0.0; n * t * h];
        for st in s.steps() {
            let (mut h2, mut c2) = (hs.clone(), cs.clone());
            for r in 0..n {
                for j in 0..h {
                    let z = |k: usize| {
                        let rec: f64 = (0..h).map(|i| hs[r * h + i] * w[(k * h + j) * h + i]).sum();
                        xg[(r * t + st) * 4 * h + k * h + j] + rec
                    };
                    let cn = sig(z(1)) * cs[r * h + j] + sig(z(0)) * z(2).tanh();
                    c2[r * h + j] = cn;
                    h2[r * h + j] = sig(z(3)) * cn.tanh();
                    y[(r * t + st) * h + j] = h2[r * h + j];
                }
            }
            (hs, cs) = (h2, c2);
        }
        [y, hs, cs]
    }

    fn values(len: usize, seed: u64, scale: f64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                scale * ((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
            })
            .collect()
    }

    fn data(shape: &[usize], v: &[f64], dt: DType) -> TensorData {
        TensorData::from_f64_slice(dt, shape.to_vec(), v).unwrap()
    }

    #[test]
    fn forward_matches_the_definition_in_f32_and_f64() {
        for (n, t, h, reverse) in [(2, 3, 3, false), (3, 4, 19, true), (1, 2, 16, false)] {
            let s = Seq { n, t, h, reverse };
            let (xg, w) = (values(n * t * 4 * h, 1, 3.0), values(4 * h * h, 2, 1.0));
            let (h0, c0) = (values(n * h, 3, 1.0), values(n * h, 4, 2.0));
            let want = naive(s, &xg, &w, &h0, &c0);
            let mut got64 = [vec![0.0; n * t * h], vec![0.0; n * h], vec![0.0; n * h]];
            let [y, hh, cc] = &mut got64;
            run_forward(s, &xg, &w, &h0, &c0, y, hh, cc);
            let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            let mut got32 = [vec![0f32; n * t * h], vec![0f32; n * h], vec![0f32; n * h]];
            let [y, hh, cc] = &mut got32;
            run_forward(s, &f(&xg), &f(&w), &f(&h0), &f(&c0), y, hh, cc);
            for k in 0..3 {
                for (i, &a) in want[k].iter().enumerate() {
                    assert!(
                        (got64[k][i] - a).abs() <= 1e-13,
                        "f64 result {k}[{i}]: {} vs {a}",
                        got64[k][i]
                    );
                    let b = got32[k][i] as f64;
                    assert!(
                        (b - a).abs() <= 2e-6 + 1e-6 * a.abs(),
                        "f32 result {k}[{i}]: {b} vs {a}"
                    );
                }
            }
        }
    }

    /// The native gradient against central differences of `Σ y·ry + Σ h·rh + Σ c·rc` through the
    /// definition, every element of every operand, with each result's cotangent present or
    /// absent; and the f32 kernel against the f64 one.
    #[test]
    fn gradient_matches_finite_differences() {
        for (n, t, h, reverse, present) in [
            (2, 3, 3, false, [true, true, true]),
            (2, 4, 2, true, [true, false, true]),
            (3, 2, 3, false, [false, true, false]),
            (1, 1, 2, true, [false, false, true]),
        ] {
            let s = Seq { n, t, h, reverse };
            let shapes = [vec![n, t, 4 * h], vec![4 * h, h], vec![n, h], vec![n, h]];
            let scales = [2.0, 0.7, 1.0, 1.5];
            let ins: Vec<Vec<f64>> = (0..4)
                .map(|i| values(shapes[i].iter().product(), 10 + i as u64, scales[i]))
                .collect();
            let out_shapes = [vec![n, t, h], vec![n, h], vec![n, h]];
            let rs: Vec<Vec<f64>> = (0..3)
                .map(|k| values(out_shapes[k].iter().product(), 20 + k as u64, 1.0))
                .collect();
            let loss = |ins: &[Vec<f64>]| -> f64 {
                let outs = naive(s, &ins[0], &ins[1], &ins[2], &ins[3]);
                (0..3)
                    .filter(|&k| present[k])
                    .map(|k| outs[k].iter().zip(&rs[k]).map(|(a, b)| a * b).sum::<f64>())
                    .sum()
            };
            for dt in [DType::F64, DType::F32] {
                let tds: Vec<TensorData> = (0..4).map(|i| data(&shapes[i], &ins[i], dt)).collect();
                let y = data(&out_shapes[0], &naive(s, &ins[0], &ins[1], &ins[2], &ins[3])[0], dt);
                let cts: Vec<Option<TensorData>> = (0..3)
                    .map(|k| present[k].then(|| data(&out_shapes[k], &rs[k], dt)))
                    .collect();
                let grads = lstm_seq_vjp(reverse, &tds, &y, &cts, &[true; 4], 2).unwrap();
                let tol = if dt == DType::F64 { 1e-7 } else { 2e-5 };
                for (i, g) in grads.iter().enumerate() {
                    let g = g.as_ref().expect("wanted").to_f64_vec();
                    for e in 0..ins[i].len() {
                        let eps = 1e-6;
                        let mut up = ins.clone();
                        up[i][e] += eps;
                        let mut down = ins.clone();
                        down[i][e] -= eps;
                        let fd = (loss(&up) - loss(&down)) / (2.0 * eps);
                        assert!(
                            (g[e] - fd).abs() <= tol * (1.0 + fd.abs()),
                            "{dt} operand {i}[{e}] ({n}x{t}x{h}, reverse {reverse}, cotangents {present:?}): {} vs {fd}",
                            g[e]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn an_empty_batch_runs_and_has_empty_gradients() {
        let s = Seq {
            n: 0,
            t: 3,
            h: 2,
            reverse: true,
        };
        let (mut y, mut h, mut c) = (vec![0f32; 0], vec![0f32; 0], vec![0f32; 0]);
        run_forward(s, &[], &[0.5; 16], &[], &[], &mut y, &mut h, &mut c);
        let e = |shape: &[usize]| data(shape, &vec![0.5; shape.iter().product()], DType::F32);
        let ins = [e(&[0, 3, 8]), e(&[8, 2]), e(&[0, 2]), e(&[0, 2])];
        let grads = lstm_seq_vjp(
            true,
            &ins,
            &e(&[0, 3, 2]),
            &[Some(e(&[0, 3, 2])), None, None],
            &[true; 4],
            2,
        )
        .unwrap();
        let dw = grads[1].as_ref().expect("wanted").to_f64_vec();
        assert_eq!(dw, vec![0.0; 16], "no rows: no weight gradient");
        assert_eq!(grads[0].as_ref().expect("wanted").shape(), &[0, 3, 8]);
    }

    #[test]
    fn unwanted_gradients_are_none_and_bad_shapes_are_errors() {
        let s = Seq {
            n: 1,
            t: 2,
            h: 2,
            reverse: false,
        };
        let shapes = [vec![1, 2, 8], vec![8, 2], vec![1, 2], vec![1, 2]];
        let tds: Vec<TensorData> = shapes
            .iter()
            .map(|sh| data(sh, &values(sh.iter().product(), 5, 1.0), DType::F32))
            .collect();
        let y = data(&[1, 2, 2], &[0.0; 4], DType::F32);
        let grads = lstm_seq_vjp(
            false,
            &tds,
            &y,
            &[Some(y.clone()), None, None],
            &[false, true, false, false],
            1,
        )
        .unwrap();
        assert!(grads[0].is_none() && grads[1].is_some() && grads[2].is_none() && grads[3].is_none());
        let _ = s;
        let wrong = data(&[1, 3, 2], &[0.0; 6], DType::F32);
        let err = lstm_seq_vjp(false, &tds, &wrong, &[None, None, None], &[true; 4], 1).unwrap_err();
        assert!(err.contains("lstm_seq"), "{err}");
    }
}
