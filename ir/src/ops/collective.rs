//! Collectives: communication between the processes of a group, as ops, so that a traced
//! training step holds them, passes see them and backends run them (Paddle's `c_allreduce_sum`,
//! `c_allgather`, `c_identity`, `mp_allreduce`, `c_split`, `c_concat`).
//!
//! The IR knows groups by number (`group`, Paddle's `ring_id`) and size (`nranks`, part of
//! the type rule: a gather multiplies an axis by it). The transport is not the IR's business:
//! the process registers a [`Communicator`] per group ([`register`]; `oar::distributed` does
//! it for every group it makes) and every backend runs a collective through [`run`].
//!
//! Two families of gradients, as in the frameworks they come from:
//!
//! - `all_reduce_sum/avg`, `all_gather`, `reduce_scatter` are functions of every rank's value,
//!   and their VJPs are those of the total over ranks (the objective is the sum of the ranks'
//!   losses, as `torch.distributed.nn`): `all_reduce_sum`'s is `all_reduce_sum`, `all_gather`'s
//!   is `reduce_scatter` and the other way round.
//! - The tensor-parallel pairs (Megatron-LM's f and g, Paddle's `mp_ops`) assume what follows
//!   them is replicated — the same computation on every rank — so each rank's gradient
//!   already is the total: `c_identity` (identity; its gradient is all-reduced) and
//!   `mp_allreduce` (summed; its gradient passes as is) are each other's VJPs, as are `c_split`
//!   (this rank's slice, no communication) and `c_concat` (every rank's slice, gathered).

use super::rules::{R, arity, check_axes};
use super::{Grads, OpDef, OpFamily, OpText, VjpArgs, named_enum};
use crate::eval::{EvalCx, Res, Value};
use crate::text::{Attrs, ParseError};
use crate::{DType, Dim, Emitter, Graph, Op, TensorData, TensorType};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

named_enum! {
    /// What a [`Collective`] computes (see the module docs for the gradients).
    CollectiveKind {
        /// The elementwise sum over the group.
        AllReduceSum => "all_reduce_sum",
        /// The elementwise mean over the group.
        AllReduceAvg => "all_reduce_avg",
        /// The elementwise maximum over the group (not differentiable).
        AllReduceMax => "all_reduce_max",
        /// Every rank's value, concatenated along `axis` in rank order.
        AllGather => "all_gather",
        /// The sum over the group, of which rank `r` keeps slice `r` of `nranks` along `axis`.
        ReduceScatter => "reduce_scatter",
        /// The value itself; the gradient is summed over the group.
        Identity => "c_identity",
        /// The sum over the group; the gradient passes as is.
        MpAllReduce => "mp_allreduce",
        /// Slice `rank` of `nranks` along `axis` (no communication); the gradient is gathered.
        Split => "c_split",
        /// Every rank's value concatenated along `axis`; the gradient is this rank's slice.
        Concat => "c_concat",
    }
}

impl CollectiveKind {
    /// Whether the kind has an `axis` (gathers, scatters, splits).
    pub fn has_axis(self) -> bool {
        matches!(
            self,
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::Split | CollectiveKind::Concat
        )
    }
}

/// A collective over the process group `group` of `nranks` processes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Collective {
    /// What it computes.
    pub kind: CollectiveKind,
    /// The group's number in this job (0 is the world).
    pub group: usize,
    /// The group's size.
    pub nranks: usize,
    /// The axis gathered, scattered or split (0 for the other kinds).
    pub axis: usize,
}

impl Collective {
    /// `kind` over `group` of `nranks` (`axis` 0).
    pub fn new(kind: CollectiveKind, group: usize, nranks: usize) -> Collective {
        Collective {
            kind,
            group,
            nranks,
            axis: 0,
        }
    }

    /// The same along `axis`.
    pub fn axis(mut self, axis: usize) -> Collective {
        self.axis = axis;
        self
    }

    fn with_kind(&self, kind: CollectiveKind) -> Op {
        Op::Collective(Collective { kind, ..self.clone() })
    }
}

