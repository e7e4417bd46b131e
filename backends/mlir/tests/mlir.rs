//! The MLIR backend's own tests, in one binary (each test binary with the `mlir` feature links
//! LLVM/MLIR): the generated text (always), and with `--features mlir` the JIT against the
//! reference backend, typed errors, `--emit llvm`, and PTX from the GPU path (`conformance/tests/kit/mlir_ptxas.rs`
//! in the `oar` crate assembles it with `ptxas` for every conformance kernel).

use oar_backend_mlir::{MlirError, emit_mlir, generate, lower};
use oar_ir::Graph;
use std::collections::BTreeMap;

fn graph(text: &str) -> Graph {
    oar_ir::text::parse_graph(text).expect("test graph parses")
}

/// `y = exp(x) + b`, `s = reduce_max(x)` over the last axis, `m = x @ w` + relu.
const MIXED: &str = r#"graph @mixed {
  %x = input "x" : f32[3,4]
  %b = input "b" : f32[4]
  %w = input "w" : f32[4,5]
  %e = exp(%x) : f32[3,4]
  %y = add(%e, %b) : f32[3,4]
  %s = reduce_max(%x) {axes = [1], keepdim = false} : f32[3]
  %m = matmul(%x, %w) : f32[3,5]
  %z = constant dense<0.0> : f32[]
  %r = max(%m, %z) : f32[3,5]
  output "y" = %y
  output "s" = %s
  output "r" = %r
}"#;

const CONV: &str = r#"graph @conv {
  %x = input "x" : f32[2,4,7,6]
  %w = input "w" : f32[6,2,3,2]
  %c = conv(%x, %w) {stride = [2, 1], pad_before = [1, 0], pad_after = [1, 1], dilation = [1, 2], groups = 2} : f32[2,6,4,5]
  %t = tanh(%c) : f32[2,6,4,5]
  output "y" = %t
}"#;

/// Opaque ops with generated code: pad, concat, gather, argmax, iota.
const INDEXING: &str = r#"graph @indexing {
  %x = input "x" : f32[3,4]
  %i = input "i" : i32[5]
  %p = pad(%x) {before = [1, 2], after = [0, 1], value = -1.5} : f32[4,7]
  %g = gather(%x, %i) {axis = 0} : f32[5,4]
  %c = concat(%x, %g, %x) {axis = 0} : f32[11,4]
  %a = argmax(%x) {axis = 1, keepdim = false} : i64[3]
  %t = iota() {axis = 1} : i64[3,4]
  output "p" = %p
  output "c" = %c
  output "g" = %g
  output "a" = %a
  output "t" = %t
}"#;

/// Normalization over rows: fusion makes one row kernel with two reduction stages.
const ROWNORM: &str = r#"graph @rownorm {
  %x = input "x" : f32[3,8]
  %m = reduce_mean(%x) {axes = [1], keepdim = true} : f32[3,1]
  %d = sub(%x, %m) : f32[3,8]
  %q = mul(%d, %d) : f32[3,8]
  %v = reduce_mean(%q) {axes = [1], keepdim = true} : f32[3,1]
  %e = constant dense<0.00001> : f32[]
  %ve = add(%v, %e) : f32[3,1]
  %r = rsqrt(%ve) : f32[3,1]
  %y = mul(%d, %r) : f32[3,8]
  output "y" = %y
}"#;

/// The row kernels of `g` (loop kernels with at least two reduction stages).
fn row_kernels(g: &Graph) -> usize {
    let p = lower(g, &BTreeMap::new()).unwrap();
    p.kernels
        .iter()
        .filter(|k| matches!(&k.body, oar_ir::kernel::KernelBody::Loop(l) if l.reduce.len() >= 2))
        .count()
}

