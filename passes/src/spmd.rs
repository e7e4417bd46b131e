//! SPMD partitioning: the compiler's way to parallelism (GSPMD's idea on one mesh axis). Given
//! a graph written for one device and sharding annotations on some of its parameters and inputs
//! — replicated, or split along an axis over a group of `n` ranks — [`partition`] rewrites it
//! into the program every rank runs on its shards, inserting the collectives itself, so the
//! ranks together compute what the graph computes.
//!
//! Annotating a training step's batch inputs `split(0)` gives data parallelism (the weight
//! gradients come out as partial sums and are all-reduced before the update); annotating
//! Megatron's weights (`fc1` by columns, `fc2` by rows) gives tensor parallelism.
//!
//! Each value is replicated, split along one axis, or **partial** (every rank holds a term of a
//! sum: a contraction over a split axis). Shardings propagate forward through the primitives
//! (the graph is decomposed first):
//!
//! - elementwise ops follow a split operand, slicing replicated operands locally (no
//!   communication; broadcast dims stay whole); sums of partials, and partials times or divided
//!   by replicated values, stay partial;
//! - reductions over a split axis become partial (sum; mean scaled by `1/n`) or are combined
//!   at once (max, min); over other axes the split follows;
//! - `matmul` follows its operands: batch or row split × replicated → rows split; replicated ×
//!   column split → columns split; a split contraction axis → partial;
//! - reshape, permute, broadcast, slice, concat, pad and gather keep a split where the axis
//!   survives whole;
//! - every other op gets replicated operands (`all_gather` of splits, `all_reduce` of partials).
//!
//! Outputs are replicated, except the new values of parameters (`@state/P` of a training step),
//! which keep `P`'s sharding so they write back into its shard. Optimizer state
//! `@opt/P.slot` of `P`'s type follows `P`. Shapes must be static.

use crate::decompose::Decompose;
use crate::{Pass, PassError};
use oar_ir::ops::{
    BinaryOp, Broadcast, Collective, CollectiveKind, Concat, Gather, Pad, Permute, Reduce, ReduceOp, Reshape, Slice,
    SliceRange, UnaryOp,
};
use oar_ir::{DType, Dim, Graph, IrError, Op, TensorType, ValueId};
use std::collections::BTreeMap;

/// How a parameter, input or output is laid out over the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sharding {
    /// Every rank holds the whole tensor.
    Replicated,
    /// Rank `r` holds slice `r` of `n` equal slices along the axis.
    Split(usize),
}

/// What to partition over and how the annotated tensors are laid out.
#[derive(Clone, Debug, Default)]
pub struct SpmdConfig {
    /// The group's number in the collectives (0: the world).
    pub group: usize,
    /// The group's size.
    pub nranks: usize,
    /// Parameters and inputs by name; the others are replicated.
    pub shardings: BTreeMap<String, Sharding>,
}

/// A partitioned graph and the layout of what it reads and writes.
#[derive(Clone, Debug)]
pub struct Partitioned {
    /// The program every rank runs on its shards.
    pub graph: Graph,
    /// Every parameter's and input's layout (the caller feeds its shard).
    pub inputs: BTreeMap<String, Sharding>,
    /// Every output's layout.
    pub outputs: BTreeMap<String, Sharding>,
    /// The collectives inserted.
    pub collectives: usize,
}

/// A value's layout while propagating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum S {
    Rep,
    Split(usize),
    /// The ranks' values sum to the value.
    Partial,
}

fn err(detail: impl Into<String>) -> IrError {
    IrError::Type {
        op: "spmd".into(),
        value: String::new(),
        detail: detail.into(),
    }
}

fn dims_of(t: &TensorType) -> Result<Vec<usize>, IrError> {
    t.shape
        .as_static()
        .ok_or_else(|| err(format!("needs static shapes (trace with fixed sizes), got {t}")))
}

struct Builder<'a> {
    old: &'a Graph,
    new: Graph,
    cfg: &'a SpmdConfig,
    collectives: usize,
}

