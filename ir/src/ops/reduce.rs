//! Reductions (`reduce_sum/max/min/prod/mean` over axes) and arg-reductions (`argmax`,
//! `argmin` along one axis, first occurrence).
//!
//! Reference semantics: float max/min propagate NaN; argmax/argmin treat NaN as the extremum
//! and return the first NaN (numpy). Integer sum/prod wrap. Sum of nothing is 0, product 1,
//! mean NaN; max/min of nothing is an error (numpy: "zero-size array ... has no identity").

use super::rules::{R, arity, check_axes, elements};
use super::{BinaryOp, Grads, OpDef, OpFamily, OpText, VjpArgs, named_enum};
use crate::eval::{Data, EvalCx, Res, Site, Value, array};
use crate::text::{Attrs, ParseError};
use crate::{DType, Dim, Emitter, Graph, Shape, TensorType};
use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};

named_enum!(
    /// Reductions.
    ReduceOp {
        /// sum
        Sum => "reduce_sum",
        /// max
        Max => "reduce_max",
        /// min
        Min => "reduce_min",
        /// product
        Prod => "reduce_prod",
        /// arithmetic mean (floats only)
        Mean => "reduce_mean",
    }
);

named_enum!(
    /// Index-of-extremum reductions.
    ArgReduceOp {
        /// index of the max
        ArgMax => "argmax",
        /// index of the min
        ArgMin => "argmin",
    }
);

impl ReduceOp {
    /// The value a reduction of nothing starts from in `dtype` (what every code generator
    /// initializes its accumulator with): 0 for sum and mean, 1 for prod, the dtype's lowest
    /// value for max and its highest for min.
    pub fn identity(self, dtype: DType) -> f64 {
        match self {
            ReduceOp::Sum | ReduceOp::Mean => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Max => dtype.lowest(),
            ReduceOp::Min => dtype.highest(),
        }
    }
}

/// Reduction over `axes` (sorted, unique).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reduce {
    /// Which reduction.
    pub op: ReduceOp,
    /// Axes reduced.
    pub axes: Vec<usize>,
    /// Keep reduced axes as size 1.
    pub keepdim: bool,
}

/// Index of the max/min along one axis (first occurrence), as i64.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArgReduce {
    /// ArgMax or ArgMin.
    pub op: ArgReduceOp,
    /// Axis reduced.
    pub axis: usize,
    /// Keep the axis as size 1.
    pub keepdim: bool,
}

impl OpText for Reduce {
    fn mnemonics() -> &'static [&'static str] {
        ReduceOp::NAMES
    }
    fn name(&self) -> &'static str {
        self.op.name()
    }
    fn print_attrs(&self) -> Vec<(&'static str, String)> {
        use crate::text::AttrValue;
        vec![
            ("axes", self.axes.print().unwrap_or_default()),
            ("keepdim", self.keepdim.to_string()),
        ]
    }
    fn parse(name: &str, attrs: &mut Attrs, _: &[TensorType]) -> Result<Self, ParseError> {
        Ok(Reduce {
            op: ReduceOp::from_name(name).ok_or_else(|| attrs.here(crate::text::unknown_op(name)))?,
            axes: attrs.get("axes")?,
            keepdim: attrs.get("keepdim")?,
        })
    }
}

impl OpText for ArgReduce {
    fn mnemonics() -> &'static [&'static str] {
        ArgReduceOp::NAMES
    }
    fn name(&self) -> &'static str {
        self.op.name()
    }
    fn print_attrs(&self) -> Vec<(&'static str, String)> {
        vec![("axis", self.axis.to_string()), ("keepdim", self.keepdim.to_string())]
    }
    fn parse(name: &str, attrs: &mut Attrs, _: &[TensorType]) -> Result<Self, ParseError> {
        Ok(ArgReduce {
            op: ArgReduceOp::from_name(name).ok_or_else(|| attrs.here(crate::text::unknown_op(name)))?,
            axis: attrs.get("axis")?,
            keepdim: attrs.get("keepdim")?,
        })
    }
}

/// The shape of `s` reduced over `axes`.
pub(crate) fn reduce_shape(s: &Shape, axes: &[usize], keepdim: bool) -> Shape {
    let mut out = Vec::new();
    for (i, d) in s.0.iter().enumerate() {
        if !axes.contains(&i) {
            out.push(d.clone());
        } else if keepdim {
            out.push(Dim::Static(1));
        }
    }
    Shape(out)
}

