//! Graph statistics for `oar inspect`: op counts, parameter sizes, FLOP estimates.

use crate::graph::Graph;
use crate::ops::Param;
use crate::ops::{Op, flops};
use std::collections::BTreeMap;

/// Summary numbers of a graph (regions included).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Nodes per op mnemonic.
    pub op_counts: BTreeMap<String, usize>,
    /// Number of distinct parameters.
    pub params: usize,
    /// Total parameter elements (static shapes only).
    pub param_elements: u64,
    /// Total parameter bytes.
    pub param_bytes: u64,
    /// Estimated FLOPs of one run, with symbolic dims bound as given; `None` if a shape
    /// stayed symbolic. Loops count their body once.
    pub flops: Option<u64>,
}

/// Compute the statistics, binding symbolic dims with `bind` for the FLOP estimate.
pub fn graph_stats(graph: &Graph, bind: &dyn Fn(&str) -> Option<usize>) -> GraphStats {
    let mut s = GraphStats {
        flops: Some(0),
        ..GraphStats::default()
    };
    let mut seen = std::collections::BTreeSet::new();
    collect(graph, bind, &mut s, &mut seen);
    s
}

fn collect(
    graph: &Graph,
    bind: &dyn Fn(&str) -> Option<usize>,
    s: &mut GraphStats,
    seen: &mut std::collections::BTreeSet<String>,
) {
    for id in graph.node_ids() {
        let node = graph.node(id);
        *s.op_counts.entry(node.op.name().to_string()).or_default() += 1;
        if let Op::Param(Param { name, ty }) = &node.op
            && seen.insert(name.clone())
        {
            s.params += 1;
            let n = ty.shape.bind(bind).num_elements().unwrap_or(0) as u64;
            s.param_elements += n;
            s.param_bytes += n * ty.dtype.size_bytes() as u64;
        }
        let ins: Vec<_> = node
            .inputs()
            .iter()
            .map(|v| {
                let t = graph.value_type(*v);
                crate::TensorType::new(t.dtype, t.shape.bind(bind))
            })
            .collect();
        let outs: Vec<_> = node
            .outputs()
            .iter()
            .map(|t| crate::TensorType::new(t.dtype, t.shape.bind(bind)))
            .collect();
        let f = flops(&node.op, &ins, &outs);
        s.flops = s.flops.zip(f).map(|(a, b)| a.saturating_add(b));
        for r in &node.regions {
            collect(r, bind, s, seen);
        }
    }
}
