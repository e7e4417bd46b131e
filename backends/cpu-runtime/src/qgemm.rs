//! `matmul_integer`: exact i32 sums `(a - a_zp) @ (b - b_zp)` of 8-bit operands (u8 or i8 each),
//! `a[.., M, K]` by a matrix `b[K, N]`.
//!
//! The operands less their zero points widen to i16 (an 8-bit value minus an 8-bit zero point
//! is in `[-255, 255]`), `b` packed in panels of 16 columns with each column's `k`, `k+1` pair
//! adjacent, and pairs of products add into i32 lanes with `vpmaddwd` — exact, unlike
//! `vpmaddubsw`, whose 16-bit pair sums saturate (onnxruntime's U8S8 kernels show it,
//! docs/QUANTIZATION.md). A microkernel keeps 4 rows × 16 columns in AVX2 registers; rows are
//! split over threads. Sums wrap at 32 bits like the reference's.

use crate::par::par_units;
use crate::simd::Simd;
use oar_ir::{DType, TensorType};

/// Columns per packed panel of `b` (two AVX2 registers of i32 sums); also [`crate::qgemm_u8`]'s.
pub(crate) const NR: usize = 16;
/// Rows per microkernel call; also [`crate::qgemm_u8`]'s.
pub(crate) const MR: usize = 4;

/// Whether the runtime computes `matmul_integer` on operands of these types: static shapes,
/// 8-bit `a[.., M, K]` and `b[K, N]`, scalar (or `[1]`) or per-row / per-column zero points.
pub fn supported(types: &[TensorType]) -> bool {
    let Some(dims) = integer_operands(types) else {
        return false;
    };
    let (a, b) = (&dims[0], &dims[1]);
    if a.len() < 2 || b.len() != 2 || a[a.len() - 1] != b[0] {
        return false;
    }
    let m = a[a.len() - 2];
    let zp_ok = |i: usize, len: usize| {
        dims.get(i)
            .is_none_or(|z| z.is_empty() || z.as_slice() == [1] || z.as_slice() == [len])
    };
    zp_ok(2, m) && zp_ok(3, b[1])
}

/// The static shapes of an integer product's operands — two 8-bit operands and up to two zero
/// points — or `None` when they are not that.
pub(crate) fn integer_operands(types: &[TensorType]) -> Option<Vec<Vec<usize>>> {
    let eight = |t: &TensorType| matches!(t.dtype, DType::I8 | DType::U8);
    if !(2..=4).contains(&types.len()) || !eight(&types[0]) || !eight(&types[1]) {
        return None;
    }
    types
        .iter()
        .map(|t| t.shape.0.iter().map(|d| d.as_static()).collect::<Option<Vec<usize>>>())
        .collect()
}

/// One 8-bit operand's values as i32.
fn widen(bytes: &[u8], dtype: DType) -> Vec<i32> {
    match dtype {
        DType::I8 => bytes.iter().map(|&v| v as i8 as i32).collect(),
        _ => bytes.iter().map(|&v| v as i32).collect(),
    }
}

/// `b` (`k` × `n`, 8-bit of `db`) less its zero points (`zb`: one, or one per column) as the
/// i16 pairs the microkernel reads: panel p, pair q, column c → `[b[2q][c], b[2q+1][c]]`, each
/// panel `NR` columns wide (the last one zero-padded).
pub fn pack_b(b: &[u8], db: DType, zb: Option<(&[u8], DType)>, k: usize, n: usize) -> Vec<i16> {
    let zb = zb.map_or_else(|| vec![0], |(v, d)| widen(v, d));
    let kp = k.div_ceil(2);
    let panels = n.div_ceil(NR);
    let mut packed = vec![0i16; panels * kp * NR * 2];
    match db {
        DType::I8 => pack_panels(b, |v| v as i8 as i32, &zb, k, n, &mut packed),
        _ => pack_panels(b, |v| v as i32, &zb, k, n, &mut packed),
    }
    packed
}

/// [`pack_b`]'s loop, written in the packed order (sequential stores; full panels vectorize).
fn pack_panels(b: &[u8], int: impl Fn(u8) -> i32 + Copy, zb: &[i32], k: usize, n: usize, packed: &mut [i16]) {
    let kp = k.div_ceil(2);
    for (p, panel) in packed.chunks_exact_mut(kp * NR * 2).enumerate() {
        let c0 = p * NR;
        let nc = NR.min(n - c0);
        let z = |c: usize| zb[if zb.len() == 1 { 0 } else { c0 + c }];
        for (q, dst) in panel.chunks_exact_mut(NR * 2).enumerate() {
            let r0 = &b[2 * q * n + c0..][..nc];
            if 2 * q + 1 < k {
                let r1 = &b[(2 * q + 1) * n + c0..][..nc];
                if zb.len() == 1 {
                    let z = zb[0];
                    for c in 0..nc {
                        dst[2 * c] = (int(r0[c]) - z) as i16;
                        dst[2 * c + 1] = (int(r1[c]) - z) as i16;
                    }
                } else {
                    for c in 0..nc {
                        dst[2 * c] = (int(r0[c]) - z(c)) as i16;
                        dst[2 * c + 1] = (int(r1[c]) - z(c)) as i16;
                    }
                }
            } else {
                for c in 0..nc {
                    dst[2 * c] = (int(r0[c]) - z(c)) as i16;
                }
            }
        }
    }
}

