//! Fusion: turn a graph of primitives into a [`KernelProgram`].
//!
//! Which values get a buffer (are *materialized*) decides everything else: every other value
//! is computed inline inside each kernel that reads it. The rule, applied to a fixpoint:
//!
//! 1. graph outputs, results and operands of opaque ops are materialized;
//! 2. each materialized value is built as one kernel by walking back through inline values
//!    (`fuse_build.rs`): elementwise ops become instructions, movement ops fold into index
//!    maps, and one contraction (matmul, conv) read at the output point becomes the kernel's
//!    anchor, with everything after it as the epilogue; reductions read at the output point,
//!    or broadcast back over the rows of the output (`x - mean(x)`), become reduction stages
//!    computed once per row before the epilogue (a layer_norm or softmax is one kernel);
//! 3. a walk that cannot express something asks for a value to be materialized; so does an
//!    anchor claimed by two kernels (its work would be duplicated), and an inline value
//!    computed more than once (by several kernels, or at several points) whose cone costs more
//!    than [`RECOMPUTE_LIMIT`] — cheap producers (a subtraction, `exp(x - max)`) are
//!    recomputed instead of stored;
//! 4. repeat until no walk asks for anything (the materialized set only grows, so this ends).

use crate::decompose::KeepIf;
use crate::fuse_build::{Body, BufferTable, KernelBuilder, MAX_INLINE_DEPTH, Phase, Role, Stop, identity, role};
use crate::{Decompose, Pass, PassError};
use oar_ir::kernel::{
    AffineExpr, BufferKind, Contraction, ContractionKernel, Kernel, KernelBody, KernelProgram, LoopKernel,
    OpaqueKernel, Operand, ScalarOp,
};
use oar_ir::ops::Conv;
use oar_ir::ops::UnaryOp;
use oar_ir::{Graph, IrError, Op, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// An inline value computed more than once is recomputed if its cone costs at most this
/// (elementwise op 1, transcendental or division 4, movement 0), else it is materialized.
pub const RECOMPUTE_LIMIT: usize = 8;

/// The fusion pass for pipelines: fuses a copy of the graph, leaves the graph unchanged, and
/// records the kernel count it would produce (see [`Fuse::last_kernel_count`]).
#[derive(Debug, Default)]
pub struct Fuse {
    kernels: std::sync::Mutex<Option<usize>>,
}

impl Fuse {
    /// Kernels produced by the last run, if it ran.
    pub fn last_kernel_count(&self) -> Option<usize> {
        *self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Pass for Fuse {
    fn name(&self) -> &'static str {
        "fuse"
    }

    fn description(&self) -> &'static str {
        "check that the graph fuses into kernels (graph unchanged; see oar_passes::fuse::fuse)"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let program = fuse(graph)?;
        *self.kernels.lock().unwrap_or_else(|e| e.into_inner()) = Some(program.kernels.len());
        Ok(false)
    }
}

fn err(graph: &Graph, detail: String) -> PassError {
    PassError::ir(
        "fuse",
        IrError::Structure {
            graph: graph.name().to_string(),
            detail,
        },
    )
}

/// The standard pipeline of a kernel-consuming backend: `graph` specialized to `bindings`
/// (`N → 8`), canonicalized, folded, CSE'd, simplified, DCE'd, then [`fuse`]d (which
/// decomposes every composite first).
pub fn lower_to_kernels(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<KernelProgram, PassError> {
    lower_to_kernels_keeping(graph, bindings, &[])
}

/// [`lower_to_kernels`] for a backend that implements some composites itself: those named in
/// `keep` (`softmax`, `layer_norm`, `sdpa`, ... — [`Decompose::keeping`]'s names) stay whole,
/// each an [`OpaqueKernel`] holding `Op::Composite`. An unknown name is
/// [`PassError::UnknownComposite`].
pub fn lower_to_kernels_keeping(
    graph: &Graph,
    bindings: &BTreeMap<String, usize>,
    keep: &[&str],
) -> Result<KernelProgram, PassError> {
    lower_to_kernels_keeping_where(graph, bindings, keep, |_, _| true)
}

/// [`lower_to_kernels_keeping`], keeping a named composite only where `keep_if` holds for its
/// operands' types (the others are decomposed).
pub fn lower_to_kernels_keeping_where(
    graph: &Graph,
    bindings: &BTreeMap<String, usize>,
    keep: &[&str],
    keep_if: KeepIf,
) -> Result<KernelProgram, PassError> {
    lower_with(graph, bindings, keep, keep_if, false)
}

/// [`lower_to_kernels_keeping_where`] for a backend that runs the kernels reading only weights
/// once per model instead of in every run (the cpu backend's hoisting): inference batch norms
/// fold into the convolutions before them first ([`crate::FoldBatchNorm`]: the new weights and
/// biases are computed from weights alone), and a value computed from weights alone (a batch
/// norm's `γ / sqrt(σ² + ε)`) that a kernel over inputs reads gets a kernel of its own instead
/// of being computed inline in every element of that kernel.
pub fn lower_to_kernels_hoisting_weights(
    graph: &Graph,
    bindings: &BTreeMap<String, usize>,
    keep: &[&str],
    keep_if: KeepIf,
) -> Result<KernelProgram, PassError> {
    lower_with(graph, bindings, keep, keep_if, true)
}

fn lower_with(
    graph: &Graph,
    bindings: &BTreeMap<String, usize>,
    keep: &[&str],
    keep_if: KeepIf,
    weights_once: bool,
) -> Result<KernelProgram, PassError> {
    use crate::{Canonicalize, Cse, Dce, Fold, PassManager, Simplify, SpecializeShapes};
    let mut g = graph.clone();
    let mut pm = PassManager::new();
    if weights_once {
        pm.add(crate::FoldBatchNorm);
    }
    pm.add(SpecializeShapes::new(bindings.iter().map(|(k, v)| (k.clone(), *v))))
        .add(Canonicalize)
        .add(Fold::new())
        .add(Cse);
    // Spelled-out composites the caller keeps whole become that composite again.
    if let Some(r) = crate::Recompose::only(keep) {
        pm.add(r);
    }
    pm.add(Simplify::new()).add(Dce);
    pm.run(&mut g)?;
    fuse_with(&g, keep, keep_if, weights_once)
}

/// Fuse `graph` into kernels. Composite ops are decomposed first (on a copy), so any verified
/// graph is accepted; control-flow regions stay inside opaque kernels.
pub fn fuse(graph: &Graph) -> Result<KernelProgram, PassError> {
    fuse_keeping(graph, &[])
}

/// [`fuse`], keeping the composites named in `keep` whole (each an opaque kernel).
pub fn fuse_keeping(graph: &Graph, keep: &[&str]) -> Result<KernelProgram, PassError> {
    fuse_keeping_where(graph, keep, |_, _| true)
}

/// [`fuse_keeping`], keeping a named composite only where `keep_if` holds for it.
pub fn fuse_keeping_where(graph: &Graph, keep: &[&str], keep_if: KeepIf) -> Result<KernelProgram, PassError> {
    fuse_with(graph, keep, keep_if, false)
}

fn fuse_with(graph: &Graph, keep: &[&str], keep_if: KeepIf, weights_once: bool) -> Result<KernelProgram, PassError> {
    oar_ir::verify(graph).map_err(|e| PassError::ir("fuse", e))?;
    let decompose = Decompose::keeping_where(keep, keep_if)?;
    let kept: BTreeSet<&str> = decompose.kept().collect();
    let mut g = graph.clone();
    decompose.run(&mut g)?;
    g.remove_dead_nodes();
    fuse_graph(&g, &kept, weights_once)
}

/// Fuse a graph that holds primitives only (top level; regions are not looked into).
pub fn fuse_primitives(g: &Graph) -> Result<KernelProgram, PassError> {
    fuse_graph(g, &BTreeSet::new(), false)
}

/// Fuse a graph of primitives and the composites in `kept` (opaque kernels); with
/// `weights_once`, for a runtime that runs weight-only kernels once per model.
fn fuse_graph(g: &Graph, kept: &BTreeSet<&str>, weights_once: bool) -> Result<KernelProgram, PassError> {
    let order = g.topo_order();
    let mut materialized: BTreeSet<ValueId> = g.outputs().iter().map(|o| o.value).collect();
    for &n in &order {
        let node = g.node(n);
        if let Op::Composite(c) = &node.op
            && !kept.contains(c.name())
        {
            return Err(err(
                g,
                format!("composite `{}` at %{}: run `decompose` first", c.name(), n.index()),
            ));
        }
        if role(g, node) == Role::Opaque {
            materialized.extend(node.inputs().iter().copied());
            materialized.extend((0..node.outputs().len() as u32).map(|output| ValueId { node: n, output }));
        }
    }
    // A matmul or convolution read through a cast to an integer dtype (conv_integer's exact
    // f64 sums cast to i32) keeps its result in a buffer of its own dtype: runtimes compute a
    // contraction into a buffer of its accumulator's dtype, the cast is a loop of its own.
    for &n in &order {
        let node = g.node(n);
        if !matches!(node.op, Op::MatMul | Op::Conv(_)) {
            continue;
        }
        let v = ValueId::first(n);
        let to_int = g
            .users(v)
            .iter()
            .any(|&(u, _)| matches!(&g.node(u).op, Op::Cast(c) if !c.to.is_float()));
        if to_int && g.value_type(v).dtype.is_float() {
            materialized.insert(v);
        }
    }
    // A value with several users whose cone holds an anchor, read by something other than a
    // same-shape elementwise op (a reduction, a broadcast, a contraction), ends up in a buffer
    // anyway: decide it up front so no kernel claims its anchor first.
    for &n in &order {
        let v = ValueId::first(n);
        let node = g.node(n);
        if !matches!(role(g, node), Role::Elementwise | Role::Anchor) || g.users(v).len() < 2 {
            continue;
        }
        let shape = &g.value_type(v).shape;
        let foreign = g
            .users(v)
            .iter()
            .any(|&(u, _)| role(g, g.node(u)) != Role::Elementwise || g.value_type(ValueId::first(u)).shape != *shape);
        if foreign && has_epilogue_anchor(g, &materialized, v) {
            materialized.insert(v);
        }
    }
    // A one-element value that takes a few ops to compute (a traced optimizer's bias
    // correction `lr / (1 - β^t)`, with `pow` expanded) and is read by a kernel over many
    // elements gets its own one-element kernel: inline, it would be recomputed for every
    // element of the reader (an MLP step's AdamW update ran ~150 scalar f64 ops per weight).
    for &n in &order {
        let node = g.node(n);
        if !matches!(role(g, node), Role::Elementwise | Role::Movement) {
            continue;
        }
        for output in 0..node.outputs().len() as u32 {
            let v = ValueId { node: n, output };
            if materialized.contains(&v) || g.value_type(v).shape.num_elements() != Some(1) {
                continue;
            }
            let wide_reader = g
                .users(v)
                .iter()
                .any(|&(u, _)| g.value_type(ValueId::first(u)).shape.num_elements() != Some(1));
            if wide_reader && cone_cost(g, &materialized, v, &mut BTreeSet::new()) >= SCALAR_HOIST_COST {
                materialized.insert(v);
            }
        }
    }
    // For a runtime that runs weight-only kernels once per model (the cpu backend's hoisting):
    // a value computed from weights alone (params and constants: a batch norm folded into a
    // convolution's bias, a weight's scale) and read by a kernel over inputs gets a buffer of
    // its own, computed once instead of in every run, and the reader sees a weight (a
    // per-channel bias, which a native epilogue recognizes). Movement ops in between stay index
    // maps over that buffer. (Elsewhere it would be one more kernel per run.)
    let weights_only = if weights_once {
        weight_only_nodes(g, &order)
    } else {
        BTreeSet::new()
    };
    for &n in &order {
        if weights_only.contains(&n) || matches!(role(g, g.node(n)), Role::Leaf | Role::Opaque) {
            continue;
        }
        for &x in g.node(n).inputs() {
            let mut v = x;
            while weights_only.contains(&v.node) && role(g, g.node(v.node)) == Role::Movement {
                v = g.node(v.node).inputs()[0];
            }
            if weights_only.contains(&v.node) && role(g, g.node(v.node)) == Role::Elementwise {
                materialized.insert(v);
            }
        }
    }
    // Chains deeper than a kernel computes inline get a buffer every so many ops up front, in
    // one linear pass (`Stop::Deep` would find the same cuts one round at a time).
    let mut depth: BTreeMap<ValueId, usize> = BTreeMap::new();
    for &n in &order {
        let node = g.node(n);
        if role(g, node) == Role::Leaf {
            continue;
        }
        let below = node
            .inputs()
            .iter()
            .filter(|x| !materialized.contains(x))
            .map(|x| depth.get(x).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        for output in 0..node.outputs().len() as u32 {
            let v = ValueId { node: n, output };
            let d = if materialized.contains(&v) { 0 } else { below + 1 };
            if d >= MAX_INLINE_DEPTH - 8 {
                materialized.insert(v);
                depth.insert(v, 0);
            } else {
                depth.insert(v, d);
            }
        }
    }
    // Each round adds at least one value, so at most one round per value (plus one).
    // (Quadratic in the worst case; fine for the graphs of today, see docs/KERNELS.md.)
    let limit = order.iter().map(|&n| g.node(n).outputs().len()).sum::<usize>() + 2;
    for _ in 0..limit {
        match build_all(g, &order, &materialized)? {
            Ok(program) => return Ok(program),
            Err(needs) => {
                let before = materialized.len();
                materialized.extend(needs);
                if materialized.len() == before {
                    return Err(err(g, "fusion made no progress (internal error)".into()));
                }
            }
        }
    }
    Err(err(g, "fusion did not converge (internal error)".into()))
}

/// The nodes of `g` (in topological `order`) computed from params and constants alone: no
/// input, no random draw, no region, no op that makes values from nothing (`iota`).
fn weight_only_nodes(g: &Graph, order: &[oar_ir::NodeId]) -> BTreeSet<oar_ir::NodeId> {
    let mut pure = BTreeSet::new();
    for &n in order {
        let node = g.node(n);
        let ok = match &node.op {
            Op::Param(_) | Op::Constant(_) => true,
            Op::Input(_) | Op::Random(_) | Op::Composite(oar_ir::Composite::Dropout(_)) => false,
            _ => {
                node.regions.is_empty()
                    && !node.inputs().is_empty()
                    && node.inputs().iter().all(|x| pure.contains(&x.node))
            }
        };
        if ok {
            pure.insert(n);
        }
    }
    pure
}

/// [`cone_cost`] from which a one-element value read by a wider kernel gets its own kernel
/// (a division or one transcendental op; cheaper scalar chains stay inline).
const SCALAR_HOIST_COST: usize = 4;

/// Cost of recomputing the inline cone of `v` (stops at buffers; anchors are never recomputed).
fn cone_cost(g: &Graph, materialized: &BTreeSet<ValueId>, v: ValueId, seen: &mut BTreeSet<ValueId>) -> usize {
    // An explicit stack: cones can be chains of any length.
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        if !seen.insert(v) || materialized.contains(&v) {
            continue;
        }
        let node = g.node(v.node);
        total = total.saturating_add(match (&node.op, role(g, node)) {
            (_, Role::Leaf) => continue,
            (_, Role::Anchor | Role::Opaque) => {
                total = total.saturating_add(1000);
                continue;
            }
            (_, Role::Movement) => 0,
            (Op::Unary(u), _) if u.float_only() && !matches!(u, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round) => 4,
            (Op::Binary(oar_ir::ops::BinaryOp::Div | oar_ir::ops::BinaryOp::Pow), _) => 4,
            _ => 1,
        });
        stack.extend(node.inputs().iter().copied());
    }
    total
}

/// True if `v` is a contraction or a same-shape elementwise function of one (a would-be
/// epilogue). Reductions do not count: one read back over its rows (a mean broadcast into
/// `x - mean`) becomes a reduction stage of the reader's kernel (see `fuse_build.rs`), and one
/// claimed by several kernels is materialized by the claim count.
fn has_epilogue_anchor(g: &Graph, materialized: &BTreeSet<ValueId>, v: ValueId) -> bool {
    // An explicit stack: elementwise chains can be of any length.
    let mut seen = BTreeSet::new();
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        if materialized.contains(&v) || !seen.insert(v) {
            continue;
        }
        let node = g.node(v.node);
        match role(g, node) {
            Role::Anchor if !matches!(node.op, Op::Reduce(_)) => return true,
            Role::Elementwise => stack.extend(
                node.inputs()
                    .iter()
                    .filter(|&&x| g.value_type(x).shape == g.value_type(v).shape),
            ),
            _ => {}
        }
    }
    false
}

/// The value to materialize for an anchor several kernels read: the top of the chain of
/// single-user, same-shape elementwise values above it, so its kernel keeps them as epilogue.
fn epilogue_head(g: &Graph, materialized: &BTreeSet<ValueId>, anchor: ValueId) -> ValueId {
    let shape = &g.value_type(anchor).shape;
    let mut v = anchor;
    loop {
        let users = g.users(v);
        if users.len() != 1 || g.outputs().iter().any(|o| o.value == v) {
            return v;
        }
        let u = ValueId::first(users[0].0);
        let node = g.node(u.node);
        if role(g, node) != Role::Elementwise || g.value_type(u).shape != *shape || materialized.contains(&u) {
            return v;
        }
        v = u;
    }
}

type Built = Result<KernelProgram, BTreeSet<ValueId>>;

/// Build every kernel for this materialized set, or return the values that must be added.
fn build_all(g: &Graph, order: &[oar_ir::NodeId], materialized: &BTreeSet<ValueId>) -> Result<Built, PassError> {
    let mut table = BufferTable::default();
    // Every graph input has a buffer, used or not: the signature stays the graph's.
    for &n in g.inputs() {
        table.of(g, ValueId::first(n));
    }
    let mut kernels = Vec::new();
    let mut needs = BTreeSet::new();
    let mut deep = BTreeSet::new();
    let mut anchor_claims: BTreeMap<ValueId, usize> = BTreeMap::new();
    let mut computed: BTreeMap<ValueId, usize> = BTreeMap::new();
    for &n in order {
        let node = g.node(n);
        let outs: Vec<ValueId> = (0..node.outputs().len() as u32)
            .map(|output| ValueId { node: n, output })
            .collect();
        if role(g, node) == Role::Leaf || !outs.iter().any(|v| materialized.contains(v)) {
            continue;
        }
        let name = format!("k{}", kernels.len());
        if role(g, node) == Role::Opaque {
            let inputs = node.inputs().iter().map(|&v| table.of(g, v)).collect();
            let outputs = outs.iter().map(|&v| table.of(g, v)).collect();
            let regions = node.regions.iter().map(oar_ir::text::print_graph).collect();
            kernels.push(Kernel {
                name: format!("{name}_{}", node.op.name()),
                body: KernelBody::Opaque(OpaqueKernel {
                    op: node.op.clone(),
                    inputs,
                    regions,
                }),
                outputs,
            });
            continue;
        }
        let v = outs[0];
        match build_one(g, materialized, &mut table, v, name) {
            Ok((kernel, claims, inlined)) => {
                for a in claims {
                    *anchor_claims.entry(a).or_default() += 1;
                }
                for (x, _) in inlined {
                    *computed.entry(x).or_default() += 1;
                }
                kernels.push(kernel);
            }
            // Only the first (most upstream) request per round: materializing it often
            // resolves later kernels' conflicts better than what they asked for.
            Err(Stop::Need(x)) => {
                if needs.is_empty() {
                    needs.insert(x);
                }
            }
            // Structural, not a conflict: every kernel's deep operand gets its buffer now.
            Err(Stop::Deep(x)) => {
                deep.insert(x);
            }
        }
    }
    // Sharing decisions first: they often resolve the walks' conflicts in a better way than
    // materializing what the walks asked for (which only ever grows the set).
    let mut shared: BTreeSet<ValueId> = anchor_claims
        .into_iter()
        .filter(|&(_, c)| c > 1)
        .map(|(a, _)| epilogue_head(g, materialized, a))
        .collect();
    for (x, count) in computed {
        if count > 1 && cone_cost(g, materialized, x, &mut BTreeSet::new()) > RECOMPUTE_LIMIT {
            shared.insert(x);
        }
    }
    if !shared.is_empty() {
        return Ok(Err(shared));
    }
    if !needs.is_empty() || !deep.is_empty() {
        needs.extend(deep);
        return Ok(Err(needs));
    }
    let mut outputs = Vec::new();
    for o in g.outputs() {
        let b = table.of(g, o.value);
        if table.buffers[b.index()].kind == BufferKind::Temp {
            table.buffers[b.index()].kind = BufferKind::Output;
        }
        outputs.push((o.name.clone(), b));
    }
    Ok(Ok(KernelProgram {
        name: g.name().to_string(),
        buffers: table.buffers,
        kernels,
        outputs,
    }))
}

/// A kernel, the anchors it claims (its contraction or its reduction stages), and the values
/// it computes inline with their maps.
type OneKernel = (Kernel, Vec<ValueId>, BTreeSet<(ValueId, Vec<AffineExpr>)>);

/// Build the kernel writing materialized value `v`.
fn build_one(
    g: &Graph,
    materialized: &BTreeSet<ValueId>,
    table: &mut BufferTable,
    v: ValueId,
    name: String,
) -> Result<OneKernel, Stop> {
    let ty = g.value_type(v).clone();
    let rank = ty.rank();
    let mut kb = KernelBuilder::new(g, materialized, table, rank);
    let mut body = Body::new(Phase::Output);
    let top = kb.expand(&mut body, v, identity(rank))?;
    if top + 1 != body.insts.len() {
        // The root resolved to an earlier instruction (e.g. a reshape chain): store a copy.
        body.insts.push(oar_ir::kernel::Inst {
            op: ScalarOp::Cast(top),
            dtype: ty.dtype,
        });
    }
    let mut ops: Vec<&'static str> = body
        .insts
        .iter()
        .filter_map(|i| match &i.op {
            ScalarOp::Unary(u, _) => Some(u.name()),
            ScalarOp::Binary(b, ..) => Some(b.name()),
            ScalarOp::Where(..) => Some("where"),
            ScalarOp::Cast(_) => Some("cast"),
            _ => None,
        })
        .collect();
    ops.dedup();
    ops.truncate(4);
    let anchor = kb.anchor;
    let kind = match anchor.map(|a| (a, g.node(a.node))) {
        None => KernelBody::Loop(LoopKernel {
            shape: ty.shape.0.clone(),
            loads: std::mem::take(&mut kb.loads),
            outer: kb.outer.unwrap_or(rank),
            reduce: kb.stages.iter().map(|(_, r)| r.clone()).collect(),
            body: body.insts,
        }),
        Some((a, node)) => {
            let contraction = match &node.op {
                Op::Conv(Conv {
                    stride,
                    pad_before,
                    pad_after,
                    dilation,
                    groups,
                }) => Contraction::Conv(Conv {
                    stride: stride.clone(),
                    pad_before: pad_before.clone(),
                    pad_after: pad_after.clone(),
                    dilation: dilation.clone(),
                    groups: *groups,
                }),
                _ => Contraction::MatMul,
            };
            let [l, r] = [node.inputs()[0], node.inputs()[1]];
            let lhs = Operand::new(g.value_type(l).shape.0.clone(), kb.operand(l)?);
            let rhs = Operand::new(g.value_type(r).shape.0.clone(), kb.operand(r)?);
            KernelBody::Contraction(ContractionKernel {
                op: contraction,
                lhs,
                rhs,
                acc_dtype: g.value_type(a).dtype,
                shape: ty.shape.0.clone(),
                loads: std::mem::take(&mut kb.loads),
                epilogue: body.insts,
            })
        }
    };
    let claims: Vec<ValueId> = anchor.into_iter().chain(kb.stages.iter().map(|(v, _)| *v)).collect();
    let anchor_names = claims.iter().map(|a| g.node(a.node).op.name());
    let label: Vec<&str> = anchor_names.chain(ops).collect();
    let name = if label.is_empty() {
        format!("{name}_copy")
    } else {
        format!("{name}_{}", label.join("_"))
    };
    let out = kb.table.of(g, v);
    let inlined = std::mem::take(&mut kb.inlined);
    Ok((
        Kernel {
            name,
            body: kind,
            outputs: vec![out],
        },
        claims,
        inlined,
    ))
}
