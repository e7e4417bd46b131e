//! Quantization ops through the eager API and a compiled training step: `quantize_linear` /
//! `dequantize_linear` (ONNX semantics: divide, round half to even, add the zero point,
//! saturate) against hand-computed values, `fake_quant` as exactly their composition, and its
//! gradients — straight-through for x, LSQ for a learned scale and zero point — against
//! hand-computed values, then the same QAT step traced (`to_static_step`) and run by the cpu
//! backend against eager. Every comparison here is exact except the traced step's parameters
//! (the compiled matmul sums in another order: 1e-5 relative).

use oar::ir::{DType, Element, TensorData};
use oar::jit::{InputSpec, to_static_step};
use oar::nn::functional as F;
use oar::nn::{Layer, Linear};
use oar::optimizer::{Optimizer, SGD};
use oar::{Error, Tensor};

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn ints<T: Element + Copy>(x: &Tensor) -> Vec<T> {
    x.to_vec::<T>().unwrap()
}

#[test]
fn quantize_linear_rounds_half_to_even_adds_the_zero_point_and_saturates() {
    // x / 0.5: -3.0 -2.5 -0.5 0.5 1.5 2.2 3.0 300 -300
    let x = t(&[-1.5, -1.25, -0.25, 0.25, 0.75, 1.1, 1.5, 150.0, -150.0], &[9]);
    let s = Tensor::scalar(0.5f32);
    let q = F::quantize_linear(&x, &s, None, 0, DType::I8).unwrap();
    assert_eq!(q.dtype(), DType::I8);
    assert_eq!(ints::<i8>(&q), vec![-3, -2, 0, 0, 2, 2, 3, 127, -128]);
    let z = Tensor::scalar(10u8);
    let q = F::quantize_linear(&x, &s, Some(&z), 0, DType::U8).unwrap();
    assert_eq!(ints::<u8>(&q), vec![7, 8, 10, 10, 12, 12, 13, 255, 0]);
}

#[test]
fn per_channel_scales_run_along_their_axis() {
    // Rows scaled by 0.25, 1 and 8 (exact divisions); zero points -1, 0, 1.
    let x = t(&[1.25, -0.5, 0.875, 3.0, -7.5, 0.4, 20.0, 4.0, -800.0], &[3, 3]);
    let s = t(&[0.25, 1.0, 8.0], &[3]);
    let z = Tensor::from_vec(vec![-1i8, 0, 1], &[3]).unwrap();
    let q = F::quantize_linear(&x, &s, Some(&z), 0, DType::I8).unwrap();
    // x/s: 5 -2 3.5 | 3 -7.5 0.4 | 2.5 0.5 -100 → rounded 5 -2 4 | 3 -8 0 | 2 0 -100, + z.
    assert_eq!(ints::<i8>(&q), vec![4, -3, 3, 3, -8, 0, 3, 1, -99]);
    let back = F::dequantize_linear(&q, &s, Some(&z), 0).unwrap();
    assert_eq!(back.dtype(), DType::F32);
    assert_eq!(
        back.to_vec::<f32>().unwrap(),
        vec![1.25, -0.5, 1.0, 3.0, -8.0, 0.0, 16.0, 0.0, -800.0]
    );
    // Along axis 1 the same scales apply per column.
    let q1 = F::quantize_linear(&x, &s, None, 1, DType::I8).unwrap();
    assert_eq!(ints::<i8>(&q1), vec![5, 0, 0, 12, -8, 0, 80, 4, -100]);
}

#[test]
fn fake_quant_is_quantize_then_dequantize_bit_for_bit() {
    oar::seed(3);
    let x = (&oar::randn(&[4, 6], DType::F32).unwrap() * 2.0).unwrap();
    let s = t(&[0.02, 0.05, 0.011, 0.3], &[4]);
    let zi = Tensor::from_vec(vec![0u8, 128, 3, 250], &[4]).unwrap();
    let zf = zi.cast(DType::F32).unwrap();
    let q = F::quantize_linear(&x, &s, Some(&zi), 0, DType::U8).unwrap();
    let want = F::dequantize_linear(&q, &s, Some(&zi), 0).unwrap();
    let got = F::fake_quant(&x, &s, Some(&zf), 0, 0, 255).unwrap();
    assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
}

