//! N-d convolution as im2col + `gemm` (f32/f64), one matrix product per (batch, group).

use super::matmul::{Float, gemm_into};
use crate::error::Result;
use oar_ir::ops::Conv;
use oar_ir::{DType, Op, TensorData};

/// `conv(x, w)` for f32/f64 (attributes from `Op::Conv`); `None` for other dtypes.
pub(crate) fn conv(op: &Op, x: &TensorData, w: &TensorData) -> Result<Option<TensorData>> {
    let Op::Conv(Conv {
        stride,
        pad_before,
        dilation,
        groups,
        ..
    }) = op
    else {
        return Ok(None);
    };
    let out_shape = match oar_ir::ops::infer_types(op, &[x.tensor_type(), w.tensor_type()], &[]) {
        Ok(t) => t[0].shape.as_static().unwrap_or_default(),
        Err(_) => return Ok(None), // the caller reports the type error
    };
    let geo = Geometry {
        x: x.shape(),
        w: w.shape(),
        y: &out_shape,
        stride,
        pad_before,
        dilation,
        groups: *groups,
    };
    Ok(match (x.dtype(), w.dtype()) {
        (DType::F32, DType::F32) => Some(typed::<f32>(&geo, x, w)?),
        (DType::F64, DType::F64) => Some(typed::<f64>(&geo, x, w)?),
        _ => None,
    })
}

struct Geometry<'a> {
    x: &'a [usize],
    w: &'a [usize],
    y: &'a [usize],
    stride: &'a [usize],
    pad_before: &'a [usize],
    dilation: &'a [usize],
    groups: usize,
}

fn typed<T: Float>(g: &Geometry, x: &TensorData, w: &TensorData) -> Result<TensorData> {
    let xv = x.to_vec::<T>()?;
    let wv = w.to_vec::<T>()?;
    let sp = g.stride.len();
    let (n, c, o) = (g.x[0], g.x[1], g.w[0]);
    let (cg, og) = (c / g.groups, o / g.groups);
    let ks: usize = g.w[2..].iter().product();
    let ys: usize = g.y[2..].iter().product();
    let xs: usize = g.x[2..].iter().product();
    // For each spatial axis, the source index of (kernel position, output position), or None in padding.
    let tables: Vec<Vec<Option<usize>>> = (0..sp)
        .map(|i| {
            let (k, y, s) = (g.w[2 + i], g.y[2 + i], g.x[2 + i]);
            (0..k * y)
                .map(|ky| {
                    let (kk, yy) = (ky / y, ky % y);
                    let pos = (yy * g.stride[i] + kk * g.dilation[i]) as isize - g.pad_before[i] as isize;
                    (pos >= 0 && (pos as usize) < s).then_some(pos as usize)
                })
                .collect()
        })
        .collect();
    let mut cols = vec![T::ZERO; cg * ks * ys];
    let mut out = vec![T::ZERO; n * o * ys];
    let mut kidx = vec![0usize; sp];
    let mut yidx = vec![0usize; sp];
    for b in 0..n {
        for grp in 0..g.groups {
            for ci in 0..cg {
                let plane = &xv[(b * c + grp * cg + ci) * xs..][..xs];
                for kf in 0..ks {
                    unflatten(kf, &g.w[2..], &mut kidx);
                    let row = &mut cols[(ci * ks + kf) * ys..][..ys];
                    for (yf, slot) in row.iter_mut().enumerate() {
                        unflatten(yf, &g.y[2..], &mut yidx);
                        let mut off = 0;
                        let mut inside = true;
                        for i in 0..sp {
                            match tables[i][kidx[i] * g.y[2 + i] + yidx[i]] {
                                Some(p) => off = off * g.x[2 + i] + p,
                                None => {
                                    inside = false;
                                    break;
                                }
                            }
                        }
                        *slot = if inside { plane[off] } else { T::ZERO };
                    }
                }
            }
            let wg = &wv[grp * og * cg * ks..][..og * cg * ks];
            let dst = &mut out[(b * o + grp * og) * ys..][..og * ys];
            gemm_into(dst, wg, &cols, og, cg * ks, ys);
        }
    }
    Ok(TensorData::from_vec(g.y.to_vec(), out)?)
}

fn unflatten(mut flat: usize, dims: &[usize], out: &mut [usize]) {
    for i in (0..dims.len()).rev() {
        out[i] = flat % dims[i];
        flat /= dims[i];
    }
}
