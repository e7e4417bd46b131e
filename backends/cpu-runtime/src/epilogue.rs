//! Convolution epilogues the runtime applies with its own vector code: a per-channel bias,
//! a residual of the output's shape and clamps by constants (batch norm folded into the
//! weights, `relu`, `relu6`, a residual block's sum), in the order the kernel's epilogue
//! names them.
//!
//! The generated epilogue (Cranelift, 128-bit vectors) runs such a chain at about half an
//! element per cycle — on MobileNetV2 more than a depthwise layer's own arithmetic; here it
//! runs at the host's full vector width, plane by plane while the planes are in cache.
//! Each step rounds as the generated code does (one f32 addition per add, `max`/`min` by a
//! non-NaN constant keeping NaN), so the results are the same bits.

use crate::simd::{Lanes, Simd};
use oar_ir::DType;
use oar_ir::kernel::{AffineExpr, BufferId, Contraction, ContractionKernel, IndexMap, KernelProgram, ScalarOp};
use oar_ir::ops::BinaryOp;

/// A convolution epilogue recognized as the chain `x + bias[o]` (optional), `+ r[i]`
/// (optional, `r` of the output's shape), then `max(x, lo)` and `min(x, hi)` in either order
/// (each optional: an absent one is by ∓∞, which changes no value).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ConvEpilogue {
    bias: Option<BufferId>,
    residual: Option<BufferId>,
    lo: f32,
    hi: f32,
    /// Whether the `max` comes before the `min`.
    max_first: bool,
    out: BufferId,
    /// Output channels, and elements per output plane.
    channels: usize,
    plane: usize,
    /// Output planes (`N · O`).
    planes: usize,
}

impl ConvEpilogue {
    /// The chain `k`'s epilogue computes, when it is one: an f32 convolution whose epilogue
    /// starts from the sum and applies, in this order, some of: the addition of a
    /// per-channel vector, the addition of a buffer of the output's shape, `max`/`min` with
    /// non-NaN constants (in either order). `None` for anything else (the generated epilogue
    /// then runs).
    pub(crate) fn of(k: &ContractionKernel, out: BufferId, p: &KernelProgram) -> Option<ConvEpilogue> {
        if !matches!(k.op, Contraction::Conv(_)) || k.acc_dtype != DType::F32 || Simd::detect() == Simd::Baseline {
            return None;
        }
        let shape: Vec<usize> = k.shape.iter().map(|d| d.as_static()).collect::<Option<_>>()?;
        if shape.len() < 3 || p.buffers.get(out.index())?.ty.dtype != DType::F32 {
            return None;
        }
        let (channels, plane) = (shape[1], shape[2..].iter().product::<usize>());
        let total = shape.iter().product::<usize>();
        // The output's own element offset (row-major, loops of extent 1 left out).
        let row_major = AffineExpr {
            terms: (0..shape.len())
                .filter(|&l| shape[l] > 1)
                .map(|l| (l, shape[l + 1..].iter().product::<usize>() as i64))
                .collect(),
            offset: 0,
        };
        let elems = |b: BufferId| {
            p.buffers
                .get(b.index())?
                .ty
                .shape
                .as_static()
                .map(|s| s.iter().product::<usize>())
        };
        let mut e = ConvEpilogue {
            bias: None,
            residual: None,
            lo: f32::NEG_INFINITY,
            hi: f32::INFINITY,
            max_first: true,
            out,
            channels,
            plane,
            planes: total / plane.max(1),
        };
        // Steps taken so far: bias, residual, max, min (a later step may not come before an
        // earlier one, except the two clamps).
        let (mut stage, mut any) = (0, false);
        let mut cur = None;
        for (i, inst) in k.epilogue.iter().enumerate() {
            if inst.dtype != DType::F32 {
                return None;
            }
            match &inst.op {
                ScalarOp::Acc(0) if cur.is_none() => cur = Some(i),
                ScalarOp::Const(_) | ScalarOp::Load(_) => {}
                &ScalarOp::Binary(op, a, b) => {
                    let other = match (Some(a) == cur, Some(b) == cur) {
                        (true, false) => b,
                        (false, true) => a,
                        _ => return None,
                    };
                    match (op, &k.epilogue.get(other)?.op) {
                        (BinaryOp::Add, &ScalarOp::Load(j)) => {
                            let load = k.loads.get(j)?;
                            let linear = reduced(&linear(&load.map)?, &shape)?;
                            let n = elems(load.buffer)?;
                            if p.buffers.get(load.buffer.index())?.ty.dtype != DType::F32 {
                                return None;
                            }
                            if (linear.is_loop(1) || channels == 1 && linear == AffineExpr::constant(0))
                                && n >= channels
                                && stage < 1
                            {
                                (e.bias, stage) = (Some(load.buffer), 1);
                            } else if linear == row_major && n >= total && stage < 2 {
                                (e.residual, stage) = (Some(load.buffer), 2);
                            } else {
                                return None;
                            }
                        }
                        (BinaryOp::Max | BinaryOp::Min, ScalarOp::Const(c)) => {
                            let c = c.0 as f32;
                            if c.is_nan() {
                                return None;
                            }
                            match op {
                                BinaryOp::Max if e.lo == f32::NEG_INFINITY && c != f32::NEG_INFINITY => {
                                    e.lo = c;
                                    e.max_first = e.hi == f32::INFINITY;
                                }
                                BinaryOp::Min if e.hi == f32::INFINITY && c != f32::INFINITY => e.hi = c,
                                _ => return None,
                            }
                            stage = 3;
                        }
                        _ => return None,
                    }
                    any = true;
                    cur = Some(i);
                }
                _ => return None,
            }
        }
        (any && cur == Some(k.epilogue.len() - 1)).then_some(e)
    }

