//! N-d convolution `x[N, C, *S] ⋆ w[O, C/groups, *K] -> out[N, O, *Y]` (cross-correlation, as
//! `Op::Conv`) for the contraction runtime.
//!
//! Seven paths, all on contiguous operands (a strided operand is copied first):
//! - **Winograd** ([`crate::winograd`]) for f32 3 × 3 stride-1 convolutions with at least 48
//!   output tiles (a 28 × 28 plane, or a batch of smaller ones);
//! - **tiled** ([`crate::conv_tiled`]) for other f32 2-d convolutions with several input
//!   channels per group and rows of 6 or more outputs on AVX2 and AVX-512 hosts:
//!   register-tiled direct convolution on packed weights;
//! - **blocked depthwise** ([`crate::conv_depthwise_blocked`]) for f32 2-d depthwise
//!   convolutions (one input and one output channel per group: MobileNet's) on AVX2 and
//!   AVX-512 hosts: the channels across the vector lanes, bands of rows transposed in and out;
//! - **depthwise** ([`crate::conv_depthwise`]) for the other f32 2-d convolutions whose output
//!   channels each read one input channel (a channel multiplier) on AVX2 and AVX-512 hosts:
//!   register-blocked accumulators over each plane's stride phases;
//! - **direct** ([`crate::conv_direct`]) for the other convolutions with one input channel per
//!   group (other dtypes and ranks, hosts without AVX2), one plane at a time;
//! - **1×1** (unit kernel, stride 1, no padding): one gemm per (batch, group, column tile) on
//!   the input as it is;
//! - **im2col + gemm** otherwise: for each (batch, group, tile of output positions) the patch
//!   matrix of the tile is built in per-thread scratch and multiplied by the group's weights.
//!
//! Threads split the (batch, group, tile) units; tiles are sized so scratch stays small and
//! there are enough units for every thread.

use crate::contraction::{Elem, Mat, PlaneEpilogue, SendPtr, View, gemm_raw, useful_threads};
use crate::conv_direct::{Direct, Scratch, gather_step};
use crate::par::par_units;
use crate::scratch::Pooled;
use gemm::Parallelism;

/// Patch-matrix elements per im2col tile (per thread).
const TILE_ELEMS: usize = 1 << 17;
/// Output planes at least this large get products of their own, as do strided 1 × 1
/// convolutions' (never grouped with other images': the grouped patches are stored
/// position-major, which reads the channels far apart).
const MIN_PLANE: usize = 256;
/// Smallest tile of output positions (gemm's n) worth a call.
const MIN_TILE: usize = 64;
/// Output tiles (of 4 × 4) from which Winograd serves where the tiled path also would.
///
/// AVX-512: from about 48 tiles (a 28 × 28 plane: ResNet-18's 128-channel layers 0.94 ->
/// 0.76 ms single-threaded); at 16 (14 × 14, 256 channels: 0.93 -> 1.17 ms) the tiled
/// direct convolution is faster. AVX2 (Zen 3), whose direct tiles hold a third of the
/// multiply-adds: from 16 — the 14 × 14 × 256 layers 2.73 -> 1.89 ms single-threaded, 1.41
/// -> 1.10 on two threads.
fn winograd_min_tiles() -> usize {
    match crate::simd::Simd::detect() {
        crate::simd::Simd::Avx512 => 48,
        _ => 16,
    }
}

/// Convolution attributes (one entry per spatial axis), as in `Op::Conv`.
pub(crate) struct ConvSpec<'a> {
    /// Stride.
    pub stride: &'a [usize],
    /// Padding before.
    pub pad_before: &'a [usize],
    /// Padding after.
    pub pad_after: &'a [usize],
    /// Dilation.
    pub dilation: &'a [usize],
    /// Groups.
    pub groups: usize,
}

impl<'a> ConvSpec<'a> {
    /// The attributes of `conv`.
    pub(crate) fn of(conv: &'a oar_ir::ops::Conv) -> ConvSpec<'a> {
        ConvSpec {
            stride: &conv.stride,
            pad_before: &conv.pad_before,
            pad_after: &conv.pad_after,
            dilation: &conv.dilation,
            groups: conv.groups,
        }
    }
}

/// What one kernel position of the last spatial axis reads: output columns `lo..hi` read the
/// input (the others the padding), at input column `ow · stride + shift`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tap {
    pub(crate) lo: usize,
    pub(crate) hi: usize,
    pub(crate) shift: isize,
}

/// The spatial geometry of one convolution.
pub(crate) struct Geo {
    /// Input spatial shape, kernel shape, output spatial shape.
    pub(crate) sin: Vec<usize>,
    pub(crate) kd: Vec<usize>,
    pub(crate) sout: Vec<usize>,
    /// Row-major strides of the input spatial shape.
    pub(crate) in_str: Vec<usize>,
    /// Per outer axis `i < sp - 1`: input index of (kernel index `kk`, output index `yy`) at
    /// `kk · sout[i] + yy`, -1 in the padding.
    pub(crate) tabs: Vec<Vec<isize>>,
    /// Per kernel position of the last axis: which output columns read the input, and where.
    pub(crate) cols: Vec<Tap>,
    /// Last-axis stride.
    pub(crate) step: usize,
    /// Elements of one input plane and of the kernel window.
    pub(crate) s_in: usize,
    pub(crate) ks: usize,
}

impl Geo {
    fn sp(&self) -> usize {
        self.sin.len()
    }

    /// Output width (last spatial axis) and kernel width.
    pub(crate) fn ow(&self) -> usize {
        self.sout[self.sp() - 1]
    }

    pub(crate) fn kw(&self) -> usize {
        self.kd[self.sp() - 1]
    }

    /// Kernel rows (positions of every spatial axis but the last).
    pub(crate) fn krows(&self) -> usize {
        self.kd[..self.sp() - 1].iter().product()
    }

    /// Offset within an input plane of the input row that kernel row `ko` reads for output row
    /// `r` (at last-axis index 0), or `None` where it lies in the padding.
    #[inline]
    pub(crate) fn row_offset(&self, mut r: usize, mut ko: usize) -> Option<usize> {
        let mut off = 0;
        for i in (0..self.sp() - 1).rev() {
            let (yy, kk) = (r % self.sout[i], ko % self.kd[i]);
            r /= self.sout[i];
            ko /= self.kd[i];
            let pos = self.tabs[i][kk * self.sout[i] + yy];
            if pos < 0 {
                return None;
            }
            off += pos as usize * self.in_str[i];
        }
        Some(off)
    }
}

