//! Activations: `relu`, `gelu`, `silu`, `sigmoid`, `softmax`, `log_softmax`, `dropout`.
//! Softmax subtracts the lane max first (decomposition and reference alike).

use super::super::rules::{R, arity, check_axes, elements, float, out_elements};
use super::{V, composite_def, one, scalar_like, select};
use crate::eval::{Data, EvalCx, Res, Site, Value};
use crate::ops::{BinaryOp, Float, OpDef, Random, RandomDist, ReduceOp, UnaryOp, op_struct, random_stream};
use crate::{DType, Emitter, Graph, Op, TensorType};
use ndarray::{ArrayD, Axis};

op_struct! {
    /// `max(x, 0)`.
    Relu "relu"
}

op_struct! {
    /// GELU: `0.5 x (1 + erf(x / √2))`, or with `approximate` the tanh form
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    Gelu "gelu" {
        /// tanh approximation.
        approximate: bool,
    }
}

op_struct! {
    /// `x * sigmoid(x)`.
    Silu "silu"
}

op_struct! {
    /// `1 / (1 + exp(-x))`.
    Sigmoid "sigmoid"
}

op_struct! {
    /// `softmax(x)` along `axis`.
    Softmax "softmax" {
        /// Axis.
        axis: usize,
    }
}

op_struct! {
    /// `log_softmax(x)` along `axis`.
    LogSoftmax "log_softmax" {
        /// Axis.
        axis: usize,
    }
}

op_struct! {
    /// Dropout with Paddle's `upscale_in_train`: in training, zero with probability `p` and
    /// scale the rest by `1/(1-p)`; identity otherwise. The mask is drawn from the shared
    /// counter-based generator ([`random_stream`]).
    Dropout "dropout" {
        /// Drop probability in `[0, 1)`.
        p: Float,
        /// Training mode.
        training: bool,
        /// Seed of the mask.
        seed: u64,
    }
}

fn float_unary(inputs: &[TensorType]) -> R {
    arity(inputs, 1)?;
    float(&inputs[0])?;
    Ok(vec![inputs[0].clone()])
}

/// Apply `f` to a float tensor.
fn float_map(cx: &dyn EvalCx, ins: &[&Value], f: impl Fn(f64) -> f64) -> Res<Vec<Value>> {
    crate::eval::arity(cx.site(), ins, &[1])?;
    let x = ins[0];
    Ok(vec![x.with(Data::F(x.as_f(cx.site(), "input")?.mapv(f)))])
}

fn sigmoid_f64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `1 / (1 + exp(-x))`.
pub(super) fn sigmoid<E: Emitter>(g: &mut E, x: E::Value) -> V<E> {
    let n = g.unary(UnaryOp::Neg, x)?;
    let e = g.unary(UnaryOp::Exp, n)?;
    let d = g.binary_scalar(BinaryOp::Add, e, 1.0)?;
    g.unary(UnaryOp::Recip, d)
}

impl OpDef for Relu {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        if !inputs[0].dtype.is_numeric() {
            return Err(format!("relu is not defined for {}", inputs[0]));
        }
        Ok(vec![inputs[0].clone()])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        out_elements(outputs)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(g.binary_scalar(BinaryOp::Max, x[0], 0.0))
    }

    /// `max(x, 0)`; NaN stays NaN.
    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        let x = ins[0];
        let data = match &x.data {
            Data::F(a) => Data::F(a.mapv(|v| if v > 0.0 || v.is_nan() { v } else { 0.0 })),
            Data::I(a) => Data::I(a.mapv(|v| v.max(0))),
            Data::B(_) => return Err(cx.site().err("relu is not defined for bool")),
        };
        Ok(vec![x.with(data)])
    }
}

impl OpDef for Gelu {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        float_unary(inputs)
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(8 * out_elements(outputs)?)
    }

    fn mode(&self) -> Option<String> {
        Some(format!("gelu/{}", if self.approximate { "tanh" } else { "erf" }))
    }

    fn modes() -> Vec<String> {
        vec!["gelu/erf".into(), "gelu/tanh".into()]
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let x = x[0];
        let mut run = || -> V<E> {
            let inner = if self.approximate {
                let x2 = g.binary(BinaryOp::Mul, x, x)?;
                let x3 = g.binary(BinaryOp::Mul, x2, x)?;
                let c = g.binary_scalar(BinaryOp::Mul, x3, 0.044715)?;
                let s = g.binary(BinaryOp::Add, x, c)?;
                let k = (2.0 / std::f64::consts::PI).sqrt();
                let a = g.binary_scalar(BinaryOp::Mul, s, k)?;
                g.unary(UnaryOp::Tanh, a)?
            } else {
                let a = g.binary_scalar(BinaryOp::Mul, x, std::f64::consts::FRAC_1_SQRT_2)?;
                g.unary(UnaryOp::Erf, a)?
            };
            let one_plus = g.binary_scalar(BinaryOp::Add, inner, 1.0)?;
            let half_x = g.binary_scalar(BinaryOp::Mul, x, 0.5)?;
            g.binary(BinaryOp::Mul, half_x, one_plus)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let approximate = self.approximate;
        float_map(cx, ins, |x| {
            if approximate {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
            } else {
                0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
            }
        })
    }
}

