//! `max_pool2d` plane by plane, on the plane's stride phases.
//!
//! The op's definition (`oar_ir`'s decomposition) pads the input with `-inf`, takes one
//! strided slice per kernel position and combines the slices by the pairwise tree of binary
//! `max` (slices in row-major kernel order, an odd last node passed up as is). Here each plane
//! is copied once into its stride phases (the polyphase decomposition of
//! [`crate::conv_direct`], `-inf` where the windows reach the padding, or past it in ceil
//! mode): phase `(r, s)` holds the padded elements whose row is `≡ r` and column `≡ s` modulo
//! the stride. There every kernel position's leaf, for a block of output rows, is one
//! contiguous run (output position `oy · pitch + ox`; the `pitch - ow` positions past each
//! row are computed and dropped), so each tree node is one long elementwise `max` (vectorized
//! at the host's width for f32). Same values, same NaN propagation, same order of comparisons
//! as the compiled definition. f32 3 × 3 windows at stride 2 (ResNet's) skip the copy:
//! [`plane_3x3s2`] reads the rows and splits their even and odd columns in registers.

use crate::par::par_units;
use crate::pool_grad::Geometry;
use crate::simd::{Lanes, Simd, instances};
use oar_ir::DType;
use oar_ir::ops::MaxPool2d;

/// Windows up to this many elements (16 × 16) run natively.
const MAX_WINDOW: usize = 256;

/// Whether the native kernel runs `max_pool2d` with attributes `m` on operands of these types:
/// one f32, f64 or f16/bf16 (widened to f32) input of rank 4, a non-empty window of at most [`MAX_WINDOW`] elements, a
/// stride.
pub fn max_pool2d_supported(m: &MaxPool2d, inputs: &[oar_ir::TensorType]) -> bool {
    let k = m.kernel[0] * m.kernel[1];
    inputs.len() == 1
        && matches!(inputs[0].dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
        && inputs[0].shape.rank() == 4
        && k > 0
        && k <= MAX_WINDOW
        && !m.stride.contains(&0)
}

/// The element types the kernel pools.
pub(crate) trait Lane: Copy + PartialOrd + Send + Sync + 'static {
    /// The padding: the dtype's lowest value, as the definition pads.
    const LOWEST: Self;
}
impl Lane for f32 {
    const LOWEST: f32 = f32::NEG_INFINITY;
}
impl Lane for f64 {
    const LOWEST: f64 = f64::NEG_INFINITY;
}

/// The IR's binary `max`: the larger side (the second on a tie), NaN if either side is NaN.
#[inline(always)]
#[allow(clippy::eq_op)]
fn max<T: Lane>(a: T, b: T) -> T {
    let m = if a > b { a } else { b };
    if a != a { a } else { m }
}

#[inline(always)]
fn max_into<T: Lane>(dst: &mut [T], a: &[T], b: &[T]) {
    for ((d, &a), &b) in dst.iter_mut().zip(a).zip(b) {
        *d = max(a, b);
    }
}

#[inline(always)]
fn max_assign<T: Lane>(dst: &mut [T], b: &[T]) {
    for (d, &b) in dst.iter_mut().zip(b) {
        *d = max(*d, b);
    }
}

/// Tree scratch elements per block of output rows at most (the nodes stay in L1).
const BLOCK_ELEMS: usize = 1 << 11;

impl Geometry {
    /// Rows and columns (the pitch) of each stride phase: the padded extent the windows read
    /// (`(o - 1) · stride + kernel`), divided by the stride.
    fn rows(&self) -> usize {
        ((self.oh - 1) * self.stride[0] + self.kernel[0]).div_ceil(self.stride[0])
    }

    fn pitch(&self) -> usize {
        ((self.ow - 1) * self.stride[1] + self.kernel[1]).div_ceil(self.stride[1])
    }

    /// Output rows per block: the tree's nodes for a block stay within [`BLOCK_ELEMS`].
    fn block(&self) -> usize {
        let k = self.kernel[0] * self.kernel[1];
        (BLOCK_ELEMS / (k.div_ceil(2) * self.pitch())).clamp(1, self.oh)
    }
}

