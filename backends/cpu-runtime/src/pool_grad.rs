//! The gradient of `max_pool2d` for eager autograd, in one pass over the planes.
//!
//! `max_pool2d` is defined (`oar_ir`'s decomposition) as the pairwise tree of binary `max` over
//! the window's slices of the `-inf`-padded input, slices in row-major kernel order; `max`'s
//! gradient goes to the larger side and is split evenly on a tie (none through a NaN). The IR's
//! gradient of that definition runs one strided slice, comparison and `where` per kernel
//! position; here each window replays the same tree on its own values, so eager gradients
//! equal what the compiled graph computes — including ties, which are common after a ReLU
//! (PyTorch instead gives a tied window's gradient to its first maximum).

use crate::par::par_units;
use crate::simd::Simd;
use oar_ir::{DType, TensorData};

/// Windows up to this many elements (16 × 16) run natively.
const MAX_WINDOW: usize = 256;

/// `dx` of `y = max_pool2d(x)` (kernel `[kh, kw]`, stride, padding `[top, left, bottom,
/// right]`) for the cotangent `dy` (whose shape gives the output size, so ceil mode needs no
/// flag). `Ok(None)`: no native path (dtypes other than f32/f64, windows above
/// [`MAX_WINDOW`] elements).
pub fn max_pool2d_vjp(
    x: &TensorData,
    dy: &TensorData,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
    threads: usize,
) -> Result<Option<TensorData>, String> {
    if x.dtype() != dy.dtype() {
        return Err(format!(
            "max_pool2d gradient: x {:?} ({}) and cotangent {:?} ({}) need one dtype",
            x.shape(),
            x.dtype(),
            dy.shape(),
            dy.dtype()
        ));
    }
    let Some(g) = Geometry::of(x.shape(), dy.shape(), kernel, stride, padding)? else {
        return Ok(None);
    };
    fn typed<T: Float>(x: &TensorData, dy: &TensorData, g: &Geometry, threads: usize) -> Result<TensorData, String> {
        let (xv, dyv) = (slice::<T>(x)?, slice::<T>(dy)?);
        let mut dx = crate::contraction::written_zeros(xv.len(), T::from_f64(0.0));
        run(g, xv, dyv, &mut dx, threads);
        TensorData::from_vec(x.shape().to_vec(), dx).map_err(|e| e.to_string())
    }
    Ok(Some(match x.dtype() {
        DType::F32 => typed::<f32>(x, dy, &g, threads)?,
        DType::F64 => typed::<f64>(x, dy, &g, threads)?,
        _ => return Ok(None),
    }))
}

/// Whether the native kernel runs `max_pool2d_grad(x, dy)` with attributes `m` on operands
/// of these types: f32, f64 or f16/bf16 (computed in f32; both alike), windows up to [`MAX_WINDOW`] elements.
pub fn max_pool2d_grad_supported(m: &oar_ir::ops::MaxPool2dGrad, inputs: &[oar_ir::TensorType]) -> bool {
    inputs.len() == 2
        && inputs[0].dtype == inputs[1].dtype
        && matches!(inputs[0].dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
        && window_fits(m.kernel, m.stride)
}

/// Windows the native kernels take: non-empty, at most [`MAX_WINDOW`] elements, a stride.
fn window_fits(kernel: [usize; 2], stride: [usize; 2]) -> bool {
    let k = kernel[0] * kernel[1];
    k > 0 && k <= MAX_WINDOW && !stride.contains(&0)
}

/// [`max_pool2d_vjp`] into `dx` (x's shape, overwritten) for f32 or f64 operands `x` (shape
/// `xs`) and `dy` (shape `ys`), [`max_pool2d_grad_supported`] checked first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn max_pool2d_vjp_into<T: Float>(
    (x, xs): (&[T], &[usize]),
    (dy, ys): (&[T], &[usize]),
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
    dx: &mut [T],
    threads: usize,
) -> Result<(), String> {
    let Some(g) = Geometry::of(xs, ys, kernel, stride, padding)? else {
        return Err(format!(
            "max_pool2d gradient: no native kernel for kernel {kernel:?}, stride {stride:?}"
        ));
    };
    if x.len() != g.planes * g.h * g.w || dy.len() != g.planes * g.oh * g.ow || dx.len() != x.len() {
        return Err(format!(
            "max_pool2d gradient: {} / {} / {} elements for x {xs:?} and cotangent {ys:?}",
            x.len(),
            dy.len(),
            dx.len()
        ));
    }
    dx.fill(T::from_f64(0.0));
    run(&g, x, dy, dx, threads);
    Ok(())
}