    /// Output planes.
    pub(crate) fn planes(&self) -> usize {
        self.planes
    }

    /// Apply the chain to output planes `first..first + n` in place.
    ///
    /// # Safety
    /// `bufs` holds live base pointers for every buffer of the program `self` was made for,
    /// sized as their types say, and the contraction's result is in the output buffer.
    pub(crate) unsafe fn apply(&self, bufs: &[*mut u8], first: usize, n: usize) {
        let ptr = |b: Option<BufferId>| b.map_or(std::ptr::null(), |b| bufs[b.index()] as *const f32);
        let c = Chain {
            out: bufs[self.out.index()] as *mut f32,
            bias: ptr(self.bias),
            residual: ptr(self.residual),
            lo: self.lo,
            hi: self.hi,
            channels: self.channels,
            plane: self.plane,
            planes: first..(first + n).min(self.planes),
        };
        let avx512 = Simd::detect() == Simd::Avx512;
        // Safety: the caller's contract; the chain's pointers are the recognized buffers'.
        unsafe {
            match (self.bias.is_some(), self.residual.is_some(), self.max_first) {
                (true, false, true) => planes::<true, false, true>(avx512, &c),
                (true, false, false) => planes::<true, false, false>(avx512, &c),
                (true, true, true) => planes::<true, true, true>(avx512, &c),
                (true, true, false) => planes::<true, true, false>(avx512, &c),
                (false, true, true) => planes::<false, true, true>(avx512, &c),
                (false, true, false) => planes::<false, true, false>(avx512, &c),
                (false, false, true) => planes::<false, false, true>(avx512, &c),
                (false, false, false) => planes::<false, false, false>(avx512, &c),
            }
        }
    }
}

/// A chain's operands as addresses, for a kernel that applies it to its sums while they are
/// in registers ([`VectorChain::apply`]): a blocked convolution's, whose output (and
/// residual, in the same layout) is stored in channel blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VectorChain {
    bias: *const f32,
    residual: *const f32,
    lo: f32,
    hi: f32,
    max_first: bool,
}

// Safety: read-only addresses of a step's live buffers, shared by the step's threads.
unsafe impl Send for VectorChain {}
unsafe impl Sync for VectorChain {}

