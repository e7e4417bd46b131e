//! Graph leaves: `input`, `param` and `constant`. Their text form (`input "x" : f32[N]`,
//! `constant dense<...>`) is written by the graph printer and parser themselves; their values
//! come from the caller, the weights or the graph, so the interpreter feeds them.

use super::rules::{R, arity};
use super::{OpDef, OpFamily, OpText, VjpArgs};
use crate::eval::{EvalCx, Res, Value};
use crate::text::{Attrs, ParseError};
use crate::{Emitter, Graph, TensorData, TensorType};
use serde::{Deserialize, Serialize};

/// A graph input (or a region argument), fed by the caller by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Input {
    /// The name callers use.
    pub name: String,
    /// Its declared type.
    pub ty: TensorType,
}

/// A named parameter (weight); its value lives in the model's weights.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Param {
    /// The weight's name (`fc1.weight`).
    pub name: String,
    /// Its declared type.
    pub ty: TensorType,
}

fn written_by_the_graph_parser(attrs: &Attrs, what: &str) -> ParseError {
    attrs.here(format!("'{what}' is written `%name = {what} ...` on a line of its own"))
}

macro_rules! leaf {
    ($t:ty, $mn:literal, $ty:expr) => {
        impl OpText for $t {
            fn mnemonics() -> &'static [&'static str] {
                &[$mn]
            }
            fn name(&self) -> &'static str {
                $mn
            }
            fn print_attrs(&self) -> Vec<(&'static str, String)> {
                Vec::new()
            }
            fn parse(_: &str, attrs: &mut Attrs, _: &[TensorType]) -> Result<Self, ParseError> {
                Err(written_by_the_graph_parser(attrs, $mn))
            }
        }

        impl OpDef for $t {
            fn family(&self) -> OpFamily {
                OpFamily::Leaf
            }
            fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
                arity(inputs, 0)?;
                let ty: fn(&$t) -> TensorType = $ty;
                Ok(vec![ty(self)])
            }
            fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
                Some(0)
            }
            fn vjp<E: Emitter>(&self, _: &mut E, a: &VjpArgs<E::Value>) -> super::Grads<E> {
                Ok(a.none())
            }
            fn eval(&self, cx: &dyn EvalCx, _: &[&Value]) -> Res<Vec<Value>> {
                leaf_value(self, cx)
            }
        }
    };
}

leaf!(Input, "input", |i| i.ty.clone());
leaf!(Param, "param", |p| p.ty.clone());
leaf!(TensorData, "constant", |t| t.tensor_type());

trait LeafValue {
    fn value(&self, cx: &dyn EvalCx) -> Res<Value>;
}

impl LeafValue for Input {
    fn value(&self, cx: &dyn EvalCx) -> Res<Value> {
        Err(cx
            .site()
            .err(format!("input `{}` is fed by the interpreter", self.name)))
    }
}

impl LeafValue for Param {
    fn value(&self, cx: &dyn EvalCx) -> Res<Value> {
        Err(cx.site().err(format!("param `{}` is read from the weights", self.name)))
    }
}

impl LeafValue for TensorData {
    fn value(&self, cx: &dyn EvalCx) -> Res<Value> {
        Value::from_tensor(self).map_err(|e| cx.site().err(e))
    }
}

fn leaf_value(l: &impl LeafValue, cx: &dyn EvalCx) -> Res<Vec<Value>> {
    Ok(vec![l.value(cx)?])
}
