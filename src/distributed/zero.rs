//! ZeRO stage 1: each rank of a data-parallel group keeps the optimizer state of its share of
//! the parameters only.

use super::ProcessGroup;
use crate::error::{Error, Result};
use crate::optimizer::Optimizer;
use crate::tensor::Tensor;
use oar_ir::TensorData;
use std::collections::BTreeMap;

/// An optimizer whose state is sharded over a data-parallel group (ZeRO stage 1, Paddle's
/// `sharding` stage 1): the parameters are split among the ranks, balanced by size; each rank
/// builds the real optimizer over its own share, updates only those, and then every parameter
/// is broadcast from the rank that owns it. With gradients averaged first
/// ([`super::DataParallel::sync_gradients`]), every rank ends each step with the parameters
/// one optimizer over all of them would give, holding about 1/N of its state.
/// `state_dict` is this rank's shard (each rank saves its own).
pub struct ShardedOptimizer<O> {
    inner: O,
    group: ProcessGroup,
    params: Vec<Tensor>,
    /// The owning rank of each of `params`.
    owners: Vec<usize>,
}

impl<O: Optimizer> ShardedOptimizer<O> {
    /// Split `params` among `group`'s ranks and build this rank's optimizer over its share
    /// with `build` (every rank must call it with the same parameters in the same order).
    pub fn new(
        params: Vec<(String, Tensor)>,
        group: &ProcessGroup,
        build: impl FnOnce(Vec<(String, Tensor)>) -> O,
    ) -> Result<ShardedOptimizer<O>> {
        let owners = partition(&params, group.size());
        let mine = params
            .iter()
            .zip(&owners)
            .filter(|(_, o)| **o == group.rank())
            .map(|(p, _)| p.clone())
            .collect();
        Ok(ShardedOptimizer {
            inner: build(mine),
            group: group.clone(),
            params: params.into_iter().map(|(_, t)| t).collect(),
            owners,
        })
    }

    /// The owning rank of each parameter, in the order given.
    pub fn owners(&self) -> &[usize] {
        &self.owners
    }

    /// This rank's optimizer.
    pub fn inner(&self) -> &O {
        &self.inner
    }
}

/// Owners balancing the ranks' element counts: largest parameters first, each to the rank
/// with the fewest elements so far (ties to the lower rank), so every rank computes the same.
fn partition(params: &[(String, Tensor)], ranks: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..params.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(params[i].1.numel()), i));
    let mut load = vec![0usize; ranks.max(1)];
    let mut owners = vec![0; params.len()];
    for i in order {
        let r = (0..load.len()).min_by_key(|&r| (load[r], r)).unwrap_or(0);
        owners[i] = r;
        load[r] += params[i].1.numel();
    }
    owners
}

impl<O: Optimizer> Optimizer for ShardedOptimizer<O> {
    fn step(&mut self) -> Result<()> {
        self.inner.step()?;
        let _ng = crate::no_grad();
        for (p, &owner) in self.params.iter().zip(&self.owners) {
            let v = self.group.broadcast(p, owner)?;
            p.set_data(v.try_data()?)?;
        }
        Ok(())
    }

    fn clear_grad(&self) {
        self.params.iter().for_each(Tensor::clear_grad);
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
        &self.params
    }

    fn set_multi_precision(&mut self, on: bool) -> Result<()> {
        self.inner.set_multi_precision(on)
    }

    fn skip_traced_step_if(&mut self, _cond: Option<Tensor>) -> Result<()> {
        Err(Error::invalid(
            "ShardedOptimizer",
            "sharded optimizers run eager steps only (no to_static)",
        ))
    }
}