impl ConvEpilogue {
    /// The chain on the buffers `bufs` (the step's live base pointers).
    pub(crate) fn vectors(&self, bufs: &[*mut u8]) -> VectorChain {
        let ptr = |b: Option<BufferId>| b.map_or(std::ptr::null(), |b| bufs[b.index()] as *const f32);
        VectorChain {
            bias: ptr(self.bias),
            residual: ptr(self.residual),
            lo: self.lo,
            hi: self.hi,
            max_first: self.max_first,
        }
    }

    /// The residual the chain adds, if any: a buffer of the output's shape, read at the
    /// output's own offsets (so it must be stored in the output's layout).
    pub(crate) fn residual(&self) -> Option<BufferId> {
        self.residual
    }
}

impl VectorChain {
    /// A chain on the given addresses (null: no such step), for tests.
    #[cfg(test)]
    pub(crate) fn new(bias: *const f32, residual: *const f32, lo: f32, hi: f32, max_first: bool) -> VectorChain {
        VectorChain {
            bias,
            residual,
            lo,
            hi,
            max_first,
        }
    }

    /// The biases of channels `c..c + n.min(L::N)` (a block of the output's channels; lanes
    /// past the last channel, `n < L::N`, are zero).
    ///
    /// # Safety
    /// Called with `L`'s instruction set; the bias holds those channels.
    #[inline(always)]
    pub(crate) unsafe fn bias_block<L: Lanes>(&self, c: usize, n: usize) -> L {
        // Safety: the caller's contract.
        unsafe {
            if self.bias.is_null() {
                L::zero()
            } else if n >= L::N {
                L::load(self.bias.add(c))
            } else {
                L::load_first(self.bias.add(c), n)
            }
        }
    }

    /// Channel `c`'s bias in every lane.
    ///
    /// # Safety
    /// Called with `L`'s instruction set; the bias holds channel `c`.
    #[inline(always)]
    pub(crate) unsafe fn bias_splat<L: Lanes>(&self, c: usize) -> L {
        // Safety: the caller's contract.
        unsafe {
            if self.bias.is_null() {
                L::zero()
            } else {
                L::splat(self.bias.add(c))
            }
        }
    }

    /// The chain on sums `v` of `n` consecutive output elements stored from offset `at` on,
    /// with their biases `b`: the same steps, in the same order, as [`ConvEpilogue::apply`].
    ///
    /// # Safety
    /// Called with `L`'s instruction set; the residual holds elements `at..at + n`.
    #[inline(always)]
    pub(crate) unsafe fn apply<L: Lanes>(&self, v: L, b: L, at: usize, n: usize) -> L {
        // Safety: the caller's contract.
        unsafe {
            let mut v = v;
            if !self.bias.is_null() {
                v = L::add(v, b);
            }
            if !self.residual.is_null() {
                v = L::add(v, L::load_first(self.residual.add(at), n));
            }
            let (lo, hi) = (L::splat(&self.lo), L::splat(&self.hi));
            if self.max_first {
                L::min(hi, L::max(lo, v))
            } else {
                L::max(lo, L::min(hi, v))
            }
        }
    }
}

/// A chain on some planes, with its buffers' addresses.
struct Chain {
    out: *mut f32,
    bias: *const f32,
    residual: *const f32,
    lo: f32,
    hi: f32,
    channels: usize,
    plane: usize,
    planes: std::ops::Range<usize>,
}

