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

use crate::contraction::{SendPtr, WeightCache, gemm_parallelism};
use crate::par::par_units;
use crate::simd::Simd;
use gemm::Parallelism;
use oar_ir::{Composite, DType, TensorData};
use std::borrow::Cow;
use std::cell::UnsafeCell;
use std::ops::{Add, Mul, Sub};
use std::sync::atomic::{AtomicUsize, Ordering};

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
    /// `self · a + b`, fused where the instance has FMA (`F`).
    fn madd<const F: bool>(self, a: Self, b: Self) -> Self;
    /// `make()` kept in `cache` across runs where the type has a slot there (f32, when the
    /// data derives from a weight); otherwise made for this call. `len`: what `make` gives.
    fn prepared(cache: Option<&WeightCache>, len: usize, make: impl Fn() -> Vec<Self>) -> Cow<'_, [Self]>;
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
    #[inline(always)]
    fn madd<const F: bool>(self, a: f32, b: f32) -> f32 {
        if F { self.mul_add(a, b) } else { self * a + b }
    }
    fn prepared(cache: Option<&WeightCache>, len: usize, make: impl Fn() -> Vec<f32>) -> Cow<'_, [f32]> {
        crate::contraction::prepared(cache, len, make)
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
    #[inline(always)]
    fn madd<const F: bool>(self, a: f64, b: f64) -> f64 {
        if F { self.mul_add(a, b) } else { self * a + b }
    }
    fn prepared(_: Option<&WeightCache>, _: usize, make: impl Fn() -> Vec<f64>) -> Cow<'_, [f64]> {
        Cow::Owned(make())
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

/// `w[R, C]` transposed (row-major `[C, R]`), in 32 × 32 tiles (a column-order walk reads each
/// cache line of `w` once per element in it).
fn transposed<T: Real>(w: &[T], rows: usize, cols: usize) -> Vec<T> {
    const TILE: usize = 32;
    let mut t = vec![T::ZERO; rows * cols];
    if t.is_empty() {
        return t;
    }
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        for c0 in (0..cols).step_by(TILE) {
            for c in c0..(c0 + TILE).min(cols) {
                for r in r0..r1 {
                    t[c * rows + r] = w[r * cols + c];
                }
            }
        }
    }
    t
}

/// Batch rows up to which a sequence runs its step products as [`gemv_acc`] per row over
/// [`unit_panels`] (a [`Split`]) instead of through gemm, whose setup dominates a product of
/// one to a few rows.
const GEMV_ROWS: usize = 4;

/// Hidden units per block of [`unit_panels`].
const UNITS: usize = 16;

/// `w_hh[G·H, H]` as one panel per block of [`UNITS`] hidden units: panel `b` holds, for each
/// `k`, the `G · UNITS` weights `w[g·H + u, k]` of its units `u` (gate-major; zeros past `H`)
/// contiguously, so [`gemv_acc`] streams it and a chunk of consecutive blocks is a contiguous
/// run of panels. Made once per model when `w_hh` is a weight (f32: [`Real::prepared`]).
fn unit_panels<T: Real>(w: &[T], gates: usize, h: usize) -> Vec<T> {
    let width = gates * UNITS;
    let mut p = vec![T::ZERO; h.div_ceil(UNITS) * h * width];
    for g in 0..gates {
        for u in 0..h {
            let (b, j) = (u / UNITS, u % UNITS);
            let panel = &mut p[b * h * width..(b + 1) * h * width];
            for (k, &v) in w[(g * h + u) * h..(g * h + u + 1) * h].iter().enumerate() {
                panel[k * width + g * UNITS + j] = v;
            }
        }
    }
    p
}

/// `z[B·W] += x[K] · (panels)ᵀ` for `B` consecutive panels of width `W` (each `K` rows of `W`):
/// each panel's `W` sums kept in registers while `k` runs over its contiguous rows, fused
/// multiply-adds where the instance has FMA (`F`), vectorized at the width of the caller's
/// target features. The same arithmetic per column whichever panels a call covers.
#[inline(always)]
fn gemv_acc<T: Real, const F: bool, const W: usize>(z: &mut [T], x: &[T], panels: &[T]) {
    let k = x.len();
    for (zb, panel) in z.chunks_exact_mut(W).zip(panels.chunks_exact(k * W)) {
        let mut acc = [T::ZERO; W];
        acc.copy_from_slice(zb);
        for (&xk, row) in x.iter().zip(panel.chunks_exact(W)) {
            for (a, &w) in acc.iter_mut().zip(row) {
                *a = w.madd::<F>(xk, *a);
            }
        }
        zb.copy_from_slice(&acc);
    }
}

/// A recurrent weight `w_hh[C, H]` transposed once per sequence (row-major), which gemm reads
/// in place each step (a column-major left operand) instead of packing `w_hh` every step.
struct StepWeights<T> {
    w: Vec<T>,
}

impl<T: Real> StepWeights<T> {
    fn new(w: &[T], cols: usize, h: usize) -> StepWeights<T> {
        StepWeights {
            w: transposed(w, cols, h),
        }
    }

    /// `z[N, C] += h_prev · w_hhᵀ`, `h_prev` the rows of `h0` before the first step, else of
    /// step `prev` in `y[N, T, H]`.
    #[inline(always)]
    fn accumulate(&self, s: Seq, z: &mut [T], prev: Option<usize>, h0: &[T], y: &[T]) {
        let (n, t, h) = (s.n, s.t, s.h);
        let cols = z.len() / n.max(1);
        let hp: Mat<T> = match prev {
            None => (h0.as_ptr(), h, 1),
            // Safety: step `p`'s rows of `y` were written by the previous iteration.
            Some(p) => (unsafe { y.as_ptr().add(p * h) }, t * h, 1),
        };
        // Safety: the operands are live for these sizes; `z` is the caller's separate scratch.
        unsafe {
            mm(
                n,
                cols,
                h,
                z.as_mut_ptr(),
                cols,
                true,
                hp,
                (self.w.as_ptr(), cols, 1),
                Parallelism::None,
            )
        };
    }
}

// ---- Few rows: the step by unit blocks, on one thread or several ---------------------------

/// A forward recurrence with few batch rows, its steps run by blocks of [`UNITS`] hidden units
/// over [`unit_panels`], and split across threads by blocks: chunk `c` owns a run of blocks,
/// i.e. the gate columns `g·H + u` of its units `u`, so it computes its part of each step's
/// product and runs the cell for its units, while every chunk reads the whole previous `h`.
/// Each chunk's panels (half of `w_hh` for two threads) stay in the cache of the thread that
/// runs it, instead of one thread streaming all of `w_hh` each step.
///
/// Steps synchronize through two counters per chunk (`next`: the first step nobody has
/// claimed; `done`: steps completed). Participant 0 (the caller) walks every step and claims,
/// in order, each chunk of it nobody has; participant `p > 0` keeps claiming chunk `p`'s next
/// step. A chunk starts once the previous step is done, and a thread only ever waits for work
/// another thread has already claimed, so a pool thread that never shows up costs nothing but
/// its share (the caller does every chunk then).
struct Split<T> {
    /// `Seq::steps`.
    steps: Vec<usize>,
    chunks: Vec<Chunk<T>>,
}

