//! The example backend passes oar's whole conformance kit against the reference backend.

use oar::conformance::{SuiteFilter, run_suite};
use oar_example_vendor_c::VendorCBackend;

/// Cases this backend may fail, each with the reason. An entry that passes is an error too.
const ALLOWED: &[(&str, &str)] = &[];

#[test]
fn vendor_c_backend_passes_the_conformance_kit() {
    let report = run_suite(&VendorCBackend, &SuiteFilter::all());
    println!("{}", report.table(true));
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
        "{}\nnot passed ({}):\n{}\nallowed entries that now pass or no longer exist: {stale:?}",
        report.summary(),
        unexpected.len(),
        unexpected.join("\n")
    );
}