/// A process group's transport, as the IR's collectives use it. `oar::distributed` registers
/// one per group over MPI; tests may register their own.
pub trait Communicator: Send + Sync {
    /// This process's rank in the group.
    fn rank(&self) -> usize;
    /// The group's size.
    fn size(&self) -> usize;
    /// The elementwise sum (or, with `max`, maximum) of `x` over the group.
    fn all_reduce(&self, x: &TensorData, max: bool) -> Result<TensorData, String>;
    /// Every rank's `x` (equal types), in rank order.
    fn all_gather(&self, x: &TensorData) -> Result<Vec<TensorData>, String>;
    /// The sum of `x` over the group, of which this rank keeps part `rank` of `size` equal
    /// parts of its flat elements (of shape `part`). By default an all-reduce and a slice.
    fn reduce_scatter(&self, x: &TensorData, part: &[usize]) -> Result<TensorData, String> {
        let sum = self.all_reduce(x, false)?;
        let n = sum.bytes().len() / self.size().max(1);
        let bytes = sum.bytes()[self.rank() * n..(self.rank() + 1) * n].to_vec();
        TensorData::from_bytes(sum.dtype(), part.to_vec(), bytes).map_err(|e| e.to_string())
    }
}

type Registry = RwLock<BTreeMap<usize, Arc<dyn Communicator>>>;

fn registry() -> &'static Registry {
    static R: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    R.get_or_init(|| RwLock::new(BTreeMap::new()))
}

/// Make `comm` the transport of group number `group` in this process (replacing any).
pub fn register(group: usize, comm: Arc<dyn Communicator>) {
    registry()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(group, comm);
}

/// The transport of group `group`, if one is registered. Group 0, the world, defaults to a
/// group of this process alone (as `oar::distributed::init` without a launcher), so graphs
/// with collectives over a world of one run anywhere (the conformance kit's cases do).
pub fn communicator(group: usize) -> Option<Arc<dyn Communicator>> {
    let found = registry()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&group)
        .cloned();
    found.or_else(|| (group == 0).then(|| Arc::new(Alone) as Arc<dyn Communicator>))
}

/// The group of this process alone: every collective gives its operand back.
struct Alone;

impl Communicator for Alone {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce(&self, x: &TensorData, _: bool) -> Result<TensorData, String> {
        Ok(x.clone())
    }
    fn all_gather(&self, x: &TensorData) -> Result<Vec<TensorData>, String> {
        Ok(vec![x.clone()])
    }
}

/// `shape` as `(outer, len, inner)` around `axis`: elements before, along and after it.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

