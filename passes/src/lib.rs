//! oar-passes: the pass manager and graph passes, one file per pass.
//!
//! A [`Pass`] rewrites a [`Graph`] in place and says whether it changed anything. The
//! [`PassManager`] runs a pipeline of passes and can verify after each, print the graph before
//! and after chosen passes through a caller-supplied sink, time each pass, and stop after pass
//! N (to bisect a bad rewrite). Passes are found by name in a registry ([`pass_by_name`]).

pub mod amp;
mod canonicalize;
mod check_numerics;
mod cse;
mod dce;
mod decompose;
mod error;
mod fold;
mod fold_batch_norm;
pub mod fuse;
mod fuse_build;
pub mod legalize;
mod manager;
pub mod memory_plan;
mod quantize;
mod recompose;
mod regions;
mod registry;
mod rewrite;
pub mod simplify;
mod specialize_shapes;
pub mod spmd;
mod steps;

pub use amp::{Amp, AmpClass, AmpConfig, AmpLevel};
pub use canonicalize::Canonicalize;
pub use check_numerics::{DEFAULT_ATOL, DEFAULT_RTOL, HALF_ATOL, HALF_RTOL, MAX_GENERATED_ELEMENTS, NumericsCheck};
pub use cse::Cse;
pub use dce::Dce;
pub use decompose::{Decompose, KeepIf};
pub use error::PassError;
pub use fold::{DEFAULT_FOLD_LIMIT_BYTES, Fold};
pub use fold_batch_norm::FoldBatchNorm;
pub use fuse::Fuse;
pub use manager::{IrSink, PassManager, PassRecord, PassReport, count_nodes};
pub use memory_plan::{memory_plan, memory_plan_joined};
pub use quantize::{FakeQuantToQdq, Quantize};
pub use recompose::Recompose;
pub use registry::{list_passes, pass_by_name, pass_from_spec};
pub use simplify::{Simplify, SimplifyStats};
pub use specialize_shapes::SpecializeShapes;
pub use spmd::{Partitioned, Sharding, Spmd, SpmdConfig, partition};
pub use steps::{StepBudget, StepRun};

use oar_ir::Graph;

/// A graph rewrite with a name and a one-line description.
pub trait Pass {
    /// The registry name (`dce`, `decompose`, ...).
    fn name(&self) -> &'static str;
    /// One line about what the pass does.
    fn description(&self) -> &'static str;
    /// Rewrite `graph` in place; returns whether anything changed.
    fn run(&self, graph: &mut Graph) -> Result<bool, PassError>;
    /// Rewrite with at most `max_steps` rewrites (`None`: all), counting them, so a bad rewrite
    /// can be found by step number. The default ignores the limit and does not count.
    fn run_steps(&self, graph: &mut Graph, max_steps: Option<usize>) -> Result<StepRun, PassError> {
        let _ = max_steps;
        Ok(StepRun {
            changed: self.run(graph)?,
            steps: None,
        })
    }
}
