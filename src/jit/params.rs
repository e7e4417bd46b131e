//! Values computed from parameters alone, computed once.

use crate::error::Result;
use oar_ir::file::Model;
use oar_ir::ops::Param;
use oar_ir::{Composite, Graph, NodeId, Op, TensorData, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// Largest folded value that may exceed the parameters it comes from (a broadcast of a scalar
/// stays in the graph past this).
const SMALL_BYTES: usize = 64 << 10;

/// Evaluate every value of `model`'s graph that depends on parameters and constants alone
/// (a weight's quantization, a batch norm folded into a convolution's weight, a transposed
/// weight) and is read by something that does not, and make each a new parameter: named
/// `<weight>.int8` for a quantization, `<weight>.folded` otherwise (the weight being the first
/// parameter it comes from). The graph then computes them never again, and weights nothing
/// reads any more leave the model. Random draws, control flow, dequantizations (their integers
/// stay the parameter) and values much larger than their parameters are left alone. Returns how many values became parameters.
pub fn fold_parameters(model: &mut Model) -> Result<usize> {
    let g = &model.graph;
    let order = g.topo_order();
    // Nodes computable from parameters and constants, and the first parameter behind each.
    let mut root: BTreeMap<NodeId, Option<String>> = BTreeMap::new();
    for &n in &order {
        let node = g.node(n);
        let r = match &node.op {
            Op::Param(Param { name, .. }) if model.weights.contains_key(name) => Some(name.clone()),
            Op::Constant(_) => None,
            // A dequantization stays computed: its integers are the parameter (a quarter of
            // the float bytes, and what the `quantize` pass multiplies).
            Op::Input(_)
            | Op::Param(_)
            | Op::Random(_)
            | Op::Iota(_)
            | Op::Composite(Composite::Dropout(_) | Composite::DequantizeLinear(_)) => {
                continue;
            }
            _ if !node.regions.is_empty()
                || node.inputs().is_empty()
                || !node.inputs().iter().all(|v| root.contains_key(&v.node)) =>
            {
                continue;
            }
            _ => node.inputs().iter().find_map(|v| root[&v.node].clone()),
        };
        root.insert(n, r);
    }
    let leaf = |n: NodeId| matches!(g.node(n).op, Op::Param(_) | Op::Constant(_));
    // The frontier: computed values something else reads (or the graph returns).
    let mut frontier: BTreeSet<ValueId> = BTreeSet::new();
    for &n in &order {
        if root.contains_key(&n) {
            continue;
        }
        for v in g.node(n).inputs() {
            if root.contains_key(&v.node) && !leaf(v.node) {
                frontier.insert(*v);
            }
        }
    }
    for o in g.outputs() {
        if root.contains_key(&o.value.node) && !leaf(o.value.node) {
            frontier.insert(o.value);
        }
    }
    if frontier.is_empty() {
        return Ok(0);
    }
    // Evaluate the frontier's cones, in order.
    let mut values: BTreeMap<NodeId, Vec<TensorData>> = BTreeMap::new();
    let needed = cone(g, &frontier, &root);
    for &n in order.iter().filter(|n| needed.contains(n)) {
        let node = g.node(n);
        let out = match &node.op {
            Op::Param(Param { name, .. }) => vec![model.weights[name].clone()],
            Op::Constant(t) => vec![t.clone()],
            op => {
                let ins: Vec<TensorData> = node
                    .inputs()
                    .iter()
                    .map(|v| values[&v.node][v.output as usize].clone())
                    .collect();
                oar_backend_reference::run_op(op, &ins)?
            }
        };
        values.insert(n, out);
    }
    let mut folded = 0;
    let g = &mut model.graph;
    for v in frontier {
        let t = &values[&v.node][v.output as usize];
        let source_bytes: usize = cone(g, &BTreeSet::from([v]), &root)
            .iter()
            .filter_map(|&n| match &g.node(n).op {
                Op::Param(Param { name, .. }) => model.weights.get(name).map(|w| w.bytes().len()),
                _ => None,
            })
            .sum();
        if t.bytes().len() > SMALL_BYTES.max(source_bytes) {
            continue;
        }
        let base = root[&v.node].clone().unwrap_or_else(|| "constant".to_string());
        let kind = match g.node(v.node).op {
            Op::Composite(Composite::QuantizeLinear(_)) => "int8",
            _ => "folded",
        };
        let mut name = format!("{base}.{kind}");
        let mut k = 1;
        while model.weights.contains_key(&name) {
            k += 1;
            name = format!("{base}.{kind}{k}");
        }
        let p = g.add_param(&name, t.tensor_type())?;
        g.replace_all_uses(v, p)?;
        model.weights.insert(name, t.clone());
        folded += 1;
    }
    if folded > 0 {
        g.remove_dead_nodes();
        let live: BTreeSet<String> = g.params().into_iter().map(|(n, _)| n).collect();
        model.weights.retain(|name, _| live.contains(name));
    }
    Ok(folded)
}

/// The nodes `values` are computed from (within `known`).
fn cone(g: &Graph, values: &BTreeSet<ValueId>, known: &BTreeMap<NodeId, Option<String>>) -> BTreeSet<NodeId> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<NodeId> = values.iter().map(|v| v.node).collect();
    while let Some(n) = stack.pop() {
        if known.contains_key(&n) && seen.insert(n) {
            stack.extend(g.node(n).inputs().iter().map(|v| v.node));
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::ops::{BinaryOp, Broadcast, DequantizeLinear, QuantizeLinear};
    use oar_ir::{DType, Dim, TensorType};

    fn run(m: &Model, x: &TensorData) -> Vec<f32> {
        let feeds = BTreeMap::from([("x".to_string(), x.clone())]);
        let out = oar_backend_reference::run_graph(&m.graph, &m.weights, &feeds).unwrap();
        out[0].1.to_vec::<f32>().unwrap()
    }

    /// `x @ (2·w) + dequantize(quantize(b)) + broadcast(1)`: the doubled weight and the
    /// quantized bias become parameters `w.folded` and `b.int8` (the float `w` and `b` leave the
    /// model), the 32K-element broadcast of a scalar stays computed, the outputs stay the same.
    #[test]
    fn parameter_only_values_become_parameters() {
        let mut g = Graph::new("m");
        let x = g.add_input("x", TensorType::of(DType::F32, &[3, 4])).unwrap();
        let w = g.add_param("w", TensorType::of(DType::F32, &[4, 128])).unwrap();
        let b = g.add_param("b", TensorType::of(DType::F32, &[128])).unwrap();
        let two = g.add_scalar(DType::F32, 2.0);
        let w2 = g.binary(BinaryOp::Mul, w, two).unwrap();
        let y = g.add_op1(Op::MatMul, &[x, w2]).unwrap();
        let s = g.add_scalar(DType::F32, 0.01);
        let z = g.add_scalar(DType::I8, 0.0);
        let bq = g
            .add_op1(
                Op::Composite(Composite::QuantizeLinear(QuantizeLinear {
                    axis: 0,
                    dtype: DType::I8,
                })),
                &[b, s, z],
            )
            .unwrap();
        let bd = g
            .add_op1(
                Op::Composite(Composite::DequantizeLinear(DequantizeLinear { axis: 0 })),
                &[bq, s, z],
            )
            .unwrap();
        let y = g.binary(BinaryOp::Add, y, bd).unwrap();
        let one = g.add_scalar(DType::F32, 1.0);
        let big = g
            .add_op1(
                Op::Broadcast(Broadcast {
                    shape: vec![Dim::Static(64), Dim::Static(3), Dim::Static(128)],
                }),
                &[one],
            )
            .unwrap();
        let y = g.binary(BinaryOp::Add, y, big).unwrap();
        g.add_output("y", y).unwrap();
        let vals = |n: usize, k: f32| (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) * k).collect::<Vec<f32>>();
        let weights = BTreeMap::from([
            (
                "w".to_string(),
                TensorData::from_vec(vec![4, 128], vals(512, 0.1)).unwrap(),
            ),
            (
                "b".to_string(),
                TensorData::from_vec(vec![128], vals(128, 0.003)).unwrap(),
            ),
        ]);
        let mut m = Model { graph: g, weights };
        let x = TensorData::from_vec(vec![3, 4], vals(12, 0.5)).unwrap();
        let before = run(&m, &x);
        assert_eq!(fold_parameters(&mut m).unwrap(), 2);
        let names: Vec<&String> = m.weights.keys().collect();
        assert_eq!(names, ["b.int8", "w.folded"]);
        assert_eq!(m.weights["b.int8"].dtype(), DType::I8);
        let text = m.graph.to_string();
        assert!(
            !text.contains("= mul(") && !text.contains("= quantize_linear("),
            "{text}"
        );
        assert!(text.contains("broadcast"), "the broadcast stays: {text}");
        assert_eq!(run(&m, &x), before);
        assert_eq!(fold_parameters(&mut m).unwrap(), 0, "nothing left");
    }
}
