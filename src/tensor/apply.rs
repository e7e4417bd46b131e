//! The one path every eager op takes: check the shared type rule, run the kernel, record the
//! op on the tape when a gradient is needed. Composites run as their decomposition, so their
//! gradients come from the primitives' rules.

use super::{Storage, Tensor};
use crate::autograd::{EagerEmitter, GradNode, is_grad_enabled};
use crate::device::Device;
use crate::error::{Error, Result};
use oar_ir::ops::infer_types;
use oar_ir::{DeviceTensor, IrError, Op, TensorData, TensorType};
use std::sync::Arc;

/// Apply `op` to eager tensors. Inside an AMP scope (`crate::amp`) the operands are first
/// cast as its table says (the casts are ops too: recorded for autograd, traced).
pub(crate) fn apply(op: Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    if let Some(cast) = crate::amp::cast_operands(&op, inputs)? {
        let refs: Vec<&Tensor> = cast.iter().collect();
        return apply_as_is(op, &refs);
    }
    apply_as_is(op, inputs)
}

/// [`apply`] without AMP's casts.
fn apply_as_is(op: Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let trace = inputs
        .iter()
        .find_map(|t| t.0.trace.as_ref().map(|tr| tr.ctx.clone()))
        .or_else(super::intercept::current);
    let needs_grad = is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
    // A traced composite stays one node unless its gradient is needed (a traced training
    // step) and it has no gradient rule of its own: then it runs as its decomposition so the
    // primitives' VJPs apply.
    if let Some(ctx) = &trace
        && !(needs_grad && matches!(&op, Op::Composite(c) if !oar_ir::ops::OpDef::has_vjp(c)))
    {
        return ctx.clone().intercept(op, inputs);
    }
    // On the CPU a composite runs as one compiled program (its decomposition fused) and is
    // recorded as itself; its gradient is compiled the same way (`kernels::composite_vjp`).
    // Elsewhere, or while tracing, it runs as its decomposition.
    if let Op::Composite(c) = &op
        && !(trace.is_none() && crate::kernels::fuses(c) && inputs.iter().all(|t| t.device().is_cpu()))
    {
        let mut em = EagerEmitter {
            values: inputs.iter().map(|t| (*t).clone()).collect(),
        };
        let args: Vec<usize> = (0..inputs.len()).collect();
        // AMP decided the composite's precision; its parts run at it (as the fused kernel does).
        let _amp = crate::amp::disable();
        let outs = oar_ir::decompose::decompose(c, &mut em, &args)?;
        return Ok(outs.into_iter().map(|i| em.values[i].clone()).collect());
    }
    if let Some(device) = placement(&op, inputs)? {
        return apply_on_device(op, inputs, &device, needs_grad);
    }
    if let Some(result) = view_of(&op, inputs)? {
        let operand = inputs[0].storage();
        return Ok(outputs(op, inputs, needs_grad, vec![operand], vec![result]));
    }
    let datas: Vec<TensorData> = inputs.iter().map(|t| t.try_data()).collect::<Result<_>>()?;
    let types = || -> Vec<TensorType> { datas.iter().map(|d| d.tensor_type()).collect() };
    let outs = crate::kernels::run(&op, &datas, || {
        infer_types(&op, &types(), &[]).map_err(|detail| IrError::Type {
            op: op.name().to_string(),
            value: "(eager)".into(),
            detail,
        })?;
        Ok(())
    })?;
    if oar_ir::numerics::enabled() {
        for t in &outs {
            if let Some((i, v)) = oar_ir::numerics::first_non_finite(t) {
                let ins: Vec<String> = types().iter().map(|t| t.to_string()).collect();
                let at = oar_ir::numerics::caller_location().map_or(String::new(), |l| format!(", called from {l}"));
                return Err(Error::invalid(
                    op.name(),
                    format!(
                        "(eager, operands {}) {}{at}",
                        ins.join(", "),
                        oar_ir::numerics::describe(i, v)
                    ),
                ));
            }
        }
    }
    let host = |d: Vec<TensorData>| d.into_iter().map(Storage::Host).collect();
    Ok(outputs(op, inputs, needs_grad, host(datas), host(outs)))
}

/// Reshape, permute, slice and broadcast of a host tensor: its bytes seen through new strides
/// (see [`super::view`]), no kernel and no copy. A reshape that strides cannot express copies
/// the elements once (PyTorch's `reshape` does too). `None` for other ops.
fn view_of(op: &Op, inputs: &[&Tensor]) -> Result<Option<Storage>> {
    let ([x], Op::Reshape(_) | Op::Permute(_) | Op::Slice(_) | Op::Broadcast(_)) = (inputs, op) else {
        return Ok(None);
    };
    let storage = x.storage();
    let view = match &storage {
        Storage::Host(d) => super::view::View::of(d),
        Storage::View(v) => v.clone(),
        Storage::Device { .. } => return Ok(None),
    };
    let out = infer_types(op, &[x.tensor_type()], &[]).map_err(|detail| IrError::Type {
        op: op.name().to_string(),
        value: "(eager)".into(),
        detail,
    })?;
    let Some(shape) = out.first().and_then(|t| t.shape.as_static()) else {
        return Ok(None);
    };
    Ok(Some(match view.apply(op, &shape) {
        Some(v) => v.into_storage(),
        None if matches!(op, Op::Reshape(_)) => Storage::Host(x.try_data()?.reshaped(shape)?),
        None => return Ok(None),
    }))
}

