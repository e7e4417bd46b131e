//! The PTX backend (`ptx`) on the conformance suite, on a machine with an NVIDIA GPU (sm_80+)
//! and its driver. Without one it checks that compiling fails with a typed
//! `BackendError::Unavailable` and skips loudly (or fails if `OAR_REQUIRE_GPU` is set).

use oar::ir::BackendError;
use oar_conformance::{SuiteFilter, run_suite};

/// Cases the PTX backend may fail, error on or not support, each with the reason.
const ALLOWED: &[(&str, &str)] = &[];

#[test]
fn ptx_backend_passes_the_conformance_suite() {
    let ptx = oar::backend::get("ptx").expect("`ptx` is a built-in backend");
    if let Err(e) = oar_backend_ptx::runtime::gpu() {
        assert!(matches!(e, BackendError::Unavailable { .. }), "{e}");
        if std::env::var_os("OAR_REQUIRE_GPU").is_some() {
            panic!("OAR_REQUIRE_GPU is set but the GPU is unavailable: {e}");
        }
        eprintln!("\n*** SKIPPED: no GPU for the ptx conformance run: {e} ***\n");
        return;
    }
    let report = run_suite(&*ptx, &SuiteFilter::all());
    println!("{report}");
    if let Err(e) = report.check_allowed(ALLOWED) {
        panic!("`ptx` on the conformance suite:\n{e}");
    }
}
