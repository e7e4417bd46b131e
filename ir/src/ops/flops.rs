//! Rough floating-point operation counts, for `oar inspect` and cost reports.

use super::{Composite, Op};
use crate::TensorType;

/// Estimated FLOPs of one op (multiply-add = 2); `None` when a shape is symbolic.
/// Elementwise ops count one per output element, reductions one per input element.
pub fn flops(op: &Op, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
    let n = |t: &TensorType| t.shape.num_elements().map(|n| n as u64);
    let out = || outputs.iter().map(n).sum::<Option<u64>>();
    let inp = |i: usize| inputs.get(i).and_then(n);
    Some(match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant(_) => 0,
        Op::Reshape { .. } | Op::Permute { .. } | Op::Broadcast { .. } | Op::Slice { .. } => 0,
        Op::Pad { .. } | Op::Concat { .. } | Op::Gather { .. } | Op::Cast { .. } => 0,
        Op::Iota { .. } => 0,
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Random { .. } => out()?,
        Op::Reduce { .. } | Op::ArgReduce { .. } => inp(0)?,
        Op::Scatter { .. } => inp(2)?,
        Op::MatMul => {
            let a = &inputs[0].shape.0;
            let k = a[a.len() - 1].as_static()? as u64;
            2 * k * out()?
        }
        Op::Conv { groups, .. } => conv_flops(inputs, outputs, *groups)?,
        Op::Composite(c) => match c {
            Composite::Linear => {
                let k = inputs[1].shape.0[0].as_static()? as u64;
                2 * k * out()? + if inputs.len() > 2 { out()? } else { 0 }
            }
            Composite::Conv2d { groups, .. } => conv_flops(inputs, outputs, *groups)? + out()?,
            Composite::MaxPool2d { kernel, .. } | Composite::AvgPool2d { kernel, .. } => {
                out()? * (kernel[0] * kernel[1]) as u64
            }
            Composite::AdaptiveAvgPool2d { .. } | Composite::AdaptiveMaxPool2d { .. } => inp(0)?,
            Composite::BatchNorm { .. } | Composite::LayerNorm { .. } => 8 * inp(0)?,
            Composite::Softmax { .. } | Composite::LogSoftmax { .. } | Composite::CrossEntropy { .. } => 5 * inp(0)?,
            Composite::Gelu { .. } => 8 * out()?,
            Composite::Silu | Composite::Sigmoid => 4 * out()?,
            Composite::Relu | Composite::Dropout { .. } => out()?,
            Composite::Embedding => 0,
            Composite::ScaledDotProductAttention { .. } => {
                let q = &inputs[0].shape.0;
                let e = q[q.len() - 1].as_static()? as u64;
                let k = &inputs[1].shape.0;
                let s = k[k.len() - 2].as_static()? as u64;
                let v = &inputs[2].shape.0;
                let ev = v[v.len() - 1].as_static()? as u64;
                let rows = out()? / ev.max(1);
                rows * s * (2 * e + 2 * ev + 5)
            }
        },
        Op::Cond | Op::While => 0,
    })
}

fn conv_flops(inputs: &[TensorType], outputs: &[TensorType], groups: usize) -> Option<u64> {
    let w = inputs[1].shape.as_static()?;
    let per_out: u64 = w[1..].iter().map(|&d| d as u64).product();
    let _ = groups; // w[1] is already C/groups
    Some(2 * per_out * outputs[0].shape.num_elements()? as u64)
}