#[test]
fn fake_quant_gradients_pass_straight_through_and_learn_the_scale() {
    // scale 0.5, zero point 1, range [-2, 2]: x/s = -2.6 -1 0.4 1.2 3
    // q = round(x/s) + 1 = -2 0 1 2 4 → inside: yes yes yes no no (2 is inside; 4 above;
    // -2 is inside) — so: -2 in, 0 in, 1 in, 2 in, 4 out.
    let x = t(&[-1.3, -0.5, 0.2, 0.6, 1.5], &[5]).requires_grad_(true).unwrap();
    let s = Tensor::scalar(0.5f32).requires_grad_(true).unwrap();
    let z = Tensor::scalar(1.0f32).requires_grad_(true).unwrap();
    let y = F::fake_quant(&x, &s, Some(&z), 0, -2, 2).unwrap();
    // Forward: (clamp(q) - 1) * 0.5 = -1.5 -0.5 0 0.5 0.5
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![-1.5, -0.5, 0.0, 0.5, 0.5]);
    let dy = t(&[1.0, 2.0, 3.0, 4.0, 5.0], &[5]);
    (&y * &dy).unwrap().sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 0.0]
    );
    // d/ds: inside round(x/s) - x/s = -3+2.6, -1+1, 0-0.4, 1-1.2 (each ×dy); above: qmax - z = 1.
    let ds = 1.0 * (-3.0f32 + 2.6) + 2.0 * 0.0 + 3.0 * (0.0 - 0.4) + 4.0 * (1.0 - 1.2) + 5.0 * 1.0;
    let got = s.grad().unwrap().item().unwrap() as f32;
    assert!((got - ds).abs() <= 1e-5, "d/ds {got} vs {ds}");
    // d/dz: 0 inside, -s·dy outside.
    assert_eq!(z.grad().unwrap().item().unwrap(), -2.5);
}

#[test]
fn bad_quantization_parameters_are_typed_errors_naming_the_op() {
    let x = t(&[1.0; 6], &[2, 3]);
    let msg = |r: oar::Result<Tensor>| match r {
        Err(e @ Error::Ir(_)) => e.to_string(),
        other => panic!("expected an IR type error, got {other:?}"),
    };
    let m = msg(F::quantize_linear(&x, &t(&[0.1, 0.2], &[2]), None, 1, DType::I8));
    assert!(m.contains("quantize_linear") && m.contains("axis 1"), "{m}");
    let m = msg(F::quantize_linear(&x, &Tensor::scalar(0.1f32), None, 0, DType::I32));
    assert!(m.contains("i8 or u8"), "{m}");
    let m = msg(F::quantize_linear(
        &x,
        &Tensor::scalar(0.1f32),
        Some(&Tensor::scalar(0i8)),
        0,
        DType::U8,
    ));
    assert!(m.contains("zero point"), "{m}");
    let m = msg(F::dequantize_linear(&x, &Tensor::scalar(0.1f32), None, 0));
    assert!(m.contains("dequantize_linear") && m.contains("i8, u8 or i32"), "{m}");
    let m = msg(F::fake_quant(&x, &Tensor::scalar(0.1f32), None, 0, 5, 4));
    assert!(m.contains("fake_quant") && m.contains("empty"), "{m}");
}

/// A linear layer whose weight is fake-quantized per output channel (i8, symmetric) with a
/// learned scale, as quantization-aware training runs it.
struct QatLinear {
    lin: Linear,
    scale: Tensor,
}

impl QatLinear {
    fn new() -> QatLinear {
        let lin = Linear::new(4, 3).unwrap();
        let scale = Tensor::parameter(TensorData::from_vec(vec![3], vec![0.02f32, 0.03, 0.05]).unwrap()).unwrap();
        QatLinear { lin, scale }
    }
}

impl Layer for QatLinear {
    fn forward(&self, x: &Tensor) -> oar::Result<Tensor> {
        // Weight [in, out]: the output channel is axis 1.
        let w = F::fake_quant(self.lin.weight(), &self.scale, None, 1, -127, 127)?;
        F::linear(x, &w, self.lin.bias_tensor())
    }
    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("scale".into(), self.scale.clone())]
    }
    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("lin".into(), &self.lin)]
    }
}

