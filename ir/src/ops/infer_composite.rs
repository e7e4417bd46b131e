//! Type and shape rules of the composite ops.

use super::Composite;
use super::infer::{R, arity, arity_range, check_axes, check_index, conv, float, matmul, same_dtype, window_out};
use crate::shape::broadcasts_to;
use crate::{DType, Dim, Shape, TensorType};

fn pool_out(
    x: &TensorType,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
    ceil: bool,
) -> Result<TensorType, String> {
    if x.rank() != 4 {
        return Err(format!("pooling needs x[N,C,H,W], got {x}"));
    }
    let mut s = x.shape.0[..2].to_vec();
    for i in 0..2 {
        let inp = x.shape.0[2 + i]
            .as_static()
            .ok_or_else(|| format!("pooling needs static spatial dims, got {x}"))?;
        let (pb, pa) = (padding[i], padding[i + 2]);
        if kernel[i] == 0 || pb > kernel[i] / 2 || pa > kernel[i] / 2 {
            return Err(format!(
                "pool padding {padding:?} must be at most half the kernel {kernel:?}"
            ));
        }
        let mut out = window_out(inp, pb + pa, kernel[i], stride[i], 1, ceil)
            .ok_or_else(|| format!("pool window {kernel:?} stride {stride:?} does not fit {x}"))?;
        // PyTorch rule: the last window must start inside the input or the leading padding.
        if ceil && (out - 1) * stride[i] >= inp + pb {
            out -= 1;
        }
        s.push(Dim::Static(out));
    }
    Ok(TensorType::new(x.dtype, s))
}

fn vector_of(t: &TensorType, n: &Dim, what: &str, x: &TensorType) -> Result<(), String> {
    if t.shape.0 != [n.clone()] || t.dtype != x.dtype {
        return Err(format!("{what} must be {}[{n}] for x {x}, got {t}", x.dtype));
    }
    Ok(())
}