struct Chunk<T> {
    /// Its blocks of units.
    b0: usize,
    b1: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// The chunk's gate scratch (`[G·UNITS]` per block, then `[G·UNITS]` for the GRU's input
    /// part). Used only by the thread holding the chunk's current step.
    work: UnsafeCell<Vec<T>>,
}

// Safety: `work` is touched only by the thread that claimed the chunk's current step; the
// claim and the `done` counter (release/acquire) order one holder's accesses before the next's.
unsafe impl<T: Send> Sync for Split<T> {}

/// What a split recurrence reads and writes: `xg[N, T, G·H]`, `w_hh`'s [`unit_panels`], the
/// GRU's `b[3H]` (empty for the LSTM), `h0[N, H]`; `y[N, T, H]` and the LSTM's running `c[N, H]`
/// (holding `c0` on entry; null for the GRU) as base pointers, each chunk writing its units only.
struct SplitIo<'a, T> {
    rec: Recurrence,
    s: Seq,
    xg: &'a [T],
    panels: &'a [T],
    b: &'a [T],
    h0: &'a [T],
    y: SendPtr<T>,
    c: SendPtr<T>,
}

impl<'a, T: Real> SplitIo<'a, T> {
    /// The operands and results of `rec` as [`run_native`] checked them, with `w_hh` as
    /// `panels`; the LSTM's running `c` (its third result) starts as `c0`.
    fn new(rec: Recurrence, s: Seq, ins: &[&'a [T]], outs: &mut [&mut [T]], panels: &'a [T]) -> SplitIo<'a, T> {
        let (b, h0): (&[T], &[T]) = match rec {
            Recurrence::Lstm => (&[], ins[2]),
            Recurrence::Gru => (ins[2], ins[3]),
        };
        let c = match (rec, &mut *outs) {
            (Recurrence::Lstm, [_, _, c]) => {
                c.copy_from_slice(ins[3]);
                SendPtr(c.as_mut_ptr())
            }
            _ => SendPtr(std::ptr::null_mut()),
        };
        SplitIo {
            rec,
            s,
            xg: ins[0],
            panels,
            b,
            h0,
            y: SendPtr(outs[0].as_mut_ptr()),
            c,
        }
    }
}

impl<T: Real> Split<T> {
    /// `parts` chunks of about equal numbers of unit blocks (fewer if there are fewer blocks).
    fn new(s: Seq, parts: usize) -> Split<T> {
        let blocks = s.h.div_ceil(UNITS);
        let parts = parts.clamp(1, blocks.max(1));
        let chunks = (0..parts)
            .map(|c| Chunk {
                b0: blocks * c / parts,
                b1: blocks * (c + 1) / parts,
                next: AtomicUsize::new(0),
                done: AtomicUsize::new(0),
                work: UnsafeCell::new(Vec::new()),
            })
            .collect();
        Split {
            steps: s.steps(),
            chunks,
        }
    }

    /// Wait until every chunk has done `k` steps.
    fn wait_done(&self, k: usize) {
        for ch in &self.chunks {
            crate::par::wait_until(|| ch.done.load(Ordering::Acquire) >= k);
        }
    }