/// [`max_pool2d_vjp_into`] on f16/bf16 elements (their bits): blocks of planes widened to f32
/// as a unit takes them, the f32 kernel on the block (f32 sums), `dx` rounded once — as the
/// whole-tensor widening did, without f32 copies of whole tensors.
#[allow(clippy::too_many_arguments)]
pub(crate) fn max_pool2d_vjp_half_into(
    half: crate::ewise::Half,
    (x, xs): (&[u16], &[usize]),
    (dy, ys): (&[u16], &[usize]),
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
    dx: &mut [u16],
    threads: usize,
) -> Result<(), String> {
    use crate::ewise::{narrow, widen};
    let Some(g) = Geometry::of(xs, ys, kernel, stride, padding)? else {
        return Err(format!(
            "max_pool2d gradient: no native kernel for kernel {kernel:?}, stride {stride:?}"
        ));
    };
    let (s_in, s_out) = (g.h * g.w, g.oh * g.ow);
    if x.len() != g.planes * s_in || dy.len() != g.planes * s_out || dx.len() != x.len() {
        return Err(format!(
            "max_pool2d gradient: {} / {} / {} elements for x {xs:?} and cotangent {ys:?}",
            x.len(),
            dy.len(),
            dx.len()
        ));
    }
    // Planes per unit: about 32K input elements.
    let per = (1usize << 15).div_ceil(s_in.max(1)).clamp(1, g.planes.max(1));
    let units = g.planes.div_ceil(per);
    let dx_ptr = crate::contraction::SendPtr(dx.as_mut_ptr());
    let scratch = || (vec![0f32; per * s_in], vec![0f32; per * s_out], vec![0f32; per * s_in]);
    crate::par::par_units(units, threads, scratch, |(xw, dyw, dxw), u| {
        let (p0, p1) = (u * per, ((u + 1) * per).min(g.planes));
        let n = p1 - p0;
        let (xw, dyw, dxw) = (&mut xw[..n * s_in], &mut dyw[..n * s_out], &mut dxw[..n * s_in]);
        widen(half, &x[p0 * s_in..p1 * s_in], xw);
        widen(half, &dy[p0 * s_out..p1 * s_out], dyw);
        dxw.fill(0.0);
        let block = Geometry { planes: n, ..g };
        run(&block, xw, dyw, dxw, 1);
        // Safety: planes p0..p1 of `dx`, written by this unit only.
        let out = unsafe { std::slice::from_raw_parts_mut(dx_ptr.get().add(p0 * s_in), n * s_in) };
        narrow(half, dxw, out);
    });
    Ok(())
}

/// `dx` (zeroed) += the gradient, on the kernel for the geometry and dtype.
fn run<T: Float>(g: &Geometry, x: &[T], dy: &[T], dx: &mut [T], threads: usize) {
    let f32s = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
    let (xf, dyf, dxf) = (bytemuck::cast_slice, bytemuck::cast_slice, bytemuck::cast_slice_mut);
    if f32s && g.tiles_2x2() {
        tiled_2x2(xf(x), dyf(dy), dxf(dx), g, threads);
    } else if f32s && g.kernel == [3, 3] && g.stride == [2, 2] {
        typed(xf(x), dyf(dy), dxf(dx), g, threads, plane_3x3s2);
    } else {
        typed(x, dy, dx, g, threads, plane::<T>);
    }
}

/// One 2-d pooling's planes, window and padding before (the forward kernel, `crate::pool`,
/// shares it).
pub(crate) struct Geometry {
    pub(crate) planes: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) kernel: [usize; 2],
    pub(crate) stride: [usize; 2],
    pub(crate) top: usize,
    pub(crate) left: usize,
}

impl Geometry {
    /// The geometry of x `[N, C, H, W]` pooled to `[N, C, OH, OW]`; `None` where no native
    /// kernel serves (windows above [`MAX_WINDOW`] elements).
    fn of(
        xs: &[usize],
        ys: &[usize],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 4],
    ) -> Result<Option<Geometry>, String> {
        if xs.len() != 4 || ys.len() != 4 || xs[..2] != ys[..2] {
            return Err(format!(
                "max_pool2d gradient: x {xs:?} and cotangent {ys:?} need [N, C, H, W] and [N, C, OH, OW]"
            ));
        }
        if !window_fits(kernel, stride) {
            return Ok(None);
        }
        Ok(Some(Geometry {
            planes: xs[0] * xs[1],
            h: xs[2],
            w: xs[3],
            oh: ys[2],
            ow: ys[3],
            kernel,
            stride,
            top: padding[0],
            left: padding[1],
        }))
    }

    /// 2 × 2 windows, stride 2, no padding, every window inside the input: each input
    /// element is in at most one window.
    fn tiles_2x2(&self) -> bool {
        self.kernel == [2, 2]
            && self.stride == [2, 2]
            && self.top == 0
            && self.left == 0
            && 2 * self.oh <= self.h
            && 2 * self.ow <= self.w
    }
}

