//! Losses built from tensor ops (so they differentiate through the eager tape): `mse_loss`,
//! `binary_cross_entropy_with_logits`, `nll_loss`.

use crate::error::{Error, Result};
use crate::tensor::{self, Tensor};
use oar_ir::DType;
use oar_ir::ops::Reduction;

/// Mean, sum or no reduction of a per-element loss.
fn reduce(loss: Tensor, reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::None => Ok(loss),
        Reduction::Sum => loss.sum(&[], false),
        Reduction::Mean => loss.mean(&[], false),
    }
}

fn same_float_shape(op: &str, input: &Tensor, label: &Tensor) -> Result<()> {
    if input.shape() != label.shape() || input.dtype() != label.dtype() || !input.dtype().is_float() {
        return Err(Error::invalid(
            op,
            format!(
                "needs float input and label of the same dtype and shape, got {} and {}",
                input.tensor_type(),
                label.tensor_type()
            ),
        ));
    }
    Ok(())
}

/// `(input − label)²`, reduced.
pub fn mse_loss(input: &Tensor, label: &Tensor, reduction: Reduction) -> Result<Tensor> {
    same_float_shape("mse_loss", input, label)?;
    let d = input.subtract(label)?;
    reduce(d.multiply(&d)?, reduction)
}

/// Binary cross-entropy on logits `x` with targets `y` in `[0, 1]`, in the stable form
/// `max(x, 0) − x·y + log(1 + e^−|x|)`, reduced. (At `x = 0` the gradient is exact because
/// the max's tie splits the gradient and `|x|`'s is 0 there.)
pub fn binary_cross_entropy_with_logits(logit: &Tensor, label: &Tensor, reduction: Reduction) -> Result<Tensor> {
    same_float_shape("binary_cross_entropy_with_logits", logit, label)?;
    let zero = logit.scalar_like(0.0)?;
    let softplus_tail = logit.abs()?.neg()?.exp()?.scale(1.0, 1.0)?.log()?;
    let loss = logit
        .maximum(&zero)?
        .subtract(&logit.multiply(label)?)?
        .add(&softplus_tail)?;
    reduce(loss, reduction)
}

/// Negative log-likelihood of log-probabilities `input[N, C]` at integer `label[N]`:
/// `−input[n, label[n]]`, reduced (mean divides by N). A label outside `[0, C)` is an error.
pub fn nll_loss(input: &Tensor, label: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let (is, ls) = (input.shape(), label.shape());
    let int_label = !label.dtype().is_float() && label.dtype() != DType::Bool;
    if is.len() != 2 || ls.len() != 1 || ls[0] != is[0] || !int_label || !input.dtype().is_float() {
        return Err(Error::invalid(
            "nll_loss",
            format!(
                "needs float input[N,C] and integer label[N], got {} and {}",
                input.tensor_type(),
                label.tensor_type()
            ),
        ));
    }
    let classes = is[1];
    check_labels("nll_loss", label, classes)?;
    // Pick with a one-hot mask (as cross_entropy's decomposition does) so the gradient is a
    // select, not a scatter.
    let ids = tensor::arange(0.0, classes as f64, 1.0, label.dtype())?;
    let one_hot = ids.equal(&label.unsqueeze(1)?)?;
    let picked = Tensor::where_(&one_hot, input, &input.scalar_like(0.0)?)?;
    reduce(picked.sum(&[1], false)?.neg()?, reduction)
}

/// Fail if any class label lies outside `[0, classes)` (an eager check on the label values).
pub(crate) fn check_labels(op: &str, label: &Tensor, classes: usize) -> Result<()> {
    match label
        .try_data()?
        .to_f64_vec()
        .into_iter()
        .find(|&l| l < 0.0 || l >= classes as f64)
    {
        Some(bad) => Err(Error::invalid(
            op,
            format!("label {bad} is out of range for {classes} classes"),
        )),
        None => Ok(()),
    }
}
