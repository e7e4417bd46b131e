//! matmul and conv of [`ContractionKernel`]s on buffers, through `gemm`.
//!
//! Each operand is read as a *strided view* of its buffer: the operand's index map (a row-major
//! view of the buffer indexed by affine functions of the operand's own axes) composes into
//! `offset + Σ stride_a · i_a`, so transposes (`k^T` in attention), broadcasts (stride 0) and
//! slices (an offset and a step) cost nothing. matmul hands the strides to `gemm` directly;
//! convolution (in [`crate::conv`]) makes its operands contiguous first (a copy, only when they
//! are not already) and picks a direct depthwise kernel, a 1×1 gemm or im2col + gemm.
//!
//! Only the contraction is computed here; the kernel's epilogue runs afterwards, in place, as
//! generated code. Every shape is checked first: a malformed kernel is an error, never a panic
//! or an out-of-bounds access.

use crate::conv::ConvSpec;
use crate::par::par_units;
use gemm::Parallelism;
use oar_ir::kernel::{BufferId, Contraction, ContractionKernel, KernelProgram, Operand};
use oar_ir::ops::Conv;
use oar_ir::{BackendError, DType, Dim};
use std::ops::{Add, AddAssign, Mul};

/// Multiply-adds below which a contraction runs on the calling thread.
const PARALLEL_MIN_FLOPS: usize = 1 << 20;
/// Multiply-adds of one product above which `gemm` splits it across threads itself.
const GEMM_PARALLEL_MIN_FLOPS: usize = 1 << 22;

/// A float type the contraction kernels handle (f32, f64).
pub(crate) trait Elem:
    Copy + Send + Sync + Default + PartialEq + Add<Output = Self> + Mul<Output = Self> + AddAssign + 'static
{
    /// 0
    const ZERO: Self;
    /// 1
    const ONE: Self;
    /// `self · a + b`, fused (only called where the `fma` target feature is enabled).
    fn fused(self, a: Self, b: Self) -> Self;
}

impl Elem for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    #[inline(always)]
    fn fused(self, a: f32, b: f32) -> f32 {
        self.mul_add(a, b)
    }
}

impl Elem for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    #[inline(always)]
    fn fused(self, a: f64, b: f64) -> f64 {
        self.mul_add(a, b)
    }
}

/// An element type matmul handles: floats through `gemm`, integers through a wrapping loop
/// (the reference's semantics: products and sums wrap in the element type).
pub(crate) trait Product: Copy + Send + Sync + 'static {
    /// `dst[m×n] (row stride dst_rs, column stride 1) = lhs[m×k] · rhs[k×n]`.
    ///
    /// # Safety
    /// As [`gemm_raw`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn product(
        m: usize,
        n: usize,
        k: usize,
        dst: *mut Self,
        dst_rs: isize,
        lhs: Mat<Self>,
        rhs: Mat<Self>,
        par: Parallelism,
    );

    /// Convolution of `x` with `w` into `out` ([`crate::conv::conv`]); only floats have one.
    ///
    /// # Safety
    /// As [`crate::conv::conv`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn conv(
        _x: &View,
        _px: *const Self,
        _w: &View,
        _pw: *const Self,
        _out: *mut Self,
        _out_shape: &[usize],
        _spec: &ConvSpec,
        _threads: usize,
        _cache: Option<&WeightCache>,
        _epi: Option<PlaneEpilogue>,
    ) -> Result<bool, String> {
        Err("conv on integers".into())
    }
}

macro_rules! float_product {
    ($($t:ty),*) => {$(
        impl Product for $t {
            unsafe fn product(m: usize, n: usize, k: usize, dst: *mut Self, dst_rs: isize, lhs: Mat<Self>, rhs: Mat<Self>, par: Parallelism) {
                // Safety: the caller's contract.
                unsafe { gemm_raw(m, n, k, dst, dst_rs, lhs, rhs, par) }
            }

            unsafe fn conv(x: &View, px: *const Self, w: &View, pw: *const Self, out: *mut Self, out_shape: &[usize], spec: &ConvSpec, threads: usize, cache: Option<&WeightCache>, epi: Option<PlaneEpilogue>) -> Result<bool, String> {
                // Safety: the caller's contract.
                unsafe { crate::conv::conv_with(x, px, w, pw, out, out_shape, spec, threads, cache, epi) }
            }
        }
    )*};
}
float_product!(f32, f64);

macro_rules! int_product {
    ($($t:ty),*) => {$(
        impl Product for $t {
            unsafe fn product(m: usize, n: usize, k: usize, dst: *mut Self, dst_rs: isize, lhs: Mat<Self>, rhs: Mat<Self>, _: Parallelism) {
                // Row by row: dst[i, :] = Σ_p lhs[i, p] · rhs[p, :], wrapping (i·k·j order keeps
                // the inner loop on a dst row).
                for i in 0..m {
                    // Safety: the caller's contract: every addressed element is valid.
                    unsafe {
                        let row = dst.offset(i as isize * dst_rs);
                        for j in 0..n {
                            *row.add(j) = 0;
                        }
                        for p in 0..k {
                            let a = *lhs.ptr.offset(i as isize * lhs.rs + p as isize * lhs.cs);
                            if a == 0 {
                                continue;
                            }
                            let b = rhs.ptr.offset(p as isize * rhs.rs);
                            for j in 0..n {
                                let r = row.add(j);
                                *r = (*r).wrapping_add(a.wrapping_mul(*b.offset(j as isize * rhs.cs)));
                            }
                        }
                    }
                }
            }
        }
    )*};
}
int_product!(i8, u8, i32, i64);

/// An operand as a strided view of its buffer: element `i` is at `offset + Σ strides[a]·i[a]`
/// (in elements). Every element of `shape` is in bounds (checked when the view is built).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct View {
    /// Element offset of index 0.
    pub offset: isize,
    /// The logical shape.
    pub shape: Vec<usize>,
    /// Element stride per axis (0 for a broadcast, negative for a reversal).
    pub strides: Vec<isize>,
}

