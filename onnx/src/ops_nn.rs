//! NN ops: activations, Clip, Dropout, MatMul/Gemm, Conv, pooling, normalization, softmax, Split.
//! Ops with an oar composite map onto it (Gemm → linear, Conv → conv2d, BatchNormalization →
//! batch_norm, ...); the rest are built from primitives.

use crate::error::OnnxError;
use crate::export::{Exporter, Written, float, int, ints, written};
use crate::ops::{NodeCx, R};
use crate::table::{Table, one};
use oar_ir::ops::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm, Broadcast, Conv, Conv2d, Dropout, Gelu, LayerNorm,
    LogSoftmax, MaxPool2d, Permute, Reduce, Softmax,
};
use oar_ir::ops::{BinaryOp as B, ReduceOp, UnaryOp as U};
use oar_ir::{Composite, DType, Dim, Float, Op, TensorData, TensorType, ValueId};

/// `Gelu` (opset 20; `approximate = "tanh"` for the tanh form).
pub(crate) fn gelu(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let approximate = cx.attr_s("approximate").is_some_and(|s| s == "tanh");
    composite1(cx, Composite::Gelu(Gelu { approximate }))
}

/// `Dropout` in inference: the input, and an all-true mask.
pub(crate) fn dropout(cx: &mut NodeCx<'_>) -> R<Vec<ValueId>> {
    let x = cx.input(0)?;
    let mask = cx.ty(x).shape.0;
    let one = cx.scalar(DType::Bool, 1.0);
    let m = cx.op(Op::Broadcast(Broadcast { shape: mask }), &[one])?;
    Ok(vec![x, m])
}

/// `GlobalAveragePool` / `GlobalMaxPool`: a reduction over every spatial axis, kept.
pub(crate) fn global_pool(cx: &mut NodeCx<'_>, op: ReduceOp) -> R<ValueId> {
    let x = cx.input(0)?;
    let axes: Vec<usize> = (2..cx.ty(x).rank()).collect();
    cx.op(
        Op::Reduce(Reduce {
            op,
            axes,
            keepdim: true,
        }),
        &[x],
    )
}

/// `BatchNormalization` in inference mode.
pub(crate) fn batch_norm(cx: &mut NodeCx<'_>) -> R<ValueId> {
    if cx.attr_i("training_mode", 0) != 0 {
        return Err(cx.err("training_mode=1 is not supported (inference only)"));
    }
    let ins = (0..5).map(|i| cx.input(i)).collect::<R<Vec<_>>>()?;
    let op = Composite::BatchNorm(BatchNorm {
        epsilon: Float(cx.attr_f("epsilon", 1e-5) as f64),
        momentum: Float(0.9),
        training: false,
    });
    cx.op(Op::Composite(op), &ins)
}

/// `c(input 0)`.
pub(crate) fn composite1(cx: &mut NodeCx<'_>, c: Composite) -> R<ValueId> {
    cx.arity(1, 1)?;
    let x = cx.input(0)?;
    cx.op(Op::Composite(c), &[x])
}

pub(crate) fn softmax(cx: &mut NodeCx<'_>, log: bool) -> R<ValueId> {
    let x = cx.input(0)?;
    let t = cx.ty(x);
    let rank = t.rank();
    let default = if cx.opset >= 13 { -1 } else { 1 };
    let axis = cx.axis(cx.attr_i("axis", default), rank)?;
    let mk = |axis| {
        if log {
            Composite::LogSoftmax(LogSoftmax { axis })
        } else {
            Composite::Softmax(Softmax { axis })
        }
    };
    if cx.opset >= 13 || axis + 1 == rank {
        return cx.op(Op::Composite(mk(axis)), &[x]);
    }
    // Before opset 13 the input is flattened to [prod(..axis), prod(axis..)] around the softmax.
    let s = cx.static_shape(x)?;
    let (a, b) = (s[..axis].iter().product::<usize>(), s[axis..].iter().product::<usize>());
    let y = cx.reshape(x, vec![Dim::Static(a), Dim::Static(b)])?;
    let y = cx.op(Op::Composite(mk(1)), &[y])?;
    cx.reshape(y, t.shape.0)
}

