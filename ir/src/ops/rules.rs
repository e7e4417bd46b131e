//! Small checks the type rules of many ops share. Errors are plain sentences naming the
//! offending shapes and dtypes; the graph builder and the verifier add the op and the value.

use crate::TensorType;

/// Result of a type rule.
pub type R = Result<Vec<TensorType>, String>;

/// Exactly `n` operands.
pub fn arity(inputs: &[TensorType], n: usize) -> Result<(), String> {
    if inputs.len() != n {
        return Err(format!("expects {n} operands, got {}", inputs.len()));
    }
    Ok(())
}

/// One of the operand counts `ok`.
pub fn arity_range(inputs: &[TensorType], ok: &[usize]) -> Result<(), String> {
    if !ok.contains(&inputs.len()) {
        return Err(format!("expects {ok:?} operands, got {}", inputs.len()));
    }
    Ok(())
}

/// Both operands have one dtype.
pub fn same_dtype(a: &TensorType, b: &TensorType) -> Result<(), String> {
    if a.dtype != b.dtype {
        return Err(format!("dtypes differ: {a} vs {b}"));
    }
    Ok(())
}

/// A float operand.
pub fn float(x: &TensorType) -> Result<(), String> {
    if !x.dtype.is_float() {
        return Err(format!("needs a float tensor, got {x}"));
    }
    Ok(())
}

/// Index operands are i32 or i64.
pub fn check_index(idx: &TensorType) -> Result<(), String> {
    if !matches!(idx.dtype, crate::DType::I32 | crate::DType::I64) {
        return Err(format!("indices must be i32 or i64, got {idx}"));
    }
    Ok(())
}

/// Axes sorted, unique and below `rank`.
pub fn check_axes(axes: &[usize], rank: usize) -> Result<(), String> {
    if axes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("axes {axes:?} must be sorted and unique"));
    }
    if let Some(a) = axes.iter().find(|&&a| a >= rank) {
        return Err(format!("axis {a} is out of range for rank {rank}"));
    }
    Ok(())
}

/// Types joined with commas, for messages.
pub fn list(ts: &[TensorType]) -> String {
    ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

/// Output size of a window op along one axis; `None` if no window fits.
pub fn window_out(
    input: usize,
    pad: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    ceil: bool,
) -> Option<usize> {
    let span = dilation.checked_mul(kernel.checked_sub(1)?)?.checked_add(1)?;
    let avail = input.checked_add(pad)?.checked_sub(span)?;
    if stride == 0 {
        return None;
    }
    Some(if ceil {
        avail.div_ceil(stride) + 1
    } else {
        avail / stride + 1
    })
}

/// Elements of a type with every dim static, as u64, for FLOP estimates, saturated at 2^48 so small constant multiples of it never
/// overflow (a hostile shape gives a huge count, not a wrapped or panicking one).
pub fn elements(t: &TensorType) -> Option<u64> {
    t.shape.num_elements().map(|n| (n as u64).min(1 << 48))
}

/// Elements of all `outputs` (one FLOP per output element: elementwise ops).
pub fn out_elements(outputs: &[TensorType]) -> Option<u64> {
    outputs
        .iter()
        .try_fold(0u64, |acc, t| Some(acc.saturating_add(elements(t)?)))
}
