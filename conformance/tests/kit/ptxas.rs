//! Every kernel the PTX backend generates for every conformance case assembles with NVIDIA's
//! `ptxas` for sm_80 and sm_90 (no GPU needed; `ptxas` comes from the
//! `nvidia-cuda-nvcc-cu12` wheel, see `scripts/test.sh`).
//!
//! Skips with a loud message only when `ptxas` is absent and `OAR_REQUIRE_PTXAS` is unset.

use oar_backend_ptx::ptxas::{assemble, find_ptxas};
use oar_backend_ptx::{Arch, Step};
use oar_conformance::Suite;

#[test]
fn every_conformance_kernel_assembles_with_ptxas() {
    let Some(ptxas) = find_ptxas() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let suite = Suite::builtin(false);
    let (mut cases, mut kernels, mut host) = (0usize, 0usize, 0usize);
    let mut host_reasons: std::collections::BTreeMap<String, usize> = Default::default();
    let mut failures = Vec::new();
    for case in suite.cases() {
        let data = match case.build() {
            Ok(d) => d,
            Err(e) => panic!("case {} does not build: {e}", case.full_name()),
        };
        let bindings = oar::ir::backend::check_inputs(&data.graph, &data.inputs).expect("case inputs match");
        for arch in [Arch::Sm80, Arch::Sm90] {
            let (_, module) = match oar_backend_ptx::compile_to_ptx(&data.graph, &bindings, arch) {
                Ok(m) => m,
                Err(e) => {
                    failures.push(format!("{} ({arch}): lowering failed: {e}", case.full_name()));
                    continue;
                }
            };
            if arch == Arch::Sm80 {
                cases += 1;
                kernels += module.entries.len();
                for s in &module.steps {
                    if let Step::Host { reason, .. } = s {
                        host += 1;
                        let key = reason.split(" (").next().unwrap_or(reason).to_string();
                        *host_reasons.entry(key).or_default() += 1;
                    }
                }
            }
            if module.entries.is_empty() {
                continue;
            }
            let path = dir.path().join(format!("case.{arch}.ptx"));
            if let Err(msg) = assemble(&ptxas, &path, &module.text(), arch.name()) {
                // Pinpoint the entries that fail.
                for i in 0..module.entries.len() {
                    if let Err(m) = assemble(&ptxas, &path, &module.entry_text(i), arch.name()) {
                        failures.push(format!(
                            "{} ({arch}) entry {}: {}",
                            case.full_name(),
                            module.entries[i].name,
                            m.lines().take(6).collect::<Vec<_>>().join("\n    ")
                        ));
                    }
                }
                if failures.is_empty() {
                    failures.push(format!("{} ({arch}): module: {msg}", case.full_name()));
                }
            }
        }
    }
    println!(
        "ptxas: {cases} cases, {kernels} generated kernels assembled for sm_80 and sm_90; {host} kernels run on the host"
    );
    for (r, n) in &host_reasons {
        println!("  host: {n} × {r}");
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
    assert!(kernels > 500, "only {kernels} kernels generated");
}
