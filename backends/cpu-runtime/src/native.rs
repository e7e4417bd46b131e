//! Opaque ops the runtime runs natively instead of through the reference interpreter, on the
//! buffers' own dtypes: data movement (`pad` constant, `gather`, `concat`: byte copies of
//! contiguous runs), `scatter`, the generators `iota` and `random`, and the lane ops `argmax` /
//! `argmin` and `sort`. Their semantics come from the op definitions in `oar_ir::ops` (the
//! comparison, permutation and generator functions the reference evaluation uses too), so the
//! results are the reference's bits. Also the composites the cpu backend keeps whole
//! (`softmax`, `log_softmax`, `layer_norm`: vectorized row kernels in [`crate::rows`], within
//! rounding of the reference; `sdpa`: [`crate::attention`]).

use crate::conv_direct::copy_run;
use crate::program::static_shape;
use oar_ir::kernel::{Kernel, KernelBody, KernelProgram, OpaqueKernel};
use oar_ir::ops::{
    Composite, Concat, ConvTranspose, ConvWeightGrad, Gather, MaxPool2d, MaxPool2dGrad, Pad, Scatter, ScatterReduce,
};
use oar_ir::tensor_data::{read_as_f64, store_f64_as};
use oar_ir::{BackendError, DType, Op, TensorData};

/// Whether [`run`] computes this opaque kernel.
pub fn supports(o: &OpaqueKernel, p: &KernelProgram) -> bool {
    let dt = |i: usize| o.inputs.get(i).map(|b| p.buffer(*b).ty.dtype);
    let types = || -> Vec<oar_ir::TensorType> { o.inputs.iter().map(|b| p.buffer(*b).ty.clone()).collect() };
    match &o.op {
        Op::Pad(_) => o.inputs.len() == 1,
        Op::Concat(_) => !o.inputs.is_empty(),
        Op::Gather(_) => o.inputs.len() == 2 && matches!(dt(1), Some(DType::I32 | DType::I64)),
        Op::Iota(_) | Op::Random(_) => o.inputs.is_empty(),
        Op::ArgReduce(_) | Op::Sort(_) | Op::Collective(_) => o.inputs.len() == 1,
        Op::Scatter(_) => o.inputs.len() == 3 && matches!(dt(1), Some(DType::I32 | DType::I64)),
        // The conversions `legalize::widen_half` puts around f16/bf16 loop kernels.
        Op::Cast(c) => {
            o.inputs.len() == 1
                && matches!(
                    (dt(0), c.to),
                    (Some(DType::F16 | DType::BF16), DType::F32) | (Some(DType::F32), DType::F16 | DType::BF16)
                )
        }
        Op::Composite(c) if crate::rnn::Recurrence::of(c).is_some() => {
            o.inputs.len() == 4 && dt(0).is_some_and(crate::rnn::seq_dtype)
        }
        Op::Composite(c) if let Some(kept) = whole_supported(c, &types()) => kept,
        Op::Composite(c) => {
            crate::rows::of(c).is_some_and(|(_, arities)| arities.contains(&o.inputs.len()))
                && dt(0).is_some_and(row_float)
        }
        _ => false,
    }
}

/// Whether the runtime computes composite `c` on operands of these types, for the composites
/// whose kernels cover some instances only (`conv_transpose`, `conv_weight_grad`,
/// `max_pool2d`, `max_pool2d_grad`, `sdpa`, `adam_update`, `matmul_integer`, `conv_integer`, `gelu`); `None` for every
/// other composite. The cpu
/// backend keeps exactly these instances whole, and [`supports`] accepts them.
pub fn whole_supported(c: &Composite, types: &[oar_ir::TensorType]) -> Option<bool> {
    Some(match c {
        Composite::ConvTranspose(ct) => crate::conv_grad::conv_transpose_supported(ct, types),
        Composite::ConvWeightGrad(cw) => crate::conv_grad::conv_weight_grad_supported(cw, types),
        Composite::MaxPool2d(m) => crate::pool::max_pool2d_supported(m, types),
        Composite::MaxPool2dGrad(m) => crate::pool_grad::max_pool2d_grad_supported(m, types),
        Composite::ScaledDotProductAttention(a) => crate::attention::supported(a, types),
        Composite::AdamUpdate(_) => crate::optim::adam_supported(types),
        Composite::MatMulInteger => crate::qgemm::supported(types),
        Composite::ConvInteger(c) => crate::qconv::supported(c, types),
        Composite::Gelu(_) => types.len() == 1 && types[0].dtype == DType::F32,
        _ => return None,
    })
}

/// `bytes` as elements of `T` (`what` names them in the error); empty bytes are no elements
/// whatever their address.
pub(crate) fn elems<'a, T: bytemuck::Pod>(bytes: &'a [u8], what: &str) -> Result<&'a [T], String> {
    if bytes.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(bytes).map_err(|e| format!("{what}: unaligned: {e}"))
}

/// [`elems`] for a result.
pub(crate) fn elems_mut<'a, T: bytemuck::Pod>(bytes: &'a mut [u8], what: &str) -> Result<&'a mut [T], String> {
    if bytes.is_empty() {
        return Ok(&mut []);
    }
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| format!("{what}: unaligned: {e}"))
}

/// The dtypes the row kernels ([`crate::rows`]) compute.
fn row_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

