//! Inference batch norm folded into the convolution before it.
//!
//! `batch_norm(conv2d(x, w, b?), γ, β, μ, σ²)` (inference mode, the convolution's only reader)
//! becomes `conv2d(x, w · k, (b − μ) · k + β)` with `k = γ / sqrt(σ² + ε)` per output channel,
//! when `w`, `b` and the statistics come from parameters and constants alone. The new weight
//! and bias are computed in the graph from those parameters; a backend or a model transform
//! that evaluates parameter-only values once (`oar::jit::fold_parameters`) makes them new
//! weights. The result equals the unfolded graph up to float rounding: one product and one sum
//! per element instead of the normalization's four operations.

use crate::{Pass, PassError};
use oar_ir::ops::{BinaryOp, UnaryOp};
use oar_ir::{Composite, Dim, Emitter, Graph, IrError, NodeId, Op, Shape, ValueId};

/// The batch-norm folding pass (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct FoldBatchNorm;

/// True if `v` is computed from parameters and constants alone (no input, no random draw).
pub(crate) fn parameter_only(g: &Graph, v: ValueId) -> bool {
    let mut stack = vec![v.node];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        let node = g.node(n);
        match &node.op {
            Op::Param(_) | Op::Constant(_) => {}
            Op::Input(_) | Op::Random(_) | Op::Composite(Composite::Dropout(_)) => return false,
            _ if !node.regions.is_empty() || node.inputs().is_empty() => return false,
            _ => stack.extend(node.inputs().iter().map(|i| i.node)),
        }
    }
    true
}

impl Pass for FoldBatchNorm {
    fn name(&self) -> &'static str {
        "fold-batch-norm"
    }

    fn description(&self) -> &'static str {
        "inference batch_norm after conv2d folded into the convolution's weight and bias"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let mut changed = false;
        for n in graph.topo_order() {
            if graph.get(n).is_none() {
                continue;
            }
            if let Some((conv, bn)) = matched(graph, n) {
                fold(graph, conv, bn).map_err(|e| PassError::ir(self.name(), e))?;
                changed = true;
            }
        }
        if changed {
            graph.remove_dead_nodes();
        }
        Ok(changed)
    }
}

/// `n` as an inference batch norm of a convolution only it reads: (conv node, bn node).
fn matched(g: &Graph, n: NodeId) -> Option<(NodeId, NodeId)> {
    let node = g.node(n);
    let Op::Composite(Composite::BatchNorm(bn)) = &node.op else {
        return None;
    };
    if bn.training {
        return None;
    }
    let x = node.inputs()[0];
    let conv = g.node(x.node);
    if !matches!(conv.op, Op::Composite(Composite::Conv2d(_))) {
        return None;
    }
    let only_reader = g.users(x).len() == 1 && !g.outputs().iter().any(|o| o.value == x);
    let statics = conv.inputs()[1..]
        .iter()
        .chain(&node.inputs()[1..])
        .all(|&v| parameter_only(g, v));
    (only_reader && statics && g.value_type(conv.inputs()[1]).rank() == 4).then_some((x.node, n))
}

fn fold(g: &mut Graph, conv: NodeId, bn: NodeId) -> Result<(), IrError> {
    let Op::Composite(Composite::BatchNorm(attrs)) = &g.node(bn).op else {
        unreachable!("matched a batch_norm")
    };
    let eps = attrs.epsilon.0;
    let [_, gamma, beta, mean, var] = g.node(bn).inputs()[..] else {
        unreachable!("batch_norm has five operands")
    };
    let c = g.node(conv);
    let op = c.op.clone();
    let (x, w, b) = (c.inputs()[0], c.inputs()[1], c.inputs().get(2).copied());
    let dt = g.value_type(var).dtype;
    let e = g.add_scalar(dt, eps);
    let v = g.binary(BinaryOp::Add, var, e)?;
    let sd = g.unary(UnaryOp::Sqrt, v)?;
    let k = g.binary(BinaryOp::Div, gamma, sd)?;
    let o = g.value_type(w).shape.0[0].clone();
    let kw = g.reshape(k, &Shape(vec![o, Dim::Static(1), Dim::Static(1), Dim::Static(1)]))?;
    let w2 = g.binary(BinaryOp::Mul, w, kw)?;
    let centered = match b {
        Some(b) => g.binary(BinaryOp::Sub, b, mean)?,
        None => g.unary(UnaryOp::Neg, mean)?,
    };
    let scaled = g.binary(BinaryOp::Mul, centered, k)?;
    let b2 = g.binary(BinaryOp::Add, scaled, beta)?;
    let y = g.add_op1(op, &[x, w2, b2])?;
    g.replace_all_uses(ValueId::first(bn), y)
}
