//! The tape: each recorded op keeps its inputs' links and saved values; `backward()` walks the
//! recorded ops newest-first and applies the shared VJP rules (`oar_ir::autodiff::vjp`).

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::emit::Emitter;
use oar_ir::{Op, TensorData, TensorType};

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// True unless inside a [`no_grad`] scope.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous grad mode when dropped.
pub struct GradModeGuard {
    prev: bool,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.prev));
    }
}

/// Turn recording off until the guard drops (`let _g = oar::no_grad();`).
pub fn no_grad() -> GradModeGuard {
    set_grad_enabled(false)
}

/// Set grad mode until the guard drops.
pub fn set_grad_enabled(on: bool) -> GradModeGuard {
    let prev = GRAD_ENABLED.with(|g| g.replace(on));
    GradModeGuard { prev }
}

/// Run `f` with recording off.
pub fn with_no_grad<T>(f: impl FnOnce() -> T) -> T {
    let _g = no_grad();
    f()
}

static NEXT_NODE: AtomicU64 = AtomicU64::new(1);

/// Where an input's gradient goes.
pub(crate) enum Edge {
    /// A leaf that takes gradients: accumulate into its `.grad`.
    Leaf(Tensor),
    /// The output `usize` of an earlier recorded op.
    Interior(Arc<GradNode>, usize),
    /// No gradient flows (stop_gradient or not a float).
    None,
}

/// One recorded op.
pub(crate) struct GradNode {
    /// Creation order: a node only depends on nodes with smaller ids.
    id: u64,
    op: Op,
    edges: Vec<Edge>,
    /// Values the VJP needs (inputs, outputs) as immutable snapshots — eager data, or traced
    /// values while `to_static` records a training step; dropped after backward unless retained.
    saved: Mutex<Option<(Vec<Tensor>, Vec<Tensor>)>>,
    output_types: Vec<TensorType>,
}

impl GradNode {
    /// Record `op`: gradients flow to `inputs`; `saved_inputs`/`saved_outputs` are the values
    /// its VJP reads.
    pub(crate) fn new(op: Op, inputs: &[&Tensor], saved_inputs: Vec<Tensor>, saved_outputs: Vec<Tensor>) -> GradNode {
        let edges = inputs
            .iter()
            .map(|t| match (&t.0.creator, t.requires_grad()) {
                (_, false) => Edge::None,
                (Some((node, i)), true) => Edge::Interior(node.clone(), *i),
                (None, true) => Edge::Leaf((*t).clone()),
            })
            .collect();
        GradNode {
            id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
            op,
            edges,
            output_types: saved_outputs.iter().map(Tensor::tensor_type).collect(),
            saved: Mutex::new(Some((saved_inputs, saved_outputs))),
        }
    }
}

/// Eager values behind `Emitter` handles, so VJP rules written for graphs run eagerly.
pub(crate) struct EagerEmitter {
    pub(crate) values: Vec<Tensor>,
}

impl EagerEmitter {
    pub(crate) fn push(&mut self, t: Tensor) -> usize {
        self.values.push(t);
        self.values.len() - 1
    }
}

impl Emitter for EagerEmitter {
    type Value = usize;
    type Error = Error;

    fn add_op(&mut self, op: Op, inputs: &[usize]) -> Result<Vec<usize>> {
        let ins: Vec<&Tensor> = inputs.iter().map(|&i| &self.values[i]).collect();
        let outs = crate::tensor::apply(op, &ins)?;
        Ok(outs.into_iter().map(|t| self.push(t)).collect())
    }

    fn add_constant(&mut self, value: TensorData) -> Result<usize> {
        Ok(self.push(Tensor::from_data(value)))
    }

    fn value_type(&self, v: usize) -> TensorType {
        // While tracing, gradient rules must see symbolic dims (a mean over `N` divides by `N`,
        // not by the probe size).
        let t = &self.values[v];
        match &t.0.trace {
            Some(tr) => tr.ctx.symbolic_type(tr.value),
            None => t.tensor_type(),
        }
    }
}

