//! Integer products on `vpmaddubsw`: exact i32 sums `w' @ x` of weight rows `w'` (the weights
//! less their zero points) by 8-bit columns `x`, where every `|w'| ≤ 64` (7-bit weights, as
//! `reduce_range` quantization makes them).
//!
//! `vpmaddubsw` multiplies unsigned bytes by signed bytes and adds adjacent pairs into i16 with
//! saturation; with `x ≤ 255` and `|w'| ≤ 64` a pair sum is at most `2 · 255 · 64 = 32640`, so
//! it never saturates and the products are exact. `vpmaddwd` by ones then adds pairs of pairs
//! into i32: each i32 lane is the sum over 4 consecutive `k` of one column — twice the
//! products per instruction of [`crate::qgemm`]'s i16 pairs, on half the bytes.
//!
//! Signed (i8) columns become unsigned by flipping their top bit (`x + 128`); the columns' zero
//! point is subtracted as `z · Σ_k w'` per row afterwards, so `w' @ (x - z)` is exact too. The
//! weights are packed once (kept in a weight cache when constant), as 4-byte quads broadcast
//! by the microkernel; the columns in panels of [`NR`] with each column's 4 `k` adjacent.

use crate::par::par_units;
use crate::qgemm::{MR, NR, store_tile};

/// The largest `|w'|` whose products with bytes cannot saturate a `vpmaddubsw` pair sum.
pub const MAX_WEIGHT: i32 = 64;

/// Weight rows as the microkernel reads them: per row, `k` rounded up to 4 in quads of i8 (one
/// `u32` each), `rows` rounded up to whole blocks of [`MR`] (zero rows), and each row's sum.
pub struct Quads {
    quads: Vec<u32>,
    sums: Vec<i32>,
    rows: usize,
    k: usize,
}

impl Quads {
    /// `w'` (`rows` × `k` values, row-major) as quads, or `None` when some `|w'|` exceeds
    /// [`MAX_WEIGHT`].
    pub fn new(w: impl Fn(usize, usize) -> i32, rows: usize, k: usize) -> Option<Quads> {
        let kq = k.div_ceil(4);
        let mut quads = vec![0u32; rows.div_ceil(MR) * MR * kq];
        let mut sums = vec![0i32; rows];
        for r in 0..rows {
            for q in 0..kq {
                let mut word = 0u32;
                for j in 0..4.min(k - 4 * q) {
                    let v = w(r, 4 * q + j);
                    if v.abs() > MAX_WEIGHT {
                        return None;
                    }
                    sums[r] += v;
                    word |= (v as i8 as u8 as u32) << (8 * j);
                }
                quads[r * kq + q] = word;
            }
        }
        Some(Quads { quads, sums, rows, k })
    }

    /// As `u32` words (for a weight cache): rows, k, the sums, the quads.
    pub fn to_words(&self) -> Vec<u32> {
        let mut v = vec![self.rows as u32, self.k as u32];
        v.extend(self.sums.iter().map(|&s| s as u32));
        v.extend_from_slice(&self.quads);
        v
    }

    /// [`Quads::to_words`]'s inverse, borrowing them; `None` when they are not that.
    pub fn view(words: &[u32]) -> Option<QuadsView<'_>> {
        let (&rows, rest) = words.split_first()?;
        let (&k, rest) = rest.split_first()?;
        let (rows, k) = (rows as usize, k as usize);
        let sums = rest.get(..rows)?;
        let quads = &rest[rows..];
        (quads.len() == rows.div_ceil(MR) * MR * k.div_ceil(4)).then_some(QuadsView {
            sums: bytemuck::cast_slice(sums),
            quads,
            rows,
            k,
        })
    }
}

/// Borrowed [`Quads`].
#[derive(Clone, Copy)]
pub struct QuadsView<'a> {
    sums: &'a [i32],
    quads: &'a [u32],
    rows: usize,
    k: usize,
}

