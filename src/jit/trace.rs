//! Tracing: while `to_static` runs the user's function, every op on a traced tensor is
//! recorded into a `Graph` instead of computed. Traced tensors carry the graph's symbolic types
//! (`f32[N,784]`); ops infer theirs symbolically, so reshaping the batch dim together with other
//! axes gives `N*C`. `Tensor::dims` reads them; `Tensor::shape` reads a symbolic dim as
//! `SYMBOLIC_SIZE`, which ops and constructors reject while tracing, so a size computed from it
//! never becomes a wrong constant.
//!
//! Regions (`jit::cond` branches, `jit::while_loop` bodies) are traced by a nested `TraceCtx`
//! with a `parent`: while it is current, ops on the parent's tensors are recorded into the
//! region, and those tensors enter it as region inputs (`captures`).

use crate::error::{Error, Result};
use crate::tensor::Tensor;
pub(crate) use crate::tensor::intercept::Traced;
use crate::tensor::intercept::{self, Interceptor};
use oar_ir::ops::Slice;
use oar_ir::{DType, Dim, Graph, Op, Shape, TensorType, ValueId};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The trace running on this thread, if any (the current interceptor, when it is a trace).
pub(crate) fn current() -> Option<Arc<TraceCtx>> {
    intercept::current().and_then(as_trace)
}

/// The trace an interceptor is, if it is one.
pub(crate) fn as_trace(i: Arc<dyn Interceptor>) -> Option<Arc<TraceCtx>> {
    i.into_any().downcast::<TraceCtx>().ok()
}

/// The trace a traced tensor belongs to (an error if another interceptor made it).
pub(crate) fn traced_ctx(tr: &Traced) -> Result<Arc<TraceCtx>> {
    as_trace(tr.ctx.clone())
        .ok_or_else(|| Error::invalid("to_static", "a tensor of another interceptor was used while tracing"))
}

/// Makes `ctx` the current trace (the tensor dispatcher's interceptor) until dropped.
pub(crate) struct CurrentGuard(#[allow(dead_code)] intercept::Guard);

impl CurrentGuard {
    pub(crate) fn enter(ctx: &Arc<TraceCtx>) -> CurrentGuard {
        CurrentGuard(intercept::Guard::enter(ctx.clone()))
    }
}

/// The state of one trace.
pub(crate) struct TraceCtx {
    pub(crate) graph: Mutex<Graph>,
    /// Eager tensors the function may use that become named params (layer parameters and
    /// buffers), by tensor id.
    pub(crate) names: Mutex<BTreeMap<u64, String>>,
    /// Eager tensors already in the graph, by tensor id.
    captured: Mutex<BTreeMap<u64, ValueId>>,
    /// Params the graph reads: name → live tensor.
    pub(crate) params: Mutex<BTreeMap<String, Tensor>>,
    /// In-place updates of params recorded by `assign` (batch-norm running stats).
    pub(crate) updates: Mutex<Vec<(String, ValueId)>>,
    /// For a region (the branch of a `cond`, the body of a `while`): the trace it is nested
    /// in. Regions take values only through their inputs, so a traced tensor of an enclosing
    /// trace used here becomes a region input (`captures`).
    pub(crate) parent: Option<Arc<TraceCtx>>,
    /// Region inputs standing for values of the parent graph: (parent value, region input).
    pub(crate) captures: Mutex<Vec<(ValueId, ValueId)>>,
}

impl TraceCtx {
    pub(crate) fn new(graph: Graph, names: BTreeMap<u64, String>) -> Arc<TraceCtx> {
        Arc::new(TraceCtx {
            graph: Mutex::new(graph),
            names: Mutex::new(names),
            captured: Mutex::new(BTreeMap::new()),
            params: Mutex::new(BTreeMap::new()),
            updates: Mutex::new(Vec::new()),
            parent: None,
            captures: Mutex::new(Vec::new()),
        })
    }

    /// The name `t` takes as a graph param if the traced code uses it (optimizer state).
    pub(crate) fn register_named(&self, t: &Tensor, name: &str) {
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(t.id(), name.to_string());
    }

    /// The param name of an eager tensor, if it has one.
    pub(crate) fn name_of(&self, t: &Tensor) -> Option<String> {
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&t.id())
            .cloned()
    }

    /// `t` as a traced tensor of this trace (capturing it if eager).
    pub(crate) fn as_traced(self: &Arc<Self>, t: &Tensor) -> Result<Tensor> {
        if t.is_traced() {
            return Ok(t.clone());
        }
        let value = self.value_of(t)?;
        Ok(Tensor::traced(Traced {
            ctx: self.clone() as Arc<dyn Interceptor>,
            value,
            dtype: t.dtype(),
            dims: t.dims(),
        }))
    }

    /// A trace for a region nested in `parent` (same symbols and named params).
    pub(crate) fn new_region(parent: &Arc<TraceCtx>, graph: Graph) -> Arc<TraceCtx> {
        Arc::new(TraceCtx {
            graph: Mutex::new(graph),
            names: Mutex::new(parent.names.lock().unwrap_or_else(|e| e.into_inner()).clone()),
            captured: Mutex::new(BTreeMap::new()),
            params: Mutex::new(BTreeMap::new()),
            updates: Mutex::new(Vec::new()),
            parent: Some(parent.clone()),
            captures: Mutex::new(Vec::new()),
        })
    }

    /// True if `other` is this trace or one it is nested in.
    pub(crate) fn is_within(&self, other: &Arc<TraceCtx>) -> bool {
        if std::ptr::eq(self, Arc::as_ptr(other)) {
            return true;
        }
        self.parent.as_ref().is_some_and(|p| p.is_within(other))
    }

    /// The region input standing for `outer`, a value of the parent graph (added on first use).
    pub(crate) fn capture_outer(&self, outer: ValueId) -> Result<ValueId> {
        let parent = self
            .parent
            .as_ref()
            .ok_or_else(|| Error::invalid("to_static", "only a region trace captures outer values"))?;
        let mut caps = self.captures.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, inner)) = caps.iter().find(|(o, _)| *o == outer) {
            return Ok(inner);
        }
        let ty = parent
            .graph
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .value_type(outer)
            .clone();
        let name = format!("capture{}", caps.len());
        let inner = self
            .graph
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add_input(&name, ty)?;
        caps.push((outer, inner));
        Ok(inner)
    }

    /// The graph (symbolic) type of a traced value.
    pub(crate) fn symbolic_type(&self, v: ValueId) -> TensorType {
        self.graph
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .value_type(v)
            .clone()
    }

    /// The graph value of `t`, capturing eager tensors (named ones as params, others as
    /// constants).
    pub(crate) fn value_of(self: &Arc<Self>, t: &Tensor) -> Result<ValueId> {
        if let Some(tr) = &t.0.trace {
            if std::ptr::addr_eq(Arc::as_ptr(&tr.ctx), Arc::as_ptr(self)) {
                return Ok(tr.value);
            }
            // A value of an enclosing trace used inside a region: it enters as a region input.
            if let Some(parent) = &self.parent
                && as_trace(tr.ctx.clone()).is_some_and(|c| self.is_within(&c))
            {
                let outer = parent.value_of(t)?;
                return self.capture_outer(outer);
            }
            return Err(Error::invalid(
                "to_static",
                "a tensor traced by another to_static call (or inside a finished cond/while branch) was used here",
            ));
        }
        if let Some(&v) = self.captured.lock().unwrap_or_else(|e| e.into_inner()).get(&t.id()) {
            return Ok(v);
        }
        let mut g = self.graph.lock().unwrap_or_else(|e| e.into_inner());
        let name = self
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&t.id())
            .cloned();
        let v = if let Some(name) = name {
            self.params
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name.clone(), t.clone());
            g.add_param(&name, t.tensor_type())?
        } else {
            g.add_constant(t.try_data()?)
        };
        self.captured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(t.id(), v);
        Ok(v)
    }
}

