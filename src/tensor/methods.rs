//! Tensor ops as methods (Paddle 2 names), each a thin wrapper over one IR op.

use super::{Tensor, apply1};
use crate::error::{Error, Result};
use oar_ir::ops::{ArgReduce, Broadcast, Cast, Concat, Gather, Pad, Permute, Reduce, Reshape, Scatter, Slice};
use oar_ir::ops::{ArgReduceOp, BinaryOp, ReduceOp, ScatterReduce, SliceRange, UnaryOp};
use oar_ir::{DType, Dim, Float, Op, TensorData};

/// Normalize a possibly negative axis for a tensor of `rank` axes.
pub(crate) fn norm_axis(op: &str, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) {
        return Err(Error::invalid(
            op,
            format!("axis {axis} is out of range for a tensor of rank {rank}"),
        ));
    }
    Ok(a as usize)
}

/// Normalize, sort and dedupe axes; an empty list means every axis.
pub(crate) fn norm_axes(op: &str, axes: &[i64], rank: usize) -> Result<Vec<usize>> {
    if axes.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut v = axes
        .iter()
        .map(|&a| norm_axis(op, a, rank))
        .collect::<Result<Vec<_>>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

macro_rules! unary_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident,)*) => {
        impl Tensor {
            $($(#[$m])* pub fn $name(&self) -> Result<Tensor> { apply1(Op::Unary(UnaryOp::$op), &[self]) })*
        }
    };
}

unary_methods! {
    /// `-x`
    neg => Neg,
    /// `|x|`
    abs => Abs,
    /// `e^x`
    exp => Exp,
    /// natural log
    log => Log,
    /// square root
    sqrt => Sqrt,
    /// `1/sqrt(x)`
    rsqrt => Rsqrt,
    /// `1/x`
    reciprocal => Recip,
    /// sine
    sin => Sin,
    /// cosine
    cos => Cos,
    /// hyperbolic tangent
    tanh => Tanh,
    /// error function
    erf => Erf,
    /// round toward -inf
    floor => Floor,
    /// round toward +inf
    ceil => Ceil,
    /// round half to even
    round => Round,
    /// -1, 0 or 1
    sign => Sign,
    /// logical not
    logical_not => Not,
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident,)*) => {
        impl Tensor {
            $($(#[$m])* pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                apply1(Op::Binary(BinaryOp::$op), &[self, other])
            })*
        }
    };
}

binary_methods! {
    /// `x + y` (broadcasting)
    add => Add,
    /// `x - y`
    subtract => Sub,
    /// `x * y`
    multiply => Mul,
    /// `x / y`
    divide => Div,
    /// `x ^ y`
    pow => Pow,
    /// elementwise max
    maximum => Max,
    /// elementwise min
    minimum => Min,
    /// remainder with the divisor's sign
    remainder => Rem,
    /// `x == y`
    equal => Eq,
    /// `x != y`
    not_equal => Ne,
    /// `x < y`
    less_than => Lt,
    /// `x <= y`
    less_equal => Le,
    /// `x > y`
    greater_than => Gt,
    /// `x >= y`
    greater_equal => Ge,
    /// logical and
    logical_and => And,
    /// logical or
    logical_or => Or,
    /// logical xor
    logical_xor => Xor,
}

impl Tensor {
    /// A scalar of this tensor's dtype.
    pub(crate) fn scalar_like(&self, v: f64) -> Result<Tensor> {
        Ok(Tensor::from_data(TensorData::from_f64_slice(
            self.dtype(),
            vec![],
            &[v],
        )?))
    }

    /// `x op s` with `s` converted to x's dtype.
    pub fn binary_scalar(&self, op: BinaryOp, s: f64) -> Result<Tensor> {
        apply1(Op::Binary(op), &[self, &self.scalar_like(s)?])
    }

    /// `x * s + b` elementwise with scalars (Paddle `scale`).
    pub fn scale(&self, s: f64, bias: f64) -> Result<Tensor> {
        let y = self.binary_scalar(BinaryOp::Mul, s)?;
        if bias == 0.0 {
            Ok(y)
        } else {
            y.binary_scalar(BinaryOp::Add, bias)
        }
    }

