//! Building one kernel: walk back from a materialized value through the values fused into it,
//! folding movement ops into index maps and elementwise ops into SSA instructions.
//!
//! A walk that meets something it cannot express (a second anchor, an anchor read at another
//! point than the output point, a reshape of non-contiguous data, an elementwise producer of a
//! contraction operand) stops with [`Stop::Need`]: the driver materializes that value and
//! rebuilds (see `fuse.rs`).

use oar_ir::graph::Node;
use oar_ir::kernel::{AffineExpr, Buffer, BufferId, BufferKind, IndexMap, Inst, Load, Reduction, ScalarOp};
use oar_ir::ops::Float;
use oar_ir::ops::{Input, Param, Permute, Reduce, Slice};
use oar_ir::{DType, Dim, Graph, Op, TensorType, ValueId};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// An index map under construction: one affine expression per axis of a value.
pub(crate) type Map = Vec<AffineExpr>;

/// Why a walk stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// This value must be materialized in a buffer first.
    Need(ValueId),
    /// This value is [`MAX_INLINE_DEPTH`] ops below the kernel's root: it gets a buffer of its
    /// own, so a chain of any length becomes a bounded number of bounded kernels (and neither
    /// this recursion nor code generation grows with it).
    Deep(ValueId),
}

/// How deep a kernel computes values inline before it reads an operand from a buffer.
pub(crate) const MAX_INLINE_DEPTH: usize = 200;

/// How a node takes part in fusion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Input, param, constant.
    Leaf,
    /// Unary, binary, where, cast: an instruction.
    Elementwise,
    /// Permute, broadcast, slice (resolvable), reshape: folded into index maps.
    Movement,
    /// Reduce (a reduction stage; several per kernel when they share the outer loops), matmul,
    /// conv (one per kernel, not beside stages).
    Anchor,
    /// Anything else: a kernel of its own.
    Opaque,
}

/// The role of a node in fusion.
pub(crate) fn role(g: &Graph, node: &Node) -> Role {
    match &node.op {
        Op::Input(_) | Op::Param(_) | Op::Constant(_) => Role::Leaf,
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_) => Role::Elementwise,
        Op::Permute(_) | Op::Broadcast(_) | Op::Reshape(_) => Role::Movement,
        Op::Slice(Slice { ranges }) => {
            let ty = g.value_type(node.inputs()[0]);
            let ok = ranges
                .iter()
                .zip(ty.shape.dims())
                .all(|(r, d)| r.is_full() || d.as_static().is_some());
            if ok { Role::Movement } else { Role::Opaque }
        }
        Op::Reduce(_) | Op::MatMul | Op::Conv(_) => Role::Anchor,
        _ => Role::Opaque,
    }
}

/// The value of a one-element constant, inlined into bodies instead of loaded.
pub(crate) fn scalar_const(node: &Node) -> Option<f64> {
    match &node.op {
        Op::Constant(t) if t.len() == 1 => t.to_f64_vec().first().copied(),
        _ => None,
    }
}

/// Buffers by the value they hold, created on first use.
#[derive(Default)]
pub(crate) struct BufferTable {
    /// Buffer of each value.
    pub ids: BTreeMap<ValueId, BufferId>,
    /// The buffers.
    pub buffers: Vec<Buffer>,
}

impl BufferTable {
    /// The buffer holding `v` (leaf kinds from the op; everything else `Temp` for now).
    pub fn of(&mut self, g: &Graph, v: ValueId) -> BufferId {
        if let Some(&b) = self.ids.get(&v) {
            return b;
        }
        let kind = match &g.node(v.node).op {
            Op::Input(Input { name, .. }) => BufferKind::Input { name: name.clone() },
            Op::Param(Param { name, .. }) => BufferKind::Param { name: name.clone() },
            Op::Constant(t) => BufferKind::Constant(t.clone()),
            _ => BufferKind::Temp,
        };
        let id = BufferId(self.buffers.len() as u32);
        self.buffers.push(Buffer {
            kind,
            ty: g.value_type(v).clone(),
            value: v.to_string(),
        });
        self.ids.insert(v, id);
        id
    }
}

/// Where a body is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// At output points: an anchor met at the output point becomes `Acc`.
    Output,
    /// Inside a reduction: anchors cannot be fused here.
    Reduce,
}

/// One SSA body under construction.
pub(crate) struct Body {
    pub insts: Vec<Inst>,
    memo: HashMap<(ValueId, Map), usize>,
    phase: Phase,
}

