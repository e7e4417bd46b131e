//! `oar compile --target ptx --emit ptx`: the PTX module of a model, assembled with `ptxas`
//! when it is available (see `conformance/tests/kit/ptxas.rs` for the skip rule).

use crate::common::{assert_clean_error, oar, stderr, stdout};
use oar::ir::file::Model;
use oar::ir::{TensorData, Weights};
use oar_backend_ptx::ptxas::{assemble, find_ptxas};
use std::path::{Path, PathBuf};

/// A scaled softmax over rows, a column max, and a matmul with bias and relu.
const NET: &str = r#"
graph @net {
  %x = input "x" : f32[N,3]
  %s = param "s" : f32[3]
  %w = param "w" : f32[3,5]
  %b = param "b" : f32[5]
  %0 = mul(%x, %s) : f32[N,3]
  %1 = exp(%0) : f32[N,3]
  %2 = reduce_sum(%1) {axes = [1], keepdim = true} : f32[N,1]
  %3 = div(%1, %2) : f32[N,3]
  %4 = reduce_max(%x) {axes = [0], keepdim = false} : f32[3]
  %5 = matmul(%3, %w) : f32[N,5]
  %6 = add(%5, %b) : f32[N,5]
  %z = constant dense<0.0> : f32[]
  %7 = max(%6, %z) : f32[N,5]
  output "p" = %3
  output "m" = %4
  output "y" = %7
}
"#;

fn model(dir: &Path) -> PathBuf {
    let graph = oar::ir::text::parse_graph(NET).unwrap();
    let t = |shape: Vec<usize>| {
        let n: usize = shape.iter().product();
        TensorData::from_vec(shape, (0..n).map(|i| i as f32 * 0.1 - 0.3).collect::<Vec<f32>>()).unwrap()
    };
    let weights = Weights::from([
        ("s".to_string(), t(vec![3])),
        ("w".to_string(), t(vec![3, 5])),
        ("b".to_string(), t(vec![5])),
    ]);
    let path = dir.join("net.oar");
    Model { graph, weights }.save(&path).unwrap();
    path
}

#[test]
fn compile_ptx_writes_a_module_that_ptxas_assembles() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    for arch in ["sm_80", "sm_90"] {
        let out = dir.path().join(format!("net.{arch}.ptx"));
        let o = oar(&[
            "compile",
            m.to_str().unwrap(),
            "--target",
            "ptx",
            "--emit",
            "ptx",
            "--arch",
            arch,
            "--bind",
            "N=4",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stdout(&o).contains("PTX entries"), "{}", stdout(&o));
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.contains(&format!(".target {arch}")));
        assert!(text.contains("fma.rn.f32"), "the matmul is a generated tiled kernel");
        assert!(text.contains("shfl.sync.bfly.b32"), "the reductions use warp shuffles");
        assert!(text.matches(".visible .entry").count() >= 3, "{text}");
        if let Some(ptxas) = find_ptxas() {
            assemble(&ptxas, &out, &text, arch).unwrap_or_else(|e| panic!("ptxas -arch={arch}: {e}"));
        }
    }
}

/// `--precision bf16|f16` on the PTX target: the matmul's operands and result are half buffers
/// (16-bit loads and stores, converted to f32 around f32 arithmetic), the matmul runs on the
/// tensor cores (`mma.sync` m16n8k16 with f32 accumulators), the softmax stays f32, and ptxas
/// assembles the module for sm_80 and sm_90.
#[test]
fn compile_ptx_in_mixed_precision() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    for (precision, cvt) in [("bf16", "cvt.rn.bf16.f32"), ("f16", "cvt.rn.f16.f32")] {
        for arch in ["sm_80", "sm_90"] {
            let out = dir.path().join(format!("net.{precision}.{arch}.ptx"));
            let o = oar(&[
                "compile",
                m.to_str().unwrap(),
                "--target",
                "ptx",
                "--precision",
                precision,
                "--arch",
                arch,
                "--bind",
                "N=4",
                "-o",
                out.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{}", stderr(&o));
            let text = std::fs::read_to_string(&out).unwrap();
            assert!(
                text.contains("ld.global.b16") || text.contains("ld.global.nc.b16"),
                "{precision}: half loads"
            );
            assert!(text.contains(cvt), "{precision}: rounding to {precision} with {cvt}");
            let mma = format!("mma.sync.aligned.m16n8k16.row.col.f32.{precision}.{precision}.f32");
            assert_eq!(
                text.matches(&mma).count(),
                2,
                "{precision}: two m16n8k16 tiles per step"
            );
            if let Some(ptxas) = find_ptxas() {
                assemble(&ptxas, &out, &text, arch).unwrap_or_else(|e| panic!("{precision} ptxas -arch={arch}: {e}"));
            }
        }
    }
}

#[test]
fn compile_ptx_errors_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let out = dir.path().join("x.ptx");
    let (m, out) = (m.to_str().unwrap(), out.to_str().unwrap());
    let o = oar(&["compile", m, "--target", "ptx", "--emit", "exe", "-o", out]);
    assert_clean_error(&o, "--emit ptx");
    let o = oar(&["compile", m, "--target", "ptx", "-o", out]);
    assert_clean_error(&o, "bind");
    let o = oar(&["compile", m, "--emit", "ptx", "-o", out]);
    assert_clean_error(&o, "--target ptx");
}

#[test]
fn ptx_is_listed_and_running_without_a_gpu_is_one_clear_error() {
    let o = oar(&["backends"]);
    assert!(stdout(&o).contains("ptx "), "{}", stdout(&o));
    if oar_backend_ptx::runtime::gpu().is_ok() {
        eprintln!("a GPU is present: the no-driver error path is not exercised here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let graph = oar::ir::text::parse_graph(
        "graph @g {\n  %w = param \"w\" : f32[3]\n  %0 = exp(%w) : f32[3]\n  output \"y\" = %0\n}\n",
    )
    .unwrap();
    let w = TensorData::from_vec(vec![3], vec![0.0f32, 1.0, 2.0]).unwrap();
    let path = dir.path().join("g.oar");
    Model {
        graph,
        weights: Weights::from([("w".to_string(), w)]),
    }
    .save(&path)
    .unwrap();
    let o = oar(&["run", path.to_str().unwrap(), "--backend", "ptx"]);
    let msg = if oar_backend_ptx::runtime::driver_present() {
        "ptx"
    } else {
        "no CUDA driver (libcuda.so not found)"
    };
    assert_clean_error(&o, msg);
}
