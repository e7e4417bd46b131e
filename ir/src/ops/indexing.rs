//! Indexing: `gather` along one axis (ONNX Gather) and its transpose `scatter`.
//!
//! Reference semantics: negative indices count from the end; an index outside `[-n, n)` is a
//! runtime error. `scatter(replace)` applies updates in row-major order of `updates`, so with
//! repeated indices the last one wins; `scatter(add)` sums them.

use super::rules::{R, arity, check_axes, check_index, elements, same_dtype};
use super::{Grads, Op, OpDef, OpFamily, VjpArgs, named_enum, op_struct};
use crate::eval::{Data, EvalCx, Res, Site, Value, array};
use crate::text::word_attr;
use crate::{Emitter, Graph, Shape, TensorType};

named_enum!(
    /// How [`Scatter`] combines updates with existing values.
    ScatterReduce {
        /// The last update wins (indices should be unique).
        Replace => "replace",
        /// Updates are summed into the data.
        Add => "add",
    }
);
word_attr!(ScatterReduce);

op_struct! {
    /// `gather(data, indices)` along `axis`: output shape is
    /// `data[..axis] ++ indices ++ data[axis+1..]`; negative indices count from the end.
    Gather "gather" {
        /// The axis indexed.
        axis: usize,
    }
}

op_struct! {
    /// `scatter(data, indices, updates)`, the transpose of [`Gather`]: `updates` has gather's
    /// output shape; each slice is written to (or added into) `data` along `axis`.
    Scatter "scatter" {
        /// The axis indexed.
        axis: usize,
        /// Replace or accumulate.
        reduce: ScatterReduce,
    }
}

/// Gather's output shape.
pub(crate) fn gather_shape(data: &Shape, idx: &Shape, axis: usize) -> Shape {
    let mut s = data.0[..axis].to_vec();
    s.extend(idx.0.iter().cloned());
    s.extend(data.0[axis + 1..].iter().cloned());
    Shape(s)
}

impl OpDef for Gather {
    fn family(&self) -> OpFamily {
        OpFamily::Indexing
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 2)?;
        let (data, idx) = (&inputs[0], &inputs[1]);
        check_index(idx)?;
        check_axes(&[self.axis], data.rank())?;
        Ok(vec![TensorType::new(
            data.dtype,
            gather_shape(&data.shape, &idx.shape, self.axis),
        )])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let zeros = e.full(&e.value_type(a.inputs[0]), 0.0)?;
        let scatter = Op::Scatter(Scatter {
            axis: self.axis,
            reduce: ScatterReduce::Add,
        });
        Ok(vec![Some(e.add_op1(scatter, &[zeros, a.inputs[1], a.g])?), None])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[2])?;
        Ok(vec![gather(cx.site(), ins[0], ins[1], self.axis)?])
    }
}

impl OpDef for Scatter {
    fn family(&self) -> OpFamily {
        OpFamily::Indexing
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 3)?;
        let (data, idx, upd) = (&inputs[0], &inputs[1], &inputs[2]);
        check_index(idx)?;
        check_axes(&[self.axis], data.rank())?;
        same_dtype(data, upd)?;
        let want = gather_shape(&data.shape, &idx.shape, self.axis);
        if upd.shape != want {
            return Err(format!(
                "updates {upd} must have shape {want} (data {data}, indices {idx})"
            ));
        }
        Ok(vec![data.clone()])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        elements(inputs.get(2)?)
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let (idx, g) = (a.inputs[1], a.g);
        let gdata = match self.reduce {
            ScatterReduce::Add => g,
            ScatterReduce::Replace => {
                let zeros = e.full(&e.value_type(a.inputs[2]), 0.0)?;
                e.add_op1(Op::Scatter(self.clone()), &[g, idx, zeros])?
            }
        };
        let gupd = if a.want(2) {
            Some(e.add_op1(Op::Gather(Gather { axis: self.axis }), &[g, idx])?)
        } else {
            None
        };
        Ok(vec![Some(gdata), None, gupd])
    }

    fn mode(&self) -> Option<String> {
        Some(format!("scatter/{}", self.reduce.name()))
    }

    fn modes() -> Vec<String> {
        ScatterReduce::NAMES.iter().map(|r| format!("scatter/{r}")).collect()
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[3])?;
        Ok(vec![scatter(
            cx.site(),
            ins[0],
            ins[1],
            ins[2],
            self.axis,
            self.reduce,
        )?])
    }
}

/// Indices normalized to `[0, n)`.
pub(crate) fn normalize_indices(site: &Site, idx: &Value, n: usize, what: &str) -> Res<Vec<usize>> {
    let a = idx.as_i(site, "indices")?;
    let n_i = n as i64;
    a.iter()
        .map(|&k| {
            let j = if k < 0 { k + n_i } else { k };
            if (0..n_i).contains(&j) {
                Ok(j as usize)
            } else {
                Err(site.err(format!("index {k} is out of range for {what} of size {n}")))
            }
        })
        .collect()
}