#[test]
fn a_traced_qat_step_matches_eager() {
    oar::seed(21);
    let eager = QatLinear::new();
    let traced = QatLinear::new();
    traced
        .set_state_dict(&eager.state_dict().into_iter().map(|(k, t)| (k, t.data())).collect())
        .unwrap();
    let mut opt_e = SGD::new(eager.parameters(), 0.1);
    let mut opt_s = SGD::new(traced.parameters(), 0.1);
    let loss = |m: &QatLinear, x: &Tensor| -> oar::Result<Tensor> {
        let y = m.forward(x)?;
        (&y * &y)?.mean(&[], false)
    };
    let spec = InputSpec::new(&[None, Some(4)], DType::F32, "x");
    let step = to_static_step(&traced, &[spec], |xs| {
        let l = loss(&traced, &xs[0])?;
        l.backward()?;
        opt_s.step()?;
        opt_s.clear_grad();
        Ok(vec![l.detach()])
    })
    .unwrap();
    assert!(step.graph().to_string().contains("fake_quant"), "{}", step.graph());
    for i in 0..3 {
        let x = oar::randn(&[5, 4], DType::F32).unwrap();
        let le = loss(&eager, &x).unwrap();
        le.backward().unwrap();
        opt_e.step().unwrap();
        opt_e.clear_grad();
        let ls = step.call(&[&x]).unwrap().remove(0);
        let (le, ls) = (le.item().unwrap(), ls.item().unwrap());
        assert!(
            (le - ls).abs() <= 1e-5 * le.abs().max(1e-3),
            "step {i}: loss {le} vs {ls}"
        );
        for ((n, a), (_, b)) in eager.state_dict().iter().zip(traced.state_dict().iter()) {
            let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
            for (p, q) in a.iter().zip(&b) {
                assert!(
                    (p - q).abs() <= 1e-5 * p.abs().max(1e-2),
                    "step {i}: {n}: {a:?} vs {b:?}"
                );
            }
        }
    }
    // The scale learned something.
    assert_ne!(eager.scale.to_vec::<f32>().unwrap(), vec![0.02, 0.03, 0.05]);
}

/// Test accuracy of `model` on the 360 test digits.
fn digits_accuracy(model: &dyn Layer) -> f64 {
    use oar::io::DataLoader;
    use oar::io::datasets::{Digits, Split};
    let _ng = oar::no_grad();
    let test = DataLoader::new(Digits::new(Split::Test).unwrap()).batch_size(400);
    let (x, y) = test.into_iter().next().unwrap().unwrap();
    let pred = model
        .forward(&x)
        .unwrap()
        .argmax(-1, false)
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    let want = y.to_vec::<i64>().unwrap();
    pred.iter().zip(&want).filter(|(p, w)| p == w).count() as f64 / want.len() as f64
}

/// The 360 test digits and their labels.
fn digits_test() -> (Tensor, Vec<i64>) {
    use oar::io::DataLoader;
    use oar::io::datasets::{Digits, Split};
    let test = DataLoader::new(Digits::new(Split::Test).unwrap()).batch_size(400);
    let (x, y) = test.into_iter().next().unwrap().unwrap();
    (x, y.to_vec::<i64>().unwrap())
}

/// `model`'s first output on `x` (its one input), run by onnxruntime (`tools/ort_run.py`; CI
/// installs it).
fn ort_logits(model: &oar::ir::file::Model, x: &oar::ir::TensorData) -> Vec<f32> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    oar::onnx::save(model, &path).unwrap();
    let xp = dir.path().join("x.npy");
    oar::ir::npy::write_npy(&xp, x).unwrap();
    let input = &model.graph.input_specs()[0].0;
    let out = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tools/ort_run.py"))
        .arg(&path)
        .arg(dir.path().join("out"))
        .arg(format!("{input}={}", xp.display()))
        .output()
        .expect("python3 runs tools/ort_run.py");
    assert!(
        out.status.success(),
        "onnxruntime: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let y = oar::ir::npy::read_npy(&dir.path().join("out/output_0.npy")).unwrap();
    y.to_vec::<f32>().unwrap()
}