fn err(k: &Kernel, detail: String) -> BackendError {
    BackendError::Runtime {
        op: k.name.clone(),
        value: String::new(),
        detail,
    }
}

/// A read-only view of an input buffer, copied first when it overlaps the output (the memory
/// plan may place them in the same arena bytes).
fn input(src: *const u8, len: usize, out: *const u8, out_len: usize, copy: &mut Vec<u8>) -> &[u8] {
    // Safety: the caller passes live buffers of these lengths.
    let view = unsafe { std::slice::from_raw_parts(src, len) };
    if overlaps(src, len, out, out_len) {
        *copy = view.to_vec();
        copy
    } else {
        // Safety: no overlap with the output, which is the only buffer written.
        unsafe { std::slice::from_raw_parts(src, len) }
    }
}

/// Indices (negative ones counting from the end) checked against an axis of size `n`.
fn normalized(k: &Kernel, raw: &[i64], n: usize, op: &str, axis: usize) -> Result<Vec<usize>, BackendError> {
    raw.iter()
        .map(|&i| {
            let j = if i < 0 { i + n as i64 } else { i };
            if (0..n as i64).contains(&j) {
                Ok(j as usize)
            } else {
                Err(err(
                    k,
                    format!("{op} index {i} out of range for axis {axis} of size {n}"),
                ))
            }
        })
        .collect()
}