/// Output size of a window along one axis (`None` when no window fits).
fn window_out(input: usize, before: usize, after: usize, k: usize, stride: usize, dil: usize) -> Option<usize> {
    let span = k.checked_sub(1)?.checked_mul(dil)?.checked_add(1)?;
    let padded = input.checked_add(before)?.checked_add(after)?;
    (padded >= span && stride > 0).then(|| (padded - span) / stride + 1)
}

/// Batch, channel and group sizes of one convolution.
#[derive(Clone, Copy)]
pub(crate) struct Dims {
    pub n: usize,
    pub c: usize,
    pub o: usize,
    /// Input and output channels per group, and groups.
    pub cg: usize,
    pub g: usize,
    pub og: usize,
    /// Output positions per plane.
    pub ys: usize,
}

/// The geometry of `conv(x[xs], w[ws])` with `spec`, checked.
pub(crate) fn geometry(xs: &[usize], ws: &[usize], spec: &ConvSpec) -> Result<(Geo, Dims), String> {
    let sp = xs.len().saturating_sub(2);
    let bad = |what: &str| format!("conv {what}: x {xs:?}, w {ws:?}");
    if sp == 0 || ws.len() != xs.len() {
        return Err(bad("needs x[N,C,*S], w[O,C/groups,*K] of equal rank ≥ 3"));
    }
    let attrs = [spec.stride, spec.pad_before, spec.pad_after, spec.dilation];
    if attrs.iter().any(|a| a.len() != sp) {
        return Err(bad("attributes need one entry per spatial axis"));
    }
    let (n, c, o, cg, g) = (xs[0], xs[1], ws[0], ws[1], spec.groups);
    if g == 0 || c % g != 0 || o % g != 0 || cg != c / g || spec.stride.contains(&0) || spec.dilation.contains(&0) {
        return Err(bad(&format!("channels, groups ({g}), stride or dilation")));
    }
    let og = o / g;
    let (sin, kd) = (xs[2..].to_vec(), ws[2..].to_vec());
    let mut sout = Vec::with_capacity(sp);
    for i in 0..sp {
        let y = window_out(
            sin[i],
            spec.pad_before[i],
            spec.pad_after[i],
            kd[i],
            spec.stride[i],
            spec.dilation[i],
        )
        .ok_or_else(|| bad(&format!("window does not fit on spatial axis {i}")))?;
        sout.push(y);
    }
    let ys: usize = sout.iter().product();
    let ks: usize = kd.iter().product();
    let s_in: usize = sin.iter().product();
    let mut in_str = vec![1usize; sp];
    for i in (0..sp - 1).rev() {
        in_str[i] = in_str[i + 1] * sin[i + 1];
    }
    let pos = |i: usize, kk: usize, yy: usize| -> isize {
        (yy * spec.stride[i] + kk * spec.dilation[i]) as isize - spec.pad_before[i] as isize
    };
    let tabs = (0..sp - 1)
        .map(|i| {
            (0..kd[i] * sout[i])
                .map(|j| {
                    let p = pos(i, j / sout[i], j % sout[i]);
                    if p >= 0 && (p as usize) < sin[i] { p } else { -1 }
                })
                .collect()
        })
        .collect();
    let l = sp - 1;
    let (step, width, ow) = (spec.stride[l], sin[l] as isize, sout[l]);
    let cols = (0..kd[l])
        .map(|kw| {
            let shift = pos(l, kw, 0);
            let lo = if shift >= 0 {
                0
            } else {
                (-shift as usize).div_ceil(step)
            };
            let hi = if width - 1 - shift < 0 {
                0
            } else {
                (((width - 1 - shift) as usize) / step + 1).min(ow)
            };
            Tap {
                lo: lo.min(hi),
                hi,
                shift,
            }
        })
        .collect();
    let geo = Geo {
        sin,
        kd,
        sout,
        in_str,
        tabs,
        cols,
        step,
        s_in,
        ks,
    };
    Ok((geo, Dims { n, c, o, cg, g, og, ys }))
}

/// [`geometry`], and `out_shape` checked against it.
pub(crate) fn geometry_to(
    xs: &[usize],
    ws: &[usize],
    out_shape: &[usize],
    spec: &ConvSpec,
) -> Result<(Geo, Dims), String> {
    let (geo, d) = geometry(xs, ws, spec)?;
    if out_shape.len() != xs.len() || out_shape[0] != d.n || out_shape[1] != d.o || out_shape[2..] != geo.sout[..] {
        return Err(format!(
            "conv output should be {:?}: x {xs:?}, w {ws:?} -> {out_shape:?}",
            [&[d.n, d.o][..], &geo.sout[..]].concat()
        ));
    }
    Ok((geo, d))
}

impl ConvSpec<'_> {
    /// A 1 × 1 kernel at stride 1 without padding: the input planes are the patch matrix.
    pub(crate) fn pointwise(&self, geo: &Geo) -> bool {
        geo.kd.iter().all(|&k| k == 1)
            && self.stride.iter().all(|&s| s == 1)
            && self.pad_before.iter().chain(self.pad_after).all(|&p| p == 0)
    }
}

/// `out = conv(x, w)`; `cache` keeps what is derived from constant weights across calls.
///
/// # Safety
/// The views are in bounds of the buffers at `px`, `pw`; `out` holds `out_shape`'s elements
/// and overlaps neither operand.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv<T: Elem>(
    x: &View,
    px: *const T,
    w: &View,
    pw: *const T,
    out: *mut T,
    out_shape: &[usize],
    spec: &ConvSpec,
    threads: usize,
    cache: Option<&crate::contraction::WeightCache>,
) -> Result<(), String> {
    // Safety: the caller's contract.
    unsafe { conv_with(x, px, w, pw, out, out_shape, spec, threads, cache, None) }.map(|_| ())
}

