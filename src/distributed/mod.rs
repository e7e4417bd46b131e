//! Distributed training on existing engines (Paddle's `paddle.distributed`): process groups and
//! collectives over MPI, data parallelism and a distributed sampler.
//!
//! A program calls [`init`] once; under `mpirun -n 4 PROGRAM` (or `oar launch -n 4 PROGRAM`,
//! which wraps it) each process gets the world group with its rank, and without a launcher the
//! same program runs as a single process (rank 0 of 1), so one code path serves both.
//! Collectives take and return [`Tensor`]s (f32, f64, i32, i64), computed on the host by the
//! MPI library (a tensor on a device is staged through host memory and the result returned on
//! its device; NCCL is not wired in): [`ProcessGroup::all_reduce`] (sum, average, max), `broadcast`, `all_gather`,
//! `reduce_scatter`, `send` / `recv` and `barrier`; [`ProcessGroup::new_group`] makes
//! sub-groups. [`DataParallel`] keeps replicas in step by averaging gradients;
//! `DataLoader::shard` gives each rank its part of every epoch; [`ShardedOptimizer`] splits
//! the optimizer state over the ranks (ZeRO stage 1).
//!
//! MPI comes from the `mpi` crate over the system's library (Debian's OpenMPI), behind the cargo
//! feature `distributed`; a build without it runs single-process programs and refuses to start
//! under a multi-process launcher with an error that names the feature.

pub mod checkpoint;
pub(crate) mod data_parallel;
pub mod fleet;
pub mod functional;
mod hybrid;
#[cfg(feature = "distributed")]
mod mpi_backend;
pub mod pipeline;
pub mod tensor_parallel;
mod zero;

pub use checkpoint::{load_sharded, save_sharded};
pub use data_parallel::DataParallel;
pub use fleet::{DistributedOptimizer, Fleet};
pub use hybrid::{DistributedStrategy, HybridGroups, init_hybrid};
pub use pipeline::{LayerDesc, PipelineLayer, Schedule};
pub use tensor_parallel::{
    ColumnParallelLinear, ParallelMlp, ParallelSelfAttention, ParallelTransformerLayer, RngTracker, RowParallelLinear,
    VocabParallelEmbedding, parallel_cross_entropy,
};
pub use zero::ShardedOptimizer;

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData};
use std::sync::Arc;

/// How [`ProcessGroup::all_reduce`] and `reduce_scatter` combine the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The elementwise sum.
    Sum,
    /// The elementwise mean (sum divided by the group size).
    Avg,
    /// The elementwise maximum.
    Max,
}

