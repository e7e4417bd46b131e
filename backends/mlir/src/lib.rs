//! oar-backend-mlir: oar's MLIR backend.
//!
//! A graph is specialized, optimized and fused into kernels by the standard pipeline
//! (`oar_passes::fuse::lower_to_kernels`), as for the `cpu` and `ptx` backends; [`codegen`]
//! writes one MLIR module (text: `func`, `scf`, `arith`, `math`, `memref`) with a function per
//! loop and contraction kernel. With the `mlir` cargo feature (needs LLVM/MLIR 19), the module
//! is parsed and verified, lowered to the LLVM dialect by [`engine::CPU_PIPELINE`] and
//! JIT-compiled by MLIR's `ExecutionEngine` (all through `melior`); opaque kernels (gather,
//! concat, pad, control flow, ...) run on the reference interpreter, one kernel at a time.
//! Without the feature the crate only generates text and the backend reports
//! [`BackendError::Unavailable`].
//!
//! [`MlirGpuBackend`] (`mlir-gpu`, with the feature) generates the same kernels for the GPU,
//! lowers them through NVVM to PTX ([`gpu`]), assembles them into one `ptx`-backend module
//! ([`ptx_module`]) and launches them through the `ptx` backend's cudarc runtime.
//!
//! See `docs/MLIR.md`.

pub mod codegen;
#[cfg(feature = "mlir")]
pub mod engine;
#[cfg(feature = "mlir")]
pub mod gpu;
#[cfg(feature = "mlir")]
mod gpu_runtime;
#[cfg(feature = "mlir")]
pub mod ptx_module;
#[cfg(feature = "mlir")]
mod runtime;

#[cfg(feature = "mlir")]
pub use ptx_module::ptx_module;

pub use codegen::{CodegenError, MlirModule, Target, generate, generate_for};

use oar_ir::kernel::{KernelBody, KernelProgram};
use oar_ir::{Backend, BackendError, Executable, Graph, Weights};
use std::collections::BTreeMap;

