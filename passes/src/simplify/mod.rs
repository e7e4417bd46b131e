//! E-graph simplification: equality saturation with egg over the pure primitive ops of a graph.
//!
//! Every pure, single-output primitive (elementwise, reductions, movement, gather, cast, iota,
//! matmul, conv) becomes an e-node whose payload is the op with its attributes; everything else
//! — inputs, params, constants, control flow, random, scatter, composites, multi-output nodes —
//! is an opaque leaf referring to its original value. The rules ([`rules`], one file per topic)
//! run under node, iteration and time limits; the cheapest form by the [`cost`] model is
//! extracted and rebuilt through the `Graph` API (types re-inferred), reusing unchanged nodes,
//! and the uses of each rewritten value move to the new one. Regions of control-flow ops are
//! simplified the same way, each on its own.

pub mod cost;
pub mod lang;
pub mod rules;

use crate::regions::rewrite_regions;
use crate::{Pass, PassError};
use cost::OarCost;
use egg::{Extractor, Id, Language, Runner};
use lang::{LeafInfo, LeafRef, OarAnalysis, OarEGraph, OarLang, OpKey, SplatConst};
use oar_ir::{Graph, IrError, Node, NodeId, Op, TensorData, ValueId};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The `simplify` pass: equality saturation over pure primitive regions, cost-based extraction.
///
/// ```
/// # use oar_passes::Simplify;
/// # use std::time::Duration;
/// let pass = Simplify::new().node_limit(20_000).iter_limit(8).time_limit(Duration::from_millis(100));
/// ```
#[derive(Clone, Debug)]
pub struct Simplify {
    node_limit: usize,
    iter_limit: usize,
    time_limit: Duration,
}

impl Default for Simplify {
    fn default() -> Simplify {
        Simplify {
            node_limit: 50_000,
            iter_limit: 16,
            time_limit: Duration::from_millis(250),
        }
    }
}

/// What one e-graph run (the top level or one region) did.
#[derive(Clone, Debug, PartialEq)]
pub struct SimplifyStats {
    /// Ops translated into the e-graph.
    pub ops: usize,
    /// Why saturation stopped (`Saturated`, or the limit that was hit).
    pub stop_reason: String,
    /// Saturation iterations run.
    pub iterations: usize,
    /// E-nodes at the end.
    pub egraph_nodes: usize,
    /// Values whose uses moved to a rebuilt value.
    pub replaced: usize,
}

impl SimplifyStats {
    /// True if saturation stopped at the node, iteration or time limit.
    pub fn hit_limit(&self) -> bool {
        self.stop_reason != "Saturated"
    }
}

impl Simplify {
    /// The default configuration: 50 000 e-nodes, 16 iterations, 250 ms per e-graph.
    pub fn new() -> Simplify {
        Simplify::default()
    }

    /// Stop saturating once the e-graph holds this many e-nodes.
    pub fn node_limit(mut self, n: usize) -> Simplify {
        self.node_limit = n;
        self
    }

    /// Stop saturating after this many iterations.
    pub fn iter_limit(mut self, n: usize) -> Simplify {
        self.iter_limit = n;
        self
    }

    /// Stop saturating after this much time (per e-graph: the top level and each region).
    pub fn time_limit(mut self, t: Duration) -> Simplify {
        self.time_limit = t;
        self
    }

    /// Simplify `graph` and its regions; one [`SimplifyStats`] per e-graph run, top level first.
    pub fn run_with_stats(&self, graph: &mut Graph) -> Result<Vec<SimplifyStats>, PassError> {
        let mut stats = Vec::new();
        self.simplify(graph, &mut stats)
            .map_err(|e| PassError::ir(self.name(), e))?;
        Ok(stats)
    }

    fn simplify(&self, graph: &mut Graph, stats: &mut Vec<SimplifyStats>) -> Result<bool, IrError> {
        let changed = self.simplify_top(graph, stats)?;
        let in_regions = rewrite_regions(graph, &mut |r| self.simplify(r, stats))?;
        Ok(changed || in_regions)
    }

