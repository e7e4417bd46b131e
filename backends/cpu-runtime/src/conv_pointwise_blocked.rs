//! 1 × 1 convolution (stride 1, no padding, one group) in f32 on the blocked channel layout
//! NCHW`L`c (`L` = the host's f32 lanes: 16 on AVX-512, 8 on AVX2) — MobileNet's pointwise
//! layers, kept in that layout across a network by [`crate::blocked`].
//!
//! In NCHW`L`c, element `(b, c, q)` of an `[N, C, H·W]` tensor lives at
//! `((b · C/L + c/L) · H·W + q) · L + c % L`: a position's `L` channels of a block are one
//! vector.
//!
//! - **Weights** are packed once (kept in the step's [`WeightCache`] when they are constant)
//!   as `[O/L][C][L]`: per block of output channels, one vector per input channel, zero past
//!   the last channel of either side.
//! - **Microkernel.** A tile is `NP` positions × `OB` blocks of output channels, in `NP · OB`
//!   accumulators (AVX-512: up to 5 × 4 zmm; AVX2: 6 × 2 or 4 × 3 ymm). Per input channel it
//!   loads the `OB` weight vectors and broadcasts the `NP` positions' input element: `NP · OB`
//!   multiply-adds for `OB + NP` loads, and no packing of the input at all.
//! - **Stores.** A blocked output takes each accumulator as it is; an NCHW output (a
//!   network's boundary) transposes the tile's `L × NP` block first. The convolution's
//!   epilogue chain ([`VectorChain`]) runs on the accumulators before they are stored.
//! - An NCHW input (a boundary) is reordered into blocked scratch first, zero-filling the
//!   lanes past its last channel.
//!
//! Threads split (image, block of `OB` output blocks, run of positions) units; a run's input
//! stays in L2 while the unit's weights stream through it tile by tile.

use crate::blocked::Layouts;
use crate::contraction::{SendPtr, WeightCache};
use crate::conv::ConvSpec;
use crate::epilogue::VectorChain;
use crate::par::par_units;
use crate::scratch::Pooled;
use crate::simd::{Lanes, Simd};

/// The granule of a unit's run of positions (the largest tile of several output blocks).
const NP: usize = 6;

/// Positions per full tile of `ob` output blocks: about 16 to 20 accumulators. More fit the
/// 32 zmm registers on paper, but the compiled tiles then spill (measured on MobileNetV2's
/// layers: 2 × 12 ran 3× slower than 2 × 6; 3 × 6 and 4 × 5 beat 3 × 8 and 4 × 6 by 10%).
/// AVX2's 3 × 4 fills its 16 registers (12 sums, 3 weight vectors, a broadcast).
fn np_max(simd: Simd, ob: usize) -> usize {
    match (simd, ob) {
        (Simd::Avx512, 1) => 16,
        (Simd::Avx512, 3) => 6,
        (Simd::Avx512, _) => 5,
        (_, 1) => 12,
        (_, 3) => 4,
        _ => 6,
    }
}
/// Input channels from which an NCHW output is computed in tiles of several output blocks.
const WIDE_NCHW_MIN_CHANNELS: usize = 256;
/// Input floats (channels × positions) of one unit's run of positions, at most.
const RUN_FLOATS: usize = 64 << 10;
/// Units per thread that runs shorten to reach, when there are threads to share them: the
/// threads' shares then differ by at most a sixteenth. At 2 per thread, MobileNetV2's
/// 96 → 24 layer at 56 × 56 had 5 units, 3 for one thread and 2 for the other (1.5× on two
/// threads); the model ran 1-2% faster on two threads with 16.
const UNITS_PER_THREAD: usize = 16;

/// The geometry of one pointwise convolution.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    n: usize,
    c: usize,
    o: usize,
    /// Positions per image (`H · W`).
    p: usize,
    simd: Simd,
}