#[test]
fn text_has_one_function_per_generated_kernel() {
    let g = graph(MIXED);
    let p = lower(&g, &BTreeMap::new()).unwrap();
    let m = generate(&p);
    assert_eq!(m.kernels.len(), p.kernels.len());
    assert!(m.kernels.iter().all(|k| k.is_ok()), "{:?}", m.kernels);
    assert_eq!(m.text.matches("func.func @oar_k").count(), p.kernels.len());
    for needle in [
        "llvm.emit_c_interface",
        "scf.for",
        // exp, legalized: 2^k from the exponent bits.
        "arith.shli",
        "arith.bitcast",
        "iter_args",
        "arith.mulf",
        "memref<12xf32>",
    ] {
        assert!(m.text.contains(needle), "no `{needle}` in\n{}", m.text);
    }
    let text = emit_mlir(&graph(CONV), &BTreeMap::new()).unwrap();
    assert!(text.contains("scf.if"), "conv padding is a bounds check:\n{text}");
    assert!(
        text.contains("arith.bitcast") && !text.contains("math.tanh"),
        "the epilogue (a legalized tanh) is fused:\n{text}"
    );
    let p = lower(&graph(INDEXING), &BTreeMap::new()).unwrap();
    let m = generate(&p);
    let opaque = p
        .kernels
        .iter()
        .filter(|k| matches!(k.body, oar_ir::kernel::KernelBody::Opaque(_)))
        .count();
    assert!(opaque >= 4, "pad, concat, gather, argmax are opaque kernels: {p:?}");
    assert!(
        m.kernels.iter().all(|k| k.is_ok()),
        "every kernel is generated: {:?}",
        m.kernels
    );
}

#[test]
fn gpu_text_launches_one_thread_per_output_point() {
    let p = lower(&graph(MIXED), &BTreeMap::new()).unwrap();
    let m = oar_backend_mlir::generate_for(&p, oar_backend_mlir::Target::Gpu);
    assert!(m.text.contains("attributes {gpu.container_module}"), "{}", m.text);
    assert_eq!(
        m.text.matches("gpu.launch blocks").count(),
        p.kernels.len(),
        "{}",
        m.text
    );
    assert!(m.text.contains("memref.atomic_rmw ori"), "the error word: {}", m.text);
}

#[test]
fn a_row_kernel_is_one_function_with_a_reduction_nest_per_stage() {
    let g = graph(ROWNORM);
    assert_eq!(row_kernels(&g), 1, "{:?}", lower(&g, &BTreeMap::new()).unwrap());
    let text = emit_mlir(&g, &BTreeMap::new()).unwrap();
    assert_eq!(text.matches("func.func").count(), 1, "{text}");
    assert_eq!(text.matches("iter_args").count(), 2, "two stages:\n{text}");
}

#[test]
fn symbolic_dims_are_a_typed_error() {
    let g = graph(
        r#"graph @sym {
  %x = input "x" : f32[N,4]
  %y = exp(%x) : f32[N,4]
  output "y" = %y
}"#,
    );
    match emit_mlir(&g, &BTreeMap::new()) {
        Err(MlirError::Symbolic(s)) => assert_eq!(s, ["N"]),
        other => panic!("{other:?}"),
    }
    let bound = emit_mlir(&g, &[("N".to_string(), 2)].into()).unwrap();
    assert!(bound.contains("memref<8xf32>"), "{bound}");
}

#[cfg(feature = "mlir")]
mod executed {
    use super::*;
    use oar_backend_mlir::{MlirBackend, engine};
    use oar_ir::{Backend, BackendError, DType, TensorData, Weights};

