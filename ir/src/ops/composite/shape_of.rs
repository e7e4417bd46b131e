//! `shape_of`: a tensor's shape as an `i64[rank]` tensor (ONNX `Shape`, Paddle `paddle.shape`).
//! Symbolic dims are known only when the graph runs; the decomposition counts each one by
//! summing ones of that size, so every backend computes it, and once shapes are bound it
//! folds to a constant.

use super::super::rules::{R, arity};
use super::super::sample::{Sample, input};
use super::{V, composite_def, one};
use crate::eval::{EvalCx, Res, Value};
use crate::ops::{Broadcast, Composite, OpDef, ReduceOp, op_struct};
use crate::{DType, Dim, Emitter, Graph, Op, TensorData, TensorType};
use ndarray::{ArrayD, IxDyn};

op_struct! {
    /// The input's shape as `i64[rank]`.
    ShapeOf "shape_of"
}

impl OpDef for ShapeOf {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        Ok(vec![TensorType::of(DType::I64, &[inputs[0].rank()])])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        _: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let dims = types[0].shape.0.clone();
        let mut run = || -> V<E> {
            let ints = |v: Vec<i64>| {
                TensorData::from_vec(vec![v.len()], v).map_err(|e| crate::IrError::Type {
                    op: "shape_of".into(),
                    value: "<new>".into(),
                    detail: e.to_string(),
                })
            };
            if let Some(sizes) = types[0].shape.as_static() {
                return g.add_constant(ints(sizes.iter().map(|&d| d as i64).collect())?);
            }
            let mut parts = Vec::with_capacity(dims.len());
            for d in &dims {
                let part = match d {
                    Dim::Static(n) => g.add_constant(ints(vec![*n as i64])?)?,
                    _ => {
                        let one = g.add_scalar(DType::I64, 1.0)?;
                        let ones = g.add_op1(Op::Broadcast(Broadcast { shape: vec![d.clone()] }), &[one])?;
                        g.reduce(ReduceOp::Sum, ones, vec![0], true)?
                    }
                };
                parts.push(part);
            }
            g.add_op1(Op::Concat(crate::ops::Concat { axis: 0 }), &parts)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        let s: Vec<i64> = ins[0].shape().iter().map(|&d| d as i64).collect();
        let a = ArrayD::from_shape_vec(IxDyn(&[s.len()]), s).map_err(|e| cx.site().err(e.to_string()))?;
        Ok(vec![Value::int(DType::I64, a)])
    }

    fn samples() -> Vec<Sample> {
        vec![
            Sample::new(
                "shape_of/f32",
                Op::Composite(Composite::ShapeOf),
                vec![input(DType::F32, &[3, 1, 4])],
            )
            .no_grad(),
        ]
    }
}
