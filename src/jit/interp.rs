//! Run a graph with eager tensors, op by op, so autograd records it: how a loaded model
//! (`TranslatedLayer`) is called and fine-tuned.

use crate::error::{Error, Result};
use crate::tensor::{Tensor, apply};
use oar_ir::ops::{Input, Param};
use oar_ir::{Dim, Graph, Op, TensorData, ValueId};
use std::collections::BTreeMap;

/// Loops stop with an error after this many iterations instead of hanging.
const MAX_WHILE_ITERATIONS: u64 = 1_000_000;

/// The graph's symbolic sizes in terms of the inputs' dims, checking them against the graph's
/// input types. The dims are static for eager inputs and may be symbolic while an enclosing
/// `to_static` traces the call (a loaded model inside a traced step).
fn bind_inputs(graph: &Graph, inputs: &BTreeMap<String, Tensor>) -> Result<BTreeMap<String, Dim>> {
    if !inputs.values().any(Tensor::is_traced) {
        let data = inputs
            .iter()
            .map(|(k, t)| t.try_data().map(|d| (k.clone(), d)))
            .collect::<Result<BTreeMap<_, _>>>()?;
        let sizes = oar_ir::backend::check_inputs(graph, &data)?;
        return Ok(sizes.into_iter().map(|(s, n)| (s, Dim::Static(n))).collect());
    }
    let mut binds: BTreeMap<String, Dim> = BTreeMap::new();
    for (name, ty) in graph.input_specs() {
        let t = inputs
            .get(&name)
            .ok_or_else(|| Error::invalid("call", format!("no value for input `{name}` ({ty})")))?;
        let dims = t.dims();
        let mismatch = |detail: String| {
            Error::invalid(
                "call",
                format!("input `{name}` is {} where {ty} is expected{detail}", t.tensor_type()),
            )
        };
        if t.dtype() != ty.dtype || dims.len() != ty.rank() {
            return Err(mismatch(String::new()));
        }
        for (axis, (want, got)) in ty.shape.dims().iter().zip(&dims).enumerate() {
            if let Dim::Sym(s) = want
                && !binds.contains_key(s)
            {
                binds.insert(s.clone(), got.clone());
                continue;
            }
            let want = substitute(want, &binds).map_err(|e| mismatch(format!(" (axis {axis}: {e})")))?;
            if want != *got {
                return Err(mismatch(format!(" (axis {axis} is {got}, not {want})")));
            }
        }
    }
    Ok(binds)
}

/// `d` with the bound symbols replaced by their dims.
fn substitute(d: &Dim, binds: &BTreeMap<String, Dim>) -> std::result::Result<Dim, String> {
    match d {
        Dim::Static(_) => Ok(d.clone()),
        _ => Dim::from_expr(d.to_expr().substitute_exprs(&|s| binds.get(s).map(Dim::to_expr))?),
    }
}

/// The op with symbolic dims in its shape attribute bound to the inputs' dims.
fn bind_op(op: &Op, binds: &BTreeMap<String, Dim>) -> Result<Op> {
    let mut bound = op.clone();
    if let Some(shape) = bound.shape_attr_mut() {
        for d in shape.iter_mut() {
            if let Some(s) = d.to_expr().symbols().into_iter().find(|s| !binds.contains_key(s)) {
                return Err(Error::invalid(
                    op.name(),
                    format!("size {d}: `{s}` is not bound by the inputs"),
                ));
            }
            let b = substitute(d, binds).map_err(|e| Error::invalid(op.name(), format!("size {d}: {e}")))?;
            *d = b;
        }
    }
    Ok(bound)
}

/// Evaluate `graph` eagerly; returns outputs in order.
pub(crate) fn run_eager(
    graph: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    params: &BTreeMap<String, Tensor>,
) -> Result<Vec<Tensor>> {
    let binds = bind_inputs(graph, inputs)?;
    let mut values: BTreeMap<ValueId, Tensor> = BTreeMap::new();
    for id in graph.topo_order() {
        let node = graph.node(id);
        let args: Vec<Tensor> = node.inputs().iter().map(|v| values[v].clone()).collect();
        let outs: Vec<Tensor> = match &node.op {
            Op::Input(Input { name, .. }) => vec![inputs[name].clone()],
            Op::Param(Param { name, .. }) => vec![
                params
                    .get(name)
                    .cloned()
                    .ok_or_else(|| Error::invalid("call", format!("no value for parameter `{name}`")))?,
            ],
            Op::Constant(t) => vec![Tensor::from_data(t.clone())],
            Op::Cond => {
                let pred = args[0].item()? != 0.0;
                let region = &node.regions[if pred { 0 } else { 1 }];
                run_region(region, &args[1..], params)?
            }
            Op::While => {
                let mut carried = args;
                let mut n = 0u64;
                while run_region(&node.regions[0], &carried, params)?[0].item()? != 0.0 {
                    n += 1;
                    if n > MAX_WHILE_ITERATIONS {
                        return Err(Error::invalid(
                            "while",
                            format!("more than {MAX_WHILE_ITERATIONS} iterations"),
                        ));
                    }
                    carried = run_region(&node.regions[1], &carried, params)?;
                }
                carried
            }
            op => {
                let refs: Vec<&Tensor> = args.iter().collect();
                apply(bind_op(op, &binds)?, &refs)?
            }
        };
        for (i, t) in outs.into_iter().enumerate() {
            values.insert(
                ValueId {
                    node: id,
                    output: i as u32,
                },
                t,
            );
        }
    }
    Ok(graph.outputs().iter().map(|o| values[&o.value].clone()).collect())
}

fn run_region(region: &Graph, args: &[Tensor], params: &BTreeMap<String, Tensor>) -> Result<Vec<Tensor>> {
    let inputs = region
        .input_specs()
        .into_iter()
        .map(|(n, _)| n)
        .zip(args.iter().cloned())
        .collect();
    run_eager(region, &inputs, params)
}

/// Eager tensors from weights.
pub(crate) fn tensors_of(weights: &BTreeMap<String, TensorData>) -> BTreeMap<String, Tensor> {
    weights
        .iter()
        .map(|(k, v)| (k.clone(), Tensor::from_data(v.clone())))
        .collect()
}