impl Builder<'_> {
    fn n(&self) -> usize {
        self.cfg.nranks
    }

    fn coll(&mut self, kind: CollectiveKind, v: ValueId, axis: usize) -> Result<ValueId, IrError> {
        self.collectives += 1;
        let c = Collective::new(kind, self.cfg.group, self.cfg.nranks).axis(axis);
        self.new.add_op1(Op::Collective(c), &[v])
    }

    /// The value whole on every rank.
    fn rep(&mut self, (v, s): (ValueId, S)) -> Result<ValueId, IrError> {
        match s {
            S::Rep => Ok(v),
            S::Split(a) => self.coll(CollectiveKind::AllGather, v, a),
            S::Partial => self.coll(CollectiveKind::AllReduceSum, v, 0),
        }
    }

    /// The value split along `axis`.
    fn split(&mut self, (v, s): (ValueId, S), axis: usize) -> Result<ValueId, IrError> {
        match s {
            S::Split(a) if a == axis => Ok(v),
            S::Rep => self.coll(CollectiveKind::Split, v, axis),
            S::Partial => self.coll(CollectiveKind::ReduceScatter, v, axis),
            S::Split(_) => {
                let r = self.rep((v, s))?;
                self.coll(CollectiveKind::Split, r, axis)
            }
        }
    }

    fn splittable(&self, dims: &[usize], axis: usize) -> bool {
        dims.get(axis)
            .is_some_and(|&d| d >= self.n() && d.is_multiple_of(self.n()))
    }

    /// Emit `op` on `ins` (new values) and return its first result.
    fn emit(&mut self, op: Op, ins: &[ValueId]) -> Result<ValueId, IrError> {
        self.new.add_op1(op, ins)
    }

    /// Elementwise ops (numpy broadcasting) on operands `ins` with global types `tys`, output
    /// of global dims `out`: follow the first split operand's axis.
    fn elementwise(
        &mut self,
        op: Op,
        ins: &[(ValueId, S)],
        tys: &[Vec<usize>],
        out: &[usize],
    ) -> Result<(ValueId, S), IrError> {
        let r = out.len();
        // The output axis an operand's split maps to, if that dim is not broadcast.
        let mapped = |i: usize, a: usize| -> Option<usize> {
            let k = a + r - tys[i].len();
            (tys[i][a] == out[k]).then_some(k)
        };
        let mut vals: Vec<(ValueId, S)> = Vec::with_capacity(ins.len());
        for &x in ins {
            vals.push(if x.1 == S::Partial { (self.rep(x)?, S::Rep) } else { x });
        }
        let target = vals.iter().enumerate().find_map(|(i, (_, s))| match s {
            S::Split(a) => mapped(i, *a),
            _ => None,
        });
        let Some(k) = target else {
            let vs: Vec<ValueId> = vals.iter().map(|&x| self.rep(x)).collect::<Result<_, _>>()?;
            return Ok((self.emit(op, &vs)?, S::Rep));
        };
        let mut vs = Vec::with_capacity(vals.len());
        for (i, &(v, s)) in vals.iter().enumerate() {
            let offset = r - tys[i].len();
            let own = k.checked_sub(offset).filter(|&a| tys[i][a] == out[k]);
            vs.push(match (s, own) {
                (S::Split(a), Some(b)) if a == b => v,
                // This operand has the axis whole: take this rank's slice of it.
                (_, Some(b)) => self.split((v, s), b)?,
                // The axis is broadcast in this operand (or absent): it is used as is.
                (_, None) => self.rep((v, s))?,
            });
        }
        Ok((self.emit(op, &vs)?, S::Split(k)))
    }

    fn node(
        &mut self,
        node: oar_ir::NodeId,
        env: &BTreeMap<ValueId, (ValueId, S)>,
    ) -> Result<Vec<(ValueId, S)>, IrError> {
        let n = self.old.node(node);
        let ins: Vec<(ValueId, S)> = n.inputs().iter().map(|v| env[v]).collect();
        let tys: Vec<Vec<usize>> = n
            .inputs()
            .iter()
            .map(|&v| dims_of(self.old.value_type(v)))
            .collect::<Result<_, _>>()?;
        let out_ty = n.outputs().first().cloned();
        let out = match &out_ty {
            Some(t) => dims_of(t)?,
            None => Vec::new(),
        };
        let np = self.n();
        let single = |v: ValueId, s: S| Ok(vec![(v, s)]);
        match &n.op {
            Op::Input(i) => {
                let s = self.leaf_sharding(&i.name, &i.ty)?;
                let v = self.new.add_input(&i.name, self.local(&i.ty, s)?)?;
                single(v, s)
            }
            Op::Param(p) => {
                let s = self.leaf_sharding(&p.name, &p.ty)?;
                let v = self.new.add_param(&p.name, self.local(&p.ty, s)?)?;
                single(v, s)
            }
            Op::Constant(t) => single(self.new.add_constant(t.clone()), S::Rep),
            Op::Cast(_) => {
                let x = ins[0];
                let x = if x.1 == S::Partial { (self.rep(x)?, S::Rep) } else { x };
                single(self.emit(n.op.clone(), &[x.0])?, x.1)
            }
            Op::Unary(u) => {
                let x = ins[0];
                if x.1 == S::Partial && *u == UnaryOp::Neg {
                    return single(self.emit(n.op.clone(), &[x.0])?, S::Partial);
                }
                let x = if x.1 == S::Partial { (self.rep(x)?, S::Rep) } else { x };
                single(self.emit(n.op.clone(), &[x.0])?, x.1)
            }
            Op::Binary(b) => {
                let (x, y) = (ins[0], ins[1]);
                let linear = match b {
                    BinaryOp::Add | BinaryOp::Sub => x.1 == S::Partial && y.1 == S::Partial,
                    BinaryOp::Mul => (x.1 == S::Partial && y.1 == S::Rep) || (x.1 == S::Rep && y.1 == S::Partial),
                    BinaryOp::Div => x.1 == S::Partial && y.1 == S::Rep,
                    _ => false,
                };
                if linear {
                    return single(self.emit(n.op.clone(), &[x.0, y.0])?, S::Partial);
                }
                let (v, s) = self.elementwise(n.op.clone(), &ins, &tys, &out)?;
                single(v, s)
            }
            Op::Where => {
                let (v, s) = self.elementwise(n.op.clone(), &ins, &tys, &out)?;
                single(v, s)
            }
            Op::Reduce(Reduce { op, axes, keepdim }) => {
                let x = ins[0];
                match x.1 {
                    S::Rep => single(self.emit(n.op.clone(), &[x.0])?, S::Rep),
                    S::Partial if matches!(op, ReduceOp::Sum | ReduceOp::Mean) => {
                        single(self.emit(n.op.clone(), &[x.0])?, S::Partial)
                    }
                    S::Partial => {
                        let v = self.rep(x)?;
                        single(self.emit(n.op.clone(), &[v])?, S::Rep)
                    }
                    S::Split(a) if !axes.contains(&a) => {
                        let k = if *keepdim {
                            a
                        } else {
                            a - axes.iter().filter(|&&r| r < a).count()
                        };
                        single(self.emit(n.op.clone(), &[x.0])?, S::Split(k))
                    }
                    S::Split(_) => {
                        let local = self.emit(n.op.clone(), &[x.0])?;
                        match op {
                            ReduceOp::Sum => single(local, S::Partial),
                            ReduceOp::Mean => {
                                let dtype = out_ty.as_ref().map_or(DType::F32, |t| t.dtype);
                                let k = self.new.add_scalar(dtype, 1.0 / np as f64);
                                single(self.emit(Op::Binary(BinaryOp::Mul), &[local, k])?, S::Partial)
                            }
                            ReduceOp::Max => single(self.coll(CollectiveKind::AllReduceMax, local, 0)?, S::Rep),
                            ReduceOp::Min => {
                                let neg = self.emit(Op::Unary(UnaryOp::Neg), &[local])?;
                                let m = self.coll(CollectiveKind::AllReduceMax, neg, 0)?;
                                single(self.emit(Op::Unary(UnaryOp::Neg), &[m])?, S::Rep)
                            }
                            _ => {
                                let v = self.rep(x)?;
                                single(self.emit(n.op.clone(), &[v])?, S::Rep)
                            }
                        }
                    }
                }
            }
            Op::MatMul => {
                let (mut l, mut r) = (ins[0], ins[1]);
                let (rl, rr, ro) = (tys[0].len(), tys[1].len(), out.len());
                // Linear in each operand: a partial times a replicated value stays partial.
                match (l.1, r.1) {
                    (S::Partial, S::Rep) | (S::Rep, S::Partial) => {
                        return single(self.emit(Op::MatMul, &[l.0, r.0])?, S::Partial);
                    }
                    (S::Partial, _) => l = (self.rep(l)?, S::Rep),
                    (_, S::Partial) => r = (self.rep(r)?, S::Rep),
                    _ => {}
                }
                // Axis roles: lhs [.., M, K], rhs [.., K, N]; batch axes in output positions.
                let lhs_role = |a: usize| {
                    if a + 1 == rl {
                        'K'
                    } else if a + 2 == rl {
                        'M'
                    } else {
                        'B'
                    }
                };
                let rhs_role = |a: usize| {
                    if a + 1 == rr {
                        'N'
                    } else if a + 2 == rr {
                        'K'
                    } else {
                        'B'
                    }
                };
                let (lv, rv) = (l.0, r.0);
                let result = match (l.1, r.1) {
                    (S::Rep, S::Rep) => (self.emit(Op::MatMul, &[lv, rv])?, S::Rep),
                    (S::Split(a), S::Rep) if lhs_role(a) == 'M' => {
                        (self.emit(Op::MatMul, &[lv, rv])?, S::Split(ro - 2))
                    }
                    (S::Rep, S::Split(a)) if rhs_role(a) == 'N' => {
                        (self.emit(Op::MatMul, &[lv, rv])?, S::Split(ro - 1))
                    }
                    (S::Split(a), S::Split(b)) if lhs_role(a) == 'K' && rhs_role(b) == 'K' => {
                        (self.emit(Op::MatMul, &[lv, rv])?, S::Partial)
                    }
                    (S::Split(a), S::Rep) if lhs_role(a) == 'K' => {
                        let rs = self.split(r, rr - 2)?;
                        (self.emit(Op::MatMul, &[lv, rs])?, S::Partial)
                    }
                    (S::Rep, S::Split(b)) if rhs_role(b) == 'K' => {
                        let ls = self.split(l, rl - 1)?;
                        (self.emit(Op::MatMul, &[ls, rv])?, S::Partial)
                    }
                    (S::Split(a), S::Split(b)) if lhs_role(a) == 'M' && rhs_role(b) == 'N' => {
                        let rr_ = self.rep(r)?;
                        (self.emit(Op::MatMul, &[lv, rr_])?, S::Split(ro - 2))
                    }
                    (S::Split(a), other) if lhs_role(a) == 'B' && matches!(other, S::Rep) => {
                        let k = a + ro - rl;
                        let rs = match k.checked_sub(ro - rr).filter(|&b| b + 2 < rr && tys[1][b] == out[k]) {
                            Some(b) => self.split(r, b)?,
                            None => rv,
                        };
                        (self.emit(Op::MatMul, &[lv, rs])?, S::Split(k))
                    }
                    _ => {
                        let (a, b) = (self.rep(l)?, self.rep(r)?);
                        (self.emit(Op::MatMul, &[a, b])?, S::Rep)
                    }
                };
                single(result.0, result.1)
            }
            Op::Reshape(_) => {
                let x = ins[0];
                match x.1 {
                    S::Rep | S::Partial => single(self.emit(n.op.clone(), &[x.0])?, x.1),
                    S::Split(a) => match reshape_axis(&tys[0], &out, a, np) {
                        Some(b) => {
                            let mut shape: Vec<Dim> = out.iter().map(|&d| Dim::Static(d)).collect();
                            shape[b] = Dim::Static(out[b] / np);
                            single(self.emit(Op::Reshape(Reshape { shape }), &[x.0])?, S::Split(b))
                        }
                        None => {
                            let v = self.rep(x)?;
                            single(self.emit(n.op.clone(), &[v])?, S::Rep)
                        }
                    },
                }
            }
            Op::Permute(Permute { perm }) => {
                let x = ins[0];
                let s = match x.1 {
                    S::Split(a) => S::Split(perm.iter().position(|&p| p == a).unwrap_or(a)),
                    s => s,
                };
                single(self.emit(n.op.clone(), &[x.0])?, s)
            }
            Op::Broadcast(_) => {
                let x = ins[0];
                let k = |a: usize| a + out.len() - tys[0].len();
                match x.1 {
                    S::Split(a) if tys[0][a] == out[k(a)] => {
                        let mut shape: Vec<Dim> = out.iter().map(|&d| Dim::Static(d)).collect();
                        shape[k(a)] = Dim::Static(out[k(a)] / np);
                        single(self.emit(Op::Broadcast(Broadcast { shape }), &[x.0])?, S::Split(k(a)))
                    }
                    S::Split(_) => {
                        let v = self.rep(x)?;
                        single(self.emit(n.op.clone(), &[v])?, S::Rep)
                    }
                    s => single(self.emit(n.op.clone(), &[x.0])?, s),
                }
            }
            Op::Slice(Slice { ranges }) => {
                let x = ins[0];
                match x.1 {
                    S::Split(a) if ranges.get(a).is_none_or(SliceRange::is_full) => {
                        single(self.emit(n.op.clone(), &[x.0])?, S::Split(a))
                    }
                    S::Split(_) => {
                        let v = self.rep(x)?;
                        single(self.emit(n.op.clone(), &[v])?, S::Rep)
                    }
                    s => single(self.emit(n.op.clone(), &[x.0])?, s),
                }
            }
            Op::Concat(Concat { axis }) => {
                let first = ins.first().map(|x| x.1);
                if let Some(S::Split(a)) = first
                    && a != *axis
                    && ins.iter().all(|x| x.1 == S::Split(a))
                {
                    let vs: Vec<ValueId> = ins.iter().map(|x| x.0).collect();
                    return single(self.emit(n.op.clone(), &vs)?, S::Split(a));
                }
                self.replicated(n.op.clone(), &ins)
            }
            Op::Pad(Pad { before, after, .. }) => {
                let x = ins[0];
                match x.1 {
                    S::Split(a) if before[a] == 0 && after[a] == 0 => {
                        single(self.emit(n.op.clone(), &[x.0])?, S::Split(a))
                    }
                    _ => self.replicated(n.op.clone(), &ins),
                }
            }
            Op::Gather(Gather { axis }) => {
                let (d, i) = (ins[0], ins[1]);
                let ir = tys[1].len();
                match (d.1, i.1) {
                    (S::Rep, S::Split(a)) => single(self.emit(n.op.clone(), &[d.0, i.0])?, S::Split(axis + a)),
                    (S::Split(a), S::Rep) if a != *axis => {
                        let k = if a < *axis { a } else { a + ir - 1 };
                        single(self.emit(n.op.clone(), &[d.0, i.0])?, S::Split(k))
                    }
                    _ => self.replicated(n.op.clone(), &ins),
                }
            }
            Op::Cond | Op::While => Err(err("control flow (cond, while) is not partitioned")),
            _ => self.replicated(n.op.clone(), &ins),
        }
    }

    /// `op` on whole operands: every output replicated.
    fn replicated(&mut self, op: Op, ins: &[(ValueId, S)]) -> Result<Vec<(ValueId, S)>, IrError> {
        let vs: Vec<ValueId> = ins.iter().map(|&x| self.rep(x)).collect::<Result<_, _>>()?;
        Ok(self.new.add_op(op, &vs)?.into_iter().map(|v| (v, S::Rep)).collect())
    }

    /// The layout of parameter or input `name`: annotated, inherited by optimizer state from
    /// its parameter, or replicated.
    fn leaf_sharding(&self, name: &str, ty: &TensorType) -> Result<S, IrError> {
        let own = self.cfg.shardings.get(name).copied().or_else(|| {
            let rest = name.strip_prefix("@opt/")?;
            self.cfg.shardings.iter().find_map(|(p, s)| {
                let slot = rest.strip_prefix(p.as_str())?.strip_prefix('.')?;
                let same = self
                    .old
                    .params()
                    .iter()
                    .any(|(q, v)| q == p && self.old.value_type(*v) == ty);
                (!slot.contains('.') && same).then_some(*s)
            })
        });
        match own {
            None | Some(Sharding::Replicated) => Ok(S::Rep),
            Some(Sharding::Split(a)) => {
                let dims = dims_of(ty)?;
                if !self.splittable(&dims, a) {
                    return Err(err(format!(
                        "`{name}` {ty} does not split along axis {a} into {} equal parts",
                        self.n()
                    )));
                }
                Ok(S::Split(a))
            }
        }
    }

    /// The type of a rank's shard.
    fn local(&self, ty: &TensorType, s: S) -> Result<TensorType, IrError> {
        match s {
            S::Split(a) => {
                let mut dims = dims_of(ty)?;
                dims[a] /= self.n();
                Ok(TensorType::new(
                    ty.dtype,
                    dims.into_iter().map(Dim::Static).collect::<Vec<_>>(),
                ))
            }
            _ => Ok(ty.clone()),
        }
    }
}

