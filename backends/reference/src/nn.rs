//! Composite ops, computed natively (never through their decompositions): the dispatcher,
//! plus linear, conv2d, activations, dropout and embedding.

use crate::contraction::{ConvSpec, conv, matmul};
use crate::elementwise::binary;
use crate::movement::reshape;
use crate::pool::{PoolSpec, adaptive_pool2d, avg_pool2d, max_pool2d};
use crate::random::uniform;
use crate::value::{Data, Res, Site, Value};
use crate::{attention, indexing, norm};
use oar_ir::Composite;
use oar_ir::ops::BinaryOp;

fn arity(site: &Site, ins: &[&Value], ok: &[usize]) -> Res<()> {
    if !ok.contains(&ins.len()) {
        return Err(site.err(format!("expects {ok:?} operands, got {}", ins.len())));
    }
    Ok(())
}

/// Evaluate a composite op.
pub(crate) fn composite(site: &Site, c: &Composite, ins: &[&Value]) -> Res<Vec<Value>> {
    use Composite::*;
    let one = |v: Value| Ok(vec![v]);
    match c {
        Linear => {
            arity(site, ins, &[2, 3])?;
            one(linear(site, ins)?)
        }
        Conv2d {
            stride,
            padding,
            dilation,
            groups,
        } => {
            arity(site, ins, &[2, 3])?;
            let spec = ConvSpec {
                stride,
                pad_before: &padding[..2],
                pad_after: &padding[2..],
                dilation,
                groups: *groups,
            };
            let y = conv(site, ins[0], ins[1], &spec)?;
            match ins.get(2) {
                Some(b) => {
                    let o = b.shape().iter().product();
                    one(binary(site, BinaryOp::Add, &y, &reshape(site, b, &[1, o, 1, 1])?)?)
                }
                None => one(y),
            }
        }
        MaxPool2d {
            kernel,
            stride,
            padding,
            ceil_mode,
        } => {
            arity(site, ins, &[1])?;
            let spec = PoolSpec {
                kernel: *kernel,
                stride: *stride,
                padding: *padding,
                ceil_mode: *ceil_mode,
            };
            one(max_pool2d(site, ins[0], &spec)?)
        }
        AvgPool2d {
            kernel,
            stride,
            padding,
            ceil_mode,
            count_include_pad,
        } => {
            arity(site, ins, &[1])?;
            let spec = PoolSpec {
                kernel: *kernel,
                stride: *stride,
                padding: *padding,
                ceil_mode: *ceil_mode,
            };
            one(avg_pool2d(site, ins[0], &spec, *count_include_pad)?)
        }
        AdaptiveAvgPool2d { output_size } | AdaptiveMaxPool2d { output_size } => {
            arity(site, ins, &[1])?;
            one(adaptive_pool2d(
                site,
                ins[0],
                *output_size,
                matches!(c, AdaptiveMaxPool2d { .. }),
            )?)
        }
        BatchNorm {
            epsilon,
            momentum,
            training,
        } => norm::batch_norm(site, ins, epsilon.0, momentum.0, *training),
        LayerNorm {
            normalized_ndim,
            epsilon,
        } => {
            arity(site, ins, &[1, 3])?;
            one(norm::layer_norm(site, ins, *normalized_ndim, epsilon.0)?)
        }
        Softmax { axis } | LogSoftmax { axis } => {
            arity(site, ins, &[1])?;
            one(norm::softmax(site, ins[0], *axis, matches!(c, LogSoftmax { .. }))?)
        }
        CrossEntropy { reduction } => {
            arity(site, ins, &[2])?;
            one(norm::cross_entropy(site, ins[0], ins[1], *reduction)?)
        }
        Relu => {
            arity(site, ins, &[1])?;
            one(relu(site, ins[0])?)
        }
        Gelu { approximate } => {
            arity(site, ins, &[1])?;
            let approximate = *approximate;
            one(float_map(site, ins[0], |x| {
                if approximate {
                    let k = (2.0 / std::f64::consts::PI).sqrt();
                    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
                } else {
                    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
                }
            })?)
        }
        Silu => {
            arity(site, ins, &[1])?;
            one(float_map(site, ins[0], |x| x * sigmoid(x))?)
        }
        Sigmoid => {
            arity(site, ins, &[1])?;
            one(float_map(site, ins[0], sigmoid)?)
        }
        Dropout { p, training, seed } => {
            arity(site, ins, &[1])?;
            one(dropout(site, ins[0], p.0, *training, *seed)?)
        }
        Embedding => {
            arity(site, ins, &[2])?;
            one(embedding(site, ins[0], ins[1])?)
        }
        ScaledDotProductAttention { causal, scale } => {
            arity(site, ins, &[3, 4])?;
            one(attention::sdpa(site, ins, *causal, scale.map(|s| s.0))?)
        }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Apply `f` to a float tensor.
fn float_map(site: &Site, x: &Value, f: impl Fn(f64) -> f64) -> Res<Value> {
    Ok(x.with(Data::F(x.as_f(site, "input")?.mapv(f))))
}

/// `x @ w + b` over the last axis of `x`.
fn linear(site: &Site, ins: &[&Value]) -> Res<Value> {
    let (x, w) = (ins[0], ins[1]);
    let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
    let (Some(&inn), [win, out]) = (xs.last(), ws.as_slice()) else {
        return Err(site.err(format!("needs x[.., in] and w[in, out], got {xs:?} and {ws:?}")));
    };
    if inn != *win {
        return Err(site.err(format!("needs x[.., in] and w[in, out], got {xs:?} and {ws:?}")));
    }
    let rows = xs[..xs.len() - 1].iter().product();
    let y = matmul(site, &reshape(site, x, &[rows, inn])?, w)?;
    let mut out_shape = xs.clone();
    *out_shape.last_mut().unwrap_or(&mut 0) = *out;
    let y = reshape(site, &y, &out_shape)?;
    match ins.get(2) {
        Some(b) => binary(site, BinaryOp::Add, &y, b),
        None => Ok(y),
    }
}

/// `max(x, 0)`; NaN stays NaN.
fn relu(site: &Site, x: &Value) -> Res<Value> {
    let data = match &x.data {
        Data::F(a) => Data::F(a.mapv(|v| if v > 0.0 || v.is_nan() { v } else { 0.0 })),
        Data::I(a) => Data::I(a.mapv(|v| v.max(0))),
        Data::B(_) => return Err(site.err("relu is not defined for bool")),
    };
    Ok(x.with(data))
}

/// Dropout with Paddle's `upscale_in_train`, mask from the shared counter-based generator.
fn dropout(site: &Site, x: &Value, p: f64, training: bool, seed: u64) -> Res<Value> {
    let a = x.as_f(site, "input")?;
    if !(0.0..1.0).contains(&p) {
        return Err(site.err(format!("dropout p={p} must be in [0, 1)")));
    }
    if !training {
        return Ok(x.clone());
    }
    let flat: Vec<f64> = a
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if uniform(seed, i as u64) >= p {
                v / (1.0 - p)
            } else {
                0.0
            }
        })
        .collect();
    let out = ndarray::ArrayD::from_shape_vec(a.raw_dim(), flat).map_err(|e| site.err(e.to_string()))?;
    Ok(x.with(Data::F(out)))
}

/// Rows of `weight[V, D]` picked by `indices`; an index outside `[0, V)` is an error
/// (negative indices do not wrap, as in PyTorch and Paddle).
fn embedding(site: &Site, idx: &Value, w: &Value) -> Res<Value> {
    let ia = idx.as_i(site, "indices")?;
    let v = match w.shape() {
        [v, _] => *v,
        s => return Err(site.err(format!("weight must be [V, D], got {s:?}"))),
    };
    if let Some(bad) = ia.iter().find(|&&k| k < 0 || k as u64 >= v as u64) {
        return Err(site.err(format!("index {bad} is out of range for {v} embeddings")));
    }
    indexing::gather(site, w, idx, 0)
}