/// Rows of `a` (`rows` × `k`, 8-bit of `da`) less their zero points (`za`: one, or one per row
/// of the `m`-row matrices `a` stacks) as the i16 pairs the microkernel broadcasts, one `u32`
/// per pair, `rows` rounded up to whole blocks of `MR` (zero rows).
pub fn pair_rows(a: &[u8], da: DType, za: Option<(&[u8], DType)>, (rows, m, k): (usize, usize, usize)) -> Vec<u32> {
    let za = za.map_or_else(|| vec![0], |(v, d)| widen(v, d));
    let kp = k.div_ceil(2);
    let int = |v: u8| if da == DType::I8 { v as i8 as i32 } else { v as i32 };
    let mut pairs = vec![0u32; rows.div_ceil(MR) * MR * kp];
    for r in 0..rows {
        let z = za[if za.len() == 1 { 0 } else { r % m.max(1) }];
        pair_row(&a[r * k..(r + 1) * k], int, z, &mut pairs[r * kp..(r + 1) * kp]);
    }
    pairs
}

/// One row less its zero point `z` as i16 pairs, one `u32` each (`dst`: `row.len() / 2`
/// rounded up; an odd last element pairs with 0).
fn pair_row(row: &[u8], int: impl Fn(u8) -> i32, z: i32, dst: &mut [u32]) {
    let k = row.len();
    for (q, d) in dst.iter_mut().enumerate() {
        let lo = int(row[2 * q]) - z;
        let hi = if 2 * q + 1 < k { int(row[2 * q + 1]) - z } else { 0 };
        *d = (lo as i16 as u16 as u32) | ((hi as i16 as u16 as u32) << 16);
    }
}

/// Rows `r0..r0 + nr` of `tile` into columns `c0..c0 + nc` of the `n`-column i32 matrix at
/// `out`.
///
/// # Safety
/// `out` holds at least `(r0 + nr) · n` i32 (as bytes, any alignment), and no other thread
/// writes those rows' columns meanwhile.
pub(crate) unsafe fn store_tile(
    out: *mut u8,
    tile: &[[i32; NR]; MR],
    (r0, nr): (usize, usize),
    n: usize,
    (c0, nc): (usize, usize),
) {
    for (i, row) in tile.iter().enumerate().take(nr) {
        // Safety: in bounds by the caller's contract; byte copies need no alignment.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr() as *const u8, out.add(((r0 + i) * n + c0) * 4), nc * 4) };
    }
}

/// `c[rows, n]` (i32 as bytes) from `a`'s rows made pairs by [`pair_rows`] and `b` packed by
/// [`pack_b`]; the panels of `b` are split over threads, each multiplied by every block of
/// rows while it is in cache.
#[allow(clippy::too_many_arguments)]
pub fn run_pairs(
    pairs: &[u32],
    rows: usize,
    packed: &[i16],
    k: usize,
    n: usize,
    out: &mut [u8],
    threads: usize,
) -> Result<(), String> {
    let kp = k.div_ceil(2);
    let panels = n.div_ceil(NR);
    let blocks = rows.div_ceil(MR);
    if pairs.len() < blocks * MR * kp || packed.len() < panels * kp * NR * 2 || out.len() != rows * n * 4 {
        return Err(format!(
            "matmul_integer: {} row pairs, {} packed values and {} result bytes for [{rows}, {k}] x [{k}, {n}]",
            pairs.len(),
            packed.len(),
            out.len()
        ));
    }
    let simd = Simd::detect();
    let out_ptr = out.as_mut_ptr() as usize;
    par_units(
        panels,
        threads.max(1),
        || (),
        |_, p| {
            let panel = &packed[p * kp * NR * 2..(p + 1) * kp * NR * 2];
            let c0 = p * NR;
            let nc = NR.min(n - c0);
            let mut tile = [[0i32; NR]; MR];
            for blk in 0..blocks {
                let r0 = blk * MR;
                tile_kernel(simd, &pairs[r0 * kp..(r0 + MR) * kp], kp, panel, &mut tile);
                // Safety: each unit writes its own columns of the output, `rows · n · 4` bytes
                // long (checked above).
                unsafe { store_tile(out_ptr as *mut u8, &tile, (r0, MR.min(rows - r0)), n, (c0, nc)) };
            }
        },
    );
    Ok(())
}

