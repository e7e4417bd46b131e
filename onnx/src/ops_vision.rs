//! Importers of the ops segmentation, detection and generative models bring: ConvTranspose,
//! Resize and Upsample, GroupNormalization, InstanceNormalization, CumSum, TopK, OneHot and
//! Einsum. Each maps onto its oar composite; the opset differences are handled here.

use crate::error::OnnxError;
use crate::export::{Exporter, Written, float, int, ints, string, written};
use crate::ops::{NodeCx, R};
use crate::table::{Table, one};
use oar_ir::ops::{
    ConvTranspose, CoordMode, CumSum, Einsum, Gather, GroupNorm, InstanceNorm, NearestMode, OneHot, Permute, Resize,
    ResizeMode, Sort, TopK,
};
use oar_ir::{Composite, DType, Dim, Float, Op, TensorData, TensorType, ValueId};

/// `ConvTranspose(X, W, B?)`: pads from `pads`, `auto_pad` or `output_shape` as the ONNX spec
/// computes them.
pub(crate) fn conv_transpose(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let (xs, wt) = (cx.static_shape(x)?, cx.ty(w));
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
    let ones = vec![1; n];
    let stride = cx.usizes(&cx.attr_ints("strides").unwrap_or_else(|| ones.clone()))?;
    let dilation = cx.usizes(&cx.attr_ints("dilations").unwrap_or_else(|| ones.clone()))?;
    let mut output_padding = cx.usizes(&cx.attr_ints("output_padding").unwrap_or_else(|| vec![0; n]))?;
    if kernel.len() != n || stride.len() != n || dilation.len() != n || output_padding.len() != n || xs.len() != n + 2 {
        return Err(cx.err("kernel_shape, strides, dilations and output_padding need one entry per spatial axis"));
    }
    let groups = usize::try_from(cx.attr_i("group", 1)).map_err(|_| cx.err("bad group"))?;
    let auto = cx.attr_s("auto_pad").unwrap_or_else(|| "NOTSET".into());
    let wanted: Option<Vec<usize>> = match (cx.attr_ints("output_shape"), auto.as_str()) {
        (Some(s), _) => {
            let s = cx.usizes(&s)?;
            Some(if s.len() == n + 2 { s[2..].to_vec() } else { s })
        }
        (None, "SAME_UPPER" | "SAME_LOWER") => Some((0..n).map(|i| xs[2 + i] * stride[i]).collect()),
        _ => None,
    };
    let (pb, pa) = match wanted {
        Some(out) if out.len() == n => {
            let (mut b, mut a) = (vec![0; n], vec![0; n]);
            for i in 0..n {
                let full = stride[i] * (xs[2 + i] - 1) + output_padding[i] + (kernel[i] - 1) * dilation[i] + 1;
                let total = full as i64 - out[i] as i64;
                // Python's floor division, as the spec's equations are written.
                let half = total.div_euclid(2);
                let (pb, pa) = if auto == "SAME_UPPER" {
                    (half, total - half)
                } else {
                    (total - half, half)
                };
                // A negative end padding asks for rows past the last window: output_padding.
                if pb < 0 || (pa < 0 && output_padding[i] as i64 - pa >= stride[i].max(dilation[i]) as i64) {
                    return Err(cx.err(format!(
                        "output_shape {out:?} is larger than the transposed convolution reaches"
                    )));
                }
                if pa < 0 {
                    output_padding[i] += (-pa) as usize;
                }
                (b[i], a[i]) = (pb as usize, pa.max(0) as usize);
            }
            (b, a)
        }
        Some(out) => return Err(cx.err(format!("output_shape {out:?} does not match {n} spatial axes"))),
        None if auto == "VALID" => (vec![0; n], vec![0; n]),
        None => {
            let p = cx.usizes(&cx.attr_ints("pads").unwrap_or_else(|| vec![0; 2 * n]))?;
            if p.len() != 2 * n {
                return Err(cx.err(format!("pads {p:?} do not match {n} spatial axes")));
            }
            (p[..n].to_vec(), p[n..].to_vec())
        }
    };
    let op = Composite::ConvTranspose(ConvTranspose {
        stride,
        pad_before: pb,
        pad_after: pa,
        output_padding,
        dilation,
        groups,
    });
    let ins: Vec<ValueId> = [Some(x), Some(w), cx.opt_input(2)].into_iter().flatten().collect();
    cx.op(Op::Composite(op), &ins)
}