    /// `where(cond, x, y)` (free function [`crate::where_`] too).
    pub fn where_(cond: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        apply1(Op::Where, &[cond, x, y])
    }

    fn reduce(&self, op: ReduceOp, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        let axes = norm_axes(op.name(), axes, self.ndim())?;
        apply1(Op::Reduce(Reduce { op, axes, keepdim }), &[self])
    }

    /// Sum over `axes` (empty: all axes).
    pub fn sum(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }

    /// Mean over `axes` (empty: all axes).
    pub fn mean(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, axes, keepdim)
    }

    /// Max over `axes` (empty: all axes).
    pub fn max(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }

    /// Min over `axes` (empty: all axes).
    pub fn min(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, axes, keepdim)
    }

    /// Product over `axes` (empty: all axes).
    pub fn prod(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Prod, axes, keepdim)
    }

    /// Index of the max along `axis` (i64).
    pub fn argmax(&self, axis: i64, keepdim: bool) -> Result<Tensor> {
        let axis = norm_axis("argmax", axis, self.ndim())?;
        apply1(
            Op::ArgReduce(ArgReduce {
                op: ArgReduceOp::ArgMax,
                axis,
                keepdim,
            }),
            &[self],
        )
    }

    /// Index of the min along `axis` (i64).
    pub fn argmin(&self, axis: i64, keepdim: bool) -> Result<Tensor> {
        let axis = norm_axis("argmin", axis, self.ndim())?;
        apply1(
            Op::ArgReduce(ArgReduce {
                op: ArgReduceOp::ArgMin,
                axis,
                keepdim,
            }),
            &[self],
        )
    }

    /// New shape with the same elements; one entry may be -1 (inferred), 0 keeps that dim.
    /// While tracing both work on symbolic dims: `[N, 8]` reshaped to `[-1, 4]` is `[2*N, 4]`.
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        let cur = self.dims();
        let bad = || {
            Error::invalid(
                "reshape",
                format!("bad target shape {shape:?} for {}", self.tensor_type()),
            )
        };
        super::intercept::check_sizes("reshape", shape.iter().map(|&d| d.max(0) as usize))?;
        let mut dims: Vec<Option<Dim>> = Vec::with_capacity(shape.len());
        for (i, &d) in shape.iter().enumerate() {
            dims.push(match d {
                -1 if !dims.iter().any(Option::is_none) => None,
                0 if i < cur.len() => Some(cur[i].clone()),
                d if d > 0 => Some(Dim::Static(d as usize)),
                _ => return Err(bad()),
            });
        }
        let dims: Vec<Dim> = if dims.iter().any(Option::is_none) {
            let known: Vec<Dim> = dims.iter().flatten().cloned().collect();
            let known = Dim::product(&known).map_err(|e| Error::invalid("reshape", e))?;
            let total = Dim::product(&cur).map_err(|e| Error::invalid("reshape", e))?;
            let fill = match (&total, &known) {
                (_, Dim::Static(0)) => None,
                _ => total.div_exact(&known),
            }
            .ok_or_else(|| Error::invalid("reshape", format!("cannot reshape {} to {shape:?}", self.tensor_type())))?;
            dims.into_iter().map(|d| d.unwrap_or_else(|| fill.clone())).collect()
        } else {
            dims.into_iter().flatten().collect()
        };
        self.reshape_dims(&dims)
    }

    /// New shape with the same elements, given as dims (symbolic ones from [`Tensor::dims`]:
    /// `x.reshape_dims(&[d[0].mul(&d[1])?, d[2].clone()])`).
    pub fn reshape_dims(&self, dims: &[Dim]) -> Result<Tensor> {
        apply1(Op::Reshape(Reshape { shape: dims.to_vec() }), &[self])
    }

    /// Flatten axes `start..=end` into one.
    pub fn flatten(&self, start: i64, end: i64) -> Result<Tensor> {
        let shape = self.dims();
        if shape.is_empty() {
            return self.reshape(&[1]);
        }
        let (s, e) = (
            norm_axis("flatten", start, shape.len())?,
            norm_axis("flatten", end, shape.len())?,
        );
        if s > e {
            return Err(Error::invalid(
                "flatten",
                format!("start axis {start} is after end axis {end}"),
            ));
        }
        let mut out: Vec<Dim> = shape[..s].to_vec();
        out.push(Dim::product(&shape[s..=e]).map_err(|m| Error::invalid("flatten", m))?);
        out.extend(shape[e + 1..].iter().cloned());
        self.reshape_dims(&out)
    }

    /// Permute axes (`perm[i]` is the input axis that becomes axis `i`).
    pub fn transpose(&self, perm: &[i64]) -> Result<Tensor> {
        let perm = perm
            .iter()
            .map(|&a| norm_axis("transpose", a, self.ndim()))
            .collect::<Result<Vec<_>>>()?;
        apply1(Op::Permute(Permute { perm }), &[self])
    }

    /// Swap the last two axes (matrix transpose).
    pub fn t(&self) -> Result<Tensor> {
        let r = self.ndim() as i64;
        if r < 2 {
            return Ok(self.clone());
        }
        let mut perm: Vec<i64> = (0..r).collect();
        perm.swap(r as usize - 1, r as usize - 2);
        self.transpose(&perm)
    }

    /// Insert a size-1 axis at `axis`.
    pub fn unsqueeze(&self, axis: i64) -> Result<Tensor> {
        let mut s = self.dims();
        let a = norm_axis("unsqueeze", axis, s.len() + 1)?;
        s.insert(a, Dim::Static(1));
        self.reshape_dims(&s)
    }

    /// Remove size-1 axes (all of them when `axes` is empty).
    pub fn squeeze(&self, axes: &[i64]) -> Result<Tensor> {
        let shape = self.dims();
        let one = Dim::Static(1);
        let drop = if axes.is_empty() {
            (0..shape.len()).filter(|&i| shape[i] == one).collect()
        } else {
            norm_axes("squeeze", axes, shape.len())?
        };
        let s: Vec<Dim> = shape
            .iter()
            .enumerate()
            .filter(|(i, d)| !(drop.contains(i) && **d == one))
            .map(|(_, d)| d.clone())
            .collect();
        self.reshape_dims(&s)
    }

    /// Broadcast to `shape` (numpy `broadcast_to`, Paddle `expand`).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        super::intercept::check_sizes("broadcast_to", shape.iter().copied())?;
        self.broadcast_to_dims(&shape.iter().map(|&d| Dim::Static(d)).collect::<Vec<_>>())
    }

    /// Broadcast to dims that may be symbolic (see [`Tensor::dims`]).
    pub fn broadcast_to_dims(&self, dims: &[Dim]) -> Result<Tensor> {
        apply1(Op::Broadcast(Broadcast { shape: dims.to_vec() }), &[self])
    }

    /// Elements `start..end` (step `step`) along `axis`; negative indices count from the end.
    pub fn slice(&self, axis: i64, start: i64, end: i64, step: i64) -> Result<Tensor> {
        let a = norm_axis("slice", axis, self.ndim())?;
        if step < 1 {
            return Err(Error::invalid("slice", format!("step {step} must be ≥ 1")));
        }
        let mut ranges = vec![SliceRange::FULL; self.ndim()];
        ranges[a] = SliceRange { start, end, step };
        apply1(Op::Slice(Slice { ranges }), &[self])
    }

    /// Element `index` along axis 0, dropping that axis (`x[i]`).
    pub fn get(&self, index: i64) -> Result<Tensor> {
        let n = *self
            .shape()
            .first()
            .ok_or_else(|| Error::invalid("get", "cannot index a 0-d tensor"))? as i64;
        let i = if index < 0 { index + n } else { index };
        if i < 0 || i >= n {
            return Err(Error::invalid(
                "get",
                format!("index {index} is out of range for axis 0 of size {n}"),
            ));
        }
        self.slice(0, i, i + 1, 1)?.squeeze(&[0])
    }

    /// Constant padding: `(before, after)` per axis.
    pub fn pad(&self, pads: &[(usize, usize)], value: f64) -> Result<Tensor> {
        apply1(
            Op::Pad(Pad {
                before: pads.iter().map(|p| p.0).collect(),
                after: pads.iter().map(|p| p.1).collect(),
                value: Float(value),
            }),
            &[self],
        )
    }

    /// `gather` along `axis` with integer `index` (Paddle `index_select` for 1-d indices).
    pub fn gather(&self, index: &Tensor, axis: i64) -> Result<Tensor> {
        let axis = norm_axis("gather", axis, self.ndim())?;
        apply1(Op::Gather(Gather { axis }), &[self, index])
    }

    /// Scatter `updates` into a copy of `self` along `axis` (overwrite, or add when `add`).
    pub fn scatter(&self, index: &Tensor, updates: &Tensor, axis: i64, add: bool) -> Result<Tensor> {
        let axis = norm_axis("scatter", axis, self.ndim())?;
        let reduce = if add {
            ScatterReduce::Add
        } else {
            ScatterReduce::Replace
        };
        apply1(Op::Scatter(Scatter { axis, reduce }), &[self, index, updates])
    }

    /// Convert to `dtype` (Paddle `cast` / `astype`).
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        apply1(Op::Cast(Cast { to: dtype }), &[self])
    }

    /// Matrix product with batch broadcasting.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        apply1(Op::MatMul, &[self, other])
    }
}