/// [`pack_b`]'s result kept in a step's weight cache (as f32 bits: two i16 per slot).
pub fn pack_b_cached(cache: &crate::contraction::WeightCache, pack: impl FnOnce() -> Vec<i16>) -> &[i16] {
    let slots = cache.get_or_init(|| {
        let p = pack();
        let mut f = vec![0f32; p.len().div_ceil(2)];
        bytemuck::cast_slice_mut::<f32, i16>(&mut f)[..p.len()].copy_from_slice(&p);
        f
    });
    bytemuck::cast_slice(slots)
}

/// `c[rows, n] = (a - za) @ (b - zb)` for `a` (`rows` × `k`, row-major, 8-bit of `da`) and `b`
/// (`k` × `n`, of `db`); `za` per row of the `m`-row matrices `a` stacks (one value: all rows),
/// `zb` per column (or one). `out` receives `rows · n` i32 values as bytes. With `cache`, `b`
/// is packed once into it (`b` and `zb` must not change between calls) and read from it
/// afterwards.
#[allow(clippy::too_many_arguments)]
pub fn run_cached(
    a: &[u8],
    da: DType,
    b: &[u8],
    db: DType,
    za: Option<(&[u8], DType)>,
    zb: Option<(&[u8], DType)>,
    (rows, m, k, n): (usize, usize, usize, usize),
    out: &mut [u8],
    threads: usize,
    cache: Option<&crate::contraction::WeightCache>,
) -> Result<(), String> {
    if b.len() != k * n {
        return Err(format!("matmul_integer: {} operand bytes for b [{k}, {n}]", b.len()));
    }
    let pack = || pack_b(b, db, zb, k, n);
    let owned;
    let packed = match cache {
        Some(c) => pack_b_cached(c, pack),
        None => {
            owned = pack();
            &owned
        }
    };
    run_packed(a, da, za, packed, (rows, m, k, n), out, threads)
}

/// [`run_cached`] with `b` packed by [`pack_b`].
pub fn run_packed(
    a: &[u8],
    da: DType,
    za: Option<(&[u8], DType)>,
    packed: &[i16],
    (rows, m, k, n): (usize, usize, usize, usize),
    out: &mut [u8],
    threads: usize,
) -> Result<(), String> {
    let kp = k.div_ceil(2);
    let panels = n.div_ceil(NR);
    if a.len() != rows * k || packed.len() < panels * kp * NR * 2 || out.len() != rows * n * 4 {
        return Err(format!(
            "matmul_integer: {} + {} operand bytes and {} result bytes for [{rows}, {k}] x [{k}, {n}]",
            a.len(),
            packed.len(),
            out.len()
        ));
    }
    let za = za.map_or_else(|| vec![0], |(v, d)| widen(v, d));
    let simd = Simd::detect();
    let int = |v: u8| if da == DType::I8 { v as i8 as i32 } else { v as i32 };
    let blocks = rows.div_ceil(MR);
    let out_ptr = out.as_mut_ptr() as usize;
    par_units(
        blocks,
        threads.max(1),
        || vec![0u32; MR * kp],
        |pairs, blk| {
            let r0 = blk * MR;
            let nr = MR.min(rows - r0);
            // Each row of the block less its zero point, as i16 pairs packed in a u32.
            for i in 0..MR {
                if i >= nr {
                    pairs[i * kp..(i + 1) * kp].fill(0);
                    continue;
                }
                let r = r0 + i;
                let z = za[if za.len() == 1 { 0 } else { r % m.max(1) }];
                pair_row(&a[r * k..(r + 1) * k], int, z, &mut pairs[i * kp..(i + 1) * kp]);
            }
            let mut tile = [[0i32; NR]; MR];
            for p in 0..panels {
                let panel = &packed[p * kp * NR * 2..(p + 1) * kp * NR * 2];
                tile_kernel(simd, pairs, kp, panel, &mut tile);
                let c0 = p * NR;
                let nc = NR.min(n - c0);
                // Safety: each block writes its own rows of the output, `rows · n · 4` bytes
                // long (checked above); blocks run on one thread each.
                unsafe { store_tile(out_ptr as *mut u8, &tile, (r0, nr), n, (c0, nc)) };
            }
        },
    );
    Ok(())
}

