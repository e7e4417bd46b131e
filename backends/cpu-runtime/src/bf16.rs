//! bf16 × bf16 → f32 products (matmul and convolution) on the host's bf16 instructions, chosen
//! at run time:
//! - **AMX-BF16** (Sapphire Rapids and later): `tdpbf16ps` on 16 × 32 tiles, a 32 × 32 block
//!   of the result in four tile registers;
//! - **AVX512-BF16** (Cooper Lake, Zen 4, and the AMX hosts): `vdpbf16ps`, an 8 × 32 block in
//!   sixteen vector registers.
//!
//! Both accumulate in f32 (each instruction adds a pair of products to an f32 sum), as the
//! reference's f64 accumulation rounded once agrees with to bf16's tolerance. A host with
//! neither has no native path ([`isa`] is `None`): the contraction runtime then widens the
//! operands to f32 and runs the f32 kernels, and the lowering keeps the conversions in the
//! program, where they are shared.
//!
//! One packed layout serves both instruction sets:
//! - the left operand row-major, `K` padded with zeros to a multiple of 32 and the rows to a
//!   multiple of 32 (used in place when it already is one);
//! - the right operand in blocks of 16 columns, each block `K/2` rows of 16 column pairs
//!   `(b[2r][j], b[2r + 1][j])` ("VNNI" order: what a tile row and a `vdpbf16ps` operand hold).
//!
//! bf16 values travel as their bits (`u16`). An operand may also be f32 values rounded to
//! bf16 as they are packed ([`Elem`]): a product then reads an f32 activation or weight with
//! no bf16 copy of it in memory.

use crate::contraction::{Mat, SendPtr};
use crate::par::par_units;
use crate::scratch::Pooled;

/// Columns of a right-operand block, and `K` per step (32 bf16: a 64-byte tile row).
const NB: usize = 16;
const KSTEP: usize = 32;
/// Rows of a left-operand block (two 16-row tiles).
const MB: usize = 32;
/// Columns of the result computed per pass over a left block (its packed right operand,
/// 256 columns × K, stays in L2 while the left blocks stream by).
const NCHUNK: usize = 256;

/// An element a product reads as bf16: bf16 bits as they are, or f32 values rounded to
/// nearest, ties to even (NaNs quieted), as the cast rounds them.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    /// True for bf16 bits (`u16`), which a packed layout can use in place.
    const BITS: bool;
    /// The element as bf16 bits.
    fn bits(self) -> u16;
    /// `dst[i] = src[i].bits()`.
    fn row(src: &[Self], dst: &mut [u16]);
    /// `out[2c] = x[c].bits()`, `out[2c + 1] = y[c].bits()` for 16 columns (with AVX-512F
    /// where `avx512`): two rows of a right operand in pair order.
    ///
    /// # Safety
    /// `x` and `y` point at 16 valid elements each; `out` holds 32; `avx512` only where the
    /// host has AVX-512F.
    unsafe fn interleave16(avx512: bool, x: *const Self, y: *const Self, out: &mut [u16]);
    /// `dst[i] = src[i · stride].bits()` (with AVX-512F gathers where `avx512` allows).
    ///
    /// # Safety
    /// Those elements are valid; `avx512` only where the host has AVX-512F.
    #[inline(always)]
    unsafe fn gather(_avx512: bool, src: *const Self, stride: isize, dst: &mut [u16]) {
        // Safety: the caller's contract.
        unsafe { gather_scalar(src, stride, dst) }
    }
    /// `out[2c] = at[c · cs].bits()`, `out[2c + 1] = at[c · cs + 1].bits()` for 16 columns `c`
    /// (the column pairs of a transposed right operand; AVX-512F gathers where `avx512` allows).
    ///
    /// # Safety
    /// Those elements are valid; `out` holds 32; `avx512` only where the host has AVX-512F.
    #[inline(always)]
    unsafe fn pairs16(_avx512: bool, at: *const Self, cs: isize, out: &mut [u16]) {
        // Safety: the caller's contract.
        unsafe { pairs16_scalar(at, cs, out) }
    }
}

impl Elem for u16 {
    const BITS: bool = true;
    #[inline(always)]
    fn bits(self) -> u16 {
        self
    }
    #[inline(always)]
    fn row(src: &[u16], dst: &mut [u16]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    unsafe fn interleave16(avx512: bool, x: *const u16, y: *const u16, out: &mut [u16]) {
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // Safety: the caller's contract.
            return unsafe { interleave16_avx512(x, y, out) };
        }
        // Safety: the caller's contract.
        unsafe { interleave16_scalar(x, y, out) }
    }
}

impl Elem for f32 {
    const BITS: bool = false;
    #[inline(always)]
    fn bits(self) -> u16 {
        crate::ewise::bf16_bits(self)
    }
    #[inline(always)]
    fn row(src: &[f32], dst: &mut [u16]) {
        crate::ewise::narrow(crate::ewise::Half::Bf16, src, dst);
    }
    #[inline(always)]
    unsafe fn interleave16(avx512: bool, x: *const f32, y: *const f32, out: &mut [u16]) {
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // Safety: the caller's contract.
            return unsafe { interleave16_f32_avx512(x, y, out) };
        }
        // Safety: the caller's contract.
        unsafe { interleave16_scalar(x, y, out) }
    }
    #[inline(always)]
    unsafe fn gather(avx512: bool, src: *const f32, stride: isize, dst: &mut [u16]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(step) = gather_step(stride)
            && avx512
        {
            // Safety: the caller's contract (AVX-512F where `avx512`).
            return unsafe { gather_f32_avx512(src, step, dst) };
        }
        // Safety: the caller's contract.
        unsafe { gather_scalar(src, stride, dst) }
    }
    #[inline(always)]
    unsafe fn pairs16(avx512: bool, at: *const f32, cs: isize, out: &mut [u16]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(step) = gather_step(cs)
            && avx512
        {
            // Safety: the caller's contract (AVX-512F where `avx512`).
            return unsafe { pairs16_f32_avx512(at, step, out) };
        }
        // Safety: the caller's contract.
        unsafe { pairs16_scalar(at, cs, out) }
    }
}

/// The byte step between 16 gathered f32 elements `stride` apart, if 15 of them fit a
/// gather's i32 offsets.
#[cfg(target_arch = "x86_64")]
fn gather_step(stride: isize) -> Option<i32> {
    let step = i32::try_from(stride.checked_mul(4)?).ok()?;
    step.checked_mul(15)?;
    Some(step)
}

/// [`Elem::gather`] of f32 elements `step` bytes apart, 16 per AVX-512 gather.
///
/// # Safety
/// The host has AVX-512F; the elements are valid.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gather_f32_avx512(src: *const f32, step: i32, dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(step),
    );
    let n = dst.len() / NB * NB;
    for i in (0..n).step_by(NB) {
        let at = src.wrapping_byte_offset(i as isize * step as isize);
        // Safety: elements `i..i + 16` are valid (the caller's contract); 16 u16s of `dst`.
        unsafe {
            let v = _mm512_i32gather_epi32::<1>(idx, at.cast());
            let r = crate::ewise::bf16v::round16(v);
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi16(r));
        }
    }
    for (i, d) in dst.iter_mut().enumerate().skip(n) {
        // Safety: the caller's contract.
        *d = unsafe { *src.wrapping_byte_offset(i as isize * step as isize) }.bits();
    }
}