impl Body {
    pub fn new(phase: Phase) -> Body {
        Body {
            insts: Vec::new(),
            memo: HashMap::new(),
            phase,
        }
    }

    fn push(&mut self, op: ScalarOp, dtype: DType) -> usize {
        self.insts.push(Inst { op, dtype });
        self.insts.len() - 1
    }
}

/// The state of building one kernel.
pub(crate) struct KernelBuilder<'a> {
    pub g: &'a Graph,
    /// Values held in buffers (besides leaves).
    pub materialized: &'a BTreeSet<ValueId>,
    pub table: &'a mut BufferTable,
    /// Rank of the output: loops `0..out_rank` are output loops.
    pub out_rank: usize,
    pub loads: Vec<Load>,
    load_ids: HashMap<Load, usize>,
    /// The contraction (matmul, conv) fused at the output point, if any.
    pub anchor: Option<ValueId>,
    /// The leading output loops the reduction stages run per, once the first stage is fused.
    pub outer: Option<usize>,
    /// Reduction stages, in evaluation order, and the reduce value each computes.
    pub stages: Vec<(ValueId, Reduction)>,
    /// Non-movement values computed inline, with the map they were computed at.
    pub inlined: BTreeSet<(ValueId, Map)>,
    /// How many values are being computed inline, nested, right now.
    depth: usize,
}

/// Identity map over `rank` loops.
pub(crate) fn identity(rank: usize) -> Map {
    (0..rank).map(AffineExpr::loop_index).collect()
}

/// The map of an operand broadcast (numpy, right-aligned) to a result read at `map`.
fn broadcast_map(from: &[Dim], to: &[Dim], map: &Map) -> Map {
    let off = to.len() - from.len();
    from.iter()
        .enumerate()
        .map(|(a, d)| {
            if *d == Dim::Static(1) && to[a + off] != Dim::Static(1) {
                AffineExpr::constant(0)
            } else {
                map[a + off].clone()
            }
        })
        .collect()
}

/// If `to` only inserts or removes size-1 axes of `from`, the map of `from` read at `map`.
fn unit_reshape_map(from: &[Dim], to: &[Dim], map: &Map) -> Option<Map> {
    let one = Dim::Static(1);
    let to_axes: Vec<usize> = (0..to.len()).filter(|&a| to[a] != one).collect();
    let from_dims: Vec<&Dim> = from.iter().filter(|d| **d != one).collect();
    if from_dims.len() != to_axes.len() || from_dims.iter().zip(&to_axes).any(|(d, &a)| **d != to[a]) {
        return None;
    }
    let mut k = 0;
    Some(
        from.iter()
            .map(|d| {
                if *d == one {
                    AffineExpr::constant(0)
                } else {
                    k += 1;
                    map[to_axes[k - 1]].clone()
                }
            })
            .collect(),
    )
}

/// One step back through a movement op.
enum Step {
    /// Continue at this value and map.
    Next(ValueId, Map),
    /// The value is a view of this buffer (a reshape of contiguous data).
    View(BufferId, IndexMap),
}

impl<'a> KernelBuilder<'a> {
    pub fn new(g: &'a Graph, materialized: &'a BTreeSet<ValueId>, table: &'a mut BufferTable, out_rank: usize) -> Self {
        KernelBuilder {
            g,
            materialized,
            table,
            out_rank,
            loads: Vec::new(),
            load_ids: HashMap::new(),
            anchor: None,
            outer: None,
            stages: Vec::new(),
            inlined: BTreeSet::new(),
            depth: 0,
        }
    }

    /// The outer loop count at which reduce `v`, read at `map`, can be a reduction stage of
    /// this kernel: at the output point (`outer` = rank: a plain reduction), or at a row point
    /// — its kept axes read at loops `0..q` in order, its kept unit axes at 0 (a mean broadcast
    /// back over a row: `outer` = q). `None` if it is read anywhere else.
    fn stage_outer(&self, v: ValueId, map: &Map, phase: Phase) -> Option<usize> {
        let Op::Reduce(Reduce { axes, keepdim, .. }) = &self.g.node(v.node).op else {
            return None;
        };
        let rank = self.ty(self.g.node(v.node).inputs()[0]).rank();
        if phase == Phase::Output && map.len() == self.out_rank && map.iter().enumerate().all(|(a, e)| e.is_loop(a)) {
            return Some(self.out_rank);
        }
        let mut out_axis = 0;
        let mut kept = 0;
        for a in 0..rank {
            if axes.contains(&a) {
                if *keepdim {
                    if *map.get(out_axis)? != AffineExpr::constant(0) {
                        return None;
                    }
                    out_axis += 1;
                }
            } else {
                if !map.get(out_axis)?.is_loop(kept) {
                    return None;
                }
                kept += 1;
                out_axis += 1;
            }
        }
        // A stage with no outer loops would run the whole reduction serially per kernel.
        (kept > 0 && kept <= self.out_rank).then_some(kept)
    }