pub(super) fn composite(c: &Composite, inputs: &[TensorType]) -> R {
    use Composite::*;
    match c {
        Linear => {
            arity_range(inputs, &[2, 3])?;
            let (x, w) = (&inputs[0], &inputs[1]);
            same_dtype(x, w)?;
            if x.rank() < 1 || w.rank() != 2 || x.shape.0[x.rank() - 1] != w.shape.0[0] {
                return Err(format!("linear needs x[.., in] and w[in, out], got {x} and {w}"));
            }
            if let Some(b) = inputs.get(2) {
                vector_of(b, &w.shape.0[1], "linear bias", x)?;
            }
            let mut s = x.shape.0.clone();
            *s.last_mut().expect("rank ≥ 1") = w.shape.0[1].clone();
            Ok(vec![TensorType::new(x.dtype, s)])
        }
        Conv2d {
            stride,
            padding,
            dilation,
            groups,
        } => {
            arity_range(inputs, &[2, 3])?;
            let (x, w) = (&inputs[0], &inputs[1]);
            if x.rank() != 4 {
                return Err(format!("conv2d needs x[N,C,H,W], got {x}"));
            }
            let y = conv(x, w, stride, &padding[..2], &padding[2..], dilation, *groups)?;
            if let Some(b) = inputs.get(2) {
                vector_of(b, &w.shape.0[0], "conv2d bias", x)?;
            }
            Ok(vec![y])
        }
        MaxPool2d {
            kernel,
            stride,
            padding,
            ceil_mode,
        } => {
            arity(inputs, 1)?;
            Ok(vec![pool_out(&inputs[0], *kernel, *stride, *padding, *ceil_mode)?])
        }
        AvgPool2d {
            kernel,
            stride,
            padding,
            ceil_mode,
            ..
        } => {
            arity(inputs, 1)?;
            float(&inputs[0])?;
            Ok(vec![pool_out(&inputs[0], *kernel, *stride, *padding, *ceil_mode)?])
        }
        AdaptiveAvgPool2d { output_size } | AdaptiveMaxPool2d { output_size } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            if x.rank() != 4
                || output_size.contains(&0)
                || !x.shape.0[2..].iter().all(|d| d.as_static().is_some_and(|n| n > 0))
            {
                return Err(format!(
                    "adaptive pooling needs x[N,C,H,W] with static H, W > 0 and output size ≥ 1, got {x} -> {output_size:?}"
                ));
            }
            if matches!(c, AdaptiveAvgPool2d { .. }) {
                float(x)?;
            }
            let mut s = x.shape.0[..2].to_vec();
            s.extend(output_size.iter().map(|&n| Dim::Static(n)));
            Ok(vec![TensorType::new(x.dtype, s)])
        }
        BatchNorm { training, .. } => {
            arity(inputs, 5)?;
            let x = &inputs[0];
            float(x)?;
            if x.rank() < 2 {
                return Err(format!("batch_norm needs x[N,C,..], got {x}"));
            }
            let ch = &x.shape.0[1];
            for (t, what) in inputs[1..].iter().zip(["scale", "bias", "running_mean", "running_var"]) {
                vector_of(t, ch, what, x)?;
            }
            Ok(if *training {
                vec![x.clone(), inputs[3].clone(), inputs[4].clone()]
            } else {
                vec![x.clone()]
            })
        }
        LayerNorm { normalized_ndim, .. } => {
            arity_range(inputs, &[1, 3])?;
            let x = &inputs[0];
            float(x)?;
            if *normalized_ndim == 0 || *normalized_ndim > x.rank() {
                return Err(format!("layer_norm over {normalized_ndim} trailing axes of {x}"));
            }
            let tail = Shape(x.shape.0[x.rank() - normalized_ndim..].to_vec());
            for t in &inputs[1..] {
                if t.shape != tail || t.dtype != x.dtype {
                    return Err(format!("layer_norm weight/bias must be {}{tail}, got {t}", x.dtype));
                }
            }
            Ok(vec![x.clone()])
        }
        Softmax { axis } | LogSoftmax { axis } => {
            arity(inputs, 1)?;
            float(&inputs[0])?;
            check_axes(&[*axis], inputs[0].rank())?;
            Ok(vec![inputs[0].clone()])
        }
        CrossEntropy { reduction } => {
            arity(inputs, 2)?;
            let (logits, labels) = (&inputs[0], &inputs[1]);
            float(logits)?;
            check_index(labels)?;
            if logits.rank() != 2 || labels.shape.0 != [logits.shape.0[0].clone()] {
                return Err(format!(
                    "cross_entropy needs logits[N,C] and labels[N], got {logits} and {labels}"
                ));
            }
            let s = match reduction {
                super::Reduction::None => labels.shape.clone(),
                _ => Shape::scalar(),
            };
            Ok(vec![TensorType::new(logits.dtype, s)])
        }
        Relu => {
            arity(inputs, 1)?;
            if !inputs[0].dtype.is_numeric() {
                return Err(format!("relu is not defined for {}", inputs[0]));
            }
            Ok(vec![inputs[0].clone()])
        }
        Gelu { .. } | Silu | Sigmoid => {
            arity(inputs, 1)?;
            float(&inputs[0])?;
            Ok(vec![inputs[0].clone()])
        }
        Dropout { p, .. } => {
            arity(inputs, 1)?;
            float(&inputs[0])?;
            if !(0.0..1.0).contains(&p.0) {
                return Err(format!("dropout p={p} must be in [0, 1)"));
            }
            Ok(vec![inputs[0].clone()])
        }
        Embedding => {
            arity(inputs, 2)?;
            let (idx, w) = (&inputs[0], &inputs[1]);
            check_index(idx)?;
            if w.rank() != 2 {
                return Err(format!("embedding weight must be [V, D], got {w}"));
            }
            let mut s = idx.shape.0.clone();
            s.push(w.shape.0[1].clone());
            Ok(vec![TensorType::new(w.dtype, s)])
        }
        ScaledDotProductAttention { .. } => {
            arity_range(inputs, &[3, 4])?;
            let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
            float(q)?;
            same_dtype(q, k)?;
            same_dtype(q, v)?;
            let kt = TensorType::new(
                k.dtype,
                transpose_last(&k.shape).ok_or_else(|| format!("attention key must have rank ≥ 2, got {k}"))?,
            );
            let scores = matmul(q, &kt).map_err(|e| format!("attention q·kᵀ: {e}"))?;
            if let Some(m) = inputs.get(3) {
                if m.dtype != DType::Bool && m.dtype != q.dtype {
                    return Err(format!("attention mask must be bool or {}, got {m}", q.dtype));
                }
                if !broadcasts_to(&m.shape, &scores.shape) {
                    return Err(format!("attention mask {m} does not broadcast to scores {scores}"));
                }
            }
            Ok(vec![
                matmul(&scores, v).map_err(|e| format!("attention weights·v: {e}"))?,
            ])
        }
    }
}

fn transpose_last(s: &Shape) -> Option<Shape> {
    let r = s.rank();
    if r < 2 {
        return None;
    }
    let mut d = s.0.clone();
    d.swap(r - 1, r - 2);
    Some(Shape(d))
}
