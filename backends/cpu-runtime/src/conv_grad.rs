//! The gradient of `y = conv(x, w) (+ b)` for eager autograd, the way PyTorch and oneDNN
//! compute it on CPUs: per tile of output positions,
//!
//! - `dw += dy_tile · im2col(x)_tileᵀ` (the forward's patch matrix, multiplied by the
//!   cotangent instead of the weights);
//! - `dx += col2im(wᵀ · dy_tile)` (the patch-shaped product scattered back onto the input);
//! - `db = Σ dy` over batch and positions.
//!
//! The IR's rules (`oar_ir::ops::conv_grad`) express the same gradients as convolutions of a
//! dilated, padded cotangent with flipped weights — right for every backend and for compiled
//! graphs, but on a CPU the input gradient then reads a patch matrix mostly made of the zero
//! padding (LeNet's second layer: 400 × 196 patches per image where this path forms 150 × 100).
//!
//! Threads take fixed ranges of the batch, each summing its weight gradient separately; the
//! ranges' sums are added in order, so results do not depend on which thread ran what.

use crate::contraction::{Elem, Mat, SendPtr, gemm_into, gemm_parallelism, written_zeros};
use crate::conv::{ConvSpec, Crop, Dims, Geo, geometry, im2col, piece_offsets, row_pieces};
use crate::par::par_units;
use crate::scratch::Pooled;
use oar_ir::ops::{Conv, ConvTranspose, ConvWeightGrad};
use oar_ir::{DType, TensorData};

/// Patch-matrix elements per tile (per thread), as the forward's.
const TILE_ELEMS: usize = 1 << 17;

/// `[dx, dw, db]` of `y = conv(x, w) + b` for the cotangent `dy`, each computed when `wants`
/// asks (`db` is the bias gradient, `[O]`, whether or not the forward had a bias).
/// `Ok(None)`: no native path for these operands (grouped convolutions, dtypes other than
/// f32/f64) — use the IR's gradient rules.
pub fn conv_vjp(
    x: &TensorData,
    w: &TensorData,
    dy: &TensorData,
    conv: &Conv,
    wants: [bool; 3],
    threads: usize,
) -> Result<Option<[Option<TensorData>; 3]>, String> {
    let (geo, d) = geometry(x.shape(), w.shape(), &ConvSpec::of(conv))?;
    let dtype = x.dtype();
    if d.g != 1 || !matches!(dtype, DType::F32 | DType::F64) {
        return Ok(None);
    }
    let y_shape = [&[d.n, d.o][..], &geo.sout].concat();
    if w.dtype() != dtype || dy.dtype() != dtype || dy.shape() != y_shape {
        return Err(format!(
            "conv gradient: cotangent {:?} ({}) for x {:?} ({dtype}), w {:?} ({}): expected {y_shape:?}",
            dy.shape(),
            dy.dtype(),
            x.shape(),
            w.shape(),
            w.dtype()
        ));
    }
    let spec = ConvSpec::of(conv);
    if let Some(crop) = Crop::of(&geo, &spec) {
        // Taps that only ever meet the padding: the cropped convolution's gradients, a zero
        // weight gradient outside the window.
        let small = Conv {
            pad_before: crop.pad_before.clone(),
            pad_after: crop.pad_after.clone(),
            ..conv.clone()
        };
        let small_w = recrop(w, &crop, &geo.kd, false)?;
        let Some([dx, dw, db]) = conv_vjp(x, &small_w, dy, &small, wants, threads)? else {
            return Ok(None);
        };
        let dw = dw.map(|t| recrop(&t, &crop, &geo.kd, true)).transpose()?;
        return Ok(Some([dx, dw, db]));
    }
    fn typed<T: Elem + bytemuck::Pod + oar_ir::Element>(
        geo: &Geo,
        d: Dims,
        (x, w, dy): (&TensorData, &TensorData, &TensorData),
        wants: [bool; 3],
        threads: usize,
        direct: Option<crate::conv_wgrad::Shape>,
    ) -> Result<[Option<TensorData>; 3], String> {
        fn slice<T: bytemuck::Pod>(t: &TensorData) -> Result<&[T], String> {
            if t.bytes().is_empty() {
                return Ok(&[]);
            }
            bytemuck::try_cast_slice(t.bytes()).map_err(|e| format!("conv gradient: unaligned operand: {e}"))
        }
        let (xs, ws, dys) = (slice::<T>(x)?, slice::<T>(w)?, slice::<T>(dy)?);
        let [want_x, want_w, want_b] = wants;
        let mut dx = want_x.then(|| written_zeros(xs.len(), T::ZERO));
        let mut dw = want_w.then(|| vec![T::ZERO; ws.len()]);
        // Small f32 planes: the weight gradient without a patch matrix.
        let direct = direct.filter(|_| want_w && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>());
        if let (Some(shape), Some(dw)) = (direct, dw.as_deref_mut()) {
            crate::conv_wgrad::weight_grad(
                shape,
                bytemuck::cast_slice(xs),
                bytemuck::cast_slice(dys),
                bytemuck::cast_slice_mut(dw),
                threads,
            );
        }
        let dw_here = if direct.is_some() { None } else { dw.as_deref_mut() };
        if want_x || dw_here.is_some() {
            grads(geo, d, xs, ws, dys, dx.as_deref_mut(), dw_here, threads);
        }
        let db = want_b.then(|| {
            let mut db = vec![T::ZERO; d.o];
            for (i, plane) in dys.chunks_exact(d.ys.max(1)).enumerate() {
                let acc = &mut db[i % d.o];
                for &v in plane {
                    *acc += v;
                }
            }
            db
        });
        let wrap = |v: Option<Vec<T>>, shape: &[usize]| {
            v.map(|v| TensorData::from_vec(shape.to_vec(), v).map_err(|e| e.to_string()))
                .transpose()
        };
        Ok([wrap(dx, x.shape())?, wrap(dw, w.shape())?, wrap(db, &[d.o])?])
    }
    let ops = (x, w, dy);
    let direct = direct_shape(&geo, d, x.shape(), w.shape(), conv);
    Ok(Some(match dtype {
        DType::F32 => typed::<f32>(&geo, d, ops, wants, threads, direct)?,
        _ => typed::<f64>(&geo, d, ops, wants, threads, direct)?,
    }))
}

