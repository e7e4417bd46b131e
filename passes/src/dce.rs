//! Dead-code elimination: remove nodes whose values reach no output, in regions too.

use crate::regions::rewrite_regions;
use crate::{Pass, PassError};
use oar_ir::{Graph, IrError};

/// Dead-code elimination. Graph inputs stay (they are the signature), as do region arguments.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dce;

/// Remove dead nodes of `graph` and, recursively, of the regions of its live nodes.
fn dce(graph: &mut Graph) -> Result<bool, IrError> {
    // Top level first, so regions of dead nodes are never visited.
    let removed = graph.remove_dead_nodes();
    let in_regions = rewrite_regions(graph, &mut dce)?;
    Ok(removed > 0 || in_regions)
}

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn description(&self) -> &'static str {
        "remove nodes whose values reach no output (regions too)"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        dce(graph).map_err(|e| PassError::ir(self.name(), e))
    }
}
