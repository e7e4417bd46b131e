//! Quantization: `QuantizeLinear` / `DequantizeLinear` (per-tensor and per-axis, opset 10–21)
//! both ways, and `fake_quant` written as the Q→DQ pair ONNX Runtime recognises where its
//! range is a whole i8/u8 range; the QOperator ops imported onto oar's integer ops —
//! `MatMulInteger` → `matmul_integer`, `ConvInteger` → `conv_integer`, `QLinearMatMul` and
//! `QLinearConv` → the integer contraction (+ i32 bias), then `requantize` by
//! `a_scale · b_scale / y_scale` computed in f32 as ONNX Runtime computes it, and
//! `DynamicQuantizeLinear` from reductions and `quantize_linear`.

use crate::export::{Exporter, Written, int, ints, written};
use crate::ops::{NodeCx, R};
use crate::ops_nn::conv_spec;
use crate::table::{Table, one};
use crate::tensor::{dtype_from_onnx, dtype_to_onnx};
use oar_ir::ops::{BinaryOp as B, Reduce, ReduceOp, UnaryOp as U};
use oar_ir::ops::{ConvInteger, DequantizeLinear, FakeQuant, QuantizeLinear, Requantize, quant_range};
use oar_ir::{Composite, DType, Dim, Op, TensorType, ValueId};

/// The axis of a per-axis scale `s` (ONNX's `axis`, default 1, may be negative); ignored (0)
/// for a per-tensor scale.
fn scale_axis(cx: &NodeCx<'_>, x: ValueId, s: ValueId) -> R<usize> {
    let rank = cx.ty(x).rank();
    if cx.ty(s).rank() == 0 || rank == 0 {
        return Ok(0);
    }
    cx.axis(cx.attr_i("axis", 1), rank)
}

/// Refuse what oar does not quantize: blocked quantization (opset 21's `block_size`).
fn plain(cx: &NodeCx<'_>) -> R<()> {
    if cx.attr_i("block_size", 0) != 0 {
        return Err(cx.err("blocked quantization (block_size ≠ 0) is not supported"));
    }
    Ok(())
}

/// `QuantizeLinear(x, y_scale, y_zero_point?)`: the result dtype is the zero point's, else
/// `output_dtype` (opset 21), else u8.
pub(crate) fn quantize(cx: &mut NodeCx<'_>) -> R<ValueId> {
    cx.arity(2, 3)?;
    plain(cx)?;
    let x = cx.input(0)?;
    let (s, z) = (cx.input(1)?, cx.opt_input(2));
    let dtype = match (z, cx.attr_i("output_dtype", 0)) {
        (Some(z), _) => cx.ty(z).dtype,
        (None, 0) => DType::U8,
        (None, t) => dtype_from_onnx(t as i32).ok_or_else(|| cx.err(format!("output_dtype {t} is not supported")))?,
    };
    let axis = scale_axis(cx, x, s)?;
    let mut ins = vec![x, s];
    ins.extend(z);
    cx.op(
        Op::Composite(Composite::QuantizeLinear(QuantizeLinear { axis, dtype })),
        &ins,
    )
}

/// `DequantizeLinear(x, x_scale, x_zero_point?)`.
pub(crate) fn dequantize(cx: &mut NodeCx<'_>) -> R<ValueId> {
    cx.arity(2, 3)?;
    plain(cx)?;
    let (x, s) = (cx.input(0)?, cx.input(1)?);
    let axis = scale_axis(cx, x, s)?;
    let mut ins = vec![x, s];
    ins.extend(cx.opt_input(2));
    cx.op(
        Op::Composite(Composite::DequantizeLinear(DequantizeLinear { axis })),
        &ins,
    )
}

