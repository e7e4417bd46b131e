//! `conv_integer` (2-D): exact i32 sums `conv(x - x_zp, w - w_zp)` of 8-bit operands.
//!
//! Per image and group, the input's patches (im2col rows, the padding filled with the input's
//! zero point so that it contributes nothing) are multiplied by the group's weights into the
//! `[channels, pixels]` output: with 7-bit weights (`|w - w_zp| ≤ 64`, `reduce_range`) and one
//! group on `vpmaddubsw` ([`crate::qgemm_u8`]: u8 × s8 quads, the patches packed four rows at a
//! time), otherwise as `matmul_integer` does ([`crate::qgemm`]: i16 pairs, `vpmaddwd`); both
//! exact. Depthwise convolutions (one input and one output channel per group) run a direct loop
//! over each channel's taps instead, where a GEMM would have one column.

use crate::contraction::{IterEpilogue, PlaneEpilogue};
use crate::conv::ConvSpec;
use crate::conv_depthwise::Int8;
use crate::par::par_units;
use crate::qgemm;
use crate::qgemm_u8;
use oar_ir::ops::ConvInteger;
use oar_ir::{DType, TensorType};

/// Whether the runtime computes this `conv_integer`: static 2-D shapes (`x[N, C, H, W]`,
/// `w[O, C/groups, KH, KW]`), 8-bit operands, a scalar input zero point and a scalar or
/// per-output-channel weight zero point.
pub fn supported(c: &ConvInteger, types: &[TensorType]) -> bool {
    let Some(dims) = qgemm::integer_operands(types) else {
        return false;
    };
    let (x, w) = (&dims[0], &dims[1]);
    let scalar = |z: &Vec<usize>| z.is_empty() || z.as_slice() == [1];
    x.len() == 4
        && w.len() == 4
        && c.stride.len() == 2
        && c.groups >= 1
        && dims.get(2).is_none_or(scalar)
        && dims.get(3).is_none_or(|z| scalar(z) || z.as_slice() == [w[0]])
}

/// An operand's 8-bit value as i32.
fn int(v: u8, dtype: DType) -> i32 {
    if dtype == DType::I8 { v as i8 as i32 } else { v as i32 }
}

/// The geometry of one 2-D integer convolution.
struct Geometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    groups: usize,
}