/// Run `k` (an opaque kernel [`supports`] accepts) on the program's buffers. With `epi`, an
/// integer convolution applies it to the parts of its result it completes, while they are in
/// cache; the result says whether it did (else the caller runs its epilogue afterwards).
///
/// # Safety
/// `bufs` holds a live pointer for every buffer of `p`, each as long as its static type.
pub unsafe fn run(
    p: &KernelProgram,
    k: &Kernel,
    bufs: &[*mut u8],
    threads: usize,
    cache: Option<&crate::contraction::WeightCache>,
    epi: Option<crate::contraction::IterEpilogue>,
) -> Result<bool, BackendError> {
    let mut applied = false;
    let KernelBody::Opaque(o) = &k.body else {
        return Err(err(k, "native step on a non-opaque kernel".into()));
    };
    let out_id = k.outputs[0];
    let out_ty = &p.buffer(out_id).ty;
    let size = out_ty.dtype.size_bytes();
    let out_shape = static_shape(out_ty);
    let out_len = out_shape.iter().product::<usize>() * size;
    let out_ptr = bufs[out_id.index()];
    let shape_of = |i: usize| static_shape(&p.buffer(o.inputs[i]).ty);
    // Operand i's bytes, in its own dtype (a bool mask beside float operands).
    let len_of = |i: usize| crate::model::byte_len(p.buffer(o.inputs[i]));
    let mut copy = Vec::new();
    match &o.op {
        Op::Pad(Pad { before, value, .. }) => {
            let x_shape = shape_of(0);
            let x = input(bufs[o.inputs[0].index()], len_of(0), out_ptr, out_len, &mut copy);
            // Safety: the output buffer is live, `out_len` bytes, and not aliased by `x`.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            let fill = TensorData::full(out_ty.dtype, vec![], value.0).map_err(|e| err(k, e.to_string()))?;
            if fill.bytes().iter().all(|&b| b == 0) {
                out.fill(0);
            } else {
                for c in out.chunks_exact_mut(size) {
                    c.copy_from_slice(fill.bytes());
                }
            }
            if x.is_empty() {
                return Ok(false);
            }
            // Runs: everything from the last padded axis `q` inward is contiguous in both the
            // input and the output, so each run copies x_shape[q..] at once.
            let rank = x_shape.len();
            let q = (0..rank)
                .rev()
                .find(|&a| before[a] != 0 || out_shape[a] != x_shape[a])
                .unwrap_or(0);
            let run_len = x_shape[q..].iter().product::<usize>() * size;
            let inner = x_shape[q + 1.min(rank)..].iter().product::<usize>().max(1) * size;
            let mut out_strides = vec![size; rank];
            for a in (0..rank.saturating_sub(1)).rev() {
                out_strides[a] = out_strides[a + 1] * out_shape[a + 1];
            }
            let outer = &x_shape[..q];
            let base: usize =
                (0..q).map(|a| before[a] * out_strides[a]).sum::<usize>() + before.get(q).copied().unwrap_or(0) * inner;
            // The innermost outer axis is walked with its fixed output stride; the odometer
            // only moves between its rows.
            let (row_len, row_stride) = match q {
                0 => (1, 0),
                _ => (outer[q - 1], out_strides[q - 1]),
            };
            let run = run_len.max(1);
            let mut idx = vec![0usize; q.saturating_sub(1)];
            let mut off = base;
            for row in x.chunks_exact(run * row_len.max(1)) {
                for (j, src) in row.chunks_exact(run).enumerate() {
                    let at = off + j * row_stride;
                    let dst = &mut out[at..at + run_len];
                    match run_len {
                        4 => dst.copy_from_slice(&src[..4]),
                        _ => copy_run(dst, src),
                    }
                }
                // Advance the odometer over the remaining outer axes, keeping `off` in step.
                for a in (0..q.saturating_sub(1)).rev() {
                    idx[a] += 1;
                    off += out_strides[a];
                    if idx[a] < outer[a] {
                        break;
                    }
                    off -= out_strides[a] * outer[a];
                    idx[a] = 0;
                }
            }
        }
        Op::Concat(Concat { axis }) => {
            // Safety: as above; inputs that overlap the output are copied first.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            let outer: usize = out_shape[..*axis].iter().product();
            let out_row = out_shape[*axis..].iter().product::<usize>() * size;
            let mut at = 0;
            for i in 0..o.inputs.len() {
                let s = shape_of(i);
                let row = s[*axis..].iter().product::<usize>() * size;
                let mut c = Vec::new();
                let x = input(bufs[o.inputs[i].index()], len_of(i), out_ptr, out_len, &mut c);
                for r in 0..outer {
                    out[r * out_row + at..r * out_row + at + row].copy_from_slice(&x[r * row..(r + 1) * row]);
                }
                at += row;
            }
        }
        Op::Gather(Gather { axis }) => {
            let data_shape = shape_of(0);
            let data = input(bufs[o.inputs[0].index()], len_of(0), out_ptr, out_len, &mut copy);
            // Safety: the index buffer is live; it is read before the output is written.
            let raw = unsafe { read_indices(p, o.inputs[1], bufs[o.inputs[1].index()]) };
            let (outer, n, inner) = lanes(&data_shape, *axis);
            let indices = normalized(k, &raw, n, "gather", *axis)?;
            let block = inner * size;
            // Safety: the output buffer is live, `out_len` bytes, and not aliased by `data`.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            let mut w = 0;
            for r in 0..outer {
                for &j in &indices {
                    let src = (r * n + j) * block;
                    out[w..w + block].copy_from_slice(&data[src..src + block]);
                    w += block;
                }
            }
        }
        // A collective hands the operand to its group's transport (`oar_ir::ops::collective`).
        Op::Collective(c) => {
            let x = input(bufs[o.inputs[0].index()], len_of(0), out_ptr, out_len, &mut copy);
            let x = TensorData::from_bytes(p.buffer(o.inputs[0]).ty.dtype, shape_of(0), x.to_vec())
                .map_err(|e| err(k, e.to_string()))?;
            let y = oar_ir::ops::collective::run(c, &x).map_err(|d| err(k, d))?;
            if y.bytes().len() != out_len {
                return Err(err(
                    k,
                    format!(
                        "{} gave {} bytes for a {} buffer",
                        c.kind.name(),
                        y.bytes().len(),
                        out_ty
                    ),
                ));
            }
            // Safety: the output buffer is live and `out_len` bytes; `x` is a copy.
            unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) }.copy_from_slice(y.bytes());
        }
        // Generators fill their buffer straight from the op's definition (no f64 tensor).
        Op::Iota(iota) => {
            // Safety: the output buffer is live and `out_len` bytes; a generator reads nothing.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            fill_chunks(out, size, threads, |first, chunk| {
                iota.write_elements(&out_shape, first, chunk)
            });
        }
        Op::Random(random) => {
            // Safety: as for iota.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            fill_chunks(out, size, threads, |first, chunk| random.write_elements(first, chunk));
        }
        // argmax/argmin and sort walk each lane along the axis with the op definitions' own
        // comparisons (first extremum, NaN largest, stable), reading elements in their dtype.
        Op::ArgReduce(a) => {
            let (xs, x_dt) = (shape_of(0), p.buffer(o.inputs[0]).ty.dtype);
            let x_len = xs.iter().product::<usize>() * x_dt.size_bytes();
            let x = input(bufs[o.inputs[0].index()], x_len, out_ptr, out_len, &mut copy);
            // Safety: the output buffer is live, `out_len` bytes, and not aliased by `x`.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            let (outer, n, inner) = lanes(&xs, a.axis);
            if n == 0 && out_len > 0 {
                return Err(err(k, format!("{} over an empty axis {}", a.op.name(), a.axis)));
            }
            for r in 0..outer {
                for i in 0..inner {
                    let at = |j: usize| ((r * n + j) * inner + i) * x_dt.size_bytes();
                    let best = if x_dt.is_float() {
                        a.best_float((0..n).map(|j| read_as_f64(x_dt, &x[at(j)..at(j) + x_dt.size_bytes()])))
                    } else {
                        a.best_int((0..n).map(|j| read_int(x_dt, &x[at(j)..])))
                    };
                    let o8 = (r * inner + i) * 8;
                    out[o8..o8 + 8].copy_from_slice(&(best.unwrap_or(0) as i64).to_le_bytes());
                }
            }
        }
        Op::Sort(sort) => {
            let (xs, w) = (shape_of(0), size);
            let idx_id = *k
                .outputs
                .get(1)
                .ok_or_else(|| err(k, "sort writes two buffers".into()))?;
            let (idx_ptr, idx_len) = (bufs[idx_id.index()], xs.iter().product::<usize>() * 8);
            // The input is copied first if it shares bytes with either output.
            let src = bufs[o.inputs[0].index()];
            let x_len = len_of(0);
            let x: &[u8] = if overlaps(src, x_len, idx_ptr, idx_len) {
                // Safety: live, `x_len` bytes.
                copy = unsafe { std::slice::from_raw_parts(src, x_len) }.to_vec();
                &copy
            } else {
                input(src, x_len, out_ptr, out_len, &mut copy)
            };
            // Safety: both outputs are live, of these lengths, distinct, and not aliased by `x`.
            let vals = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            let idx = unsafe { std::slice::from_raw_parts_mut(idx_ptr, idx_len) };
            let (outer, n, inner) = lanes(&xs, sort.axis);
            let dt = out_ty.dtype;
            let (mut fl, mut il) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for r in 0..outer {
                for i in 0..inner {
                    let at = |j: usize| ((r * n + j) * inner + i) * w;
                    let perm = if dt.is_float() {
                        fl.clear();
                        fl.extend((0..n).map(|j| read_as_f64(dt, &x[at(j)..at(j) + w])));
                        sort.permutation(&fl)
                    } else {
                        il.clear();
                        il.extend((0..n).map(|j| read_int(dt, &x[at(j)..])));
                        sort.permutation_int(&il)
                    };
                    for (j, src) in perm.into_iter().enumerate() {
                        vals[at(j)..at(j) + w].copy_from_slice(&x[at(src)..at(src) + w]);
                        let o8 = (r * n + j) * inner + i;
                        idx[o8 * 8..o8 * 8 + 8].copy_from_slice(&(src as i64).to_le_bytes());
                    }
                }
            }
        }
        Op::Cast(_) => {
            let from = p.buffer(o.inputs[0]).ty.dtype;
            let n = out_len / size;
            let x = input(
                bufs[o.inputs[0].index()],
                n * from.size_bytes(),
                out_ptr,
                out_len,
                &mut copy,
            );
            // Safety: the output buffer is live, `out_len` bytes, and not aliased by `x`.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            let to = out_ty.dtype;
            fill_chunks(out, size, threads, |first, chunk| {
                half_convert(from, to, &x[first * from.size_bytes()..], chunk)
            });
        }
        Op::Scatter(sc) => {
            // Safety: the output buffer is live and `out_len` bytes; inputs that overlap it are
            // copied first (data may be planned into the output's own bytes).
            unsafe { scatter(p, k, o, sc, bufs, out_ptr, out_len)? };
        }
        Op::Composite(
            c @ (Composite::ConvTranspose(_)
            | Composite::ConvWeightGrad(_)
            | Composite::MaxPool2d(_)
            | Composite::MaxPool2dGrad(_)),
        ) => {
            let mut copies: Vec<Vec<u8>> = vec![Vec::new(); o.inputs.len()];
            let ins: Vec<&[u8]> = copies
                .iter_mut()
                .enumerate()
                .map(|(i, copy)| input(bufs[o.inputs[i].index()], len_of(i), out_ptr, out_len, copy))
                .collect();
            let shapes: Vec<Vec<usize>> = (0..o.inputs.len()).map(shape_of).collect();
            // Safety: the output buffer is live, `out_len` bytes, not aliased by the inputs.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            let operands = FloatOperands {
                name: c.name(),
                ins: &ins,
                shapes: &shapes,
                out_shape: &out_shape,
                threads,
            };
            match c {
                Composite::ConvTranspose(ct) => operands.run(ct, out_ty.dtype, out),
                Composite::ConvWeightGrad(cw) => operands.run(cw, out_ty.dtype, out),
                Composite::MaxPool2d(m) => operands.run(m, out_ty.dtype, out),
                Composite::MaxPool2dGrad(m) => operands.run(m, out_ty.dtype, out),
                _ => unreachable!("matched above"),
            }
            .map_err(|d| err(k, d))?;
        }
        Op::Composite(Composite::ScaledDotProductAttention(a)) => {
            let mut copies: Vec<Vec<u8>> = vec![Vec::new(); o.inputs.len()];
            let ins: Vec<&[u8]> = copies
                .iter_mut()
                .enumerate()
                .map(|(i, copy)| input(bufs[o.inputs[i].index()], len_of(i), out_ptr, out_len, copy))
                .collect();
            let shapes: Vec<Vec<usize>> = (0..o.inputs.len()).map(shape_of).collect();
            let mask_bool = o.inputs.get(3).is_some_and(|&b| p.buffer(b).ty.dtype == DType::Bool);
            // Safety: the output buffer is live, `out_len` bytes, not aliased by the inputs.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            crate::attention::run_bytes(a, out_ty.dtype, &ins, &shapes, mask_bool, out, threads)
                .map_err(|d| err(k, d))?;
        }
        Op::Composite(c @ (Composite::MatMulInteger | Composite::ConvInteger(_))) => {
            let mut copies: Vec<Vec<u8>> = vec![Vec::new(); o.inputs.len()];
            let ins: Vec<&[u8]> = copies
                .iter_mut()
                .enumerate()
                .map(|(i, copy)| input(bufs[o.inputs[i].index()], len_of(i), out_ptr, out_len, copy))
                .collect();
            let dt = |i: usize| p.buffer(o.inputs[i]).ty.dtype;
            let zp = |i: usize| ins.get(i).map(|z| (*z, dt(i)));
            // Weights (and their zero points) are prepared once and kept for later runs.
            let fixed = |i: usize| o.inputs.get(i).is_none_or(|&b| p.buffer(b).kind.is_weight());
            let cache = cache.filter(|_| fixed(1) && fixed(3));
            let (s0, s1) = (shape_of(0), shape_of(1));
            // Safety: the output buffer is live, `out_len` bytes, not aliased by the inputs.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            match c {
                Composite::ConvInteger(c) => crate::qconv::run(
                    c,
                    (ins[0], dt(0), &s0),
                    (ins[1], dt(1), &s1),
                    zp(2),
                    zp(3),
                    out,
                    threads,
                    cache,
                    epi,
                )
                .map(|done| applied = done),
                _ => {
                    let (m, kk, n) = (s0[s0.len() - 2], s0[s0.len() - 1], s1[1]);
                    let rows = s0[..s0.len() - 1].iter().product();
                    crate::qgemm::run_cached(
                        ins[0],
                        dt(0),
                        ins[1],
                        dt(1),
                        zp(2),
                        zp(3),
                        (rows, m, kk, n),
                        out,
                        threads,
                        cache,
                    )
                }
            }
            .map_err(|d| err(k, d))?;
        }
        Op::Composite(Composite::AdamUpdate(a)) => {
            // Safety: the caller passes live buffers of the program's types.
            unsafe {
                with_results(p, k, o, bufs, |ins, outs| {
                    crate::optim::adam_bytes(a, out_ty.dtype, ins, outs, threads)
                })
            }
            .map_err(|d| err(k, d))?;
        }
        Op::Composite(c) if let Some((rec, reverse)) = crate::rnn::Recurrence::of(c) => {
            let shapes: Vec<Vec<usize>> = (0..o.inputs.len()).map(shape_of).collect();
            let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
            // The recurrent weight's panels are kept for later runs when it is a weight.
            let cache = cache.filter(|_| p.buffer(o.inputs[1]).kind.is_weight());
            // Safety: the caller passes live buffers of the program's types.
            unsafe {
                with_results(p, k, o, bufs, |ins, outs| {
                    crate::rnn::run_native(rec, reverse, out_ty.dtype, &shapes, ins, outs, threads, cache)
                })
            }
            .map_err(|d| err(k, d))?;
        }
        Op::Composite(Composite::Gelu(gelu)) => {
            let x = input(bufs[o.inputs[0].index()], len_of(0), out_ptr, out_len, &mut copy);
            // Safety: the output buffer is live, `out_len` bytes, and not aliased by `x`.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            let x = elems::<f32>(x, "gelu operand").map_err(|d| err(k, d))?;
            let out = elems_mut::<f32>(out, "gelu result").map_err(|d| err(k, d))?;
            if x.len() != out.len() {
                return Err(err(k, format!("gelu of {} elements into {}", x.len(), out.len())));
            }
            let op = if gelu.approximate {
                crate::ewise::Unary::GeluTanh
            } else {
                crate::ewise::Unary::Gelu
            };
            crate::ewise::unary(op, x, out, threads);
        }
        Op::Composite(c) if crate::rows::of(c).is_some() => {
            let (op, g) = crate::rows::geometry(c, &shape_of(0)).map_err(|d| err(k, d))?;
            let x = input(bufs[o.inputs[0].index()], len_of(0), out_ptr, out_len, &mut copy);
            let (mut wcopy, mut bcopy) = (Vec::new(), Vec::new());
            let affine = if o.inputs.len() == 3 {
                let n = g.n * size;
                Some((
                    input(bufs[o.inputs[1].index()], n, out_ptr, out_len, &mut wcopy),
                    input(bufs[o.inputs[2].index()], n, out_ptr, out_len, &mut bcopy),
                ))
            } else {
                None
            };
            // Safety: the output buffer is live, `out_len` bytes, and not aliased by the inputs.
            let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
            crate::rows::run(op, out_ty.dtype, g, x, affine, out, threads).map_err(|d| err(k, d))?;
        }
        other => return Err(err(k, format!("no native implementation of `{}`", other.name()))),
    }
    Ok(applied)
}

