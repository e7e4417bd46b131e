//! Collectives as differentiable tensor ops (`paddle.distributed` functions and Paddle's
//! `mp_ops`): each is one IR op ([`oar_ir::ops::Collective`]), so autograd differentiates it
//! and `to_static` traces it into the graph, where every backend runs it through the group's
//! transport. See [`oar_ir::ops::collective`] for the two families of gradients.
//!
//! On a group of one process every function is the identity (no op is recorded).

use super::{ProcessGroup, ReduceOp};
use crate::error::Result;
use crate::tensor::{Tensor, apply1, norm_axis};
use oar_ir::Op;
use oar_ir::ops::{Collective, CollectiveKind};

fn collective(kind: CollectiveKind, x: &Tensor, group: &ProcessGroup, axis: Option<i64>) -> Result<Tensor> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    let axis = match axis {
        Some(a) => norm_axis(kind.name(), a, x.ndim())?,
        None => 0,
    };
    apply1(
        Op::Collective(Collective::new(kind, group.id(), group.size()).axis(axis)),
        &[x],
    )
}

/// The elementwise sum, mean or maximum of `x` over `group`, on every rank. The gradient of a
/// sum is the sum of the ranks' gradients (the objective is the total of the ranks' losses);
/// a maximum has none.
pub fn all_reduce(x: &Tensor, op: ReduceOp, group: &ProcessGroup) -> Result<Tensor> {
    let kind = match op {
        ReduceOp::Sum => CollectiveKind::AllReduceSum,
        ReduceOp::Avg => CollectiveKind::AllReduceAvg,
        ReduceOp::Max => CollectiveKind::AllReduceMax,
    };
    collective(kind, x, group, None)
}

/// Every rank's `x` concatenated along `axis`, in rank order; its gradient is reduce-scattered.
pub fn all_gather(x: &Tensor, axis: i64, group: &ProcessGroup) -> Result<Tensor> {
    collective(CollectiveKind::AllGather, x, group, Some(axis))
}

/// The sum of `x` over `group`, of which rank `r` keeps slice `r` along `axis`; its gradient
/// is all-gathered.
pub fn reduce_scatter(x: &Tensor, axis: i64, group: &ProcessGroup) -> Result<Tensor> {
    collective(CollectiveKind::ReduceScatter, x, group, Some(axis))
}

/// `x` itself, whose gradient is summed over `group` (Megatron's `f`, Paddle's `c_identity`):
/// where a replicated activation enters a tensor-parallel region.
pub fn copy_to_parallel(x: &Tensor, group: &ProcessGroup) -> Result<Tensor> {
    collective(CollectiveKind::Identity, x, group, None)
}

/// The sum of `x` over `group`, whose gradient passes as is (Megatron's `g`, Paddle's
/// `mp_allreduce`): where partial results leave a tensor-parallel region.
pub fn reduce_from_parallel(x: &Tensor, group: &ProcessGroup) -> Result<Tensor> {
    collective(CollectiveKind::MpAllReduce, x, group, None)
}

/// This rank's slice of `x` along `axis` (no communication); the gradient is gathered
/// (Paddle's `c_split`).
pub fn scatter_to_parallel(x: &Tensor, axis: i64, group: &ProcessGroup) -> Result<Tensor> {
    collective(CollectiveKind::Split, x, group, Some(axis))
}

/// Every rank's `x` concatenated along `axis`; the gradient is this rank's slice (Paddle's
/// `c_concat`).
pub fn gather_from_parallel(x: &Tensor, axis: i64, group: &ProcessGroup) -> Result<Tensor> {
    collective(CollectiveKind::Concat, x, group, Some(axis))
}