impl OpDef for Silu {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        float_unary(inputs)
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(4 * out_elements(outputs)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || -> V<E> {
            let s = sigmoid(g, x[0])?;
            g.binary(BinaryOp::Mul, x[0], s)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        float_map(cx, ins, |x| x * sigmoid_f64(x))
    }
}

impl OpDef for Sigmoid {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        float_unary(inputs)
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(4 * out_elements(outputs)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(sigmoid(g, x[0]))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        float_map(cx, ins, sigmoid_f64)
    }
}

fn softmax_rule(axis: usize, inputs: &[TensorType]) -> R {
    arity(inputs, 1)?;
    float(&inputs[0])?;
    check_axes(&[axis], inputs[0].rank())?;
    Ok(vec![inputs[0].clone()])
}

/// `x - max(x)` along `axis`, the shift that keeps `exp` from overflowing.
fn shifted<E: Emitter>(g: &mut E, x: E::Value, axis: usize) -> V<E> {
    let m = g.reduce(ReduceOp::Max, x, vec![axis], true)?;
    g.binary(BinaryOp::Sub, x, m)
}

/// `exp(x - m) / Σ exp(x - m)` with `m = max(x)` along `axis`.
pub(crate) fn softmax<E: Emitter>(g: &mut E, x: E::Value, axis: usize) -> V<E> {
    let z = shifted(g, x, axis)?;
    let e = g.unary(UnaryOp::Exp, z)?;
    let s = g.reduce(ReduceOp::Sum, e, vec![axis], true)?;
    g.binary(BinaryOp::Div, e, s)
}

/// `(x - m) - log Σ exp(x - m)` with `m = max(x)` along `axis`.
pub(crate) fn log_softmax<E: Emitter>(g: &mut E, x: E::Value, axis: usize) -> V<E> {
    let z = shifted(g, x, axis)?;
    let e = g.unary(UnaryOp::Exp, z)?;
    let s = g.reduce(ReduceOp::Sum, e, vec![axis], true)?;
    let l = g.unary(UnaryOp::Log, s)?;
    g.binary(BinaryOp::Sub, z, l)
}

/// Softmax (or log-softmax) of each lane along `axis`, in f64.
pub(crate) fn softmax_f64(a: &ArrayD<f64>, axis: usize, log: bool) -> ArrayD<f64> {
    let mut out = a.clone();
    for mut lane in out.lanes_mut(Axis(axis)) {
        let max = lane.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f64 = lane.iter().map(|&v| (v - max).exp()).sum();
        if log {
            let lse = sum.ln();
            lane.mapv_inplace(|v| v - max - lse);
        } else {
            lane.mapv_inplace(|v| (v - max).exp() / sum);
        }
    }
    out
}

fn softmax_eval(site: &Site, ins: &[&Value], axis: usize, log: bool) -> Res<Vec<Value>> {
    crate::eval::arity(site, ins, &[1])?;
    let a = ins[0].as_f(site, "softmax input")?;
    if axis >= a.ndim() {
        return Err(site.err(format!("axis {axis} out of range for {:?}", a.shape())));
    }
    Ok(vec![Value::float(ins[0].dtype, softmax_f64(a, axis, log))])
}

impl OpDef for Softmax {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        softmax_rule(self.axis, inputs)
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(5 * elements(inputs.first()?)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(softmax(g, x[0], self.axis))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        softmax_eval(cx.site(), ins, self.axis, false)
    }
}

impl OpDef for LogSoftmax {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        softmax_rule(self.axis, inputs)
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(5 * elements(inputs.first()?)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(log_softmax(g, x[0], self.axis))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        softmax_eval(cx.site(), ins, self.axis, true)
    }
}

impl OpDef for Dropout {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        float(&inputs[0])?;
        if !(0.0..1.0).contains(&self.p.0) {
            return Err(format!("dropout p={} must be in [0, 1)", self.p));
        }
        Ok(vec![inputs[0].clone()])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        out_elements(outputs)
    }

    fn mode(&self) -> Option<String> {
        Some(format!("dropout/{}", if self.training { "train" } else { "eval" }))
    }

    fn modes() -> Vec<String> {
        vec!["dropout/train".into(), "dropout/eval".into()]
    }

    /// Keep where a uniform `[0, 1)` draw with the op's seed is `≥ p`, scaling kept values by
    /// `1 / (1 - p)`; in inference the input itself. The draw is made in f64 whatever x's
    /// dtype, so the mask is exactly the shared generator's (a draw rounded to f32 could round
    /// up to `p` and flip an element).
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let (x, p) = (x[0], self.p.0);
        if !self.training {
            return Some(Ok(vec![x]));
        }
        let mut run = || -> V<E> {
            let random = Op::Random(Random {
                dist: RandomDist::Uniform {
                    low: Float(0.0),
                    high: Float(1.0),
                },
                shape: types[0].shape.0.clone(),
                dtype: DType::F64,
                seed: self.seed,
            });
            let u = g.add_op1(random, &[])?;
            let keep = g.binary_scalar(BinaryOp::Ge, u, p)?;
            let scaled = g.binary_scalar(BinaryOp::Div, x, 1.0 - p)?;
            let zero = scalar_like(g, x, 0.0)?;
            select(g, keep, scaled, zero)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[1])?;
        let (x, p) = (ins[0], self.p.0);
        let a = x.as_f(site, "input")?;
        if !(0.0..1.0).contains(&p) {
            return Err(site.err(format!("dropout p={p} must be in [0, 1)")));
        }
        if !self.training {
            return Ok(vec![x.clone()]);
        }
        let flat: Vec<f64> = a
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                if random_stream::uniform(self.seed, i as u64) >= p {
                    v / (1.0 - p)
                } else {
                    0.0
                }
            })
            .collect();
        Ok(vec![x.with(Data::F(crate::eval::array(site, a.shape(), flat)?))])
    }
}
