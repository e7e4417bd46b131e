//! `conv1d`: a 1-d convolution as a 2-d one over an inserted unit height axis, so it shares
//! conv2d's decomposition and gradients.

use super::{Pair, conv2d};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// 1-d convolution of `x[N,C,L]` with `weight[O,C/groups,k]`; `padding` is `p` or
/// `[left, right]`.
pub fn conv1d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: usize,
    padding: impl Into<Pair>,
    dilation: usize,
    groups: usize,
) -> Result<Tensor> {
    if x.ndim() != 3 || weight.ndim() != 3 {
        return Err(Error::invalid(
            "conv1d",
            format!(
                "needs x[N,C,L] and weight[O,C/groups,k], got {} and {}",
                x.tensor_type(),
                weight.tensor_type()
            ),
        ));
    }
    let [left, right] = padding.into().0;
    let y = conv2d(
        &x.unsqueeze(2)?,
        &weight.unsqueeze(2)?,
        bias,
        [1, stride],
        [0, left, 0, right],
        [1, dilation],
        groups,
    )
    .map_err(|e| {
        Error::invalid(
            "conv1d",
            format!(
                "x {}, weight {} (as a height-1 conv2d): {e}",
                x.tensor_type(),
                weight.tensor_type()
            ),
        )
    })?;
    y.squeeze(&[2])
}
