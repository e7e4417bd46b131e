//! The weight gradient of a small-image f32 convolution without a patch matrix.
//!
//! `dw[o, c, ky, kx] = Σ_b Σ_oy Σ_ox dy[b, o, oy, ox] · x[b, c, oy + ky - pt, ox + kx - pl]`
//! (stride 1, no dilation). On LeNet-sized planes (28 × 28, 10 × 10) the im2col + GEMM path
//! spends more time writing its patch matrix — short row segments, one per kernel tap and
//! output row — than multiplying. Here the output columns are the vector lanes: per kernel
//! row `ky` of input channel `c` and block of `OB` output channels, `OB × KW` vector
//! accumulators stay in registers while the batch and the output rows stream past; each
//! input row is loaded once per tap `kx` (an unaligned load at offset `kx` into a zero-padded
//! copy of the input), each cotangent row once per output channel. The lanes are summed at
//! the end in a fixed order, and each unit (`c`, `ky`, output block) owns its gradient
//! entries, so results do not depend on the threads.

use crate::par::par_units;
use crate::simd::Simd;

/// Where the direct kernel serves (else im2col + GEMM): 2-D, f32, stride 1, no dilation, a
/// kernel width it has an instance for, output rows short enough that im2col's segments are
/// what costs, and long enough to fill most of a vector (the lanes are output columns: a
/// 1 × 1 plane would use one lane of sixteen, where GEMM over grouped images runs at speed).
/// Rows shorter than the host's vector (8 × 8 planes under AVX-512) take the direct kernel
/// only for few channels (`o · c < 1024`, LeNet's 6 → 16), where GEMM has little to work
/// with; with many (a ResNet stage's 64 → 64) GEMM over the batch is ~2.5× faster there.
pub(crate) fn eligible(stride: &[usize], dilation: &[usize], kw: usize, ow: usize, o: usize, c: usize) -> bool {
    let lanes = match Simd::detect() {
        Simd::Avx512 => 16,
        Simd::Avx2Fma => 8,
        Simd::Baseline => 4,
    };
    let wide = ow >= lanes || o.saturating_mul(c) < 1024;
    stride == [1, 1] && dilation == [1, 1] && matches!(kw, 3 | 5) && (8..=32).contains(&ow) && wide
}

/// Shapes of one call: x `[n, c, h, w]`, dy `[n, o, oh, ow]`, kernel `[kh, kw]`, padding
/// before (`pt`, `pl`).
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub oh: usize,
    pub ow: usize,
    pub kh: usize,
    pub kw: usize,
    pub pt: usize,
    pub pl: usize,
}

/// `dw` (`[o, c, kh, kw]`, overwritten) of the convolution `s` ([`eligible`] checked by the
/// caller).
pub(crate) fn weight_grad(s: Shape, x: &[f32], dy: &[f32], dw: &mut [f32], threads: usize) {
    debug_assert_eq!(dw.len(), s.o * s.c * s.kh * s.kw);
    match (Simd::detect(), s.kw) {
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx512, 5) => run::<4, 5, 16>(s, x, dy, dw, threads, Isa::Avx512),
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx512, 3) => run::<6, 3, 16>(s, x, dy, dw, threads, Isa::Avx512),
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx2Fma, 5) => run::<2, 5, 8>(s, x, dy, dw, threads, Isa::Avx2),
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx2Fma, 3) => run::<3, 3, 8>(s, x, dy, dw, threads, Isa::Avx2),
        (_, 5) => run::<2, 5, 4>(s, x, dy, dw, threads, Isa::Baseline),
        _ => run::<2, 3, 4>(s, x, dy, dw, threads, Isa::Baseline),
    }
}

#[derive(Clone, Copy)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Baseline,
}