/// [`conv`], and the path applies the epilogue `epi` to the planes it completes where it can
/// (the depthwise one does): the result says whether it did.
///
/// # Safety
/// As [`conv`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv_with<T: Elem>(
    x: &View,
    px: *const T,
    w: &View,
    pw: *const T,
    out: *mut T,
    out_shape: &[usize],
    spec: &ConvSpec,
    threads: usize,
    cache: Option<&crate::contraction::WeightCache>,
    epi: Option<PlaneEpilogue>,
) -> Result<bool, String> {
    let (xs, ws) = (&x.shape, &w.shape);
    let (geo, d) = geometry_to(xs, ws, out_shape, spec)?;
    let Dims { n, c, o, cg, g, og, ys } = d;
    let sp = geo.sp();
    let sout = &geo.sout;
    let total = n * o * ys;
    if total == 0 {
        return Ok(false);
    }
    let (ks, s_in) = (geo.ks, geo.s_in);
    if cg == 0 || s_in == 0 {
        // No input channels, or an empty input the padding alone covers: every tap reads 0.
        // Safety: `out` holds `total` elements.
        unsafe { std::slice::from_raw_parts_mut(out, total).fill(T::ZERO) };
        return Ok(false);
    }
    if let Some(crop) = Crop::of(&geo, spec) {
        let packed: Vec<T>;
        let full = if w.is_dense() {
            // Safety: the view is in bounds (the caller's contract).
            unsafe { std::slice::from_raw_parts(pw.wrapping_offset(w.offset), w.len()) }
        } else {
            // Safety: as above.
            packed = unsafe { pack(pw, w) };
            &packed
        };
        let small = crop.kernel(full, &geo.kd, T::ZERO, threads);
        let view = dense(&[&ws[..2], &crop.kd[..]].concat());
        // Safety: the cropped kernel is dense and of its view's shape; the rest is the caller's.
        return unsafe {
            conv_with(
                x,
                px,
                &view,
                small.as_ptr(),
                out,
                out_shape,
                &crop.spec(spec),
                threads,
                None,
                epi,
            )
        };
    }
    // Contiguous operands.
    let (mut xbuf, mut wbuf) = (Vec::new(), Vec::new());
    // Safety: the views are in bounds (the caller's contract).
    let (xp, wp) = unsafe { (dense_run(px, x, &mut xbuf), dense_run(pw, w, &mut wbuf)) };
    let f32s = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
    let winograd = winograd_shape(&geo, &d, spec).filter(|_| f32s);
    let many_tiles = winograd.is_some_and(|s| s.tiles() >= winograd_min_tiles());
    let flops = total.saturating_mul(cg).saturating_mul(ks);
    let useful = useful_threads(flops, threads);
    if f32s
        && !many_tiles
        && let Some(plan) = crate::conv_tiled::Plan::new(xs, ws, spec, sout)
    {
        // Safety: contiguous f32 operands (T is f32) of the checked shapes; `out` holds
        // `total` elements and overlaps neither.
        unsafe {
            crate::conv_tiled::conv(
                xp as *const f32,
                wp as *const f32,
                out as *mut f32,
                &plan,
                useful,
                cache,
            )
        };
        return Ok(false);
    }
    if let Some(s) = winograd {
        // Safety: contiguous f32 operands (T is f32) of the checked shapes; `out` holds
        // `total` elements and overlaps neither.
        unsafe { crate::winograd::conv(xp as *const f32, wp as *const f32, out as *mut f32, &s, threads, cache) };
        return Ok(false);
    }
    if f32s && let Some(plan) = crate::conv_depthwise_blocked::Plan::new(xs, ws, spec, sout) {
        // Safety: contiguous f32 operands (T is f32) of the checked shapes; `out` holds
        // `total` elements and overlaps neither.
        unsafe {
            crate::conv_depthwise_blocked::conv(
                xp as *const f32,
                wp as *const f32,
                out as *mut f32,
                &plan,
                threads,
                epi,
            )
        };
        return Ok(epi.is_some());
    }
    if f32s && let Some(plan) = crate::conv_depthwise::Plan::new(xs, ws, spec, sout) {
        // Safety: contiguous f32 operands (T is f32) of the checked shapes; `out` holds
        // `total` elements and overlaps neither.
        unsafe {
            crate::conv_depthwise::conv(
                xp as *const f32,
                wp as *const f32,
                out as *mut f32,
                &plan,
                &crate::conv_depthwise::F32,
                threads,
                epi,
            )
        };
        return Ok(epi.is_some());
    }
    let threads = useful;
    let (xp, wp, out) = (SendPtr(xp as *mut T), SendPtr(wp as *mut T), SendPtr(out));
    // The direct path's scratch, next to the planes' own sizes.
    let direct_fits = || {
        Direct::scratch_elems(&geo.kd, &geo.sout, spec.stride, spec.dilation)
            .is_some_and(|e| e <= s_in.saturating_add(ys).saturating_mul(4).saturating_add(1 << 16))
    };
    if cg == 1 && direct_fits() {
        // Direct: one output plane per unit.
        let direct = Direct::new(
            &geo.sin,
            &geo.kd,
            &geo.sout,
            spec.stride,
            spec.pad_before,
            spec.dilation,
        );
        // Planes per unit: about 64K multiply-adds (a 7 × 7 stage's planes are a few hundred
        // each).
        let planes = n * o;
        let per = (1usize << 16).div_ceil(ys * ks).clamp(1, planes);
        par_units(planes.div_ceil(per), threads, Scratch::default, |scratch, unit| {
            for u in unit * per..((unit + 1) * per).min(planes) {
                let (b, oc) = (u / o, u % o);
                // Safety: plane `(b, oc / og)` of x, weights of `oc`, output plane `u`: all in
                // bounds (contiguous operands of the checked shapes); units write disjoint
                // planes.
                unsafe {
                    let x = std::slice::from_raw_parts((xp.get() as *const T).add((b * c + oc / og) * s_in), s_in);
                    let wk = std::slice::from_raw_parts((wp.get() as *const T).add(oc * ks), ks);
                    let dst = std::slice::from_raw_parts_mut(out.get().add(u * ys), ys);
                    direct.plane(x, wk, dst, scratch);
                }
            }
        });
        return Ok(false);
    }
    let pointwise = spec.pointwise(&geo);
    let kdim = cg * ks;
    // Fewer output positions than kernel taps (a weight gradient's convolution, whose kernel
    // is the output-sized cotangent): patches position by position, each a run of whole
    // kernel rows copied from the input, instead of the tap-major matrix's short segments.
    let by_position = !pointwise && ys < ks;
    // Column tiles: bounded scratch, and enough units for the threads.
    let max_tile = if pointwise {
        ys
    } else {
        (TILE_ELEMS / kdim).max(MIN_TILE)
    };
    // Small planes (a deep CNN stage's 4 × 4 or 1 × 1): several images per product, their
    // patches side by side — one image's product is a matrix-vector product re-reading the
    // weights (pointwise convolutions too: their planes are not adjacent in NCHW). At least
    // one block of images per thread.
    let patch_tile = (TILE_ELEMS / kdim).max(MIN_TILE);
    let unit_kernel = geo.kd.iter().all(|&k| k == 1);
    let group = if ys * 2 >= patch_tile || ys >= MIN_PLANE || unit_kernel && !pointwise {
        1
    } else {
        (patch_tile / ys).min(n.div_ceil(threads)).max(1)
    };
    if group > 1 {
        let blocks = n.div_ceil(group);
        let units = blocks * g;
        let cols_n = group * ys;
        let par = product_parallelism(units, threads);
        par_units(
            units,
            threads,
            || (Pooled::<T>::take(kdim * cols_n), Pooled::<T>::take(og * cols_n)),
            |(cols, prod), u| {
                let (blk, grp) = (u / g, u % g);
                let (b0, b1) = (blk * group, ((blk + 1) * group).min(n));
                let m = (b1 - b0) * ys;
                for (j, b) in (b0..b1).enumerate() {
                    let xg = (xp.get() as *const T).wrapping_add((b * c + grp * cg) * s_in);
                    // Safety: the group's `cg` input planes of batch `b`, in bounds.
                    let planes = unsafe { std::slice::from_raw_parts(xg, cg * s_in) };
                    let dst = &mut cols[j * ys * kdim..][..ys * kdim];
                    patches_by_position(&geo, spec.dilation[sp - 1], planes, cg, 0, ys, dst);
                }
                let w = (wp.get() as *const T).wrapping_add(grp * og * kdim);
                if og < 32 && m >= 4 * og && matches!(par, Parallelism::None) {
                    // Few output channels (LeNet's 16): the product transposed, positions
                    // along the register tile's long side, written column-major into `prod`.
                    let (lhs, rhs) = (
                        Mat {
                            ptr: cols.as_ptr(),
                            rs: kdim as isize,
                            cs: 1,
                        },
                        Mat {
                            ptr: w,
                            rs: 1,
                            cs: kdim as isize,
                        },
                    );
                    // Safety: `prod` holds og × m elements (position i, channel j at
                    // j·m + i); operands in bounds; kdim > 0.
                    unsafe {
                        crate::contraction::gemm_strided(m, og, kdim, prod.as_mut_ptr(), 1, m as isize, lhs, rhs)
                    };
                } else {
                    let lhs = Mat {
                        ptr: w,
                        rs: kdim as isize,
                        cs: 1,
                    };
                    let rhs = Mat {
                        ptr: cols.as_ptr(),
                        rs: 1,
                        cs: kdim as isize,
                    };
                    // Safety: `prod` holds og × m elements; operands in bounds.
                    unsafe { gemm_raw(og, m, kdim, prod.as_mut_ptr(), m as isize, lhs, rhs, par) };
                }
                for (j, b) in (b0..b1).enumerate() {
                    for oc in 0..og {
                        // Safety: output plane (b, grp·og + oc): in bounds, written by this
                        // unit only.
                        let dst =
                            unsafe { std::slice::from_raw_parts_mut(out.get().add((b * o + grp * og + oc) * ys), ys) };
                        dst.copy_from_slice(&prod[oc * m + j * ys..][..ys]);
                    }
                }
            },
        );
        return Ok(false);
    }
    let want_tiles = threads.div_ceil(n * g).min(ys.div_ceil(MIN_TILE));
    let ntiles = ys.div_ceil(max_tile).max(want_tiles).max(1);
    let tile = ys.div_ceil(ntiles).next_multiple_of(16).min(ys);
    let ntiles = ys.div_ceil(tile);
    let units = n * g * ntiles;
    let par = product_parallelism(units, threads);
    par_units(
        units,
        threads,
        || Pooled::<T>::take(if pointwise { 0 } else { kdim * tile }),
        |scratch, u| {
            let (b, grp, t) = (u / (g * ntiles), (u / ntiles) % g, u % ntiles);
            let (y0, y1) = (t * tile, ((t + 1) * tile).min(ys));
            let yc = y1 - y0;
            let xg = (xp.get() as *const T).wrapping_add((b * c + grp * cg) * s_in);
            let rhs = if pointwise {
                Mat {
                    ptr: xg.wrapping_add(y0),
                    rs: s_in as isize,
                    cs: 1,
                }
            } else if by_position {
                let cols = &mut scratch[..kdim * yc];
                // Safety: the group's `cg` input planes of batch `b`, in bounds.
                unsafe {
                    patches_by_position(
                        &geo,
                        spec.dilation[sp - 1],
                        std::slice::from_raw_parts(xg, cg * s_in),
                        cg,
                        y0,
                        y1,
                        cols,
                    )
                };
                Mat {
                    ptr: cols.as_ptr(),
                    rs: 1,
                    cs: kdim as isize,
                }
            } else {
                let cols = &mut scratch[..kdim * yc];
                // Safety: the group's `cg` input planes of batch `b`, in bounds.
                unsafe { im2col(&geo, std::slice::from_raw_parts(xg, cg * s_in), cg, y0, y1, cols) };
                Mat {
                    ptr: cols.as_ptr(),
                    rs: yc as isize,
                    cs: 1,
                }
            };
            let lhs = Mat {
                ptr: (wp.get() as *const T).wrapping_add(grp * og * kdim),
                rs: kdim as isize,
                cs: 1,
            };
            // Safety: output rows `(b, grp·og ..)` columns `y0..y1`: in bounds, disjoint per
            // unit; operands in bounds as above.
            unsafe {
                let dst = out.get().add((b * o + grp * og) * ys + y0);
                gemm_raw(og, yc, kdim, dst, ys as isize, lhs, rhs, par);
            }
        },
    );
    Ok(false)
}