/// `Resize` (opset ≥ 10) and `Upsample` (`upsample`: scales only, asymmetric coordinates).
pub(crate) fn resize(cx: &mut NodeCx<'_>, upsample: bool) -> R<ValueId> {
    let x = cx.input(0)?;
    let shape = cx.static_shape(x)?;
    let rank = shape.len();
    let mode = match cx.attr_s("mode").as_deref().unwrap_or("nearest") {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" => ResizeMode::Linear,
        "cubic" => ResizeMode::Cubic,
        m => return Err(cx.err(format!("mode `{m}` is not supported"))),
    };
    let coordinate = match cx.attr_s("coordinate_transformation_mode").as_deref() {
        _ if upsample || cx.opset < 11 => CoordMode::Asymmetric,
        None | Some("half_pixel") => CoordMode::HalfPixel,
        Some("pytorch_half_pixel") => CoordMode::PytorchHalfPixel,
        Some("align_corners") => CoordMode::AlignCorners,
        Some("asymmetric") => CoordMode::Asymmetric,
        Some("half_pixel_symmetric") => CoordMode::HalfPixelSymmetric,
        Some(m) => return Err(cx.err(format!("coordinate_transformation_mode `{m}` is not supported"))),
    };
    let nearest = match cx.attr_s("nearest_mode").as_deref() {
        _ if upsample || cx.opset < 11 => NearestMode::Floor,
        None | Some("round_prefer_floor") => NearestMode::RoundPreferFloor,
        Some("round_prefer_ceil") => NearestMode::RoundPreferCeil,
        Some("floor") => NearestMode::Floor,
        Some("ceil") => NearestMode::Ceil,
        Some(m) => return Err(cx.err(format!("nearest_mode `{m}` is not supported"))),
    };
    if cx.attr_i("antialias", 0) != 0 {
        return Err(cx.err("antialias=1 is not supported"));
    }
    let policy = cx
        .attr_s("keep_aspect_ratio_policy")
        .unwrap_or_else(|| "stretch".into());
    // Scales and sizes, on `axes` (opset 18) or every axis.
    let axes: Vec<usize> = match cx.attr_ints("axes") {
        Some(a) => a.iter().map(|&a| cx.axis(a, rank)).collect::<R<_>>()?,
        None => (0..rank).collect(),
    };
    let (scales_in, sizes_in) = match (upsample, cx.opset) {
        (true, o) if o < 9 => (
            cx.attr_floats("scales").map(|v| v.into_iter().map(f64::from).collect()),
            None,
        ),
        (true, _) | (false, 10) => (const_floats(cx, 1)?, None),
        (false, _) => (const_floats(cx, 2)?.filter(|v| !v.is_empty()), cx.const_ints(3)?),
    };
    let mut scales = vec![1.0; rank];
    let mut sizes = shape.clone();
    match (scales_in, sizes_in) {
        (_, Some(s)) if !s.is_empty() => {
            let s = cx.usizes(&s)?;
            if s.len() != axes.len() {
                return Err(cx.err(format!("sizes {s:?} do not match axes {axes:?}")));
            }
            let ratios = axes.iter().zip(&s).map(|(&a, &v)| v as f64 / shape[a] as f64);
            // Keep the aspect ratio: one scale for every axis, the smallest or the largest.
            let common = match policy.as_str() {
                "stretch" => None,
                "not_larger" => ratios.clone().reduce(f64::min),
                "not_smaller" => ratios.clone().reduce(f64::max),
                p => return Err(cx.err(format!("keep_aspect_ratio_policy `{p}` is not supported"))),
            };
            for (&a, &v) in axes.iter().zip(&s) {
                (sizes[a], scales[a]) = match common {
                    Some(c) => ((c * shape[a] as f64).round() as usize, c),
                    None => (v, v as f64 / shape[a] as f64),
                };
            }
        }
        (Some(f), _) => {
            if f.len() != axes.len()
                || f.iter()
                    .any(|&v| v.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
            {
                return Err(cx.err(format!("scales {f:?} must be positive, one per axis {axes:?}")));
            }
            for (&a, &v) in axes.iter().zip(&f) {
                scales[a] = v;
                sizes[a] = (shape[a] as f64 * v).floor() as usize;
            }
        }
        _ => return Err(cx.err("needs scales or sizes")),
    }
    let Some(first) = (0..rank).find(|&a| sizes[a] != shape[a] || scales[a] != 1.0) else {
        return Ok(x);
    };
    let given_scales = sizes
        .iter()
        .zip(&shape)
        .zip(&scales)
        .any(|((&m, &n), &s)| m as f64 / n as f64 != s);
    let op = Composite::Resize(Resize {
        sizes: sizes[first..].to_vec(),
        scales: if given_scales {
            scales[first..].iter().map(|&s| Float(s)).collect()
        } else {
            Vec::new()
        },
        mode,
        coordinate,
        nearest,
        cubic_a: Float(cx.attr_f("cubic_coeff_a", -0.75) as f64),
        exclude_outside: cx.attr_i("exclude_outside", 0) != 0,
    });
    cx.op(Op::Composite(op), &[x])
}

/// A constant float vector input, when present.
fn const_floats(cx: &NodeCx<'_>, i: usize) -> R<Option<Vec<f64>>> {
    Ok(cx.const_input(i)?.map(|t| t.to_f64_vec()))
}

/// `GroupNormalization(X, scale, bias)`: opset 18 gives scale and bias per group, opset 21
/// per channel; a per-group pair is repeated over each group's channels.
pub(crate) fn group_norm(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (x, s, b) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let groups = usize::try_from(cx.attr_i("num_groups", 0)).map_err(|_| cx.err("bad num_groups"))?;
    let c = cx
        .static_shape(x)?
        .get(1)
        .copied()
        .ok_or_else(|| cx.err("needs X[N, C, ...]"))?;
    let per_channel = |cx: &mut NodeCx<'_>, v: ValueId| -> R<ValueId> {
        let n = cx.static_shape(v)?.iter().product::<usize>();
        if n == c || groups == 0 || n != groups || c % groups != 0 {
            return Ok(v);
        }
        let idx: Vec<i64> = (0..c).map(|ch| (ch / (c / groups)) as i64).collect();
        let idx =
            cx.g.add_constant(TensorData::from_vec(vec![c], idx).map_err(|e| cx.err(e.to_string()))?);
        let flat = cx.reshape(v, vec![Dim::Static(groups)])?;
        cx.op(Op::Gather(Gather { axis: 0 }), &[flat, idx])
    };
    let (s, b) = (per_channel(cx, s)?, per_channel(cx, b)?);
    let op = Composite::GroupNorm(GroupNorm {
        num_groups: groups,
        epsilon: Float(cx.attr_f("epsilon", 1e-5) as f64),
    });
    cx.op(Op::Composite(op), &[x, s, b])
}

