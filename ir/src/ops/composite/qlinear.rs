//! Integer contractions and requantization, as ONNX defines them: `matmul_integer` and
//! `conv_integer` multiply 8-bit operands (less their zero points) into exact i32 sums, and
//! `requantize` scales such sums back to 8 bits (`saturate(round_half_even(acc · m) + z)`,
//! the multiplication in f32 as ONNX Runtime's requantization does it). A quantized
//! `QLinearMatMul` or `QLinearConv` is `requantize(matmul_integer(..), sa·sb/sy, zy)`.
//!
//! Sums wrap at 32 bits (two's complement), which no 8-bit product of a realistic size reaches.

use super::super::contraction::{conv_f64, conv_type, matmul, matmul_type};
use super::super::rules::{R, arity_range, out_elements};
use super::super::sample::{Domain, Sample, input_in};
use super::quant::{broadcast_param, check_params, clamp, param, plus_zero_point, quant_range, zero_point_or_zeros};
use super::{composite_def, one};
use crate::eval::{Data, EvalCx, Res, Site, Value, round_float};
use crate::ops::{BinaryOp, Conv, OpDef, UnaryOp, op_struct};
use crate::{Composite, DType, Dim, Emitter, Graph, Op, TensorType};
use ndarray::{ArrayD, Zip};

op_struct! {
    /// ONNX `MatMulInteger`: `(a - a_zero_point) @ (b - b_zero_point)` in i32, for i8/u8
    /// `a[.., M, K]` and `b[.., K, N]`; `a_zero_point` is a scalar or per row (`[M]`),
    /// `b_zero_point` a scalar or per column (`[N]`).
    MatMulInteger "matmul_integer"
}

op_struct! {
    /// ONNX `ConvInteger`: the convolution of `x - x_zero_point` (i8/u8 `[N, C, *S]`, padded
    /// with the zero point) by `w - w_zero_point` (i8/u8 `[O, C/groups, *K]`; a scalar or
    /// per-output-channel `[O]` zero point), in i32.
    ConvInteger "conv_integer" {
        /// Stride per spatial axis.
        stride: Vec<usize>,
        /// Padding before each spatial axis.
        pad_before: Vec<usize>,
        /// Padding after each spatial axis.
        pad_after: Vec<usize>,
        /// Dilation per spatial axis.
        dilation: Vec<usize>,
        /// Number of groups.
        groups: usize,
    }
}

op_struct! {
    /// `requantize(acc i32, multiplier, zero_point?)`: `saturate(round_half_even(f32(acc) ·
    /// multiplier) + zero_point)` as `dtype`; the multiplier (float) is a scalar or runs along
    /// `axis`, the zero point has its shape.
    Requantize "requantize" {
        /// The axis a vector multiplier runs along (unused for a scalar).
        axis: usize,
        /// The result dtype, `i8` or `u8` (the zero point's too).
        dtype: DType,
    }
}

impl ConvInteger {
    /// The integer convolution with `c`'s geometry.
    pub fn of(c: Conv) -> ConvInteger {
        let Conv {
            stride,
            pad_before,
            pad_after,
            dilation,
            groups,
        } = c;
        ConvInteger {
            stride,
            pad_before,
            pad_after,
            dilation,
            groups,
        }
    }

    /// The float convolution the decomposition runs.
    pub fn conv(&self) -> Conv {
        Conv {
            stride: self.stride.clone(),
            pad_before: self.pad_before.clone(),
            pad_after: self.pad_after.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
        }
    }
}

fn eight_bit(t: &TensorType, what: &str) -> Result<(), String> {
    if matches!(t.dtype, DType::I8 | DType::U8) {
        Ok(())
    } else {
        Err(format!("{what} must be i8 or u8, got {t}"))
    }
}

/// A zero point of `x`: its dtype, a scalar, `[1]`, or `[x.dims[axis]]`.
fn check_zero_point(z: &TensorType, x: &TensorType, axis: usize, what: &str) -> Result<(), String> {
    let ok = z.dtype == x.dtype
        && match z.rank() {
            0 => true,
            1 => z.shape.0[0] == Dim::Static(1) || x.shape.0.get(axis) == Some(&z.shape.0[0]),
            _ => false,
        };
    if ok {
        Ok(())
    } else {
        let axis_dim = x.shape.0.get(axis).map_or("?".to_string(), |d| d.to_string());
        Err(format!(
            "{what} must be {} of shape [] or [{axis_dim}] for {x}, got {z}",
            x.dtype
        ))
    }
}

/// `cast(v, to) - zero_point` (broadcast along `axis` of `vt`) when there is one.
fn centered<E: Emitter>(
    g: &mut E,
    v: E::Value,
    z: Option<E::Value>,
    vt: &TensorType,
    axis: usize,
    to: DType,
) -> super::V<E> {
    let c = g.cast(v, to)?;
    match z {
        Some(z) => {
            let z = g.cast(z, to)?;
            let z = param(g, z, vt, axis)?;
            g.binary(BinaryOp::Sub, c, z)
        }
        None => Ok(c),
    }
}