    /// Claim chunk `c`'s step `k`; if won, run it once step `k - 1` is done.
    #[inline(always)]
    fn try_run<const F: bool>(&self, io: &SplitIo<'_, T>, c: usize, k: usize) {
        let ch = &self.chunks[c];
        if ch
            .next
            .compare_exchange(k, k + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        self.wait_done(k);
        match io.rec {
            Recurrence::Lstm => split_step::<T, F, { 4 * UNITS }>(self, io, ch, k),
            Recurrence::Gru => split_step::<T, F, { 3 * UNITS }>(self, io, ch, k),
        }
        ch.done.store(k + 1, Ordering::Release);
    }
}

/// Participant `p` of a split forward recurrence (see [`Split`]). Plain functions all the way
/// down to the arithmetic (no closure), so the caller's target features reach it.
#[inline(always)]
fn split_forward<T: Real, const F: bool>(sp: &Split<T>, io: &SplitIo<'_, T>, p: usize) {
    let steps = sp.steps.len();
    if p == 0 {
        for k in 0..steps {
            for c in 0..sp.chunks.len() {
                sp.try_run::<F>(io, c, k);
            }
        }
        sp.wait_done(steps);
    } else if let Some(ch) = sp.chunks.get(p) {
        loop {
            let k = ch.next.load(Ordering::Acquire);
            if k >= steps {
                break;
            }
            sp.try_run::<F>(io, p, k);
        }
    }
}

/// Step `k` of chunk `ch` (panel width `W = G · UNITS`): for every row, its blocks' gate
/// products, then the cell on each block's units.
#[inline(always)]
fn split_step<T: Real, const F: bool, const W: usize>(sp: &Split<T>, io: &SplitIo<'_, T>, ch: &Chunk<T>, k: usize) {
    let Seq { n, t, h, .. } = io.s;
    let gates = W / UNITS;
    let gh = gates * h;
    let nb = ch.b1 - ch.b0;
    // Safety: this thread holds the chunk's current step (see `Chunk::work`).
    let work = unsafe { &mut *ch.work.get() };
    if work.len() < (nb + 1) * W {
        work.resize((nb + 1) * W, T::ZERO);
    }
    let (z, xl) = work.split_at_mut(nb * W);
    let st = sp.steps[k];
    let prev = k.checked_sub(1).map(|q| sp.steps[q]);
    let panels = &io.panels[ch.b0 * h * W..ch.b1 * h * W];
    for r in 0..n {
        let xrow = &io.xg[(r * t + st) * gh..][..gh];
        // Safety: step `prev` is complete (every chunk's units written before `done`).
        let hp: &[T] = match prev {
            None => &io.h0[r * h..(r + 1) * h],
            Some(q) => unsafe { std::slice::from_raw_parts(io.y.get().add((r * t + q) * h), h) },
        };
        for (b, zb) in (ch.b0..ch.b1).zip(z.chunks_exact_mut(W)) {
            let (u0, u1) = (b * UNITS, (b * UNITS + UNITS).min(h));
            for (g, zg) in zb.chunks_exact_mut(UNITS).enumerate() {
                let src = match io.rec {
                    Recurrence::Lstm => &xrow[g * h + u0..g * h + u1],
                    Recurrence::Gru => &io.b[g * h + u0..g * h + u1],
                };
                zg[..u1 - u0].copy_from_slice(src);
            }
        }
        gemv_acc::<T, F, W>(z, hp, panels);
        for (b, zb) in (ch.b0..ch.b1).zip(z.chunks_exact_mut(W)) {
            let (u0, u1) = (b * UNITS, (b * UNITS + UNITS).min(h));
            let m = u1 - u0;
            if m < UNITS {
                // A last, partial block: its gates side by side, as the cells read them.
                for g in 1..gates {
                    zb.copy_within(g * UNITS..g * UNITS + m, g * m);
                }
            }
            // Safety: units `u0..u1` of this row's step `st` (and of its `c`) are this chunk's.
            let hy = unsafe { std::slice::from_raw_parts_mut(io.y.get().add((r * t + st) * h + u0), m) };
            match io.rec {
                Recurrence::Lstm => {
                    let c = unsafe { std::slice::from_raw_parts_mut(io.c.get().add(r * h + u0), m) };
                    cell_forward::<T, F>(&zb[..gates * m], c, hy);
                }
                Recurrence::Gru => {
                    for g in 0..gates {
                        xl[g * m..(g + 1) * m].copy_from_slice(&xrow[g * h + u0..g * h + u1]);
                    }
                    gru_cell_forward::<T, F>(&xl[..gates * m], &zb[..gates * m], &hp[u0..u1], hy);
                }
            }
        }
    }
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
    let wt = StepWeights::new(w, g4, h);
    c_out.copy_from_slice(c0);
    let mut prev: Option<usize> = None;
    for st in s.steps() {
        for r in 0..n {
            gates[r * g4..(r + 1) * g4].copy_from_slice(&xg[(r * t + st) * g4..][..g4]);
        }
        // gates += h_prev · w_hhᵀ.
        wt.accumulate(s, &mut gates, prev, h0, y);
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
    let hprev = previous_h(s, h0, y);
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

/// `fn $run<T>(args) -> ret`: `$body::<T, true>` compiled for AVX-512 and for AVX2+FMA and
/// chosen at run time, or `$body::<T, false>` on other hosts.
macro_rules! simd_dispatch {
    ($(#[$m:meta])* fn $run:ident = $body:ident($($a:ident: $t:ty),*) $(-> $ret:ty)?) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        fn $run<T: Real>($($a: $t),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512<T: Real>($($a: $t),*) $(-> $ret)? {
                    $body::<T, true>($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2<T: Real>($($a: $t),*) $(-> $ret)? {
                    $body::<T, true>($($a),*)
                }
                // Safety: the features were detected on this host.
                match Simd::detect() {
                    Simd::Avx512 => return unsafe { avx512($($a),*) },
                    Simd::Avx2Fma => return unsafe { avx2($($a),*) },
                    Simd::Baseline => {}
                }
            }
            $body::<T, false>($($a),*)
        }
    };
}

simd_dispatch! {
    /// The LSTM forward kernel on typed slices, for the host's instruction set.
    fn run_forward = forward(s: Seq, xg: &[T], w: &[T], h0: &[T], c0: &[T], y: &mut [T], h_out: &mut [T], c_out: &mut [T])
}

simd_dispatch! {
    /// Participant `p` of a split forward recurrence, for the host's instruction set.
    fn run_split_forward = split_forward(sp: &Split<T>, io: &SplitIo<'_, T>, p: usize)
}

simd_dispatch! {
    /// The LSTM backward kernel on typed slices, for the host's instruction set.
    fn run_backward = backward(s: Seq, ins: Operands<T>, y: &[T], cts: Cotangents<T>, threads: usize) -> [Vec<T>; 4]
}

simd_dispatch! {
    /// The GRU forward kernel on typed slices, for the host's instruction set.
    fn run_gru_forward = gru_forward(s: Seq, xg: &[T], w: &[T], b: &[T], h0: &[T], y: &mut [T], h_out: &mut [T])
}

simd_dispatch! {
    /// The GRU backward kernel on typed slices, for the host's instruction set.
    fn run_gru_backward = gru_backward(s: Seq, ins: Operands<T>, y: &[T], cts: (Option<&[T]>, Option<&[T]>), threads: usize) -> [Vec<T>; 4]
}

// ---- GRU ---------------------------------------------------------------------------------

/// Each step's previous `h` as `[N, T, H]` (`h0` for the first step the recurrence runs).
fn previous_h<T: Real>(s: Seq, h0: &[T], y: &[T]) -> Vec<T> {
    let (n, t, h) = (s.n, s.t, s.h);
    let steps = s.steps();
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
    hprev
}

/// One GRU step on one row: input part `x[3H]` and recurrent part `hg[3H]` (r, z, n), the
/// previous `hp[H]`; the new `h` into `hy[H]`.
#[inline(always)]
fn gru_cell_forward<T: Real, const F: bool>(x: &[T], hg: &[T], hp: &[T], hy: &mut [T]) {
    let h = hy.len();
    let (xr, xz, xn) = (&x[..h], &x[h..2 * h], &x[2 * h..3 * h]);
    let (hr, hz, hn) = (&hg[..h], &hg[h..2 * h], &hg[2 * h..3 * h]);
    let hp = &hp[..h];
    for j in 0..h {
        let r = (xr[j] + hr[j]).sigmoid::<F>();
        let z = (xz[j] + hz[j]).sigmoid::<F>();
        let n = (xn[j] + r * hn[j]).tanh_::<F>();
        hy[j] = n + z * (hp[j] - n);
    }
}

/// The GRU forward recurrence: `y[N, T, H]` and the last `h` from `xg[N, T, 3H]`, `w[3H, H]`,
/// `b[3H]`, `h0`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gru_forward<T: Real, const F: bool>(s: Seq, xg: &[T], w: &[T], b: &[T], h0: &[T], y: &mut [T], h_out: &mut [T]) {
    let (n, t, h, g3) = (s.n, s.t, s.h, 3 * s.h);
    let mut hg = vec![T::ZERO; n * g3];
    let mut hp = vec![T::ZERO; h];
    let wt = StepWeights::new(w, g3, h);
    let mut prev: Option<usize> = None;
    for st in s.steps() {
        for r in 0..n {
            hg[r * g3..(r + 1) * g3].copy_from_slice(&b[..g3]);
        }
        // hg = b_hh + h_prev · w_hhᵀ.
        wt.accumulate(s, &mut hg, prev, h0, y);
        for r in 0..n {
            hp.copy_from_slice(match prev {
                None => &h0[r * h..(r + 1) * h],
                Some(p) => &y[(r * t + p) * h..][..h],
            });
            let row = r * t + st;
            gru_cell_forward::<T, F>(
                &xg[row * g3..][..g3],
                &hg[r * g3..(r + 1) * g3],
                &hp,
                &mut y[row * h..][..h],
            );
        }
        prev = Some(st);
    }
    let last = prev.unwrap_or(0);
    for r in 0..n {
        h_out[r * h..(r + 1) * h].copy_from_slice(&y[(r * t + last) * h..][..h]);
    }
}

/// One GRU step's gradient on one row: `x`, `hg` and `hp` as in the forward, `dh` the
/// cotangent of this step's `h` (replaced by the part that reaches `hp` directly); the
/// cotangents of the input part into `dx[3H]` and of the recurrent part into `dhg[3H]`.
#[inline(always)]
fn gru_cell_backward<T: Real, const F: bool>(x: &[T], hg: &[T], hp: &[T], dh: &mut [T], dx: &mut [T], dhg: &mut [T]) {
    let h = dh.len();
    let (xr, xz, xn) = (&x[..h], &x[h..2 * h], &x[2 * h..3 * h]);
    let (hr, hz, hn) = (&hg[..h], &hg[h..2 * h], &hg[2 * h..3 * h]);
    let hp = &hp[..h];
    let (dxr, rest) = dx[..3 * h].split_at_mut(h);
    let (dxz, dxn) = rest.split_at_mut(h);
    let (dhr, rest) = dhg[..3 * h].split_at_mut(h);
    let (dhz, dhn) = rest.split_at_mut(h);
    let one = T::ONE;
    for j in 0..h {
        let r = (xr[j] + hr[j]).sigmoid::<F>();
        let z = (xz[j] + hz[j]).sigmoid::<F>();
        let n = (xn[j] + r * hn[j]).tanh_::<F>();
        let d = dh[j];
        let dnp = d * (one - z) * (one - n * n);
        let drp = dnp * hn[j] * r * (one - r);
        let dzp = d * (hp[j] - n) * z * (one - z);
        dxr[j] = drp;
        dxz[j] = dzp;
        dxn[j] = dnp;
        dhr[j] = drp;
        dhz[j] = dzp;
        dhn[j] = dnp * r;
        dh[j] = d * z;
    }
}

/// The cotangents of `gru_seq`'s operands `(dxg, dw, db, dh0)` given its operands
/// `(xg, w, b, h0)`, its result `y` and the cotangents of `y` and the last `h` (`None`: zero).
#[inline(always)]
fn gru_backward<T: Real, const F: bool>(
    s: Seq,
    (xg, w, b, h0): Operands<T>,
    y: &[T],
    (dy, dh_last): (Option<&[T]>, Option<&[T]>),
    threads: usize,
) -> [Vec<T>; 4] {
    let (n, t, h, g3) = (s.n, s.t, s.h, 3 * s.h);
    let steps = s.steps();
    let rows = n * t;
    let par = |flops: usize| gemm_parallelism(flops, threads);
    let hprev = previous_h(s, h0, y);
    // Every step's recurrent part at once: hg = b_hh + h_prev · w_hhᵀ, [N, T, 3H].
    let mut hg: Vec<T> = (0..rows).flat_map(|_| b[..g3].iter().copied()).collect();
    let wt = transposed(w, g3, h);
    // Safety: the operands are live for these sizes; `hg` is a separate buffer.
    unsafe {
        mm(
            rows,
            g3,
            h,
            hg.as_mut_ptr(),
            g3,
            true,
            (hprev.as_ptr(), h, 1),
            (wt.as_ptr(), g3, 1),
            par(rows * g3 * h),
        )
    };
    let mut dx = vec![T::ZERO; rows * g3];
    let mut dhg = vec![T::ZERO; rows * g3];
    let mut dh = dh_last.map_or_else(|| vec![T::ZERO; n * h], <[T]>::to_vec);
    for &st in steps.iter().rev() {
        for r in 0..n {
            let row = r * t + st;
            let dh = &mut dh[r * h..(r + 1) * h];
            if let Some(dy) = dy {
                dh.iter_mut().zip(&dy[row * h..][..h]).for_each(|(d, &y)| *d = *d + y);
            }
            gru_cell_backward::<T, F>(
                &xg[row * g3..][..g3],
                &hg[row * g3..][..g3],
                &hprev[row * h..][..h],
                dh,
                &mut dx[row * g3..][..g3],
                &mut dhg[row * g3..][..g3],
            );
        }
        // dh_prev = (direct part, in dh) + dhg_step · w_hh.
        // Safety: the operands are live for these sizes; `dh` is separate from both.
        unsafe {
            mm(
                n,
                h,
                g3,
                dh.as_mut_ptr(),
                h,
                true,
                (dhg.as_ptr().add(st * g3), t * g3, 1),
                (w.as_ptr(), h, 1),
                Parallelism::None,
            )
        };
    }
    // dw_hh = dhgᵀ · h_prev, db_hh = Σ dhg, over all steps.
    let mut dw = vec![T::ZERO; g3 * h];
    // Safety: as above.
    unsafe {
        mm(
            g3,
            h,
            rows,
            dw.as_mut_ptr(),
            h,
            false,
            (dhg.as_ptr(), 1, g3),
            (hprev.as_ptr(), h, 1),
            par(g3 * h * rows),
        )
    };
    let mut db = vec![T::ZERO; g3];
    for row in dhg.chunks_exact(g3) {
        db.iter_mut().zip(row).for_each(|(d, &v)| *d = *d + v);
    }
    [dx, dw, db, dh]
}

/// Which recurrence a sequence op runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recurrence {
    /// `lstm_seq(xg, w_hh, h0, c0) -> (y, h, c)`.
    Lstm,
    /// `gru_seq(xg, w_hh, b_hh, h0) -> (y, h)`.
    Gru,
}

impl Recurrence {
    /// The recurrence of composite `c` and its `reverse` attribute (`None`: not a sequence op).
    pub fn of(c: &Composite) -> Option<(Recurrence, bool)> {
        match c {
            Composite::LstmSeq(l) => Some((Recurrence::Lstm, l.reverse)),
            Composite::GruSeq(g) => Some((Recurrence::Gru, g.reverse)),
            _ => None,
        }
    }

    /// Whether operand `i` is shared by every batch row (the recurrent weight, GRU's `b_hh`)
    /// rather than `[N, ...]`.
    fn shared(self, i: usize) -> bool {
        match self {
            Recurrence::Lstm => i == 1,
            Recurrence::Gru => i == 1 || i == 2,
        }
    }

    /// Gates per hidden unit.
    fn gates(self) -> usize {
        match self {
            Recurrence::Lstm => 4,
            Recurrence::Gru => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Recurrence::Lstm => "lstm_seq",
            Recurrence::Gru => "gru_seq",
        }
    }

    /// The sizes of the op on operands of `shapes` (`xg` first; the state is `h0`).
    fn seq(self, shapes: &[&[usize]], reverse: bool) -> Result<Seq, String> {
        let bad = || format!("{} operands do not fit: {shapes:?}", self.name());
        let (gates, state) = match self {
            Recurrence::Lstm => (4, 2),
            Recurrence::Gru => (3, 3),
        };
        let (xg, h0) = (shapes.first().ok_or_else(bad)?, shapes.get(state).ok_or_else(bad)?);
        let s = match (xg, h0) {
            ([n, t, g], [n2, h]) if n == n2 && *g == gates * h && *t > 0 => Seq {
                n: *n,
                t: *t,
                h: *h,
                reverse,
            },
            _ => return Err(bad()),
        };
        let (ops, _) = self.shapes(s);
        if shapes.len() != ops.len() || shapes.iter().zip(&ops).any(|(a, b)| a != &b.as_slice()) {
            return Err(bad());
        }
        Ok(s)
    }

    /// The operands' and the results' shapes for sizes `s`.
    fn shapes(self, s: Seq) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
        let (n, t, h) = (s.n, s.t, s.h);
        match self {
            Recurrence::Lstm => (
                vec![vec![n, t, 4 * h], vec![4 * h, h], vec![n, h], vec![n, h]],
                vec![vec![n, t, h], vec![n, h], vec![n, h]],
            ),
            Recurrence::Gru => (
                vec![vec![n, t, 3 * h], vec![3 * h, h], vec![3 * h], vec![n, h]],
                vec![vec![n, t, h], vec![n, h]],
            ),
        }
    }
}

/// Whether the native kernels compute the sequence ops in this dtype.
pub fn seq_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64)
}

