//! Cranelift code generation for loop kernels (see `docs/KERNELS.md` for their meaning).
//!
//! Contract with the rest of the backend:
//! - [`analyze`] says whether a [`LoopKernel`] can be compiled and, if so, the function's outer
//!   extent and per-iteration cost; it must agree with [`define_function`].
//! - [`define_function`] declares (export linkage, the spec's name) and defines one function
//!   `extern "C" fn(bufs: *const *mut u8, lo: i64, hi: i64)` computing outer iterations
//!   `lo..hi`; `bufs[b]` is buffer `b`'s base address. Math calls go to the runtime's
//!   `oar_rt_*` functions (imported by name).

use crate::CpuError;
use crate::lower::FuncSpec;
use cranelift_module::{FuncId, Module};
use oar_ir::kernel::{Buffer, BufferId, LoopKernel};

/// Whether `k` (writing `out`) can be compiled: `(outer extent, cost per outer iteration)`,
/// or the reason it cannot.
pub fn analyze(k: &LoopKernel, out: BufferId, buffers: &[Buffer]) -> Result<(u64, u64), String> {
    let _ = (k, out, buffers);
    Err("code generation not implemented yet".into())
}

/// Declare and define `spec` in `module`; returns its id and, if `want_clif`, its CLIF text.
pub fn define_function<M: Module>(
    module: &mut M,
    spec: &FuncSpec,
    buffers: &[Buffer],
    want_clif: bool,
) -> Result<(FuncId, Option<String>), CpuError> {
    let _ = (module, buffers, want_clif);
    Err(CpuError::Codegen {
        kernel: spec.name.clone(),
        detail: "not implemented".into(),
    })
}