/// `f(operands, results)` for a kernel with several results, each operand and result as its
/// buffer's bytes; operands that share bytes with a result (the memory plan may place them
/// so) are copied first.
///
/// # Safety
/// As [`run`]: `bufs` holds live buffers of the program's types.
unsafe fn with_results<R>(
    p: &KernelProgram,
    k: &Kernel,
    o: &OpaqueKernel,
    bufs: &[*mut u8],
    f: impl FnOnce(&[&[u8]], Vec<&mut [u8]>) -> R,
) -> R {
    let outs: Vec<(*mut u8, usize)> = k
        .outputs
        .iter()
        .map(|b| (bufs[b.index()], crate::model::byte_len(p.buffer(*b))))
        .collect();
    let mut copies: Vec<Vec<u8>> = vec![Vec::new(); o.inputs.len()];
    let ins: Vec<&[u8]> = copies
        .iter_mut()
        .zip(&o.inputs)
        .map(|(copy, b)| {
            let (src, len) = (bufs[b.index()] as *const u8, crate::model::byte_len(p.buffer(*b)));
            // Safety: the caller passes live buffers of their types' lengths.
            let view = unsafe { std::slice::from_raw_parts(src, len) };
            if outs.iter().any(|&(out, n)| overlaps(src, len, out, n)) {
                *copy = view.to_vec();
                &copy[..]
            } else {
                view
            }
        })
        .collect();
    // Safety: the results are live, as long as their types, disjoint from each other and
    // (after the copies) from the operands.
    let outs = outs
        .iter()
        .map(|&(ptr, n)| unsafe { std::slice::from_raw_parts_mut(ptr, n) })
        .collect();
    f(&ins, outs)
}