/// `x`'s elements in new dense memory, recorded (when a gradient is needed) as a reshape to
/// its own shape, whose gradient passes the cotangent through.
pub(crate) fn dense_copy(x: &Tensor) -> Result<Tensor> {
    let op = Op::Reshape(oar_ir::ops::Reshape {
        shape: x.shape().into_iter().map(oar_ir::Dim::Static).collect(),
    });
    let dense = Storage::Host(x.try_data()?);
    let needs_grad = is_grad_enabled() && x.requires_grad();
    Ok(outputs(op, &[x], needs_grad, vec![x.storage()], vec![dense]).remove(0))
}

/// The output tensors of `op` on `inputs`: leaves, or — when a gradient is needed and some
/// output is a float — recorded on the tape with the op's operands and results saved.
fn outputs(op: Op, inputs: &[&Tensor], needs_grad: bool, operands: Vec<Storage>, results: Vec<Storage>) -> Vec<Tensor> {
    let record = needs_grad && results.iter().any(|r| r.dtype().is_float());
    if !record {
        return results.into_iter().map(|r| Tensor::make_in(r, None)).collect();
    }
    let saved_in = operands.into_iter().map(|r| Tensor::make_in(r, None)).collect();
    let saved_out = results.iter().cloned().map(|r| Tensor::make_in(r, None)).collect();
    let node = Arc::new(GradNode::new(op, inputs, saved_in, saved_out));
    results
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let float = r.dtype().is_float();
            let t = Tensor::make_in(r, Some((node.clone(), i)));
            if !float {
                t.0.stop_gradient.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            t
        })
        .collect()
}

/// Where an op on `inputs` runs: `None` for the CPU, else the one device its inputs are on.
/// CPU inputs that take no gradient (data, constants) are uploaded to it; a CPU input that
/// takes a gradient, or inputs on two devices, are errors naming the op and the devices.
fn placement(op: &Op, inputs: &[&Tensor]) -> Result<Option<Device>> {
    let devices: Vec<Device> = inputs.iter().map(|t| t.device()).collect();
    let Some(device) = devices.iter().find(|d| !d.is_cpu()).cloned() else {
        return Ok(None);
    };
    for (i, (t, d)) in inputs.iter().zip(&devices).enumerate() {
        if *d == device {
            continue;
        }
        if !d.is_cpu() {
            return Err(Error::invalid(
                op.name(),
                format!("inputs are on {device} and {d} (input {i}): move them to one device with `.to()`"),
            ));
        }
        if t.requires_grad() && is_grad_enabled() {
            return Err(Error::invalid(
                op.name(),
                format!(
                    "input {i} ({}) is on cpu and takes a gradient while the others are on {device}: \
                     move it (or its layer, `Layer::to`) to {device}",
                    t.tensor_type()
                ),
            ));
        }
    }
    Ok(Some(device))
}

/// [`apply`] for a primitive on `device`: the device runtime runs it (compiled once per op,
/// dtypes and shapes); the tape records device tensors, so backward runs there too.
fn apply_on_device(op: Op, inputs: &[&Tensor], device: &Device, needs_grad: bool) -> Result<Vec<Tensor>> {
    // `placement` allows only tensors on `device` and CPU tensors (uploaded here).
    let dts: Vec<DeviceTensor> = inputs
        .iter()
        .map(|t| match t.device_tensor() {
            Some(d) => Ok(d),
            None => crate::device::upload(device, &t.try_data()?),
        })
        .collect::<Result<_>>()?;
    let types: Vec<TensorType> = dts.iter().map(|d| d.tensor_type()).collect();
    let expect = infer_types(&op, &types, &[]).map_err(|detail| IrError::Type {
        op: op.name().to_string(),
        value: format!("(eager, on {device})"),
        detail,
    })?;
    let refs: Vec<&DeviceTensor> = dts.iter().collect();
    let outs = crate::device::run_op(device, &op, &refs, &expect)?;
    let place = |ds: Vec<DeviceTensor>| {
        ds.into_iter()
            .map(|tensor| Storage::Device {
                device: device.clone(),
                tensor,
            })
            .collect()
    };
    Ok(outputs(op, inputs, needs_grad, place(dts), place(outs)))
}

/// Apply an op with one output.
pub(crate) fn apply1(op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let mut outs = apply(op, inputs)?;
    Ok(outs.remove(0))
}
