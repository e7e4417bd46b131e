//! The dataflow graph: nodes hold ops, edges carry values; regions hold sub-graphs.

use crate::error::IrError;
use crate::ops::{BinaryOp, Op, UnaryOp, infer_types};
use crate::ops::{Input, Param};
use crate::{DType, TensorData, TensorType};
use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, NodeIndexable};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;

/// A node's id (stable across removals of other nodes).
pub type NodeId = NodeIndex<u32>;

/// A value: output `output` of node `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId {
    /// The defining node.
    pub node: NodeId,
    /// Which of its outputs.
    pub output: u32,
}

impl ValueId {
    /// Output 0 of `node`.
    pub fn first(node: NodeId) -> ValueId {
        ValueId { node, output: 0 }
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.output == 0 {
            write!(f, "%{}", self.node.index())
        } else {
            write!(f, "%{}#{}", self.node.index(), self.output)
        }
    }
}

/// An edge: which output of the source feeds which operand of the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    /// Output index on the source node.
    pub output: u32,
    /// Operand index on the target node.
    pub input: u32,
}

/// A node: an op, its operands, its output types and its regions (sub-graphs).
#[derive(Clone, Debug)]
pub struct Node {
    /// The op.
    pub op: Op,
    inputs: Vec<ValueId>,
    outputs: Vec<TensorType>,
    /// Sub-graphs (control flow only).
    pub regions: Vec<Graph>,
}

impl Node {
    /// Operands, in order.
    pub fn inputs(&self) -> &[ValueId] {
        &self.inputs
    }
    /// Output types, in order.
    pub fn outputs(&self) -> &[TensorType] {
        &self.outputs
    }
}

/// A named graph output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// The name callers see.
    pub name: String,
    /// The value returned.
    pub value: ValueId,
}