/// `out[N, O, OH, OW]` (i32 as bytes) = `conv_integer(x, w, zx, zw)` with `c`'s geometry.
#[allow(clippy::too_many_arguments)]
pub fn run(
    c: &ConvInteger,
    x: (&[u8], DType, &[usize]),
    w: (&[u8], DType, &[usize]),
    zx: Option<(&[u8], DType)>,
    zw: Option<(&[u8], DType)>,
    out: &mut [u8],
    threads: usize,
    cache: Option<&crate::contraction::WeightCache>,
    epi: Option<IterEpilogue>,
) -> Result<bool, String> {
    let (xb, dx, xs) = x;
    let (wb, dw, ws) = w;
    let out_dim = |i: usize, size: usize, k: usize| -> Option<usize> {
        let span = c.dilation[i] * (k - 1) + 1;
        (size + c.pad_before[i] + c.pad_after[i])
            .checked_sub(span)
            .map(|d| d / c.stride[i] + 1)
    };
    let g = Geometry {
        n: xs[0],
        c: xs[1],
        h: xs[2],
        w: xs[3],
        o: ws[0],
        kh: ws[2],
        kw: ws[3],
        oh: out_dim(0, xs[2], ws[2]).unwrap_or(0),
        ow: out_dim(1, xs[3], ws[3]).unwrap_or(0),
        groups: c.groups,
    };
    let (cg, og) = (g.c / g.groups.max(1), g.o / g.groups.max(1));
    if g.groups == 0
        || !g.c.is_multiple_of(g.groups)
        || !g.o.is_multiple_of(g.groups)
        || ws[1] != cg
        || xb.len() != g.n * g.c * g.h * g.w
        || wb.len() != g.o * cg * g.kh * g.kw
        || out.len() != g.n * g.o * g.oh * g.ow * 4
    {
        return Err(format!(
            "conv_integer: x {xs:?} ({} bytes), w {ws:?} ({} bytes), groups {}, {} result bytes do not fit",
            xb.len(),
            wb.len(),
            g.groups,
            out.len()
        ));
    }
    let zx_byte = zx.map_or(0u8, |(b, _)| b[0]);
    let zw_at = |o: usize| zw.map_or(0, |(b, d)| int(b[if b.len() == 1 { 0 } else { o }], d));
    let (pixels, k) = (g.oh * g.ow, cg * g.kh * g.kw);
    // The epilogue over whole planes, for the depthwise paths.
    let by_plane = epi.map(|e| move |first: usize, n: usize| (e.f)(first * e.per_plane, (first + n) * e.per_plane));
    let plane_epi = by_plane.as_ref().map(|f| f as PlaneEpilogue);
    if cg == 1 {
        let d = Depthwise {
            c,
            g: &g,
            x: (xb, dx),
            w: (wb, dw),
            zx: int(zx_byte, dx),
            zw_at: &zw_at,
            threads,
            epi: plane_epi,
        };
        if d.on_f32_kernels(xs, ws, out) {
            return Ok(epi.is_some());
        }
        if og == 1 {
            d.integer_loop(out);
            return Ok(epi.is_some());
        }
    }
    // The weights less their zero points, packed once (kept in `cache` when they are constant),
    // tagged by the kernel they are packed for: with one group, 7-bit weights (`reduce_range`)
    // and AVX2, as `vpmaddubsw` quads ([`qgemm_u8`]); otherwise every group's as the exact i16
    // kernel's row pairs ([og, k] each, the weight's own layout), one group after the other.
    let rows_per_group = og.div_ceil(4) * 4 * k.div_ceil(2);
    let pack_weights = || {
        if g.groups == 1 && qgemm_u8::available() {
            let w = |r: usize, i: usize| int(wb[r * k + i], dw) - zw_at(r);
            if let Some(q) = qgemm_u8::Quads::new(w, g.o, k) {
                return [QUADS].into_iter().chain(q.to_words()).collect();
            }
        }
        let mut all = vec![PAIRS];
        all.reserve(g.groups * rows_per_group);
        for grp in 0..g.groups {
            let za = zw.map(|(b, d)| {
                if b.len() == 1 {
                    (b, d)
                } else {
                    (&b[grp * og..(grp + 1) * og], d)
                }
            });
            all.extend(qgemm::pair_rows(
                &wb[grp * og * k..(grp + 1) * og * k],
                dw,
                za,
                (og, og, k),
            ));
        }
        all
    };
    let owned: Vec<u32>;
    let packed_weights: &[u32] = match cache {
        Some(c) => bytemuck::cast_slice(c.get_or_init(|| bytemuck::cast_vec(pack_weights()))),
        None => {
            owned = pack_weights();
            &owned
        }
    };
    let (&tag, packed_weights) = packed_weights.split_first().ok_or("conv_integer: no packed weights")?;
    let quads = match tag {
        QUADS => Some(qgemm_u8::Quads::view(packed_weights).ok_or("conv_integer: packed weights do not fit")?),
        _ => None,
    };
    let pairs = packed_weights;
    // The input's patches as a [k, pixels] matrix (row (ci, ky, kx): that tap's input for every
    // output pixel, the padding the input's zero point); a 1×1, stride-1, unpadded convolution
    // reads the input planes as they are.
    let direct = g.kh == 1
        && g.kw == 1
        && c.stride.iter().all(|&s| s == 1)
        && c.pad_before.iter().chain(&c.pad_after).all(|&p| p == 0);
    let mut cols = if direct || quads.is_some() {
        Vec::new()
    } else {
        vec![zx_byte; k * pixels]
    };
    let zxb = zx.map(|(b, d)| (&b[..1], d));
    for img in 0..g.n {
        for grp in 0..g.groups {
            let planes = &xb[(img * g.c + grp * cg) * g.h * g.w..][..cg * g.h * g.w];
            let dst = &mut out[(img * g.o + grp * og) * pixels * 4..][..og * pixels * 4];
            if let Some(q) = quads {
                // The patches packed four rows at a time, never stored whole.
                let signed = dx == DType::I8;
                PACKED.with_borrow_mut(|packed| {
                    qgemm_u8::pack_rows(k, pixels, signed, threads, packed, |r, row| {
                        if direct {
                            row.copy_from_slice(&planes[r * pixels..(r + 1) * pixels]);
                        } else {
                            im2col_row(c, &g, planes, r, zx_byte, row);
                        }
                    });
                    let z = if signed { zx_byte ^ 0x80 } else { zx_byte };
                    qgemm_u8::run(q, packed, z, pixels, dst, threads)
                })?;
                continue;
            }
            let b: &[u8] = if direct {
                planes
            } else {
                im2col(c, &g, planes, cg, zx_byte, &mut cols);
                &cols
            };
            let packed = qgemm::pack_b(b, dx, zxb, k, pixels);
            qgemm::run_pairs(
                &pairs[grp * rows_per_group..(grp + 1) * rows_per_group],
                og,
                &packed,
                k,
                pixels,
                dst,
                threads,
            )?;
        }
    }
    // The epilogue runs after the product, over the whole output (applied by each thread to
    // the chunks of columns it had finished, the generated epilogue's calls — a few hundred
    // pixels of one plane each — cost more than the cache they save: ResNet-18 int8 on Zen 3,
    // two threads, 30.7 → 28.5 ms, 17.3 → 15.9 with 7-bit weights).
    Ok(false)
}

