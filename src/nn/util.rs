//! Helpers shared by the layers: parameter creation, dtype changes, error context.

use crate::error::{Error, Result};
use crate::tensor::{self, Tensor};
use oar_ir::DType;

/// A trainable zero tensor of `shape` (an initializer fills it afterwards).
pub(crate) fn param(shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::parameter(tensor::zeros(shape, dtype)?.data())
}

/// A non-trainable tensor of `value` (running statistics).
pub(crate) fn buffer(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
    tensor::full(shape, value, dtype)
}

/// The same values converted to `dtype`, as a fresh leaf with the same `stop_gradient`.
pub(crate) fn recast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if !dtype.is_float() {
        return Err(Error::invalid(
            "dtype",
            format!("layer parameters must be float, got {dtype}"),
        ));
    }
    let data = crate::autograd::with_no_grad(|| t.cast(dtype))?.data();
    let out = Tensor::from_data(data);
    out.set_stop_gradient(t.stop_gradient())?;
    Ok(out)
}

/// Prefix any error from a layer's forward with the layer's description
/// (`Linear(in_features=4, out_features=3): ...`).
pub(crate) fn ctx<T>(layer: impl FnOnce() -> String, r: Result<T>) -> Result<T> {
    r.map_err(|e| Error::invalid(&layer(), e.to_string()))
}

/// Fail unless `x` has one of the ranks in `ranks`, naming the layer and the input type.
pub(crate) fn check_rank(layer: &str, x: &Tensor, ranks: &[usize], want: &str) -> Result<()> {
    if ranks.contains(&x.ndim()) {
        return Ok(());
    }
    Err(Error::invalid(
        layer,
        format!("expects input {want}, got {}", x.tensor_type()),
    ))
}
