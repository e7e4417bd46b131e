//! Tensor-dependent control flow: `cond` and `while_loop` run eagerly as plain Rust control
//! flow, and while tracing become `Op::Cond` / `Op::While` whose branches and bodies are traced
//! into region graphs. Regions take values only through their inputs, so traced tensors of the
//! enclosing trace that a branch uses become extra operands (and, for a loop, extra carried
//! values that the body returns unchanged).

use super::trace::{CurrentGuard, TraceCtx, Traced, as_trace, current, input, traced_ctx};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::{Graph, Op, TensorType, ValueId};
use std::sync::Arc;

/// Eager loops stop with an error after this many iterations instead of hanging.
pub const MAX_EAGER_ITERATIONS: u64 = 1_000_000;

/// A predicate as a traced or eager `bool[]`: one element, any dtype (non-zero is true).
fn to_pred(op: &str, p: &Tensor) -> Result<Tensor> {
    if p.numel() != 1 {
        return Err(Error::invalid(
            op,
            format!("the condition must have one element, got shape {:?}", p.shape()),
        ));
    }
    let p = if p.shape().is_empty() {
        p.clone()
    } else {
        p.reshape(&[])?
    };
    if p.dtype() == oar_ir::DType::Bool {
        return Ok(p);
    }
    let zero = crate::tensor::full(&[], 0.0, p.dtype())?;
    p.not_equal(&zero)
}

/// The truth value of an eager predicate.
fn eager_truth(op: &str, p: &Tensor) -> Result<bool> {
    if p.numel() != 1 {
        return Err(Error::invalid(
            op,
            format!("the condition must have one element, got shape {:?}", p.shape()),
        ));
    }
    Ok(p.item()? != 0.0)
}

/// A traced region: its graph, the parent values its capture inputs stand for, and the
/// (symbolic) types of its results.
struct Region {
    graph: Graph,
    captures: Vec<(ValueId, ValueId)>,
    results: Vec<TensorType>,
}

/// Trace `f` into a region graph nested in `parent`. Inputs: `args` (as traced tensors given
/// to `f`), then the pre-registered captures, then captures found while tracing.
fn trace_region(
    parent: &Arc<TraceCtx>,
    name: &str,
    args: &[TensorType],
    pre: &[ValueId],
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Region> {
    let ctx = TraceCtx::new_region(parent, Graph::new(name));
    let xs = args
        .iter()
        .enumerate()
        .map(|(i, ty)| input(&ctx, &format!("arg{i}"), &ty.shape.0, ty.dtype))
        .collect::<Result<Vec<_>>>()?;
    for &outer in pre {
        ctx.capture_outer(outer)?;
    }
    let outs = {
        let _current = CurrentGuard::enter(&ctx);
        f(&xs)?
    };
    let values = outs.iter().map(|t| ctx.value_of(t)).collect::<Result<Vec<_>>>()?;
    if !ctx.updates.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
        return Err(Error::invalid(
            name,
            "a parameter update (e.g. batch-norm running statistics in training mode) cannot happen inside a \
             tensor-dependent branch or loop",
        ));
    }
    let mut graph = ctx.graph.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (i, v) in values.into_iter().enumerate() {
        graph.add_output(&format!("out{i}"), v)?;
    }
    // Params read inside the region are params of the whole function.
    let params = std::mem::take(&mut *ctx.params.lock().unwrap_or_else(|e| e.into_inner()));
    parent.params.lock().unwrap_or_else(|e| e.into_inner()).extend(params);
    let captures = ctx.captures.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(Region {
        graph,
        captures,
        results: outs.iter().map(Tensor::tensor_type).collect(),
    })
}

/// Give `region` inputs for the captures in `all` beyond the ones it already has.
fn add_capture_inputs(parent: &Arc<TraceCtx>, region: &mut Region, all: &[(ValueId, ValueId)]) -> Result<()> {
    let g = parent.graph.lock().unwrap_or_else(|e| e.into_inner());
    for (outer, _) in &all[region.captures.len()..] {
        let name = format!("capture{}", region.captures.len());
        let inner = region.graph.add_input(&name, g.value_type(*outer).clone())?;
        region.captures.push((*outer, inner));
    }
    Ok(())
}

