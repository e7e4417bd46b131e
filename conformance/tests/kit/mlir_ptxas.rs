//! The MLIR backend's GPU path (`--features mlir`): every loop and contraction kernel of every
//! conformance case, generated as a `gpu.launch`, lowered by MLIR through NVVM to PTX (with
//! libdevice linked) and assembled with NVIDIA's `ptxas` for sm_80 and sm_90 (no GPU needed).
//!
//! The same kernels (after the `ptx` backend's lowering) assembled into ONE module per case
//! for the `ptx` backend's runtime (`mlir-gpu`), also through `ptxas`.
//!
//! The per-kernel sweep is sampled by default — every third case, sm_80 only; the module test
//! covers every case on both chips — and runs whole with `OAR_TEST_FULL=1` (docs/MLIR.md).
//!
//! Skips with a loud message only when `ptxas` is absent and `OAR_REQUIRE_PTXAS` is unset.
use oar_backend_ptx::ptxas::{assemble, find_ptxas};
use oar_conformance::Suite;
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

/// `ptxas` and `libdevice.10.bc`, or `None` after a loud message (a panic if required).
fn tools() -> Option<(PathBuf, PathBuf)> {
    let ptxas = find_ptxas()?;
    let Some(libdevice) = libdevice(&ptxas) else {
        assert!(
            std::env::var_os("OAR_REQUIRE_PTXAS").is_none(),
            "OAR_REQUIRE_PTXAS is set but libdevice.10.bc was not found (set OAR_LIBDEVICE)"
        );
        eprintln!("\n*** SKIPPED: libdevice.10.bc not found beside ptxas (set OAR_LIBDEVICE) ***\n");
        return None;
    };
    Some((ptxas, libdevice))
}

#[test]
fn every_conformance_kernel_lowers_to_ptx_that_assembles() {
    let Some((ptxas, libdevice)) = tools() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut cases, mut kernels, mut failures) = (0usize, 0usize, Vec::new());
    let full = std::env::var_os("OAR_TEST_FULL").is_some();
    let chips: &[&str] = if full { &["sm_80", "sm_90"] } else { &["sm_80"] };
    for (i, case) in Suite::builtin(false).cases().into_iter().enumerate() {
        if !full && i % 3 != 0 {
            continue;
        }
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
        for &chip in chips {
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
    println!("mlir → ptx: {cases} cases, {kernels} kernels lowered and assembled for {chips:?}");
    let (min_cases, min_kernels) = if full { (600, 700) } else { (200, 230) };
    assert!(
        cases > min_cases && kernels > min_kernels,
        "too few cases or kernels: {cases}, {kernels}"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// The `.param` count of `.entry name(...)` in `text`, if it has that entry.
fn entry_params(text: &str, name: &str) -> Option<usize> {
    let at = text.find(&format!(".entry {name}("))?;
    let rest = &text[at..];
    Some(rest[..rest.find(')')?].matches(".param").count())
}

#[test]
fn every_conformance_case_is_one_mlir_made_ptx_module_that_assembles() {
    use oar_backend_ptx::{Arch, Step};
    let Some((ptxas, libdevice)) = tools() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut cases, mut entries, mut failures) = (0usize, 0usize, Vec::new());
    for case in Suite::builtin(false).cases() {
        let name = case.full_name();
        let data = case
            .build()
            .unwrap_or_else(|e| panic!("case {name} does not build: {e}"));
        let bindings = oar::ir::backend::check_inputs(&data.graph, &data.inputs).expect("case inputs match");
        // The `mlir-gpu` backend's lowering: the `ptx` backend's.
        let program = match oar_backend_ptx::lower(&data.graph, &bindings) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name}: lowering failed: {e}"));
                continue;
            }
        };
        cases += 1;
        for arch in [Arch::Sm80, Arch::Sm90] {
            let module = match oar_backend_mlir::ptx_module(&program, arch, Some(&libdevice)) {
                Ok(m) => m,
                Err(e) => {
                    failures.push(format!("{name} ({arch}): {e}"));
                    continue;
                }
            };
            let text = module.text();
            if text.contains('\0') {
                failures.push(format!(
                    "{name} ({arch}): a NUL byte in the module (the driver takes a C string)"
                ));
            }
            if module.steps.len() != program.kernels.len() {
                failures.push(format!("{name} ({arch}): {} steps", module.steps.len()));
            }
            for s in &module.steps {
                if let Step::Host { kernel, reason } = s {
                    let k = &program.kernels[*kernel];
                    if !matches!(k.body, oar::ir::kernel::KernelBody::Opaque(_)) {
                        failures.push(format!("{name} ({arch}): kernel {} on the host: {reason}", k.name));
                    }
                }
            }
            for e in &module.entries {
                let want = e.params.len() + usize::from(e.error_word);
                match entry_params(&text, &e.name) {
                    Some(n) if n == want => {}
                    got => failures.push(format!("{name} ({arch}): `{}` has {got:?} params, want {want}", e.name)),
                }
            }
            let missing = oar_backend_mlir::ptx_module::unresolved_externs(&module);
            if !missing.is_empty() {
                failures.push(format!("{name} ({arch}): unresolved {missing:?} with libdevice linked"));
            }
            if arch == Arch::Sm80 {
                entries += module.entries.len();
            }
            if module.entries.is_empty() {
                continue;
            }
            let path = dir.path().join(format!("module.{arch}.ptx"));
            if let Err(m) = assemble(&ptxas, &path, &text, arch.name()) {
                let m = m.lines().take(6).collect::<Vec<_>>().join("\n    ");
                failures.push(format!("{name} ({arch}) module: {m}"));
            }
        }
    }
    println!("mlir-gpu: {cases} cases, {entries} entries, one module per case assembled for sm_80 and sm_90");
    assert!(
        cases > 600 && entries > 700,
        "too few cases or entries: {cases}, {entries}"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_mlir_gpu_backend_is_registered_and_unavailable_without_a_gpu() {
    let backend = oar::backend::get("mlir-gpu").expect("`mlir-gpu` is registered with the `mlir` feature");
    let g = oar::ir::text::parse_graph(
        "graph @g {\n  %x = input \"x\" : f32[4]\n  %y = exp(%x) : f32[4]\n  output \"y\" = %y\n}",
    )
    .expect("graph parses");
    let r = backend.compile(&g, &oar::ir::Weights::default());
    match oar_backend_ptx::runtime::gpu() {
        // Here (no GPU lent): "no CUDA driver (libcuda.so not found)".
        Err(oar::ir::BackendError::Unavailable { reason: why, .. }) => match r {
            Err(oar::ir::BackendError::Unavailable { backend, reason }) => {
                assert_eq!(backend, "mlir-gpu");
                assert!(reason.contains(&why) && reason.contains("CUDA"), "{reason}");
            }
            Err(e) => panic!("expected Unavailable, got {e}"),
            Ok(_) => panic!("compiled without a GPU"),
        },
        Err(e) => panic!("the ptx runtime's error is not `Unavailable`: {e}"),
        Ok(_) => {
            r.expect("compiles on a GPU");
        }
    }
}
