//! Scaled dot-product attention `softmax(scale · q kᵀ + mask) v` as one kernel, forward and
//! gradients, on f32/f64 — the `[.., L, S]` score tensor is never materialized.
//!
//! Work is split by batch entry (every leading index of q, k, v) and block of query rows
//! ([`block_rows`]: 32 to 128). For a block: its scores `scale · q_blk kᵀ` (one GEMM, the scale in the product),
//! masked — `causal` keys past the block's last query are never computed and those inside the
//! block get -inf; a bool mask puts -inf where it is false, a float mask is added (either
//! broadcast from any shape that broadcasts to the scores) — then softmax by the row kernels
//! ([`crate::rows`], the host's vector width), then `p v_blk` (one GEMM) into the output rows.
//! A row whose every key is masked is NaN, as the definition's is.
//!
//! The gradients recompute each block's probabilities `p` (nothing is saved from the forward)
//! and, with `dO` the cotangent: `dv += pᵀ dO`, `dp = dO vᵀ`, `ds = scale · p ∘ (dp - rowsum(p ∘ dp))`,
//! `dq = ds k`, `dk += dsᵀ q` — five GEMMs per block. A batch entry's blocks run on one
//! thread (they accumulate into the same `dk`, `dv`); with fewer entries than threads the GEMMs
//! split themselves.
//!
//! What is kept native ([`supported`]): q, k, v of one float dtype with the same leading dims
//! (the definition broadcasts them; other shapes decompose), a mask that broadcasts to the
//! scores; the float mask's own gradient is left to the definition.

use crate::contraction::{Elem, Mat, SendPtr, gemm_parallelism, gemm_scaled_into, written_zeros};
use crate::native::{elems, elems_mut};
use crate::par::par_units;
use gemm::Parallelism;
use oar_ir::ops::ScaledDotProductAttention;
use oar_ir::{DType, TensorData, TensorType};

/// Query rows per block at least (causal attention: always, so that a block computes few
/// keys past its diagonal).
const BLOCK: usize = 32;

/// Query rows per block at most, and score elements per block at most (64 KB of f32: a
/// block's scores and probabilities stay in L2).
const MAX_BLOCK: usize = 128;
const MAX_BLOCK_SCORES: usize = 1 << 14;

/// Query rows per block for `batch` entries of `l` queries over `s` keys: from [`BLOCK`] up to
/// [`MAX_BLOCK`] while the scores fit [`MAX_BLOCK_SCORES`] and each of `threads` still gets two
/// blocks (K and V are packed once per block's GEMMs: a transformer's 128-query heads ran 20%
/// faster as one block than as four).
fn block_rows(batch: usize, l: usize, s: usize, causal: bool, threads: usize) -> usize {
    let units = 2 * threads.max(1);
    let mut rows = BLOCK;
    while !causal
        && rows < MAX_BLOCK
        && rows < l
        && 2 * rows * s <= MAX_BLOCK_SCORES
        && batch * l.div_ceil(2 * rows) >= units
    {
        rows *= 2;
    }
    rows
}

/// The sizes of one attention: `batch` entries of `q[L, E]`, `k[S, E]`, `v[S, Ev]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Geometry {
    batch: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    scale: f64,
    causal: bool,
    mask: Option<MaskLayout>,
    /// Query rows per block ([`block_rows`]).
    block: usize,
}

/// Where a broadcast mask's element for (batch entry, query, key) is.
#[derive(Clone, Debug, PartialEq)]
struct MaskLayout {
    /// Offset of each batch entry's `[L, S]` view.
    offsets: Vec<usize>,
    /// Element strides along the query and key axes (0: broadcast).
    rs: usize,
    cs: usize,
}

impl Geometry {
    /// The geometry of `op` on operands of these shapes (q, k, v, then the mask's, if any).
    /// `Ok(None)`: shapes the kernel does not take (leading dims that differ between q, k and
    /// v); `Err`: shapes the op itself rejects.
    pub fn of(op: &ScaledDotProductAttention, shapes: &[&[usize]]) -> Result<Option<Geometry>, String> {
        let (q, k, v) = match shapes {
            [q, k, v] | [q, k, v, _] => (*q, *k, *v),
            _ => return Err(format!("sdpa: expects 3 or 4 operands, got {}", shapes.len())),
        };
        let r = q.len();
        if r < 2 || k.len() != r || v.len() != r {
            return Ok(None);
        }
        let lead = &q[..r - 2];
        if &k[..r - 2] != lead || &v[..r - 2] != lead {
            return Ok(None);
        }
        let (l, e, s, ev) = (q[r - 2], q[r - 1], k[r - 2], v[r - 1]);
        if k[r - 1] != e || v[r - 2] != s {
            return Err(format!("sdpa: q {q:?}, k {k:?} and v {v:?} do not chain (q·kᵀ·v)"));
        }
        let batch = lead.iter().product();
        let mask = match shapes.get(3) {
            None => None,
            Some(m) => {
                let mut scores = lead.to_vec();
                scores.extend([l, s]);
                Some(MaskLayout::of(m, &scores)?)
            }
        };
        let scale = op.scale.map_or(1.0 / (e as f64).sqrt(), |f| f.0);
        Ok(Some(Geometry {
            batch,
            l,
            s,
            e,
            ev,
            scale,
            causal: op.causal,
            mask,
            block: block_rows(batch, l, s, op.causal, rayon::current_num_threads()),
        }))
    }

