//! oar-backend-ptx: oar's NVIDIA GPU backend.
//!
//! A graph is specialized to concrete shapes, optimized and fused into kernels
//! (`oar_passes::fuse`), exactly as for the CPU backend; [`codegen`] then writes one PTX
//! module with an entry per loop kernel (elementwise, broadcast, reduction with its epilogue)
//! and per contraction (tiled matmul, implicit-GEMM convolution, with fused epilogues).
//! Opaque kernels (gather, concat, control flow, ...) and the few bodies the generator leaves
//! alone run on the host through the reference interpreter. [`runtime`] loads the module with
//! the CUDA driver (through `cudarc`, loaded dynamically: the crate builds and runs without
//! CUDA and reports a typed error when there is no driver or device). [`eager`] serves eager
//! tensors on `gpu:0` through the same pipeline, one op at a time.
//!
//! See `docs/PTX.md`.

pub mod codegen;
pub mod eager;
pub mod pool;
pub mod ptxas;
pub mod runtime;

pub use codegen::{Arch, PtxModule, Step, generate};

use oar_ir::kernel::KernelProgram;
use oar_ir::runner::Specializing;
use oar_ir::{Backend, BackendError, Executable, Graph, Weights};
use std::collections::BTreeMap;

/// Why the PTX backend could not compile a graph.
#[derive(Debug, thiserror::Error)]
pub enum PtxError {
    /// A pass (specialization, optimization, fusion) failed.
    #[error(transparent)]
    Pass(#[from] oar_passes::PassError),
    /// Some dims are still symbolic; generated code needs every size.
    #[error("the graph still has symbolic dims {}: bind them (e.g. `--bind {}=1`)", .0.join(", "), .0[0])]
    Symbolic(Vec<String>),
    /// A kernel could not be prepared for code generation.
    #[error("kernel `{kernel}`: {detail}")]
    Kernel {
        /// The kernel (or graph) name.
        kernel: String,
        /// What went wrong.
        detail: String,
    },
}

impl From<PtxError> for BackendError {
    fn from(e: PtxError) -> BackendError {
        BackendError::Runtime {
            op: "compile".into(),
            value: "ptx".into(),
            detail: e.to_string(),
        }
    }
}

/// Bind `bindings` in `graph`, run the standard passes and fuse (the CPU backend's pipeline).
pub fn lower(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<KernelProgram, PtxError> {
    // Kernels with several reduction stages (layer_norm, softmax) run as plain pieces, stage
    // results in scratch buffers (docs/PTX.md: one block per row is not generated yet).
    let program = oar_passes::fuse::lower_to_kernels(graph, bindings)?
        .split_stages()
        .map_err(|detail| PtxError::Kernel {
            kernel: graph.name().to_string(),
            detail,
        })?;
    let symbolic = program.symbolic_dims();
    if !symbolic.is_empty() {
        return Err(PtxError::Symbolic(symbolic));
    }
    Ok(program)
}

/// Lower `graph` and generate its PTX module for `arch` (no GPU needed).
pub fn compile_to_ptx(
    graph: &Graph,
    bindings: &BTreeMap<String, usize>,
    arch: Arch,
) -> Result<(KernelProgram, PtxModule), PtxError> {
    let program = lower(graph, bindings)?;
    let module = generate(&program, arch);
    Ok((program, module))
}

/// What the generated PTX computes natively; `oar_passes::legalize` expands the rest (the
/// transcendentals, `rsqrt`, `pow`, float `rem`) before code generation: `max.NaN`/`min.NaN`
/// (f64 by hand), saturating `cvt.rzi` casts and integer `rem` (with the error word).
pub fn natives() -> oar_passes::legalize::Natives {
    use oar_passes::legalize::{Expand, Natives};
    Natives::of(&[Expand::NanMinMax, Expand::SaturatingCast, Expand::IntRem])
}

/// The PTX backend (registry name `ptx`). Constructing it touches no driver; compiling checks
/// for one and fails with [`BackendError::Unavailable`] when there is none.
#[derive(Clone, Copy, Debug, Default)]
pub struct PtxBackend;

impl PtxBackend {
    /// The backend.
    pub fn new() -> Self {
        PtxBackend
    }
}

impl Backend for PtxBackend {
    fn name(&self) -> &str {
        "ptx"
    }

    fn description(&self) -> &str {
        "NVIDIA GPUs: generated PTX kernels (fused loops, reductions, tiled matmul/conv) run through the CUDA driver"
    }

    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        let arch = runtime::gpu()?.arch;
        let w = weights.clone();
        // oar's runner: one loaded program per binding of symbolic dims, run by the host
        // runner with this GPU as launcher.
        let exe = Specializing::new(graph, weights, oar_backend_reference::run_kernel, move |g, b| {
            let (program, module) = compile_to_ptx(g, b, arch)?;
            runtime::GpuProgram::load(program, module, &w)
        })?;
        Ok(Box::new(exe))
    }
}
