//! Activation layers: `ReLU`, `GELU`, `SiLU`, `Sigmoid`, `Tanh`, `Softmax`, `LogSoftmax`.
//! None has parameters; each is its `nn::functional` counterpart.

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
