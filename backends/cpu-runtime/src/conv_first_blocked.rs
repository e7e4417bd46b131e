//! A network's first convolution — a 2-d f32 convolution on an NCHW input of a few channels
//! (an image's 3), one group — with output channels across the vector lanes: the output is
//! written in the blocked layout NCHW`L`c ([`crate::blocked`]), or transposed to NCHW at a
//! network boundary.
//!
//! - **Input.** Each image is copied once into zero-padded scratch (every row and column a
//!   window reads), so no tap needs a bounds check.
//! - **Weights** are packed once (kept in the step's [`WeightCache`] when constant) as
//!   `[O/L][C · kh · kw][L]`: per block of `L` output channels, one vector per tap.
//! - **Microkernel.** A tile is `NP` consecutive positions of an output row × `OB` output
//!   blocks in `NP · OB` accumulators (AVX-512: 6 × 2 for 32 channels, 5 × 4 for 64). Per
//!   tap it loads the `OB` weight vectors and broadcasts each position's input element — the positions `S`
//!   apart for stride `S`, a constant offset — so a first layer's few multiply-adds per
//!   output need no patch matrix and no transposing store.
//! - The step's epilogue chain runs on the accumulators before they are stored
//!   ([`crate::conv_pointwise_blocked::store`]).

use crate::contraction::{SendPtr, WeightCache};
use crate::conv::ConvSpec;
use crate::conv_pointwise_blocked::{Dest, Tile, store};
use crate::epilogue::VectorChain;
use crate::par::par_units;
use crate::scratch::Pooled;
use crate::simd::{Lanes, Simd};

/// Input channels up to which this path serves (a first layer's).
const MAX_CHANNELS: usize = 4;
/// Positions per tile when a row has fewer left than a full tile.
const NP: usize = 6;

/// The geometry of one first-layer convolution.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    oh: usize,
    ow: usize,
    sh: usize,
    sw: usize,
    pt: usize,
    pl: usize,
    /// Padded scratch rows and columns per channel.
    hp: usize,
    wp: usize,
    /// Per tap (channel, kernel row, kernel column): its offset in an image's scratch
    /// relative to the window's first element, in floats.
    taps: Vec<usize>,
    simd: Simd,
}

impl Plan {
    /// The plan for `conv(x[xs], w[ws])` with `spec` and output spatial shape `sout`, where
    /// this path serves: a 2-d convolution with one group and at most [`MAX_CHANNELS`] input
    /// channels, column stride 1 or 2, on a host with AVX2 or AVX-512, whose padded scratch is
    /// not far beyond the input.
    pub(crate) fn new(xs: &[usize], ws: &[usize], spec: &ConvSpec, sout: &[usize]) -> Option<Plan> {
        let simd = Simd::detect();
        if simd == Simd::Baseline || xs.len() != 4 || ws.len() != 4 || sout.len() != 2 || spec.groups != 1 {
            return None;
        }
        let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
        let (o, kh, kw, oh, ow) = (ws[0], ws[2], ws[3], sout[0], sout[1]);
        let (sh, sw, dh, dw) = (spec.stride[0], spec.stride[1], spec.dilation[0], spec.dilation[1]);
        if ws[1] != c || c > MAX_CHANNELS || !(1..=2).contains(&sw) {
            return None;
        }
        if [n, c, h, w, o, kh, kw, oh, ow, sh, dh, dw].contains(&0) {
            return None;
        }
        let hp = (oh - 1).checked_mul(sh)?.checked_add((kh - 1).checked_mul(dh)?)? + 1;
        let wp = (ow - 1).checked_mul(sw)?.checked_add((kw - 1).checked_mul(dw)?)? + 1;
        let (hp, wp) = (hp.max(spec.pad_before[0] + h), wp.max(spec.pad_before[1] + w));
        if hp.checked_mul(wp)? > (h * w).saturating_mul(4).saturating_add(1 << 16) {
            return None;
        }
        let taps = (0..c)
            .flat_map(|ch| (0..kh).flat_map(move |ky| (0..kw).map(move |kx| (ch * hp + ky * dh) * wp + kx * dw)))
            .collect();
        Some(Plan {
            n,
            c,
            h,
            w,
            o,
            oh,
            ow,
            sh,
            sw,
            pt: spec.pad_before[0],
            pl: spec.pad_before[1],
            hp,
            wp,
            taps,
            simd,
        })
    }

