//! The one path every eager op takes: check the shared type rule, run the kernel, record the
//! op on the tape when a gradient is needed. Composites run as their decomposition, so their
//! gradients come from the primitives' rules.

use super::Tensor;
use crate::autograd::{EagerEmitter, GradNode, is_grad_enabled};
use crate::error::Result;
use oar_ir::ops::infer_types;
use oar_ir::{IrError, Op, TensorData};
use std::sync::Arc;

/// Apply `op` to eager tensors.
pub(crate) fn apply(op: Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let trace = inputs
        .iter()
        .find_map(|t| t.0.trace.as_ref().map(|tr| tr.ctx.clone()))
        .or_else(crate::jit::current);
    let needs_grad = is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
    // A traced composite stays one node unless its gradient is needed (a traced training
    // step): then, as in eager mode, it runs as its decomposition so the primitives' VJPs apply.
    if let Some(ctx) = &trace
        && !(needs_grad && matches!(op, Op::Composite(_)))
    {
        return crate::jit::trace_apply(ctx, op, inputs);
    }
    if let Op::Composite(c) = &op {
        let mut em = EagerEmitter {
            values: inputs.iter().map(|t| (*t).clone()).collect(),
        };
        let args: Vec<usize> = (0..inputs.len()).collect();
        let outs = oar_ir::decompose::decompose(c, &mut em, &args)?;
        return Ok(outs.into_iter().map(|i| em.values[i].clone()).collect());
    }
    let datas: Vec<TensorData> = inputs.iter().map(|t| t.data()).collect();
    let types: Vec<_> = datas.iter().map(|d| d.tensor_type()).collect();
    infer_types(&op, &types, &[]).map_err(|detail| IrError::Type {
        op: op.name().to_string(),
        value: "(eager)".into(),
        detail,
    })?;
    let outs = crate::kernels::run(&op, &datas)?;
    let record = needs_grad && outs.iter().any(|o| o.dtype().is_float());
    if !record {
        return Ok(outs.into_iter().map(Tensor::from_data).collect());
    }
    let saved_in = datas.into_iter().map(Tensor::from_data).collect();
    let saved_out = outs.iter().cloned().map(Tensor::from_data).collect();
    let node = Arc::new(GradNode::new(op, inputs, saved_in, saved_out));
    Ok(outs
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let float = d.dtype().is_float();
            let t = Tensor::make(d, Some((node.clone(), i)));
            if !float {
                t.0.stop_gradient.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            t
        })
        .collect())
}

/// Apply an op with one output.
pub(crate) fn apply1(op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let mut outs = apply(op, inputs)?;
    Ok(outs.remove(0))
}