pub(crate) fn activation(cx: &mut NodeCx<'_>, op_type: &str) -> R<ValueId> {
    let x = cx.input(0)?;
    let dt = cx.ty(x).dtype;
    let zero = cx.scalar(dt, 0.0);
    let y = match op_type {
        "LeakyRelu" | "PRelu" => {
            let neg = if op_type == "PRelu" {
                let slope = cx.input(1)?;
                cx.bin(B::Mul, x, slope)?
            } else {
                let a = cx.attr_f("alpha", 0.01) as f64;
                cx.bin_c(B::Mul, x, a)?
            };
            let c = cx.bin(B::Lt, x, zero)?;
            cx.op(Op::Where, &[c, neg, x])?
        }
        "Elu" | "Selu" | "Celu" => {
            let (alpha, gamma) = match op_type {
                "Elu" => (cx.attr_f("alpha", 1.0) as f64, 1.0),
                "Celu" => (cx.attr_f("alpha", 1.0) as f64, 1.0),
                _ => (
                    cx.attr_f("alpha", 1.673_263_2) as f64,
                    cx.attr_f("gamma", 1.050_701) as f64,
                ),
            };
            // Celu: max(0,x) + min(0, alpha*(exp(x/alpha)-1)); Elu/Selu: x<0 ? alpha*(exp(x)-1) : x.
            let inner = if op_type == "Celu" {
                cx.bin_c(B::Div, x, alpha)?
            } else {
                x
            };
            let e = cx.un(U::Exp, inner)?;
            let em1 = cx.bin_c(B::Sub, e, 1.0)?;
            let neg = cx.bin_c(B::Mul, em1, alpha)?;
            let c = cx.bin(B::Lt, x, zero)?;
            let y = cx.op(Op::Where, &[c, neg, x])?;
            if gamma == 1.0 { y } else { cx.bin_c(B::Mul, y, gamma)? }
        }
        "HardSigmoid" | "HardSwish" => {
            let (a, b) = if op_type == "HardSwish" {
                (1.0 / 6.0, 0.5)
            } else {
                (cx.attr_f("alpha", 0.2) as f64, cx.attr_f("beta", 0.5) as f64)
            };
            let y = cx.bin_c(B::Mul, x, a)?;
            let y = cx.bin_c(B::Add, y, b)?;
            let y = cx.bin_c(B::Max, y, 0.0)?;
            let y = cx.bin_c(B::Min, y, 1.0)?;
            if op_type == "HardSwish" {
                cx.bin(B::Mul, x, y)?
            } else {
                y
            }
        }
        "Softplus" | "Mish" => {
            // log(1 + exp(x)), computed as max(x,0) + log(1 + exp(-|x|)) to avoid overflow.
            let ax = cx.un(U::Abs, x)?;
            let nax = cx.un(U::Neg, ax)?;
            let e = cx.un(U::Exp, nax)?;
            let e1 = cx.bin_c(B::Add, e, 1.0)?;
            let l = cx.un(U::Log, e1)?;
            let m = cx.bin(B::Max, x, zero)?;
            let sp = cx.bin(B::Add, m, l)?;
            if op_type == "Mish" {
                let t = cx.un(U::Tanh, sp)?;
                cx.bin(B::Mul, x, t)?
            } else {
                sp
            }
        }
        "Softsign" => {
            let ax = cx.un(U::Abs, x)?;
            let d = cx.bin_c(B::Add, ax, 1.0)?;
            cx.bin(B::Div, x, d)?
        }
        "ThresholdedRelu" => {
            let c = cx.bin_c(B::Gt, x, cx.attr_f("alpha", 1.0) as f64)?;
            cx.op(Op::Where, &[c, x, zero])?
        }
        "Tan" => {
            let (s, c) = (cx.un(U::Sin, x)?, cx.un(U::Cos, x)?);
            cx.bin(B::Div, s, c)?
        }
        _ => {
            // Sinh / Cosh = (e^x ∓ e^-x) / 2.
            let e = cx.un(U::Exp, x)?;
            let nx = cx.un(U::Neg, x)?;
            let en = cx.un(U::Exp, nx)?;
            let s = cx.bin(if op_type == "Sinh" { B::Sub } else { B::Add }, e, en)?;
            cx.bin_c(B::Mul, s, 0.5)?
        }
    };
    Ok(y)
}

