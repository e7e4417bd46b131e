//! Quantization functions: ONNX's `QuantizeLinear` / `DequantizeLinear` and the fake
//! quantization quantization-aware training inserts. A scale is a scalar (per-tensor) or a
//! vector along `axis` (per-channel); a zero point has the scale's shape or is a scalar.

use super::{composite1, with_optional};
use crate::error::Result;
use crate::tensor::Tensor;
use oar_ir::ops::{DequantizeLinear, FakeQuant, QuantizeLinear};
use oar_ir::{Composite, DType};

/// `saturate(round_half_even(x / scale) + zero_point)` as `dtype` (`I8` or `U8`; a given zero
/// point must have that dtype).
pub fn quantize_linear(
    x: &Tensor,
    scale: &Tensor,
    zero_point: Option<&Tensor>,
    axis: usize,
    dtype: DType,
) -> Result<Tensor> {
    let c = Composite::QuantizeLinear(QuantizeLinear { axis, dtype });
    composite1(c, &with_optional(vec![x, scale], zero_point))
}

/// `(x - zero_point) * scale` for an i8, u8 or i32 `x`, in the scale's dtype.
pub fn dequantize_linear(x: &Tensor, scale: &Tensor, zero_point: Option<&Tensor>, axis: usize) -> Result<Tensor> {
    let c = Composite::DequantizeLinear(DequantizeLinear { axis });
    composite1(c, &with_optional(vec![x, scale], zero_point))
}

/// `(clamp(round_half_even(x / scale) + zero_point, qmin, qmax) - zero_point) * scale`: the
/// values int8 inference will see, as floats. Gradients pass straight through inside the
/// range and stop outside it; a scale or zero point that requires grad learns (LSQ). The zero
/// point is a float tensor of x's dtype.
pub fn fake_quant(
    x: &Tensor,
    scale: &Tensor,
    zero_point: Option<&Tensor>,
    axis: usize,
    qmin: i64,
    qmax: i64,
) -> Result<Tensor> {
    let c = Composite::FakeQuant(FakeQuant { axis, qmin, qmax });
    composite1(c, &with_optional(vec![x, scale], zero_point))
}
