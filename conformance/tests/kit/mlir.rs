//! The MLIR backend (`mlir`, built with `--features mlir`) on the conformance suite: every
//! case passes against the reference backend, except the ones listed in [`ALLOWED`] with their
//! reasons. `mlir-gpu` runs the same suite when a GPU is present.
use oar_conformance::{SuiteFilter, run_suite};

/// Cases the MLIR backend may fail, error on or not support, each with the reason. An entry
/// that passes is an error too (delete it), so this list stays honest.
const ALLOWED: &[(&str, &str)] = &[];

#[test]
fn mlir_backend_passes_the_conformance_suite() {
    let mlir = oar::backend::get("mlir").expect("`mlir` is registered with the `mlir` feature");
    let report = run_suite(&*mlir, &SuiteFilter::all());
    println!("{report}");
    if let Err(e) = report.check_allowed(ALLOWED) {
        panic!("`mlir` on the conformance suite:\n{e}");
    }
}

/// Cases `mlir-gpu` may fail, error on or not support, each with the reason.
const ALLOWED_GPU: &[(&str, &str)] = &[];

/// `mlir-gpu` (MLIR-made PTX launched by the `ptx` backend's runtime) on a machine with an
/// NVIDIA GPU (sm_80+) and its driver. Without one it checks that compiling fails with a typed
/// `BackendError::Unavailable` and skips loudly (or fails if `OAR_REQUIRE_GPU` is set).
#[test]
fn mlir_gpu_backend_passes_the_conformance_suite() {
    use oar::ir::BackendError;
    let backend = oar::backend::get("mlir-gpu").expect("`mlir-gpu` is registered with the `mlir` feature");
    if let Err(e) = oar_backend_ptx::runtime::gpu() {
        assert!(matches!(e, BackendError::Unavailable { .. }), "{e}");
        if std::env::var_os("OAR_REQUIRE_GPU").is_some() {
            panic!("OAR_REQUIRE_GPU is set but the GPU is unavailable: {e}");
        }
        eprintln!("\n*** SKIPPED: no GPU for the mlir-gpu conformance run: {e} ***\n");
        return;
    }
    let report = run_suite(&*backend, &SuiteFilter::all());
    println!("{report}");
    if let Err(e) = report.check_allowed(ALLOWED_GPU) {
        panic!("`mlir-gpu` on the conformance suite:\n{e}");
    }
}
