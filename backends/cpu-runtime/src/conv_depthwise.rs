//! Depthwise 2-d convolution in f32 — each output channel reads one input channel, as
//! MobileNet's 3 × 3 and 5 × 5 layers — with register-blocked accumulators on AVX2 and
//! AVX-512 hosts.
//!
//! Per plane, the input is padded and split into stride phases once
//! ([`crate::conv_direct::Phases`]), so that each kernel tap reads one contiguous run per
//! output row. The output is computed in the phases' pitch (`oy · pitch + ox`; the columns
//! past `ow` are dropped when the rows are copied out), `U` vectors at a time, each kept in a
//! register across every tap: one load and one multiply-add per vector and tap, with the
//! plane's weights held in registers. Small planes (7 × 7 at the end of MobileNet) fill the
//! vectors because the flat layout runs across rows.

use crate::contraction::{PlaneEpilogue, SendPtr};
use crate::conv::ConvSpec;
use crate::conv_direct::{Phases, TapPhases, copy_run, gather_step};
use crate::par::par_units;
use crate::simd::{Lanes, Simd};

/// Vectors per register block.
const U: usize = 4;
/// Output elements per block of rows (the block's accumulator stays in L1).
const BLOCK: usize = 2048;
/// Multiply-adds per unit of planes handed to a thread, at least.
const UNIT_MACS: usize = 1 << 15;
/// Multiply-adds plus input elements from which a convolution is split across threads: few
/// multiply-adds per element moved, so threads pay off from less work than a GEMM's.
const PARALLEL_MIN: usize = 1 << 17;

/// The geometry of one depthwise convolution.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// Output planes (`n · o`), input channels, output channels per input channel.
    planes: usize,
    c: usize,
    o: usize,
    og: usize,
    split: Phases,
    oh: usize,
    ow: usize,
    /// Per kernel tap (row-major): where its run starts in the split plane.
    taps: Vec<usize>,
    /// The input runs the split copies, `(to, from, n)`: `n` elements from `from` on, every
    /// `sw`-th, to `to` on in the split plane (whose other elements, the padding, stay zero).
    runs: Vec<(usize, usize, usize)>,
    /// Elements of the split plane with the slack the last block's vectors read past it.
    scratch: usize,
    simd: Simd,
}

impl Plan {
    /// The plan for `conv(x[xs], w[ws])` with `spec` and output spatial shape `sout`, where this
    /// path serves: a 2-d convolution with one input channel per group and output channel, on
    /// a host with AVX2 or AVX-512, whose split plane is not far beyond the input plane.
    pub(crate) fn new(xs: &[usize], ws: &[usize], spec: &ConvSpec, sout: &[usize]) -> Option<Plan> {
        let simd = Simd::detect();
        if simd == Simd::Baseline || xs.len() != 4 || ws.len() != 4 || sout.len() != 2 || ws[1] != 1 {
            return None;
        }
        if crate::conv_tiled::forced_off() {
            return None;
        }
        let (n, c, o) = (xs[0], xs[1], ws[0]);
        let g = spec.groups;
        if g != c || o % g.max(1) != 0 {
            return None;
        }
        let (h, w, kh, kw, oh, ow) = (xs[2], xs[3], ws[2], ws[3], sout[0], sout[1]);
        let (sh, sw, dh, dw) = (spec.stride[0], spec.stride[1], spec.dilation[0], spec.dilation[1]);
        if oh == 0 || ow == 0 || kh == 0 || kw == 0 {
            return None;
        }
        let TapPhases {
            rows,
            pitch,
            plane,
            taps,
            phases,
        } = TapPhases::new([kh, kw], [sh, sw], [dh, dw], [oh, ow])?;
        // Huge padding, strides or dilations: the split plane would dwarf the input.
        if plane > (h * w).saturating_mul(4).saturating_add(1 << 16) {
            return None;
        }
        let split = Phases {
            h,
            w,
            top: spec.pad_before[0],
            left: spec.pad_before[1],
            sh,
            sw,
            rows,
            pitch,
        };
        let runs = split.runs(|phase| phases[phase]);
        Some(Plan {
            planes: n * o,
            c,
            o,
            og: o / c,
            split,
            oh,
            ow,
            taps,
            runs,
            scratch: plane + U * simd.lanes(),
            simd,
        })
    }

