//! The `mlir-gpu` backend's executable: the `ptx` backend's pipeline and cudarc runtime with
//! MLIR-made kernels ([`crate::ptx_module`]) in place of the hand-written PTX generator.

use crate::gpu::find_libdevice;
use crate::ptx_module::{ptx_module, unresolved_externs};
use oar_backend_ptx::Arch;
use oar_backend_ptx::runtime::{GpuProgram, gpu};
use oar_ir::runner::Specializing;
use oar_ir::{BackendError, Executable, Graph, Weights};
use std::collections::BTreeMap;

const NAME: &str = "mlir-gpu";

/// The GPU, or `Unavailable` naming this backend (the reason is the `ptx` runtime's: no
/// driver, no device, compute capability below 8.0).
fn device() -> Result<&'static oar_backend_ptx::runtime::Gpu, BackendError> {
    gpu().map_err(|e| match e {
        BackendError::Unavailable { reason, .. } => BackendError::Unavailable {
            backend: NAME.into(),
            reason: format!("launches through the ptx backend's CUDA runtime: {reason}"),
        },
        e => e,
    })
}

pub(crate) fn compile(graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
    let arch = device()?.arch;
    let w = weights.clone();
    let exe = Specializing::new(graph, weights, oar_backend_reference::run_kernel, move |g, b| {
        load(g, b, arch, &w)
    })?;
    Ok(Box::new(exe))
}

/// The `ptx` backend's lowering (stages split into scratch buffers) with MLIR's kernels,
/// loaded on the GPU.
fn load(
    graph: &Graph,
    bindings: &BTreeMap<String, usize>,
    arch: Arch,
    weights: &Weights,
) -> Result<GpuProgram, BackendError> {
    let program = oar_backend_ptx::lower(graph, bindings)?;
    let libdevice = find_libdevice();
    let module = ptx_module(&program, arch, libdevice.as_deref())?;
    let missing = unresolved_externs(&module);
    if !missing.is_empty() {
        let hint = match std::env::var_os("OAR_LIBDEVICE") {
            Some(p) => format!("OAR_LIBDEVICE={} is not a file", std::path::Path::new(&p).display()),
            None => "set OAR_LIBDEVICE, or pip install nvidia-cuda-nvcc-cu12".into(),
        };
        return Err(BackendError::Unavailable {
            backend: NAME.into(),
            reason: format!(
                "the kernels call libdevice ({}) but libdevice.10.bc was not found ({hint})",
                missing.join(", ")
            ),
        });
    }
    GpuProgram::load(program, module, weights)
}