    fn simplify_top(&self, graph: &mut Graph, stats: &mut Vec<SimplifyStats>) -> Result<bool, IrError> {
        let tr = Translation::new(graph);
        if tr.translated.is_empty() {
            return Ok(false);
        }
        let ops = tr.translated.len();
        let runner = Runner::default()
            .with_egraph(tr.egraph)
            .with_node_limit(self.node_limit)
            .with_iter_limit(self.iter_limit)
            .with_time_limit(self.time_limit)
            .run(&rules::all_rules());
        let eg = &runner.egraph;
        let extractor = Extractor::new(eg, OarCost::new(eg));
        let mut b = Builder {
            eg,
            extractor,
            built: HashMap::new(),
            existing: tr.existing,
            splats: HashMap::new(),
            new_nodes: Vec::new(),
        };
        let mut replaced = 0;
        for root in &tr.roots {
            let (new, leaf_rank) = b.build(graph, root.class)?;
            // A term whose leaves come after an opaque consumer of the root would make a cycle.
            if new == root.value || leaf_rank > root.consumer_rank {
                continue;
            }
            let (old_ty, new_ty) = (graph.value_type(root.value), graph.value_type(new));
            if old_ty != new_ty {
                return Err(IrError::Structure {
                    graph: graph.name().to_string(),
                    detail: format!("simplify rebuilt {} ({old_ty}) as {new} ({new_ty})", root.value),
                });
            }
            graph.replace_all_uses(root.value, new)?;
            replaced += 1;
        }
        let mut candidates: HashSet<NodeId> = tr.live_before;
        candidates.extend(b.new_nodes);
        remove_unused(graph, &candidates)?;
        let stop_reason = runner
            .stop_reason
            .as_ref()
            .map_or("Saturated".to_string(), |r| format!("{r:?}"));
        stats.push(SimplifyStats {
            ops,
            stop_reason,
            iterations: runner.iterations.len(),
            egraph_nodes: runner.egraph.total_number_of_nodes(),
            replaced,
        });
        Ok(replaced > 0)
    }
}

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn description(&self) -> &'static str {
        "e-graph simplification (egg): algebra, movement, broadcast and cast rules, cost-based extraction"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        self.run_with_stats(graph).map(|s| s.iter().any(|s| s.replaced > 0))
    }
}

/// True for the ops that become e-nodes: pure primitives with one output and no regions.
fn translatable(node: &Node) -> bool {
    use Op::*;
    node.outputs().len() == 1
        && node.regions.is_empty()
        && matches!(
            node.op,
            Unary(_)
                | Binary(_)
                | Where
                | Reduce(_)
                | ArgReduce(_)
                | Reshape(_)
                | Permute(_)
                | Broadcast(_)
                | Slice(_)
                | Pad(_)
                | Concat(_)
                | Gather(_)
                | Cast(_)
                | Iota(_)
                | MatMul
                | Conv(_)
        )
}

/// A value whose uses may move: a graph output or an operand of an opaque node.
struct Root {
    value: ValueId,
    class: Id,
    /// 1 + the lowest topological rank of its opaque consumers (`usize::MAX` if none): leaves of
    /// a replacement must rank below every consumer, so the rebuilt graph stays acyclic.
    consumer_rank: usize,
}

/// The graph as an e-graph.
struct Translation {
    egraph: OarEGraph,
    roots: Vec<Root>,
    translated: Vec<NodeId>,
    /// Translated nodes that had uses (those the pass may delete once unused).
    live_before: HashSet<NodeId>,
    /// Original translated nodes by (op, operands), so unchanged parts are reused.
    existing: HashMap<(OpKey, Vec<ValueId>), ValueId>,
}

/// Elements scanned to recognise a uniform constant.
const SPLAT_SCAN_LIMIT: usize = 1 << 20;

/// The common value of a constant's elements, if they are all equal and exact as f64.
fn splat_value(t: &TensorData) -> Option<f64> {
    if t.is_empty() || t.len() > SPLAT_SCAN_LIMIT {
        return None;
    }
    let vals = t.to_f64_vec();
    let first = vals[0];
    let exact = !t.dtype().is_int() || first.abs() <= 9_007_199_254_740_992.0;
    (exact && vals.iter().all(|v| v.to_bits() == first.to_bits())).then_some(first)
}

impl Translation {
    fn new(graph: &Graph) -> Translation {
        let order = graph.topo_order();
        let rank: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i + 1)).collect();
        let mut egraph = OarEGraph::new(OarAnalysis::default());
        let mut class_of: HashMap<ValueId, Id> = HashMap::new();
        let mut translated = Vec::new();
        let mut existing = HashMap::new();
        for &n in &order {
            let node = graph.node(n);
            if !translatable(node) {
                continue;
            }
            let mut kids = Vec::with_capacity(node.inputs().len());
            for &v in node.inputs() {
                let id = *class_of.entry(v).or_insert_with(|| {
                    let def = graph.node(v.node);
                    let splat = match &def.op {
                        Op::Constant(t) => splat_value(t),
                        _ => None,
                    };
                    egraph.analysis.leaves.push(LeafInfo {
                        value: v,
                        ty: graph.value_type(v).clone(),
                        splat,
                        rank: rank[&v.node],
                    });
                    egraph.add(OarLang::Leaf(LeafRef(egraph.analysis.leaves.len() as u32 - 1)))
                });
                kids.push(id);
            }
            let key = egraph.analysis.ops.borrow_mut().intern(node.op.clone());
            existing.insert((key, node.inputs().to_vec()), ValueId::first(n));
            let id = egraph.add(OarLang::Op(key, kids));
            class_of.insert(ValueId::first(n), id);
            translated.push(n);
        }
        let translated_set: HashSet<NodeId> = translated.iter().copied().collect();
        let outputs: HashSet<ValueId> = graph.outputs().iter().map(|o| o.value).collect();
        let mut roots = Vec::new();
        let mut live_before = HashSet::new();
        for &n in &translated {
            let v = ValueId::first(n);
            let users = graph.users(v);
            if !users.is_empty() || outputs.contains(&v) {
                live_before.insert(n);
            }
            let opaque = users.iter().filter(|(u, _)| !translated_set.contains(u));
            let consumer_rank = opaque.map(|(u, _)| rank[u]).min();
            if consumer_rank.is_some() || outputs.contains(&v) {
                roots.push(Root {
                    value: v,
                    class: class_of[&v],
                    consumer_rank: consumer_rank.unwrap_or(usize::MAX),
                });
            }
        }
        Translation {
            egraph,
            roots,
            translated,
            live_before,
            existing,
        }
    }
}