thread_local! {
    /// The packed patches of the last `vpmaddubsw` convolution on this thread, reused (their
    /// pages stay mapped) by the next.
    static PACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The tag of weights packed as [`qgemm_u8::Quads`].
const QUADS: u32 = 1;
/// The tag of weights packed as [`qgemm::pair_rows`].
const PAIRS: u32 = 0;

/// `cols[(ci, ky, kx), pixel]` = the input under that tap for every output pixel of `planes`
/// (`cg` input planes), `fill` (the input's zero point) where the tap falls in the padding.
fn im2col(c: &ConvInteger, g: &Geometry, planes: &[u8], cg: usize, fill: u8, cols: &mut [u8]) {
    let pixels = g.oh * g.ow;
    for (r, row) in cols.chunks_exact_mut(pixels).take(cg * g.kh * g.kw).enumerate() {
        im2col_row(c, g, planes, r, fill, row);
    }
}

/// Row `r` = `(ci, ky, kx)` of [`im2col`]: the input under that tap for every output pixel.
fn im2col_row(c: &ConvInteger, g: &Geometry, planes: &[u8], r: usize, fill: u8, row: &mut [u8]) {
    let s1 = c.stride[1] as isize;
    let (ci, ky, kx) = (r / (g.kh * g.kw), r / g.kw % g.kh, r % g.kw);
    let plane = &planes[ci * g.h * g.w..][..g.h * g.w];
    let off = (kx * c.dilation[1]) as isize - c.pad_before[1] as isize;
    let lo = if off >= 0 { 0 } else { ((-off) + s1 - 1) / s1 } as usize;
    let hi = ((g.w as isize - off + s1 - 1) / s1).clamp(0, g.ow as isize) as usize;
    if c.stride[0] == 1 && s1 == 1 && g.ow == g.w && lo < hi {
        // Output rows map to consecutive input rows at one column offset: the row is the plane
        // shifted by `dy · w + off`, one copy, with the padding rows and the border columns
        // filled afterwards (a small image's rows are then not one short copy each).
        let dy = (ky * c.dilation[0]) as isize - c.pad_before[0] as isize;
        let oy0 = (-dy).clamp(0, g.oh as isize) as usize;
        let oy1 = (g.h as isize - dy).clamp(oy0 as isize, g.oh as isize) as usize;
        let shift = dy * g.w as isize + off;
        let start = ((oy0 * g.w) as isize).max(-shift) as usize;
        let end = ((oy1 * g.w) as isize)
            .min((g.h * g.w) as isize - shift)
            .max(start as isize) as usize;
        row[..start].fill(fill);
        row[end..].fill(fill);
        let from = (start as isize + shift) as usize;
        row[start..end].copy_from_slice(&plane[from..from + (end - start)]);
        for oy in oy0..oy1 {
            let r = &mut row[oy * g.w..(oy + 1) * g.w];
            r[..lo].fill(fill);
            r[hi..].fill(fill);
        }
        return;
    }
    for oy in 0..g.oh {
        let dst = &mut row[oy * g.ow..(oy + 1) * g.ow];
        let iy = (oy * c.stride[0] + ky * c.dilation[0]) as isize - c.pad_before[0] as isize;
        if iy < 0 || iy >= g.h as isize || lo >= hi {
            dst.fill(fill);
            continue;
        }
        dst[..lo].fill(fill);
        dst[hi..].fill(fill);
        let src = &plane[iy as usize * g.w..][..g.w];
        let first = (lo as isize * s1 + off) as usize;
        if s1 == 1 {
            dst[lo..hi].copy_from_slice(&src[first..first + (hi - lo)]);
        } else if s1 == 2 {
            even_bytes(&src[first..], &mut dst[lo..hi]);
        } else {
            for (d, &v) in dst[lo..hi].iter_mut().zip(src[first..].iter().step_by(s1 as usize)) {
                *d = v;
            }
        }
    }
}

/// `dst[i] = src[2 · i]` for every `i` of `dst` (`src` holds at least `2 · dst.len() - 1`
/// bytes): a stride-2 convolution's taps, sixteen at a time.
fn even_bytes(src: &[u8], dst: &mut [u8]) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    while i + 16 <= dst.len() && 2 * i + 32 <= src.len() {
        use std::arch::x86_64::*;
        // Safety: SSE2 is part of x86-64; 32 bytes of `src` from `2 i` and 16 of `dst` from `i`
        // are in bounds (the loop's condition); unaligned loads and store.
        unsafe {
            let low = _mm_set1_epi16(0xff);
            let a = _mm_and_si128(_mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i), low);
            let b = _mm_and_si128(_mm_loadu_si128(src.as_ptr().add(2 * i + 16) as *const __m128i), low);
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, _mm_packus_epi16(a, b));
        }
        i += 16;
    }
    for (j, d) in dst.iter_mut().enumerate().skip(i) {
        *d = src[2 * j];
    }
}

