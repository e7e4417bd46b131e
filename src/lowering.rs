//! The standard pipeline a kernel-consuming backend runs (docs/BACKENDS.md, route B): bind the
//! symbolic dims, simplify, decompose and fuse into a [`KernelProgram`].

use oar_ir::kernel::KernelProgram;
use oar_ir::{BackendError, Graph};
use std::collections::BTreeMap;

/// [`oar_passes::fuse::lower_to_kernels`] (`graph` specialized to `bindings` — every dim must
/// end up static for most code generators — simplified and fused); a pass failure is a
/// [`BackendError::Runtime`] naming the graph and the pass's message.
pub fn kernel_program(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<KernelProgram, BackendError> {
    let err = |e: oar_passes::PassError| BackendError::Runtime {
        op: "compile".into(),
        value: graph.name().into(),
        detail: e.to_string(),
    };
    oar_passes::fuse::lower_to_kernels(graph, bindings).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_symbols_and_fuses() {
        let spec = crate::jit::InputSpec::new(&[None, Some(4)], oar_ir::DType::F32, "x");
        let f = crate::jit::to_static(|xs| Ok(vec![xs[0].exp()?.sqrt()?]), &[spec]).unwrap();
        let p = kernel_program(f.graph(), &[("N".to_string(), 3)].into()).unwrap();
        assert_eq!(p.kernels.len(), 1, "{p}");
        assert_eq!(
            p.buffers.iter().map(|b| b.ty.to_string()).collect::<Vec<_>>(),
            ["f32[3,4]"; 2]
        );
    }
}
