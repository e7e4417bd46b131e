//! The MLIR backend's GPU path (`--features mlir`): every loop and contraction kernel of every
//! conformance case, generated as a `gpu.launch`, lowered by MLIR through NVVM to PTX (with
//! libdevice linked) and assembled with NVIDIA's `ptxas` for sm_80 and sm_90 (no GPU needed).
//!
//! Skips with a loud message only when `ptxas` is absent and `OAR_REQUIRE_PTXAS` is unset.
#![cfg(feature = "mlir")]

mod common;

use common::ptxas::{assemble, find_ptxas};
use oar::conformance::Suite;
use std::path::PathBuf;

/// `libdevice.10.bc`: `$OAR_LIBDEVICE`, or beside the wheel's `ptxas` (`../nvvm/libdevice`).
fn libdevice(ptxas: &std::path::Path) -> Option<PathBuf> {
    std::env::var_os("OAR_LIBDEVICE")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| {
            let p = ptxas.parent()?.parent()?.join("nvvm/libdevice/libdevice.10.bc");
            p.is_file().then_some(p)
        })
}

#[test]
fn every_conformance_kernel_lowers_to_ptx_that_assembles() {
    let Some(ptxas) = find_ptxas() else {
        return;
    };
    let Some(libdevice) = libdevice(&ptxas) else {
        assert!(
            std::env::var_os("OAR_REQUIRE_PTXAS").is_none(),
            "OAR_REQUIRE_PTXAS is set but libdevice.10.bc was not found (set OAR_LIBDEVICE)"
        );
        eprintln!("\n*** SKIPPED: libdevice.10.bc not found beside ptxas (set OAR_LIBDEVICE) ***\n");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut cases, mut kernels, mut failures) = (0usize, 0usize, Vec::new());
    for case in Suite::builtin(false).cases() {
        let data = case
            .build()
            .unwrap_or_else(|e| panic!("case {} does not build: {e}", case.full_name()));
        let bindings = oar::ir::backend::check_inputs(&data.graph, &data.inputs).expect("case inputs match");
        let program = match oar_backend_mlir::lower(&data.graph, &bindings) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{}: lowering failed: {e}", case.full_name()));
                continue;
            }
        };
        cases += 1;
        for chip in ["sm_80", "sm_90"] {
            let ptx = match oar_backend_mlir::gpu::ptx(&program, chip, Some(&libdevice)) {
                Ok(p) => p,
                Err(e) => {
                    failures.push(format!("{} ({chip}): {e}", case.full_name()));
                    continue;
                }
            };
            if chip == "sm_80" {
                kernels += ptx.len();
            }
            for (i, k) in ptx.iter().enumerate() {
                let path = dir.path().join(format!("k{i}.{chip}.ptx"));
                if let Err(m) = assemble(&ptxas, &path, &k.ptx, chip) {
                    let m = m.lines().take(6).collect::<Vec<_>>().join("\n    ");
                    failures.push(format!("{} ({chip}) kernel {}: {m}", case.full_name(), k.kernel));
                }
            }
        }
    }
    println!("mlir → ptx: {cases} cases, {kernels} kernels lowered and assembled for sm_80 and sm_90");
    assert!(
        cases > 600 && kernels > 700,
        "too few cases or kernels: {cases}, {kernels}"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}