fn add_into(slot: &mut Option<Tensor>, g: Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        Some(prev) => crate::tensor::apply(Op::Binary(oar_ir::ops::BinaryOp::Add), &[&prev, &g])?.remove(0),
        None => g,
    });
    Ok(())
}

/// A cotangent being summed during backward: a tensor as a VJP returned it, or a host buffer
/// the tape owns alone and adds later contributions into in place.
enum Cot {
    Shared(Tensor),
    Owned(TensorData),
}

impl Cot {
    fn into_tensor(self) -> Tensor {
        match self {
            Cot::Shared(t) => t,
            Cot::Owned(d) => Tensor::from_data(d),
        }
    }

    /// The value as a host buffer to write into (shared bytes are copied when first written),
    /// if it is on the host in a dtype [`crate::kernels::accumulate`] handles.
    fn owned(self) -> std::result::Result<TensorData, Cot> {
        match self {
            Cot::Owned(d) => Ok(d),
            Cot::Shared(t) if t.device().is_cpu() && !t.is_traced() => match t.try_data() {
                Ok(d) if crate::kernels::accumulate::supported(d.dtype(), d.dtype()) => Ok(d),
                _ => Err(Cot::Shared(t)),
            },
            other => Err(other),
        }
    }
}

/// Add `g` into a cotangent slot: in place when the slot already holds a host buffer of the
/// same type (the first sum makes one), else through the `add` op.
fn accumulate(slot: &mut Option<Cot>, g: Tensor) -> Result<()> {
    let Some(prev) = slot.take() else {
        *slot = Some(Cot::Shared(g));
        return Ok(());
    };
    let host = g.device().is_cpu() && !g.is_traced();
    let prev = match prev {
        Cot::Owned(mut d) if host => {
            let gd = g.try_data()?;
            if d.shape() == gd.shape() && crate::kernels::accumulate::add_in_place(&mut d, &gd) {
                *slot = Some(Cot::Owned(d));
                return Ok(());
            }
            Cot::Owned(d)
        }
        prev => prev,
    };
    let sum = crate::tensor::apply(Op::Binary(oar_ir::ops::BinaryOp::Add), &[&prev.into_tensor(), &g])?.remove(0);
    // The sum is new memory nobody else holds: later contributions go into it in place.
    *slot = Some(if host {
        Cot::Owned(sum.try_data()?)
    } else {
        Cot::Shared(sum)
    });
    Ok(())
}

/// The gradient of `slice` (operand type `input`) added straight into the window it took:
/// no zero-padded copy of the operand per slice, one buffer for all of them. False when this
/// does not apply (device or traced values, other dtypes, symbolic dims): then the slice's VJP
/// runs as usual.
fn accumulate_slice(
    slot: &mut Option<Cot>,
    slice: &oar_ir::ops::Slice,
    input: &TensorType,
    g: &Tensor,
) -> Result<bool> {
    let Some(dims) = input.shape.as_static() else {
        return Ok(false);
    };
    if slice.ranges.len() != dims.len() || !g.device().is_cpu() || g.is_traced() {
        return Ok(false);
    }
    let gd = g.try_data()?;
    if !crate::kernels::accumulate::supported(input.dtype, gd.dtype()) {
        return Ok(false);
    }
    let start: Vec<usize> = slice.ranges.iter().zip(&dims).map(|(r, &n)| r.resolve(n).0).collect();
    let step: Vec<usize> = slice.ranges.iter().map(|r| r.step.max(1) as usize).collect();
    let mut acc = match slot.take() {
        None => {
            TensorData::full(input.dtype, dims.clone(), 0.0).map_err(|e| Error::invalid("backward", e.to_string()))?
        }
        Some(prev) => match prev.owned() {
            Ok(d) if d.shape() == dims.as_slice() => d,
            Ok(d) => {
                *slot = Some(Cot::Owned(d));
                return Ok(false);
            }
            Err(prev) => {
                *slot = Some(prev);
                return Ok(false);
            }
        },
    };
    let done = crate::kernels::accumulate::add_into_window(&mut acc, &start, &step, &gd);
    *slot = Some(Cot::Owned(acc));
    Ok(done)
}