/// A `[A, B, *K]` f32/f64 tensor cut to `crop`'s window, or (`full`) a cut one put back into
/// the whole window `kd` with zeros around it.
fn recrop(t: &TensorData, crop: &Crop, kd: &[usize], full: bool) -> Result<TensorData, String> {
    fn typed<T: bytemuck::Pod + oar_ir::Element + Elem>(
        t: &TensorData,
        crop: &Crop,
        kd: &[usize],
        full: bool,
    ) -> Result<TensorData, String> {
        let v: &[T] = bytemuck::try_cast_slice(t.bytes()).map_err(|e| format!("conv gradient: {e}"))?;
        let lead = &t.shape()[..2];
        let (shape, data) = if full {
            let mut out = vec![T::ZERO; lead.iter().product::<usize>() * kd.iter().product::<usize>()];
            crop.uncrop(v, kd, T::ZERO, &mut out, 1);
            ([lead, kd].concat(), out)
        } else {
            ([lead, &crop.kd[..]].concat(), crop.kernel(v, kd, T::ZERO, 1))
        };
        TensorData::from_vec(shape, data).map_err(|e| e.to_string())
    }
    match t.dtype() {
        DType::F32 => typed::<f32>(t, crop, kd, full),
        _ => typed::<f64>(t, crop, kd, full),
    }
}

/// Whether [`conv_transpose_into`] computes `conv_transpose(x, w, b?)` with attributes `ct`
/// for operands of these types: one group, f32, f64 or f16/bf16 (computed in f32), an `output_padding` below the stride
/// (then the transposed convolution is exactly the input gradient of the forward convolution
/// with the same attributes, on an input of the output's size).
pub fn conv_transpose_supported(ct: &ConvTranspose, inputs: &[oar_ir::TensorType]) -> bool {
    let dtype_ok = inputs
        .first()
        .is_some_and(|x| matches!(x.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16))
        && inputs.iter().all(|t| Some(t.dtype) == inputs.first().map(|x| x.dtype));
    ct.groups == 1
        && (2..=3).contains(&inputs.len())
        && dtype_ok
        && ct.output_padding.iter().zip(&ct.stride).all(|(p, s)| p < s)
}

/// `out = conv_transpose(x, w) (+ b)` (x `[N, Cin, *S]`, w `[Cin, Cout, *K]`, out `[N, Cout,
/// *out_spatial]`, all of dtype `T`): the col2im path of [`conv_vjp`]'s input gradient, the
/// transposed convolution's input playing the cotangent. `ct` is checked by
/// [`conv_transpose_supported`] first.
pub(crate) fn conv_transpose_into<T: Elem + bytemuck::Pod>(
    ct: &ConvTranspose,
    (x, x_shape): (&[T], &[usize]),
    (w, w_shape): (&[T], &[usize]),
    bias: Option<&[T]>,
    (out, out_shape): (&mut [T], &[usize]),
    threads: usize,
) -> Result<(), String> {
    // The forward convolution: input of the output's shape, weight [Cin(=O), Cout(=C), *K].
    let conv = ct.forward();
    let spec = ConvSpec::of(&conv);
    let (geo, d) = geometry(out_shape, w_shape, &spec)?;
    let y_shape = [&[d.n, d.o][..], &geo.sout].concat();
    if d.g != 1 || y_shape != x_shape || out.len() != out_shape.iter().product::<usize>() {
        return Err(format!(
            "conv_transpose: x {x_shape:?}, w {w_shape:?} and output {out_shape:?} do not match (one group)"
        ));
    }
    if let Some(crop) = Crop::of(&geo, &spec) {
        // Taps that only ever meet the padding scatter nothing into the output.
        let small = ConvTranspose {
            pad_before: crop.pad_before.clone(),
            pad_after: crop.pad_after.clone(),
            ..ct.clone()
        };
        let small_w = crop.kernel(w, &geo.kd, T::ZERO, threads);
        let small_shape = [&w_shape[..2], &crop.kd[..]].concat();
        return conv_transpose_into(
            &small,
            (x, x_shape),
            (&small_w, &small_shape),
            bias,
            (out, out_shape),
            threads,
        );
    }
    if let Some(spec) = as_forward(ct, &geo.kd).filter(|_| geo.ow() >= FORWARD_MIN_WIDTH) {
        // Stride 1: the forward convolution of x with the flipped, transposed kernel, on the
        // forward paths (tiled, Winograd, GEMM) instead of col2im.
        let flipped = flip_transpose(w, w_shape);
        let fw_shape = [&[w_shape[1], w_shape[0]][..], &w_shape[2..]].concat();
        // Safety: dense operands of the checked shapes; `out` holds the output.
        unsafe {
            crate::conv::conv(
                &crate::conv::dense(x_shape),
                x.as_ptr(),
                &crate::conv::dense(&fw_shape),
                flipped.as_ptr(),
                out.as_mut_ptr(),
                out_shape,
                &spec.spec(),
                threads,
                None,
            )?
        };
        add_bias(out, out_shape, bias, d.c);
        return Ok(());
    }
    out.fill(T::ZERO);
    grads(&geo, d, &[], w, x, Some(out), None, threads);
    add_bias(out, out_shape, bias, d.c);
    Ok(())
}

