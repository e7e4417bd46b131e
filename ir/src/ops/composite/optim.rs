//! Optimizer updates as ops, so a static training step keeps each parameter's update whole: a
//! backend runs it as one pass over the parameter, its gradient and its state instead of a
//! chain of elementwise kernels (and the bias corrections, one-element values, once).

use super::super::rules::{R, arity, elements, float, same_dtype};
use super::super::sample::{Domain, Sample, input, input_in};
use super::{V, composite_def};
use crate::eval::{EvalCx, Res, Value};
use crate::ops::{BinaryOp, Float, OpDef, UnaryOp, op_struct};
use crate::{DType, Emitter, Graph, Op, TensorType};

op_struct! {
    /// One Adam / AdamW step with PyTorch's bias correction:
    /// `adam_update(p, g, m, v, lr, step) -> (p', m', v')` with
    /// `m' = β₁ m + (1 - β₁) g`, `v' = β₂ v + (1 - β₂) g²` and
    /// `p' = p (1 - lr · weight_decay) - lr / (1 - β₁^step) · m' / (√v' / √(1 - β₂^step) + ε)`
    /// (`weight_decay` is AdamW's decoupled decay; 0 for Adam). `p g m v` share one float type;
    /// `lr` and `step` (this update's number, from 1) are scalars of that dtype.
    AdamUpdate "adam_update" {
        /// Decay of the first moment.
        beta1: Float,
        /// Decay of the second moment.
        beta2: Float,
        /// Added to the denominator.
        epsilon: Float,
        /// Decoupled weight decay (AdamW's coefficient).
        weight_decay: Float,
    }
}

impl AdamUpdate {
    /// `(p', m', v')` of one element, and the per-call constants: the definition in f64.
    fn element(&self, k: &AdamConstants, p: f64, g: f64, m: f64, v: f64) -> (f64, f64, f64) {
        let (b1, b2) = (self.beta1.0, self.beta2.0);
        let m = b1 * m + (1.0 - b1) * g;
        let v = b2 * v + (1.0 - b2) * g * g;
        let p = p * k.decay - k.step_size * m / (v.sqrt() / k.bc2_sqrt + self.epsilon.0);
        (p, m, v)
    }

    /// The constants of one call: bias corrections from `lr` and `step`.
    pub fn constants(&self, lr: f64, step: f64) -> AdamConstants {
        AdamConstants {
            step_size: lr / (1.0 - self.beta1.0.powf(step)),
            bc2_sqrt: (1.0 - self.beta2.0.powf(step)).sqrt(),
            decay: 1.0 - lr * self.weight_decay.0,
        }
    }
}

/// What one [`AdamUpdate`] call computes once for every element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConstants {
    /// `lr / (1 - β₁^step)`
    pub step_size: f64,
    /// `√(1 - β₂^step)`
    pub bc2_sqrt: f64,
    /// `1 - lr · weight_decay`
    pub decay: f64,
}

