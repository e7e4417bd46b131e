//! `max_pool2d` in one pass over each plane, without the padded copy of the input.
//!
//! The op's definition (`oar_ir`'s decomposition) pads the input with `-inf`, takes one
//! strided slice per kernel position and combines the slices by the pairwise tree of binary
//! `max` (slices in row-major kernel order, an odd last node passed up as is). Here each output
//! row replays that tree on rows of leaves: the input rows a window row reads are split once
//! into their `stride` column phases (with `-inf` where the window reaches the padding, or
//! past it in ceil mode), so every kernel position's leaf row is a contiguous slice of a
//! phase, and each tree node is one elementwise `max` over a row of outputs (which the
//! compiler vectorizes). Same values, same NaN propagation, same order of comparisons as the
//! compiled definition.

use crate::par::par_units;
use crate::pool_grad::Geometry;
use oar_ir::DType;
use oar_ir::ops::MaxPool2d;

/// Windows up to this many elements (16 × 16) run natively.
const MAX_WINDOW: usize = 256;

/// Whether the native kernel runs `max_pool2d` with attributes `m` on operands of these types:
/// one f32 or f64 input of rank 4, a non-empty window of at most [`MAX_WINDOW`] elements, a
/// stride.
pub fn max_pool2d_supported(m: &MaxPool2d, inputs: &[oar_ir::TensorType]) -> bool {
    let k = m.kernel[0] * m.kernel[1];
    inputs.len() == 1
        && matches!(inputs[0].dtype, DType::F32 | DType::F64)
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

fn max_into<T: Lane>(dst: &mut [T], a: &[T], b: &[T]) {
    for ((d, &a), &b) in dst.iter_mut().zip(a).zip(b) {
        *d = max(a, b);
    }
}

fn max_assign<T: Lane>(dst: &mut [T], b: &[T]) {
    for (d, &b) in dst.iter_mut().zip(b) {
        *d = max(*d, b);
    }
}

impl Geometry {
    /// Column phases a window row reads (`q = dj mod stride` for `dj < kw`).
    fn phases(&self) -> usize {
        self.stride[1].min(self.kernel[1])
    }

    /// Elements of one phase row: every output column's leaf for every `dj` of that phase.
    fn phase_len(&self) -> usize {
        self.ow + (self.kernel[1] - 1) / self.stride[1]
    }
}

/// `out = max_pool2d(x)` for x `[N, C, H, W]` (shape `xs`) pooled to `out` (shape `ys`, which
/// gives the output size, so ceil mode needs no flag), [`max_pool2d_supported`] checked first.
pub(crate) fn max_pool2d_into<T: Lane>(
    (x, xs): (&[T], &[usize]),
    (out, ys): (&mut [T], &[usize]),
    m: &MaxPool2d,
    threads: usize,
) -> Result<(), String> {
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
    if x.len() != g.planes * s_in || out.len() != g.planes * s_out {
        return Err(format!(
            "max_pool2d: {} / {} elements for x {xs:?} and output {ys:?}",
            x.len(),
            out.len()
        ));
    }
    if s_out == 0 {
        return Ok(());
    }
    // Planes per unit: about 16K output-window elements each.
    let per = (1usize << 14).div_ceil(s_out * k).max(1);
    let units = g.planes.div_ceil(per);
    let work = g.planes.saturating_mul(s_out).saturating_mul(k);
    let threads = if work < 1 << 16 { 1 } else { threads };
    let out_ptr = crate::contraction::SendPtr(out.as_mut_ptr());
    let scratch = || {
        (
            vec![T::LOWEST; g.kernel[0] * g.phases() * g.phase_len()],
            vec![T::LOWEST; k.div_ceil(2) * g.ow],
        )
    };
    par_units(units, threads, scratch, |(phases, tmp), u| {
        for p in u * per..((u + 1) * per).min(g.planes) {
            // Safety: plane `p` of the output, written by this unit only.
            let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(p * s_out), s_out) };
            plane(&g, &x[p * s_in..][..s_in], dst, phases, tmp);
        }
    });
    Ok(())
}

/// One plane, output row by output row.
fn plane<T: Lane>(g: &Geometry, x: &[T], out: &mut [T], phases: &mut [T], tmp: &mut [T]) {
    let [kh, kw] = g.kernel;
    let [sh, sw] = g.stride;
    let (nph, plen, ow) = (g.phases(), g.phase_len(), g.ow);
    let k = kh * kw;
    for (i, out_row) in out.chunks_exact_mut(ow).enumerate() {
        // Phase q of window row di: element t is padded column q + sw·t of input row
        // i·sh + di - top (-inf outside the input).
        for di in 0..kh {
            let r = (i * sh + di).checked_sub(g.top).filter(|&r| r < g.h);
            for q in 0..nph {
                let ph = &mut phases[(di * nph + q) * plen..][..plen];
                let Some(r) = r else {
                    ph.fill(T::LOWEST);
                    continue;
                };
                let row = &x[r * g.w..][..g.w];
                // Columns t with left ≤ q + sw·t < left + w read the input.
                let lo = g.left.saturating_sub(q).div_ceil(sw).min(plen);
                let hi = if q >= g.left + g.w {
                    0
                } else {
                    (g.left + g.w - q).div_ceil(sw).min(plen)
                }
                .max(lo);
                ph[..lo].fill(T::LOWEST);
                ph[hi..].fill(T::LOWEST);
                if lo < hi {
                    let first = q + sw * lo - g.left;
                    crate::conv_direct::gather_step(&mut ph[lo..hi], &row[first..], sw);
                }
            }
        }
        let leaf = |l: usize| {
            let (di, dj) = (l / kw, l % kw);
            &phases[(di * nph + dj % sw) * plen + dj / sw..][..ow]
        };
        if k == 1 {
            out_row.copy_from_slice(leaf(0));
            continue;
        }
        // The tree's first level from the leaves, the others in place in `tmp` (node j of a
        // level from nodes 2j and 2j + 1 of the one below).
        for j in 0..k / 2 {
            max_into(&mut tmp[j * ow..][..ow], leaf(2 * j), leaf(2 * j + 1));
        }
        if k % 2 == 1 {
            tmp[k / 2 * ow..][..ow].copy_from_slice(leaf(k - 1));
        }
        let mut n = k.div_ceil(2);
        while n > 1 {
            {
                let (first, rest) = tmp.split_at_mut(ow);
                max_assign(first, &rest[..ow]);
            }
            for j in 1..n / 2 {
                let (lo, hi) = tmp.split_at_mut(2 * j * ow);
                let (a, b) = hi.split_at(ow);
                max_into(&mut lo[j * ow..][..ow], a, &b[..ow]);
            }
            if n % 2 == 1 {
                tmp.copy_within((n - 1) * ow..n * ow, n / 2 * ow);
            }
            n = n.div_ceil(2);
        }
        out_row.copy_from_slice(&tmp[..ow]);
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
}
