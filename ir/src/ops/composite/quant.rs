//! Quantization: `quantize_linear` and `dequantize_linear` with ONNX semantics, and
//! `fake_quant` (quantize then dequantize in one op) with a straight-through gradient.
//!
//! A scale is a scalar (per-tensor) or a vector running along `axis` (per-axis); a zero point,
//! where given, has the scale's shape or is a scalar. Division is `x / scale` in x's dtype,
//! rounding is half-to-even, and the integer range saturates — the decompositions and the
//! reference agree bit for bit on every input that is not NaN.

use super::super::rules::{R, arity_range, float};
use super::{V, composite_def, one, reshape, select};
use crate::eval::{Data, EvalCx, Res, Site, Value, round_float};
use crate::ops::sample::{Domain, Sample, input_in};
use crate::ops::{BinaryOp, Grads, OpDef, UnaryOp, VjpArgs, op_struct};
use crate::{Composite, DType, Dim, Emitter, Graph, Op, TensorType};
use ndarray::{ArrayD, IxDyn, Zip};

op_struct! {
    /// ONNX `QuantizeLinear`: `saturate(round_half_even(x / scale) + zero_point)` as `dtype`.
    QuantizeLinear "quantize_linear" {
        /// The axis of `x` a vector scale runs along (unused for a scalar scale).
        axis: usize,
        /// The integer result dtype, `i8` or `u8` (the zero point's dtype too).
        dtype: DType,
    }
}

op_struct! {
    /// ONNX `DequantizeLinear`: `(x - zero_point) * scale`, in the scale's float dtype.
    DequantizeLinear "dequantize_linear" {
        /// The axis of `x` a vector scale runs along (unused for a scalar scale).
        axis: usize,
    }
}

op_struct! {
    /// `fake_quant(x, scale, zero_point?)`: `(clamp(round_half_even(x / scale) + zero_point,
    /// qmin, qmax) - zero_point) * scale`, in x's dtype — quantization's rounding and
    /// saturation with float values, as quantization-aware training inserts it. Its gradient
    /// passes `dy` through where the quantized value is inside `[qmin, qmax]` and is zero
    /// outside (the straight-through estimator); a scale or zero point that wants a gradient
    /// gets LSQ's (Esser et al. 2020; PyTorch's `_fake_quantize_learnable_*`, without the
    /// gradient factor).
    FakeQuant "fake_quant" {
        /// The axis of `x` a vector scale runs along (unused for a scalar scale).
        axis: usize,
        /// The smallest quantized value (`-128` for i8).
        qmin: i64,
        /// The largest quantized value (`127` for i8).
        qmax: i64,
    }
}

/// The range of a quantized dtype.
pub fn quant_range(dtype: DType) -> Option<(i64, i64)> {
    match dtype {
        DType::I8 => Some((-128, 127)),
        DType::U8 => Some((0, 255)),
        _ => None,
    }
}

/// Check a scale (and zero point) against `x`: the scale is a float `[]`, `[1]` or
/// `[x.dims[axis]]`; a zero point of `zp_dtype` has the scale's shape or is a scalar.
pub(super) fn check_params(
    x: &TensorType,
    scale: &TensorType,
    zp: Option<&TensorType>,
    axis: usize,
    zp_dtype: DType,
) -> Result<(), String> {
    if !scale.dtype.is_float() {
        return Err(format!("scale must be a float tensor, got {scale}"));
    }
    match scale.rank() {
        0 => {}
        1 if scale.shape.0[0] == Dim::Static(1) => {}
        1 => {
            let Some(d) = x.shape.0.get(axis) else {
                return Err(format!(
                    "axis {axis} is out of range for x {x} with a per-axis scale {scale}"
                ));
            };
            if *d != scale.shape.0[0] {
                return Err(format!("per-axis scale {scale} does not match axis {axis} of x {x}"));
            }
        }
        _ => return Err(format!("scale must be a scalar or a vector, got {scale}")),
    }
    if let Some(z) = zp {
        let scalar = z.rank() == 0 || z.shape.0 == [Dim::Static(1)];
        if !(z.shape == scale.shape || scalar) || z.dtype != zp_dtype {
            return Err(format!(
                "zero point must be {zp_dtype}{} like the scale {scale}, or a {zp_dtype} scalar, got {z}",
                scale.shape
            ));
        }
    }
    Ok(())
}