/// `epochs` epochs of Adam on the digits training set (batch 64, fixed order).
fn train_digits(model: &mut dyn Layer, epochs: usize, lr: f64) {
    use oar::io::DataLoader;
    use oar::io::datasets::{Digits, Split};
    use oar::nn::functional::cross_entropy;
    use oar::optimizer::Adam;
    model.train();
    let mut opt = Adam::new(model.named_parameters(), lr);
    let train = DataLoader::new(Digits::new(Split::Train).unwrap())
        .batch_size(64)
        .shuffle(true)
        .seed(0);
    for _ in 0..epochs {
        for batch in &train {
            let (x, y) = batch.unwrap();
            let loss = cross_entropy(&model.forward(&x).unwrap(), &y, F::Reduction::Mean).unwrap();
            loss.backward().unwrap();
            opt.step().unwrap();
            opt.clear_grad();
        }
    }
    model.eval();
}

/// The digits CNN trained in f32, then quantized: PTQ (entropy-calibrated u8 activations on 4
/// training batches, per-channel i8 weights) keeps the test accuracy within 1 point of f32, and
/// one epoch of QAT from the f32 weights within 0.5 points. The accuracy is the simulated int8
/// model's (fake quantization: the values int8 kernels compute, up to the float rounding of
/// the accumulation).
#[test]
fn ptq_and_qat_of_the_digits_cnn_keep_f32_accuracy() {
    use crate::common::{deterministic, digits_cnn};
    use oar::io::DataLoader;
    use oar::io::datasets::{Digits, Split};
    use oar::quantization::{ActivationObserver, Calibration, PTQ, QAT, QuantConfig};
    let mut model = digits_cnn();
    deterministic(&model, 0);
    train_digits(&mut model, 6, 5e-3);
    let f32_acc = digits_accuracy(&model);
    assert!(f32_acc > 0.9, "f32 accuracy {f32_acc}");
    let trained = model.state_dict();

    let mut ptq_model = digits_cnn();
    ptq_model
        .set_state_dict(&trained.iter().map(|(k, t)| (k.clone(), t.data())).collect())
        .unwrap();
    ptq_model.eval();
    let ptq = PTQ::new(ActivationObserver::Histogram(Calibration::Entropy));
    assert_eq!(
        ptq.quantize(&mut ptq_model).unwrap(),
        3,
        "two convolutions and a linear"
    );
    let calib = DataLoader::new(Digits::new(Split::Train).unwrap()).batch_size(64);
    {
        let _ng = oar::no_grad();
        for batch in (&calib).into_iter().take(4) {
            ptq_model.forward(&batch.unwrap().0).unwrap();
        }
    }
    // While calibrating the model still computes in float.
    assert_eq!(digits_accuracy(&ptq_model), f32_acc);
    ptq.freeze();
    let ptq_acc = digits_accuracy(&ptq_model);
    let names: Vec<String> = ptq_model.state_dict().into_keys().collect();
    assert!(names.contains(&"0.weight_quant.scale".to_string()), "{names:?}");
    // A fresh model restored from the calibrated state quantizes the same way.
    let mut restored = digits_cnn();
    let fresh = PTQ::new(ActivationObserver::MinMax);
    fresh.quantize(&mut restored).unwrap();
    fresh.freeze();
    restored.eval();
    let calibrated = ptq_model.state_dict();
    restored
        .set_state_dict(&calibrated.iter().map(|(k, t)| (k.clone(), t.data())).collect())
        .unwrap();
    assert_eq!(digits_accuracy(&restored), ptq_acc);
    // Traced, the fake quantization is in the graph and the cpu backend computes the same logits.
    let x = oar::randn(&[5, 1, 8, 8], DType::F32).unwrap();
    let spec = InputSpec::new(&[None, Some(1), Some(8), Some(8)], DType::F32, "x");
    let traced = oar::jit::to_static_layer(&ptq_model, &spec).unwrap();
    assert_eq!(traced.graph().to_string().matches("fake_quant").count(), 6);
    let (a, b) = {
        let _ng = oar::no_grad();
        (ptq_model.forward(&x).unwrap(), traced.call(&[&x]).unwrap().remove(0))
    };
    for (p, q) in a.to_vec::<f32>().unwrap().iter().zip(b.to_vec::<f32>().unwrap()) {
        assert!((p - q).abs() <= 1e-4 * p.abs().max(1.0), "eager {p} vs traced {q}");
    }

    let mut qat_model = digits_cnn();
    qat_model
        .set_state_dict(&trained.iter().map(|(k, t)| (k.clone(), t.data())).collect())
        .unwrap();
    let qat = QAT::new(QuantConfig::default());
    assert_eq!(qat.quantize(&mut qat_model).unwrap(), 3);
    train_digits(&mut qat_model, 1, 5e-4);
    let qat_acc = digits_accuracy(&qat_model);
    // Converted: traced, fake quantization into quantize/dequantize pairs, the products onto
    // the integers (matmul_integer runs natively on the cpu) — the same predictions but for
    // values within float rounding of a class boundary.
    let spec = InputSpec::new(&[None, Some(1), Some(8), Some(8)], DType::F32, "x");
    let int8 = oar::quantization::convert(&qat_model, &spec).unwrap();
    let text = int8.graph().to_string();
    assert!(!text.contains("fake_quant"), "{text}");
    assert_eq!(text.matches("conv_integer").count(), 2, "{text}");
    assert_eq!(text.matches("matmul_integer").count(), 1, "{text}");
    let int8_acc = digits_accuracy(&int8);
    eprintln!(
        "digits CNN test accuracy: f32 {f32_acc:.4}, PTQ {ptq_acc:.4}, QAT {qat_acc:.4}, QAT on integers {int8_acc:.4}"
    );
    assert!(
        (int8_acc - qat_acc).abs() <= 1.0 / 360.0 + 1e-9,
        "integer {int8_acc} vs fake {qat_acc}"
    );
    assert!(ptq_acc >= f32_acc - 0.01, "PTQ {ptq_acc} vs f32 {f32_acc}");

    // PTQ of the saved float graph (what `oar quantize` runs): the f32 model traced, calibrated
    // on the same 4 batches, its products on the integers.
    let traced = oar::jit::to_static_layer(&model, &spec).unwrap();
    let float = oar::ir::file::Model {
        graph: traced.graph().clone(),
        weights: traced.weights(),
    };
    let batches: Vec<_> = (&calib)
        .into_iter()
        .take(4)
        .map(|b| std::collections::BTreeMap::from([("x".to_string(), b.unwrap().0.data())]))
        .collect();
    let config = oar::quantization::StaticQuantConfig {
        method: ActivationObserver::Histogram(Calibration::Entropy),
        per_channel: true,
        ..Default::default()
    };
    let q = oar::quantization::quantize_model(&float, &batches, &config).unwrap();
    let ops: Vec<&str> = q.layers.iter().map(|l| l.op).collect();
    assert_eq!(ops, ["conv2d", "conv2d", "linear"]);
    let text = q.model.graph.to_string();
    assert_eq!(text.matches("conv_integer").count(), 2, "{text}");
    assert_eq!(text.matches("matmul_integer").count(), 1, "{text}");
    let int8_bytes: usize = q.model.weights.values().map(|t| t.bytes().len()).sum();
    let f32_bytes: usize = float.weights.values().map(|t| t.bytes().len()).sum();
    assert!(int8_bytes * 3 < f32_bytes, "{int8_bytes} vs {f32_bytes} bytes");
    let int8_layer = oar::jit::TranslatedLayer::new(q.model.clone()).unwrap();
    let graph_ptq_acc = digits_accuracy(&int8_layer);
    eprintln!("digits CNN, graph PTQ (entropy, per channel) on integers: {graph_ptq_acc:.4}");
    assert!(
        graph_ptq_acc >= f32_acc - 0.01,
        "graph PTQ {graph_ptq_acc} vs f32 {f32_acc}"
    );

    // Exported, onnxruntime runs both forms: the integer graph (ConvInteger, MatMulInteger:
    // the same exact sums, so the logits agree to float rounding) and the QDQ graph (its own
    // kernels: predictions agree but for values on a rounding boundary). With 7-bit weights
    // (`reduce_range`): onnxruntime's u8 × i8 kernels on x86 without VNNI add pairs of products
    // in 16 bits with saturation (`vpmaddubsw`), so full-range weights make its sums inexact —
    // 122 of the 3600 logits differed by up to 0.85 on an AVX2 host.
    let q7 = oar::quantization::quantize_model(
        &float,
        &batches,
        &oar::quantization::StaticQuantConfig {
            reduce_range: true,
            ..config
        },
    )
    .unwrap();
    let int8_layer = oar::jit::TranslatedLayer::new(q7.model.clone()).unwrap();
    let (x, labels) = digits_test();
    let ours = {
        let _ng = oar::no_grad();
        int8_layer.forward(&x).unwrap().to_vec::<f32>().unwrap()
    };
    let int8_ort = ort_logits(&q7.model, &x.data());
    assert_eq!(int8_ort.len(), ours.len());
    for (a, b) in ours.iter().zip(&int8_ort) {
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "oar {a} vs onnxruntime {b}");
    }
    let qdq_ort = ort_logits(&q7.qdq, &x.data());
    let argmax = |v: &[f32]| -> Vec<usize> {
        v.chunks(10)
            .map(|r| (0..10).max_by(|&i, &j| r[i].total_cmp(&r[j])).unwrap())
            .collect()
    };
    let (p_ours, p_qdq) = (argmax(&ours), argmax(&qdq_ort));
    let agree = p_ours.iter().zip(&p_qdq).filter(|(a, b)| a == b).count();
    assert!(
        agree * 100 >= 99 * p_ours.len(),
        "{agree} of {} predictions agree",
        p_ours.len()
    );
    let qdq_acc = p_qdq.iter().zip(&labels).filter(|(p, y)| **p as i64 == **y).count() as f64 / labels.len() as f64;
    assert!(
        qdq_acc >= f32_acc - 0.01,
        "onnxruntime on the QDQ export {qdq_acc} vs f32 {f32_acc}"
    );
    assert!(qat_acc >= f32_acc - 0.005, "QAT {qat_acc} vs f32 {f32_acc}");
}

