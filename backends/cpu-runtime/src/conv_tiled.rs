//! Register-tiled direct convolution for f32 (2-d, NCHW, several input channels per group):
//! the path for ordinary convolutions — 3 × 3 and 1 × 1 layers at any stride, a CNN's first
//! layer on 3 channels — where im2col would copy every input element once per kernel tap and
//! a GEMM on the copy re-packs both operands on every call.
//!
//! **Input layout.** Each image's channels are copied once into scratch, zero-padded and split
//! into stride phases (the polyphase decomposition of [`crate::conv_direct`]): phase `(r, s)`
//! of a channel holds the padded elements whose row is `≡ r` and column `≡ s` modulo the
//! stride. There, kernel tap `t` of output position `q = oy · pitch + ox` reads channel `c` at
//! `c · plane + tap[t] + q` — one contiguous run per tap over the whole output plane (the
//! `pitch - ow` positions past each output row are computed and dropped).
//!
//! **Weights** are packed once (kept in the step's [`WeightCache`] when they are constant)
//! into blocks of `OCB` output channels, `[group][K / OCB][C][tap][OCB]`, zero-filled past the
//! last channel.
//!
//! **Microkernel.** A tile is `OCB` output channels × `NV` vectors of consecutive positions,
//! held in `OCB · NV` accumulators (AVX-512: 8 × 3 zmm; AVX2: 4 × 3 ymm). For each input
//! channel and tap it loads `NV` input vectors and broadcasts `OCB` weights: `OCB · NV` fused
//! multiply-adds for `OCB + NV` loads. The last block of a plane takes as many vectors as it
//! needs. Tiles are stored to a small buffer and their valid positions copied to the output
//! rows. In the channel orientation (many multiply-adds per output) a tile is the other way
//! round: 2 vectors of output channels × positions, one broadcast per position — on
//! AVX-512 a rectangle of 1 or 2 rows of up to 7 positions, on AVX2 a flat run of up to 6
//! consecutive positions in row-major order, each read at its own offset; a unit takes its
//! input channels in chunks whose weights fit L1 (16 KB), running every tile of the unit
//! over one chunk before the next and carrying the tiles' partial sums in scratch.
//!
//! Threads split the tiles: by position block (every channel block of it in turn, so the
//! input block stays in L1) when a group's weights are small, else by channel block (its
//! weights stay in L2 while the positions stream).

use crate::contraction::{SendPtr, WeightCache};
use crate::conv::ConvSpec;
use crate::conv_direct::TapPhases;
use crate::par::par_units;
use crate::scratch::Pooled;
use crate::simd::{Lanes, Simd};

/// Weight rows (one per input channel and tap) prefetched ahead.
const PREFETCH: usize = 32;
/// f32s per cache line.
const LINE: usize = 16;

/// Output-channel vectors per tile (of [`lanes`] channels each).
const OV: usize = 2;
/// Position vectors (at most: [`pv`]) and output channels per tile in the position
/// orientation (AVX-512; AVX2, with 16 registers, takes half the channels).
const PV: usize = 3;
const PC: usize = 8;

/// Position vectors per tile in the position orientation: [`PV`] on AVX2 (12 accumulators of
/// its 16 registers), 2 on AVX-512 (16 accumulators; with 3 × 8 ResNet-18's 7 × 7 first layer
/// ran 1.21–1.35 ms single-threaded against 1.20–1.28 in alternating runs).
fn pv(simd: Simd) -> usize {
    match simd {
        Simd::Avx512 => 2,
        _ => PV,
    }
}

/// Output channels per tile in the position orientation.
fn pc(simd: Simd) -> usize {
    match simd {
        Simd::Avx512 => PC,
        _ => PC / 2,
    }
}
/// Multiply-adds per output (`cg · taps`) up to which wide rows take the position orientation
/// (AVX-512; AVX2, with fewer channels per tile, up to 3/5 of it: measured on 3 × 3 and 7 × 7
/// first layers).
const POSITIONS_MAX_MACS: usize = 160;
/// Output rows narrower than this take another path.
const MIN_WIDTH: usize = 6;
/// Scratch bytes of padded input per batch of images (at least one image).
const SCRATCH_BYTES: usize = 8 << 20;

/// The geometry of one tiled convolution.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    n: usize,
    /// Groups, input and output channels per group.
    g: usize,
    cg: usize,
    og: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    sh: usize,
    sw: usize,
    pt: usize,
    pl: usize,
    /// Rows and columns (the pitch) of each stride phase of a padded channel.
    rows: usize,
    pitch: usize,
    /// Elements per channel in scratch (`sh · sw · rows · pitch`).
    plane: usize,
    /// Per kernel tap (row-major): where its run starts within a channel.
    taps: Vec<usize>,
    /// Per stride phase: whether a tap reads it (a strided 1 × 1 kernel reads one of them).
    phases: Vec<bool>,
    /// Elements of one image's scratch (every channel of one group, and the slack a row's
    /// last position vectors read past the last channel).
    image: usize,
    /// Vectors along positions (not channels): few multiply-adds per output (a first layer
    /// on 3 channels) and wide rows, where the channel orientation's transposing store would
    /// cost more than its multiply-adds.
    along_positions: bool,
    simd: Simd,
}