impl OpDef for Reduce {
    fn family(&self) -> OpFamily {
        OpFamily::Reduction
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        if !x.dtype.is_numeric() || (self.op == ReduceOp::Mean && !x.dtype.is_float()) {
            return Err(format!("{} is not defined for {x}", self.op.name()));
        }
        check_axes(&self.axes, x.rank())?;
        Ok(vec![TensorType::new(
            x.dtype,
            reduce_shape(&x.shape, &self.axes, self.keepdim),
        )])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        elements(inputs.first()?)
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        Ok(vec![Some(reduce_vjp(
            e,
            self.op,
            &self.axes,
            a.inputs[0],
            a.outputs[0],
            a.g,
        )?)])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        Ok(vec![reduce(cx.site(), self.op, ins[0], &self.axes, self.keepdim)?])
    }
}

impl OpDef for ArgReduce {
    fn family(&self) -> OpFamily {
        OpFamily::Reduction
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        check_axes(&[self.axis], x.rank())?;
        if x.shape.0[self.axis] == Dim::Static(0) {
            return Err(format!("axis {} of {x} is empty", self.axis));
        }
        Ok(vec![TensorType::new(
            DType::I64,
            reduce_shape(&x.shape, &[self.axis], self.keepdim),
        )])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        elements(inputs.first()?)
    }

    fn vjp<E: Emitter>(&self, _: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        Ok(a.none())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        Ok(vec![arg_reduce(cx.site(), self.op, ins[0], self.axis, self.keepdim)?])
    }
}

/// Shape of a reduced value with `keepdim = true`.
fn keep_shape(s: &Shape, axes: &[usize]) -> Shape {
    reduce_shape(s, axes, true)
}

fn reduce_vjp<E: Emitter>(
    e: &mut E,
    r: ReduceOp,
    axes: &[usize],
    x: E::Value,
    y: E::Value,
    g: E::Value,
) -> Result<E::Value, E::Error> {
    use BinaryOp::{Div, Eq, Mul};
    let xt: TensorType = e.value_type(x);
    let ks = keep_shape(&xt.shape, axes);
    let gk = e.reshape(g, &ks)?;
    let gb = e.broadcast_to(gk, &xt.shape)?;
    Ok(match r {
        ReduceOp::Sum => gb,
        ReduceOp::Mean => {
            let count: Option<usize> = axes.iter().map(|&a| xt.shape.0[a].as_static()).product();
            match count {
                Some(c) => e.binary_scalar(Div, gb, c as f64)?,
                None => {
                    // A symbolic reduced axis: count the elements at run time.
                    let ones = e.full(&xt, 1.0)?;
                    let c = e.reduce(ReduceOp::Sum, ones, axes.to_vec(), true)?;
                    e.binary(Div, gb, c)?
                }
            }
        }
        ReduceOp::Max | ReduceOp::Min => {
            // Split evenly among the elements equal to the extremum.
            let yk = e.reshape(y, &ks)?;
            let hit = e.binary(Eq, x, yk)?;
            let mask = e.cast(hit, xt.dtype)?;
            let count = e.reduce(ReduceOp::Sum, mask, axes.to_vec(), true)?;
            let share = e.binary(Div, gk, count)?;
            e.binary(Mul, mask, share)?
        }
        ReduceOp::Prod => {
            // ∂/∂xᵢ Πx = Πx / xᵢ (undefined where xᵢ = 0, as in the naive rule).
            let yk = e.reshape(y, &ks)?;
            let t = e.binary(Mul, gk, yk)?;
            e.binary(Div, t, x)?
        }
    })
}

