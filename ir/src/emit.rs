//! [`Emitter`]: "something that applies ops to values". A [`Graph`] records nodes; an eager
//! context computes tensors. Decompositions and gradient rules are written once against this
//! trait, so eager and static mode share them (one definition per op).

use crate::ops::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::ops::{Broadcast, Cast, Permute, Reduce, Reshape};
use crate::{DType, Dim, Graph, IrError, Shape, TensorData, TensorType, ValueId};

/// Applies ops to values. Method names match [`Graph`]'s inherent methods, so code written
/// for a graph reads the same when made generic.
pub trait Emitter {
    /// A handle to a value (cheap to copy).
    type Value: Copy + std::fmt::Debug;
    /// The error of applying an op; type-rule errors convert into it.
    type Error: From<IrError> + std::fmt::Debug;

    /// Apply `op` to `inputs`, returning its outputs.
    fn add_op(&mut self, op: Op, inputs: &[Self::Value]) -> Result<Vec<Self::Value>, Self::Error>;

    /// A constant tensor.
    fn add_constant(&mut self, value: TensorData) -> Result<Self::Value, Self::Error>;

    /// The type of a value.
    fn value_type(&self, v: Self::Value) -> TensorType;

    /// Apply an op with exactly one output.
    fn add_op1(&mut self, op: Op, inputs: &[Self::Value]) -> Result<Self::Value, Self::Error> {
        let name = op.name();
        let outs = self.add_op(op, inputs)?;
        match outs.as_slice() {
            [v] => Ok(*v),
            _ => Err(IrError::Type {
                op: name.into(),
                value: "<new>".into(),
                detail: format!("expected one output, op has {}", outs.len()),
            }
            .into()),
        }
    }

    /// A scalar constant (shape `[]`) of `dtype`.
    fn add_scalar(&mut self, dtype: DType, value: f64) -> Result<Self::Value, Self::Error> {
        let t = TensorData::from_f64_slice(dtype, vec![], &[value]).expect("one element");
        self.add_constant(t)
    }

    /// Elementwise unary op.
    fn unary(&mut self, op: UnaryOp, x: Self::Value) -> Result<Self::Value, Self::Error> {
        self.add_op1(Op::Unary(op), &[x])
    }

    /// Elementwise binary op.
    fn binary(&mut self, op: BinaryOp, a: Self::Value, b: Self::Value) -> Result<Self::Value, Self::Error> {
        self.add_op1(Op::Binary(op), &[a, b])
    }

    /// `x op scalar` with the scalar in x's dtype.
    fn binary_scalar(&mut self, op: BinaryOp, x: Self::Value, s: f64) -> Result<Self::Value, Self::Error> {
        let c = self.add_scalar(self.value_type(x).dtype, s)?;
        self.binary(op, x, c)
    }

    /// Reduce over `axes`.
    fn reduce(
        &mut self,
        op: ReduceOp,
        x: Self::Value,
        axes: Vec<usize>,
        keepdim: bool,
    ) -> Result<Self::Value, Self::Error> {
        self.add_op1(Op::Reduce(Reduce { op, axes, keepdim }), &[x])
    }

    /// Reshape to `shape`.
    fn reshape(&mut self, x: Self::Value, shape: &Shape) -> Result<Self::Value, Self::Error> {
        if self.value_type(x).shape == *shape {
            return Ok(x);
        }
        self.add_op1(Op::Reshape(Reshape { shape: shape.0.clone() }), &[x])
    }

    /// Permute axes.
    fn permute(&mut self, x: Self::Value, perm: Vec<usize>) -> Result<Self::Value, Self::Error> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        self.add_op1(Op::Permute(Permute { perm }), &[x])
    }

    /// Swap the last two axes.
    fn transpose_last(&mut self, x: Self::Value) -> Result<Self::Value, Self::Error> {
        let r = self.value_type(x).rank();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 1, r - 2);
        self.permute(x, perm)
    }

    /// numpy `broadcast_to`.
    fn broadcast_to(&mut self, x: Self::Value, shape: &Shape) -> Result<Self::Value, Self::Error> {
        if self.value_type(x).shape == *shape {
            return Ok(x);
        }
        self.add_op1(Op::Broadcast(Broadcast { shape: shape.0.clone() }), &[x])
    }

    /// A tensor of `ty` filled with `value`.
    fn full(&mut self, ty: &TensorType, value: f64) -> Result<Self::Value, Self::Error> {
        let s = self.add_scalar(ty.dtype, value)?;
        self.broadcast_to(s, &ty.shape)
    }

    /// Cast to `dtype` (no-op if equal).
    fn cast(&mut self, x: Self::Value, to: DType) -> Result<Self::Value, Self::Error> {
        if self.value_type(x).dtype == to {
            return Ok(x);
        }
        self.add_op1(Op::Cast(Cast { to }), &[x])
    }

    /// Sum `g` down to `shape`, undoing numpy broadcasting (the gradient of a broadcast).
    fn sum_to(&mut self, g: Self::Value, shape: &Shape) -> Result<Self::Value, Self::Error> {
        let gs = self.value_type(g).shape;
        if gs == *shape {
            return Ok(g);
        }
        let lead = gs.rank().checked_sub(shape.rank()).ok_or_else(|| IrError::Type {
            op: "sum_to".into(),
            value: "<new>".into(),
            detail: format!("cannot sum {gs} down to {shape}"),
        })?;
        let mut axes: Vec<usize> = (0..lead).collect();
        for (i, d) in shape.0.iter().enumerate() {
            if *d == Dim::Static(1) && gs.0[lead + i] != Dim::Static(1) {
                axes.push(lead + i);
            }
        }
        let r = if axes.is_empty() {
            g
        } else {
            self.reduce(ReduceOp::Sum, g, axes, true)?
        };
        self.reshape(r, shape)
    }
}

impl Emitter for Graph {
    type Value = ValueId;
    type Error = IrError;

    fn add_op(&mut self, op: Op, inputs: &[ValueId]) -> Result<Vec<ValueId>, IrError> {
        Graph::add_op(self, op, inputs)
    }

    fn add_constant(&mut self, value: TensorData) -> Result<ValueId, IrError> {
        Ok(Graph::add_constant(self, value))
    }

    fn value_type(&self, v: ValueId) -> TensorType {
        Graph::value_type(self, v).clone()
    }
}