/// [`Elem::pairs16`] of f32 elements, columns `step` bytes apart: two gathers of eight
/// adjacent pairs, already in the interleaved order.
///
/// # Safety
/// The host has AVX-512F; the elements are valid; `out` holds 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pairs16_f32_avx512(at: *const f32, step: i32, out: &mut [u16]) {
    use std::arch::x86_64::*;
    assert!(out.len() >= 2 * NB);
    let idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(step));
    for half in 0..2 {
        let base = at.wrapping_byte_offset(8 * half as isize * step as isize);
        // Safety: columns `8·half..8·half + 8`, two f32s each, are valid; 16 u16s of `out`.
        unsafe {
            let v = _mm512_i32gather_epi64::<1>(idx, base.cast());
            let r = crate::ewise::bf16v::round16(v);
            _mm256_storeu_si256(out.as_mut_ptr().add(16 * half).cast(), _mm512_cvtepi32_epi16(r));
        }
    }
}

/// The bf16 instructions a product runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AMX tiles.
    Amx,
    /// AVX512-BF16 vectors.
    Avx512,
}

/// The bf16 instructions of this host the products use, `None` where it has none. The
/// environment variable `OAR_CPU_BF16` (read once) narrows the choice: `avx512` uses
/// AVX512-BF16 on an AMX host, `widen` no native path at all (so one AMX machine tests every
/// path).
pub(crate) fn isa() -> Option<Isa> {
    static ISA: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let forced = std::env::var("OAR_CPU_BF16").ok();
        let (amx, avx) = host();
        match forced.as_deref() {
            Some("widen") => None,
            Some("avx512") => avx.then_some(Isa::Avx512),
            _ if amx => Some(Isa::Amx),
            _ => avx.then_some(Isa::Avx512),
        }
    })
}

/// True if bf16 products run natively here (see [`isa`]): the cpu lowering then leaves the
/// operands of bf16 matmuls and convolutions in bf16.
pub fn native() -> bool {
    isa().is_some()
}

/// Whether the host has (AMX-BF16 usable by this process, AVX512-BF16).
fn host() -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        let avx = std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16");
        (avx && amx_permitted(), avx)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (false, false)
    }
}

/// CPUID says AMX-TILE and AMX-BF16, and the kernel lets this process use the tile data
/// (Linux grants it on request: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`).
#[cfg(target_arch = "x86_64")]
fn amx_permitted() -> bool {
    let l7 = std::arch::x86_64::__cpuid_count(7, 0);
    let (bf16, tile) = (l7.edx & (1 << 22) != 0, l7.edx & (1 << 24) != 0);
    if !(bf16 && tile) {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // Safety: a request for a permission; no memory is passed.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// A left operand ready for the kernels: row-major with `ld` elements per row, `mp` rows
/// (a multiple of [`MB`]) and `kp` columns (a multiple of [`KSTEP`]) readable, zeros past the
/// operand's own.
struct Left {
    ptr: *const u16,
    ld: usize,
    mp: usize,
    kp: usize,
    /// The packed copy `ptr` points into, if any.
    _packed: Option<Pooled<u16>>,
}

/// `a[m×k]` as a [`Left`]: in place when it is row-major with rows a multiple of 32 elements
/// apart and `m`, `k` multiples of 32, else packed.
///
/// # Safety
/// Every element of `a` for these sizes is valid.
unsafe fn left<A: Elem>(m: usize, k: usize, a: Mat<A>) -> Left {
    let (mp, kp) = (m.next_multiple_of(MB), k.next_multiple_of(KSTEP));
    if A::BITS && a.cs == 1 && mp == m && kp == k && a.rs >= k as isize {
        return Left {
            // (`A` is `u16`: only bf16 bits are used in place.)
            ptr: a.ptr.cast::<u16>(),
            ld: a.rs as usize,
            mp,
            kp,
            _packed: None,
        };
    }
    let avx512 = has_avx512();
    let mut p = Pooled::<u16>::take(mp * kp);
    for i in 0..mp {
        let row = &mut p[i * kp..][..kp];
        if i >= m {
            row.fill(0);
            continue;
        }
        let src = a.ptr.wrapping_offset(i as isize * a.rs);
        if a.cs == 1 {
            // Safety: row `i`'s `k` elements are valid (the caller's contract).
            A::row(unsafe { std::slice::from_raw_parts(src, k) }, &mut row[..k]);
        } else {
            // Safety: as above.
            unsafe { A::gather(avx512, src, a.cs, &mut row[..k]) };
        }
        row[k..].fill(0);
    }
    Left {
        ptr: p.as_ptr(),
        ld: kp,
        mp,
        kp,
        _packed: Some(p),
    }
}

/// Elements of `b[k×n]` packed by [`pack_right`]: `(kp, np, len)`.
fn right_dims(k: usize, n: usize) -> (usize, usize, usize) {
    let (kp, np) = (k.next_multiple_of(KSTEP), n.next_multiple_of(2 * NB));
    (kp, np, kp * np)
}

/// Pack `b[k×n]` into `dst` (at least [`right_dims`]' length) in blocks of 16 columns of
/// `kp / 2` rows of column pairs (see the module docs), zeros past the operand.
///
/// # Safety
/// Every element of `b` for these sizes is valid.
pub(crate) unsafe fn pack_right<B: Elem>(k: usize, n: usize, b: Mat<B>, dst: &mut [u16]) {
    let (_, np, len) = right_dims(k, n);
    // Safety: the caller's contract.
    unsafe { pack_right_blocks(k, n, b, &mut dst[..len], 0..np / NB) };
}

/// [`pack_right`] of column blocks `blocks` only, into `dst`: those blocks' part of the packed
/// operand.
///
/// # Safety
/// As [`pack_right`].
unsafe fn pack_right_blocks<B: Elem>(k: usize, n: usize, b: Mat<B>, dst: &mut [u16], blocks: std::ops::Range<usize>) {
    let half = k.next_multiple_of(KSTEP) / 2;
    let avx512 = has_avx512();
    for (jb, block) in blocks.zip(dst.chunks_exact_mut(half * 2 * NB)) {
        let j0 = jb * NB;
        let cols = n.saturating_sub(j0).min(NB);
        for (r, out) in block.chunks_exact_mut(2 * NB).enumerate() {
            let (p0, p1) = (2 * r, 2 * r + 1);
            let row = |p: usize| b.ptr.wrapping_offset(p as isize * b.rs + j0 as isize * b.cs);
            if cols == NB && p1 < k && b.cs == 1 {
                // Safety: both rows' 16 columns are valid (the caller's contract).
                unsafe { B::interleave16(avx512, row(p0), row(p1), out) };
                continue;
            }
            if p1 < k && b.rs == 1 {
                // A transposed operand: each pair is two adjacent elements of a column.
                if cols == NB {
                    // Safety: elements (p0, j0 + c) and (p1, j0 + c) are valid for 16 columns.
                    unsafe { B::pairs16(avx512, row(p0), b.cs, out) };
                    continue;
                }
                for c in 0..NB {
                    let (x, y) = if c < cols {
                        let at = row(p0).wrapping_offset(c as isize * b.cs);
                        // Safety: elements (p0, j0 + c) and (p1, j0 + c) are valid.
                        unsafe { ((*at).bits(), (*at.add(1)).bits()) }
                    } else {
                        (0, 0)
                    };
                    out[2 * c] = x;
                    out[2 * c + 1] = y;
                }
                continue;
            }
            for (lane, p) in [p0, p1].into_iter().enumerate() {
                for c in 0..NB {
                    out[2 * c + lane] = if p < k && c < cols {
                        // Safety: element (p, j0 + c) is valid (the caller's contract).
                        unsafe { *row(p).offset(c as isize * b.cs) }.bits()
                    } else {
                        0
                    };
                }
            }
        }
    }
}

/// Whether the host has AVX-512F (the packing's vector paths).
fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`Elem::gather`] one element at a time.
///
/// # Safety
/// As [`Elem::gather`].
#[inline(always)]
unsafe fn gather_scalar<E: Elem>(src: *const E, stride: isize, dst: &mut [u16]) {
    for (i, d) in dst.iter_mut().enumerate() {
        // Safety: the caller's contract.
        *d = unsafe { *src.offset(i as isize * stride) }.bits();
    }
}

/// [`Elem::pairs16`] one element at a time.
///
/// # Safety
/// As [`Elem::pairs16`].
#[inline(always)]
unsafe fn pairs16_scalar<E: Elem>(at: *const E, cs: isize, out: &mut [u16]) {
    for c in 0..NB {
        let p = at.wrapping_offset(c as isize * cs);
        // Safety: the caller's contract.
        unsafe {
            out[2 * c] = (*p).bits();
            out[2 * c + 1] = (*p.add(1)).bits();
        }
    }
}

/// [`Elem::interleave16`] one element at a time.
///
/// # Safety
/// As [`Elem::interleave16`].
#[inline(always)]
unsafe fn interleave16_scalar<E: Elem>(x: *const E, y: *const E, out: &mut [u16]) {
    for c in 0..NB {
        // Safety: the caller's contract.
        unsafe {
            out[2 * c] = (*x.add(c)).bits();
            out[2 * c + 1] = (*y.add(c)).bits();
        }
    }
}

/// Stores bf16 bits held in the low halves of `lo`'s and `hi`'s lanes as 16 pairs
/// `(lo[c], hi[c])`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn store_pairs16(lo: std::arch::x86_64::__m512i, hi: std::arch::x86_64::__m512i, out: &mut [u16]) {
    use std::arch::x86_64::*;
    assert!(out.len() >= 2 * NB);
    // Safety: 64 bytes of `out` (checked above).
    unsafe {
        _mm512_storeu_si512(
            out.as_mut_ptr().cast(),
            _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi)),
        )
    };
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn interleave16_avx512(x: *const u16, y: *const u16, out: &mut [u16]) {
    use std::arch::x86_64::*;
    // Safety: 16 u16s at each of `x`, `y`.
    let (lo, hi) = unsafe {
        (
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(x.cast())),
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(y.cast())),
        )
    };
    store_pairs16(lo, hi, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn interleave16_f32_avx512(x: *const f32, y: *const f32, out: &mut [u16]) {
    use crate::ewise::bf16v::round16;
    use std::arch::x86_64::*;
    // Safety: 16 f32s at each of `x`, `y`.
    let (lo, hi) = unsafe { (_mm512_loadu_si512(x.cast()), _mm512_loadu_si512(y.cast())) };
    store_pairs16(round16(lo), round16(hi), out);
}

/// `dst[m×n] (row stride ldc) = a[m×k] · b[k×n]` in f32 from bf16 operands, on `threads`
/// threads, with `isa`'s instructions.
///
/// # Safety
/// Every element the strides address for these sizes is valid; `dst` holds rows `0..m` of
/// `n` elements `ldc` apart and overlaps neither operand; `isa` runs on this host.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<A: Elem, B: Elem>(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    ldc: usize,
    a: Mat<A>,
    b: Mat<B>,
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            // Safety: row `i` of `dst` (the caller's contract).
            unsafe { std::slice::from_raw_parts_mut(dst.add(i * ldc), n).fill(0.0) };
        }
        return;
    }
    if m == 1 && n > 1 {
        // A single row (a batch-1 classifier): the product transposed, `dstᵀ[n×1] = bᵀ · aᵀ`,
        // so the large operand is the left one, packed by rows (a copy of contiguous runs
        // for a `[n, k]` weight read transposed) rather than gathered pair by pair.
        let (bt, at) = (
            Mat {
                ptr: b.ptr,
                rs: b.cs,
                cs: b.rs,
            },
            Mat {
                ptr: a.ptr,
                rs: a.cs,
                cs: a.rs,
            },
        );
        // Safety: the same elements, transposed; `dst` holds n elements 1 apart.
        return unsafe { gemm(isa, n, 1, k, dst, 1, bt, at, threads) };
    }
    let (kp, np, len) = right_dims(k, n);
    let mut packed = Pooled::<u16>::take(len);
    let blocks = np / NB;
    let parts = if k * n >= 1 << 15 { threads.clamp(1, blocks) } else { 1 };
    if parts <= 1 {
        // Safety: the caller's contract.
        unsafe { pack_right(k, n, b, &mut packed) };
    } else {
        let (out, per_block) = (SendPtr(packed.as_mut_ptr()), kp * NB);
        let bp = SendPtr(b.ptr as *mut B);
        let (rs, cs) = (b.rs, b.cs);
        par_units(
            parts,
            parts,
            || (),
            |_, part| {
                let (b0, b1) = (blocks * part / parts, blocks * (part + 1) / parts);
                // Safety: the parts write disjoint blocks of `packed`; the caller's contract.
                unsafe {
                    let dst = std::slice::from_raw_parts_mut(out.get().add(b0 * per_block), (b1 - b0) * per_block);
                    let b = Mat {
                        ptr: bp.get() as *const B,
                        rs,
                        cs,
                    };
                    pack_right_blocks(k, n, b, dst, b0..b1);
                }
            },
        );
    }
    // Safety: the caller's contract.
    let lhs = unsafe { left(m, k, a) };
    // Safety: as above; `packed` is `b` packed.
    unsafe { product(isa, m, n, &lhs, &packed, dst, ldc, threads) };
}

