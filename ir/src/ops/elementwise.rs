//! The other elementwise ops: `where` (select with three-way broadcasting) and `cast`.

use super::rules::{R, arity, out_elements, same_dtype};
use super::{Grads, Op, OpDef, OpFamily, OpText, VjpArgs, op_struct};
use crate::eval::{Data, EvalCx, Res, Value, broadcast_dims, float_to_int, view_as};
use crate::shape::broadcast_shapes;
use crate::text::{Attrs, ParseError, single_result};
use crate::{DType, Emitter, Graph, TensorType};
use ndarray::{ArrayD, ArrayViewD, Zip};
use serde::{Deserialize, Serialize};

op_struct! {
    /// `where(cond, a, b)`: elementwise select with broadcasting; `cond` is bool.
    Where "where"
}

impl OpDef for Where {
    fn family(&self) -> OpFamily {
        OpFamily::Elementwise
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 3)?;
        let (c, a, b) = (&inputs[0], &inputs[1], &inputs[2]);
        if c.dtype != DType::Bool {
            return Err(format!("condition must be bool, got {c}"));
        }
        same_dtype(a, b)?;
        let s = broadcast_shapes(&broadcast_shapes(&c.shape, &a.shape)?, &b.shape)?;
        Ok(vec![TensorType::new(a.dtype, s)])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        out_elements(outputs)
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let (c, g) = (a.inputs[0], a.g);
        let zero = e.add_scalar(e.value_type(g).dtype, 0.0)?;
        let side = |e: &mut E, i: usize| -> Result<Option<E::Value>, E::Error> {
            if !a.want(i) {
                return Ok(None);
            }
            let (t, f) = if i == 1 { (g, zero) } else { (zero, g) };
            let w = e.add_op1(Op::Where, &[c, t, f])?;
            Ok(Some(e.sum_to(w, &e.value_type(a.inputs[i]).shape)?))
        };
        let ga = side(e, 1)?;
        let gb = side(e, 2)?;
        Ok(vec![None, ga, gb])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[3])?;
        let (c, a, b) = (ins[0], ins[1], ins[2]);
        let cond = c.as_b(site, "condition")?;
        if a.dtype != b.dtype {
            return Err(site.err(format!("dtypes differ: {} vs {}", a.dtype, b.dtype)));
        }
        let shape = broadcast_dims(site, &broadcast_dims(site, cond.shape(), a.shape())?, b.shape())?;
        let vc = view_as(site, cond, &shape)?;
        fn pick<T: Copy>(
            site: &crate::eval::Site,
            c: &ArrayViewD<bool>,
            x: &ArrayD<T>,
            y: &ArrayD<T>,
        ) -> Res<ArrayD<T>> {
            let (vx, vy) = (view_as(site, x, c.shape())?, view_as(site, y, c.shape())?);
            Ok(Zip::from(c)
                .and(&vx)
                .and(&vy)
                .map_collect(|&k, &p, &q| if k { p } else { q }))
        }
        let data = match (&a.data, &b.data) {
            (Data::F(x), Data::F(y)) => Data::F(pick(site, &vc, x, y)?),
            (Data::I(x), Data::I(y)) => Data::I(pick(site, &vc, x, y)?),
            (Data::B(x), Data::B(y)) => Data::B(pick(site, &vc, x, y)?),
            _ => return Err(site.err("where operands have different storage")),
        };
        Ok(vec![a.with(data)])
    }
}

/// Convert elements to another dtype: float→int truncates toward zero and saturates (NaN →
/// 0); int→int wraps; anything→bool is `!= 0` (NaN → true); bool→number is 0/1. The target
/// dtype is the result type's, so the text states it once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cast {
    /// Target dtype.
    pub to: DType,
}

impl OpText for Cast {
    fn mnemonics() -> &'static [&'static str] {
        &["cast"]
    }
    fn name(&self) -> &'static str {
        "cast"
    }
    fn print_attrs(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    fn parse(name: &str, attrs: &mut Attrs, results: &[TensorType]) -> Result<Self, ParseError> {
        Ok(Cast {
            to: single_result(attrs, name, results)?.dtype,
        })
    }
}

impl OpDef for Cast {
    fn family(&self) -> OpFamily {
        OpFamily::Elementwise
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        Ok(vec![TensorType::new(self.to, inputs[0].shape.clone())])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let from = e.value_type(a.inputs[0]).dtype;
        if from.is_float() && e.value_type(a.g).dtype.is_float() {
            Ok(vec![Some(e.cast(a.g, from)?)])
        } else {
            Ok(a.none())
        }
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        Ok(vec![cast(ins[0], self.to)])
    }
}

/// The reference cast (see [`Cast`]).
pub(crate) fn cast(x: &Value, to: DType) -> Value {
    let data = match (&x.data, to) {
        (Data::F(a), t) if t.is_float() => Data::F(a.clone()),
        (Data::F(a), DType::Bool) => Data::B(a.mapv(|v| v != 0.0)),
        (Data::F(a), t) => Data::I(a.mapv(|v| float_to_int(t, v))),
        // i64 → f32 in one rounding step (through f64 would round twice above 2^53).
        (Data::I(a), DType::F32) => Data::F(a.mapv(|v| v as f32 as f64)),
        (Data::I(a), t) if t.is_float() => Data::F(a.mapv(|v| v as f64)),
        (Data::I(a), DType::Bool) => Data::B(a.mapv(|v| v != 0)),
        (Data::I(a), _) => Data::I(a.clone()),
        (Data::B(a), t) if t.is_float() => Data::F(a.mapv(|v| v as u8 as f64)),
        (Data::B(a), DType::Bool) => Data::B(a.clone()),
        (Data::B(a), _) => Data::I(a.mapv(|v| v as i64)),
    };
    Value { dtype: to, data }
}