/// f32 2 × 2 / stride 2 pooling ([`Geometry::tiles_2x2`]), the shape of most CNNs' pools:
/// every window's tree written out branch-free in f32 and vectorized. Equal to [`plane`]'s
/// result bit for bit: the comparisons are exact in either width, a share is a product of
/// halves (exact), `g · share` is rounded once as there, and `+ 0.0` turns a -0 into the +0
/// that adding to a zeroed gradient gives.
fn tiled_2x2(xv: &[f32], dyv: &[f32], dx: &mut [f32], g: &Geometry, threads: usize) {
    let planes = g.planes;
    let (s_in, s_out) = (g.h * g.w, g.oh * g.ow);
    let per = (1usize << 14).div_ceil(s_in.max(1)).max(1);
    let units = planes.div_ceil(per);
    let threads = if planes * s_in < 1 << 16 { 1 } else { threads };
    let dx_ptr = crate::contraction::SendPtr(dx.as_mut_ptr());
    let rows = pick_rows_2x2();
    par_units(
        units,
        threads,
        || (),
        |_, u| {
            for p in u * per..((u + 1) * per).min(planes) {
                let (xp, gp) = (&xv[p * s_in..][..s_in], &dyv[p * s_out..][..s_out]);
                // Safety: plane `p` of dx, written by this unit only.
                let dp = unsafe { std::slice::from_raw_parts_mut(dx_ptr.get().add(p * s_in), s_in) };
                for i in 0..g.oh {
                    let (x0, x1) = xp[2 * i * g.w..][..2 * g.w].split_at(g.w);
                    let (d0, d1) = dp[2 * i * g.w..][..2 * g.w].split_at_mut(g.w);
                    rows(
                        &x0[..2 * g.ow],
                        &x1[..2 * g.ow],
                        &gp[i * g.ow..][..g.ow],
                        &mut d0[..2 * g.ow],
                        &mut d1[..2 * g.ow],
                    );
                }
            }
        },
    );
}

type Rows2x2 = fn(&[f32], &[f32], &[f32], &mut [f32], &mut [f32]);

/// One row of 2 × 2 windows: input rows `x0`, `x1` (2 · ow elements), cotangents `gy` (ow),
/// gradient rows `d0`, `d1`.
#[inline(always)]
fn rows_2x2_body(x0: &[f32], x1: &[f32], gy: &[f32], d0: &mut [f32], d1: &mut [f32]) {
    // `max`'s rule at one node: the larger side takes it, a tie halves, a NaN gives nothing.
    #[inline(always)]
    fn split(p: f32, q: f32) -> (f32, f32) {
        let tie = if p == q { 0.5 } else { 0.0 };
        (if p > q { 1.0 } else { tie }, if q > p { 1.0 } else { tie })
    }
    let n = gy.len();
    let (x0, x1, d0, d1) = (&x0[..2 * n], &x1[..2 * n], &mut d0[..2 * n], &mut d1[..2 * n]);
    for j in 0..n {
        let (a, b, c, d) = (x0[2 * j], x0[2 * j + 1], x1[2 * j], x1[2 * j + 1]);
        // A NaN anywhere makes the root NaN: no share anywhere.
        let nan = a.is_nan() | b.is_nan() | c.is_nan() | d.is_nan();
        let g = if nan { 0.0 } else { gy[j] };
        let (s1, s2) = split(if a > b { a } else { b }, if c > d { c } else { d });
        let (sa, sb) = split(a, b);
        let (sc, sd) = split(c, d);
        d0[2 * j] = g * (s1 * sa) + 0.0;
        d0[2 * j + 1] = g * (s1 * sb) + 0.0;
        d1[2 * j] = g * (s2 * sc) + 0.0;
        d1[2 * j + 1] = g * (s2 * sd) + 0.0;
    }
}

fn pick_rows_2x2() -> Rows2x2 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn avx512(x0: &[f32], x1: &[f32], gy: &[f32], d0: &mut [f32], d1: &mut [f32]) {
            rows_2x2_body(x0, x1, gy, d0, d1)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(x0: &[f32], x1: &[f32], gy: &[f32], d0: &mut [f32], d1: &mut [f32]) {
            rows_2x2_body(x0, x1, gy, d0, d1)
        }
        match Simd::detect() {
            // Safety: the features were detected.
            Simd::Avx512 => return |x0, x1, gy, d0, d1| unsafe { avx512(x0, x1, gy, d0, d1) },
            // Safety: as above.
            Simd::Avx2Fma => return |x0, x1, gy, d0, d1| unsafe { avx2(x0, x1, gy, d0, d1) },
            Simd::Baseline => {}
        }
    }
    rows_2x2_body
}

/// A tensor's elements as `T` (its dtype checked by the caller).
fn slice<T: bytemuck::Pod>(t: &TensorData) -> Result<&[T], String> {
    if t.bytes().is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(t.bytes()).map_err(|e| format!("max_pool2d gradient: unaligned operand: {e}"))
}