/// `(outer, n, inner)` around `axis` of `shape`.
fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

fn gather_flat<T: Clone>(flat: &[T], ks: &[usize], (outer, n, inner): (usize, usize, usize)) -> Vec<T> {
    let mut out = Vec::with_capacity(outer * ks.len() * inner);
    for o in 0..outer {
        for &k in ks {
            let start = (o * n + k) * inner;
            out.extend_from_slice(&flat[start..start + inner]);
        }
    }
    out
}

/// `gather(data, indices)` along `axis` (also used by composites' evaluations).
pub(crate) fn gather(site: &Site, data: &Value, idx: &Value, axis: usize) -> Res<Value> {
    let shape = data.shape().to_vec();
    if axis >= shape.len() {
        return Err(site.err(format!("axis {axis} out of range for {shape:?}")));
    }
    let ks = normalize_indices(site, idx, shape[axis], &format!("axis {axis}"))?;
    let mut out_shape = shape[..axis].to_vec();
    out_shape.extend_from_slice(idx.shape());
    out_shape.extend_from_slice(&shape[axis + 1..]);
    site.check_size(data.dtype, &out_shape, "gathered tensor")?;
    let parts = split(&shape, axis);
    let out = match &data.data {
        Data::F(a) => Data::F(array(
            site,
            &out_shape,
            gather_flat(&a.iter().copied().collect::<Vec<_>>(), &ks, parts),
        )?),
        Data::I(a) => Data::I(array(
            site,
            &out_shape,
            gather_flat(&a.iter().copied().collect::<Vec<_>>(), &ks, parts),
        )?),
        Data::B(a) => Data::B(array(
            site,
            &out_shape,
            gather_flat(&a.iter().copied().collect::<Vec<_>>(), &ks, parts),
        )?),
    };
    Ok(data.with(out))
}

fn scatter_flat<T: Copy>(
    flat: &mut [T],
    upd: &[T],
    ks: &[usize],
    (outer, n, inner): (usize, usize, usize),
    combine: impl Fn(T, T) -> T,
) {
    let mut u = 0;
    for o in 0..outer {
        for &k in ks {
            let start = (o * n + k) * inner;
            for j in 0..inner {
                flat[start + j] = combine(flat[start + j], upd[u]);
                u += 1;
            }
        }
    }
}

/// `scatter(data, indices, updates)` along `axis`.
fn scatter(site: &Site, data: &Value, idx: &Value, upd: &Value, axis: usize, reduce: ScatterReduce) -> Res<Value> {
    let shape = data.shape().to_vec();
    if axis >= shape.len() {
        return Err(site.err(format!("axis {axis} out of range for {shape:?}")));
    }
    let mut want = shape[..axis].to_vec();
    want.extend_from_slice(idx.shape());
    want.extend_from_slice(&shape[axis + 1..]);
    if upd.shape() != want.as_slice() || upd.dtype != data.dtype {
        return Err(site.err(format!(
            "updates {}{:?} must be {}{want:?}",
            upd.dtype,
            upd.shape(),
            data.dtype
        )));
    }
    let ks = normalize_indices(site, idx, shape[axis], &format!("axis {axis}"))?;
    let parts = split(&shape, axis);
    let add = reduce == ScatterReduce::Add;
    let out = match (&data.data, &upd.data) {
        (Data::F(a), Data::F(u)) => {
            let mut flat: Vec<f64> = a.iter().copied().collect();
            let upd: Vec<f64> = u.iter().copied().collect();
            scatter_flat(&mut flat, &upd, &ks, parts, |x, y| if add { x + y } else { y });
            Data::F(array(site, &shape, flat)?)
        }
        (Data::I(a), Data::I(u)) => {
            let mut flat: Vec<i64> = a.iter().copied().collect();
            let upd: Vec<i64> = u.iter().copied().collect();
            scatter_flat(
                &mut flat,
                &upd,
                &ks,
                parts,
                |x, y| if add { x.wrapping_add(y) } else { y },
            );
            Data::I(array(site, &shape, flat)?)
        }
        (Data::B(a), Data::B(u)) => {
            // Adding bools is logical or.
            let mut flat: Vec<bool> = a.iter().copied().collect();
            let upd: Vec<bool> = u.iter().copied().collect();
            scatter_flat(&mut flat, &upd, &ks, parts, |x, y| if add { x | y } else { y });
            Data::B(array(site, &shape, flat)?)
        }
        _ => return Err(site.err("data and updates have different dtypes")),
    };
    Ok(data.with(out))
}
