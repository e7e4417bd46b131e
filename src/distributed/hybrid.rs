//! Hybrid parallelism (Paddle's `fleet.init(strategy=...)` and `HybridCommunicateGroup`): the
//! world arranged as a `dp × pp × mp` grid, and for this rank the three groups it belongs to —
//! the ranks holding the same model slice on other data (data parallel), the stages of its
//! pipeline (pipeline parallel) and the ranks splitting its layers (tensor parallel).
//!
//! The tensor-parallel axis is the innermost (its ranks are neighbours, as they talk the most):
//! world rank `((dp · pp_degree) + pp) · mp_degree + mp`.

use super::ProcessGroup;
use crate::error::{Error, Result};

/// How the world is split (Paddle's `DistributedStrategy.hybrid_configs` and
/// `pipeline_configs`); the three degrees multiply to the world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistributedStrategy {
    /// Replicas on different data.
    pub dp_degree: usize,
    /// Ranks splitting each layer (tensor parallel).
    pub mp_degree: usize,
    /// Pipeline stages.
    pub pp_degree: usize,
    /// Micro-batches per pipeline step (`PipelineLayer::train_batch`).
    pub accumulate_steps: usize,
    /// Samples per micro-batch.
    pub micro_batch_size: usize,
}

impl Default for DistributedStrategy {
    fn default() -> Self {
        DistributedStrategy {
            dp_degree: 1,
            mp_degree: 1,
            pp_degree: 1,
            accumulate_steps: 1,
            micro_batch_size: 1,
        }
    }
}

/// This rank's place in the `dp × pp × mp` grid and its three groups.
#[derive(Clone, Debug)]
pub struct HybridGroups {
    /// The strategy it was made for.
    pub strategy: DistributedStrategy,
    /// The ranks with this rank's model slice on other data (size `dp_degree`).
    pub dp: ProcessGroup,
    /// This rank's pipeline: one rank per stage (size `pp_degree`; rank `s` runs stage `s`).
    pub pp: ProcessGroup,
    /// The ranks splitting this rank's layers (size `mp_degree`).
    pub mp: ProcessGroup,
}

impl HybridGroups {
    /// This rank's coordinates `(dp, pp, mp)` in the grid.
    pub fn coords(&self) -> (usize, usize, usize) {
        (self.dp.rank(), self.pp.rank(), self.mp.rank())
    }

    /// The samples of a global batch of `batch` this rank's data-parallel replica trains on:
    /// slice `dp` of `dp_degree` equal slices (an error unless they are equal).
    pub fn data_slice(&self, batch: usize) -> Result<std::ops::Range<usize>> {
        let n = self.strategy.dp_degree;
        if !batch.is_multiple_of(n) {
            return Err(Error::invalid(
                "HybridGroups::data_slice",
                format!("a batch of {batch} does not split into {n} data-parallel replicas"),
            ));
        }
        let k = batch / n;
        Ok(self.dp.rank() * k..(self.dp.rank() + 1) * k)
    }
}

/// Arrange `world` as `strategy` says and return this rank's groups. Every rank of `world`
/// must call it with the same strategy (it makes groups, a collective act).
pub fn init_hybrid(world: &ProcessGroup, strategy: DistributedStrategy) -> Result<HybridGroups> {
    let DistributedStrategy {
        dp_degree: dp,
        mp_degree: mp,
        pp_degree: pp,
        ..
    } = strategy;
    if dp == 0 || mp == 0 || pp == 0 || dp.checked_mul(mp).and_then(|x| x.checked_mul(pp)) != Some(world.size()) {
        return Err(Error::invalid(
            "init_hybrid",
            format!(
                "dp {dp} × pp {pp} × mp {mp} must equal the world size {} (every degree at least 1)",
                world.size()
            ),
        ));
    }
    let rank_of = |d: usize, p: usize, m: usize| world.ranks()[(d * pp + p) * mp + m];
    // Every rank makes every group in the same order; each keeps the ones it is in.
    let mine = |groups: Vec<Vec<usize>>| -> Result<ProcessGroup> {
        let mut found = None;
        for g in groups {
            if let Some(made) = world.new_group(&g)? {
                found = Some(made);
            }
        }
        found.ok_or_else(|| Error::invalid("init_hybrid", "this rank is in none of the groups"))
    };
    let dp_groups = (0..pp)
        .flat_map(|p| (0..mp).map(move |m| (p, m)))
        .map(|(p, m)| (0..dp).map(|d| rank_of(d, p, m)).collect())
        .collect();
    let pp_groups = (0..dp)
        .flat_map(|d| (0..mp).map(move |m| (d, m)))
        .map(|(d, m)| (0..pp).map(|p| rank_of(d, p, m)).collect())
        .collect();
    let mp_groups = (0..dp)
        .flat_map(|d| (0..pp).map(move |p| (d, p)))
        .map(|(d, p)| (0..mp).map(|m| rank_of(d, p, m)).collect())
        .collect();
    Ok(HybridGroups {
        strategy,
        dp: mine(dp_groups)?,
        pp: mine(pp_groups)?,
        mp: mine(mp_groups)?,
    })
}
