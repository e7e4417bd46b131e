//! The model zoo end to end: every model traces (`jit::save` to a `.oar` file), exports to ONNX
//! that onnxruntime runs (`oar export`, `tools/ort_run.py`), and compiles with `oar compile`
//! into an executable; onnxruntime's and the executable's outputs match the eager model's
//! (within 1e-3 of the largest output, + 1e-5: long f32 sums in other orders).
//!
//! CI runs a sample that covers every family at reduced size (small inputs, tiny
//! configurations). `OAR_ZOO_FULL=1` runs every zoo model at its standard size too (several
//! minutes and a few GB of weight files, written to a temporary directory):
//! `OAR_ZOO_FULL=1 cargo test --release -p oar-cli --test cli zoo::`.

use crate::common::{oar, stderr};
use oar::ir::TensorData;
use oar::jit::InputSpec;
use oar::nn::Layer;
use oar::rec::models::{CtrConfig, DeepFM, WideDeep};
use oar::text::models::{
    BertConfig, BertForSequenceClassification, GruClassifier, LstmClassifier, Pooling, RnnClassifierConfig,
};
use oar::vision::models as vm;
use oar::{DType, Tensor};
use std::path::Path;
use std::process::Command;

type Build = fn() -> oar::Result<Box<dyn Layer>>;

/// A zoo model, its input and whether CI's sample runs it.
struct Case {
    name: &'static str,
    build: Build,
    shape: &'static [usize],
    /// `Some(n)`: integer ids below `n` (text models); `None`: f32 images or features.
    ids_below: Option<i64>,
    sampled: bool,
}

fn boxed<L: Layer + 'static>(l: oar::Result<L>) -> oar::Result<Box<dyn Layer>> {
    Ok(Box::new(l?))
}

fn tiny_bert() -> BertConfig {
    BertConfig {
        vocab_size: 100,
        hidden_size: 32,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        intermediate_size: 64,
        max_position_embeddings: 32,
        num_labels: 3,
        ..BertConfig::default()
    }
}

fn rnn_config() -> RnnClassifierConfig {
    RnnClassifierConfig {
        vocab_size: 100,
        embed_dim: 16,
        hidden_size: 24,
        num_layers: 2,
        bidirectional: true,
        num_classes: 4,
        pooling: Pooling::Mean,
    }
}

fn ctr_config() -> CtrConfig {
    CtrConfig {
        field_dims: vec![10, 20, 30],
        dense_dim: 4,
        embed_dim: 8,
        hidden_sizes: vec![32, 16],
        dropout: 0.0,
    }
}

const IMG32: &[usize] = &[2, 3, 32, 32];
const IMG64: &[usize] = &[2, 3, 64, 64];
const IMG224: &[usize] = &[1, 3, 224, 224];