impl Geometry {
    /// A unit's scratch: the stride phases of one plane and the tree's nodes for one block.
    fn scratch<T: Lane>(&self) -> (Vec<T>, Vec<T>) {
        let k = self.kernel[0] * self.kernel[1];
        (
            vec![T::LOWEST; self.stride[0] * self.stride[1] * self.rows() * self.pitch()],
            vec![T::LOWEST; k.div_ceil(2) * ((self.block() - 1) * self.pitch() + self.ow)],
        )
    }
}

/// The geometry of `max_pool2d` on `x[xs]` into `out[ys]`, checked (operand lengths
/// included); `None` when the output is empty.
fn checked(
    xs: &[usize],
    x_len: usize,
    ys: &[usize],
    out_len: usize,
    m: &MaxPool2d,
) -> Result<Option<Geometry>, String> {
    if xs.len() != 4 || ys.len() != 4 || xs[..2] != ys[..2] {
        return Err(format!(
            "max_pool2d: x {xs:?} and output {ys:?} need [N, C, H, W] and [N, C, OH, OW]"
        ));
    }
    let k = m.kernel[0] * m.kernel[1];
    if k == 0 || k > MAX_WINDOW || m.stride.contains(&0) {
        return Err(format!(
            "max_pool2d: no native kernel for kernel {:?}, stride {:?}",
            m.kernel, m.stride
        ));
    }
    let g = Geometry {
        planes: xs[0] * xs[1],
        h: xs[2],
        w: xs[3],
        oh: ys[2],
        ow: ys[3],
        kernel: m.kernel,
        stride: m.stride,
        top: m.padding[0],
        left: m.padding[1],
    };
    let (s_in, s_out) = (g.h * g.w, g.oh * g.ow);
    if x_len != g.planes * s_in || out_len != g.planes * s_out {
        return Err(format!(
            "max_pool2d: {x_len} / {out_len} elements for x {xs:?} and output {ys:?}"
        ));
    }
    Ok((s_out > 0).then_some(g))
}

/// Planes per unit (about 16K output-window elements each) and the threads worth using.
fn split(g: &Geometry, threads: usize) -> (usize, usize) {
    let (s_out, k) = (g.oh * g.ow, g.kernel[0] * g.kernel[1]);
    let per = (1usize << 14).div_ceil(s_out * k).max(1);
    let work = g.planes.saturating_mul(s_out).saturating_mul(k);
    (per, if work < 1 << 16 { 1 } else { threads })
}

/// `out = max_pool2d(x)` (shapes `[N, C, H, W]` → `[N, C, OH, OW]`), threads over planes.
pub(crate) fn max_pool2d_into<T: Lane>(
    (x, xs): (&[T], &[usize]),
    (out, ys): (&mut [T], &[usize]),
    m: &MaxPool2d,
    threads: usize,
) -> Result<(), String> {
    by_planes(
        (x, xs),
        (out, ys),
        m,
        threads,
        |g| g.scratch::<T>(),
        |g, x, dst, (phases, tmp)| any_plane(g, x, dst, phases, tmp),
    )
}

/// [`max_pool2d_into`] on f16/bf16 elements (their bits): each plane widened to f32 as its
/// unit takes it, pooled at f32 width, the maxima (half values) narrowed back exactly — no
/// f32 copy of the whole input or output.
pub(crate) fn max_pool2d_half_into(
    half: crate::ewise::Half,
    x: (&[u16], &[usize]),
    out: (&mut [u16], &[usize]),
    m: &MaxPool2d,
    threads: usize,
) -> Result<(), String> {
    let scratch = |g: &Geometry| {
        let (phases, tmp) = g.scratch::<f32>();
        (phases, tmp, vec![0f32; g.h * g.w], vec![0f32; g.oh * g.ow])
    };
    by_planes(x, out, m, threads, scratch, |g, x, dst, (phases, tmp, wide, pooled)| {
        crate::ewise::widen(half, x, wide);
        any_plane(g, wide, pooled, phases, tmp);
        crate::ewise::narrow(half, pooled, dst);
    })
}