/// The Winograd path's shape of this convolution, where [`crate::winograd::applies`]: 2-d,
/// 3 × 3, stride 1, undilated, one group.
fn winograd_shape(geo: &Geo, d: &Dims, spec: &ConvSpec) -> Option<crate::winograd::Shape> {
    let plain = geo.kd == [3, 3] && spec.stride == [1, 1] && spec.dilation == [1, 1] && d.g == 1;
    let s = crate::winograd::Shape {
        n: d.n,
        c: d.c,
        k: d.o,
        h: *geo.sin.first()?,
        w: *geo.sin.get(1)?,
        pt: spec.pad_before[0],
        pl: spec.pad_before[1],
        oh: geo.sout[0],
        ow: geo.sout[1],
    };
    (plain && crate::winograd::applies(&s)).then_some(s)
}

/// How each of `units` GEMMs may split: gemm splits a product itself only when there are
/// fewer units than threads.
fn product_parallelism(units: usize, threads: usize) -> Parallelism {
    if units < threads && threads > 1 {
        Parallelism::Rayon(threads.div_ceil(units))
    } else {
        Parallelism::None
    }
}

/// The patch matrix of [`im2col`] stored by output position: row `y - y0` (position `y`)
/// holds, at `ci · ks + kf`, the input element kernel position `kf` of plane `ci` reads there
/// (0 in the padding) — so each kernel row is one copy of `kw` input elements when the last
/// axis is undilated and inside the input. `dil` is the last axis's dilation.
fn patches_by_position<T: Elem>(g: &Geo, dil: usize, x: &[T], cg: usize, y0: usize, y1: usize, cols: &mut [T]) {
    let (ow, kw, krows) = (g.ow(), g.kw(), g.krows());
    let kdim = cg * g.ks;
    for (y, patch) in (y0..y1).zip(cols.chunks_exact_mut(kdim)) {
        let (r, col) = (y / ow, y % ow);
        // Taps of the last axis that read the input at this column, and where.
        let first = g.cols.iter().position(|t| (t.lo..t.hi).contains(&col));
        for ci in 0..cg {
            let plane = &x[ci * g.s_in..][..g.s_in];
            for ko in 0..krows {
                let dst = &mut patch[ci * g.ks + ko * kw..][..kw];
                let Some(off) = g.row_offset(r, ko) else {
                    dst.fill(T::ZERO);
                    continue;
                };
                let at = |t: &Tap| (off as isize + (col * g.step) as isize + t.shift) as usize;
                let whole = dil == 1 && first == Some(0) && (g.cols[kw - 1].lo..g.cols[kw - 1].hi).contains(&col);
                if whole {
                    let a = at(&g.cols[0]);
                    copy_short(dst, &plane[a..a + kw]);
                } else {
                    for (d, t) in dst.iter_mut().zip(&g.cols) {
                        *d = if (t.lo..t.hi).contains(&col) {
                            plane[at(t)]
                        } else {
                            T::ZERO
                        };
                    }
                }
            }
        }
    }
}