/// Fill `out` (elements of `size` bytes) by `fill(first_element, chunk)`, split across up to
/// `threads` threads when it is large enough to be worth it.
fn fill_chunks(out: &mut [u8], size: usize, threads: usize, fill: impl Fn(usize, &mut [u8]) + Sync) {
    const MIN_ELEMENTS: usize = 1 << 16;
    let n = out.len() / size.max(1);
    let chunks = threads.min(n / MIN_ELEMENTS).max(1);
    if chunks == 1 {
        fill(0, out);
        return;
    }
    let per = n.div_ceil(chunks);
    let (len, base) = (out.len(), crate::contraction::SendPtr(out.as_mut_ptr()));
    crate::par::par_units(
        chunks,
        threads,
        || (),
        |_, c| {
            let (lo, hi) = (c * per * size, ((c + 1) * per * size).min(len));
            // Safety: chunks are disjoint byte ranges of `out`.
            fill(c * per, unsafe {
                std::slice::from_raw_parts_mut(base.get().add(lo), hi - lo)
            });
        },
    );
}

/// A `random` op of static shape run on its own, outside a program (eager mode): its output
/// filled straight from the definition in parallel chunks, as a program's generator kernel
/// fills its buffer — the reference's bits without its f64 tensor.
pub fn random(r: &oar_ir::ops::Random, threads: usize) -> Result<TensorData, String> {
    let shape = oar_ir::Shape(r.shape.clone())
        .as_static()
        .ok_or_else(|| format!("random: shape {:?} is not bound", r.shape))?;
    if !r.dtype.is_float() {
        return Err(format!("random needs a float dtype, got {}", r.dtype));
    }
    let len = oar_ir::tensor_data::checked_byte_len(r.dtype, &shape).map_err(|e| format!("random output: {e}"))?;
    let mut out = vec![0u8; len];
    fill_chunks(&mut out, r.dtype.size_bytes(), threads, |first, chunk| {
        r.write_elements(first, chunk)
    });
    TensorData::from_bytes(r.dtype, shape, out).map_err(|e| format!("random output: {e}"))
}

