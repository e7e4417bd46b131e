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

fn typed<T: Float>(a: &TensorData, b: &TensorData) -> Result<TensorData> {
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
        gemm_into(dst, &av[ao..ao + m * k], &bv[bo..bo + k * n], m, k, n);
    }
    let mut shape = batch;
    shape.extend([m, n]);
    Ok(TensorData::from_vec(shape, out)?)
}

/// A float type the gemm kernels handle.
pub(crate) trait Float: Element + Default {
    /// 0
    const ZERO: Self;
    /// 1
    const ONE: Self;
}

impl Float for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
}

impl Float for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
}

/// `dst[m×n] = a[m×k] · b[k×n]`, all row-major and contiguous.
pub(crate) fn gemm_into<T: Float>(dst: &mut [T], a: &[T], b: &[T], m: usize, k: usize, n: usize) {
    assert!(
        dst.len() == m * n && a.len() == m * k && b.len() == k * n,
        "gemm_into: slice sizes"
    );
    // Threads pay off only for large products (gemm splits the work itself).
    let parallelism = if m * n * k >= 1 << 18 {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the assert above guarantees each slice holds exactly its row-major matrix with
    // the strides given (column stride 1, row stride = row length); `dst` is a distinct
    // `&mut` borrow, so it overlaps neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            T::ZERO,
            T::ONE,
            false,
            false,
            false,
            parallelism,
        );
    }
}