impl Plan {
    /// The plan for `conv(x[xs], w[ws])` with `spec` and output spatial shape `sout`, where this
    /// path serves: a 2-d 1 × 1 convolution with stride 1, no padding and one group, on a host
    /// with AVX2 or AVX-512.
    pub(crate) fn new(xs: &[usize], ws: &[usize], spec: &ConvSpec, sout: &[usize]) -> Option<Plan> {
        let simd = Simd::detect();
        if simd == Simd::Baseline || xs.len() != 4 || ws.len() != 4 || sout.len() != 2 {
            return None;
        }
        let unit = |v: &[usize]| v.iter().all(|&d| d == 1);
        let zero = |v: &[usize]| v.iter().all(|&d| d == 0);
        if spec.groups != 1
            || ws[1] != xs[1]
            || ws[2..] != [1, 1]
            || !unit(spec.stride)
            || !zero(spec.pad_before)
            || !zero(spec.pad_after)
            || sout != &xs[2..]
        {
            return None;
        }
        let plan = Plan {
            n: xs[0],
            c: xs[1],
            o: ws[0],
            p: xs[2].checked_mul(xs[3])?,
            simd,
        };
        ([plan.n, plan.c, plan.o, plan.p].iter().all(|&d| d > 0)).then_some(plan)
    }

    fn lanes(&self) -> usize {
        self.simd.lanes()
    }

    /// Blocks of input and of output channels.
    fn cbl(&self) -> usize {
        self.c.div_ceil(self.lanes())
    }

    fn obl(&self) -> usize {
        self.o.div_ceil(self.lanes())
    }

    /// Groups of output blocks for tiles of several blocks, of sizes as equal as they go.
    /// AVX-512: up to 4 blocks a group. AVX2: pairs, and a group of 3 for an odd count instead
    /// of a lone block, whose tiles load a vector per multiply-add and fall behind the FMA
    /// ports (MobileNetV2's 144 → 24 layer: 0.284 ms as groups of 1 and 2, 0.245 as one of 3).
    fn wide_groups(&self) -> usize {
        match self.simd {
            Simd::Avx512 => self.obl().div_ceil(crate::blocked::max_output_blocks(self.simd)),
            _ => (self.obl() / 2).max(1),
        }
    }

    /// Elements of the packed weights.
    fn packed_len(&self) -> usize {
        self.obl() * self.cbl() * self.lanes() * self.lanes()
    }
}

/// The kernels `w[O, C, 1, 1]` as `[O/L][C/L · L][L]`.
fn pack(w: &[f32], p: &Plan) -> Vec<f32> {
    crate::blocked::pack_output_blocks(w, p.o, p.c, p.cbl() * p.lanes(), p.lanes())
}