/// The rows of `a` to reduce: `a` with the kept axes first, flattened to `[outer][inner]`;
/// returns the rows and the output shape.
fn rows<T: Clone>(site: &Site, a: &ArrayD<T>, axes: &[usize], keepdim: bool) -> Res<(Vec<Vec<T>>, Vec<usize>)> {
    let rank = a.ndim();
    if axes.iter().any(|&x| x >= rank) {
        return Err(site.err(format!("axes {axes:?} out of range for rank {rank}")));
    }
    let kept: Vec<usize> = (0..rank).filter(|i| !axes.contains(i)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let inner: usize = axes.iter().map(|&i| a.shape()[i]).product();
    let outer: usize = kept.iter().map(|&i| a.shape()[i]).product();
    let flat: Vec<T> = a.view().permuted_axes(IxDyn(&perm)).iter().cloned().collect();
    let rows = (0..outer).map(|o| flat[o * inner..(o + 1) * inner].to_vec()).collect();
    let mut shape = Vec::new();
    for (i, &d) in a.shape().iter().enumerate() {
        if !axes.contains(&i) {
            shape.push(d);
        } else if keepdim {
            shape.push(1);
        }
    }
    Ok((rows, shape))
}

/// `reduce_*` over `axes` (also used by the kernel interpreter).
pub fn reduce(site: &Site, op: ReduceOp, x: &Value, axes: &[usize], keepdim: bool) -> Res<Value> {
    let empty = || site.err(format!("{} over an empty axis has no identity", op.name()));
    let data = match &x.data {
        Data::F(a) => {
            let (rows, shape) = rows(site, a, axes, keepdim)?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                out.push(match op {
                    ReduceOp::Sum => r.iter().sum(),
                    ReduceOp::Prod => r.iter().product(),
                    ReduceOp::Mean => r.iter().sum::<f64>() / r.len() as f64,
                    ReduceOp::Max | ReduceOp::Min => {
                        let first = *r.first().ok_or_else(empty)?;
                        r.iter().fold(first, |acc, &v| {
                            if acc.is_nan() || v.is_nan() {
                                f64::NAN
                            } else if op == ReduceOp::Max {
                                acc.max(v)
                            } else {
                                acc.min(v)
                            }
                        })
                    }
                });
            }
            Data::F(array(site, &shape, out)?)
        }
        Data::I(a) if op != ReduceOp::Mean => {
            let (rows, shape) = rows(site, a, axes, keepdim)?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                out.push(match op {
                    ReduceOp::Sum => r.iter().fold(0i64, |s, &v| s.wrapping_add(v)),
                    ReduceOp::Prod => r.iter().fold(1i64, |s, &v| s.wrapping_mul(v)),
                    ReduceOp::Max => *r.iter().max().ok_or_else(empty)?,
                    _ => *r.iter().min().ok_or_else(empty)?,
                });
            }
            Data::I(array(site, &shape, out)?)
        }
        _ => return Err(site.err(format!("{} is not defined for {}", op.name(), x.dtype))),
    };
    Ok(x.with(data))
}

impl ArgReduce {
    /// The index of the winning element of one lane of floats: the first maximum (minimum),
    /// a NaN beating everything but an earlier NaN (PyTorch's argmax); `None` for an empty
    /// lane. The one definition the reference and the backends' own kernels share.
    pub fn best_float(&self, lane: impl IntoIterator<Item = f64>) -> Option<usize> {
        let max = self.op == ArgReduceOp::ArgMax;
        best(lane, |v: f64, b: f64| {
            !b.is_nan() && (v.is_nan() || if max { v > b } else { v < b })
        })
    }

    /// [`ArgReduce::best_float`] for integers and booleans (as 0/1).
    pub fn best_int(&self, lane: impl IntoIterator<Item = i64>) -> Option<usize> {
        let max = self.op == ArgReduceOp::ArgMax;
        best(lane, |v: i64, b: i64| if max { v > b } else { v < b })
    }
}

/// The position of the element no later one is `better` than (the first on ties).
fn best<T: Copy>(lane: impl IntoIterator<Item = T>, better: impl Fn(T, T) -> bool) -> Option<usize> {
    let mut it = lane.into_iter();
    let mut b = it.next()?;
    let mut at = 0;
    for (i, v) in it.enumerate() {
        if better(v, b) {
            (b, at) = (v, i + 1);
        }
    }
    Some(at)
}

/// `argmax` / `argmin` along `axis`, as i64.
fn arg_reduce(site: &Site, op: ArgReduceOp, x: &Value, axis: usize, keepdim: bool) -> Res<Value> {
    let def = ArgReduce { op, axis, keepdim };
    let empty = || site.err(format!("{} over an empty axis {axis}", op.name()));
    let (out, shape) = match &x.data {
        Data::F(a) => {
            let (rows, shape) = rows(site, a, &[axis], keepdim)?;
            let out: Option<Vec<i64>> = rows
                .iter()
                .map(|r| def.best_float(r.iter().copied()).map(|i| i as i64))
                .collect();
            (out, shape)
        }
        Data::I(a) => {
            let (rows, shape) = rows(site, a, &[axis], keepdim)?;
            let out: Option<Vec<i64>> = rows
                .iter()
                .map(|r| def.best_int(r.iter().copied()).map(|i| i as i64))
                .collect();
            (out, shape)
        }
        Data::B(a) => {
            let (rows, shape) = rows(site, a, &[axis], keepdim)?;
            let out: Option<Vec<i64>> = rows
                .iter()
                .map(|r| def.best_int(r.iter().map(|&b| i64::from(b))).map(|i| i as i64))
                .collect();
            (out, shape)
        }
    };
    Ok(Value::int(DType::I64, array(site, &shape, out.ok_or_else(empty)?)?))
}
