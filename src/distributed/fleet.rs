//! Paddle's `fleet` entry points for collective training: `fleet::init(strategy)` arranges the
//! job ([`init_hybrid`]); `distributed_model` replicates a model over the data-parallel group
//! and `distributed_optimizer` averages the gradients over it before every update, so a
//! training loop needs no explicit synchronisation:
//!
//! ```ignore
//! let fleet = oar::distributed::fleet::init(DistributedStrategy { dp_degree: 2, ..Default::default() })?;
//! let model = fleet.distributed_model(net)?;
//! let mut opt = fleet.distributed_optimizer(Adam::new(model.named_parameters(), 1e-3));
//! loss.backward()?;
//! opt.step()?; // gradients averaged over the replicas, then the update
//! ```
//!
//! Gradient accumulation (PyTorch's `no_sync`) needs nothing special: `backward` several times,
//! then one `step`, which averages the accumulated gradients once.

use super::data_parallel::{DEFAULT_BUCKET_BYTES, average_gradients};
use super::{DataParallel, DistributedStrategy, HybridGroups, ProcessGroup, init_hybrid};
use crate::error::Result;
use crate::nn::Layer;
use crate::optimizer::Optimizer;
use crate::tensor::Tensor;
use oar_ir::TensorData;
use std::collections::BTreeMap;

/// The job as `fleet::init` arranged it.
#[derive(Clone, Debug)]
pub struct Fleet {
    world: ProcessGroup,
    groups: HybridGroups,
}

/// Join the job ([`super::init`]) and arrange it as `strategy` says.
pub fn init(strategy: DistributedStrategy) -> Result<Fleet> {
    let world = super::init()?;
    let groups = init_hybrid(&world, strategy)?;
    Ok(Fleet { world, groups })
}

impl Fleet {
    /// The world group.
    pub fn world(&self) -> &ProcessGroup {
        &self.world
    }

    /// This rank's data-, pipeline- and tensor-parallel groups.
    pub fn groups(&self) -> &HybridGroups {
        &self.groups
    }

    /// `layer` replicated over the data-parallel group (its weights become that group's rank
    /// 0's).
    pub fn distributed_model<L: Layer>(&self, layer: L) -> Result<DataParallel<L>> {
        DataParallel::new(layer, &self.groups.dp)
    }

    /// `inner` with its gradients averaged over the data-parallel group before each step.
    pub fn distributed_optimizer<O: Optimizer>(&self, inner: O) -> DistributedOptimizer<O> {
        DistributedOptimizer {
            inner,
            group: self.groups.dp.clone(),
        }
    }
}

/// An optimizer whose `step` first averages its parameters' gradients over a data-parallel
/// group (in buckets, one all-reduce each), then updates (Paddle's `HybridParallelOptimizer`).
pub struct DistributedOptimizer<O> {
    inner: O,
    group: ProcessGroup,
}

impl<O: Optimizer> DistributedOptimizer<O> {
    /// The wrapped optimizer.
    pub fn inner(&self) -> &O {
        &self.inner
    }
}

impl<O: Optimizer> Optimizer for DistributedOptimizer<O> {
    fn step(&mut self) -> Result<()> {
        average_gradients(self.inner.parameters(), &self.group, DEFAULT_BUCKET_BYTES)?;
        self.inner.step()
    }

    fn clear_grad(&self) {
        self.inner.clear_grad()
    }

    fn get_lr(&self) -> f64 {
        self.inner.get_lr()
    }

    fn set_lr(&mut self, lr: f64) {
        self.inner.set_lr(lr)
    }

    fn state_dict(&self) -> BTreeMap<String, TensorData> {
        self.inner.state_dict()
    }

    fn set_state_dict(&mut self, state: &BTreeMap<String, TensorData>) -> Result<()> {
        self.inner.set_state_dict(state)
    }

    fn parameters(&self) -> &[Tensor] {
        self.inner.parameters()
    }

    fn set_multi_precision(&mut self, on: bool) -> Result<()> {
        self.inner.set_multi_precision(on)
    }

    fn skip_traced_step_if(&mut self, cond: Option<Tensor>) -> Result<()> {
        self.inner.skip_traced_step_if(cond)
    }
}