/// A dataflow graph on petgraph. Operand order lives in each node; petgraph edges mirror it
/// so graph algorithms (topological order, users) work directly.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    name: String,
    dag: StableDiGraph<Node, Operand>,
    inputs: Vec<NodeId>,
    outputs: Vec<Output>,
    /// Names already used by inputs and params, so adding either is O(log n).
    input_names: BTreeMap<String, NodeId>,
    param_names: BTreeMap<String, NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: &str) -> Graph {
        Graph {
            name: name.to_string(),
            ..Graph::default()
        }
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Rename the graph.
    pub fn set_name(&mut self, name: &str) {
        self.name = name.to_string();
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.dag.node_count()
    }

    /// Node ids in index order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.dag.node_indices()
    }

    /// The node with this id, if it exists.
    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.dag.node_weight(id)
    }

    /// The node with this id. Panics if it was removed: ids come from this graph.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.dag[id]
    }

    /// The underlying petgraph (read-only), for graph algorithms.
    pub fn dag(&self) -> &StableDiGraph<Node, Operand> {
        &self.dag
    }

    /// The type of a value, if it exists.
    pub fn try_value_type(&self, v: ValueId) -> Option<&TensorType> {
        self.dag.node_weight(v.node)?.outputs.get(v.output as usize)
    }

    /// The type of a value. Panics if the value does not exist: ids come from this graph.
    pub fn value_type(&self, v: ValueId) -> &TensorType {
        self.try_value_type(v).expect("value of this graph")
    }

    /// Graph input nodes, in call order.
    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    /// Graph input values, in call order.
    pub fn input_values(&self) -> Vec<ValueId> {
        self.inputs.iter().map(|&n| ValueId::first(n)).collect()
    }

    /// Graph input names and types, in call order.
    pub fn input_specs(&self) -> Vec<(String, TensorType)> {
        self.inputs
            .iter()
            .filter_map(|&n| match &self.dag[n].op {
                Op::Input(Input { name, ty }) => Some((name.clone(), ty.clone())),
                _ => None,
            })
            .collect()
    }

    /// Graph input types, in call order.
    pub fn input_types(&self) -> Vec<TensorType> {
        self.inputs.iter().map(|&n| self.dag[n].outputs[0].clone()).collect()
    }

    /// Named outputs, in order.
    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    /// Output types, in order.
    pub fn output_types(&self) -> Vec<TensorType> {
        self.outputs
            .iter()
            .filter_map(|o| self.try_value_type(o.value).cloned())
            .collect()
    }

    /// Parameters (name, value) in node order.
    pub fn params(&self) -> Vec<(String, ValueId)> {
        self.dag
            .node_indices()
            .filter_map(|n| match &self.dag[n].op {
                Op::Param(Param { name, .. }) => Some((name.clone(), ValueId::first(n))),
                _ => None,
            })
            .collect()
    }

    fn insert(&mut self, node: Node) -> NodeId {
        let inputs = node.inputs.clone();
        let id = self.dag.add_node(node);
        for (i, v) in inputs.iter().enumerate() {
            self.dag.add_edge(
                v.node,
                id,
                Operand {
                    output: v.output,
                    input: i as u32,
                },
            );
        }
        id
    }

    /// Add a graph input (or region argument).
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> Result<ValueId, IrError> {
        if self.input_names.contains_key(name) {
            return Err(IrError::DuplicateInput {
                graph: self.name.clone(),
                name: name.to_string(),
            });
        }
        let op = Op::Input(Input {
            name: name.to_string(),
            ty: ty.clone(),
        });
        let id = self.insert(Node {
            op,
            inputs: vec![],
            outputs: vec![ty],
            regions: vec![],
        });
        self.inputs.push(id);
        self.input_names.insert(name.to_string(), id);
        Ok(ValueId::first(id))
    }

    /// Turn every parameter into a graph input named `prefix` + its name, appended after the
    /// existing inputs in parameter (node) order, so a compiled graph can take new weight
    /// values on every call without being compiled again.
    pub fn params_as_inputs(&mut self, prefix: &str) -> Result<(), IrError> {
        for (name, v) in self.params() {
            let input = format!("{prefix}{name}");
            if self.input_names.contains_key(&input) {
                return Err(IrError::DuplicateInput {
                    graph: self.name.clone(),
                    name: input,
                });
            }
            let node = v.node;
            let ty = self.value_type(v).clone();
            self.dag[node].op = Op::Input(Input {
                name: input.clone(),
                ty,
            });
            self.param_names.remove(&name);
            self.inputs.push(node);
            self.input_names.insert(input, node);
        }
        Ok(())
    }

    /// Add (or find) a named parameter; the same name must always have the same type.
    pub fn add_param(&mut self, name: &str, ty: TensorType) -> Result<ValueId, IrError> {
        if let Some(&node) = self.param_names.get(name) {
            let v = ValueId::first(node);
            let first = self.value_type(v);
            if *first != ty {
                return Err(IrError::ParamConflict {
                    name: name.to_string(),
                    first: first.to_string(),
                    second: ty.to_string(),
                });
            }
            return Ok(v);
        }
        let op = Op::Param(Param {
            name: name.to_string(),
            ty: ty.clone(),
        });
        let id = self.insert(Node {
            op,
            inputs: vec![],
            outputs: vec![ty],
            regions: vec![],
        });
        self.param_names.insert(name.to_string(), id);
        Ok(ValueId::first(id))
    }

    /// Add a constant.
    pub fn add_constant(&mut self, value: TensorData) -> ValueId {
        let ty = value.tensor_type();
        ValueId::first(self.insert(Node {
            op: Op::Constant(value),
            inputs: vec![],
            outputs: vec![ty],
            regions: vec![],
        }))
    }

    /// Add a scalar constant of `dtype` (shape `[]`).
    pub fn add_scalar(&mut self, dtype: DType, value: f64) -> ValueId {
        let t = TensorData::from_f64_slice(dtype, vec![], &[value]).expect("one element");
        self.add_constant(t)
    }

    /// Add an op (no regions); its output types come from the op's type rule.
    pub fn add_op(&mut self, op: Op, inputs: &[ValueId]) -> Result<Vec<ValueId>, IrError> {
        self.add_region_op(op, inputs, Vec::new())
    }

    /// Add an op with exactly one output and return it.
    pub fn add_op1(&mut self, op: Op, inputs: &[ValueId]) -> Result<ValueId, IrError> {
        let name = op.name();
        let outs = self.add_op(op, inputs)?;
        match outs.as_slice() {
            [v] => Ok(*v),
            _ => Err(IrError::Type {
                op: name.to_string(),
                value: "<new>".into(),
                detail: format!("expected one output, op has {}", outs.len()),
            }),
        }
    }

    /// Add an op holding regions (control flow).
    pub fn add_region_op(&mut self, op: Op, inputs: &[ValueId], regions: Vec<Graph>) -> Result<Vec<ValueId>, IrError> {
        if matches!(op, Op::Input(_)) {
            return Err(IrError::Structure {
                graph: self.name.clone(),
                detail: "graph inputs are added with add_input".into(),
            });
        }
        let mut types = Vec::with_capacity(inputs.len());
        for v in inputs {
            let t = self.try_value_type(*v).ok_or_else(|| IrError::BadOperand {
                op: op.name().to_string(),
                value: "<new>".into(),
                operand: v.to_string(),
            })?;
            types.push(t.clone());
        }
        if let Op::Param(Param { name, ty }) = &op {
            return self.add_param(name, ty.clone()).map(|v| vec![v]);
        }
        let outputs = infer_types(&op, &types, &regions).map_err(|detail| IrError::Type {
            op: op.name().to_string(),
            value: "<new>".into(),
            detail,
        })?;
        let n = outputs.len();
        let id = self.insert(Node {
            op,
            inputs: inputs.to_vec(),
            outputs,
            regions,
        });
        Ok((0..n as u32).map(|output| ValueId { node: id, output }).collect())
    }

    /// Elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: ValueId) -> Result<ValueId, IrError> {
        self.add_op1(Op::Unary(op), &[x])
    }

    /// Elementwise binary op.
    pub fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> Result<ValueId, IrError> {
        self.add_op1(Op::Binary(op), &[a, b])
    }

    /// Add a named output.
    pub fn add_output(&mut self, name: &str, value: ValueId) -> Result<(), IrError> {
        if self.outputs.iter().any(|o| o.name == name) {
            return Err(IrError::DuplicateOutput {
                graph: self.name.clone(),
                name: name.to_string(),
            });
        }
        if self.try_value_type(value).is_none() {
            return Err(IrError::BadOperand {
                op: "output".into(),
                value: name.to_string(),
                operand: value.to_string(),
            });
        }
        self.outputs.push(Output {
            name: name.to_string(),
            value,
        });
        Ok(())
    }

    /// Users of a value: (node, operand index), sorted.
    pub fn users(&self, v: ValueId) -> Vec<(NodeId, usize)> {
        let mut u: Vec<_> = self
            .dag
            .edges_directed(v.node, Direction::Outgoing)
            .filter(|e| e.weight().output == v.output)
            .map(|e| (e.target(), e.weight().input as usize))
            .collect();
        u.sort();
        u
    }

    /// Point operand `index` of `node` at `value`. The value must have the same type.
    pub fn set_operand(&mut self, node: NodeId, index: usize, value: ValueId) -> Result<(), IrError> {
        let old = self.dag[node].inputs[index];
        if self.try_value_type(old) != self.try_value_type(value) {
            return Err(IrError::Structure {
                graph: self.name.clone(),
                detail: format!(
                    "cannot replace operand {old} of %{} with {value}: types differ",
                    node.index()
                ),
            });
        }
        let edge = self
            .dag
            .edges_directed(node, Direction::Incoming)
            .find(|e| e.weight().input as usize == index)
            .map(|e| e.id())
            .expect("every operand has an edge");
        self.dag.remove_edge(edge);
        self.dag.add_edge(
            value.node,
            node,
            Operand {
                output: value.output,
                input: index as u32,
            },
        );
        self.dag[node].inputs[index] = value;
        Ok(())
    }

    /// Replace every use of `old` (operands and graph outputs) by `new` of the same type.
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) -> Result<(), IrError> {
        for (node, index) in self.users(old) {
            self.set_operand(node, index, new)?;
        }
        for o in &mut self.outputs {
            if o.value == old {
                o.value = new;
            }
        }
        Ok(())
    }

    /// Replace a node's op by another with the same operand and output types.
    pub fn replace_op(&mut self, node: NodeId, op: Op) -> Result<(), IrError> {
        let types: Vec<_> = self.dag[node]
            .inputs
            .iter()
            .map(|v| self.value_type(*v).clone())
            .collect();
        let outs = infer_types(&op, &types, &self.dag[node].regions).map_err(|detail| IrError::Type {
            op: op.name().into(),
            value: format!("%{}", node.index()),
            detail,
        })?;
        if outs != self.dag[node].outputs {
            return Err(IrError::Structure {
                graph: self.name.clone(),
                detail: format!(
                    "replacing %{} with `{}` changes its output types",
                    node.index(),
                    op.name()
                ),
            });
        }
        self.dag[node].op = op;
        Ok(())
    }

    /// Mutable access to a node's op without re-checking types: for in-place rewrites that
    /// keep the node's types (the pass manager verifies the graph after each pass). Renaming an
    /// input or param this way is not supported: their names are indexed.
    pub fn op_mut(&mut self, node: NodeId) -> &mut Op {
        &mut self.dag[node].op
    }

    /// Remove a node that nothing uses (no users, not an output, not an input).
    pub fn remove_node(&mut self, node: NodeId) -> Result<(), IrError> {
        let used = self.dag.edges_directed(node, Direction::Outgoing).next().is_some()
            || self.outputs.iter().any(|o| o.value.node == node)
            || self.inputs.contains(&node);
        if used {
            return Err(IrError::Structure {
                graph: self.name.clone(),
                detail: format!("cannot remove %{}: it is still used", node.index()),
            });
        }
        self.forget_names(node);
        self.dag.remove_node(node);
        Ok(())
    }

    /// Remove every node whose values cannot reach an output; returns how many were removed.
    /// Graph inputs are kept (they are part of the signature).
    pub fn remove_dead_nodes(&mut self) -> usize {
        let mut live: BTreeSet<NodeId> = self.inputs.iter().copied().collect();
        let mut stack: Vec<NodeId> = self.outputs.iter().map(|o| o.value.node).collect();
        while let Some(n) = stack.pop() {
            if live.insert(n) {
                stack.extend(self.dag[n].inputs.iter().map(|v| v.node));
            }
        }
        let dead: Vec<_> = self.dag.node_indices().filter(|n| !live.contains(n)).collect();
        for &n in &dead {
            self.forget_names(n);
            self.dag.remove_node(n);
        }
        dead.len()
    }

    fn forget_names(&mut self, node: NodeId) {
        if let Op::Param(Param { name, .. }) = &self.dag[node].op
            && self.param_names.get(name) == Some(&node)
        {
            self.param_names.remove(name);
        }
    }

    /// A deterministic topological order: among ready nodes, the lowest id first. For a graph
    /// whose ids are already topologically ordered (e.g. freshly parsed) this is id order.
    pub fn topo_order(&self) -> Vec<NodeId> {
        let mut indegree: Vec<usize> = vec![0; self.dag.node_bound()];
        for n in self.dag.node_indices() {
            indegree[n.index()] = self.dag[n].inputs.len();
        }
        let mut ready: BinaryHeap<std::cmp::Reverse<NodeId>> = self
            .dag
            .node_indices()
            .filter(|n| indegree[n.index()] == 0)
            .map(std::cmp::Reverse)
            .collect();
        let mut order = Vec::with_capacity(self.dag.node_count());
        while let Some(std::cmp::Reverse(n)) = ready.pop() {
            order.push(n);
            for e in self.dag.edges_directed(n, Direction::Outgoing) {
                let t = e.target();
                indegree[t.index()] -= 1;
                if indegree[t.index()] == 0 {
                    ready.push(std::cmp::Reverse(t));
                }
            }
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dim, Shape};

    #[test]
    fn build_use_and_rewrite() {
        let mut g = Graph::new("t");
        let x = g
            .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(4)]))
            .unwrap();
        let w = g.add_param("w", TensorType::of(DType::F32, &[4, 3])).unwrap();
        assert_eq!(g.add_param("w", TensorType::of(DType::F32, &[4, 3])).unwrap(), w);
        assert!(g.add_param("w", TensorType::of(DType::F32, &[3])).is_err());
        let y = g.add_op1(Op::MatMul, &[x, w]).unwrap();
        assert_eq!(g.value_type(y).to_string(), "f32[N,3]");
        let e = g.unary(UnaryOp::Exp, y).unwrap();
        let n = g.unary(UnaryOp::Neg, y).unwrap();
        g.add_output("y", e).unwrap();
        assert!(g.add_output("y", e).is_err());
        assert_eq!(g.users(y).len(), 2);
        g.replace_all_uses(e, n).unwrap();
        assert_eq!(g.outputs()[0].value, n);
        assert_eq!(g.remove_dead_nodes(), 1);
        assert_eq!(g.topo_order().len(), 4);
        assert!(g.remove_node(x.node).is_err());
    }

    #[test]
    fn type_errors_name_op_and_shapes() {
        let mut g = Graph::new("t");
        let a = g.add_input("a", TensorType::of(DType::F32, &[2, 3])).unwrap();
        let b = g.add_input("b", TensorType::of(DType::F32, &[4, 5])).unwrap();
        let err = g.add_op1(Op::MatMul, &[a, b]).unwrap_err().to_string();
        assert!(
            err.contains("matmul") && err.contains("f32[2,3]") && err.contains("f32[4,5]"),
            "{err}"
        );
        let i = g
            .add_input("i", TensorType::new(DType::I32, Shape::of(&[2, 3])))
            .unwrap();
        let err = g.binary(BinaryOp::Add, a, i).unwrap_err().to_string();
        assert!(err.contains("add") && err.contains("i32[2,3]"), "{err}");
        assert!(g.add_input("a", TensorType::of(DType::F32, &[1])).is_err());
    }
}
