//! Ordering: `topk` (PyTorch `topk`, ONNX TopK) and `argsort`, both a `sort` and a slice.

use super::super::rules::{R, arity, check_axes, elements};
use super::super::sample::{Domain, Sample, input, input_in};
use super::{composite_def, slice};
use crate::eval::{EvalCx, Res, Value};
use crate::ops::{Composite, OpDef, SliceRange, Sort, op_struct};
use crate::{DType, Dim, Emitter, Graph, Op, TensorType};

op_struct! {
    /// `topk(x) -> (values, indices i64)`: the `k` largest (or smallest) elements along `axis`,
    /// in order (ties: the earlier element first).
    TopK "topk" {
        /// How many.
        k: usize,
        /// The axis.
        axis: usize,
        /// Largest (true) or smallest (false).
        largest: bool,
    }
}

op_struct! {
    /// `argsort(x) -> indices i64`: where each element of the sorted lane comes from (stable).
    ArgSort "argsort" {
        /// The axis.
        axis: usize,
        /// Largest first.
        descending: bool,
    }
}

impl OpDef for TopK {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        check_axes(&[self.axis], x.rank())?;
        match x.shape.0[self.axis].as_static() {
            Some(n) if self.k <= n => {}
            _ => {
                return Err(format!(
                    "topk k={} needs a static axis {} of at least k, got {x}",
                    self.k, self.axis
                ));
            }
        }
        let mut shape = x.shape.0.clone();
        shape[self.axis] = Dim::Static(self.k);
        Ok(vec![
            TensorType::new(x.dtype, shape.clone()),
            TensorType::new(DType::I64, shape),
        ])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        elements(inputs.first()?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || -> Result<Vec<E::Value>, E::Error> {
            let sort = Op::Sort(Sort {
                axis: self.axis,
                descending: self.largest,
            });
            let sorted = g.add_op(sort, &[x[0]])?;
            let mut ranges = vec![SliceRange::FULL; types[0].rank()];
            ranges[self.axis] = SliceRange::new(0, self.k as i64);
            let v = slice(g, sorted[0], ranges.clone())?;
            let i = slice(g, sorted[1], ranges)?;
            Ok(vec![v, i])
        };
        Some(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let sort = Sort {
            axis: self.axis,
            descending: self.largest,
        };
        let sorted = sort.eval(cx, ins)?;
        let take = |v: &Value| {
            crate::ops::movement::slice(
                cx.site(),
                v,
                &(0..v.shape().len())
                    .map(|a| {
                        if a == self.axis {
                            SliceRange::new(0, self.k as i64)
                        } else {
                            SliceRange::FULL
                        }
                    })
                    .collect::<Vec<_>>(),
            )
        };
        Ok(vec![take(&sorted[0])?, take(&sorted[1])?])
    }

    fn samples() -> Vec<Sample> {
        let op = |k, axis, largest| Op::Composite(Composite::TopK(TopK { k, axis, largest }));
        vec![
            Sample::new("topk/f32/largest", op(3, 1, true), vec![input(DType::F32, &[4, 7])]),
            Sample::new(
                "topk/f64/smallest_axis0",
                op(2, 0, false),
                vec![input(DType::F64, &[5, 3])],
            ),
            Sample::new(
                "topk/i32/ties",
                op(4, 1, true),
                vec![input_in(DType::I32, &[3, 6], Domain::Ints(-2, 2))],
            )
            .no_grad(),
        ]
    }
}

impl OpDef for ArgSort {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        check_axes(&[self.axis], x.rank())?;
        Ok(vec![TensorType::new(DType::I64, x.shape.clone())])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        elements(inputs.first()?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let sort = Op::Sort(Sort {
            axis: self.axis,
            descending: self.descending,
        });
        Some(g.add_op(sort, &[x[0]]).map(|outs| vec![outs[1]]))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let sort = Sort {
            axis: self.axis,
            descending: self.descending,
        };
        let mut sorted = sort.eval(cx, ins)?;
        Ok(vec![sorted.remove(1)])
    }

    fn samples() -> Vec<Sample> {
        let op = |axis, descending| Op::Composite(Composite::ArgSort(ArgSort { axis, descending }));
        vec![
            Sample::new("argsort/f32", op(0, false), vec![input(DType::F32, &[6, 2])]).no_grad(),
            Sample::new(
                "argsort/i64/descending",
                op(1, true),
                vec![input_in(DType::I64, &[2, 5], Domain::Ints(-3, 3))],
            )
            .no_grad(),
        ]
    }
}