/// The host's instance of [`chain`].
///
/// # Safety
/// As [`chain`]; `avx512` only on an AVX-512 host, else an AVX2 one.
unsafe fn planes<const BIAS: bool, const RES: bool, const MAX_FIRST: bool>(avx512: bool, c: &Chain) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn wide<const BIAS: bool, const RES: bool, const MAX_FIRST: bool>(c: &Chain) {
            // Safety: the caller's contract.
            unsafe { chain::<crate::simd::x86::Zmm, BIAS, RES, MAX_FIRST>(c) }
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn narrow<const BIAS: bool, const RES: bool, const MAX_FIRST: bool>(c: &Chain) {
            // Safety: the caller's contract.
            unsafe { chain::<crate::simd::x86::Ymm, BIAS, RES, MAX_FIRST>(c) }
        }
        // Safety: the caller's contract.
        unsafe {
            if avx512 {
                wide::<BIAS, RES, MAX_FIRST>(c)
            } else {
                narrow::<BIAS, RES, MAX_FIRST>(c)
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "no chain is recognized without vector instances ({avx512}, {})",
        c.plane
    )
}

/// The flat element offset a load map reads, as one affine expression of the loops (`None`
/// with a symbolic view).
fn linear(map: &IndexMap) -> Option<AffineExpr> {
    let view: Vec<usize> = map.view.iter().map(|d| d.as_static()).collect::<Option<_>>()?;
    let mut acc = AffineExpr::constant(0);
    for (a, e) in map.axes.iter().enumerate() {
        let stride = view[a + 1..].iter().product::<usize>() as i64;
        let scaled = e.scaled(stride, 0);
        acc.offset += scaled.offset;
        for (l, c) in scaled.terms {
            match acc.terms.iter_mut().find(|(m, _)| *m == l) {
                Some(t) => t.1 += c,
                None => acc.terms.push((l, c)),
            }
        }
    }
    acc.terms.retain(|&(_, c)| c != 0);
    acc.terms.sort_unstable();
    Some(acc)
}

/// `e` without the loops of extent 1 in `shape` (always 0), `None` when a term names no
/// loop of it.
fn reduced(e: &AffineExpr, shape: &[usize]) -> Option<AffineExpr> {
    let mut terms = Vec::new();
    for &(l, c) in &e.terms {
        if *shape.get(l)? > 1 {
            terms.push((l, c));
        }
    }
    Some(AffineExpr {
        terms,
        offset: e.offset,
    })
}

/// The chain on `c`'s planes.
///
/// # Safety
/// Called with `L`'s instruction set; every pointer covers what it is read or written at.
#[inline(always)]
unsafe fn chain<L: Lanes, const BIAS: bool, const RES: bool, const MAX_FIRST: bool>(c: &Chain) {
    // Safety: the caller's contract.
    unsafe {
        let (lo, hi) = (L::splat(&c.lo), L::splat(&c.hi));
        for p in c.planes.clone() {
            let at = p * c.plane;
            let (out, res) = (c.out.add(at), c.residual.wrapping_add(at));
            let b = if BIAS {
                L::splat(c.bias.add(p % c.channels))
            } else {
                L::zero()
            };
            let mut i = 0;
            while i + L::N <= c.plane {
                L::store(
                    out.add(i),
                    step::<L, BIAS, RES, MAX_FIRST>(L::load(out.add(i)), b, res.wrapping_add(i), L::N, lo, hi),
                );
                i += L::N;
            }
            if i < c.plane {
                let n = c.plane - i;
                L::store_first(
                    out.add(i),
                    n,
                    step::<L, BIAS, RES, MAX_FIRST>(L::load_first(out.add(i), n), b, res.wrapping_add(i), n, lo, hi),
                );
            }
        }
    }
}

/// One vector `v` of the chain: `b` the bias, `r` the residual's elements (`n` of them).
///
/// # Safety
/// As [`chain`].
#[inline(always)]
unsafe fn step<L: Lanes, const BIAS: bool, const RES: bool, const MAX_FIRST: bool>(
    v: L,
    b: L,
    r: *const f32,
    n: usize,
    lo: L,
    hi: L,
) -> L {
    // Safety: the caller's contract.
    unsafe {
        let mut v = v;
        if BIAS {
            v = L::add(v, b);
        }
        if RES {
            v = L::add(v, L::load_first(r, n));
        }
        // `lo > v ? lo : v` and `hi < v ? hi : v` keep a NaN `v` (the generated code's
        // `max`/`min` by a constant); by ∓∞ they change nothing.
        if MAX_FIRST {
            L::min(hi, L::max(lo, v))
        } else {
            L::max(lo, L::min(hi, v))
        }
    }
}