impl View {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True if the view is the dense row-major layout of its shape (strides of unit axes are
    /// ignored: they are never multiplied by anything but 0).
    pub fn is_dense(&self) -> bool {
        let mut expect = 1isize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expect {
                return false;
            }
            expect = expect.saturating_mul(n as isize);
        }
        true
    }
}

/// A raw pointer that may cross threads (the code sharing it writes disjoint parts).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);

// Safety: used only to hand buffer base pointers to worker tasks that touch disjoint elements
// (or only read).
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// `n` copies of `zero`, written out. For buffers that are read before they are written
/// (`+=` accumulation): `vec![0.0; n]` gets fresh pages from `calloc` that map the shared zero
/// page on the first read, so the first write to each page is a copy-on-write fault and a
/// TLB shootdown across every CPU running the process — which cost more than the kernels
/// themselves on the eager LeNet step's gradients.
pub(crate) fn written_zeros<T: Copy>(n: usize, zero: T) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    v.resize(n, zero);
    v
}

/// A matrix operand of [`gemm_raw`]: base pointer, row stride, column stride (elements).
#[derive(Clone, Copy)]
pub(crate) struct Mat<T> {
    pub ptr: *const T,
    pub rs: isize,
    pub cs: isize,
}

/// `dst[m×n] (row stride dst_rs, column stride 1) = lhs[m×k] · rhs[k×n]`.
///
/// # Safety
/// Every element the strides address for these sizes is valid; `dst` overlaps neither operand.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_raw<T: Elem>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: isize,
    lhs: Mat<T>,
    rhs: Mat<T>,
    parallelism: Parallelism,
) {
    // Safety: the caller's contract.
    unsafe { gemm_into(m, n, k, dst, dst_rs, lhs, rhs, false, parallelism) }
}

/// `dst = lhs · rhs` on the calling thread, `dst[i, j]` at `dst + i·dst_rs + j·dst_cs` (a
/// column-major destination lets a product be computed transposed into the other's layout).
///
/// # Safety
/// As [`gemm_raw`], for this destination layout; `k > 0`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_strided<T: Elem>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: isize,
    dst_cs: isize,
    lhs: Mat<T>,
    rhs: Mat<T>,
) {
    if m == 0 || n == 0 {
        return;
    }
    // Safety: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_cs,
            dst_rs,
            false,
            lhs.ptr,
            lhs.cs,
            lhs.rs,
            rhs.ptr,
            rhs.cs,
            rhs.rs,
            T::ZERO,
            T::ONE,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// [`gemm_raw`], or `dst += lhs · rhs` when `accumulate`.
///
/// # Safety
/// As [`gemm_raw`]; with `accumulate`, `dst` is initialized.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_into<T: Elem>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: isize,
    lhs: Mat<T>,
    rhs: Mat<T>,
    accumulate: bool,
    parallelism: Parallelism,
) {
    // Safety: the caller's contract.
    unsafe { gemm_scaled_into(m, n, k, dst, dst_rs, lhs, rhs, accumulate, T::ONE, parallelism) }
}

