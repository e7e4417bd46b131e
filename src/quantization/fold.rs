//! Batch norms folded into the convolutions before them, on an eager model — before
//! quantization-aware training, so that the weight quantizers see the weights inference will
//! multiply (folding after QAT would change the quantized weights the training tuned).

use crate::error::{Error, Result};
use crate::jit::InputSpec;
use crate::nn::Layer;
use oar_ir::ops::Param;
use oar_ir::{Composite, Op, ValueId};
use std::collections::BTreeMap;

/// Fold every batch norm that directly follows a `Conv2D` in `model` (the convolution's
/// result read by nothing else) into that convolution, with the batch norm's running
/// statistics: `weight[o] · γ[o]/√(var[o] + ε)`, bias `(bias[o] − mean[o]) · γ[o]/√(var[o] +
/// ε) + β[o]`; the batch norm then computes the identity and holds no state (a checkpoint of
/// the folded model has no batch-norm entries). Returns how many were folded.
///
/// Which convolution feeds which batch norm is read from a trace of `model.forward` on `spec`
/// (in eval mode), not from the order the layers are declared in. Folding uses inference
/// statistics: fold a trained float model, then quantize (`QAT`, `PTQ`) and fine-tune.
pub fn fold_batch_norms(model: &mut dyn Layer, spec: &InputSpec) -> Result<usize> {
    let training = model.is_training();
    model.eval();
    let pairs = conv_bn_pairs(model, spec);
    if training {
        model.train();
    }
    let pairs = pairs?;
    let state = model.state_dict();
    let values = |name: &str| -> Result<Vec<f32>> {
        state
            .get(name)
            .ok_or_else(|| Error::invalid("fold_batch_norms", format!("no state `{name}`")))?
            .try_data()?
            .to_vec::<f32>()
            .map_err(Into::into)
    };
    let mut affine = Vec::with_capacity(pairs.len());
    for (conv, bn, eps) in &pairs {
        let key = |s: &str| {
            if bn.is_empty() {
                s.to_string()
            } else {
                format!("{bn}.{s}")
            }
        };
        let (g, b, m, v) = (
            values(&key("weight"))?,
            values(&key("bias"))?,
            values(&key("_mean"))?,
            values(&key("_variance"))?,
        );
        let scale: Vec<f32> = g
            .iter()
            .zip(&v)
            .map(|(g, v)| (*g as f64 / (*v as f64 + eps).sqrt()) as f32)
            .collect();
        let shift: Vec<f32> = (0..scale.len())
            .map(|c| (b[c] as f64 - m[c] as f64 * scale[c] as f64) as f32)
            .collect();
        affine.push((conv.clone(), bn.clone(), scale, shift));
    }
    for (conv, bn, scale, shift) in &affine {
        let c =
            layer_at(model, conv).ok_or_else(|| Error::invalid("fold_batch_norms", format!("no layer `{conv}`")))?;
        c.fold_affine(scale, shift).unwrap_or_else(|| {
            Err(Error::invalid(
                "fold_batch_norms",
                format!("layer `{conv}` cannot take a batch norm"),
            ))
        })?;
        let n = layer_at(model, bn).ok_or_else(|| Error::invalid("fold_batch_norms", format!("no layer `{bn}`")))?;
        if !n.fold_away() {
            return Err(Error::invalid(
                "fold_batch_norms",
                format!("layer `{bn}` is not a batch norm"),
            ));
        }
    }
    Ok(affine.len())
}

/// `(conv layer path, batch norm layer path, epsilon)` for each batch norm of the trace whose
/// input is a 2-d convolution's result that nothing else reads, both with their state named
/// `<path>.weight` etc.
fn conv_bn_pairs(model: &dyn Layer, spec: &InputSpec) -> Result<Vec<(String, String, f64)>> {
    let traced = crate::jit::to_static_layer(model, spec)?;
    let g = traced.graph();
    let param = |v: ValueId| match &g.node(v.node).op {
        Op::Param(Param { name, .. }) => Some(name.clone()),
        _ => None,
    };
    let layer = |v: ValueId, leaf: &str| {
        let name = param(v)?;
        if name == leaf {
            return Some(String::new());
        }
        name.strip_suffix(&format!(".{leaf}")).map(str::to_string)
    };
    let outputs: Vec<ValueId> = g.outputs().iter().map(|o| o.value).collect();
    let mut pairs = Vec::new();
    let mut seen = BTreeMap::new();
    for n in g.node_ids() {
        let node = g.node(n);
        let Op::Composite(Composite::BatchNorm(b)) = &node.op else {
            continue;
        };
        let ins = node.inputs();
        let Some(bn) = layer(ins[1], "weight") else { continue };
        let same = |i: usize, leaf: &str| layer(ins[i], leaf).as_deref() == Some(bn.as_str());
        if !(same(2, "bias") && same(3, "_mean") && same(4, "_variance")) {
            continue;
        }
        let x = ins[0];
        let conv_node = g.node(x.node);
        if !matches!(conv_node.op, Op::Composite(Composite::Conv2d(_))) || g.users(x).len() != 1 || outputs.contains(&x)
        {
            continue;
        }
        let Some(conv) = layer(conv_node.inputs()[1], "weight") else {
            continue;
        };
        // A convolution or batch norm used twice (a shared layer) is not folded.
        *seen.entry(conv.clone()).or_insert(0) += 1;
        *seen.entry(bn.clone()).or_insert(0) += 1;
        pairs.push((conv, bn, b.epsilon.0));
    }
    Ok(pairs
        .into_iter()
        .filter(|(c, b, _)| seen[c] == 1 && seen[b] == 1)
        .collect())
}

/// The sublayer of `root` at a dotted path (`layer1.0.conv1`; empty: `root`).
fn layer_at<'a>(root: &'a mut dyn Layer, path: &str) -> Option<&'a mut dyn Layer> {
    if path.is_empty() {
        return Some(root);
    }
    let (head, rest) = path.split_once('.').unwrap_or((path, ""));
    let sub = root.sublayers_mut().into_iter().find(|(n, _)| n == head)?.1;
    layer_at(sub, rest)
}
