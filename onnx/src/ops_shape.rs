//! Movement ops (Reshape, Transpose, Slice, Concat, Squeeze, Expand, Tile, Pad, Gather,
//! Flatten, Range) and reductions; the import table (`table.rs`) maps each op type here.

use crate::export::{Exporter, Written, int, string, written};
use crate::ops::{NodeCx, R};
use crate::table::{Table, one};
use oar_ir::ops::{BinaryOp, ReduceOp, SliceRange, UnaryOp};
use oar_ir::ops::{BorderPad, Broadcast, Concat, Gather, Pad, PadMode, Permute, Slice, Trilu};
use oar_ir::{Composite, Dim, Float, Op, SymExpr, TensorData, TensorType, ValueId};

/// `Reshape(x, shape)` (opset < 5: the `shape` attribute).
pub(crate) fn reshape(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let target = if cx.opset < 5 {
        let t = cx.attr_ints("shape").unwrap_or_default();
        t.into_iter().map(SymExpr::constant).collect()
    } else {
        cx.shape_ints(1)?.ok_or_else(|| cx.err("needs its shape input"))?
    };
    let dims = reshape_dims(cx, x, &target, cx.attr_i("allowzero", 0) != 0)?;
    cx.reshape(x, dims)
}

/// `Flatten(x)` around `axis` into two dims.
pub(crate) fn flatten(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let t = cx.ty(x);
    let axis = cx.attr_i("axis", 1);
    let axis = if axis == t.rank() as i64 {
        t.rank()
    } else {
        cx.axis(axis, t.rank())?
    };
    let a = product(cx, &t.shape.0[..axis])?;
    let b = product(cx, &t.shape.0[axis..])?;
    cx.reshape(x, vec![a, b])
}

/// `Transpose(x)` by `perm` (default: reversed axes).
pub(crate) fn transpose(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let r = cx.ty(x).rank();
    let perm = match cx.attr_ints("perm") {
        Some(p) if !p.is_empty() => p.iter().map(|&a| cx.axis(a, r)).collect::<R<Vec<_>>>()?,
        _ => (0..r).rev().collect(),
    };
    cx.op(Op::Permute(Permute { perm }), &[x])
}

/// `Concat` along `axis`.
pub(crate) fn concat(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x0 = cx.input(0)?;
    let axis = cx.axis(cx.attr_i("axis", 0), cx.ty(x0).rank())?;
    let ins = (0..cx.n_inputs()).map(|i| cx.input(i)).collect::<R<Vec<_>>>()?;
    if ins.len() == 1 {
        Ok(x0)
    } else {
        cx.op(Op::Concat(Concat { axis }), &ins)
    }
}

/// `Squeeze` (`squeeze`) or `Unsqueeze`: axes from the attribute or (opset ≥ 13) the input.
pub(crate) fn squeeze(cx: &mut NodeCx<'_>, squeeze: bool) -> R<ValueId> {
    let x = cx.input(0)?;
    let axes = if cx.opset >= 13 {
        cx.const_ints(1)?
    } else {
        cx.attr_ints("axes")
    };
    let mut dims = cx.ty(x).shape.0;
    if squeeze {
        let rank = dims.len();
        let drop: Vec<usize> = match axes {
            Some(a) if !a.is_empty() => a.iter().map(|&a| cx.axis(a, rank)).collect::<R<_>>()?,
            _ => (0..rank).filter(|&i| dims[i] == Dim::Static(1)).collect(),
        };
        if drop.iter().enumerate().any(|(i, a)| drop[..i].contains(a)) {
            return Err(cx.err(format!("axes {drop:?} name an axis twice")));
        }
        for &a in &drop {
            if dims[a] != Dim::Static(1) {
                return Err(cx.err(format!("cannot squeeze axis {a} of size {}", dims[a])));
            }
        }
        dims = dims
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !drop.contains(i))
            .map(|(_, d)| d)
            .collect();
    } else {
        let axes = axes.ok_or_else(|| cx.err("needs axes"))?;
        let out_rank = dims.len() + axes.len();
        let mut ax = axes.iter().map(|&a| cx.axis(a, out_rank)).collect::<R<Vec<_>>>()?;
        ax.sort_unstable();
        if ax.windows(2).any(|w| w[0] == w[1]) {
            return Err(cx.err(format!("axes {axes:?} name an axis twice")));
        }
        for a in ax {
            dims.insert(a, Dim::Static(1));
        }
    }
    cx.reshape(x, dims)
}