/// Where a split along axis `a` of `from` lands in the reshape to `to`, if it survives: a
/// rank's slice is one contiguous run of the elements from axis `a` inwards (for each index
/// of the axes before it), so it stays one slice of an axis `b` that has the same elements
/// before it and splits into `n` equal parts.
fn reshape_axis(from: &[usize], to: &[usize], a: usize, n: usize) -> Option<usize> {
    let before: usize = from[..a].iter().product();
    let mut acc = 1usize;
    for (b, &d) in to.iter().enumerate() {
        if acc == before && d != 1 {
            return (d.is_multiple_of(n) && d >= n).then_some(b);
        }
        acc = acc.checked_mul(d)?;
        if acc > before {
            return None;
        }
    }
    None
}

/// Partition `graph` as `config` says (see the module docs).
pub fn partition(graph: &Graph, config: &SpmdConfig) -> Result<Partitioned, IrError> {
    if config.nranks == 0 {
        return Err(err("the group must have at least one rank"));
    }
    let mut g = graph.clone();
    Decompose::all().run(&mut g).map_err(|e| err(e.to_string()))?;
    let mut b = Builder {
        old: &g,
        new: Graph::new(graph.name()),
        cfg: config,
        collectives: 0,
    };
    let mut env: BTreeMap<ValueId, (ValueId, S)> = BTreeMap::new();
    let mut inputs = BTreeMap::new();
    for node in g.topo_order() {
        let outs = b.node(node, &env)?;
        match &g.node(node).op {
            Op::Input(oar_ir::ops::Input { name, .. }) | Op::Param(oar_ir::ops::Param { name, .. }) => {
                inputs.insert(name.clone(), public(outs[0].1));
            }
            _ => {}
        }
        for (i, o) in outs.into_iter().enumerate() {
            let v = ValueId { node, output: i as u32 };
            // A partial sum read more than once is summed once, where it is made (a gradient
            // feeding both of Adam's moments), not at every use that needs it whole.
            let uses = g.users(v).len() + g.outputs().iter().filter(|o| o.value == v).count();
            let o = if o.1 == S::Partial && uses > 1 {
                (b.rep(o)?, S::Rep)
            } else {
                o
            };
            env.insert(v, o);
        }
    }
    let mut outputs = BTreeMap::new();
    for o in g.outputs() {
        let x = env[&o.value];
        // A parameter's new value keeps the parameter's layout; everything else is whole.
        let want = o
            .name
            .strip_prefix("@state/")
            .and_then(|p| inputs.get(p).copied())
            .unwrap_or(Sharding::Replicated);
        let v = match want {
            Sharding::Replicated => b.rep(x)?,
            Sharding::Split(a) => b.split(x, a)?,
        };
        b.new.add_output(&o.name, v)?;
        outputs.insert(o.name.clone(), want);
    }
    oar_ir::verify(&b.new)?;
    Ok(Partitioned {
        collectives: b.collectives,
        graph: b.new,
        inputs,
        outputs,
    })
}

