//! CPU kernels for eager mode. Hot ops (matmul, conv) run through `gemm`; every other op runs on the
//! reference interpreter as a one-node graph, so eager and static results agree by construction.

mod conv;
mod matmul;

use crate::error::Result;
use oar_ir::{Graph, Op, TensorData, Weights};
use std::collections::BTreeMap;

/// Run one op on concrete inputs.
pub(crate) fn run(op: &Op, inputs: &[TensorData]) -> Result<Vec<TensorData>> {
    if let Op::MatMul = op
        && let Some(out) = matmul::matmul(&inputs[0], &inputs[1])?
    {
        return Ok(vec![out]);
    }
    if let Op::Conv { .. } = op
        && let Some(out) = conv::conv(op, &inputs[0], &inputs[1])?
    {
        return Ok(vec![out]);
    }
    run_reference(op, inputs)
}

fn run_reference(op: &Op, inputs: &[TensorData]) -> Result<Vec<TensorData>> {
    let mut g = Graph::new(op.name());
    let mut feeds = BTreeMap::new();
    let mut args = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        let name = format!("x{i}");
        args.push(g.add_input(&name, t.tensor_type())?);
        feeds.insert(name, t.clone());
    }
    let outs = g.add_op(op.clone(), &args)?;
    for (i, v) in outs.iter().enumerate() {
        g.add_output(&format!("y{i}"), *v)?;
    }
    let res = oar_backend_reference::run_graph(&g, &Weights::new(), &feeds)?;
    Ok(res.into_iter().map(|(_, t)| t).collect())
}