/// `Expand(x, shape)`: numpy broadcasting to a constant shape.
pub(crate) fn expand(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let shape = oar_ir::Shape(cx.shape_dims(1)?.ok_or_else(|| cx.err("needs its shape input"))?);
    let out = oar_ir::broadcast_shapes(&cx.ty(x).shape, &shape).map_err(|e| cx.err(e))?;
    if out == cx.ty(x).shape {
        Ok(x)
    } else {
        cx.op(Op::Broadcast(Broadcast { shape: out.0 }), &[x])
    }
}

/// `Tile(x, repeats)`.
pub(crate) fn tile(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let reps = cx.const_ints(1)?.ok_or_else(|| cx.err("needs its repeats input"))?;
    let shape = cx.static_shape(x)?;
    let reps = cx.usizes(&reps)?;
    if reps.len() != shape.len() {
        return Err(cx.err(format!("repeats {reps:?} do not match rank {}", shape.len())));
    }
    // x[d0, d1] → [1, d0, 1, d1] → broadcast [r0, d0, r1, d1] → reshape [r0*d0, r1*d1].
    let inter: Vec<Dim> = shape.iter().flat_map(|&d| [Dim::Static(1), Dim::Static(d)]).collect();
    let wide: Vec<Dim> = shape
        .iter()
        .zip(&reps)
        .flat_map(|(&d, &r)| [Dim::Static(r), Dim::Static(d)])
        .collect();
    let out: Vec<Dim> = shape.iter().zip(&reps).map(|(&d, &r)| Dim::Static(d * r)).collect();
    let y = cx.reshape(x, inter)?;
    let y = cx.op(Op::Broadcast(Broadcast { shape: wide }), &[y])?;
    cx.reshape(y, out)
}

/// `Gather(x, indices)` along `axis`.
pub(crate) fn gather(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (x, i) = (cx.input(0)?, cx.input(1)?);
    let axis = cx.axis(cx.attr_i("axis", 0), cx.ty(x).rank())?;
    let i = cx.cast(i, oar_ir::DType::I64)?;
    cx.op(Op::Gather(Gather { axis }), &[x, i])
}

/// `Range(start, limit, delta)` of constants, folded.
pub(crate) fn range(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (s, l, d) = (cx.const_scalar(0)?, cx.const_scalar(1)?, cx.const_scalar(2)?);
    let (s, l, d) = (s.unwrap_or(0.0), l.unwrap_or(0.0), d.unwrap_or(1.0));
    let dt = cx.ty(cx.input(0)?).dtype;
    let n = ((l - s) / d).ceil().max(0.0);
    if !n.is_finite() || n > 1e8 {
        return Err(cx.err(format!("range({s}, {l}, {d}) is too long")));
    }
    let vals: Vec<f64> = (0..n as usize).map(|k| s + k as f64 * d).collect();
    let t = TensorData::from_f64_slice(dt, vec![vals.len()], &vals).map_err(|e| cx.err(e.to_string()))?;
    Ok(cx.g.add_constant(t))
}

/// Product of dims (`N*C` when symbolic).
fn product(cx: &NodeCx<'_>, dims: &[Dim]) -> R<Dim> {
    Dim::product(dims).map_err(|e| cx.err(e))
}

/// ONNX reshape target → dims: `0` copies the input dim (unless `allowzero`), `-1` is the
/// element count divided by the other dims (exactly, as polynomials when symbolic).
fn reshape_dims(cx: &NodeCx<'_>, x: ValueId, target: &[SymExpr], allowzero: bool) -> R<Vec<Dim>> {
    let in_shape = cx.ty(x).shape;
    let in_dims = &in_shape.0;
    let mut out: Vec<Option<Dim>> = Vec::with_capacity(target.len());
    for (i, t) in target.iter().enumerate() {
        out.push(match t.as_constant() {
            Some(0) if !allowzero => Some(
                in_dims
                    .get(i)
                    .cloned()
                    .ok_or_else(|| cx.err("0 in shape past the input rank"))?,
            ),
            Some(-1) => None,
            Some(c) if c < 0 => return Err(cx.err(format!("bad reshape dim {c}"))),
            _ => Some(Dim::from_expr(t.clone()).map_err(|e| cx.err(format!("reshape dim {t}: {e}")))?),
        });
    }
    let holes = out.iter().filter(|d| d.is_none()).count();
    if holes > 1 {
        return Err(cx.err("more than one -1 in the reshape target"));
    }
    if holes == 1 {
        let total = in_shape.num_elements_dim().map_err(|e| cx.err(e))?;
        let known = product(cx, &out.iter().flatten().cloned().collect::<Vec<_>>())?;
        let show: Vec<String> = target.iter().map(|t| t.to_string()).collect();
        let fill = total.div_exact(&known).ok_or_else(|| {
            cx.err(format!(
                "cannot infer -1 reshaping {} to [{}]",
                cx.ty(x),
                show.join(",")
            ))
        })?;
        return Ok(out.into_iter().map(|d| d.unwrap_or_else(|| fill.clone())).collect());
    }
    Ok(out.into_iter().flatten().collect())
}

