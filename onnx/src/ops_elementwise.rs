//! Elementwise and value ops whose conversion is more than one oar op: Pow with a mixed
//! exponent dtype, Mod (numpy and C `fmod`), the variadic Max/Min/Sum/Mean, Cast/CastLike, and
//! the shape-valued ConstantOfShape, Shape, Size.

use crate::export::{Exporter, Written, written};
use crate::ops::{NodeCx, R};
use crate::table::{Table, one};
use crate::tensor::{dtype_from_onnx, tensor_from_proto};
use oar_ir::ops::{ArgReduceOp, BinaryOp as B, UnaryOp as U};
use oar_ir::{Op, TensorData, TensorType, ValueId};

/// `Pow(a, e)`; the exponent is cast to the base's dtype.
pub(crate) fn pow(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (a, e) = (cx.input(0)?, cx.input(1)?);
    let e = cx.cast(e, cx.ty(a).dtype)?;
    cx.bin(B::Pow, a, e)
}

/// `Mod`: the remainder with the divisor's sign, or with `fmod=1` the dividend's
/// (`a - trunc(a / b) · b`, floats only).
pub(crate) fn modulo(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    if cx.attr_i("fmod", 0) == 0 {
        return cx.bin(B::Rem, a, b);
    }
    let dt = cx.ty(a).dtype;
    if !dt.is_float() {
        return Err(cx.err("fmod=1 on integers is not supported"));
    }
    let r = cx.bin(B::Rem, a, b)?;
    let zero = cx.scalar(dt, 0.0);
    let rz = cx.bin(B::Ne, r, zero)?;
    let sa = cx.bin(B::Lt, a, zero)?;
    let sr = cx.bin(B::Lt, r, zero)?;
    let differ = cx.bin(B::Xor, sa, sr)?;
    let fix = cx.bin(B::And, differ, rz)?;
    let r2 = cx.bin(B::Sub, r, b)?;
    cx.op(Op::Where, &[fix, r2, r])
}

/// Max/Min/Sum of any number of inputs folded with `op`; `mean` divides by their count.
pub(crate) fn variadic(cx: &mut NodeCx<'_>, op: B, mean: bool) -> R<ValueId> {
    let mut acc = cx.input(0)?;
    for i in 1..cx.n_inputs() {
        let x = cx.input(i)?;
        acc = cx.bin(op, acc, x)?;
    }
    if mean {
        let n = cx.n_inputs() as f64;
        acc = cx.bin_c(B::Div, acc, n)?;
    }
    Ok(acc)
}

/// `Cast` to the `to` attribute's dtype.
pub(crate) fn cast(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let code = cx.attr_i("to", 0) as i32;
    let to = dtype_from_onnx(code).ok_or_else(|| {
        cx.err(format!(
            "cast to {} is not supported",
            crate::tensor::onnx_type_name(code)
        ))
    })?;
    let x = cx.input(0)?;
    cx.cast(x, to)
}

/// `CastLike(x, like)`: to `like`'s dtype.
pub(crate) fn cast_like(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let (x, like) = (cx.input(0)?, cx.input(1)?);
    let to = cx.ty(like).dtype;
    cx.cast(x, to)
}

/// `ConstantOfShape(shape)`: a constant tensor of the `value` attribute's dtype.
pub(crate) fn constant_of_shape(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let dims = cx.shape_dims(0)?.ok_or_else(|| cx.err("needs its shape input"))?;
    let value = match cx.attr("value").and_then(|a| a.t.as_ref()) {
        Some(t) => tensor_from_proto(t, None)?,
        None => TensorData::scalar(0.0f32),
    };
    let v = value.to_f64_vec().first().copied().unwrap_or(0.0);
    let shape = oar_ir::Shape(dims.clone());
    let small = shape
        .num_elements()
        .is_some_and(|n| n <= crate::import::FOLD_LIMIT_ELEMENTS);
    let Some(shape) = shape.as_static().filter(|_| small) else {
        // A symbolic or large shape: the fill value broadcast to it at run time (a large
        // constant would be held in the graph, and the model file, element by element).
        let s =
            cx.g.add_constant(TensorData::full(value.dtype(), vec![], v).map_err(|e| cx.err(e.to_string()))?);
        return cx.op(Op::Broadcast(oar_ir::ops::Broadcast { shape: dims }), &[s]);
    };
    let t = TensorData::full(value.dtype(), shape, v).map_err(|e| cx.err(e.to_string()))?;
    Ok(cx.g.add_constant(t))
}

