//! Cranelift code generation for loop kernels (see `docs/KERNELS.md` for their meaning).
//!
//! Contract with the rest of the backend:
//! - [`analyze`] says whether a [`LoopKernel`] can be compiled and, if so, the function's outer
//!   extent and per-iteration cost; it must agree with [`define_function`].
//! - [`define_function`] declares (export linkage, the spec's name) and defines one function
//!   `extern "C" fn(bufs: *const *mut u8, lo: i64, hi: i64)` computing outer iterations
//!   `lo..hi`; `bufs[b]` is buffer `b`'s base address. Kernels reach it legalized
//!   (`oar_passes::legalize` with [`crate::natives`]): no transcendental, `pow` or float `rem`
//!   is left, so the functions call nothing.
//!
//! # The loop nest
//!
//! Every dim is static. Each load's index map (view shape + affine axes) is composed into one
//! affine element offset `c0 + Σ c_l·i_l`; the output is row-major over the kernel shape.
//! Unit loops are dropped and adjacent loops are merged when every access is contiguous
//! across them. Then ([`plan`]):
//! - elementwise kernels: the outer loops are flattened into the outer index the runtime splits
//!   across threads; the last output loop runs inside, as 128-bit vectors (f32x4, i32x4, f64x2,
//!   i64x2; two vectors per iteration — one for bodies with transcendentals, which have
//!   enough independent work —, then one, then scalars) with contiguous loads as vector
//!   loads, broadcast loads splatted, stride-2 loads as two loads and a shuffle, other strided
//!   loads gathered lane by lane; bools are lane masks in vector code (bool buffers are widened
//!   from / narrowed to bytes). When the outer loops are few, the last loop is also split into
//!   blocks that join the outer index. Mixed lane widths (f32 with f64, i8 data) run as
//!   scalar code.
//! - reductions over a contiguous innermost axis: one output element per outer iteration,
//!   the reduction loops inside, the innermost vectorized with one vector accumulator per
//!   unrolled vector, combined at the end;
//! - reductions over a strided axis whose output axis is contiguous: vectorized across output
//!   elements (one accumulator lane per output element, four vectors = one 64-byte line of
//!   f32 outputs per reduction step), the reduction loops inside.
//!
//! Instructions are hoisted to the outermost loop they depend on (per-channel constants of a
//! batch-norm epilogue are computed once per channel, not per element).
//!
//! # Numerics
//!
//! Every instruction's result is in its dtype, as in the reference backend (`+ - * / sqrt` and
//! `rsqrt`, computed in f64 and rounded once, are bit-identical to it). The transcendental
//! functions, `pow` and float `rem` arrive expanded by `oar_passes::legalize` into the core
//! ops (its accuracy table: ≤ 1–3 ulp), the same instructions every backend runs; NaN-
//! propagating `max`/`min`, saturating float → int casts and `rsqrt` are native here.
//!
//! Reductions: float sums, means and products of f32 accumulate in f64 (like the reference,
//! which accumulates in f64), f64 ones in f64. The order differs from the reference's
//! sequential one: in the vectorized loop element `i` of a row goes to partial accumulator
//! `i mod (lanes·unroll)` (every element is added in f64: the result is almost always the
//! reference's correctly rounded sum); partials are combined in order, then their lanes in
//! order, then the scalar remainder's partial is added. Across output elements each lane
//! accumulates its own element sequentially. Integer reductions wrap (order does not matter);
//! max/min propagate NaN.

mod emit;
mod ops;
mod plan;

use crate::CpuError;
use crate::lower::FuncSpec;
use cranelift_codegen::ir::{AbiParam, InstBuilder, UserFuncName, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module, ModuleError};
use oar_ir::kernel::{Buffer, BufferId, LoopKernel};

/// Whether `k` (writing `out`) can be compiled: `(outer extent, cost per outer iteration)`,
/// or the reason it cannot.
pub fn analyze(k: &LoopKernel, out: BufferId, buffers: &[Buffer]) -> Result<(u64, u64), String> {
    let p = plan::plan(k, out, buffers)?;
    Ok((p.extent, p.cost))
}