/// The product of a [`Left`] and a packed right operand into `dst`, split over `threads`
/// (by blocks of rows where there are enough, else by columns).
///
/// # Safety
/// As [`gemm`].
#[allow(clippy::too_many_arguments)]
unsafe fn product(isa: Isa, m: usize, n: usize, a: &Left, b: &[u16], dst: *mut f32, ldc: usize, threads: usize) {
    let mblocks = a.mp / MB;
    let nblocks = n.div_ceil(2 * NB);
    let (rows_split, parts) = if mblocks >= threads || mblocks >= nblocks {
        (true, threads.min(mblocks).max(1))
    } else {
        (false, threads.min(nblocks).max(1))
    };
    let (ap, dstp) = (SendPtr(a.ptr as *mut u16), SendPtr(dst));
    let (ld, kp) = (a.ld, a.kp);
    let run = |part: usize| {
        let range = |total: usize| (total * part / parts, total * (part + 1) / parts);
        let ((i0, i1), (j0, j1)) = if rows_split {
            (range(mblocks), (0, nblocks))
        } else {
            ((0, mblocks), range(nblocks))
        };
        let region = Region {
            a: ap.get(),
            ld,
            kp,
            b: b.as_ptr(),
            m,
            n,
            dst: dstp.get(),
            ldc,
        };
        // Safety: the caller's contract; parts write disjoint blocks of `dst`.
        unsafe {
            match isa {
                Isa::Amx => amx::blocks(&region, i0..i1, j0..j1),
                Isa::Avx512 => avx512::blocks(&region, i0..i1, j0..j1),
            }
        }
    };
    if parts <= 1 {
        run(0);
    } else {
        par_units(parts, parts, || (), |_, p| run(p));
    }
}

/// What the kernels compute: `dst[m×n] = a · b` for a [`Left`] `a` and a packed `b`.
struct Region {
    a: *const u16,
    ld: usize,
    kp: usize,
    b: *const u16,
    m: usize,
    n: usize,
    dst: *mut f32,
    ldc: usize,
}

impl Region {
    /// `f(i0, j0)` for the 32 × 32 result blocks `ib` × `jb` (in block units), in chunks of
    /// [`NCHUNK`] columns: each chunk's packed right operand stays in cache while every row
    /// block passes over it.
    #[inline(always)]
    fn each_block(ib: std::ops::Range<usize>, jb: std::ops::Range<usize>, mut f: impl FnMut(usize, usize)) {
        let chunk = NCHUNK / (2 * NB);
        let mut j = jb.start;
        while j < jb.end {
            let je = (j + chunk).min(jb.end);
            for i in ib.clone() {
                for jj in j..je {
                    f(i * MB, jj * 2 * NB);
                }
            }
            j = je;
        }
    }