/// `tile[i][c] = Σ_q pairs[i][q] · panel[q][c]` (pairwise i16 products summed in i32).
fn tile_kernel(simd: Simd, pairs: &[u32], kp: usize, panel: &[i16], tile: &mut [[i32; NR]; MR]) {
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Baseline {
        // Safety: AVX2 is present (Avx2Fma and Avx512 both imply it).
        unsafe { tile_avx2(pairs, kp, panel, tile) };
        return;
    }
    let _ = simd;
    for (i, row) in tile.iter_mut().enumerate() {
        row.fill(0);
        for q in 0..kp {
            let w = pairs[i * kp + q];
            let (lo, hi) = (w as u16 as i16 as i32, (w >> 16) as u16 as i16 as i32);
            let col = &panel[q * NR * 2..(q + 1) * NR * 2];
            for (c, acc) in row.iter_mut().enumerate() {
                *acc = acc.wrapping_add(lo * col[2 * c] as i32 + hi * col[2 * c + 1] as i32);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2(pairs: &[u32], kp: usize, panel: &[i16], tile: &mut [[i32; NR]; MR]) {
    use std::arch::x86_64::*;
    assert!(pairs.len() >= MR * kp && panel.len() >= kp * NR * 2);
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    for q in 0..kp {
        // Safety: `panel` holds kp · 32 i16 (asserted); unaligned loads.
        let (b0, b1) = unsafe {
            let p = panel.as_ptr().add(q * NR * 2) as *const __m256i;
            (_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1)))
        };
        for (i, a) in acc.iter_mut().enumerate() {
            let av = _mm256_set1_epi32(pairs[i * kp + q] as i32);
            a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(av, b0));
            a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(av, b1));
        }
    }
    for (row, a) in tile.iter_mut().zip(acc) {
        // Safety: each row holds NR = 16 i32.
        unsafe {
            _mm256_storeu_si256(row.as_mut_ptr() as *mut __m256i, a[0]);
            _mm256_storeu_si256(row.as_mut_ptr().add(8) as *mut __m256i, a[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, in i64.
    fn naive(a: &[i32], b: &[i32], za: &[i32], zb: &[i32], (rows, m, k, n): (usize, usize, usize, usize)) -> Vec<i32> {
        let mut c = vec![0i32; rows * n];
        for r in 0..rows {
            for j in 0..n {
                let z_a = za[if za.len() == 1 { 0 } else { r % m }] as i64;
                let z_b = zb[if zb.len() == 1 { 0 } else { j }] as i64;
                let s: i64 = (0..k)
                    .map(|kk| (a[r * k + kk] as i64 - z_a) * (b[kk * n + j] as i64 - z_b))
                    .sum();
                c[r * n + j] = s as i32;
            }
        }
        c
    }

    fn ints(bytes: &[u8]) -> Vec<i32> {
        bytes
            .chunks_exact(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn matches_the_definition_for_every_operand_type_and_ragged_shapes() {
        let mut seed = 0x1234_5678u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        };
        // Extreme values included: 255·(−128) products, which vpmaddubsw would saturate.
        for (da, db) in [
            (DType::U8, DType::I8),
            (DType::I8, DType::I8),
            (DType::U8, DType::U8),
            (DType::I8, DType::U8),
        ] {
            for (rows, m, k, n) in [
                (5, 5, 33, 7),
                (8, 4, 64, 16),
                (1, 1, 1, 1),
                (6, 3, 9, 35),
                (13, 13, 130, 17),
            ] {
                let mut a: Vec<u8> = (0..rows * k).map(|_| next()).collect();
                let mut b: Vec<u8> = (0..k * n).map(|_| next()).collect();
                a[0] = 255;
                b[0] = 128;
                let za: Vec<u8> = (0..m).map(|_| next()).collect();
                let zb: Vec<u8> = (0..n).map(|_| next()).collect();
                let want = naive(
                    &widen(&a, da),
                    &widen(&b, db),
                    &widen(&za, da),
                    &widen(&zb, db),
                    (rows, m, k, n),
                );
                let mut out = vec![0u8; rows * n * 4];
                run_cached(
                    &a,
                    da,
                    &b,
                    db,
                    Some((&za, da)),
                    Some((&zb, db)),
                    (rows, m, k, n),
                    &mut out,
                    2,
                    None,
                )
                .unwrap();
                assert_eq!(ints(&out), want, "{da} x {db} [{rows}, {k}] x [{k}, {n}]");
                // Scalar zero points and none.
                let want = naive(&widen(&a, da), &widen(&b, db), &[0], &[0], (rows, m, k, n));
                run_cached(&a, da, &b, db, None, None, (rows, m, k, n), &mut out, 1, None).unwrap();
                assert_eq!(ints(&out), want);
            }
        }
    }
}
