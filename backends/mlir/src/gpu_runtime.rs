//! The `mlir-gpu` backend's executable: the `ptx` backend's pipeline and cudarc runtime with
//! MLIR-made kernels ([`crate::ptx_module`]) in place of the hand-written PTX generator.

use crate::gpu::find_libdevice;
use crate::ptx_module::{ptx_module, unresolved_externs};
use oar_backend_ptx::Arch;
use oar_backend_ptx::runtime::{GpuProgram, gpu};
use oar_ir::backend::BoundedCache;
use oar_ir::backend::check_inputs;
use oar_ir::{BackendError, Executable, Graph, TensorData, Weights};
use std::collections::BTreeMap;
use std::sync::Arc;

const NAME: &str = "mlir-gpu";

/// Most bindings kept loaded per executable (as `ptx`).
const CACHE_CAPACITY: usize = 16;

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
    oar_ir::verify(graph)?;
    let g = device()?;
    let exe = MlirGpuExecutable {
        graph: graph.clone(),
        weights: weights.clone(),
        arch: g.arch,
        loaded: BoundedCache::new(CACHE_CAPACITY),
    };
    if graph.input_specs().iter().all(|(_, t)| t.shape.is_static()) {
        exe.loaded(&BTreeMap::new())?; // static graphs report compile errors now
    }
    Ok(Box::new(exe))
}

struct MlirGpuExecutable {
    graph: Graph,
    weights: Weights,
    arch: Arch,
    loaded: BoundedCache<BTreeMap<String, usize>, Arc<GpuProgram>>,
}

impl MlirGpuExecutable {
    fn loaded(&self, bindings: &BTreeMap<String, usize>) -> Result<Arc<GpuProgram>, BackendError> {
        self.loaded.get_or_try_insert_with(bindings, || self.load(bindings))
    }

    fn load(&self, bindings: &BTreeMap<String, usize>) -> Result<Arc<GpuProgram>, BackendError> {
        // The `ptx` backend's lowering (stages split into scratch buffers), MLIR's kernels.
        let program = oar_backend_ptx::lower(&self.graph, bindings)?;
        let libdevice = find_libdevice();
        let module = ptx_module(&program, self.arch, libdevice.as_deref())?;
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
        Ok(Arc::new(GpuProgram::load(program, module, &self.weights)?))
    }
}

impl Executable for MlirGpuExecutable {
    fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        let bindings = check_inputs(&self.graph, inputs)?;
        self.loaded(&bindings)?.run(inputs)
    }
}