/// Padded operands, then one unit per (input channel, kernel row, block of `OB` outputs).
fn run<const OB: usize, const KW: usize, const L: usize>(
    s: Shape,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    threads: usize,
    isa: Isa,
) {
    let chunks = s.ow.div_ceil(L);
    let owp = chunks * L;
    // Input rows in the padded frame: row oy + ky of the padded input is input row
    // oy + ky - pt; columns likewise shifted by pl, zero outside, wide enough for the last
    // chunk's loads at every tap.
    let (hp, wp) = (s.oh + s.kh - 1, owp + KW - 1);
    let mut xp = vec![0f32; s.n * s.c * hp * wp];
    for (plane, dst) in x.chunks_exact(s.h * s.w).zip(xp.chunks_exact_mut(hp * wp)) {
        for r in 0..s.h {
            let pr = r + s.pt;
            if pr >= hp {
                break;
            }
            // Input columns that land inside the padded row.
            let cols = s.w.min(wp.saturating_sub(s.pl));
            dst[pr * wp + s.pl..][..cols].copy_from_slice(&plane[r * s.w..][..cols]);
        }
    }
    // Cotangent rows padded to whole chunks, output channels to whole blocks (zeros: no
    // contribution).
    let blocks = s.o.div_ceil(OB);
    let op = blocks * OB;
    let mut dyp = vec![0f32; s.n * op * s.oh * owp];
    for b in 0..s.n {
        for o in 0..s.o {
            for r in 0..s.oh {
                let src = &dy[((b * s.o + o) * s.oh + r) * s.ow..][..s.ow];
                dyp[((b * op + o) * s.oh + r) * owp..][..s.ow].copy_from_slice(src);
            }
        }
    }
    let units = s.c * s.kh * blocks;
    let out = crate::contraction::SendPtr(dw.as_mut_ptr());
    let work = s.n * s.oh * chunks * OB * KW * units;
    let threads = if work < 1 << 14 { 1 } else { threads };
    let (xp, dyp) = (&xp[..], &dyp[..]);
    par_units(
        units,
        threads,
        || (),
        |_, u| {
            let (cb, ob) = (u / blocks, u % blocks);
            let (c, ky) = (cb / s.kh, cb % s.kh);
            let mut sums = [[0f32; KW]; OB];
            match isa {
                #[cfg(target_arch = "x86_64")]
                // Safety: the features were detected.
                Isa::Avx512 => unsafe { unit_avx512::<OB, KW, L>(s, xp, dyp, c, ky, ob, &mut sums) },
                #[cfg(target_arch = "x86_64")]
                // Safety: as above.
                Isa::Avx2 => unsafe { unit_avx2::<OB, KW, L>(s, xp, dyp, c, ky, ob, &mut sums) },
                Isa::Baseline => unit::<OB, KW, L>(s, xp, dyp, c, ky, ob, &mut sums),
            }
            for (i, row) in sums.iter().enumerate() {
                let o = ob * OB + i;
                if o >= s.o {
                    break;
                }
                for (kx, &v) in row.iter().enumerate() {
                    // Safety: entry (o, c, ky, kx) belongs to this unit alone.
                    unsafe { *out.get().add(((o * s.c + c) * s.kh + ky) * s.kw + kx) = v };
                }
            }
        },
    );
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn unit_avx512<const OB: usize, const KW: usize, const L: usize>(
    s: Shape,
    xp: &[f32],
    dyp: &[f32],
    c: usize,
    ky: usize,
    ob: usize,
    sums: &mut [[f32; KW]; OB],
) {
    unit::<OB, KW, L>(s, xp, dyp, c, ky, ob, sums)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn unit_avx2<const OB: usize, const KW: usize, const L: usize>(
    s: Shape,
    xp: &[f32],
    dyp: &[f32],
    c: usize,
    ky: usize,
    ob: usize,
    sums: &mut [[f32; KW]; OB],
) {
    unit::<OB, KW, L>(s, xp, dyp, c, ky, ob, sums)
}

/// One unit's sums: `sums[i][kx]` for output channel `ob · OB + i`, tap (`ky`, `kx`) of input
/// channel `c`.
#[inline(always)]
fn unit<const OB: usize, const KW: usize, const L: usize>(
    s: Shape,
    xp: &[f32],
    dyp: &[f32],
    c: usize,
    ky: usize,
    ob: usize,
    sums: &mut [[f32; KW]; OB],
) {
    let chunks = s.ow.div_ceil(L);
    let owp = chunks * L;
    let (hp, wp) = (s.oh + s.kh - 1, owp + KW - 1);
    let op = s.o.div_ceil(OB) * OB;
    let mut total = [[[0f32; L]; KW]; OB];
    for ch in 0..chunks {
        let mut acc = [[[0f32; L]; KW]; OB];
        for b in 0..s.n {
            let xplane = &xp[(b * s.c + c) * hp * wp..][..hp * wp];
            for oy in 0..s.oh {
                let xrow = &xplane[(oy + ky) * wp + ch * L..][..L + KW - 1];
                let xv: [[f32; L]; KW] = std::array::from_fn(|kx| xrow[kx..kx + L].try_into().expect("L lanes"));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let o = ob * OB + i;
                    let d: &[f32; L] = dyp[((b * op + o) * s.oh + oy) * owp + ch * L..][..L]
                        .try_into()
                        .expect("L lanes");
                    for (a, xk) in acc.iter_mut().zip(&xv) {
                        for l in 0..L {
                            // A fused multiply-add where the instance has FMA (the x86-64
                            // ones), a multiply and an add elsewhere (no libm call).
                            a[l] = if cfg!(target_arch = "x86_64") && L > 4 {
                                d[l].mul_add(xk[l], a[l])
                            } else {
                                d[l] * xk[l] + a[l]
                            };
                        }
                    }
                }
            }
        }
        for (t, a) in total.iter_mut().zip(&acc) {
            for (tk, ak) in t.iter_mut().zip(a) {
                for l in 0..L {
                    tk[l] += ak[l];
                }
            }
        }
    }
    for (srow, trow) in sums.iter_mut().zip(&total) {
        for (sv, t) in srow.iter_mut().zip(trow) {
            // Lanes in a fixed pairwise order.
            let mut v = *t;
            let mut width = L;
            while width > 1 {
                width /= 2;
                for l in 0..width {
                    v[l] += v[l + width];
                }
            }
            *sv = v[0];
        }
    }
}
