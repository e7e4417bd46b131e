//! Zero-copy views. Eager `reshape`, `transpose`/permute, `slice` and `expand`/broadcast of a
//! host tensor make a [`View`]: the source's bytes (shared, not copied), a shape, strides in
//! elements (0 along expanded axes) and an offset — O(rank) work whatever the size, as in
//! PyTorch. A kernel that reads a view gets its elements [`materialize`](View::materialize)d
//! (a strided copy, blocked for transposes, split across threads when large; the view stays a
//! view, as in PyTorch — `Tensor::contiguous` keeps a copy), and a chain of views composes
//! without touching elements. A view of a contiguous value that covers it in order is the value itself
//! reshaped (no view at all).
//!
//! Values stay values: bytes shared by a view and its source are copied before either is
//! written in place (as every shared host value is, see `Tensor::with_host_data_mut`), so a
//! write never shows through a view — unlike PyTorch, where views alias their base.

use oar_ir::ops::{Broadcast, Permute, Reshape, Slice};
use oar_ir::{DType, Op, TensorData};

/// Elements from which a strided copy is split across threads.
const PAR_MIN_ELEMS: usize = 1 << 18;

/// A strided window on a host value's bytes.
#[derive(Clone)]
pub(crate) struct View {
    base: TensorData,
    shape: Vec<usize>,
    /// In elements, one per axis; 0 along broadcast axes.
    strides: Vec<usize>,
    /// In elements.
    offset: usize,
}

/// Row-major strides of `shape`, in elements.
fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

impl View {
    /// `d` as a view of itself.
    pub(crate) fn of(d: &TensorData) -> View {
        View {
            strides: contiguous_strides(d.shape()),
            shape: d.shape().to_vec(),
            base: d.clone(),
            offset: 0,
        }
    }

    pub(crate) fn dtype(&self) -> DType {
        self.base.dtype()
    }

    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether this view reads its base's bytes in order, from the first, all of them: it is
    /// the base reshaped.
    fn is_whole_base(&self) -> bool {
        self.offset == 0 && self.numel() == self.base.len() && self.is_dense()
    }