/// Multiply-adds of a sequence's step products (`N · T · G·H · H`), what decides whether
/// splitting it across threads pays.
fn recurrence_macs(rec: Recurrence, s: Seq) -> usize {
    s.n.saturating_mul(s.t)
        .saturating_mul(rec.gates() * s.h)
        .saturating_mul(s.h)
}

/// Blocks of batch rows a sequence op splits into: one per thread when the recurrence is
/// worth splitting (each block runs every step for its rows, without synchronizing).
fn row_blocks(rec: Recurrence, s: Seq, threads: usize) -> usize {
    let flops = recurrence_macs(rec, s);
    if flops < 1 << 20 {
        1
    } else {
        threads.clamp(1, s.n.max(1))
    }
}

/// Threads a forward recurrence with few rows ([`Split`]) runs on: one for short sequences,
/// else one per thread, at most one per block of units.
fn split_parts(rec: Recurrence, s: Seq, threads: usize) -> usize {
    let flops = recurrence_macs(rec, s);
    if flops < 1 << 20 {
        return 1;
    }
    threads.clamp(1, s.h.div_ceil(UNITS).max(1))
}

/// The forward kernel of `rec` for few rows (`n ≤ GEMV_ROWS`) as a [`Split`] into `parts`
/// chunks: `ins` and `outs` as [`run_native`] checked them; `cache` keeps `w_hh`'s panels.
fn forward_split<T: Real>(
    rec: Recurrence,
    s: Seq,
    parts: usize,
    ins: &[&[T]],
    mut outs: Vec<&mut [T]>,
    cache: Option<&WeightCache>,
) {
    let (gates, h) = (rec.gates(), s.h);
    let panels = T::prepared(cache, h.div_ceil(UNITS) * h * gates * UNITS, || {
        unit_panels(ins[1], gates, h)
    });
    let sp = Split::new(s, parts);
    let io = SplitIo::new(rec, s, ins, &mut outs, &panels);
    let np = sp.chunks.len();
    par_units(np, np, || (), |_, p| run_split_forward(&sp, &io, p));
    let t = s.t;
    if let (Some(&last), [y, h_out, ..]) = (sp.steps.last(), outs.as_mut_slice()) {
        for r in 0..s.n {
            h_out[r * h..(r + 1) * h].copy_from_slice(&y[(r * t + last) * h..][..h]);
        }
    }
}

