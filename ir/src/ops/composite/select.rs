//! Selections built on `where`: `masked_fill` (PyTorch `masked_fill`), `one_hot` (PyTorch
//! `one_hot`, ONNX OneHot) and `trilu` (PyTorch `triu`/`tril`, ONNX Trilu).

use super::super::rules::{R, arity, check_index, out_elements};
use super::super::sample::{Domain, Sample, input, input_in};
use super::{V, composite_def, iota, one, reshape, select};
use crate::eval::{Data, EvalCx, Res, Value, view_as};
use crate::ops::{BinaryOp, Composite, Float, OpDef, op_struct};
use crate::shape::broadcasts_to;
use crate::{DType, Dim, Emitter, Graph, Op, TensorType};
use ndarray::{ArrayD, IxDyn, Zip};

op_struct! {
    /// `masked_fill(x, mask)`: `value` where the bool `mask` (broadcast to x's shape) is true,
    /// `x` elsewhere.
    MaskedFill "masked_fill" {
        /// The fill value (converted like a cast for integer `x`).
        value: Float,
    }
}

op_struct! {
    /// `one_hot(indices)`: `indices.shape ++ [depth]`, 1 at each index and 0 elsewhere, in
    /// `dtype`. A negative index counts from the end (ONNX); one outside `[-depth, depth)`
    /// gives a row of zeros.
    OneHot "one_hot" {
        /// Number of classes.
        depth: usize,
        /// Output dtype.
        dtype: DType,
    }
}

op_struct! {
    /// `trilu(x)`: the upper (`triu`) or lower (`tril`) triangle of the matrices in the last two
    /// axes, the rest zero. Element `[.., i, j]` is kept when `j - i ≥ diagonal` (upper) or
    /// `j - i ≤ diagonal` (lower), as PyTorch's `diagonal` and ONNX's `k`.
    Trilu "trilu" {
        /// Which diagonal bounds the triangle (0 the main one, > 0 above it, < 0 below).
        diagonal: i64,
        /// Keep the upper triangle (else the lower).
        upper: bool,
    }
}

impl OpDef for Trilu {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        if x.rank() < 2 {
            return Err(format!(
                "trilu needs a rank ≥ 2 input (matrices in the last two axes), got {x}"
            ));
        }
        Ok(vec![x.clone()])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    /// `where(iota_col - iota_row ≥ diagonal, x, 0)` (`≤` for the lower triangle); the mask is
    /// `[m, n]` and broadcasts over the leading axes.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let t = &types[0];
        let r = t.rank();
        let mn = vec![t.shape.0[r - 2].clone(), t.shape.0[r - 1].clone()];
        let mut run = || -> V<E> {
            let row = iota(g, mn.clone(), 0, DType::I64)?;
            let col = iota(g, mn.clone(), 1, DType::I64)?;
            let d = g.binary(BinaryOp::Sub, col, row)?;
            let cmp = if self.upper { BinaryOp::Ge } else { BinaryOp::Le };
            let keep = g.binary_scalar(cmp, d, self.diagonal as f64)?;
            let zero = g.add_scalar(t.dtype, 0.0)?;
            select(g, keep, x[0], zero)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[1])?;
        let x = ins[0];
        let r = x.shape().len();
        if r < 2 {
            return Err(site.err(format!("trilu needs rank ≥ 2, got {:?}", x.shape())));
        }
        let keep = |ix: &IxDyn| {
            let d = ix[r - 1] as i64 - ix[r - 2] as i64;
            if self.upper {
                d >= self.diagonal
            } else {
                d <= self.diagonal
            }
        };
        fn tri<T: Copy>(a: &ArrayD<T>, zero: T, keep: impl Fn(&IxDyn) -> bool) -> ArrayD<T> {
            ArrayD::from_shape_fn(a.raw_dim(), |ix| if keep(&ix) { a[&ix] } else { zero })
        }
        let data = match &x.data {
            Data::F(a) => Data::F(tri(a, 0.0, keep)),
            Data::I(a) => Data::I(tri(a, 0, keep)),
            Data::B(a) => Data::B(tri(a, false, keep)),
        };
        Ok(vec![x.with(data)])
    }

    fn samples() -> Vec<Sample> {
        let op = |diagonal, upper| Op::Composite(Composite::Trilu(Trilu { diagonal, upper }));
        vec![
            Sample::new(
                "trilu/f32/triu_batched",
                op(1, true),
                vec![input(DType::F32, &[3, 4, 5])],
            ),
            Sample::new("trilu/f64/tril_below", op(-1, false), vec![input(DType::F64, &[5, 3])]),
            Sample::new(
                "trilu/i64/tril",
                op(0, false),
                vec![input_in(DType::I64, &[2, 4, 4], Domain::Ints(-9, 9))],
            )
            .no_grad(),
            Sample::new("trilu/bool/triu_far", op(-2, true), vec![input(DType::Bool, &[3, 6])]).no_grad(),
        ]
    }
}