pub(crate) fn clip(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let dt = cx.ty(x).dtype;
    let (lo, hi) = if cx.opset < 11 {
        (
            Some(cx.attr_f("min", f32::MIN) as f64),
            Some(cx.attr_f("max", f32::MAX) as f64),
        )
    } else {
        let lo = cx.opt_input(1);
        let hi = cx.opt_input(2);
        let mut y = x;
        if let Some(lo) = lo {
            y = cx.bin(B::Max, y, lo)?;
        }
        if let Some(hi) = hi {
            y = cx.bin(B::Min, y, hi)?;
        }
        return Ok(y);
    };
    let mut y = x;
    if let Some(lo) = lo {
        let c = cx.scalar(dt, lo);
        y = cx.bin(B::Max, y, c)?;
    }
    if let Some(hi) = hi {
        let c = cx.scalar(dt, hi);
        y = cx.bin(B::Min, y, c)?;
    }
    Ok(y)
}

pub(crate) fn matmul(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (mut a, mut b) = (cx.input(0)?, cx.input(1)?);
    let (ta, tb) = (cx.ty(a), cx.ty(b));
    // numpy rules for 1-D operands: [K] → [1, K] (then drop M), [K] → [K, 1] (then drop N).
    if ta.rank() == 1 {
        a = cx.reshape(a, vec![Dim::Static(1), ta.shape.0[0].clone()])?;
    }
    if tb.rank() == 1 {
        b = cx.reshape(b, vec![tb.shape.0[0].clone(), Dim::Static(1)])?;
    }
    let y = cx.op(Op::MatMul, &[a, b])?;
    let mut dims = cx.ty(y).shape.0;
    let r = dims.len();
    if tb.rank() == 1 {
        dims.remove(r - 1);
    }
    if ta.rank() == 1 {
        dims.remove(r - 2);
    }
    cx.reshape(y, dims)
}

pub(crate) fn gemm(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (mut a, mut b) = (cx.input(0)?, cx.input(1)?);
    let (alpha, beta) = (cx.attr_f("alpha", 1.0) as f64, cx.attr_f("beta", 1.0) as f64);
    if cx.attr_i("transA", 0) != 0 {
        a = cx.op(Op::Permute(Permute { perm: vec![1, 0] }), &[a])?;
    }
    if cx.attr_i("transB", 0) != 0 {
        b = cx.op(Op::Permute(Permute { perm: vec![1, 0] }), &[b])?;
    }
    let c = cx.opt_input(2);
    let n = cx.ty(b).shape.0.get(1).cloned();
    // linear(x, w[in,out], bias[out]) is exactly Gemm with alpha = beta = 1 and a 1-D C of size N.
    if alpha == 1.0 && beta == 1.0 {
        match c {
            Some(c) if cx.ty(c).rank() == 1 && cx.ty(c).shape.0.first() == n.as_ref() => {
                return cx.op(Op::Composite(Composite::Linear), &[a, b, c]);
            }
            None => return cx.op(Op::Composite(Composite::Linear), &[a, b]),
            _ => {}
        }
    }
    let mut y = cx.op(Op::MatMul, &[a, b])?;
    if alpha != 1.0 {
        y = cx.bin_c(B::Mul, y, alpha)?;
    }
    if let Some(mut c) = c {
        if beta != 1.0 {
            c = cx.bin_c(B::Mul, c, beta)?;
        }
        y = cx.bin(B::Add, y, c)?;
    }
    Ok(y)
}