/// The part of the kernel window that reads the input: per spatial axis the taps `lo .. lo +
/// kd` that some output position reads inside the input. Taps outside it read padding for
/// every output (a 3 × 3 kernel with padding 1 on a 1 × 1 plane — the deep layers of a CNN on
/// small images — reads the input with its centre tap only), so the convolution equals the
/// one with the cropped kernel and the padding reduced to match, on 1/9 of the work there.
pub(crate) struct Crop {
    pub lo: Vec<usize>,
    pub kd: Vec<usize>,
    pub pad_before: Vec<usize>,
    pub pad_after: Vec<usize>,
}

impl Crop {
    /// The crop of this convolution's kernel, `None` when every tap reads the input somewhere
    /// (or none does on some axis: the output is then the bias alone, left to the plain path).
    pub(crate) fn of(geo: &Geo, spec: &ConvSpec) -> Option<Crop> {
        let sp = geo.sp();
        let mut c = Crop {
            lo: vec![0; sp],
            kd: vec![0; sp],
            pad_before: vec![0; sp],
            pad_after: vec![0; sp],
        };
        for i in 0..sp {
            let (s, d, p) = (spec.stride[i], spec.dilation[i], spec.pad_before[i] as isize);
            let reads = |kk: usize| {
                (0..geo.sout[i]).any(|yy| {
                    let pos = (yy * s + kk * d) as isize - p;
                    pos >= 0 && (pos as usize) < geo.sin[i]
                })
            };
            let lo = (0..geo.kd[i]).find(|&kk| reads(kk))?;
            let hi = (lo..geo.kd[i]).rev().find(|&kk| reads(kk))? + 1;
            let pb = spec.pad_before[i].checked_sub(lo * d)?;
            let span = (hi - lo - 1) * d + 1;
            let pa = ((geo.sout[i] - 1) * s + span).checked_sub(geo.sin[i] + pb)?;
            (c.lo[i], c.kd[i], c.pad_before[i], c.pad_after[i]) = (lo, hi - lo, pb, pa);
        }
        (c.kd != geo.kd).then_some(c)
    }

    /// The attributes of the cropped convolution.
    pub(crate) fn spec<'a>(&'a self, spec: &ConvSpec<'a>) -> ConvSpec<'a> {
        ConvSpec {
            stride: spec.stride,
            pad_before: &self.pad_before,
            pad_after: &self.pad_after,
            dilation: spec.dilation,
            groups: spec.groups,
        }
    }

    /// Kernel offset pairs: for each element of a cropped kernel window (row-major over
    /// `self.kd`), its offset in the full window `kd`.
    fn offsets(&self, kd: &[usize]) -> Vec<usize> {
        let n: usize = self.kd.iter().product();
        (0..n)
            .map(|mut j| {
                let (mut at, mut scale) = (0, 1);
                for i in (0..kd.len()).rev() {
                    at += (j % self.kd[i] + self.lo[i]) * scale;
                    j /= self.kd[i];
                    scale *= kd[i];
                }
                at
            })
            .collect()
    }

    /// `w` (`[A, B, *kd]`, dense) restricted to the cropped window: `[A, B, *self.kd]`.
    ///
    /// A deep layer's 512 × 512 × 3 × 3 kernel is 9.4 MB, read from memory (a training step's
    /// optimizer has just written it): the windows are copied in blocks split across
    /// `threads`, into a vector of the final size (collecting from an iterator of unknown
    /// length grew it by doubling).
    pub(crate) fn kernel<T: Copy + Send + Sync>(&self, w: &[T], kd: &[usize], zero: T, threads: usize) -> Vec<T> {
        let (ks, offs) = (kd.iter().product::<usize>().max(1), self.offsets(kd));
        let (windows, k) = (w.len() / ks, offs.len());
        let mut out = vec![zero; windows * k];
        let dst = crate::contraction::SendPtr(out.as_mut_ptr());
        by_windows(windows, ks, threads, |a, b| {
            // Safety: windows a..b of `out`, written by this block only.
            let dst = unsafe { std::slice::from_raw_parts_mut(dst.get().add(a * k), (b - a) * k) };
            for (d, win) in dst.chunks_exact_mut(k.max(1)).zip(w[a * ks..b * ks].chunks_exact(ks)) {
                for (x, &o) in d.iter_mut().zip(&offs) {
                    *x = win[o];
                }
            }
        });
        out
    }

