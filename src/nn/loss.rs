//! Loss layers: `CrossEntropyLoss`, `MSELoss`, `BCEWithLogitsLoss`, `NLLLoss`.
//!
//! They are not [`Layer`](super::Layer)s because a loss takes two inputs; they implement
//! [`Loss`] instead. Each reduces by mean (the default), sum or not at all.

use super::functional::{self as F, Reduction};
use crate::error::Result;
use crate::tensor::Tensor;

/// A loss: `forward(input, label)` gives the (reduced) loss.
pub trait Loss {
    /// The loss of `input` against `label`.
    fn forward(&self, input: &Tensor, label: &Tensor) -> Result<Tensor>;
}

/// Class labels given as `[N, 1]` (Paddle's common layout) become `[N]`.
fn class_labels(input: &Tensor, label: &Tensor) -> Result<Tensor> {
    let s = label.shape();
    if input.ndim() == 2 && s.len() == 2 && s[1] == 1 {
        label.squeeze(&[1])
    } else {
        Ok(label.clone())
    }
}

macro_rules! loss_layer {
    ($(#[$m:meta])* $name:ident, |$s:ident, $x:ident, $y:ident| $body:expr) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            reduction: Reduction,
        }

        impl $name {
            /// The loss with mean reduction.
            pub fn new() -> $name {
                $name { reduction: Reduction::Mean }
            }

            /// Reduce by `Reduction::Mean`, `Sum` or `None`.
            pub fn reduction(mut self, reduction: Reduction) -> $name {
                self.reduction = reduction;
                self
            }
        }

        impl Default for $name {
            fn default() -> $name {
                $name::new()
            }
        }

        impl Loss for $name {
            fn forward(&self, $x: &Tensor, $y: &Tensor) -> Result<Tensor> {
                let $s = self;
                $body
            }
        }
    };
}

loss_layer!(
    /// Softmax cross-entropy of `logits[N, C]` against integer labels `[N]` (or `[N, 1]`); a
    /// label outside `[0, C)` is an error.
    CrossEntropyLoss,
    |s, x, y| {
        let y = class_labels(x, y)?;
        F::cross_entropy(x, &y, s.reduction)
    }
);
loss_layer!(
    /// Mean squared error of `input` against a `label` of the same shape.
    MSELoss,
    |s, x, y| F::mse_loss(x, y, s.reduction)
);
loss_layer!(
    /// Binary cross-entropy on logits against targets in `[0, 1]` of the same shape.
    BCEWithLogitsLoss,
    |s, x, y| F::binary_cross_entropy_with_logits(x, y, s.reduction)
);
loss_layer!(
    /// Negative log-likelihood of log-probabilities `[N, C]` at integer labels `[N]` (or `[N, 1]`).
    NLLLoss,
    |s, x, y| F::nll_loss(x, &class_labels(x, y)?, s.reduction)
);
