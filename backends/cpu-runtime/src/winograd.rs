//! Winograd F(4×4, 3×3) convolution for f32: 3 × 3 kernels, stride 1, no dilation, one group
//! (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016; interpolation
//! points 0, ±1, ±2, ∞).
//!
//! Each 4 × 4 block of outputs of a channel pair is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`, where `d` is
//! the 6 × 6 input patch under the block and `g` the 3 × 3 kernel: 36 multiplies per input
//! channel where the direct convolution does 144. Summed over input channels, the elementwise
//! products become 36 independent GEMMs, one per position `ξ` of the 6 × 6 transformed tile:
//! `M[ξ] (K × T) = U[ξ] (K × C) · V[ξ] (C × T)` over the T tiles. So a call
//! 1. transforms the kernels: `U[ξ][k][c]` (16 input channels per vector),
//! 2. per block of tiles, transforms the input patches: `V[ξ][c][t]` (16 tiles per vector),
//! 3. runs the 36 GEMMs (split across threads by `ξ`),
//! 4. transforms each tile's 36 products back to its 4 × 4 outputs (16 tiles per vector),
//!    clipped at the output's edges.
//!
//! The transforms are written as loops over 16 lanes, instantiated for AVX-512 and AVX2+FMA
//! and chosen at run time ([`crate::simd`]). On wide planes (8 or more tiles per row) the
//! lanes are a row segment of tiles, whose patches are read as whole input rows split by
//! deinterleaving, and whose output blocks are interleaved back and stored as whole rows
//! (ResNet-18's 56 × 56 layers: input transform 0.36 → 0.2 ms, output 0.21 → 0.13 ms
//! single-threaded); narrower planes move their tiles' elements one by one. Rounding differs
//! from the direct product (the transforms scale by up to 8 and 1/24): measured relative
//! errors stay near 1e-6 of the outputs' scale for unit-scale data, well inside the 1e-4 the
//! backend promises against other runtimes; [`applies`] keeps small convolutions (few
//! channels or tiles) on the exact path.

use crate::contraction::{Mat, SendPtr, WeightCache, gemm_raw};
use crate::par::par_units;
use crate::simd::{Simd, instances};
use gemm::Parallelism;

/// Lanes per transform vector.
const L: usize = 16;
/// Bytes of transformed kernels above which the direct path serves instead (deep layers at
/// small planes, where re-reading the 4× larger transformed kernels costs more than it saves).
const MAX_U_BYTES: usize = 12 << 20;
/// Bytes of per-block scratch (transformed inputs and products) at most, unless that leaves
/// fewer than [`MIN_BLOCK_VECTORS`] vectors of tiles: L2-sized blocks for few channels (64 at
/// 56 × 56: 112 tiles per block), 48 tiles for many (512 at 7 × 7, batch 16: 12.7 → 9.0 ms
/// against blocks of 16, whose GEMMs are too narrow).
const BLOCK_BYTES: usize = 2 << 20;
/// Tile vectors per block at least.
const MIN_BLOCK_VECTORS: usize = 3;

/// The geometry of one Winograd convolution (NCHW).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub n: usize,
    pub c: usize,
    pub k: usize,
    pub h: usize,
    pub w: usize,
    /// Padding before (top, left).
    pub pt: usize,
    pub pl: usize,
    pub oh: usize,
    pub ow: usize,
}

impl Shape {
    /// Tile rows and columns per image.
    fn tiles_hw(&self) -> (usize, usize) {
        (self.oh.div_ceil(4), self.ow.div_ceil(4))
    }

    pub(crate) fn tiles(&self) -> usize {
        let (th, tw) = self.tiles_hw();
        self.n * th * tw
    }

    /// Image, tile row and tile column of tile `t`.
    #[inline]
    fn tile(&self, t: usize) -> (usize, usize, usize) {
        let (th, tw) = self.tiles_hw();
        (t / (th * tw), (t / tw) % th, t % tw)
    }

    /// Whether the transforms take a row segment of tiles at a time ([`gather_row`],
    /// [`scatter_row`]): on a vector host (`vector`, the instance's), planes of at least
    /// [`ROW_SEGMENT_MIN`] tiles per row.
    fn rowwise(&self, vector: bool) -> bool {
        vector && Simd::detect() != Simd::Baseline && self.tiles_hw().1 >= ROW_SEGMENT_MIN
    }

    /// Tiles in the transforms' group from tile `t`, `left` tiles to go: a vector's worth,
    /// cut at the end of the tile row when `rowwise`.
    fn group(&self, t: usize, left: usize, rowwise: bool) -> usize {
        let tw = self.tiles_hw().1;
        let lanes = L.min(left);
        if rowwise { lanes.min(tw - t % tw) } else { lanes }
    }
}

