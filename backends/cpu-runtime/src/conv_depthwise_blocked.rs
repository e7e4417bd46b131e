//! Depthwise 2-d convolution in f32 with the channels across the vector lanes — each output
//! channel reads one input channel, as MobileNet's 3 × 3 layers — on AVX2 and AVX-512 hosts.
//!
//! [`crate::conv_depthwise`] puts an output row's positions across the lanes: a stride-2 layer
//! must first split every plane into its stride phases, and a 7 × 7 or 14 × 14 plane leaves
//! most of each vector's lanes to the padding or to per-plane bookkeeping. Here the lanes
//! hold `L` channels of one position (the blocked layout NCHW`L`c, within the kernel):
//!
//! - **Bands.** A unit of work is one image's block of `L` channels, computed in bands of
//!   output rows. The input rows a band reads are transposed into scratch (`[row][column][L]`,
//!   zero-padded: the padding columns are never written, the padding rows are zeroed), by
//!   `L × L` register transposes of `L` consecutive positions of `L` planes — the flat
//!   positions run across rows, so a 7-wide plane fills whole vectors too.
//! - **Microkernel.** Output position `(oy, ox)` sums, over the taps, the scratch vector at
//!   `(oy · sh + ky · dh, ox · sw + kx · dw)` times the tap's `L` weights: one load and one
//!   multiply-add per tap and vector at any stride, `B` positions of a row at a time, the
//!   3 × 3 kernel's weights held in registers.
//! - The band's sums are transposed back into the `L` output planes, and the convolution's
//!   epilogue runs on the block's planes once they are complete.

use crate::blocked::Layouts;
use crate::contraction::{PlaneEpilogue, SendPtr};
use crate::conv::ConvSpec;
use crate::epilogue::VectorChain;
use crate::par::par_units;
use crate::simd::{Lanes, Simd};

/// Scratch bytes per band (its transposed input rows and its sums), at most (unless one
/// output row needs more).
const BAND_BYTES: usize = 128 << 10;
/// Multiply-adds plus input elements from which a convolution is split across threads (as
/// [`crate::conv_depthwise`]).
const PARALLEL_MIN: usize = 1 << 17;

/// The geometry of one blocked depthwise convolution.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    sh: usize,
    sw: usize,
    pt: usize,
    pl: usize,
    /// Kernel extents and dilations.
    kh: usize,
    kw: usize,
    dh: usize,
    dw: usize,
    /// Per kernel tap (row-major): where its window starts relative to the output position's
    /// first input row and column in a blocked input (`[row][column][L]`, unpadded), in floats.
    direct_taps: Vec<usize>,
    /// Per kernel tap (row-major): where its window starts relative to the output position's
    /// first scratch row and column, in floats.
    taps: Vec<usize>,
    /// Kernel rows' extent in input rows, `(kh - 1) · dh + 1`.
    kext: usize,
    /// Scratch row width in positions (every input column and every column a window reads).
    wp: usize,
    /// Output rows per band.
    band: usize,
    /// For a 3 × 3 kernel undilated along the row: its rows' distance in scratch (floats)
    /// and the column stride.
    kernel3: Option<(usize, usize)>,
    /// Per input position of a band's first rows (`q = row · w + col`): its scratch offset
    /// relative to that row's, in floats.
    place: Vec<usize>,
    simd: Simd,
}