/// `InstanceNormalization(input, scale, B)`.
pub(crate) fn instance_norm(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let ins = (0..3).map(|i| cx.input(i)).collect::<R<Vec<_>>>()?;
    let op = Composite::InstanceNorm(InstanceNorm {
        epsilon: Float(cx.attr_f("epsilon", 1e-5) as f64),
    });
    cx.op(Op::Composite(op), &ins)
}

/// `CumSum(x, axis)` with `exclusive` and `reverse`.
pub(crate) fn cumsum(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let axis = cx
        .const_ints(1)?
        .and_then(|a| a.first().copied())
        .ok_or_else(|| cx.err("needs a constant axis input"))?;
    let op = Composite::CumSum(CumSum {
        axis: cx.axis(axis, cx.ty(x).rank())?,
        exclusive: cx.attr_i("exclusive", 0) != 0,
        reverse: cx.attr_i("reverse", 0) != 0,
    });
    cx.op(Op::Composite(op), &[x])
}

/// `TopK(X, K)` (opset 1: `k` attribute) → values, indices.
pub(crate) fn topk(cx: &mut NodeCx<'_>) -> R<Vec<ValueId>> {
    let x = cx.input(0)?;
    let k = if cx.opset < 10 {
        cx.attr_i("k", 0)
    } else {
        cx.const_ints(1)?
            .and_then(|k| k.first().copied())
            .ok_or_else(|| cx.err("needs a constant K input"))?
    };
    let op = Op::Composite(Composite::TopK(TopK {
        k: usize::try_from(k).map_err(|_| cx.err(format!("K = {k} is negative")))?,
        axis: cx.axis(cx.attr_i("axis", -1), cx.ty(x).rank())?,
        largest: cx.attr_i("largest", 1) != 0,
    }));
    let name = op.name();
    cx.g.add_op(op, &[x]).map_err(|e| cx.err(format!("{name}: {e}")))
}

