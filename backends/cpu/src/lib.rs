//! oar-backend-cpu: oar's CPU backend.
//!
//! A graph is specialized to concrete shapes, optimized, fused into kernels
//! (`oar_passes::fuse`), and each loop kernel (and each matmul/conv epilogue) is compiled to
//! machine code with Cranelift ([`codegen`]). The runtime ([`oar_cpu_runtime`]) runs the
//! kernels, calls `gemm` for matmul and convolution, runs data movement, sorting, scatter and
//! generators natively, and control flow with compiled regions; the reference interpreter is
//! only the evaluator of last resort for a kernel the code generator declines.
//!
//! - In process: [`CpuBackend`] registers as `cpu`; compiled code is cached by graph text and
//!   symbol bindings within the process.
//! - Ahead of time: [`aot`] writes an object file, a standalone executable, or a shared
//!   library with a C header.

pub mod aot;
pub mod codegen;
pub mod lower;
pub mod machine;

use oar_cpu_runtime::Model;
use oar_ir::backend::{BoundedCache, check_inputs};
use oar_ir::{Backend, BackendError, Executable, Graph, TensorData, Weights};
use oar_passes::legalize::{Expand, Natives};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// What the generated code computes natively (everything else is expanded by
/// `oar_passes::legalize` before code generation): NaN-propagating `max`/`min` (one compare and
/// select, or `maxps` with a constant), saturating float → int casts (`fcvt_to_sint_sat`) and
/// `rsqrt` (in f64 on vectors, bit-identical to the reference).
pub fn natives() -> Natives {
    Natives::of(&[Expand::NanMinMax, Expand::SaturatingCast, Expand::Rsqrt])
}

/// Why the CPU backend could not compile a graph.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// A pass (specialization, optimization, fusion, memory planning) failed.
    #[error(transparent)]
    Pass(#[from] oar_passes::PassError),
    /// Some dims are still symbolic; compiled code needs every size.
    #[error("the graph still has symbolic dims {}: bind them (e.g. `--bind {}=1`)", .0.join(", "), .0[0])]
    Symbolic(Vec<String>),
    /// The code generator failed on a kernel.
    #[error("code generation for kernel `{kernel}`: {detail}")]
    Codegen {
        /// Kernel (function) name.
        kernel: String,
        /// What went wrong.
        detail: String,
    },
    /// Cranelift's module layer (JIT memory, object writing) failed.
    #[error("cranelift: {0}")]
    Module(String),
    /// Writing, linking or reading files failed.
    #[error("{0}")]
    Io(String),
    /// A backend error (inputs, weights, running).
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl From<CpuError> for BackendError {
    fn from(e: CpuError) -> BackendError {
        match e {
            CpuError::Backend(b) => b,
            other => BackendError::Runtime {
                op: "compile".into(),
                value: "cpu".into(),
                detail: other.to_string(),
            },
        }
    }
}

/// A lowered program with its machine code: shared by every executable of the same graph
/// and bindings in this process.
pub struct Compiled {
    /// What was compiled.
    pub lowered: lower::Lowered,
    /// The machine code.
    pub code: machine::MachineCode,
}

type CacheKey = (String, BTreeMap<String, usize>);

/// Most compiled programs kept in the process-wide cache.
const CACHE_CAPACITY: usize = 64;

fn cache() -> &'static BoundedCache<CacheKey, Arc<Compiled>> {
    static CACHE: OnceLock<BoundedCache<CacheKey, Arc<Compiled>>> = OnceLock::new();
    CACHE.get_or_init(|| BoundedCache::new(CACHE_CAPACITY))
}

/// Lower and JIT-compile `graph` for `bindings`, or reuse an earlier compilation of the same
/// graph text and bindings in this process.
pub fn compile_cached(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<Arc<Compiled>, CpuError> {
    let key = (oar_ir::text::print_graph(graph), bindings.clone());
    cache().get_or_try_insert_with(&key, || {
        let lowered = lower::lower(graph, bindings)?;
        let code = machine::compile(&lowered)?;
        Ok(Arc::new(Compiled { lowered, code }))
    })
}

/// Number of programs in the process-wide compile cache (for tests and reports).
pub fn cache_len() -> usize {
    cache().len()
}

/// The CPU backend (registry name `cpu`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// The backend.
    pub fn new() -> Self {
        CpuBackend
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn description(&self) -> &str {
        "Cranelift-compiled fused kernels with gemm matmul/conv, multithreaded (JIT in process; AOT via `oar compile`)"
    }

    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        oar_ir::verify(graph)?;
        let exe = CpuExecutable {
            graph: graph.clone(),
            weights: weights.clone(),
            models: BoundedCache::new(CACHE_CAPACITY),
        };
        // Static graphs compile now, so errors show at compile time; symbolic ones per binding.
        let symbolic = graph.input_specs().iter().any(|(_, t)| !t.shape.is_static());
        if !symbolic {
            exe.model(&BTreeMap::new())?;
        }
        Ok(Box::new(exe))
    }
}

/// A compiled program and the model that runs it, for one binding of symbolic dims.
type BoundModel = Arc<(Arc<Compiled>, Model)>;

/// A graph compiled for the CPU: one model per distinct binding of its symbolic dims.
struct CpuExecutable {
    graph: Graph,
    weights: Weights,
    models: BoundedCache<BTreeMap<String, usize>, BoundModel>,
}

impl CpuExecutable {
    fn model(&self, bindings: &BTreeMap<String, usize>) -> Result<BoundModel, BackendError> {
        self.models.get_or_try_insert_with(bindings, || self.bind(bindings))
    }

    fn bind(&self, bindings: &BTreeMap<String, usize>) -> Result<BoundModel, BackendError> {
        let compiled = compile_cached(&self.graph, bindings)?;
        let mut weights = compiled.lowered.consts.clone();
        for (k, v) in &self.weights {
            weights.insert(k.clone(), v.clone());
        }
        let model = Model::new(compiled.lowered.cpu.clone(), compiled.code.funcs.clone(), &weights)?;
        Ok(Arc::new((compiled, model)))
    }
}

impl Executable for CpuExecutable {
    fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        let bindings = check_inputs(&self.graph, inputs)?;
        let entry = self.model(&bindings)?;
        entry.1.run(inputs)
    }
}