/// f32 and f64 (values compared and shares added in f64; `Element` converts).
pub(crate) trait Float: bytemuck::Pod + oar_ir::Element + Into<f64> + 'static {}
impl Float for f32 {}
impl Float for f64 {}

/// Any window up to [`MAX_WINDOW`], f32 or f64: `plane` ([`plane`], or [`plane_3x3s2`] for f32) on
/// every plane, blocks of planes split across threads.
fn typed<T: Float>(
    xv: &[T],
    dyv: &[T],
    dx: &mut [T],
    g: &Geometry,
    threads: usize,
    plane: fn(&Geometry, &[T], &[T], &mut [T], &mut Tree),
) {
    let planes = g.planes;
    let (s_in, s_out) = (g.h * g.w, g.oh * g.ow);
    let k = g.kernel[0] * g.kernel[1];
    // Planes per unit: about 16K input elements each.
    let per = (1usize << 14).div_ceil(s_in.max(1)).max(1);
    let units = planes.div_ceil(per);
    let work = planes.saturating_mul(s_out).saturating_mul(k);
    let threads = if work < 1 << 15 { 1 } else { threads };
    let dx_ptr = crate::contraction::SendPtr(dx.as_mut_ptr());
    par_units(
        units,
        threads,
        || Tree::new(k),
        |tree, u| {
            for p in u * per..((u + 1) * per).min(planes) {
                let xp = &xv[p * s_in..][..s_in];
                let gp = &dyv[p * s_out..][..s_out];
                // Safety: plane `p` of dx, written by this unit only.
                let dp = unsafe { std::slice::from_raw_parts_mut(dx_ptr.get().add(p * s_in), s_in) };
                plane(g, xp, gp, dp, tree);
            }
        },
    );
}

/// One plane: every window replays the max tree and adds its shares of the cotangent.
fn plane<T: Float>(g: &Geometry, x: &[T], dy: &[T], dx: &mut [T], tree: &mut Tree) {
    for i in 0..g.oh {
        for j in 0..g.ow {
            window(g, x, dy, dx, tree, i, j);
        }
    }
}

/// Window `(i, j)` of a plane: its max tree replayed, its shares of the cotangent added.
#[inline(always)]
fn window<T: Float>(g: &Geometry, x: &[T], dy: &[T], dx: &mut [T], tree: &mut Tree, i: usize, j: usize) {
    let [kh, kw] = g.kernel;
    // The window's first input row/column, when the window lies inside the input.
    let inside =
        |o: usize, s: usize, pad: usize, k: usize, n: usize| (o * s).checked_sub(pad).filter(|&first| first + k <= n);
    let gij: f64 = dy[i * g.ow + j].into();
    // Inside the input with one strict maximum (the common case): it takes it all.
    if let (Some(r0), Some(c0)) = (
        inside(i, g.stride[0], g.top, kh, g.h),
        inside(j, g.stride[1], g.left, kw, g.w),
    ) {
        let base = r0 * g.w + c0;
        // Branch-free (window values are data; branches on them mispredict): the
        // maximum, then how many elements equal it and where the last one is.
        let (mut best, mut nan) = (f64::NEG_INFINITY, false);
        for di in 0..kh {
            for &v in &x[base + di * g.w..][..kw] {
                let v: f64 = v.into();
                nan |= v.is_nan();
                best = if v > best { v } else { best };
            }
        }
        let (mut count, mut at) = (0usize, base);
        for di in 0..kh {
            let row = base + di * g.w;
            for (dj, &v) in x[row..][..kw].iter().enumerate() {
                let hit = v.into() == best;
                count += hit as usize;
                at = if hit { row + dj } else { at };
            }
        }
        let unique = count == 1;
        if unique && !nan {
            dx[at] = T::from_f64(dx[at].into() + gij);
            return;
        }
        if kh == 2 && kw == 2 && !nan {
            // A tie in a 2 × 2 window: its tree inline — (a, b) and (c, d), then the two maxima; ties
            // split in halves at each node, as `Tree::shares` does (a ReLU before the
            // pool makes all-zero windows common).
            let at = [base, base + 1, base + g.w, base + g.w + 1];
            let v: [f64; 4] = at.map(|a| x[a].into());
            let split = |p: f64, q: f64| {
                if p > q {
                    (1.0, 0.0)
                } else if p < q {
                    (0.0, 1.0)
                } else {
                    (0.5, 0.5)
                }
            };
            let (s1, s2) = split(v[0].max(v[1]), v[2].max(v[3]));
            let (sa, sb) = split(v[0], v[1]);
            let (sc, sd) = split(v[2], v[3]);
            for (a, share) in at.into_iter().zip([s1 * sa, s1 * sb, s2 * sc, s2 * sd]) {
                if share != 0.0 {
                    dx[a] = T::from_f64(dx[a].into() + gij * share);
                }
            }
            return;
        }
    }
    // Leaves in slice order; `None`: the padding.
    for di in 0..kh {
        for dj in 0..kw {
            let r = (i * g.stride[0] + di).checked_sub(g.top).filter(|&r| r < g.h);
            let c = (j * g.stride[1] + dj).checked_sub(g.left).filter(|&c| c < g.w);
            let at = r.zip(c).map(|(r, c)| r * g.w + c);
            tree.leaf[di * kw + dj] = at;
            tree.vals[di * kw + dj] = at.map_or(f64::NEG_INFINITY, |a| x[a].into());
        }
    }
    tree.shares();
    for (leaf, &share) in tree.leaf.iter().zip(&tree.share) {
        if let Some(a) = leaf
            && share != 0.0
        {
            dx[*a] = T::from_f64(dx[*a].into() + gij * share);
        }
    }
}