/// Rows `r0..r1` of a `[N, ...]` buffer (`n` rows), or all of a `shared` one.
fn rows<T>(b: &[T], shared: bool, n: usize, r0: usize, r1: usize) -> &[T] {
    if shared || n == 0 {
        return b;
    }
    let per = b.len() / n;
    &b[r0 * per..r1 * per]
}

/// `b` as `T`s (an empty buffer's pointer need not be aligned).
fn cast<T: bytemuck::Pod>(b: &[u8]) -> Result<&[T], String> {
    if b.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(b).map_err(|e| format!("unaligned operand: {e}"))
}

fn cast_mut<T: bytemuck::Pod>(b: &mut [u8]) -> Result<&mut [T], String> {
    if b.is_empty() {
        return Ok(&mut []);
    }
    bytemuck::try_cast_slice_mut(b).map_err(|e| format!("unaligned result: {e}"))
}

/// The forward kernel of `rec` on the bytes of its operands (shapes `shapes`) and results
/// (f32 or f64 as `dtype`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_native(
    rec: Recurrence,
    reverse: bool,
    dtype: DType,
    shapes: &[&[usize]],
    ins: &[&[u8]],
    outs: Vec<&mut [u8]>,
    threads: usize,
    cache: Option<&WeightCache>,
) -> Result<(), String> {
    fn typed<T: Real + bytemuck::Pod>(
        rec: Recurrence,
        s: Seq,
        ins: &[&[u8]],
        outs: Vec<&mut [u8]>,
        threads: usize,
        cache: Option<&WeightCache>,
    ) -> Result<(), String> {
        let (ops, res) = rec.shapes(s);
        let ins: Vec<&[T]> = ins.iter().map(|b| cast::<T>(b)).collect::<Result<_, _>>()?;
        let mut outs: Vec<&mut [T]> = outs.into_iter().map(cast_mut::<T>).collect::<Result<_, _>>()?;
        let len = |shape: &Vec<usize>| shape.iter().product::<usize>();
        let fits = ins.len() == ops.len()
            && outs.len() == res.len()
            && ins.iter().zip(&ops).all(|(b, sh)| b.len() == len(sh))
            && outs.iter().zip(&res).all(|(b, sh)| b.len() == len(sh));
        if !fits {
            return Err(format!("{} buffers do not hold {s:?}", rec.name()));
        }
        if !matches!((rec, outs.len()), (Recurrence::Lstm, 3) | (Recurrence::Gru, 2)) {
            return Err(format!("{} buffers do not hold {s:?}", rec.name()));
        }
        if s.n <= GEMV_ROWS {
            forward_split(rec, s, split_parts(rec, s, threads), &ins, outs, cache);
            return Ok(());
        }
        // Batch rows never interact: each block of rows runs the whole sequence on its own.
        let blocks = row_blocks(rec, s, threads);
        let outs: Vec<(SendPtr<T>, usize)> = outs
            .iter_mut()
            .map(|o| (SendPtr(o.as_mut_ptr()), o.len() / s.n.max(1)))
            .collect();
        par_units(
            blocks,
            blocks,
            || (),
            |_, b| {
                let (r0, r1) = (s.n * b / blocks, s.n * (b + 1) / blocks);
                let sub = Seq { n: r1 - r0, ..s };
                let i: Vec<&[T]> = (0..ins.len())
                    .map(|i| rows(ins[i], rec.shared(i), s.n, r0, r1))
                    .collect();
                // Safety: block `b`'s rows of each result, written by this unit only.
                let mut o: Vec<&mut [T]> = outs
                    .iter()
                    .map(|&(p, per)| unsafe { std::slice::from_raw_parts_mut(p.get().add(r0 * per), (r1 - r0) * per) })
                    .collect();
                match (rec, o.as_mut_slice()) {
                    (Recurrence::Lstm, [y, h, c]) => run_forward(sub, i[0], i[1], i[2], i[3], y, h, c),
                    (Recurrence::Gru, [y, h]) => run_gru_forward(sub, i[0], i[1], i[2], i[3], y, h),
                    _ => unreachable!("checked above"),
                }
            },
        );
        Ok(())
    }
    let s = rec.seq(shapes, reverse)?;
    match dtype {
        DType::F32 => typed::<f32>(rec, s, ins, outs, threads, cache),
        DType::F64 => typed::<f64>(rec, s, ins, outs, threads, cache),
        other => Err(format!("{} has no native kernel in {other}", rec.name())),
    }
}