/// Why the MLIR backend could not compile a graph.
#[derive(Debug, thiserror::Error)]
pub enum MlirError {
    /// A pass (specialization, optimization, fusion) failed.
    #[error(transparent)]
    Pass(#[from] oar_passes::PassError),
    /// Some dims are still symbolic; generated code needs every size.
    #[error("the graph still has symbolic dims {}: bind them (e.g. `--bind {}=1`)", .0.join(", "), .0[0])]
    Symbolic(Vec<String>),
    /// A loop or contraction kernel this generator cannot express.
    #[error("kernel {kernel}: {reason}")]
    Codegen {
        /// The kernel's name.
        kernel: String,
        /// What is missing.
        reason: CodegenError,
    },
    /// MLIR rejected the generated module (a generator bug), with its diagnostics.
    #[error("MLIR parse/verify failed{}: {detail}", kernel.as_ref().map(|k| format!(" in kernel {k}")).unwrap_or_default())]
    Parse {
        /// The kernel the first diagnostic points into, if any.
        kernel: Option<String>,
        /// MLIR's diagnostics.
        detail: String,
    },
    /// The lowering pipeline or the JIT failed.
    #[error("MLIR lowering failed: {0}")]
    Lower(String),
    /// MLIR-made PTX does not fit the `ptx` backend's module and launch model.
    #[error("kernel {kernel}: MLIR-made PTX: {detail}")]
    Ptx {
        /// The kernel's name.
        kernel: String,
        /// What does not fit.
        detail: String,
    },
    /// The JIT has no symbol for a kernel's function.
    #[error("kernel {0}: no JIT symbol")]
    Symbol(String),
}

impl MlirError {
    /// A parse error whose diagnostics are attributed to the kernel whose function contains
    /// the first line they point at (`loc("-":LINE:COL)`).
    pub fn parse(text: &str, detail: String) -> MlirError {
        let line = detail.split(':').nth(1).and_then(|l| l.trim().parse::<usize>().ok());
        let kernel = line.and_then(|line| {
            text.lines()
                .take(line)
                .filter_map(|l| l.trim().strip_prefix("// kernel "))
                .last()
                .map(str::to_string)
        });
        MlirError::Parse { kernel, detail }
    }
}

impl From<MlirError> for BackendError {
    fn from(e: MlirError) -> BackendError {
        match e {
            MlirError::Codegen { kernel, reason } => BackendError::Unsupported {
                backend: "mlir".into(),
                op: format!("kernel {kernel}: {reason}"),
            },
            e => BackendError::Runtime {
                op: "compile".into(),
                value: "mlir".into(),
                detail: e.to_string(),
            },
        }
    }
}

/// Bind `bindings` in `graph`, run the standard passes and fuse.
pub fn lower(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<KernelProgram, MlirError> {
    let program = oar_passes::fuse::lower_to_kernels(graph, bindings)?;
    let symbolic = program.symbolic_dims();
    if !symbolic.is_empty() {
        return Err(MlirError::Symbolic(symbolic));
    }
    Ok(program)
}

/// Generate the module for `program`; a loop or contraction kernel the generator declines is
/// an error (only opaque kernels are left to the interpreter).
pub fn generate_checked(program: &KernelProgram) -> Result<MlirModule, MlirError> {
    let module = generate(program);
    for (k, r) in program.kernels.iter().zip(&module.kernels) {
        if let (Err(reason), false) = (r, matches!(k.body, KernelBody::Opaque(_))) {
            return Err(MlirError::Codegen {
                kernel: k.name.clone(),
                reason: reason.clone(),
            });
        }
    }
    Ok(module)
}

/// The MLIR text of `graph` under `bindings` (what `oar compile --target mlir --emit mlir`
/// prints): the module before any lowering.
pub fn emit_mlir(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<String, MlirError> {
    Ok(generate_checked(&lower(graph, bindings)?)?.text)
}

/// The LLVM IR of `graph` after the CPU pipeline (`--emit llvm`).
#[cfg(feature = "mlir")]
pub fn emit_llvm(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<String, MlirError> {
    let module = generate_checked(&lower(graph, bindings)?)?;
    let (ctx, diags) = engine::context();
    let mut m = engine::parse(&ctx, &diags, &module.text)?;
    engine::run_pipeline(&ctx, &diags, &mut m, engine::CPU_PIPELINE)?;
    engine::llvm_ir(&m)
}

/// What both backends answer in a build without the `mlir` feature: the graph is checked,
/// then `Unavailable` says why.
#[cfg(not(feature = "mlir"))]
fn without_feature(backend: &str, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
    oar_ir::verify(graph)?;
    Err(BackendError::Unavailable {
        backend: backend.into(),
        reason: "oar-backend-mlir was built without its `mlir` feature (needs LLVM/MLIR 19)".into(),
    })
}

/// The MLIR backend (registry name `mlir`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MlirBackend;

impl Backend for MlirBackend {
    fn name(&self) -> &str {
        "mlir"
    }

    fn description(&self) -> &str {
        "MLIR (scf/arith/math/memref) generated per fused kernel, lowered and JIT-compiled by MLIR 19 via melior"
    }

    #[cfg(feature = "mlir")]
    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        runtime::compile(graph, weights)
    }

    #[cfg(not(feature = "mlir"))]
    fn compile(&self, graph: &Graph, _weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        without_feature(self.name(), graph)
    }
}

/// The MLIR GPU backend (registry name `mlir-gpu`): kernels generated for the GPU, lowered by
/// MLIR through NVVM to PTX and launched through the `ptx` backend's cudarc runtime (Debian
/// ships no MLIR CUDA runtime library). Compiling needs a CUDA driver and device: without
/// one it fails with [`BackendError::Unavailable`].
#[derive(Clone, Copy, Debug, Default)]
pub struct MlirGpuBackend;

impl Backend for MlirGpuBackend {
    fn name(&self) -> &str {
        "mlir-gpu"
    }

    fn description(&self) -> &str {
        "NVIDIA GPUs: kernels lowered by MLIR 19 through NVVM to PTX, launched by the ptx backend's CUDA runtime"
    }

    #[cfg(feature = "mlir")]
    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        gpu_runtime::compile(graph, weights)
    }

    #[cfg(not(feature = "mlir"))]
    fn compile(&self, graph: &Graph, _weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        without_feature(self.name(), graph)
    }
}
