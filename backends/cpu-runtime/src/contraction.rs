//! matmul and conv of [`ContractionKernel`]s on buffers, through `gemm`.

use oar_ir::BackendError;
use oar_ir::kernel::{BufferId, ContractionKernel, KernelProgram};

/// Compute `k`'s contraction (not its epilogue) into buffer `out`.
///
/// # Safety
/// `bufs` holds valid base pointers for every buffer of `program`, sized as their types say.
pub(crate) unsafe fn run(
    k: &ContractionKernel,
    out: BufferId,
    program: &KernelProgram,
    bufs: &[*mut u8],
    threads: usize,
) -> Result<(), BackendError> {
    let _ = (k, out, program, bufs, threads);
    Err(BackendError::Unsupported {
        backend: "cpu".into(),
        op: "contraction (not yet implemented)".into(),
    })
}
