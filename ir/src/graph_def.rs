//! A plain serde form of [`Graph`]: nodes listed in topological order, operands as positions
//! of earlier nodes, regions nested. Rebuilding goes through the `Graph` API, so every type
//! rule is checked again and hostile input cannot build a cyclic or ill-typed graph.

use crate::error::IrError;
use crate::graph::{Graph, NodeId, ValueId};
use crate::ops::Op;
use crate::ops::{Input, Param};
use crate::verify::MAX_REGION_DEPTH;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// A value reference inside a [`GraphDef`]: (position of the defining node, output index).
pub type ValueRef = (usize, u32);

/// A serializable graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphDef {
    /// The graph's name.
    pub name: String,
    /// Positions (in `nodes`) of the graph inputs, in call order.
    pub inputs: Vec<usize>,
    /// Nodes: graph inputs first (in call order), then the rest in topological order.
    pub nodes: Vec<NodeDef>,
    /// Named outputs, in order.
    pub outputs: Vec<(String, ValueRef)>,
}

/// One node of a [`GraphDef`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDef {
    /// The op.
    pub op: Op,
    /// Operands; each refers to an earlier node.
    pub inputs: Vec<ValueRef>,
    /// Sub-graphs (control flow only).
    pub regions: Vec<GraphDef>,
}

impl GraphDef {
    /// The serde form of `graph`. Graph inputs come first, so rebuilding gives back the same
    /// input order and `from_graph(to_graph(d)) == d` for any `d` produced here.
    pub fn from_graph(graph: &Graph) -> GraphDef {
        let mut order: Vec<NodeId> = graph.inputs().to_vec();
        let mut listed: HashSet<NodeId> = order.iter().copied().collect();
        // A malformed graph (a cycle) leaves nodes out of the topological order; appending them
        // keeps the def complete so `to_graph` reports the problem instead of losing nodes.
        for n in graph.topo_order().into_iter().chain(graph.node_ids()) {
            if listed.insert(n) {
                order.push(n);
            }
        }
        let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        // Values of removed nodes cannot occur through the Graph API; map them past the end.
        let vref = |v: &ValueId| (pos.get(&v.node).copied().unwrap_or(usize::MAX), v.output);
        let nodes = order
            .iter()
            .filter_map(|&id| graph.get(id))
            .map(|node| NodeDef {
                op: node.op.clone(),
                inputs: node.inputs().iter().map(vref).collect(),
                regions: node.regions.iter().map(GraphDef::from_graph).collect(),
            })
            .collect();
        GraphDef {
            name: graph.name().to_string(),
            inputs: (0..graph.inputs().len()).collect(),
            nodes,
            outputs: graph
                .outputs()
                .iter()
                .map(|o| (o.name.clone(), vref(&o.value)))
                .collect(),
        }
    }

    /// Rebuild the graph through the `Graph` API, checking every rule again: what it returns
    /// verifies (graph-wide rules too — one type per param name, unique input names — which a
    /// node-by-node build cannot see; the fuzzer found a def with a param declared twice).
    pub fn to_graph(&self) -> Result<Graph, IrError> {
        let g = self.build(0)?;
        crate::verify(&g)?;
        Ok(g)
    }

    /// Deepest region nesting in this def (0 for a graph without regions).
    pub fn region_depth(&self) -> usize {
        // Iterative, so a deep def cannot overflow the stack here.
        let mut deepest = 0;
        let mut stack = vec![(self, 0usize)];
        while let Some((g, d)) = stack.pop() {
            deepest = deepest.max(d);
            for n in &g.nodes {
                stack.extend(n.regions.iter().map(|r| (r, d + 1)));
            }
        }
        deepest
    }

    fn err(&self, detail: String) -> IrError {
        IrError::Structure {
            graph: self.name.clone(),
            detail,
        }
    }

    fn build(&self, depth: usize) -> Result<Graph, IrError> {
        if depth > MAX_REGION_DEPTH {
            return Err(self.err(format!("regions nest deeper than {MAX_REGION_DEPTH}")));
        }
        let mut g = Graph::new(&self.name);
        let mut ids: Vec<Option<NodeId>> = vec![None; self.nodes.len()];
        for &p in &self.inputs {
            let node = self
                .nodes
                .get(p)
                .ok_or_else(|| self.err(format!("graph input refers to node {p}, which does not exist")))?;
            let Op::Input(Input { name, ty }) = &node.op else {
                return Err(self.err(format!("graph input {p} is a `{}` node, not an input", node.op.name())));
            };
            if ids[p].is_some() {
                return Err(self.err(format!("node {p} is listed twice as a graph input")));
            }
            if !node.inputs.is_empty() || !node.regions.is_empty() {
                return Err(self.err(format!("input `{name}` (node {p}) has operands or regions")));
            }
            ids[p] = Some(g.add_input(name, ty.clone())?.node);
        }
        for (p, node) in self.nodes.iter().enumerate() {
            if ids[p].is_some() {
                continue;
            }
            let op = node.op.name();
            let mut operands = Vec::with_capacity(node.inputs.len());
            for (i, &(q, output)) in node.inputs.iter().enumerate() {
                let id = (q < p).then(|| ids[q]).flatten().ok_or_else(|| {
                    self.err(format!(
                        "node {p} (`{op}`): operand {i} refers to node {q}, which is not an earlier node"
                    ))
                })?;
                operands.push(ValueId { node: id, output });
            }
            let leaf = matches!(node.op, Op::Input(_) | Op::Param(_) | Op::Constant(_));
            if leaf && (!operands.is_empty() || !node.regions.is_empty()) {
                return Err(self.err(format!("node {p} (`{op}`) takes no operands or regions")));
            }
            let v = match &node.op {
                Op::Input(Input { name, .. }) => {
                    return Err(self.err(format!("input `{name}` (node {p}) is not listed as a graph input")));
                }
                Op::Param(Param { name, ty }) => g.add_param(name, ty.clone())?,
                Op::Constant(t) => g.add_constant(t.clone()),
                _ => {
                    let regions = node
                        .regions
                        .iter()
                        .map(|r| r.build(depth + 1))
                        .collect::<Result<Vec<_>, _>>()?;
                    let outs = g.add_region_op(node.op.clone(), &operands, regions)?;
                    // An op with no outputs still gets a node; find it from the graph.
                    match outs.first() {
                        Some(v) => *v,
                        None => ValueId::first(last_node(&g)),
                    }
                }
            };
            ids[p] = Some(v.node);
        }
        for (name, (q, output)) in &self.outputs {
            let id = ids
                .get(*q)
                .copied()
                .flatten()
                .ok_or_else(|| self.err(format!("output `{name}` refers to node {q}, which does not exist")))?;
            g.add_output(
                name,
                ValueId {
                    node: id,
                    output: *output,
                },
            )?;
        }
        Ok(g)
    }
}