/// `out[N, O, H, W] = conv(x[N, C, H, W], w[O, C, 1, 1])` as planned, in the layouts given,
/// then `chain` on the sums. With `cache` (constant weights) the packed weights are made on
/// the first call and kept.
///
/// # Safety
/// `x`, `w` and `out` hold the plan's elements; `out` overlaps neither; a blocked side holds
/// whole blocks of channels (the last one padded); the chain's buffers are live and of the
/// output's size.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    p: &Plan,
    layouts: Layouts,
    threads: usize,
    cache: Option<&WeightCache>,
    chain: Option<&VectorChain>,
) {
    let (l, cbl, obl) = (p.lanes(), p.cbl(), p.obl());
    // Safety: the caller's contract.
    let w = unsafe { std::slice::from_raw_parts(w, p.o * p.c) };
    let packed = crate::contraction::prepared(cache, p.packed_len(), || pack(w, p));
    let image = cbl * p.p * l;
    let mut scratch = Pooled::<f32>::take(if layouts.input { 0 } else { p.n * image });
    let xb = if layouts.input {
        x
    } else {
        let sp = SendPtr(scratch.as_mut_ptr());
        let xs = SendPtr(x as *mut f32);
        let macs = p.n * p.c * p.p;
        par_units(
            p.n * cbl,
            if macs >= 1 << 16 { threads } else { 1 },
            || (),
            |_, u| {
                // Safety: block `u` of the scratch (image `u / cbl`), written by this unit only;
                // the input's channels of that block.
                unsafe { reorder(p, xs.get(), sp.get(), u / cbl, u % cbl) }
            },
        );
        scratch.as_ptr()
    };
    let xb = SendPtr(xb as *mut f32);
    let out = SendPtr(out);
    // Units: (image, group of output blocks, run of positions). Runs keep a unit's input in
    // L2. When the images' runs are too few for the threads (a deep stage's small planes,
    // where the weights are most of the data), the output blocks split into a multiple of
    // the threads' count of groups of about equal size, so each thread streams its share of
    // the weights; then runs shorten if there are still too few units to share evenly.
    let macs = (p.n * p.p).saturating_mul(p.c).saturating_mul(p.o);
    let threads = if macs >= 1 << 17 { threads } else { 1 };
    let mut run = (RUN_FLOATS / (cbl * l))
        .max(24)
        .next_multiple_of(24)
        .min(p.p.next_multiple_of(NP));
    // An NCHW output takes one block per tile and a whole vector of positions, so its
    // transposed rows are stored whole — unless the sums are long (deep layers), where the
    // transposes of a few positions' tiles cost little beside them and the wider tiles' fewer
    // loads per multiply-add win (MobileNetV2's last layer, 320 channels in and 49 positions:
    // 0.25 -> 0.21 ms single-threaded).
    let wide = layouts.output || p.c >= WIDE_NCHW_MIN_CHANNELS;
    // On AVX-512, an NCHW output whose last block has at most 8 channels (24 of 32) computes
    // that block 8 lanes wide.
    let half = p.simd == Simd::Avx512 && !wide && (1..=8).contains(&(p.o % 16));
    let mut groups = if wide { p.wide_groups() } else { obl };
    if p.n * p.p.div_ceil(run) < threads {
        groups = groups.next_multiple_of(threads).min(obl);
    }
    while threads > 1 && run > NP && p.n * groups * p.p.div_ceil(run) < UNITS_PER_THREAD * threads {
        run = (run / 2).next_multiple_of(NP);
    }
    let runs = p.p.div_ceil(run);
    par_units(
        p.n * groups * runs,
        threads,
        || (),
        |_, u| {
            let (b, g, r) = (u / (groups * runs), u / runs % groups, u % runs);
            let ob0 = g * obl / groups;
            let ob = (g + 1) * obl / groups - ob0;
            let q1 = ((r + 1) * run).min(p.p);
            let mut q = r * run;
            let full = if half && ob0 + ob == obl {
                16
            } else {
                np_max(p.simd, ob)
            };
            while q < q1 {
                // The run's positions in tiles of about equal size (49 as 13 + 3 × 12, not
                // 3 × 16 + 1: a tile of few positions waits on its accumulators' latency).
                let left = q1 - q;
                let np = left.div_ceil(left.div_ceil(full));
                let t = Tile {
                    x: xb.get().wrapping_add((b * cbl * p.p + q) * l),
                    w: packed.as_ptr().wrapping_add(ob0 * cbl * l * l),
                    out: out.get(),
                    b,
                    q,
                    ob0,
                };
                // Safety: the tile's input, weights and outputs are in bounds; units write
                // disjoint outputs.
                unsafe {
                    match p.simd {
                        Simd::Avx512 if half && ob0 + ob == obl => tile_half(p, &t, np, chain),
                        Simd::Avx512 => tile_avx512(p, &t, ob, np, layouts.output, chain),
                        _ => tile_avx2(p, &t, ob, np, layouts.output, chain),
                    }
                }
                q += np;
            }
        },
    );
}

/// Block `cb` of image `b`'s NCHW input into the blocked scratch, lanes past the last channel
/// zero.
///
/// # Safety
/// `x` holds the plan's input, `dst` the blocked image (`cbl · p · L` floats per image).
unsafe fn reorder(p: &Plan, x: *const f32, dst: *mut f32, b: usize, cb: usize) {
    // Safety: the caller's contract.
    unsafe {
        match p.simd {
            Simd::Avx512 => reorder_avx512(p, x, dst, b, cb),
            _ => reorder_avx2(p, x, dst, b, cb),
        }
    }
}

