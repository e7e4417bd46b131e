//! The vector instructions hand-written kernels are compiled for, chosen at run time: each such
//! kernel is one generic body instantiated under `#[target_feature]` for AVX-512 and for
//! AVX2+FMA, and once without (other hosts), and [`Simd::detect`] picks the instance.

/// The widest instruction set this host runs that the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Simd {
    /// AVX-512F (with AVX2 and FMA).
    Avx512,
    /// AVX2 with FMA.
    Avx2Fma,
    /// Whatever the build targets (SSE2 on x86-64).
    Baseline,
}

impl Simd {
    /// The instruction set the kernels use: the host's widest, or a narrower one named by
    /// `OAR_CPU_SIMD` (`avx2` or `baseline`; read once) — so one AVX-512 machine tests the
    /// AVX2 instances too (CI runs the runtime's tests both ways). A value naming more than
    /// the host has, or none of these, leaves the host's (with a warning for the latter).
    pub(crate) fn detect() -> Simd {
        static FORCED: std::sync::OnceLock<Option<Simd>> = std::sync::OnceLock::new();
        Simd::pick(*FORCED.get_or_init(Simd::from_env), Simd::host())
    }

    /// The forced set where it is narrower than the host's, else the host's.
    fn pick(forced: Option<Simd>, host: Simd) -> Simd {
        match forced {
            Some(f) if f.rank() < host.rank() => f,
            _ => host,
        }
    }

    /// What this host runs (the detection is cached by the standard library).
    fn host() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Simd::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Simd::Avx2Fma;
            }
        }
        Simd::Baseline
    }

    /// f32 lanes of the instruction set's vectors the kernels use (AVX2's for `Baseline`,
    /// where no hand-written kernel runs).
    pub(crate) fn lanes(self) -> usize {
        match self {
            Simd::Avx512 => 16,
            _ => 8,
        }
    }

    fn rank(self) -> u8 {
        match self {
            Simd::Baseline => 0,
            Simd::Avx2Fma => 1,
            Simd::Avx512 => 2,
        }
    }

    /// `OAR_CPU_SIMD`, parsed.
    fn from_env() -> Option<Simd> {
        let v = std::env::var("OAR_CPU_SIMD").ok()?;
        let parsed = Simd::parse(&v);
        if parsed.is_none() {
            eprintln!("oar: OAR_CPU_SIMD={v:?} is not one of avx512, avx2, baseline; using the host's");
        }
        parsed
    }

    fn parse(v: &str) -> Option<Simd> {
        match v.to_ascii_lowercase().as_str() {
            "avx512" => Some(Simd::Avx512),
            "avx2" => Some(Simd::Avx2Fma),
            "baseline" => Some(Simd::Baseline),
            _ => None,
        }
    }
}

/// Instances of `body::<true>` for AVX-512 and AVX2+FMA: the functions `$avx2` and `$avx512`
/// taking `$args` (off x86-64, `body::<false>`), and `$pick`, which calls the host's.
macro_rules! instances {
    ($body:ident, $pick:ident, $avx2:ident, $avx512:ident, ($($a:ident: $t:ty),*) -> $r:ty) => {
        fn $avx2($($a: $t),*) -> $r {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn inner($($a: $t),*) -> $r {
                    $body::<true>($($a),*)
                }
                // Safety: called only when `Simd::detect` found AVX2 and FMA.
                unsafe { inner($($a),*) }
            }
            #[cfg(not(target_arch = "x86_64"))]
            $body::<false>($($a),*)
        }
        fn $avx512($($a: $t),*) -> $r {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn inner($($a: $t),*) -> $r {
                    $body::<true>($($a),*)
                }
                // Safety: called only when `Simd::detect` found AVX-512F.
                unsafe { inner($($a),*) }
            }
            #[cfg(not(target_arch = "x86_64"))]
            $body::<false>($($a),*)
        }
        fn $pick($($a: $t),*) -> $r {
            match Simd::detect() {
                Simd::Avx512 => $avx512($($a),*),
                Simd::Avx2Fma => $avx2($($a),*),
                Simd::Baseline => $body::<false>($($a),*),
            }
        }
    };
}
pub(crate) use instances;

