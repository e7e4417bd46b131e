//! The interpreter loop: evaluates a graph's nodes in topological order.
//!
//! Before each node runs, its declared result types are resolved against the symbol
//! bindings and refused if too large; after it runs, its results are checked against those
//! types and rounded/wrapped to their dtypes.

use oar_ir::eval::{EvalCx, Res, Site, Value};
use oar_ir::graph::Node;
use oar_ir::ops::{Input, OpDef, Param};
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
        .map(|d| {
            d.eval(&|s| binds.get(s).copied()).ok_or_else(|| match d {
                Dim::Expr(e) => site.err(format!("size `{e}` has an unbound symbol or is negative")),
                _ => site.err(format!("symbolic dim `{d}` is not bound by any input")),
            })
        })
        .collect()
}

/// Bind the symbols of `ty` from a concrete shape; false on any disagreement.
pub(crate) fn bind_shape(ty: &TensorType, shape: &[usize], binds: &mut Bindings) -> bool {
    oar_ir::bind_dims(ty.shape.dims(), shape, binds).is_ok()
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
                Op::Input(Input { name, ty }) => {
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
                Op::Param(Param { name, ty }) => vec![self.param(name, ty, &mut binds)?],
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
            if oar_ir::numerics::enabled() && !matches!(node.op, Op::Input(_) | Op::Param(_) | Op::Constant(_)) {
                for v in &outs {
                    let t = v.to_tensor().map_err(|e| site.err(e))?;
                    if let Some((i, x)) = oar_ir::numerics::first_non_finite(&t) {
                        let ins: Vec<String> = node.inputs().iter().map(|v| g.value_type(*v).to_string()).collect();
                        return Err(site.err(format!(
                            "{} (operands {})",
                            oar_ir::numerics::describe(i, x),
                            ins.join(", ")
                        )));
                    }
                }
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

    /// Evaluate one non-leaf node through its op's reference evaluation.
    fn node(&self, node: &Node, ins: &[&Value], site: &Site, binds: &Bindings) -> Res<Vec<Value>> {
        if matches!(node.op, Op::Input(_) | Op::Param(_)) {
            return Err(site.err("leaf evaluated as an op"));
        }
        let cx = NodeCx {
            interp: self,
            node,
            site,
            binds,
        };
        node.op.eval(&cx, ins)
    }
}

/// What an op's evaluation may ask of the interpreter: its node's site, symbol bindings and
/// regions.
struct NodeCx<'a, 'w> {
    interp: &'a Interp<'w>,
    node: &'a Node,
    site: &'a Site,
    binds: &'a Bindings,
}

impl EvalCx for NodeCx<'_, '_> {
    fn site(&self) -> &Site {
        self.site
    }

    fn resolve(&self, dims: &[Dim]) -> Res<Vec<usize>> {
        resolve(self.site, dims, self.binds)
    }

    fn region(&self, i: usize, args: &[Value]) -> Res<Vec<Value>> {
        let region = self.node.regions.get(i).ok_or_else(|| {
            self.site
                .err(format!("{} needs {} regions", self.node.op.name(), i + 1))
        })?;
        self.interp.eval(region, args, self.binds.clone())
    }

    fn max_while_iterations(&self) -> u64 {
        self.interp.max_while_iterations
    }
}