/// Windows per [`scan`] call.
const SCAN: usize = 64;

/// The shares of a 3 × 3 window whose nine elements are equal ([`Tree::shares`]).
const UNIFORM_3X3: [f64; 9] = [0.0625, 0.0625, 0.0625, 0.0625, 0.0625, 0.0625, 0.0625, 0.0625, 0.5];

/// Windows `0..n` of one output row, 3 × 3 with stride 2 (the pool after most CNNs' stems),
/// window `k` reading columns `2k..2k + 3` of the input rows `r0`, `r1`, `r2`: the tap (0..9,
/// row-major) of each window's maximum — the last of equal ones, or 9 when all nine are equal
/// and none is NaN — and whether it is the only one with no NaN in the window (what
/// [`window`]'s first test decides, compared in f32: exact in either width).
#[inline(always)]
fn scan_body<const V: bool>(r0: &[f32], r1: &[f32], r2: &[f32], tap: &mut [u8], ok: &mut [bool]) {
    let n = tap.len().min(ok.len());
    let (r0, r1, r2) = (&r0[..2 * n + 1], &r1[..2 * n + 1], &r2[..2 * n + 1]);
    for k in 0..n {
        let c = 2 * k;
        let v = [
            r0[c],
            r0[c + 1],
            r0[c + 2],
            r1[c],
            r1[c + 1],
            r1[c + 2],
            r2[c],
            r2[c + 1],
            r2[c + 2],
        ];
        let (mut best, mut nan) = (f32::NEG_INFINITY, false);
        for &x in &v {
            nan |= x.is_nan();
            best = if x > best { x } else { best };
        }
        let (mut count, mut at) = (0u32, 0u8);
        for (t, &x) in v.iter().enumerate() {
            let hit = x == best;
            count += hit as u32;
            at = if hit { t as u8 } else { at };
        }
        // 9: every element equal (an all-zero window after a ReLU).
        tap[k] = if count == 9 && !nan { 9 } else { at };
        ok[k] = count == 1 && !nan;
    }
}

crate::simd::instances!(scan_body, scan, scan_avx2, scan_avx512,
    (r0: &[f32], r1: &[f32], r2: &[f32], tap: &mut [u8], ok: &mut [bool]) -> ());

/// [`plane`] for f32 3 × 3 windows with stride 2: the windows inside the input are scanned
/// [`SCAN`] at a time at the host's vector width, and those with one maximum and no NaN add
/// their cotangent there; the rest (ties, NaNs, windows over the padding) replay their tree
/// in [`window`]. Windows run in the same order either way, so every sum is added in the
/// same order — the result is [`plane`]'s, bit for bit.
fn plane_3x3s2(g: &Geometry, x: &[f32], dy: &[f32], dx: &mut [f32], tree: &mut Tree) {
    let (mut tap, mut ok) = ([0u8; SCAN], [false; SCAN]);
    // Windows j with 2j - left in 0..=w - 3 lie inside the input's columns.
    let j_lo = g.left.div_ceil(2);
    let j_hi = if g.w + g.left >= 3 {
        ((g.w + g.left - 3) / 2 + 1).min(g.ow)
    } else {
        0
    };
    for i in 0..g.oh {
        let r0 = (2 * i).checked_sub(g.top).filter(|&r| r + 3 <= g.h);
        let Some(r0) = r0.filter(|_| j_lo < j_hi) else {
            for j in 0..g.ow {
                window(g, x, dy, dx, tree, i, j);
            }
            continue;
        };
        for j in 0..j_lo {
            window(g, x, dy, dx, tree, i, j);
        }
        let mut j0 = j_lo;
        while j0 < j_hi {
            let n = SCAN.min(j_hi - j0);
            let c0 = 2 * j0 - g.left;
            let row = |di: usize| &x[(r0 + di) * g.w + c0..(r0 + di + 1) * g.w];
            scan(row(0), row(1), row(2), &mut tap[..n], &mut ok[..n]);
            for k in 0..n {
                if ok[k] {
                    let t = tap[k] as usize;
                    let at = (r0 + t / 3) * g.w + c0 + 2 * k + t % 3;
                    dx[at] += dy[i * g.ow + j0 + k];
                } else if tap[k] == 9 {
                    // All nine equal: the tree's ties halve at every node — the last leaf (the
                    // odd one out at the root) takes 1/2, the other eight 1/16 each; added in
                    // f64 and rounded once, as `window` does.
                    let gij = f64::from(dy[i * g.ow + j0 + k]);
                    for (t, share) in UNIFORM_3X3.iter().enumerate() {
                        let at = (r0 + t / 3) * g.w + c0 + 2 * k + t % 3;
                        dx[at] = (f64::from(dx[at]) + gij * share) as f32;
                    }
                } else {
                    window(g, x, dy, dx, tree, i, j0 + k);
                }
            }
            j0 += n;
        }
        for j in j_hi..g.ow {
            window(g, x, dy, dx, tree, i, j);
        }
    }
}

