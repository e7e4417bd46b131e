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