    const INTS: &str = r#"graph @ints {
      %a = input "a" : i32[6]
      %b = input "b" : i32[6]
      %q = div(%a, %b) : i32[6]
      %r = rem(%a, %b) : i32[6]
      %s = add(%q, %r) : i32[6]
      output "y" = %s
    }"#;

    fn data(dt: DType, shape: &[usize], f: impl Fn(usize) -> f64) -> TensorData {
        let n = shape.iter().product();
        let v: Vec<f64> = (0..n).map(f).collect();
        TensorData::from_f64_slice(dt, shape.to_vec(), &v).unwrap()
    }

    /// Run `g` on `mlir` and `reference`; compare every output within `tol` (relative + absolute).
    fn agree(g: &Graph, inputs: &BTreeMap<String, TensorData>, tol: f64) {
        let w = Weights::default();
        let got = MlirBackend.compile(g, &w).unwrap().run(inputs).unwrap();
        let want = oar_backend_reference::ReferenceBackend::new()
            .compile(g, &w)
            .unwrap()
            .run(inputs)
            .unwrap();
        assert_eq!(got.len(), want.len());
        for ((n, a), (_, b)) in got.iter().zip(&want) {
            assert_eq!(a.shape(), b.shape(), "{n}");
            for (i, (x, y)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
                let ok = (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol + tol * y.abs();
                assert!(ok, "{n}[{i}]: mlir {x} vs reference {y}");
            }
        }
    }

    #[test]
    fn loops_reductions_matmul_match_the_reference() {
        let ins: BTreeMap<String, TensorData> = [
            (
                "x".to_string(),
                data(DType::F32, &[3, 4], |i| (i as f64 * 0.37).sin() * 3.0),
            ),
            ("b".to_string(), data(DType::F32, &[4], |i| i as f64 - 1.5)),
            ("w".to_string(), data(DType::F32, &[4, 5], |i| (i as f64 * 0.11).cos())),
        ]
        .into();
        agree(&graph(MIXED), &ins, 1e-6);
    }

    #[test]
    fn multi_stage_row_kernels_match_the_reference() {
        let g = graph(ROWNORM);
        let ins: BTreeMap<String, TensorData> = [(
            "x".to_string(),
            data(DType::F32, &[3, 8], |i| (i as f64 * 0.71).sin() * 2.0 + 0.3),
        )]
        .into();
        agree(&g, &ins, 1e-6);
    }

    #[test]
    fn grouped_strided_padded_dilated_conv_matches_the_reference() {
        let ins: BTreeMap<String, TensorData> = [
            (
                "x".to_string(),
                data(DType::F32, &[2, 4, 7, 6], |i| ((i * 7919) % 13) as f64 / 13.0 - 0.5),
            ),
            (
                "w".to_string(),
                data(DType::F32, &[6, 2, 3, 2], |i| ((i * 31) % 7) as f64 / 7.0 - 0.4),
            ),
        ]
        .into();
        agree(&graph(CONV), &ins, 1e-6);
    }

    #[test]
    fn integer_division_matches_and_division_by_zero_is_an_error() {
        let a = TensorData::from_vec(vec![6], vec![7i32, -7, 7, -7, i32::MIN, 5]).unwrap();
        let b = TensorData::from_vec(vec![6], vec![2i32, 2, -2, -2, -1, 3]).unwrap();
        let ins: BTreeMap<String, TensorData> = [("a".to_string(), a.clone()), ("b".to_string(), b)].into();
        agree(&graph(INTS), &ins, 0.0);
        let zero = TensorData::from_vec(vec![6], vec![1i32, 1, 0, 1, 1, 1]).unwrap();
        let ins: BTreeMap<String, TensorData> = [("a".to_string(), a), ("b".to_string(), zero)].into();
        let exe = MlirBackend.compile(&graph(INTS), &Weights::default()).unwrap();
        match exe.run(&ins) {
            Err(BackendError::Runtime { detail, .. }) => assert!(detail.contains("division by zero"), "{detail}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pad_concat_gather_argmax_iota_match_and_a_bad_index_is_an_error() {
        let x = data(DType::F32, &[3, 4], |i| {
            [0.5, f64::NAN, -2.0, 3.0][i % 4] * (i as f64 + 1.0)
        });
        let i = TensorData::from_vec(vec![5], vec![2i32, 0, -1, 1, -3]).unwrap();
        let ins: BTreeMap<String, TensorData> = [("x".to_string(), x.clone()), ("i".to_string(), i)].into();
        agree(&graph(INDEXING), &ins, 0.0);
        let bad = TensorData::from_vec(vec![5], vec![0i32, 3, 0, 0, 0]).unwrap();
        let ins: BTreeMap<String, TensorData> = [("x".to_string(), x), ("i".to_string(), bad)].into();
        match MlirBackend
            .compile(&graph(INDEXING), &Weights::default())
            .unwrap()
            .run(&ins)
        {
            Err(BackendError::Runtime { detail, .. }) => {
                assert!(detail.contains("gather index out of range"), "{detail}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bad_module_is_a_parse_error_naming_the_kernel() {
        let text = "module {\n  // kernel 0 `k0_exp`\n  func.func @f() {\n    %0 = arith.addf %1 : f32\n  }\n}\n";
        let (ctx, diags) = engine::context();
        match engine::parse(&ctx, &diags, text) {
            Err(e @ MlirError::Parse { .. }) => {
                let s = e.to_string();
                assert!(s.contains("k0_exp"), "{s}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("parsed"),
        }
    }

    #[test]
    fn gpu_kernels_lower_to_ptx_entries() {
        let p = lower(&graph(MIXED), &BTreeMap::new()).unwrap();
        for chip in ["sm_80", "sm_90"] {
            let ptx = oar_backend_mlir::gpu::ptx(&p, chip, None).unwrap();
            assert_eq!(ptx.len(), p.kernels.len());
            for (i, k) in ptx.iter().enumerate() {
                assert!(k.ptx.contains(&format!(".target {chip}")), "{}", k.ptx);
                assert!(
                    !k.ptx.contains('\0'),
                    "no NUL: {:?}",
                    &k.ptx[k.ptx.len().saturating_sub(8)..]
                );
                assert!(k.ptx.contains(&format!(".entry oar_k{i}_kernel")), "{}", k.ptx);
            }
        }
    }

    #[test]
    fn gpu_kernels_take_one_pointer_per_buffer_in_launch_order() {
        use oar_backend_mlir::gpu::KernelArg;
        let p = lower(&graph(INDEXING), &BTreeMap::new()).unwrap();
        let kernels = oar_backend_mlir::gpu::kernels(&p, "sm_80", None).unwrap();
        assert_eq!(kernels.len(), p.kernels.len());
        for (k, g) in p.kernels.iter().zip(&kernels) {
            let g = g.as_ref().unwrap();
            assert_eq!(g.entry, format!("oar_k{}_kernel", g.index));
            assert_eq!(g.args.last(), Some(&KernelArg::ErrorWord), "{g:?}");
            let mut bufs: Vec<_> = g
                .args
                .iter()
                .filter_map(|a| match a {
                    KernelArg::Buffer(b) => Some(*b),
                    KernelArg::ErrorWord => None,
                })
                .collect();
            bufs.sort();
            let mut want = k.reads();
            want.extend(&k.outputs);
            want.sort();
            want.dedup();
            assert_eq!(bufs, want, "kernel {}", k.name);
            // Bare pointers: one `.u64` parameter per argument, no memref descriptors.
            let params = g.ptx.matches(&format!(".param .u64 {}_param_", g.entry)).count();
            assert_eq!(params, g.args.len(), "{}", g.ptx);
            let points: u64 = p
                .buffer(k.outputs[0])
                .ty
                .shape
                .as_static()
                .unwrap()
                .iter()
                .product::<usize>() as u64;
            assert_eq!(g.block, (256, 1, 1));
            assert_eq!(g.grid, (points.div_ceil(256).max(1) as u32, 1, 1));
        }
    }

    #[test]
    fn the_gpu_kernels_make_one_ptx_module_for_the_ptx_runtime() {
        use oar_backend_ptx::{Arch, Step};
        let p = oar_backend_ptx::lower(&graph(MIXED), &BTreeMap::new()).unwrap();
        let m = oar_backend_mlir::ptx_module(&p, Arch::Sm90, None).unwrap();
        assert_eq!(m.steps.len(), p.kernels.len());
        assert!(
            m.steps.iter().all(|s| matches!(s, Step::Launch { .. })),
            "{:?}",
            m.steps
        );
        let text = m.text();
        assert_eq!(text.matches(".version").count(), 1, "{text}");
        assert_eq!(text.matches(".target sm_90").count(), 1, "{text}");
        for e in &m.entries {
            assert!(e.error_word);
            assert!(text.contains(&format!(".entry {}(", e.name)), "{text}");
        }
        // `exp` arrives legalized: nothing is left for libdevice.
        assert_eq!(text.matches(".extern .func").count(), 0, "{text}");
        assert!(oar_backend_mlir::ptx_module::unresolved_externs(&m).is_empty());
    }

    #[test]
    fn the_mlir_gpu_backend_needs_a_gpu() {
        let r = oar_backend_mlir::MlirGpuBackend.compile(&graph(MIXED), &Weights::default());
        match (oar_backend_ptx::runtime::gpu(), r) {
            (Err(_), Err(BackendError::Unavailable { backend, reason })) => {
                assert_eq!(backend, "mlir-gpu");
                assert!(reason.contains("CUDA"), "{reason}");
            }
            (Ok(_), Ok(_)) => {}
            (g, r) => panic!("gpu: {:?}, compile: {:?}", g.err(), r.err()),
        }
    }

    #[test]
    fn llvm_ir_is_emitted() {
        let ir = oar_backend_mlir::emit_llvm(&graph(MIXED), &BTreeMap::new()).unwrap();
        assert!(ir.contains("define i32 @oar_k0("), "{ir}");
        assert!(ir.contains("@_mlir_ciface_oar_k0"), "{ir}");
    }
}