/// The pairwise max tree over `k` leaves (level by level, an odd last node passed up as is).
struct Tree {
    k: usize,
    leaf: Vec<Option<usize>>,
    /// Node values, level after level (the leaves first).
    vals: Vec<f64>,
    /// Each node's share of the root's cotangent, same layout.
    share: Vec<f64>,
    /// Where each level starts in `vals`, and its size.
    levels: Vec<(usize, usize)>,
}

impl Tree {
    fn new(k: usize) -> Tree {
        let mut levels = vec![(0, k)];
        let (mut at, mut n) = (k, k);
        while n > 1 {
            let next = n.div_ceil(2);
            levels.push((at, next));
            at += next;
            n = next;
        }
        Tree {
            k,
            leaf: vec![None; k],
            vals: vec![0.0; at],
            share: vec![0.0; at],
            levels,
        }
    }

    /// Values up the tree, then shares down it (`max`'s gradient rule at every node).
    fn shares(&mut self) {
        for l in 1..self.levels.len() {
            let ((lo, n), (up, _)) = (self.levels[l - 1], self.levels[l]);
            for j in 0..n.div_ceil(2) {
                let a = self.vals[lo + 2 * j];
                self.vals[up + j] = if 2 * j + 1 < n {
                    let b = self.vals[lo + 2 * j + 1];
                    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
                } else {
                    a
                };
            }
        }
        let top = self.share.len() - 1;
        self.share[top] = 1.0;
        for l in (1..self.levels.len()).rev() {
            let ((lo, n), (up, _)) = (self.levels[l - 1], self.levels[l]);
            for j in 0..n.div_ceil(2) {
                let s = self.share[up + j];
                if 2 * j + 1 < n {
                    let (a, b) = (self.vals[lo + 2 * j], self.vals[lo + 2 * j + 1]);
                    let (sa, sb) = if a > b {
                        (s, 0.0)
                    } else if a < b {
                        (0.0, s)
                    } else if a == b {
                        (0.5 * s, 0.5 * s)
                    } else {
                        (0.0, 0.0)
                    };
                    self.share[lo + 2 * j] = sa;
                    self.share[lo + 2 * j + 1] = sb;
                } else {
                    self.share[lo + 2 * j] = s;
                }
            }
        }
        debug_assert_eq!(self.levels[0], (0, self.k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vjp(
        x: &[f64],
        xs: [usize; 4],
        dy: &[f64],
        ys: [usize; 4],
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 4],
    ) -> Vec<f64> {
        let x = TensorData::from_vec(xs.to_vec(), x.to_vec()).unwrap();
        let dy = TensorData::from_vec(ys.to_vec(), dy.to_vec()).unwrap();
        let dx = max_pool2d_vjp(&x, &dy, k, s, p, 2).unwrap().unwrap();
        bytemuck::cast_slice::<u8, f64>(dx.bytes()).to_vec()
    }

    #[test]
    fn the_maximum_takes_the_gradient() {
        // 2×2 windows, stride 2, over a 1×1×2×4 input: maxima 4 (index 5) and 7 (index 2).
        let x = [1.0, 2.0, 7.0, 3.0, 0.0, 4.0, 5.0, 6.0];
        let dx = vjp(&x, [1, 1, 2, 4], &[10.0, 20.0], [1, 1, 1, 2], [2, 2], [2, 2], [0; 4]);
        assert_eq!(dx, [0.0, 0.0, 20.0, 0.0, 0.0, 10.0, 0.0, 0.0]);
    }

    #[test]
    fn ties_split_as_the_pairwise_tree_does() {
        // Window (a, b, c, d) = all equal: max(max(a, b), max(c, d)) gives each a quarter.
        let dx = vjp(&[3.0; 4], [1, 1, 2, 2], &[8.0], [1, 1, 1, 1], [2, 2], [2, 2], [0; 4]);
        assert_eq!(dx, [2.0; 4]);
        // Partial ties in 2×2 windows (the inline path): (5, 5 | 1, 2) — the top pair's first
        // side wins, its two leaves split it; (1, 5 | 5, 0) — the two sides tie, each side's
        // winner takes half.
        let dx = vjp(
            &[5.0, 5.0, 1.0, 2.0],
            [1, 1, 2, 2],
            &[8.0],
            [1, 1, 1, 1],
            [2, 2],
            [2, 2],
            [0; 4],
        );
        assert_eq!(dx, [4.0, 4.0, 0.0, 0.0]);
        let dx = vjp(
            &[1.0, 5.0, 5.0, 0.0],
            [1, 1, 2, 2],
            &[8.0],
            [1, 1, 1, 1],
            [2, 2],
            [2, 2],
            [0; 4],
        );
        assert_eq!(dx, [0.0, 4.0, 4.0, 0.0]);
        // Three leaves (1×3 window), the first two tied above the third: halves; the third,
        // passed up alone, loses.
        let dx = vjp(
            &[5.0, 5.0, 1.0],
            [1, 1, 1, 3],
            &[8.0],
            [1, 1, 1, 1],
            [1, 3],
            [1, 1],
            [0; 4],
        );
        assert_eq!(dx, [4.0, 4.0, 0.0]);
        // A NaN in the window: no gradient anywhere (the reference's rule).
        let dx = vjp(
            &[f64::NAN, 1.0],
            [1, 1, 1, 2],
            &[8.0],
            [1, 1, 1, 1],
            [1, 2],
            [1, 1],
            [0; 4],
        );
        assert_eq!(dx, [0.0, 0.0]);
    }

    /// The f32 2 × 2 path equals the general replay bit for bit: random values with many
    /// ties (a ReLU's zeros, a few distinct values), NaNs, -0 and subnormal cotangents, odd
    /// input sizes (a last row and column no window covers), one and two threads.
    #[test]
    fn f32_2x2_windows_match_the_general_path_bitwise() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for (n, c, h, w) in [(2, 3, 28, 28), (1, 2, 11, 9), (64, 6, 10, 10), (3, 1, 2, 2)] {
            let (oh, ow) = (h / 2, w / 2);
            let x: Vec<f32> = (0..n * c * h * w)
                .map(|_| match next() % 10 {
                    0..=3 => 0.0,
                    4 => f32::NAN,
                    5 => -0.0,
                    v => v as f32 * 0.5,
                })
                .collect();
            let dy: Vec<f32> = (0..n * c * oh * ow)
                .map(|_| match next() % 6 {
                    0 => -0.0,
                    1 => f32::from_bits(3), // subnormal: g · ¼ rounds
                    2 => -f32::from_bits(5),
                    v => (v as f32 - 3.7) * 1.3,
                })
                .collect();
            let g = Geometry::of(&[n, c, h, w], &[n, c, oh, ow], [2, 2], [2, 2], [0; 4])
                .unwrap()
                .unwrap();
            assert!(g.tiles_2x2());
            let mut general = vec![0f32; x.len()];
            typed::<f32>(&x, &dy, &mut general, &g, 2, plane::<f32>);
            let xt = TensorData::from_vec(vec![n, c, h, w], x.clone()).unwrap();
            let dyt = TensorData::from_vec(vec![n, c, oh, ow], dy.clone()).unwrap();
            for threads in [1, 2] {
                let fast = max_pool2d_vjp(&xt, &dyt, [2, 2], [2, 2], [0; 4], threads)
                    .unwrap()
                    .unwrap();
                let a: &[u32] = bytemuck::cast_slice(fast.bytes());
                let b: &[u32] = bytemuck::cast_slice(&general);
                assert_eq!(a, b, "{n}×{c}×{h}×{w}, {threads} threads");
                // The slice entry point (the compiled graphs' kernel), over a dirty buffer.
                let mut into = vec![f32::NAN; x.len()];
                max_pool2d_vjp_into(
                    (&x, &[n, c, h, w]),
                    (&dy, &[n, c, oh, ow]),
                    [2, 2],
                    [2, 2],
                    [0; 4],
                    &mut into,
                    threads,
                )
                .unwrap();
                let bits: &[u32] = bytemuck::cast_slice(&into);
                assert_eq!(bits, b, "{n}×{c}×{h}×{w}, {threads} threads, into");
            }
        }
    }

    /// The f32 3 × 3 / stride 2 path equals the general replay bit for bit: many ties, NaNs,
    /// -0, infinities and subnormal cotangents; no padding and padding 1; rows of more than one
    /// scan; planes too small for any inside window; one and two threads.
    #[test]
    fn f32_3x3_stride_2_windows_match_the_general_path_bitwise() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for (n, c, h, w) in [
            (2, 3, 32, 32),
            (1, 2, 11, 9),
            (1, 1, 5, 161),
            (3, 4, 7, 8),
            (1, 2, 2, 2),
        ] {
            for pad in [0usize, 1] {
                let (oh, ow) = (
                    (h + 2 * pad).saturating_sub(3) / 2 + 1,
                    (w + 2 * pad).saturating_sub(3) / 2 + 1,
                );
                if h + 2 * pad < 3 || w + 2 * pad < 3 {
                    continue;
                }
                // Every other plane mostly zeros (all-zero windows: the uniform ties).
                let x: Vec<f32> = (0..n * c * h * w)
                    .map(|e| match next() % if (e / (h * w)) % 2 == 1 { 120 } else { 12 } {
                        0..=3 => 0.0,
                        4 => f32::NAN,
                        5 => -0.0,
                        6 => f32::NEG_INFINITY,
                        7..=11 => next() as u8 as f32 * 0.5,
                        _ => 0.0,
                    })
                    .collect();
                let dy: Vec<f32> = (0..n * c * oh * ow)
                    .map(|_| match next() % 6 {
                        0 => -0.0,
                        1 => f32::from_bits(3),
                        2 => -f32::from_bits(5),
                        v => (v as f32 - 3.7) * 1.3,
                    })
                    .collect();
                let shape = [n, c, h, w];
                let g = Geometry::of(&shape, &[n, c, oh, ow], [3, 3], [2, 2], [pad; 4])
                    .unwrap()
                    .unwrap();
                let mut general = vec![0f32; x.len()];
                let (s_in, s_out) = (h * w, oh * ow);
                for p in 0..n * c {
                    let (xp, gp) = (&x[p * s_in..][..s_in], &dy[p * s_out..][..s_out]);
                    plane(&g, xp, gp, &mut general[p * s_in..][..s_in], &mut Tree::new(9));
                }
                for threads in [1, 2] {
                    let mut got = vec![f32::NAN; x.len()];
                    max_pool2d_vjp_into(
                        (&x, &shape),
                        (&dy, &[n, c, oh, ow]),
                        [3, 3],
                        [2, 2],
                        [pad; 4],
                        &mut got,
                        threads,
                    )
                    .unwrap();
                    let (a, b): (&[u32], &[u32]) = (bytemuck::cast_slice(&got), bytemuck::cast_slice(&general));
                    assert_eq!(a, b, "{shape:?} pad {pad}, {threads} threads");
                }
            }
        }
    }