/// `(outer, n, inner)`: the lanes along `axis` of a row-major `shape` — lane `(r, i)` holds the
/// elements at `(r·n + j)·inner + i` for `j < n`.
fn lanes(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// Whether two byte ranges share memory.
fn overlaps(a: *const u8, a_len: usize, b: *const u8, b_len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a < b + b_len && b < a + a_len
}

/// One little-endian integer or bool element, as i64.
fn read_int(dtype: DType, b: &[u8]) -> i64 {
    match dtype {
        DType::I8 => b[0] as i8 as i64,
        DType::U8 | DType::Bool => b[0] as i64,
        DType::I32 => i32::from_le_bytes(b[..4].try_into().unwrap()) as i64,
        _ => i64::from_le_bytes(b[..8].try_into().unwrap()),
    }
}

/// The indices of an index buffer (i32 or i64) as i64.
///
/// # Safety
/// The buffer is live and holds its static type's bytes.
unsafe fn read_indices(p: &KernelProgram, id: oar_ir::kernel::BufferId, ptr: *const u8) -> Vec<i64> {
    let ty = &p.buffer(id).ty;
    let n: usize = static_shape(ty).iter().product();
    // Safety: per the contract.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, n * ty.dtype.size_bytes()) };
    match ty.dtype {
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        _ => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
    }
}

/// `scatter(data, indices, updates)` along the axis, as the reference defines it: negative
/// indices count from the end, `replace` lets the last update win, `add` sums floats in f64 and
/// rounds once (so repeated indices give the reference's bits), wraps integers, ors booleans.
///
/// # Safety
/// As [`run`]; `out` is the kernel's output buffer of `out_len` bytes.
unsafe fn scatter(
    p: &KernelProgram,
    k: &Kernel,
    o: &OpaqueKernel,
    sc: &Scatter,
    bufs: &[*mut u8],
    out_ptr: *mut u8,
    out_len: usize,
) -> Result<(), BackendError> {
    let out_ty = &p.buffer(k.outputs[0]).ty;
    let (dt, w) = (out_ty.dtype, out_ty.dtype.size_bytes());
    let ds = static_shape(out_ty);
    let (outer, n, inner) = lanes(&ds, sc.axis);
    // Safety: live index buffer.
    let raw = unsafe { read_indices(p, o.inputs[1], bufs[o.inputs[1].index()]) };
    let ks = normalized(k, &raw, n, "scatter", sc.axis)?;
    let upd_len = outer * ks.len() * inner * w;
    let (mut c0, mut c2) = (Vec::new(), Vec::new());
    let data = input(bufs[o.inputs[0].index()], out_len, out_ptr, out_len, &mut c0);
    let upd = input(bufs[o.inputs[2].index()], upd_len, out_ptr, out_len, &mut c2);
    // Safety: live, `out_len` bytes, aliased by neither `data` nor `upd` (copied if they were).
    let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, out_len) };
    if data.as_ptr() != out.as_ptr() {
        out.copy_from_slice(data);
    }
    let row = inner * w;
    // Every (outer, index) pair names a row of `inner` elements of the output.
    let nk = ks.len();
    let ks = &ks;
    let pairs = || {
        (0..outer).flat_map(move |r| {
            ks.iter()
                .enumerate()
                .map(move |(q, &j)| ((r * n + j) * row, (r * nk + q) * row))
        })
    };
    match sc.reduce {
        ScatterReduce::Replace => {
            for (dst, src) in pairs() {
                out[dst..dst + row].copy_from_slice(&upd[src..src + row]);
            }
        }
        ScatterReduce::Add if dt.is_float() => {
            let mut seen = ks.to_vec();
            seen.sort_unstable();
            seen.dedup();
            if dt == DType::F64 || seen.len() == nk {
                // Each element gets at most one f64 sum per row pair: round it directly.
                for (dst, src) in pairs() {
                    for e in 0..inner {
                        let (a, b) = (dst + e * w, src + e * w);
                        let v = read_as_f64(dt, &out[a..a + w]) + read_as_f64(dt, &upd[b..b + w]);
                        store_f64_as(dt, v, &mut out[a..a + w]);
                    }
                }
            } else {
                // Repeated indices: sum in f64 over the whole output, round once at the end.
                let mut acc: Vec<f64> = out.chunks_exact(w).map(|c| read_as_f64(dt, c)).collect();
                for (dst, src) in pairs() {
                    for e in 0..inner {
                        acc[dst / w + e] += read_as_f64(dt, &upd[src + e * w..src + (e + 1) * w]);
                    }
                }
                for (c, v) in out.chunks_exact_mut(w).zip(acc) {
                    store_f64_as(dt, v, c);
                }
            }
        }
        ScatterReduce::Add => {
            for (dst, src) in pairs() {
                for e in 0..inner {
                    let (a, b) = (dst + e * w, src + e * w);
                    let v = read_int(dt, &out[a..a + w]);
                    let u = read_int(dt, &upd[b..b + w]);
                    let sum = if dt == DType::Bool {
                        i64::from(v != 0 || u != 0)
                    } else {
                        v.wrapping_add(u)
                    };
                    // Little-endian truncation is the two's-complement wrap to the dtype.
                    out[a..a + w].copy_from_slice(&sum.to_le_bytes()[..w]);
                }
            }
        }
    }
    Ok(())
}