impl Plan {
    /// The plan for `conv(x[xs], w[ws])` with `spec` and output spatial shape `sout`, where this
    /// path serves: a 2-d convolution with one input channel per group and one output channel
    /// per input channel, on a host with AVX2 or AVX-512, whose scratch rows are not far
    /// beyond the input's.
    pub(crate) fn new(xs: &[usize], ws: &[usize], spec: &ConvSpec, sout: &[usize]) -> Option<Plan> {
        let simd = Simd::detect();
        if simd == Simd::Baseline || xs.len() != 4 || ws.len() != 4 || sout.len() != 2 || ws[1] != 1 {
            return None;
        }
        if crate::conv_tiled::forced_off() {
            return None;
        }
        let (n, c) = (xs[0], xs[1]);
        if spec.groups != c || ws[0] != c {
            return None;
        }
        let (h, w, kh, kw, oh, ow) = (xs[2], xs[3], ws[2], ws[3], sout[0], sout[1]);
        let (sh, sw, dh, dw) = (spec.stride[0], spec.stride[1], spec.dilation[0], spec.dilation[1]);
        if [n, c, h, w, kh, kw, oh, ow, sh, sw, dh, dw].contains(&0) {
            return None;
        }
        let (pt, pl) = (spec.pad_before[0], spec.pad_before[1]);
        let lanes = simd.lanes();
        let reach = (ow - 1).checked_mul(sw)?.checked_add((kw - 1).checked_mul(dw)?)? + 1;
        let wp = reach.max(pl.checked_add(w)?);
        let kext = (kh - 1).checked_mul(dh)? + 1;
        // Huge padding, strides or dilations: rows far wider than the input's.
        if wp > w.saturating_mul(4).saturating_add(1 << 12) || kext > h.saturating_mul(4).saturating_add(1 << 12) {
            return None;
        }
        let in_rows = |band: usize| (band - 1) * sh + kext;
        let bytes = |band: usize| (in_rows(band) * wp + band * ow) * lanes * 4;
        let mut band = 1;
        while band < oh && bytes(band + 1) <= BAND_BYTES {
            band += 1;
        }
        let taps = (0..kh)
            .flat_map(|ky| (0..kw).map(move |kx| (ky * dh * wp + kx * dw) * lanes))
            .collect();
        let place = (0..in_rows(band).min(h) * w)
            .map(|q| ((q / w) * wp + pl + q % w) * lanes)
            .collect();
        Some(Plan {
            n,
            c,
            h,
            w,
            oh,
            ow,
            sh,
            sw,
            pt,
            pl,
            kh,
            kw,
            dh,
            dw,
            direct_taps: (0..kh)
                .flat_map(|ky| (0..kw).map(move |kx| (ky * dh * w + kx * dw) * lanes))
                .collect(),
            taps,
            kext,
            wp,
            band,
            kernel3: (kh == 3 && kw == 3 && dw == 1).then_some((dh * wp * lanes, sw)),
            place,
            simd,
        })
    }

    /// Scratch rows of a band of `rows` output rows.
    fn in_rows(&self, rows: usize) -> usize {
        (rows - 1) * self.sh + self.kext
    }
}

/// Per-thread scratch: a band's transposed input rows, its sums, a block's packed weights.
struct Scratch {
    input: Vec<f32>,
    sums: Vec<f32>,
    weights: Vec<f32>,
}

/// `out[N, C, OH, OW] = conv(x[N, C, H, W], w[C, 1, kh, kw])` as planned, on up to `threads`
/// threads; `epi` is applied to each block's planes as soon as they are done.
///
/// # Safety
/// `x`, `w` and `out` hold the plan's elements; `out` overlaps neither.
pub(crate) unsafe fn conv(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    p: &Plan,
    threads: usize,
    epi: Option<PlaneEpilogue>,
) {
    let nchw = Layouts {
        input: false,
        output: false,
    };
    // Safety: the caller's contract.
    unsafe { conv_in(x, w, out, p, nchw, threads, epi, None) }
}