    #[test]
    fn overlapping_windows_and_padding_add_up() {
        // 3×3 windows, stride 1, padding 1 on a 1×1×2×2 input of distinct values: every window
        // covers the whole input, so the maximum (index 3) takes every output's gradient.
        let dx = vjp(
            &[1.0, 2.0, 3.0, 4.0],
            [1, 1, 2, 2],
            &[1.0, 2.0, 3.0, 4.0],
            [1, 1, 2, 2],
            [3, 3],
            [1, 1],
            [1; 4],
        );
        assert_eq!(dx, [0.0, 0.0, 0.0, 10.0]);
    }

    /// The half gradient is the f32 kernel's on the widened operands, rounded once — f16 and
    /// bf16, overlapping windows (their sums), padding, one and two threads, and more planes
    /// than one unit takes.
    #[test]
    fn half_gradients_are_the_widened_ones_rounded() {
        use crate::ewise::{Half, narrow, widen};
        let (kernel, stride, padding) = ([3, 3], [2, 2], [1, 1, 1, 1]);
        let (xs, ys) = ([3usize, 200, 9, 8], [3usize, 200, 5, 4]);
        let (n, m): (usize, usize) = (xs.iter().product(), ys.iter().product());
        let xv: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173).collect();
        let dyv: Vec<f32> = (0..m).map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.31).collect();
        for half in [Half::F16, Half::Bf16] {
            let (mut xb, mut dyb) = (vec![0u16; n], vec![0u16; m]);
            narrow(half, &xv, &mut xb);
            narrow(half, &dyv, &mut dyb);
            let (mut xw, mut dyw) = (vec![0f32; n], vec![0f32; m]);
            widen(half, &xb, &mut xw);
            widen(half, &dyb, &mut dyw);
            let mut want_f = vec![0f32; n];
            max_pool2d_vjp_into((&xw, &xs), (&dyw, &ys), kernel, stride, padding, &mut want_f, 1).unwrap();
            let mut want = vec![0u16; n];
            narrow(half, &want_f, &mut want);
            for threads in [1, 2] {
                let mut got = vec![0u16; n];
                max_pool2d_vjp_half_into(
                    half,
                    (&xb, &xs),
                    (&dyb, &ys),
                    kernel,
                    stride,
                    padding,
                    &mut got,
                    threads,
                )
                .unwrap();
                assert_eq!(got, want, "{half:?} t{threads}");
            }
        }
    }
}
