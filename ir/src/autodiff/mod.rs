//! Reverse-mode differentiation: [`vjp`] applies an op's own gradient rule
//! ([`OpDef::vjp`], in its family's module), shared by eager autograd and static graphs, and
//! [`append_backward`] extends a graph with the gradient of a scalar.

use crate::emit::Emitter;
use crate::ops::{BinaryOp, Composite, Op, OpDef, VjpArgs};
use crate::{Graph, IrError, NodeId, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// Gradients of `op`'s inputs given the cotangents of its outputs (`None` = zero).
/// `wants[i]` says whether input `i` needs a gradient; unwanted or non-differentiable inputs
/// get `None`. Composites must be decomposed first; control flow is not differentiable yet.
pub fn vjp<E: Emitter>(
    e: &mut E,
    op: &Op,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    wants: &[bool],
) -> Result<Vec<Option<E::Value>>, E::Error> {
    let none = vec![None; inputs.len()];
    if !wants.iter().any(|&w| w) {
        return Ok(none);
    }
    // Only single-output primitives are differentiable; their cotangent is cotangents[0].
    let g = match cotangents.first() {
        Some(Some(g)) => *g,
        _ => return Ok(none),
    };
    let args = VjpArgs {
        inputs,
        outputs,
        g,
        wants,
    };
    op.vjp(e, &args)
}

/// Append to `graph` the nodes computing `d loss / d wrt[i]` for each `wrt[i]` (`None` when the
/// loss does not depend on it). `loss` may have any shape: its cotangent is all ones (so the
/// result is the gradient of `sum(loss)`). Composite ops must be decomposed first.
pub fn append_backward(graph: &mut Graph, loss: ValueId, wrt: &[ValueId]) -> Result<Vec<Option<ValueId>>, IrError> {
    let order = graph.topo_order();
    // Nodes on a path from some `wrt` to `loss`.
    let mut depends: BTreeSet<NodeId> = wrt.iter().map(|v| v.node).collect();
    for &n in &order {
        if graph.node(n).inputs().iter().any(|v| depends.contains(&v.node)) {
            depends.insert(n);
        }
    }
    let mut reaches: BTreeSet<NodeId> = BTreeSet::from([loss.node]);
    for &n in order.iter().rev() {
        if reaches.contains(&n) {
            reaches.extend(graph.node(n).inputs().iter().map(|v| v.node));
        }
    }
    let ty = Graph::value_type(graph, loss).clone();
    let seed = graph.full(&ty, 1.0)?;
    let mut cot: BTreeMap<ValueId, ValueId> = BTreeMap::from([(loss, seed)]);
    for &n in order.iter().rev() {
        if !(depends.contains(&n) && reaches.contains(&n)) {
            continue;
        }
        let node = graph.node(n);
        let outs: Vec<ValueId> = (0..node.outputs().len() as u32)
            .map(|output| ValueId { node: n, output })
            .collect();
        let cts: Vec<Option<ValueId>> = outs.iter().map(|v| cot.get(v).copied()).collect();
        if cts.iter().all(Option::is_none) {
            continue;
        }
        let inputs = node.inputs().to_vec();
        let wants: Vec<bool> = inputs.iter().map(|v| depends.contains(&v.node)).collect();
        let op = node.op.clone();
        let grads = vjp(graph, &op, &inputs, &outs, &cts, &wants)?;
        for (x, gx) in inputs.into_iter().zip(grads) {
            if let Some(gx) = gx {
                let acc = match cot.get(&x) {
                    Some(&prev) => graph.binary(BinaryOp::Add, prev, gx)?,
                    None => gx,
                };
                cot.insert(x, acc);
            }
        }
    }
    Ok(wrt.iter().map(|v| cot.get(v).copied()).collect())
}

/// The gradients of composite `c`'s operands through its decomposition, emitted into `e`:
/// the decomposition is emitted (nested composites decomposed in turn), then each
/// primitive's rule applied in reverse — what differentiating the decomposed graph gives.
/// A composite's own gradient op (`max_pool2d_grad`) decomposes to this.
pub fn vjp_through_decomposition<E: Emitter>(
    e: &mut E,
    c: &Composite,
    inputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    wants: &[bool],
) -> Result<Vec<Option<E::Value>>, E::Error> {
    // The recorder wraps the emitter as a trait object: its type does not grow with each
    // nesting (a decomposition that records again would otherwise instantiate forever).
    let inner: &mut dyn Emitter<Value = E::Value, Error = E::Error> = e;
    let mut rec = Recorder {
        inner,
        values: Vec::new(),
        tape: Vec::new(),
        recording: true,
    };
    let ins: Vec<usize> = inputs.iter().map(|&v| rec.intern(v)).collect();
    let outs = crate::decompose::decompose(c, &mut rec, &ins)?;
    rec.recording = false;
    // Values that depend on a wanted operand.
    let mut depends = vec![false; rec.values.len()];
    for (&i, &w) in ins.iter().zip(wants) {
        depends[i] |= w;
    }
    for step in &rec.tape {
        if step.ins.iter().any(|&v| depends[v]) {
            for &o in &step.outs {
                depends[o] = true;
            }
        }
    }
    let mut cot: BTreeMap<usize, usize> = BTreeMap::new();
    for (&y, ct) in outs.iter().zip(cotangents) {
        if let Some(ct) = ct {
            let ct = rec.intern(*ct);
            add_cotangent(&mut rec, &mut cot, y, ct)?;
        }
    }
    let tape = std::mem::take(&mut rec.tape);
    for step in tape.iter().rev() {
        let cts: Vec<Option<usize>> = step.outs.iter().map(|o| cot.get(o).copied()).collect();
        let step_wants: Vec<bool> = step.ins.iter().map(|&v| depends[v]).collect();
        if cts.iter().all(Option::is_none) || !step_wants.iter().any(|&w| w) {
            continue;
        }
        let grads = vjp(&mut rec, &step.op, &step.ins, &step.outs, &cts, &step_wants)?;
        for (&x, gx) in step.ins.iter().zip(grads) {
            if let Some(gx) = gx {
                add_cotangent(&mut rec, &mut cot, x, gx)?;
            }
        }
    }
    Ok(ins
        .iter()
        .zip(wants)
        .map(|(i, &w)| if w { cot.get(i).map(|&g| rec.values[g]) } else { None })
        .collect())
}

fn add_cotangent<V: Copy + std::fmt::Debug, Er>(
    rec: &mut Recorder<'_, V, Er>,
    cot: &mut BTreeMap<usize, usize>,
    x: usize,
    g: usize,
) -> Result<(), Er>
where
    Er: From<IrError> + std::fmt::Debug,
{
    let acc = match cot.get(&x) {
        Some(&prev) => rec.binary(BinaryOp::Add, prev, g)?,
        None => g,
    };
    cot.insert(x, acc);
    Ok(())
}

/// One primitive applied while recording: its op, operands and results (recorder handles).
struct Step {
    op: Op,
    ins: Vec<usize>,
    outs: Vec<usize>,
}

/// An emitter that forwards to `inner` and, while `recording`, decomposes composites and keeps
/// a tape of the primitives. Its handles index `values` (the inner emitter's values need not
/// be comparable).
struct Recorder<'a, V, Er> {
    inner: &'a mut dyn Emitter<Value = V, Error = Er>,
    values: Vec<V>,
    tape: Vec<Step>,
    recording: bool,
}

