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
