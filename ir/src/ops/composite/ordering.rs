//! Ordering: `topk` (PyTorch `topk`, ONNX TopK) and `argsort`, both a `sort` and a slice; `flip`
//! (PyTorch `flip`), a gather with reversed indices per axis.

use super::super::rules::{R, arity, check_axes, elements};
use super::super::sample::{Domain, Sample, input, input_in};
use super::{V, composite_def, iota, one, slice};
use crate::eval::{Data, EvalCx, Res, Value};
use crate::ops::{BinaryOp, Composite, Gather, OpDef, SliceRange, Sort, op_struct};
use crate::{DType, Dim, Emitter, Graph, Op, TensorData, TensorType};
use ndarray::{ArrayD, Axis};

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

op_struct! {
    /// `flip(x)`: the elements in reverse order along each of `axes` (sorted, distinct).
    Flip "flip" {
        /// The axes to reverse.
        axes: Vec<usize>,
    }
}

impl OpDef for Flip {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        check_axes(&self.axes, x.rank())?;
        for &a in &self.axes {
            if x.shape.0[a].as_static().is_none() {
                return Err(format!("flip needs a static axis {a}, got {x}"));
            }
        }
        Ok(vec![x.clone()])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    /// One gather per axis of size > 1, with the indices `n-1, …, 0` built from an iota.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || -> V<E> {
            let mut y = x[0];
            for &axis in &self.axes {
                let n = types[0].shape.0[axis].as_static().unwrap_or(1);
                if n <= 1 {
                    continue;
                }
                let iota = iota(g, vec![Dim::Static(n)], 0, DType::I64)?;
                let last = g.add_constant(TensorData::scalar((n - 1) as i64))?;
                let idx = g.binary(BinaryOp::Sub, last, iota)?;
                y = g.add_op1(Op::Gather(Gather { axis }), &[y, idx])?;
            }
            Ok(y)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[1])?;
        let x = ins[0];
        if let Some(a) = self.axes.iter().find(|&&a| a >= x.shape().len()) {
            return Err(site.err(format!("flip axis {a} out of range for {:?}", x.shape())));
        }
        fn flip<T: Clone>(a: &ArrayD<T>, axes: &[usize]) -> ArrayD<T> {
            let mut v = a.view();
            for &ax in axes {
                v.invert_axis(Axis(ax));
            }
            v.to_owned()
        }
        let data = match &x.data {
            Data::F(a) => Data::F(flip(a, &self.axes)),
            Data::I(a) => Data::I(flip(a, &self.axes)),
            Data::B(a) => Data::B(flip(a, &self.axes)),
        };
        Ok(vec![x.with(data)])
    }

    fn samples() -> Vec<Sample> {
        let op = |axes: &[usize]| Op::Composite(Composite::Flip(Flip { axes: axes.to_vec() }));
        vec![
            Sample::new("flip/f32/last", op(&[2]), vec![input(DType::F32, &[2, 3, 5])]),
            Sample::new("flip/f64/two_axes", op(&[0, 1]), vec![input(DType::F64, &[4, 3, 2])]),
            Sample::new(
                "flip/i32/unit_axis",
                op(&[0, 1]),
                vec![input_in(DType::I32, &[1, 6], Domain::Ints(-9, 9))],
            )
            .no_grad(),
            Sample::new("flip/bool", op(&[0]), vec![input(DType::Bool, &[5, 2])]).no_grad(),
        ]
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