impl Interceptor for TraceCtx {
    fn intercept(self: Arc<Self>, op: Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        trace_apply(&self, op, inputs)
    }

    fn symbolic_type(&self, v: ValueId) -> TensorType {
        TraceCtx::symbolic_type(self, v)
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

/// Sizes in `op`'s attributes (shape attributes, slice bounds, padding) must not come from a
/// symbolic dim read through `shape()`.
fn check_attr_sizes(op: &Op) -> Result<()> {
    let mut sizes: Vec<usize> = Vec::new();
    if let Some(shape) = op.shape_attr() {
        sizes.extend(shape.iter().filter_map(Dim::as_static));
    }
    match op {
        Op::Slice(Slice { ranges }) => sizes.extend(
            ranges
                .iter()
                .flat_map(|r| [r.start, r.end])
                .filter(|&v| v != i64::MAX)
                .map(|v| v.unsigned_abs() as usize),
        ),
        Op::Pad(oar_ir::ops::Pad { before, after, .. }) => sizes.extend(before.iter().chain(after).copied()),
        _ => {}
    }
    intercept::check_sizes(op.name(), sizes)
}

/// Record `op(inputs)` into the trace that one of the inputs belongs to.
pub(crate) fn trace_apply(ctx: &Arc<TraceCtx>, op: Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    // Inside a region (a cond branch, a while body), ops on the enclosing trace's tensors are
    // recorded into the region, which the current trace then is.
    let ctx = &match current() {
        Some(cur) if cur.is_within(ctx) => cur,
        _ => ctx.clone(),
    };
    check_attr_sizes(&op)?;
    let values = inputs.iter().map(|t| ctx.value_of(t)).collect::<Result<Vec<_>>>()?;
    let tape_op = op.clone();
    let outs = ctx
        .graph
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .add_op(op, &values)
        .map_err(|e| Error::invalid("to_static", format!("{e} (while tracing)")))?;
    let record = crate::autograd::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
    let mut result = Vec::with_capacity(outs.len());
    let g = ctx.graph.lock().unwrap_or_else(|e| e.into_inner());
    for v in outs {
        let ty = g.value_type(v);
        result.push(Tensor::traced(Traced {
            ctx: ctx.clone(),
            value: v,
            dtype: ty.dtype,
            dims: ty.shape.0.clone(),
        }));
    }
    drop(g);
    if record {
        // Tracing a training step: keep the tape, with traced values saved for the VJPs so
        // `backward()` records the backward ops into the same graph.
        let saved_in = inputs.iter().map(|t| ctx.as_traced(t)).collect::<Result<Vec<_>>>()?;
        let node = Arc::new(crate::autograd::GradNode::new(
            tape_op,
            inputs,
            saved_in,
            result.clone(),
        ));
        result = result
            .into_iter()
            .enumerate()
            .map(|(i, t)| t.with_creator(node.clone(), i))
            .collect();
    }
    Ok(result)
}

/// A graph input as a traced tensor.
pub(crate) fn input(ctx: &Arc<TraceCtx>, name: &str, dims: &[Dim], dtype: DType) -> Result<Tensor> {
    let ty = TensorType::new(dtype, Shape(dims.to_vec()));
    let v = ctx
        .graph
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .add_input(name, ty.clone())?;
    Ok(Tensor::traced(Traced {
        ctx: ctx.clone(),
        value: v,
        dtype,
        dims: dims.to_vec(),
    }))
}