/// `out[n, c, ..] += b[c]` for the `c` channels of `out_shape`.
fn add_bias<T: Elem>(out: &mut [T], out_shape: &[usize], bias: Option<&[T]>, c: usize) {
    if let Some(b) = bias {
        let plane: usize = out_shape[2..].iter().product();
        for (i, chunk) in out.chunks_exact_mut(plane.max(1)).enumerate() {
            let v = b[i % c];
            for o in chunk {
                *o += v;
            }
        }
    }
}

/// Output rows narrower than this stay on the scatter path (measured on a CIFAR-size
/// ResNet-18 training step: 8 × 8 planes gain a quarter, 4 × 4 and smaller lose a tenth).
const FORWARD_MIN_WIDTH: usize = 8;

/// The attributes of a transposed convolution as a forward one, where it is one: stride 1,
/// no dilation, one group, padding of at most `k - 1` per side (the forward padding is
/// `k - 1 - p`).
struct Forward {
    /// A 1 per spatial axis: the stride and the dilation.
    ones: Vec<usize>,
    pad_before: Vec<usize>,
    pad_after: Vec<usize>,
}

impl Forward {
    fn spec(&self) -> ConvSpec<'_> {
        ConvSpec {
            stride: &self.ones,
            pad_before: &self.pad_before,
            pad_after: &self.pad_after,
            dilation: &self.ones,
            groups: 1,
        }
    }
}

fn as_forward(ct: &ConvTranspose, kd: &[usize]) -> Option<Forward> {
    let ones = |v: &[usize]| v.iter().all(|&s| s == 1);
    if !ones(&ct.stride) || !ones(&ct.dilation) || ct.groups != 1 || kd.len() != ct.pad_before.len() {
        return None;
    }
    let flip =
        |pads: &[usize]| -> Option<Vec<usize>> { pads.iter().zip(kd).map(|(&p, &k)| (k - 1).checked_sub(p)).collect() };
    Some(Forward {
        ones: ct.stride.clone(),
        pad_before: flip(&ct.pad_before)?,
        pad_after: flip(&ct.pad_after)?,
    })
}

/// `w[O, C, *K]` as `w'[C, O, *K]` with every spatial axis reversed (reversing each axis of a
/// row-major block reverses its flat index).
fn flip_transpose<T: Copy>(w: &[T], ws: &[usize]) -> Vec<T> {
    let (o, c, ks) = (ws[0], ws[1], ws[2..].iter().product::<usize>());
    let mut out = Vec::with_capacity(w.len());
    for ci in 0..c {
        for oi in 0..o {
            let src = &w[(oi * c + ci) * ks..][..ks];
            out.extend(src.iter().rev());
        }
    }
    out
}

