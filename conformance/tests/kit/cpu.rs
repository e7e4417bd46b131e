//! The CPU backend (`cpu`) on the conformance suite: every case passes against the reference
//! backend, except the ones listed in [`ALLOWED`] with their reasons.

use oar_conformance::{SuiteFilter, run_suite};

/// Cases the CPU backend may fail, error on or not support, each with the reason. An entry
/// that passes is an error too (delete it), so this list stays honest.
const ALLOWED: &[(&str, &str)] = &[];

#[test]
fn cpu_backend_passes_the_conformance_suite() {
    let cpu = oar::backend::get("cpu").expect("`cpu` is a built-in backend");
    let report = run_suite(&*cpu, &SuiteFilter::all());
    println!("{report}");
    if let Err(e) = report.check_allowed(ALLOWED) {
        panic!("`cpu` on the conformance suite:\n{e}");
    }
}
