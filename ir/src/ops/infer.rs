//! Type and shape rules: the output types of an op given its input types.
//!
//! Errors are plain sentences naming the offending shapes/dtypes; the graph builder and the
//! verifier add the op name and the value id.

use super::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::graph::Graph;
use crate::shape::{broadcast_shapes, broadcasts_to};
use crate::{DType, Dim, Shape, TensorType};

pub(super) type R = Result<Vec<TensorType>, String>;

/// Output types of `op` applied to `inputs` (with `regions` for control flow).
pub fn infer_types(op: &Op, inputs: &[TensorType], regions: &[Graph]) -> R {
    if regions.len() != op.num_regions() {
        return Err(format!("expects {} regions, got {}", op.num_regions(), regions.len()));
    }
    match op {
        Op::Input { ty, .. } | Op::Param { ty, .. } => {
            arity(inputs, 0)?;
            Ok(vec![ty.clone()])
        }
        Op::Constant(t) => {
            arity(inputs, 0)?;
            Ok(vec![t.tensor_type()])
        }
        Op::Unary(u) => unary(*u, inputs),
        Op::Binary(b) => binary(*b, inputs),
        Op::Where => {
            arity(inputs, 3)?;
            let (c, a, b) = (&inputs[0], &inputs[1], &inputs[2]);
            if c.dtype != DType::Bool {
                return Err(format!("condition must be bool, got {c}"));
            }
            same_dtype(a, b)?;
            let s = broadcast_shapes(&broadcast_shapes(&c.shape, &a.shape)?, &b.shape)?;
            Ok(vec![TensorType::new(a.dtype, s)])
        }
        Op::Reduce { op, axes, keepdim } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            if !x.dtype.is_numeric() || (*op == ReduceOp::Mean && !x.dtype.is_float()) {
                return Err(format!("{} is not defined for {x}", op.name()));
            }
            check_axes(axes, x.rank())?;
            Ok(vec![TensorType::new(x.dtype, reduce_shape(&x.shape, axes, *keepdim))])
        }
        Op::ArgReduce { axis, keepdim, .. } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            check_axes(&[*axis], x.rank())?;
            if x.shape.0[*axis] == Dim::Static(0) {
                return Err(format!("axis {axis} of {x} is empty"));
            }
            Ok(vec![TensorType::new(
                DType::I64,
                reduce_shape(&x.shape, &[*axis], *keepdim),
            )])
        }
        Op::Reshape { shape } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            let to = Shape(shape.clone());
            if !same_element_count(&x.shape, &to) {
                return Err(format!("cannot reshape {x} to {to}: element counts differ"));
            }
            Ok(vec![TensorType::new(x.dtype, to)])
        }
        Op::Permute { perm } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank()
                || perm
                    .iter()
                    .any(|&p| p >= x.rank() || std::mem::replace(&mut seen[p], true))
            {
                return Err(format!("{perm:?} is not a permutation of the axes of {x}"));
            }
            let s = perm.iter().map(|&p| x.shape.0[p].clone()).collect::<Vec<_>>();
            Ok(vec![TensorType::new(x.dtype, s)])
        }
        Op::Broadcast { shape } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            let to = Shape(shape.clone());
            if !broadcasts_to(&x.shape, &to) {
                return Err(format!("{x} does not broadcast to {to}"));
            }
            Ok(vec![TensorType::new(x.dtype, to)])
        }
        Op::Slice { ranges } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            if ranges.len() != x.rank() {
                return Err(format!("{} slice ranges for {x}", ranges.len()));
            }
            let mut out = Vec::with_capacity(x.rank());
            for (axis, (r, d)) in ranges.iter().zip(&x.shape.0).enumerate() {
                if r.step < 1 {
                    return Err(format!("slice step {} on axis {axis} must be ≥ 1", r.step));
                }
                out.push(match d {
                    Dim::Static(n) => Dim::Static(r.resolve(*n).1),
                    Dim::Sym(_) if r.is_full() => d.clone(),
                    Dim::Sym(_) => return Err(format!("only a full slice is allowed on symbolic axis {axis} of {x}")),
                });
            }
            Ok(vec![TensorType::new(x.dtype, out)])
        }
        Op::Pad { before, after, .. } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            if before.len() != x.rank() || after.len() != x.rank() {
                return Err(format!("pad needs {} before/after values for {x}", x.rank()));
            }
            let mut out = Vec::with_capacity(x.rank());
            for (axis, d) in x.shape.0.iter().enumerate() {
                let extra = before[axis].checked_add(after[axis]).ok_or("padding overflows")?;
                out.push(match d {
                    Dim::Static(n) => Dim::Static(n.checked_add(extra).ok_or("padding overflows")?),
                    Dim::Sym(_) if extra == 0 => d.clone(),
                    Dim::Sym(_) => return Err(format!("cannot pad symbolic axis {axis} of {x}")),
                });
            }
            Ok(vec![TensorType::new(x.dtype, out)])
        }
        Op::Concat { axis } => {
            let first = inputs.first().ok_or("concat needs at least one input")?;
            check_axes(&[*axis], first.rank())?;
            let mut total = 0usize;
            for t in inputs {
                same_dtype(first, t)?;
                let ok =
                    t.rank() == first.rank() && (0..t.rank()).all(|i| i == *axis || t.shape.0[i] == first.shape.0[i]);
                if !ok {
                    return Err(format!("cannot concat {first} and {t} along axis {axis}"));
                }
                match &t.shape.0[*axis] {
                    Dim::Static(n) => total = total.checked_add(*n).ok_or("concat size overflows")?,
                    Dim::Sym(_) if inputs.len() == 1 => return Ok(vec![first.clone()]),
                    Dim::Sym(_) => return Err(format!("cannot concat along symbolic axis {axis} of {t}")),
                }
            }
            let mut s = first.shape.0.clone();
            s[*axis] = Dim::Static(total);
            Ok(vec![TensorType::new(first.dtype, s)])
        }
        Op::Gather { axis } => {
            arity(inputs, 2)?;
            let (data, idx) = (&inputs[0], &inputs[1]);
            check_index(idx)?;
            check_axes(&[*axis], data.rank())?;
            Ok(vec![TensorType::new(
                data.dtype,
                gather_shape(&data.shape, &idx.shape, *axis),
            )])
        }
        Op::Scatter { axis, .. } => {
            arity(inputs, 3)?;
            let (data, idx, upd) = (&inputs[0], &inputs[1], &inputs[2]);
            check_index(idx)?;
            check_axes(&[*axis], data.rank())?;
            same_dtype(data, upd)?;
            let want = gather_shape(&data.shape, &idx.shape, *axis);
            if upd.shape != want {
                return Err(format!(
                    "updates {upd} must have shape {want} (data {data}, indices {idx})"
                ));
            }
            Ok(vec![data.clone()])
        }
        Op::Cast { to } => {
            arity(inputs, 1)?;
            Ok(vec![TensorType::new(*to, inputs[0].shape.clone())])
        }
        Op::Iota { shape, axis, dtype } => {
            arity(inputs, 0)?;
            check_axes(&[*axis], shape.len())?;
            if !dtype.is_numeric() {
                return Err(format!("iota needs a numeric dtype, got {dtype}"));
            }
            Ok(vec![TensorType::new(*dtype, shape.clone())])
        }
        Op::Random { dist, shape, dtype, .. } => {
            arity(inputs, 0)?;
            if !dtype.is_float() {
                return Err(format!("random needs a float dtype, got {dtype}"));
            }
            match dist {
                super::RandomDist::Uniform { low, high } if low.0.partial_cmp(&high.0).is_none_or(|o| o.is_gt()) => {
                    return Err(format!("uniform bounds low={} > high={}", low, high));
                }
                super::RandomDist::Normal { std, .. } if std.0.partial_cmp(&0.0).is_none_or(|o| o.is_lt()) => {
                    return Err(format!("normal std={} must be ≥ 0", std));
                }
                _ => {}
            }
            Ok(vec![TensorType::new(*dtype, shape.clone())])
        }
        Op::MatMul => {
            arity(inputs, 2)?;
            Ok(vec![matmul(&inputs[0], &inputs[1])?])
        }
        Op::Conv {
            stride,
            pad_before,
            pad_after,
            dilation,
            groups,
        } => {
            arity(inputs, 2)?;
            Ok(vec![conv(
                &inputs[0], &inputs[1], stride, pad_before, pad_after, dilation, *groups,
            )?])
        }
        Op::Composite(c) => super::infer_composite::composite(c, inputs),
        Op::Cond => {
            let pred = inputs.first().ok_or("cond needs a predicate")?;
            if pred.dtype != DType::Bool || pred.rank() != 0 {
                return Err(format!("cond predicate must be bool[], got {pred}"));
            }
            let args = &inputs[1..];
            for (i, r) in regions.iter().enumerate() {
                region_inputs(r, args, if i == 0 { "then" } else { "else" })?;
            }
            let (t, e) = (regions[0].output_types(), regions[1].output_types());
            if t != e {
                return Err(format!("then returns ({}) but else returns ({})", list(&t), list(&e)));
            }
            Ok(t)
        }
        Op::While => {
            region_inputs(&regions[0], inputs, "cond")?;
            region_inputs(&regions[1], inputs, "body")?;
            let c = regions[0].output_types();
            if c != [TensorType::new(DType::Bool, Shape::scalar())] {
                return Err(format!("while condition must return (bool[]), returns ({})", list(&c)));
            }
            let b = regions[1].output_types();
            if b != inputs {
                return Err(format!(
                    "while body returns ({}) but carries ({})",
                    list(&b),
                    list(inputs)
                ));
            }
            Ok(inputs.to_vec())
        }
    }
}