impl OpDef for MaskedFill {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 2)?;
        let (x, m) = (&inputs[0], &inputs[1]);
        if m.dtype != DType::Bool {
            return Err(format!("masked_fill mask must be bool, got {m}"));
        }
        if !broadcasts_to(&m.shape, &x.shape) {
            return Err(format!("masked_fill mask {m} does not broadcast to {x}"));
        }
        Ok(vec![x.clone()])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        out_elements(outputs)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let mut run = || -> V<E> {
            let fill = g.add_scalar(types[0].dtype, self.value.0)?;
            select(g, x[1], fill, x[0])
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2])?;
        let (x, m) = (ins[0], ins[1].as_b(site, "mask")?);
        let mv = view_as(site, m, x.shape())?;
        fn fill<T: Copy>(a: &ArrayD<T>, m: &ndarray::ArrayViewD<bool>, v: T) -> ArrayD<T> {
            Zip::from(a).and(m).map_collect(|&x, &k| if k { v } else { x })
        }
        let v = self.value.0;
        let data = match &x.data {
            Data::F(a) => Data::F(fill(a, &mv, v)),
            Data::I(a) => Data::I(fill(a, &mv, crate::eval::float_to_int(x.dtype, v))),
            Data::B(a) => Data::B(fill(a, &mv, v != 0.0)),
        };
        Ok(vec![x.with(data)])
    }

    fn samples() -> Vec<Sample> {
        let op = |v| Op::Composite(Composite::MaskedFill(MaskedFill { value: Float(v) }));
        vec![
            Sample::new(
                "masked_fill/f32/broadcast_mask",
                op(-1e4),
                vec![input(DType::F32, &[2, 3, 4]), input(DType::Bool, &[3, 1])],
            ),
            Sample::new(
                "masked_fill/i32",
                op(7.0),
                vec![
                    input_in(DType::I32, &[4, 3], Domain::Ints(-5, 5)),
                    input(DType::Bool, &[4, 3]),
                ],
            )
            .no_grad(),
        ]
    }
}

impl OpDef for OneHot {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        check_index(&inputs[0])?;
        if self.depth == 0 {
            return Err("one_hot depth must be ≥ 1".into());
        }
        let mut shape = inputs[0].shape.0.clone();
        shape.push(Dim::Static(self.depth));
        Ok(vec![TensorType::new(self.dtype, shape)])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    /// `iota(depth) == (i < 0 ? i + depth : i)`, cast.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        want: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let (it, depth) = (&types[0], self.depth as f64);
        let mut run = || -> V<E> {
            let neg = g.binary_scalar(BinaryOp::Lt, x[0], 0.0)?;
            let wrapped = g.binary_scalar(BinaryOp::Add, x[0], depth)?;
            let idx = select(g, neg, wrapped, x[0])?;
            let mut col = it.shape.0.clone();
            col.push(Dim::Static(1));
            let idx = reshape(g, idx, col)?;
            let classes = iota(g, want[0].shape.0.clone(), it.rank(), it.dtype)?;
            let hit = g.binary(BinaryOp::Eq, classes, idx)?;
            g.cast(hit, self.dtype)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[1])?;
        let idx = ins[0].as_i(site, "indices")?;
        let mut shape = idx.shape().to_vec();
        shape.push(self.depth);
        site.check_size(self.dtype, &shape, "one_hot output")?;
        let d = self.depth as i64;
        let hot = ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
            let at: Vec<usize> = (0..shape.len() - 1).map(|i| ix[i]).collect();
            let k = idx[at.as_slice()];
            let k = if k < 0 { k + d } else { k };
            k == ix[shape.len() - 1] as i64
        });
        let v = Value::boolean(hot);
        Ok(vec![crate::ops::elementwise::cast(&v, self.dtype)])
    }

    fn samples() -> Vec<Sample> {
        let op = |depth, dtype| Op::Composite(Composite::OneHot(OneHot { depth, dtype }));
        vec![
            Sample::new(
                "one_hot/i64_to_f32",
                op(5, DType::F32),
                vec![input_in(DType::I64, &[2, 3], Domain::Ints(-6, 6))],
            )
            .no_grad(),
            Sample::new(
                "one_hot/i32_to_i64",
                op(4, DType::I64),
                vec![input_in(DType::I32, &[7], Domain::Ints(-4, 3))],
            )
            .no_grad(),
            Sample::new("one_hot/i64_to_bool", op(3, DType::Bool), vec![input(DType::I64, &[2])]).no_grad(),
        ]
    }
}