/// Padding (before, after) per spatial axis from `pads` / `auto_pad`.
fn spatial_pads(
    cx: &NodeCx<'_>,
    in_sizes: &[Dim],
    kernel: &[usize],
    stride: &[usize],
    dilation: &[usize],
) -> R<(Vec<usize>, Vec<usize>)> {
    let n = kernel.len();
    let auto = cx.attr_s("auto_pad").unwrap_or_else(|| "NOTSET".into());
    match auto.as_str() {
        "NOTSET" | "" => {
            let p = cx.attr_ints("pads").unwrap_or_else(|| vec![0; 2 * n]);
            if p.len() != 2 * n {
                return Err(cx.err(format!("pads {p:?} do not match {n} spatial axes")));
            }
            let p = cx.usizes(&p)?;
            Ok((p[..n].to_vec(), p[n..].to_vec()))
        }
        "VALID" => Ok((vec![0; n], vec![0; n])),
        "SAME_UPPER" | "SAME_LOWER" => {
            let (mut b, mut a) = (vec![0; n], vec![0; n]);
            for i in 0..n {
                let size = in_sizes[i]
                    .as_static()
                    .ok_or_else(|| cx.err("auto_pad SAME needs static spatial dims"))?;
                let out = size.div_ceil(stride[i]);
                let span = (kernel[i] - 1) * dilation[i] + 1;
                let total = ((out - 1) * stride[i] + span).saturating_sub(size);
                let small = total / 2;
                if auto == "SAME_UPPER" {
                    (b[i], a[i]) = (small, total - small);
                } else {
                    (b[i], a[i]) = (total - small, small);
                }
            }
            Ok((b, a))
        }
        other => Err(cx.err(format!("auto_pad `{other}` is not supported"))),
    }
}

/// The convolution a `Conv`-like node (`Conv`, `ConvInteger`, `QLinearConv`) describes for
/// input `x` and weight `w`: strides, dilations, groups and pads (`auto_pad` too).
pub(crate) fn conv_spec(cx: &NodeCx<'_>, x: ValueId, w: ValueId) -> R<Conv> {
    let wt = cx.ty(w);
    if wt.rank() < 3 {
        return Err(cx.err(format!(
            "the weight must be [C_out, C_in/group, k...] with at least one spatial axis, got {wt}"
        )));
    }
    let n = wt.rank() - 2;
    let kernel: Vec<usize> = match cx.attr_ints("kernel_shape") {
        Some(k) => cx.usizes(&k)?,
        None => wt.shape.0[2..].iter().map(|d| d.as_static().unwrap_or(0)).collect(),
    };
    let stride = cx.usizes(&cx.attr_ints("strides").unwrap_or_else(|| vec![1; n]))?;
    let dilation = cx.usizes(&cx.attr_ints("dilations").unwrap_or_else(|| vec![1; n]))?;
    if kernel.len() != n || stride.len() != n || dilation.len() != n {
        return Err(cx.err("kernel_shape, strides and dilations must have one entry per spatial axis"));
    }
    let groups = usize::try_from(cx.attr_i("group", 1)).map_err(|_| cx.err("bad group"))?;
    let xs = cx.ty(x).shape.0;
    let (pad_before, pad_after) = spatial_pads(cx, xs.get(2..).unwrap_or(&[]), &kernel, &stride, &dilation)?;
    Ok(Conv {
        stride,
        pad_before,
        pad_after,
        dilation,
        groups,
    })
}