/// Observers learn the parameters a layer's fake quantization uses: after one QAT forward on
/// `x`, the input's scale and zero point are the affine u8 parameters of `x`'s range, the
/// weight's the per-column symmetric ones, and the output is the linear layer on the
/// fake-quantized input and weight.
#[test]
fn qat_layers_quantize_their_input_and_weight_by_what_they_observe() {
    use oar::quantization::{QAT, QuantConfig, QuantSpec};
    let mut lin = Linear::new(3, 2).unwrap();
    lin.weight()
        .set_data(TensorData::from_vec(vec![3, 2], vec![0.5f32, -1.0, 0.25, 0.5, -0.127, 0.3]).unwrap())
        .unwrap();
    let qat = QAT::new(QuantConfig::default());
    assert_eq!(qat.quantize(&mut lin).unwrap(), 1);
    let x = t(&[-1.0, 0.5, 3.0, 2.0, -0.25, 1.0], &[2, 3]);
    let y = lin.forward(&x).unwrap();
    let st = lin.state_dict();
    let a = QuantSpec::activation().qparams(&[-1.0], &[3.0]).unwrap();
    assert_eq!(st["input_quant.scale"].to_vec::<f32>().unwrap(), a.scale);
    assert_eq!(st["input_quant.zero_point"].to_vec::<f32>().unwrap(), a.zero_point);
    // Columns: max |w| 0.5 and 1.0.
    assert_eq!(
        st["weight_quant.scale"].to_vec::<f32>().unwrap(),
        vec![0.5 / 127.0, 1.0 / 127.0]
    );
    let xq = F::fake_quant(
        &x,
        &st["input_quant.scale"],
        Some(&st["input_quant.zero_point"]),
        0,
        0,
        255,
    )
    .unwrap();
    let wq = F::fake_quant(lin.weight(), &st["weight_quant.scale"], None, 1, -127, 127).unwrap();
    let want = F::linear(&xq, &wq, lin.bias_tensor()).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    // In eval mode the parameters are frozen.
    lin.eval();
    lin.forward(&t(&[100.0; 3], &[1, 3])).unwrap();
    assert_eq!(lin.state_dict()["input_quant.scale"].to_vec::<f32>().unwrap(), a.scale);
}