impl Plan {
    /// The plan for `conv(x[xs], w[ws])` with `spec` and output spatial shape `sout`, where this
    /// path serves: a 2-d convolution with several input channels per group (`cg ≥ 2`,
    /// `cg · taps ≥ 8`; depthwise ones take [`crate::conv_direct`]), not a 1 × 1 one, output
    /// rows of at least [`MIN_WIDTH`],
    /// a host with AVX2 or AVX-512, and padded scratch not far beyond the input's size.
    pub(crate) fn new(xs: &[usize], ws: &[usize], spec: &ConvSpec, sout: &[usize]) -> Option<Plan> {
        let simd = Simd::detect();
        if simd == Simd::Baseline || xs.len() != 4 || ws.len() != 4 || sout.len() != 2 || forced_off() {
            return None;
        }
        let (n, g) = (xs[0], spec.groups);
        let (cg, og) = (ws[1], ws[0] / g.max(1));
        let (h, w, kh, kw, oh, ow) = (xs[2], xs[3], ws[2], ws[3], sout[0], sout[1]);
        let (sh, sw, dh, dw) = (spec.stride[0], spec.stride[1], spec.dilation[0], spec.dilation[1]);
        // Planes narrower than 6 (a deep stage's 4 × 4 or 1 × 1 at a training batch) leave
        // too few positions per tile to reuse the weights loaded: the caller's GEMM over
        // several images serves them.
        if cg < 2 || cg * kh * kw < 8 || og == 0 || oh == 0 || ow < MIN_WIDTH {
            return None;
        }
        // A 1 × 1 convolution is a GEMM on the input as it is (or on its strided gather): no
        // scratch to fill, no tile to transpose, few multiply-adds per output to hide them.
        if kh * kw == 1 {
            return None;
        }
        let TapPhases {
            rows,
            pitch,
            plane,
            taps,
            phases,
        } = TapPhases::new([kh, kw], [sh, sw], [dh, dw], [oh, ow])?;
        let max_macs = match simd {
            Simd::Avx512 => POSITIONS_MAX_MACS,
            _ => POSITIONS_MAX_MACS * 3 / 5,
        };
        let along_positions = cg * kh * kw <= max_macs && ow >= 2 * simd.lanes();
        let image = cg.checked_mul(plane)?.checked_add(PV * simd.lanes())?;
        // Huge padding, strides or dilations: the scratch would dwarf the input.
        if image > (cg * h * w).saturating_mul(4).saturating_add(1 << 16) {
            return None;
        }
        Some(Plan {
            n,
            g,
            cg,
            og,
            h,
            w,
            oh,
            ow,
            sh,
            sw,
            pt: spec.pad_before[0],
            pl: spec.pad_before[1],
            rows,
            pitch,
            plane,
            taps,
            phases,
            image,
            along_positions,
            simd,
        })
    }

    /// Whether the channel orientation's tiles are flat runs of positions ([`FLAT_NP`]):
    /// on AVX2. AVX-512 tiles are rectangles of [`RECT_ROWS`] rows, whose positions a base
    /// register and displacements address (28 offsets would not fit the general registers).
    fn flat(&self) -> bool {
        !self.along_positions && self.simd != Simd::Avx512
    }

    /// Output channels per weight block.
    fn ocb(&self) -> usize {
        if self.along_positions {
            pc(self.simd)
        } else {
            OV * self.simd.lanes()
        }
    }

    fn blocks(&self) -> usize {
        self.og.div_ceil(self.ocb())
    }

    /// Elements of the packed weights.
    fn packed_len(&self) -> usize {
        self.g * self.blocks() * self.cg * self.taps.len() * self.ocb()
    }
}

/// `OAR_CPU_CONV=im2col` turns this path off (read once): the A/B switch of the benchmarks.
pub(crate) fn forced_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("OAR_CPU_CONV").is_ok_and(|v| v.eq_ignore_ascii_case("im2col")))
}

/// The kernels `w[G·og, cg, kh, kw]` in blocks: `[group][og / OCB][cg][tap][OCB]`.
fn pack(w: &[f32], p: &Plan) -> Vec<f32> {
    let (ocb, taps) = (p.ocb(), p.taps.len());
    let mut out = vec![0f32; p.packed_len()];
    for grp in 0..p.g {
        for oc in 0..p.og {
            let (blk, o) = (oc / ocb, oc % ocb);
            let base = (grp * p.blocks() + blk) * p.cg * taps * ocb + o;
            let src = &w[(grp * p.og + oc) * p.cg * taps..][..p.cg * taps];
            for (i, &v) in src.iter().enumerate() {
                out[base + i * ocb] = v;
            }
        }
    }
    out
}