/// `OneHot(indices, depth, values)`: `values[1]` at each index, `values[0]` elsewhere, the new
/// axis at `axis`.
pub(crate) fn one_hot(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (idx, values) = (cx.input(0)?, cx.input(2)?);
    let depth = cx
        .const_scalar(1)?
        .ok_or_else(|| cx.err("needs a constant depth input"))?;
    if !(depth >= 1.0 && depth.fract() == 0.0) {
        return Err(cx.err(format!("depth {depth} must be a positive integer")));
    }
    let idx = if cx.ty(idx).dtype.is_float() {
        let f = cx.un(oar_ir::ops::UnaryOp::Floor, idx)?;
        cx.cast(f, DType::I64)?
    } else if cx.ty(idx).dtype == DType::I64 || cx.ty(idx).dtype == DType::I32 {
        idx
    } else {
        cx.cast(idx, DType::I64)?
    };
    let rank = cx.ty(idx).rank() + 1;
    let hot = cx.op(
        Op::Composite(Composite::OneHot(OneHot {
            depth: depth as usize,
            dtype: DType::Bool,
        })),
        &[idx],
    )?;
    let pick = |cx: &mut NodeCx<'_>, k: i64| -> R<ValueId> {
        let i = cx.g.add_constant(TensorData::scalar(k));
        cx.op(Op::Gather(Gather { axis: 0 }), &[values, i])
    };
    let (off, on) = (pick(cx, 0)?, pick(cx, 1)?);
    let y = cx.op(Op::Where, &[hot, on, off])?;
    let axis = cx.axis(cx.attr_i("axis", -1), rank)?;
    if axis + 1 == rank {
        return Ok(y);
    }
    let mut perm: Vec<usize> = (0..rank - 1).collect();
    perm.insert(axis, rank - 1);
    cx.op(Op::Permute(Permute { perm }), &[y])
}

/// `Einsum(inputs...)` by its `equation`.
pub(crate) fn einsum(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let equation = cx.attr_s("equation").ok_or_else(|| cx.err("needs an equation"))?;
    let ins = (0..cx.n_inputs()).map(|i| cx.input(i)).collect::<R<Vec<_>>>()?;
    cx.op(Op::Composite(Composite::Einsum(Einsum { equation })), &ins)
}

/// This family's ONNX mapping (see `table.rs`).
pub(crate) const TABLE: Table = Table {
    imports: &[
        ("ConvTranspose", |cx| one(conv_transpose(cx))),
        ("CumSum", |cx| one(cumsum(cx))),
        ("Einsum", |cx| one(einsum(cx))),
        ("GroupNormalization", |cx| one(group_norm(cx))),
        ("InstanceNormalization", |cx| one(instance_norm(cx))),
        ("OneHot", |cx| one(one_hot(cx))),
        ("Resize", |cx| one(resize(cx, false))),
        ("TopK", topk),
        ("Upsample", |cx| one(resize(cx, true))),
    ],
    exports: &[
        ("conv_transpose", write_conv_transpose),
        ("cumsum", write_cumsum),
        ("einsum", write_einsum),
        ("instance_norm", write_instance_norm),
        ("one_hot", write_one_hot),
        ("resize", write_resize),
        ("sort", write_sort),
        ("topk", write_topk),
    ],
};

// ---- export: the oar ops of this family written as ONNX nodes

fn write_conv_transpose(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::ConvTranspose(ct)) = op else {
        return Ok(None);
    };
    let pads: Vec<usize> = ct.pad_before.iter().chain(&ct.pad_after).copied().collect();
    let attrs = vec![
        ints("strides", &ct.stride),
        ints("pads", &pads),
        ints("output_padding", &ct.output_padding),
        ints("dilations", &ct.dilation),
        int("group", ct.groups as i64),
    ];
    written(ex.emit("ConvTranspose", ins.to_vec(), attrs))
}

