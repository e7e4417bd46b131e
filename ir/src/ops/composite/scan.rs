//! `cumsum`: running sums along an axis (PyTorch `cumsum`, ONNX CumSum with `exclusive` and
//! `reverse`). Decomposition: the log-step (Hillis–Steele) scan, `⌈log₂ n⌉` rounds of
//! "shift by 2^k and add" built from slice, pad and add, so every backend runs it and its
//! gradient (a reverse cumsum) follows from theirs.

use super::super::rules::{R, arity, check_axes, elements};
use super::super::sample::{Domain, Sample, input, input_in};
use super::{V, composite_def, one, slice};
use crate::eval::{Data, EvalCx, Res, Value};
use crate::ops::{BinaryOp, Composite, Float, OpDef, Pad, SliceRange, op_struct};
use crate::{DType, Emitter, Graph, Op, TensorType};
use ndarray::{ArrayD, Axis};

op_struct! {
    /// `cumsum(x)` along `axis`; `exclusive` leaves the element itself out, `reverse` sums
    /// from the end.
    CumSum "cumsum" {
        /// The axis.
        axis: usize,
        /// Sum of the elements strictly before (after, with `reverse`) each one.
        exclusive: bool,
        /// Sum from the end of the axis.
        reverse: bool,
    }
}

/// `y` shifted by `d` along `axis` of length `n`, zeros entering: toward the end (a forward
/// scan) or toward the start (`reverse`).
fn shift<E: Emitter>(g: &mut E, y: E::Value, axis: usize, n: usize, d: usize, reverse: bool) -> V<E> {
    let rank = g.value_type(y).rank();
    let mut ranges = vec![SliceRange::FULL; rank];
    ranges[axis] = if reverse {
        SliceRange::new(d as i64, n as i64)
    } else {
        SliceRange::new(0, (n - d) as i64)
    };
    let kept = slice(g, y, ranges)?;
    let (mut before, mut after) = (vec![0; rank], vec![0; rank]);
    if reverse {
        after[axis] = d;
    } else {
        before[axis] = d;
    }
    g.add_op1(
        Op::Pad(Pad {
            before,
            after,
            value: Float(0.0),
        }),
        &[kept],
    )
}

impl OpDef for CumSum {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        if !x.dtype.is_numeric() {
            return Err(format!("cumsum is not defined for {x}"));
        }
        check_axes(&[self.axis], x.rank())?;
        if x.shape.0[self.axis].as_static().is_none() {
            return Err(format!("cumsum needs a static axis {}, got {x}", self.axis));
        }
        Ok(vec![x.clone()])
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
        let n = types[0].shape.0[self.axis].as_static().unwrap_or(0);
        let mut run = || -> V<E> {
            let mut y = x[0];
            let mut d = 1;
            while d < n {
                let s = shift(g, y, self.axis, n, d, self.reverse)?;
                y = g.binary(BinaryOp::Add, y, s)?;
                d *= 2;
            }
            if self.exclusive && n > 0 {
                y = shift(g, y, self.axis, n, 1, self.reverse)?;
            }
            Ok(y)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[1])?;
        let x = ins[0];
        if self.axis >= x.shape().len() {
            return Err(site.err(format!("axis {} out of range for {:?}", self.axis, x.shape())));
        }
        fn scan<T: Copy>(a: &ArrayD<T>, axis: usize, zero: T, add: impl Fn(T, T) -> T, c: &CumSum) -> ArrayD<T> {
            let mut out = a.clone();
            for mut lane in out.lanes_mut(Axis(axis)) {
                let n = lane.len();
                let mut acc = zero;
                for k in 0..n {
                    let i = if c.reverse { n - 1 - k } else { k };
                    let v = lane[i];
                    if c.exclusive {
                        lane[i] = acc;
                        acc = add(acc, v);
                    } else {
                        acc = add(acc, v);
                        lane[i] = acc;
                    }
                }
            }
            out
        }
        let data = match &x.data {
            Data::F(a) => Data::F(scan(a, self.axis, 0.0, |p, q| p + q, self)),
            Data::I(a) => Data::I(scan(a, self.axis, 0, i64::wrapping_add, self)),
            Data::B(_) => return Err(site.err("cumsum is not defined for bool")),
        };
        Ok(vec![x.with(data)])
    }

    fn samples() -> Vec<Sample> {
        let cs = |axis, exclusive, reverse| {
            Op::Composite(Composite::CumSum(CumSum {
                axis,
                exclusive,
                reverse,
            }))
        };
        vec![
            Sample::new(
                "cumsum/f32/axis1",
                cs(1, false, false),
                vec![input(DType::F32, &[3, 7, 2])],
            ),
            Sample::new(
                "cumsum/f64/exclusive_reverse",
                cs(0, true, true),
                vec![input(DType::F64, &[9, 2])],
            ),
            Sample::new(
                "cumsum/i32/reverse",
                cs(1, false, true),
                vec![input_in(DType::I32, &[2, 5], Domain::Ints(-20, 20))],
            )
            .no_grad(),
        ]
    }
}