/// `out[N, G·og, OH, OW] = conv(x[N, G·cg, H, W], w[G·og, cg, kh, kw])` as planned.
/// With `cache` (constant weights) the packed weights are made on the first call and kept.
///
/// # Safety
/// `x`, `w` and `out` hold the plan's elements; `out` overlaps neither.
pub(crate) unsafe fn conv(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    p: &Plan,
    threads: usize,
    cache: Option<&WeightCache>,
) {
    let (c, o) = (p.g * p.cg, p.g * p.og);
    // Safety: the caller's contract.
    let (x, w) = unsafe {
        (
            std::slice::from_raw_parts(x, p.n * c * p.h * p.w),
            std::slice::from_raw_parts(w, o * p.cg * p.taps.len()),
        )
    };
    let packed = crate::contraction::prepared(cache, p.packed_len(), || pack(w, p));
    let out = SendPtr(out);
    // Images per batch of scratch; each (image, group) has its own scratch.
    let per = p.g * p.image;
    let imgs = (SCRATCH_BYTES / 4 / per.max(1)).clamp(1, p.n);
    let mut scratch = Pooled::<f32>::take(imgs * per);
    let sp = SendPtr(scratch.as_mut_ptr());
    for b0 in (0..p.n).step_by(imgs) {
        let nb = imgs.min(p.n - b0);
        // Fill: units of channels.
        let chans = nb * c;
        let per_unit = (1usize << 15).div_ceil(p.plane).clamp(1, chans);
        par_units(
            chans.div_ceil(per_unit),
            threads,
            || (),
            |_, u| {
                for ch in u * per_unit..((u + 1) * per_unit).min(chans) {
                    let (b, ci) = (ch / c, ch % c);
                    let (grp, cc) = (ci / p.cg, ci % p.cg);
                    let src = &x[((b0 + b) * c + ci) * p.h * p.w..][..p.h * p.w];
                    // Safety: channel `cc` of (image b, group grp)'s scratch: in bounds, written by
                    // this unit only.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(sp.get().add((b * p.g + grp) * p.image + cc * p.plane), p.plane)
                    };
                    fill(p, src, dst);
                }
            },
        );
        // Compute: units of (image, group, weight block, part of the plane), enough for
        // every thread to take several. A part is a band of rows (the position orientation's
        // rows; AVX-512's tiles of `RECT_ROWS` rows × row segments of at most `RECT_NP`
        // positions) or, for flat tiles, a run of positions in row-major order.
        let (nob, flat) = (p.blocks(), p.flat());
        let blocks = nb * p.g * nob;
        let (len, step) = if flat {
            (p.oh * p.ow, FLAT_NP)
        } else {
            (p.oh, RECT_ROWS)
        };
        let splits = (8 * threads).div_ceil(blocks).clamp(1, len.div_ceil(step));
        let per = len.div_ceil(splits).next_multiple_of(step);
        let splits = len.div_ceil(per);
        // Partial sums of a unit's tiles while its input channels are taken in chunks (with
        // one chunk, each tile's sums go through a small buffer that stays in L1).
        let chunk = chunk_channels(p);
        let chunked = chunk < p.cg;
        let positions = if flat { per } else { per * p.ow };
        let partial_len = if chunked { positions * p.ocb() } else { 0 };
        par_units(
            blocks * splits,
            threads,
            || Pooled::<f32>::take(partial_len),
            |partial, u| {
                let (blk, split) = (u / splits, u % splits);
                let (bg, ob) = (blk / nob, blk % nob);
                let (b, grp) = (bg / p.g, bg % p.g);
                // Safety: the scratch of (b, grp) is filled; tiles write disjoint outputs.
                unsafe {
                    let xs = sp.get().add((b * p.g + grp) * p.image) as *const f32;
                    let wb = packed.as_ptr().add((grp * nob + ob) * p.cg * p.taps.len() * p.ocb());
                    let dst = out.get().add(((b0 + b) * o + grp * p.og) * p.oh * p.ow);
                    let (start, end) = (split * per, ((split + 1) * per).min(len));
                    if p.along_positions {
                        for oy in start..end {
                            for ox in (0..p.ow).step_by(pv(p.simd) * p.simd.lanes()) {
                                tile_positions(p, xs, wb, oy, ox, ob, dst);
                            }
                        }
                        return;
                    }
                    let tiles = Tiles { p, xs, wb, ob, dst };
                    let mut tile_buf = [0f32; RECT_ROWS * RECT_NP * OV * 16];
                    // Each tile's partial sums: its own part of the unit's buffer while the
                    // chunks carry them, else the one small buffer.
                    let part = if chunked {
                        Part::Advance(partial.as_mut_ptr())
                    } else {
                        Part::Reuse(tile_buf.as_mut_ptr())
                    };
                    for c0 in (0..p.cg).step_by(chunk) {
                        let cc = chunk.min(p.cg - c0);
                        let chans = Chunk {
                            c0,
                            cc,
                            last: c0 + cc == p.cg,
                        };
                        if flat {
                            tiles.flat(start..end, chans, part);
                        } else {
                            tiles.rect(start..end, chans, part);
                        }
                    }
                }
            },
        );
    }
}

/// Where the tiles of a unit keep their partial sums.
#[derive(Clone, Copy)]
enum Part {
    /// Tile after tile along one buffer (the sums carried across chunks of channels).
    Advance(*mut f32),
    /// Every tile in the same small buffer (one chunk).
    Reuse(*mut f32),
}

impl Part {
    /// The buffer of the tile after one of `len` sums at `self`.
    fn next(self, len: usize) -> Part {
        match self {
            Part::Advance(at) => Part::Advance(at.wrapping_add(len)),
            reuse => reuse,
        }
    }

    fn ptr(self) -> *mut f32 {
        match self {
            Part::Advance(at) | Part::Reuse(at) => at,
        }
    }
}

/// One unit's tiles: (image, group)'s filled scratch `xs`, weight block `ob` at `wb`, the
/// group's output planes at `dst`.
struct Tiles<'a> {
    p: &'a Plan,
    xs: *const f32,
    wb: *const f32,
    ob: usize,
    dst: *mut f32,
}

