//! The verifier: re-checks every structural and type invariant of a graph and its regions.

use crate::error::IrError;
use crate::graph::{Graph, NodeId};
use crate::ops::{Input, Param};
use crate::ops::{Op, infer_types};
use std::collections::{BTreeMap, BTreeSet};

/// Deepest nesting of regions the verifier (and the loaders) accept.
pub const MAX_REGION_DEPTH: usize = 64;

/// Check `graph`: operands exist, no cycles, types match the op rules, inputs are declared,
/// names are unique, params agree on types, outputs exist; regions recursively.
pub fn verify(graph: &Graph) -> Result<(), IrError> {
    let mut params = BTreeMap::new();
    verify_at(graph, 0, &mut params)
}

fn structure(g: &Graph, detail: String) -> IrError {
    IrError::Structure {
        graph: g.name().to_string(),
        detail,
    }
}

fn verify_at(g: &Graph, depth: usize, params: &mut BTreeMap<String, String>) -> Result<(), IrError> {
    if depth > MAX_REGION_DEPTH {
        return Err(structure(g, format!("regions nest deeper than {MAX_REGION_DEPTH}")));
    }
    let order = g.topo_order();
    if order.len() != g.node_count() {
        return Err(structure(g, "the graph has a cycle".into()));
    }
    let declared: BTreeSet<NodeId> = g.inputs().iter().copied().collect();
    let mut input_names = BTreeSet::new();
    for id in order {
        let node = g.node(id);
        let value = format!("%{}", id.index());
        let op = node.op.name().to_string();
        let mut types = Vec::with_capacity(node.inputs().len());
        for v in node.inputs() {
            let t = g.try_value_type(*v).ok_or_else(|| IrError::BadOperand {
                op: op.clone(),
                value: value.clone(),
                operand: v.to_string(),
            })?;
            types.push(t.clone());
        }
        if node.outputs().iter().any(|t| {
            t.shape
                .dims()
                .iter()
                .any(|d| matches!(d, crate::Dim::Sym(s) if s.is_empty()))
        }) {
            return Err(IrError::Type {
                op,
                value,
                detail: "a symbolic dim has an empty name".into(),
            });
        }
        match &node.op {
            Op::Input(Input { name, .. }) => {
                if !declared.contains(&id) {
                    return Err(structure(
                        g,
                        format!("input `{name}` at {value} is not a declared graph input"),
                    ));
                }
                if !input_names.insert(name.clone()) {
                    return Err(IrError::DuplicateInput {
                        graph: g.name().into(),
                        name: name.clone(),
                    });
                }
            }
            Op::Param(Param { name, ty }) => {
                let t = ty.to_string();
                match params.get(name) {
                    Some(first) if *first != t => {
                        return Err(IrError::ParamConflict {
                            name: name.clone(),
                            first: first.clone(),
                            second: t,
                        });
                    }
                    _ => {
                        params.insert(name.clone(), t);
                    }
                }
            }
            _ => {}
        }
        for r in &node.regions {
            verify_at(r, depth + 1, params)?;
        }
        let expected = infer_types(&node.op, &types, &node.regions).map_err(|detail| IrError::Type {
            op: op.clone(),
            value: value.clone(),
            detail,
        })?;
        if expected != node.outputs() {
            let show = |ts: &[crate::TensorType]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
            return Err(IrError::Type {
                op,
                value,
                detail: format!(
                    "declared result types ({}) but the operands give ({})",
                    show(node.outputs()),
                    show(&expected)
                ),
            });
        }
    }
    if declared.len() != g.inputs().len() || g.inputs().iter().any(|&n| g.get(n).is_none()) {
        return Err(structure(g, "graph input list is malformed".into()));
    }
    let mut names = BTreeSet::new();
    for o in g.outputs() {
        if g.try_value_type(o.value).is_none() {
            return Err(IrError::BadOperand {
                op: "output".into(),
                value: o.name.clone(),
                operand: o.value.to_string(),
            });
        }
        if !names.insert(&o.name) {
            return Err(IrError::DuplicateOutput {
                graph: g.name().into(),
                name: o.name.clone(),
            });
        }
    }
    Ok(())
}