/// LSQ's gradient scale: a learned quantizer's forward is plain `fake_quant`'s, bit for bit,
/// and its scale's gradient is `fake_quant`'s times `1 / √(N · Q_P)` — per tensor (N = all 24
/// elements, Q_P = 255 for u8) and per channel (N = 6 per channel, Q_P = 127 for i8).
#[test]
fn lsq_scales_the_step_size_gradient() {
    use oar::quantization::{FakeQuantize, MinMaxObserver, QuantSpec, Scheme};
    let x = (&oar::randn(&[4, 6], DType::F32).unwrap() * 2.0).unwrap();
    let dy = oar::randn(&[4, 6], DType::F32).unwrap();
    let per_channel = QuantSpec {
        dtype: DType::I8,
        scheme: Scheme::Symmetric,
        axis: Some(0),
    };
    for (spec, channels, n, qmax) in [
        (QuantSpec::activation(), 1, 24.0f64, 255.0f64),
        (per_channel, 4, 6.0, 127.0),
    ] {
        let mut fq = FakeQuantize::learned(spec, Box::new(MinMaxObserver::new(spec.axis)), channels).unwrap();
        fq.set_training(true);
        // The first forward observes and initializes the scale.
        fq.forward(&x).unwrap();
        let y = fq.forward(&x).unwrap();
        (&y * &dy).unwrap().sum(&[], false).unwrap().backward().unwrap();
        let got = fq.scale().grad().unwrap().to_vec::<f32>().unwrap();
        // Plain fake_quant with a copy of the scale.
        let s = Tensor::from_data(fq.scale().try_data().unwrap())
            .requires_grad_(true)
            .unwrap();
        let z = (spec.scheme == Scheme::Affine).then_some(fq.zero_point());
        let (lo, hi) = spec.range().unwrap();
        let plain = F::fake_quant(&x, &s, z, spec.axis.unwrap_or(0), lo, hi).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), plain.to_vec::<f32>().unwrap());
        (&plain * &dy).unwrap().sum(&[], false).unwrap().backward().unwrap();
        let raw = s.grad().unwrap().to_vec::<f32>().unwrap();
        let g = 1.0 / (n * qmax).sqrt();
        assert!(raw.iter().any(|r| *r != 0.0), "{raw:?}");
        for (a, b) in got.iter().zip(&raw) {
            let want = (*b as f64 * g) as f32;
            assert!(
                (a - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "{got:?} vs {raw:?} x {g}"
            );
        }
    }
}