pub(crate) fn conv(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let Conv {
        stride,
        pad_before: pb,
        pad_after: pa,
        dilation,
        groups,
    } = conv_spec(cx, x, w)?;
    let n = stride.len();
    let b = cx.opt_input(2);
    if n == 2 {
        let op = Composite::Conv2d(Conv2d {
            stride: [stride[0], stride[1]],
            padding: [pb[0], pb[1], pa[0], pa[1]],
            dilation: [dilation[0], dilation[1]],
            groups,
        });
        let ins: Vec<ValueId> = [Some(x), Some(w), b].into_iter().flatten().collect();
        return cx.op(Op::Composite(op), &ins);
    }
    let op = Op::Conv(Conv {
        stride,
        pad_before: pb,
        pad_after: pa,
        dilation,
        groups,
    });
    let y = cx.op(op, &[x, w])?;
    match b {
        None => Ok(y),
        Some(b) => {
            let mut dims = vec![Dim::Static(1); n + 2];
            dims[1] = cx.ty(b).shape.0.first().cloned().unwrap_or(Dim::Static(1));
            let b = cx.reshape(b, dims)?;
            cx.bin(B::Add, y, b)
        }
    }
}

pub(crate) fn pool(cx: &mut NodeCx<'_>, max: bool) -> R<ValueId> {
    let x = cx.input(0)?;
    let xs = cx.ty(x).shape.0;
    let kernel = cx.usizes(
        &cx.attr_ints("kernel_shape")
            .ok_or_else(|| cx.err("needs kernel_shape"))?,
    )?;
    let n = kernel.len();
    let stride = cx.usizes(&cx.attr_ints("strides").unwrap_or_else(|| vec![1; n]))?;
    let dilation = cx.usizes(&cx.attr_ints("dilations").unwrap_or_else(|| vec![1; n]))?;
    if dilation.iter().any(|&d| d != 1) {
        return Err(cx.err("pooling with dilations is not supported"));
    }
    if cx.attr_i("storage_order", 0) != 0 {
        return Err(cx.err("storage_order=1 is not supported"));
    }
    if stride.len() != n || xs.len() != n + 2 {
        return Err(cx.err("strides and the input rank must match kernel_shape"));
    }
    let (pb, pa) = spatial_pads(cx, &xs[2..], &kernel, &stride, &dilation)?;
    let ceil_mode = cx.attr_i("ceil_mode", 0) != 0;
    // 1-D pooling runs as 2-D over [N, C, 1, L].
    let (k2, s2, p4, x2) = match n {
        2 => (
            [kernel[0], kernel[1]],
            [stride[0], stride[1]],
            [pb[0], pb[1], pa[0], pa[1]],
            x,
        ),
        1 => {
            let x2 = cx.reshape(x, vec![xs[0].clone(), xs[1].clone(), Dim::Static(1), xs[2].clone()])?;
            ([1, kernel[0]], [1, stride[0]], [0, pb[0], 0, pa[0]], x2)
        }
        _ => return Err(cx.err(format!("{n}-D pooling is not supported (1-D and 2-D are)"))),
    };
    let op = if max {
        Composite::MaxPool2d(MaxPool2d {
            kernel: k2,
            stride: s2,
            padding: p4,
            ceil_mode,
        })
    } else {
        Composite::AvgPool2d(AvgPool2d {
            kernel: k2,
            stride: s2,
            padding: p4,
            ceil_mode,
            count_include_pad: cx.attr_i("count_include_pad", 0) != 0,
        })
    };
    let y = cx.op(Op::Composite(op), &[x2])?;
    if n == 1 {
        let mut d = cx.ty(y).shape.0;
        d.remove(2);
        return cx.reshape(y, d);
    }
    Ok(y)
}

pub(crate) fn layer_norm(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let rank = cx.ty(x).rank();
    let axis = cx.axis(cx.attr_i("axis", -1), rank)?;
    let op = Composite::LayerNorm(LayerNorm {
        normalized_ndim: rank - axis,
        epsilon: Float(cx.attr_f("epsilon", 1e-5) as f64),
    });
    let scale = cx.input(1)?;
    let tail = cx.ty(x).shape.0[axis..].to_vec();
    let fits = |cx: &NodeCx<'_>, v: ValueId| cx.ty(v).shape.0 == tail;
    match cx.opt_input(2) {
        Some(b) if fits(cx, scale) && fits(cx, b) => cx.op(Op::Composite(op), &[x, scale, b]),
        b => {
            // Scale/bias that broadcast rather than match exactly: normalize, then apply them.
            let y = cx.op(Op::Composite(op), &[x])?;
            let y = cx.bin(B::Mul, y, scale)?;
            match b {
                Some(b) => cx.bin(B::Add, y, b),
                None => Ok(y),
            }
        }
    }
}