impl OpDef for AdamUpdate {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 6)?;
        let p = &inputs[0];
        float(p)?;
        for (t, what) in inputs[1..4].iter().zip(["gradient", "first moment", "second moment"]) {
            if t != p {
                return Err(format!(
                    "adam_update: the {what} is {t}, the parameter {p} (they must match)"
                ));
            }
        }
        for (t, what) in inputs[4..].iter().zip(["learning rate", "step"]) {
            same_dtype(p, t)?;
            if t.rank() != 0 {
                return Err(format!("adam_update: the {what} must be a scalar, got {t}"));
            }
        }
        Ok(vec![p.clone(), p.clone(), p.clone()])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(12 * elements(inputs.first()?)?)
    }

    /// The update as elementwise ops (what a static training step recorded before this op).
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || -> Result<Vec<E::Value>, E::Error> {
            let (p, gr, m, v, lr, step) = (x[0], x[1], x[2], x[3], x[4], x[5]);
            let dt = types[0].dtype;
            // 1 - β^step
            let correction = |g: &mut E, beta: f64| -> V<E> {
                let b = g.add_scalar(dt, beta)?;
                let bp = g.binary(BinaryOp::Pow, b, step)?;
                let neg = g.binary_scalar(BinaryOp::Mul, bp, -1.0)?;
                g.binary_scalar(BinaryOp::Add, neg, 1.0)
            };
            let bc1 = correction(g, self.beta1.0)?;
            let bc2 = correction(g, self.beta2.0)?;
            let bc2_sqrt = g.unary(UnaryOp::Sqrt, bc2)?;
            let p = if self.weight_decay.0 != 0.0 {
                let f = g.binary_scalar(BinaryOp::Mul, lr, -self.weight_decay.0)?;
                let f = g.binary_scalar(BinaryOp::Add, f, 1.0)?;
                g.binary(BinaryOp::Mul, p, f)?
            } else {
                p
            };
            let m_old = g.binary_scalar(BinaryOp::Mul, m, self.beta1.0)?;
            let m_new = g.binary_scalar(BinaryOp::Mul, gr, 1.0 - self.beta1.0)?;
            let m = g.binary(BinaryOp::Add, m_old, m_new)?;
            let v_old = g.binary_scalar(BinaryOp::Mul, v, self.beta2.0)?;
            let g2 = g.binary(BinaryOp::Mul, gr, gr)?;
            let v_new = g.binary_scalar(BinaryOp::Mul, g2, 1.0 - self.beta2.0)?;
            let v = g.binary(BinaryOp::Add, v_old, v_new)?;
            let root = g.unary(UnaryOp::Sqrt, v)?;
            let scaled = g.binary(BinaryOp::Div, root, bc2_sqrt)?;
            let denom = g.binary_scalar(BinaryOp::Add, scaled, self.epsilon.0)?;
            let step_size = g.binary(BinaryOp::Div, lr, bc1)?;
            let step = g.binary(BinaryOp::Mul, step_size, m)?;
            let delta = g.binary(BinaryOp::Div, step, denom)?;
            let p = g.binary(BinaryOp::Sub, p, delta)?;
            Ok(vec![p, m, v])
        };
        Some(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[6])?;
        let names = [
            "parameter",
            "gradient",
            "first moment",
            "second moment",
            "learning rate",
            "step",
        ];
        let a: Vec<_> = ins
            .iter()
            .zip(names)
            .map(|(v, what)| v.as_f(site, what))
            .collect::<Res<_>>()?;
        let scalar = |i: usize| {
            a[i].iter()
                .next()
                .copied()
                .ok_or_else(|| site.err(format!("the {} is empty", names[i])))
        };
        for i in 1..4 {
            if a[i].shape() != a[0].shape() {
                return Err(site.err(format!(
                    "the {} has shape {:?}, the parameter {:?}",
                    names[i],
                    a[i].shape(),
                    a[0].shape()
                )));
            }
        }
        let k = self.constants(scalar(4)?, scalar(5)?);
        let (mut p, mut m, mut v) = (a[0].clone(), a[2].clone(), a[3].clone());
        ndarray::Zip::from(&mut p)
            .and(&mut m)
            .and(&mut v)
            .and(a[1])
            .for_each(|p, m, v, &g| (*p, *m, *v) = self.element(&k, *p, g, *m, *v));
        let out = |x| ins[0].with(crate::eval::Data::F(x));
        Ok(vec![out(p), out(m), out(v)])
    }

    fn samples() -> Vec<Sample> {
        let adam = |wd: f64| {
            Op::Composite(super::Composite::AdamUpdate(AdamUpdate {
                beta1: Float(0.9),
                beta2: Float(0.999),
                epsilon: Float(1e-8),
                weight_decay: Float(wd),
            }))
        };
        let operands = |dt: DType, shape: &[usize], step: f64| {
            vec![
                input(dt, shape),
                input(dt, shape),
                input_in(dt, shape, Domain::Range(-0.1, 0.1)),
                input_in(dt, shape, Domain::Range(0.0, 0.01)),
                input_in(dt, &[], Domain::Values(vec![0.01])),
                input_in(dt, &[], Domain::Values(vec![step])),
            ]
        };
        vec![
            Sample::new("adam_update/f32/adamw", adam(0.01), operands(DType::F32, &[3, 5], 3.0)).no_grad(),
            Sample::new(
                "adam_update/f32/first_step",
                adam(0.0),
                operands(DType::F32, &[37], 1.0),
            )
            .no_grad(),
            Sample::new("adam_update/f64", adam(0.1), operands(DType::F64, &[2, 3, 4], 10.0)).no_grad(),
        ]
    }
}