/// [`conv`] with either side stored blocked (NCHW`L`c, whole blocks of channels): a blocked
/// input's rows are copied into the band's scratch instead of transposed, and a blocked
/// output's sums are written in place and `chain` applied to them (`epi` serves an NCHW
/// output).
///
/// # Safety
/// As [`conv`]; a blocked side has whole blocks of channels; the chain's buffers are live and
/// of the output's size.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv_in(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    p: &Plan,
    layouts: Layouts,
    threads: usize,
    epi: Option<PlaneEpilogue>,
    chain: Option<&VectorChain>,
) {
    let lanes = p.simd.lanes();
    let blocks = p.c.div_ceil(lanes);
    let macs = (p.n * p.c).saturating_mul(p.oh * p.ow).saturating_mul(p.taps.len());
    let moved = macs.saturating_add((p.n * p.c).saturating_mul(p.h * p.w));
    let threads = if moved >= PARALLEL_MIN { threads } else { 1 };
    let (x, w, out) = (SendPtr(x as *mut f32), SendPtr(w as *mut f32), SendPtr(out));
    par_units(
        p.n * blocks,
        threads,
        || Scratch {
            input: vec![0.0; p.in_rows(p.band) * p.wp * lanes],
            sums: vec![0.0; p.band * p.ow * lanes],
            weights: vec![0.0; p.taps.len() * lanes],
        },
        |s, unit| {
            let (b, c0) = (unit / blocks, unit % blocks * lanes);
            let cb = lanes.min(p.c - c0);
            // Safety: the caller's contract; units write disjoint planes.
            unsafe {
                let at = Block {
                    x: x.get(),
                    w: w.get(),
                    out: out.get(),
                    b,
                    c0,
                    cb,
                    layouts,
                    chain,
                };
                match p.simd {
                    Simd::Avx512 => block_avx512(p, &at, s),
                    _ => block_avx2(p, &at, s),
                }
            }
            if let Some(epi) = epi.filter(|_| !layouts.output) {
                epi(b * p.c + c0, cb);
            }
        },
    );
}

/// One unit's operands: channels `c0..c0 + cb` of image `b`.
struct Block<'a> {
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    b: usize,
    c0: usize,
    cb: usize,
    layouts: Layouts,
    chain: Option<&'a VectorChain>,
}