/// Operands `a`, `b` of an integer product as rank ≥ 2 (a 1-D `a` is a row, a 1-D `b` a
/// column, as numpy treats them); `squeeze` says which result axes to drop again.
fn matrices(cx: &mut NodeCx<'_>, a: ValueId, b: ValueId) -> R<(ValueId, ValueId, [bool; 2])> {
    let (ta, tb) = (cx.ty(a), cx.ty(b));
    let (mut a2, mut b2) = (a, b);
    if ta.rank() == 1 {
        a2 = cx.reshape(a, vec![Dim::Static(1), ta.shape.0[0].clone()])?;
    }
    if tb.rank() == 1 {
        b2 = cx.reshape(b, vec![tb.shape.0[0].clone(), Dim::Static(1)])?;
    }
    Ok((a2, b2, [ta.rank() == 1, tb.rank() == 1]))
}

/// Drop the axes [`matrices`] added.
fn unsqueeze_back(cx: &mut NodeCx<'_>, y: ValueId, added: [bool; 2]) -> R<ValueId> {
    if added == [false, false] {
        return Ok(y);
    }
    let mut dims = cx.ty(y).shape.0;
    let r = dims.len();
    if added[1] {
        dims.remove(r - 1);
    }
    if added[0] {
        dims.remove(r - 2);
    }
    cx.reshape(y, dims)
}

/// The operands `[a, b]` followed by their zero points as oar's integer ops take them
/// (positionally: a left-out `a` zero point before a given `b` one becomes a zero of a's dtype).
fn with_zero_points(
    cx: &mut NodeCx<'_>,
    a: ValueId,
    b: ValueId,
    za: Option<ValueId>,
    zb: Option<ValueId>,
) -> Vec<ValueId> {
    let mut ins = vec![a, b];
    match (za, zb) {
        (za, Some(zb)) => {
            let dt = cx.ty(a).dtype;
            let za = za.unwrap_or_else(|| cx.scalar(dt, 0.0));
            ins.extend([za, zb]);
        }
        (Some(za), None) => ins.push(za),
        (None, None) => {}
    }
    ins
}

/// `matmul_integer(a, b, a_zp?, b_zp?)` on operands made rank ≥ 2.
fn integer_product(
    cx: &mut NodeCx<'_>,
    a: ValueId,
    b: ValueId,
    za: Option<ValueId>,
    zb: Option<ValueId>,
) -> R<(ValueId, [bool; 2])> {
    let (a2, b2, added) = matrices(cx, a, b)?;
    let ins = with_zero_points(cx, a2, b2, za, zb);
    Ok((cx.op(Op::Composite(Composite::MatMulInteger), &ins)?, added))
}

/// `MatMulInteger(A, B, a_zero_point?, b_zero_point?)`.
pub(crate) fn matmul_integer(cx: &mut NodeCx<'_>) -> R<ValueId> {
    cx.arity(2, 4)?;
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let (y, added) = integer_product(cx, a, b, cx.opt_input(2), cx.opt_input(3))?;
    unsqueeze_back(cx, y, added)
}

/// `conv_integer(x, w, x_zp?, w_zp?)` with the node's convolution attributes.
fn integer_conv(cx: &mut NodeCx<'_>, x: ValueId, w: ValueId, zx: Option<ValueId>, zw: Option<ValueId>) -> R<ValueId> {
    let op = Composite::ConvInteger(ConvInteger::of(conv_spec(cx, x, w)?));
    let ins = with_zero_points(cx, x, w, zx, zw);
    cx.op(Op::Composite(op), &ins)
}

/// `ConvInteger(x, w, x_zero_point?, w_zero_point?)`.
pub(crate) fn conv_integer(cx: &mut NodeCx<'_>) -> R<ValueId> {
    cx.arity(2, 4)?;
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    integer_conv(cx, x, w, cx.opt_input(2), cx.opt_input(3))
}