/// Rebuilds extracted terms into the graph.
struct Builder<'a> {
    eg: &'a OarEGraph,
    extractor: Extractor<'a, OarCost<'a>, OarLang, OarAnalysis>,
    /// Built classes: value and the highest rank of its leaves (0: none).
    built: HashMap<Id, (ValueId, usize)>,
    existing: HashMap<(OpKey, Vec<ValueId>), ValueId>,
    splats: HashMap<SplatConst, ValueId>,
    new_nodes: Vec<NodeId>,
}

impl Builder<'_> {
    /// The value of class `root`'s cheapest term (iterative: chains can be thousands deep).
    fn build(&mut self, graph: &mut Graph, root: Id) -> Result<(ValueId, usize), IrError> {
        let mut stack = vec![(self.eg.find(root), false)];
        while let Some((c, expanded)) = stack.pop() {
            if self.built.contains_key(&c) {
                continue;
            }
            let node = self.extractor.find_best_node(c).clone();
            let kids: Vec<Id> = node.children().iter().map(|&k| self.eg.find(k)).collect();
            if !expanded {
                stack.push((c, true));
                stack.extend(kids.iter().filter(|k| !self.built.contains_key(k)).map(|&k| (k, false)));
                continue;
            }
            let built = match &node {
                OarLang::Leaf(l) => {
                    let leaf = &self.eg.analysis.leaves[l.0 as usize];
                    (leaf.value, leaf.rank)
                }
                OarLang::Splat(s) => (self.splat(graph, s)?, 0),
                OarLang::Op(k, _) => {
                    let mut vals = Vec::with_capacity(kids.len());
                    let mut rank = 0;
                    for k in &kids {
                        let &(v, r) = self.built.get(k).ok_or_else(|| cycle(graph, c))?;
                        vals.push(v);
                        rank = rank.max(r);
                    }
                    let key = (*k, vals);
                    let v = match self.existing.get(&key) {
                        Some(&v) => v,
                        None => {
                            let op = self.eg.analysis.ops.borrow().op(*k).clone();
                            let v = graph.add_op1(op, &key.1)?;
                            self.new_nodes.push(v.node);
                            self.existing.insert(key, v);
                            v
                        }
                    };
                    (v, rank)
                }
            };
            self.built.insert(c, built);
        }
        Ok(self.built[&self.eg.find(root)])
    }

    fn splat(&mut self, graph: &mut Graph, s: &SplatConst) -> Result<ValueId, IrError> {
        if let Some(&v) = self.splats.get(s) {
            return Ok(v);
        }
        let data = TensorData::full(s.dtype, s.shape.clone(), s.value()).map_err(|e| IrError::Structure {
            graph: graph.name().to_string(),
            detail: format!("simplify could not make constant {s}: {e}"),
        })?;
        let v = graph.add_constant(data);
        self.new_nodes.push(v.node);
        self.splats.insert(s.clone(), v);
        Ok(v)
    }
}

fn cycle(graph: &Graph, c: Id) -> IrError {
    IrError::Structure {
        graph: graph.name().to_string(),
        detail: format!("simplify extracted a cyclic term at e-class {c}"),
    }
}

/// Remove the `candidates` that nothing uses any more, consumers before producers.
fn remove_unused(graph: &mut Graph, candidates: &HashSet<NodeId>) -> Result<(), IrError> {
    let outputs: HashSet<NodeId> = graph.outputs().iter().map(|o| o.value.node).collect();
    let mut order = graph.topo_order();
    order.reverse();
    for n in order {
        if candidates.contains(&n) && !outputs.contains(&n) && graph.users(ValueId::first(n)).is_empty() {
            graph.remove_node(n)?;
        }
    }
    Ok(())
}
