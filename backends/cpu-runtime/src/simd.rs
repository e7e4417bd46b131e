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
    /// The host's (the detection is cached by the standard library).
    pub(crate) fn detect() -> Simd {
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