/// Check the geometry, then `plane(g, x plane, out plane, scratch)` for every plane, threads
/// over blocks of planes, each with its own `scratch(g)`.
fn by_planes<E: Copy + Send + Sync, S>(
    (x, xs): (&[E], &[usize]),
    (out, ys): (&mut [E], &[usize]),
    m: &MaxPool2d,
    threads: usize,
    scratch: impl Fn(&Geometry) -> S + Sync,
    plane: impl Fn(&Geometry, &[E], &mut [E], &mut S) + Sync,
) -> Result<(), String> {
    let Some(g) = checked(xs, x.len(), ys, out.len(), m)? else {
        return Ok(());
    };
    let (s_in, s_out) = (g.h * g.w, g.oh * g.ow);
    let (per, threads) = split(&g, threads);
    let out_ptr = crate::contraction::SendPtr(out.as_mut_ptr());
    par_units(
        g.planes.div_ceil(per),
        threads,
        || scratch(&g),
        |s, u| {
            for p in u * per..((u + 1) * per).min(g.planes) {
                // Safety: plane `p` of the output, written by this unit only.
                let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(p * s_out), s_out) };
                plane(&g, &x[p * s_in..][..s_in], dst, s);
            }
        },
    );
    Ok(())
}

/// [`plane`] for f32, compiled for the host's vector instructions ([`instances`]).
#[inline(always)]
fn plane_body<const V: bool>(g: &Geometry, x: &[f32], out: &mut [f32], phases: &mut [f32], tmp: &mut [f32]) {
    plane(g, x, out, phases, tmp)
}

instances!(plane_body, plane_f32, plane_avx2, plane_avx512,
    (g: &Geometry, x: &[f32], out: &mut [f32], phases: &mut [f32], tmp: &mut [f32]) -> ());

/// [`plane`], at the host's full vector width for f32 (3 × 3 windows at stride 2, ResNet's,
/// straight from the input rows: [`plane_3x3s2`]).
fn any_plane<T: Lane>(g: &Geometry, x: &[T], out: &mut [T], phases: &mut [T], tmp: &mut [T]) {
    if std::any::TypeId::of::<T>() != std::any::TypeId::of::<f32>() {
        return plane(g, x, out, phases, tmp);
    }
    // Safety: `T` is f32: the same slices, typed as they are.
    unsafe {
        let f = |s: &mut [T]| std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut f32, s.len());
        let x = std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len());
        if g.kernel == [3, 3] && g.stride == [2, 2] {
            match Simd::detect() {
                Simd::Avx512 => return plane_3x3s2_avx512(g, x, f(out)),
                Simd::Avx2Fma => return plane_3x3s2_avx2(g, x, f(out)),
                Simd::Baseline => {}
            }
        }
        plane_f32(g, x, f(out), f(phases), f(tmp))
    }
}