/// Whether [`conv_weight_grad_into`] computes `conv_weight_grad(x, dy)` for operands of these
/// types: one group, f32, f64 or f16/bf16 (computed in f32, rounded once).
pub fn conv_weight_grad_supported(cw: &ConvWeightGrad, inputs: &[oar_ir::TensorType]) -> bool {
    cw.groups == 1
        && inputs.len() == 2
        && matches!(inputs[0].dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
        && inputs[1].dtype == inputs[0].dtype
}

/// `out = conv_weight_grad(x, dy)` (x `[N, C, *S]`, dy `[N, O, *Y]`, out `[O, C, *K]`, all of
/// dtype `T`): the weight-gradient half of [`conv_vjp`] (the direct kernel for small f32
/// planes, else im2col + GEMM per tile). `cw` is checked by [`conv_weight_grad_supported`]
/// first.
pub(crate) fn conv_weight_grad_into<T: Elem + bytemuck::Pod>(
    cw: &ConvWeightGrad,
    (x, x_shape): (&[T], &[usize]),
    (dy, dy_shape): (&[T], &[usize]),
    (out, out_shape): (&mut [T], &[usize]),
    threads: usize,
) -> Result<(), String> {
    let conv = cw.forward();
    let spec = ConvSpec::of(&conv);
    let (geo, d) = geometry(x_shape, out_shape, &spec)?;
    let y_shape = [&[d.n, d.o][..], &geo.sout].concat();
    if d.g != 1 || y_shape != dy_shape || out.len() != out_shape.iter().product::<usize>() {
        return Err(format!(
            "conv_weight_grad: x {x_shape:?}, dy {dy_shape:?} and output {out_shape:?} do not match (one group)"
        ));
    }
    if let Some(crop) = Crop::of(&geo, &spec) {
        // Taps that only ever meet the padding have a zero gradient.
        let small = ConvWeightGrad {
            pad_before: crop.pad_before.clone(),
            pad_after: crop.pad_after.clone(),
            kernel: crop.kd.clone(),
            ..cw.clone()
        };
        let small_shape = [&out_shape[..2], &crop.kd[..]].concat();
        let mut part = vec![T::ZERO; small_shape.iter().product()];
        conv_weight_grad_into(&small, (x, x_shape), (dy, dy_shape), (&mut part, &small_shape), threads)?;
        crop.uncrop(&part, &geo.kd, T::ZERO, out, threads);
        return Ok(());
    }
    let direct = direct_shape(&geo, d, x_shape, out_shape, &conv);
    if let (Some(shape), true) = (direct, std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()) {
        crate::conv_wgrad::weight_grad(
            shape,
            bytemuck::cast_slice(x),
            bytemuck::cast_slice(dy),
            bytemuck::cast_slice_mut(out),
            threads,
        );
        return Ok(());
    }
    grads(&geo, d, x, &[], dy, None, Some(out), threads);
    Ok(())
}

/// The shapes for [`crate::conv_wgrad::weight_grad`] where it serves this convolution.
fn direct_shape(geo: &Geo, d: Dims, xs: &[usize], ws: &[usize], conv: &Conv) -> Option<crate::conv_wgrad::Shape> {
    if xs.len() != 4
        || d.g != 1
        || !crate::conv_wgrad::eligible(&conv.stride, &conv.dilation, ws[3], geo.sout[1], d.o, d.c)
    {
        return None;
    }
    Some(crate::conv_wgrad::Shape {
        n: d.n,
        c: d.c,
        h: xs[2],
        w: xs[3],
        o: d.o,
        oh: geo.sout[0],
        ow: geo.sout[1],
        kh: ws[2],
        kw: ws[3],
        pt: conv.pad_before[0],
        pl: conv.pad_before[1],
    })
}

/// `dx` (zeroed by the caller; added to) and `dw` (overwritten) of an ungrouped convolution,
/// where asked.
///
/// Large output planes are cut into tiles of positions, one patch matrix each. Small planes
/// (the deep layers of a CNN: 4 × 4, 1 × 1) are grouped instead: several images' patch
/// matrices side by side and their cotangents packed beside them, so each product has a
/// useful inner size — per image, a 1 × 1 plane's weight gradient is a rank-1 update of the
/// whole `[O, C·K]` matrix, and its input gradient a matrix-vector product re-reading all the
/// weights.
#[allow(clippy::too_many_arguments)]
fn grads<T: Elem>(
    geo: &Geo,
    d: Dims,
    x: &[T],
    w: &[T],
    dy: &[T],
    dx: Option<&mut [T]>,
    dw: Option<&mut [T]>,
    threads: usize,
) {
    let Dims { n, c, o, ys, .. } = d;
    let (s_in, kdim) = (geo.s_in, c * geo.ks);
    if n == 0 || ys == 0 || kdim == 0 || o == 0 {
        // An empty sum: a zero weight gradient (dx is zeroed by the caller).
        if let Some(dw) = dw {
            dw.fill(T::ZERO);
        }
        return;
    }
    // Positions per product: a tile of one image's plane, or whole planes of `group` images.
    let target = (TILE_ELEMS / kdim).max(16);
    let tile = target.clamp(16, ys.max(16)).min(ys);
    let tiles = ys.div_ceil(tile);
    let group = if ys >= target / 2 { 1 } else { (target / ys).max(1) };
    // Fixed batch ranges, one weight-gradient sum each.
    let ranges = threads.clamp(1, n.div_ceil(group));
    let per_range = o * kdim;
    let want_w = dw.is_some();
    let mut partial = vec![T::ZERO; if want_w { ranges * per_range } else { 0 }];
    let cols_n = (group * ys).max(tile);
    // With fewer ranges than threads (a batch of one), each product may split instead.
    let flops = o * kdim * cols_n;
    let par = if ranges < threads {
        gemm_parallelism(flops, threads)
    } else {
        gemm::Parallelism::None
    };
    let want_x = dx.is_some();
    let (dx_ptr, part_ptr) = (dx.map(|d| SendPtr(d.as_mut_ptr())), SendPtr(partial.as_mut_ptr()));
    par_units(
        ranges,
        threads,
        || GradScratch {
            cols: Pooled::take(kdim * cols_n),
            back: Pooled::take(if want_x { kdim * cols_n } else { 0 }),
            dy: Pooled::take(if group > 1 { o * cols_n } else { 0 }),
            one: Pooled::take(if group > 1 { kdim * ys } else { 0 }),
        },
        |sc, r| {
            let mut first = true;
            let (lo, hi) = (n * r / ranges, n * (r + 1) / ranges);
            // Range `r`'s own [o × kdim] sum.
            let part = part_ptr.get().wrapping_add(r * per_range);
            let mut b0 = lo;
            while b0 < hi {
                let b1 = (b0 + group).min(hi);
                if group == 1 {
                    let dyb = &dy[b0 * o * ys..][..o * ys];
                    for t in 0..tiles {
                        let (y0, y1) = (t * tile, ((t + 1) * tile).min(ys));
                        let yc = y1 - y0;
                        // dy[:, y0..y1] as an [o × yc] matrix.
                        let dy_tile = Mat {
                            ptr: dyb[y0..].as_ptr(),
                            rs: ys as isize,
                            cs: 1,
                        };
                        if want_w {
                            let cols = &mut sc.cols[..kdim * yc];
                            im2col(geo, &x[b0 * c * s_in..][..c * s_in], c, y0, y1, cols);
                            // Safety: `part` is this range's sum; operands in bounds.
                            unsafe { weight_product(o, kdim, yc, part, dy_tile, cols, !first, par) };
                            first = false;
                        }
                        if let Some(dx_ptr) = dx_ptr {
                            let back = &mut sc.back[..kdim * yc];
                            // Safety: `back` holds kdim × yc elements; operands in bounds.
                            unsafe { input_product(o, kdim, yc, w, dy_tile, back, par) };
                            // Safety: image `b0`'s planes of dx: only this range writes them.
                            let dxb =
                                unsafe { std::slice::from_raw_parts_mut(dx_ptr.get().add(b0 * c * s_in), c * s_in) };
                            col2im(geo, back, c, y0, y1, dxb);
                        }
                    }
                } else {
                    // Images b0..b1 side by side: columns (image, position).
                    let m = (b1 - b0) * ys;
                    let dyp = &mut sc.dy[..o * m];
                    for (j, b) in (b0..b1).enumerate() {
                        for oc in 0..o {
                            dyp[oc * m + j * ys..][..ys].copy_from_slice(&dy[(b * o + oc) * ys..][..ys]);
                        }
                    }
                    let dy_tile = Mat {
                        ptr: dyp.as_ptr(),
                        rs: m as isize,
                        cs: 1,
                    };
                    if want_w {
                        let cols = &mut sc.cols[..kdim * m];
                        for (j, b) in (b0..b1).enumerate() {
                            im2col(geo, &x[b * c * s_in..][..c * s_in], c, 0, ys, &mut sc.one);
                            for (row, src) in sc.one.chunks_exact(ys).enumerate() {
                                cols[row * m + j * ys..][..ys].copy_from_slice(src);
                            }
                        }
                        // Safety: `part` is this range's sum; operands in bounds.
                        unsafe { weight_product(o, kdim, m, part, dy_tile, cols, !first, par) };
                        first = false;
                    }
                    if let Some(dx_ptr) = dx_ptr {
                        let back = &mut sc.back[..kdim * m];
                        // Safety: `back` holds kdim × m elements; operands in bounds.
                        unsafe { input_product(o, kdim, m, w, dy_tile, back, par) };
                        for (j, b) in (b0..b1).enumerate() {
                            for (row, dst) in sc.one.chunks_exact_mut(ys).enumerate() {
                                dst.copy_from_slice(&back[row * m + j * ys..][..ys]);
                            }
                            // Safety: image `b`'s planes of dx: only this range writes them.
                            let dxb =
                                unsafe { std::slice::from_raw_parts_mut(dx_ptr.get().add(b * c * s_in), c * s_in) };
                            col2im(geo, &sc.one, c, 0, ys, dxb);
                        }
                    }
                }
                b0 = b1;
            }
        },
    );
    if let Some(dw) = dw {
        dw.copy_from_slice(&partial[..per_range]);
        for part in partial.chunks_exact(per_range).skip(1) {
            for (a, &p) in dw.iter_mut().zip(part) {
                *a += p;
            }
        }
    }
}

/// Per-thread buffers of [`grads`]: patch matrix, its gradient, packed cotangents, and one
/// image's patch matrix (grouped images).
struct GradScratch<T: Copy + Default + 'static> {
    cols: Pooled<T>,
    back: Pooled<T>,
    dy: Pooled<T>,
    one: Pooled<T>,
}

