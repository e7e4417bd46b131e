//! The interpreter loop: evaluates a graph's nodes in topological order.
//!
//! Before each node runs, its declared result types are resolved against the symbol
//! bindings and refused if too large; after it runs, its results are checked against those
//! types and rounded/wrapped to their dtypes.

use crate::contraction::{ConvSpec, conv, matmul};
use crate::value::{Res, Site, Value};
use crate::{elementwise, indexing, movement, nn, random, reduce};
use oar_ir::graph::Node;
use oar_ir::{BackendError, Dim, Graph, Op, TensorType, Weights};
use std::collections::BTreeMap;

/// Symbol bindings (`N` → 8).
pub(crate) type Bindings = BTreeMap<String, usize>;

/// Evaluation settings and the weights params read from.
pub(crate) struct Interp<'w> {
    /// Weights by parameter name.
    pub weights: &'w Weights,
    /// A `while` running more iterations than this is an error.
    pub max_while_iterations: u64,
}

/// Concrete sizes of `dims`; an unbound symbol is an error.
pub(crate) fn resolve(site: &Site, dims: &[Dim], binds: &Bindings) -> Res<Vec<usize>> {
    dims.iter()
        .map(|d| match d {
            Dim::Static(n) => Ok(*n),
            Dim::Sym(s) => binds
                .get(s)
                .copied()
                .ok_or_else(|| site.err(format!("symbolic dim `{s}` is not bound by any input"))),
        })
        .collect()
}

/// Bind the symbols of `ty` from a concrete shape; false on any disagreement.
pub(crate) fn bind_shape(ty: &TensorType, shape: &[usize], binds: &mut Bindings) -> bool {
    ty.rank() == shape.len()
        && ty.shape.dims().iter().zip(shape).all(|(d, &n)| match d {
            Dim::Static(s) => *s == n,
            Dim::Sym(s) => *binds.entry(s.clone()).or_insert(n) == n,
        })
}

fn type_str(v: &Value) -> String {
    format!("{}{:?}", v.dtype, v.shape())
}

