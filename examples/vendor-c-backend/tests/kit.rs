//! The example backend passes oar's whole conformance kit against the reference backend.

/// Cases this backend may fail, each with the reason. An entry that passes is an error too.
const ALLOWED: &[(&str, &str)] = &[];

#[test]
fn vendor_c_backend_passes_the_conformance_kit() {
    let report = oar_conformance::run_suite(&oar_example_vendor_c::VendorCBackend, &Default::default());
    println!("{}", report.table(true));
    if let Err(e) = report.check_allowed(ALLOWED) {
        panic!("the vendor C backend on the kit:\n{e}");
    }
}

/// The kit passing must not come from interpreting everything: every loop and contraction
/// kernel of an MLP with softmax is emitted as C.
#[test]
fn loop_and_contraction_kernels_are_emitted_as_c() {
    use oar::nn::{Layer, Linear, ReLU, Sequential, functional::softmax};
    let mlp = Sequential::new().add(Linear::new(8, 16).unwrap()).add(ReLU);
    let mlp = mlp.add(Linear::new(16, 4).unwrap());
    let spec = oar::jit::InputSpec::new(&[None, Some(8)], oar::DType::F32, "x");
    let f = oar::jit::to_static(|xs| Ok(vec![softmax(&mlp.forward(&xs[0])?, -1)?]), &[spec]).unwrap();
    let program = oar::lowering::kernel_program(f.graph(), &[("N".to_string(), 3)].into()).unwrap();
    // The softmax is one kernel with two reduction stages; this backend emits plain pieces.
    let (_, symbols) = oar_example_vendor_c::emit::emit_program(&program);
    assert!(
        symbols.iter().any(|s| s.is_err()),
        "a staged kernel must not be emitted as is"
    );
    let mut program = program.split_stages().unwrap();
    // exp has no C helper: legalize expands it (as the backend does before emitting).
    oar::passes::legalize::legalize(&mut program, &oar::passes::legalize::Natives::none());
    let (source, symbols) = oar_example_vendor_c::emit::emit_program(&program);
    let (loops, contractions, _) = program.kernel_counts();
    let emitted = symbols.iter().filter(|s| s.is_ok()).count();
    assert!(
        loops >= 2 && contractions == 2 && emitted == loops + contractions,
        "{program}\n{symbols:?}"
    );
    assert!(source.contains("int oar_k0(void **b)"), "{source}");
}