    /// `Acc(s)` for reduce `v` read at `map`: the stage computing it, built on first use.
    fn stage(&mut self, body: &mut Body, v: ValueId, map: &Map, outer: usize) -> Result<usize, Stop> {
        let dtype = self.ty(v).dtype;
        if let Some(s) = self.stages.iter().position(|(r, _)| *r == v) {
            return Ok(body.push(ScalarOp::Acc(s), dtype));
        }
        let node = self.g.node(v.node);
        let Op::Reduce(Reduce { op, axes, keepdim }) = &node.op else {
            return Err(Stop::Need(v));
        };
        let x = node.inputs()[0];
        let xdims = self.ty(x).shape.0.clone();
        let (mut out_axis, mut red) = (0, 0);
        let mut xmap = Vec::with_capacity(xdims.len());
        for a in 0..xdims.len() {
            if axes.contains(&a) {
                xmap.push(AffineExpr::loop_index(outer + red));
                red += 1;
                out_axis += usize::from(*keepdim);
            } else {
                xmap.push(map[out_axis].clone());
                out_axis += 1;
            }
        }
        let mut rbody = Body::new(Phase::Reduce);
        self.expr(&mut rbody, x, xmap)?;
        self.stages.push((
            v,
            Reduction {
                op: *op,
                dims: axes.iter().map(|&a| xdims[a].clone()).collect(),
                body: rbody.insts,
            },
        ));
        Ok(body.push(ScalarOp::Acc(self.stages.len() - 1), dtype))
    }

    /// True if `v` is read from a buffer rather than computed inline.
    pub fn is_buffer(&self, v: ValueId) -> bool {
        self.materialized.contains(&v) || role(self.g, self.g.node(v.node)) == Role::Leaf
    }

    fn ty(&self, v: ValueId) -> &TensorType {
        self.g.value_type(v)
    }

    fn load(&mut self, buffer: BufferId, map: IndexMap) -> usize {
        let load = Load { buffer, map };
        if let Some(&i) = self.load_ids.get(&load) {
            return i;
        }
        self.loads.push(load.clone());
        self.load_ids.insert(load, self.loads.len() - 1);
        self.loads.len() - 1
    }

    /// Step back through the movement op defining `v` (read at `map`).
    fn step(&mut self, v: ValueId, map: &Map) -> Result<Step, Stop> {
        let node = self.g.node(v.node);
        let out = self.ty(v).shape.0.clone();
        let x = node.inputs()[0];
        let from = self.ty(x).shape.0.clone();
        Ok(match &node.op {
            Op::Broadcast(_) => Step::Next(x, broadcast_map(&from, &out, map)),
            Op::Permute(Permute { perm }) => {
                let mut m = vec![AffineExpr::default(); perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    m[p] = map[i].clone();
                }
                Step::Next(x, m)
            }
            Op::Slice(Slice { ranges }) => {
                let m = ranges
                    .iter()
                    .zip(&from)
                    .zip(map)
                    .map(|((r, d), e)| match d.as_static() {
                        Some(size) if !r.is_full() => {
                            let (start, _) = r.resolve(size);
                            e.scaled(r.step, start as i64)
                        }
                        _ => e.clone(),
                    })
                    .collect();
                Step::Next(x, m)
            }
            Op::Reshape(_) => {
                if let Some(m) = unit_reshape_map(&from, &out, map) {
                    return Ok(Step::Next(x, m));
                }
                // A general reshape is only a view of a contiguous buffer: skip reshapes down to
                // a buffer, or ask for the operand to be materialized.
                let mut base = x;
                while !self.is_buffer(base) && matches!(self.g.node(base.node).op, Op::Reshape(_)) {
                    base = self.g.node(base.node).inputs()[0];
                }
                if !self.is_buffer(base) || scalar_const(self.g.node(base.node)).is_some() {
                    return Err(Stop::Need(x));
                }
                let b = self.table.of(self.g, base);
                Step::View(
                    b,
                    IndexMap {
                        view: out,
                        axes: map.clone(),
                    },
                )
            }
            _ => unreachable!("step is only called on movement ops"),
        })
    }