impl Tensor {
    /// Backpropagate from this tensor (its gradient is all ones), accumulating into the
    /// `.grad()` of every leaf that takes gradients; the recorded graph is then released.
    pub fn backward(&self) -> Result<()> {
        self.backward_with(None, false)
    }

    /// Backpropagate with an explicit output gradient (default ones) and, with
    /// `retain_graph`, keep the recorded graph for another backward pass.
    pub fn backward_with(&self, grad: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        if !self.requires_grad() {
            return Err(Error::invalid(
                "backward",
                "the tensor does not require a gradient (stop_gradient is true and no input takes gradients)",
            ));
        }
        let seed = match grad {
            Some(g) if g.tensor_type() != self.tensor_type() => {
                return Err(Error::invalid(
                    "backward",
                    format!(
                        "gradient {} does not match tensor {}",
                        g.tensor_type(),
                        self.tensor_type()
                    ),
                ));
            }
            Some(g) => g.detach().to(&self.device())?,
            None => crate::tensor::full_dims(&self.dims(), 1.0, self.dtype())?.to(&self.device())?,
        };
        let _mode = crate::autograd::no_grad();
        // Gradients run in the dtypes the forward ops ran in, never re-cast by AMP.
        let _amp = crate::amp::disable();
        let Some((root, out)) = &self.0.creator else {
            let mut slot = self.grad();
            add_into(&mut slot, seed)?;
            self.set_grad(slot);
            return Ok(());
        };
        // Collect the recorded ops reachable from the root, newest first.
        let mut nodes: BTreeMap<u64, Arc<GradNode>> = BTreeMap::new();
        let mut stack = vec![root.clone()];
        while let Some(n) = stack.pop() {
            if nodes.insert(n.id, n.clone()).is_none() {
                for e in &n.edges {
                    if let Edge::Interior(p, _) = e {
                        stack.push(p.clone());
                    }
                }
            }
        }
        let mut cot: HashMap<(u64, usize), Option<Cot>> = HashMap::new();
        cot.insert((root.id, *out), Some(Cot::Shared(seed)));
        // Each leaf's gradient is complete once the oldest op that reads it is done (ops run
        // newest first): then its contributions are added into `.grad()` and the gradient
        // hook, if any, hears of it (data parallelism starts reducing it while backward goes on).
        let mut last_use: BTreeMap<u64, Vec<Tensor>> = BTreeMap::new();
        {
            // `nodes` ascends by id: the first op met reading a leaf is its oldest.
            let mut seen = std::collections::HashSet::new();
            for n in nodes.values() {
                for e in &n.edges {
                    if let Edge::Leaf(t) = e
                        && seen.insert(t.id())
                    {
                        last_use.entry(n.id).or_default().push(t.clone());
                    }
                }
            }
        }
        let mut leaves: HashMap<u64, Vec<Tensor>> = HashMap::new();
        let finish = |id: u64, leaves: &mut HashMap<u64, Vec<Tensor>>| -> Result<()> {
            for leaf in last_use.get(&id).into_iter().flatten() {
                let Some(gs) = leaves.remove(&leaf.id()) else { continue };
                let mut slot = leaf.grad();
                for g in gs {
                    add_into(&mut slot, g)?;
                }
                leaf.set_grad(slot);
                GRAD_HOOK.with(|h| {
                    if let Some(h) = h.borrow_mut().as_mut() {
                        h(leaf);
                    }
                });
            }
            Ok(())
        };
        for node in nodes.values().rev() {
            self.backward_node(node, &mut cot, &mut leaves, retain_graph)?;
            finish(node.id, &mut leaves)?;
        }
        Ok(())
    }