    /// Output rows per block.
    fn block_rows(&self) -> usize {
        (BLOCK / self.split.pitch).clamp(1, self.oh)
    }
}

/// Per-thread scratch: the split plane and one block's accumulators.
struct Scratch {
    split: Vec<f32>,
    acc: Vec<f32>,
}

/// How a plane's input elements enter the split plane (as f32) and its sums leave it: f32
/// copies ([`F32`]), or 8-bit integers less their zero point and exact i32 sums ([`Int8`]).
pub(crate) trait PlaneIo: Sync {
    /// Input element.
    type In: Copy + Sync;
    /// Output element.
    type Out: Copy + Send;
    /// `dst[i] = src[i · step]` as f32.
    fn gather(&self, dst: &mut [f32], src: &[Self::In], step: usize);
    /// `dst = acc` as output elements (equal lengths).
    fn store(&self, dst: &mut [Self::Out], acc: &[f32]);
}

/// f32 in, f32 out.
pub(crate) struct F32;

impl PlaneIo for F32 {
    type In = f32;
    type Out = f32;
    #[inline(always)]
    fn gather(&self, dst: &mut [f32], src: &[f32], step: usize) {
        gather_step(dst, src, step);
    }
    #[inline(always)]
    fn store(&self, dst: &mut [f32], acc: &[f32]) {
        copy_run(dst, acc);
    }
}

/// `conv_integer`'s depthwise case: 8-bit inputs less their zero point in, i32 sums out. The
/// f32 sums are exact — every product of two values less their zero points is at most 255² in
/// magnitude, so the sum of [`Int8::MAX_TAPS`] of them stays below 2^24 — and so are the
/// conversions both ways. The padding (zero in the split plane) is the zero point, as
/// `conv_integer` pads.
pub(crate) struct Int8 {
    /// The input's zero point.
    pub zero: i32,
    /// Whether the input is i8 (else u8).
    pub signed: bool,
}

impl Int8 {
    /// Taps per output at most for exact f32 sums (256 · 255² < 2^24).
    pub const MAX_TAPS: usize = 256;
}

impl PlaneIo for Int8 {
    type In = u8;
    type Out = i32;
    #[inline(always)]
    fn gather(&self, dst: &mut [f32], src: &[u8], step: usize) {
        let z = self.zero;
        let v = |b: u8| (if self.signed { b as i8 as i32 } else { b as i32 } - z) as f32;
        if step == 1 {
            let n = dst.len();
            for (d, &b) in dst.iter_mut().zip(&src[..n]) {
                *d = v(b);
            }
        } else {
            for (d, &b) in dst.iter_mut().zip(src.iter().step_by(step)) {
                *d = v(b);
            }
        }
    }
    #[inline(always)]
    fn store(&self, dst: &mut [i32], acc: &[f32]) {
        for (d, &a) in dst.iter_mut().zip(acc) {
            *d = a as i32;
        }
    }
}

/// `out[N, O, OH, OW] = conv(x[N, C, H, W], w[O, 1, kh, kw])` with `O/C` output channels per
/// input channel, as planned, on up to `threads` threads; `epi` is applied to each unit's
/// planes as soon as they are done.
///
/// # Safety
/// `x`, `w` and `out` hold the plan's elements; `out` overlaps neither.
pub(crate) unsafe fn conv<I: PlaneIo>(
    x: *const I::In,
    w: *const f32,
    out: *mut I::Out,
    p: &Plan,
    io: &I,
    threads: usize,
    epi: Option<PlaneEpilogue>,
) {
    let (ks, s_in, ys) = (p.taps.len(), p.split.h * p.split.w, p.oh * p.ow);
    let (x, w, out) = (SendPtr(x as *mut I::In), SendPtr(w as *mut f32), SendPtr(out));
    let macs = p.planes.saturating_mul(ys).saturating_mul(ks);
    let moved = macs.saturating_add((p.planes / p.og.max(1)).saturating_mul(s_in));
    let threads = if moved >= PARALLEL_MIN { threads } else { 1 };
    // Units of whole planes: several per thread where there is work enough, so that threads
    // finishing early take more.
    let units = (macs / UNIT_MACS).clamp(threads, 4 * threads).min(p.planes);
    let per = p.planes.div_ceil(units.max(1));
    let (block_rows, step) = (p.block_rows(), U * p.simd.lanes());
    par_units(
        p.planes.div_ceil(per),
        threads,
        || Scratch {
            split: vec![0.0; p.scratch],
            acc: vec![0.0; block_rows * p.split.pitch + step],
        },
        |s, unit| {
            let planes = unit * per..((unit + 1) * per).min(p.planes);
            for plane in planes.clone() {
                let (b, oc) = (plane / p.o, plane % p.o);
                // Safety: plane `(b, oc / og)` of x, the kernel of `oc`, output plane `plane`:
                // in bounds (the caller's contract); units write disjoint planes.
                let (src, wk, dst) = unsafe {
                    (
                        std::slice::from_raw_parts((x.get() as *const I::In).add((b * p.c + oc / p.og) * s_in), s_in),
                        std::slice::from_raw_parts((w.get() as *const f32).add(oc * ks), ks),
                        std::slice::from_raw_parts_mut(out.get().add(plane * ys), ys),
                    )
                };
                // Safety: the plan's instruction set (see `Plan::new`).
                unsafe {
                    match p.simd {
                        Simd::Avx512 => plane_avx512(p, src, wk, dst, s, io),
                        _ => plane_avx2(p, src, wk, dst, s, io),
                    }
                }
            }
            if let Some(epi) = epi {
                epi(planes.start, planes.len());
            }
        },
    );
}