fn cases() -> Vec<Case> {
    let c = |name, build: Build, shape, sampled| Case {
        name,
        build,
        shape,
        ids_below: None,
        sampled,
    };
    vec![
        // The sample: every family, small.
        c("lenet", || boxed(vm::lenet(10)), &[2, 1, 28, 28], true),
        c("resnet18", || boxed(vm::resnet18(10)), IMG32, true),
        c("resnet50", || boxed(vm::resnet50(10)), IMG32, true),
        c("mobilenet_v1_025", || boxed(vm::mobilenet_v1(0.25, 10)), IMG32, true),
        c("mobilenet_v2_035", || boxed(vm::mobilenet_v2(0.35, 10)), IMG32, true),
        c(
            "mobilenet_v3_small",
            || boxed(vm::mobilenet_v3_small(1.0, 10)),
            IMG32,
            true,
        ),
        c("shufflenet_v2_x0_5", || boxed(vm::shufflenet_v2_x0_5(10)), IMG32, true),
        c("squeezenet1_1", || boxed(vm::squeezenet1_1(10)), IMG64, true),
        c(
            "densenet_small",
            || boxed(vm::DenseNet::new(&vm::DenseNetConfig::new(12, &[2, 3, 2], 24), 10)),
            IMG32,
            true,
        ),
        c("googlenet", || boxed(vm::googlenet(10, false)), IMG64, true),
        c(
            "vit_small",
            || {
                boxed(vm::VisionTransformer::new(&vm::ViTConfig::new(
                    32, 8, 2, 4, 64, 128, 10,
                )))
            },
            IMG32,
            true,
        ),
        c("unet", || boxed(vm::unet(3, 2, 8)), IMG32, true),
        c("wide_deep", || boxed(WideDeep::new(&ctr_config())), &[4, 7], true),
        c("deepfm", || boxed(DeepFM::new(&ctr_config())), &[4, 7], true),
        Case {
            name: "bert_tiny",
            build: || boxed(BertForSequenceClassification::new(&tiny_bert())),
            shape: &[2, 16],
            ids_below: Some(100),
            sampled: true,
        },
        Case {
            name: "lstm_classifier",
            build: || boxed(LstmClassifier::new(&rnn_config())),
            shape: &[2, 12],
            ids_below: Some(100),
            sampled: true,
        },
        Case {
            name: "gru_classifier",
            build: || boxed(GruClassifier::new(&rnn_config())),
            shape: &[2, 12],
            ids_below: Some(100),
            sampled: true,
        },
        // Full size: OAR_ZOO_FULL=1.
        c("alexnet", || boxed(vm::alexnet(1000)), IMG224, false),
        c("vgg11", || boxed(vm::vgg11(false, 1000)), IMG224, false),
        c("vgg13_bn", || boxed(vm::vgg13(true, 1000)), IMG224, false),
        c("vgg16", || boxed(vm::vgg16(false, 1000)), IMG224, false),
        c("vgg19_bn", || boxed(vm::vgg19(true, 1000)), IMG224, false),
        c("resnet34", || boxed(vm::resnet34(1000)), IMG224, false),
        c("resnet101", || boxed(vm::resnet101(1000)), IMG224, false),
        c("resnet152", || boxed(vm::resnet152(1000)), IMG224, false),
        c("resnext50_32x4d", || boxed(vm::resnext50_32x4d(1000)), IMG224, false),
        c("wide_resnet50_2", || boxed(vm::wide_resnet50_2(1000)), IMG224, false),
        c("mobilenet_v1", || boxed(vm::mobilenet_v1(1.0, 1000)), IMG224, false),
        c("mobilenet_v2", || boxed(vm::mobilenet_v2(1.0, 1000)), IMG224, false),
        c(
            "mobilenet_v3_large",
            || boxed(vm::mobilenet_v3_large(1.0, 1000)),
            IMG224,
            false,
        ),
        c(
            "shufflenet_v2_x2_0",
            || boxed(vm::shufflenet_v2_x2_0(1000)),
            IMG224,
            false,
        ),
        c("squeezenet1_0", || boxed(vm::squeezenet1_0(1000)), IMG224, false),
        c("densenet121", || boxed(vm::densenet121(1000)), IMG224, false),
        c(
            "inception_v3",
            || boxed(vm::inception_v3(1000, false)),
            &[1, 3, 299, 299],
            false,
        ),
        c("vit_b_16", || boxed(vm::vit_b_16(1000)), IMG224, false),
        c("fcn_resnet50", || boxed(vm::fcn_resnet50(21, false)), IMG224, false),
        Case {
            name: "bert_base",
            build: || boxed(BertForSequenceClassification::new(&BertConfig::default())),
            shape: &[1, 128],
            ids_below: Some(30522),
            sampled: false,
        },
    ]
}

/// A deterministic input: f32 noise, or ids below `n`. WideDeep/DeepFM's packed input holds
/// 4 dense features, then one id per field (below 10, 20, 30).
fn input(case: &Case) -> Tensor {
    let n: usize = case.shape.iter().product();
    match (case.ids_below, case.name) {
        (Some(v), _) => Tensor::from_vec((0..n as i64).map(|i| (i * 7919 + 13) % v).collect(), case.shape).unwrap(),
        (None, "wide_deep" | "deepfm") => {
            let row = |r: usize| {
                [
                    0.5,
                    -1.0,
                    r as f32 * 0.1,
                    2.0,
                    (r % 10) as f32,
                    (3 * r % 20) as f32,
                    (7 * r % 30) as f32,
                ]
            };
            Tensor::from_vec((0..case.shape[0]).flat_map(row).collect(), case.shape).unwrap()
        }
        _ => {
            oar::seed(17);
            oar::randn(case.shape, DType::F32).unwrap()
        }
    }
}