/// `requantize(acc, a_scale · b_scale / y_scale, y_zero_point)` along `axis` (the multiplier
/// is per-axis when `b_scale` is).
fn requantize(
    cx: &mut NodeCx<'_>,
    acc: ValueId,
    scales: [ValueId; 3],
    y_zp: Option<ValueId>,
    axis: usize,
) -> R<ValueId> {
    // f16 / bf16 scales (opset 21) widen exactly; the multiplier is computed in f32.
    let mut f32s = scales;
    for (k, s) in scales.into_iter().enumerate() {
        if !cx.ty(s).dtype.is_float() {
            return Err(cx.err(format!("scales must be float, got {}", cx.ty(s))));
        }
        f32s[k] = cx.cast(s, DType::F32)?;
    }
    let [sa, sb, sy] = f32s;
    let ab = cx.bin(B::Mul, sa, sb)?;
    let m = cx.bin(B::Div, ab, sy)?;
    // Scalars of shape [1] (as exporters often write them) count as per-tensor.
    let m = match cx.ty(m).shape.0.as_slice() {
        [d] if *d == Dim::Static(1) => cx.reshape(m, vec![])?,
        _ => m,
    };
    let dtype = y_zp.map_or(DType::U8, |z| cx.ty(z).dtype);
    let mut ins = vec![acc, m];
    if let Some(z) = y_zp {
        let z = if cx.ty(z).rank() == 1 && cx.ty(m).rank() == 0 {
            cx.reshape(z, vec![])?
        } else {
            z
        };
        ins.push(z);
    }
    cx.op(Op::Composite(Composite::Requantize(Requantize { axis, dtype })), &ins)
}

/// `QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)`.
pub(crate) fn qlinear_matmul(cx: &mut NodeCx<'_>) -> R<ValueId> {
    cx.arity(8, 8)?;
    let [a, sa, za, b, sb, zb, sy, zy] = std::array::from_fn(|i| cx.input(i));
    let (a, b) = (a?, b?);
    let (acc, added) = integer_product(cx, a, b, Some(za?), Some(zb?))?;
    let axis = cx.ty(acc).rank() - 1;
    let y = requantize(cx, acc, [sa?, sb?, sy?], Some(zy?), axis)?;
    unsqueeze_back(cx, y, added)
}

/// `QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B?)`: the i32 bias is added
/// to the sums before requantization.
pub(crate) fn qlinear_conv(cx: &mut NodeCx<'_>) -> R<ValueId> {
    cx.arity(8, 9)?;
    let [x, sx, zx, w, sw, zw, sy, zy] = std::array::from_fn(|i| cx.input(i));
    let (x, w) = (x?, w?);
    let mut acc = integer_conv(cx, x, w, Some(zx?), Some(zw?))?;
    if let Some(bias) = cx.opt_input(8) {
        let mut dims = vec![Dim::Static(1); cx.ty(acc).rank()];
        dims[1] = cx.ty(bias).shape.0.first().cloned().unwrap_or(Dim::Static(1));
        let bias = cx.reshape(bias, dims)?;
        acc = cx.bin(B::Add, acc, bias)?;
    }
    requantize(cx, acc, [sx?, sw?, sy?], Some(zy?), 1)
}