/// Ask for the cache line at `p` to be brought into L2 (a hint: never faults, any address).
#[inline(always)]
pub(crate) fn prefetch_l2(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // Safety: a prefetch reads nothing architecturally; any address is allowed.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A vector of f32 lanes, as the hand-written microkernels use it (implemented for the
/// AVX-512 and AVX2 vectors in [`x86`]).
pub(crate) trait Lanes: Copy {
    const N: usize;
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn splat(p: *const f32) -> Self;
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    /// `a > b ? a : b` lane by lane (`b` where either is NaN: `maxps`).
    unsafe fn max(a: Self, b: Self) -> Self;
    /// `a < b ? a : b` lane by lane (`b` where either is NaN: `minps`).
    unsafe fn min(a: Self, b: Self) -> Self;
    unsafe fn store(p: *mut f32, v: Self);
    /// Hint that the 64 bytes at `p` are read soon.
    unsafe fn prefetch(p: *const f32);
    /// The first `n` lanes (`n <= N`) from `p`, the others zero; only those `n` are read.
    unsafe fn load_first(p: *const f32, n: usize) -> Self;
    /// Store the first `n` lanes (`n <= N`) of `v` at `p`; only those `n` are written.
    unsafe fn store_first(p: *mut f32, n: usize, v: Self);
    /// Transpose the `N × N` matrix whose rows are `rows` (`rows.len() == N`): lane `j` of
    /// row `i` becomes lane `i` of row `j`.
    unsafe fn transpose(rows: &mut [Self]);
    /// Lanes `lo..hi` (`lo <= hi <= N`) from `p + lane`, the others `fill`; only those lanes
    /// are read (`p` itself may point before a buffer whose elements `lo..hi` it reads).
    unsafe fn load_lanes(p: *const f32, lo: usize, hi: usize, fill: Self) -> Self;
    /// The even-numbered lanes of the `2N` lanes `a, b` (`a`'s first), and the odd ones.
    unsafe fn deinterleave(a: Self, b: Self) -> (Self, Self);
    /// The inverse of [`Lanes::deinterleave`]: `a₀ b₀ a₁ b₁ …` in two vectors.
    unsafe fn interleave(a: Self, b: Self) -> (Self, Self);
    /// The IR's binary `max`: `a > b ? a : b`, and `a` where `a` is NaN (so NaN where either
    /// is, the first NaN's bits; the second on a tie of `-0` and `+0`).
    unsafe fn max_ir(a: Self, b: Self) -> Self;
    /// `v` in every lane.
    unsafe fn splat_value(v: f32) -> Self;
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::Lanes;
    use std::arch::x86_64::*;

    #[derive(Clone, Copy)]
    pub(crate) struct Zmm(__m512);
    #[derive(Clone, Copy)]
    pub(crate) struct Ymm(__m256);

    /// `Lanes` for one vector type from its intrinsics.
    macro_rules! lanes {
        ($t:ident, $n:literal, $zero:ident, $load:ident, $set1:ident, $fma:ident, $store:ident, $add:ident, $max:ident, $min:ident) => {
            // Safety (every method): called only from functions compiled with the type's
            // instruction set (AVX-512F resp. AVX2 + FMA) on pointers valid for the lanes read
            // or written.
            impl Lanes for $t {
                const N: usize = $n;
                #[inline(always)]
                unsafe fn zero() -> Self {
                    unsafe { $t($zero()) }
                }
                #[inline(always)]
                unsafe fn load(p: *const f32) -> Self {
                    unsafe { $t($load(p)) }
                }
                #[inline(always)]
                unsafe fn splat(p: *const f32) -> Self {
                    unsafe { $t($set1(*p)) }
                }
                #[inline(always)]
                unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
                    unsafe { $t($fma(a.0, b.0, c.0)) }
                }
                #[inline(always)]
                unsafe fn add(a: Self, b: Self) -> Self {
                    unsafe { $t($add(a.0, b.0)) }
                }
                #[inline(always)]
                unsafe fn max(a: Self, b: Self) -> Self {
                    unsafe { $t($max(a.0, b.0)) }
                }
                #[inline(always)]
                unsafe fn min(a: Self, b: Self) -> Self {
                    unsafe { $t($min(a.0, b.0)) }
                }
                #[inline(always)]
                unsafe fn store(p: *mut f32, v: Self) {
                    unsafe { $store(p, v.0) }
                }
                #[inline(always)]
                unsafe fn prefetch(p: *const f32) {
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
                }
                #[inline(always)]
                unsafe fn load_first(p: *const f32, n: usize) -> Self {
                    unsafe { $t(<$t>::masked_load(p, n)) }
                }
                #[inline(always)]
                unsafe fn store_first(p: *mut f32, n: usize, v: Self) {
                    unsafe { <$t>::masked_store(p, n, v.0) }
                }
                #[inline(always)]
                unsafe fn load_lanes(p: *const f32, lo: usize, hi: usize, fill: Self) -> Self {
                    unsafe { $t(<$t>::load_lanes_raw(p, lo, hi, fill.0)) }
                }
                #[inline(always)]
                unsafe fn deinterleave(a: Self, b: Self) -> (Self, Self) {
                    let (e, o) = unsafe { <$t>::deinterleave_raw(a.0, b.0) };
                    ($t(e), $t(o))
                }
                #[inline(always)]
                unsafe fn interleave(a: Self, b: Self) -> (Self, Self) {
                    let (lo, hi) = unsafe { <$t>::interleave_raw(a.0, b.0) };
                    ($t(lo), $t(hi))
                }
                #[inline(always)]
                unsafe fn max_ir(a: Self, b: Self) -> Self {
                    unsafe { $t(<$t>::max_ir_raw(a.0, b.0)) }
                }
                #[inline(always)]
                unsafe fn splat_value(v: f32) -> Self {
                    unsafe { $t($set1(v)) }
                }
                #[inline(always)]
                unsafe fn transpose(rows: &mut [Self]) {
                    assert_eq!(rows.len(), $n);
                    let mut r: [_; $n] = std::array::from_fn(|i| rows[i].0);
                    unsafe { <$t>::transpose_in_place(&mut r) };
                    for (row, v) in rows.iter_mut().zip(r) {
                        *row = $t(v);
                    }
                }
            }
        };
    }

    // Safety (every function below): called only from functions compiled with AVX-512F
    // resp. AVX2, on pointers valid for the first `n` lanes.
    impl Zmm {
        #[inline(always)]
        unsafe fn masked_load(p: *const f32, n: usize) -> __m512 {
            unsafe { _mm512_maskz_loadu_ps(Self::mask(n), p) }
        }
        #[inline(always)]
        unsafe fn masked_store(p: *mut f32, n: usize, v: __m512) {
            unsafe { _mm512_mask_storeu_ps(p, Self::mask(n), v) }
        }
        #[inline(always)]
        fn mask(n: usize) -> __mmask16 {
            if n >= 16 { !0 } else { ((1u32 << n) - 1) as __mmask16 }
        }
        #[inline(always)]
        unsafe fn load_lanes_raw(p: *const f32, lo: usize, hi: usize, fill: __m512) -> __m512 {
            unsafe { _mm512_mask_loadu_ps(fill, Self::mask(hi) & !Self::mask(lo), p) }
        }
        #[inline(always)]
        unsafe fn deinterleave_raw(a: __m512, b: __m512) -> (__m512, __m512) {
            unsafe {
                let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
                (_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b))
            }
        }
        #[inline(always)]
        unsafe fn interleave_raw(a: __m512, b: __m512) -> (__m512, __m512) {
            unsafe {
                let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
                let hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
                (_mm512_permutex2var_ps(a, lo, b), _mm512_permutex2var_ps(a, hi, b))
            }
        }
        #[inline(always)]
        unsafe fn max_ir_raw(a: __m512, b: __m512) -> __m512 {
            unsafe {
                // `maxps(a, b)` is `a > b ? a : b` and `b` where either is NaN: only a NaN `a`
                // needs putting back.
                let m = _mm512_max_ps(a, b);
                _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a), a)
            }
        }
        /// The low (high) 64-bit pairs of each 128-bit lane of `a` and `b`, interleaved.
        #[inline(always)]
        unsafe fn pairs_lo(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))) }
        }
        #[inline(always)]
        unsafe fn pairs_hi(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))) }
        }
        /// Rows `2i, 2i + 1` interleaved by element, then by pairs: `u[4g + j]` holds, in
        /// 128-bit lane `k`, column `4k + j` of rows `4g..4g + 4`; two rounds of 128-bit lane
        /// shuffles then gather each column's four lanes.
        #[inline(always)]
        unsafe fn transpose_in_place(r: &mut [__m512; 16]) {
            unsafe {
                let mut t = [_mm512_setzero_ps(); 16];
                for i in 0..8 {
                    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
                }
                let (lo, hi) = (Self::pairs_lo, Self::pairs_hi);
                let mut u = [_mm512_setzero_ps(); 16];
                for g in 0..4 {
                    let b = 4 * g;
                    u[b] = lo(t[b], t[b + 2]);
                    u[b + 1] = hi(t[b], t[b + 2]);
                    u[b + 2] = lo(t[b + 1], t[b + 3]);
                    u[b + 3] = hi(t[b + 1], t[b + 3]);
                }
                for j in 0..4 {
                    let v = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
                    let w = _mm512_shuffle_f32x4::<0xdd>(u[j], u[4 + j]);
                    let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
                    let w2 = _mm512_shuffle_f32x4::<0xdd>(u[8 + j], u[12 + j]);
                    r[j] = _mm512_shuffle_f32x4::<0x88>(v, v2);
                    r[8 + j] = _mm512_shuffle_f32x4::<0xdd>(v, v2);
                    r[4 + j] = _mm512_shuffle_f32x4::<0x88>(w, w2);
                    r[12 + j] = _mm512_shuffle_f32x4::<0xdd>(w, w2);
                }
            }
        }
    }

    impl Ymm {
        #[inline(always)]
        unsafe fn masked_load(p: *const f32, n: usize) -> __m256 {
            unsafe { _mm256_maskload_ps(p, Self::mask(n)) }
        }
        #[inline(always)]
        unsafe fn masked_store(p: *mut f32, n: usize, v: __m256) {
            unsafe { _mm256_maskstore_ps(p, Self::mask(n), v) }
        }
        /// Lanes below `n` set.
        #[inline(always)]
        unsafe fn mask(n: usize) -> __m256i {
            unsafe {
                _mm256_cmpgt_epi32(
                    _mm256_set1_epi32(n.min(8) as i32),
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                )
            }
        }
        #[inline(always)]
        unsafe fn load_lanes_raw(p: *const f32, lo: usize, hi: usize, fill: __m256) -> __m256 {
            unsafe {
                let m = _mm256_andnot_si256(Self::mask(lo), Self::mask(hi));
                _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m))
            }
        }
        #[inline(always)]
        unsafe fn deinterleave_raw(a: __m256, b: __m256) -> (__m256, __m256) {
            unsafe {
                // Within each 128-bit half: a's pair then b's pair; then the halves' middle
                // quarters swapped.
                let (e, o) = (_mm256_shuffle_ps::<0x88>(a, b), _mm256_shuffle_ps::<0xdd>(a, b));
                (Self::middle_swapped(e), Self::middle_swapped(o))
            }
        }
        #[inline(always)]
        unsafe fn interleave_raw(a: __m256, b: __m256) -> (__m256, __m256) {
            unsafe {
                // Pairs within each 128-bit half, then the halves regrouped.
                let (l, h) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
                (
                    _mm256_permute2f128_ps::<0x20>(l, h),
                    _mm256_permute2f128_ps::<0x31>(l, h),
                )
            }
        }
        /// The 64-bit quarters `0, 2, 1, 3` of `v`.
        #[inline(always)]
        unsafe fn middle_swapped(v: __m256) -> __m256 {
            unsafe { _mm256_castpd_ps(_mm256_permute4x64_pd::<0xd8>(_mm256_castps_pd(v))) }
        }
        #[inline(always)]
        unsafe fn max_ir_raw(a: __m256, b: __m256) -> __m256 {
            unsafe {
                let m = _mm256_max_ps(a, b);
                _mm256_blendv_ps(m, a, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a))
            }
        }
        #[inline(always)]
        unsafe fn pairs_lo(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a), _mm256_castps_pd(b))) }
        }
        #[inline(always)]
        unsafe fn pairs_hi(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a), _mm256_castps_pd(b))) }
        }
        /// As [`Zmm::transpose_in_place`], the last round a 128-bit lane exchange.
        #[inline(always)]
        unsafe fn transpose_in_place(r: &mut [__m256; 8]) {
            unsafe {
                let mut t = [_mm256_setzero_ps(); 8];
                for i in 0..4 {
                    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
                }
                let (lo, hi) = (Self::pairs_lo, Self::pairs_hi);
                let mut u = [_mm256_setzero_ps(); 8];
                for g in 0..2 {
                    let b = 4 * g;
                    u[b] = lo(t[b], t[b + 2]);
                    u[b + 1] = hi(t[b], t[b + 2]);
                    u[b + 2] = lo(t[b + 1], t[b + 3]);
                    u[b + 3] = hi(t[b + 1], t[b + 3]);
                }
                for j in 0..4 {
                    r[j] = _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]);
                    r[4 + j] = _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]);
                }
            }
        }
    }

    lanes!(
        Zmm,
        16,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_storeu_ps,
        _mm512_add_ps,
        _mm512_max_ps,
        _mm512_min_ps
    );
    lanes!(
        Ymm,
        8,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_storeu_ps,
        _mm256_add_ps,
        _mm256_max_ps,
        _mm256_min_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_set_is_never_wider_than_the_host() {
        assert_eq!(Simd::parse("AVX2"), Some(Simd::Avx2Fma));
        assert_eq!(Simd::parse("baseline"), Some(Simd::Baseline));
        assert_eq!(Simd::parse("sse9"), None);
        assert_eq!(Simd::pick(Some(Simd::Avx2Fma), Simd::Avx512), Simd::Avx2Fma);
        assert_eq!(Simd::pick(Some(Simd::Baseline), Simd::Avx2Fma), Simd::Baseline);
        assert_eq!(Simd::pick(Some(Simd::Avx512), Simd::Avx2Fma), Simd::Avx2Fma);
        assert_eq!(Simd::pick(None, Simd::Avx512), Simd::Avx512);
        // Whatever this process was told, never more than the host.
        assert!(Simd::detect().rank() <= Simd::host().rank());
    }
}