impl Tiles<'_> {
    /// Input channels `ch` of the flat tiles over positions `span` (row-major), of about
    /// equal size (49 positions as 5 + 5 + 6 + …). Each tile first asks for its share of the
    /// next chunk's weights (past the last: the next block's first chunk) in L2 — a layer's
    /// weights stream from memory when they are larger than the caches.
    ///
    /// # Safety
    /// As [`tile_flat`], for every tile of `span`; `part` holds the span's sums.
    unsafe fn flat(&self, span: std::ops::Range<usize>, ch: Chunk, mut part: Part) {
        let (p, len) = (self.p, span.len());
        let tiles = len.div_ceil(FLAT_NP);
        let row = p.taps.len() * p.ocb();
        let next = self.wb.wrapping_add((ch.c0 + ch.cc) * row);
        let lines = (ch.cc * row).div_ceil(LINE);
        let share = lines.div_ceil(tiles);
        for t in 0..tiles {
            for l in t * share..((t + 1) * share).min(lines) {
                crate::simd::prefetch_l2(next.wrapping_add(l * LINE));
            }
            let q0 = span.start + t * len / tiles;
            let np = span.start + (t + 1) * len / tiles - q0;
            // Safety: the caller's contract.
            unsafe { tile_flat(p, self.xs, self.wb, q0, np, ch, part.ptr(), self.ob, self.dst) };
            part = part.next(np * p.ocb());
        }
    }

    /// Input channels `ch` of the rectangular tiles over output rows `rows`: [`RECT_ROWS`]
    /// rows × row segments of about equal width (7 as 2 + 2 + 3, not 3 + 3 + 1).
    ///
    /// # Safety
    /// As [`tile`], for every tile of `rows`; `part` holds the rows' sums.
    unsafe fn rect(&self, rows: std::ops::Range<usize>, ch: Chunk, mut part: Part) {
        let p = self.p;
        let segs = p.ow.div_ceil(RECT_NP);
        for oy in rows.clone().step_by(RECT_ROWS) {
            for sg in 0..segs {
                let ox = sg * p.ow / segs;
                let at = Pos {
                    oy,
                    nr: RECT_ROWS.min(rows.end - oy),
                    ox,
                    np: (sg + 1) * p.ow / segs - ox,
                };
                // Safety: the caller's contract.
                unsafe { tile(p, self.xs, self.wb, at, ch, part.ptr(), self.ob, self.dst) };
                part = part.next(at.nr * at.np * p.ocb());
            }
        }
    }
}

/// One channel of one image, padded and phase-split into `dst` (`plane` elements; the
/// phases no tap reads are left alone).
fn fill(p: &Plan, src: &[f32], dst: &mut [f32]) {
    let split = crate::conv_direct::Phases {
        h: p.h,
        w: p.w,
        top: p.pt,
        left: p.pl,
        sh: p.sh,
        sw: p.sw,
        rows: p.rows,
        pitch: p.pitch,
    };
    split.split(src, 0.0, dst, |phase| !p.phases[phase]);
}

/// Rows per rectangular tile (AVX-512's channel orientation): two, so each weight vector
/// loaded serves twice the positions.
const RECT_ROWS: usize = 2;
/// Positions per rectangular tile row at most: the 28 accumulators (`RECT_ROWS · RECT_NP`
/// per weight vector), the weight vectors and a broadcast fit the 32 zmm registers.
const RECT_NP: usize = 7;

/// Positions per flat tile at most (AVX2's channel orientation): 12 accumulators, two
/// weight vectors and a broadcast of the 16 ymm registers, and an offset per position in a
/// general register. A flat tile is a run of consecutive positions in row-major order,
/// wherever the rows break: a 7 × 7 plane is 9 tiles of 5 or 6 positions, where rectangles
/// of at most 2 × 3 (the 16 registers' limit) left tiles of 2 and of one row, whose 4 to 8
/// accumulators cannot hide the multiply-add latency (ResNet-18's 7 × 7 × 512 layer,
/// standalone, Zen 3: 72 → 79–91 GFLOP/s with warm weights, 70 → 80–82 streamed).
const FLAT_NP: usize = 6;

/// Where a tile is: output rows `oy..oy + nr`, columns `ox..ox + np`.
#[derive(Clone, Copy)]
struct Pos {
    oy: usize,
    nr: usize,
    ox: usize,
    np: usize,
}

/// Input channels `c0..c0 + cc` of a tile's sums; `last`: the sums are then complete.
#[derive(Clone, Copy)]
struct Chunk {
    c0: usize,
    cc: usize,
    last: bool,
}

/// Weight bytes per chunk of input channels in the channel orientation: a chunk's weights
/// stay in L1 while every tile of a unit runs over them (a block's weights for all of a deep
/// layer's input channels — 256 × 9 × 16 floats — came from L2 on every tile).
const CHUNK_BYTES: usize = 16 << 10;

/// Input channels per chunk.
fn chunk_channels(p: &Plan) -> usize {
    (CHUNK_BYTES / 4 / (p.taps.len() * p.ocb())).clamp(1, p.cg)
}