/// Channels `c0..c0 + cb` of image `b`, band by band.
///
/// # Safety
/// Called with `L`'s instruction set (`L::N` the plan's lanes); the pointers as [`conv_in`]'s.
#[inline(always)]
unsafe fn block<L: Lanes, const B: usize>(p: &Plan, at: &Block, s: &mut Scratch) {
    let Block {
        x,
        w,
        out,
        b,
        c0,
        cb,
        layouts,
        chain,
    } = *at;
    let ks = p.taps.len();
    let (plane_in, plane_out) = (p.h * p.w, p.oh * p.ow);
    // Safety (the whole body): every offset below is within the caller's buffers (image `b`,
    // channels `c0..c0 + cb`) or the scratch sized by the plan.
    unsafe {
        // The block's weights, tap-major: `weights[t · L + i]` is channel `c0 + i`'s tap `t`.
        s.weights.fill(0.0);
        for i in 0..cb {
            for t in 0..ks {
                s.weights[t * L::N + i] = *w.add((c0 + i) * ks + t);
            }
        }
        let xin = x.add((b * p.c + c0) * plane_in);
        let xout = out.add((b * p.c + c0) * plane_out);
        let row_floats = p.wp * L::N;
        let mut rows = [L::zero(); 16];
        let rows = &mut rows[..L::N];
        let wts = s.weights.as_ptr();
        for oy0 in (0..p.oh).step_by(p.band) {
            let oy1 = (oy0 + p.band).min(p.oh);
            // The band's sums, position-major: in the output's rows when it is blocked.
            let sums_at = if layouts.output {
                xout.add(oy0 * p.ow * L::N)
            } else {
                s.sums.as_mut_ptr()
            };
            // A blocked output's chain runs as the sums are stored.
            let post = Post {
                chain: chain.filter(|_| layouts.output),
                bias: chain.map_or(L::zero(), |c| c.bias_block::<L>(c0, cb)),
                at: (b * p.c + c0) * plane_out + oy0 * p.ow * L::N,
            };
            if layouts.input && p.sh >= 2 && p.sw >= 2 {
                // Blocked rows of a strided layer are read where they are: staging would
                // copy four or more input elements per output.
                for oy in oy0..oy1 {
                    let (sums, post) = (sums_at.add((oy - oy0) * p.ow * L::N), post.row(oy - oy0, p.ow));
                    direct_row::<L, B>(p, xin, wts, oy, sums, post);
                }
            } else {
                let in_rows = p.in_rows(oy1 - oy0);
                let iy0 = (oy0 * p.sh) as isize - p.pt as isize;
                // Rows above and below the input are padding.
                for r in 0..in_rows {
                    let iy = iy0 + r as isize;
                    if iy < 0 || iy >= p.h as isize {
                        s.input[r * row_floats..(r + 1) * row_floats].fill(0.0);
                    }
                }
                // The input rows the band reads, transposed into their scratch rows.
                let first = iy0.max(0) as usize;
                let last = ((iy0 + in_rows as isize).max(0) as usize).min(p.h);
                if first < last && layouts.input {
                    // Blocked rows: copied whole.
                    for iy in first..last {
                        let dst = (s.input.as_mut_ptr()).add((iy as isize - iy0) as usize * row_floats + p.pl * L::N);
                        std::ptr::copy_nonoverlapping(xin.add(iy * p.w * L::N), dst, p.w * L::N);
                    }
                } else if first < last {
                    let base = s.input.as_mut_ptr().add((first as isize - iy0) as usize * row_floats);
                    let (q0, q1) = (first * p.w, last * p.w);
                    for q in (q0..q1).step_by(L::N) {
                        let n = L::N.min(q1 - q);
                        for (i, r) in rows.iter_mut().enumerate() {
                            *r = if i < cb {
                                L::load_first(xin.add(i * plane_in + q), n)
                            } else {
                                L::zero()
                            };
                        }
                        L::transpose(rows);
                        let (at, end) = (p.place[q - q0], p.place[q - q0 + n - 1]);
                        if n == L::N && end == at + (n - 1) * L::N {
                            // Within one row: consecutive places.
                            for (j, &r) in rows.iter().enumerate() {
                                L::store(base.add(at + j * L::N), r);
                            }
                        } else {
                            for (j, &r) in rows.iter().enumerate() {
                                if j < n {
                                    L::store(base.add(p.place[q - q0 + j]), r);
                                }
                            }
                        }
                    }
                }
                for r in 0..oy1 - oy0 {
                    let (src, sums) = (
                        s.input.as_ptr().add(r * p.sh * row_floats),
                        sums_at.add(r * p.ow * L::N),
                    );
                    match p.kernel3 {
                        Some((rows_apart, 1)) => row3::<L, B, 1>(src, rows_apart, wts, sums, p.ow, post.row(r, p.ow)),
                        Some((rows_apart, 2)) => row3::<L, B, 2>(src, rows_apart, wts, sums, p.ow, post.row(r, p.ow)),
                        _ => row::<L, B>(src, &p.taps, wts, sums, p.ow, p.sw * L::N, post.row(r, p.ow)),
                    }
                }
            }
            let len = (oy1 - oy0) * p.ow;
            if layouts.output {
                continue;
            }
            // Back to the output planes.
            for q in (0..len).step_by(L::N) {
                let n = L::N.min(len - q);
                for (j, r) in rows.iter_mut().enumerate() {
                    *r = if j < n {
                        L::load(s.sums.as_ptr().add((q + j) * L::N))
                    } else {
                        L::zero()
                    };
                }
                L::transpose(rows);
                for (i, &r) in rows.iter().enumerate() {
                    if i < cb {
                        L::store_first(xout.add(i * plane_out + oy0 * p.ow + q), n, r);
                    }
                }
            }
        }
    }
}

/// What happens to a row's sums as they are stored: a blocked output's chain, with the
/// block's biases and the output offset of the row's first vector.
#[derive(Clone, Copy)]
struct Post<'a, L> {
    chain: Option<&'a VectorChain>,
    bias: L,
    at: usize,
}

