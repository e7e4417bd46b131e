//! In-place gradient accumulation for the tape: `acc += g`, and `acc[window] += g` for the
//! gradient of a slice (so a slice's gradient never becomes a zero-padded copy of its input).
//! f32 and f64 on the host; anything else is left to the caller's general path.

use oar_ir::{DType, TensorData};
use rayon::prelude::*;

/// Elements above which an accumulation is shared across threads.
const PARALLEL_MIN: usize = 1 << 18;
/// Elements per parallel chunk.
const CHUNK: usize = 1 << 15;

/// Whether `acc` can take in-place accumulations of `g` here (same float dtype).
pub(crate) fn supported(acc: DType, g: DType) -> bool {
    acc == g && matches!(acc, DType::F32 | DType::F64)
}

/// `acc += g` element-wise (same dtype and element count). False (nothing changed) for a
/// dtype other than f32/f64, a size mismatch, or misaligned bytes.
pub(crate) fn add_in_place(acc: &mut TensorData, g: &TensorData) -> bool {
    if !supported(acc.dtype(), g.dtype()) || acc.len() != g.len() {
        return false;
    }
    fn run<T: bytemuck::Pod + Send + Sync + std::ops::AddAssign>(a: &mut [u8], b: &[u8]) -> bool {
        let (Ok(a), Ok(b)) = (
            bytemuck::try_cast_slice_mut::<u8, T>(a),
            bytemuck::try_cast_slice::<u8, T>(b),
        ) else {
            return false;
        };
        let add = |(a, b): (&mut [T], &[T])| a.iter_mut().zip(b).for_each(|(a, b)| *a += *b);
        if a.len() >= PARALLEL_MIN && rayon::current_num_threads() > 1 {
            a.par_chunks_mut(CHUNK).zip(b.par_chunks(CHUNK)).for_each(add);
        } else {
            add((a, b));
        }
        true
    }
    let dtype = acc.dtype();
    let b = g.bytes();
    let a = acc.bytes_mut();
    match dtype {
        DType::F32 => run::<f32>(a, b),
        _ => run::<f64>(a, b),
    }
}

/// `acc[window] += g`, where the window takes, on each axis `k` of `acc`, `g.shape()[k]`
/// elements from `start[k]` with stride `step[k]` (a resolved slice). False (nothing changed)
/// when the dtypes are unsupported, the ranks differ, or the window does not fit.
pub(crate) fn add_into_window(acc: &mut TensorData, start: &[usize], step: &[usize], g: &TensorData) -> bool {
    let dims = acc.shape().to_vec();
    let counts = g.shape().to_vec();
    let rank = dims.len();
    if !supported(acc.dtype(), g.dtype())
        || counts.len() != rank
        || start.len() != rank
        || step.len() != rank
        || (0..rank).any(|k| counts[k] > 0 && start[k] + (counts[k] - 1) * step[k] >= dims[k])
    {
        return false;
    }
    if g.is_empty() {
        return true;
    }
    // Element strides of `acc`, and the offset of the window's first element.
    let mut strides = vec![1usize; rank];
    for k in (0..rank.saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * dims[k + 1];
    }
    let base: usize = (0..rank).map(|k| start[k] * strides[k]).sum();
    fn run<T: bytemuck::Pod + std::ops::AddAssign>(
        a: &mut [u8],
        b: &[u8],
        counts: &[usize],
        strides: &[usize],
        step: &[usize],
        base: usize,
    ) -> bool {
        let (Ok(a), Ok(b)) = (
            bytemuck::try_cast_slice_mut::<u8, T>(a),
            bytemuck::try_cast_slice::<u8, T>(b),
        ) else {
            return false;
        };
        let rank = counts.len();
        let (inner, inner_stride) = match rank {
            0 => (1, 1),
            _ => (counts[rank - 1], strides[rank - 1] * step[rank - 1]),
        };
        let outer = rank.saturating_sub(1);
        let mut idx = vec![0usize; outer];
        for row in b.chunks_exact(inner) {
            let off = base + (0..outer).map(|k| idx[k] * strides[k] * step[k]).sum::<usize>();
            if inner_stride == 1 {
                a[off..off + inner].iter_mut().zip(row).for_each(|(a, b)| *a += *b);
            } else {
                for (j, v) in row.iter().enumerate() {
                    a[off + j * inner_stride] += *v;
                }
            }
            // Next row of the window (odometer over the outer axes).
            for k in (0..outer).rev() {
                idx[k] += 1;
                if idx[k] < counts[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        true
    }
    let dtype = acc.dtype();
    let b = g.bytes();
    let a = acc.bytes_mut();
    match dtype {
        DType::F32 => run::<f32>(a, b, &counts, &strides, step, base),
        _ => run::<f64>(a, b, &counts, &strides, step, base),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_add_matches_a_hand_computed_strided_slice() {
        // acc [3, 5] of zeros; g [2, 2] added at rows 0 and 2, columns 1 and 4 (steps 2, 3).
        let mut acc = TensorData::full(DType::F32, vec![3, 5], 0.0).unwrap();
        let g = TensorData::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        assert!(add_into_window(&mut acc, &[0, 1], &[2, 3], &g));
        assert!(add_into_window(&mut acc, &[0, 1], &[2, 3], &g));
        let want = [
            0.0, 2.0, 0.0, 0.0, 4.0, //
            0.0, 0.0, 0.0, 0.0, 0.0, //
            0.0, 6.0, 0.0, 0.0, 8.0,
        ];
        assert_eq!(acc.to_vec::<f32>().unwrap(), want);
        // A window past the end changes nothing and says so.
        assert!(!add_into_window(&mut acc, &[2, 1], &[2, 3], &g));
        assert_eq!(acc.to_vec::<f32>().unwrap(), want);
    }

    #[test]
    fn in_place_add_copies_shared_bytes_first() {
        let a = TensorData::from_vec(vec![3], vec![1.0f64, 2.0, 3.0]).unwrap();
        let mut acc = a.clone();
        assert!(add_in_place(&mut acc, &a));
        assert_eq!(acc.to_vec::<f64>().unwrap(), [2.0, 4.0, 6.0]);
        assert_eq!(
            a.to_vec::<f64>().unwrap(),
            [1.0, 2.0, 3.0],
            "the shared value is unchanged"
        );
        let ints = TensorData::from_vec(vec![1], vec![1i32]).unwrap();
        assert!(!add_in_place(&mut ints.clone(), &ints));
    }
}