/// One plane of a 3 × 3, stride-2 max pool read straight from the input rows (no phase
/// copy): per output vector and window row, the two vectors of input columns under it split
/// into their even and odd columns (the window's first and second column) and the even ones
/// from two columns on (its third); columns and rows outside the input are `-inf`, as the
/// definition pads. The nine leaves combine by the tree of [`plane`]'s general loop — the four
/// pairs, the pairs of pairs, their pair, then the odd ninth leaf — with the IR's `max`, so
/// the values and NaN bits are its.
///
/// # Safety
/// Called with `L`'s instruction set; `x` and `out` are one plane of `g`.
#[inline(always)]
unsafe fn plane_3x3s2<L: Lanes>(g: &Geometry, x: &[f32], out: &mut [f32]) {
    let (h, w, n) = (g.h as isize, g.w as isize, L::N as isize);
    assert!(x.len() >= g.h * g.w && out.len() >= g.oh * g.ow);
    // Safety: every load is masked to the lanes inside its row; every store to the row's
    // outputs (the asserts above).
    unsafe {
        let lowest = L::splat_value(f32::NEG_INFINITY);
        for oy in 0..g.oh {
            let rows: [Option<*const f32>; 3] = std::array::from_fn(|r| {
                let iy = (2 * oy + r) as isize - g.top as isize;
                (0..h).contains(&iy).then(|| x.as_ptr().add(iy as usize * g.w))
            });
            for ox in (0..g.ow).step_by(L::N) {
                let c = 2 * ox as isize - g.left as isize;
                let mut leaves = [lowest; 9];
                for (r, row) in rows.iter().enumerate() {
                    if let Some(row) = *row {
                        let ((even, odd), (third, _)) = if c >= 0 && c + 2 + 2 * n <= w {
                            // Inside the row: plain loads.
                            let at = row.add(c as usize);
                            (
                                L::deinterleave(L::load(at), L::load(at.add(L::N))),
                                L::deinterleave(L::load(at.add(2)), L::load(at.add(2 + L::N))),
                            )
                        } else {
                            (
                                L::deinterleave(columns(row, c, w, lowest), columns(row, c + n, w, lowest)),
                                L::deinterleave(columns(row, c + 2, w, lowest), columns(row, c + 2 + n, w, lowest)),
                            )
                        };
                        leaves[3 * r] = even;
                        leaves[3 * r + 1] = odd;
                        leaves[3 * r + 2] = third;
                    }
                }
                let m = max_tree9(leaves);
                L::store_first(out.as_mut_ptr().add(oy * g.ow + ox), L::N.min(g.ow - ox), m);
            }
        }
    }
}

/// The maximum of a 3 × 3 window's nine leaves (row-major) by [`plane`]'s tree of the IR's
/// `max` — the four pairs, the pairs of pairs, their pair, then the odd ninth leaf — so the
/// values and NaN bits are the definition's.
///
/// # Safety
/// Called with `L`'s instruction set.
#[inline(always)]
pub(crate) unsafe fn max_tree9<L: Lanes>(l: [L; 9]) -> L {
    // Safety: the caller's contract.
    unsafe {
        let (n0, n1) = (L::max_ir(l[0], l[1]), L::max_ir(l[2], l[3]));
        let (n2, n3) = (L::max_ir(l[4], l[5]), L::max_ir(l[6], l[7]));
        L::max_ir(L::max_ir(L::max_ir(n0, n1), L::max_ir(n2, n3)), l[8])
    }
}

/// Input columns `c..c + N` of a row of `w`, `-inf` (`lowest`) outside it.
///
/// # Safety
/// As [`plane_3x3s2`]; `row` is an input row.
#[inline(always)]
unsafe fn columns<L: Lanes>(row: *const f32, c: isize, w: isize, lowest: L) -> L {
    let n = L::N as isize;
    let (lo, hi) = ((-c).clamp(0, n) as usize, (w - c).clamp(0, n) as usize);
    // Safety: only the lanes inside the row are read.
    unsafe { L::load_lanes(row.wrapping_offset(c), lo, hi.max(lo), lowest) }
}

/// [`plane_3x3s2`] for one instruction set.
macro_rules! pool_instance {
    ($name:ident, $feat:literal, $lanes:ty) => {
        /// # Safety
        /// The host has the instruction set.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name(g: &Geometry, x: &[f32], out: &mut [f32]) {
            // Safety: the caller's contract.
            unsafe { plane_3x3s2::<$lanes>(g, x, out) }
        }

        /// Off x86-64 [`Simd::detect`] is `Baseline`.
        #[cfg(not(target_arch = "x86_64"))]
        unsafe fn $name(_: &Geometry, _: &[f32], _: &mut [f32]) {
            unreachable!("no vector instances off x86-64")
        }
    };
}

pool_instance!(plane_3x3s2_avx512, "avx512f,avx2,fma", crate::simd::x86::Zmm);
pool_instance!(plane_3x3s2_avx2, "avx2,fma", crate::simd::x86::Ymm);