fn public(s: S) -> Sharding {
    match s {
        S::Split(a) => Sharding::Split(a),
        _ => Sharding::Replicated,
    }
}

/// [`partition`] as a pass (for `PassManager` pipelines and dumps): the graph is replaced by
/// its partitioned form.
#[derive(Clone, Debug)]
pub struct Spmd(pub SpmdConfig);

impl Pass for Spmd {
    fn name(&self) -> &'static str {
        "spmd"
    }

    fn description(&self) -> &'static str {
        "partition a one-device graph over a process group by sharding annotations, inserting collectives"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let p = partition(graph, &self.0).map_err(|e| PassError::ir(self.name(), e))?;
        *graph = p.graph;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::ops::Reduce;

    fn ty(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, dims.iter().map(|&d| Dim::Static(d)).collect::<Vec<_>>())
    }

    fn config(shardings: &[(&str, Sharding)]) -> SpmdConfig {
        SpmdConfig {
            group: 0,
            nranks: 2,
            shardings: shardings.iter().map(|(k, s)| (k.to_string(), *s)).collect(),
        }
    }

    fn count(g: &Graph, name: &str) -> usize {
        g.node_ids().filter(|&n| g.node(n).op.name() == name).count()
    }

    /// `mean(x @ w)` with `x [8, 4]` and `w [4, 6]`.
    fn mean_of_product() -> Graph {
        let mut g = Graph::new("f");
        let x = g.add_input("x", ty(&[8, 4])).unwrap();
        let w = g.add_param("w", ty(&[4, 6])).unwrap();
        let y = g.add_op1(Op::MatMul, &[x, w]).unwrap();
        let m = g
            .add_op1(
                Op::Reduce(Reduce {
                    op: ReduceOp::Mean,
                    axes: vec![0, 1],
                    keepdim: false,
                }),
                &[y],
            )
            .unwrap();
        g.add_output("loss", m).unwrap();
        g.add_output("y", y).unwrap();
        g
    }

    #[test]
    fn a_split_batch_makes_rows_split_and_the_mean_partial() {
        let p = partition(&mean_of_product(), &config(&[("x", Sharding::Split(0))])).unwrap();
        let g = &p.graph;
        assert_eq!(g.input_specs()[0].1, ty(&[4, 4]), "{g}");
        // The mean is summed once; `y` (rows split) is gathered for the output.
        assert_eq!((count(g, "all_reduce_sum"), count(g, "all_gather")), (1, 1), "{g}");
        assert_eq!(p.collectives, 2);
        assert_eq!(p.inputs["x"], Sharding::Split(0));
        assert_eq!(p.inputs["w"], Sharding::Replicated);
    }

    #[test]
    fn a_split_contraction_is_a_partial_sum() {
        let p = partition(
            &mean_of_product(),
            &config(&[("x", Sharding::Split(1)), ("w", Sharding::Split(0))]),
        )
        .unwrap();
        let g = &p.graph;
        // `y` is partial and read twice (the mean, the output): summed once, where it is made.
        assert_eq!(count(g, "all_reduce_sum"), 1, "{g}");
        assert_eq!(count(g, "all_gather"), 0, "{g}");
        assert_eq!(g.params()[0].0, "w");
        assert_eq!(g.value_type(g.params()[0].1), &ty(&[2, 6]));
    }

    #[test]
    fn column_split_weights_give_column_split_outputs() {
        let p = partition(&mean_of_product(), &config(&[("w", Sharding::Split(1))])).unwrap();
        let g = &p.graph;
        // The mean over the split columns is a partial (scaled by 1/2), `y` is gathered.
        assert_eq!((count(g, "all_reduce_sum"), count(g, "all_gather")), (1, 1), "{g}");
    }

    #[test]
    fn reshapes_keep_a_split_that_survives_whole() {
        // [B, S, W] split on B → [B·S, W]: the merged axis keeps it.
        assert_eq!(reshape_axis(&[4, 5, 8], &[20, 8], 0, 2), Some(0));
        // Kept as is.
        assert_eq!(reshape_axis(&[4, 5, 8], &[4, 40], 0, 2), Some(0));
        // [20, 8] split on 0 → [4, 5, 8]: the outer factor.
        assert_eq!(reshape_axis(&[20, 8], &[4, 5, 8], 0, 2), Some(0));
        // A split of W merged behind S: the slices interleave.
        assert_eq!(reshape_axis(&[4, 5, 8], &[4, 40], 2, 2), None);
        // Size-1 axes are skipped; an axis the ranks do not divide is no place for it.
        assert_eq!(reshape_axis(&[4, 6], &[1, 24], 0, 2), Some(1));
        assert_eq!(reshape_axis(&[4, 6], &[3, 8], 0, 2), None);
    }

    #[test]
    fn bad_annotations_and_graphs_are_errors() {
        let e = partition(&mean_of_product(), &config(&[("w", Sharding::Split(2))])).unwrap_err();
        assert!(e.to_string().contains("`w`"), "{e}");
        let mut odd = config(&[("x", Sharding::Split(0))]);
        odd.nranks = 3;
        let e = partition(&mean_of_product(), &odd).unwrap_err();
        assert!(e.to_string().contains("3 equal parts"), "{e}");
        let mut g = Graph::new("sym");
        let x = g
            .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(4)]))
            .unwrap();
        g.add_output("y", x).unwrap();
        let e = partition(&g, &config(&[])).unwrap_err();
        assert!(e.to_string().contains("static shapes"), "{e}");
    }
}