/// The dims a scale-shaped parameter takes to broadcast against `x` along `axis`: a vector
/// `[C]` becomes `[C, 1, …, 1]` (rank − axis dims); scalars broadcast as they are.
fn param_dims(x: &TensorType, p: &TensorType, axis: usize) -> Option<Vec<Dim>> {
    (p.rank() == 1 && x.rank() > axis).then(|| {
        let mut d = vec![p.shape.0[0].clone()];
        d.resize(x.rank() - axis, Dim::Static(1));
        d
    })
}

/// A scale-shaped parameter reshaped to broadcast against `x`.
pub(super) fn param<E: Emitter>(g: &mut E, p: E::Value, x: &TensorType, axis: usize) -> V<E> {
    let pt = g.value_type(p);
    match param_dims(x, &pt, axis) {
        Some(d) => reshape(g, p, d),
        None => Ok(p),
    }
}

/// `round_half_even(x / scale) (+ zero_point)` in x's float dtype, the scale and zero point
/// broadcast along `axis` (the zero point cast to x's dtype).
fn scaled<E: Emitter>(g: &mut E, x: &[E::Value], types: &[TensorType], axis: usize) -> V<E> {
    let s = param(g, x[1], &types[0], axis)?;
    let r = g.binary(BinaryOp::Div, x[0], s)?;
    let q = g.unary(UnaryOp::Round, r)?;
    plus_zero_point(g, q, x.get(2).copied(), &types[0], axis)
}

/// `q + zero_point` in q's float dtype (the zero point cast, broadcast along `axis` of `x`),
/// or `q` without one.
pub(super) fn plus_zero_point<E: Emitter>(
    g: &mut E,
    q: E::Value,
    z: Option<E::Value>,
    x: &TensorType,
    axis: usize,
) -> V<E> {
    let Some(z) = z else {
        return Ok(q);
    };
    let dt = g.value_type(q).dtype;
    let z = g.cast(z, dt)?;
    let z = param(g, z, x, axis)?;
    g.binary(BinaryOp::Add, q, z)
}

pub(super) fn clamp<E: Emitter>(g: &mut E, q: E::Value, lo: i64, hi: i64) -> V<E> {
    let q = g.binary_scalar(BinaryOp::Max, q, lo as f64)?;
    g.binary_scalar(BinaryOp::Min, q, hi as f64)
}

