//! Real PyTorch exports (`tools/export_torch_models.py --size small`, committed under
//! `onnx/tests/models/`; the same models from the dynamo exporter under `models/dynamo/`)
//! imported with oar-onnx and run on oar's backends, against the onnxruntime outputs committed
//! next to them.
//!
//! Tolerance: every element must satisfy `|oar - ort| <= 1e-4 * max(|ort|, FLOOR)` with the
//! absolute floor `FLOOR = 1e-2` (so values near zero are held to 1e-6 absolute): 1e-4
//! relative as the issue asks, without demanding relative precision from values that are
//! themselves rounding noise of a sum of larger terms.

use oar_ir::TensorData;
use oar_ir::backend::Backend;
use oar_ir::file::Model;
use oar_ir::npy::read_npy;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

const RTOL: f64 = 1e-4;
const FLOOR: f64 = 1e-2;
const MODELS: [&str; 4] = ["resnet18", "mobilenet_v2", "transformer_encoder", "lstm"];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models")
}

/// Where `--size full` exports live: `$OAR_ONNX_FULL_MODELS`, else `<repo>/target/models`.
fn full_dir() -> PathBuf {
    std::env::var_os("OAR_ONNX_FULL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/models"))
}

struct Case {
    model: Model,
    inputs: BTreeMap<String, TensorData>,
    want: TensorData,
}

fn case(name: &str) -> Case {
    case_in(&dir(), name)
}

fn case_in(d: &Path, name: &str) -> Case {
    let model = oar_onnx::load(&d.join(format!("{name}.onnx"))).unwrap_or_else(|e| panic!("{name}: import: {e}"));
    let x = read_npy(&d.join(format!("{name}.input_0.npy"))).unwrap();
    let want = read_npy(&d.join(format!("{name}.output_0.npy"))).unwrap();
    let specs = model.graph.input_specs();
    assert_eq!(specs.len(), 1, "{name}: one graph input");
    let inputs = BTreeMap::from([(specs[0].0.clone(), x)]);
    Case { model, inputs, want }
}

/// Largest `|got - want| / max(|want|, FLOOR)`; fails on a shape or dtype mismatch.
fn max_rel_err(name: &str, got: &TensorData, want: &TensorData) -> f64 {
    assert_eq!(got.shape(), want.shape(), "{name}: output shape");
    assert_eq!(got.dtype(), want.dtype(), "{name}: output dtype");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut worst = (0.0f64, 0usize);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let e = (a - b).abs() / b.abs().max(FLOOR);
        if e.is_nan() || e > worst.0 {
            worst = (if e.is_nan() { f64::INFINITY } else { e }, i);
        }
    }
    eprintln!(
        "{name}: max rel err {:.3e} at {} (oar {}, ort {})",
        worst.0, worst.1, g[worst.1], w[worst.1]
    );
    worst.0
}

fn check_reference(name: &str) {
    check_reference_in(&dir(), name);
}

fn check_reference_in(d: &Path, name: &str) {
    let c = case_in(d, name);
    let out = oar_backend_reference::run_graph(&c.model.graph, &c.model.weights, &c.inputs)
        .unwrap_or_else(|e| panic!("{name}: reference run: {e}"));
    assert_eq!(out.len(), 1, "{name}: one output");
    let err = max_rel_err(&format!("{name} (reference)"), &out[0].1, &c.want);
    assert!(err <= RTOL, "{name}: max relative error {err:.3e} > {RTOL:e}");
}

#[test]
fn resnet18_matches_onnxruntime() {
    check_reference("resnet18");
}

#[test]
fn mobilenet_v2_matches_onnxruntime() {
    check_reference("mobilenet_v2");
}

#[test]
fn transformer_encoder_matches_onnxruntime() {
    check_reference("transformer_encoder");
}

#[test]
fn lstm_matches_onnxruntime() {
    check_reference("lstm");
}

/// The same four models from torch's newer, torch.export-based exporter (`--exporter dynamo`,
/// opset 18), committed under `tests/models/dynamo/`: different graphs (ReduceMean instead of
/// GlobalAveragePool, Reshape instead of Flatten, other attention plumbing).
#[test]
fn dynamo_exports_match_onnxruntime() {
    for name in MODELS {
        check_reference_in(&dir().join("dynamo"), name);
    }
}

