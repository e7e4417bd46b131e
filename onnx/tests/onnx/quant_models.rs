//! CNNs quantized by ONNX Runtime's `quantize_static` (`tools/export_quant_models.py`,
//! committed under `onnx/tests/models/quant/`: QDQ with int8 and with uint8 activations, and
//! the QOperator form with QLinearConv / QLinearMatMul / com.microsoft.QLinearAdd) imported and
//! run on the reference and the cpu backend, against onnxruntime's outputs. The QOperator model
//! has 7-bit weights (`reduce_range`): onnxruntime's U8S8 QLinearConv saturates pair sums at
//! 16 bits on x86, so with 8-bit weights its own output is not the exact integer result (the
//! tool's docs give the numbers); oar's integer ops are exact.
//!
//! Tolerance: one quantization step of the output (the scale of the tensor the output is
//! dequantized from, recorded in the manifest): a float rounding that lands on the other side
//! of a rounding boundary anywhere in the network may move a value by one step, never more on
//! these models. Most elements agree exactly; the test prints how many.

use oar_ir::TensorData;
use oar_ir::backend::Backend;
use oar_ir::npy::read_npy;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models/quant")
}

fn manifest() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("manifest.json")).unwrap()).unwrap()
}

/// Compare `got` with onnxruntime's output: every element within `step`; returns how many
/// are exactly equal.
fn within_one_step(label: &str, got: &TensorData, want: &TensorData, step: f64) -> usize {
    assert_eq!(got.tensor_type(), want.tensor_type(), "{label}");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut exact = 0;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let d = (a - b).abs();
        assert!(
            d <= step * (1.0 + 1e-6),
            "{label}[{i}]: oar {a} vs onnxruntime {b}: {:.2} steps of {step}",
            d / step
        );
        exact += usize::from(d <= step * 1e-6);
    }
    eprintln!("{label}: {exact} of {} elements equal, the rest one step off", g.len());
    exact
}

#[test]
fn onnxruntime_quantized_cnns_match_onnxruntime() {
    let m = manifest();
    let models = m["models"].as_object().unwrap();
    assert_eq!(models.len(), 3);
    let cpu = oar_backend_cpu::CpuBackend::new();
    for (name, info) in models {
        let model = oar_onnx::load(&dir().join(format!("{name}.onnx"))).unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = model.graph.to_string();
        let expect: &[&str] = if name.contains("qop") {
            &["conv_integer", "matmul_integer", "requantize"]
        } else {
            &["quantize_linear", "dequantize_linear"]
        };
        for op in expect {
            assert!(text.contains(op), "{name}: no {op} in the imported graph");
        }
        let x = read_npy(&dir().join(format!("{name}.input_0.npy"))).unwrap();
        let want = read_npy(&dir().join(format!("{name}.output_0.npy"))).unwrap();
        let inputs = BTreeMap::from([("x".to_string(), x)]);
        let step = info["output_step"].as_f64().unwrap();
        let r = oar_backend_reference::run_graph(&model.graph, &model.weights, &inputs).unwrap();
        let exact = within_one_step(&format!("{name} (reference)"), &r[0].1, &want, step);
        assert!(exact * 2 >= want.len(), "{name}: most outputs should agree exactly");
        let exe = cpu
            .compile(&model.graph, &model.weights)
            .unwrap_or_else(|e| panic!("{name}: cpu: {e}"));
        let c = exe.run(&inputs).unwrap_or_else(|e| panic!("{name}: cpu run: {e}"));
        within_one_step(&format!("{name} (cpu)"), &c[0].1, &want, step);
    }
}

/// The `quantize` pass turns the QDQ models' dequantize → conv2d / matmul → quantize chains into
/// `conv_integer` / `matmul_integer` + `requantize` (no float convolution or matmul is left), and
/// the rewritten models still match onnxruntime within one output step on the reference and
/// the cpu backend.
#[test]
fn the_quantize_pass_runs_qdq_models_on_integers() {
    use oar_passes::{Pass, Quantize};
    let m = manifest();
    let cpu = oar_backend_cpu::CpuBackend::new();
    for name in ["cnn_qdq_s8s8", "cnn_qdq_u8s8"] {
        let mut model = oar_onnx::load(&dir().join(format!("{name}.onnx"))).unwrap();
        assert!(Quantize.run(&mut model.graph).unwrap(), "{name}: nothing rewritten");
        oar_ir::verify(&model.graph).unwrap();
        let text = model.graph.to_string();
        assert_eq!(text.matches("conv_integer").count(), 2, "{name}:\n{text}");
        assert_eq!(text.matches("matmul_integer").count(), 1, "{name}");
        assert_eq!(text.matches("requantize").count(), 3, "{name}");
        assert!(
            !text.contains("conv2d") && !text.contains(" matmul("),
            "{name}:\n{text}"
        );
        let x = read_npy(&dir().join(format!("{name}.input_0.npy"))).unwrap();
        let want = read_npy(&dir().join(format!("{name}.output_0.npy"))).unwrap();
        let inputs = BTreeMap::from([("x".to_string(), x)]);
        let step = m["models"][name]["output_step"].as_f64().unwrap();
        let r = oar_backend_reference::run_graph(&model.graph, &model.weights, &inputs).unwrap();
        within_one_step(&format!("{name} quantized (reference)"), &r[0].1, &want, step);
        let exe = cpu.compile(&model.graph, &model.weights).unwrap();
        let c = exe.run(&inputs).unwrap();
        within_one_step(&format!("{name} quantized (cpu)"), &c[0].1, &want, step);
    }
}