/// The gradient of a sequence op (`rec`, `reverse` as its attribute) for eager autograd: its
/// operands, its result `y` and the cotangents of its results (`None`: unused) give the
/// cotangents of the operands `wants` marks. f32 and f64 ([`seq_dtype`]).
pub fn seq_vjp(
    rec: Recurrence,
    reverse: bool,
    ins: &[TensorData],
    y: &TensorData,
    cts: &[Option<TensorData>],
    wants: &[bool],
    threads: usize,
) -> Result<Vec<Option<TensorData>>, String> {
    let name = rec.name();
    let shapes: Vec<&[usize]> = ins.iter().map(TensorData::shape).collect();
    let s = rec.seq(&shapes, reverse)?;
    let dtype = ins[0].dtype();
    let (_, res) = rec.shapes(s);
    let fits = |t: &TensorData, shape: &[usize]| t.dtype() == dtype && t.shape() == shape;
    let shapes_ok = ins.iter().all(|t| t.dtype() == dtype)
        && fits(y, &res[0])
        && cts.len() == res.len()
        && cts
            .iter()
            .zip(&res)
            .all(|(c, sh)| c.as_ref().is_none_or(|c| fits(c, sh)));
    if !shapes_ok {
        return Err(format!(
            "{name} gradient: operands, result and cotangents do not match xg {:?} ({dtype})",
            ins[0].shape()
        ));
    }
    fn typed<T: Real + bytemuck::Pod + oar_ir::Element>(
        rec: Recurrence,
        s: Seq,
        ins: &[TensorData],
        y: &TensorData,
        cts: &[Option<TensorData>],
        threads: usize,
    ) -> Result<Vec<TensorData>, String> {
        fn e<T: bytemuck::Pod>(t: &TensorData) -> Result<&[T], String> {
            cast::<T>(t.bytes())
        }
        let ct = |i: usize| cts[i].as_ref().map(e::<T>).transpose();
        let ins4 = [e::<T>(&ins[0])?, e::<T>(&ins[1])?, e::<T>(&ins[2])?, e::<T>(&ins[3])?];
        let (y, cts) = (e::<T>(y)?, [ct(0)?, ct(1)?, cts.get(2).map_or(Ok(None), |_| ct(2))?]);
        // Batch rows never interact: each block of rows runs the recurrence backwards on its
        // own; the shared operands' gradients (w_hh, b_hh) are summed over the blocks in order.
        let blocks = row_blocks(rec, s, threads);
        let parts: Vec<std::sync::Mutex<Option<[Vec<T>; 4]>>> = (0..blocks).map(|_| Default::default()).collect();
        let inner = if blocks > 1 { 1 } else { threads };
        par_units(
            blocks,
            blocks,
            || (),
            |_, b| {
                let (r0, r1) = (s.n * b / blocks, s.n * (b + 1) / blocks);
                let sub = Seq { n: r1 - r0, ..s };
                let i = |k: usize| rows(ins4[k], rec.shared(k), s.n, r0, r1);
                let four = (i(0), i(1), i(2), i(3));
                let c = |k: usize| cts[k].map(|c| rows(c, false, s.n, r0, r1));
                let yb = rows(y, false, s.n, r0, r1);
                let g = match rec {
                    Recurrence::Lstm => run_backward::<T>(sub, four, yb, (c(0), c(1), c(2)), inner),
                    Recurrence::Gru => run_gru_backward::<T>(sub, four, yb, (c(0), c(1)), inner),
                };
                *parts[b].lock().unwrap_or_else(|e| e.into_inner()) = Some(g);
            },
        );
        let mut parts = parts.into_iter().map(|p| {
            p.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every block ran")
        });
        let mut grads = parts.next().expect("at least one block");
        for part in parts {
            for (k, (g, p)) in grads.iter_mut().zip(part).enumerate() {
                if rec.shared(k) {
                    g.iter_mut().zip(&p).for_each(|(a, &b)| *a = *a + b);
                } else {
                    g.extend_from_slice(&p);
                }
            }
        }
        grads
            .into_iter()
            .zip(ins)
            .map(|(g, x)| TensorData::from_vec(x.shape().to_vec(), g).map_err(|e| e.to_string()))
            .collect()
    }
    let grads = match dtype {
        DType::F32 => typed::<f32>(rec, s, ins, y, cts, threads)?,
        DType::F64 => typed::<f64>(rec, s, ins, y, cts, threads)?,
        other => return Err(format!("{name} has no native gradient in {other}")),
    };
    Ok(grads
        .into_iter()
        .zip(wants.iter().copied().chain(std::iter::repeat(false)))
        .map(|(g, want)| want.then_some(g))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hidden size of 0 type-checks (`w_hh[0, 0]`); the kernels return empty results.
    #[test]
    fn zero_hidden_size_gives_empty_results() {
        for n in [2, 5] {
            let (t, h) = (3, 0);
            for reverse in [false, true] {
                let s = Seq { n, t, h, reverse };
                let (mut y, mut hh, mut cc) = (vec![], vec![], vec![]);
                run_forward::<f32>(s, &[], &[], &[], &[], &mut y, &mut hh, &mut cc);
                run_gru_forward::<f64>(s, &[], &[], &[], &[], &mut [], &mut []);
            }
        }
        assert!(transposed::<f32>(&[], 0, 5).is_empty());
    }

    #[test]
    fn unit_panel_products_match_the_plain_sum() {
        // 3 gates of 37 units (two whole blocks and a partial one) over K = 37; f32 and f64;
        // the blocks one call at a time give the same bits as all of them in one call.
        let (gates, h) = (3, 37);
        let w: Vec<f64> = (0..gates * h * h)
            .map(|i| ((i * 7919) % 113) as f64 / 56.0 - 1.0)
            .collect();
        let x: Vec<f64> = (0..h).map(|i| ((i * 31) % 17) as f64 / 8.0 - 1.0).collect();
        let panels = unit_panels(&w, gates, h);
        let width = gates * UNITS;
        let blocks = h.div_ceil(UNITS);
        assert_eq!(panels.len(), blocks * h * width);
        // z in panel order: block, gate, unit (0.01 · column as the starting value).
        let col = |b: usize, g: usize, j: usize| (g * h + b * UNITS + j, b * width + g * UNITS + j);
        let mut z = vec![0.0; blocks * width];
        let mut want = vec![0.0; blocks * width];
        for b in 0..blocks {
            for g in 0..gates {
                for j in 0..UNITS.min(h - b * UNITS) {
                    let (c, at) = col(b, g, j);
                    z[at] = c as f64 * 0.01;
                    want[at] = z[at] + (0..h).map(|i| x[i] * w[c * h + i]).sum::<f64>();
                }
            }
        }
        let mut all = z.clone();
        gemv_acc::<f64, false, 48>(&mut all, &x, &panels);
        for (g, w) in all.iter().zip(&want) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
        let mut one_by_one = z.clone();
        for b in 0..blocks {
            gemv_acc::<f64, false, 48>(
                &mut one_by_one[b * width..(b + 1) * width],
                &x,
                &panels[b * h * width..(b + 1) * h * width],
            );
        }
        assert_eq!(one_by_one, all);
        let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let mut z32 = f(&z);
        gemv_acc::<f32, false, 48>(&mut z32, &f(&x), &unit_panels(&f(&w), gates, h));
        for (g, w) in z32.iter().zip(&want) {
            assert!((f64::from(*g) - w).abs() < 1e-4, "{g} vs {w}");
        }
    }

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
                let grads = seq_vjp(Recurrence::Lstm, reverse, &tds, &y, &cts, &[true; 4], 2).unwrap();
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

    /// `gru_seq` by its definition, in f64: `(y, h)`.
    fn naive_gru(s: Seq, xg: &[f64], w: &[f64], b: &[f64], h0: &[f64]) -> [Vec<f64>; 2] {
        let (n, t, h) = (s.n, s.t, s.h);
        let mut hs = h0.to_vec();
        let mut y = vec![0.0; n * t * h];
        for st in s.steps() {
            let mut h2 = hs.clone();
            for r in 0..n {
                for j in 0..h {
                    let hg =
                        |k: usize| b[k * h + j] + (0..h).map(|i| hs[r * h + i] * w[(k * h + j) * h + i]).sum::<f64>();
                    let x = |k: usize| xg[(r * t + st) * 3 * h + k * h + j];
                    let rg = sig(x(0) + hg(0));
                    let zg = sig(x(1) + hg(1));
                    let ng = (x(2) + rg * hg(2)).tanh();
                    h2[r * h + j] = ng + zg * (hs[r * h + j] - ng);
                    y[(r * t + st) * h + j] = h2[r * h + j];
                }
            }
            hs = h2;
        }
        [y, hs]
    }

    /// The GRU kernels: forward in f32 and f64 against the definition, and the gradient of
    /// every operand against central differences, both directions, each result's cotangent
    /// present or absent.
    #[test]
    fn gru_matches_the_definition_and_finite_differences() {
        for (n, t, h, reverse, present) in [
            (2, 3, 3, false, [true, true]),
            (3, 4, 19, true, [true, false]),
            (1, 2, 2, true, [false, true]),
        ] {
            let s = Seq { n, t, h, reverse };
            let shapes = [vec![n, t, 3 * h], vec![3 * h, h], vec![3 * h], vec![n, h]];
            let scales = [2.0, 0.7, 0.5, 1.0];
            let ins: Vec<Vec<f64>> = (0..4)
                .map(|i| values(shapes[i].iter().product(), 40 + i as u64, scales[i]))
                .collect();
            let want = naive_gru(s, &ins[0], &ins[1], &ins[2], &ins[3]);
            for dt in [DType::F64, DType::F32] {
                let tds: Vec<TensorData> = (0..4).map(|i| data(&shapes[i], &ins[i], dt)).collect();
                let bytes: Vec<&[u8]> = tds.iter().map(TensorData::bytes).collect();
                let mut y = TensorData::full(dt, vec![n, t, h], 0.0).unwrap();
                let mut hl = TensorData::full(dt, vec![n, h], 0.0).unwrap();
                let shape_refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
                run_native(
                    Recurrence::Gru,
                    reverse,
                    dt,
                    &shape_refs,
                    &bytes,
                    vec![y.bytes_mut(), hl.bytes_mut()],
                    2,
                    None,
                )
                .unwrap();
                let tol = if dt == DType::F64 { 1e-13 } else { 3e-6 };
                for (got, want) in [(y.to_f64_vec(), &want[0]), (hl.to_f64_vec(), &want[1])] {
                    for (i, (a, b)) in got.iter().zip(want.iter()).enumerate() {
                        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{dt} forward [{i}]: {a} vs {b}");
                    }
                }
            }
            if n * h > 12 {
                continue; // finite differences on the small cases only
            }
            let out_shapes = [vec![n, t, h], vec![n, h]];
            let rs: Vec<Vec<f64>> = (0..2)
                .map(|k| values(out_shapes[k].iter().product(), 50 + k as u64, 1.0))
                .collect();
            let loss = |ins: &[Vec<f64>]| -> f64 {
                let outs = naive_gru(s, &ins[0], &ins[1], &ins[2], &ins[3]);
                (0..2)
                    .filter(|&k| present[k])
                    .map(|k| outs[k].iter().zip(&rs[k]).map(|(a, b)| a * b).sum::<f64>())
                    .sum()
            };
            for dt in [DType::F64, DType::F32] {
                let tds: Vec<TensorData> = (0..4).map(|i| data(&shapes[i], &ins[i], dt)).collect();
                let y = data(&out_shapes[0], &want[0], dt);
                let cts: Vec<Option<TensorData>> = (0..2)
                    .map(|k| present[k].then(|| data(&out_shapes[k], &rs[k], dt)))
                    .collect();
                let grads = seq_vjp(Recurrence::Gru, reverse, &tds, &y, &cts, &[true; 4], 2).unwrap();
                let tol = if dt == DType::F64 { 1e-7 } else { 2e-5 };
                for (i, g) in grads.iter().enumerate() {
                    let g = g.as_ref().expect("wanted").to_f64_vec();
                    for e in 0..ins[i].len() {
                        let eps = 1e-6;
                        let (mut up, mut down) = (ins.clone(), ins.clone());
                        up[i][e] += eps;
                        down[i][e] -= eps;
                        let fd = (loss(&up) - loss(&down)) / (2.0 * eps);
                        assert!(
                            (g[e] - fd).abs() <= tol * (1.0 + fd.abs()),
                            "{dt} gru operand {i}[{e}] ({n}x{t}x{h}, reverse {reverse}): {} vs {fd}",
                            g[e]
                        );
                    }
                }
            }
        }
    }

    /// Few rows, long enough to split each step across threads by blocks of hidden units
    /// (`Split`), with a partial last block: the results match the gemm path's (`forward`,
    /// `gru_forward`: another summation order, 1e-12 in f64); 2 and 3 threads give the 1-thread
    /// results bit for bit (each column's sum runs in the same order); and the caller alone,
    /// with no helper ever showing up, does every chunk.
    #[test]
    fn steps_split_across_threads_give_the_unsplit_results() {
        for (n, t, h, reverse) in [(1, 40, 100, false), (3, 24, 72, true)] {
            for rec in [Recurrence::Lstm, Recurrence::Gru] {
                let g = if rec == Recurrence::Lstm { 4 } else { 3 };
                let s = Seq { n, t, h, reverse };
                assert_eq!((split_parts(rec, s, 1), split_parts(rec, s, 3)), (1, 3), "{s:?}");
                let shapes: Vec<Vec<usize>> = match rec {
                    Recurrence::Lstm => vec![vec![n, t, g * h], vec![g * h, h], vec![n, h], vec![n, h]],
                    Recurrence::Gru => vec![vec![n, t, g * h], vec![g * h, h], vec![g * h], vec![n, h]],
                };
                let vals: Vec<Vec<f64>> = shapes
                    .iter()
                    .enumerate()
                    .map(|(i, sh)| values(sh.iter().product(), 60 + i as u64, 0.7))
                    .collect();
                let res = [vec![0.0; n * t * h], vec![0.0; n * h], vec![0.0; n * h]];
                // run_native in `dt` on `threads` threads with `cache`: the results as f64.
                let run_in = |dt: DType, threads: usize, cache: Option<&WeightCache>| {
                    let tds: Vec<TensorData> = shapes.iter().zip(&vals).map(|(sh, v)| data(sh, v, dt)).collect();
                    let bytes: Vec<&[u8]> = tds.iter().map(TensorData::bytes).collect();
                    let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
                    let mut outs: Vec<TensorData> = [vec![n, t, h], vec![n, h], vec![n, h]][..g - 1]
                        .iter()
                        .map(|sh| TensorData::full(dt, sh.clone(), 0.0).unwrap())
                        .collect();
                    let out_bytes = outs.iter_mut().map(TensorData::bytes_mut).collect();
                    run_native(rec, reverse, dt, &refs, &bytes, out_bytes, threads, cache).unwrap();
                    outs.iter().map(TensorData::to_f64_vec).collect::<Vec<_>>()
                };
                let run = |threads: usize| run_in(DType::F64, threads, None);
                let one = run(1);
                for threads in [2, 3] {
                    assert_eq!(run(threads), one, "{rec:?} {s:?}, {threads} threads");
                }
                let mut gemm = res.clone();
                let [y, hh, cc] = &mut gemm;
                match rec {
                    Recurrence::Lstm => run_forward(s, &vals[0], &vals[1], &vals[2], &vals[3], y, hh, cc),
                    Recurrence::Gru => run_gru_forward(s, &vals[0], &vals[1], &vals[2], &vals[3], y, hh),
                }
                for (k, (a, b)) in one.iter().zip(&gemm).enumerate() {
                    let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
                    assert!(err <= 1e-12, "{rec:?} {s:?}: result {k} off the gemm path's by {err}");
                }
                // The caller alone.
                let mut alone = res.clone();
                let [y, hh, cc] = &mut alone;
                let ins: Vec<&[f64]> = vals.iter().map(Vec::as_slice).collect();
                let mut outs: Vec<&mut [f64]> = vec![y, hh, cc];
                outs.truncate(g - 1);
                let sp = Split::new(s, 3);
                assert_eq!(sp.chunks.len(), 3);
                let panels = unit_panels(ins[1], g, h);
                let io = SplitIo::new(rec, s, &ins, &mut outs, &panels);
                run_split_forward(&sp, &io, 0);
                assert_eq!(alone[0], one[0], "{rec:?} {s:?}: the caller alone");

                // f32 with a weight cache: the panels are made on the first run and reused.
                let run32 = |cache: Option<&WeightCache>| run_in(DType::F32, 2, cache);
                let cache = WeightCache::new();
                let plain = run32(None);
                assert_eq!(run32(Some(&cache)), plain, "{rec:?} {s:?}: f32, first cached run");
                assert_eq!(cache.get().map(Vec::len), Some(h.div_ceil(UNITS) * h * g * UNITS));
                assert_eq!(run32(Some(&cache)), plain, "{rec:?} {s:?}: f32, from the cache");
            }
        }
    }

    /// Big enough to split into blocks of batch rows (`row_blocks`): forward and gradients
    /// with 1, 2 and 3 threads agree (the blocks run the same per-row arithmetic; only the
    /// shared weights' gradients are summed in another order).
    #[test]
    fn batch_row_blocks_give_the_unsplit_results() {
        let (n, t, h) = (5, 6, 128);
        for rec in [Recurrence::Lstm, Recurrence::Gru] {
            let g = if rec == Recurrence::Lstm { 4 } else { 3 };
            let s = Seq { n, t, h, reverse: true };
            assert_eq!((row_blocks(rec, s, 1), row_blocks(rec, s, 3)), (1, 3));
            let shapes: Vec<Vec<usize>> = match rec {
                Recurrence::Lstm => vec![vec![n, t, g * h], vec![g * h, h], vec![n, h], vec![n, h]],
                Recurrence::Gru => vec![vec![n, t, g * h], vec![g * h, h], vec![g * h], vec![n, h]],
            };
            let tds: Vec<TensorData> = shapes
                .iter()
                .enumerate()
                .map(|(i, sh)| data(sh, &values(sh.iter().product(), 20 + i as u64, 0.5), DType::F64))
                .collect();
            let bytes: Vec<&[u8]> = tds.iter().map(TensorData::bytes).collect();
            let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
            let run = |threads: usize| {
                let mut outs: Vec<TensorData> = [vec![n, t, h], vec![n, h], vec![n, h]][..g - 1]
                    .iter()
                    .map(|sh| TensorData::full(DType::F64, sh.clone(), 0.0).unwrap())
                    .collect();
                let out_bytes = outs.iter_mut().map(TensorData::bytes_mut).collect();
                run_native(rec, true, DType::F64, &refs, &bytes, out_bytes, threads, None).unwrap();
                let cts: Vec<Option<TensorData>> = outs
                    .iter()
                    .enumerate()
                    .map(|(i, o)| Some(data(o.shape(), &values(o.len(), 40 + i as u64, 1.0), DType::F64)))
                    .collect();
                let grads = seq_vjp(rec, true, &tds, &outs[0], &cts, &[true; 4], threads).unwrap();
                let mut all: Vec<Vec<f64>> = outs.iter().map(TensorData::to_f64_vec).collect();
                all.extend(grads.into_iter().map(|g| g.unwrap().to_f64_vec()));
                all
            };
            let one = run(1);
            for threads in [2, 3] {
                for (k, (a, b)) in run(threads).iter().zip(&one).enumerate() {
                    let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
                    assert!(err <= 1e-12, "{rec:?}, {threads} threads: result {k} off by {err}");
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
        let grads = seq_vjp(
            Recurrence::Lstm,
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
        let grads = seq_vjp(
            Recurrence::Lstm,
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
        let err = seq_vjp(
            Recurrence::Lstm,
            false,
            &tds,
            &wrong,
            &[None, None, None],
            &[true; 4],
            1,
        )
        .unwrap_err();
        assert!(err.contains("lstm_seq"), "{err}");
    }
}
