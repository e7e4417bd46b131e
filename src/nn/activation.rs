//! Activation layers: `ReLU`, `ReLU6`, `Hardsigmoid`, `Hardswish`, `GELU`, `SiLU`, `Sigmoid`,
//! `Tanh`, `Softmax`, `LogSoftmax`. None has parameters; each is its `nn::functional`
//! counterpart.

use super::Layer;
use super::functional as F;
use crate::error::Result;
use crate::tensor::Tensor;

macro_rules! simple_activation {
    ($($(#[$m:meta])* $name:ident => $f:expr;)*) => {
        $(
            $(#[$m])*
            #[derive(Clone, Copy, Debug, Default)]
            pub struct $name;

            impl $name {
                /// The layer.
                pub fn new() -> $name {
                    $name
                }
            }

            impl Layer for $name {
                fn forward(&self, x: &Tensor) -> Result<Tensor> {
                    $f(x)
                }
            }
        )*
    };
}

simple_activation! {
    /// `max(x, 0)`.
    ReLU => F::relu;
    /// `min(max(x, 0), 6)` ([`F::relu6`]).
    ReLU6 => F::relu6;
    /// `relu6(x + 3) / 6`, PyTorch's hard sigmoid ([`F::hardsigmoid`]).
    Hardsigmoid => F::hardsigmoid;
    /// `x · relu6(x + 3) / 6` ([`F::hardswish`]).
    Hardswish => F::hardswish;
    /// `x · sigmoid(x)` (also called swish).
    SiLU => F::silu;
    /// `1 / (1 + e^-x)`.
    Sigmoid => F::sigmoid;
    /// Hyperbolic tangent.
    Tanh => F::tanh;
}

/// GELU: exact (erf) by default, or the tanh approximation with `.approximate(true)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GELU {
    approximate: bool,
}

impl GELU {
    /// The exact (erf) GELU.
    pub fn new() -> GELU {
        GELU { approximate: false }
    }

    /// Use the tanh approximation.
    pub fn approximate(mut self, on: bool) -> GELU {
        self.approximate = on;
        self
    }
}

impl Layer for GELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::gelu(x, self.approximate)
    }
}

/// Softmax along `axis` (Paddle's default −1).
#[derive(Clone, Copy, Debug)]
pub struct Softmax {
    axis: i64,
}

impl Softmax {
    /// Softmax along `axis` (negative counts from the end).
    pub fn new(axis: i64) -> Softmax {
        Softmax { axis }
    }
}

impl Default for Softmax {
    fn default() -> Softmax {
        Softmax::new(-1)
    }
}

impl Layer for Softmax {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::softmax(x, self.axis)
    }
}

/// Log-softmax along `axis` (Paddle's default −1).
#[derive(Clone, Copy, Debug)]
pub struct LogSoftmax {
    axis: i64,
}

impl LogSoftmax {
    /// Log-softmax along `axis` (negative counts from the end).
    pub fn new(axis: i64) -> LogSoftmax {
        LogSoftmax { axis }
    }
}

impl Default for LogSoftmax {
    fn default() -> LogSoftmax {
        LogSoftmax::new(-1)
    }
}

impl Layer for LogSoftmax {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::log_softmax(x, self.axis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jit::{InputSpec, to_static_layer};
    use oar_ir::DType;

    const POINTS: [f64; 8] = [-4.0, -3.0, 0.0, 2.0, 3.0, 5.0, 6.0, 7.0];

    /// The layer's values at [`POINTS`] and the gradient of their sum.
    fn values_and_grads(layer: &dyn Layer) -> (Vec<f64>, Vec<f64>) {
        let x = Tensor::from_vec(POINTS.to_vec(), &[POINTS.len()])
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let y = layer.forward(&x).unwrap();
        y.sum(&[], false).unwrap().backward().unwrap();
        (y.to_vec().unwrap(), x.grad().unwrap().to_vec().unwrap())
    }

    fn assert_close(got: &[f64], want: &[f64], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() < 1e-12, "{what} at x = {}: {g} != {w}", POINTS[i]);
        }
    }

    #[test]
    fn relu6_values_and_gradients() {
        let (y, g) = values_and_grads(&ReLU6::new());
        assert_close(&y, &[0.0, 0.0, 0.0, 2.0, 3.0, 5.0, 6.0, 6.0], "relu6");
        // Kinks at 0 and 6 take the mean of the one-sided slopes.
        assert_close(&g, &[0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 0.5, 0.0], "relu6'");
    }

    #[test]
    fn hardsigmoid_values_and_gradients() {
        let (y, g) = values_and_grads(&Hardsigmoid::new());
        assert_close(&y, &[0.0, 0.0, 0.5, 5.0 / 6.0, 1.0, 1.0, 1.0, 1.0], "hardsigmoid");
        let s = 1.0 / 6.0;
        assert_close(&g, &[0.0, s / 2.0, s, s, s / 2.0, 0.0, 0.0, 0.0], "hardsigmoid'");
    }

    #[test]
    fn hardswish_values_and_gradients() {
        let (y, g) = values_and_grads(&Hardswish::new());
        assert_close(&y, &[0.0, 0.0, 0.0, 10.0 / 6.0, 3.0, 5.0, 6.0, 7.0], "hardswish");
        // d/dx x·relu6(x+3)/6 = (relu6(x+3) + x·relu6'(x+3)) / 6: 0 below −3, x/3 + ½ inside,
        // 1 above 3; at ±3 the mean of the one-sided slopes.
        assert_close(&g, &[0.0, -0.25, 0.5, 7.0 / 6.0, 1.25, 1.0, 1.0, 1.0], "hardswish'");
    }

    #[test]
    fn hard_activations_trace_like_eager() {
        let x = Tensor::from_vec(vec![-4.5f32, -3.0, -1.25, 0.0, 0.5, 2.75, 3.0, 8.0], &[2, 4]).unwrap();
        let spec = InputSpec::new(&[None, Some(4)], DType::F32, "x");
        let layers: [&dyn Layer; 3] = [&ReLU6, &Hardsigmoid, &Hardswish];
        for layer in layers {
            let eager = layer.forward(&x).unwrap().to_vec::<f32>().unwrap();
            let traced = to_static_layer(layer, &spec).unwrap().call(&[&x]).unwrap();
            assert_eq!(traced[0].to_vec::<f32>().unwrap(), eager);
        }
    }
}
