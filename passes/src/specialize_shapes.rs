//! Shape specialization: bind symbolic dims (`N`) to sizes, so later passes and code generators
//! see static shapes. Input and param types and every shape attribute (reshape, broadcast, iota,
//! random) that names a bound symbol are rewritten, in regions too, and every type is inferred
//! again, so a binding that contradicts the graph is an error naming the op.

use crate::{Pass, PassError};
use oar_ir::ops::{Input, Param};
use oar_ir::{Dim, Graph, IrError, NodeId, Op, TensorType, ValueId};
use std::collections::{BTreeMap, HashMap};

/// The shape-specialization pass; without bindings it changes nothing.
#[derive(Clone, Debug, Default)]
pub struct SpecializeShapes {
    binds: BTreeMap<String, usize>,
}

impl SpecializeShapes {
    /// Bind each named symbol to its size: `SpecializeShapes::new([("N", 8)])`.
    pub fn new<S: AsRef<str>>(binds: impl IntoIterator<Item = (S, usize)>) -> SpecializeShapes {
        SpecializeShapes {
            binds: binds.into_iter().map(|(s, n)| (s.as_ref().to_string(), n)).collect(),
        }
    }

    /// The bindings, by symbol.
    pub fn bindings(&self) -> &BTreeMap<String, usize> {
        &self.binds
    }

    fn dims(&self, dims: &[Dim]) -> Vec<Dim> {
        dims.iter().map(|d| d.bind(&|s| self.binds.get(s).copied())).collect()
    }

    fn ty(&self, t: &TensorType) -> TensorType {
        TensorType::new(t.dtype, self.dims(t.shape.dims()))
    }

    /// `op` with every bound symbol in its attributes replaced.
    fn op(&self, op: &Op) -> Op {
        let mut op = op.clone();
        if let Op::Input(Input { ty, .. }) | Op::Param(Param { ty, .. }) = &mut op {
            *ty = self.ty(ty);
        }
        if let Some(shape) = op.shape_attr_mut() {
            *shape = self.dims(shape);
        }
        op
    }

    /// True if any type or attribute in `graph` (regions included) names a bound symbol.
    fn mentions(&self, graph: &Graph) -> bool {
        let bound = |dims: &[Dim]| {
            dims.iter()
                .any(|d| d.symbols().iter().any(|s| self.binds.contains_key(s)))
        };
        graph.node_ids().any(|id| {
            let n = graph.node(id);
            n.outputs().iter().any(|t| bound(t.shape.dims()))
                || self.op(&n.op) != n.op
                || n.regions.iter().any(|r| self.mentions(r))
        })
    }

    /// A copy of `graph` with bound symbols replaced and types inferred again.
    fn rebuild(&self, graph: &Graph) -> Result<Graph, IrError> {
        let mut out = Graph::new(graph.name());
        let mut map: HashMap<NodeId, Vec<ValueId>> = HashMap::new();
        for &id in graph.inputs() {
            if let Op::Input(Input { name, ty }) = &graph.node(id).op {
                map.insert(id, vec![out.add_input(name, self.ty(ty))?]);
            }
        }
        for id in graph.topo_order() {
            if map.contains_key(&id) {
                continue;
            }
            let n = graph.node(id);
            let operands: Vec<ValueId> = n.inputs().iter().map(|v| map[&v.node][v.output as usize]).collect();
            let regions = n
                .regions
                .iter()
                .map(|r| self.rebuild(r))
                .collect::<Result<Vec<_>, _>>()?;
            let values = match &n.op {
                Op::Constant(t) => vec![out.add_constant(t.clone())],
                op => out.add_region_op(self.op(op), &operands, regions)?,
            };
            map.insert(id, values);
        }
        for o in graph.outputs() {
            out.add_output(&o.name, map[&o.value.node][o.value.output as usize])?;
        }
        Ok(out)
    }
}

impl Pass for SpecializeShapes {
    fn name(&self) -> &'static str {
        "specialize-shapes"
    }

    fn description(&self) -> &'static str {
        "bind symbolic dims to sizes (e.g. N=8) in input/param types and shape attributes, re-infer types"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        if self.binds.is_empty() || !self.mentions(graph) {
            return Ok(false);
        }
        *graph = self.rebuild(graph).map_err(|e| PassError::ir(self.name(), e))?;
        Ok(true)
    }
}