impl OpDef for QuantizeLinear {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[2, 3])?;
        let x = &inputs[0];
        float(x)?;
        if quant_range(self.dtype).is_none() {
            return Err(format!("quantize_linear produces i8 or u8, not {}", self.dtype));
        }
        if inputs[1].dtype != x.dtype {
            return Err(format!("scale {} must have x's dtype {}", inputs[1], x.dtype));
        }
        check_params(x, &inputs[1], inputs.get(2), self.axis, self.dtype)?;
        Ok(vec![TensorType::new(self.dtype, x.shape.0.clone())])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(4 * super::super::rules::out_elements(outputs)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || {
            let (lo, hi) = quant_range(self.dtype).unwrap_or((0, 0));
            let q = scaled(g, x, types, self.axis)?;
            let q = clamp(g, q, lo, hi)?;
            g.cast(q, self.dtype)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2, 3])?;
        let (lo, hi) = quant_range(self.dtype).ok_or_else(|| site.err(format!("cannot produce {}", self.dtype)))?;
        let q = quantized(site, ins, self.axis)?;
        Ok(vec![Value::int(
            self.dtype,
            q.mapv(|v| v.clamp(lo as f64, hi as f64) as i64),
        )])
    }

    fn samples() -> Vec<Sample> {
        let op = |axis, dtype| Op::Composite(Composite::QuantizeLinear(QuantizeLinear { axis, dtype }));
        let x = |shape: &[usize]| input_in(DType::F32, shape, Domain::Range(-4.0, 4.0));
        let scale = |shape: &[usize]| input_in(DType::F32, shape, Domain::Range(0.01, 0.05));
        vec![
            Sample::new(
                "quantize_linear/f32/u8",
                op(1, DType::U8),
                vec![
                    x(&[2, 3, 4]),
                    scale(&[]),
                    input_in(DType::U8, &[], Domain::Ints(100, 150)),
                ],
            )
            .no_grad(),
            Sample::new(
                "quantize_linear/f32/i8_per_axis",
                op(1, DType::I8),
                vec![
                    x(&[2, 3, 4]),
                    scale(&[3]),
                    input_in(DType::I8, &[3], Domain::Ints(-10, 10)),
                ],
            )
            .no_grad(),
            // x / 0.25 lands on .5 exactly: ties round to even, then saturate.
            Sample::new(
                "quantize_linear/f32/i8_ties",
                op(0, DType::I8),
                vec![
                    input_in(
                        DType::F32,
                        &[10],
                        Domain::Values(vec![
                            0.125, 0.375, -0.125, -0.625, 0.875, 1.125, 31.875, 40.0, -32.125, -50.0,
                        ]),
                    ),
                    input_in(DType::F32, &[], Domain::Values(vec![0.25])),
                ],
            )
            .no_grad(),
        ]
    }
}

/// `round_half_even(x / scale) + zero_point` with the division in x's dtype, as f64.
fn quantized(site: &Site, ins: &[&Value], axis: usize) -> Res<ArrayD<f64>> {
    let x = ins[0].as_f(site, "x")?;
    let dt = ins[0].dtype;
    let s = broadcast_param(site, ins[1], x.shape(), axis, "scale")?;
    let mut q = ArrayD::zeros(x.shape());
    Zip::from(&mut q)
        .and(x)
        .and(&s)
        .for_each(|q, &x, &s| *q = round_float(dt, x / s).round_ties_even());
    q += &zero_point_or_zeros(site, ins, x.shape(), axis)?;
    Ok(q)
}

/// Operand 2, the zero point, broadcast to `shape` along `axis` (zeros without one).
pub(super) fn zero_point_or_zeros(site: &Site, ins: &[&Value], shape: &[usize], axis: usize) -> Res<ArrayD<f64>> {
    match ins.get(2) {
        Some(z) => broadcast_param(site, z, shape, axis, "zero point"),
        None => Ok(ArrayD::zeros(shape)),
    }
}

/// A scale-shaped parameter (float or integer) as f64, broadcast to `shape` along `axis`.
pub(super) fn broadcast_param(site: &Site, p: &Value, shape: &[usize], axis: usize, what: &str) -> Res<ArrayD<f64>> {
    let a = match &p.data {
        Data::F(a) => a.clone(),
        Data::I(a) => a.mapv(|v| v as f64),
        Data::B(_) => return Err(site.err(format!("{what} must be numeric"))),
    };
    let dims: Vec<usize> = match a.shape() {
        [] | [1] => vec![],
        &[c] if axis < shape.len() && shape[axis] == c => {
            let mut d = vec![1; shape.len()];
            d[axis] = c;
            d
        }
        s => return Err(site.err(format!("{what} {s:?} does not fit x {shape:?} along axis {axis}"))),
    };
    let a = a
        .into_shape_with_order(IxDyn(&dims))
        .map_err(|e| site.err(format!("{what}: {e}")))?;
    let b = a
        .broadcast(IxDyn(shape))
        .ok_or_else(|| site.err(format!("{what} does not broadcast to {shape:?}")))?;
    Ok(b.to_owned())
}