impl<L: Lanes> Post<'_, L> {
    /// Store sums `v` of the row's position `ox` at `dst`.
    ///
    /// # Safety
    /// Called with `L`'s instruction set; `dst` holds a vector; the chain's residual holds
    /// the position's.
    #[inline(always)]
    unsafe fn store(&self, dst: *mut f32, ox: usize, v: L) {
        // Safety: the caller's contract.
        unsafe {
            let v = match self.chain {
                Some(c) => c.apply(v, self.bias, self.at + ox * L::N, L::N),
                None => v,
            };
            L::store(dst, v)
        }
    }

    /// The same for row `oy` ahead (rows of `ow` positions).
    fn row(&self, rows: usize, ow: usize) -> Self {
        Post {
            at: self.at + rows * ow * L::N,
            ..*self
        }
    }
}

/// Output row `oy` of a block read straight from its blocked input rows `x`
/// (`[row][column][L]`): the columns whose every tap is inside a row by the row kernels,
/// when every kernel row is inside the input; the others tap by tap, skipping the padding.
///
/// # Safety
/// Called with `L`'s instruction set; `x` holds the block's input rows, `sums` the output
/// row's `ow` vectors.
#[inline(always)]
unsafe fn direct_row<L: Lanes, const B: usize>(
    p: &Plan,
    x: *const f32,
    w: *const f32,
    oy: usize,
    sums: *mut f32,
    post: Post<L>,
) {
    let l = L::N;
    let top = (oy * p.sh) as isize - p.pt as isize;
    let reach = (p.kw - 1) * p.dw;
    let (mut lo, mut hi) = (p.pl.div_ceil(p.sw).min(p.ow), 0);
    if p.w + p.pl > reach {
        hi = ((p.w - 1 + p.pl - reach) / p.sw + 1).min(p.ow);
    }
    if top < 0 || top as usize + p.kext > p.h || lo >= hi {
        (lo, hi) = (p.ow, p.ow);
    }
    // Safety: the caller's contract; the interior columns' taps are inside the rows.
    unsafe {
        for ox in (0..lo).chain(hi..p.ow) {
            post.store(sums.add(ox * l), ox, checked::<L>(p, x, w, oy, ox));
        }
        if lo < hi {
            let src = x.add((top as usize * p.w + lo * p.sw - p.pl) * l);
            let (dst, n) = (sums.add(lo * l), hi - lo);
            let post = Post {
                at: post.at + lo * l,
                ..post
            };
            match p.kernel3 {
                Some((_, 1)) => row3::<L, B, 1>(src, p.dh * p.w * l, w, dst, n, post),
                Some((_, 2)) => row3::<L, B, 2>(src, p.dh * p.w * l, w, dst, n, post),
                _ => row::<L, B>(src, &p.direct_taps, w, dst, n, p.sw * l, post),
            }
        }
    }
}

/// The taps `k0..k1` of a kernel axis (`k` taps, dilation `d`) inside an input axis of
/// `n` for the window at `start - pad`.
#[inline(always)]
fn inside(start: usize, pad: usize, d: usize, k: usize, n: usize) -> (usize, usize) {
    // Tap t reads start + t·d - pad: inside when pad ≤ start + t·d < n + pad.
    let k0 = pad.saturating_sub(start).div_ceil(d).min(k);
    let k1 = if n + pad > start {
        ((n + pad - start - 1) / d + 1).min(k)
    } else {
        0
    };
    (k0, k1.max(k0))
}

