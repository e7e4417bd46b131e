//! The host runtime: one JIT per (graph, bindings), host buffers, kernels called through the
//! packed C interface MLIR generates for `llvm.emit_c_interface` functions.

use crate::codegen::{ERR_DIV_ZERO, ERR_EMPTY, ERR_INDEX, ERR_NEG_POW, KernelFn};
use crate::{MlirError, generate_checked, jit, lower};
use oar_ir::backend::check_inputs;
use oar_ir::kernel::{Buffer, BufferId, BufferKind, KernelProgram};
use oar_ir::{BackendError, Executable, Graph, TensorData, Weights};
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

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

struct Compiled {
    program: KernelProgram,
    /// Per kernel: its packed entry point and memref arguments, or `None` (interpreted).
    fns: Vec<Option<(Packed, KernelFn)>>,
    _engine: Option<Engine>,
}

struct MlirExecutable {
    graph: Graph,
    weights: Weights,
    programs: Mutex<HashMap<BTreeMap<String, usize>, Arc<Compiled>>>,
}

pub(crate) fn compile(graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
    oar_ir::verify(graph)?;
    let exe = MlirExecutable {
        graph: graph.clone(),
        weights: weights.clone(),
        programs: Mutex::default(),
    };
    if exe.graph.input_specs().iter().all(|(_, t)| t.shape.is_static()) {
        exe.program(&BTreeMap::new())?; // static graphs report compile errors now
    }
    Ok(Box::new(exe))
}

impl MlirExecutable {
    fn program(&self, bindings: &BTreeMap<String, usize>) -> Result<Arc<Compiled>, BackendError> {
        if let Some(c) = self.programs.lock().unwrap_or_else(|e| e.into_inner()).get(bindings) {
            return Ok(c.clone());
        }
        let compiled = Arc::new(compile_program(&self.graph, bindings)?);
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        programs.insert(bindings.clone(), compiled.clone());
        Ok(compiled)
    }
}

/// Fuse, generate, parse, lower and JIT one program.
fn compile_program(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<Compiled, MlirError> {
    let program = lower(graph, bindings)?;
    let module = generate_checked(&program)?;
    if module.kernels.iter().all(|k| k.is_err()) {
        let fns = vec![None; program.kernels.len()];
        return Ok(Compiled {
            program,
            fns,
            _engine: None,
        });
    }
    let (ctx, diags) = jit::context();
    let mut m = jit::parse(&ctx, &diags, &module.text)?;
    jit::run_pipeline(&ctx, &diags, &mut m, jit::CPU_PIPELINE)?;
    let engine = jit::engine(&m);
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
    Ok(Compiled {
        program,
        fns,
        _engine: Some(Engine(engine)),
    })
}

fn runtime_err(op: &str, value: &str, detail: impl ToString) -> BackendError {
    let (op, value, detail) = (op.to_string(), value.to_string(), detail.to_string());
    BackendError::Runtime { op, value, detail }
}

fn dims(b: &Buffer) -> Vec<usize> {
    b.ty.shape.dims().iter().map(|d| d.as_static().unwrap_or(0)).collect()
}

fn elems(b: &Buffer) -> usize {
    dims(b).iter().product()
}

fn byte_len(b: &Buffer) -> usize {
    elems(b) * b.ty.dtype.size_bytes()
}

fn tensor(p: &KernelProgram, bufs: &[Vec<u64>], id: BufferId) -> Result<TensorData, BackendError> {
    let b = p.buffer(id);
    // Safety: u64 has no padding and u8 has alignment 1; the buffer holds `byte_len(b)` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(bufs[id.index()].as_ptr().cast::<u8>(), byte_len(b)) };
    TensorData::from_bytes(b.ty.dtype, dims(b), bytes.to_vec()).map_err(|e| runtime_err("read", &b.value, e))
}

fn copy_in(dst: &mut [u64], src: &[u8]) {
    let n = src.len().min(dst.len() * 8);
    // Safety: both ranges hold `n` bytes and do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), n) }
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

impl Executable for MlirExecutable {
    fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        let c = self.program(&check_inputs(&self.graph, inputs)?)?;
        let p = &c.program;
        let mut bufs: Vec<Vec<u64>> = Vec::with_capacity(p.buffers.len());
        for b in &p.buffers {
            let mut v = vec![0u64; byte_len(b).div_ceil(8).max(1)];
            let leaf = match &b.kind {
                BufferKind::Input { name } => inputs.get(name),
                BufferKind::Param { name } => self.weights.get(name),
                BufferKind::Constant(t) => Some(t),
                BufferKind::Temp | BufferKind::Output => None,
            };
            if let Some(t) = leaf.filter(|t| t.dtype() == b.ty.dtype && t.shape() == dims(b)) {
                copy_in(&mut v, t.bytes());
            } else if let BufferKind::Param { name } = &b.kind {
                let detail = format!("no weight of type {} given", b.ty);
                return Err(BackendError::Weight {
                    name: name.clone(),
                    detail,
                });
            }
            bufs.push(v);
        }
        for (ki, k) in p.kernels.iter().enumerate() {
            if let Some((entry, f)) = &c.fns[ki] {
                let mut descs: Vec<Desc1> = f
                    .params
                    .iter()
                    .map(|id| {
                        let ptr = bufs[id.index()].as_mut_ptr().cast::<u8>();
                        Desc1 {
                            allocated: ptr,
                            aligned: ptr,
                            offset: 0,
                            size: elems(p.buffer(*id)) as i64,
                            stride: 1,
                        }
                    })
                    .collect();
                let mut ptrs: Vec<*mut Desc1> = descs.iter_mut().map(|d| d as *mut Desc1).collect();
                let mut result: i32 = 0;
                let mut args: Vec<*mut c_void> = ptrs.iter_mut().map(|p| (p as *mut *mut Desc1).cast()).collect();
                args.push((&mut result as *mut i32).cast());
                // Safety: each descriptor describes a live buffer of the size the function was
                // generated for; `args` matches the packed signature (one per memref, then the
                // result).
                unsafe { entry(args.as_mut_ptr()) };
                if result != 0 {
                    let value = &p.buffer(k.outputs[0]).value;
                    return Err(runtime_err(&k.name, value, error_text(result)));
                }
            } else {
                let results = oar_backend_reference::run_kernel(p, ki, &self.weights, &mut |id| tensor(p, &bufs, id))?;
                for (id, t) in k.outputs.iter().zip(&results) {
                    copy_in(&mut bufs[id.index()], t.bytes());
                }
            }
        }
        let output = |(name, id): &(String, BufferId)| Ok((name.clone(), tensor(p, &bufs, *id)?));
        p.outputs.iter().map(output).collect()
    }
}
