//! Decompose composite ops into primitives, except those a backend keeps.

use crate::regions::rewrite_regions;
use crate::{Pass, PassError};
use oar_ir::decompose::{composite_names, decompose};
use oar_ir::{Composite, Graph, IrError, Op, TensorType, ValueId};
use std::collections::BTreeSet;

/// Which instances of a kept composite stay whole, given its operands' types (a backend whose
/// native kernel covers only some dtypes or attributes decomposes the rest).
pub type KeepIf = fn(&Composite, &[TensorType]) -> bool;

/// Replace every composite node (in regions too) by its decomposition into primitives; the
/// composites named in the keep-list stay (a backend's native ops), where `keep_if` agrees.
#[derive(Clone, Debug, Default)]
pub struct Decompose {
    keep: BTreeSet<&'static str>,
    keep_if: Option<KeepIf>,
}

impl Decompose {
    /// Decompose every composite.
    pub fn all() -> Decompose {
        Decompose::default()
    }

    /// Decompose every composite except those named (mnemonics such as `softmax`, `sdpa`).
    pub fn keeping(names: &[&str]) -> Result<Decompose, PassError> {
        let mut keep = BTreeSet::new();
        for name in names {
            let known = composite_names()
                .iter()
                .find(|n| *n == name)
                .ok_or_else(|| PassError::UnknownComposite {
                    name: name.to_string(),
                    known: composite_names().join(", "),
                })?;
            keep.insert(*known);
        }
        Ok(Decompose { keep, keep_if: None })
    }

    /// [`Decompose::keeping`], keeping a named composite only where `keep_if` holds for it.
    pub fn keeping_where(names: &[&str], keep_if: KeepIf) -> Result<Decompose, PassError> {
        Ok(Decompose {
            keep_if: Some(keep_if),
            ..Decompose::keeping(names)?
        })
    }

    /// The composites this pass leaves in place.
    pub fn kept(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.keep.iter().copied()
    }

    fn keeps(&self, graph: &Graph, c: &Composite, inputs: &[ValueId]) -> bool {
        self.keep.contains(c.name())
            && self.keep_if.is_none_or(|keep_if| {
                let types: Vec<TensorType> = inputs.iter().map(|&v| graph.value_type(v).clone()).collect();
                keep_if(c, &types)
            })
    }

    fn run_on(&self, graph: &mut Graph) -> Result<bool, IrError> {
        let mut changed = false;
        for node in graph.topo_order() {
            let (op, inputs) = match &graph.node(node).op {
                Op::Composite(c) if !self.keeps(graph, c, graph.node(node).inputs()) => {
                    (c.clone(), graph.node(node).inputs().to_vec())
                }
                _ => continue,
            };
            let outs = decompose(&op, graph, &inputs)?;
            for (i, v) in outs.into_iter().enumerate() {
                graph.replace_all_uses(ValueId { node, output: i as u32 }, v)?;
            }
            graph.remove_node(node)?;
            changed = true;
        }
        let in_regions = rewrite_regions(graph, &mut |r| self.run_on(r))?;
        Ok(changed || in_regions)
    }
}

impl Pass for Decompose {
    fn name(&self) -> &'static str {
        "decompose"
    }

    fn description(&self) -> &'static str {
        "replace composite ops by primitives, except a backend's keep-list"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        self.run_on(graph).map_err(|e| PassError::ir(self.name(), e))
    }
}