/// `part[o × kdim] (+)= dy[o × m] · cols[kdim × m]ᵀ`.
///
/// # Safety
/// `part` holds `o · kdim` elements (initialized when `accumulate`); `dy` addresses `o × m`.
#[allow(clippy::too_many_arguments)]
unsafe fn weight_product<T: Elem>(
    o: usize,
    kdim: usize,
    m: usize,
    part: *mut T,
    dy: Mat<T>,
    cols: &[T],
    accumulate: bool,
    par: gemm::Parallelism,
) {
    let cols = Mat {
        ptr: cols.as_ptr(),
        rs: 1,
        cs: m as isize,
    };
    // Safety: the caller's contract; `cols` holds kdim × m elements.
    unsafe { gemm_into(o, kdim, m, part, kdim as isize, dy, cols, accumulate, par) }
}

/// `back[kdim × m] = w[o × kdim]ᵀ · dy[o × m]`.
///
/// # Safety
/// `dy` addresses `o × m` elements; `w` holds `o · kdim`, `back` `kdim · m`.
unsafe fn input_product<T: Elem>(
    o: usize,
    kdim: usize,
    m: usize,
    w: &[T],
    dy: Mat<T>,
    back: &mut [T],
    par: gemm::Parallelism,
) {
    let wt = Mat {
        ptr: w.as_ptr(),
        rs: 1,
        cs: kdim as isize,
    };
    // Safety: the caller's contract.
    unsafe { gemm_into(kdim, m, o, back.as_mut_ptr(), m as isize, wt, dy, false, par) }
}