    /// Whether the elements are consecutive in row-major order (size-1 axes' strides ignored).
    pub(crate) fn is_dense(&self) -> bool {
        let mut expect = 1;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expect {
                return false;
            }
            expect *= n;
        }
        true
    }

    /// Whether `self` and `other` read the same bytes (not a copy of them).
    #[cfg(test)]
    fn shares_bytes(&self, other: &TensorData) -> bool {
        std::ptr::eq(self.base.bytes().as_ptr(), other.bytes().as_ptr()) && !other.bytes().is_empty()
    }

    pub(crate) fn base(&self) -> &TensorData {
        &self.base
    }

    /// The storage holding this view: the base itself, reshaped, when the view reads it
    /// whole and in order; else the view.
    pub(crate) fn into_storage(self) -> super::Storage {
        if self.is_whole_base()
            && let Ok(d) = self.base.reshaped(self.shape.clone())
        {
            return super::Storage::Host(d);
        }
        super::Storage::View(self)
    }

    /// The elements as a dense value (the base itself, reshaped, when it reads it in order).
    pub(crate) fn materialize(&self) -> TensorData {
        if self.is_whole_base() {
            // The base has this many elements, so the reshape cannot fail.
            if let Ok(d) = self.base.reshaped(self.shape.clone()) {
                return d;
            }
        }
        let size = self.dtype().size_bytes();
        let mut out = vec![0u8; self.numel() * size];
        if !out.is_empty() {
            let (shape, strides) = coalesce(&self.shape, &self.strides);
            copy_strided(self.base.bytes(), self.offset, &shape, &strides, size, &mut out);
        }
        TensorData::from_bytes(self.dtype(), self.shape.clone(), out)
            .expect("a view's element count times its dtype's size is its byte length")
    }

    /// The view of this one that `op` (reshape, permute, slice or broadcast) makes, with
    /// result shape `out` (the op's inferred type); `None` for other ops, and for a reshape
    /// that strides cannot express (then the caller copies, as PyTorch's `reshape` does).
    pub(crate) fn apply(&self, op: &Op, out: &[usize]) -> Option<View> {
        let v = match op {
            Op::Reshape(Reshape { .. }) => self.reshape(out)?,
            Op::Permute(Permute { perm }) => {
                if perm.len() != self.shape.len() || perm.iter().any(|&p| p >= self.shape.len()) {
                    return None;
                }
                View {
                    base: self.base.clone(),
                    shape: perm.iter().map(|&p| self.shape[p]).collect(),
                    strides: perm.iter().map(|&p| self.strides[p]).collect(),
                    offset: self.offset,
                }
            }
            Op::Slice(Slice { ranges }) => {
                if ranges.len() != self.shape.len() {
                    return None;
                }
                let mut v = self.clone();
                for (axis, r) in ranges.iter().enumerate() {
                    let (start, n) = r.resolve(self.shape[axis]);
                    if n > 0 {
                        v.offset += start * self.strides[axis];
                    }
                    v.shape[axis] = n;
                    v.strides[axis] = self.strides[axis] * r.step.max(1) as usize;
                }
                v
            }
            Op::Broadcast(Broadcast { .. }) => {
                let lead = out.len().checked_sub(self.shape.len())?;
                let mut strides = vec![0; out.len()];
                for (i, (&n, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
                    strides[lead + i] = match (n, out[lead + i]) {
                        (a, b) if a == b => s,
                        (1, _) => 0,
                        _ => return None,
                    };
                }
                View {
                    base: self.base.clone(),
                    shape: out.to_vec(),
                    strides,
                    offset: self.offset,
                }
            }
            _ => return None,
        };
        (v.shape == out).then_some(v)
    }

    /// The view with shape `new` reading the same elements in the same row-major order, when
    /// strides can express it (PyTorch's `computeStride`): each run of axes that are
    /// contiguous among themselves must map onto whole new axes.
    fn reshape(&self, new: &[usize]) -> Option<View> {
        let numel = self.numel();
        if new.iter().product::<usize>() != numel {
            return None;
        }
        let view = |strides| View {
            base: self.base.clone(),
            shape: new.to_vec(),
            strides,
            offset: self.offset,
        };
        if numel == 0 || self.is_dense() {
            return Some(view(contiguous_strides(new)));
        }
        let (old, old_strides) = (&self.shape, &self.strides);
        let mut strides = vec![0; new.len()];
        let mut view_d = new.len();
        let mut chunk_base = *old_strides.last()?;
        let (mut tensor_numel, mut view_numel) = (1, 1);
        for d in (0..old.len()).rev() {
            tensor_numel *= old[d];
            if d == 0 || (old[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base) {
                while view_d > 0 && (view_numel < tensor_numel || new[view_d - 1] == 1) {
                    strides[view_d - 1] = view_numel * chunk_base;
                    view_numel *= new[view_d - 1];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if d > 0 {
                    chunk_base = old_strides[d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        (view_d == 0).then(|| view(strides))
    }
}

/// `shape`/`strides` without size-1 axes and with each pair of axes that one stride walks
/// merged (a 4-d contiguous slab becomes one axis), so the copy loops run as long as possible.
fn coalesce(shape: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: Vec<usize> = Vec::with_capacity(shape.len());
    for (&n, &s) in shape.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        match (out_shape.last_mut(), out_strides.last_mut()) {
            (Some(pn), Some(ps)) if *ps == s * n => {
                *pn *= n;
                *ps = s;
            }
            _ => {
                out_shape.push(n);
                out_strides.push(s);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        out_strides.push(1);
    }
    (out_shape, out_strides)
}

/// Copy the elements of `src` at `offset + Σ index·stride` into `out` in row-major order of
/// `shape` (elements of `size` bytes; `out` holds exactly the shape's elements).
fn copy_strided(src: &[u8], offset: usize, shape: &[usize], strides: &[usize], size: usize, out: &mut [u8]) {
    match size {
        1 => copy_typed::<u8>(src, offset, shape, strides, out),
        2 => copy_typed::<u16>(src, offset, shape, strides, out),
        4 => copy_typed::<u32>(src, offset, shape, strides, out),
        8 => copy_typed::<u64>(src, offset, shape, strides, out),
        _ => unreachable!("element sizes are 1, 2, 4 or 8 bytes"),
    }
}

fn copy_typed<T: Elem>(src: &[u8], offset: usize, shape: &[usize], strides: &[usize], out: &mut [u8]) {
    // Host buffers are allocated for their element type's alignment in practice; a misaligned
    // one (never seen) takes the byte path.
    let (Ok(src), Ok(out)) = (
        bytemuck::try_cast_slice::<u8, T>(src),
        bytemuck::try_cast_slice_mut::<u8, T>(out),
    ) else {
        return copy_bytes(src, offset, shape, strides, size_of::<T>(), out);
    };
    let rank = shape.len();
    // The last two axes are copied as a tile (blocked when they are transposed); the axes
    // before them are an odometer over `outer` tiles.
    let (rows, cols) = if rank >= 2 {
        (shape[rank - 2], shape[rank - 1])
    } else {
        (1, shape[0])
    };
    let (rs, cs) = if rank >= 2 {
        (strides[rank - 2], strides[rank - 1])
    } else {
        (0, strides[0])
    };
    let tile = rows * cols;
    let outer_shape = &shape[..rank.saturating_sub(2)];
    let outer_strides = &strides[..rank.saturating_sub(2)];
    let tile_offset = |mut t: usize| {
        let mut off = offset;
        for (&n, &s) in outer_shape.iter().zip(outer_strides).rev() {
            off += (t % n) * s;
            t /= n;
        }
        off
    };
    let tile_at = |t: usize, dst: &mut [T]| copy_tile(src, tile_offset(t), rows, cols, rs, cs, dst);
    let threads = rayon::current_num_threads();
    if out.len() >= PAR_MIN_ELEMS && threads > 1 && out.len() / tile >= 2 {
        use rayon::prelude::*;
        out.par_chunks_mut(tile)
            .enumerate()
            .for_each(|(t, dst)| tile_at(t, dst));
    } else if out.len() >= PAR_MIN_ELEMS && threads > 1 {
        // One big tile: split its rows.
        use rayon::prelude::*;
        let band = rows.div_ceil(threads * 4).max(1);
        out.par_chunks_mut(band * cols).enumerate().for_each(|(b, dst)| {
            let r0 = b * band;
            copy_tile(src, offset + r0 * rs, dst.len() / cols, cols, rs, cs, dst)
        });
    } else {
        for (t, dst) in out.chunks_mut(tile).enumerate() {
            tile_at(t, dst);
        }
    }
}

/// An element type the strided copy moves (by its bits).
trait Elem: bytemuck::Pod + Send + Sync {
    /// The tile `dst[r][c] = src[off + r + c·cs]` by a vector kernel, where there is one for this
    /// element size and host; `false`: none (the scalar loops run).
    fn copy_transposed(_src: &[Self], _off: usize, _rows: usize, _cols: usize, _cs: usize, _dst: &mut [Self]) -> bool {
        false
    }
}

impl Elem for u8 {}
impl Elem for u16 {}
impl Elem for u64 {}
impl Elem for u32 {
    fn copy_transposed(src: &[u32], off: usize, rows: usize, cols: usize, cs: usize, dst: &mut [u32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            // Safety: AVX was detected.
            unsafe { transpose_u32(src, off, rows, cols, cs, dst) };
            return true;
        }
        let _ = (src, off, rows, cols, cs, dst);
        false
    }
}

/// `dst[r][c] = src[off + r + c·cs]` (rows × cols, `dst` row-major) in 8 × 8 blocks transposed in
/// AVX registers; the edges element by element. Every index is checked (slices).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_u32(src: &[u32], off: usize, rows: usize, cols: usize, cs: usize, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    let (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
    for r0 in (0..r8).step_by(8) {
        for c0 in (0..c8).step_by(8) {
            // Input row i: the 8 elements src[off + (c0 + i)·cs + r0 ..][..8].
            let load = |i: usize| {
                let s = off + (c0 + i) * cs + r0;
                let v: &[u32; 8] = src[s..s + 8].try_into().expect("8 elements");
                // Safety: `v` is 8 readable u32s; AVX is enabled on this function.
                unsafe { _mm256_loadu_ps(v.as_ptr().cast()) }
            };
            let (a0, a1, a2, a3) = (load(0), load(1), load(2), load(3));
            let (a4, a5, a6, a7) = (load(4), load(5), load(6), load(7));
            let (t0, t1) = (_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
            let (t2, t3) = (_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
            let (t4, t5) = (_mm256_unpacklo_ps(a4, a5), _mm256_unpackhi_ps(a4, a5));
            let (t6, t7) = (_mm256_unpacklo_ps(a6, a7), _mm256_unpackhi_ps(a6, a7));
            let (u0, u1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
            let (u2, u3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
            let (u4, u5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
            let (u6, u7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
            let out = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (j, v) in out.into_iter().enumerate() {
                let d = (r0 + j) * cols + c0;
                let o: &mut [u32; 8] = (&mut dst[d..d + 8]).try_into().expect("8 elements");
                // Safety: `o` is 8 writable u32s.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().cast(), v) };
            }
        }
    }
    for r in 0..rows {
        let cs_from = if r < r8 { c8 } else { 0 };
        for c in cs_from..cols {
            dst[r * cols + c] = src[off + r + c * cs];
        }
    }
}

/// Rows × cols elements at `src[off + r·rs + c·cs]` into `dst` in row-major order.
fn copy_tile<T: Elem>(src: &[T], off: usize, rows: usize, cols: usize, rs: usize, cs: usize, dst: &mut [T]) {
    const B: usize = 8;
    if rs == 1 && cs > 1 && T::copy_transposed(src, off, rows, cols, cs, dst) {
        return;
    }
    if cs == 1 {
        for (r, d) in dst.chunks_exact_mut(cols).enumerate() {
            let s = off + r * rs;
            d.copy_from_slice(&src[s..s + cols]);
        }
    } else if cs == 0 {
        for (r, d) in dst.chunks_exact_mut(cols).enumerate() {
            d.fill(src[off + r * rs]);
        }
    } else if rs == 1 || rs < cs {
        // Transposed (the row axis walks memory faster): blocks of B × B keep both sides'
        // lines in cache.
        for r0 in (0..rows).step_by(B) {
            for c0 in (0..cols).step_by(B) {
                for r in r0..(r0 + B).min(rows) {
                    let d = &mut dst[r * cols..(r + 1) * cols];
                    let s = off + r * rs;
                    for c in c0..(c0 + B).min(cols) {
                        d[c] = src[s + c * cs];
                    }
                }
            }
        }
    } else {
        for (r, d) in dst.chunks_exact_mut(cols).enumerate() {
            let s = off + r * rs;
            for (c, x) in d.iter_mut().enumerate() {
                *x = src[s + c * cs];
            }
        }
    }
}

/// [`copy_typed`] element by element through bytes (a misaligned buffer).
fn copy_bytes(src: &[u8], offset: usize, shape: &[usize], strides: &[usize], size: usize, out: &mut [u8]) {
    let mut index = vec![0usize; shape.len()];
    for dst in out.chunks_exact_mut(size) {
        let e = offset + index.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
        dst.copy_from_slice(&src[e * size..(e + 1) * size]);
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::ops::SliceRange;
    use oar_ir::{Dim, TensorData};

    fn iota(shape: &[usize]) -> TensorData {
        let n = shape.iter().product::<usize>();
        TensorData::from_vec(shape.to_vec(), (0..n).map(|i| i as f32).collect()).unwrap()
    }

    /// The element of `v` at `index`, read through its strides.
    fn at(v: &View, index: &[usize]) -> f32 {
        let e = v.offset + index.iter().zip(&v.strides).map(|(i, s)| i * s).sum::<usize>();
        v.base.to_vec::<f32>().unwrap()[e]
    }

    fn dims(s: &[usize]) -> Vec<Dim> {
        s.iter().map(|&n| Dim::Static(n)).collect()
    }

    #[test]
    fn a_transpose_slice_and_expand_compose_without_copying_and_materialize_by_hand() {
        let x = iota(&[4, 6]);
        let t = View::of(&x)
            .apply(&Op::Permute(Permute { perm: vec![1, 0] }), &[6, 4])
            .unwrap();
        assert!(t.shares_bytes(&x));
        assert_eq!(t.strides, vec![1, 6]);
        // t[1..5:2, 1..] : rows 1 and 3 of the transpose, columns 1..4.
        let s = t
            .apply(
                &Op::Slice(Slice {
                    ranges: vec![
                        SliceRange {
                            start: 1,
                            end: 5,
                            step: 2,
                        },
                        SliceRange::new(1, i64::MAX),
                    ],
                }),
                &[2, 3],
            )
            .unwrap();
        let e = s
            .apply(
                &Op::Broadcast(Broadcast {
                    shape: dims(&[5, 2, 3]),
                }),
                &[5, 2, 3],
            )
            .unwrap();
        assert!(e.shares_bytes(&x));
        assert_eq!(e.strides[0], 0);
        let m = e.materialize().to_vec::<f32>().unwrap();
        // x[i][j] = 6i + j; t[r][c] = x[c][r]; s[a][b] = t[1 + 2a][1 + b] = 6(1 + b) + 1 + 2a.
        let mut want = Vec::new();
        for _ in 0..5 {
            for a in 0..2 {
                for b in 0..3 {
                    want.push((6 * (1 + b) + 1 + 2 * a) as f32);
                }
            }
        }
        assert_eq!(m, want);
    }

    #[test]
    fn reshape_keeps_a_view_when_strides_allow_and_declines_when_they_do_not() {
        let x = iota(&[2, 3, 4]);
        let reshape = |v: &View, s: &[usize]| v.apply(&Op::Reshape(Reshape { shape: dims(s) }), s);
        // Slice on axis 2 then merge axes 0 and 1: expressible.
        let s = View::of(&x)
            .apply(
                &Op::Slice(Slice {
                    ranges: vec![SliceRange::FULL, SliceRange::FULL, SliceRange::new(1, 3)],
                }),
                &[2, 3, 2],
            )
            .unwrap();
        let r = reshape(&s, &[6, 2]).unwrap();
        assert_eq!(r.strides, vec![4, 1]);
        for i in 0..6 {
            for j in 0..2 {
                assert_eq!(at(&r, &[i, j]), (4 * i + 1 + j) as f32);
            }
        }
        // Merging the sliced axis with its neighbour is not: the caller copies.
        assert!(reshape(&s, &[2, 6]).is_none());
        // A transpose splits and regroups only along its own runs.
        let t = View::of(&x)
            .apply(&Op::Permute(Permute { perm: vec![2, 0, 1] }), &[4, 2, 3])
            .unwrap();
        let r = reshape(&t, &[4, 6]).unwrap();
        assert_eq!(r.strides, vec![1, 4]);
        assert_eq!(
            reshape(&t, &[4, 6, 1]).unwrap().materialize(),
            t.materialize().reshaped(vec![4, 6, 1]).unwrap()
        );
        assert!(reshape(&t, &[8, 3]).is_none());
    }

    #[test]
    fn materialize_matches_an_index_walk_for_every_element_size_and_large_tiles() {
        for dtype in [DType::U8, DType::F16, DType::F32, DType::F64] {
            let n = 300 * 260;
            let vals: Vec<f64> = (0..n).map(|i| (i % 251) as f64).collect();
            let x = TensorData::from_f64_slice(dtype, vec![300, 260], &vals).unwrap();
            let t = View::of(&x)
                .apply(&Op::Permute(Permute { perm: vec![1, 0] }), &[260, 300])
                .unwrap();
            let got = t.materialize().to_f64_vec();
            for r in 0..260 {
                for c in 0..300 {
                    assert_eq!(got[r * 300 + c], vals[c * 260 + r], "{dtype} at {r},{c}");
                }
            }
        }
        // One tile large enough that its rows are split across threads (when there are
        // several), edges included (neither side a multiple of 8).
        let x = iota(&[523, 601]);
        let t = View::of(&x)
            .apply(&Op::Permute(Permute { perm: vec![1, 0] }), &[601, 523])
            .unwrap();
        let got = t.materialize().to_vec::<f32>().unwrap();
        for r in 0..601 {
            for c in 0..523 {
                assert_eq!(got[r * 523 + c], (c * 601 + r) as f32, "at {r},{c}");
            }
        }
        // Many tiles, split across threads.
        let x = iota(&[3, 512, 512]);
        let t = View::of(&x)
            .apply(&Op::Permute(Permute { perm: vec![0, 2, 1] }), &[3, 512, 512])
            .unwrap();
        let got = t.materialize().to_vec::<f32>().unwrap();
        let xs = x.to_vec::<f32>().unwrap();
        for b in 0..3 {
            for i in (0..512).step_by(37) {
                for j in 0..512 {
                    assert_eq!(got[b * 512 * 512 + i * 512 + j], xs[b * 512 * 512 + j * 512 + i]);
                }
            }
        }
    }

    #[test]
    fn a_view_that_reads_its_whole_base_in_order_is_the_base() {
        let x = iota(&[2, 3]);
        let r = View::of(&x)
            .apply(&Op::Reshape(Reshape { shape: dims(&[3, 2]) }), &[3, 2])
            .unwrap();
        let m = r.materialize();
        assert_eq!(m.shape(), &[3, 2]);
        assert!(std::ptr::eq(m.bytes().as_ptr(), x.bytes().as_ptr()));
        // An empty slice has no elements to read.
        let e = View::of(&x)
            .apply(
                &Op::Slice(Slice {
                    ranges: vec![SliceRange::new(2, 2), SliceRange::FULL],
                }),
                &[0, 3],
            )
            .unwrap();
        assert_eq!(e.materialize().len(), 0);
    }
}