/// Concatenate along `axis`.
pub fn concat(xs: &[&Tensor], axis: i64) -> Result<Tensor> {
    let first = xs
        .first()
        .ok_or_else(|| Error::invalid("concat", "needs at least one tensor"))?;
    let axis = norm_axis("concat", axis, first.ndim())?;
    apply1(Op::Concat(Concat { axis }), xs)
}

/// Stack along a new axis.
pub fn stack(xs: &[&Tensor], axis: i64) -> Result<Tensor> {
    let first = xs
        .first()
        .ok_or_else(|| Error::invalid("stack", "needs at least one tensor"))?;
    let a = norm_axis("stack", axis, first.ndim() + 1)? as i64;
    let parts = xs.iter().map(|x| x.unsqueeze(a)).collect::<Result<Vec<_>>>()?;
    concat(&parts.iter().collect::<Vec<_>>(), a)
}

/// `where(cond, x, y)`.
pub fn where_(cond: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    Tensor::where_(cond, x, y)
}

macro_rules! free_binary {
    ($($(#[$m:meta])* $name:ident,)*) => {
        $($(#[$m])* pub fn $name(x: &Tensor, y: &Tensor) -> Result<Tensor> { x.$name(y) })*
    };
}

free_binary! {
    /// `x + y`
    add,
    /// `x - y`
    subtract,
    /// `x * y`
    multiply,
    /// `x / y`
    divide,
    /// matrix product
    matmul,
    /// elementwise max
    maximum,
    /// elementwise min
    minimum,
}

macro_rules! free_unary {
    ($($(#[$m:meta])* $name:ident,)*) => {
        $($(#[$m])* pub fn $name(x: &Tensor) -> Result<Tensor> { x.$name() })*
    };
}

free_unary! {
    /// `e^x` (`paddle.exp`)
    exp,
    /// natural log
    log,
    /// square root
    sqrt,
    /// `1/sqrt(x)`
    rsqrt,
    /// `|x|`
    abs,
    /// sine
    sin,
    /// cosine
    cos,
    /// hyperbolic tangent
    tanh,
    /// error function
    erf,
    /// round toward -inf
    floor,
    /// round toward +inf
    ceil,
    /// round half to even
    round,
    /// -1, 0 or 1
    sign,
}

macro_rules! free_reduce {
    ($($(#[$m:meta])* $name:ident,)*) => {
        $($(#[$m])* pub fn $name(x: &Tensor, axes: &[i64], keepdim: bool) -> Result<Tensor> { x.$name(axes, keepdim) })*
    };
}

free_reduce! {
    /// Sum over `axes` (empty: all) (`paddle.sum`)
    sum,
    /// Mean over `axes` (empty: all)
    mean,
    /// Max over `axes` (empty: all)
    max,
    /// Min over `axes` (empty: all)
    min,
    /// Product over `axes` (empty: all)
    prod,
}

/// `x.reshape(shape)` (`paddle.reshape`).
pub fn reshape(x: &Tensor, shape: &[i64]) -> Result<Tensor> {
    x.reshape(shape)
}

/// `x.transpose(perm)` (`paddle.transpose`).
pub fn transpose(x: &Tensor, perm: &[i64]) -> Result<Tensor> {
    x.transpose(perm)
}

/// `x.cast(dtype)` (`paddle.cast`).
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    x.cast(dtype)
}