/// [`gemm_into`] with the product scaled: `dst (+)= scale · lhs · rhs`.
///
/// # Safety
/// As [`gemm_into`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_scaled_into<T: Elem>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: isize,
    lhs: Mat<T>,
    rhs: Mat<T>,
    accumulate: bool,
    scale: T,
    parallelism: Parallelism,
) {
    if m == 0 || n == 0 || (k == 0 && accumulate) {
        return;
    }
    if k == 0 {
        // An empty sum: zeros (outputs start uninitialized).
        for i in 0..m {
            // Safety: row `i` of `dst` holds `n` elements.
            unsafe { std::slice::from_raw_parts_mut(dst.offset(i as isize * dst_rs), n).fill(T::ZERO) };
        }
        return;
    }
    if let Parallelism::Rayon(t) = parallelism
        && let Some((along_rows, chunk)) = split_product(m, n, t)
    {
        // gemm's own threading leaves one thread busy on many shapes (a deep convolution's
        // 512 × 49 × 4608 product, a transformer's 768 × 128 × 768 ran at one core's speed
        // with 2 threads): split the product into independent blocks of rows (or columns)
        // instead, one single-threaded gemm each.
        let total = if along_rows { m } else { n };
        let parts = total.div_ceil(chunk);
        let (d, l, r) = (SendPtr(dst), SendPtr(lhs.ptr as *mut T), SendPtr(rhs.ptr as *mut T));
        crate::par::par_units(
            parts,
            parts,
            || (),
            |_, u| {
                let (a, b) = (u * chunk, ((u + 1) * chunk).min(total));
                let (mut lhs, mut rhs) = (
                    Mat {
                        ptr: l.get() as *const T,
                        ..lhs
                    },
                    Mat {
                        ptr: r.get() as *const T,
                        ..rhs
                    },
                );
                let (rows, cols, at) = if along_rows {
                    lhs.ptr = lhs.ptr.wrapping_offset(a as isize * lhs.rs);
                    (b - a, n, a as isize * dst_rs)
                } else {
                    rhs.ptr = rhs.ptr.wrapping_offset(a as isize * rhs.cs);
                    (m, b - a, a as isize)
                };
                // Safety: a block of the caller's product (rows or columns `a..b`), in
                // bounds as the whole is; blocks write disjoint parts of `dst`.
                unsafe {
                    gemm_scaled_into(
                        rows,
                        cols,
                        k,
                        d.get().wrapping_offset(at),
                        dst_rs,
                        lhs,
                        rhs,
                        accumulate,
                        scale,
                        Parallelism::None,
                    )
                };
            },
        );
        return;
    }
    // Strides of unit axes are never used; keep them tidy so gemm's layout checks see the
    // contiguous case.
    let tidy = |n: usize, s: isize| if n == 1 { 1 } else { s };
    let (lhs_rs, lhs_cs) = (tidy(m, lhs.rs), tidy(k, lhs.cs));
    let (rhs_rs, rhs_cs) = (tidy(k, rhs.rs), tidy(n, rhs.cs));
    let dst_rs = if m == 1 { n as isize } else { dst_rs };
    // Safety: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs,
            accumulate,
            lhs.ptr,
            lhs_cs,
            lhs_rs,
            rhs.ptr,
            rhs_cs,
            rhs_rs,
            // dst = alpha · dst + beta · lhs · rhs (alpha read only with `accumulate`)
            if accumulate { T::ONE } else { T::ZERO },
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// How [`gemm_scaled_into`] splits an `m × n` product over `threads` (`Rayon(0)`: all of
/// them): `(along_rows, chunk)` — along the longer side, so that each thread packs its share
/// of the larger operand rather than all of it (a transformer's `128 × 256 · 256 × 1024`
/// weight product split by rows had both threads pack the whole 1 MB weight: 5% of the
/// encoder's time), blocks of `chunk` rows (multiples of 16) or columns (of 8); `None` when
/// neither side is worth splitting.
fn split_product(m: usize, n: usize, threads: usize) -> Option<(bool, usize)> {
    let threads = match threads {
        0 => rayon::current_num_threads(),
        t => t,
    };
    if threads <= 1 {
        return None;
    }
    // Rows in multiples of 16 (the vector width gemm wants for an unpacked left side),
    // columns in multiples of 8.
    let rows = || Some((true, m.div_ceil(threads).next_multiple_of(16)));
    if m >= 16 * threads && m >= n {
        return rows();
    }
    if n >= 16 * threads {
        return Some((false, n.div_ceil(threads).next_multiple_of(8)));
    }
    if m >= 48 * threads { rows() } else { None }
}

/// How `gemm` may split one product, given the threads available.
pub(crate) fn gemm_parallelism(flops: usize, threads: usize) -> Parallelism {
    if threads > 1 && flops >= GEMM_PARALLEL_MIN_FLOPS {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    }
}

/// Threads worth using for `flops` multiply-adds.
pub(crate) fn useful_threads(flops: usize, threads: usize) -> usize {
    if flops < PARALLEL_MIN_FLOPS { 1 } else { threads.max(1) }
}

/// What a kernel derives from a constant operand once and keeps for every later run (a
/// convolution's Winograd-transformed kernels), one slot per step of a model.
pub type WeightCache = std::sync::OnceLock<Vec<f32>>;

/// `make()` kept in `cache` across runs (made on the first), where there is a cache and what it
/// holds has the `len` elements `make` gives; otherwise made for this call.
pub(crate) fn prepared(
    cache: Option<&WeightCache>,
    len: usize,
    make: impl Fn() -> Vec<f32>,
) -> std::borrow::Cow<'_, [f32]> {
    match cache.map(|c| c.get_or_init(&make)) {
        Some(v) if v.len() == len => std::borrow::Cow::Borrowed(v),
        _ => std::borrow::Cow::Owned(make()),
    }
}

/// A convolution's epilogue, for a path that completes whole output planes to apply while they
/// are in cache: `epi(first, n)` runs it on output planes `first..first + n` (plane `b · O + o`
/// is image `b`, channel `o`). The path calls it for each plane exactly once, after the plane
/// is complete, or never.
pub(crate) type PlaneEpilogue<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// An epilogue function over ranges of its outer iterations, `per_plane` of them per output
/// plane in order, iteration `j` of a plane covering its elements from `j · block` on (the
/// last one to the plane's end): `(f)(lo, hi)` runs iterations `lo..hi`. A path may apply it
/// to parts of planes (the columns it has finished in every row of a block), each iteration
/// exactly once.
#[derive(Clone, Copy)]
pub struct IterEpilogue<'a> {
    /// Runs outer iterations `lo..hi`.
    pub f: &'a (dyn Fn(usize, usize) + Sync),
    /// Outer iterations per output plane (nonzero).
    pub per_plane: usize,
    /// Elements per iteration.
    pub block: usize,
}

/// Compute `k`'s contraction into buffer `out`. `cache` is the step's slot for data derived
/// from its right operand, used only when that operand is a param or a constant (which no
/// step writes). A convolution may apply its epilogue `epi` itself, plane by plane; the result
/// says whether it did (the caller applies the epilogue otherwise).
///
/// # Safety
/// `bufs` holds valid base pointers for every buffer of `program`, sized as their types say.
pub(crate) unsafe fn run(
    k: &ContractionKernel,
    out: BufferId,
    program: &KernelProgram,
    bufs: &[*mut u8],
    threads: usize,
    cache: Option<&WeightCache>,
    epi: Option<PlaneEpilogue>,
) -> Result<bool, BackendError> {
    let op = op_name(&k.op);
    let fail = |detail: String| BackendError::Runtime {
        op: op.into(),
        value: out.to_string(),
        detail,
    };
    let prep = prepare(k, out, program, bufs).map_err(fail)?;
    let Prepared {
        dtype,
        operands,
        stored,
        lhs,
        rhs,
        out_shape,
    } = prep;
    let ptr = |b: BufferId| bufs[b.index()];
    let cache = cache.filter(|_| program.buffer(rhs.1).kind.is_weight());
    if operands == DType::BF16 {
        let src = |b: BufferId, t: DType| match t {
            DType::F32 => Bf16Src::F32(ptr(b) as *const f32),
            _ => Bf16Src::Bits(ptr(b) as *const u16),
        };
        let (pa, pb, po) = (src(lhs.1, stored[0]), src(rhs.1, stored[1]), ptr(out) as *mut f32);
        // Safety: as below, for bf16 operands (stored as bf16 or as f32 to round) and an f32
        // result.
        return unsafe {
            bf16_product(
                &k.op,
                crate::bf16::isa(),
                &lhs.0,
                pa,
                &rhs.0,
                pb,
                po,
                &out_shape,
                threads,
                cache,
                epi,
            )
        }
        .map_err(fail);
    }
    // Safety: `prepare` checked every operand view against its buffer's size, the output
    // shape against the output buffer, the dtypes and the pointers' alignment.
    unsafe {
        match dtype {
            DType::F32 => typed::<f32>(k, &lhs, &rhs, &out_shape, ptr, out, threads, cache, epi),
            DType::F64 => typed::<f64>(k, &lhs, &rhs, &out_shape, ptr, out, threads, cache, epi),
            DType::I8 => typed::<i8>(k, &lhs, &rhs, &out_shape, ptr, out, threads, cache, epi),
            DType::U8 => typed::<u8>(k, &lhs, &rhs, &out_shape, ptr, out, threads, cache, epi),
            DType::I32 => typed::<i32>(k, &lhs, &rhs, &out_shape, ptr, out, threads, cache, epi),
            DType::I64 => typed::<i64>(k, &lhs, &rhs, &out_shape, ptr, out, threads, cache, epi),
            other => Err(format!("{other} contractions are not supported")),
        }
    }
    .map_err(fail)
}