/// The adjoint of [`im2col`]: add each patch-matrix element of output positions `y0..y1`
/// (row `ci · ks + kf`, as `im2col` lays them out) onto the input element it was read from;
/// elements read from the padding are dropped.
fn col2im<T: Elem>(g: &Geo, cols: &[T], cg: usize, y0: usize, y1: usize, dx: &mut [T]) {
    let yc = y1 - y0;
    let (kw, krows) = (g.kw(), g.krows());
    let pieces = row_pieces(g.ow(), y0, y1);
    let mut offs = Vec::with_capacity(pieces.len());
    for ko in 0..krows {
        piece_offsets(g, &pieces, ko, &mut offs);
        for ci in 0..cg {
            let plane = &mut dx[ci * g.s_in..][..g.s_in];
            for (kx, tap) in g.cols.iter().enumerate() {
                let row = &cols[(ci * g.ks + ko * kw + kx) * yc..][..yc];
                let mut at = 0;
                for (&(_, c0, c1), off) in pieces.iter().zip(&offs) {
                    let seg = &row[at..at + (c1 - c0)];
                    at += c1 - c0;
                    let Some(off) = *off else { continue };
                    let (a, b) = (tap.lo.clamp(c0, c1), tap.hi.clamp(c0, c1));
                    if a >= b {
                        continue;
                    }
                    let first = (off as isize + (a * g.step) as isize + tap.shift) as usize;
                    let src = &seg[a - c0..b - c0];
                    let dst = &mut plane[first..first + (b - a - 1) * g.step + 1];
                    if g.step == 1 {
                        for (d, &s) in dst.iter_mut().zip(src) {
                            *d += s;
                        }
                    } else {
                        for (d, &s) in dst.iter_mut().step_by(g.step).zip(src) {
                            *d += s;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random vector in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    fn out_size(xs: [usize; 4], ws: [usize; 4], a: &Conv) -> [usize; 2] {
        [0, 1].map(|i| {
            let (s, k, p) = (a.stride[i], ws[2 + i], a.pad_before[i] + a.pad_after[i]);
            (xs[2 + i] + p - a.dilation[i] * (k - 1) - 1) / s + 1
        })
    }

    /// The gradients by the definition, 2-d: every (output, tap) pair adds its product.
    fn by_definition(
        xs: [usize; 4],
        ws: [usize; 4],
        a: &Conv,
        x: &[f64],
        w: &[f64],
        dy: &[f64],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let [n, c, h, wi] = xs;
        let [o, _, kh, kw] = ws;
        let [oh, ow] = out_size(xs, ws, a);
        let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; o]);
        for b in 0..n {
            for oc in 0..o {
                for yy in 0..oh {
                    for xx in 0..ow {
                        let g = dy[((b * o + oc) * oh + yy) * ow + xx];
                        db[oc] += g;
                        for ci in 0..c {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy =
                                        (yy * a.stride[0] + ky * a.dilation[0]) as isize - a.pad_before[0] as isize;
                                    let ix =
                                        (xx * a.stride[1] + kx * a.dilation[1]) as isize - a.pad_before[1] as isize;
                                    if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= wi {
                                        continue;
                                    }
                                    let xi = ((b * c + ci) * h + iy as usize) * wi + ix as usize;
                                    let wk = ((oc * c + ci) * kh + ky) * kw + kx;
                                    dx[xi] += g * w[wk];
                                    dw[wk] += g * x[xi];
                                }
                            }
                        }
                    }
                }
            }
        }
        (dx, dw, db)
    }

    #[test]
    fn gradients_match_the_definition() {
        let conv = |s: [usize; 2], pb: [usize; 2], pa: [usize; 2], d: [usize; 2]| Conv {
            stride: s.to_vec(),
            pad_before: pb.to_vec(),
            pad_after: pa.to_vec(),
            dilation: d.to_vec(),
            groups: 1,
        };
        let cases = [
            ([3, 2, 9, 8], [4, 2, 3, 3], conv([1, 1], [1, 1], [1, 1], [1, 1])),
            ([2, 3, 11, 10], [5, 3, 3, 2], conv([2, 3], [2, 0], [1, 2], [1, 1])),
            ([2, 2, 12, 12], [3, 2, 3, 3], conv([1, 2], [0, 3], [2, 0], [2, 3])),
            // LeNet's second layer, one image; and a batch of one with a wide plane
            // (several tiles of output positions).
            ([1, 6, 14, 14], [16, 6, 5, 5], conv([1, 1], [0, 0], [0, 0], [1, 1])),
            ([1, 8, 40, 90], [2, 8, 3, 3], conv([1, 1], [1, 1], [1, 1], [1, 1])),
            // Kernels wider than what the input lets them read (cropped, `Crop`): 1 × 1
            // planes (the centre tap alone), 2 × 2 planes under a 5 × 5 kernel (taps 1..4
            // per axis), one axis only.
            ([4, 5, 1, 1], [6, 5, 3, 3], conv([1, 1], [1, 1], [1, 1], [1, 1])),
            ([3, 4, 2, 2], [5, 4, 5, 5], conv([1, 1], [2, 2], [2, 2], [1, 1])),
            ([2, 3, 1, 3], [4, 3, 3, 3], conv([1, 1], [1, 1], [1, 1], [1, 1])),
        ];
        for (i, (xs, ws, a)) in cases.into_iter().enumerate() {
            let cropped = Crop::of(&geometry(&xs, &ws, &ConvSpec::of(&a)).unwrap().0, &ConvSpec::of(&a));
            assert_eq!(
                cropped.map(|c| c.kd),
                [
                    None,
                    None,
                    None,
                    None,
                    None,
                    Some(vec![1, 1]),
                    Some(vec![3, 3]),
                    Some(vec![1, 3])
                ][i]
            );
            let x = values(xs.iter().product(), 3 * i as u64);
            let w = values(ws.iter().product(), 3 * i as u64 + 1);
            let [oh, ow] = out_size(xs, ws, &a);
            let dy = values(xs[0] * ws[0] * oh * ow, 3 * i as u64 + 2);
            let (ex, ew, eb) = by_definition(xs, ws, &a, &x, &w, &dy);
            for threads in [1, 2, 3] {
                let t = |v: &[f64], s: &[usize]| TensorData::from_vec(s.to_vec(), v.to_vec()).unwrap();
                let got = conv_vjp(
                    &t(&x, &xs),
                    &t(&w, &ws),
                    &t(&dy, &[xs[0], ws[0], oh, ow]),
                    &a,
                    [true, true, true],
                    threads,
                )
                .unwrap()
                .expect("a native path");
                for (name, g, e) in [("dx", &got[0], &ex), ("dw", &got[1], &ew), ("db", &got[2], &eb)] {
                    let g: &[f64] = bytemuck::cast_slice(g.as_ref().unwrap().bytes());
                    let err = g.iter().zip(e.iter()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                    assert!(err < 1e-12, "case {i}, {threads} threads: {name} off by {err}");
                }
            }
        }
    }

    /// f32 weight gradients of small stride-1 convolutions take the direct kernel
    /// (`conv_wgrad`): against the definition in f64 (error within 1e-5 of the sum of the
    /// terms' magnitudes), and bit-identical for one, two and three threads. Cases: LeNet's
    /// two layers at batch 3, 3 × 3 with asymmetric padding and output channels not a
    /// multiple of any block, a row wider than two vector chunks.
    #[test]
    fn direct_f32_weight_gradients_match_the_definition() {
        let conv = |pb: [usize; 2], pa: [usize; 2]| Conv {
            stride: vec![1, 1],
            pad_before: pb.to_vec(),
            pad_after: pa.to_vec(),
            dilation: vec![1, 1],
            groups: 1,
        };
        let cases = [
            ([3, 1, 28, 28], [6, 1, 5, 5], conv([2, 2], [2, 2])),
            ([3, 6, 14, 14], [16, 6, 5, 5], conv([0, 0], [0, 0])),
            ([2, 3, 9, 10], [7, 3, 3, 3], conv([1, 0], [2, 1])),
            ([2, 2, 6, 31], [5, 2, 3, 3], conv([1, 1], [1, 1])),
        ];
        for (i, (xs, ws, a)) in cases.into_iter().enumerate() {
            let [oh, ow] = out_size(xs, ws, &a);
            let ys = [xs[0], ws[0], oh, ow];
            let geo = geometry(&xs, &ws, &ConvSpec::of(&a)).unwrap();
            assert!(
                direct_shape(&geo.0, geo.1, &xs, &ws, &a).is_some(),
                "case {i} takes the direct kernel"
            );
            let f32s = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect::<Vec<f32>>();
            let x = f32s(values(xs.iter().product(), 7 * i as u64));
            let w = f32s(values(ws.iter().product(), 7 * i as u64 + 1));
            let dy = f32s(values(ys.iter().product(), 7 * i as u64 + 2));
            let wide = |v: &[f32]| v.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
            let (_, ew, _) = by_definition(xs, ws, &a, &wide(&x), &wide(&w), &wide(&dy));
            let abs = |v: &[f32]| v.iter().map(|v| f64::from(v.abs())).collect::<Vec<f64>>();
            let (_, bound, _) = by_definition(xs, ws, &a, &abs(&x), &abs(&w), &abs(&dy));
            let t = |v: &[f32], s: &[usize]| TensorData::from_vec(s.to_vec(), v.to_vec()).unwrap();
            let mut first: Option<Vec<u32>> = None;
            for threads in [1, 2, 3] {
                let got = conv_vjp(
                    &t(&x, &xs),
                    &t(&w, &ws),
                    &t(&dy, &ys),
                    &a,
                    [false, true, false],
                    threads,
                )
                .unwrap()
                .expect("a native path");
                let dw: &[f32] = bytemuck::cast_slice(got[1].as_ref().unwrap().bytes());
                for (k, ((&g, &e), &b)) in dw.iter().zip(&ew).zip(&bound).enumerate() {
                    assert!(
                        (f64::from(g) - e).abs() <= 1e-5 * b + 1e-30,
                        "case {i}, {threads} threads, dw[{k}]: {g} vs {e} (terms' magnitudes {b})"
                    );
                }
                let bits: Vec<u32> = dw.iter().map(|v| v.to_bits()).collect();
                match &first {
                    None => first = Some(bits),
                    Some(f) => assert_eq!(f, &bits, "case {i}: {threads} threads differ from one"),
                }
            }
        }
    }

    /// `conv_transpose` is the forward convolution's input gradient: against the definition
    /// (dx of a convolution over an input of the output's size), with strides, padding,
    /// output_padding, dilation and a bias; one and two threads.
    #[test]
    fn conv_transpose_is_the_input_gradient_by_definition() {
        let cases = [
            // (transpose input [N, Cin, *S], weight [Cin, Cout, *K], stride, pads, output_padding, dilation)
            ([2, 3, 4, 5], [3, 2, 3, 3], [2, 2], [1, 0], [0, 1], [1, 0], [1, 1]),
            ([1, 4, 5, 5], [4, 3, 2, 3], [1, 1], [0, 1], [1, 1], [0, 0], [2, 1]),
            ([2, 2, 3, 3], [2, 5, 3, 3], [3, 2], [0, 0], [0, 0], [2, 1], [1, 1]),
            // 1 × 1 planes: only the centre tap scatters into the output (cropped).
            ([3, 4, 1, 1], [4, 2, 3, 3], [1, 1], [1, 1], [1, 1], [0, 0], [1, 1]),
            // Stride 1: forward convolutions with the flipped kernel (symmetric and asymmetric
            // padding; a padding beyond k - 1 and narrow rows stay on the scatter path).
            ([2, 8, 9, 9], [8, 6, 3, 3], [1, 1], [1, 1], [1, 1], [0, 0], [1, 1]),
            ([1, 4, 7, 10], [4, 5, 3, 5], [1, 1], [0, 2], [2, 1], [0, 0], [1, 1]),
            ([2, 3, 5, 5], [3, 4, 3, 3], [1, 1], [1, 1], [1, 1], [0, 0], [1, 1]),
            ([1, 3, 9, 9], [3, 4, 3, 3], [1, 1], [3, 0], [3, 0], [0, 0], [1, 1]),
        ];
        for (i, (xs, ws, stride, pb, pa, op, dil)) in cases.into_iter().enumerate() {
            let ct = ConvTranspose {
                stride: stride.to_vec(),
                pad_before: pb.to_vec(),
                pad_after: pa.to_vec(),
                output_padding: op.to_vec(),
                dilation: dil.to_vec(),
                groups: 1,
            };
            let out_sp: Vec<usize> = ct.output_sizes(&xs[2..], &ws[2..]).unwrap();
            let out_shape = [xs[0], ws[1], out_sp[0], out_sp[1]];
            let x = values(xs.iter().product(), 11 * i as u64);
            let w = values(ws.iter().product(), 11 * i as u64 + 1);
            let b = values(ws[1], 11 * i as u64 + 2);
            let a = Conv {
                stride: stride.to_vec(),
                pad_before: pb.to_vec(),
                pad_after: pa.to_vec(),
                dilation: dil.to_vec(),
                groups: 1,
            };
            // The forward convolution over an output-sized input maps back to x's size.
            assert_eq!(out_size(out_shape, ws, &a), [xs[2], xs[3]], "case {i}");
            let zeros = vec![0.0; out_shape.iter().product()];
            let (mut want, _, _) = by_definition(out_shape, ws, &a, &zeros, &w, &x);
            let plane = out_sp[0] * out_sp[1];
            for (j, v) in want.iter_mut().enumerate() {
                *v += b[(j / plane) % ws[1]];
            }
            for threads in [1, 2] {
                let mut out = vec![f64::NAN; want.len()];
                conv_transpose_into(&ct, (&x, &xs), (&w, &ws), Some(&b), (&mut out, &out_shape), threads).unwrap();
                let err = out.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(err < 1e-12, "case {i}, {threads} threads: off by {err}");
                // f32 (the tiled forward path on AVX hosts), to f32 rounding.
                let f = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<f32>>();
                let mut out32 = vec![f32::NAN; want.len()];
                let (x32, w32, b32) = (f(&x), f(&w), f(&b));
                conv_transpose_into(
                    &ct,
                    (&x32, &xs),
                    (&w32, &ws),
                    Some(&b32),
                    (&mut out32, &out_shape),
                    threads,
                )
                .unwrap();
                let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let err = out32
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (*a as f64 - b).abs())
                    .fold(0.0, f64::max);
                assert!(err < 1e-5 * scale, "case {i}, {threads} threads, f32: off by {err}");
            }
            let types: Vec<oar_ir::TensorType> = [&xs[..], &ws[..], &[ws[1]][..]]
                .iter()
                .map(|s| oar_ir::TensorType::of(DType::F64, s))
                .collect();
            assert!(conv_transpose_supported(&ct, &types));
        }
    }

    /// `conv_weight_grad` (a static graph's weight gradient) against the definition, where the
    /// kernel is cropped to the taps that read the input and where it is not.
    #[test]
    fn conv_weight_grad_matches_the_definition() {
        for (i, (xs, ws, pad)) in [
            ([3, 4, 1, 1], [5, 4, 3, 3], 1),
            ([2, 3, 2, 2], [4, 3, 5, 5], 2),
            ([2, 3, 5, 4], [4, 3, 3, 3], 1),
        ]
        .into_iter()
        .enumerate()
        {
            let a = Conv {
                stride: vec![1, 1],
                pad_before: vec![pad; 2],
                pad_after: vec![pad; 2],
                dilation: vec![1, 1],
                groups: 1,
            };
            let cw = ConvWeightGrad {
                stride: a.stride.clone(),
                pad_before: a.pad_before.clone(),
                pad_after: a.pad_after.clone(),
                dilation: a.dilation.clone(),
                groups: 1,
                kernel: ws[2..].to_vec(),
            };
            let [oh, ow] = out_size(xs, ws, &a);
            let ys = [xs[0], ws[0], oh, ow];
            let x = values(xs.iter().product(), 13 * i as u64);
            let dy = values(ys.iter().product(), 13 * i as u64 + 1);
            let (_, want, _) = by_definition(xs, ws, &a, &x, &vec![0.0; ws.iter().product()], &dy);
            for threads in [1, 2] {
                let mut got = vec![f64::NAN; want.len()];
                conv_weight_grad_into(&cw, (&x, &xs), (&dy, &ys), (&mut got, &ws), threads).unwrap();
                let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(err < 1e-12, "case {i}, {threads} threads: off by {err}");
            }
        }
    }

    /// Only what is asked for is computed; grouped convolutions have no native path.
    #[test]
    fn wants_and_groups() {
        let a = Conv {
            stride: vec![1, 1],
            pad_before: vec![0, 0],
            pad_after: vec![0, 0],
            dilation: vec![1, 1],
            groups: 1,
        };
        let t = |s: &[usize]| TensorData::from_vec(s.to_vec(), vec![0.5f32; s.iter().product()]).unwrap();
        let got = conv_vjp(
            &t(&[1, 2, 4, 4]),
            &t(&[3, 2, 3, 3]),
            &t(&[1, 3, 2, 2]),
            &a,
            [false, true, false],
            2,
        )
        .unwrap()
        .unwrap();
        assert!(got[0].is_none() && got[2].is_none());
        // Every dw element sums 4 positions of 0.5 · 0.5.
        let dw: &[f32] = bytemuck::cast_slice(got[1].as_ref().unwrap().bytes());
        assert!(dw.iter().all(|&v| v == 1.0), "{dw:?}");
        let grouped = Conv { groups: 2, ..a };
        let none = conv_vjp(
            &t(&[1, 2, 4, 4]),
            &t(&[2, 1, 3, 3]),
            &t(&[1, 2, 2, 2]),
            &grouped,
            [true; 3],
            2,
        )
        .unwrap();
        assert!(none.is_none());
    }
}
