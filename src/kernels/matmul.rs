//! Batched matmul through the `gemm` crate (f32/f64), with numpy batch broadcasting.

use crate::error::Result;
use oar_ir::shape::broadcast_shapes;
use oar_ir::{DType, Element, Shape, TensorData};

/// `a[.., M, K] @ b[.., K, N]` for f32/f64; `None` for other dtypes (the caller falls back).
pub(crate) fn matmul(a: &TensorData, b: &TensorData) -> Result<Option<TensorData>> {
    match (a.dtype(), b.dtype()) {
        (DType::F32, DType::F32) => Ok(Some(typed::<f32>(a, b)?)),
        (DType::F64, DType::F64) => Ok(Some(typed::<f64>(a, b)?)),
        _ => Ok(None),
    }
}

fn typed<T: Element + num_zero::Zero>(a: &TensorData, b: &TensorData) -> Result<TensorData> {
    let (sa, sb) = (a.shape(), b.shape());
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let batch = broadcast_shapes(&Shape::of(&sa[..ra - 2]), &Shape::of(&sb[..rb - 2]))
        .map_err(|e| crate::Error::invalid("matmul", e))?
        .as_static()
        .unwrap_or_default();
    let nb: usize = batch.iter().product();
    let av = a.to_vec::<T>()?;
    let bv = b.to_vec::<T>()?;
    let mut out = vec![T::ZERO; nb * m * n];
    let offset = |idx: usize, shape: &[usize]| -> usize {
        // Map a flat index in the broadcast batch to a flat batch index of `shape`.
        let mut rem = idx;
        let mut flat = 0;
        let mut stride = 1;
        for (i, &d) in batch.iter().enumerate().rev() {
            let coord = rem % d;
            rem /= d;
            let j = i as isize - (batch.len() as isize - shape.len() as isize);
            if j >= 0 {
                let sd = shape[j as usize];
                flat += if sd == 1 { 0 } else { coord * stride };
                stride *= sd;
            }
        }
        flat
    };
    for bi in 0..nb {
        let ao = offset(bi, &sa[..ra - 2]) * m * k;
        let bo = offset(bi, &sb[..rb - 2]) * k * n;
        let dst = &mut out[bi * m * n..(bi + 1) * m * n];
        // SAFETY: all slices hold exactly m×k, k×n and m×n row-major elements with the strides
        // given (column stride 1, row stride = row length), and do not overlap.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                av[ao..].as_ptr(),
                1,
                k as isize,
                bv[bo..].as_ptr(),
                1,
                n as isize,
                T::ZERO,
                T::ONE,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
    let mut shape = batch;
    shape.extend([m, n]);
    Ok(TensorData::from_vec(shape, out)?)
}

/// The constants gemm needs, for the two float types.
mod num_zero {
    pub trait Zero: Copy {
        const ZERO: Self;
        const ONE: Self;
    }
    impl Zero for f32 {
        const ZERO: f32 = 0.0;
        const ONE: f32 = 1.0;
    }
    impl Zero for f64 {
        const ZERO: f64 = 0.0;
        const ONE: f64 = 1.0;
    }
}