/// Output position `(oy, ox)` of a block from its blocked input rows, tap by tap in the row
/// kernels' order, the taps on the padding left out.
///
/// # Safety
/// As [`direct_row`].
#[inline(always)]
unsafe fn checked<L: Lanes>(p: &Plan, x: *const f32, w: *const f32, oy: usize, ox: usize) -> L {
    // Safety: the caller's contract; only taps inside the input are read.
    unsafe {
        let mut a = L::zero();
        let (ky0, ky1) = inside(oy * p.sh, p.pt, p.dh, p.kh, p.h);
        let (kx0, kx1) = inside(ox * p.sw, p.pl, p.dw, p.kw, p.w);
        for ky in ky0..ky1 {
            // Row and column of tap (ky, kx0): inside the input.
            let (iy, ix) = (oy * p.sh + ky * p.dh - p.pt, ox * p.sw + kx0 * p.dw - p.pl);
            let first = x.add((iy * p.w + ix) * L::N);
            for kx in kx0..kx1 {
                let v = L::load(first.add((kx - kx0) * p.dw * L::N));
                a = L::fma(v, L::load(w.add((ky * p.kw + kx) * L::N)), a);
            }
        }
        a
    }
}

/// [`row`] for a 3 × 3 kernel undilated along the row and column stride `S`: kernel rows
/// `rows_apart` floats apart in scratch, every other offset a constant.
///
/// # Safety
/// As [`row`].
#[inline(always)]
unsafe fn row3<L: Lanes, const B: usize, const S: usize>(
    src: *const f32,
    rows_apart: usize,
    w: *const f32,
    sums: *mut f32,
    ow: usize,
    post: Post<L>,
) {
    // Safety: the caller's contract.
    unsafe {
        let held: [L; 9] = std::array::from_fn(|t| L::load(w.add(t * L::N)));
        let mut ox = 0;
        while ox + B <= ow {
            let mut a = [L::zero(); B];
            let at = src.add(ox * S * L::N);
            for ky in 0..3 {
                let kr = at.add(ky * rows_apart);
                for kx in 0..3 {
                    let (s, wt) = (kr.add(kx * L::N), held[ky * 3 + kx]);
                    for (u, a) in a.iter_mut().enumerate() {
                        *a = L::fma(L::load(s.add(u * S * L::N)), wt, *a);
                    }
                }
            }
            for (u, &a) in a.iter().enumerate() {
                post.store(sums.add((ox + u) * L::N), ox + u, a);
            }
            ox += B;
        }
        for ox in ox..ow {
            let mut a = L::zero();
            let at = src.add(ox * S * L::N);
            for ky in 0..3 {
                for kx in 0..3 {
                    a = L::fma(L::load(at.add(ky * rows_apart + kx * L::N)), held[ky * 3 + kx], a);
                }
            }
            post.store(sums.add(ox * L::N), ox, a);
        }
    }
}

/// One output row: `sums[ox] = Σ_t weights[t] · src[ox · step + taps[t]]` (vectors of `L`
/// channels) for `ox < ow`, `B` positions at a time, the weights read per tap (any kernel;
/// [`row3`] serves the 3 × 3 ones).
///
/// # Safety
/// Called with `L`'s instruction set; every read and write in bounds.
#[inline(always)]
unsafe fn row<L: Lanes, const B: usize>(
    src: *const f32,
    taps: &[usize],
    w: *const f32,
    sums: *mut f32,
    ow: usize,
    step: usize,
    post: Post<L>,
) {
    // Safety: the caller's contract.
    unsafe {
        let mut ox = 0;
        while ox + B <= ow {
            let mut a = [L::zero(); B];
            let at = src.add(ox * step);
            for (t, &tap) in taps.iter().enumerate() {
                let (s, wt) = (at.add(tap), L::load(w.add(t * L::N)));
                for (u, a) in a.iter_mut().enumerate() {
                    *a = L::fma(L::load(s.add(u * step)), wt, *a);
                }
            }
            for (u, &a) in a.iter().enumerate() {
                post.store(sums.add((ox + u) * L::N), ox + u, a);
            }
            ox += B;
        }
        for ox in ox..ow {
            let mut a = L::zero();
            let at = src.add(ox * step);
            for (t, &tap) in taps.iter().enumerate() {
                a = L::fma(L::load(at.add(tap)), L::load(w.add(t * L::N)), a);
            }
            post.store(sums.add(ox * L::N), ox, a);
        }
    }
}