/// `v - zero_point` on integer values as i64, the zero point broadcast along `axis`.
fn centered_eval(site: &Site, v: &Value, z: Option<&&Value>, axis: usize, what: &str) -> Res<ArrayD<i64>> {
    let a = v.as_i(site, what)?;
    Ok(match z {
        Some(z) => {
            let zb = broadcast_param(site, z, a.shape(), axis, &format!("{what} zero point"))?;
            let mut out = a.clone();
            Zip::from(&mut out).and(&zb).for_each(|o, &z| *o -= z as i64);
            out
        }
        None => a.clone(),
    })
}

impl OpDef for MatMulInteger {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[2, 3, 4])?;
        let (a, b) = (&inputs[0], &inputs[1]);
        eight_bit(a, "matmul_integer a")?;
        eight_bit(b, "matmul_integer b")?;
        let wide = |t: &TensorType| TensorType::new(DType::I32, t.shape.0.clone());
        let out = matmul_type(&wide(a), &wide(b))?;
        if let Some(z) = inputs.get(2) {
            check_zero_point(z, a, a.rank() - 2, "a_zero_point")?;
        }
        if let Some(z) = inputs.get(3) {
            check_zero_point(z, b, b.rank() - 1, "b_zero_point")?;
        }
        Ok(vec![out])
    }

    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        let k = inputs.first()?.shape.0.last()?.as_static()? as u64;
        Some(2u64.saturating_mul(k).saturating_mul(out_elements(outputs)?))
    }

    /// `matmul(cast(a, i32) - a_zp, cast(b, i32) - b_zp)`.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || {
            let (at, bt) = (&types[0], &types[1]);
            let a = centered(g, x[0], x.get(2).copied(), at, at.rank() - 2, DType::I32)?;
            let b = centered(g, x[1], x.get(3).copied(), bt, bt.rank() - 1, DType::I32)?;
            g.add_op1(Op::MatMul, &[a, b])
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2, 3, 4])?;
        let (ra, rb) = (ins[0].shape().len(), ins[1].shape().len());
        if ra < 2 || rb < 2 {
            return Err(site.err("needs operands of rank ≥ 2"));
        }
        let a = centered_eval(site, ins[0], ins.get(2), ra - 2, "a")?;
        let b = centered_eval(site, ins[1], ins.get(3), rb - 1, "b")?;
        let mut y = matmul(site, &Value::int(DType::I32, a), &Value::int(DType::I32, b))?;
        y.normalize();
        Ok(vec![y])
    }

    fn samples() -> Vec<Sample> {
        let op = Op::Composite(Composite::MatMulInteger);
        let u8s = |shape: &[usize]| input_in(DType::U8, shape, Domain::Ints(0, 255));
        let i8s = |shape: &[usize]| input_in(DType::I8, shape, Domain::Ints(-128, 127));
        vec![
            Sample::new(
                "matmul_integer/u8s8/zero_points",
                op.clone(),
                vec![
                    u8s(&[5, 33]),
                    i8s(&[33, 7]),
                    input_in(DType::U8, &[], Domain::Ints(100, 150)),
                    input_in(DType::I8, &[7], Domain::Ints(-5, 5)),
                ],
            )
            .no_grad(),
            Sample::new(
                "matmul_integer/s8s8/batched",
                op.clone(),
                vec![i8s(&[2, 3, 16]), i8s(&[2, 16, 4])],
            )
            .no_grad(),
            Sample::new(
                "matmul_integer/u8u8/per_row",
                op,
                vec![
                    u8s(&[4, 9]),
                    u8s(&[9, 3]),
                    input_in(DType::U8, &[4], Domain::Ints(0, 255)),
                ],
            )
            .no_grad(),
        ]
    }
}

