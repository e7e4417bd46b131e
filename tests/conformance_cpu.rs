//! The CPU backend (`cpu`) on the conformance suite: every case passes against the reference
//! backend, except the ones listed in [`ALLOWED`] with their reasons.

use oar::conformance::{SuiteFilter, run_suite};

/// Cases the CPU backend may fail, error on or not support, each with the reason. An entry
/// that passes is an error too (delete it), so this list stays honest.
const ALLOWED: &[(&str, &str)] = &[];

#[test]
fn cpu_backend_passes_the_conformance_suite() {
    let cpu = oar::backend::get("cpu").expect("`cpu` is a built-in backend");
    let report = run_suite(&*cpu, &SuiteFilter::all());
    println!("{report}");
    let unexpected: Vec<String> = report
        .not_passed()
        .filter(|r| !ALLOWED.iter().any(|(n, _)| *n == r.full_name()))
        .map(|r| format!("  {} [{}]: {:?}", r.full_name(), r.status.label(), r.status))
        .collect();
    let stale: Vec<&str> = ALLOWED
        .iter()
        .filter(|(n, _)| report.get(n).is_none_or(|r| r.status.is_pass()))
        .map(|(n, _)| *n)
        .collect();
    assert!(
        unexpected.is_empty() && stale.is_empty(),
        "{}\ncases that did not pass on `cpu` ({}):\n{}\nallowed exceptions that now pass or no longer exist: {stale:?}",
        report.summary(),
        unexpected.len(),
        unexpected.join("\n")
    );
}