/// Convert the elements of `x` (`from`) into `out` (`to`): f16/bf16 to f32 exactly, f32 to
/// f16/bf16 rounded to nearest even (the reference's casts).
pub(crate) fn half_convert(from: DType, to: DType, x: &[u8], out: &mut [u8]) {
    use crate::ewise::{Half, narrow, widen};
    let half = |d: DType| Half::of(d).unwrap_or(Half::Bf16);
    let n = out.len() / to.size_bytes();
    match (from, to) {
        (DType::F16 | DType::BF16, _) => {
            match (
                bytemuck::try_cast_slice::<u8, u16>(&x[..2 * n]),
                bytemuck::try_cast_slice_mut::<u8, f32>(out),
            ) {
                (Ok(src), Ok(dst)) => widen(half(from), src, dst),
                _ => {
                    for (i, o) in out.chunks_exact_mut(4).enumerate() {
                        let h = [u16::from_le_bytes([x[2 * i], x[2 * i + 1]])];
                        let mut v = [0f32];
                        widen(half(from), &h, &mut v);
                        o.copy_from_slice(&v[0].to_le_bytes());
                    }
                }
            }
        }
        _ => match (
            bytemuck::try_cast_slice::<u8, f32>(&x[..4 * n]),
            bytemuck::try_cast_slice_mut::<u8, u16>(out),
        ) {
            (Ok(src), Ok(dst)) => narrow(half(to), src, dst),
            _ => {
                for i in 0..n {
                    let v = [f32::from_le_bytes(x[4 * i..4 * i + 4].try_into().unwrap())];
                    let mut h = [0u16];
                    narrow(half(to), &v, &mut h);
                    out[2 * i..2 * i + 2].copy_from_slice(&h[0].to_le_bytes());
                }
            }
        },
    }
}

/// The element types of [`FloatKernel`]s.
trait FloatElem: crate::contraction::Elem + crate::pool_grad::Float + crate::pool::Lane {}
impl FloatElem for f32 {}
impl FloatElem for f64 {}

/// A native composite on f32 or f64 operands, one body for both.
trait FloatKernel {
    /// `out = op(ins)`, every operand of dtype `T`.
    fn run<T: FloatElem>(
        &self,
        ins: &[&[T]],
        shapes: &[Vec<usize>],
        out: (&mut [T], &[usize]),
        threads: usize,
    ) -> Result<(), String>;

    /// The kernel on f16/bf16 operands (their bits), where it widens them itself as it goes;
    /// `None`: [`FloatOperands::run`] widens whole operands for [`FloatKernel::run`].
    fn run_half(
        &self,
        _half: crate::ewise::Half,
        _ins: &[&[u16]],
        _shapes: &[Vec<usize>],
        _out: (&mut [u16], &[usize]),
        _threads: usize,
    ) -> Option<Result<(), String>> {
        None
    }
}

impl FloatKernel for ConvTranspose {
    fn run<T: FloatElem>(
        &self,
        ins: &[&[T]],
        shapes: &[Vec<usize>],
        out: (&mut [T], &[usize]),
        threads: usize,
    ) -> Result<(), String> {
        let bias = ins.get(2).copied();
        crate::conv_grad::conv_transpose_into(self, (ins[0], &shapes[0]), (ins[1], &shapes[1]), bias, out, threads)
    }
}

impl FloatKernel for ConvWeightGrad {
    fn run<T: FloatElem>(
        &self,
        ins: &[&[T]],
        shapes: &[Vec<usize>],
        out: (&mut [T], &[usize]),
        threads: usize,
    ) -> Result<(), String> {
        crate::conv_grad::conv_weight_grad_into(self, (ins[0], &shapes[0]), (ins[1], &shapes[1]), out, threads)
    }
}

