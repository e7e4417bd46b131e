//! `conv_integer` (2-D): exact i32 sums `conv(x - x_zp, w - w_zp)` of 8-bit operands.
//!
//! Per image and group, the input's patches are gathered into rows (im2col, the padding filled
//! with the input's zero point so that it contributes nothing) and multiplied by the group's
//! weights as `matmul_integer` does ([`crate::qgemm`]: i16 pairs, `vpmaddwd`, exact); the
//! `[pixels, channels]` result is written back channel-major. Depthwise convolutions (one input
//! and one output channel per group) run a direct loop over each channel's taps instead, where
//! a GEMM would have one column.

use crate::qgemm;
use oar_ir::ops::ConvInteger;
use oar_ir::{DType, TensorType};

/// Whether the runtime computes this `conv_integer`: static 2-D shapes (`x[N, C, H, W]`,
/// `w[O, C/groups, KH, KW]`), 8-bit operands, a scalar input zero point and a scalar or
/// per-output-channel weight zero point.
pub fn supported(c: &ConvInteger, types: &[TensorType]) -> bool {
    let eight = |t: &TensorType| matches!(t.dtype, DType::I8 | DType::U8);
    let Some(dims) = types
        .iter()
        .map(|t| t.shape.0.iter().map(|d| d.as_static()).collect::<Option<Vec<usize>>>())
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    if !(2..=4).contains(&types.len()) || !eight(&types[0]) || !eight(&types[1]) {
        return false;
    }
    let (x, w) = (&dims[0], &dims[1]);
    let scalar = |z: &Vec<usize>| z.is_empty() || z.as_slice() == [1];
    x.len() == 4
        && w.len() == 4
        && c.stride.len() == 2
        && c.groups >= 1
        && dims.get(2).is_none_or(scalar)
        && dims.get(3).is_none_or(|z| scalar(z) || z.as_slice() == [w[0]])
}

/// An operand's 8-bit value as i32.
fn int(v: u8, dtype: DType) -> i32 {
    if dtype == DType::I8 { v as i8 as i32 } else { v as i32 }
}

/// The geometry of one 2-D integer convolution.
struct Geometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    groups: usize,
}