/// The `k` × `n` byte matrix whose row `r` `row(r, dst)` writes (`n` bytes; i8 when `signed`,
/// its top bit then flipped) packed in panels of [`NR`] columns, quad `q` of column `c` at
/// `(q · NR + c) · 4` in its panel (`k` rounded up to 4 with rows whose weights are zero, the
/// last panel's missing columns zero), into `packed` (resized; its old contents are overwritten), four rows at a time on `threads` threads: each
/// quad of rows is made in a small buffer and interleaved from it while it is in L1, so a
/// convolution's patches (im2col) need not be stored whole.
pub fn pack_rows(
    k: usize,
    n: usize,
    signed: bool,
    threads: usize,
    packed: &mut Vec<u8>,
    row: impl Fn(usize, &mut [u8]) + Sync,
) {
    let kq = k.div_ceil(4);
    let panels = n.div_ceil(NR);
    packed.resize(panels * kq * NR * 4, 0);
    if n == 0 {
        return;
    }
    let flip = if signed { 0x80 } else { 0 };
    let dst_ptr = packed.as_mut_ptr() as usize;
    par_units(
        kq,
        threads.max(1),
        || vec![0u8; 4 * n],
        |rows4, q| {
            let nrows = 4.min(k - 4 * q);
            for (j, r) in rows4.chunks_exact_mut(n).enumerate() {
                if j < nrows {
                    row(4 * q + j, r);
                } else {
                    r.fill(0);
                }
            }
            let r = |j: usize| &rows4[j * n..(j + 1) * n];
            for p in 0..panels {
                // Safety: quad `q` of every panel is this unit's alone, 64 bytes inside `packed`
                // (sized above).
                let dst =
                    unsafe { std::slice::from_raw_parts_mut((dst_ptr as *mut u8).add((p * kq + q) * NR * 4), NR * 4) };
                let c0 = p * NR;
                let nc = NR.min(n - c0);
                #[cfg(target_arch = "x86_64")]
                if nc == NR {
                    interleave_sse2(&r(0)[c0..], &r(1)[c0..], &r(2)[c0..], &r(3)[c0..], flip, dst);
                    continue;
                }
                dst.fill(0);
                for j in 0..4 {
                    for (c, &v) in r(j)[c0..c0 + nc].iter().enumerate() {
                        dst[4 * c + j] = v ^ flip;
                    }
                }
            }
        },
    );
}