pub(crate) fn split(cx: &mut NodeCx<'_>) -> R<Vec<ValueId>> {
    let x = cx.input(0)?;
    let t = cx.ty(x);
    let axis = cx.axis(cx.attr_i("axis", 0), t.rank())?;
    let size = t.shape.0[axis]
        .as_static()
        .ok_or_else(|| cx.err("split axis must be static"))?;
    let sizes = if cx.opset >= 13 {
        cx.const_ints(1)?
    } else {
        cx.attr_ints("split")
    };
    let sizes: Vec<usize> = match sizes {
        Some(s) if !s.is_empty() => cx.usizes(&s)?,
        _ => {
            let n = if cx.opset >= 18 {
                usize::try_from(cx.attr_i("num_outputs", 0)).unwrap_or(0)
            } else {
                cx.node_outputs()
            };
            if n == 0 {
                return Err(cx.err("cannot tell how many parts to split into"));
            }
            // Equal parts; the last is smaller when the size does not divide (opset 18 rule).
            let part = size.div_ceil(n);
            (0..n).map(|i| part.min(size.saturating_sub(i * part))).collect()
        }
    };
    if sizes.iter().sum::<usize>() != size {
        return Err(cx.err(format!("split sizes {sizes:?} do not add up to {size}")));
    }
    let mut start = 0i64;
    let mut outs = Vec::with_capacity(sizes.len());
    for s in sizes {
        outs.push(cx.slice_axis(x, axis, start, start + s as i64)?);
        start += s as i64;
    }
    Ok(outs)
}

/// This family's ONNX mapping (see `table.rs`).
pub(crate) const TABLE: Table = Table {
    imports: &[
        ("AveragePool", |cx| one(pool(cx, false))),
        ("BatchNormalization", |cx| one(batch_norm(cx))),
        ("Celu", |cx| one(activation(cx, "Celu"))),
        ("Clip", |cx| one(clip(cx))),
        ("Conv", |cx| one(conv(cx))),
        ("Cosh", |cx| one(activation(cx, "Cosh"))),
        ("Dropout", dropout),
        ("Elu", |cx| one(activation(cx, "Elu"))),
        ("Gelu", |cx| one(gelu(cx))),
        ("Gemm", |cx| one(gemm(cx))),
        ("GlobalAveragePool", |cx| one(global_pool(cx, ReduceOp::Mean))),
        ("GlobalMaxPool", |cx| one(global_pool(cx, ReduceOp::Max))),
        ("HardSigmoid", |cx| one(activation(cx, "HardSigmoid"))),
        ("HardSwish", |cx| one(activation(cx, "HardSwish"))),
        ("LayerNormalization", |cx| one(layer_norm(cx))),
        ("LeakyRelu", |cx| one(activation(cx, "LeakyRelu"))),
        ("LogSoftmax", |cx| one(softmax(cx, true))),
        ("MatMul", |cx| one(matmul(cx))),
        ("MaxPool", |cx| one(pool(cx, true))),
        ("Mish", |cx| one(activation(cx, "Mish"))),
        ("PRelu", |cx| one(activation(cx, "PRelu"))),
        ("Relu", |cx| one(composite1(cx, Composite::Relu))),
        ("Selu", |cx| one(activation(cx, "Selu"))),
        ("Sigmoid", |cx| one(composite1(cx, Composite::Sigmoid))),
        ("Sinh", |cx| one(activation(cx, "Sinh"))),
        ("Softmax", |cx| one(softmax(cx, false))),
        ("Softplus", |cx| one(activation(cx, "Softplus"))),
        ("Softsign", |cx| one(activation(cx, "Softsign"))),
        ("Split", split),
        ("Tan", |cx| one(activation(cx, "Tan"))),
        ("ThresholdedRelu", |cx| one(activation(cx, "ThresholdedRelu"))),
    ],
    exports: &[
        ("adaptive_avg_pool2d", write_global_pool),
        ("adaptive_max_pool2d", write_global_pool),
        ("avg_pool2d", write_pool),
        ("batch_norm", write_batch_norm),
        ("conv2d", write_conv2d),
        ("dropout", write_dropout),
        ("gelu", write_gelu),
        ("layer_norm", write_layer_norm),
        ("linear", write_linear),
        ("log_softmax", write_softmax),
        ("max_pool2d", write_pool),
        ("relu", write_plain),
        ("sigmoid", write_plain),
        ("silu", write_silu),
        ("softmax", write_softmax),
    ],
};