/// Flat host buffers of the dtypes collectives move.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Buffer {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl Buffer {
    fn of(op: &str, t: &Tensor) -> Result<(Buffer, Vec<usize>)> {
        let d = t.detach().try_data()?;
        let shape = d.shape().to_vec();
        let bad = |e: oar_ir::tensor_data::TensorDataError| Error::invalid(op, e.to_string());
        let b = match d.dtype() {
            DType::F32 => Buffer::F32(d.to_vec().map_err(bad)?),
            DType::F64 => Buffer::F64(d.to_vec().map_err(bad)?),
            DType::I32 => Buffer::I32(d.to_vec().map_err(bad)?),
            DType::I64 => Buffer::I64(d.to_vec().map_err(bad)?),
            other => {
                return Err(Error::invalid(
                    op,
                    format!("collectives move f32, f64, i32 and i64 tensors, not {other}"),
                ));
            }
        };
        Ok((b, shape))
    }

    fn zeros(dtype: DType, n: usize, op: &str) -> Result<Buffer> {
        Ok(match dtype {
            DType::F32 => Buffer::F32(vec![0.0; n]),
            DType::F64 => Buffer::F64(vec![0.0; n]),
            DType::I32 => Buffer::I32(vec![0; n]),
            DType::I64 => Buffer::I64(vec![0; n]),
            other => {
                return Err(Error::invalid(
                    op,
                    format!("collectives move f32, f64, i32 and i64 tensors, not {other}"),
                ));
            }
        })
    }

    /// Zeros for a tensor of `shape` (its size checked against overflow).
    fn zeros_of_shape(dtype: DType, shape: &[usize], op: &str) -> Result<Buffer> {
        let n = crate::ir::tensor_data::checked_byte_len(dtype, shape)
            .map_err(|e| Error::invalid(op, e.to_string()))?
            / dtype.size_bytes().max(1);
        Buffer::zeros(dtype, n, op)
    }

    #[cfg(feature = "distributed")]
    fn dtype(&self) -> DType {
        match self {
            Buffer::F32(_) => DType::F32,
            Buffer::F64(_) => DType::F64,
            Buffer::I32(_) => DType::I32,
            Buffer::I64(_) => DType::I64,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Buffer::F32(v) => v.len(),
            Buffer::F64(v) => v.len(),
            Buffer::I32(v) => v.len(),
            Buffer::I64(v) => v.len(),
        }
    }

    fn tensor(self, shape: Vec<usize>) -> Result<Tensor> {
        let d = match self {
            Buffer::F32(v) => TensorData::from_vec(shape, v),
            Buffer::F64(v) => TensorData::from_vec(shape, v),
            Buffer::I32(v) => TensorData::from_vec(shape, v),
            Buffer::I64(v) => TensorData::from_vec(shape, v),
        }
        .map_err(|e| Error::invalid("collective", e.to_string()))?;
        Ok(Tensor::from_data(d))
    }

    /// Divide every element by `n` (integer division for integer buffers).
    fn divide(&mut self, n: usize) {
        match self {
            Buffer::F32(v) => v.iter_mut().for_each(|x| *x /= n as f32),
            Buffer::F64(v) => v.iter_mut().for_each(|x| *x /= n as f64),
            Buffer::I32(v) => v.iter_mut().for_each(|x| *x /= n as i32),
            Buffer::I64(v) => v.iter_mut().for_each(|x| *x /= n as i64),
        }
    }

    /// `parts` equal consecutive pieces.
    fn split(self, parts: usize) -> Vec<Buffer> {
        fn chunks<T: Clone>(v: Vec<T>, parts: usize) -> Vec<Vec<T>> {
            let n = v.len() / parts.max(1);
            v.chunks(n.max(1)).map(<[T]>::to_vec).collect()
        }
        match self {
            Buffer::F32(v) => chunks(v, parts).into_iter().map(Buffer::F32).collect(),
            Buffer::F64(v) => chunks(v, parts).into_iter().map(Buffer::F64).collect(),
            Buffer::I32(v) => chunks(v, parts).into_iter().map(Buffer::I32).collect(),
            Buffer::I64(v) => chunks(v, parts).into_iter().map(Buffer::I64).collect(),
        }
    }
}

/// What a transport provides: one communicator's collectives on flat buffers. `Sum` and `Max`
/// only (averages divide afterwards); `all_gather` and `reduce_scatter` move equal parts.
pub(crate) trait Comm: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    fn all_reduce(&self, buf: &mut Buffer, max: bool) -> Result<()>;
    /// The sum of `send` over the group into `recv` (same length): gradient buckets, whose
    /// buffers the caller keeps from step to step.
    fn sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()>;
    fn broadcast(&self, buf: &mut Buffer, root: usize) -> Result<()>;
    fn all_gather(&self, send: &Buffer, recv: &mut Buffer) -> Result<()>;
    fn reduce_scatter(&self, send: &Buffer, recv: &mut Buffer, max: bool) -> Result<()>;
    fn send(&self, buf: &Buffer, dst: usize) -> Result<()>;
    fn recv(&self, buf: &mut Buffer, src: usize) -> Result<()>;
    /// Send `send` to `dst` and receive `recv` from `src` in one call (`MPI_Sendrecv`), so two
    /// ranks exchanging in opposite directions never wait on each other.
    fn send_recv(&self, send: &Buffer, dst: usize, recv: &mut Buffer, src: usize) -> Result<()>;
    fn barrier(&self) -> Result<()>;
    /// The sub-communicator of `ranks` (this process must be one of them).
    fn split(&self, ranks: &[usize]) -> Result<Option<Arc<dyn Comm>>>;
}

/// The group of one process: every collective is the identity.
struct Solo;