/// `Slice` by starts/ends/axes/steps (attributes before opset 10, inputs after).
pub(crate) fn slice(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let rank = cx.ty(x).rank();
    let (starts, ends, axes, steps) = if cx.opset < 10 {
        (cx.attr_ints("starts"), cx.attr_ints("ends"), cx.attr_ints("axes"), None)
    } else {
        (
            cx.const_ints(1)?,
            cx.const_ints(2)?,
            cx.const_ints(3)?,
            cx.const_ints(4)?,
        )
    };
    let starts = starts.ok_or_else(|| cx.err("needs starts"))?;
    let ends = ends.ok_or_else(|| cx.err("needs ends"))?;
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(cx.err("starts, ends, axes and steps differ in length"));
    }
    let mut ranges = vec![SliceRange::FULL; rank];
    for k in 0..starts.len() {
        let a = cx.axis(axes[k], rank)?;
        if steps[k] < 1 {
            return Err(cx.err(format!("step {} is not supported (oar slices take step ≥ 1)", steps[k])));
        }
        let end = if ends[k] >= i32::MAX as i64 { i64::MAX } else { ends[k] };
        ranges[a] = SliceRange {
            start: starts[k],
            end,
            step: steps[k],
        };
    }
    cx.op(Op::Slice(Slice { ranges }), &[x])
}

/// `Pad` (constant, reflect, edge, wrap).
pub(crate) fn pad(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let rank = cx.ty(x).rank();
    let mode = match cx.attr_s("mode").as_deref().unwrap_or("constant") {
        "constant" => None,
        "reflect" => Some(PadMode::Reflect),
        "edge" => Some(PadMode::Replicate),
        "wrap" => Some(PadMode::Circular),
        other => return Err(cx.err(format!("pad mode `{other}` is not supported"))),
    };
    let (pads, value, axes) = if cx.opset < 11 {
        (
            cx.attr_ints("pads").or(cx.attr_ints("paddings")),
            cx.attr_f("value", 0.0) as f64,
            None,
        )
    } else {
        (cx.const_ints(1)?, cx.const_scalar(2)?.unwrap_or(0.0), cx.const_ints(3)?)
    };
    let pads = pads.ok_or_else(|| cx.err("needs pads"))?;
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| cx.axis(a, rank)).collect::<R<_>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.err(format!("pads {pads:?} do not match {} axes", axes.len())));
    }
    let (mut before, mut after) = (vec![0; rank], vec![0; rank]);
    let n = axes.len();
    let p = cx
        .usizes(&pads)
        .map_err(|_| cx.err("negative pads are not supported"))?;
    for (k, &a) in axes.iter().enumerate() {
        before[a] = p[k];
        after[a] = p[k + n];
    }
    let op = match mode {
        None => Op::Pad(Pad {
            before,
            after,
            value: Float(value),
        }),
        Some(mode) => Op::Composite(Composite::BorderPad(BorderPad { before, after, mode })),
    };
    cx.op(op, &[x])
}

/// A reduction as ONNX spells it: `post(reduce(pre(x)))`, with the input squared first for
/// L2 and SumSquare; axes from the attribute or, from opset `axes_input_from`, the input.
pub(crate) struct Reduction {
    pub pre: Option<UnaryOp>,
    pub square: bool,
    pub op: ReduceOp,
    pub post: Option<UnaryOp>,
    pub axes_input_from: i64,
}

/// A plain reduction (axes as an input from opset 18).
pub(crate) const fn plain(op: ReduceOp) -> Reduction {
    Reduction {
        pre: None,
        square: false,
        op,
        post: None,
        axes_input_from: 18,
    }
}

pub(crate) fn reduce(cx: &mut NodeCx<'_>, r: Reduction) -> R<ValueId> {
    let x = cx.input(0)?;
    let axes = cx.reduce_axes(cx.ty(x).rank(), r.axes_input_from)?;
    let mut y = x;
    if let Some(u) = r.pre {
        y = cx.un(u, y)?;
    }
    if r.square {
        y = cx.bin(BinaryOp::Mul, y, y)?;
    }
    y = cx.reduce(r.op, y, axes)?;
    if let Some(u) = r.post {
        y = cx.un(u, y)?;
    }
    Ok(y)
}