// ---- export: the oar ops of this family written as ONNX nodes

/// `linear(x, w, b?)` → `MatMul` (+ `Add`).
fn write_linear(ex: &mut Exporter<'_>, _: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let y = ex.emit("MatMul", ins[..2].to_vec(), vec![]);
    written(match ins.get(2) {
        Some(b) => ex.emit("Add", vec![y, b.clone()], vec![]),
        None => y,
    })
}

fn write_conv2d(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::Conv2d(Conv2d {
        stride,
        padding,
        dilation,
        groups,
    })) = op
    else {
        return Ok(None);
    };
    let pads = [padding[0], padding[1], padding[2], padding[3]];
    let attrs = vec![
        ints("strides", stride),
        ints("pads", &pads),
        ints("dilations", dilation),
        int("group", *groups as i64),
    ];
    written(ex.emit("Conv", ins.to_vec(), attrs))
}

/// `max_pool2d` → `MaxPool`, `avg_pool2d` → `AveragePool` (with `count_include_pad`).
fn write_pool(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let (name, kernel, stride, padding, ceil_mode, include_pad) = match op {
        Op::Composite(Composite::MaxPool2d(MaxPool2d {
            kernel,
            stride,
            padding,
            ceil_mode,
        })) => ("MaxPool", kernel, stride, padding, ceil_mode, None),
        Op::Composite(Composite::AvgPool2d(AvgPool2d {
            kernel,
            stride,
            padding,
            ceil_mode,
            count_include_pad,
        })) => (
            "AveragePool",
            kernel,
            stride,
            padding,
            ceil_mode,
            Some(count_include_pad),
        ),
        _ => return Ok(None),
    };
    let mut attrs = vec![
        ints("kernel_shape", kernel),
        ints("strides", stride),
        ints("pads", padding),
        int("ceil_mode", *ceil_mode as i64),
    ];
    if let Some(&c) = include_pad {
        attrs.push(int("count_include_pad", c as i64));
    }
    written(ex.emit(name, ins.to_vec(), attrs))
}

/// Adaptive pooling to 1×1 is global pooling; other sizes are decomposed.
fn write_global_pool(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let name = match op {
        Op::Composite(Composite::AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size: [1, 1] })) => "GlobalAveragePool",
        Op::Composite(Composite::AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size: [1, 1] })) => "GlobalMaxPool",
        _ => return Ok(None),
    };
    written(ex.emit(name, ins.to_vec(), vec![]))
}

/// Inference-mode batch norm; training mode is decomposed.
fn write_batch_norm(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::BatchNorm(BatchNorm {
        epsilon,
        training: false,
        ..
    })) = op
    else {
        return Ok(None);
    };
    written(ex.emit("BatchNormalization", ins.to_vec(), vec![float("epsilon", epsilon.0)]))
}

