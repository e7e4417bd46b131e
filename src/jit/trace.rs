//! Tracing: while `to_static` runs the user's function, every op on a traced tensor is
//! recorded into a `Graph` instead of computed. Symbolic dims (the batch `N`) are traced with a
//! probe size that no real model uses; dims equal to a probe become the symbol again in the
//! graph, and the graph's symbolic types are checked against the traced (probe) types.
//!
//! Regions (`jit::cond` branches, `jit::while_loop` bodies) are traced by a nested `TraceCtx`
//! with a `parent`: while it is current, ops on the parent's tensors are recorded into the
//! region, and those tensors enter it as region inputs (`captures`).

use crate::error::{Error, Result};
use crate::tensor::Tensor;
pub(crate) use crate::tensor::intercept::Traced;
use crate::tensor::intercept::{self, Interceptor};
use oar_ir::ops::{Broadcast, Slice};
use oar_ir::ops::{SliceRange, infer_types};
use oar_ir::{DType, Dim, Graph, IrError, Op, Shape, TensorType, ValueId};
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

/// Probe sizes for symbolic dims: primes below 10 000, unlikely as real sizes or products.
const PROBES: [usize; 8] = [9973, 9967, 9949, 9941, 9931, 9929, 9923, 9907];

/// The state of one trace.
pub(crate) struct TraceCtx {
    pub(crate) graph: Mutex<Graph>,
    /// Symbol → probe size.
    pub(crate) probes: Vec<(String, usize)>,
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
    pub(crate) fn new(graph: Graph, probes: Vec<(String, usize)>, names: BTreeMap<u64, String>) -> Arc<TraceCtx> {
        Arc::new(TraceCtx {
            graph: Mutex::new(graph),
            probes,
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
            shape: t.shape(),
        }))
    }

    /// A trace for a region nested in `parent` (same symbols and named params).
    pub(crate) fn new_region(parent: &Arc<TraceCtx>, graph: Graph) -> Arc<TraceCtx> {
        Arc::new(TraceCtx {
            graph: Mutex::new(graph),
            probes: parent.probes.clone(),
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

    /// The probe size for the `i`-th distinct symbol.
    pub(crate) fn probe(i: usize) -> Option<usize> {
        PROBES.get(i).copied()
    }

    fn symbol_of(&self, n: usize) -> Option<&str> {
        self.probes.iter().find(|(_, p)| *p == n).map(|(s, _)| s.as_str())
    }

    /// Dims equal to a probe become their symbol.
    pub(crate) fn symbolize_dims(&self, dims: &[usize]) -> Vec<Dim> {
        dims.iter()
            .map(|&d| self.symbol_of(d).map_or(Dim::Static(d), Dim::sym))
            .collect()
    }

    fn symbolize_attr(&self, dims: &[Dim]) -> Vec<Dim> {
        dims.iter()
            .map(|d| match d {
                Dim::Static(n) => self.symbol_of(*n).map_or(d.clone(), Dim::sym),
                _ => d.clone(),
            })
            .collect()
    }

    /// The op with symbols in its shape attribute replaced by their probe sizes (ops built
    /// from symbolic types, e.g. by gradient rules, before computing traced shapes).
    fn concretize_op(&self, mut op: Op) -> Op {
        if let Some(shape) = op.shape_attr_mut() {
            for d in shape.iter_mut() {
                if let Dim::Sym(s) = d
                    && let Some((_, p)) = self.probes.iter().find(|(n, _)| n == s)
                {
                    *d = Dim::Static(*p);
                }
            }
        }
        op
    }

    /// The graph (symbolic) type of a traced value.
    pub(crate) fn symbolic_type(&self, v: ValueId) -> TensorType {
        self.graph
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .value_type(v)
            .clone()
    }

    /// The op with probe sizes in its attributes replaced by symbols (shape attributes, and
    /// slices that run to a probe-sized end, which take the whole symbolic axis).
    fn symbolize_op(&self, mut op: Op) -> Op {
        if let Some(shape) = op.shape_attr_mut() {
            *shape = self.symbolize_attr(shape);
        }
        if let Op::Slice(Slice { ranges }) = &mut op {
            for r in ranges.iter_mut() {
                let whole = r.start == 0 && r.step == 1 && r.end >= 0 && self.symbol_of(r.end as usize).is_some();
                if whole {
                    *r = SliceRange::FULL;
                }
            }
        }
        op
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
        } else if t.shape().iter().any(|&d| self.symbol_of(d).is_some()) {
            // Made with a traced size (e.g. zeros of the batch size): keep it symbolic when it
            // is a fill value, which is what such tensors are in practice.
            let data = t.try_data()?;
            let vals = data.to_f64_vec();
            if vals.windows(2).any(|w| w[0].to_bits() != w[1].to_bits()) || vals.is_empty() {
                return Err(Error::invalid(
                    "to_static",
                    format!(
                        "a tensor of shape {:?} was created with a traced (symbolic) size; derive it from the inputs instead",
                        t.shape()
                    ),
                ));
            }
            let s = g.add_scalar(data.dtype(), vals[0]);
            g.add_op1(
                Op::Broadcast(Broadcast {
                    shape: self.symbolize_dims(&t.shape()),
                }),
                &[s],
            )?
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

/// Record `op(inputs)` into the trace that one of the inputs belongs to.
pub(crate) fn trace_apply(ctx: &Arc<TraceCtx>, op: Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    // Inside a region (a cond branch, a while body), ops on the enclosing trace's tensors are
    // recorded into the region, which the current trace then is.
    let ctx = &match current() {
        Some(cur) if cur.is_within(ctx) => cur,
        _ => ctx.clone(),
    };
    let op = ctx.concretize_op(op);
    let values = inputs.iter().map(|t| ctx.value_of(t)).collect::<Result<Vec<_>>>()?;
    let concrete_in: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type()).collect();
    let concrete = infer_types(&op, &concrete_in, &[]).map_err(|detail| IrError::Type {
        op: op.name().to_string(),
        value: "(traced)".into(),
        detail,
    })?;
    let name = op.name();
    let sym_op_for_tape = op.clone();
    let sym_op = ctx.symbolize_op(op);
    let outs = ctx
        .graph
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .add_op(sym_op, &values)
        .map_err(|e| {
            let syms: Vec<&str> = ctx.probes.iter().map(|(s, _)| s.as_str()).collect();
            Error::invalid(
                "to_static",
                format!("{e} (while tracing, the symbolic dims {syms:?} must stay on their own axes)"),
            )
        })?;
    let g = ctx.graph.lock().unwrap_or_else(|e| e.into_inner());
    let probe = |s: &str| ctx.probes.iter().find(|(n, _)| n == s).map(|(_, p)| *p);
    drop(g);
    let record = crate::autograd::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
    let mut result = Vec::with_capacity(outs.len());
    let g = ctx.graph.lock().unwrap_or_else(|e| e.into_inner());
    for (v, c) in outs.into_iter().zip(concrete) {
        let sym = g.value_type(v);
        if sym.shape.bind(&probe) != c.shape {
            return Err(Error::invalid(
                "to_static",
                format!(
                    "op `{name}` gives {sym} in the graph but {c} when traced: it mixes a symbolic dim with \
                     other sizes (e.g. reshaping N×K into one axis); keep the symbolic dim on its own axis"
                ),
            ));
        }
        let shape = c.shape.as_static().unwrap_or_default();
        result.push(Tensor::traced(Traced {
            ctx: ctx.clone(),
            value: v,
            dtype: c.dtype,
            shape,
        }));
    }
    drop(g);
    if record {
        // Tracing a training step: keep the tape, with traced values saved for the VJPs so
        // `backward()` records the backward ops into the same graph.
        let saved_in = inputs.iter().map(|t| ctx.as_traced(t)).collect::<Result<Vec<_>>>()?;
        let node = Arc::new(crate::autograd::GradNode::new(
            sym_op_for_tape,
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
    let probe = |s: &str| ctx.probes.iter().find(|(n, _)| n == s).map(|(_, p)| *p);
    let shape = ty.shape.bind(&probe).as_static().unwrap_or_default();
    Ok(Tensor::traced(Traced {
        ctx: ctx.clone(),
        value: v,
        dtype,
        shape,
    }))
}