/// [`analyze`] for a piece of a kernel with reduction stages over `rows` outer points:
/// `(outer extent, cost per outer iteration, outer iterations per row)`, the last 0 when the
/// function's outer index does not run over whole rows in order.
pub fn analyze_rows(k: &LoopKernel, out: BufferId, buffers: &[Buffer], rows: u64) -> Result<(u64, u64, u64), String> {
    let p = plan::plan(k, out, buffers)?;
    // The outer index is row-major over `p.outer` (then the vector loop's blocks); the rows
    // are the leading loops when a prefix of them spans exactly `rows` points.
    let mut span = 1u64;
    let mut per_row = if rows == 1 { p.extent } else { 0 };
    for l in &p.outer {
        span = span.saturating_mul(l.n);
        if span == rows && rows > 1 {
            per_row = p.extent / rows;
            break;
        }
        if span > rows {
            break;
        }
    }
    Ok((p.extent, p.cost, per_row))
}

pub use plan::Hints;

/// How an elementwise kernel over `[planes…, pixels…]` (its first `hints.planes` dims count the
/// planes) runs as a native kernel's epilogue on parts of planes: `(outer extent, cost per
/// outer iteration, outer iterations per plane, elements per iteration)` — iteration `j` of a
/// plane covers its elements `j·block ..` up to the next block or the plane's end — or `None`
/// when its outer index does not run over whole planes, each flat and in order.
pub fn analyze_planes(k: &LoopKernel, out: BufferId, buffers: &[Buffer], hints: Hints) -> Option<(u64, u64, u64, u64)> {
    let p = plan::plan_with(k, out, buffers, hints).ok()?;
    let shape: Vec<u64> = k
        .shape
        .iter()
        .map(|d| d.as_static().map(|v| v as u64))
        .collect::<Option<_>>()?;
    let planes: u64 = shape[..hints.planes.min(shape.len())].iter().product();
    let pixels: u64 = shape[hints.planes.min(shape.len())..].iter().product();
    let outer: u64 = p.outer.iter().map(|l| l.n).product();
    let v = p.vloop.as_ref()?;
    // Planes as the outer loops, each plane's pixels as one vector loop in blocks.
    (p.mode == plan::Mode::Elementwise && outer == planes && v.n == pixels && p.block > 0)
        .then_some((p.extent, p.cost, p.nblocks, p.block))
}

/// Declare and define `spec` in `module`; returns its id and, if `want_clif`, its CLIF text
/// (as generated, before Cranelift's optimizations; the function is named after the spec).
pub fn define_function<M: Module>(
    module: &mut M,
    spec: &FuncSpec,
    buffers: &[Buffer],
    want_clif: bool,
) -> Result<(FuncId, Option<String>), CpuError> {
    let err = |detail: String| CpuError::Codegen {
        kernel: spec.name.clone(),
        detail,
    };
    let plan = plan::plan_with(&spec.kernel, spec.out, buffers, spec.hints).map_err(err)?;
    let ptr = module.target_config().pointer_type();
    if ptr != types::I64 {
        return Err(err(format!("64-bit targets only (pointer type {ptr})")));
    }
    let mut sig = module.make_signature();
    sig.params = vec![AbiParam::new(ptr), AbiParam::new(types::I64), AbiParam::new(types::I64)];
    sig.returns = vec![AbiParam::new(types::I32)];
    let id = module
        .declare_function(&spec.name, Linkage::Export, &sig)
        .map_err(|e| err(e.to_string()))?;
    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    ctx.func.name = UserFuncName::testcase(&spec.name);
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let params = b.block_params(entry).to_vec();
        // The status the function returns (`KERNEL_DIV_BY_ZERO` bits).
        let status = b.declare_var(types::I32);
        let zero = b.ins().iconst(types::I32, 0);
        b.def_var(status, zero);
        {
            let mut em = emit::Em::new(&mut b, &plan, &spec.kernel, status);
            em.build(params[0], params[1], params[2]);
        }
        let s = b.use_var(status);
        b.ins().return_(&[s]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    let clif = want_clif.then(|| ctx.func.display().to_string());
    module.define_function(id, &mut ctx).map_err(|e| {
        let detail = match &e {
            ModuleError::Compilation(cranelift_codegen::CodegenError::Verifier(v)) => {
                cranelift_codegen::print_errors::pretty_verifier_error(&ctx.func, None, v.clone())
            }
            other => other.to_string(),
        };
        err(detail)
    })?;
    Ok((id, clif))
}