/// `Resize(X, roi = "", scales | sizes)` over every axis (the leading ones unchanged).
fn write_resize(ex: &mut Exporter<'_>, op: &Op, ins: &[String], tys: &[TensorType]) -> Written {
    let Op::Composite(Composite::Resize(r)) = op else {
        return Ok(None);
    };
    let shape = ex.static_dims(&tys[0].shape.0, "resize input")?;
    let lead = shape.len() - r.sizes.len();
    let mut inputs = vec![ins[0].clone(), String::new()];
    if r.scales.is_empty() {
        inputs.push(String::new());
        let sizes: Vec<i64> = shape[..lead]
            .iter()
            .copied()
            .chain(r.sizes.iter().map(|&s| s as i64))
            .collect();
        inputs.push(ex.i64s(&sizes));
    } else {
        let scales: Vec<f32> = std::iter::repeat_n(1.0, lead)
            .chain(r.scales.iter().map(|s| s.0 as f32))
            .collect();
        inputs.push(ex.constant(TensorData::from_vec(vec![scales.len()], scales).expect("1-D")));
    }
    let attrs = vec![
        string("mode", r.mode.name()),
        string("coordinate_transformation_mode", r.coordinate.name()),
        string("nearest_mode", r.nearest.name()),
        float("cubic_coeff_a", r.cubic_a.0),
        int("exclude_outside", r.exclude_outside as i64),
    ];
    written(ex.emit("Resize", inputs, attrs))
}

/// `InstanceNormalization` (ones and zeros for a missing scale and bias).
fn write_instance_norm(ex: &mut Exporter<'_>, op: &Op, ins: &[String], tys: &[TensorType]) -> Written {
    let Op::Composite(Composite::InstanceNorm(InstanceNorm { epsilon })) = op else {
        return Ok(None);
    };
    let x = &tys[0];
    let mut ins = ins.to_vec();
    if ins.len() == 1 {
        let Some(c) = x.shape.0[1].as_static() else {
            return Ok(None); // symbolic channels: decomposed
        };
        let ones = ex.constant(TensorData::full(x.dtype, vec![c], 1.0).expect("ones"));
        let zeros = ex.constant(TensorData::full(x.dtype, vec![c], 0.0).expect("zeros"));
        ins.extend([ones, zeros]);
    }
    written(ex.emit("InstanceNormalization", ins, vec![float("epsilon", epsilon.0)]))
}

fn write_cumsum(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::CumSum(CumSum {
        axis,
        exclusive,
        reverse,
    })) = op
    else {
        return Ok(None);
    };
    let a = ex.i64s(&[*axis as i64]);
    let attrs = vec![int("exclusive", *exclusive as i64), int("reverse", *reverse as i64)];
    written(ex.emit("CumSum", vec![ins[0].clone(), a], attrs))
}

/// `one_hot` as `OneHot(indices, depth, [0, 1])` on the last axis.
fn write_one_hot(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::OneHot(OneHot { depth, dtype })) = op else {
        return Ok(None);
    };
    let d = ex.i64s(&[*depth as i64]);
    let v = ex.constant(TensorData::from_f64_slice(*dtype, vec![2], &[0.0, 1.0]).expect("values"));
    written(ex.emit("OneHot", vec![ins[0].clone(), d, v], vec![int("axis", -1)]))
}

fn write_einsum(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::Einsum(Einsum { equation })) = op else {
        return Ok(None);
    };
    written(ex.emit("Einsum", ins.to_vec(), vec![string("equation", equation)]))
}

/// `sort` as a TopK over the whole axis (ties keep the earlier element first).
fn write_sort(ex: &mut Exporter<'_>, op: &Op, ins: &[String], tys: &[TensorType]) -> Written {
    let Op::Sort(Sort { axis, descending }) = op else {
        return Ok(None);
    };
    let n = tys[0].shape.0[*axis]
        .as_static()
        .ok_or_else(|| OnnxError::Export("sort of a symbolic axis".into()))?;
    let k = ex.i64s(&[n as i64]);
    let attrs = vec![
        int("axis", *axis as i64),
        int("largest", *descending as i64),
        int("sorted", 1),
    ];
    Ok(Some(ex.emit_n("TopK", vec![ins[0].clone(), k], attrs, 2)))
}

fn write_topk(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::TopK(TopK { k, axis, largest })) = op else {
        return Ok(None);
    };
    let kk = ex.i64s(&[*k as i64]);
    let attrs = vec![
        int("axis", *axis as i64),
        int("largest", *largest as i64),
        int("sorted", 1),
    ];
    Ok(Some(ex.emit_n("TopK", vec![ins[0].clone(), kk], attrs, 2)))
}