/// The most recently added node (the highest index: nothing is removed while rebuilding).
fn last_node(g: &Graph) -> NodeId {
    g.node_ids().max().expect("a node was just added")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::{DType, Dim, TensorData, TensorType};

    fn sample() -> Graph {
        let mut g = Graph::new("g");
        let x = g
            .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(3)]))
            .unwrap();
        let w = g.add_param("w", TensorType::of(DType::F32, &[3, 2])).unwrap();
        let y = g.add_op1(Op::MatMul, &[x, w]).unwrap();
        let c = g.add_constant(TensorData::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap());
        let z = g.binary(BinaryOp::Add, y, c).unwrap();
        let e = g.unary(UnaryOp::Exp, z).unwrap();
        g.add_output("out", e).unwrap();
        g
    }

    /// Found by the `graph_json` fuzz target: a def naming one param twice with two types
    /// built node by node, and only `verify` saw the conflict.
    #[test]
    fn a_param_declared_twice_with_two_types_is_refused() {
        let mut d = GraphDef::from_graph(&sample());
        let mut twin = d.nodes[1].clone();
        let Op::Param(p) = &mut twin.op else {
            panic!("node 1 is the param")
        };
        p.ty = TensorType::of(DType::BF16, &[2, 4]);
        d.nodes.push(twin);
        let e = d.to_graph().unwrap_err();
        assert!(matches!(e, IrError::ParamConflict { .. }), "{e}");
    }

    #[test]
    fn round_trips_through_json() {
        let d = GraphDef::from_graph(&sample());
        assert_eq!(d.nodes.len(), 6);
        assert_eq!(d.inputs, vec![0]);
        let json = serde_json::to_string(&d).unwrap();
        let back: GraphDef = serde_json::from_str(&json).unwrap();
        assert_eq!(back, d);
        let g = back.to_graph().unwrap();
        crate::verify(&g).unwrap();
        assert_eq!(GraphDef::from_graph(&g), d);
    }

    #[test]
    fn rejects_forward_references_and_bad_inputs() {
        let mut d = GraphDef::from_graph(&sample());
        d.nodes[2].inputs[1] = (4, 0);
        let e = d.to_graph().unwrap_err().to_string();
        assert!(
            e.contains("node 2 (`matmul`)") && e.contains("not an earlier node"),
            "{e}"
        );
        let mut d = GraphDef::from_graph(&sample());
        d.inputs = vec![1];
        assert!(d.to_graph().unwrap_err().to_string().contains("not an input"));
        let mut d = GraphDef::from_graph(&sample());
        d.inputs = vec![];
        assert!(d.to_graph().unwrap_err().to_string().contains("not listed"));
        let mut d = GraphDef::from_graph(&sample());
        d.outputs[0].1 = (5, 1);
        assert!(d.to_graph().is_err());
        let mut d = GraphDef::from_graph(&sample());
        d.nodes[2].inputs.swap(0, 1);
        let e = d.to_graph().unwrap_err().to_string();
        assert!(e.contains("matmul"), "{e}");
    }

    #[test]
    fn rejects_inconsistent_constants_in_json() {
        let json = r#"{"dtype":"f32","shape":[1000000000000000],"bytes":[0,0,0,0]}"#;
        let e = serde_json::from_str::<TensorData>(json).unwrap_err().to_string();
        assert!(e.contains("too large"), "{e}");
        let json = r#"{"dtype":"f32","shape":[2],"bytes":[0,0,0,0]}"#;
        let e = serde_json::from_str::<TensorData>(json).unwrap_err().to_string();
        assert!(e.contains("needs 8 bytes, got 4"), "{e}");
    }

    #[test]
    fn depth_limit() {
        let mut d = GraphDef {
            name: "leaf".into(),
            inputs: vec![],
            nodes: vec![],
            outputs: vec![],
        };
        for _ in 0..=MAX_REGION_DEPTH {
            d = GraphDef {
                name: "outer".into(),
                inputs: vec![],
                nodes: vec![NodeDef {
                    op: Op::While,
                    inputs: vec![],
                    regions: vec![d],
                }],
                outputs: vec![],
            };
        }
        assert_eq!(d.region_depth(), MAX_REGION_DEPTH + 1);
        let e = d.to_graph().unwrap_err().to_string();
        assert!(e.contains("nest deeper than 64"), "{e}");
    }
}