/// Run collective `c` on this process's operand `x` through its group's registered
/// transport: what every backend calls. Errors name the collective and the group.
pub fn run(c: &Collective, x: &TensorData) -> Result<TensorData, String> {
    let name = c.kind.name();
    let comm = communicator(c.group).ok_or_else(|| {
        format!(
            "{name}: no process group number {} in this process (collectives run in a job started by `oar \
             launch` or mpirun, after `oar::distributed::init`)",
            c.group
        )
    })?;
    if comm.size() != c.nranks {
        return Err(format!(
            "{name}: the graph expects group {} to have {} ranks, but it has {}",
            c.group,
            c.nranks,
            comm.size()
        ));
    }
    let shape = x.shape().to_vec();
    if c.kind.has_axis() && c.axis >= shape.len() {
        return Err(format!("{name}: axis {} is out of range for shape {shape:?}", c.axis));
    }
    let (n, r) = (c.nranks, comm.rank());
    let elem = x.dtype().size_bytes();
    match c.kind {
        CollectiveKind::AllReduceSum | CollectiveKind::MpAllReduce => comm.all_reduce(x, false),
        CollectiveKind::AllReduceMax => comm.all_reduce(x, true),
        CollectiveKind::AllReduceAvg => {
            let sum = comm.all_reduce(x, false)?;
            let v: Vec<f64> = sum.to_f64_vec().into_iter().map(|s| s / n as f64).collect();
            TensorData::from_f64_slice(sum.dtype(), shape, &v).map_err(|e| e.to_string())
        }
        CollectiveKind::Identity => Ok(x.clone()),
        CollectiveKind::AllGather | CollectiveKind::Concat => {
            let parts = comm.all_gather(x)?;
            let (outer, len, inner) = around(&shape, c.axis);
            let block = len * inner * elem;
            let mut out = Vec::with_capacity(block * outer * n);
            for o in 0..outer {
                for p in &parts {
                    if p.shape() != shape.as_slice() || p.dtype() != x.dtype() {
                        return Err(format!(
                            "{name}: ranks disagree on the operand: {} here, {} on another rank",
                            x.tensor_type(),
                            p.tensor_type()
                        ));
                    }
                    out.extend_from_slice(&p.bytes()[o * block..(o + 1) * block]);
                }
            }
            let mut s = shape;
            s[c.axis] *= n;
            TensorData::from_bytes(x.dtype(), s, out).map_err(|e| e.to_string())
        }
        CollectiveKind::ReduceScatter | CollectiveKind::Split => {
            let (outer, len, inner) = around(&shape, c.axis);
            if !len.is_multiple_of(n) {
                return Err(format!(
                    "{name}: axis {} of {shape:?} does not split into {n} equal parts",
                    c.axis
                ));
            }
            let mut part = shape.clone();
            part[c.axis] = len / n;
            // Rank-major order, so that each rank's part is contiguous.
            let block = len / n * inner * elem;
            let mut ranked = vec![0u8; x.bytes().len()];
            for o in 0..outer {
                for q in 0..n {
                    let src = (o * n + q) * block;
                    let dst = (q * outer + o) * block;
                    ranked[dst..dst + block].copy_from_slice(&x.bytes()[src..src + block]);
                }
            }
            if c.kind == CollectiveKind::Split {
                let mine = ranked[r * outer * block..(r + 1) * outer * block].to_vec();
                return TensorData::from_bytes(x.dtype(), part, mine).map_err(|e| e.to_string());
            }
            let ranked = TensorData::from_bytes(x.dtype(), vec![n, outer * block / elem.max(1)], ranked)
                .map_err(|e| e.to_string())?;
            let got = comm.reduce_scatter(&ranked, &[outer * block / elem.max(1)])?;
            got.reshaped(part).map_err(|e| e.to_string())
        }
    }
}

impl OpText for Collective {
    fn mnemonics() -> &'static [&'static str] {
        CollectiveKind::NAMES
    }
    fn name(&self) -> &'static str {
        self.kind.name()
    }
    fn print_attrs(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![("group", self.group.to_string()), ("nranks", self.nranks.to_string())];
        if self.kind.has_axis() {
            v.push(("axis", self.axis.to_string()));
        }
        v
    }
    fn parse(name: &str, attrs: &mut Attrs, _: &[TensorType]) -> Result<Self, ParseError> {
        let kind = CollectiveKind::from_name(name).ok_or_else(|| attrs.here(crate::text::unknown_op(name)))?;
        Ok(Collective {
            kind,
            group: attrs.get("group")?,
            nranks: attrs.get("nranks")?,
            axis: if kind.has_axis() { attrs.get("axis")? } else { 0 },
        })
    }
}