/// Input channels `ch` of the tile at `at` of weight block `ob`, added to the tile's partial
/// sums at `part` (`[rows][np][ocb]`; set by the first chunk), and with the last chunk stored
/// into the output planes at `dst` (the group's first output channel of the image).
///
/// # Safety
/// `xs` is the (image, group)'s filled scratch, `wb` the block's packed weights, `dst` holds
/// the group's `og` output planes, `part` the tile's partial sums; the tile is within the
/// output and at most [`RECT_ROWS`] × [`RECT_NP`].
#[allow(clippy::too_many_arguments)]
unsafe fn tile(p: &Plan, xs: *const f32, wb: *const f32, at: Pos, ch: Chunk, part: *mut f32, ob: usize, dst: *mut f32) {
    let (ocb, lanes) = (p.ocb(), p.simd.lanes());
    let oc0 = ob * ocb;
    let valid = ocb.min(p.og - oc0);
    let ov = valid.div_ceil(lanes);
    let x = xs.wrapping_add(at.oy * p.pitch + at.ox);
    let a = Args::chunk(p, x, wb, ch, part, [0; FLAT_NP]);
    let (nr, np) = (at.nr, at.np);
    // Safety: reads stay within the scratch and the block; `part` holds nr × np × ocb;
    // rectangular tiles are AVX-512's.
    unsafe {
        match (ov == OV, nr == 2) {
            (true, true) => avx512_2x2(a, np),
            (true, false) => avx512_2x1(a, np),
            (false, true) => avx512_1x2(a, np),
            (false, false) => avx512_1x1(a, np),
        }
    }
    if !ch.last {
        return;
    }
    // Safety: the tile's partial sums, complete.
    let buf = unsafe { std::slice::from_raw_parts(part, nr * np * ocb) };
    let plane = p.oh * p.ow;
    for o in 0..valid {
        for r in 0..nr {
            // Safety: output (oc0 + o, oy + r, ox..ox + np) of the group's planes.
            let row =
                unsafe { std::slice::from_raw_parts_mut(dst.add((oc0 + o) * plane + (at.oy + r) * p.ow + at.ox), np) };
            for (j, v) in row.iter_mut().enumerate() {
                *v = buf[(r * np + j) * ocb + o];
            }
        }
    }
}

/// Input channels `ch` of the flat tile of positions `q0..q0 + np` (row-major over the
/// output plane, `np` ≤ [`FLAT_NP`]) of weight block `ob`, as [`tile`] does for a rectangle.
///
/// # Safety
/// As [`tile`]; the tile is within the output plane.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_flat(
    p: &Plan,
    xs: *const f32,
    wb: *const f32,
    q0: usize,
    np: usize,
    ch: Chunk,
    part: *mut f32,
    ob: usize,
    dst: *mut f32,
) {
    let (ocb, lanes) = (p.ocb(), p.simd.lanes());
    let oc0 = ob * ocb;
    let valid = ocb.min(p.og - oc0);
    let mut offs = [0; FLAT_NP];
    for (j, off) in offs.iter_mut().take(np).enumerate() {
        let q = q0 + j;
        *off = q / p.ow * p.pitch + q % p.ow;
    }
    let a = Args::chunk(p, xs, wb, ch, part, offs);
    // Safety: every offset is a position of the plane, whose taps read within the scratch;
    // `part` holds np × ocb; flat tiles are AVX2's.
    unsafe {
        if valid.div_ceil(lanes) == OV {
            avx2_flat2(a, np)
        } else {
            avx2_flat1(a, np)
        }
    }
    if !ch.last {
        return;
    }
    // Safety: the tile's partial sums, complete.
    let buf = unsafe { std::slice::from_raw_parts(part, np * ocb) };
    let plane = p.oh * p.ow;
    for o in 0..valid {
        // Safety: output (oc0 + o, q0..q0 + np) of the group's planes.
        let run = unsafe { std::slice::from_raw_parts_mut(dst.add((oc0 + o) * plane + q0), np) };
        for (j, v) in run.iter_mut().enumerate() {
            *v = buf[j * ocb + o];
        }
    }
}

/// Output row `oy`, columns `ox..` (up to [`pv`] vectors), of weight block `ob` in the
/// position orientation.
///
/// # Safety
/// As [`tile`].
unsafe fn tile_positions(p: &Plan, xs: *const f32, wb: *const f32, oy: usize, ox: usize, ob: usize, dst: *mut f32) {
    let (ocb, lanes) = (p.ocb(), p.simd.lanes());
    let oc0 = ob * ocb;
    let valid = ocb.min(p.og - oc0);
    let np = (p.ow - ox).min(pv(p.simd) * lanes);
    let nv = np.div_ceil(lanes);
    let mut buf = [0f32; PC * PV * 16];
    let a = Args {
        x: xs.wrapping_add(oy * p.pitch + ox),
        w: wb,
        cg: p.cg,
        plane: p.plane,
        pitch: p.pitch,
        taps: &p.taps,
        out: buf.as_mut_ptr(),
        add: false,
        offs: [0; FLAT_NP],
    };
    // Safety: reads stay within the scratch (its slack covers the last vectors) and the
    // block; `buf` holds ocb × nv vectors.
    unsafe {
        match p.simd {
            Simd::Avx512 => positions_avx512(a, nv),
            _ => positions_avx2(a, nv),
        }
    }
    let plane = p.oh * p.ow;
    for o in 0..valid {
        // Safety: output (oc0 + o, oy, ox..ox + np) of the group's planes.
        let row = unsafe { std::slice::from_raw_parts_mut(dst.add((oc0 + o) * plane + oy * p.ow + ox), np) };
        row.copy_from_slice(&buf[o * nv * lanes..][..np]);
    }
}