    /// The full `[A, B, *kd]` gradient from the cropped one: zero outside the window, each
    /// window written once (zeros, then its cropped taps, while it is in cache), blocks of
    /// windows split across `threads`.
    pub(crate) fn uncrop<T: Copy + Send + Sync>(
        &self,
        small: &[T],
        kd: &[usize],
        zero: T,
        out: &mut [T],
        threads: usize,
    ) {
        let (ks, offs) = (kd.iter().product::<usize>().max(1), self.offsets(kd));
        let k = offs.len().max(1);
        let windows = (out.len() / ks).min(small.len() / k);
        let dst = crate::contraction::SendPtr(out.as_mut_ptr());
        by_windows(windows, ks, threads, |a, b| {
            // Safety: windows a..b of `out`, written by this block only.
            let dst = unsafe { std::slice::from_raw_parts_mut(dst.get().add(a * ks), (b - a) * ks) };
            for (win, part) in dst.chunks_exact_mut(ks).zip(small[a * k..b * k].chunks_exact(k)) {
                win.fill(zero);
                for (&o, &v) in offs.iter().zip(part) {
                    win[o] = v;
                }
            }
        });
    }
}

/// `f(a, b)` for blocks of windows `a..b` (about 64K elements of `ks` each), over `threads`
/// when there are at least four blocks.
fn by_windows(windows: usize, ks: usize, threads: usize, f: impl Fn(usize, usize) + Sync) {
    let per = ((1usize << 16) / ks.max(1)).max(1);
    let blocks = windows.div_ceil(per);
    let threads = if blocks < 4 { 1 } else { threads };
    crate::par::par_units(blocks, threads, || (), |_, u| f(u * per, ((u + 1) * per).min(windows)));
}

/// A dense view of `shape`.
pub(crate) fn dense(shape: &[usize]) -> View {
    let mut strides = vec![1isize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1] as isize;
    }
    View {
        offset: 0,
        shape: shape.to_vec(),
        strides,
    }
}

/// `dst = src` (equal lengths) for a kernel row: common widths as fixed-size moves (a
/// `memmove` call costs more than copying 3, 5 or 7 elements).
#[inline(always)]
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    fn fixed<T: Copy, const N: usize>(dst: &mut [T], src: &[T]) {
        let s: &[T; N] = src.try_into().expect("equal lengths");
        let d: &mut [T; N] = dst.try_into().expect("equal lengths");
        *d = *s;
    }
    match dst.len() {
        1 => dst[0] = src[0],
        2 => fixed::<T, 2>(dst, src),
        3 => fixed::<T, 3>(dst, src),
        4 => fixed::<T, 4>(dst, src),
        5 => fixed::<T, 5>(dst, src),
        7 => fixed::<T, 7>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

/// The elements of view `v` of `base` as one dense row-major run: in place where the view is
/// dense, else packed into `keep` (which must outlive the pointer's use).
///
/// # Safety
/// Every element of the view is in bounds of `base`.
pub(crate) unsafe fn dense_run<T: Copy>(base: *const T, v: &View, keep: &mut Vec<T>) -> *const T {
    if v.is_dense() {
        base.wrapping_offset(v.offset)
    } else {
        // Safety: the caller's contract.
        *keep = unsafe { pack(base, v) };
        keep.as_ptr()
    }
}

/// A dense row-major copy of a strided view.
///
/// # Safety
/// Every element of the view is in bounds of `base`.
pub(crate) unsafe fn pack<T: Copy>(base: *const T, v: &View) -> Vec<T> {
    let n = v.len();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let r = v.shape.len();
    if r == 0 {
        // Safety: the caller's contract.
        out.push(unsafe { *base.offset(v.offset) });
        return out;
    }
    let (last_n, last_s) = (v.shape[r - 1], v.strides[r - 1]);
    let mut idx = vec![0usize; r - 1];
    let mut off = v.offset;
    loop {
        for j in 0..last_n {
            // Safety: the caller's contract.
            out.push(unsafe { *base.offset(off + j as isize * last_s) });
        }
        let mut d = r - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            off += v.strides[d];
            if idx[d] < v.shape[d] {
                break;
            }
            off -= v.strides[d] * v.shape[d] as isize;
            idx[d] = 0;
        }
    }
}

/// The pieces of output positions `y0..y1` that lie on one output row: `(r, c0, c1)` covers
/// positions `r · ow + c0 .. r · ow + c1`.
pub(crate) fn row_pieces(ow: usize, y0: usize, y1: usize) -> Vec<(usize, usize, usize)> {
    let mut pieces = Vec::with_capacity((y1 - y0) / ow.max(1) + 2);
    let mut y = y0;
    while y < y1 {
        let (r, c0) = (y / ow, y % ow);
        let c1 = ow.min(c0 + (y1 - y));
        pieces.push((r, c0, c1));
        y += c1 - c0;
    }
    pieces
}

/// For kernel row `ko`, the input-row offset each of `pieces` reads ([`Geo::row_offset`]).
pub(crate) fn piece_offsets(g: &Geo, pieces: &[(usize, usize, usize)], ko: usize, offs: &mut Vec<Option<usize>>) {
    offs.clear();
    offs.extend(pieces.iter().map(|&(r, ..)| g.row_offset(r, ko)));
}

