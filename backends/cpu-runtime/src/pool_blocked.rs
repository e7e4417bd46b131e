//! `max_pool2d` from the blocked channel layout NCHW`L`c ([`crate::blocked`]) into NCHW, for
//! 3 × 3 windows at stride 2: ResNet's pool after its first layer, which the first-layer
//! kernel ([`crate::conv_first_blocked`]) then stores blocked instead of transposing its
//! output.
//!
//! An output vector holds one position's `L` channels: each of the window's nine elements is
//! one vector load — no splitting of even and odd columns as the NCHW kernel
//! ([`crate::pool`]'s `plane_3x3s2`) needs — combined by that kernel's tree of IR `max`es
//! ([`max_tree9`]), so the values and NaN bits are the definition's. `L` consecutive positions
//! are transposed in registers into the `L` output planes' rows.

use crate::contraction::SendPtr;
use crate::par::par_units;
use crate::pool::max_tree9;
use crate::simd::{Lanes, Simd};
use oar_ir::ops::MaxPool2d;

/// The geometry of one blocked max pool.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    top: usize,
    left: usize,
    simd: Simd,
}

impl Plan {
    /// The plan for `max_pool2d(x[xs])` with attributes `m` and output shape `ys`, where this
    /// path serves: 3 × 3 windows at stride 2 on a host with AVX2 or AVX-512, every window
    /// overlapping the input.
    pub(crate) fn new(xs: &[usize], m: &MaxPool2d, ys: &[usize]) -> Option<Plan> {
        let simd = Simd::detect();
        if simd == Simd::Baseline || xs.len() != 4 || ys.len() != 4 || xs[..2] != ys[..2] {
            return None;
        }
        if m.kernel != [3, 3] || m.stride != [2, 2] || xs.contains(&0) || ys.contains(&0) {
            return None;
        }
        let (top, left) = (m.padding[0], m.padding[1]);
        // Windows wholly in the padding (a padding of 3 or more) are the general path's.
        if top > 2 || left > 2 || 2 * (ys[2] - 1) >= xs[2] + top || 2 * (ys[3] - 1) >= xs[3] + left {
            return None;
        }
        Some(Plan {
            n: xs[0],
            c: xs[1],
            h: xs[2],
            w: xs[3],
            oh: ys[2],
            ow: ys[3],
            top,
            left,
            simd,
        })
    }
}

/// `out[N, C, OH, OW] = max_pool2d(x)`, `x` stored blocked (its channels padded to whole
/// blocks; the padded lanes are pooled and dropped).
///
/// # Safety
/// `x` holds the plan's blocked input, `out` its NCHW output; they do not overlap.
pub(crate) unsafe fn pool(x: *const f32, out: *mut f32, p: &Plan, threads: usize) {
    let l = p.simd.lanes();
    let cb = p.c.div_ceil(l);
    let work = p.n * cb * l * p.oh * p.ow * 9;
    let threads = if work >= 1 << 16 { threads } else { 1 };
    // Units: (image, channel block, band of output rows).
    let bands = (4 * threads).div_ceil(p.n * cb).clamp(1, p.oh);
    let rows = p.oh.div_ceil(bands);
    let bands = p.oh.div_ceil(rows);
    let (xs, os) = (SendPtr(x as *mut f32), SendPtr(out));
    par_units(
        p.n * cb * bands,
        threads,
        || (),
        |_, u| {
            let (plane, band) = (u / bands, u % bands);
            let oys = band * rows..((band + 1) * rows).min(p.oh);
            // Safety: block `plane` of the input; the unit's output rows of its channels.
            unsafe {
                match p.simd {
                    Simd::Avx512 => rows_avx512(p, xs.get(), os.get(), plane, oys),
                    _ => rows_avx2(p, xs.get(), os.get(), plane, oys),
                }
            }
        },
    );
}

/// Output rows `oys` of channel block `plane` (image `plane / blocks`).
///
/// # Safety
/// Called with `L`'s instruction set; as [`pool`].
#[inline(always)]
unsafe fn rows<L: Lanes>(p: &Plan, x: *const f32, out: *mut f32, plane: usize, oys: std::ops::Range<usize>) {
    let l = L::N;
    let cb = p.c.div_ceil(l);
    let (b, blk) = (plane / cb, plane % cb);
    let valid = l.min(p.c - blk * l);
    let (h, w) = (p.h as isize, p.w as isize);
    // Safety: every load is of an input position inside the plane; every store of an output
    // position of a valid channel.
    unsafe {
        let xp = x.add(plane * p.h * p.w * l);
        let lowest = L::splat_value(f32::NEG_INFINITY);
        let mut v = [lowest; 16];
        for oy in oys {
            let iy0 = (2 * oy) as isize - p.top as isize;
            let rows: [Option<*const f32>; 3] = std::array::from_fn(|r| {
                let iy = iy0 + r as isize;
                (0..h).contains(&iy).then(|| xp.add(iy as usize * p.w * l))
            });
            for ox0 in (0..p.ow).step_by(l) {
                let np = l.min(p.ow - ox0);
                let c0 = (2 * ox0) as isize - p.left as isize;
                let inside = rows.iter().all(Option::is_some) && c0 >= 0 && c0 + 2 * (np as isize) < w;
                for (j, vj) in v.iter_mut().enumerate().take(np) {
                    let c = c0 + 2 * j as isize;
                    let mut leaves = [lowest; 9];
                    for (r, row) in rows.iter().enumerate() {
                        let Some(row) = *row else { continue };
                        for d in 0..3 {
                            let ix = c + d as isize;
                            if inside || (0..w).contains(&ix) {
                                leaves[3 * r + d] = L::load(row.offset(ix * l as isize));
                            }
                        }
                    }
                    *vj = max_tree9(leaves);
                }
                L::transpose(&mut v[..l]);
                for (lane, &row) in v.iter().enumerate().take(valid) {
                    let ch = blk * l + lane;
                    L::store_first(out.add(((b * p.c + ch) * p.oh + oy) * p.ow + ox0), np, row);
                }
            }
        }
    }
}

