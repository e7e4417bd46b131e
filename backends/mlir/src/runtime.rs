//! The host runtime: one JIT per (graph, bindings), run by oar's host runner
//! ([`oar_ir::runner`]); kernels are called through the packed C interface MLIR generates for
//! `llvm.emit_c_interface` functions.

use crate::codegen::{ERR_DIV_ZERO, ERR_EMPTY, ERR_INDEX, ERR_NEG_POW, KernelFn};
use crate::{MlirError, engine, generate_checked, lower};
use oar_ir::kernel::KernelProgram;
use oar_ir::runner::{Compiled, HostBuffers, HostLauncher, Launched, Specializing};
use oar_ir::{BackendError, Executable, Graph, Weights};
use std::collections::BTreeMap;
use std::ffi::c_void;

/// `_mlir__mlir_ciface_<f>(void **args)`: `args[i]` points at a pointer to argument `i`'s
/// memref descriptor; the last entry points at the `i32` result.
type Packed = unsafe extern "C" fn(*mut *mut c_void);

/// The descriptor of a 1-d memref (`memref<NxT>`), as the C interface passes it.
#[repr(C)]
struct Desc1 {
    allocated: *mut u8,
    aligned: *mut u8,
    offset: i64,
    size: i64,
    stride: i64,
}

/// The JIT; its code is reentrant (the only state is each call's stack).
struct Engine(#[allow(dead_code)] melior::ExecutionEngine);
// Safety: the engine is only used to keep the JIT'd code alive after its symbols have been
// looked up; calling the code concurrently is safe (it touches only its arguments and stack).
unsafe impl Send for Engine {}
unsafe impl Sync for Engine {}

struct MlirProgram {
    program: KernelProgram,
    /// Per kernel: its packed entry point and memref arguments, or `None` (interpreted).
    fns: Vec<Option<(Packed, KernelFn)>>,
    _engine: Option<Engine>,
}

pub(crate) fn compile(graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
    let exe = Specializing::new(graph, weights, oar_backend_reference::run_kernel, |g, b| {
        Ok(compile_program(g, b)?)
    })?;
    Ok(Box::new(exe))
}

/// Fuse, generate, parse, lower and JIT one program.
fn compile_program(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<MlirProgram, MlirError> {
    let program = lower(graph, bindings)?;
    let module = generate_checked(&program)?;
    if module.kernels.iter().all(|k| k.is_err()) {
        let fns = vec![None; program.kernels.len()];
        return Ok(MlirProgram {
            program,
            fns,
            _engine: None,
        });
    }
    let (ctx, diags) = engine::context();
    let mut m = engine::parse(&ctx, &diags, &module.text)?;
    engine::run_pipeline(&ctx, &diags, &mut m, engine::CPU_PIPELINE)?;
    let engine = engine::engine(&m);
    let mut fns = Vec::with_capacity(module.kernels.len());
    for (k, f) in program.kernels.iter().zip(module.kernels) {
        let Ok(f) = f else {
            fns.push(None);
            continue;
        };
        let sym = engine.lookup(&format!("_mlir__mlir_ciface_{}", f.symbol));
        if sym.is_null() {
            return Err(MlirError::Symbol(k.name.clone()));
        }
        // Safety: every generated function is `llvm.emit_c_interface`, so its packed wrapper
        // has the `Packed` signature.
        let p: Packed = unsafe { std::mem::transmute::<*mut (), Packed>(sym) };
        fns.push(Some((p, f)));
    }
    Ok(MlirProgram {
        program,
        fns,
        _engine: Some(Engine(engine)),
    })
}

fn error_text(code: i32) -> String {
    let mut parts = Vec::new();
    if code & ERR_DIV_ZERO != 0 {
        parts.push("integer division by zero");
    }
    if code & ERR_NEG_POW != 0 {
        parts.push("integer power with a negative exponent");
    }
    if code & ERR_EMPTY != 0 {
        parts.push("max/min/argmax/argmin over an empty axis has no identity");
    }
    if code & ERR_INDEX != 0 {
        parts.push("gather index out of range");
    }
    if parts.is_empty() {
        return format!("error word {code}");
    }
    parts.join(", ")
}

impl Compiled for MlirProgram {
    fn program(&self) -> &KernelProgram {
        &self.program
    }
}

impl HostLauncher for MlirProgram {
    fn launch(&self, index: usize, bufs: &mut HostBuffers) -> Result<Launched, BackendError> {
        let Some((entry, f)) = &self.fns[index] else {
            return Ok(Launched::Host);
        };
        let p = &self.program;
        let mut descs: Vec<Desc1> = f
            .params
            .iter()
            .map(|id| {
                let ptr = bufs.pointer(*id);
                let size = oar_ir::runner::static_dims(p.buffer(*id)).iter().product::<usize>() as i64;
                Desc1 {
                    allocated: ptr,
                    aligned: ptr,
                    offset: 0,
                    size,
                    stride: 1,
                }
            })
            .collect();
        let mut ptrs: Vec<*mut Desc1> = descs.iter_mut().map(|d| d as *mut Desc1).collect();
        let mut result: i32 = 0;
        let mut args: Vec<*mut c_void> = ptrs.iter_mut().map(|p| (p as *mut *mut Desc1).cast()).collect();
        args.push((&mut result as *mut i32).cast());
        // Safety: each descriptor describes a live buffer of the size the function was
        // generated for; `args` matches the packed signature (one per memref, then the result).
        unsafe { entry(args.as_mut_ptr()) };
        if result != 0 {
            let k = &p.kernels[index];
            return Err(BackendError::Runtime {
                op: k.name.clone(),
                value: p.buffer(k.outputs[0]).value.clone(),
                detail: error_text(result),
            });
        }
        Ok(Launched::Device)
    }
}