/// The operands of one microkernel call.
#[derive(Clone, Copy)]
struct Args<'a> {
    /// The tile's first position in the first channel's scratch.
    x: *const f32,
    /// The weight block, `[cg][tap][ocb]`.
    w: *const f32,
    cg: usize,
    plane: usize,
    /// Scratch elements from one output row to the next.
    pitch: usize,
    taps: &'a [usize],
    /// `[rows][np][ocb]`.
    out: *mut f32,
    /// Add to the sums in `out` (the channel orientation's later chunks of input channels).
    add: bool,
    /// A flat tile's positions: where each reads, relative to `x`.
    offs: [usize; FLAT_NP],
}

impl<'a> Args<'a> {
    /// The channel orientation's operands for input channels `ch` of a tile whose first
    /// position reads at `x` in the first channel's scratch: weights from block `wb`, partial
    /// sums at `part`.
    fn chunk(p: &'a Plan, x: *const f32, wb: *const f32, ch: Chunk, part: *mut f32, offs: [usize; FLAT_NP]) -> Self {
        Args {
            x: x.wrapping_add(ch.c0 * p.plane),
            w: wb.wrapping_add(ch.c0 * p.taps.len() * p.ocb()),
            cg: ch.cc,
            plane: p.plane,
            pitch: p.pitch,
            taps: &p.taps,
            out: part,
            add: ch.c0 > 0,
            offs,
        }
    }
}

/// Where a tile's positions read within a tap's run of the scratch: position `j` at
/// `offset(j)`.
trait Positions: Copy {
    fn new(a: &Args) -> Self;
    fn offset(&self, j: usize) -> usize;
}

/// Rows of `NP` consecutive positions, `pitch` apart: AVX-512's rectangles, addressed from
/// one base register by displacements.
#[derive(Clone, Copy)]
struct Rect<const NP: usize>(usize);

impl<const NP: usize> Positions for Rect<NP> {
    #[inline(always)]
    fn new(a: &Args) -> Self {
        Rect(a.pitch)
    }

    #[inline(always)]
    fn offset(&self, j: usize) -> usize {
        j / NP * self.0 + j % NP
    }
}

/// `NP` positions at offsets of their own: AVX2's flat tiles, one general register each.
#[derive(Clone, Copy)]
struct Flat<const NP: usize>([usize; NP]);

impl<const NP: usize> Positions for Flat<NP> {
    #[inline(always)]
    fn new(a: &Args) -> Self {
        Flat(std::array::from_fn(|j| a.offs[j]))
    }

    #[inline(always)]
    fn offset(&self, j: usize) -> usize {
        self.0[j]
    }
}