    fn lanes(&self) -> usize {
        self.simd.lanes()
    }

    fn obl(&self) -> usize {
        self.o.div_ceil(self.lanes())
    }

    /// Output blocks per tile, at most.
    fn ob_max(&self) -> usize {
        crate::blocked::max_output_blocks(self.simd)
    }

    fn packed_len(&self) -> usize {
        self.obl() * self.taps.len() * self.lanes()
    }
}

/// Positions per full tile of `ob` output blocks.
/// (As [`crate::conv_pointwise_blocked`]'s: more accumulators spill.)
fn np_max(simd: Simd, ob: usize) -> usize {
    match (simd, ob) {
        (_, 1) => 12,
        (Simd::Avx512, 4) => 5,
        _ => 6,
    }
}

/// The kernels `w[O, C, kh, kw]` as `[O/L][C · kh · kw][L]`.
fn pack(w: &[f32], p: &Plan) -> Vec<f32> {
    crate::blocked::pack_output_blocks(w, p.o, p.taps.len(), p.taps.len(), p.lanes())
}

/// `out[N, O, OH, OW] = conv(x[N, C, H, W], w[O, C, kh, kw])` as planned, the output blocked
/// or NCHW, then `chain` on the sums. With `cache` (constant weights) the packed weights are
/// made on the first call and kept.
///
/// # Safety
/// `x`, `w` and `out` hold the plan's elements; `out` overlaps neither; a blocked output holds
/// whole blocks of channels (the last one padded); the chain's buffers are live and of the
/// output's size.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    p: &Plan,
    blocked_out: bool,
    threads: usize,
    cache: Option<&WeightCache>,
    chain: Option<&VectorChain>,
) {
    let (l, obl) = (p.lanes(), p.obl());
    // Safety: the caller's contract.
    let (x, w) = unsafe {
        (
            std::slice::from_raw_parts(x, p.n * p.c * p.h * p.w),
            std::slice::from_raw_parts(w, p.o * p.taps.len()),
        )
    };
    let packed = crate::contraction::prepared(cache, p.packed_len(), || pack(w, p));
    let plane = p.hp * p.wp;
    let mut scratch = Pooled::<f32>::take(p.n * p.c * plane);
    let macs = (p.n * p.o * p.oh * p.ow).saturating_mul(p.taps.len());
    let threads = if macs >= 1 << 17 { threads } else { 1 };
    // The padded copy, a channel plane per unit.
    let sp = SendPtr(scratch.as_mut_ptr());
    par_units(
        p.n * p.c,
        threads,
        || (),
        |_, u| {
            // Safety: plane `u` of the scratch, written by this unit only.
            let dst = unsafe { std::slice::from_raw_parts_mut(sp.get().add(u * plane), plane) };
            dst.fill(0.0);
            let src = &x[u * p.h * p.w..][..p.h * p.w];
            for (iy, row) in src.chunks_exact(p.w).enumerate() {
                dst[(iy + p.pt) * p.wp + p.pl..][..p.w].copy_from_slice(row);
            }
        },
    );
    // Units: (image, group of output blocks, band of rows).
    let mut groups = obl.div_ceil(p.ob_max());
    if p.n * p.oh < threads {
        groups = groups.next_multiple_of(threads).min(obl);
    }
    let bands = (4 * threads).div_ceil(p.n * groups).clamp(1, p.oh);
    let rows = p.oh.div_ceil(bands);
    let bands = p.oh.div_ceil(rows);
    let (xs, out) = (SendPtr(scratch.as_mut_ptr()), SendPtr(out));
    par_units(
        p.n * groups * bands,
        threads,
        || (),
        |_, u| {
            let (b, g, band) = (u / (groups * bands), u / bands % groups, u % bands);
            let ob0 = g * obl / groups;
            let ob = (g + 1) * obl / groups - ob0;
            let full = np_max(p.simd, ob);
            for oy in band * rows..((band + 1) * rows).min(p.oh) {
                let mut ox = 0;
                while ox < p.ow {
                    let left = p.ow - ox;
                    let np = if left >= full { full } else { NP.min(left) };
                    let t = Tile {
                        x: xs.get().wrapping_add(b * p.c * plane + oy * p.sh * p.wp + ox * p.sw),
                        w: packed.as_ptr().wrapping_add(ob0 * p.taps.len() * l),
                        out: out.get(),
                        b,
                        q: oy * p.ow + ox,
                        ob0,
                    };
                    // Safety: the tile's scratch, weights and outputs are in bounds; units write
                    // disjoint outputs.
                    unsafe {
                        match p.simd {
                            Simd::Avx512 => tile_avx512(p, &t, ob, np, blocked_out, chain),
                            _ => tile_avx2(p, &t, ob, np, blocked_out, chain),
                        }
                    }
                    ox += np;
                }
            }
        },
    );
}