fn assert_matches(got: &TensorData, want: &[f32], what: &str) {
    let got = got.to_f64_vec();
    assert_eq!(got.len(), want.len(), "{what}: output size");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let b = *b as f64;
        assert!(
            (a - b).abs() <= 1e-3 * scale + 1e-5,
            "{what}[{i}]: {a} vs eager {b} (largest {scale})"
        );
    }
}

/// Trace, export + onnxruntime, compile + run: each against the eager output.
fn check(case: &Case, dir: &Path) {
    let mut net = (case.build)().unwrap_or_else(|e| panic!("{}: {e}", case.name));
    net.eval();
    let x = input(case);
    let eager = {
        let _g = oar::no_grad();
        net.forward(&x).unwrap_or_else(|e| panic!("{}: {e}", case.name))
    };
    let want = eager.to_vec::<f32>().unwrap();
    let dtype = if case.ids_below.is_some() {
        DType::I64
    } else {
        DType::F32
    };
    let dims: Vec<Option<usize>> = case.shape.iter().map(|&d| Some(d)).collect();
    let model = dir.join(format!("{}.oar", case.name));
    oar::jit::save(net.as_ref(), &model, &InputSpec::new(&dims, dtype, "x"))
        .unwrap_or_else(|e| panic!("{}: to_static: {e}", case.name));
    let x_npy = dir.join(format!("{}.x.npy", case.name));
    oar::ir::npy::write_npy(&x_npy, &x.try_data().unwrap()).unwrap();

    let onnx = dir.join(format!("{}.onnx", case.name));
    let o = oar(&["export", model.to_str().unwrap(), "-o", onnx.to_str().unwrap()]);
    assert!(o.status.success(), "{}: export: {}", case.name, stderr(&o));
    let ort_out = dir.join(format!("{}.ort", case.name));
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/ort_run.py");
    let r = Command::new("python3")
        .arg(&tool)
        .args([onnx.to_str().unwrap(), ort_out.to_str().unwrap()])
        .arg(format!("x={}", x_npy.display()))
        .output()
        .unwrap();
    assert!(
        r.status.success(),
        "{}: onnxruntime: {}",
        case.name,
        String::from_utf8_lossy(&r.stderr)
    );
    let ort = oar::ir::npy::read_npy(&ort_out.join("output_0.npy")).unwrap();
    assert_matches(&ort, &want, &format!("{} (onnxruntime)", case.name));

    let exe = dir.join(case.name);
    let o = oar(&[
        "compile",
        model.to_str().unwrap(),
        "--target",
        "cpu",
        "--emit",
        "exe",
        "-o",
        exe.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}: compile: {}", case.name, stderr(&o));
    let out = dir.join(format!("{}.out", case.name));
    let r = Command::new(&exe)
        .args([
            "--input",
            &format!("x={}", x_npy.display()),
            "--output-dir",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        r.status.success(),
        "{}: exe: {}",
        case.name,
        String::from_utf8_lossy(&r.stderr)
    );
    let got = oar::ir::npy::read_npy(&out.join("output.npy")).unwrap();
    assert_matches(&got, &want, &format!("{} (compiled)", case.name));
    // Large weight files go as soon as the case is done.
    for p in [&model, &onnx, &exe] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn zoo_models_trace_export_and_compile() {
    let full = std::env::var_os("OAR_ZOO_FULL").is_some_and(|v| v == "1");
    let dir = tempfile::tempdir().unwrap();
    let mut ran = Vec::new();
    for case in cases().iter().filter(|c| c.sampled || full) {
        let start = std::time::Instant::now();
        check(case, dir.path());
        ran.push(format!("{} {:.1}s", case.name, start.elapsed().as_secs_f64()));
    }
    eprintln!("zoo: {}", ran.join(", "));
}