/// `out[j][v·N + l] = Σ_c Σ_t w[c][t][v·N + l] · x[c·plane + tap[t] + q.offset(j)]` for `P`
/// positions and `V` vectors of output channels (`W` channels per weight row).
///
/// # Safety
/// Called with `L`'s instruction set; every read is within the operands.
#[inline(always)]
unsafe fn microkernel<L: Lanes, const V: usize, const P: usize, const W: usize, Q: Positions>(a: Args) {
    // Safety: the caller's contract.
    unsafe {
        let q = Q::new(&a);
        let mut acc = [[L::zero(); V]; P];
        if a.add {
            for (j, acc) in acc.iter_mut().enumerate() {
                for (v, s) in acc.iter_mut().enumerate() {
                    *s = L::load(a.out.add(j * W + v * L::N));
                }
            }
        }
        let mut wp = a.w;
        for c in 0..a.cg {
            let xc = a.x.add(c * a.plane);
            for &t in a.taps {
                let mut wv = [L::zero(); V];
                for (v, wv) in wv.iter_mut().enumerate() {
                    *wv = L::load(wp.add(v * L::N));
                    // The weights stream from memory when a layer's are larger than L2.
                    L::prefetch(wp.wrapping_add(PREFETCH * W + v * L::N));
                }
                let xt = xc.add(t);
                for (j, acc) in acc.iter_mut().enumerate() {
                    let xj = L::splat(xt.add(q.offset(j)));
                    for v in 0..V {
                        acc[v] = L::fma(wv[v], xj, acc[v]);
                    }
                }
                wp = wp.add(W);
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            for (v, &s) in acc.iter().enumerate() {
                L::store(a.out.add(j * W + v * L::N), s);
            }
        }
    }
}

/// `out[o][v·N + l] = Σ_c Σ_t w[c][t][o] · x[c·plane + tap[t] + v·N + l]` for `OCB` output
/// channels and `V` vectors of consecutive positions (the position orientation).
///
/// # Safety
/// Called with `L`'s instruction set; every read is within the operands.
#[inline(always)]
unsafe fn microkernel_positions<L: Lanes, const V: usize, const OCB: usize>(a: Args) {
    // Safety: the caller's contract.
    unsafe {
        let mut acc = [[L::zero(); V]; OCB];
        let mut wp = a.w;
        for c in 0..a.cg {
            let xc = a.x.add(c * a.plane);
            for &t in a.taps {
                let xt = xc.add(t);
                let mut xv = [L::zero(); V];
                for (v, xv) in xv.iter_mut().enumerate() {
                    *xv = L::load(xt.add(v * L::N));
                }
                for (o, acc) in acc.iter_mut().enumerate() {
                    let wo = L::splat(wp.add(o));
                    for v in 0..V {
                        acc[v] = L::fma(xv[v], wo, acc[v]);
                    }
                }
                wp = wp.add(OCB);
            }
        }
        for (o, acc) in acc.iter().enumerate() {
            for (v, &r) in acc.iter().enumerate() {
                L::store(a.out.add((o * V + v) * L::N), r);
            }
        }
    }
}

/// The position-orientation instances for one instruction set: `$name(args, nv)` for `nv`
/// vectors (one of `$nv`).
macro_rules! position_kernels {
    ($name:ident, $feat:literal, $lanes:ty, $pc:expr, [$($nv:literal)*]) => {
        /// # Safety
        /// The host has the instruction set; as [`microkernel_positions`].
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name(a: Args, nv: usize) {
            // Safety: the caller's contract.
            unsafe {
                match nv {
                    $($nv => microkernel_positions::<$lanes, $nv, { $pc }>(a),)*
                    _ => unreachable!("tile of {nv} vectors"),
                }
            }
        }

        /// Off x86-64 no plan is made ([`Simd::detect`] is `Baseline`).
        #[cfg(not(target_arch = "x86_64"))]
        unsafe fn $name(_: Args, _: usize) {
            unreachable!("no vector instances off x86-64")
        }
    };
}

position_kernels!(positions_avx512, "avx512f,avx2,fma", crate::simd::x86::Zmm, PC, [1 2]);
position_kernels!(positions_avx2, "avx2,fma", crate::simd::x86::Ymm, PC / 2, [1 2 3]);

/// The instances of [`microkernel`] for one instruction set, vector count, row count and kind
/// of tile (`Rect`, or `Flat` with one row): `$name(args, np)` picks the one for `np`
/// positions per row.
macro_rules! microkernels {
    ($name:ident, $feat:literal, $lanes:ty, $v:literal, $r:literal, $w:literal, $q:ident, [$($np:literal)*]) => {
        /// # Safety
        /// The host has the instruction set; as [`microkernel`].
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name(a: Args, np: usize) {
            // Safety: the caller's contract.
            unsafe {
                match np {
                    $($np => microkernel::<$lanes, $v, { $r * $np }, $w, $q<$np>>(a),)*
                    _ => unreachable!("tile of {np} positions"),
                }
            }
        }

        /// Off x86-64 no plan is made ([`Simd::detect`] is `Baseline`).
        #[cfg(not(target_arch = "x86_64"))]
        unsafe fn $name(_: Args, _: usize) {
            unreachable!("no vector instances off x86-64")
        }
    };
}

microkernels!(avx512_2x2, "avx512f,avx2,fma", crate::simd::x86::Zmm, 2, 2, 32, Rect, [1 2 3 4 5 6 7]);
microkernels!(avx512_2x1, "avx512f,avx2,fma", crate::simd::x86::Zmm, 2, 1, 32, Rect, [1 2 3 4 5 6 7]);
microkernels!(avx512_1x2, "avx512f,avx2,fma", crate::simd::x86::Zmm, 1, 2, 32, Rect, [1 2 3 4 5 6 7]);
microkernels!(avx512_1x1, "avx512f,avx2,fma", crate::simd::x86::Zmm, 1, 1, 32, Rect, [1 2 3 4 5 6 7]);
microkernels!(avx2_flat2, "avx2,fma", crate::simd::x86::Ymm, 2, 1, 16, Flat, [1 2 3 4 5 6]);
microkernels!(avx2_flat1, "avx2,fma", crate::simd::x86::Ymm, 1, 1, 16, Flat, [1 2 3 4 5 6]);

#[cfg(test)]
mod tests {
    use super::*;

    /// Both orientations; strides 1 to 3, asymmetric padding, dilation, groups, 1 × 3, 3 × 1
    /// and 7 × 7 kernels, a 3-channel first layer, output channels that fill no weight block
    /// or half of one, one-row planes, rows wider than a tile (whole position tiles beside part
    /// ones), several images in one batch of scratch, cached and uncached weights, 1 and 2
    /// threads: against the definition (small integers, so f32 is exact). CI runs this on the AVX-512 and the AVX2 instances
    /// (`OAR_CPU_SIMD`).
    #[test]
    fn tiled_convolutions_match_the_definition() {
        // (n, c, o, h, w, kh, kw, stride, pad before, pad after, dilation, groups)
        type Case = (
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 2],
            usize,
        );
        let cases: [Case; 15] = [
            (1, 16, 24, 14, 14, 3, 3, [1, 1], [1, 1], [1, 1], [1, 1], 1),
            (2, 3, 10, 23, 21, 7, 7, [2, 2], [3, 3], [3, 2], [1, 1], 1),
            (1, 8, 9, 7, 7, 1, 3, [1, 1], [0, 1], [0, 1], [1, 1], 1),
            (3, 8, 5, 9, 12, 3, 1, [2, 2], [1, 0], [1, 0], [1, 1], 1),
            (1, 12, 16, 11, 13, 3, 3, [1, 2], [2, 0], [1, 2], [2, 1], 1),
            (2, 8, 12, 9, 9, 3, 3, [1, 1], [1, 1], [1, 1], [1, 1], 4),
            (1, 4, 33, 5, 40, 3, 5, [3, 1], [1, 2], [0, 2], [1, 2], 1),
            (1, 2, 8, 1, 7, 3, 3, [1, 1], [1, 1], [1, 1], [1, 1], 1),
            (5, 9, 17, 6, 6, 3, 3, [1, 1], [1, 1], [1, 1], [1, 1], 1),
            (1, 5, 70, 4, 29, 3, 3, [1, 1], [1, 1], [1, 1], [1, 1], 1),
            // The position orientation: a first layer, rows of one partial and of several
            // tiles.
            (1, 3, 13, 40, 75, 5, 5, [2, 2], [2, 2], [2, 2], [1, 1], 1),
            (2, 4, 7, 5, 70, 3, 3, [1, 1], [1, 1], [1, 1], [1, 1], 1),
            (1, 3, 20, 6, 100, 3, 3, [1, 1], [1, 1], [1, 1], [1, 1], 1),
            // More input channels than a chunk (AVX2: 28, AVX-512: 14 for 3 × 3): partial sums
            // carried across chunks; an odd row count (a last tile of one row) and a part
            // weight block.
            (2, 61, 36, 7, 7, 3, 3, [1, 1], [1, 1], [1, 1], [1, 1], 1),
            (1, 45, 20, 15, 19, 3, 3, [2, 2], [1, 1], [1, 1], [1, 1], 1),
        ];
        for (i, (n, c, o, h, w, kh, kw, stride, pad_before, pad_after, dilation, groups)) in
            cases.into_iter().enumerate()
        {
            let spec = ConvSpec {
                stride: &stride,
                pad_before: &pad_before,
                pad_after: &pad_after,
                dilation: &dilation,
                groups,
            };
            let (xs, ws) = ([n, c, h, w], [o, c / groups, kh, kw]);
            let (geo, _) = crate::conv::geometry(&xs, &ws, &spec).unwrap();
            let sout = [geo.sout[0], geo.sout[1]];
            let x: Vec<f64> = (0..xs.iter().product())
                .map(|j: usize| ((j * 7 + i) % 9) as f64 - 4.0)
                .collect();
            let wt: Vec<f64> = (0..ws.iter().product())
                .map(|j: usize| ((j * 5 + i) % 7) as f64 - 3.0)
                .collect();
            let want = crate::conv::testing::reference(&x, xs, &wt, ws, &spec, sout);
            let Some(plan) = Plan::new(&xs, &ws, &spec, &sout) else {
                assert_eq!(Simd::detect(), Simd::Baseline, "case {i}: no plan");
                continue;
            };
            // Cases 10 to 12 have rows wide enough for the position orientation, cases 0, 4, 8,
            // 13 and 14 too narrow.
            if (10..13).contains(&i) {
                assert!(plan.along_positions, "case {i}");
            } else if [0, 4, 8, 13, 14].contains(&i) {
                assert!(!plan.along_positions, "case {i}");
            }
            let (x32, w32): (Vec<f32>, Vec<f32>) = (
                x.iter().map(|&v| v as f32).collect(),
                wt.iter().map(|&v| v as f32).collect(),
            );
            let cache = WeightCache::new();
            for (threads, cached) in [(1, false), (2, true), (2, true)] {
                let mut out = vec![f32::NAN; want.len()];
                // Safety: dense operands of the plan's shapes; `out` holds the output.
                unsafe {
                    conv(
                        x32.as_ptr(),
                        w32.as_ptr(),
                        out.as_mut_ptr(),
                        &plan,
                        threads,
                        cached.then_some(&cache),
                    )
                };
                let got: Vec<f64> = out.iter().map(|&v| v as f64).collect();
                assert_eq!(got, want, "case {i}, {threads} threads, cached {cached}");
            }
        }
    }

    /// Depthwise convolutions, single input channels, 1 × 1 and 3-d convolutions, narrow
    /// planes and baseline hosts are not this path's.
    #[test]
    fn declines_what_other_paths_serve() {
        let (st, pad, dil) = ([1, 1], [1, 1], [1, 1]);
        let spec = |groups| ConvSpec {
            stride: &st,
            pad_before: &pad,
            pad_after: &pad,
            dilation: &dil,
            groups,
        };
        assert!(Plan::new(&[1, 8, 9, 9], &[8, 1, 3, 3], &spec(8), &[9, 9]).is_none());
        assert!(Plan::new(&[1, 1, 9, 9], &[8, 1, 3, 3], &spec(1), &[9, 9]).is_none());
        assert!(Plan::new(&[1, 2, 3, 9, 9], &[8, 2, 3, 3, 3], &spec(1), &[9, 9]).is_none());
        let (zero, one) = ([0, 0], [1, 1]);
        let pointwise = ConvSpec {
            stride: &one,
            pad_before: &zero,
            pad_after: &zero,
            dilation: &one,
            groups: 1,
        };
        assert!(Plan::new(&[1, 8, 9, 9], &[8, 8, 1, 1], &pointwise, &[9, 9]).is_none());
        assert!(Plan::new(&[1, 8, 9, 9], &[8, 8, 1, 1], &spec(1), &[11, 11]).is_none());
        assert!(Plan::new(&[32, 8, 4, 4], &[8, 8, 3, 3], &spec(1), &[4, 4]).is_none());
        let serves = Plan::new(&[1, 8, 9, 9], &[8, 8, 3, 3], &spec(1), &[9, 9]).is_some();
        assert_eq!(serves, Simd::detect() != Simd::Baseline);
    }
}
