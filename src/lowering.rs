//! The standard pipeline a kernel-consuming backend runs (docs/BACKENDS.md, route B): bind the
//! symbolic dims, simplify, decompose and fuse into a [`KernelProgram`].

use oar_ir::kernel::KernelProgram;
use oar_ir::{BackendError, Graph};
use oar_passes::{Canonicalize, Cse, Dce, Fold, PassManager, Simplify, SpecializeShapes};
use std::collections::BTreeMap;

/// `graph` specialized to `bindings` (`N → 8`; every dim must end up static for most code
/// generators), canonicalized, folded, CSE'd, simplified, DCE'd, then fused by
/// [`oar_passes::fuse::fuse`] (which decomposes every composite first). A pass failure is a
/// [`BackendError::Runtime`] naming the graph and the pass's message.
pub fn kernel_program(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<KernelProgram, BackendError> {
    let err = |e: oar_passes::PassError| BackendError::Runtime {
        op: "compile".into(),
        value: graph.name().into(),
        detail: e.to_string(),
    };
    let mut g = graph.clone();
    let mut pm = PassManager::new();
    pm.add(SpecializeShapes::new(bindings.iter().map(|(k, v)| (k.clone(), *v))))
        .add(Canonicalize)
        .add(Fold::new())
        .add(Cse)
        .add(Simplify::new())
        .add(Dce);
    pm.run(&mut g).map_err(err)?;
    oar_passes::fuse::fuse(&g).map_err(err)
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