/// Views of both operands and what they read.
struct Prepared {
    dtype: DType,
    /// The operands' dtype: `dtype`, or bf16 for a bf16 product accumulated in f32.
    operands: DType,
    /// The dtypes the operands are stored in: `operands`, or f32 for an operand rounded to
    /// bf16 as it is read.
    stored: [DType; 2],
    lhs: (View, BufferId),
    rhs: (View, BufferId),
    out_shape: Vec<usize>,
}

/// Check a contraction against the program and resolve its operand views.
fn prepare(k: &ContractionKernel, out: BufferId, p: &KernelProgram, bufs: &[*mut u8]) -> Result<Prepared, String> {
    if bufs.len() != p.buffers.len() {
        return Err(format!(
            "{} buffer pointers for {} buffers",
            bufs.len(),
            p.buffers.len()
        ));
    }
    let ob = p
        .buffers
        .get(out.index())
        .ok_or_else(|| format!("{out} is not a buffer"))?;
    let dtype = ob.ty.dtype;
    if !supported(dtype, &k.op) {
        return Err(format!("{dtype} {} is not supported", op_name(&k.op)));
    }
    if k.acc_dtype != dtype {
        return Err(format!("accumulates in {} but writes {dtype}", k.acc_dtype));
    }
    let out_shape = static_dims(&k.shape, "output shape")?;
    let ob_shape = static_dims(&ob.ty.shape.0, "output buffer")?;
    if checked_len(&out_shape)? != checked_len(&ob_shape)? {
        return Err(format!(
            "output shape {out_shape:?} does not fit {out} of shape {ob_shape:?}"
        ));
    }
    let lhs = operand_view(&k.lhs, p, "lhs")?;
    let rhs = operand_view(&k.rhs, p, "rhs")?;
    let stored = [p.buffer(lhs.1).ty.dtype, p.buffer(rhs.1).ty.dtype];
    let operands = match (k.lhs.element_dtype(stored[0]), k.rhs.element_dtype(stored[1])) {
        (DType::BF16, DType::BF16) if dtype == DType::F32 => DType::BF16,
        _ => dtype,
    };
    for (what, (_, b), o, t) in [("lhs", &lhs, &k.lhs, stored[0]), ("rhs", &rhs, &k.rhs, stored[1])] {
        let rounded = o.round.is_some_and(|r| r != t);
        if rounded && !(o.round == Some(DType::BF16) && t == DType::F32 && operands == DType::BF16) {
            return Err(format!(
                "{what} {b} is {t} rounded to {} as it is read: only f32 operands of a bf16 product round",
                o.element_dtype(t)
            ));
        }
        if !rounded && t != operands {
            return Err(format!("{what} {b} is {t}, the output {dtype}"));
        }
        if *b == out {
            return Err(format!("{what} reads the output buffer {out}"));
        }
    }
    for (b, n, align) in [
        (lhs.1, lhs.0.len(), stored[0].size_bytes()),
        (rhs.1, rhs.0.len(), stored[1].size_bytes()),
        (out, checked_len(&out_shape)?, dtype.size_bytes()),
    ] {
        // (An empty buffer may have a dangling pointer; nothing is read through it.)
        if n > 0 && !(bufs[b.index()] as usize).is_multiple_of(align) {
            return Err(format!("{b} is not aligned to {align} bytes"));
        }
    }
    Ok(Prepared {
        dtype,
        operands,
        stored,
        lhs,
        rhs,
        out_shape,
    })
}

fn static_dims(dims: &[Dim], what: &str) -> Result<Vec<usize>, String> {
    dims.iter()
        .map(|d| d.as_static().ok_or_else(|| format!("{what} has a symbolic dim `{d}`")))
        .collect()
}

fn checked_len(shape: &[usize]) -> Result<usize, String> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("{shape:?} has too many elements"))
}