impl OpDef for DequantizeLinear {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[2, 3])?;
        let (x, s) = (&inputs[0], &inputs[1]);
        if !matches!(x.dtype, DType::I8 | DType::U8 | DType::I32) {
            return Err(format!("dequantize_linear reads i8, u8 or i32, got {x}"));
        }
        check_params(x, s, inputs.get(2), self.axis, x.dtype)?;
        Ok(vec![TensorType::new(s.dtype, x.shape.0.clone())])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(2 * super::super::rules::out_elements(outputs)?)
    }

    /// `(cast(x) - cast(zero_point)) * scale` in the scale's dtype.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || {
            let dt = types[1].dtype;
            let mut v = g.cast(x[0], dt)?;
            if let Some(&z) = x.get(2) {
                let z = g.cast(z, dt)?;
                let z = param(g, z, &types[0], self.axis)?;
                v = g.binary(BinaryOp::Sub, v, z)?;
            }
            let s = param(g, x[1], &types[0], self.axis)?;
            g.binary(BinaryOp::Mul, v, s)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2, 3])?;
        let x = ins[0].as_i(site, "x")?;
        let dt = ins[1].dtype;
        let s = broadcast_param(site, ins[1], x.shape(), self.axis, "scale")?;
        let z = zero_point_or_zeros(site, ins, x.shape(), self.axis)?;
        // Each step rounded to the scale's dtype, as the decomposition computes it.
        let mut y = ArrayD::zeros(x.shape());
        Zip::from(&mut y).and(x).and(&z).and(&s).for_each(|y, &x, &z, &s| {
            let d = round_float(dt, round_float(dt, x as f64) - round_float(dt, z));
            *y = round_float(dt, d * s);
        });
        Ok(vec![Value::float(dt, y)])
    }

    fn samples() -> Vec<Sample> {
        let op = |axis| Op::Composite(Composite::DequantizeLinear(DequantizeLinear { axis }));
        let scale = |shape: &[usize]| input_in(DType::F32, shape, Domain::Range(0.01, 0.05));
        vec![
            Sample::new(
                "dequantize_linear/u8/f32",
                op(1),
                vec![
                    input_in(DType::U8, &[2, 3, 4], Domain::Ints(0, 255)),
                    scale(&[]),
                    input_in(DType::U8, &[], Domain::Ints(100, 150)),
                ],
            )
            .no_grad(),
            Sample::new(
                "dequantize_linear/i8/f32_per_axis",
                op(2),
                vec![
                    input_in(DType::I8, &[2, 3, 4], Domain::Ints(-128, 127)),
                    scale(&[4]),
                    input_in(DType::I8, &[4], Domain::Ints(-10, 10)),
                ],
            )
            .no_grad(),
            Sample::new(
                "dequantize_linear/i32/f32",
                op(0),
                vec![
                    input_in(DType::I32, &[5, 3], Domain::Ints(-100_000, 100_000)),
                    scale(&[]),
                ],
            )
            .no_grad(),
        ]
    }
}