/// `Shape(x)` (with `start`/`end`): a constant when x's shape is static, else `shape_of`
/// (which the importer also follows symbolically, see `shape_values`).
pub(crate) fn shape(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let t = cx.ty(x);
    let r = t.rank() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (s, e) = (clampi(cx.attr_i("start", 0)), clampi(cx.attr_i("end", r)));
    let Some(shape) = t.shape.as_static() else {
        let all = cx.op(Op::Composite(oar_ir::Composite::ShapeOf), &[x])?;
        if (s, e) == (0, r as usize) {
            return Ok(all);
        }
        let ranges = vec![oar_ir::ops::SliceRange::new(s as i64, e.max(s) as i64)];
        return cx.op(Op::Slice(oar_ir::ops::Slice { ranges }), &[all]);
    };
    let dims: Vec<i64> = shape[s..e.max(s)].iter().map(|&d| d as i64).collect();
    let n = dims.len();
    let t = TensorData::from_vec(vec![n], dims).map_err(|e| cx.err(e.to_string()))?;
    Ok(cx.g.add_constant(t))
}

/// `Size(x)`, a constant.
pub(crate) fn size(cx: &mut NodeCx<'_>) -> R<ValueId> {
    let x = cx.input(0)?;
    let n: usize = cx.static_shape(x)?.iter().product();
    Ok(cx.g.add_constant(TensorData::scalar(n as i64)))
}

/// This family's ONNX mapping (see `table.rs`).
pub(crate) const TABLE: Table = Table {
    imports: &[
        ("Abs", |cx| one(cx.unary(U::Abs))),
        ("Add", |cx| one(cx.binary(B::Add))),
        ("And", |cx| one(cx.binary(B::And))),
        ("ArgMax", |cx| one(cx.arg_reduce(ArgReduceOp::ArgMax))),
        ("ArgMin", |cx| one(cx.arg_reduce(ArgReduceOp::ArgMin))),
        ("Cast", |cx| one(cast(cx))),
        ("CastLike", |cx| one(cast_like(cx))),
        ("Ceil", |cx| one(cx.unary(U::Ceil))),
        ("Constant", |cx| one(cx.constant())),
        ("ConstantOfShape", |cx| one(constant_of_shape(cx))),
        ("Cos", |cx| one(cx.unary(U::Cos))),
        ("Div", |cx| one(cx.binary(B::Div))),
        ("Equal", |cx| one(cx.binary(B::Eq))),
        ("Erf", |cx| one(cx.unary(U::Erf))),
        ("Exp", |cx| one(cx.unary(U::Exp))),
        ("Floor", |cx| one(cx.unary(U::Floor))),
        ("Greater", |cx| one(cx.binary(B::Gt))),
        ("GreaterOrEqual", |cx| one(cx.binary(B::Ge))),
        ("Identity", |cx| one(cx.input(0))),
        ("Less", |cx| one(cx.binary(B::Lt))),
        ("LessOrEqual", |cx| one(cx.binary(B::Le))),
        ("Log", |cx| one(cx.unary(U::Log))),
        ("Max", |cx| one(variadic(cx, B::Max, false))),
        ("Mean", |cx| one(variadic(cx, B::Add, true))),
        ("Min", |cx| one(variadic(cx, B::Min, false))),
        ("Mod", |cx| one(modulo(cx))),
        ("Mul", |cx| one(cx.binary(B::Mul))),
        ("Neg", |cx| one(cx.unary(U::Neg))),
        ("Not", |cx| one(cx.unary(U::Not))),
        ("Or", |cx| one(cx.binary(B::Or))),
        ("Pow", |cx| one(pow(cx))),
        ("Reciprocal", |cx| one(cx.unary(U::Recip))),
        ("Round", |cx| one(cx.unary(U::Round))),
        ("Shape", |cx| one(shape(cx))),
        ("Sign", |cx| one(cx.unary(U::Sign))),
        ("Sin", |cx| one(cx.unary(U::Sin))),
        ("Size", |cx| one(size(cx))),
        ("Sqrt", |cx| one(cx.unary(U::Sqrt))),
        ("Sub", |cx| one(cx.binary(B::Sub))),
        ("Sum", |cx| one(variadic(cx, B::Add, false))),
        ("Tanh", |cx| one(cx.unary(U::Tanh))),
        ("Where", |cx| {
            let (c, a, b) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
            one(cx.op(Op::Where, &[c, a, b]))
        }),
        ("Xor", |cx| one(cx.binary(B::Xor))),
    ],
    exports: &[("shape_of", write_shape)],
};

/// `shape_of(x)` → `Shape`.
fn write_shape(ex: &mut Exporter<'_>, _: &Op, ins: &[String], _: &[TensorType]) -> Written {
    written(ex.emit("Shape", ins.to_vec(), vec![]))
}