    /// The output's element count, `batch · L · Ev`.
    fn out_len(&self) -> usize {
        self.batch * self.l * self.ev
    }

    /// Keys a block of query rows ending before `end` sees (causal: up to the last query).
    fn keys(&self, end: usize) -> usize {
        if self.causal { end.min(self.s) } else { self.s }
    }

    /// Blocks of query rows per batch entry.
    fn blocks(&self) -> usize {
        self.l.div_ceil(self.block)
    }
}

impl MaskLayout {
    /// The layout of a mask of shape `m` broadcast to `scores` (`[.., L, S]`).
    fn of(m: &[usize], scores: &[usize]) -> Result<MaskLayout, String> {
        let r = scores.len();
        if m.len() > r {
            return Err(format!("sdpa: mask {m:?} has more axes than the scores {scores:?}"));
        }
        // The mask's row-major strides, aligned to the scores' axes from the right; 0 where
        // it broadcasts.
        let mut strides = vec![0usize; r];
        let mut step = 1usize;
        for (i, &n) in m.iter().enumerate().rev() {
            let at = r - m.len() + i;
            if n != 1 && n != scores[at] {
                return Err(format!("sdpa: mask {m:?} does not broadcast to the scores {scores:?}"));
            }
            if n != 1 {
                strides[at] = step;
            }
            step *= n;
        }
        let lead = &scores[..r - 2];
        let batch: usize = lead.iter().product();
        let offsets = (0..batch)
            .map(|b| {
                let (mut rest, mut off) = (b, 0);
                for (a, &n) in lead.iter().enumerate().rev() {
                    off += (rest % n) * strides[a];
                    rest /= n;
                }
                off
            })
            .collect();
        Ok(MaskLayout {
            offsets,
            rs: strides[r - 2],
            cs: strides[r - 1],
        })
    }
}

/// Whether the cpu backend keeps `op` on operands of these types whole (the kernel computes
/// it): f32/f64 q, k, v of one dtype with the same leading dims, static shapes, a bool or
/// same-dtype mask.
pub fn supported(op: &ScaledDotProductAttention, inputs: &[TensorType]) -> bool {
    let Some(dtype) = inputs.first().map(|t| t.dtype) else {
        return false;
    };
    if !matches!(dtype, DType::F32 | DType::F64) || inputs.len() < 3 || inputs[1..3].iter().any(|t| t.dtype != dtype) {
        return false;
    }
    if inputs
        .get(3)
        .is_some_and(|m| m.dtype != DType::Bool && m.dtype != dtype)
    {
        return false;
    }
    let Some(shapes) = inputs.iter().map(|t| t.shape.as_static()).collect::<Option<Vec<_>>>() else {
        return false;
    };
    let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    matches!(Geometry::of(op, &shapes), Ok(Some(_)))
}

/// A mask's values.
#[derive(Clone, Copy)]
enum Mask<'a, T> {
    None,
    /// Bool bytes: nonzero keeps the position.
    Keep(&'a [u8]),
    /// Added to the scaled scores.
    Add(&'a [T]),
}

/// The float types of the kernel.
pub(crate) trait AttnFloat:
    Elem + bytemuck::Pod + oar_ir::Element + PartialOrd + std::ops::Sub<Output = Self>
{
    /// -∞
    const NEG_INF: Self;
    /// Softmax of each row of `n` elements of `x` into `out`.
    fn softmax_rows(x: &[Self], out: &mut [Self], n: usize);
}

impl AttnFloat for f32 {
    const NEG_INF: f32 = f32::NEG_INFINITY;
    fn softmax_rows(x: &[f32], out: &mut [f32], n: usize) {
        crate::rows::softmax_rows_f32(x, out, n)
    }
}

impl AttnFloat for f64 {
    const NEG_INF: f64 = f64::NEG_INFINITY;
    fn softmax_rows(x: &[f64], out: &mut [f64], n: usize) {
        crate::rows::softmax_rows_f64(x, out, n)
    }
}

/// Operand slices of one dtype.
struct Operands<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    mask: Mask<'a, T>,
}

