//! The process-wide backend registry: built-in backends are registered on first use, and a
//! vendor crate adds its own with [`register`] — no enum to edit.

use oar_ir::backend::{Backend, BackendError, Registry};
use std::sync::{Arc, OnceLock};

/// The backend used when none is named: the Cranelift-compiled CPU backend.
pub const DEFAULT_BACKEND: &str = "cpu";

/// The global registry, with the built-in backends registered.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let r = Registry::new();
        r.register(Arc::new(oar_backend_reference::ReferenceBackend::new()));
        r.register(Arc::new(oar_backend_cpu::CpuBackend::new()));
        // Constructing it touches no driver (it cannot panic); without a GPU, compiling
        // reports `BackendError::Unavailable`.
        r.register(Arc::new(oar_backend_ptx::PtxBackend::new()));
        // Built with the `mlir` feature only: it links LLVM/MLIR 19.
        #[cfg(feature = "mlir")]
        r.register(Arc::new(oar_backend_mlir::MlirBackend));
        // MLIR-made PTX launched by the ptx runtime; without a GPU, compiling reports
        // `BackendError::Unavailable`.
        #[cfg(feature = "mlir")]
        r.register(Arc::new(oar_backend_mlir::MlirGpuBackend));
        r
    })
}

/// Register (or replace) a backend under its name.
pub fn register(backend: Arc<dyn Backend>) {
    registry().register(backend);
}

/// The backend with this name.
pub fn get(name: &str) -> Result<Arc<dyn Backend>, BackendError> {
    registry().get(name)
}