fn list(ts: &[TensorType]) -> String {
    ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

fn region_inputs(r: &Graph, args: &[TensorType], which: &str) -> Result<(), String> {
    let want = r.input_types();
    if want != args {
        return Err(format!(
            "{which} region takes ({}) but is given ({})",
            list(&want),
            list(args)
        ));
    }
    Ok(())
}

pub(super) fn arity(inputs: &[TensorType], n: usize) -> Result<(), String> {
    if inputs.len() != n {
        return Err(format!("expects {n} operands, got {}", inputs.len()));
    }
    Ok(())
}

pub(super) fn arity_range(inputs: &[TensorType], ok: &[usize]) -> Result<(), String> {
    if !ok.contains(&inputs.len()) {
        return Err(format!("expects {ok:?} operands, got {}", inputs.len()));
    }
    Ok(())
}

pub(super) fn same_dtype(a: &TensorType, b: &TensorType) -> Result<(), String> {
    if a.dtype != b.dtype {
        return Err(format!("dtypes differ: {a} vs {b}"));
    }
    Ok(())
}

pub(super) fn float(x: &TensorType) -> Result<(), String> {
    if !x.dtype.is_float() {
        return Err(format!("needs a float tensor, got {x}"));
    }
    Ok(())
}

pub(super) fn check_index(idx: &TensorType) -> Result<(), String> {
    if !matches!(idx.dtype, DType::I32 | DType::I64) {
        return Err(format!("indices must be i32 or i64, got {idx}"));
    }
    Ok(())
}

pub(super) fn check_axes(axes: &[usize], rank: usize) -> Result<(), String> {
    if axes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("axes {axes:?} must be sorted and unique"));
    }
    if let Some(a) = axes.iter().find(|&&a| a >= rank) {
        return Err(format!("axis {a} is out of range for rank {rank}"));
    }
    Ok(())
}