/// LSQ (`learn_scale`): the quantizers' scales are parameters. The first training forward
/// initializes them from what it observes; an SGD step then moves each by its gradient
/// (`fake_quant`'s LSQ rule), and later forwards do not observe them back.
#[test]
fn lsq_scales_start_from_the_first_observation_then_learn_by_gradient() {
    use oar::quantization::{QAT, QuantConfig, QuantSpec};
    let mut lin = Linear::new(3, 2).unwrap();
    lin.weight()
        .set_data(TensorData::from_vec(vec![3, 2], vec![0.5f32, -1.0, 0.25, 0.5, -0.127, 0.3]).unwrap())
        .unwrap();
    let qat = QAT::new(QuantConfig {
        learn_scale: true,
        ..QuantConfig::default()
    });
    qat.quantize(&mut lin).unwrap();
    let param = |name: &str| {
        lin.named_parameters()
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no parameter {name}"))
            .1
    };
    let (sa, sw) = (param("input_quant.scale"), param("weight_quant.scale"));
    let x = t(&[-1.0, 0.5, 3.0, 2.0, -0.25, 1.0], &[2, 3]);
    let y = lin.forward(&x).unwrap();
    let a = QuantSpec::activation().qparams(&[-1.0], &[3.0]).unwrap();
    assert_eq!(sa.to_vec::<f32>().unwrap(), a.scale);
    assert_eq!(sw.to_vec::<f32>().unwrap(), vec![0.5 / 127.0, 1.0 / 127.0]);
    let mut opt = SGD::new(lin.parameters(), 0.01);
    (&y * &y).unwrap().mean(&[], false).unwrap().backward().unwrap();
    let (ga, gw) = (
        sa.grad().unwrap().to_vec::<f32>().unwrap(),
        sw.grad().unwrap().to_vec::<f32>().unwrap(),
    );
    assert!(ga[0] != 0.0 && gw.iter().all(|g| *g != 0.0), "{ga:?} {gw:?}");
    let (a0, w0) = (sa.to_vec::<f32>().unwrap(), sw.to_vec::<f32>().unwrap());
    opt.step().unwrap();
    let (a1, w1) = (sa.to_vec::<f32>().unwrap(), sw.to_vec::<f32>().unwrap());
    assert!((a1[0] - (a0[0] - 0.01 * ga[0])).abs() <= 1e-7, "{a1:?}");
    for c in 0..2 {
        assert!((w1[c] - (w0[c] - 0.01 * gw[c])).abs() <= 1e-7, "{w1:?}");
    }
    // Another forward, on a much wider input, keeps the learned scale.
    lin.forward(&t(&[100.0; 3], &[1, 3])).unwrap();
    assert_eq!(sa.to_vec::<f32>().unwrap(), a1);
}