/// The strided view an operand's load describes, checked against its buffer.
pub(crate) fn operand_view(op: &Operand, p: &KernelProgram, what: &str) -> Result<(View, BufferId), String> {
    let b = op.load.buffer;
    let buf = p
        .buffers
        .get(b.index())
        .ok_or_else(|| format!("{what} reads {b}, which is not a buffer"))?;
    let shape = static_dims(&op.shape, &format!("{what} shape"))?;
    let n = checked_len(&shape)?;
    let view = static_dims(&op.load.map.view, &format!("{what} view"))?;
    let buf_len = checked_len(&static_dims(&buf.ty.shape.0, &format!("{what} buffer {b}"))?)?;
    if checked_len(&view)? != buf_len {
        return Err(format!(
            "{what}: {b} of {buf_len} elements cannot be viewed as {view:?}"
        ));
    }
    let axes = &op.load.map.axes;
    if axes.len() != view.len() {
        return Err(format!(
            "{what}: {} index expressions for a view of rank {}",
            axes.len(),
            view.len()
        ));
    }
    // Row-major strides of the view (their products are bounded by the buffer length).
    let mut vstride = vec![1i128; view.len()];
    for a in (0..view.len().saturating_sub(1)).rev() {
        vstride[a] = vstride[a + 1] * view[a + 1] as i128;
    }
    let rank = shape.len();
    let mut offset = 0i128;
    let mut strides = vec![0i128; rank];
    for (v, e) in axes.iter().enumerate() {
        let (mut lo, mut hi) = (e.offset as i128, e.offset as i128);
        for &(l, c) in &e.terms {
            if l >= rank {
                return Err(format!("{what}: index `{e}` names loop i{l} of a rank-{rank} operand"));
            }
            let span = c as i128 * (shape[l] as i128 - 1).max(0);
            lo += span.min(0);
            hi += span.max(0);
            strides[l] += c as i128 * vstride[v];
        }
        if n > 0 && (lo < 0 || hi >= view[v] as i128) {
            return Err(format!(
                "{what}: index `{e}` over {shape:?} leaves axis {v} of {b} viewed as {view:?}"
            ));
        }
        offset += e.offset as i128 * vstride[v];
    }
    let to_isize = |x: i128| isize::try_from(x).map_err(|_| format!("{what}: stride {x} out of range"));
    Ok((
        View {
            offset: if n > 0 { to_isize(offset)? } else { 0 },
            shape,
            strides: strides.into_iter().map(to_isize).collect::<Result<_, _>>()?,
        },
        b,
    ))
}

/// True if the runtime computes contraction `op` on `dtype` (conv on floats; matmul on floats and
/// integers, the latter wrapping like the reference).
pub fn supported(dtype: DType, op: &Contraction) -> bool {
    match op {
        Contraction::MatMul => matches!(
            dtype,
            DType::F32 | DType::F64 | DType::I8 | DType::U8 | DType::I32 | DType::I64
        ),
        Contraction::Conv(_) => matches!(dtype, DType::F32 | DType::F64),
    }
}

fn op_name(op: &Contraction) -> &'static str {
    match op {
        Contraction::MatMul => "matmul",
        Contraction::Conv(_) => "conv",
    }
}

/// The contraction for one element type.
#[allow(clippy::too_many_arguments)]
unsafe fn typed<T: Product>(
    k: &ContractionKernel,
    lhs: &(View, BufferId),
    rhs: &(View, BufferId),
    out_shape: &[usize],
    ptr: impl Fn(BufferId) -> *mut u8,
    out: BufferId,
    threads: usize,
    cache: Option<&WeightCache>,
    epi: Option<PlaneEpilogue>,
) -> Result<bool, String> {
    let (pa, pb) = (ptr(lhs.1) as *const T, ptr(rhs.1) as *const T);
    let po = ptr(out) as *mut T;
    // Safety: the caller checked the views and buffers.
    unsafe {
        match &k.op {
            Contraction::MatMul => matmul(&lhs.0, pa, &rhs.0, pb, po, out_shape, threads).map(|()| false),
            Contraction::Conv(Conv {
                stride,
                pad_before,
                pad_after,
                dilation,
                groups,
            }) => T::conv(
                &lhs.0,
                pa,
                &rhs.0,
                pb,
                po,
                out_shape,
                &ConvSpec {
                    stride,
                    pad_before,
                    pad_after,
                    dilation,
                    groups: *groups,
                },
                threads,
                cache,
                epi,
            ),
        }
    }
}

/// Where a bf16 product operand's elements are: bf16 bits, or f32 values rounded to bf16 as
/// they are read.
#[derive(Clone, Copy)]
enum Bf16Src {
    Bits(*const u16),
    F32(*const f32),
}

/// A bf16 × bf16 → f32 contraction: on `isa`, the host's bf16 instructions
/// ([`crate::bf16`]), or on f32 copies of the operands where there are none (or the
/// convolution's shape is one the native path leaves alone). A matmul packs f32 operands
/// straight into its bf16 layout; other paths round them into a bf16 copy first.
///
/// # Safety
/// As [`typed`], for bf16 operands and an f32 result; `isa` runs on this host.
#[allow(clippy::too_many_arguments)]
unsafe fn bf16_product(
    op: &Contraction,
    isa: Option<crate::bf16::Isa>,
    a: &View,
    sa: Bf16Src,
    b: &View,
    sb: Bf16Src,
    out: *mut f32,
    out_shape: &[usize],
    threads: usize,
    cache: Option<&WeightCache>,
    epi: Option<PlaneEpilogue>,
) -> Result<bool, String> {
    /// The native matmul on operands of element types `A` and `B`.
    ///
    /// # Safety
    /// As `bf16_product`'s.
    #[allow(clippy::too_many_arguments)]
    unsafe fn native<A: crate::bf16::Elem, B: crate::bf16::Elem>(
        isa: crate::bf16::Isa,
        a: &View,
        pa: *const A,
        b: &View,
        pb: *const B,
        out: *mut f32,
        out_shape: &[usize],
        threads: usize,
    ) -> Result<bool, String> {
        let product = |m, n, k, dst, ldc: isize, lhs, rhs, par: Parallelism| {
            let threads = match par {
                Parallelism::None => 1,
                Parallelism::Rayon(t) => t.max(1),
            };
            // Safety: `matmul_with` hands valid operand and result blocks.
            unsafe { crate::bf16::gemm(isa, m, n, k, dst, ldc as usize, lhs, rhs, threads) }
        };
        // Safety: the caller's contract.
        unsafe { matmul_with(a, pa, b, pb, out, out_shape, threads, product) }.map(|()| false)
    }
    // Safety: the caller's contract.
    unsafe {
        if let (Contraction::MatMul, Some(isa)) = (op, isa) {
            use Bf16Src::{Bits, F32};
            return match (sa, sb) {
                (Bits(pa), Bits(pb)) => native(isa, a, pa, b, pb, out, out_shape, threads),
                (F32(pa), Bits(pb)) => native(isa, a, pa, b, pb, out, out_shape, threads),
                (Bits(pa), F32(pb)) => native(isa, a, pa, b, pb, out, out_shape, threads),
                (F32(pa), F32(pb)) => native(isa, a, pa, b, pb, out, out_shape, threads),
            };
        }
        // Every other path reads bf16 bits: f32 operands are rounded into dense copies.
        let (mut ka, mut kb) = (Vec::new(), Vec::new());
        let (da, db) = (crate::conv::dense(&a.shape), crate::conv::dense(&b.shape));
        let (a, pa) = match sa {
            Bf16Src::Bits(p) => (a, p),
            Bf16Src::F32(p) => (&da, rounded(p, a, &mut ka)),
        };
        let (b, pb) = match sb {
            Bf16Src::Bits(p) => (b, p),
            Bf16Src::F32(p) => (&db, rounded(p, b, &mut kb)),
        };
        if let Contraction::Conv(c) = op
            && let Some(isa) = isa
            && crate::bf16::conv(isa, a, pa, b, pb, out, out_shape, &ConvSpec::of(c), threads, cache)?
        {
            return Ok(false);
        }
        let (wa, wb) = (crate::bf16::widened(pa, a), crate::bf16::widened(pb, b));
        let (va, vb) = (crate::conv::dense(&a.shape), crate::conv::dense(&b.shape));
        match op {
            Contraction::MatMul => matmul(&va, wa.as_ptr(), &vb, wb.as_ptr(), out, out_shape, threads).map(|()| false),
            Contraction::Conv(c) => crate::conv::conv_with(
                &va,
                wa.as_ptr(),
                &vb,
                wb.as_ptr(),
                out,
                out_shape,
                &ConvSpec::of(c),
                threads,
                None,
                epi,
            ),
        }
    }
}