/// One plane: its phases, then the tree block of output rows by block.
#[inline(always)]
fn plane<T: Lane>(g: &Geometry, x: &[T], out: &mut [T], phases: &mut [T], tmp: &mut [T]) {
    let [kh, kw] = g.kernel;
    let [sh, sw] = g.stride;
    let (rows, pitch, ow) = (g.rows(), g.pitch(), g.ow);
    let k = kh * kw;
    // Phase (r, s), element (i, j): padded row i·sh + r, column j·sw + s.
    let split = crate::conv_direct::Phases {
        h: g.h,
        w: g.w,
        top: g.top,
        left: g.left,
        sh,
        sw,
        rows,
        pitch,
    };
    split.split(x, T::LOWEST, phases, |_| false);
    let block = g.block();
    for oy0 in (0..g.oh).step_by(block) {
        let nr = block.min(g.oh - oy0);
        // Output (oy0 + a, ox) at a · pitch + ox of the block's runs.
        let len = (nr - 1) * pitch + ow;
        let leaf = |l: usize| {
            let (di, dj) = (l / kw, l % kw);
            let at = ((di % sh) * sw + dj % sw) * rows * pitch + (oy0 + di / sh) * pitch + dj / sw;
            &phases[at..][..len]
        };
        let rows_out = &mut out[oy0 * ow..][..nr * ow];
        if k == 1 {
            let run = leaf(0);
            for (a, o) in rows_out.chunks_exact_mut(ow).enumerate() {
                o.copy_from_slice(&run[a * pitch..][..ow]);
            }
            continue;
        }
        // The tree's first level from the leaves, the others in place in `tmp` (node j of a
        // level from nodes 2j and 2j + 1 of the one below).
        for j in 0..k / 2 {
            max_into(&mut tmp[j * len..][..len], leaf(2 * j), leaf(2 * j + 1));
        }
        if k % 2 == 1 {
            tmp[k / 2 * len..][..len].copy_from_slice(leaf(k - 1));
        }
        let mut n = k.div_ceil(2);
        while n > 1 {
            {
                let (first, rest) = tmp.split_at_mut(len);
                max_assign(first, &rest[..len]);
            }
            for j in 1..n / 2 {
                let (lo, hi) = tmp.split_at_mut(2 * j * len);
                let (a, b) = hi.split_at(len);
                max_into(&mut lo[j * len..][..len], a, &b[..len]);
            }
            if n % 2 == 1 {
                tmp.copy_within((n - 1) * len..n * len, n / 2 * len);
            }
            n = n.div_ceil(2);
        }
        for (a, o) in rows_out.chunks_exact_mut(ow).enumerate() {
            o.copy_from_slice(&tmp[a * pitch..][..ow]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::TensorData;
    use oar_ir::eval::{Site, Value, eval_one};

    /// The kernel's value and the definition's (the reference evaluator), f64, and the output
    /// shape; `None` where the definition refuses the geometry (no window fits).
    fn both(x: &[f64], xs: [usize; 4], m: &MaxPool2d) -> Option<(Vec<f64>, Vec<f64>, Vec<usize>)> {
        let xt = Value::from_tensor(&TensorData::from_vec(xs.to_vec(), x.to_vec()).unwrap()).unwrap();
        let site = Site {
            op: "max_pool2d".into(),
            value: "%0".into(),
        };
        let want = eval_one(&site, m, &[&xt]).ok()?.to_tensor().unwrap();
        let ys = want.shape().to_vec();
        let mut got = vec![0.0; ys.iter().product()];
        max_pool2d_into((x, &xs), (&mut got, &ys), m, 2).unwrap();
        Some((got, want.to_f64_vec(), ys))
    }

    fn pool(kernel: [usize; 2], stride: [usize; 2], padding: [usize; 4], ceil_mode: bool) -> MaxPool2d {
        MaxPool2d {
            kernel,
            stride,
            padding,
            ceil_mode,
        }
    }

    #[test]
    fn hand_computed_windows() {
        // 1×1×3×4, 2×2 windows, stride 2, padding 1 on every side: 2×3 outputs.
        //  1  2  3  4
        //  5  6  7  8
        //  9 10 11 12
        let x: Vec<f64> = (1..=12).map(f64::from).collect();
        let (got, want, ys) = both(&x, [1, 1, 3, 4], &pool([2, 2], [2, 2], [1, 1, 1, 1], false)).unwrap();
        assert_eq!(ys, [1, 1, 2, 3]);
        assert_eq!(got, [1.0, 3.0, 4.0, 9.0, 11.0, 12.0]);
        assert_eq!(got, want);
    }

    #[test]
    fn every_geometry_matches_the_definition() {
        // Kernels, strides, asymmetric padding, ceil mode (windows hanging past the padding),
        // planes narrower than the window's reach; values with ties and negative numbers.
        let cases = [
            ([3, 3], [2, 2], [1, 1, 1, 1], false),
            ([3, 3], [2, 2], [1, 1, 1, 1], true),
            ([2, 2], [2, 2], [0, 0, 0, 0], false),
            ([2, 2], [2, 2], [0, 0, 0, 0], true),
            ([3, 2], [1, 3], [1, 0, 0, 1], true),
            ([1, 1], [2, 1], [0, 0, 0, 0], false),
            ([5, 4], [3, 2], [2, 1, 2, 2], true),
            ([1, 7], [1, 1], [0, 3, 0, 3], false),
        ];
        let mut compared = 0;
        for (xs, seed) in [([2, 3, 7, 9], 1u64), ([1, 2, 5, 4], 2), ([1, 1, 11, 6], 3)] {
            let n: usize = xs.iter().product();
            let mut s = seed;
            let x: Vec<f64> = (0..n)
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((s >> 33) % 9) as f64 - 4.0
                })
                .collect();
            for &(k, st, p, c) in &cases {
                let m = pool(k, st, p, c);
                let Some((got, want, _)) = both(&x, xs, &m) else {
                    continue;
                };
                assert_eq!(got, want, "{xs:?} {m:?}");
                compared += 1;
            }
        }
        // 24 pairs; the definition refuses only windows no plane position fits.
        assert!(compared >= 20, "{compared} geometries compared");
    }

    #[test]
    fn nan_propagates_and_f32_matches() {
        let mut x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        x[5] = f32::NAN;
        let m = pool([2, 2], [2, 2], [0; 4], false);
        let mut out = vec![0f32; 4];
        max_pool2d_into((&x, &[1, 1, 4, 4]), (&mut out, &[1, 1, 2, 2]), &m, 1).unwrap();
        assert!(out[0].is_nan());
        assert_eq!(out[1..], [7.0, 13.0, 15.0]);
    }

    /// The 3 × 3 stride-2 kernel read straight from the rows gives the general tree's bits —
    /// NaNs of several payloads, ±0 ties, ±∞, repeated values — on planes 1 to 40 wide
    /// (vector tails, rows shorter than a vector) and 70 wide (vectors inside the row), 1 to
    /// 9 high, paddings 0 to 2 before and 0 to 1 after, and outputs one row or column past
    /// (ceil mode), on both vector instances the host has.
    #[test]
    fn direct_3x3_stride_2_is_the_tree_bit_for_bit() {
        let specials = [
            f32::from_bits(0x7fc0_0001),
            f32::from_bits(0xffc1_2345),
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        let mut compared = 0;
        for (h, w) in [
            (1, 1),
            (2, 3),
            (3, 7),
            (5, 15),
            (8, 16),
            (9, 17),
            (4, 31),
            (3, 33),
            (6, 40),
            (7, 2),
            (5, 70),
        ] {
            for (top, left, bottom, right, extra) in
                [(0, 0, 0, 0, 0), (1, 1, 1, 1, 0), (2, 1, 0, 1, 0), (1, 2, 1, 0, 1)]
            {
                if h + top + bottom < 3 || w + left + right < 3 {
                    continue;
                }
                let g = Geometry {
                    planes: 1,
                    h,
                    w,
                    oh: (h + top + bottom - 3) / 2 + 1 + extra,
                    ow: (w + left + right - 3) / 2 + 1 + extra,
                    kernel: [3, 3],
                    stride: [2, 2],
                    top,
                    left,
                };
                let x: Vec<f32> = (0..h * w)
                    .map(|_| match next() % 10 {
                        0 | 1 => specials[next() % specials.len()],
                        _ => (next() % 5) as f32 - 2.0,
                    })
                    .collect();
                let (mut phases, mut tmp) = g.scratch::<f32>();
                let mut want = vec![0f32; g.oh * g.ow];
                plane(&g, &x, &mut want, &mut phases, &mut tmp);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let mut check = |name: &str, run: &dyn Fn(&mut [f32])| {
                    let mut got = vec![1f32; g.oh * g.ow];
                    run(&mut got);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{name} {h}x{w} pads {top} {left} {bottom} {right} +{extra}"
                    );
                    compared += 1;
                };
                #[cfg(target_arch = "x86_64")]
                {
                    let simd = Simd::detect();
                    if simd != Simd::Baseline {
                        // Safety: the host has AVX2 and FMA.
                        check("avx2", &|o| unsafe { plane_3x3s2_avx2(&g, &x, o) });
                    }
                    if simd == Simd::Avx512 {
                        // Safety: the host has AVX-512F.
                        check("avx512", &|o| unsafe { plane_3x3s2_avx512(&g, &x, o) });
                    }
                }
                let _ = &mut check;
            }
        }
        if Simd::detect() != Simd::Baseline {
            assert!(compared >= 30, "{compared} planes compared");
        }
    }

    #[test]
    fn malformed_shapes_are_errors() {
        let m = pool([2, 2], [2, 2], [0; 4], false);
        let x = [0f64; 16];
        let mut out = [0f64; 4];
        let e = max_pool2d_into((&x, &[1, 1, 4, 4]), (&mut out, &[1, 2, 2, 2]), &m, 1).unwrap_err();
        assert!(e.contains("max_pool2d"), "{e}");
        let e = max_pool2d_into((&x[..8], &[1, 1, 4, 4]), (&mut out, &[1, 1, 2, 2]), &m, 1).unwrap_err();
        assert!(e.contains("elements"), "{e}");
    }

    /// The half kernel gives exactly the f32 kernel's maxima on the widened input, rounded back
    /// (they are input values, so the rounding is exact): f16 and bf16, padding, strides,
    /// ceil-mode-like edges, NaNs and infinities, over one and two threads.
    #[test]
    fn half_planes_pool_like_the_widened_input() {
        use crate::ewise::{Half, narrow, widen};
        let m = pool([3, 3], [2, 2], [1, 1, 1, 1], false);
        let (xs, ys) = ([2usize, 3, 9, 8], [2usize, 3, 5, 4]);
        let n: usize = xs.iter().product();
        let mut vals: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173).collect();
        vals[5] = f32::NAN;
        vals[80] = f32::INFINITY;
        vals[81] = f32::NEG_INFINITY;
        for half in [Half::F16, Half::Bf16] {
            let mut bits = vec![0u16; n];
            narrow(half, &vals, &mut bits);
            let mut wide = vec![0f32; n];
            widen(half, &bits, &mut wide);
            let mut want_f = vec![0f32; ys.iter().product()];
            max_pool2d_into((&wide, &xs), (&mut want_f, &ys), &m, 1).unwrap();
            let mut want = vec![0u16; want_f.len()];
            narrow(half, &want_f, &mut want);
            for threads in [1, 2] {
                let mut got = vec![0u16; want.len()];
                max_pool2d_half_into(half, (&bits, &xs), (&mut got, &ys), &m, threads).unwrap();
                assert_eq!(got, want, "{half:?} t{threads}");
            }
        }
    }
}