/// `DynamicQuantizeLinear(x) -> (y u8, y_scale, y_zero_point)`: the range `[min(x, 0),
/// max(x, 0)]` mapped onto `[0, 255]`.
pub(crate) fn dynamic_quantize(cx: &mut NodeCx<'_>) -> R<Vec<ValueId>> {
    cx.arity(1, 1)?;
    let x = cx.input(0)?;
    if cx.ty(x).dtype != DType::F32 {
        return Err(cx.err(format!("x must be f32, got {}", cx.ty(x))));
    }
    let axes: Vec<usize> = (0..cx.ty(x).rank()).collect();
    let whole = |cx: &mut NodeCx<'_>, op| -> R<ValueId> {
        if axes.is_empty() {
            return Ok(x);
        }
        let axes = axes.clone();
        cx.op(
            Op::Reduce(Reduce {
                op,
                axes,
                keepdim: false,
            }),
            &[x],
        )
    };
    let hi = whole(cx, ReduceOp::Max)?;
    let lo = whole(cx, ReduceOp::Min)?;
    let hi = cx.bin_c(B::Max, hi, 0.0)?;
    let lo = cx.bin_c(B::Min, lo, 0.0)?;
    let span = cx.bin(B::Sub, hi, lo)?;
    let scale = cx.bin_c(B::Div, span, 255.0)?;
    // zero point = saturate(round(0 - lo / scale)), in [0, 255] by construction.
    let r = cx.bin(B::Div, lo, scale)?;
    let r = cx.un(U::Neg, r)?;
    let r = cx.un(U::Round, r)?;
    let r = cx.bin_c(B::Max, r, 0.0)?;
    let r = cx.bin_c(B::Min, r, 255.0)?;
    let zp = cx.cast(r, DType::U8)?;
    let q = QuantizeLinear {
        axis: 0,
        dtype: DType::U8,
    };
    let y = cx.op(Op::Composite(Composite::QuantizeLinear(q)), &[x, scale, zp])?;
    Ok(vec![y, scale, zp])
}

/// `x - zero_point` as f32.
fn centered_f32(cx: &mut NodeCx<'_>, x: ValueId, zp: ValueId) -> R<ValueId> {
    let x = cx.cast(x, DType::F32)?;
    let z = cx.cast(zp, DType::F32)?;
    cx.bin(B::Sub, x, z)
}

/// ONNX Runtime's contrib `QLinearAdd(A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp?)`,
/// computed as its kernel does: `(A - A_zp)·(A_scale/C_scale) + (B - B_zp)·(B_scale/C_scale)`,
/// rounded half to even, plus `C_zp`, saturated.
pub(crate) fn qlinear_add(cx: &mut NodeCx<'_>) -> R<ValueId> {
    cx.arity(7, 8)?;
    let [a, sa, za, b, sb, zb, sc] = std::array::from_fn(|i| cx.input(i));
    let (a, sc) = (a?, sc?);
    let fa = centered_f32(cx, a, za?)?;
    let fb = centered_f32(cx, b?, zb?)?;
    let ma = cx.bin(B::Div, sa?, sc)?;
    let mb = cx.bin(B::Div, sb?, sc)?;
    let ta = cx.bin(B::Mul, fa, ma)?;
    let tb = cx.bin(B::Mul, fb, mb)?;
    let v = cx.bin(B::Add, ta, tb)?;
    let mut q = cx.un(U::Round, v)?;
    let dtype = match cx.opt_input(7) {
        Some(zc) => {
            let dt = cx.ty(zc).dtype;
            let z = cx.cast(zc, DType::F32)?;
            q = cx.bin(B::Add, q, z)?;
            dt
        }
        None => cx.ty(a).dtype,
    };
    let (lo, hi) = quant_range(dtype).ok_or_else(|| cx.err(format!("C must be i8 or u8, not {dtype}")))?;
    let q = cx.bin_c(B::Max, q, lo as f64)?;
    let q = cx.bin_c(B::Min, q, hi as f64)?;
    cx.cast(q, dtype)
}

/// This family's ONNX mapping (see `table.rs`).
pub(crate) const TABLE: Table = Table {
    imports: &[
        ("com.microsoft.QLinearAdd", |cx| one(qlinear_add(cx))),
        ("ConvInteger", |cx| one(conv_integer(cx))),
        ("DequantizeLinear", |cx| one(dequantize(cx))),
        ("DynamicQuantizeLinear", dynamic_quantize),
        ("MatMulInteger", |cx| one(matmul_integer(cx))),
        ("QLinearConv", |cx| one(qlinear_conv(cx))),
        ("QLinearMatMul", |cx| one(qlinear_matmul(cx))),
        ("QuantizeLinear", |cx| one(quantize(cx))),
    ],
    exports: &[
        ("conv_integer", write_conv_integer),
        ("dequantize_linear", write_dequantize),
        ("fake_quant", write_fake_quant),
        ("matmul_integer", write_matmul_integer),
        ("quantize_linear", write_quantize),
    ],
};

