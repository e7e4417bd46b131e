//! Decompositions of composite ops into primitives.
//!
//! Each composite is rewritten into the closed primitive set (elementwise, reductions, movement,
//! indexing, generators, matmul, conv), one file per topic. [`decompose`] checks the operands
//! with the composite's type rule first and checks afterwards that the primitives produce
//! exactly the composite's output types, so a decomposition can never silently change a graph.

mod activation;
mod attention;
mod build;
mod loss;
mod nn;
mod norm;
mod pooling;

use crate::ops::infer_types;
use crate::{Composite, Emitter, IrError, Op, TensorType};

/// The mnemonics of every composite op, in declaration order (for keep-lists and listings).
pub const COMPOSITE_NAMES: &[&str] = Composite::NAMES;

/// Apply the primitive ops computing `op(inputs)` through `e` (a [`Graph`](crate::Graph) records
/// them, an eager context computes them); returns the op's outputs.
///
/// Fails with the composite's own type error if the operands do not fit its rule.
pub fn decompose<E: Emitter>(op: &Composite, e: &mut E, inputs: &[E::Value]) -> Result<Vec<E::Value>, E::Error> {
    let name = op.name();
    let types: Vec<TensorType> = inputs.iter().map(|v| e.value_type(*v)).collect();
    let want = infer_types(&Op::Composite(op.clone()), &types, &[]).map_err(|detail| IrError::Type {
        op: name.to_string(),
        value: "<new>".into(),
        detail,
    })?;
    let outs = expand(op, e, inputs, &types, &want)?;
    let got: Vec<TensorType> = outs.iter().map(|v| e.value_type(*v)).collect();
    if got != want {
        // A bug in a decomposition, reported as an error rather than a corrupted graph.
        let show = |ts: &[TensorType]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
        return Err(IrError::Type {
            op: name.to_string(),
            value: "<new>".into(),
            detail: format!(
                "decomposition produced ({}) but the op yields ({})",
                show(&got),
                show(&want)
            ),
        }
        .into());
    }
    Ok(outs)
}

/// Dispatch to the per-topic decomposition; operand types are already checked.
fn expand<E: Emitter>(
    op: &Composite,
    g: &mut E,
    x: &[E::Value],
    types: &[TensorType],
    want: &[TensorType],
) -> Result<Vec<E::Value>, E::Error> {
    use Composite::*;
    let one = |r: Result<E::Value, E::Error>| r.map(|v| vec![v]);
    match op {
        Linear => one(nn::linear(g, x, types)),
        Conv2d {
            stride,
            padding,
            dilation,
            groups,
        } => one(nn::conv2d(g, x, *stride, *padding, *dilation, *groups)),
        Embedding => one(nn::embedding(g, x)),
        MaxPool2d {
            kernel,
            stride,
            padding,
            ceil_mode,
        } => {
            let _ = ceil_mode; // the output type already encodes the ceil rule
            one(pooling::max_pool2d(
                g, x[0], &types[0], &want[0], *kernel, *stride, *padding,
            ))
        }
        AvgPool2d {
            kernel,
            stride,
            padding,
            count_include_pad,
            ..
        } => one(pooling::avg_pool2d(
            g,
            x[0],
            &types[0],
            &want[0],
            pooling::Window {
                kernel: *kernel,
                stride: *stride,
                padding: *padding,
            },
            *count_include_pad,
        )),
        AdaptiveAvgPool2d { output_size } => one(pooling::adaptive_pool2d(g, x[0], &types[0], *output_size, false)),
        AdaptiveMaxPool2d { output_size } => one(pooling::adaptive_pool2d(g, x[0], &types[0], *output_size, true)),
        BatchNorm {
            epsilon,
            momentum,
            training,
        } => norm::batch_norm(g, x, &types[0], epsilon.0, momentum.0, *training),
        LayerNorm {
            normalized_ndim,
            epsilon,
        } => one(norm::layer_norm(g, x, &types[0], *normalized_ndim, epsilon.0)),
        Softmax { axis } => one(activation::softmax(g, x[0], *axis)),
        LogSoftmax { axis } => one(activation::log_softmax(g, x[0], *axis)),
        CrossEntropy { reduction } => one(loss::cross_entropy(g, x[0], x[1], &types[1], *reduction)),
        Relu => one(activation::relu(g, x[0])),
        Gelu { approximate } => one(activation::gelu(g, x[0], *approximate)),
        Silu => one(activation::silu(g, x[0])),
        Sigmoid => one(activation::sigmoid(g, x[0])),
        Dropout { p, training, seed } => one(activation::dropout(g, x[0], &types[0], p.0, *training, *seed)),
        ScaledDotProductAttention { causal, scale } => one(attention::sdpa(g, x, types, *causal, scale.map(|s| s.0))),
    }
}

#[cfg(test)]
mod tests;
