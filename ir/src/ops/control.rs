//! Control flow: `cond` and `while`, whose bodies are regions (full graphs). The reference
//! evaluates regions through the interpreter ([`EvalCx::region`]); a `while` running more
//! than the configured number of iterations is an error, never a hang.

use super::rules::{R, list};
use super::{Grads, OpDef, OpFamily, VjpArgs, op_struct};
use crate::eval::{EvalCx, Res, Value};
use crate::{DType, Emitter, Graph, IrError, Shape, TensorType};

op_struct! {
    /// `cond(pred, args...)`: runs region 0 (then) or region 1 (else) on `args`; both
    /// regions return the same types.
    Cond "cond"
}

op_struct! {
    /// `while(init...)`: region 0 maps the carried values to a bool scalar; while true,
    /// region 1 maps carried values to new carried values.
    While "while"
}

fn region_inputs(r: &Graph, args: &[TensorType], which: &str) -> Result<(), String> {
    let want = r.input_types();
    if want != args {
        return Err(format!(
            "{which} region takes ({}) but is given ({})",
            list(&want),
            list(args)
        ));
    }
    Ok(())
}

fn no_gradient<E: Emitter>(op: &str) -> Grads<E> {
    Err(IrError::Type {
        op: op.into(),
        value: "<vjp>".into(),
        detail: "gradients through control flow are not supported yet".into(),
    }
    .into())
}

impl OpDef for Cond {
    fn family(&self) -> OpFamily {
        OpFamily::ControlFlow
    }

    fn num_regions(&self) -> usize {
        2
    }

    fn infer(&self, inputs: &[TensorType], regions: &[Graph]) -> R {
        let pred = inputs.first().ok_or("cond needs a predicate")?;
        if pred.dtype != DType::Bool || pred.rank() != 0 {
            return Err(format!("cond predicate must be bool[], got {pred}"));
        }
        let args = &inputs[1..];
        for (i, r) in regions.iter().enumerate() {
            region_inputs(r, args, if i == 0 { "then" } else { "else" })?;
        }
        let (t, e) = (regions[0].output_types(), regions[1].output_types());
        if t != e {
            return Err(format!("then returns ({}) but else returns ({})", list(&t), list(&e)));
        }
        Ok(t)
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    fn vjp<E: Emitter>(&self, _: &mut E, _: &VjpArgs<E::Value>) -> Grads<E> {
        no_gradient::<E>("cond")
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        let (pred, args) = ins.split_first().ok_or_else(|| site.err("cond needs a predicate"))?;
        let p = pred.as_b(site, "predicate")?;
        let take = match p.iter().next() {
            Some(&b) if p.len() == 1 => b,
            _ => return Err(site.err(format!("predicate must be a bool scalar, got shape {:?}", p.shape()))),
        };
        let args: Vec<Value> = args.iter().map(|&v| v.clone()).collect();
        cx.region(if take { 0 } else { 1 }, &args)
    }
}

impl OpDef for While {
    fn family(&self) -> OpFamily {
        OpFamily::ControlFlow
    }

    fn num_regions(&self) -> usize {
        2
    }

    fn infer(&self, inputs: &[TensorType], regions: &[Graph]) -> R {
        region_inputs(&regions[0], inputs, "cond")?;
        region_inputs(&regions[1], inputs, "body")?;
        let c = regions[0].output_types();
        if c != [TensorType::new(DType::Bool, Shape::scalar())] {
            return Err(format!("while condition must return (bool[]), returns ({})", list(&c)));
        }
        let b = regions[1].output_types();
        if b != inputs {
            return Err(format!(
                "while body returns ({}) but carries ({})",
                list(&b),
                list(inputs)
            ));
        }
        Ok(inputs.to_vec())
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    fn vjp<E: Emitter>(&self, _: &mut E, _: &VjpArgs<E::Value>) -> Grads<E> {
        no_gradient::<E>("while")
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        let mut carried: Vec<Value> = ins.iter().map(|&v| v.clone()).collect();
        let mut iterations = 0u64;
        loop {
            let c = cx.region(0, &carried)?;
            let keep_going = match c.as_slice() {
                [v] => match v.as_b(site, "while condition")?.iter().next() {
                    Some(&b) if v.shape().is_empty() => b,
                    _ => return Err(site.err("while condition must return a bool scalar")),
                },
                _ => return Err(site.err("while condition must return one value")),
            };
            if !keep_going {
                return Ok(carried);
            }
            if iterations >= cx.max_while_iterations() {
                return Err(site.err(format!("while loop exceeded {} iterations", cx.max_while_iterations())));
            }
            iterations += 1;
            carried = cx.region(1, &carried)?;
        }
    }
}