/// `N` positions × `OB` output blocks over every tap, then the chain and the store.
///
/// # Safety
/// Called with `L`'s instruction set; the tile's reads and writes in bounds.
#[inline(always)]
unsafe fn tile<L: Lanes, const S: usize, const OB: usize, const N: usize>(
    p: &Plan,
    t: &Tile,
    blocked_out: bool,
    chain: Option<&VectorChain>,
) {
    let l = L::N;
    let wstep = p.taps.len() * l;
    // Safety: the caller's contract; the scratch is padded for every tap of the tile.
    unsafe {
        let mut acc = [[L::zero(); OB]; N];
        for (k, &tap) in p.taps.iter().enumerate() {
            let x = t.x.add(tap);
            let wv: [L; OB] = std::array::from_fn(|j| L::load(t.w.add(j * wstep + k * l)));
            for (i, a) in acc.iter_mut().enumerate() {
                let v = L::splat(x.add(i * S));
                for j in 0..OB {
                    a[j] = L::fma(wv[j], v, a[j]);
                }
            }
        }
        let d = Dest { o: p.o, p: p.oh * p.ow };
        match L::N {
            16 => store::<L, 16, OB, N>(d, t, &acc, N, blocked_out, chain),
            _ => store::<L, 8, OB, N>(d, t, &acc, N, blocked_out, chain),
        }
    }
}

/// The tile instances for one instruction set: `$tile(p, t, ob, np, …)` picks the one of
/// the plan's column stride, `ob` output blocks (1 to `$ob`) and `np` positions.
macro_rules! instances {
    ($tile:ident, $feat:literal, $lanes:ty, $($ob:literal),*) => {
        /// # Safety
        /// The host has the instruction set; the rest as [`tile`].
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $tile(p: &Plan, t: &Tile, ob: usize, np: usize, blocked_out: bool, chain: Option<&VectorChain>) {
            macro_rules! by_size {
                ($s:literal) => {
                    match (ob, np) {
                        (1, 12) => tile::<$lanes, $s, 1, 12>(p, t, blocked_out, chain),
                        $(
                            ($ob, 6) => tile::<$lanes, $s, $ob, 6>(p, t, blocked_out, chain),
                            ($ob, 5) => tile::<$lanes, $s, $ob, 5>(p, t, blocked_out, chain),
                            ($ob, 4) => tile::<$lanes, $s, $ob, 4>(p, t, blocked_out, chain),
                            ($ob, 3) => tile::<$lanes, $s, $ob, 3>(p, t, blocked_out, chain),
                            ($ob, 2) => tile::<$lanes, $s, $ob, 2>(p, t, blocked_out, chain),
                            ($ob, 1) => tile::<$lanes, $s, $ob, 1>(p, t, blocked_out, chain),
                        )*
                        _ => unreachable!("a tile of {ob} output blocks and {np} positions"),
                    }
                };
            }
            // Safety: the caller's contract.
            unsafe {
                if p.sw == 1 {
                    by_size!(1)
                } else {
                    by_size!(2)
                }
            }
        }

        /// Off x86-64 no plan is made ([`Simd::detect`] is `Baseline`).
        #[cfg(not(target_arch = "x86_64"))]
        unsafe fn $tile(_: &Plan, _: &Tile, _: usize, _: usize, _: bool, _: Option<&VectorChain>) {
            unreachable!("no vector instances off x86-64")
        }
    };
}