/// This family's ONNX mapping (see `table.rs`).
pub(crate) const TABLE: Table = Table {
    imports: &[
        ("Concat", |cx| one(concat(cx))),
        ("Expand", |cx| one(expand(cx))),
        ("Flatten", |cx| one(flatten(cx))),
        ("Gather", |cx| one(gather(cx))),
        ("Pad", |cx| one(pad(cx))),
        ("Range", |cx| one(range(cx))),
        ("ReduceL1", |cx| {
            one(reduce(
                cx,
                Reduction {
                    pre: Some(UnaryOp::Abs),
                    ..plain(ReduceOp::Sum)
                },
            ))
        }),
        ("ReduceL2", |cx| {
            one(reduce(
                cx,
                Reduction {
                    square: true,
                    post: Some(UnaryOp::Sqrt),
                    ..plain(ReduceOp::Sum)
                },
            ))
        }),
        ("ReduceLogSum", |cx| {
            one(reduce(
                cx,
                Reduction {
                    post: Some(UnaryOp::Log),
                    ..plain(ReduceOp::Sum)
                },
            ))
        }),
        ("ReduceLogSumExp", |cx| {
            one(reduce(
                cx,
                Reduction {
                    pre: Some(UnaryOp::Exp),
                    post: Some(UnaryOp::Log),
                    ..plain(ReduceOp::Sum)
                },
            ))
        }),
        ("ReduceMax", |cx| one(reduce(cx, plain(ReduceOp::Max)))),
        ("ReduceMean", |cx| one(reduce(cx, plain(ReduceOp::Mean)))),
        ("ReduceMin", |cx| one(reduce(cx, plain(ReduceOp::Min)))),
        ("ReduceProd", |cx| one(reduce(cx, plain(ReduceOp::Prod)))),
        ("ReduceSum", |cx| {
            one(reduce(
                cx,
                Reduction {
                    axes_input_from: 13,
                    ..plain(ReduceOp::Sum)
                },
            ))
        }),
        ("ReduceSumSquare", |cx| {
            one(reduce(
                cx,
                Reduction {
                    square: true,
                    ..plain(ReduceOp::Sum)
                },
            ))
        }),
        ("Reshape", |cx| one(reshape(cx))),
        ("Slice", |cx| one(slice(cx))),
        ("Squeeze", |cx| one(squeeze(cx, true))),
        ("Tile", |cx| one(tile(cx))),
        ("Transpose", |cx| one(transpose(cx))),
        ("Trilu", |cx| one(trilu(cx))),
        ("Unsqueeze", |cx| one(squeeze(cx, false))),
    ],
    exports: &[
        ("border_pad", write_border_pad),
        ("embedding", write_embedding),
        ("trilu", write_trilu),
    ],
};

/// `Trilu(input, k?)` with `upper` (default 1): oar's `trilu` with `diagonal = k`.
fn trilu(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let diagonal = match cx.opt_input(1) {
        Some(_) => cx
            .const_ints(1)?
            .and_then(|k| k.first().copied())
            .ok_or_else(|| cx.err("needs a constant k input"))?,
        None => 0,
    };
    let op = Composite::Trilu(Trilu {
        diagonal,
        upper: cx.attr_i("upper", 1) != 0,
    });
    cx.op(Op::Composite(op), &[x])
}

fn write_trilu(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::Trilu(Trilu { diagonal, upper })) = op else {
        return Ok(None);
    };
    let k = ex.constant(TensorData::scalar(*diagonal));
    written(ex.emit("Trilu", vec![ins[0].clone(), k], vec![int("upper", *upper as i64)]))
}

// ---- export: the oar ops of this family written as ONNX nodes

/// Reflect and replicate padding as `Pad` modes; circular (`wrap`, opset 19) is decomposed.
fn write_border_pad(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::BorderPad(BorderPad { before, after, mode })) = op else {
        return Ok(None);
    };
    let mode = match mode {
        PadMode::Reflect => "reflect",
        PadMode::Replicate => "edge",
        PadMode::Circular => return Ok(None),
    };
    let pads: Vec<i64> = before.iter().chain(after).map(|&p| p as i64).collect();
    let p = ex.i64s(&pads);
    written(ex.emit("Pad", vec![ins[0].clone(), p], vec![string("mode", mode)]))
}

/// `embedding(indices, weight)` → `Gather(weight, indices)`.
fn write_embedding(ex: &mut Exporter<'_>, _: &Op, ins: &[String], _: &[TensorType]) -> Written {
    written(ex.emit("Gather", vec![ins[1].clone(), ins[0].clone()], vec![int("axis", 0)]))
}
