//! Losses: `cross_entropy` (through log_softmax and a one-hot mask).

use super::super::rules::{R, arity, check_index, elements, float};
use super::activation::{log_softmax, softmax_f64};
use super::{V, composite_def, dims, one, reshape, scalar_like, select};
use crate::eval::{EvalCx, Res, Value};
use crate::ops::{BinaryOp, OpDef, ReduceOp, UnaryOp, named_enum, op_struct};
use crate::text::word_attr;
use crate::{Dim, Emitter, Graph, Shape, TensorType};
use ndarray::{ArrayD, IxDyn};

named_enum!(
    /// How a loss reduces over the batch.
    Reduction {
        /// Mean over the batch.
        Mean => "mean",
        /// Sum over the batch.
        Sum => "sum",
        /// One loss per sample.
        None => "none",
    }
);
word_attr!(Reduction);

op_struct! {
    /// `cross_entropy(logits[N,C], labels[N] (int))`: `-log_softmax(logits)[label]`, reduced.
    CrossEntropy "cross_entropy" {
        /// Mean, sum or none over N.
        reduction: Reduction,
    }
}

impl OpDef for CrossEntropy {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 2)?;
        let (logits, labels) = (&inputs[0], &inputs[1]);
        float(logits)?;
        check_index(labels)?;
        if logits.rank() != 2 || labels.shape.0 != [logits.shape.0[0].clone()] {
            return Err(format!(
                "cross_entropy needs logits[N,C] and labels[N], got {logits} and {labels}"
            ));
        }
        let s = match self.reduction {
            Reduction::None => labels.shape.clone(),
            _ => Shape::scalar(),
        };
        Ok(vec![TensorType::new(logits.dtype, s)])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(5 * elements(inputs.first()?)?)
    }

    /// `-log_softmax(logits)[n, labels[n]]`, reduced over `N` by mean, sum or not at all. The
    /// label's entry is picked with a one-hot mask `iota == labels` (a select, not a gather,
    /// so the whole loss stays elementwise plus reductions). A label outside `[0, C)` matches
    /// no class and contributes 0, where the reference reports an error.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let (logits, labels, lt) = (x[0], x[1], &types[1]);
        let mut run = || -> V<E> {
            let ls = log_softmax(g, logits, 1)?;
            let shape = dims(g, logits);
            let classes = super::iota(g, shape.clone(), 1, lt.dtype)?;
            let col = reshape(g, labels, vec![shape[0].clone(), Dim::Static(1)])?;
            let one_hot = g.binary(BinaryOp::Eq, classes, col)?;
            let zero = scalar_like(g, ls, 0.0)?;
            let picked = select(g, one_hot, ls, zero)?;
            let per_sample = g.reduce(ReduceOp::Sum, picked, vec![1], false)?;
            let loss = g.unary(UnaryOp::Neg, per_sample)?;
            match self.reduction {
                Reduction::None => Ok(loss),
                Reduction::Sum => g.reduce(ReduceOp::Sum, loss, vec![0], false),
                Reduction::Mean => g.reduce(ReduceOp::Mean, loss, vec![0], false),
            }
        };
        one::<E>(run())
    }

    /// A label outside `[0, C)` is an error.
    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2])?;
        let (logits, labels) = (ins[0], ins[1]);
        let x = logits.as_f(site, "logits")?;
        let l = labels.as_i(site, "labels")?;
        let (n, c) = match x.shape() {
            [n, c] if l.shape() == [*n] => (*n, *c),
            s => {
                return Err(site.err(format!(
                    "needs logits[N,C] and labels[N], got {s:?} and {:?}",
                    l.shape()
                )));
            }
        };
        let logp = softmax_f64(x, 1, true);
        let mut losses = Vec::with_capacity(n);
        for (i, &label) in l.iter().enumerate() {
            if label < 0 || label as u64 >= c as u64 {
                return Err(site.err(format!("label {label} at row {i} is out of range for {c} classes")));
            }
            losses.push(-logp[[i, label as usize]]);
        }
        let out = match self.reduction {
            Reduction::None => ArrayD::from_shape_vec(IxDyn(&[n]), losses),
            Reduction::Sum => Ok(ArrayD::from_elem(IxDyn(&[]), losses.iter().sum())),
            Reduction::Mean => Ok(ArrayD::from_elem(IxDyn(&[]), losses.iter().sum::<f64>() / n as f64)),
        };
        Ok(vec![Value::float(
            logits.dtype,
            out.map_err(|e| site.err(e.to_string()))?,
        )])
    }
}
