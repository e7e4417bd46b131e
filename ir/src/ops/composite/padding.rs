//! `border_pad`: padding that repeats the tensor's own elements — `reflect` (mirror without
//! repeating the edge, PyTorch `reflect`, ONNX `reflect`), `replicate` (repeat the edge,
//! ONNX `edge`) and `circular` (wrap around, ONNX `wrap`). Constant padding is the `pad`
//! primitive. Decomposition: one `gather` per padded axis with a constant index vector.

use super::super::rules::{R, arity};
use super::super::sample::{Domain, Sample, input, input_in};
use super::{V, composite_def, one};
use crate::eval::{Data, EvalCx, Res, Value};
use crate::ops::{Composite, Gather, OpDef, named_enum, op_struct};
use crate::text::word_attr;
use crate::{DType, Dim, Emitter, Graph, Op, TensorData, TensorType};
use ndarray::{ArrayD, Axis};

named_enum!(
    /// Where `border_pad` takes its padding from.
    PadMode {
        /// Mirror at the edge, without repeating it: `[a b c] → b [a b c] b`.
        Reflect => "reflect",
        /// Repeat the edge element: `[a b c] → a [a b c] c`.
        Replicate => "replicate",
        /// Wrap around: `[a b c] → c [a b c] a`.
        Circular => "circular",
    }
);
word_attr!(PadMode);

op_struct! {
    /// `border_pad(x)`: `before[i]`/`after[i]` elements on axis `i`, taken from `x` itself.
    BorderPad "border_pad" {
        /// Elements added before each axis.
        before: Vec<usize>,
        /// Elements added after each axis.
        after: Vec<usize>,
        /// Reflect, replicate or circular.
        mode: PadMode,
    }
}

impl BorderPad {
    /// The source index of every element of an axis of `n` padded by `b` and `a`.
    pub fn sources(&self, n: usize, b: usize, a: usize) -> Vec<usize> {
        let n_i = n as i64;
        (-(b as i64)..n_i + a as i64)
            .map(|i| {
                let j = match self.mode {
                    PadMode::Reflect => {
                        // Period 2(n-1): mirror, then mirror again past the far edge.
                        let p = 2 * (n_i - 1).max(1);
                        let m = i.rem_euclid(p);
                        if m < n_i { m } else { p - m }
                    }
                    PadMode::Replicate => i.clamp(0, n_i - 1),
                    PadMode::Circular => i.rem_euclid(n_i),
                };
                j.clamp(0, n_i - 1) as usize
            })
            .collect()
    }

    /// Why `before`/`after` cannot pad an axis of `n` in this mode, if they cannot.
    fn check_axis(&self, axis: usize, n: usize) -> Result<(), String> {
        let (b, a) = (self.before[axis], self.after[axis]);
        let ok = match self.mode {
            _ if b == 0 && a == 0 => true,
            PadMode::Reflect => b < n && a < n,
            PadMode::Replicate => n > 0,
            PadMode::Circular => b <= n && a <= n,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{} padding ({b}, {a}) on axis {axis} needs a larger axis than {n}",
                self.mode.name()
            ))
        }
    }
}

impl OpDef for BorderPad {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        if self.before.len() != x.rank() || self.after.len() != x.rank() {
            return Err(format!("border_pad needs {} before/after values for {x}", x.rank()));
        }
        let mut shape = Vec::with_capacity(x.rank());
        for (axis, d) in x.shape.0.iter().enumerate() {
            let extra = self.before[axis]
                .checked_add(self.after[axis])
                .ok_or("padding overflows")?;
            shape.push(match d {
                Dim::Static(n) => {
                    self.check_axis(axis, *n)?;
                    Dim::Static(n.checked_add(extra).ok_or("padding overflows")?)
                }
                _ if extra == 0 => d.clone(),
                _ => return Err(format!("cannot pad symbolic axis {axis} of {x} in this mode")),
            });
        }
        Ok(vec![TensorType::new(x.dtype, shape)])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let xt = &types[0];
        let mut run = || -> V<E> {
            let mut y = x[0];
            for (axis, d) in xt.shape.0.iter().enumerate() {
                let (b, a) = (self.before[axis], self.after[axis]);
                if b == 0 && a == 0 {
                    continue;
                }
                let n = d.as_static().unwrap_or(0);
                let idx: Vec<i64> = self.sources(n, b, a).into_iter().map(|j| j as i64).collect();
                let idx = g.add_constant(TensorData::from_vec(vec![idx.len()], idx).expect("indices"))?;
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
        let shape = x.shape().to_vec();
        if self.before.len() != shape.len() || self.after.len() != shape.len() {
            return Err(site.err(format!("pad widths do not match shape {shape:?}")));
        }
        let mut data = x.data.clone();
        for (axis, &n) in shape.iter().enumerate() {
            let (b, a) = (self.before[axis], self.after[axis]);
            if b == 0 && a == 0 {
                continue;
            }
            self.check_axis(axis, n).map_err(|e| site.err(e))?;
            let mut out_shape = shape.clone();
            out_shape[axis] = n + b + a;
            site.check_size(x.dtype, &out_shape, "padded tensor")?;
            let src = self.sources(n, b, a);
            fn take<T: Clone>(a: &ArrayD<T>, axis: usize, src: &[usize]) -> ArrayD<T> {
                a.select(Axis(axis), src)
            }
            data = match data {
                Data::F(a) => Data::F(take(&a, axis, &src)),
                Data::I(a) => Data::I(take(&a, axis, &src)),
                Data::B(a) => Data::B(take(&a, axis, &src)),
            };
        }
        Ok(vec![x.with(data)])
    }

    fn samples() -> Vec<Sample> {
        let bp = |before: &[usize], after: &[usize], mode| {
            Op::Composite(Composite::BorderPad(BorderPad {
                before: before.to_vec(),
                after: after.to_vec(),
                mode,
            }))
        };
        let f = DType::F32;
        vec![
            Sample::new(
                "border_pad/reflect/2d",
                bp(&[0, 0, 2, 1], &[0, 0, 1, 3], PadMode::Reflect),
                vec![input(f, &[2, 3, 4, 5])],
            ),
            Sample::new(
                "border_pad/replicate/1d",
                bp(&[0, 0, 3], &[0, 0, 2], PadMode::Replicate),
                vec![input(f, &[2, 2, 4])],
            ),
            Sample::new(
                "border_pad/circular/i64",
                bp(&[1, 2], &[1, 3], PadMode::Circular),
                vec![input_in(DType::I64, &[3, 4], Domain::Ints(-9, 9))],
            )
            .no_grad(),
        ]
    }
}
