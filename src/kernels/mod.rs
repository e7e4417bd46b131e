//! CPU kernels for eager mode. Hot ops (matmul, conv) run through `gemm`; every other op runs on the
//! reference interpreter as a one-node graph, so eager and static results agree by construction.

mod conv;
mod matmul;

use crate::error::Result;
use oar_ir::{Op, TensorData};

/// Run one op on concrete inputs.
pub(crate) fn run(op: &Op, inputs: &[TensorData]) -> Result<Vec<TensorData>> {
    if let Op::MatMul = op
        && let Some(out) = matmul::matmul(&inputs[0], &inputs[1])?
    {
        return Ok(vec![out]);
    }
    if let Op::Conv(_) = op
        && let Some(out) = conv::conv(op, &inputs[0], &inputs[1])?
    {
        return Ok(vec![out]);
    }
    run_reference(op, inputs)
}

fn run_reference(op: &Op, inputs: &[TensorData]) -> Result<Vec<TensorData>> {
    Ok(oar_backend_reference::run_op(op, inputs)?)
}