/// A depthwise `conv_integer` (one input channel per group): its operands, the input's zero
/// point, the weights' per output channel, and the epilogue to apply to finished planes.
#[derive(Clone, Copy)]
struct Depthwise<'a> {
    c: &'a ConvInteger,
    g: &'a Geometry,
    x: (&'a [u8], DType),
    w: (&'a [u8], DType),
    zx: i32,
    zw_at: &'a (dyn Fn(usize) -> i32 + Sync),
    threads: usize,
    epi: Option<PlaneEpilogue<'a>>,
}

impl Depthwise<'_> {
    /// On the f32 depthwise kernels ([`crate::conv_depthwise`], AVX2 / AVX-512), whose sums of
    /// 8-bit values less their zero points are exact ([`Int8`]); false where that path does
    /// not serve (no vector instruction set, more than [`Int8::MAX_TAPS`] taps, an output not
    /// aligned for i32 stores).
    fn on_f32_kernels(self, xs: &[usize], ws: &[usize], out: &mut [u8]) -> bool {
        let (c, g, (wb, dw)) = (self.c, self.g, self.w);
        let taps = g.kh * g.kw;
        if taps > Int8::MAX_TAPS || !(out.as_ptr() as usize).is_multiple_of(4) {
            return false;
        }
        let spec = ConvSpec {
            stride: &c.stride,
            pad_before: &c.pad_before,
            pad_after: &c.pad_after,
            dilation: &c.dilation,
            groups: c.groups,
        };
        let Some(plan) = crate::conv_depthwise::Plan::new(xs, ws, &spec, &[g.oh, g.ow]) else {
            return false;
        };
        let w: Vec<f32> = (0..g.o * taps)
            .map(|i| (int(wb[i], dw) - (self.zw_at)(i / taps)) as f32)
            .collect();
        let io = Int8 {
            zero: self.zx,
            signed: self.x.1 == DType::I8,
        };
        // Safety: x, w and out hold the plan's elements (checked by the caller), out is
        // aligned for i32 (above) and overlaps neither.
        unsafe {
            crate::conv_depthwise::conv(
                self.x.0.as_ptr(),
                w.as_ptr(),
                out.as_mut_ptr() as *mut i32,
                &plan,
                &io,
                self.threads,
                self.epi,
            )
        };
        true
    }

    /// Depthwise `conv_integer` (one input and one output channel per group): per channel, each
    /// tap adds `w · (x − x_zp)` over whole output rows (contiguous input for stride 1, which the
    /// compiler vectorizes); channels run in parallel.
    fn integer_loop(self, out: &mut [u8]) {
        let Depthwise {
            c,
            g,
            x: (xb, dx),
            w: (wb, dw),
            zx,
            zw_at,
            threads,
            epi,
        } = self;
        let out_ptr = out.as_mut_ptr() as usize;
        let (pixels, taps) = (g.oh * g.ow, g.kh * g.kw);
        // The input as i32 less its zero point, per plane when a channel's unit reads it.
        par_units(
            g.n * g.o,
            threads.max(1),
            || (vec![0i32; pixels], vec![0i32; g.h * g.w]),
            |(acc, plane), unit| {
                let ch = unit % g.o;
                let src = &xb[unit * g.h * g.w..][..g.h * g.w];
                for (p, &v) in plane.iter_mut().zip(src) {
                    *p = int(v, dx) - zx;
                }
                acc.fill(0);
                let zwi = zw_at(ch);
                for ky in 0..g.kh {
                    for kx in 0..g.kw {
                        let w = int(wb[ch * taps + ky * g.kw + kx], dw) - zwi;
                        if w == 0 {
                            continue;
                        }
                        // Output columns whose input column is inside the row.
                        let off = (kx * c.dilation[1]) as isize - c.pad_before[1] as isize;
                        let s1 = c.stride[1] as isize;
                        let lo = if off >= 0 { 0 } else { ((-off) + s1 - 1) / s1 } as usize;
                        let hi = ((g.w as isize - off + s1 - 1) / s1).clamp(0, g.ow as isize) as usize;
                        if lo >= hi {
                            continue;
                        }
                        for oy in 0..g.oh {
                            let iy = (oy * c.stride[0] + ky * c.dilation[0]) as isize - c.pad_before[0] as isize;
                            if iy < 0 || iy >= g.h as isize {
                                continue;
                            }
                            let row = &plane[iy as usize * g.w..][..g.w];
                            let dst = &mut acc[oy * g.ow + lo..oy * g.ow + hi];
                            let first = (lo as isize * s1 + off) as usize;
                            if s1 == 1 {
                                for (a, &v) in dst.iter_mut().zip(&row[first..first + (hi - lo)]) {
                                    *a = a.wrapping_add(v.wrapping_mul(w));
                                }
                            } else {
                                for (a, &v) in dst.iter_mut().zip(row[first..].iter().step_by(s1 as usize)) {
                                    *a = a.wrapping_add(v.wrapping_mul(w));
                                }
                            }
                        }
                    }
                }
                // Safety: each unit writes its own plane of the output (`n · o · pixels` i32,
                // checked by the caller); byte copies need no alignment.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        acc.as_ptr() as *const u8,
                        (out_ptr as *mut u8).add(unit * pixels * 4),
                        pixels * 4,
                    );
                }
                if let Some(epi) = epi {
                    epi(unit, 1);
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the 16-byte steps, `src` as short as allowed: the even bytes.
    #[test]
    fn even_bytes_takes_every_other_byte() {
        let src: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        for n in [0, 1, 15, 16, 17, 31, 32, 33, 48, 99] {
            let mut dst = vec![0u8; n];
            let len = (2 * n).saturating_sub(1);
            even_bytes(&src[..len], &mut dst);
            let want: Vec<u8> = (0..n).map(|i| src[2 * i]).collect();
            assert_eq!(dst, want, "{n} bytes");
        }
    }

    /// The definition, directly.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        c: &ConvInteger,
        x: &[i32],
        xs: [usize; 4],
        w: &[i32],
        ws: [usize; 4],
        zx: i32,
        zw: &[i32],
        (oh, ow): (usize, usize),
    ) -> Vec<i32> {
        let [n, ch, h, wd] = xs;
        let [o, cg, kh, kw] = ws;
        let og = o / c.groups;
        let mut out = vec![0i32; n * o * oh * ow];
        for img in 0..n {
            for oc in 0..o {
                let grp = oc / og;
                let z = zw[if zw.len() == 1 { 0 } else { oc }];
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut s = 0i64;
                        for ci in 0..cg {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy =
                                        (oy * c.stride[0] + ky * c.dilation[0]) as isize - c.pad_before[0] as isize;
                                    let ix =
                                        (ox * c.stride[1] + kx * c.dilation[1]) as isize - c.pad_before[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                        continue;
                                    }
                                    let xv = x[((img * ch + grp * cg + ci) * h + iy as usize) * wd + ix as usize] - zx;
                                    let wv = w[((oc * cg + ci) * kh + ky) * kw + kx] - z;
                                    s += (xv * wv) as i64;
                                }
                            }
                        }
                        out[((img * o + oc) * oh + oy) * ow + ox] = s as i32;
                    }
                }
            }
        }
        out
    }

    /// An epilogue handed to the convolution runs on every iteration exactly once, and only
    /// once the sums it reads are final, on the depthwise paths; the general path (im2col and
    /// 1 × 1) leaves it to the caller and runs none. 1 and 3 threads, planes whose last block is
    /// short.
    #[test]
    fn epilogues_see_finished_sums_once() {
        use std::sync::Mutex;
        for (xs, ws, groups) in [
            ([1usize, 3, 90, 91], [5usize, 3, 3, 3], 1),
            ([1, 40, 30, 30], [48, 40, 1, 1], 1),
            ([2, 4, 33, 33], [4, 1, 3, 3], 4),
        ] {
            let c = ConvInteger {
                stride: vec![1, 1],
                pad_before: vec![ws[2] / 2; 2],
                pad_after: vec![ws[2] / 2; 2],
                dilation: vec![1, 1],
                groups,
            };
            let xb: Vec<u8> = (0..xs.iter().product::<usize>())
                .map(|i| (i * 37 % 251) as u8)
                .collect();
            let wb: Vec<u8> = (0..ws.iter().product::<usize>())
                .map(|i| (i * 11 % 255) as u8)
                .collect();
            let pixels = xs[2] * xs[3];
            let planes = xs[0] * ws[0];
            let mut want = vec![0i32; planes * pixels];
            run(
                &c,
                (&xb, DType::U8, &xs),
                (&wb, DType::I8, &ws),
                None,
                None,
                bytemuck::cast_slice_mut(&mut want),
                1,
                None,
                None,
            )
            .unwrap();
            let block = 64;
            let per_plane = pixels.div_ceil(block);
            for threads in [1, 3] {
                let mut got = vec![0i32; planes * pixels];
                let at = got.as_ptr() as usize;
                let seen = Mutex::new(vec![false; planes * per_plane]);
                let f = |lo: usize, hi: usize| {
                    let mut seen = seen.lock().unwrap();
                    for it in lo..hi {
                        assert!(!seen[it], "iteration {it} twice");
                        seen[it] = true;
                        let (plane, j) = (it / per_plane, it % per_plane);
                        let cols = j * block..((j + 1) * block).min(pixels);
                        for i in cols.map(|col| plane * pixels + col) {
                            // Safety: in bounds; this element is no longer written.
                            let v = unsafe { *(at as *const i32).add(i) };
                            assert_eq!(v, want[i], "element {i} read before it was final");
                        }
                    }
                };
                let epi = IterEpilogue {
                    f: &f,
                    per_plane,
                    block,
                };
                let applied = run(
                    &c,
                    (&xb, DType::U8, &xs),
                    (&wb, DType::I8, &ws),
                    None,
                    None,
                    bytemuck::cast_slice_mut(&mut got),
                    threads,
                    None,
                    Some(epi),
                )
                .unwrap();
                // The depthwise paths apply it; the general one leaves it to the caller.
                let depthwise = ws[1] == 1;
                assert_eq!(applied, depthwise, "{xs:?} {ws:?}");
                let seen = seen.into_inner().unwrap();
                assert!(seen.iter().all(|&s| s == depthwise), "every iteration runs, or none");
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn matches_the_definition_for_strides_padding_groups_and_depthwise() {
        let mut seed = 0x9e37_79b9u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        };
        // (x shape, w shape, stride, pads, dilation, groups)
        type Case = ([usize; 4], [usize; 4], [usize; 2], [usize; 2], [usize; 2], usize);
        let cases: [Case; 8] = [
            ([1, 3, 9, 9], [4, 3, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            ([1, 4, 9, 9], [8, 1, 3, 3], [1, 1], [1, 1], [1, 1], 4),
            ([2, 4, 8, 7], [6, 2, 3, 3], [2, 2], [1, 0], [1, 1], 2),
            ([1, 6, 7, 7], [6, 1, 3, 3], [1, 1], [1, 1], [1, 1], 6),
            ([1, 5, 10, 10], [3, 5, 1, 1], [1, 1], [0, 0], [1, 1], 1),
            ([1, 2, 9, 9], [2, 2, 3, 3], [1, 1], [2, 2], [2, 2], 1),
            ([1, 4, 9, 8], [4, 1, 3, 3], [2, 2], [1, 1], [1, 1], 4),
            ([2, 3, 7, 10], [3, 1, 5, 5], [1, 2], [2, 2], [1, 1], 3),
        ];
        for (dx, dw) in [(DType::U8, DType::I8), (DType::I8, DType::I8), (DType::U8, DType::U8)] {
            for (xs, ws, stride, pad, dil, groups) in cases {
                let c = ConvInteger {
                    stride: stride.to_vec(),
                    pad_before: pad.to_vec(),
                    pad_after: pad.to_vec(),
                    dilation: dil.to_vec(),
                    groups,
                };
                let oh = (xs[2] + 2 * pad[0] - dil[0] * (ws[2] - 1) - 1) / stride[0] + 1;
                let ow = (xs[3] + 2 * pad[1] - dil[1] * (ws[3] - 1) - 1) / stride[1] + 1;
                let xb: Vec<u8> = (0..xs.iter().product::<usize>()).map(|_| next()).collect();
                let wb: Vec<u8> = (0..ws.iter().product::<usize>()).map(|_| next()).collect();
                let zx = [next()];
                let zw: Vec<u8> = (0..ws[0]).map(|_| next()).collect();
                let xi: Vec<i32> = xb.iter().map(|&v| int(v, dx)).collect();
                let wi: Vec<i32> = wb.iter().map(|&v| int(v, dw)).collect();
                let zwi: Vec<i32> = zw.iter().map(|&v| int(v, dw)).collect();
                let want = naive(&c, &xi, xs, &wi, ws, int(zx[0], dx), &zwi, (oh, ow));
                // `skew` bytes into an i32 allocation: 1 misaligns the result (depthwise
                // convolutions then take the integer loop instead of the f32 kernels).
                let conv_at =
                    |skew: usize, zps: bool, threads: usize, cache: Option<&crate::contraction::WeightCache>| {
                        let mut words = vec![0i32; want.len() + 1];
                        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
                        let out = &mut bytes[skew..skew + want.len() * 4];
                        let (zx, zw) = if zps {
                            (Some((&zx[..], dx)), Some((&zw[..], dw)))
                        } else {
                            (None, None)
                        };
                        run(&c, (&xb, dx, &xs), (&wb, dw, &ws), zx, zw, out, threads, cache, None).unwrap();
                        out.chunks_exact(4)
                            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                            .collect::<Vec<i32>>()
                    };
                let conv = |zps, threads, cache| conv_at(0, zps, threads, cache);
                for skew in [0, 1] {
                    assert_eq!(
                        conv_at(skew, true, 2, None),
                        want,
                        "{dx} x {dw}: x {xs:?} w {ws:?} stride {stride:?} groups {groups}, skew {skew}"
                    );
                }
                // Packed once into a cache, then read from it.
                let cache = crate::contraction::WeightCache::new();
                for _ in 0..2 {
                    assert_eq!(conv(true, 2, Some(&cache)), want);
                }
                // No zero points.
                let want = naive(&c, &xi, xs, &wi, ws, 0, &[0], (oh, ow));
                assert_eq!(conv(false, 1, None), want);
            }
        }
    }
}