impl<'a, T: AttnFloat> Operands<'a, T> {
    /// The operands as `T` (q, k, v, then an optional mask of bool bytes or `T`), checked
    /// against `g`'s sizes.
    fn of(g: &Geometry, ins: &[&'a [u8]], mask_bool: bool) -> Result<Self, String> {
        let cast = |b: &'a [u8], what: &str, len: usize| -> Result<&'a [T], String> {
            let s: &[T] = elems(b, &format!("sdpa {what}"))?;
            if s.len() != len {
                return Err(format!("sdpa: {what} holds {} elements, expected {len}", s.len()));
            }
            Ok(s)
        };
        let (b, l, s, e, ev) = (g.batch, g.l, g.s, g.e, g.ev);
        let q = cast(ins[0], "q", b * l * e)?;
        let k = cast(ins[1], "k", b * s * e)?;
        let v = cast(ins[2], "v", b * s * ev)?;
        let mask = match (ins.get(3), &g.mask) {
            (None, _) => Mask::None,
            (Some(m), Some(layout)) => {
                // The largest element the layout addresses.
                let last = layout.offsets.iter().max().copied().unwrap_or(0)
                    + l.saturating_sub(1) * layout.rs
                    + s.saturating_sub(1) * layout.cs;
                let len = if b * l * s == 0 { 0 } else { last + 1 };
                if mask_bool {
                    if m.len() < len {
                        return Err(format!("sdpa: mask holds {} elements, needs {len}", m.len()));
                    }
                    Mask::Keep(m)
                } else {
                    let t: &[T] = elems(m, "sdpa mask")?;
                    if t.len() < len {
                        return Err(format!("sdpa: mask holds {} elements, needs {len}", t.len()));
                    }
                    Mask::Add(t)
                }
            }
            (Some(_), None) => return Err("sdpa: a mask without its shape".into()),
        };
        Ok(Operands { q, k, v, mask })
    }
}

/// Per-thread buffers: a block's scores and probabilities (then its `ds`).
struct Scratch<T> {
    scores: Vec<T>,
    probs: Vec<T>,
}

impl<T: AttnFloat> Scratch<T> {
    fn new(g: &Geometry) -> Self {
        let n = g.block.min(g.l) * g.s;
        Scratch {
            scores: written_zeros(n, T::ZERO),
            probs: written_zeros(n, T::ZERO),
        }
    }
}

/// The probabilities of batch entry `b`'s query rows `i0..i0 + rows` over its first `keys`
/// keys, into `sc.probs` (`rows × keys`, row-major).
fn block_probs<T: AttnFloat>(
    g: &Geometry,
    ops: &Operands<T>,
    (b, i0, rows, keys): (usize, usize, usize, usize),
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let (e, n) = (g.e, rows * keys);
    let scores = &mut sc.scores[..n];
    // Safety: q's rows i0.. of entry b and k's first `keys` rows of entry b are in bounds
    // (checked by `Operands::of`); `scores` holds rows × keys elements.
    unsafe {
        gemm_scaled_into(
            rows,
            keys,
            e,
            scores.as_mut_ptr(),
            keys as isize,
            Mat {
                ptr: ops.q.as_ptr().add((b * g.l + i0) * e),
                rs: e as isize,
                cs: 1,
            },
            Mat {
                ptr: ops.k.as_ptr().add(b * g.s * e),
                rs: 1,
                cs: e as isize,
            },
            false,
            T::from_f64(g.scale),
            par,
        );
    }
    for (r, row) in scores.chunks_exact_mut(keys).enumerate() {
        let i = i0 + r;
        if g.causal && i + 1 < keys {
            row[i + 1..].fill(T::NEG_INF);
        }
        let Some(layout) = &g.mask else { continue };
        let base = layout.offsets[b] + i * layout.rs;
        match ops.mask {
            Mask::None => {}
            Mask::Keep(m) => {
                for (j, x) in row.iter_mut().enumerate() {
                    if m[base + j * layout.cs] == 0 {
                        *x = T::NEG_INF;
                    }
                }
            }
            Mask::Add(m) => {
                for (j, x) in row.iter_mut().enumerate() {
                    *x += m[base + j * layout.cs];
                }
            }
        }
    }
    T::softmax_rows(scores, &mut sc.probs[..n], keys);
}

/// The attention into `out` (`batch · L · Ev` elements).
fn forward<T: AttnFloat>(g: &Geometry, ops: &Operands<T>, out: &mut [T], threads: usize) {
    let units = g.batch * g.blocks();
    let flops = g.batch * g.l * g.s * (g.e + g.ev);
    let par = if units >= threads {
        Parallelism::None
    } else {
        gemm_parallelism(flops / units.max(1), threads)
    };
    let out_ptr = SendPtr(out.as_mut_ptr());
    par_units(
        units,
        threads,
        || Scratch::new(g),
        |sc, u| {
            let (b, blk) = (u / g.blocks(), u % g.blocks());
            let i0 = blk * g.block;
            let rows = g.block.min(g.l - i0);
            let keys = g.keys(i0 + rows);
            let dst = out_ptr.get();
            // Safety: unit u writes only rows i0..i0 + rows of entry b, `ev` elements each.
            let at = unsafe { dst.add((b * g.l + i0) * g.ev) };
            if keys == 0 {
                // No keys: an empty sum.
                unsafe { std::slice::from_raw_parts_mut(at, rows * g.ev).fill(T::ZERO) };
                return;
            }
            block_probs(g, ops, (b, i0, rows, keys), sc, par);
            // Safety: as above; `probs` holds rows × keys, v's entry b at least keys × ev.
            unsafe {
                gemm_scaled_into(
                    rows,
                    g.ev,
                    keys,
                    at,
                    g.ev as isize,
                    Mat {
                        ptr: sc.probs.as_ptr(),
                        rs: keys as isize,
                        cs: 1,
                    },
                    Mat {
                        ptr: ops.v.as_ptr().add(b * g.s * g.ev),
                        rs: g.ev as isize,
                        cs: 1,
                    },
                    false,
                    T::ONE,
                    par,
                );
            }
        },
    );
}

/// Gradient buffers (each `None` when not wanted).
struct Grads<T> {
    dq: Option<Vec<T>>,
    dk: Option<Vec<T>>,
    dv: Option<Vec<T>>,
}

/// `dq`, `dk`, `dv` of the attention for the cotangent `dy` (`batch · L · Ev`), as `wants`.
fn backward<T: AttnFloat>(g: &Geometry, ops: &Operands<T>, dy: &[T], wants: [bool; 3], threads: usize) -> Grads<T> {
    let (b, l, s, e, ev) = (g.batch, g.l, g.s, g.e, g.ev);
    let mut grads = Grads {
        dq: wants[0].then(|| written_zeros(b * l * e, T::ZERO)),
        dk: wants[1].then(|| written_zeros(b * s * e, T::ZERO)),
        dv: wants[2].then(|| written_zeros(b * s * ev, T::ZERO)),
    };
    let ptr = |v: &mut Option<Vec<T>>| v.as_mut().map(|v| SendPtr(v.as_mut_ptr()));
    let (dq, dk, dv) = (ptr(&mut grads.dq), ptr(&mut grads.dk), ptr(&mut grads.dv));
    let flops = b * l * s * (2 * e + 3 * ev);
    let par = if b >= threads {
        Parallelism::None
    } else {
        gemm_parallelism(flops / b.max(1), threads)
    };
    let mat = |ptr: *const T, rs: usize, cs: usize| Mat {
        ptr,
        rs: rs as isize,
        cs: cs as isize,
    };
    par_units(
        b,
        threads,
        || Scratch::new(g),
        |sc, bi| {
            for blk in 0..g.blocks() {
                let i0 = blk * g.block;
                let rows = g.block.min(l - i0);
                let keys = g.keys(i0 + rows);
                if keys == 0 {
                    continue;
                }
                block_probs(g, ops, (bi, i0, rows, keys), sc, par);
                let n = rows * keys;
                // Safety (every product below): unit bi touches only entry bi's rows of dq,
                // dk and dv; operand pointers stay inside entry bi's q, k, v and dy rows
                // (sizes checked by the callers); `probs` and `scores` hold rows × keys.
                let dy_blk = unsafe { dy.as_ptr().add((bi * l + i0) * ev) };
                if let Some(dv) = dv {
                    unsafe {
                        gemm_scaled_into(
                            keys,
                            ev,
                            rows,
                            dv.get().add(bi * s * ev),
                            ev as isize,
                            mat(sc.probs.as_ptr(), 1, keys),
                            mat(dy_blk, ev, 1),
                            true,
                            T::ONE,
                            par,
                        );
                    }
                }
                if dq.is_none() && dk.is_none() {
                    continue;
                }
                // dp = dO vᵀ, into `scores`.
                unsafe {
                    gemm_scaled_into(
                        rows,
                        keys,
                        ev,
                        sc.scores.as_mut_ptr(),
                        keys as isize,
                        mat(dy_blk, ev, 1),
                        mat(ops.v.as_ptr().add(bi * s * ev), 1, ev),
                        false,
                        T::ONE,
                        par,
                    );
                }
                // ds = scale · p ∘ (dp - Σ p ∘ dp), into `scores`.
                let scale = T::from_f64(g.scale);
                for (dp, p) in sc.scores[..n]
                    .chunks_exact_mut(keys)
                    .zip(sc.probs[..n].chunks_exact(keys))
                {
                    let mut d = T::ZERO;
                    for (&a, &b) in dp.iter().zip(p) {
                        d += a * b;
                    }
                    for (a, &b) in dp.iter_mut().zip(p) {
                        *a = scale * b * (*a - d);
                    }
                }
                let q_blk = unsafe { ops.q.as_ptr().add((bi * l + i0) * e) };
                let k_b = unsafe { ops.k.as_ptr().add(bi * s * e) };
                if let Some(dq) = dq {
                    unsafe {
                        gemm_scaled_into(
                            rows,
                            e,
                            keys,
                            dq.get().add((bi * l + i0) * e),
                            e as isize,
                            mat(sc.scores.as_ptr(), keys, 1),
                            mat(k_b, e, 1),
                            false,
                            T::ONE,
                            par,
                        );
                    }
                }
                if let Some(dk) = dk {
                    unsafe {
                        gemm_scaled_into(
                            keys,
                            e,
                            rows,
                            dk.get().add(bi * s * e),
                            e as isize,
                            mat(sc.scores.as_ptr(), 1, keys),
                            mat(q_blk, e, 1),
                            true,
                            T::ONE,
                            par,
                        );
                    }
                }
            }
        },
    );
    grads
}

/// The attention of `op` on operand bytes (q, k, v of `dtype`, then an optional mask of bool
/// bytes when `mask_bool` or of `dtype`) with these shapes, into `out`.
pub fn run_bytes(
    op: &ScaledDotProductAttention,
    dtype: DType,
    ins: &[&[u8]],
    shapes: &[Vec<usize>],
    mask_bool: bool,
    out: &mut [u8],
    threads: usize,
) -> Result<(), String> {
    let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    let g = Geometry::of(op, &shapes)?.ok_or_else(|| format!("sdpa: no native kernel for shapes {shapes:?}"))?;
    fn typed<T: AttnFloat>(
        g: &Geometry,
        ins: &[&[u8]],
        mask_bool: bool,
        out: &mut [u8],
        threads: usize,
    ) -> Result<(), String> {
        let ops = Operands::<T>::of(g, ins, mask_bool)?;
        let out: &mut [T] = elems_mut(out, "sdpa output")?;
        if out.len() != g.out_len() {
            return Err(format!(
                "sdpa: output holds {} elements, expected {}",
                out.len(),
                g.out_len()
            ));
        }
        forward(g, &ops, out, threads);
        Ok(())
    }
    match dtype {
        DType::F32 => typed::<f32>(&g, ins, mask_bool, out, threads),
        DType::F64 => typed::<f64>(&g, ins, mask_bool, out, threads),
        other => Err(format!("sdpa: no native kernel for {other}")),
    }
}

/// `[dq, dk, dv, dmask]` of the attention for the cotangent `dy`, each computed when `wants`
/// asks. `Ok(None)`: no native path (dtypes other than f32/f64, broadcast q/k/v, or the float
/// mask's gradient wanted) — use the definition's gradient.
pub fn vjp(
    op: &ScaledDotProductAttention,
    inputs: &[TensorData],
    dy: &TensorData,
    wants: &[bool],
    threads: usize,
) -> Result<Option<Vec<Option<TensorData>>>, String> {
    let want = |i: usize| wants.get(i) == Some(&true);
    let dtype = inputs.first().map(TensorData::dtype);
    let Some(dtype @ (DType::F32 | DType::F64)) = dtype else {
        return Ok(None);
    };
    if inputs.len() < 3 || want(3) || inputs[1..3].iter().any(|t| t.dtype() != dtype) || dy.dtype() != dtype {
        return Ok(None);
    }
    let mask_bool = match inputs.get(3).map(TensorData::dtype) {
        None | Some(DType::Bool) => true,
        Some(d) if d == dtype => false,
        Some(_) => return Ok(None),
    };
    let shapes: Vec<&[usize]> = inputs.iter().map(TensorData::shape).collect();
    let Some(g) = Geometry::of(op, &shapes)? else {
        return Ok(None);
    };
    if dy.shape().iter().product::<usize>() != g.out_len() {
        return Err(format!(
            "sdpa gradient: cotangent {:?} for q {:?}, v {:?}",
            dy.shape(),
            shapes[0],
            shapes[2]
        ));
    }
    fn typed<T: AttnFloat>(
        g: &Geometry,
        inputs: &[TensorData],
        dy: &TensorData,
        mask_bool: bool,
        wants: [bool; 3],
        threads: usize,
    ) -> Result<Vec<Option<TensorData>>, String> {
        let ins: Vec<&[u8]> = inputs.iter().map(TensorData::bytes).collect();
        let ops = Operands::<T>::of(g, &ins, mask_bool)?;
        let dys: &[T] = elems(dy.bytes(), "sdpa gradient's cotangent")?;
        let grads = backward(g, &ops, dys, wants, threads);
        let wrap = |v: Option<Vec<T>>, like: &TensorData| {
            v.map(|v| TensorData::from_vec(like.shape().to_vec(), v).map_err(|e| format!("sdpa gradient: {e}")))
                .transpose()
        };
        let mut out = vec![
            wrap(grads.dq, &inputs[0])?,
            wrap(grads.dk, &inputs[1])?,
            wrap(grads.dv, &inputs[2])?,
        ];
        if inputs.len() > 3 {
            out.push(None);
        }
        Ok(out)
    }
    let wants = [want(0), want(1), want(2)];
    match dtype {
        DType::F32 => typed::<f32>(&g, inputs, dy, mask_bool, wants, threads),
        _ => typed::<f64>(&g, inputs, dy, mask_bool, wants, threads),
    }
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::ops::Float;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    /// A case: leading dims, L, S, E, Ev, causal, scale, mask (shape, bool?).
    struct Case {
        lead: Vec<usize>,
        l: usize,
        s: usize,
        e: usize,
        ev: usize,
        causal: bool,
        scale: Option<f64>,
        mask: Option<(Vec<usize>, bool)>,
    }

    impl Case {
        fn shapes(&self) -> Vec<Vec<usize>> {
            let with = |a: usize, b: usize| [self.lead.clone(), vec![a, b]].concat();
            let mut v = vec![with(self.l, self.e), with(self.s, self.e), with(self.s, self.ev)];
            if let Some((m, _)) = &self.mask {
                v.push(m.clone());
            }
            v
        }

        fn op(&self) -> ScaledDotProductAttention {
            ScaledDotProductAttention {
                causal: self.causal,
                scale: self.scale.map(Float),
            }
        }

        /// Operand values (a bool mask as 0/1, keeping ~70%; the first key always kept).
        fn inputs(&self, seed: u64) -> Vec<Vec<f64>> {
            self.shapes()
                .iter()
                .enumerate()
                .map(|(i, sh)| {
                    let v = values(sh.iter().product(), seed + i as u64);
                    match &self.mask {
                        Some((_, true)) if i == 3 => v
                            .iter()
                            .enumerate()
                            .map(|(j, &x)| f64::from(x > -0.4 || j % sh[sh.len() - 1] == 0))
                            .collect(),
                        _ => v,
                    }
                })
                .collect()
        }

        /// The definition in f64, computed directly: every score, masked, softmax, · v.
        fn expect(&self, ins: &[Vec<f64>]) -> Vec<f64> {
            let (l, s, e, ev) = (self.l, self.s, self.e, self.ev);
            let batch: usize = self.lead.iter().product();
            let scale = self.scale.unwrap_or(1.0 / (e as f64).sqrt());
            let scores_shape = [self.lead.clone(), vec![l, s]].concat();
            let mut out = vec![0.0; batch * l * ev];
            for b in 0..batch {
                for i in 0..l {
                    let mut row: Vec<f64> = (0..s)
                        .map(|j| {
                            scale
                                * (0..e)
                                    .map(|c| ins[0][(b * l + i) * e + c] * ins[1][(b * s + j) * e + c])
                                    .sum::<f64>()
                        })
                        .collect();
                    for (j, x) in row.iter_mut().enumerate() {
                        if self.causal && j > i {
                            *x = f64::NEG_INFINITY;
                        }
                        if let Some((m, is_bool)) = &self.mask {
                            // The mask element by broadcasting: index of (b, i, j) in the scores,
                            // reduced to the mask's shape.
                            let mut idx = b * l * s + i * s + j;
                            let mut full = vec![0; scores_shape.len()];
                            for a in (0..scores_shape.len()).rev() {
                                full[a] = idx % scores_shape[a];
                                idx /= scores_shape[a];
                            }
                            let off = full[scores_shape.len() - m.len()..]
                                .iter()
                                .zip(m)
                                .fold(0, |o, (&f, &n)| o * n + if n == 1 { 0 } else { f });
                            let mv = ins[3][off];
                            if *is_bool {
                                if mv == 0.0 {
                                    *x = f64::NEG_INFINITY;
                                }
                            } else {
                                *x += mv;
                            }
                        }
                    }
                    let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = row.iter().map(|x| (x - mx).exp()).sum();
                    for c in 0..ev {
                        out[(b * l + i) * ev + c] = (0..s)
                            .map(|j| (row[j] - mx).exp() / sum * ins[2][(b * s + j) * ev + c])
                            .sum();
                    }
                }
            }
            out
        }

        fn bytes<T: oar_ir::Element>(&self, ins: &[Vec<f64>]) -> Vec<Vec<u8>> {
            ins.iter()
                .enumerate()
                .map(|(i, v)| match &self.mask {
                    Some((_, true)) if i == 3 => v.iter().map(|&x| x as u8).collect(),
                    _ => T::slice_to_le_bytes(&v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>()),
                })
                .collect()
        }

        fn run<T: oar_ir::Element + bytemuck::Pod>(&self, ins: &[Vec<f64>], threads: usize) -> Vec<f64> {
            let bytes = self.bytes::<T>(ins);
            let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
            let n = self.lead.iter().product::<usize>() * self.l * self.ev;
            let mut out = vec![T::from_f64(0.0); n];
            let mask_bool = matches!(self.mask, Some((_, true)));
            run_bytes(
                &self.op(),
                T::DTYPE,
                &refs,
                &self.shapes(),
                mask_bool,
                bytemuck::cast_slice_mut(&mut out),
                threads,
            )
            .unwrap();
            out.iter().map(|v| v.to_f64()).collect()
        }
    }

    fn cases() -> Vec<Case> {
        let case = |lead: &[usize], l, s, e, ev, causal, mask: Option<(&[usize], bool)>| Case {
            lead: lead.to_vec(),
            l,
            s,
            e,
            ev,
            causal,
            scale: None,
            mask: mask.map(|(m, b)| (m.to_vec(), b)),
        };
        vec![
            // Several blocks of query rows, L > S and L < S, causal both ways.
            case(&[2, 3], 70, 9, 5, 4, false, None),
            case(&[2, 3], 70, 9, 5, 4, true, None),
            case(&[3], 5, 40, 8, 3, true, None),
            case(&[], 33, 33, 4, 6, true, None),
            // Non-causal blocks grow with few keys ([`block_rows`]): 64-row blocks, the last
            // partial; and one whole-entry block per head.
            case(&[1], 300, 40, 8, 5, false, None),
            case(&[4], 128, 128, 8, 8, false, None),
            // Masks broadcast from every kind of shape.
            case(&[2, 3], 35, 7, 4, 4, false, Some((&[35, 7], true))),
            case(&[2, 3], 35, 7, 4, 4, true, Some((&[2, 1, 1, 7], true))),
            case(&[2, 3], 35, 7, 4, 4, false, Some((&[3, 35, 1], false))),
            case(&[2, 3], 35, 7, 4, 4, false, Some((&[2, 3, 35, 7], false))),
            Case {
                scale: Some(0.3),
                ..case(&[4], 12, 12, 16, 16, false, None)
            },
        ]
    }

    #[test]
    fn blocks_grow_while_scores_stay_small_and_threads_stay_busy() {
        // (batch, L, S, causal, threads) -> rows per block.
        for (args, rows) in [
            ((4, 128, 128, false, 2), 128),
            ((4, 128, 128, false, 4), 64),
            ((1, 300, 40, false, 2), 64),
            ((4, 128, 128, true, 2), 32),
            ((16, 512, 512, false, 2), 32),
            ((8, 20, 20, false, 2), 32),
        ] {
            let (b, l, s, c, t) = args;
            assert_eq!(block_rows(b, l, s, c, t), rows, "{args:?}");
        }
    }

    /// Forward against the definition in f64: f64 to 1e-12, f32 to 2e-6 (relative to the
    /// largest output), on one and two threads.
    #[test]
    fn attention_matches_the_definition() {
        for (n, case) in cases().iter().enumerate() {
            let ins = case.inputs(7 * n as u64);
            let want = case.expect(&ins);
            let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
            for threads in [1, 2] {
                for (got, tol) in [
                    (case.run::<f64>(&ins, threads), 1e-12),
                    (case.run::<f32>(&ins, threads), 2e-6),
                ] {
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!((g - w).abs() <= tol * scale, "case {n} element {i}: {g} vs {w}");
                    }
                }
            }
        }
    }