/// Batch norms fold into the convolutions before them (`quantization::fold_batch_norms`): a
/// `Sequential` (conv → batch norm → ReLU, a conv without bias) and the zoo's ResNet-18 (its
/// 20 conv–batch-norm pairs, the downsample branches included), with batch-norm statistics
/// that are not the identity. The folded model's eval outputs match the unfolded ones (1e-4 of
/// the largest), the batch norms' state is gone, and QAT then quantizes the folded
/// convolutions; folding after QAT is an error that names the reason.
#[test]
fn batch_norms_fold_into_convolutions_before_qat() {
    use oar::nn::{BatchNorm2D, Conv2D, ReLU, Sequential};
    use oar::quantization::{QAT, QuantConfig, fold_batch_norms};
    use oar::vision::models::resnet18;
    // Every 1-d state entry (batch-norm scales, shifts, statistics; biases) made distinct.
    let perturb = |m: &dyn Layer| {
        for (i, (name, t)) in m.state_dict().into_iter().enumerate() {
            if t.dims().len() != 1 {
                continue;
            }
            let n = t.numel();
            let v: Vec<f32> = (0..n)
                .map(|j| {
                    let u = ((i * 31 + j * 17) % 97) as f32 / 97.0;
                    if name.ends_with("_variance") { 0.5 + u } else { u - 0.5 }
                })
                .collect();
            t.set_data(TensorData::from_vec(vec![n], v).unwrap()).unwrap();
        }
    };
    let close = |a: &Tensor, b: &Tensor| {
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        let big = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(worst <= 1e-4 * big.max(1.0), "worst {worst} of {big}");
    };
    let mut seq = Sequential::new()
        .add(Conv2D::new(3, 4, 3).unwrap().padding(1).bias(false))
        .add(BatchNorm2D::new(4).unwrap())
        .add(ReLU::new());
    perturb(&seq);
    let x = oar::randn(&[2, 3, 6, 6], DType::F32).unwrap();
    seq.eval();
    let before = seq.forward(&x).unwrap();
    let spec = InputSpec::new(&[None, Some(3), Some(6), Some(6)], DType::F32, "x");
    assert_eq!(fold_batch_norms(&mut seq, &spec).unwrap(), 1);
    close(&before, &seq.forward(&x).unwrap());
    let keys: Vec<String> = seq.state_dict().into_keys().collect();
    assert_eq!(keys, vec!["0.bias", "0.weight"], "the batch norm's state is gone");
    assert_eq!(QAT::new(QuantConfig::default()).quantize(&mut seq).unwrap(), 1);

    let mut net = resnet18(10).unwrap();
    perturb(&net);
    net.eval();
    let x = oar::randn(&[1, 3, 32, 32], DType::F32).unwrap();
    let before = net.forward(&x).unwrap();
    let spec = InputSpec::new(&[Some(1), Some(3), Some(32), Some(32)], DType::F32, "x");
    assert_eq!(fold_batch_norms(&mut net, &spec).unwrap(), 20);
    close(&before, &net.forward(&x).unwrap());
    assert!(
        !net.state_dict()
            .keys()
            .any(|k| k.contains("bn") || k.ends_with("_mean"))
    );
    // Nothing left to fold.
    assert_eq!(fold_batch_norms(&mut net, &spec).unwrap(), 0);

    let mut late = Sequential::new()
        .add(Conv2D::new(3, 4, 3).unwrap())
        .add(BatchNorm2D::new(4).unwrap());
    QAT::new(QuantConfig::default()).quantize(&mut late).unwrap();
    let e = fold_batch_norms(
        &mut late,
        &InputSpec::new(&[Some(1), Some(3), Some(5), Some(5)], DType::F32, "x"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("before quantizing"), "{e}");
}