impl OpDef for ConvInteger {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[2, 3, 4])?;
        let (x, w) = (&inputs[0], &inputs[1]);
        eight_bit(x, "conv_integer x")?;
        eight_bit(w, "conv_integer w")?;
        let f = |t: &TensorType| TensorType::new(DType::F32, t.shape.0.clone());
        let out = conv_type(&f(x), &f(w), &self.conv())?;
        if let Some(z) = inputs.get(2)
            && (z.rank() != 0 && z.shape.0 != [Dim::Static(1)] || z.dtype != x.dtype)
        {
            return Err(format!("x_zero_point must be a {} scalar, got {z}", x.dtype));
        }
        if let Some(z) = inputs.get(3) {
            check_zero_point(z, w, 0, "w_zero_point")?;
        }
        Ok(vec![TensorType::new(DType::I32, out.shape.0)])
    }

    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        let w = &inputs.get(1)?.shape.0;
        let taps = w[1..]
            .iter()
            .try_fold(1u64, |a, d| Some(a.saturating_mul(d.as_static()? as u64)))?;
        Some(2u64.saturating_mul(taps).saturating_mul(out_elements(outputs)?))
    }

    /// `cast(conv(f64(x) - x_zp, f64(w) - w_zp), i32)`: every partial sum of 8-bit products is
    /// an integer far below 2^53, so f64 is exact.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || {
            let (xt, wt) = (&types[0], &types[1]);
            let xs = centered(g, x[0], x.get(2).copied(), xt, 1, DType::F64)?;
            let ws = centered(g, x[1], x.get(3).copied(), wt, 0, DType::F64)?;
            let y = g.add_op1(Op::Conv(self.conv()), &[xs, ws])?;
            g.cast(y, DType::I32)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2, 3, 4])?;
        let f = |a: ArrayD<i64>| a.mapv(|v| v as f64);
        let x = f(centered_eval(site, ins[0], ins.get(2), 1, "x")?);
        let w = f(centered_eval(site, ins[1], ins.get(3), 0, "w")?);
        let mut y = Value::int(DType::I32, conv_f64(site, &x, &w, &self.conv())?.mapv(|v| v as i64));
        y.normalize();
        Ok(vec![y])
    }

    fn samples() -> Vec<Sample> {
        let op = |stride: usize, pad: usize, groups| {
            Op::Composite(Composite::ConvInteger(ConvInteger {
                stride: vec![stride; 2],
                pad_before: vec![pad; 2],
                pad_after: vec![pad; 2],
                dilation: vec![1; 2],
                groups,
            }))
        };
        vec![
            Sample::new(
                "conv_integer/u8s8/padded_per_channel",
                op(1, 1, 1),
                vec![
                    input_in(DType::U8, &[1, 3, 6, 5], Domain::Ints(0, 255)),
                    input_in(DType::I8, &[4, 3, 3, 3], Domain::Ints(-128, 127)),
                    input_in(DType::U8, &[], Domain::Ints(120, 136)),
                    input_in(DType::I8, &[4], Domain::Ints(-3, 3)),
                ],
            )
            .no_grad(),
            Sample::new(
                "conv_integer/s8s8/strided_grouped",
                op(2, 0, 2),
                vec![
                    input_in(DType::I8, &[2, 4, 7, 7], Domain::Ints(-128, 127)),
                    input_in(DType::I8, &[6, 2, 3, 3], Domain::Ints(-128, 127)),
                ],
            )
            .no_grad(),
        ]
    }
}

impl OpDef for Requantize {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[2, 3])?;
        let acc = &inputs[0];
        if acc.dtype != DType::I32 {
            return Err(format!("requantize reads i32 sums, got {acc}"));
        }
        if quant_range(self.dtype).is_none() {
            return Err(format!("requantize produces i8 or u8, not {}", self.dtype));
        }
        check_params(acc, &inputs[1], inputs.get(2), self.axis, self.dtype)?;
        Ok(vec![TensorType::new(self.dtype, acc.shape.0.clone())])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(4 * out_elements(outputs)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || {
            let (at, ft) = (&types[0], types[1].dtype);
            let (lo, hi) = quant_range(self.dtype).unwrap_or((0, 0));
            let v = g.cast(x[0], ft)?;
            let m = param(g, x[1], at, self.axis)?;
            let v = g.binary(BinaryOp::Mul, v, m)?;
            let q = g.unary(UnaryOp::Round, v)?;
            let q = plus_zero_point(g, q, x.get(2).copied(), at, self.axis)?;
            let q = clamp(g, q, lo, hi)?;
            g.cast(q, self.dtype)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2, 3])?;
        let (lo, hi) = quant_range(self.dtype).ok_or_else(|| site.err(format!("cannot produce {}", self.dtype)))?;
        let acc = ins[0].as_i(site, "acc")?;
        let ft = ins[1].dtype;
        if !matches!(ins[1].data, Data::F(_)) {
            return Err(site.err("the multiplier must be a float tensor"));
        }
        let m = broadcast_param(site, ins[1], acc.shape(), self.axis, "multiplier")?;
        let z = zero_point_or_zeros(site, ins, acc.shape(), self.axis)?;
        let mut y = ArrayD::zeros(acc.shape());
        Zip::from(&mut y).and(acc).and(&m).and(&z).for_each(|y, &a, &m, &z| {
            let v = round_float(ft, round_float(ft, a as f64) * m).round_ties_even() + z;
            *y = v.clamp(lo as f64, hi as f64) as i64;
        });
        Ok(vec![Value::int(self.dtype, y)])
    }

    fn samples() -> Vec<Sample> {
        let op = |axis, dtype| Op::Composite(Composite::Requantize(Requantize { axis, dtype }));
        vec![
            Sample::new(
                "requantize/u8",
                op(0, DType::U8),
                vec![
                    input_in(DType::I32, &[4, 6], Domain::Ints(-40_000, 40_000)),
                    input_in(DType::F32, &[], Domain::Range(0.0005, 0.004)),
                    input_in(DType::U8, &[], Domain::Ints(100, 150)),
                ],
            )
            .no_grad(),
            Sample::new(
                "requantize/i8_per_channel",
                op(1, DType::I8),
                vec![
                    input_in(DType::I32, &[3, 5], Domain::Ints(-60_000, 60_000)),
                    input_in(DType::F32, &[5], Domain::Range(0.0005, 0.004)),
                ],
            )
            .no_grad(),
        ]
    }
}