/// 16 columns of 4 rows, each column's 4 bytes adjacent (each byte xor `flip`), into `dst`.
#[cfg(target_arch = "x86_64")]
fn interleave_sse2(r0: &[u8], r1: &[u8], r2: &[u8], r3: &[u8], flip: u8, dst: &mut [u8]) {
    use std::arch::x86_64::*;
    assert!(r0.len() >= 16 && r1.len() >= 16 && r2.len() >= 16 && r3.len() >= 16 && dst.len() >= 64);
    // Safety: SSE2 is part of x86-64; the loads and stores are in bounds (asserted), unaligned.
    unsafe {
        let f = _mm_set1_epi8(flip as i8);
        let ld = |r: &[u8]| _mm_xor_si128(_mm_loadu_si128(r.as_ptr() as *const __m128i), f);
        let (a, b, c, d) = (ld(r0), ld(r1), ld(r2), ld(r3));
        let (ab_lo, ab_hi) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
        let (cd_lo, cd_hi) = (_mm_unpacklo_epi8(c, d), _mm_unpackhi_epi8(c, d));
        let out = dst.as_mut_ptr() as *mut __m128i;
        _mm_storeu_si128(out, _mm_unpacklo_epi16(ab_lo, cd_lo));
        _mm_storeu_si128(out.add(1), _mm_unpackhi_epi16(ab_lo, cd_lo));
        _mm_storeu_si128(out.add(2), _mm_unpacklo_epi16(ab_hi, cd_hi));
        _mm_storeu_si128(out.add(3), _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
}

/// Whether this host runs [`run`] (AVX2).
pub fn available() -> bool {
    crate::simd::Simd::detect() != crate::simd::Simd::Baseline
}

/// `out[rows, n]` (i32 as bytes) `= w' @ (x - z)` for the weights `w` and the columns packed by
/// [`pack_rows`] (`z`: the columns' zero point as packed, i.e. with its top bit flipped when
/// they are signed), on `threads` threads. Needs AVX2 ([`available`]).
pub fn run(w: QuadsView<'_>, packed: &[u8], z: u8, n: usize, out: &mut [u8], threads: usize) -> Result<(), String> {
    let (rows, k) = (w.rows, w.k);
    let kq = k.div_ceil(4);
    let panels = n.div_ceil(NR);
    let blocks = rows.div_ceil(MR);
    if !available() || packed.len() < panels * kq * NR * 4 || out.len() != rows * n * 4 {
        return Err(format!(
            "matmul_integer (u8): {} packed bytes and {} result bytes for [{rows}, {k}] x [{k}, {n}]",
            packed.len(),
            out.len()
        ));
    }
    // Per row, what the zero point adds: z · Σ_k w' (blocks of MR, the padding rows 0).
    let mut fix = vec![0i32; blocks * MR];
    for (f, &s) in fix.iter_mut().zip(w.sums) {
        *f = s.wrapping_mul(z as i32);
    }
    let out_ptr = out.as_mut_ptr() as usize;
    // One tile: rows `blk · MR..`, columns of panel `p`, into the output.
    let tile = |blk: usize, p: usize| {
        let panel = &packed[p * kq * NR * 4..(p + 1) * kq * NR * 4];
        let (r0, c0) = (blk * MR, p * NR);
        let quads = &w.quads[r0 * kq..(r0 + MR) * kq];
        let fix: &[i32; MR] = fix[r0..r0 + MR].try_into().expect("MR rows");
        let mut tile = [[0i32; NR]; MR];
        #[cfg(target_arch = "x86_64")]
        // Safety: AVX2 is present (checked above).
        unsafe {
            tile_avx2(quads, kq, panel, fix, &mut tile)
        };
        // Safety: each call writes its own tile of the output, `rows · n · 4` bytes long
        // (checked above).
        unsafe {
            store_tile(
                out_ptr as *mut u8,
                &tile,
                (r0, MR.min(rows - r0)),
                n,
                (c0, NR.min(n - c0)),
            )
        };
    };
    // The larger operand is read once and the smaller one, again for each of its parts, from
    // cache: with many columns (large images) each panel is multiplied by every block of rows
    // while it is in L1; with few (deep layers of small images, whose weights are megabytes)
    // each block of rows by every panel.
    if packed.len() <= w.quads.len() * 4 {
        par_units(
            blocks,
            threads.max(1),
            || (),
            |_, blk| (0..panels).for_each(|p| tile(blk, p)),
        );
    } else {
        par_units(
            panels,
            threads.max(1),
            || (),
            |_, p| (0..blocks).for_each(|blk| tile(blk, p)),
        );
    }
    Ok(())
}

/// `tile[i][c] = Σ_q quads[i][q] · panel[q][c] - fix[i]` (4-byte dot products of i8 weights and
/// u8 columns, summed in i32).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2(quads: &[u32], kq: usize, panel: &[u8], fix: &[i32; MR], tile: &mut [[i32; NR]; MR]) {
    use std::arch::x86_64::*;
    assert!(quads.len() >= MR * kq && panel.len() >= kq * NR * 4);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    let rows: [*const u32; MR] = std::array::from_fn(|i| quads[i * kq..].as_ptr());
    let p = panel.as_ptr() as *const __m256i;
    for q in 0..kq {
        // Safety: `panel` holds kq · 64 bytes and each row kq quads (asserted); unaligned loads.
        unsafe {
            let (b0, b1) = (_mm256_loadu_si256(p.add(2 * q)), _mm256_loadu_si256(p.add(2 * q + 1)));
            for (a, row) in acc.iter_mut().zip(rows) {
                let wv = _mm256_set1_epi32(*row.add(q) as i32);
                a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(_mm256_maddubs_epi16(b0, wv), ones));
                a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(_mm256_maddubs_epi16(b1, wv), ones));
            }
        }
    }
    for ((row, a), &f) in tile.iter_mut().zip(acc).zip(fix) {
        let f = _mm256_set1_epi32(f);
        // Safety: each row holds NR = 16 i32.
        unsafe {
            _mm256_storeu_si256(row.as_mut_ptr() as *mut __m256i, _mm256_sub_epi32(a[0], f));
            _mm256_storeu_si256(row.as_mut_ptr().add(8) as *mut __m256i, _mm256_sub_epi32(a[1], f));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row-major `k` × `n` matrix `x`, packed by [`pack_rows`].
    fn pack_columns(x: &[u8], signed: bool, k: usize, n: usize) -> Vec<u8> {
        let mut packed = Vec::new();
        pack_rows(k, n, signed, 1, &mut packed, |r, dst| {
            dst.copy_from_slice(&x[r * n..(r + 1) * n])
        });
        packed
    }

    /// Every operand extreme: weights ±64, columns 0 and 255 (or −128 and 127), ragged `k` and
    /// `n`, zero points; exact against i64 sums.
    #[test]
    fn matches_the_definition_at_the_extremes() {
        if !available() {
            eprintln!("no AVX2: skipped");
            return;
        }
        let mut seed = 0x9e37_79b9u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed >> 24
        };
        for (rows, k, n) in [
            (1, 1, 1),
            (5, 7, 17),
            (8, 64, 32),
            (13, 147, 45),
            (4, 576, 16),
            (3, 0, 5),
            (2, 5, 0),
        ] {
            for signed in [false, true] {
                let w: Vec<i32> = (0..rows * k)
                    .map(|i| {
                        if i % 5 == 0 {
                            [-64, 64][i % 2]
                        } else {
                            (next() % 129) as i32 - 64
                        }
                    })
                    .collect();
                let x: Vec<u8> = (0..k * n)
                    .map(|i| if i % 3 == 0 { [0, 255][i % 2] } else { next() as u8 })
                    .collect();
                let z = next() as u8;
                let value = |b: u8| if signed { b as i8 as i64 } else { b as i64 };
                let q = Quads::new(|r, c| w[r * k + c], rows, k).unwrap();
                let packed = pack_columns(&x, signed, k, n);
                let mut out = vec![0u8; rows * n * 4];
                let zp = if signed { z ^ 0x80 } else { z };
                let words = q.to_words();
                let view = Quads::view(&words).unwrap();
                run(view, &packed, zp, n, &mut out, 2).unwrap();
                let got: Vec<i32> = bytemuck::pod_collect_to_vec(&out);
                for r in 0..rows {
                    for c in 0..n {
                        let want: i64 = (0..k)
                            .map(|kk| w[r * k + kk] as i64 * (value(x[kk * n + c]) - value(z)))
                            .sum();
                        assert_eq!(
                            got[r * n + c] as i64,
                            want,
                            "[{rows}, {k}] x [{k}, {n}] signed {signed} at ({r}, {c})"
                        );
                    }
                }
            }
        }
        assert!(Quads::new(|_, _| 65, 1, 1).is_none(), "a weight beyond 64 is refused");
    }
}