/// [`reorder`] with `L`'s instructions: `L × L` register transposes.
///
/// # Safety
/// As [`reorder`], with `L`'s instruction set.
#[inline(always)]
unsafe fn reorder_with<L: Lanes>(p: &Plan, x: *const f32, dst: *mut f32, b: usize, cb: usize) {
    let l = L::N;
    let c0 = cb * l;
    let valid = l.min(p.c - c0);
    let src = x.wrapping_add((b * p.c + c0) * p.p);
    let dst = dst.wrapping_add((b * p.cbl() + cb) * p.p * l);
    // Safety: rows `c0..c0 + valid` of image `b` and the block's scratch are in bounds.
    unsafe {
        let mut rows = [L::zero(); 16];
        let rows = &mut rows[..l];
        for q in (0..p.p).step_by(l) {
            let n = l.min(p.p - q);
            for (i, r) in rows.iter_mut().enumerate() {
                *r = if i < valid {
                    L::load_first(src.add(i * p.p + q), n)
                } else {
                    L::zero()
                };
            }
            L::transpose(rows);
            for (j, &r) in rows.iter().enumerate().take(n) {
                L::store(dst.add((q + j) * l), r);
            }
        }
    }
}

/// One tile's addresses: its first position's input (block 0), its first output block's
/// packed weights; image `b`, positions from `q`, output blocks from `ob0`.
pub(crate) struct Tile {
    pub(crate) x: *const f32,
    pub(crate) w: *const f32,
    pub(crate) out: *mut f32,
    pub(crate) b: usize,
    pub(crate) q: usize,
    pub(crate) ob0: usize,
}

/// An output's channels and positions per image, for [`store`].
#[derive(Clone, Copy)]
pub(crate) struct Dest {
    pub(crate) o: usize,
    pub(crate) p: usize,
}

/// `np` positions × `OB` output blocks, accumulated over every input channel, then the chain
/// and the store.
///
/// # Safety
/// Called with `L`'s instruction set; the tile's reads and writes in bounds.
#[inline(always)]
unsafe fn tile<L: Lanes, const BL: usize, const OB: usize, const N: usize>(
    p: &Plan,
    t: &Tile,
    blocked_out: bool,
    chain: Option<&VectorChain>,
) {
    // The layout's lanes `BL` (a constant, so positions are constant offsets; `L` may be
    // narrower: the half block of an NCHW output).
    let (l, cbl) = (BL, p.cbl());
    let (xstep, wstep) = (p.p * l, cbl * l * l);
    // Safety: the caller's contract; every offset is within the tile's operands.
    unsafe {
        let mut acc = [[L::zero(); OB]; N];
        for cb in 0..cbl {
            let x = t.x.add(cb * xstep);
            let w = t.w.add(cb * l * l);
            // The last block's lanes past the input's channels are zero: skipped.
            for k in 0..l.min(p.c - cb * l) {
                let wv: [L; OB] = std::array::from_fn(|j| L::load(w.add(j * wstep + k * l)));
                for (i, a) in acc.iter_mut().enumerate() {
                    let v = L::splat(x.add(i * l + k));
                    for j in 0..OB {
                        a[j] = L::fma(wv[j], v, a[j]);
                    }
                }
            }
        }
        store::<L, BL, OB, N>(Dest { o: p.o, p: p.p }, t, &acc, N, blocked_out, chain);
    }
}

/// The tile's sums (`np` positions) through the chain to the output.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
pub(crate) unsafe fn store<L: Lanes, const BL: usize, const OB: usize, const N: usize>(
    p: Dest,
    t: &Tile,
    acc: &[[L; OB]; N],
    np: usize,
    blocked_out: bool,
    chain: Option<&VectorChain>,
) {
    let l = L::N;
    let obl = p.o.div_ceil(BL);
    // Safety: the caller's contract.
    unsafe {
        if blocked_out {
            for j in 0..OB {
                let ob = t.ob0 + j;
                let bias = chain.map_or(L::zero(), |c| c.bias_block::<L>(ob * l, p.o.saturating_sub(ob * l)));
                for (i, a) in acc.iter().enumerate().take(np) {
                    let at = ((t.b * obl + ob) * p.p + t.q + i) * l;
                    let v = match chain {
                        Some(c) => c.apply(a[j], bias, at, l),
                        None => a[j],
                    };
                    L::store(t.out.add(at), v);
                }
            }
            return;
        }
        let mut rows = [L::zero(); 16];
        let rows = &mut rows[..l];
        // `L` positions at a time (AVX2's tiles are wider than its vectors).
        #[allow(clippy::needless_range_loop)]
        for i0 in (0..np).step_by(l) {
            let n = l.min(np - i0);
            for j in 0..OB {
                let oc0 = (t.ob0 + j) * BL;
                for (i, r) in rows.iter_mut().enumerate() {
                    *r = if i < n { acc[i0 + i][j] } else { L::zero() };
                }
                L::transpose(rows);
                for (k, &r) in rows.iter().enumerate().take(l.min(p.o - oc0)) {
                    let at = (t.b * p.o + oc0 + k) * p.p + t.q + i0;
                    let v = match chain {
                        Some(c) => c.apply(r, c.bias_splat::<L>(oc0 + k), at, n),
                        None => r,
                    };
                    L::store_first(t.out.add(at), n, v);
                }
            }
        }
    }
}