impl OpDef for FakeQuant {
    composite_def!(with_vjp);

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[2, 3])?;
        let x = &inputs[0];
        float(x)?;
        if self.qmin > self.qmax {
            return Err(format!("fake_quant range [{}, {}] is empty", self.qmin, self.qmax));
        }
        if inputs[1].dtype != x.dtype {
            return Err(format!("scale {} must have x's dtype {}", inputs[1], x.dtype));
        }
        check_params(x, &inputs[1], inputs.get(2), self.axis, x.dtype)?;
        Ok(vec![x.clone()])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(6 * super::super::rules::out_elements(outputs)?)
    }

    /// `dx = dy` where `qmin ≤ round(x/s) + z ≤ qmax`, else 0. A scale that wants a
    /// gradient gets `dy · (round(x/s) − x/s)` inside the range and `dy · (qmin|qmax − z)`
    /// outside; a zero point gets `−dy · s` outside and 0 inside — each summed to its shape.
    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let xt = e.value_type(a.inputs[0]);
        let st = e.value_type(a.inputs[1]);
        let q = scaled(e, a.inputs, std::slice::from_ref(&xt), self.axis)?;
        let ge = e.binary_scalar(BinaryOp::Ge, q, self.qmin as f64)?;
        let le = e.binary_scalar(BinaryOp::Le, q, self.qmax as f64)?;
        let inside = e.binary(BinaryOp::And, ge, le)?;
        let zero = e.full(&xt, 0.0)?;
        let mut grads = a.none();
        if a.want(0) {
            grads[0] = Some(select(e, inside, a.g, zero)?);
        }
        let s = param(e, a.inputs[1], &xt, self.axis)?;
        let z = match a.inputs.get(2) {
            Some(&z) => Some(param(e, z, &xt, self.axis)?),
            None => None,
        };
        // Sum a per-element gradient down to the parameter's shape.
        let reduce = |e: &mut E, v: E::Value| -> V<E> {
            let bshape = e.value_type(s).shape;
            let r = e.sum_to(v, &bshape)?;
            e.reshape(r, &st.shape)
        };
        if a.want(1) {
            let r = e.binary(BinaryOp::Div, a.inputs[0], s)?;
            let rr = e.unary(UnaryOp::Round, r)?;
            let inner = e.binary(BinaryOp::Sub, rr, r)?;
            let below = e.binary_scalar(BinaryOp::Lt, q, self.qmin as f64)?;
            let lo = e.full(&xt, self.qmin as f64)?;
            let hi = e.full(&xt, self.qmax as f64)?;
            let mut edge = select(e, below, lo, hi)?;
            if let Some(z) = z {
                edge = e.binary(BinaryOp::Sub, edge, z)?;
            }
            let d = select(e, inside, inner, edge)?;
            let d = e.binary(BinaryOp::Mul, d, a.g)?;
            grads[1] = Some(reduce(e, d)?);
        }
        if a.want(2) && z.is_some() {
            let ns = e.unary(UnaryOp::Neg, s)?;
            let ns = e.binary(BinaryOp::Mul, ns, a.g)?;
            let d = select(e, inside, zero, ns)?;
            grads[2] = Some(reduce(e, d)?);
        }
        Ok(grads)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || {
            let q = scaled(g, x, types, self.axis)?;
            let mut q = clamp(g, q, self.qmin, self.qmax)?;
            if let Some(&z) = x.get(2) {
                let z = param(g, z, &types[0], self.axis)?;
                q = g.binary(BinaryOp::Sub, q, z)?;
            }
            let s = param(g, x[1], &types[0], self.axis)?;
            g.binary(BinaryOp::Mul, q, s)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2, 3])?;
        let dt = ins[0].dtype;
        let q = quantized(site, ins, self.axis)?;
        let shape = q.shape().to_vec();
        let s = broadcast_param(site, ins[1], &shape, self.axis, "scale")?;
        let z = zero_point_or_zeros(site, ins, &shape, self.axis)?;
        let mut y = ArrayD::zeros(q.shape());
        let (lo, hi) = (self.qmin as f64, self.qmax as f64);
        Zip::from(&mut y).and(&q).and(&z).and(&s).for_each(|y, &q, &z, &s| {
            *y = round_float(dt, round_float(dt, q.clamp(lo, hi) - z) * s);
        });
        Ok(vec![Value::float(dt, y)])
    }

    fn samples() -> Vec<Sample> {
        let op = |axis, qmin, qmax| Op::Composite(Composite::FakeQuant(FakeQuant { axis, qmin, qmax }));
        let x = |shape: &[usize]| input_in(DType::F32, shape, Domain::Range(-4.0, 4.0));
        vec![
            Sample::new(
                "fake_quant/f32/u8_affine",
                op(0, 0, 255),
                vec![
                    x(&[3, 5]),
                    input_in(DType::F32, &[], Domain::Range(0.01, 0.05)),
                    input_in(DType::F32, &[], Domain::Values(vec![128.0])),
                ],
            )
            .no_grad(),
            Sample::new(
                "fake_quant/f32/i8_per_channel",
                op(0, -127, 127),
                vec![x(&[4, 3, 2]), input_in(DType::F32, &[4], Domain::Range(0.01, 0.05))],
            )
            .no_grad(),
        ]
    }
}
