//! `sort`: the values of each lane along an axis in order, and where each came from — the
//! primitive under `topk` and `argsort`. Stable (equal elements keep their order, descending
//! too); NaN sorts as the largest value (numpy, PyTorch). Backends without a sorting kernel run
//! it as an opaque kernel on the reference evaluation.

use super::rules::{R, arity, check_axes, elements};
use super::sample::{Domain, Sample, input, input_in};
use super::{Grads, Iota, Op, OpDef, OpFamily, Scatter, ScatterReduce, VjpArgs, op_struct};
use crate::eval::{Data, EvalCx, Res, Value};
use crate::{DType, Dim, Emitter, Graph, IrError, Shape, TensorType};
use ndarray::{ArrayD, Axis};
use std::cmp::Ordering;

op_struct! {
    /// `sort(x) -> (values, indices i64)` along `axis`, stable, ascending or descending.
    Sort "sort" {
        /// The axis sorted.
        axis: usize,
        /// Largest first.
        descending: bool,
    }
}

/// The total order sort uses: NaN above everything.
fn order(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).expect("not NaN"),
    }
}

impl Sort {
    /// The permutation sorting `lane` (stable).
    pub fn permutation(&self, lane: &[f64]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..lane.len()).collect();
        if self.descending {
            idx.sort_by(|&i, &j| order(lane[j], lane[i]));
        } else {
            idx.sort_by(|&i, &j| order(lane[i], lane[j]));
        }
        idx
    }

    /// [`Sort::permutation`] for integers and booleans (as 0/1).
    pub fn permutation_int(&self, lane: &[i64]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..lane.len()).collect();
        if self.descending {
            idx.sort_by(|&i, &j| lane[j].cmp(&lane[i]));
        } else {
            idx.sort_by_key(|&i| lane[i]);
        }
        idx
    }
}

/// `x` with `axis` moved last and flattened with the rest: `[R·n]`, plus R and n (static).
fn static_dims(t: &TensorType) -> Result<Vec<usize>, IrError> {
    t.shape.as_static().ok_or_else(|| IrError::Type {
        op: "sort".into(),
        value: "<vjp>".into(),
        detail: format!("the gradient of sort needs a static shape, got {t}"),
    })
}

impl OpDef for Sort {
    fn family(&self) -> OpFamily {
        OpFamily::Indexing
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        check_axes(&[self.axis], x.rank())?;
        Ok(vec![x.clone(), TensorType::new(DType::I64, x.shape.clone())])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        let x = inputs.first()?;
        let n = x.shape.0.get(self.axis)?.as_static()? as u64;
        Some(elements(x)? * (64 - n.max(1).leading_zeros() as u64))
    }

    /// The values' cotangent goes back where each value came from: with the axis moved last
    /// and every lane laid end to end, a scatter to `index + lane · n`.
    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let (x, idx, g) = (a.inputs[0], a.outputs[1], a.g);
        let xt = e.value_type(x);
        if !xt.dtype.is_float() {
            return Ok(a.none());
        }
        let dims = static_dims(&xt)?;
        let rank = dims.len();
        let n = dims[self.axis];
        let total: usize = dims.iter().product();
        let mut perm: Vec<usize> = (0..rank).filter(|&i| i != self.axis).collect();
        perm.push(self.axis);
        let lanes = Shape(vec![Dim::Static(total / n.max(1)), Dim::Static(n)]);
        let flat = Shape(vec![Dim::Static(total)]);
        let to_lanes = |e: &mut E, v: E::Value| -> Result<E::Value, E::Error> {
            let p = e.permute(v, perm.clone())?;
            e.reshape(p, &lanes)
        };
        let idx_l = to_lanes(e, idx)?;
        let rows = e.add_op1(
            Op::Iota(Iota {
                shape: lanes.0.clone(),
                axis: 0,
                dtype: DType::I64,
            }),
            &[],
        )?;
        let base = e.binary_scalar(super::BinaryOp::Mul, rows, n as f64)?;
        let pos = e.binary(super::BinaryOp::Add, idx_l, base)?;
        let pos = e.reshape(pos, &flat)?;
        let g_l = to_lanes(e, g)?;
        let g_flat = e.reshape(g_l, &flat)?;
        let zeros = e.full(&TensorType::new(xt.dtype, flat.clone()), 0.0)?;
        let scatter = Op::Scatter(Scatter {
            axis: 0,
            reduce: ScatterReduce::Add,
        });
        let gx = e.add_op1(scatter, &[zeros, pos, g_flat])?;
        let moved: Vec<Dim> = perm.iter().map(|&i| Dim::Static(dims[i])).collect();
        let gx = e.reshape(gx, &Shape(moved))?;
        let mut inv = vec![0; rank];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        Ok(vec![Some(e.permute(gx, inv)?)])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[1])?;
        let x = ins[0];
        let axis = self.axis;
        if axis >= x.shape().len() {
            return Err(site.err(format!("axis {axis} out of range for {:?}", x.shape())));
        }
        /// Sort every lane of `a` along `axis` by the permutation `perm` gives: values and
        /// source indices.
        fn lanes<T: Clone>(a: &ArrayD<T>, axis: usize, perm: impl Fn(&[T]) -> Vec<usize>) -> (ArrayD<T>, ArrayD<i64>) {
            let mut values = a.clone();
            let mut indices = ArrayD::<i64>::zeros(a.raw_dim());
            let dst = values
                .lanes_mut(Axis(axis))
                .into_iter()
                .zip(indices.lanes_mut(Axis(axis)));
            for (src, (mut v, mut ix)) in a.lanes(Axis(axis)).into_iter().zip(dst) {
                let lane: Vec<T> = src.iter().cloned().collect();
                for (k, i) in perm(&lane).into_iter().enumerate() {
                    v[k] = lane[i].clone();
                    ix[k] = i as i64;
                }
            }
            (values, indices)
        }
        let (values, indices) = match &x.data {
            Data::F(a) => {
                let (v, i) = lanes(a, axis, |l| self.permutation(l));
                (Data::F(v), i)
            }
            Data::I(a) => {
                let (v, i) = lanes(a, axis, |l| self.permutation_int(l));
                (Data::I(v), i)
            }
            Data::B(a) => {
                let (v, i) = lanes(a, axis, |l| {
                    self.permutation_int(&l.iter().map(|&b| i64::from(b)).collect::<Vec<_>>())
                });
                (Data::B(v), i)
            }
        };
        Ok(vec![x.with(values), Value::int(DType::I64, indices)])
    }

    fn samples() -> Vec<Sample> {
        let op = |axis, descending| Op::Sort(Sort { axis, descending });
        vec![
            Sample::new(
                "sort/f32/ties_nan",
                op(1, false),
                vec![input_in(
                    DType::F32,
                    &[3, 6],
                    Domain::WithSpecials(vec![f64::NAN, 0.5, 0.5, -0.0, 0.0], Box::new(Domain::standard())),
                )],
            )
            .no_grad(),
            Sample::new(
                "sort/f64/descending_axis0",
                op(0, true),
                vec![input(DType::F64, &[5, 3])],
            ),
            Sample::new(
                "sort/i64/descending_ties",
                op(1, true),
                vec![input_in(DType::I64, &[2, 7], Domain::Ints(-3, 3))],
            )
            .no_grad(),
        ]
    }
}