/// The elements of view `v` of f32 `base`, rounded to bf16, as one dense run kept in `keep`.
///
/// # Safety
/// Every element of the view is in bounds of `base`.
unsafe fn rounded(base: *const f32, v: &View, keep: &mut Vec<u16>) -> *const u16 {
    let mut run = Vec::new();
    // Safety: the caller's contract.
    let src = unsafe { std::slice::from_raw_parts(crate::conv::dense_run(base, v, &mut run), v.len()) };
    keep.resize(v.len(), 0);
    crate::ewise::narrow(crate::ewise::Half::Bf16, src, keep);
    keep.as_ptr()
}

/// Collapse the axes of a view (`shape`, `strides`) into one `(size, stride)` if their elements are
/// evenly spaced; unit axes drop out.
fn collapse(shape: &[usize], strides: &[isize]) -> Option<(usize, isize)> {
    let mut size = 1usize;
    let mut stride = 1isize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n == 1 {
            continue;
        }
        if size == 1 {
            stride = s;
        } else if s != stride.checked_mul(size as isize)? {
            return None;
        }
        size *= n;
    }
    Some((size, stride))
}

/// `a[.., M, K] x b[.., K, N] -> out[.., M, N]` with numpy batch broadcasting; `out` dense.
///
/// # Safety
/// The views are in bounds of the buffers at `pa`, `pb`; `out` holds `out_shape`'s elements.
pub(crate) unsafe fn matmul<T: Product>(
    a: &View,
    pa: *const T,
    b: &View,
    pb: *const T,
    out: *mut T,
    out_shape: &[usize],
    threads: usize,
) -> Result<(), String> {
    // Safety: the caller's contract.
    unsafe {
        matmul_with(
            a,
            pa,
            b,
            pb,
            out,
            out_shape,
            threads,
            |m, n, k, dst, rs, lhs, rhs, par| T::product(m, n, k, dst, rs, lhs, rhs, par),
        )
    }
}