impl<V, Er> Recorder<'_, V, Er> {
    fn intern(&mut self, v: V) -> usize {
        self.values.push(v);
        self.values.len() - 1
    }
}

impl<V: Copy + std::fmt::Debug, Er: From<IrError> + std::fmt::Debug> Emitter for Recorder<'_, V, Er> {
    type Value = usize;
    type Error = Er;

    fn add_op(&mut self, op: Op, inputs: &[usize]) -> Result<Vec<usize>, Er> {
        if self.recording
            && let Op::Composite(c) = &op
        {
            return crate::decompose::decompose(c, self, inputs);
        }
        let ins: Vec<V> = inputs.iter().map(|&i| self.values[i]).collect();
        let outs: Vec<usize> = self
            .inner
            .add_op(op.clone(), &ins)?
            .into_iter()
            .map(|v| self.intern(v))
            .collect();
        if self.recording {
            self.tape.push(Step {
                op,
                ins: inputs.to_vec(),
                outs: outs.clone(),
            });
        }
        Ok(outs)
    }

    fn add_constant(&mut self, value: crate::TensorData) -> Result<usize, Er> {
        let v = self.inner.add_constant(value)?;
        Ok(self.intern(v))
    }

    fn value_type(&self, v: usize) -> crate::TensorType {
        self.inner.value_type(self.values[v])
    }
}