/// The tile instances for one instruction set: `$tile(p, t, ob, np, …)` picks the one of
/// `ob` output blocks and `np` positions, each `$ob => [$np, …]` listing the positions
/// [`np_max`] allows that many blocks; `$reorder` is [`reorder_with`]'s.
macro_rules! instances {
    ($tile:ident, $reorder:ident, $feat:literal, $lanes:ty, $bl:literal, $($ob:literal => [$($np:literal),*]),*) => {
        /// # Safety
        /// The host has the instruction set; the rest as [`tile`].
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $tile(p: &Plan, t: &Tile, ob: usize, np: usize, blocked_out: bool, chain: Option<&VectorChain>) {
            /// One instance, a function of its own: its loop's place in the code (which
            /// decides how the core fetches it) then does not move with the other instances.
            #[target_feature(enable = $feat)]
            #[inline(never)]
            unsafe fn one<const OB: usize, const N: usize>(
                p: &Plan,
                t: &Tile,
                blocked_out: bool,
                chain: Option<&VectorChain>,
            ) {
                // Safety: the caller's contract.
                unsafe { tile::<$lanes, $bl, OB, N>(p, t, blocked_out, chain) }
            }
            // Safety: the caller's contract.
            unsafe {
                match (ob, np) {
                    $($(
                        ($ob, $np) => one::<$ob, $np>(p, t, blocked_out, chain),
                    )*)*
                    _ => unreachable!("a tile of {ob} output blocks and {np} positions"),
                }
            }
        }

        /// # Safety
        /// The host has the instruction set; the rest as [`reorder`].
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $reorder(p: &Plan, x: *const f32, dst: *mut f32, b: usize, cb: usize) {
            // Safety: the caller's contract.
            unsafe { reorder_with::<$lanes>(p, x, dst, b, cb) }
        }

        /// Off x86-64 no plan is made ([`Simd::detect`] is `Baseline`).
        #[cfg(not(target_arch = "x86_64"))]
        unsafe fn $tile(_: &Plan, _: &Tile, _: usize, _: usize, _: bool, _: Option<&VectorChain>) {
            unreachable!("no vector instances off x86-64")
        }

        /// Off x86-64 no plan is made.
        #[cfg(not(target_arch = "x86_64"))]
        unsafe fn $reorder(_: &Plan, _: *const f32, _: *mut f32, _: usize, _: usize) {
            unreachable!("no vector instances off x86-64")
        }
    };
}

/// The last, at most half-full block of an NCHW output on an AVX-512 host: 8 lanes wide
/// (32 registers), one block of up to 16 positions.
///
/// # Safety
/// The host has AVX-512F; the rest as [`tile`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn tile_half(p: &Plan, t: &Tile, np: usize, chain: Option<&VectorChain>) {
    use crate::simd::x86::Ymm;
    // Safety: the caller's contract.
    unsafe {
        macro_rules! by_np {
            ($($n:literal),*) => {
                match np {
                    $($n => tile::<Ymm, 16, 1, $n>(p, t, false, chain),)*
                    _ => unreachable!("a half tile of {np} positions"),
                }
            };
        }
        by_np!(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)
    }
}

/// Off x86-64 no plan is made.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_half(_: &Plan, _: &Tile, _: usize, _: Option<&VectorChain>) {
    unreachable!("no vector instances off x86-64")
}