impl Interp<'_> {
    /// Evaluate `g` on positional `args` (one per graph input); outputs in graph order.
    pub fn eval(&self, g: &Graph, args: &[Value], mut binds: Bindings) -> Res<Vec<Value>> {
        let bound = g.node_ids().map(|n| n.index() + 1).max().unwrap_or(0);
        let mut vals: Vec<Option<Vec<Value>>> = vec![None; bound];
        for id in g.topo_order() {
            let node = g.node(id);
            let site = Site {
                op: node.op.name().to_string(),
                value: format!("%{}", id.index()),
            };
            let mut outs = match &node.op {
                Op::Input { name, ty } => {
                    let pos = g.inputs().iter().position(|&n| n == id);
                    let arg = pos
                        .and_then(|p| args.get(p))
                        .ok_or_else(|| site.err(format!("no value given for input `{name}`")))?;
                    if arg.dtype != ty.dtype || !bind_shape(ty, arg.shape(), &mut binds) {
                        return Err(BackendError::InputMismatch {
                            name: name.clone(),
                            expected: ty.to_string(),
                            got: type_str(arg),
                        });
                    }
                    vec![arg.clone()]
                }
                Op::Param { name, ty } => vec![self.param(name, ty, &mut binds)?],
                _ => {
                    let mut ins = Vec::with_capacity(node.inputs().len());
                    for v in node.inputs() {
                        let val = vals
                            .get(v.node.index())
                            .and_then(|o| o.as_ref())
                            .and_then(|outs| outs.get(v.output as usize))
                            .ok_or_else(|| site.err(format!("operand {v} has no value")))?;
                        ins.push(val);
                    }
                    for t in node.outputs() {
                        let shape = resolve(&site, t.shape.dims(), &binds)?;
                        site.check_size(t.dtype, &shape, "result")?;
                    }
                    self.node(node, &ins, &site, &binds)?
                }
            };
            if outs.len() != node.outputs().len() {
                return Err(site.err(format!(
                    "produced {} results, declared {}",
                    outs.len(),
                    node.outputs().len()
                )));
            }
            for (v, t) in outs.iter_mut().zip(node.outputs()) {
                let want = resolve(&site, t.shape.dims(), &binds)?;
                if v.dtype != t.dtype || v.shape() != want.as_slice() || !v.is_consistent() {
                    return Err(site.err(format!(
                        "computed {} but declared {t} = {}{want:?}",
                        type_str(v),
                        t.dtype
                    )));
                }
                v.normalize();
            }
            vals[id.index()] = Some(outs);
        }
        g.outputs()
            .iter()
            .map(|o| {
                vals.get(o.value.node.index())
                    .and_then(|v| v.as_ref())
                    .and_then(|v| v.get(o.value.output as usize))
                    .cloned()
                    .ok_or_else(|| BackendError::Runtime {
                        op: "output".into(),
                        value: o.name.clone(),
                        detail: format!("{} was never computed", o.value),
                    })
            })
            .collect()
    }

    /// A parameter's weight, checked against its declared type (binding its symbols).
    fn param(&self, name: &str, ty: &TensorType, binds: &mut Bindings) -> Res<Value> {
        let weight = |detail: String| BackendError::Weight {
            name: name.to_string(),
            detail,
        };
        let t = self
            .weights
            .get(name)
            .ok_or_else(|| weight(format!("no weight given (expected {ty})")))?;
        if t.dtype() != ty.dtype || !bind_shape(ty, t.shape(), binds) {
            return Err(weight(format!("expected {ty}, got {}", t.tensor_type())));
        }
        Value::from_tensor(t).map_err(weight)
    }

    /// Evaluate one non-leaf node.
    fn node(&self, node: &Node, ins: &[&Value], site: &Site, binds: &Bindings) -> Res<Vec<Value>> {
        let arg = |i: usize| {
            ins.get(i)
                .copied()
                .ok_or_else(|| site.err(format!("missing operand {i}")))
        };
        let one = |v: Value| Ok(vec![v]);
        match &node.op {
            Op::Input { .. } | Op::Param { .. } => Err(site.err("leaf evaluated as an op")),
            Op::Constant(t) => one(Value::from_tensor(t).map_err(|e| site.err(e))?),
            Op::Unary(u) => one(elementwise::unary(site, *u, arg(0)?)?),
            Op::Binary(b) => one(elementwise::binary(site, *b, arg(0)?, arg(1)?)?),
            Op::Where => one(elementwise::select(site, arg(0)?, arg(1)?, arg(2)?)?),
            Op::Reduce { op, axes, keepdim } => one(reduce::reduce(site, *op, arg(0)?, axes, *keepdim)?),
            Op::ArgReduce { op, axis, keepdim } => one(reduce::arg_reduce(site, *op, arg(0)?, *axis, *keepdim)?),
            Op::Reshape { shape } => one(movement::reshape(site, arg(0)?, &resolve(site, shape, binds)?)?),
            Op::Permute { perm } => one(movement::permute(site, arg(0)?, perm)?),
            Op::Broadcast { shape } => one(movement::broadcast(site, arg(0)?, &resolve(site, shape, binds)?)?),
            Op::Slice { ranges } => one(movement::slice(site, arg(0)?, ranges)?),
            Op::Pad { before, after, value } => one(movement::pad(site, arg(0)?, before, after, value.0)?),
            Op::Concat { axis } => one(movement::concat(site, ins, *axis)?),
            Op::Gather { axis } => one(indexing::gather(site, arg(0)?, arg(1)?, *axis)?),
            Op::Scatter { axis, reduce } => one(indexing::scatter(site, arg(0)?, arg(1)?, arg(2)?, *axis, *reduce)?),
            Op::Cast { to } => one(elementwise::cast(arg(0)?, *to)),
            Op::Iota { shape, axis, dtype } => one(random::iota(site, &resolve(site, shape, binds)?, *axis, *dtype)?),
            Op::Random {
                dist,
                shape,
                dtype,
                seed,
            } => one(random::random(
                site,
                dist,
                &resolve(site, shape, binds)?,
                *dtype,
                *seed,
            )?),
            Op::MatMul => one(matmul(site, arg(0)?, arg(1)?)?),
            Op::Conv {
                stride,
                pad_before,
                pad_after,
                dilation,
                groups,
            } => {
                let spec = ConvSpec {
                    stride,
                    pad_before,
                    pad_after,
                    dilation,
                    groups: *groups,
                };
                one(conv(site, arg(0)?, arg(1)?, &spec)?)
            }
            Op::Composite(c) => nn::composite(site, c, ins),
            Op::Cond => self.cond(node, ins, site, binds),
            Op::While => self.while_loop(node, ins, site, binds),
        }
    }
}