/// [`rows`] for one instruction set.
macro_rules! rows_instance {
    ($name:ident, $feat:literal, $lanes:ty) => {
        /// # Safety
        /// The host has the instruction set; as [`rows`].
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name(p: &Plan, x: *const f32, out: *mut f32, plane: usize, oys: std::ops::Range<usize>) {
            // Safety: the caller's contract.
            unsafe { rows::<$lanes>(p, x, out, plane, oys) }
        }

        /// Off x86-64 no plan is made ([`Simd::detect`] is `Baseline`).
        #[cfg(not(target_arch = "x86_64"))]
        unsafe fn $name(_: &Plan, _: *const f32, _: *mut f32, _: usize, _: std::ops::Range<usize>) {
            unreachable!("no vector instances off x86-64")
        }
    };
}

rows_instance!(rows_avx512, "avx512f,avx2,fma", crate::simd::x86::Zmm);
rows_instance!(rows_avx2, "avx2,fma", crate::simd::x86::Ymm);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocked::to_blocked;

    /// Against the NCHW kernel, bit for bit: NaNs of two payloads, ±0 ties, ±∞, padding of 0
    /// to 2, odd and even sizes, channels below, at and past whole blocks (the padded lanes
    /// of the blocked input NaN), 1 and 2 threads. CI runs this on both vector instances
    /// (`OAR_CPU_SIMD`).
    #[test]
    fn blocked_pools_match_the_nchw_kernel_bit_for_bit() {
        if Simd::detect() == Simd::Baseline {
            return;
        }
        let l = Simd::detect().lanes();
        let (nan_a, nan_b) = (f32::from_bits(0x7fc0_0001), f32::from_bits(0xffc0_0002));
        let special = [nan_a, nan_b, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1.5, -2.5];
        // (n, c, h, w, top, left, bottom, right)
        let cases = [
            (1, 16, 17, 23, 1, 1, 1, 1),
            (2, 20, 12, 12, 0, 0, 1, 1),
            (1, 8, 9, 40, 2, 2, 2, 2),
            (1, 3, 5, 5, 1, 0, 1, 2),
            (2, 33, 28, 30, 1, 1, 0, 0),
        ];
        for (n, c, h, w, top, left, bottom, right) in cases {
            let (oh, ow) = ((h + top + bottom - 3) / 2 + 1, (w + left + right - 3) / 2 + 1);
            let m = MaxPool2d {
                kernel: [3, 3],
                stride: [2, 2],
                padding: [top, left, bottom, right],
                ceil_mode: false,
            };
            let len = n * c * h * w;
            let x: Vec<f32> = (0..len)
                .map(|i| {
                    let r = (i * 2654435761) % 97;
                    if r < 16 {
                        special[r % special.len()]
                    } else {
                        (r % 13) as f32 - 6.0
                    }
                })
                .collect();
            let (xs, ys) = ([n, c, h, w], [n, c, oh, ow]);
            let mut want = vec![0f32; n * c * oh * ow];
            crate::pool::max_pool2d_into((&x[..], &xs[..]), (&mut want[..], &ys[..]), &m, 1).unwrap();
            let plan = Plan::new(&xs, &m, &ys).expect("a blocked pool plan");
            let xb = to_blocked(&x, n, c, h * w, l);
            for threads in [1, 2] {
                let mut got = vec![f32::NAN; want.len()];
                // Safety: the plan's blocked input and NCHW output.
                unsafe { pool(xb.as_ptr(), got.as_mut_ptr(), &plan, threads) };
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{:?}, {threads} threads",
                    (n, c, h, w, top, left)
                );
            }
        }
    }

    /// Other windows and strides, and windows wholly in the padding, are not this path's.
    #[test]
    fn declines_other_pools() {
        let m = |kernel, stride, pad| MaxPool2d {
            kernel,
            stride,
            padding: [pad; 4],
            ceil_mode: false,
        };
        assert!(Plan::new(&[1, 8, 9, 9], &m([2, 2], [2, 2], 0), &[1, 8, 4, 4]).is_none());
        assert!(Plan::new(&[1, 8, 9, 9], &m([3, 3], [1, 1], 1), &[1, 8, 9, 9]).is_none());
        assert!(Plan::new(&[1, 8, 9, 9], &m([3, 3], [2, 2], 3), &[1, 8, 7, 7]).is_none());
        let serves = Plan::new(&[1, 8, 9, 9], &m([3, 3], [2, 2], 1), &[1, 8, 5, 5]).is_some();
        assert_eq!(serves, Simd::detect() != Simd::Baseline);
    }
}
