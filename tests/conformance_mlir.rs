//! The MLIR backend (`mlir`, built with `--features mlir`) on the conformance suite: every
//! case passes against the reference backend, except the ones listed in [`ALLOWED`] with their
//! reasons.
#![cfg(feature = "mlir")]

use oar::conformance::{SuiteFilter, run_suite};

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