// ---- export

/// A zero point of `dtype` for a writer that must name one (ONNX's default is u8).
fn zero_point(ex: &mut Exporter<'_>, dtype: DType) -> String {
    ex.constant(oar_ir::TensorData::from_f64_slice(dtype, vec![], &[0.0]).expect("scalar"))
}

fn write_quantize(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::QuantizeLinear(QuantizeLinear { axis, dtype })) = op else {
        return Ok(None);
    };
    let mut ins = ins.to_vec();
    if ins.len() == 2 {
        // Without a zero point ONNX quantizes to u8: name an i8 zero for i8.
        ins.push(zero_point(ex, *dtype));
    }
    written(ex.emit("QuantizeLinear", ins, vec![int("axis", *axis as i64)]))
}

fn write_dequantize(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::DequantizeLinear(DequantizeLinear { axis })) = op else {
        return Ok(None);
    };
    written(ex.emit("DequantizeLinear", ins.to_vec(), vec![int("axis", *axis as i64)]))
}

/// `fake_quant` over a whole i8 or u8 range → `QuantizeLinear` → `DequantizeLinear` (the
/// float zero point cast to the integer type); any other range is written as its
/// decomposition.
fn write_fake_quant(ex: &mut Exporter<'_>, op: &Op, ins: &[String], _: &[TensorType]) -> Written {
    let Op::Composite(Composite::FakeQuant(FakeQuant { axis, qmin, qmax })) = op else {
        return Ok(None);
    };
    let Some(dtype) = [DType::I8, DType::U8]
        .into_iter()
        .find(|&d| quant_range(d) == Some((*qmin, *qmax)))
    else {
        return Ok(None);
    };
    let z = match ins.get(2) {
        Some(z) => ex.emit("Cast", vec![z.clone()], vec![int("to", dtype_to_onnx(dtype) as i64)]),
        None => zero_point(ex, dtype),
    };
    let attrs = || vec![int("axis", *axis as i64)];
    let q = ex.emit(
        "QuantizeLinear",
        vec![ins[0].clone(), ins[1].clone(), z.clone()],
        attrs(),
    );
    written(ex.emit("DequantizeLinear", vec![q, ins[1].clone(), z], attrs()))
}

/// `matmul_integer` → `MatMulInteger` (the same operands); a per-row zero point of `a`, which
/// ONNX allows but onnxruntime rejects, is written as the decomposition.
fn write_matmul_integer(ex: &mut Exporter<'_>, op: &Op, ins: &[String], types: &[TensorType]) -> Written {
    if !matches!(op, Op::Composite(Composite::MatMulInteger)) {
        return Ok(None);
    }
    if types.get(2).is_some_and(|z| z.shape.num_elements() != Some(1)) {
        return Ok(None);
    }
    written(ex.emit("MatMulInteger", ins.to_vec(), vec![]))
}

/// A 2-D `conv_integer` → `ConvInteger` with its strides, pads, dilations and groups; other
/// ranks, and a per-channel weight zero point (ONNX allows it, onnxruntime rejects it), are
/// written as the decomposition.
fn write_conv_integer(ex: &mut Exporter<'_>, op: &Op, ins: &[String], types: &[TensorType]) -> Written {
    let Op::Composite(Composite::ConvInteger(c)) = op else {
        return Ok(None);
    };
    if c.stride.len() != 2 || types.get(3).is_some_and(|z| z.shape.num_elements() != Some(1)) {
        return Ok(None);
    }
    let pads: Vec<usize> = c.pad_before.iter().chain(&c.pad_after).copied().collect();
    let attrs = vec![
        ints("strides", &c.stride),
        ints("pads", &pads),
        ints("dilations", &c.dilation),
        int("group", c.groups as i64),
    ];
    written(ex.emit("ConvInteger", ins.to_vec(), attrs))
}