/// One output plane `dst` of the input plane `src` and the kernel `w`: split, blocks of rows
/// computed flat, rows copied out.
///
/// # Safety
/// Called with `L`'s instruction set.
#[inline(always)]
unsafe fn plane<L: Lanes, I: PlaneIo>(p: &Plan, src: &[I::In], w: &[f32], dst: &mut [I::Out], s: &mut Scratch, io: &I) {
    // The padding of the split plane is zero from the scratch's start on: only the input's
    // elements are written, here.
    for &(to, from, n) in &p.runs {
        io.gather(&mut s.split[to..to + n], &src[from..], p.split.sw);
    }
    let (block_rows, pitch, step) = (p.block_rows(), p.split.pitch, U * L::N);
    for r0 in (0..p.oh).step_by(block_rows) {
        let r1 = (r0 + block_rows).min(p.oh);
        let len = ((r1 - 1 - r0) * pitch + p.ow).next_multiple_of(step);
        let at = &s.split[r0 * pitch..];
        // Every tap's run of the block's rows ends within the split plane (the phases hold
        // what the windows read), and the rounding up to whole steps within its slack.
        debug_assert!(p.taps.iter().all(|&t| t + len <= at.len()) && len <= s.acc.len());
        // Safety: every read and write is in bounds (above).
        unsafe {
            match p.taps.len() {
                9 => flat::<L, 9>(&p.taps, at.as_ptr(), w, s.acc.as_mut_ptr(), len),
                25 => flat::<L, 25>(&p.taps, at.as_ptr(), w, s.acc.as_mut_ptr(), len),
                _ => flat::<L, 0>(&p.taps, at.as_ptr(), w, s.acc.as_mut_ptr(), len),
            }
        }
        for (oy, row) in (r0..r1).zip(dst[r0 * p.ow..r1 * p.ow].chunks_exact_mut(p.ow)) {
            io.store(row, &s.acc[(oy - r0) * pitch..][..p.ow]);
        }
    }
}

/// `acc[j] = Σ_t w[t] · src[taps[t] + j]` for `j < len` (a multiple of the register block)
/// with `K` taps (`K = 0`: any number, the weights broadcast from memory per block).
///
/// # Safety
/// Called with `L`'s instruction set; `src` is readable at every `taps[t] + j`, `acc` writable
/// at every `j < len`.
#[inline(always)]
unsafe fn flat<L: Lanes, const K: usize>(taps: &[usize], src: *const f32, w: &[f32], acc: *mut f32, len: usize) {
    // Safety: the caller's contract.
    unsafe {
        // With `K` known the tap loop unrolls and the weights stay in registers.
        let n = if K > 0 { K } else { taps.len() };
        let held: [L; K] = std::array::from_fn(|i| L::splat(&w[i]));
        for j in (0..len).step_by(U * L::N) {
            let mut a = [L::zero(); U];
            for k in 0..n {
                let (s, wk) = (src.add(taps[k] + j), if K > 0 { held[k] } else { L::splat(&w[k]) });
                for (u, a) in a.iter_mut().enumerate() {
                    *a = L::fma(L::load(s.add(u * L::N)), wk, *a);
                }
            }
            for (u, &a) in a.iter().enumerate() {
                L::store(acc.add(j + u * L::N), a);
            }
        }
    }
}

