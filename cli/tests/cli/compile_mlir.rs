//! `oar compile --target mlir`: `--emit mlir` (the module before lowering, no LLVM needed) and,
//! in an `oar` built with `--features mlir`, `--emit llvm` (the LLVM IR after the pipeline).

use crate::common::{assert_clean_error, oar, stderr, stdout};

const NET: &str = r#"graph @net {
  %x = input "x" : f32[N,3]
  %w = input "w" : f32[3,5]
  %1 = exp(%x) : f32[N,3]
  %2 = reduce_sum(%1) {axes = [1], keepdim = true} : f32[N,1]
  %3 = div(%1, %2) : f32[N,3]
  %5 = matmul(%3, %w) : f32[N,5]
  %6 = tanh(%5) : f32[N,5]
  output "y" = %6
}
"#;

fn model(dir: &std::path::Path) -> String {
    let path = dir.join("net.oir");
    std::fs::write(&path, NET).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn compile_mlir_prints_the_module() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let o = oar(&[
        "compile", &m, "--target", "mlir", "--emit", "mlir", "--bind", "N=2", "-o", "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("func.func @oar_k0("), "{text}");
    // tanh, legalized into arith ops (no math library call).
    assert!(text.contains("arith.bitcast") && !text.contains("math.tanh"), "{text}");
    assert!(text.contains("memref<6xf32>"), "N bound to 2: {text}");
    let o = oar(&["compile", &m, "--target", "mlir", "-o", "-"]);
    assert_clean_error(&o, "bind");
    let o = oar(&[
        "compile", &m, "--target", "mlir", "--emit", "exe", "--bind", "N=2", "-o", "-",
    ]);
    assert_clean_error(&o, "`mlir` or `llvm`");
    let o = oar(&["compile", &m, "--emit", "mlir", "-o", "-"]);
    assert_clean_error(&o, "--target mlir");
}

#[test]
fn compile_llvm_needs_the_feature_or_prints_llvm_ir() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let o = oar(&[
        "compile", &m, "--target", "mlir", "--emit", "llvm", "--bind", "N=2", "-o", "-",
    ]);
    if cfg!(feature = "mlir") {
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stdout(&o).contains("define i32 @oar_k0("), "{}", stdout(&o));
    } else {
        assert_clean_error(&o, "--features mlir");
    }
}

#[test]
fn mlir_gpu_writes_one_ptx_module_and_runs_only_on_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let o = oar(&[
        "compile", &m, "--target", "mlir-gpu", "--arch", "sm_90", "--bind", "N=2", "-o", "-",
    ]);
    let run = oar(&["run", &m, "--target", "mlir-gpu"]);
    if cfg!(feature = "mlir") {
        assert!(o.status.success(), "{}", stderr(&o));
        let text = stdout(&o);
        assert_eq!(text.matches(".version").count(), 1, "{text}");
        assert!(text.contains(".target sm_90"), "{text}");
        assert!(text.contains(".entry oar_k0_kernel("), "{text}");
        let o = oar(&[
            "compile", &m, "--target", "mlir-gpu", "--emit", "mlir", "--bind", "N=2", "-o", "-",
        ]);
        assert_clean_error(&o, "--emit ptx");
        if oar_backend_ptx::runtime::gpu().is_err() {
            assert_clean_error(&run, "CUDA");
        }
    } else {
        assert_clean_error(&o, "--features mlir");
        assert_clean_error(&run, "--features mlir");
    }
}