instances!(tile_avx512, "avx512f,avx2,fma", crate::simd::x86::Zmm, 1, 2, 3, 4);
instances!(tile_avx2, "avx2,fma", crate::simd::x86::Ymm, 1, 2);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocked::from_blocked;

    /// 3 × 3 stride 2 (MobileNet's first layer), 7 × 7 stride 2 padding 3 (ResNet's), 5 × 5
    /// stride 1, asymmetric padding, dilation, 1 to 4 channels, output channels below, at and
    /// past whole blocks, both output layouts with and without the chain, 1 and 2 threads:
    /// against the definition on small integers (exact in f32). CI runs this on both vector
    /// instances (`OAR_CPU_SIMD`).
    #[test]
    fn first_layers_match_the_definition() {
        if Simd::detect() == Simd::Baseline {
            return;
        }
        let l = Simd::detect().lanes();
        // (n, c, o, h, w, k, stride, pad before, pad after, dilation)
        let cases = [
            (1, 3, 32, 23, 21, 3, 2, 1, 1, 1),
            (2, 3, 64, 30, 30, 7, 2, 3, 3, 1),
            (1, 1, 16, 9, 13, 5, 1, 2, 2, 1),
            (1, 4, 20, 12, 11, 3, 1, 0, 2, 2),
            (1, 2, 8, 17, 17, 3, 2, 0, 0, 1),
            (3, 3, 40, 5, 40, 3, 1, 1, 1, 1),
        ];
        for (n, c, o, h, w, k, s, pb, pa, d) in cases {
            let spec = ConvSpec {
                stride: &[s, s],
                pad_before: &[pb, pb],
                pad_after: &[pa, pa],
                dilation: &[d, d],
                groups: 1,
            };
            let out_len = |i: usize| (i + pb + pa - d * (k - 1) - 1) / s + 1;
            let (oh, ow) = (out_len(h), out_len(w));
            let x: Vec<f64> = (0..n * c * h * w).map(|i| ((i * 7 + 3) % 11) as f64 - 5.0).collect();
            let wt: Vec<f64> = (0..o * c * k * k).map(|i| ((i * 5 + 1) % 7) as f64 - 3.0).collect();
            let want: Vec<f32> = crate::conv::testing::reference(&x, [n, c, h, w], &wt, [o, c, k, k], &spec, [oh, ow])
                .iter()
                .map(|&v| v as f32)
                .collect();
            let (x, wt): (Vec<f32>, Vec<f32>) = (
                x.iter().map(|&v| v as f32).collect(),
                wt.iter().map(|&v| v as f32).collect(),
            );
            let po = oh * ow;
            let bias: Vec<f32> = (0..o).map(|i| (i % 5) as f32 - 2.0).collect();
            let res: Vec<f32> = (0..want.len()).map(|i| ((i * 3) % 13) as f32 - 6.0).collect();
            let chained: Vec<f32> = (want.iter().enumerate())
                .map(|(i, &v)| (v + bias[i / po % o] + res[i]).clamp(-20.0, 30.0))
                .collect();
            let plan = Plan::new(&[n, c, h, w], &[o, c, k, k], &spec, &[oh, ow]).expect("a first-layer plan");
            for blocked in [false, true] {
                let rin = if blocked {
                    crate::blocked::to_blocked(&res, n, o, po, l)
                } else {
                    res.clone()
                };
                let chain = VectorChain::new(bias.as_ptr(), rin.as_ptr(), -20.0, 30.0, true);
                for (with_chain, expect) in [(false, &want), (true, &chained)] {
                    for threads in [1, 2] {
                        let mut got = vec![f32::NAN; if blocked { rin.len() } else { want.len() }];
                        // Safety: operands of the plan's shapes, chain buffers of the output's.
                        unsafe {
                            conv(
                                x.as_ptr(),
                                wt.as_ptr(),
                                got.as_mut_ptr(),
                                &plan,
                                blocked,
                                threads,
                                None,
                                with_chain.then_some(&chain),
                            )
                        };
                        let got = if blocked { from_blocked(&got, n, o, po, l) } else { got };
                        let case = ((n, c, o, h, w, k), (s, pb, pa, d), (blocked, with_chain, threads));
                        assert_eq!(&got, expect, "{case:?}");
                    }
                }
            }
        }
    }
}