instances!(
    tile_avx512,
    reorder_avx512,
    "avx512f,avx2,fma",
    crate::simd::x86::Zmm,
    16,
    1 => [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
    2 => [1, 2, 3, 4, 5],
    3 => [1, 2, 3, 4, 5, 6],
    4 => [1, 2, 3, 4, 5]
);
instances!(
    tile_avx2,
    reorder_avx2,
    "avx2,fma",
    crate::simd::x86::Ymm,
    8,
    1 => [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
    2 => [1, 2, 3, 4, 5, 6],
    3 => [1, 2, 3, 4]
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocked::{from_blocked, to_blocked};

    fn spec() -> ConvSpec<'static> {
        ConvSpec {
            stride: &[1, 1],
            pad_before: &[0, 0],
            pad_after: &[0, 0],
            dilation: &[1, 1],
            groups: 1,
        }
    }

    /// Channel counts below, at and past whole blocks (3, 8, 16, 24, 40, 96, 272; a blocked side
    /// padded to whole blocks, its padded input lanes NaN), planes of 1 to 56 × 56 positions
    /// (partial tiles and runs), batches, every pair of layouts, with and
    /// without the chain (bias, residual, clamps), 1 and 2 threads: against the definition on
    /// small integers (exact in f32). CI runs this on both vector instances (`OAR_CPU_SIMD`).
    #[test]
    fn pointwise_convolutions_match_the_definition_in_every_layout() {
        let Some(l) = Some(Simd::detect().lanes()).filter(|_| Simd::detect() != Simd::Baseline) else {
            return;
        };
        // (n, c, o, h, w)
        let cases = [
            (1, 16, 16, 1, 1),
            (2, 3, 5, 7, 7),
            (1, 24, 40, 14, 14),
            (1, 96, 24, 56, 56),
            (2, 40, 96, 7, 5),
            (1, 8, 3, 9, 11),
            (3, 16, 72, 2, 13),
            // Deep: an NCHW output in tiles of several blocks.
            (2, 272, 40, 7, 7),
        ];
        for (n, c, o, h, w) in cases {
            let p = h * w;
            let x: Vec<f32> = (0..n * c * p).map(|i| ((i * 7 + 3) % 11) as f32 - 5.0).collect();
            let wt: Vec<f32> = (0..o * c).map(|i| ((i * 5 + 1) % 7) as f32 - 3.0).collect();
            let bias: Vec<f32> = (0..o).map(|i| (i % 5) as f32 - 2.0).collect();
            let res: Vec<f32> = (0..n * o * p).map(|i| ((i * 3) % 13) as f32 - 6.0).collect();
            let mut sums = vec![0f32; n * o * p];
            for b in 0..n {
                for oc in 0..o {
                    for q in 0..p {
                        sums[(b * o + oc) * p + q] = (0..c).map(|ch| wt[oc * c + ch] * x[(b * c + ch) * p + q]).sum();
                    }
                }
            }
            let chained: Vec<f32> = sums
                .iter()
                .enumerate()
                .map(|(i, &s)| (s + bias[i / p % o] + res[i]).clamp(-20.0, 30.0))
                .collect();
            let plan = Plan::new(&[n, c, h, w], &[o, c, 1, 1], &spec(), &[h, w]).expect("a pointwise plan");
            for (input, output) in [(false, false), (true, false), (false, true), (true, true)] {
                let xin = if input { to_blocked(&x, n, c, p, l) } else { x.clone() };
                let rin = if output {
                    to_blocked(&res, n, o, p, l)
                } else {
                    res.clone()
                };
                for (with_chain, want) in [(false, &sums), (true, &chained)] {
                    for threads in [1, 2] {
                        let chain = VectorChain::new(bias.as_ptr(), rin.as_ptr(), -20.0, 30.0, true);
                        let mut got = vec![f32::NAN; if output { rin.len() } else { n * o * p }];
                        // Safety: operands of the plan's shapes, chain buffers of the output's.
                        unsafe {
                            conv(
                                xin.as_ptr(),
                                wt.as_ptr(),
                                got.as_mut_ptr(),
                                &plan,
                                Layouts { input, output },
                                threads,
                                None,
                                with_chain.then_some(&chain),
                            )
                        };
                        let got = if output { from_blocked(&got, n, o, p, l) } else { got };
                        let case = (n, c, o, h, w, input, output, with_chain, threads);
                        assert_eq!(&got, want, "{case:?}");
                    }
                }
            }
        }
    }
}