/// [`matmul`] of `I` operands into an `O` result, each product by `product` (as
/// [`Product::product`]).
///
/// # Safety
/// As [`matmul`]; `product` computes `dst = lhs · rhs` under [`gemm_raw`]'s contract.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_with<A: Copy, B: Copy, O: Copy>(
    a: &View,
    pa: *const A,
    b: &View,
    pb: *const B,
    out: *mut O,
    out_shape: &[usize],
    threads: usize,
    product: impl Fn(usize, usize, usize, *mut O, isize, Mat<A>, Mat<B>, Parallelism) + Sync,
) -> Result<(), String> {
    let (ra, rb, ro) = (a.shape.len(), b.shape.len(), out_shape.len());
    if ra < 2 || rb < 2 || ro != ra.max(rb) {
        return Err(format!(
            "matmul needs operands of rank ≥ 2 and an output of the larger rank: {:?} x {:?} -> {out_shape:?}",
            a.shape, b.shape
        ));
    }
    let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
    if b.shape[rb - 2] != k || out_shape[ro - 2] != m || out_shape[ro - 1] != n {
        return Err(format!(
            "matmul shapes do not agree: {:?} x {:?} -> {out_shape:?}",
            a.shape, b.shape
        ));
    }
    // Batch strides of each operand over the output's batch axes (0 where broadcast).
    let nbat = ro - 2;
    let batch = &out_shape[..nbat];
    let mut sa = vec![0isize; nbat];
    let mut sb = vec![0isize; nbat];
    for (d, &od) in batch.iter().enumerate() {
        let dim = |v: &View, r: usize| {
            (d + r - 2 >= nbat)
                .then(|| d + r - 2 - nbat)
                .map(|ax| (v.shape[ax], v.strides[ax]))
        };
        let (da, db) = (dim(a, ra), dim(b, rb));
        let size = |x: Option<(usize, isize)>| x.map_or(1, |(s, _)| s);
        let want = match (size(da), size(db)) {
            (1, y) => y,
            (x, 1) => x,
            (x, y) if x == y => x,
            _ => 0,
        };
        if want != od || (size(da) != od && size(da) != 1) || (size(db) != od && size(db) != 1) {
            return Err(format!(
                "matmul batch dims do not broadcast: {:?} x {:?} -> {out_shape:?}",
                a.shape, b.shape
            ));
        }
        if let Some((_, st)) = da.filter(|&(s, _)| s != 1) {
            sa[d] = st;
        }
        if let Some((_, st)) = db.filter(|&(s, _)| s != 1) {
            sb[d] = st;
        }
    }
    let nb: usize = batch.iter().product();
    if nb == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let (a_rs, a_cs) = (a.strides[ra - 2], a.strides[ra - 1]);
    let (b_rs, b_cs) = (b.strides[rb - 2], b.strides[rb - 1]);
    let flops = nb.saturating_mul(m).saturating_mul(n).saturating_mul(k);
    let threads = useful_threads(flops, threads);
    // rhs shared by every batch and lhs batches evenly spaced rows: one product of nb·M rows.
    if nb > 1 && sb.iter().all(|&s| s == 0) {
        let mut shape: Vec<usize> = batch.to_vec();
        shape.push(m);
        let mut strides = sa.clone();
        strides.push(a_rs);
        if let Some((rows, rs)) = collapse(&shape, &strides) {
            let lhs = Mat {
                ptr: pa.wrapping_offset(a.offset),
                rs,
                cs: a_cs,
            };
            let rhs = Mat {
                ptr: pb.wrapping_offset(b.offset),
                rs: b_rs,
                cs: b_cs,
            };
            // The same elements the batched products would read and write.
            product(rows, n, k, out, n as isize, lhs, rhs, gemm_parallelism(flops, threads));
            return Ok(());
        }
    }
    let offset = |flat: usize, strides: &[isize]| -> isize {
        let mut rem = flat;
        let mut off = 0isize;
        for d in (0..nbat).rev() {
            off += (rem % batch[d]) as isize * strides[d];
            rem /= batch[d];
        }
        off
    };
    let (pa, pb, out) = (SendPtr(pa as *mut A), SendPtr(pb as *mut B), SendPtr(out));
    let one = |bi: usize, par: Parallelism| {
        let lhs = Mat {
            ptr: (pa.get() as *const A).wrapping_offset(a.offset + offset(bi, &sa)),
            rs: a_rs,
            cs: a_cs,
        };
        let rhs = Mat {
            ptr: (pb.get() as *const B).wrapping_offset(b.offset + offset(bi, &sb)),
            rs: b_rs,
            cs: b_cs,
        };
        // Batch `bi`'s operands are in bounds (views checked); its output block is `m·n`
        // elements at `bi·m·n`, disjoint from every other batch's.
        product(m, n, k, out.get().wrapping_add(bi * m * n), n as isize, lhs, rhs, par);
    };
    let per = m.saturating_mul(n).saturating_mul(k);
    // A matrix-vector product (a batch-1 classifier) streams its matrix once: memory-bound,
    // it gains from a second thread's bandwidth from a sixteenth of the work on.
    let vector = m == 1 || n == 1;
    let split_from = if vector {
        GEMM_PARALLEL_MIN_FLOPS / 16
    } else {
        GEMM_PARALLEL_MIN_FLOPS
    };
    if nb >= threads || per < split_from {
        // Threads over batches, one single-threaded product each.
        par_units(nb, threads, || (), |_, bi| one(bi, Parallelism::None));
    } else {
        // Fewer batches than threads (so at least 2 threads), each product worth splitting.
        for bi in 0..nb {
            one(bi, Parallelism::Rayon(threads));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) % 17) as f64 / 4.0 - 2.0
            })
            .collect()
    }

    /// Products split into blocks of rows or of columns over 2 and 3 threads equal one
    /// unsplit product — strided operands, a destination wider than the product,
    /// accumulation and scaling included. The values are small multiples of 1/4, so every
    /// sum is exact in f64 whatever the order.
    #[test]
    fn split_products_equal_one_product() {
        for (m, n, k) in [(200, 7, 13), (40, 90, 5), (97, 97, 33), (3, 200, 8), (1, 64, 4)] {
            for threads in [2, 3] {
                let split = split_product(m, n, threads);
                for accumulate in [false, true] {
                    // lhs row-major with a padded row, rhs column-major.
                    let (lrs, rcs, drs) = (k + 3, k + 1, n + 5);
                    let lhs = values(m * lrs, 1);
                    let rhs = values(n * rcs, 2);
                    let init = values(m * drs, 3);
                    let run = |par: Parallelism| {
                        let mut dst = init.clone();
                        // Safety: every address is inside the vectors above.
                        unsafe {
                            gemm_scaled_into(
                                m,
                                n,
                                k,
                                dst.as_mut_ptr(),
                                drs as isize,
                                Mat {
                                    ptr: lhs.as_ptr(),
                                    rs: lrs as isize,
                                    cs: 1,
                                },
                                Mat {
                                    ptr: rhs.as_ptr(),
                                    rs: 1,
                                    cs: rcs as isize,
                                },
                                accumulate,
                                0.5,
                                par,
                            )
                        };
                        dst
                    };
                    let want = run(Parallelism::None);
                    // Hand-computed check of one element, then the split against the whole.
                    let (i, j) = (m - 1, n / 2);
                    let dot: f64 = (0..k).map(|c| lhs[i * lrs + c] * rhs[j * rcs + c]).sum();
                    let base = if accumulate { init[i * drs + j] } else { 0.0 };
                    assert_eq!(want[i * drs + j], base + 0.5 * dot);
                    assert_eq!(
                        run(Parallelism::Rayon(threads)),
                        want,
                        "{m}×{n}×{k} {threads} {split:?}"
                    );
                }
            }
        }
        assert_eq!(split_product(200, 7, 2), Some((true, 112)));
        assert_eq!(split_product(3, 200, 2), Some((false, 104)));
        assert_eq!(split_product(1, 20, 2), None);
    }

    /// bf16 matmuls (batch broadcast, a transposed right operand, a single row) and
    /// convolutions give the same f32 results on every path: each native instruction set of
    /// this host and the widening path of hosts without one (which an AOT binary built on a
    /// bf16 host takes there). Values are small multiples of 1/4 (exact in bf16), so every
    /// path's sums are exact and equal.
    #[test]
    fn bf16_products_agree_on_every_path() {
        let bits = |v: &[f64]| {
            v.iter()
                .map(|&x| half::bf16::from_f64(x).to_bits())
                .collect::<Vec<u16>>()
        };
        let mut isas = vec![None];
        isas.extend(crate::bf16::isa().map(Some));
        if crate::bf16::isa() == Some(crate::bf16::Isa::Amx) {
            isas.push(Some(crate::bf16::Isa::Avx512));
        }
        let view = |offset, shape: &[usize], strides: &[isize]| View {
            offset,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        };
        // (op, lhs view, rhs view, lhs len, rhs len, output shape)
        let conv = Conv {
            stride: vec![1, 1],
            pad_before: vec![1, 1],
            pad_after: vec![1, 1],
            dilation: vec![1, 1],
            groups: 1,
        };
        let cases = [
            // [2, 40, 24] x [24, 50] broadcast: one product of 80 rows.
            (
                Contraction::MatMul,
                view(0, &[2, 40, 24], &[960, 24, 1]),
                view(0, &[24, 50], &[50, 1]),
                1920,
                1200,
                vec![2, 40, 50],
            ),
            // [3, 5, 64] x [3, 64, 33] with the right operand transposed (stored [3, 33, 64]).
            (
                Contraction::MatMul,
                view(0, &[3, 5, 64], &[320, 64, 1]),
                view(0, &[3, 64, 33], &[2112, 1, 64]),
                960,
                6336,
                vec![3, 5, 33],
            ),
            // A transposed left operand (a weight gradient's `xᵀ`, stored [37, 20]).
            (
                Contraction::MatMul,
                view(0, &[20, 37], &[1, 20]),
                view(0, &[37, 18], &[18, 1]),
                740,
                666,
                vec![20, 18],
            ),
            // A single row against a transposed classifier matrix.
            (
                Contraction::MatMul,
                view(0, &[1, 96], &[96, 1]),
                view(0, &[96, 70], &[1, 96]),
                96,
                6720,
                vec![1, 70],
            ),
            (
                Contraction::Conv(conv),
                view(0, &[2, 32, 6, 5], &[960, 30, 5, 1]),
                view(0, &[40, 32, 3, 3], &[288, 9, 3, 1]),
                1920,
                11520,
                vec![2, 40, 6, 5],
            ),
        ];
        for (op, va, vb, na, nb, out_shape) in cases {
            let (a, b) = (bits(&values(na, 11)), bits(&values(nb, 12)));
            let results: Vec<Vec<f32>> = isas
                .iter()
                .map(|&isa| {
                    let mut out = vec![f32::NAN; out_shape.iter().product()];
                    for threads in [1, 2] {
                        // Safety: the views lie in `a` and `b`; `out` holds the output shape.
                        unsafe {
                            bf16_product(
                                &op,
                                isa,
                                &va,
                                Bf16Src::Bits(a.as_ptr()),
                                &vb,
                                Bf16Src::Bits(b.as_ptr()),
                                out.as_mut_ptr(),
                                &out_shape,
                                threads,
                                None,
                                None,
                            )
                        }
                        .unwrap();
                    }
                    // Operands stored as f32 values a little off the bf16 ones (less than half
                    // a bf16 step, both ways), rounded as they are read: the same products.
                    let off = |v: &[u16]| {
                        v.iter()
                            .enumerate()
                            .map(|(i, &x)| {
                                let f = f32::from_bits((x as u32) << 16);
                                f * if i % 2 == 0 {
                                    1.0 + 1.0 / 1024.0
                                } else {
                                    1.0 - 1.0 / 1024.0
                                }
                            })
                            .collect::<Vec<f32>>()
                    };
                    let (fa, fb) = (off(&a), off(&b));
                    let srcs = [
                        (Bf16Src::F32(fa.as_ptr()), Bf16Src::Bits(b.as_ptr())),
                        (Bf16Src::Bits(a.as_ptr()), Bf16Src::F32(fb.as_ptr())),
                        (Bf16Src::F32(fa.as_ptr()), Bf16Src::F32(fb.as_ptr())),
                    ];
                    for (i, (sa, sb)) in srcs.into_iter().enumerate() {
                        let mut got = vec![f32::NAN; out.len()];
                        // Safety: as above.
                        unsafe {
                            bf16_product(&op, isa, &va, sa, &vb, sb, got.as_mut_ptr(), &out_shape, 2, None, None)
                        }
                        .unwrap();
                        assert_eq!(got, out, "{isa:?}, f32 operands {i}, {op:?} {out_shape:?}");
                    }
                    out
                })
                .collect();
            for (isa, r) in isas.iter().zip(&results) {
                assert_eq!(r, &results[0], "{isa:?} vs widening, {op:?} {out_shape:?}");
            }
            if let Contraction::MatMul = op {
                // One element by hand: the last row's first column.
                let (m, k, n) = (
                    va.shape[va.shape.len() - 2],
                    va.shape[va.shape.len() - 1],
                    vb.shape[vb.shape.len() - 1],
                );
                let batches = out_shape[..out_shape.len() - 2].iter().product::<usize>();
                let bi = batches - 1;
                let f = |x: u16| f32::from_bits((x as u32) << 16) as f64;
                let at = |v: &View, bi: usize, i: usize, j: usize| {
                    let r = v.shape.len();
                    let boff = if r == 3 { bi as isize * v.strides[0] } else { 0 };
                    (v.offset + boff + i as isize * v.strides[r - 2] + j as isize * v.strides[r - 1]) as usize
                };
                let dot: f64 = (0..k)
                    .map(|p| f(a[at(&va, bi, m - 1, p)]) * f(b[at(&vb, bi, p, 0)]))
                    .sum();
                assert_eq!(results[0][(bi * m + m - 1) * n] as f64, dot);
            }
        }
    }
}