    /// A contraction operand: movement ops folded into one load of a buffer.
    pub fn operand(&mut self, mut v: ValueId) -> Result<Load, Stop> {
        let mut map = identity(self.ty(v).rank());
        loop {
            if self.is_buffer(v) {
                let buffer = self.table.of(self.g, v);
                let view = self.ty(v).shape.0.clone();
                return Ok(Load {
                    buffer,
                    map: IndexMap { view, axes: map },
                });
            }
            if role(self.g, self.g.node(v.node)) != Role::Movement {
                return Err(Stop::Need(v));
            }
            match self.step(v, &map)? {
                Step::Next(x, m) => (v, map) = (x, m),
                Step::View(buffer, map) => return Ok(Load { buffer, map }),
            }
        }
    }

    /// The instruction computing `v` at loop point `map`.
    pub fn expr(&mut self, body: &mut Body, v: ValueId, map: Map) -> Result<usize, Stop> {
        if let Some(&i) = body.memo.get(&(v, map.clone())) {
            return Ok(i);
        }
        let node = self.g.node(v.node);
        let dtype = self.ty(v).dtype;
        let i = if let Some(c) = scalar_const(node) {
            body.push(ScalarOp::Const(Float(c)), dtype)
        } else if self.is_buffer(v) {
            let b = self.table.of(self.g, v);
            let view = self.ty(v).shape.0.clone();
            let l = self.load(
                b,
                IndexMap {
                    view,
                    axes: map.clone(),
                },
            );
            body.push(ScalarOp::Load(l), dtype)
        } else {
            if self.depth >= MAX_INLINE_DEPTH {
                return Err(Stop::Deep(v));
            }
            self.depth += 1;
            let r = self.expand(body, v, map.clone());
            self.depth -= 1;
            r?
        };
        body.memo.insert((v, map), i);
        Ok(i)
    }

    /// The instructions of the op defining `v` (which is computed inline), at `map`.
    pub fn expand(&mut self, body: &mut Body, v: ValueId, map: Map) -> Result<usize, Stop> {
        let node = self.g.node(v.node);
        let out = self.ty(v).shape.0.clone();
        let dtype = self.ty(v).dtype;
        let role = role(self.g, node);
        if role == Role::Elementwise {
            self.inlined.insert((v, map.clone()));
            let mut args = Vec::with_capacity(3);
            for &x in node.inputs() {
                let m = broadcast_map(self.ty(x).shape.dims(), &out, &map);
                match self.expr(body, x, m) {
                    Ok(i) => args.push(i),
                    // An operand of the same shape that must be materialized: materialize this
                    // value instead, so the operand's kernel takes it as epilogue (var → +eps →
                    // rsqrt becomes one reduction kernel), unless this is a kernel root.
                    Err(Stop::Need(n)) if n == x && self.ty(x).shape.0 == out && !self.materialized.contains(&v) => {
                        return Err(Stop::Need(v));
                    }
                    Err(e) => return Err(e),
                }
            }
            let op = match &node.op {
                Op::Unary(u) => ScalarOp::Unary(*u, args[0]),
                Op::Binary(b) => ScalarOp::Binary(*b, args[0], args[1]),
                Op::Where => ScalarOp::Where(args[0], args[1], args[2]),
                _ => ScalarOp::Cast(args[0]),
            };
            return Ok(body.push(op, dtype));
        }
        match role {
            Role::Movement => match self.step(v, &map)? {
                Step::Next(x, m) => self.expr(body, x, m),
                Step::View(b, m) => {
                    let l = self.load(b, m);
                    Ok(body.push(ScalarOp::Load(l), dtype))
                }
            },
            Role::Anchor if matches!(node.op, Op::Reduce(_)) => match self.stage_outer(v, &map, body.phase) {
                Some(outer) if self.anchor.is_none() && self.outer.is_none_or(|o| o == outer) => {
                    self.outer = Some(outer);
                    self.stage(body, v, &map, outer)
                }
                _ => Err(Stop::Need(v)),
            },
            Role::Anchor
                if body.phase == Phase::Output
                    && out.len() == self.out_rank
                    && map.iter().enumerate().all(|(a, e)| e.is_loop(a))
                    && self.stages.is_empty()
                    && self.anchor.is_none_or(|a| a == v) =>
            {
                self.anchor = Some(v);
                Ok(body.push(ScalarOp::Acc(0), dtype))
            }
            _ => Err(Stop::Need(v)),
        }
    }
}