/// The full-size exports (`python3 tools/export_torch_models.py --size full --out target/models`,
/// not committed) on the reference backend: `cargo test -p oar-onnx --release --test
/// torch_models -- --ignored`.
#[test]
#[ignore = "needs the full-size exports in target/models (or $OAR_ONNX_FULL_MODELS)"]
fn full_size_models_match_onnxruntime() {
    let d = full_dir();
    assert!(
        d.join("resnet18.onnx").exists(),
        "{} has no full-size exports: run `python3 tools/export_torch_models.py --size full --out target/models`",
        d.display()
    );
    for name in MODELS {
        check_reference_in(&d, name);
    }
}

/// The same models on the `cpu` backend. A model the backend cannot compile or run yet (an
/// error, or a panic inside the backend while it is being completed) is reported and skipped,
/// so this passes either way; a model it does run must match like the reference does.
#[test]
fn torch_models_on_cpu_backend() {
    let cpu = oar_backend_cpu::CpuBackend::new();
    let mut skipped = Vec::new();
    for name in MODELS {
        let c = case(name);
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let exe = cpu
                .compile(&c.model.graph, &c.model.weights)
                .map_err(|e| format!("compile: {e}"))?;
            exe.run(&c.inputs).map_err(|e| format!("run: {e}"))
        }));
        let out = match run {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => {
                skipped.push(format!("{name}: {e}"));
                continue;
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                skipped.push(format!("{name}: backend panicked: {msg}"));
                continue;
            }
        };
        let err = max_rel_err(&format!("{name} (cpu)"), &out[0].1, &c.want);
        assert!(err <= RTOL, "{name} on cpu: max relative error {err:.3e} > {RTOL:e}");
    }
    for s in &skipped {
        eprintln!("cpu backend skipped {s}");
    }
}

/// The committed fixtures stay within the 20 MB budget.
#[test]
fn committed_models_fit_the_size_budget() {
    fn size(p: &Path) -> u64 {
        let m = std::fs::metadata(p).unwrap();
        if m.is_dir() {
            std::fs::read_dir(p).unwrap().map(|e| size(&e.unwrap().path())).sum()
        } else {
            m.len()
        }
    }
    let total = size(&dir());
    assert!(total <= 20_000_000, "onnx/tests/models holds {total} bytes (> 20 MB)");
}

/// A CNN exported with a dynamic batch axis (`tools/export_dynamic_onnx.py`): its reshape
/// targets are computed from `Shape(x)` at run time (`view(x.size(0), -1)`, a reshape to
/// `[n*c, h*w]`). One import serves batch 2 and 5, on the reference and the cpu backend, against
/// onnxruntime's outputs.
#[test]
fn dynamic_batch_export_runs_at_every_batch_size() {
    let d = dir().join("dynamic");
    let model = oar_onnx::load(&d.join("dyn_cnn.onnx")).unwrap();
    let specs = model.graph.input_specs();
    assert_eq!(specs[0].1.to_string(), "f32[batch,2,6,6]");
    let text = model.graph.to_string();
    assert!(text.contains("4*batch"), "the batch merged with the channels: {text}");
    let cpu = oar_backend_cpu::CpuBackend::new();
    let exe = cpu.compile(&model.graph, &model.weights).unwrap();
    for b in [2, 5] {
        let x = read_npy(&d.join(format!("dyn_cnn.input_{b}.npy"))).unwrap();
        let want = read_npy(&d.join(format!("dyn_cnn.output_{b}.npy"))).unwrap();
        let inputs = BTreeMap::from([(specs[0].0.clone(), x)]);
        let r = oar_backend_reference::run_graph(&model.graph, &model.weights, &inputs).unwrap();
        let err = max_rel_err(&format!("dyn_cnn batch {b} (reference)"), &r[0].1, &want);
        assert!(err <= RTOL, "batch {b}: reference max relative error {err:.3e}");
        let c = exe.run(&inputs).unwrap();
        let err = max_rel_err(&format!("dyn_cnn batch {b} (cpu)"), &c[0].1, &want);
        assert!(err <= RTOL, "batch {b}: cpu max relative error {err:.3e}");
    }
}
