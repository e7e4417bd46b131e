//! oar-cpu-runtime: what a model compiled by oar's CPU backend needs at run time.
//!
//! - [`program`]: the compiled model's description ([`CpuProgram`]: a static kernel program,
//!   its memory plan and one step per kernel) and its blob encoding for AOT binaries.
//! - [`Model`]: runs a program with a table of generated kernel functions — generated loop
//!   kernels split across threads, matmul/conv through `gemm` (integer matmul by a wrapping
//!   loop) with generated epilogues, native opaque ops, and the reference interpreter as the
//!   evaluator of last resort.
//!
//! Built as an rlib (linked into the JIT) and as a static library (linked into AOT executables
//! and shared libraries, which then depend on nothing beyond libc).

pub mod attention;
pub mod bf16;
mod blocked;
pub mod capi;
mod contraction;
mod conv;
mod conv_depthwise;
mod conv_depthwise_blocked;
mod conv_direct;
mod conv_first_blocked;
pub mod conv_grad;
mod conv_pointwise_blocked;
mod conv_tiled;
mod conv_wgrad;
mod epilogue;
pub mod ewise;
pub mod exe;
mod model;
pub mod native;
pub mod optim;
mod par;
pub mod pool;
mod pool_blocked;
pub mod pool_grad;
pub mod profile;
pub mod program;
pub mod qconv;
pub mod qgemm;
pub mod qgemm_u8;
pub mod rnn;
mod rows;
mod scratch;
mod simd;
mod winograd;

pub use contraction::supported as contraction_supported;

/// Whether the runtime applies contraction kernel `k`'s epilogue with its own vector code (a
/// convolution's bias / residual / clamp chain) instead of the generated function, on this
/// host.
pub fn native_epilogue(k: &oar_ir::kernel::Kernel, p: &oar_ir::kernel::KernelProgram) -> bool {
    match &k.body {
        oar_ir::kernel::KernelBody::Contraction(c) => k
            .outputs
            .first()
            .is_some_and(|&out| epilogue::ConvEpilogue::of(c, out, p).is_some()),
        _ => false,
    }
}
/// Per step of `prog`: for a convolution or max pool run on the blocked channel layout on
/// this host (`crate::blocked`), whether its input and its output are stored blocked; `None`
/// for the other steps. Weight-only steps, which a model computes once, count as unblocked.
pub fn blocked_layouts(prog: &CpuProgram) -> Vec<Option<(bool, bool)>> {
    let chains = model::chains(prog);
    let plan = blocked::plan(&prog.program, &prog.steps, &chains, &vec![false; prog.steps.len()]);
    plan.iter().map(|s| s.as_ref().map(|s| s.layouts())).collect()
}
pub use model::Model;
pub use program::{CpuProgram, KernelFn, LoopCall, NativeEpilogue, RowPiece, Step, decode_blob, encode_blob};