impl OpDef for Collective {
    fn family(&self) -> OpFamily {
        OpFamily::Communication
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        if self.nranks == 0 {
            return Err("nranks must be positive".into());
        }
        if !matches!(x.dtype, DType::F32 | DType::F64 | DType::I32 | DType::I64) {
            return Err(format!(
                "collectives move f32, f64, i32 and i64 tensors, not {}",
                x.dtype
            ));
        }
        if self.kind == CollectiveKind::AllReduceAvg && !x.dtype.is_float() {
            return Err(format!("all_reduce_avg needs a float operand, got {x}"));
        }
        if !self.kind.has_axis() {
            return Ok(vec![x.clone()]);
        }
        check_axes(&[self.axis], x.rank())?;
        let mut s = x.shape.0.clone();
        let n = Dim::Static(self.nranks);
        s[self.axis] = match self.kind {
            CollectiveKind::AllGather | CollectiveKind::Concat => {
                s[self.axis].mul(&n).map_err(|e| format!("gathered size: {e}"))?
            }
            _ => s[self.axis].div_exact(&n).ok_or_else(|| {
                format!(
                    "axis {} of {x} does not split into {} equal parts",
                    self.axis, self.nranks
                )
            })?,
        };
        Ok(vec![TensorType::new(x.dtype, s)])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        Some(0)
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        use CollectiveKind::*;
        if !a.want(0) {
            return Ok(a.none());
        }
        let back = match self.kind {
            AllReduceSum => AllReduceSum,
            AllReduceAvg => AllReduceAvg,
            AllGather => ReduceScatter,
            ReduceScatter => AllGather,
            Identity => MpAllReduce,
            MpAllReduce => Identity,
            Split => Concat,
            Concat => Split,
            AllReduceMax => {
                return Err(crate::IrError::Type {
                    op: self.kind.name().into(),
                    value: "<vjp>".into(),
                    detail: "all_reduce_max is not differentiable".into(),
                }
                .into());
            }
        };
        Ok(vec![Some(e.add_op1(self.with_kind(back), &[a.g])?)])
    }