    /// A row with every key masked is NaN (the definition's softmax of -inf only).
    #[test]
    fn fully_masked_rows_are_nan() {
        let case = Case {
            lead: vec![1],
            l: 2,
            s: 3,
            e: 2,
            ev: 2,
            causal: false,
            scale: None,
            mask: Some((vec![2, 1], true)),
        };
        let mut ins = case.inputs(3);
        ins[3] = vec![1.0, 0.0];
        let got = case.run::<f32>(&ins, 1);
        assert!(
            got[..2].iter().all(|v| v.is_finite()) && got[2..].iter().all(|v| v.is_nan()),
            "{got:?}"
        );
    }

    /// Gradients against central finite differences of the f64 definition (`Σ dy ∘ out`):
    /// f64 to 1e-6 relative.
    #[test]
    fn gradients_match_finite_differences() {
        for (n, case) in cases().iter().enumerate().filter(|(n, _)| n % 2 == 0 || *n > 5) {
            let ins = case.inputs(11 * n as u64);
            let out_len = case.lead.iter().product::<usize>() * case.l * case.ev;
            let dy = values(out_len, 99 + n as u64);
            let loss = |ins: &[Vec<f64>]| case.expect(ins).iter().zip(&dy).map(|(a, b)| a * b).sum::<f64>();
            let shapes = case.shapes();
            let data: Vec<TensorData> = ins
                .iter()
                .zip(&shapes)
                .enumerate()
                .map(|(i, (v, sh))| match &case.mask {
                    Some((_, true)) if i == 3 => {
                        TensorData::from_vec(sh.clone(), v.iter().map(|&x| x != 0.0).collect::<Vec<bool>>()).unwrap()
                    }
                    _ => TensorData::from_vec(sh.clone(), v.clone()).unwrap(),
                })
                .collect();
            let dyt = TensorData::from_vec([case.lead.clone(), vec![case.l, case.ev]].concat(), dy.clone()).unwrap();
            let grads = vjp(&case.op(), &data, &dyt, &[true, true, true], 2).unwrap().unwrap();
            for (which, g) in grads.iter().take(3).enumerate() {
                let g = g.as_ref().unwrap().to_f64_vec();
                // A sample of elements (every one for small operands).
                let step = (g.len() / 40).max(1);
                for i in (0..g.len()).step_by(step) {
                    let h = 1e-5;
                    let mut plus = ins.clone();
                    plus[which][i] += h;
                    let mut minus = ins.clone();
                    minus[which][i] -= h;
                    let fd = (loss(&plus) - loss(&minus)) / (2.0 * h);
                    assert!(
                        (g[i] - fd).abs() <= 1e-6 * fd.abs().max(1.0),
                        "case {n} operand {which} element {i}: {} vs {fd}",
                        g[i]
                    );
                }
            }
        }
    }