fn reduce_shape(s: &Shape, axes: &[usize], keepdim: bool) -> Shape {
    let mut out = Vec::new();
    for (i, d) in s.0.iter().enumerate() {
        if !axes.contains(&i) {
            out.push(d.clone());
        } else if keepdim {
            out.push(Dim::Static(1));
        }
    }
    Shape(out)
}

fn gather_shape(data: &Shape, idx: &Shape, axis: usize) -> Shape {
    let mut s = data.0[..axis].to_vec();
    s.extend(idx.0.iter().cloned());
    s.extend(data.0[axis + 1..].iter().cloned());
    Shape(s)
}

/// Equal element counts, comparing the product of static dims and the multiset of symbols.
fn same_element_count(a: &Shape, b: &Shape) -> bool {
    fn split(s: &Shape) -> (Option<usize>, Vec<&str>) {
        let mut p = Some(1usize);
        let mut syms = Vec::new();
        for d in &s.0 {
            match d {
                Dim::Static(n) => p = p.and_then(|p| p.checked_mul(*n)),
                Dim::Sym(x) => syms.push(x.as_str()),
            }
        }
        syms.sort_unstable();
        (p, syms)
    }
    let (pa, sa) = split(a);
    let (pb, sb) = split(b);
    pa.is_some() && (pa == pb && (sa == sb || pa == Some(0)))
}

fn unary(u: UnaryOp, inputs: &[TensorType]) -> R {
    arity(inputs, 1)?;
    let x = &inputs[0];
    let ok = match u {
        _ if u.float_only() => x.dtype.is_float(),
        UnaryOp::Not => !x.dtype.is_float(),
        _ => x.dtype.is_numeric(),
    };
    if !ok {
        return Err(format!("{} is not defined for {x}", u.name()));
    }
    Ok(vec![x.clone()])
}