impl FloatKernel for MaxPool2d {
    fn run<T: FloatElem>(
        &self,
        ins: &[&[T]],
        shapes: &[Vec<usize>],
        out: (&mut [T], &[usize]),
        threads: usize,
    ) -> Result<(), String> {
        crate::pool::max_pool2d_into((ins[0], &shapes[0]), out, self, threads)
    }

    fn run_half(
        &self,
        half: crate::ewise::Half,
        ins: &[&[u16]],
        shapes: &[Vec<usize>],
        out: (&mut [u16], &[usize]),
        threads: usize,
    ) -> Option<Result<(), String>> {
        // Widened plane by plane inside the kernel.
        Some(crate::pool::max_pool2d_half_into(
            half,
            (ins[0], &shapes[0]),
            out,
            self,
            threads,
        ))
    }
}

impl FloatKernel for MaxPool2dGrad {
    fn run<T: FloatElem>(
        &self,
        ins: &[&[T]],
        shapes: &[Vec<usize>],
        out: (&mut [T], &[usize]),
        threads: usize,
    ) -> Result<(), String> {
        crate::pool_grad::max_pool2d_vjp_into(
            (ins[0], &shapes[0]),
            (ins[1], &shapes[1]),
            self.kernel,
            self.stride,
            self.padding,
            out.0,
            threads,
        )
    }

    fn run_half(
        &self,
        half: crate::ewise::Half,
        ins: &[&[u16]],
        shapes: &[Vec<usize>],
        out: (&mut [u16], &[usize]),
        threads: usize,
    ) -> Option<Result<(), String>> {
        // Widened block of planes by block inside the kernel.
        Some(crate::pool_grad::max_pool2d_vjp_half_into(
            half,
            (ins[0], &shapes[0]),
            (ins[1], &shapes[1]),
            self.kernel,
            self.stride,
            self.padding,
            out.0,
            threads,
        ))
    }
}

/// A native composite's operands as bytes, with their shapes.
struct FloatOperands<'a> {
    name: &'a str,
    ins: &'a [&'a [u8]],
    shapes: &'a [Vec<usize>],
    out_shape: &'a [usize],
    threads: usize,
}

impl FloatOperands<'_> {
    /// `kernel` on the operands seen as `dtype` (f32 or f64; f16/bf16 widened to f32).
    fn run(&self, kernel: &impl FloatKernel, dtype: DType, out: &mut [u8]) -> Result<(), String> {
        fn typed<T: FloatElem>(ops: &FloatOperands, kernel: &impl FloatKernel, out: &mut [u8]) -> Result<(), String> {
            let ins = ops
                .ins
                .iter()
                .map(|b| {
                    bytemuck::try_cast_slice::<u8, T>(b).map_err(|e| format!("{}: unaligned operand: {e}", ops.name))
                })
                .collect::<Result<Vec<&[T]>, String>>()?;
            let out: &mut [T] =
                bytemuck::try_cast_slice_mut(out).map_err(|e| format!("{}: unaligned output: {e}", ops.name))?;
            kernel.run(&ins, ops.shapes, (out, ops.out_shape), ops.threads)
        }
        match dtype {
            DType::F32 => typed::<f32>(self, kernel, out),
            DType::F64 => typed::<f64>(self, kernel, out),
            DType::F16 | DType::BF16 => {
                let half = crate::ewise::Half::of(dtype).expect("a half dtype");
                let bits: Result<Vec<&[u16]>, _> = self.ins.iter().map(|b| bytemuck::try_cast_slice(b)).collect();
                if let (Ok(ins), Ok(out)) = (bits, bytemuck::try_cast_slice_mut::<u8, u16>(&mut *out))
                    && let Some(done) = kernel.run_half(half, &ins, self.shapes, (out, self.out_shape), self.threads)
                {
                    return done;
                }
                // Operands widened to f32 (exact), the f32 kernel (f32 accumulation), the
                // result rounded once to the half dtype.
                // (Per-thread scratch, not fresh allocations: a fresh vector's pages fault in
                // on every call.)
                let wide: Vec<crate::scratch::Pooled<f32>> = self
                    .ins
                    .iter()
                    .map(|b| {
                        let mut w = crate::scratch::Pooled::<f32>::take(b.len() / 2);
                        fill_chunks(bytemuck::cast_slice_mut(&mut w), 4, self.threads, |first, chunk| {
                            half_convert(dtype, DType::F32, &b[first * 2..], chunk)
                        });
                        w
                    })
                    .collect();
                let ins: Vec<&[u8]> = wide.iter().map(|w| bytemuck::cast_slice(&w[..])).collect();
                let mut wide_out = crate::scratch::Pooled::<f32>::take(out.len() / 2);
                wide_out.fill(0.0);
                let ops = FloatOperands { ins: &ins, ..*self };
                typed::<f32>(&ops, kernel, bytemuck::cast_slice_mut(&mut wide_out[..]))?;
                let src: &[u8] = bytemuck::cast_slice(&wide_out[..]);
                fill_chunks(out, 2, self.threads, |first, chunk| {
                    half_convert(DType::F32, dtype, &src[first * 4..], chunk)
                });
                Ok(())
            }
            other => Err(format!("{}: no native kernel for {other}", self.name)),
        }
    }
}