/// Whether the Winograd path serves this convolution, where it wins: enough input and output
/// channels (16 each) and enough tiles (16) for the GEMMs, at least half of each tile's
/// outputs inside the plane, and transformed kernels of at most [`MAX_U_BYTES`].
pub(crate) fn applies(s: &Shape) -> bool {
    // A tile computes 16 outputs with 36 multiplies per channel pair; planes much smaller
    // than the tiles (2 × 2) waste most of them.
    let useful = 8 * s.tiles() <= s.n * s.oh * s.ow;
    s.c >= 16 && s.k >= 16 && s.tiles() >= 16 && useful && 36 * s.c * s.k * 4 <= MAX_U_BYTES
}

/// `out[N, K, OH, OW] = conv(x[N, C, H, W], w[K, C, 3, 3])`, stride 1, padding `pt`/`pl`
/// before (after: whatever `oh`/`ow` imply; zeros). With `cache` (constant kernels), the
/// transformed kernels are computed on the first call and kept.
///
/// # Safety
/// `x`, `w` and `out` hold the shapes' elements; `out` overlaps neither.
pub(crate) unsafe fn conv(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    s: &Shape,
    threads: usize,
    cache: Option<&WeightCache>,
) {
    // Safety: the caller's contract.
    unsafe { conv_in_blocks(x, w, out, s, threads, cache, BLOCK_BYTES) }
}

/// [`conv`] with blocks of tiles of at most `block_bytes` of scratch.
///
/// # Safety
/// As [`conv`].
unsafe fn conv_in_blocks(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    s: &Shape,
    threads: usize,
    cache: Option<&WeightCache>,
    block_bytes: usize,
) {
    let total = s.tiles();
    if total == 0 || s.k == 0 {
        return;
    }
    // Safety: the caller's contract.
    let (x, w) = unsafe {
        (
            std::slice::from_raw_parts(x, s.n * s.c * s.h * s.w),
            std::slice::from_raw_parts(w, s.k * s.c * 9),
        )
    };
    let out = SendPtr(out);
    let mut own = Vec::new();
    let u: &[f32] = match cache {
        Some(c) => c.get_or_init(|| kernels(w, s, threads)),
        None => {
            own = kernels(w, s, threads);
            &own
        }
    };
    // Blocks of tiles: multiples of the vector width, transformed inputs and products within
    // `block_bytes`, but never fewer than `MIN_BLOCK_VECTORS` vectors (the 36 GEMMs need the
    // width more than the block needs L2).
    let tb = (block_bytes / (36 * (s.c + s.k) * 4) / L).max(MIN_BLOCK_VECTORS) * L;
    let blocks = total.div_ceil(tb);
    if blocks >= 2 * threads {
        // Each unit a block of tiles through all three steps, in its thread's scratch.
        par_units(
            blocks,
            threads,
            || (),
            |_, b| {
                let (t0, nt) = (b * tb, tb.min(total - b * tb));
                with_scratch(36 * (s.c + s.k) * tb, |scratch| {
                    let (v, m) = scratch.split_at_mut(36 * s.c * tb);
                    for c in 0..s.c {
                        input_pick(x, s, c, t0, nt, tb, SendPtr(v.as_mut_ptr()));
                    }
                    for xi in 0..36 {
                        product(u, v, m, false, s, xi, nt, tb);
                    }
                    for k in 0..s.k {
                        output_pick(m, s, k, t0, nt, tb, out);
                    }
                });
            },
        );
        drop(own);
        return;
    }
    // Few blocks (small planes at batch 1): one block at a time, each step split across the
    // threads (input channels, transformed positions, output channels).
    let tb = total.div_ceil(blocks).next_multiple_of(L);
    with_scratch(36 * (s.c + s.k) * tb, |scratch| {
        let (v, m) = scratch.split_at_mut(36 * s.c * tb);
        for b in 0..blocks {
            let (t0, nt) = (b * tb, tb.min(total - b * tb));
            let vp = SendPtr(v.as_mut_ptr());
            par_units(s.c, threads, || (), |_, c| input_pick(x, s, c, t0, nt, tb, vp));
            let (vp, mp) = (SendPtr(v.as_mut_ptr()), SendPtr(m.as_mut_ptr()));
            par_units(
                36,
                threads,
                || (),
                |_, xi| {
                    // Safety: unit `xi` writes M[ξ] only and reads V; both hold their 36 parts.
                    let (v, m) = unsafe {
                        (
                            std::slice::from_raw_parts(vp.get() as *const f32, 36 * s.c * tb),
                            std::slice::from_raw_parts_mut(mp.get().add(xi * s.k * tb), s.k * tb),
                        )
                    };
                    product(u, v, m, true, s, xi, nt, tb);
                },
            );
            let m = &*m;
            par_units(s.k, threads, || (), |_, k| output_pick(m, s, k, t0, nt, tb, out));
        }
    });
    drop(own);
}