    /// Every kind over the world of one process (which needs no launcher): the identity,
    /// which every backend must still run through [`run`].
    fn samples() -> Vec<super::Sample> {
        use super::sample::input;
        CollectiveKind::ALL
            .iter()
            .map(|&kind| {
                let c = Collective::new(kind, 0, 1).axis(if kind.has_axis() { 1 } else { 0 });
                let s = super::Sample::new(
                    format!("{}/f32", kind.name()),
                    Op::Collective(c),
                    vec![input(DType::F32, &[2, 3])],
                );
                if kind == CollectiveKind::AllReduceMax {
                    s.no_grad()
                } else {
                    s
                }
            })
            .collect()
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        let x = ins[0].to_tensor().map_err(|e| cx.site().err(e))?;
        let y = run(self, &x).map_err(|e| cx.site().err(e))?;
        Ok(vec![Value::from_tensor(&y).map_err(|e| cx.site().err(e))?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group of `n` simulated in one process: rank `r` of it, where every rank's operand is
    /// the local one plus `r` times `step` (so sums and gathers are known in closed form).
    struct Fake {
        rank: usize,
        n: usize,
        step: f64,
    }

    impl Fake {
        fn of(&self, x: &TensorData, q: usize) -> TensorData {
            let v: Vec<f64> = x
                .to_f64_vec()
                .into_iter()
                .map(|e| e + (q as f64 - self.rank as f64) * self.step)
                .collect();
            TensorData::from_f64_slice(x.dtype(), x.shape().to_vec(), &v).unwrap()
        }
    }

    impl Communicator for Fake {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.n
        }
        fn all_reduce(&self, x: &TensorData, max: bool) -> Result<TensorData, String> {
            let parts: Vec<Vec<f64>> = (0..self.n).map(|q| self.of(x, q).to_f64_vec()).collect();
            let v: Vec<f64> = (0..x.len())
                .map(|i| {
                    let it = parts.iter().map(|p| p[i]);
                    if max { it.fold(f64::MIN, f64::max) } else { it.sum() }
                })
                .collect();
            TensorData::from_f64_slice(x.dtype(), x.shape().to_vec(), &v).map_err(|e| e.to_string())
        }
        fn all_gather(&self, x: &TensorData) -> Result<Vec<TensorData>, String> {
            Ok((0..self.n).map(|q| self.of(x, q)).collect())
        }
    }

    fn t(shape: &[usize], v: &[f64]) -> TensorData {
        TensorData::from_f64_slice(DType::F32, shape.to_vec(), v).unwrap()
    }

    #[test]
    fn every_kind_computes_its_closed_form() {
        use CollectiveKind::*;
        // Rank 1 of 2; rank q holds x + (q − 1)·10.
        register(
            101,
            Arc::new(Fake {
                rank: 1,
                n: 2,
                step: 10.0,
            }),
        );
        let x = t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let c = |k| Collective::new(k, 101, 2);
        let v = |k: Collective| run(&k, &x).unwrap().to_f64_vec();
        assert_eq!(v(c(AllReduceSum)), [-8.0, -6.0, -4.0, -2.0]);
        assert_eq!(v(c(MpAllReduce)), [-8.0, -6.0, -4.0, -2.0]);
        assert_eq!(v(c(AllReduceAvg)), [-4.0, -3.0, -2.0, -1.0]);
        assert_eq!(v(c(AllReduceMax)), [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(v(c(Identity)), [1.0, 2.0, 3.0, 4.0]);
        // Gathers: rank 0's [[-9, -8], [-7, -6]] then rank 1's.
        let g0 = run(&c(AllGather), &x).unwrap();
        assert_eq!(g0.shape(), [4, 2]);
        assert_eq!(g0.to_f64_vec(), [-9.0, -8.0, -7.0, -6.0, 1.0, 2.0, 3.0, 4.0]);
        let g1 = run(&c(Concat).axis(1), &x).unwrap();
        assert_eq!(g1.shape(), [2, 4]);
        assert_eq!(g1.to_f64_vec(), [-9.0, -8.0, 1.0, 2.0, -7.0, -6.0, 3.0, 4.0]);
        // Splits keep rank 1's half: row 1, or column 1.
        assert_eq!(v(c(Split)), [3.0, 4.0]);
        assert_eq!(v(c(Split).axis(1)), [2.0, 4.0]);
        // Reduce-scatter along axis 1: column 1 of the sum [[-8, -6], [-4, -2]].
        let rs = run(&c(ReduceScatter).axis(1), &x).unwrap();
        assert_eq!(rs.shape(), [2, 1]);
        assert_eq!(rs.to_f64_vec(), [-6.0, -2.0]);
    }

    #[test]
    fn errors_name_the_collective_and_the_group() {
        let x = t(&[3], &[1.0, 2.0, 3.0]);
        let e = run(&Collective::new(CollectiveKind::AllReduceSum, 9999, 2), &x).unwrap_err();
        assert!(e.contains("all_reduce_sum") && e.contains("9999"), "{e}");
        // The world defaults to this process alone.
        let sum = run(&Collective::new(CollectiveKind::AllReduceSum, 0, 1), &x).unwrap();
        assert_eq!(sum.to_f64_vec(), [1.0, 2.0, 3.0]);
        let e = run(&Collective::new(CollectiveKind::AllReduceSum, 0, 2), &x).unwrap_err();
        assert!(e.contains("expects group 0 to have 2 ranks, but it has 1"), "{e}");
        register(
            102,
            Arc::new(Fake {
                rank: 0,
                n: 3,
                step: 1.0,
            }),
        );
        let e = run(&Collective::new(CollectiveKind::AllGather, 102, 2), &x).unwrap_err();
        assert!(e.contains("expects group 102 to have 2 ranks, but it has 3"), "{e}");
        let e = run(&Collective::new(CollectiveKind::Split, 102, 3), &t(&[2], &[1.0, 2.0])).unwrap_err();
        assert!(e.contains("does not split into 3"), "{e}");
        let ty = TensorType::new(DType::F32, vec![Dim::Static(4), Dim::Static(3)]);
        let split = Collective::new(CollectiveKind::Split, 0, 2).axis(1);
        assert!(
            split
                .infer(std::slice::from_ref(&ty), &[])
                .unwrap_err()
                .contains("does not split")
        );
        let gather = Collective::new(CollectiveKind::AllGather, 0, 2).axis(1);
        assert_eq!(gather.infer(&[ty], &[]).unwrap()[0].to_string(), "f32[4,6]");
    }
}
