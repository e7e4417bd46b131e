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

/// [`kernel_program`] keeping the composites named in `keep` whole, each an opaque kernel
/// holding `Op::Composite` for a backend that implements them itself (a fused attention, a
/// vendor layer_norm); see [`oar_passes::fuse::lower_to_kernels_keeping`].
pub fn kernel_program_keeping(
    graph: &Graph,
    bindings: &BTreeMap<String, usize>,
    keep: &[&str],
) -> Result<KernelProgram, BackendError> {
    let err = |e: oar_passes::PassError| BackendError::Runtime {
        op: "compile".into(),
        value: graph.name().into(),
        detail: e.to_string(),
    };
    oar_passes::fuse::lower_to_kernels_keeping(graph, bindings, keep).map_err(err)
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

    #[test]
    fn keeps_the_composites_asked_for() {
        let spec = crate::jit::InputSpec::new(&[Some(2), Some(4)], oar_ir::DType::F32, "x");
        let f = crate::jit::to_static(|xs| Ok(vec![crate::nn::functional::softmax(&xs[0], -1)?]), &[spec]).unwrap();
        let kept = kernel_program_keeping(f.graph(), &BTreeMap::new(), &["softmax"]).unwrap();
        assert_eq!(kept.kernel_counts(), (0, 0, 1), "{kept}");
        let fused = kernel_program(f.graph(), &BTreeMap::new()).unwrap();
        assert_eq!(fused.kernel_counts(), (1, 0, 0), "{fused}");
        let e = kernel_program_keeping(f.graph(), &BTreeMap::new(), &["nope"]).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }
}