/// `out[N, O, OH, OW]` (i32 as bytes) = `conv_integer(x, w, zx, zw)` with `c`'s geometry.
#[allow(clippy::too_many_arguments)]
pub fn run(
    c: &ConvInteger,
    x: (&[u8], DType, &[usize]),
    w: (&[u8], DType, &[usize]),
    zx: Option<(&[u8], DType)>,
    zw: Option<(&[u8], DType)>,
    out: &mut [u8],
    threads: usize,
    cache: Option<&crate::contraction::WeightCache>,
) -> Result<(), String> {
    let (xb, dx, xs) = x;
    let (wb, dw, ws) = w;
    let out_dim = |i: usize, size: usize, k: usize| -> Option<usize> {
        let span = c.dilation[i] * (k - 1) + 1;
        (size + c.pad_before[i] + c.pad_after[i])
            .checked_sub(span)
            .map(|d| d / c.stride[i] + 1)
    };
    let g = Geometry {
        n: xs[0],
        c: xs[1],
        h: xs[2],
        w: xs[3],
        o: ws[0],
        kh: ws[2],
        kw: ws[3],
        oh: out_dim(0, xs[2], ws[2]).unwrap_or(0),
        ow: out_dim(1, xs[3], ws[3]).unwrap_or(0),
        groups: c.groups,
    };
    let (cg, og) = (g.c / g.groups.max(1), g.o / g.groups.max(1));
    if g.groups == 0
        || !g.c.is_multiple_of(g.groups)
        || !g.o.is_multiple_of(g.groups)
        || ws[1] != cg
        || xb.len() != g.n * g.c * g.h * g.w
        || wb.len() != g.o * cg * g.kh * g.kw
        || out.len() != g.n * g.o * g.oh * g.ow * 4
    {
        return Err(format!(
            "conv_integer: x {xs:?} ({} bytes), w {ws:?} ({} bytes), groups {}, {} result bytes do not fit",
            xb.len(),
            wb.len(),
            g.groups,
            out.len()
        ));
    }
    let zx_byte = zx.map_or(0u8, |(b, _)| b[0]);
    let zw_at = |o: usize| zw.map_or(0, |(b, d)| int(b[if b.len() == 1 { 0 } else { o }], d));
    let (pixels, k) = (g.oh * g.ow, cg * g.kh * g.kw);
    let mut sums = vec![0u8; pixels * og * 4];
    let out_i32 = |out: &mut [u8], idx: usize, v: i32| out[idx * 4..idx * 4 + 4].copy_from_slice(&v.to_ne_bytes());
    if cg == 1 && og == 1 {
        // Depthwise: a direct loop per channel.
        let zxi = int(zx_byte, dx);
        for img in 0..g.n {
            for ch in 0..g.o {
                let plane = &xb[(img * g.c + ch) * g.h * g.w..][..g.h * g.w];
                let taps = &wb[ch * g.kh * g.kw..][..g.kh * g.kw];
                let zwi = zw_at(ch);
                let wt: Vec<i32> = taps.iter().map(|&v| int(v, dw) - zwi).collect();
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        let mut acc = 0i32;
                        for ky in 0..g.kh {
                            let iy = (oy * c.stride[0] + ky * c.dilation[0]) as isize - c.pad_before[0] as isize;
                            if iy < 0 || iy >= g.h as isize {
                                continue;
                            }
                            for kx in 0..g.kw {
                                let ix = (ox * c.stride[1] + kx * c.dilation[1]) as isize - c.pad_before[1] as isize;
                                if ix < 0 || ix >= g.w as isize {
                                    continue;
                                }
                                let v = int(plane[iy as usize * g.w + ix as usize], dx) - zxi;
                                acc = acc.wrapping_add(v * wt[ky * g.kw + kx]);
                            }
                        }
                        out_i32(out, ((img * g.o + ch) * g.oh + oy) * g.ow + ox, acc);
                    }
                }
            }
        }
        return Ok(());
    }
    // Every group's weights as a packed [k, og] matrix, one after the other (kept in `cache`
    // when the weights are constant).
    let pack_all = || {
        let mut all = Vec::new();
        let mut wmat = vec![0u8; k * og];
        for grp in 0..g.groups {
            for oc in 0..og {
                let src = &wb[(grp * og + oc) * k..][..k];
                for (kk, &v) in src.iter().enumerate() {
                    wmat[kk * og + oc] = v;
                }
            }
            let zb = zw.map(|(b, d)| {
                if b.len() == 1 {
                    (b, d)
                } else {
                    (&b[grp * og..(grp + 1) * og], d)
                }
            });
            all.extend(qgemm::pack_b(&wmat, dw, zb, k, og));
        }
        all
    };
    let owned;
    let packed: &[i16] = match cache {
        Some(c) => qgemm::pack_b_cached(c, pack_all),
        None => {
            owned = pack_all();
            &owned
        }
    };
    let per_group = packed.len() / g.groups;
    let mut cols = vec![zx_byte; pixels * k];
    for img in 0..g.n {
        for grp in 0..g.groups {
            // im2col: row p = output pixel, column (ci, ky, kx).
            cols.fill(zx_byte);
            for ci in 0..cg {
                let plane = &xb[(img * g.c + grp * cg + ci) * g.h * g.w..][..g.h * g.w];
                for ky in 0..g.kh {
                    for kx in 0..g.kw {
                        let col = (ci * g.kh + ky) * g.kw + kx;
                        for oy in 0..g.oh {
                            let iy = (oy * c.stride[0] + ky * c.dilation[0]) as isize - c.pad_before[0] as isize;
                            if iy < 0 || iy >= g.h as isize {
                                continue;
                            }
                            let row = &plane[iy as usize * g.w..][..g.w];
                            for ox in 0..g.ow {
                                let ix = (ox * c.stride[1] + kx * c.dilation[1]) as isize - c.pad_before[1] as isize;
                                if ix >= 0 && ix < g.w as isize {
                                    cols[(oy * g.ow + ox) * k + col] = row[ix as usize];
                                }
                            }
                        }
                    }
                }
            }
            let za = zx.map(|(b, d)| (&b[..1], d));
            let panel = &packed[grp * per_group..(grp + 1) * per_group];
            qgemm::run_packed(&cols, dx, za, panel, (pixels, pixels, k, og), &mut sums, threads)?;
            // [pixels, og] into the output's channels.
            for oc in 0..og {
                let base = (img * g.o + grp * og + oc) * pixels;
                for p in 0..pixels {
                    out[(base + p) * 4..(base + p) * 4 + 4]
                        .copy_from_slice(&sums[(p * og + oc) * 4..(p * og + oc) * 4 + 4]);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, directly.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        c: &ConvInteger,
        x: &[i32],
        xs: [usize; 4],
        w: &[i32],
        ws: [usize; 4],
        zx: i32,
        zw: &[i32],
        (oh, ow): (usize, usize),
    ) -> Vec<i32> {
        let [n, ch, h, wd] = xs;
        let [o, cg, kh, kw] = ws;
        let og = o / c.groups;
        let mut out = vec![0i32; n * o * oh * ow];
        for img in 0..n {
            for oc in 0..o {
                let grp = oc / og;
                let z = zw[if zw.len() == 1 { 0 } else { oc }];
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut s = 0i64;
                        for ci in 0..cg {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy =
                                        (oy * c.stride[0] + ky * c.dilation[0]) as isize - c.pad_before[0] as isize;
                                    let ix =
                                        (ox * c.stride[1] + kx * c.dilation[1]) as isize - c.pad_before[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                        continue;
                                    }
                                    let xv = x[((img * ch + grp * cg + ci) * h + iy as usize) * wd + ix as usize] - zx;
                                    let wv = w[((oc * cg + ci) * kh + ky) * kw + kx] - z;
                                    s += (xv * wv) as i64;
                                }
                            }
                        }
                        out[((img * o + oc) * oh + oy) * ow + ox] = s as i32;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_definition_for_strides_padding_groups_and_depthwise() {
        let mut seed = 0x9e37_79b9u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        };
        // (x shape, w shape, stride, pads, dilation, groups)
        type Case = ([usize; 4], [usize; 4], [usize; 2], [usize; 2], [usize; 2], usize);
        let cases: [Case; 5] = [
            ([1, 3, 9, 9], [4, 3, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            ([2, 4, 8, 7], [6, 2, 3, 3], [2, 2], [1, 0], [1, 1], 2),
            ([1, 6, 7, 7], [6, 1, 3, 3], [1, 1], [1, 1], [1, 1], 6),
            ([1, 5, 10, 10], [3, 5, 1, 1], [1, 1], [0, 0], [1, 1], 1),
            ([1, 2, 9, 9], [2, 2, 3, 3], [1, 1], [2, 2], [2, 2], 1),
        ];
        for (dx, dw) in [(DType::U8, DType::I8), (DType::I8, DType::I8), (DType::U8, DType::U8)] {
            for (xs, ws, stride, pad, dil, groups) in cases {
                let c = ConvInteger {
                    stride: stride.to_vec(),
                    pad_before: pad.to_vec(),
                    pad_after: pad.to_vec(),
                    dilation: dil.to_vec(),
                    groups,
                };
                let oh = (xs[2] + 2 * pad[0] - dil[0] * (ws[2] - 1) - 1) / stride[0] + 1;
                let ow = (xs[3] + 2 * pad[1] - dil[1] * (ws[3] - 1) - 1) / stride[1] + 1;
                let xb: Vec<u8> = (0..xs.iter().product::<usize>()).map(|_| next()).collect();
                let wb: Vec<u8> = (0..ws.iter().product::<usize>()).map(|_| next()).collect();
                let zx = [next()];
                let zw: Vec<u8> = (0..ws[0]).map(|_| next()).collect();
                let xi: Vec<i32> = xb.iter().map(|&v| int(v, dx)).collect();
                let wi: Vec<i32> = wb.iter().map(|&v| int(v, dw)).collect();
                let zwi: Vec<i32> = zw.iter().map(|&v| int(v, dw)).collect();
                let want = naive(&c, &xi, xs, &wi, ws, int(zx[0], dx), &zwi, (oh, ow));
                let mut out = vec![0u8; want.len() * 4];
                run(
                    &c,
                    (&xb, dx, &xs),
                    (&wb, dw, &ws),
                    Some((&zx, dx)),
                    Some((&zw, dw)),
                    &mut out,
                    2,
                    None,
                )
                .unwrap();
                // Packed once into a cache, then read from it.
                let cache = crate::contraction::WeightCache::new();
                for _ in 0..2 {
                    let mut again = vec![0u8; want.len() * 4];
                    run(
                        &c,
                        (&xb, dx, &xs),
                        (&wb, dw, &ws),
                        Some((&zx, dx)),
                        Some((&zw, dw)),
                        &mut again,
                        2,
                        Some(&cache),
                    )
                    .unwrap();
                    assert_eq!(again, out);
                }
                let got: Vec<i32> = out
                    .chunks_exact(4)
                    .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                    .collect();
                assert_eq!(
                    got, want,
                    "{dx} x {dw}: x {xs:?} w {ws:?} stride {stride:?} groups {groups}"
                );
                // No zero points.
                let want = naive(&c, &xi, xs, &wi, ws, 0, &[0], (oh, ow));
                run(&c, (&xb, dx, &xs), (&wb, dw, &ws), None, None, &mut out, 1, None).unwrap();
                let got: Vec<i32> = out
                    .chunks_exact(4)
                    .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                    .collect();
                assert_eq!(got, want);
            }
        }
    }
}