    /// Packed block `jb` of 16 columns of the right operand.
    fn right_block(&self, jb: usize) -> *const u16 {
        self.b.wrapping_add(jb * self.kp * NB)
    }

    /// Write the `rows × cols` block `tile` (row stride `ts` elements) at (`i0`, `j0`) of
    /// `dst`, cut to the result's own rows and columns.
    ///
    /// # Safety
    /// `tile` holds the block.
    #[inline(always)]
    unsafe fn put(&self, tile: &[f32], ts: usize, rows: usize, cols: usize, i0: usize, j0: usize) {
        let rows = rows.min(self.m.saturating_sub(i0));
        let cols = cols.min(self.n.saturating_sub(j0));
        for r in 0..rows {
            // Safety: row `i0 + r < m`, columns `j0..j0 + cols ≤ n` of `dst`.
            unsafe {
                std::ptr::copy_nonoverlapping(tile.as_ptr().add(r * ts), self.dst.add((i0 + r) * self.ldc + j0), cols)
            };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod amx {
    //! `tdpbf16ps` on tiles: C (16 × 16 f32) += A (16 × 32 bf16) · B (16 pair rows × 16
    //! columns). Tiles 0–3 hold a 32 × 32 block of the result, 4–5 two A tiles, 6–7 two B
    //! tiles; every tile is 16 rows of 64 bytes.
    use super::{KSTEP, MB, NB, Region};
    use std::arch::asm;

    #[repr(C, align(64))]
    struct Config([u8; 64]);

    fn config() -> Config {
        let mut c = Config([0; 64]);
        c.0[0] = 1; // palette 1
        for t in 0..8 {
            c.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
            c.0[48 + t] = 16;
        }
        c
    }

    /// Clear the four result tiles.
    #[inline(always)]
    unsafe fn zero() {
        // Safety: tiles configured by the caller.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            )
        };
    }

    /// One K step: A tiles at `a0`, `a1` (rows `lda` bytes apart), B tiles at `b0`, `b1` (rows
    /// `ldb` bytes apart), the four products added to the result tiles.
    #[inline(always)]
    unsafe fn step(a0: *const u16, a1: *const u16, lda: usize, b0: *const u16, b1: *const u16, ldb: usize) {
        // Safety: the caller's tiles lie in readable memory.
        unsafe {
            asm!(
                "tileloadd tmm4, [{a0} + {lda}*1]",
                "tileloadd tmm5, [{a1} + {lda}*1]",
                "tileloadd tmm6, [{b0} + {ldb}*1]",
                "tileloadd tmm7, [{b1} + {ldb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0,
                a1 = in(reg) a1,
                lda = in(reg) lda,
                b0 = in(reg) b0,
                b1 = in(reg) b1,
                ldb = in(reg) ldb,
                options(nostack, readonly)
            )
        };
    }

    /// Store the four result tiles at `c` (rows `ldc` bytes apart).
    #[inline(always)]
    unsafe fn store(c: [*mut f32; 4], ldc: usize) {
        // Safety: the caller's 16 × 16 blocks lie in writable memory.
        unsafe {
            asm!(
                "tilestored [{c0} + {ldc}*1], tmm0",
                "tilestored [{c1} + {ldc}*1], tmm1",
                "tilestored [{c2} + {ldc}*1], tmm2",
                "tilestored [{c3} + {ldc}*1], tmm3",
                c0 = in(reg) c[0],
                c1 = in(reg) c[1],
                c2 = in(reg) c[2],
                c3 = in(reg) c[3],
                ldc = in(reg) ldc,
                options(nostack)
            )
        };
    }

    /// Store the result tiles into `t` (four 16 × 16 tiles, one after another).
    #[inline(always)]
    unsafe fn store_to(t: &mut [f32; 1024]) {
        let p = t.as_mut_ptr();
        // Safety: `t` holds the four tiles.
        unsafe { store([p, p.add(256), p.add(512), p.add(768)], 64) };
    }

    /// Result blocks `ib` (of 32 rows) × `jb` (of 32 columns).
    ///
    /// # Safety
    /// AMX-BF16 is usable; `r` describes valid operands and result.
    pub(super) unsafe fn blocks(r: &Region, ib: std::ops::Range<usize>, jb: std::ops::Range<usize>) {
        // Safety: the caller's contract.
        unsafe { with_tiles(|| Region::each_block(ib, jb, |i0, j0| block(r, i0, j0))) };
    }

    /// `f()` with the tiles configured (palette 1, every tile 16 rows of 64 bytes), then
    /// released (the tile state back to its initial one).
    ///
    /// # Safety
    /// AMX-BF16 is usable.
    unsafe fn with_tiles(f: impl FnOnce()) {
        let cfg = config();
        // Safety: a valid palette-1 configuration.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        f();
        // Safety: the tiles were configured above.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }

    /// The 32 × 32 block at (`i0`, `j0`).
    #[inline(always)]
    unsafe fn block(r: &Region, i0: usize, j0: usize) {
        let lda = r.ld * 2;
        let a0 = r.a.wrapping_add(i0 * r.ld);
        let a1 = a0.wrapping_add(16 * r.ld);
        let b0 = r.right_block(j0 / NB);
        let b1 = r.right_block(j0 / NB + 1);
        // Safety: tiles configured by `blocks`; every A tile row lies in the left operand's
        // `mp × kp` readable elements, every B tile in its packed block.
        unsafe {
            zero();
            for s in 0..r.kp / KSTEP {
                step(
                    a0.add(s * KSTEP),
                    a1.add(s * KSTEP),
                    lda,
                    b0.add(s * KSTEP * NB),
                    b1.add(s * KSTEP * NB),
                    64,
                );
            }
        }
        let full_rows = i0 + MB <= r.m;
        let full_cols = j0 + 2 * NB <= r.n;
        if full_rows && full_cols {
            let c0 = r.dst.wrapping_add(i0 * r.ldc + j0);
            let c2 = c0.wrapping_add(16 * r.ldc);
            // Safety: the whole block lies in `dst`.
            unsafe { store([c0, c0.wrapping_add(NB), c2, c2.wrapping_add(NB)], r.ldc * 4) };
            return;
        }
        // An edge block: through a buffer, cut to the result.
        let mut t = [0f32; 4 * 256];
        // Safety: `t` holds four 16 × 16 tiles.
        unsafe {
            store_to(&mut t);
            r.put(&t[..256], NB, 16, NB, i0, j0);
            r.put(&t[256..512], NB, 16, NB, i0, j0 + NB);
            r.put(&t[512..768], NB, 16, NB, i0 + 16, j0);
            r.put(&t[768..], NB, 16, NB, i0 + 16, j0 + NB);
        }
    }

    /// Units `work` of the direct convolution ([`super::direct_conv`]): unit `u` is channel
    /// block `u % mblocks` (32 output channels) of grid chunk `u / mblocks` (32 positions).
    ///
    /// # Safety
    /// AMX is usable; `a` holds `mblocks · 32` rows of `kp` weights, `b` the phase planes
    /// `boffs` index (row stride `ldb` bytes), `out` the group's `og` output planes.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn direct_units(
        a: *const u16,
        kp: usize,
        b: *const u16,
        ldb: usize,
        boffs: &[usize],
        out: *mut f32,
        og: usize,
        dp: &super::Direct,
        mblocks: usize,
        work: std::ops::Range<usize>,
    ) {
        // Safety: the caller's contract.
        unsafe { with_tiles(|| direct_block_units(a, kp, b, ldb, boffs, out, og, dp, mblocks, work)) };
    }

    /// [`direct_units`] with the tiles configured.
    ///
    /// # Safety
    /// As [`direct_units`], with the tiles configured.
    #[allow(clippy::too_many_arguments)]
    unsafe fn direct_block_units(
        a: *const u16,
        kp: usize,
        b: *const u16,
        ldb: usize,
        boffs: &[usize],
        out: *mut f32,
        og: usize,
        dp: &super::Direct,
        mblocks: usize,
        work: std::ops::Range<usize>,
    ) {
        let lda = kp * 2;
        let (grid, wq, ow, ys) = (dp.grid(), dp.wq, dp.ow, dp.oh * dp.ow);
        let mut t = [0f32; 4 * 256];
        for u in work {
            let (chunk, mb) = (u / mblocks, u % mblocks);
            let (i0, f0) = (mb * MB, chunk * 2 * NB);
            let a0 = a.wrapping_add(i0 * kp);
            let a1 = a0.wrapping_add(16 * kp);
            let b0 = b.wrapping_add(f0 * 2);
            // Safety: every tile lies in the packed weights or the phase planes (their slack
            // covers the last chunk); `t` holds four 16 × 16 tiles.
            unsafe {
                zero();
                for (s, &off) in boffs.iter().enumerate() {
                    let bs = b0.add(off);
                    step(a0.add(s * KSTEP), a1.add(s * KSTEP), lda, bs, bs.add(2 * NB), ldb);
                }
                store_to(&mut t);
            }
            // Runs of the chunk's positions on one output row, in its valid columns.
            let mut f = f0;
            let end = (f0 + 2 * NB).min(grid);
            while f < end {
                let (oy, ox) = (f / wq, f % wq);
                let run_end = (f - ox + wq).min(end);
                let valid = (f - ox + ow).min(run_end);
                if f < valid {
                    let (c0, len) = (f - f0, valid - f);
                    for r in 0..MB.min(og.saturating_sub(i0)) {
                        let (tr, rr) = (r / 16, r % 16);
                        // The run's columns c0..c0 + len may cross from the first tile
                        // column block (0..16) to the second.
                        let mut c = c0;
                        while c < c0 + len {
                            let tc = c / NB;
                            let n = (NB * (tc + 1)).min(c0 + len) - c;
                            let src = &t[(tr * 2 + tc) * 256 + rr * NB + c % NB..][..n];
                            // Safety: output channel i0 + r < og, row oy, columns ox + (c − c0)
                            // onward, within the row (valid ≤ row start + ow).
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src.as_ptr(),
                                    out.add((i0 + r) * ys + oy * ow + ox + (c - c0)),
                                    n,
                                )
                            };
                            c += n;
                        }
                    }
                }
                f = run_end;
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod amx {
    pub(super) unsafe fn blocks(_: &super::Region, _: std::ops::Range<usize>, _: std::ops::Range<usize>) {
        unreachable!("AMX is never detected off x86-64")
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn direct_units(
        _: *const u16,
        _: usize,
        _: *const u16,
        _: usize,
        _: &[usize],
        _: *mut f32,
        _: usize,
        _: &super::Direct,
        _: usize,
        _: std::ops::Range<usize>,
    ) {
        unreachable!("AMX is never detected off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! `vdpbf16ps`: each f32 lane adds a pair of products. An 8 × 32 block of the result in
    //! sixteen registers; per pair row of K, two loads of the packed right operand and eight
    //! broadcast pairs of the left.
    use super::{MB, NB, Region};
    use std::arch::x86_64::*;

    const ROWS: usize = 8;

    /// Result blocks `ib` (of 32 rows) × `jb` (of 32 columns).
    ///
    /// # Safety
    /// AVX512-BF16 is available; `r` describes valid operands and result.
    pub(super) unsafe fn blocks(r: &Region, ib: std::ops::Range<usize>, jb: std::ops::Range<usize>) {
        Region::each_block(ib, jb, |i0, j0| {
            for i in (i0..(i0 + MB).min(r.m)).step_by(ROWS) {
                // Safety: the caller's contract.
                unsafe { block(r, i, j0) };
            }
        });
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn block(r: &Region, i0: usize, j0: usize) {
        let b0 = r.right_block(j0 / NB);
        let b1 = r.right_block(j0 / NB + 1);
        let a = r.a.wrapping_add(i0 * r.ld);
        let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
        for p in 0..r.kp / 2 {
            // Safety: pair row `p` of both packed blocks and elements `2p, 2p + 1` of the
            // block's rows lie in the operands' readable elements.
            unsafe {
                let v0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b0.add(p * 2 * NB).cast()));
                let v1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b1.add(p * 2 * NB).cast()));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let pair = (a.add(i * r.ld + 2 * p) as *const i32).read_unaligned();
                    let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    acc[0] = _mm512_dpbf16_ps(acc[0], x, v0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], x, v1);
                }
            }
        }
        let mut t = [0f32; ROWS * 2 * NB];
        for (i, acc) in acc.iter().enumerate() {
            // Safety: row `i` of `t` holds 32 f32s.
            unsafe {
                _mm512_storeu_ps(t.as_mut_ptr().add(i * 2 * NB), acc[0]);
                _mm512_storeu_ps(t.as_mut_ptr().add(i * 2 * NB + NB), acc[1]);
            }
        }
        // Safety: `t` holds the block.
        unsafe { r.put(&t, 2 * NB, ROWS, 2 * NB, i0, j0) };
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod avx512 {
    pub(super) unsafe fn blocks(_: &super::Region, _: std::ops::Range<usize>, _: std::ops::Range<usize>) {
        unreachable!("AVX512-BF16 is never detected off x86-64")
    }
}

/// Patch-matrix elements per tile of output positions (per thread), as the f32 path's.
const TILE_ELEMS: usize = 1 << 17;

/// A bf16 convolution `x[N, C, *S] ⋆ w[O, C/groups, *K] -> out[N, O, *Y]` in f32 (see
/// [`crate::conv`] for the geometry): per (image, group, tile of output positions) the tile's
/// patch matrix (im2col, or the input itself for a 1 × 1 stride-1 convolution) is packed and
/// multiplied by the group's weights. Returns `Ok(false)` for the shapes this path leaves to
/// the widening one (depthwise and other convolutions of very few channels per group, kernels
/// larger than the padded input), having written nothing.
///
/// # Safety
/// The views are in bounds of the buffers at `px`, `pw`; `out` holds `out_shape`'s elements
/// and overlaps neither operand; `isa` runs on this host.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv(
    isa: Isa,
    x: &crate::contraction::View,
    px: *const u16,
    w: &crate::contraction::View,
    pw: *const u16,
    out: *mut f32,
    out_shape: &[usize],
    spec: &crate::conv::ConvSpec,
    threads: usize,
    cache: Option<&crate::contraction::WeightCache>,
) -> Result<bool, String> {
    use crate::conv::{Crop, Dims, dense_run, geometry_to, im2col};
    let (geo, d) = geometry_to(&x.shape, &w.shape, out_shape, spec)?;
    let Dims { n, c, o, cg, g, og, ys } = d;
    let (ks, s_in) = (geo.ks, geo.s_in);
    let kdim = cg * ks;
    if n * o * ys == 0 {
        return Ok(true);
    }
    // Fewer than 32 output channels per group fill a tile's rows poorly (LeNet's 6 and 16 ran
    // about 3× slower than widened f32 here); those and tiny kernels take the widening path.
    if cg == 0 || s_in == 0 || kdim < 16 || og < 32 || Crop::of(&geo, spec).is_some() {
        return Ok(false);
    }
    // Contiguous operands.
    let (mut xbuf, mut wbuf) = (Vec::new(), Vec::new());
    // Safety: the views are in bounds (the caller's contract).
    let (xp, wp) = unsafe { (dense_run(px, x, &mut xbuf), dense_run(pw, w, &mut wbuf)) };
    let pointwise = spec.pointwise(&geo);
    // Safety: contiguous operands of the checked shapes; AMX is usable where `isa` says so.
    if isa == Isa::Amx && !pointwise && unsafe { direct_conv(&geo, spec, &d, xp, wp, out, threads, cache) } {
        return Ok(true);
    }
    // Each group's weights as a left operand ([og × kdim], row-major), made once.
    let lefts: Vec<Left> = (0..g)
        .map(|grp| {
            let a = Mat {
                ptr: wp.wrapping_add(grp * og * kdim),
                rs: kdim as isize,
                cs: 1,
            };
            // Safety: group `grp`'s weights are in bounds.
            unsafe { left(og, kdim, a) }
        })
        .collect();
    let lefts: Vec<(SendPtr<u16>, usize)> = lefts.iter().map(|l| (SendPtr(l.ptr as *mut u16), l.ld)).collect();
    let (mp, kp) = (og.next_multiple_of(MB), kdim.next_multiple_of(KSTEP));
    let max_tile = if pointwise {
        ys.min(1024)
    } else {
        (TILE_ELEMS / kdim).max(2 * NB)
    };
    let ntiles = ys.div_ceil(max_tile);
    let tile = ys.div_ceil(ntiles).next_multiple_of(2 * NB).min(ys);
    let ntiles = ys.div_ceil(tile);
    let units = n * g * ntiles;
    let mblocks = mp / MB;
    // Too few units for the threads: each also splits its rows (output channels).
    let mparts = if units < threads {
        threads.div_ceil(units).min(mblocks)
    } else {
        1
    };
    let (xp, out) = (SendPtr(xp as *mut u16), SendPtr(out));
    let lefts = &lefts;
    par_units(
        units * mparts,
        threads,
        || {
            let cols = Pooled::<u16>::take(if pointwise { 0 } else { kdim * tile });
            let packed = Pooled::<u16>::take(right_dims(kdim, tile).2);
            (cols, packed)
        },
        |(cols, packed), u| {
            let (unit, part) = (u / mparts, u % mparts);
            let (b, grp, t) = (unit / (g * ntiles), (unit / ntiles) % g, unit % ntiles);
            let (y0, y1) = (t * tile, ((t + 1) * tile).min(ys));
            let yc = y1 - y0;
            let xg = (xp.get() as *const u16).wrapping_add((b * c + grp * cg) * s_in);
            let rhs = if pointwise {
                Mat {
                    ptr: xg.wrapping_add(y0),
                    rs: s_in as isize,
                    cs: 1,
                }
            } else {
                let cols = &mut cols[..kdim * yc];
                // Safety: the group's `cg` input planes of image `b`, in bounds.
                im2col(
                    &geo,
                    unsafe { std::slice::from_raw_parts(xg, cg * s_in) },
                    cg,
                    y0,
                    y1,
                    cols,
                );
                Mat {
                    ptr: cols.as_ptr(),
                    rs: yc as isize,
                    cs: 1,
                }
            };
            // Safety: the patch matrix (or the input planes) holds kdim × yc elements.
            unsafe { pack_right(kdim, yc, rhs, packed) };
            let (a, ld) = lefts[grp];
            let region = Region {
                a: a.get() as *const u16,
                ld,
                kp,
                b: packed.as_ptr(),
                m: og,
                n: yc,
                dst: out.get().wrapping_add((b * o + grp * og) * ys + y0),
                ldc: ys,
            };
            let ib = mblocks * part / mparts..mblocks * (part + 1) / mparts;
            let jb = 0..yc.div_ceil(2 * NB);
            // Safety: output rows (b, grp·og + ib) columns y0..y1: in bounds, disjoint per
            // unit and part; operands packed above.
            unsafe {
                match isa {
                    Isa::Amx => amx::blocks(&region, ib, jb),
                    Isa::Avx512 => avx512::blocks(&region, ib, jb),
                }
            }
        },
    );
    Ok(true)
}

/// The direct path's layout of one 2-d convolution on AMX (see [`direct_conv`]).
struct Direct {
    /// Output rows and columns; columns of the position grid (output columns and junk ones).
    oh: usize,
    ow: usize,
    wq: usize,
    /// Channels per group padded to a multiple of 32 (16 pairs per K step).
    cp: usize,
    /// Pairs per phase plane (the grid, and slack past its end that the last chunk reads).
    plane: usize,
    /// Phase planes kept: `(row phase, column phase)`, and each tap's phase index and grid
    /// offset, in tap order (row-major over the kernel).
    phases: Vec<(usize, usize)>,
    taps: Vec<(usize, usize)>,
    /// Phase grid rows; input size, stride, padding before.
    hq: usize,
    h: usize,
    w: usize,
    sh: usize,
    sw: usize,
    pt: usize,
    pl: usize,
}

impl Direct {
    /// The layout of a 2-d convolution with `cg` input channels per group, `None` where the
    /// direct path does not apply (other ranks, few channels, a tap reaching past the slack).
    fn new(geo: &crate::conv::Geo, spec: &crate::conv::ConvSpec, cg: usize) -> Option<Direct> {
        if geo.sin.len() != 2 || cg < 16 {
            return None;
        }
        let (h, w) = (geo.sin[0], geo.sin[1]);
        let (kh, kw) = (geo.kd[0], geo.kd[1]);
        let (sh, sw) = (spec.stride[0], spec.stride[1]);
        let (dh, dw) = (spec.dilation[0], spec.dilation[1]);
        let (pt, pl) = (spec.pad_before[0], spec.pad_before[1]);
        let hp = h + pt + spec.pad_after[0];
        let wp = w + pl + spec.pad_after[1];
        let (hq, wq) = (hp.div_ceil(sh), wp.div_ceil(sw));
        let (oh, ow) = (geo.sout[0], geo.sout[1]);
        let col_reach = (kw - 1) * dw / sw;
        if col_reach > 64 || oh * wq == 0 {
            return None;
        }
        let mut phases = Vec::new();
        let mut taps = Vec::with_capacity(kh * kw);
        for ky in 0..kh {
            for kx in 0..kw {
                let ph = ((ky * dh) % sh, (kx * dw) % sw);
                let at = phases.iter().position(|&p| p == ph).unwrap_or_else(|| {
                    phases.push(ph);
                    phases.len() - 1
                });
                taps.push((at, (ky * dh) / sh * wq + (kx * dw) / sw));
            }
        }
        // The last chunk of 32 grid positions reads up to 31 past the grid's last position,
        // plus a tap's column reach.
        let plane = (hq * wq + 32 + col_reach + 1).next_multiple_of(16);
        Some(Direct {
            oh,
            ow,
            wq,
            cp: cg.next_multiple_of(KSTEP),
            plane,
            phases,
            taps,
            hq,
            h,
            w,
            sh,
            sw,
            pt,
            pl,
        })
    }

    /// Grid positions computed (`oh` rows of `wq`).
    fn grid(&self) -> usize {
        self.oh * self.wq
    }

    /// u16 elements of one image-group's phase planes.
    fn planes_len(&self) -> usize {
        self.phases.len() * self.cp / 2 * self.plane * 2
    }

    /// Phase plane `p` of channel pair `r` of `x` (the group's `cg` channels, each an `h × w`
    /// plane): `dst[qy·wq + qx] = (x[2r][iy][ix], x[2r+1][iy][ix])` at the padded input's
    /// `(qy·sh + py, qx·sw + px)`, zeros in the padding, past `cg` and in the slack.
    fn fill(&self, x: &[u16], cg: usize, p: usize, r: usize, dst: &mut [u32]) {
        let (py, px) = self.phases[p];
        let wq = self.wq;
        dst.fill(0);
        let plane = self.h * self.w;
        let ch = |c: usize| (c < cg).then(|| &x[c * plane..][..plane]);
        let (x0, x1) = (ch(2 * r), ch(2 * r + 1));
        if x0.is_none() {
            return;
        }
        for qy in 0..self.hq {
            let Some(iy) = (qy * self.sh + py).checked_sub(self.pt).filter(|&iy| iy < self.h) else {
                continue;
            };
            let row = &mut dst[qy * wq..][..wq];
            // Grid columns reading the input: ix = qx·sw + px − pl in 0..w.
            let first = self.pl.saturating_sub(px).div_ceil(self.sw);
            for (qx, d) in row.iter_mut().enumerate().skip(first) {
                let ix = qx * self.sw + px - self.pl;
                if ix >= self.w {
                    break;
                }
                let lo = x0.map_or(0, |c| c[iy * self.w + ix]) as u32;
                let hi = x1.map_or(0, |c| c[iy * self.w + ix]) as u32;
                *d = lo | hi << 16;
            }
        }
    }
}

/// A bf16 2-d convolution on AMX without a patch matrix: the input is laid out once per image
/// and group as planes of channel pairs on a grid of the output's rows and the padded input's
/// columns (per stride phase), so a B tile — 16 channel pairs × 16 consecutive grid positions —
/// is one strided tile load at the tap's offset; the weights are packed with K ordered (tap,
/// channel). The grid's junk columns (past the output's) are computed and dropped. Returns
/// `false` where it does not apply.
///
/// # Safety
/// `xp` holds the contiguous input `[n, g·cg, h, w]`, `wp` the weights `[g·og, cg, kh, kw]`,
/// `out` the output `[n, g·og, oh, ow]`; AMX is usable.
#[allow(clippy::too_many_arguments)]
unsafe fn direct_conv(
    geo: &crate::conv::Geo,
    spec: &crate::conv::ConvSpec,
    d: &crate::conv::Dims,
    xp: *const u16,
    wp: *const u16,
    out: *mut f32,
    threads: usize,
    cache: Option<&crate::contraction::WeightCache>,
) -> bool {
    let Some(dp) = Direct::new(geo, spec, d.cg) else {
        return false;
    };
    // Laying out weights that are not kept costs about what the patch matrix does for planes
    // smaller than the number of output channels (a deep stage's 7 × 7).
    if cache.is_none() && d.og > geo.sout.iter().product::<usize>() {
        return false;
    }
    let (cg, og, ks) = (d.cg, d.og, geo.ks);
    let (cp, pairs) = (dp.cp, dp.cp / 2);
    let kp = ks * cp;
    let mp = og.next_multiple_of(MB);
    let mblocks = mp / MB;
    // Weights [mp × kp] per group, K ordered (tap, channel); kept across runs for constant
    // weights (as pairs of bf16 in the cache's 32-bit words).
    let len = d.g * mp * kp;
    let wsend = SendPtr(wp as *mut u16);
    let make = || {
        let mut words = vec![0f32; len / 2];
        let packed: &mut [u16] = bytemuck::cast_slice_mut(&mut words);
        for grp in 0..d.g {
            for o in 0..og {
                let row = &mut packed[(grp * mp + o) * kp..][..kp];
                for ci in 0..cg {
                    // Safety: weights of output channel grp·og + o, input channel ci.
                    let src = unsafe {
                        std::slice::from_raw_parts((wsend.get() as *const u16).add(((grp * og + o) * cg + ci) * ks), ks)
                    };
                    for (t, &v) in src.iter().enumerate() {
                        row[t * cp + ci] = v;
                    }
                }
            }
        }
        words
    };
    let words = crate::contraction::prepared(cache, len / 2, make);
    let weights: &[u16] = bytemuck::cast_slice(&words);
    // Per K step: where its B tiles start in the phase planes (u16 elements).
    let ksteps = kp / KSTEP;
    let per_tap = cp / KSTEP;
    let boffs: Vec<usize> = (0..ksteps)
        .map(|s| {
            let (t, cb) = (s / per_tap, s % per_tap);
            let (p, off) = dp.taps[t];
            ((p * pairs + cb * 16) * dp.plane + off) * 2
        })
        .collect();
    let grid = dp.grid();
    let chunks = grid.div_ceil(2 * NB);
    let ys = dp.oh * dp.ow;
    let mut planes = Pooled::<u16>::take(dp.planes_len());
    let units_per = (chunks * mblocks).div_ceil(4 * threads.max(1)).max(1);
    for b in 0..d.n {
        for grp in 0..d.g {
            // Safety: image b's group `grp` planes.
            let x = unsafe { std::slice::from_raw_parts(xp.add((b * d.c + grp * cg) * dp.h * dp.w), cg * dp.h * dp.w) };
            {
                let words: &mut [u32] = bytemuck::cast_slice_mut(&mut planes[..]);
                let jobs = dp.phases.len() * pairs;
                let dst = SendPtr(words.as_mut_ptr());
                let plane = dp.plane;
                let dpr = &dp;
                par_units(
                    jobs,
                    if x.len() >= 1 << 15 { threads } else { 1 },
                    || (),
                    |_, j| {
                        let (p, r) = (j / pairs, j % pairs);
                        // Safety: jobs fill disjoint planes of `words`.
                        let plane_dst = unsafe { std::slice::from_raw_parts_mut(dst.get().add(j * plane), plane) };
                        dpr.fill(x, cg, p, r, plane_dst);
                    },
                );
            }
            let a = weights[grp * mp * kp..].as_ptr();
            let outg = out.wrapping_add((b * d.o + grp * og) * ys);
            let (ap, bp, op) = (
                SendPtr(a as *mut u16),
                SendPtr(planes.as_ptr() as *mut u16),
                SendPtr(outg),
            );
            let (dpr, boffs) = (&dp, &boffs);
            let units = (chunks * mblocks).div_ceil(units_per);
            par_units(
                units,
                threads,
                || (),
                |_, u| {
                    // Safety: AMX is usable (the caller's contract); units write disjoint
                    // (channel block, position chunk) parts of the output.
                    unsafe {
                        amx::direct_units(
                            ap.get(),
                            kp,
                            bp.get(),
                            dpr.plane * 4,
                            boffs,
                            op.get(),
                            og,
                            dpr,
                            mblocks,
                            u * units_per..((u + 1) * units_per).min(chunks * mblocks),
                        )
                    };
                },
            );
        }
    }
    true
}

/// A dense f32 copy of a strided bf16 view (the path of hosts without native bf16), in
/// per-thread scratch.
///
/// # Safety
/// Every element of the view is in bounds of `base`.
pub(crate) unsafe fn widened(base: *const u16, v: &crate::contraction::View) -> Pooled<f32> {
    let mut out = Pooled::<f32>::take(v.len());
    let mut keep = Vec::new();
    // Safety: the caller's contract; the run holds the view's elements.
    let bits = unsafe { std::slice::from_raw_parts(crate::conv::dense_run(base, v, &mut keep), v.len()) };
    crate::ewise::widen(crate::ewise::Half::Bf16, bits, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bits of `x` rounded to bf16.
    pub(super) fn bf16_bits(x: f32) -> u16 {
        half::bf16::from_f32(x).to_bits()
    }

    /// The f32 value of bf16 bits.
    pub(super) fn f32_of(b: u16) -> f32 {
        f32::from_bits((b as u32) << 16)
    }

    /// Instruction sets this host runs.
    fn isas() -> Vec<Isa> {
        let (amx, avx) = host();
        let mut v = Vec::new();
        if amx {
            v.push(Isa::Amx);
        }
        if avx {
            v.push(Isa::Avx512);
        }
        v
    }

    fn values(n: usize, seed: u64) -> Vec<u16> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                bf16_bits(((s >> 33) as f32 / (1u64 << 31) as f32) * 4.0 - 2.0)
            })
            .collect()
    }

    /// Convolutions on every path (AMX direct for 2-d convolutions of 16 or more channels per
    /// group, im2col + product otherwise, on both instruction sets) against the f64
    /// definition on the same bf16 values: strides, dilations, asymmetric padding, groups,
    /// channel counts off the block sizes, and planes narrower than a tile. Fewer than 32
    /// output channels per group are left to the widening path, untouched.
    #[test]
    fn convolutions_match_the_definition() {
        for isa in isas() {
            let (xv, wv) = (crate::conv::dense(&[2, 6, 14, 14]), crate::conv::dense(&[16, 6, 5, 5]));
            let spec = crate::conv::ConvSpec {
                stride: &[1, 1],
                pad_before: &[0, 0],
                pad_after: &[0, 0],
                dilation: &[1, 1],
                groups: 1,
            };
            let (x, w) = (values(2 * 6 * 196, 1), values(16 * 150, 2));
            let mut out = vec![f32::NAN; 2 * 16 * 100];
            // Safety: dense operands and output of the stated shapes.
            let done = unsafe {
                conv(
                    isa,
                    &xv,
                    x.as_ptr(),
                    &wv,
                    w.as_ptr(),
                    out.as_mut_ptr(),
                    &[2, 16, 10, 10],
                    &spec,
                    1,
                    None,
                )
            };
            assert_eq!(done, Ok(false), "LeNet's 16 output channels are left to widening");
            assert!(out.iter().all(|v| v.is_nan()), "nothing written");
        }
        use crate::contraction::View;
        use crate::conv::{ConvSpec, dense, testing::reference};
        // (x shape, w shape, stride, pad before, pad after, dilation, groups)
        type Case = (
            [usize; 4],
            [usize; 4],
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 2],
            usize,
        );
        let cases: [Case; 8] = [
            ([1, 64, 12, 12], [64, 64, 3, 3], [1, 1], [1, 1], [1, 1], [1, 1], 1),
            ([2, 20, 9, 7], [40, 20, 3, 3], [2, 2], [1, 1], [1, 1], [1, 1], 1),
            ([1, 32, 7, 7], [48, 32, 1, 1], [2, 2], [0, 0], [0, 0], [1, 1], 1),
            ([1, 3, 20, 20], [40, 3, 7, 7], [2, 2], [3, 3], [3, 3], [1, 1], 1),
            ([1, 48, 10, 11], [72, 24, 3, 3], [1, 1], [2, 0], [1, 2], [2, 1], 2),
            ([1, 40, 5, 5], [33, 40, 3, 3], [1, 1], [1, 1], [1, 1], [1, 1], 1),
            ([3, 16, 4, 4], [32, 16, 2, 2], [1, 2], [0, 1], [1, 0], [1, 1], 1),
            ([1, 64, 6, 40], [32, 64, 1, 1], [1, 1], [0, 0], [0, 0], [1, 1], 1),
        ];
        for (xs, ws, stride, pb, pa, dil, groups) in cases {
            let spec = ConvSpec {
                stride: &stride,
                pad_before: &pb,
                pad_after: &pa,
                dilation: &dil,
                groups,
            };
            let sout: [usize; 2] =
                std::array::from_fn(|i| (xs[2 + i] + pb[i] + pa[i] - dil[i] * (ws[2 + i] - 1) - 1) / stride[i] + 1);
            let x = values(xs.iter().product(), 3);
            let w = values(ws.iter().product(), 5);
            let f = |v: &[u16]| v.iter().map(|&b| f32_of(b) as f64).collect::<Vec<_>>();
            let want = reference(&f(&x), xs, &f(&w), ws, &spec, sout);
            let abs = |v: &[u16]| f(v).iter().map(|v| v.abs()).collect::<Vec<_>>();
            let size = reference(&abs(&x), xs, &abs(&w), ws, &spec, sout);
            let out_shape = [xs[0], ws[0], sout[0], sout[1]];
            let (xv, wv): (View, View) = (dense(&xs), dense(&ws));
            for isa in isas() {
                for (threads, kept) in [(1, false), (2, false), (1, true), (2, true)] {
                    // A cache (constant weights) lets the direct path take every plane size.
                    let slot = crate::contraction::WeightCache::new();
                    let cache = kept.then_some(&slot);
                    let mut out = vec![f32::NAN; want.len()];
                    // Safety: dense operands and output of the stated shapes.
                    let done = unsafe {
                        conv(
                            isa,
                            &xv,
                            x.as_ptr(),
                            &wv,
                            w.as_ptr(),
                            out.as_mut_ptr(),
                            &out_shape,
                            &spec,
                            threads,
                            cache,
                        )
                    }
                    .unwrap();
                    assert!(done, "{xs:?} {ws:?}: left to the widening path");
                    let kdim = ws[1] * ws[2] * ws[3];
                    for (i, ((&got, &want), &size)) in out.iter().zip(&want).zip(&size).enumerate() {
                        // f32 sums of `kdim` exact products, in any order.
                        let tol = kdim as f64 * 6e-8 * size + 1e-30;
                        assert!(
                            (got as f64 - want).abs() <= tol,
                            "{isa:?} t{threads} {xs:?} {ws:?} at {i}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Every instruction set against an f64 sum of the same bf16 products, over shapes with
    /// every kind of edge (rows, columns and K off the block sizes; strided operands).
    #[test]
    fn products_match_f64_sums() {
        eprintln!("bf16 instruction sets here: {:?}", isas());
        for isa in isas() {
            for &(m, n, k) in &[
                (1, 1, 1),
                (32, 32, 32),
                (33, 17, 40),
                (64, 96, 576),
                (7, 300, 147),
                (100, 49, 64),
                (16, 5, 1000),
                (1, 70, 96),
                (1, 1000, 512),
            ] {
                for transposed_b in [false, true] {
                    let a = values(m * k, 1 + m as u64);
                    let b = values(k * n, 7 + n as u64);
                    let bm = if transposed_b {
                        // b stored as n × k: element (p, j) at j·k + p.
                        let mut t = vec![0u16; k * n];
                        for p in 0..k {
                            for j in 0..n {
                                t[j * k + p] = b[p * n + j];
                            }
                        }
                        t
                    } else {
                        b.clone()
                    };
                    let (rs, cs) = if transposed_b { (1, k as isize) } else { (n as isize, 1) };
                    let ldc = n + 3;
                    let mut c = vec![f32::NAN; m * ldc];
                    for threads in [1, 2] {
                        // Safety: operands and result of the stated sizes.
                        unsafe {
                            gemm(
                                isa,
                                m,
                                n,
                                k,
                                c.as_mut_ptr(),
                                ldc,
                                Mat {
                                    ptr: a.as_ptr(),
                                    rs: k as isize,
                                    cs: 1,
                                },
                                Mat {
                                    ptr: bm.as_ptr(),
                                    rs,
                                    cs,
                                },
                                threads,
                            )
                        };
                        for i in 0..m {
                            for j in 0..n {
                                let prods = (0..k).map(|p| f32_of(a[i * k + p]) as f64 * f32_of(b[p * n + j]) as f64);
                                let want: f64 = prods.clone().sum();
                                let size: f64 = prods.map(f64::abs).sum();
                                let got = c[i * ldc + j] as f64;
                                // f32 accumulation of k exact products (bf16 × bf16 fits f32),
                                // in any order: k roundings of at most 2^-24 of the running sum.
                                let tol = k as f64 * 6e-8 * size + 1e-30;
                                assert!(
                                    (got - want).abs() <= tol,
                                    "{isa:?} {m}x{n}x{k} t{transposed_b} at ({i},{j}): {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