/// The patch matrix of output positions `y0..y1` (flat over the output plane) for `cg` input
/// planes: row `ci · ks + kf` (kernel position `kf`, row-major over the kernel) holds, for each
/// position, the input element that tap reads (0 in the padding).
pub(crate) fn im2col<T: Copy + Default>(g: &Geo, x: &[T], cg: usize, y0: usize, y1: usize, cols: &mut [T]) {
    let yc = y1 - y0;
    let (ow, kw, krows) = (g.ow(), g.kw(), g.krows());
    // Output rows and input-row offsets are worked out once per kernel row, not per copy.
    let pieces = row_pieces(ow, y0, y1);
    let mut offs = Vec::with_capacity(pieces.len());
    for ko in 0..krows {
        piece_offsets(g, &pieces, ko, &mut offs);
        for ci in 0..cg {
            let plane = &x[ci * g.s_in..][..g.s_in];
            for (kx, &Tap { lo, hi, shift, .. }) in g.cols.iter().enumerate() {
                let row = &mut cols[(ci * g.ks + ko * kw + kx) * yc..][..yc];
                let mut at = 0;
                for (&(_, c0, c1), off) in pieces.iter().zip(&offs) {
                    let seg = &mut row[at..at + (c1 - c0)];
                    at += c1 - c0;
                    match *off {
                        None => seg.fill(T::default()),
                        Some(off) => {
                            let (a, b) = (lo.clamp(c0, c1), hi.clamp(c0, c1));
                            seg[..a - c0].fill(T::default());
                            seg[b - c0..].fill(T::default());
                            let mid = &mut seg[a - c0..b - c0];
                            if a < b {
                                let first = (off as isize + (a * g.step) as isize + shift) as usize;
                                gather_step(mid, &plane[first..first + (b - a - 1) * g.step + 1], g.step);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What the convolution paths' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use super::ConvSpec;

    /// A depthwise convolution's operands (small integers, so f32 sums are exact) and its
    /// value by the definition.
    pub(crate) struct Depthwise {
        pub xs: [usize; 4],
        pub ws: [usize; 4],
        pub sout: [usize; 2],
        stride: [usize; 2],
        pad_before: [usize; 2],
        pad_after: [usize; 2],
        dilation: [usize; 2],
        pub x: Vec<f32>,
        pub w: Vec<f32>,
        pub want: Vec<f32>,
    }

    impl Depthwise {
        /// `n` images of `c` channels of `h × w`, `og` output channels per input channel,
        /// a square `kh × kw` kernel with stride `s`, padding `pb` before and `pa` after,
        /// dilation `d` (on both axes).
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn new(
            [n, c, og, h, w]: [usize; 5],
            [kh, kw]: [usize; 2],
            s: usize,
            pb: usize,
            pa: usize,
            d: usize,
        ) -> Depthwise {
            let o = c * og;
            let (xs, ws) = ([n, c, h, w], [o, 1, kh, kw]);
            let x: Vec<f64> = (0..n * c * h * w).map(|i| ((i * 7 + 3) % 11) as f64 - 5.0).collect();
            let wt: Vec<f64> = (0..o * kh * kw).map(|i| ((i * 5 + 1) % 7) as f64 - 3.0).collect();
            let out = |i: usize, k: usize| (i + pb + pa - d * (k - 1) - 1) / s + 1;
            let mut case = Depthwise {
                xs,
                ws,
                sout: [out(h, kh), out(w, kw)],
                stride: [s, s],
                pad_before: [pb, pb],
                pad_after: [pa, pa],
                dilation: [d, d],
                x: x.iter().map(|&v| v as f32).collect(),
                w: wt.iter().map(|&v| v as f32).collect(),
                want: Vec::new(),
            };
            case.want = reference(&x, xs, &wt, ws, &case.spec(), case.sout)
                .iter()
                .map(|&v| v as f32)
                .collect();
            case
        }

        pub(crate) fn spec(&self) -> ConvSpec<'_> {
            ConvSpec {
                stride: &self.stride,
                pad_before: &self.pad_before,
                pad_after: &self.pad_after,
                dilation: &self.dilation,
                groups: self.xs[1],
            }
        }
    }

    /// The 2-d convolution by its definition in f64, with groups and dilation.
    pub(crate) fn reference(
        x: &[f64],
        xs: [usize; 4],
        w: &[f64],
        ws: [usize; 4],
        spec: &ConvSpec,
        sout: [usize; 2],
    ) -> Vec<f64> {
        let ([n, c, h, wi], [o, cg, kh, kw]) = (xs, ws);
        let og = o / spec.groups;
        let mut out = vec![0f64; n * o * sout[0] * sout[1]];
        for b in 0..n {
            for oc in 0..o {
                for yy in 0..sout[0] {
                    for xx in 0..sout[1] {
                        let mut acc = 0.0;
                        for ci in 0..cg {
                            let ic = oc / og * cg + ci;
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy = (yy * spec.stride[0] + ky * spec.dilation[0]) as isize
                                        - spec.pad_before[0] as isize;
                                    let ix = (xx * spec.stride[1] + kx * spec.dilation[1]) as isize
                                        - spec.pad_before[1] as isize;
                                    if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wi {
                                        acc += x[((b * c + ic) * h + iy as usize) * wi + ix as usize]
                                            * w[((oc * cg + ci) * kh + ky) * kw + kx];
                                    }
                                }
                            }
                        }
                        out[((b * o + oc) * sout[0] + yy) * sout[1] + xx] = acc;
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The convolution by its definition in f64 (2-d, undilated): `x[xs] ⋆ w[ws]` with
    /// `groups`, into an output of `sout`.
    fn reference(
        (x, xs): (&[f64], [usize; 4]),
        (w, ws): (&[f64], [usize; 4]),
        stride: [usize; 2],
        pad: [usize; 2],
        groups: usize,
        sout: [usize; 2],
    ) -> Vec<f64> {
        let spec = ConvSpec {
            stride: &stride,
            pad_before: &pad,
            pad_after: &pad,
            dilation: &[1, 1],
            groups,
        };
        testing::reference(x, xs, w, ws, &spec, sout)
    }

    /// [`conv`] on dense operands, 2 threads, no cache.
    fn run<T: Elem>(xs: &[usize], x: &[T], ws: &[usize], w: &[T], out_shape: &[usize], spec: &ConvSpec) -> Vec<T> {
        let mut out = vec![T::ZERO; out_shape.iter().product()];
        // Safety: dense operands of their shapes; `out` holds the output.
        unsafe {
            conv(
                &dense(xs),
                x.as_ptr(),
                &dense(ws),
                w.as_ptr(),
                out.as_mut_ptr(),
                out_shape,
                spec,
                2,
                None,
            )
        }
        .unwrap();
        out
    }

    /// Forward convolutions whose kernel reaches past what the input offers (cropped to the
    /// taps that read it) against the definition in f64, and the crops themselves; small
    /// planes of several images in one product.
    #[test]
    fn cropped_kernels_give_the_same_convolution() {
        // (x, w, stride, pad before, pad after, crop)
        // The last three: no crop; a pointwise convolution of small planes, images grouped.
        type Case = ([usize; 4], [usize; 4], usize, usize, usize, Option<Vec<usize>>);
        let cases: [Case; 6] = [
            ([3, 5, 1, 1], [4, 5, 3, 3], 1, 1, 1, Some(vec![1, 1])),
            ([2, 3, 2, 2], [4, 3, 5, 5], 1, 2, 2, Some(vec![3, 3])),
            ([2, 2, 1, 6], [3, 2, 3, 3], 2, 1, 1, Some(vec![1, 3])),
            ([1, 2, 4, 4], [3, 2, 3, 3], 1, 1, 1, None),
            ([5, 3, 2, 2], [4, 3, 1, 1], 1, 0, 0, None),
            // Grouped images, few output channels: the transposed product.
            ([6, 3, 3, 3], [2, 3, 3, 3], 1, 1, 1, None),
        ];
        for (i, (xs, ws, st, pb, pa, want_crop)) in cases.into_iter().enumerate() {
            let (stride, pad_before, pad_after, dilation) = ([st; 2], [pb; 2], [pa; 2], [1; 2]);
            let spec = ConvSpec {
                stride: &stride,
                pad_before: &pad_before,
                pad_after: &pad_after,
                dilation: &dilation,
                groups: 1,
            };
            let (geo, _) = geometry(&xs, &ws, &spec).unwrap();
            assert_eq!(Crop::of(&geo, &spec).map(|c| c.kd), want_crop, "case {i}");
            let n = |s: &[usize]| s.iter().product::<usize>();
            let x: Vec<f64> = (0..n(&xs)).map(|j| ((j * 7 + i) % 11) as f64 - 5.0).collect();
            let w: Vec<f64> = (0..n(&ws)).map(|j| ((j * 5 + i) % 9) as f64 - 4.0).collect();
            let out_shape = [xs[0], ws[0], geo.sout[0], geo.sout[1]];
            let want = reference((&x, xs), (&w, ws), [st; 2], [pb; 2], 1, [geo.sout[0], geo.sout[1]]);
            let got = run(&xs, &x, &ws, &w, &out_shape, &spec);
            assert_eq!(got, want, "case {i}");
        }
    }

    /// A cropped kernel and its uncrop, split across threads in blocks of windows (here 256 ×
    /// 128 windows: five blocks), against the windows read one by one: one tap (a 3 × 3
    /// kernel on 1 × 1 planes) and a 1 × 3 crop.
    #[test]
    fn crop_copies_split_across_threads() {
        for (xs, stride, want) in [([1, 128, 1, 1], 1, vec![1, 1]), ([1, 128, 1, 6], 2, vec![1, 3])] {
            let ws = [256, 128, 3, 3];
            let (st, pad) = ([stride; 2], [1; 2]);
            let spec = ConvSpec {
                stride: &st,
                pad_before: &pad,
                pad_after: &pad,
                dilation: &[1, 1],
                groups: 1,
            };
            let (geo, _) = geometry(&xs, &ws, &spec).unwrap();
            let crop = Crop::of(&geo, &spec).unwrap();
            assert_eq!(crop.kd, want);
            let w: Vec<f32> = (0..256 * 128 * 9).map(|j| j as f32).collect();
            let offs = crop.offsets(&[3, 3]);
            let naive: Vec<f32> = w.chunks_exact(9).flat_map(|win| offs.iter().map(|&o| win[o])).collect();
            for threads in [1, 2, 3] {
                let small = crop.kernel(&w, &[3, 3], 0.0, threads);
                assert_eq!(small, naive, "threads {threads}");
                let mut full = vec![-1.0; w.len()];
                crop.uncrop(&small, &[3, 3], 0.0, &mut full, threads);
                for (j, (&f, &v)) in full.iter().zip(&w).enumerate() {
                    let kept = offs.contains(&(j % 9));
                    assert_eq!(f, if kept { v } else { 0.0 }, "threads {threads}, element {j}");
                }
            }
        }
    }

    /// Depthwise and single-input-channel convolutions (the direct path): strides 1 to 3,
    /// asymmetric padding, a channel multiplier, planes from 1 × 1 to 9 × 11, against the
    /// definition in f64, for f32 and f64 operands.
    #[test]
    fn direct_convolutions_match_the_definition() {
        // (n, c, o, h, w, kh, kw, stride, pad before, pad after)
        let cases = [
            (2, 4, 4, 7, 7, 3, 3, [1, 1], [1, 1], [1, 1]),
            (1, 3, 6, 9, 11, 3, 3, [2, 2], [1, 1], [1, 1]),
            (2, 2, 2, 6, 5, 5, 3, [1, 3], [2, 0], [1, 2]),
            (1, 1, 3, 8, 8, 5, 5, [1, 1], [0, 0], [0, 0]),
            (3, 5, 5, 1, 1, 3, 3, [1, 1], [1, 1], [1, 1]),
        ];
        for (i, (n, c, o, h, w, kh, kw, st, pb, pa)) in cases.into_iter().enumerate() {
            let dil = [1, 1];
            let spec = ConvSpec {
                stride: &st,
                pad_before: &pb,
                pad_after: &pa,
                dilation: &dil,
                groups: c,
            };
            let (xs, ws) = ([n, c, h, w], [o, 1, kh, kw]);
            let (geo, _) = geometry(&xs, &ws, &spec).unwrap();
            let (oh, ow) = (geo.sout[0], geo.sout[1]);
            let x: Vec<f64> = (0..n * c * h * w).map(|j| ((j * 7 + i) % 13) as f64 - 6.0).collect();
            let wt: Vec<f64> = (0..o * kh * kw).map(|j| ((j * 5 + i) % 7) as f64 - 3.0).collect();
            let want = reference((&x, xs), (&wt, ws), st, pb, c, [oh, ow]);
            let out_shape = [n, o, oh, ow];
            let got = run(&xs, &x, &ws, &wt, &out_shape, &spec);
            assert_eq!(got, want, "case {i}, f64");
            let (x32, w32): (Vec<f32>, Vec<f32>) = (
                x.iter().map(|&v| v as f32).collect(),
                wt.iter().map(|&v| v as f32).collect(),
            );
            let got32 = run(&xs, &x32, &ws, &w32, &out_shape, &spec);
            // Small integers: exact in f32 too.
            assert_eq!(
                got32.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                want,
                "case {i}, f32"
            );
        }
    }
}