fn show(ts: &[TensorType]) -> String {
    ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

/// Traced tensors for the results of a region op.
fn results(ctx: &Arc<TraceCtx>, values: Vec<ValueId>, concrete: &[TensorType]) -> Vec<Tensor> {
    values
        .into_iter()
        .zip(concrete)
        .map(|(value, c)| {
            Tensor::traced(Traced {
                ctx: ctx.clone(),
                value,
                dtype: c.dtype,
                dims: c.shape.0.clone(),
            })
        })
        .collect()
}

/// `if pred { then_fn() } else { else_fn() }` on a tensor predicate (one element; bool or
/// number, non-zero is true). Eagerly one branch runs; while tracing, both branches are traced
/// into the regions of one `cond` op and must return the same number and types of tensors.
pub fn cond(
    pred: &Tensor,
    then_fn: impl FnOnce() -> Result<Vec<Tensor>>,
    else_fn: impl FnOnce() -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let ctx = match &pred.0.trace {
        // An eager predicate is known now, even while tracing: the branch is taken statically.
        None => {
            return if eager_truth("cond", pred)? {
                then_fn()
            } else {
                else_fn()
            };
        }
        Some(tr) => match current() {
            Some(cur) if as_trace(tr.ctx.clone()).is_some_and(|t| cur.is_within(&t)) => cur,
            _ => traced_ctx(tr)?,
        },
    };
    let p = {
        let _current = CurrentGuard::enter(&ctx);
        to_pred("cond", pred)?
    };
    let pv = ctx.value_of(&p)?;
    let mut then_r = trace_region(&ctx, "then", &[], &[], |_| then_fn())?;
    let pre: Vec<ValueId> = then_r.captures.iter().map(|c| c.0).collect();
    let else_r = trace_region(&ctx, "else", &[], &pre, |_| else_fn())?;
    add_capture_inputs(&ctx, &mut then_r, &else_r.captures)?;
    let (t, e) = (then_r.graph.output_types(), else_r.graph.output_types());
    if t != e {
        return Err(Error::invalid(
            "cond",
            format!(
                "both branches must return the same tensors: the then branch returns ({}) but the else branch \
                 returns ({})",
                show(&t),
                show(&e)
            ),
        ));
    }
    let mut operands = vec![pv];
    operands.extend(else_r.captures.iter().map(|c| c.0));
    let values = ctx.graph.lock().unwrap_or_else(|e| e.into_inner()).add_region_op(
        Op::Cond,
        &operands,
        vec![then_r.graph, else_r.graph],
    )?;
    Ok(results(&ctx, values, &then_r.results))
}

/// `while cond_fn(carried) { carried = body_fn(carried) }`, returning the final carried values.
/// `cond_fn` returns a one-element tensor (non-zero is true); `body_fn` returns as many tensors
/// as it is given, of the same types. Eagerly it loops (at most [`MAX_EAGER_ITERATIONS`]
/// times); while tracing (a trace is current, or an initial value is traced) it becomes one
/// `while` op. Traced tensors of the enclosing trace that the closures use are carried too.
pub fn while_loop(
    cond_fn: impl Fn(&[Tensor]) -> Result<Tensor>,
    body_fn: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    init: Vec<Tensor>,
) -> Result<Vec<Tensor>> {
    let traced = init
        .iter()
        .find_map(|t| t.0.trace.as_ref().and_then(|tr| as_trace(tr.ctx.clone())));
    let ctx = match (current(), traced) {
        (Some(cur), Some(t)) if cur.is_within(&t) => cur,
        (_, Some(t)) => t,
        (Some(cur), None) => cur,
        (None, None) => return eager_while(cond_fn, body_fn, init),
    };
    let n = init.len();
    let init_vals = init.iter().map(|t| ctx.value_of(t)).collect::<Result<Vec<_>>>()?;
    let types: Vec<TensorType> = {
        let g = ctx.graph.lock().unwrap_or_else(|e| e.into_inner());
        init_vals.iter().map(|v| g.value_type(*v).clone()).collect()
    };
    let mut cond_r = trace_region(&ctx, "cond", &types, &[], |xs| {
        Ok(vec![to_pred("while_loop", &cond_fn(xs)?)?])
    })?;
    let pre: Vec<ValueId> = cond_r.captures.iter().map(|c| c.0).collect();
    let mut body_r = trace_region(&ctx, "body", &types, &pre, |xs| body_fn(xs))?;
    let got = body_r.graph.output_types();
    if got != types {
        return Err(Error::invalid(
            "while_loop",
            format!(
                "the body must return the carried values' types: it is given ({}) but returns ({})",
                show(&types),
                show(&got)
            ),
        ));
    }
    // Captured values are carried through the loop unchanged.
    for (k, (_, inner)) in body_r.captures.iter().enumerate() {
        body_r.graph.add_output(&format!("capture{k}"), *inner)?;
    }
    add_capture_inputs(&ctx, &mut cond_r, &body_r.captures)?;
    let mut operands = init_vals;
    operands.extend(body_r.captures.iter().map(|c| c.0));
    let mut values = ctx.graph.lock().unwrap_or_else(|e| e.into_inner()).add_region_op(
        Op::While,
        &operands,
        vec![cond_r.graph, body_r.graph],
    )?;
    values.truncate(n);
    let concrete: Vec<TensorType> = init.iter().map(Tensor::tensor_type).collect();
    Ok(results(&ctx, values, &concrete))
}

fn eager_while(
    cond_fn: impl Fn(&[Tensor]) -> Result<Tensor>,
    body_fn: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    init: Vec<Tensor>,
) -> Result<Vec<Tensor>> {
    let mut carried = init;
    let mut n = 0u64;
    while eager_truth("while_loop", &cond_fn(&carried)?)? {
        n += 1;
        if n > MAX_EAGER_ITERATIONS {
            return Err(Error::invalid(
                "while_loop",
                format!("more than {MAX_EAGER_ITERATIONS} iterations"),
            ));
        }
        let next = body_fn(&carried)?;
        if next.len() != carried.len() {
            return Err(Error::invalid(
                "while_loop",
                format!(
                    "the body must return the {} carried values, returned {}",
                    carried.len(),
                    next.len()
                ),
            ));
        }
        carried = next;
    }
    Ok(carried)
}

/// Support for code generated by `#[oar::to_static]`; not a public API.
#[doc(hidden)]
pub mod __macro {
    use crate::error::{Error, Result};
    use crate::tensor::Tensor;

    /// What a condition is at run time.
    pub enum Kind<'a> {
        /// Plain Rust control flow.
        Bool(bool),
        /// Tensor-dependent control flow (`cond` / `while_loop`).
        Tensor(&'a Tensor),
    }

    /// A condition of a rewritten `if`/`while`: `bool` or `Tensor`; `Kind` picks the path at
    /// compile time for the checks below.
    #[diagnostic::on_unimplemented(
        message = "the condition of an `if`/`while` in a #[to_static] function must be a `bool` or a `Tensor`, not `{Self}`"
    )]
    pub trait Condition {
        /// `bool` or `Tensor`.
        type Kind;
        /// The run-time view.
        fn kind(&self) -> Kind<'_>;
    }

    impl Condition for bool {
        type Kind = bool;
        fn kind(&self) -> Kind<'_> {
            Kind::Bool(*self)
        }
    }

    impl Condition for Tensor {
        type Kind = Tensor;
        fn kind(&self) -> Kind<'_> {
            Kind::Tensor(self)
        }
    }

    impl<T: Condition + ?Sized> Condition for &T {
        type Kind = T::Kind;
        fn kind(&self) -> Kind<'_> {
            (**self).kind()
        }
    }

    /// The run-time view of a condition.
    pub fn kind<C: Condition>(c: &C) -> Kind<'_> {
        c.kind()
    }

    /// A plain condition's value (only reached for `bool`; a tensor condition there is a
    /// compile error from [`early_exit_allowed`]).
    pub fn truth<C: Condition>(c: &C) -> bool {
        matches!(c.kind(), Kind::Bool(true))
    }

    /// A condition as a tensor predicate.
    pub fn pred<C: Condition>(c: &C) -> Result<Tensor> {
        Ok(match c.kind() {
            Kind::Bool(b) => Tensor::scalar(b),
            Kind::Tensor(t) => t.clone(),
        })
    }

    /// Implemented by condition kinds whose branches may `return`/`break`/`continue`.
    #[diagnostic::on_unimplemented(
        message = "`return`, `break` and `continue` cannot leave an `if`/`while` whose condition is a Tensor: #[to_static] traces it into a graph region",
        label = "leaves a tensor-dependent branch or loop"
    )]
    pub trait EarlyExitAllowed {}
    impl EarlyExitAllowed for bool {}

    /// Compile-time check placed at a `return`/`break`/`continue`.
    pub fn early_exit_allowed<C: Condition>(_: &C)
    where
        C::Kind: EarlyExitAllowed,
    {
    }

    /// Implemented by the types a variable assigned under a condition of kind `K` may have.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be carried out of an `if`/`while` whose condition is a Tensor: only `Tensor` variables (and `()`/`Tensor` branch values) can",
        label = "assigned inside a tensor-dependent branch or loop"
    )]
    pub trait CarryUnder<K> {}
    impl<T: ?Sized> CarryUnder<bool> for T {}
    impl CarryUnder<Tensor> for Tensor {}
    impl CarryUnder<Tensor> for () {}

    /// Compile-time check placed at an assignment to a carried variable.
    pub fn carry_check<C: Condition, V: CarryUnder<C::Kind> + ?Sized>(_: &C, _: &V) {}

    /// Borrowed variable for autoref dispatch: `Tensor` picks [`CarryTensor`], anything else
    /// [`CarryOther`] (whose methods are never reached: [`carry_check`] rejects it first).
    pub struct Slot<'a, T: ?Sized>(pub &'a T);

    fn not_tensor<T>() -> Result<T> {
        Err(Error::invalid(
            "to_static",
            "a value carried out of a tensor-dependent branch is not a Tensor",
        ))
    }

    /// Carrying a `Tensor` variable.
    pub trait CarryTensor {
        /// A copy for a branch.
        fn __oar_dup(&self) -> Result<Tensor>;
        /// The value `t` in the variable's type.
        fn __oar_from(&self, t: &Tensor) -> Result<Tensor>;
        /// The variable as a region result.
        fn __oar_out(&self) -> Result<Tensor>;
    }

    impl CarryTensor for Slot<'_, Tensor> {
        fn __oar_dup(&self) -> Result<Tensor> {
            Ok(self.0.clone())
        }
        fn __oar_from(&self, t: &Tensor) -> Result<Tensor> {
            Ok(t.clone())
        }
        fn __oar_out(&self) -> Result<Tensor> {
            Ok(self.0.clone())
        }
    }

    /// The fallback for non-tensor variables (type-checks plain code; never runs).
    pub trait CarryOther<T> {
        /// Never succeeds.
        fn __oar_dup(&self) -> Result<T>;
        /// Never succeeds.
        fn __oar_from(&self, t: &Tensor) -> Result<T>;
        /// Never succeeds.
        fn __oar_out(&self) -> Result<Tensor>;
    }

    impl<T> CarryOther<T> for &Slot<'_, T> {
        fn __oar_dup(&self) -> Result<T> {
            not_tensor()
        }
        fn __oar_from(&self, _: &Tensor) -> Result<T> {
            not_tensor()
        }
        fn __oar_out(&self) -> Result<Tensor> {
            not_tensor()
        }
    }

    /// The next result of a control-flow op.
    pub fn next(outs: &mut std::vec::IntoIter<Tensor>) -> Result<Tensor> {
        outs.next()
            .ok_or_else(|| Error::invalid("to_static", "a control-flow op returned fewer values than expected"))
    }

    /// Branch values and carried variables as region results, and back.
    pub trait Outs: Sized {
        /// Append the tensors of `self`.
        fn into_outs(self, outs: &mut Vec<Tensor>) -> Result<()>;
        /// Take the value from the op's results.
        fn from_outs(outs: &mut std::vec::IntoIter<Tensor>) -> Result<Self>;
    }

    impl Outs for () {
        fn into_outs(self, _: &mut Vec<Tensor>) -> Result<()> {
            Ok(())
        }
        fn from_outs(_: &mut std::vec::IntoIter<Tensor>) -> Result<()> {
            Ok(())
        }
    }

    impl Outs for Tensor {
        fn into_outs(self, outs: &mut Vec<Tensor>) -> Result<()> {
            outs.push(self);
            Ok(())
        }
        fn from_outs(outs: &mut std::vec::IntoIter<Tensor>) -> Result<Tensor> {
            outs.next()
                .ok_or_else(|| Error::invalid("cond", "a branch returned fewer values than expected"))
        }
    }

    // Plain values of `if` expressions: never tensor results ([`carry_check`] rejects them).
    macro_rules! plain_outs {
        ($($t:ty),*) => {$(
            impl Outs for $t {
                fn into_outs(self, _: &mut Vec<Tensor>) -> Result<()> {
                    not_tensor()
                }
                fn from_outs(_: &mut std::vec::IntoIter<Tensor>) -> Result<$t> {
                    not_tensor()
                }
            }
        )*};
    }
    plain_outs!(
        bool,
        char,
        i8,
        i16,
        i32,
        i64,
        isize,
        u8,
        u16,
        u32,
        u64,
        usize,
        f32,
        f64,
        String,
        &'static str
    );
}