/// [`plane`] for one instruction set.
macro_rules! plane_instance {
    ($name:ident, $feat:literal, $lanes:ty) => {
        /// # Safety
        /// The host has the instruction set.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name<I: PlaneIo>(p: &Plan, src: &[I::In], w: &[f32], dst: &mut [I::Out], s: &mut Scratch, io: &I) {
            // Safety: the caller's contract.
            unsafe { plane::<$lanes, I>(p, src, w, dst, s, io) }
        }

        /// Off x86-64 no plan is made ([`Simd::detect`] is `Baseline`).
        #[cfg(not(target_arch = "x86_64"))]
        unsafe fn $name<I: PlaneIo>(_: &Plan, _: &[I::In], _: &[f32], _: &mut [I::Out], _: &mut Scratch, _: &I) {
            unreachable!("no vector instances off x86-64")
        }
    };
}

plane_instance!(plane_avx512, "avx512f,avx2,fma", crate::simd::x86::Zmm);
plane_instance!(plane_avx2, "avx2,fma", crate::simd::x86::Ymm);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::testing::Depthwise;

    /// 3 × 3, 5 × 5, 7 × 7 and 1 × 3 kernels; strides 1 to 3, asymmetric padding, dilation,
    /// two output channels per input channel, 1 × 1 to 30 × 33 planes, batches, 1 and 2
    /// threads: against the definition (small integers, so f32 is exact). CI runs this on the
    /// AVX-512 and the AVX2 instances (`OAR_CPU_SIMD`).
    #[test]
    fn depthwise_convolutions_match_the_definition() {
        // (n, c, og, h, w, kh, kw, stride, pad before, pad after, dilation)
        type Case = (
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
        );
        let cases: [Case; 12] = [
            (1, 3, 1, 7, 7, 3, 3, 1, 1, 1, 1),
            (2, 5, 1, 14, 14, 3, 3, 2, 1, 1, 1),
            (1, 4, 1, 30, 33, 3, 3, 1, 1, 1, 1),
            (1, 2, 1, 30, 33, 3, 3, 2, 0, 1, 1),
            (1, 3, 1, 19, 17, 5, 5, 1, 2, 2, 1),
            (1, 3, 1, 19, 17, 5, 5, 2, 2, 2, 1),
            (1, 2, 2, 12, 11, 3, 3, 1, 1, 1, 1),
            (1, 2, 1, 16, 16, 7, 7, 3, 3, 2, 1),
            (1, 2, 1, 13, 15, 3, 3, 1, 2, 2, 2),
            (1, 2, 1, 1, 1, 3, 3, 1, 1, 1, 1),
            (2, 3, 1, 9, 40, 1, 3, 1, 0, 1, 1),
            (1, 40, 1, 56, 56, 3, 3, 1, 1, 1, 1),
        ];
        if Simd::detect() == Simd::Baseline {
            return;
        }
        for (n, c, og, h, w, kh, kw, s, pb, pa, d) in cases {
            let t = Depthwise::new([n, c, og, h, w], [kh, kw], s, pb, pa, d);
            let plan = Plan::new(&t.xs, &t.ws, &t.spec(), &t.sout).expect("a depthwise plan");
            for threads in [1, 2] {
                let mut got = vec![f32::NAN; t.want.len()];
                // Safety: operands of the plan's shapes.
                unsafe { conv(t.x.as_ptr(), t.w.as_ptr(), got.as_mut_ptr(), &plan, &F32, threads, None) };
                let case = (n, c, og, h, w, kh, kw, s, pb, pa, d);
                assert_eq!(got, t.want, "{case:?}, {threads} threads");
            }
        }
    }

    #[test]
    fn declines_what_other_paths_serve() {
        let spec = ConvSpec {
            stride: &[1, 1],
            pad_before: &[1, 1],
            pad_after: &[1, 1],
            dilation: &[1, 1],
            groups: 1,
        };
        // Several input channels per group: the tiled path's.
        assert!(Plan::new(&[1, 4, 8, 8], &[4, 4, 3, 3], &spec, &[8, 8]).is_none());
        // 1-d and 3-d convolutions: the generic direct path's.
        assert!(Plan::new(&[1, 4, 8], &[4, 1, 3], &spec, &[8]).is_none());
    }
}