    /// Backpropagate through one recorded op: its cotangents (taken from `cot`) become its
    /// inputs' (added into `cot`, or collected per leaf in `leaves`).
    fn backward_node(
        &self,
        node: &Arc<GradNode>,
        cot: &mut HashMap<(u64, usize), Option<Cot>>,
        leaves: &mut HashMap<u64, Vec<Tensor>>,
        retain_graph: bool,
    ) -> Result<()> {
        {
            let cts: Vec<Option<Tensor>> = (0..node.output_types.len())
                .map(|i| cot.remove(&(node.id, i)).flatten().map(Cot::into_tensor))
                .collect();
            if cts.iter().all(Option::is_none) {
                return Ok(());
            }
            // A slice into an earlier op's result: add its gradient into that result's
            // cotangent in place (the input's type is what the slice was recorded with).
            if let (Op::Slice(sl), Some(g), [Edge::Interior(p, i)]) = (&node.op, &cts[0], node.edges.as_slice())
                && let Some(input) = p.output_types.get(*i)
                && accumulate_slice(cot.entry((p.id, *i)).or_default(), sl, input, g)?
            {
                if !retain_graph {
                    *node.saved.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
                return Ok(());
            }
            let saved = {
                let guard = node.saved.lock().unwrap_or_else(|e| e.into_inner());
                guard.clone().ok_or_else(|| {
                    Error::invalid(
                        "backward",
                        format!(
                            "the graph through `{}` was already released by a previous backward; \
                             pass retain_graph = true to backward twice",
                            node.op.name()
                        ),
                    )
                })?
            };
            let wants: Vec<bool> = node.edges.iter().map(|e| !matches!(e, Edge::None)).collect();
            let grads: Vec<Option<Tensor>> = match &node.op {
                // Recorded as itself (a fused eager composite): its compiled gradient program.
                // (A traced one, recorded whole for its own rule, records that rule below.)
                Op::Composite(_) if !saved.0.iter().any(Tensor::is_traced) => {
                    let ins: Vec<TensorData> = saved.0.iter().map(Tensor::try_data).collect::<Result<_>>()?;
                    let cts: Vec<Option<TensorData>> = cts
                        .iter()
                        .map(|c| c.as_ref().map(Tensor::try_data).transpose())
                        .collect::<Result<_>>()?;
                    let results: Vec<TensorData> = saved.1.iter().map(Tensor::try_data).collect::<Result<_>>()?;
                    crate::kernels::composite_vjp(&node.op, &ins, &results, &cts, &wants)?
                        .into_iter()
                        .map(|g| g.map(Tensor::from_data))
                        .collect()
                }
                _ => {
                    let mut em = EagerEmitter { values: Vec::new() };
                    let ins: Vec<usize> = saved.0.into_iter().map(|t| em.push(t)).collect();
                    let outs: Vec<usize> = saved.1.into_iter().map(|t| em.push(t)).collect();
                    let cts: Vec<Option<usize>> = cts.into_iter().map(|c| c.map(|t| em.push(t))).collect();
                    let grads = oar_ir::autodiff::vjp(&mut em, &node.op, &ins, &outs, &cts, &wants)?;
                    grads.into_iter().map(|g| g.map(|g| em.values[g].clone())).collect()
                }
            };
            for (edge, g) in node.edges.iter().zip(grads) {
                let Some(g) = g else { continue };
                match edge {
                    Edge::None => {}
                    Edge::Leaf(t) => leaves.entry(t.id()).or_default().push(g),
                    Edge::Interior(p, i) => accumulate(cot.entry((p.id, *i)).or_default(), g)?,
                }
            }
            if !retain_graph {
                *node.saved.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        Ok(())
    }
}

/// What [`with_grad_hook`] calls.
type GradHook = Box<dyn FnMut(&Tensor)>;

thread_local! {
    /// Called with each leaf whose gradient a running backward has completed (this thread's
    /// backward passes only).
    static GRAD_HOOK: std::cell::RefCell<Option<GradHook>> = const { std::cell::RefCell::new(None) };
}

/// Run `f` (a backward pass) with `hook` called for each leaf as soon as its gradient is
/// complete, in the order backward completes them; the previous hook is restored after.
pub(crate) fn with_grad_hook<T>(hook: impl FnMut(&Tensor) + 'static, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<GradHook>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            GRAD_HOOK.with(|h| *h.borrow_mut() = prev);
        }
    }
    let prev = GRAD_HOOK.with(|h| h.borrow_mut().replace(Box::new(hook)));
    let _restore = Restore(prev);
    f()
}