impl Comm for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce(&self, _: &mut Buffer, _: bool) -> Result<()> {
        Ok(())
    }
    fn sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        recv.copy_from_slice(send);
        Ok(())
    }
    fn broadcast(&self, _: &mut Buffer, _: usize) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, send: &Buffer, recv: &mut Buffer) -> Result<()> {
        *recv = send.clone();
        Ok(())
    }
    fn reduce_scatter(&self, send: &Buffer, recv: &mut Buffer, _: bool) -> Result<()> {
        *recv = send.clone();
        Ok(())
    }
    fn send(&self, _: &Buffer, dst: usize) -> Result<()> {
        Err(Error::invalid(
            "send",
            format!("rank {dst} does not exist in a group of one"),
        ))
    }
    fn recv(&self, _: &mut Buffer, src: usize) -> Result<()> {
        Err(Error::invalid(
            "recv",
            format!("rank {src} does not exist in a group of one"),
        ))
    }
    fn send_recv(&self, _: &Buffer, dst: usize, _: &mut Buffer, src: usize) -> Result<()> {
        Err(Error::invalid(
            "send_recv",
            format!("ranks {dst} and {src}: a group of one has no other rank"),
        ))
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn split(&self, ranks: &[usize]) -> Result<Option<Arc<dyn Comm>>> {
        Ok(ranks.contains(&0).then(|| Arc::new(Solo) as Arc<dyn Comm>))
    }
}

/// A set of processes that run collectives together (Paddle's `Group`, PyTorch's
/// `ProcessGroup`). Cheap to clone; every member must call each collective in the same order.
#[derive(Clone)]
pub struct ProcessGroup {
    comm: Arc<dyn Comm>,
    /// This group's members as world ranks, in group-rank order.
    ranks: Vec<usize>,
    /// The group's number in IR collectives ([`ProcessGroup::id`]).
    id: usize,
}