    /// Shapes the kernel leaves to the definition, and shapes the op rejects.
    #[test]
    fn unsupported_and_malformed_shapes() {
        let op = ScaledDotProductAttention {
            causal: false,
            scale: None,
        };
        // k broadcast over q's leading dims: not native.
        assert_eq!(Geometry::of(&op, &[&[2, 3, 4], &[1, 5, 4], &[1, 5, 4]]).unwrap(), None);
        assert!(
            Geometry::of(&op, &[&[2, 3, 4], &[2, 5, 3], &[2, 5, 4]])
                .unwrap_err()
                .contains("chain")
        );
        assert!(
            Geometry::of(&op, &[&[2, 3, 4], &[2, 5, 4], &[2, 5, 4], &[3, 6]])
                .unwrap_err()
                .contains("broadcast")
        );
        let t = |s: &[usize]| TensorType::of(DType::F32, s);
        assert!(supported(&op, &[t(&[2, 3, 4]), t(&[2, 5, 4]), t(&[2, 5, 6])]));
        assert!(!supported(
            &op,
            &[t(&[2, 3, 4]), t(&[2, 5, 4]), TensorType::of(DType::F64, &[2, 5, 6])]
        ));
        // Too few mask elements for the shape claimed: an error, not a read past the end.
        let (q, kv) = (vec![0u8; 2 * 3 * 4 * 4], vec![0u8; 2 * 5 * 4 * 4]);
        let err = run_bytes(
            &op,
            DType::F32,
            &[&q, &kv, &kv, &[1u8; 3]],
            &[vec![2, 3, 4], vec![2, 5, 4], vec![2, 5, 4], vec![3, 5]],
            true,
            &mut [0u8; 2 * 3 * 4 * 4],
            1,
        )
        .unwrap_err();
        assert!(err.contains("mask"), "{err}");
    }
}