/// `LayerNormalization` over the trailing axes (a ones scale when the op has none).
fn write_layer_norm(ex: &mut Exporter<'_>, op: &Op, ins: &[String], tys: &[TensorType]) -> Written {
    let Op::Composite(Composite::LayerNorm(LayerNorm {
        normalized_ndim,
        epsilon,
    })) = op
    else {
        return Ok(None);
    };
    let x = &tys[0];
    let mut ins = ins.to_vec();
    let axis = (x.rank() - normalized_ndim) as i64;
    if ins.len() == 1 {
        let tail: Vec<usize> = x.shape.0[x.rank() - normalized_ndim..]
            .iter()
            .map(|d| d.as_static().unwrap_or(1))
            .collect();
        let ones = TensorData::full(x.dtype, tail, 1.0).map_err(|e| OnnxError::Export(e.to_string()))?;
        ins.push(ex.constant(ones));
    }
    written(ex.emit(
        "LayerNormalization",
        ins,
        vec![int("axis", axis), float("epsilon", epsilon.0)],
    ))
}

fn write_softmax(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let (name, axis) = match op {
        Op::Composite(Composite::Softmax(Softmax { axis })) => ("Softmax", axis),
        Op::Composite(Composite::LogSoftmax(LogSoftmax { axis })) => ("LogSoftmax", axis),
        _ => return Ok(None),
    };
    written(ex.emit(name, ins.to_vec(), vec![int("axis", *axis as i64)]))
}

/// Ops whose ONNX op has no attributes (`Relu`, `Sigmoid`).
fn write_plain(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let name = match op {
        Op::Composite(Composite::Relu) => "Relu",
        Op::Composite(Composite::Sigmoid) => "Sigmoid",
        _ => return Ok(None),
    };
    written(ex.emit(name, ins.to_vec(), vec![]))
}

fn write_silu(ex: &mut Exporter<'_>, _: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let s = ex.emit("Sigmoid", ins.to_vec(), vec![]);
    written(ex.emit("Mul", vec![ins[0].clone(), s], vec![]))
}

/// gelu from Erf (exact) or Tanh (approximate): ONNX's Gelu needs opset 20.
fn write_gelu(ex: &mut Exporter<'_>, op: &Op, ins: &[String], tys: &[TensorType]) -> Written {
    let Op::Composite(Composite::Gelu(Gelu { approximate })) = op else {
        return Ok(None);
    };
    let dt = tys[0].dtype;
    let c = |v: f64, ex: &mut Exporter<'_>| ex.constant(TensorData::from_f64_slice(dt, vec![], &[v]).expect("scalar"));
    let x0 = ins[0].clone();
    if !approximate {
        // 0.5 * x * (1 + erf(x / sqrt(2)))
        let r2 = c(std::f64::consts::SQRT_2, ex);
        let d = ex.emit("Div", vec![x0.clone(), r2], vec![]);
        let e = ex.emit("Erf", vec![d], vec![]);
        let one = c(1.0, ex);
        let a = ex.emit("Add", vec![e, one], vec![]);
        let m = ex.emit("Mul", vec![x0, a], vec![]);
        let half = c(0.5, ex);
        return written(ex.emit("Mul", vec![m, half], vec![]));
    }
    // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    let x2 = ex.emit("Mul", vec![x0.clone(), x0.clone()], vec![]);
    let x3 = ex.emit("Mul", vec![x2, x0.clone()], vec![]);
    let k = c(0.044715, ex);
    let x3k = ex.emit("Mul", vec![x3, k], vec![]);
    let s = ex.emit("Add", vec![x0.clone(), x3k], vec![]);
    let r = c((2.0 / std::f64::consts::PI).sqrt(), ex);
    let a = ex.emit("Mul", vec![s, r], vec![]);
    let t = ex.emit("Tanh", vec![a], vec![]);
    let one = c(1.0, ex);
    let t1 = ex.emit("Add", vec![t, one], vec![]);
    let half = c(0.5, ex);
    let hx = ex.emit("Mul", vec![x0, half], vec![]);
    written(ex.emit("Mul", vec![hx, t1], vec![]))
}

/// Inference-mode dropout is the identity; training mode is decomposed.
fn write_dropout(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::Dropout(Dropout { training: false, .. })) = op else {
        return Ok(None);
    };
    written(ex.emit("Identity", ins.to_vec(), vec![]))
}