/// The number of the group of `ranks` (world ranks, sorted) in IR collectives: 0 for the
/// world, else a hash of the members, so that every process — and a graph saved on one rank
/// and loaded on another — names a group the same way.
fn group_id(ranks: &[usize], world: usize) -> usize {
    if ranks.len() == world && ranks.iter().enumerate().all(|(i, &r)| i == r) {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in ranks {
        for b in (*r as u64).to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    // Small enough to read in the IR text, never 0.
    1 + (h % 0x7fff_ffff) as usize
}

/// A group's transport as the IR's collectives see it ([`oar_ir::ops::Communicator`]).
struct IrComm(Arc<dyn Comm>);

impl IrComm {
    fn buffer(x: &TensorData) -> std::result::Result<Buffer, String> {
        Buffer::of("collective", &Tensor::from_data(x.clone()))
            .map(|(b, _)| b)
            .map_err(|e| e.to_string())
    }

    fn data(b: Buffer, shape: &[usize]) -> std::result::Result<TensorData, String> {
        b.tensor(shape.to_vec())
            .and_then(|t| t.try_data())
            .map_err(|e| e.to_string())
    }
}

impl oar_ir::ops::Communicator for IrComm {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn all_reduce(&self, x: &TensorData, max: bool) -> std::result::Result<TensorData, String> {
        let mut b = Self::buffer(x)?;
        self.0.all_reduce(&mut b, max).map_err(|e| e.to_string())?;
        Self::data(b, x.shape())
    }
    fn all_gather(&self, x: &TensorData) -> std::result::Result<Vec<TensorData>, String> {
        let b = Self::buffer(x)?;
        let mut recv = Buffer::zeros(x.dtype(), b.len() * self.size(), "all_gather").map_err(|e| e.to_string())?;
        self.0.all_gather(&b, &mut recv).map_err(|e| e.to_string())?;
        recv.split(self.size())
            .into_iter()
            .map(|p| Self::data(p, x.shape()))
            .collect()
    }
    fn reduce_scatter(&self, x: &TensorData, part: &[usize]) -> std::result::Result<TensorData, String> {
        let b = Self::buffer(x)?;
        let mut recv =
            Buffer::zeros(x.dtype(), b.len() / self.size().max(1), "reduce_scatter").map_err(|e| e.to_string())?;
        self.0.reduce_scatter(&b, &mut recv, false).map_err(|e| e.to_string())?;
        Self::data(recv, part)
    }
}

/// The deadline of every collective and point-to-point call, in milliseconds (0: the default).
static TIMEOUT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long a collective may wait for the other ranks before this process gives up with an
/// error naming the call (default 30 s, or `OAR_DIST_TIMEOUT` in seconds): a rank that died or
/// hung ends the job instead of hanging it. Applies to every group of this process.
pub fn set_timeout(timeout: std::time::Duration) {
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1);
    TIMEOUT_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

/// The deadline [`set_timeout`] set, else `OAR_DIST_TIMEOUT` seconds, else 30 s.
pub fn timeout() -> std::time::Duration {
    match TIMEOUT_MS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => std::env::var("OAR_DIST_TIMEOUT")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(std::time::Duration::from_secs(30), std::time::Duration::from_secs_f64),
        ms => std::time::Duration::from_millis(ms),
    }
}

/// The launcher's view of this process, from the environment: `(rank, size)`.
fn launcher_world() -> Option<(usize, usize)> {
    let var = |names: &[&str]| names.iter().find_map(|n| std::env::var(n).ok()?.parse::<usize>().ok());
    let size = var(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"])?;
    let rank = var(&["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]).unwrap_or(0);
    Some((rank, size))
}

/// Join the job the launcher started (`mpirun`, `oar launch`): the world group. Without a
/// launcher, a group of one. Call it once per process (later calls return the same group).
pub fn init() -> Result<ProcessGroup> {
    static WORLD: std::sync::OnceLock<std::result::Result<ProcessGroup, String>> = std::sync::OnceLock::new();
    WORLD
        .get_or_init(|| world().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| Error::invalid("distributed::init", e))
}

fn world() -> Result<ProcessGroup> {
    let comm: Arc<dyn Comm> = match launcher_world() {
        None | Some((_, 1)) => Arc::new(Solo),
        Some((_, size)) => multi_process(size)?,
    };
    let ranks = (0..comm.size()).collect();
    Ok(ProcessGroup::registered(comm, ranks))
}

#[cfg(feature = "distributed")]
fn multi_process(_size: usize) -> Result<Arc<dyn Comm>> {
    mpi_backend::world()
}

#[cfg(not(feature = "distributed"))]
fn multi_process(size: usize) -> Result<Arc<dyn Comm>> {
    Err(Error::invalid(
        "distributed::init",
        format!(
            "started as one of {size} processes, but this build of oar has no MPI: build it with the cargo \
             feature `distributed`"
        ),
    ))
}

impl ProcessGroup {
    /// The group over `comm`, registered for IR collectives under its [`group_id`].
    fn registered(comm: Arc<dyn Comm>, ranks: Vec<usize>) -> ProcessGroup {
        let world = launcher_world().map_or(1, |(_, n)| n);
        let id = group_id(&ranks, world);
        oar_ir::ops::collective::register(id, Arc::new(IrComm(comm.clone())));
        ProcessGroup { comm, ranks, id }
    }

    /// The group's number in IR collectives (Paddle's `ring_id`): 0 for the world, else
    /// derived from its members, the same in every process.
    pub fn id(&self) -> usize {
        self.id
    }

    /// This process's rank in the group (0-based).
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of processes in the group.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// The group's members as world ranks.
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// The sub-group of the given world ranks (Paddle's `new_group`): every process of this
    /// group must call it with the same list; those in it get `Some`, the others `None`.
    pub fn new_group(&self, world_ranks: &[usize]) -> Result<Option<ProcessGroup>> {
        let mut local = Vec::with_capacity(world_ranks.len());
        for r in world_ranks {
            match self.ranks.iter().position(|x| x == r) {
                Some(i) if !local.contains(&i) => local.push(i),
                Some(_) => return Err(Error::invalid("new_group", format!("rank {r} is listed twice"))),
                None => {
                    return Err(Error::invalid(
                        "new_group",
                        format!("rank {r} is not in this group ({:?})", self.ranks),
                    ));
                }
            }
        }
        local.sort_unstable();
        Ok(self
            .comm
            .split(&local)?
            .map(|comm| ProcessGroup::registered(comm, local.iter().map(|&i| self.ranks[i]).collect())))
    }

    /// The elementwise combination of `t` over the group; every rank gets the result. Shapes
    /// and dtypes must agree across ranks.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let (mut b, shape) = Buffer::of("all_reduce", t)?;
        self.comm.all_reduce(&mut b, op == ReduceOp::Max)?;
        if op == ReduceOp::Avg {
            b.divide(self.size());
        }
        b.tensor(shape)?.to(&t.device())
    }

    /// Rank `root`'s `t` on every rank (the others' `t` gives the shape and dtype).
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        self.check_rank("broadcast", root)?;
        let (mut b, shape) = Buffer::of("broadcast", t)?;
        self.comm.broadcast(&mut b, root)?;
        b.tensor(shape)?.to(&t.device())
    }

    /// Every rank's `t`, in rank order (equal shapes).
    pub fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        let (b, shape) = Buffer::of("all_gather", t)?;
        let mut recv = Buffer::zeros(t.dtype(), b.len() * self.size(), "all_gather")?;
        self.comm.all_gather(&b, &mut recv)?;
        recv.split(self.size())
            .into_iter()
            .map(|p| p.tensor(shape.clone())?.to(&t.device()))
            .collect()
    }

    /// Combine `t` over the group and give rank `r` the `r`-th of `size` equal slices along
    /// axis 0 (whose length the size must divide).
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let (b, mut shape) = Buffer::of("reduce_scatter", t)?;
        let n = self.size();
        match shape.first() {
            Some(&d0) if d0 % n == 0 => shape[0] = d0 / n,
            _ => {
                return Err(Error::invalid(
                    "reduce_scatter",
                    format!("axis 0 of {shape:?} does not split into {n} equal parts"),
                ));
            }
        }
        let mut recv = Buffer::zeros(t.dtype(), b.len() / n, "reduce_scatter")?;
        self.comm.reduce_scatter(&b, &mut recv, op == ReduceOp::Max)?;
        if op == ReduceOp::Avg {
            recv.divide(n);
        }
        recv.tensor(shape)?.to(&t.device())
    }

    /// Send `t` to rank `dst` (blocking until it can be reused).
    pub fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        self.check_rank("send", dst)?;
        let (b, _) = Buffer::of("send", t)?;
        self.comm.send(&b, dst)
    }

    /// Receive a tensor of `shape` and `dtype` from rank `src`.
    pub fn recv(&self, shape: &[usize], dtype: DType, src: usize) -> Result<Tensor> {
        self.check_rank("recv", src)?;
        let mut b = Buffer::zeros_of_shape(dtype, shape, "recv")?;
        self.comm.recv(&mut b, src)?;
        b.tensor(shape.to_vec())
    }

    /// Send `t` to rank `dst` and receive a tensor of `shape` and `t`'s dtype from rank `src`
    /// at once (`MPI_Sendrecv`): the exchange a pipeline stage makes with its neighbours.
    pub fn send_recv(&self, t: &Tensor, dst: usize, shape: &[usize], src: usize) -> Result<Tensor> {
        self.check_rank("send_recv", dst)?;
        self.check_rank("send_recv", src)?;
        let (b, _) = Buffer::of("send_recv", t)?;
        let mut r = Buffer::zeros_of_shape(t.dtype(), shape, "send_recv")?;
        self.comm.send_recv(&b, dst, &mut r, src)?;
        r.tensor(shape.to_vec())?.to(&t.device())
    }

    /// Wait until every rank of the group gets here.
    pub fn barrier(&self) -> Result<()> {
        self.comm.barrier()
    }

    fn check_rank(&self, op: &str, r: usize) -> Result<()> {
        if r < self.size() {
            Ok(())
        } else {
            Err(Error::invalid(
                op,
                format!("rank {r} is not in a group of {}", self.size()),
            ))
        }
    }
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup(rank {} of {}, world ranks {:?})",
            self.rank(),
            self.size(),
            self.ranks
        )
    }
}