/// [`block`] for one instruction set.
macro_rules! block_instance {
    ($name:ident, $feat:literal, $lanes:ty, $b:literal) => {
        /// # Safety
        /// The host has the instruction set; the rest as [`block`].
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(p: &Plan, at: &Block, s: &mut Scratch) {
            // Safety: the caller's contract.
            unsafe { block::<$lanes, $b>(p, at, s) }
        }

        /// Off x86-64 no plan is made ([`Simd::detect`] is `Baseline`).
        #[cfg(not(target_arch = "x86_64"))]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(_: &Plan, _: &Block, _: &mut Scratch) {
            unreachable!("no vector instances off x86-64")
        }
    };
}

block_instance!(block_avx512, "avx512f,avx2,fma", crate::simd::x86::Zmm, 8);
block_instance!(block_avx2, "avx2,fma", crate::simd::x86::Ymm, 4);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocked::{from_blocked, to_blocked};
    use crate::conv::testing::Depthwise;

    /// 3 × 3, 5 × 5, 7 × 7 and 1 × 3 kernels; strides 1 to 3, asymmetric padding, dilation;
    /// channel counts below, at and past a block of lanes (3, 8, 16, 20, 40); 1 × 1 to
    /// 112 × 112 planes (several bands), batches, 1 and 2 threads: against the definition
    /// (small integers, so f32 is exact). CI runs this on the AVX-512 and the AVX2 instances
    /// (`OAR_CPU_SIMD`).
    #[test]
    fn blocked_depthwise_convolutions_match_the_definition() {
        // (n, c, h, w, kh, kw, stride, pad before, pad after, dilation)
        type Case = (usize, usize, usize, usize, usize, usize, usize, usize, usize, usize);
        let cases: [Case; 16] = [
            (1, 3, 7, 7, 3, 3, 1, 1, 1, 1),
            (2, 20, 14, 14, 3, 3, 2, 1, 1, 1),
            (1, 16, 30, 33, 3, 3, 1, 1, 1, 1),
            (1, 8, 30, 33, 3, 3, 2, 0, 1, 1),
            (1, 3, 19, 17, 5, 5, 1, 2, 2, 1),
            (1, 17, 19, 17, 5, 5, 2, 2, 2, 1),
            (1, 2, 16, 16, 7, 7, 3, 3, 2, 1),
            (1, 9, 13, 15, 3, 3, 1, 2, 2, 2),
            (1, 2, 1, 1, 3, 3, 1, 1, 1, 1),
            (2, 3, 9, 40, 1, 3, 1, 0, 1, 1),
            (1, 40, 56, 56, 3, 3, 1, 1, 1, 1),
            (1, 16, 112, 112, 3, 3, 2, 0, 1, 1),
            (1, 32, 112, 112, 3, 3, 1, 1, 1, 1),
            (3, 24, 5, 3, 3, 3, 1, 4, 4, 1),
            (1, 16, 14, 14, 3, 3, 2, 1, 1, 1),
            (2, 8, 9, 11, 5, 5, 2, 2, 2, 1),
        ];
        if Simd::detect() == Simd::Baseline {
            return;
        }
        for (n, c, h, w, kh, kw, s, pb, pa, d) in cases {
            let t = Depthwise::new([n, c, 1, h, w], [kh, kw], s, pb, pa, d);
            let plan = Plan::new(&t.xs, &t.ws, &t.spec(), &t.sout).expect("a blocked depthwise plan");
            for threads in [1, 2] {
                let mut got = vec![f32::NAN; t.want.len()];
                let done = std::sync::Mutex::new(vec![0usize; n * c]);
                let epi = |start: usize, count: usize| {
                    for p in start..start + count {
                        done.lock().unwrap()[p] += 1;
                    }
                };
                // Safety: operands of the plan's shapes.
                unsafe { conv(t.x.as_ptr(), t.w.as_ptr(), got.as_mut_ptr(), &plan, threads, Some(&epi)) };
                let case = (n, c, h, w, kh, kw, s, pb, pa, d);
                assert_eq!(got, t.want, "{case:?}, {threads} threads");
                assert!(
                    done.lock().unwrap().iter().all(|&k| k == 1),
                    "{case:?}: every plane's epilogue once"
                );
                // Blocked layouts (whole blocks of channels only), the output's with the
                // chain: bias, residual, clamps.
                let l = Simd::detect().lanes();
                if !c.is_multiple_of(l) {
                    continue;
                }
                let (pi, po) = (h * w, t.sout[0] * t.sout[1]);
                let bias: Vec<f32> = (0..c).map(|i| (i % 5) as f32 - 2.0).collect();
                let res: Vec<f32> = (0..t.want.len()).map(|i| ((i * 3) % 13) as f32 - 6.0).collect();
                let chained: Vec<f32> = (t.want.iter().enumerate())
                    .map(|(i, &v)| (v + bias[i / po % c] + res[i]).clamp(-20.0, 30.0))
                    .collect();
                let rb = to_blocked(&res, n, c, po, l);
                let chain = VectorChain::new(bias.as_ptr(), rb.as_ptr(), -20.0, 30.0, false);
                let xb = to_blocked(&t.x, n, c, pi, l);
                for (input, output) in [(true, false), (false, true), (true, true)] {
                    let mut got = vec![f32::NAN; t.want.len()];
                    let xin = if input { &xb } else { &t.x };
                    // Safety: operands of the plan's shapes, chain buffers of the output's.
                    unsafe {
                        conv_in(
                            xin.as_ptr(),
                            t.w.as_ptr(),
                            got.as_mut_ptr(),
                            &plan,
                            Layouts { input, output },
                            threads,
                            None,
                            Some(&chain),
                        )
                    };
                    if output {
                        assert_eq!(from_blocked(&got, n, c, po, l), chained, "{case:?} blocked output");
                    } else {
                        assert_eq!(got, t.want, "{case:?} blocked input");
                    }
                }
            }
        }
    }

    /// Every lane of every row moves to its transposed place, for both vector types, and the
    /// partial loads and stores touch only their first lanes.
    #[test]
    fn transposes_and_partial_moves() {
        fn check<L: Lanes>() {
            let n = L::N;
            let m: Vec<f32> = (0..n * n).map(|i| i as f32).collect();
            // Safety: the caller checked the instruction set; every pointer covers its lanes.
            unsafe {
                let mut rows: Vec<L> = (0..n).map(|i| L::load(m.as_ptr().add(i * n))).collect();
                L::transpose(&mut rows);
                let mut got = vec![0.0f32; n * n];
                for (i, &r) in rows.iter().enumerate() {
                    L::store(got.as_mut_ptr().add(i * n), r);
                }
                for i in 0..n {
                    for j in 0..n {
                        assert_eq!(got[j * n + i], m[i * n + j], "{n} lanes: ({i}, {j})");
                    }
                }
                for k in 0..=n {
                    let v = L::load_first(m.as_ptr().add(1), k);
                    let mut dst = vec![-1.0f32; n];
                    L::store_first(dst.as_mut_ptr(), k, v);
                    let want: Vec<f32> = (0..n).map(|j| if j < k { (j + 1) as f32 } else { -1.0 }).collect();
                    assert_eq!(dst, want, "{n} lanes, first {k}");
                    let mut all = vec![0.0f32; n];
                    L::store(all.as_mut_ptr(), v);
                    assert!(all[k..].iter().all(|&z| z == 0.0), "{n} lanes: lanes past {k} zero");
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2() {
                check::<crate::simd::x86::Ymm>()
            }
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn avx512() {
                check::<crate::simd::x86::Zmm>()
            }
            match Simd::detect() {
                // Safety: the host has the instruction sets.
                Simd::Avx512 => unsafe {
                    avx512();
                    avx2()
                },
                // Safety: as above.
                Simd::Avx2Fma => unsafe { avx2() },
                Simd::Baseline => {}
            }
        }
    }
}