fn binary(b: BinaryOp, inputs: &[TensorType]) -> R {
    arity(inputs, 2)?;
    let (x, y) = (&inputs[0], &inputs[1]);
    same_dtype(x, y)?;
    let ok = if b.is_logical() {
        !x.dtype.is_float()
    } else if b.is_comparison() {
        true
    } else {
        x.dtype.is_numeric()
    };
    if !ok {
        return Err(format!("{} is not defined for {x}", b.name()));
    }
    let s = broadcast_shapes(&x.shape, &y.shape)?;
    let dtype = if b.is_comparison() { DType::Bool } else { x.dtype };
    Ok(vec![TensorType::new(dtype, s)])
}

pub(super) fn matmul(a: &TensorType, b: &TensorType) -> Result<TensorType, String> {
    same_dtype(a, b)?;
    if a.rank() < 2 || b.rank() < 2 || !a.dtype.is_numeric() {
        return Err(format!("matmul needs numeric operands of rank ≥ 2, got {a} x {b}"));
    }
    let (ra, rb) = (a.rank(), b.rank());
    if a.shape.0[ra - 1] != b.shape.0[rb - 2] {
        return Err(format!("matmul inner dims differ: {a} x {b}"));
    }
    let batch = broadcast_shapes(
        &Shape(a.shape.0[..ra - 2].to_vec()),
        &Shape(b.shape.0[..rb - 2].to_vec()),
    )
    .map_err(|e| format!("matmul batch dims of {a} x {b}: {e}"))?;
    let mut s = batch.0;
    s.push(a.shape.0[ra - 2].clone());
    s.push(b.shape.0[rb - 1].clone());
    Ok(TensorType::new(a.dtype, s))
}

/// Output size of a window op along one axis; `None` if no window fits.
pub(crate) fn window_out(
    input: usize,
    pad: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    ceil: bool,
) -> Option<usize> {
    let span = dilation.checked_mul(kernel.checked_sub(1)?)?.checked_add(1)?;
    let avail = input.checked_add(pad)?.checked_sub(span)?;
    if stride == 0 {
        return None;
    }
    Some(if ceil {
        avail.div_ceil(stride) + 1
    } else {
        avail / stride + 1
    })
}

pub(super) fn conv(
    x: &TensorType,
    w: &TensorType,
    stride: &[usize],
    pad_before: &[usize],
    pad_after: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<TensorType, String> {
    same_dtype(x, w)?;
    float(x)?;
    let sp = x.rank().saturating_sub(2);
    if sp == 0 || w.rank() != x.rank() {
        return Err(format!(
            "conv needs x[N,C,*spatial] and w[O,C/groups,*kernel] of equal rank ≥ 3, got {x} and {w}"
        ));
    }
    if [stride.len(), pad_before.len(), pad_after.len(), dilation.len()]
        .iter()
        .any(|&l| l != sp)
    {
        return Err(format!("conv attributes must have {sp} entries (one per spatial axis)"));
    }
    if groups == 0 || stride.contains(&0) || dilation.contains(&0) {
        return Err("conv groups, stride and dilation must be ≥ 1".into());
    }
    let stat = |d: &Dim, what: &str| {
        d.as_static()
            .ok_or_else(|| format!("conv {what} must be static, got {x} and {w}"))
    };
    let c = stat(&x.shape.0[1], "channels")?;
    let o = stat(&w.shape.0[0], "output channels")?;
    let wc = stat(&w.shape.0[1], "weight channels")?;
    if c % groups != 0 || o % groups != 0 || wc != c / groups {
        return Err(format!(
            "conv channels: x {x}, w {w}, groups {groups} (need w[1] = C/groups, O % groups = 0)"
        ));
    }
    let mut s = vec![x.shape.0[0].clone(), Dim::Static(o)];
    for i in 0..sp {
        let inp = stat(&x.shape.0[2 + i], "spatial dims")?;
        let k = stat(&w.shape.0[2 + i], "kernel dims")?;
        let out = pad_before[i]
            .checked_add(pad_after[i])
            .and_then(|p| window_out(inp, p, k, stride[i], dilation[i], false))
            .ok_or_else(|| format!("conv window does not fit: x {x}, w {w}, spatial axis {i}"))?;
        s.push(Dim::Static(out));
    }
    Ok(TensorType::new(x.dtype, s))
}