thread_local! {
    /// Transformed inputs and products: each thread's, reused across calls (no fresh pages to
    /// fault in per call); every element a block reads is written first in that block.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `f` on the calling thread's scratch, at least `need` elements.
fn with_scratch(need: usize, f: impl FnOnce(&mut [f32])) {
    SCRATCH.with_borrow_mut(|scratch| {
        if scratch.len() < need {
            scratch.resize(need, 0.0);
        }
        f(&mut scratch[..need])
    })
}

/// `M[ξ] (K × nt) = U[ξ] (K × C) · V[ξ] (C × nt)`; `m` holds every M[ξ], or (`alone`)
/// M[ξ] only. U[ξ] is stored input channel-major (`U[ξ][c][k]`), so gemm reads it
/// in place without packing it for narrow blocks.
#[allow(clippy::too_many_arguments)]
fn product(u: &[f32], v: &[f32], m: &mut [f32], alone: bool, s: &Shape, xi: usize, nt: usize, tb: usize) {
    let (uk, vk) = (&u[xi * s.c * s.k..][..s.c * s.k], &v[xi * s.c * tb..][..s.c * tb]);
    let mk = if alone {
        &mut m[..s.k * tb]
    } else {
        &mut m[xi * s.k * tb..][..s.k * tb]
    };
    let lhs = Mat {
        ptr: uk.as_ptr(),
        rs: 1,
        cs: s.k as isize,
    };
    let rhs = Mat {
        ptr: vk.as_ptr(),
        rs: tb as isize,
        cs: 1,
    };
    // Safety: U[ξ] (K × C, column-major), V[ξ]'s first `nt` columns (C × nt, row stride tb)
    // and M[ξ] (K × nt, row stride tb) lie in the slices above.
    unsafe { gemm_raw(s.k, nt, s.c, mk.as_mut_ptr(), tb as isize, lhs, rhs, Parallelism::None) };
}

/// `U[ξ][c][k]` for every input channel, a channel per unit.
fn kernels(w: &[f32], s: &Shape, threads: usize) -> Vec<f32> {
    let mut u = vec![0f32; 36 * s.k * s.c];
    let up = SendPtr(u.as_mut_ptr());
    // Unit `c` writes `U[ξ][c][..]` only.
    par_units(s.c, threads, || (), |_, c| filter_pick(w, s.c, s.k, c, up));
    u
}

/// `lanes` elements at `src` (all [`L`] when `lanes == L`, read as one vector).
///
/// # Safety
/// `src` is valid for `lanes` reads.
#[inline(always)]
unsafe fn load(src: *const f32, lanes: usize) -> [f32; L] {
    if lanes == L {
        // Safety: the caller's contract.
        return unsafe { (src as *const [f32; L]).read_unaligned() };
    }
    let mut v = [0f32; L];
    for (l, x) in v.iter_mut().enumerate().take(lanes) {
        // Safety: as above.
        *x = unsafe { *src.add(l) };
    }
    v
}

/// The first `lanes` elements of `v` to `dst` (one vector store when `lanes == L`).
///
/// # Safety
/// `dst` is valid for `lanes` writes.
#[inline(always)]
unsafe fn store(dst: *mut f32, v: &[f32; L], lanes: usize) {
    if lanes == L {
        // Safety: the caller's contract.
        unsafe { (dst as *mut [f32; L]).write_unaligned(*v) };
        return;
    }
    for (l, &x) in v.iter().enumerate().take(lanes) {
        // Safety: as above.
        unsafe { *dst.add(l) = x };
    }
}

/// `unsafe fn $name(args)`: `$with::<Zmm>(args)` on AVX-512 hosts, `$with::<Ymm>(args)` on
/// AVX2 ones, each compiled for its instruction set (its callers run only where
/// [`Simd::detect`] is not `Baseline`).
macro_rules! by_lanes {
    ($(#[$m:meta])* unsafe fn $name:ident = $with:ident($($a:ident: $t:ty),*)) => {
        $(#[$m])*
        unsafe fn $name($($a: $t),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn avx512($($a: $t),*) {
                    unsafe { $with::<crate::simd::x86::Zmm>($($a),*) }
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($a: $t),*) {
                    unsafe { $with::<crate::simd::x86::Ymm>($($a),*) }
                }
                // Safety: the caller's contract.
                unsafe {
                    match Simd::detect() {
                        Simd::Avx512 => avx512($($a),*),
                        _ => avx2($($a),*),
                    }
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = ($($a),*);
                unreachable!("no vector instances off x86-64")
            }
        }
    };
}

/// Tiles per row from which the transforms take a row segment of tiles at a time, reading and
/// writing whole rows ([`gather_row`], [`scatter_row`]); narrower planes move their tiles'
/// elements one by one (measured on ResNet-18 at batch 16: 7 tiles per row gathered as whole
/// rows ran 25% slower, the lanes then half empty).
const ROW_SEGMENT_MIN: usize = 8;

by_lanes! {
    /// `d[r·6 + q][l]` = element `(r, q)` of the patch of tile `l` (zero in the padding), for
    /// `cnt` tiles side by side in one row of tiles (row `ty`, from column `tx`) of input plane
    /// `at`: each patch row is read as the input row it lies in, four vectors from each tile's
    /// first column and four from four columns on, and split by two rounds of deinterleaving
    /// into the columns 0–3 (and 4–5) of every tile's patch — instead of 36 scalar moves per
    /// tile, whose stores the vector loads of `d` then wait on.
    ///
    /// # Safety
    /// The host has the detected instruction set (not `Baseline`); `at` holds the plane's
    /// `s.h · s.w` elements.
    unsafe fn gather_row = gather_row_with(s: &Shape, at: *const f32, ty: usize, tx: usize, cnt: usize, d: &mut [[f32; L]; 36])
}

/// [`gather_row`] with `V`'s vectors: `V::N` tiles per round.
///
/// # Safety
/// As [`gather_row`], with `V`'s instruction set.
#[inline(always)]
unsafe fn gather_row_with<V: crate::simd::Lanes>(
    s: &Shape,
    at: *const f32,
    ty: usize,
    tx: usize,
    cnt: usize,
    d: &mut [[f32; L]; 36],
) {
    let (h, w) = (s.h as isize, s.w as isize);
    // Safety (the whole body): `V`'s instruction set (the caller's); every load reads only
    // the lanes whose columns are inside the row; `d`'s rows hold `L` lanes.
    unsafe {
        for half in (0..L).step_by(V::N).take_while(|&h| h < cnt) {
            // The round's first tile's patch column 0, in the input row.
            let col0 = (4 * (tx + half)) as isize - s.pl as isize;
            for r in 0..6 {
                let y = (4 * ty + r) as isize - s.pt as isize;
                if !(0..h).contains(&y) {
                    for q in 0..6 {
                        V::store(d[r * 6 + q].as_mut_ptr().add(half), V::zero());
                    }
                    continue;
                }
                let row = at.wrapping_offset(y * w);
                let [p0, p1, p2, p3] = split4::<V>(row, w, col0);
                let [q4, q5, _, _] = split4::<V>(row, w, col0 + 4);
                for (q, v) in [p0, p1, p2, p3, q4, q5].into_iter().enumerate() {
                    V::store(d[r * 6 + q].as_mut_ptr().add(half), v);
                }
            }
        }
    }
}

/// `V::N` lanes of input row `row` (`w` columns) from column `first`: zero outside the row.
///
/// # Safety
/// `V`'s instruction set; `row` holds `w` elements.
#[inline(always)]
unsafe fn row_lanes<V: crate::simd::Lanes>(row: *const f32, w: isize, first: isize) -> V {
    let n = V::N as isize;
    let (lo, hi) = ((-first).clamp(0, n) as usize, (w - first).clamp(0, n) as usize);
    // Safety: lanes `lo..hi` are columns inside the row.
    unsafe {
        if lo < hi {
            V::load_lanes(row.wrapping_offset(first), lo, hi, V::zero())
        } else {
            V::zero()
        }
    }
}

/// The `4 · V::N` columns of `row` from column `from`, split by their index mod 4: lane `m`
/// of part `j` is column `from + 4m + j`.
///
/// # Safety
/// As [`row_lanes`].
#[inline(always)]
unsafe fn split4<V: crate::simd::Lanes>(row: *const f32, w: isize, from: isize) -> [V; 4] {
    let n = V::N as isize;
    // Safety: the caller's contract.
    unsafe {
        let (e01, o01) = V::deinterleave(row_lanes::<V>(row, w, from), row_lanes::<V>(row, w, from + n));
        let (e23, o23) = V::deinterleave(
            row_lanes::<V>(row, w, from + 2 * n),
            row_lanes::<V>(row, w, from + 3 * n),
        );
        let (p0, p2) = V::deinterleave(e01, e23);
        let (p1, p3) = V::deinterleave(o01, o23);
        [p0, p1, p2, p3]
    }
}

by_lanes! {
    /// Each tile's 4 × 4 block `y[i·4 + j][l]` to output plane `at`, for `cnt` tiles side by side
    /// in one row of tiles (row `ty`, from column `tx`): each output row of the blocks
    /// interleaved back out of the lanes by two rounds and stored as whole row vectors, up to
    /// the segment's (and the plane's) last column.
    ///
    /// # Safety
    /// As [`gather_row`]; `at` holds the output plane's `s.oh · s.ow` elements.
    unsafe fn scatter_row = scatter_row_with(s: &Shape, at: *mut f32, ty: usize, tx: usize, cnt: usize, y: &[[f32; L]; 16])
}

/// [`scatter_row`] with `V`'s vectors: `V::N` tiles per round.
///
/// # Safety
/// As [`scatter_row`], with `V`'s instruction set.
#[inline(always)]
unsafe fn scatter_row_with<V: crate::simd::Lanes>(
    s: &Shape,
    at: *mut f32,
    ty: usize,
    tx: usize,
    cnt: usize,
    y: &[[f32; L]; 16],
) {
    let n = V::N;
    // The segment's last output column (exclusive).
    let end = s.ow.min(4 * (tx + cnt));
    // Safety (the whole body): `V`'s instruction set (the caller's); `y`'s rows hold `L`
    // lanes; every store writes columns `< end` of an output row inside the plane.
    unsafe {
        for half in (0..L).step_by(n).take_while(|&h| h < cnt) {
            let c0 = 4 * (tx + half);
            for i in 0..4.min(s.oh - 4 * ty) {
                let row = at.add((4 * ty + i) * s.ow);
                let part = |j: usize| y[i * 4 + j].as_ptr().add(half);
                let (y0, y1, y2, y3) = (V::load(part(0)), V::load(part(1)), V::load(part(2)), V::load(part(3)));
                let (a_lo, a_hi) = V::interleave(y0, y2);
                let (b_lo, b_hi) = V::interleave(y1, y3);
                let (o0, o1) = V::interleave(a_lo, b_lo);
                let (o2, o3) = V::interleave(a_hi, b_hi);
                for (k, o) in [o0, o1, o2, o3].into_iter().enumerate() {
                    let c = c0 + k * n;
                    if c < end {
                        V::store_first(row.add(c), n.min(end - c), o);
                    }
                }
            }
        }
    }
}

/// `G`'s 1-d transform: three lane vectors `src[s0 + i·ss]` to six.
#[inline(always)]
fn g_1d(src: &[[f32; L]], s0: usize, ss: usize) -> [[f32; L]; 6] {
    let (g0, g1, g2) = (&src[s0], &src[s0 + ss], &src[s0 + 2 * ss]);
    let mut o = [[0f32; L]; 6];
    for l in 0..L {
        let (a, b, c) = (g0[l], g1[l], g2[l]);
        o[0][l] = a * 0.25;
        o[1][l] = (a + b + c) * (-1.0 / 6.0);
        o[2][l] = (a - b + c) * (-1.0 / 6.0);
        o[3][l] = a * (1.0 / 24.0) + b * (1.0 / 12.0) + c * (1.0 / 6.0);
        o[4][l] = a * (1.0 / 24.0) - b * (1.0 / 12.0) + c * (1.0 / 6.0);
        o[5][l] = c;
    }
    o
}

/// `Bᵀ`'s 1-d transform: six lane vectors `src[s0 + i·ss]` to six.
#[inline(always)]
fn b_1d(src: &[[f32; L]], s0: usize, ss: usize) -> [[f32; L]; 6] {
    let d: [&[f32; L]; 6] = std::array::from_fn(|i| &src[s0 + i * ss]);
    let mut o = [[0f32; L]; 6];
    for l in 0..L {
        let (d0, d1, d2, d3, d4, d5) = (d[0][l], d[1][l], d[2][l], d[3][l], d[4][l], d[5][l]);
        o[0][l] = 4.0 * d0 - 5.0 * d2 + d4;
        o[1][l] = -4.0 * (d1 + d2) + d3 + d4;
        o[2][l] = 4.0 * (d1 - d2) - d3 + d4;
        o[3][l] = 2.0 * (d3 - d1) - d2 + d4;
        o[4][l] = 2.0 * (d1 - d3) - d2 + d4;
        o[5][l] = 4.0 * d1 - 5.0 * d3 + d5;
    }
    o
}

/// `Aᵀ`'s 1-d transform: six lane vectors `src[s0 + i·ss]` to four.
#[inline(always)]
fn a_1d(src: &[[f32; L]], s0: usize, ss: usize) -> [[f32; L]; 4] {
    let m: [&[f32; L]; 6] = std::array::from_fn(|i| &src[s0 + i * ss]);
    let mut o = [[0f32; L]; 4];
    for l in 0..L {
        let (m0, m1, m2, m3, m4, m5) = (m[0][l], m[1][l], m[2][l], m[3][l], m[4][l], m[5][l]);
        let (p12, d12, p34, d34) = (m1 + m2, m1 - m2, m3 + m4, m3 - m4);
        o[0][l] = m0 + p12 + p34;
        o[1][l] = d12 + 2.0 * d34;
        o[2][l] = p12 + 4.0 * p34;
        o[3][l] = d12 + 8.0 * d34 + m5;
    }
    o
}

/// `U[ξ][c][k] = (G g Gᵀ)[ξ]` for input channel `c`, every output channel (16 at a time).
///
/// # Safety
/// `u` holds `36 · cc · kk` elements; nothing else writes `U[..][c][..]`.
#[inline(always)]
unsafe fn filter_body<const V: bool>(w: &[f32], cc: usize, kk: usize, c: usize, u: SendPtr<f32>) {
    let (mut g, mut t) = ([[0f32; L]; 9], [[0f32; L]; 18]);
    let mut k0 = 0;
    while k0 < kk {
        let lanes = L.min(kk - k0);
        for l in 0..lanes {
            let at = ((k0 + l) * cc + c) * 9;
            for (i, gi) in g.iter_mut().enumerate() {
                gi[l] = w[at + i];
            }
        }
        // Down each kernel column j: t[i·3 + j] (6 × 3); then along each row i.
        for j in 0..3 {
            for (i, r) in g_1d(&g, j, 3).iter().enumerate() {
                t[i * 3 + j] = *r;
            }
        }
        for i in 0..6 {
            for (j, r) in g_1d(&t, i * 3, 1).iter().enumerate() {
                // Safety: U[ξ][c][k0 .. k0 + lanes] is in bounds and this call's own.
                unsafe { store(u.get().add(((i * 6 + j) * cc + c) * kk + k0), r, lanes) };
            }
        }
        k0 += lanes;
    }
}

/// `d[r·6 + q][l]` = element `(r, q)` of the patch of tile `t + l` (zero in the padding),
/// for `lanes` tiles of channel `c` of `x`, element by element.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `l` picks a lane of several vectors
fn gather_tiles(x: &[f32], s: &Shape, c: usize, t: usize, lanes: usize, d: &mut [[f32; L]; 36]) {
    let plane = s.h * s.w;
    for l in 0..lanes {
        let (b, ty, tx) = s.tile(t + l);
        let xp = &x[(b * s.c + c) * plane..][..plane];
        // Patch rows/columns 4·ty - pt + r, 4·tx - pl + q.
        let (r0, q0) = ((4 * ty) as isize - s.pt as isize, (4 * tx) as isize - s.pl as isize);
        let inside = r0 >= 0 && q0 >= 0 && r0 as usize + 6 <= s.h && q0 as usize + 6 <= s.w;
        if inside {
            let base = r0 as usize * s.w + q0 as usize;
            for r in 0..6 {
                let row = &xp[base + r * s.w..][..6];
                for q in 0..6 {
                    d[r * 6 + q][l] = row[q];
                }
            }
        } else {
            for r in 0..6 {
                let y = r0 + r as isize;
                for q in 0..6 {
                    let xx = q0 + q as isize;
                    d[r * 6 + q][l] = if y >= 0 && (y as usize) < s.h && xx >= 0 && (xx as usize) < s.w {
                        xp[y as usize * s.w + xx as usize]
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// Each tile's 4 × 4 block `y[i·4 + j][l]` (tile `t + l`, `lanes` tiles) to output channel
/// `k`, clipped at the output's edges, element by element.
///
/// # Safety
/// `out` holds `n · k · oh · ow` elements; nothing else writes channel `k`'s planes.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `l` picks a lane of several vectors
unsafe fn scatter_tiles(s: &Shape, k: usize, t: usize, lanes: usize, y: &[[f32; L]; 16], out: SendPtr<f32>) {
    let plane = s.oh * s.ow;
    for l in 0..lanes {
        let (b, ty, tx) = s.tile(t + l);
        let (r0, q0) = (4 * ty, 4 * tx);
        let (rows, cols) = (4.min(s.oh - r0), 4.min(s.ow - q0));
        // Safety: output plane (b, k) is in bounds and this call's own.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add((b * s.k + k) * plane), plane) };
        for i in 0..rows {
            for j in 0..cols {
                dst[(r0 + i) * s.ow + q0 + j] = y[i * 4 + j][l];
            }
        }
    }
}

/// `V[ξ][c][t - t0] = (Bᵀ d B)[ξ]` for input channel `c` and tiles `t0 .. t0 + nt` (16 at a
/// time), `d` the 6 × 6 patch of tile `t` (zeros outside the input).
///
/// # Safety
/// `v` holds `36 · s.c · tb` elements; nothing else writes `V[..][c][..]`.
#[inline(always)]
unsafe fn input_body<const V: bool>(x: &[f32], s: &Shape, c: usize, t0: usize, nt: usize, tb: usize, v: SendPtr<f32>) {
    let plane = s.h * s.w;
    let (mut d, mut t) = ([[0f32; L]; 36], [[0f32; L]; 36]);
    let rowwise = s.rowwise(V);
    let mut a = 0;
    while a < nt {
        let lanes = s.group(t0 + a, nt - a, rowwise);
        if rowwise {
            let (b, ty, tx) = s.tile(t0 + a);
            // Safety: plane (b, c) of `x`, read inside its bounds only.
            unsafe { gather_row(s, x[(b * s.c + c) * plane..].as_ptr(), ty, tx, lanes, &mut d) };
        } else {
            gather_tiles(x, s, c, t0 + a, lanes, &mut d);
        }
        // A whole vector is stored where the row has room (one store, not `lanes` scalar
        // ones): its lanes past `lanes` belong to the next tiles, which the next groups of
        // this call write over, or to columns past `nt`, which no product reads.
        let whole = if a + L <= tb { L } else { lanes };
        // Down each patch column q, then along each row i.
        for q in 0..6 {
            for (i, r) in b_1d(&d, q, 6).iter().enumerate() {
                t[i * 6 + q] = *r;
            }
        }
        for i in 0..6 {
            for (j, r) in b_1d(&t, i * 6, 1).iter().enumerate() {
                // Safety: V[ξ][c][a .. a + lanes] is in bounds and this call's own.
                unsafe { store(v.get().add(((i * 6 + j) * s.c + c) * tb + a), r, whole) };
            }
        }
        a += lanes;
    }
}

/// Output channel `k`'s 4 × 4 blocks for tiles `t0 .. t0 + nt` from `M[ξ][k][t - t0]`, clipped
/// at the output's edges.
///
/// # Safety
/// `out` holds `n · k · oh · ow` elements; nothing else writes channel `k`'s planes.
#[inline(always)]
unsafe fn output_body<const V: bool>(
    m: &[f32],
    s: &Shape,
    k: usize,
    t0: usize,
    nt: usize,
    tb: usize,
    out: SendPtr<f32>,
) {
    let plane = s.oh * s.ow;
    let (mut mm, mut t, mut y) = ([[0f32; L]; 36], [[0f32; L]; 24], [[0f32; L]; 16]);
    let rowwise = s.rowwise(V);
    let mut a = 0;
    while a < nt {
        let lanes = s.group(t0 + a, nt - a, rowwise);
        // A whole vector where the row has room (the lanes past `lanes` are not stored).
        let whole = if a + L <= tb { L } else { lanes };
        for (xi, v) in mm.iter_mut().enumerate() {
            let src = &m[(xi * s.k + k) * tb + a..][..whole];
            // Safety: `src` holds `whole` elements.
            *v = unsafe { load(src.as_ptr(), whole) };
        }
        // Down each column j: t[i·6 + j] (4 × 6); then along each row i: y[i·4 + j] (4 × 4).
        for j in 0..6 {
            for (i, r) in a_1d(&mm, j, 6).iter().enumerate() {
                t[i * 6 + j] = *r;
            }
        }
        for i in 0..4 {
            for (j, r) in a_1d(&t, i * 6, 1).iter().enumerate() {
                y[i * 4 + j] = *r;
            }
        }
        if rowwise {
            let (b, ty, tx) = s.tile(t0 + a);
            // Safety: output plane (b, k), this call's own.
            unsafe { scatter_row(s, out.get().wrapping_add((b * s.k + k) * plane), ty, tx, lanes, &y) };
        } else {
            // Safety: the caller's contract.
            unsafe { scatter_tiles(s, k, t0 + a, lanes, &y, out) };
        }
        a += lanes;
    }
}

/// The bodies as the instances take them: the destination pointers' contracts (in bounds,
/// disjoint per unit) are [`conv`]'s, the only caller.
#[inline(always)]
fn filter_safe<const V: bool>(w: &[f32], cc: usize, kk: usize, c: usize, u: SendPtr<f32>) {
    // Safety: `conv`'s units pass in-bounds, disjoint destinations.
    unsafe { filter_body::<V>(w, cc, kk, c, u) }
}

#[inline(always)]
fn input_safe<const V: bool>(x: &[f32], s: &Shape, c: usize, t0: usize, nt: usize, tb: usize, v: SendPtr<f32>) {
    // Safety: as above.
    unsafe { input_body::<V>(x, s, c, t0, nt, tb, v) }
}

#[inline(always)]
fn output_safe<const V: bool>(m: &[f32], s: &Shape, k: usize, t0: usize, nt: usize, tb: usize, out: SendPtr<f32>) {
    // Safety: as above.
    unsafe { output_body::<V>(m, s, k, t0, nt, tb, out) }
}

instances!(filter_safe, filter_pick, filter_avx2, filter_avx512,
    (w: &[f32], cc: usize, kk: usize, c: usize, u: SendPtr<f32>) -> ());
instances!(input_safe, input_pick, input_avx2, input_avx512,
    (x: &[f32], s: &Shape, c: usize, t0: usize, nt: usize, tb: usize, v: SendPtr<f32>) -> ());
instances!(output_safe, output_pick, output_avx2, output_avx512,
    (m: &[f32], s: &Shape, k: usize, t0: usize, nt: usize, tb: usize, out: SendPtr<f32>) -> ());

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
            })
            .collect()
    }

    /// The direct convolution in f64.
    fn direct(x: &[f32], w: &[f32], s: &Shape) -> Vec<f64> {
        let mut out = vec![0f64; s.n * s.k * s.oh * s.ow];
        for b in 0..s.n {
            for k in 0..s.k {
                for i in 0..s.oh {
                    for j in 0..s.ow {
                        let mut acc = 0f64;
                        for c in 0..s.c {
                            for di in 0..3 {
                                for dj in 0..3 {
                                    let (y, xx) = (i + di, j + dj);
                                    if y < s.pt || xx < s.pl || y - s.pt >= s.h || xx - s.pl >= s.w {
                                        continue;
                                    }
                                    let xv = x[((b * s.c + c) * s.h + y - s.pt) * s.w + xx - s.pl] as f64;
                                    acc += xv * w[((k * s.c + c) * 3 + di) * 3 + dj] as f64;
                                }
                            }
                        }
                        out[((b * s.k + k) * s.oh + i) * s.ow + j] = acc;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_direct_convolution() {
        // Paddings 0, 1, 2 (outputs not multiples of 4 included), batches, channel counts
        // off the vector width, more tiles than one block holds (blocks enough for a block
        // per unit even at the smallest block, 48 tiles), planes narrow and wide (tiles
        // gathered one by one, or a row segment at a time).
        let cases = [
            (1, 16, 16, 8, 8, 1, 1),
            (2, 17, 19, 9, 11, 1, 1),
            (1, 20, 33, 13, 7, 0, 0),
            (3, 16, 16, 6, 10, 2, 2),
            (1, 32, 24, 30, 30, 1, 0),
            (2, 16, 16, 38, 40, 1, 1),
            // Rows of more tiles than a vector's lanes (18: segments of 16 and 2).
            (1, 16, 17, 70, 71, 1, 2),
        ];
        for (n, c, k, h, w, pt, pl) in cases {
            // Padding after equals before (as the callers' ONNX models have).
            let (oh, ow) = (h + 2 * pt - 2, w + 2 * pl - 2);
            let s = Shape {
                n,
                c,
                k,
                h,
                w,
                pt,
                pl,
                oh,
                ow,
            };
            let x = values(n * c * h * w, 1 + c as u64);
            let wt = values(k * c * 9, 7 + k as u64);
            let mut got = vec![f32::NAN; n * k * oh * ow];
            // Both schedules: a few blocks, each step split across threads, and (small
            // blocks) a block per unit; with transformed kernels cached or not.
            for (threads, block_bytes) in [(1, BLOCK_BYTES), (2, BLOCK_BYTES), (2, 1), (3, 36 * 4 * 128 * L)] {
                let cache = WeightCache::new();
                let mut run = |cache: Option<&WeightCache>| {
                    got.fill(f32::NAN);
                    // Safety: the vectors hold the shapes' elements.
                    unsafe {
                        conv_in_blocks(
                            x.as_ptr(),
                            wt.as_ptr(),
                            got.as_mut_ptr(),
                            &s,
                            threads,
                            cache,
                            block_bytes,
                        )
                    };
                    got.clone()
                };
                let first = run(Some(&cache));
                assert!(cache.get().is_some());
                assert_eq!(
                    run(Some(&cache)),
                    first,
                    "the cached kernels give the first call's outputs"
                );
                let got = run(None);
                let want = direct(&x, &wt, &s);
                let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                let err = got
                    .iter()
                    .zip(&want)
                    .fold(0f64, |m, (&g, &e)| m.max((g as f64 - e).abs()));
                assert!(
                    err <= 1e-5 * scale,
                    "{s:?} {threads} {block_bytes}: max error {err:e} (scale {scale})"
                );
            }
        }
    }

    #[test]
    fn applies_where_it_wins() {
        let s = |c, k, hw| Shape {
            n: 1,
            c,
            k,
            h: hw,
            w: hw,
            pt: 1,
            pl: 1,
            oh: hw,
            ow: hw,
        };
        assert!(applies(&s(64, 64, 56)));
        assert!(applies(&s(256, 256, 14)));
        assert!(!applies(&s(512, 512, 7)), "transformed kernels of 37 MB");
        assert!(!applies(&s(3, 64, 56)), "three input channels");
        assert!(!applies(&s(64, 64, 8)), "4 tiles");
        let batch = |n, hw| Shape { n, ..s(64, 64, hw) };
        assert!(applies(&batch(32, 4)), "one full tile per image");
        assert!(!applies(&batch(32, 2)), "a quarter of each tile used");
    }
}
