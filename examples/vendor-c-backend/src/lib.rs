//! An example out-of-tree oar backend: every fused loop and contraction kernel becomes a C
//! function ([`emit`]), one C file per program is compiled with `cc -O2 -shared -fPIC` (cached
//! by source hash in the temp dir), loaded with `libloading` and called; opaque kernels (and
//! f16/bf16 kernels, which portable C cannot express) run on oar's reference interpreter, one
//! kernel at a time. See `docs/BACKENDS.md` in the oar repository for the contract.

pub mod emit;

/// The Rust blocks of `docs/BACKENDS.md`, compiled and run as doc tests of this crate.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/BACKENDS.md")]
pub struct BackendsDoc;

use oar::ir::backend::check_inputs;
use oar::ir::kernel::{Buffer, BufferId, BufferKind, KernelProgram};
use oar::ir::{Backend, BackendError, Executable, Graph, TensorData, Weights};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// The backend (registry name `vendor-c`).
#[derive(Clone, Copy, Debug, Default)]
pub struct VendorCBackend;

/// A kernel's entry point: buffer pointers in, 0 (ok) or 1 (integer division by zero) out.
type KernelFn = unsafe extern "C" fn(*const *mut u8) -> i32;

fn runtime_err(op: &str, value: &str, detail: impl ToString) -> BackendError {
    let (op, value, detail) = (op.to_string(), value.to_string(), detail.to_string());
    BackendError::Runtime { op, value, detail }
}

impl Backend for VendorCBackend {
    fn name(&self) -> &str {
        "vendor-c"
    }

    fn description(&self) -> &str {
        "example vendor backend: fused kernels emitted as C, compiled with cc, loaded with libloading"
    }

    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        oar::ir::verify(graph)?;
        let (graph, weights, programs) = (graph.clone(), weights.clone(), Mutex::default());
        let exe = CExecutable {
            graph,
            weights,
            programs,
        };
        if exe.graph.input_specs().iter().all(|(_, t)| t.shape.is_static()) {
            exe.program(&BTreeMap::new())?; // static graphs report compile errors now
        }
        Ok(Box::new(exe))
    }
}

/// A fused program and its compiled kernels (`None`: run on the reference interpreter).
struct Compiled {
    program: KernelProgram,
    fns: Vec<Option<KernelFn>>,
    _lib: Option<libloading::Library>,
}

struct CExecutable {
    graph: Graph,
    weights: Weights,
    /// One compiled program per binding of the graph's symbolic dims.
    programs: Mutex<HashMap<BTreeMap<String, usize>, Arc<Compiled>>>,
}

impl CExecutable {
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

/// Fuse with the standard pipeline, emit one C file, compile and load it.
fn compile_program(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<Compiled, BackendError> {
    // Kernels with several reduction stages (layer_norm) as plain pieces: one reduction each.
    let program = oar::lowering::kernel_program(graph, bindings)?.split_stages();
    let mut program = program.map_err(|e| runtime_err("split_stages", graph.name(), e))?;
    // The math this C backend does not write itself (exp, log, pow, NaN-aware max, ...)
    // becomes core arithmetic, the same instructions every oar backend runs.
    oar::passes::legalize::legalize(&mut program, &oar::passes::legalize::Natives::none());
    let (source, symbols) = emit::emit_program(&program);
    let (mut fns, mut lib) = (Vec::new(), None);
    for sym in &symbols {
        let Ok(name) = sym else {
            fns.push(None); // run on the reference interpreter
            continue;
        };
        let lib = match &mut lib {
            Some(l) => l,
            slot @ None => {
                let so = compile_c(&source).map_err(|e| runtime_err("cc", graph.name(), e))?;
                // Safety: the library is our own generated code, with no initializers.
                let l = unsafe { libloading::Library::new(&so) };
                slot.insert(l.map_err(|e| runtime_err("dlopen", graph.name(), e))?)
            }
        };
        // Safety: every emitted function has the `KernelFn` signature.
        let f = unsafe { lib.get::<KernelFn>(name.as_bytes()) }.map_err(|e| runtime_err("dlsym", name, e))?;
        fns.push(Some(*f));
    }
    Ok(Compiled {
        program,
        fns,
        _lib: lib,
    })
}

/// Compile one C file into a shared library, or reuse the one built from the same source.
pub fn compile_c(source: &str) -> Result<std::path::PathBuf, String> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    let dir = std::env::temp_dir().join("oar-vendor-c");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let so = dir.join(format!("{:016x}.so", h.finish()));
    if so.exists() {
        return Ok(so);
    }
    let writer = (std::process::id(), std::thread::current().id()); // concurrent compiles of one source
    let tmp = dir.join(format!("{:016x}-{}-{:?}", h.finish(), writer.0, writer.1));
    let c = tmp.with_extension("c");
    std::fs::write(&c, source).map_err(|e| format!("{}: {e}", c.display()))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .args(["-O2", "-shared", "-fPIC", "-fwrapv", "-ffp-contract=off", "-o"])
        .args([tmp.with_extension("so"), c.clone(), "-lm".into()])
        .output()
        .map_err(|e| format!("running `{cc}`: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("`{cc}` failed on {}:\n{err}", c.display()));
    }
    // Rename last, so a concurrent process never loads a half-written library.
    std::fs::rename(tmp.with_extension("so"), &so).map_err(|e| format!("{}: {e}", so.display()))?;
    let _ = std::fs::remove_file(&c);
    Ok(so)
}

fn dims(b: &Buffer) -> Vec<usize> {
    b.ty.shape.dims().iter().map(|d| d.as_static().unwrap_or(0)).collect()
}

fn byte_len(b: &Buffer) -> usize {
    dims(b).iter().product::<usize>() * b.ty.dtype.size_bytes()
}

/// The current contents of buffer `id` as a tensor ("copy out").
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

impl Executable for CExecutable {
    fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        let c = self.program(&check_inputs(&self.graph, inputs)?)?;
        let p = &c.program;
        // "Allocate": one 8-byte-aligned host allocation per buffer; leaves copied in.
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
        // "Launch" every kernel in order; this host runtime is synchronous.
        for (ki, k) in p.kernels.iter().enumerate() {
            if let Some(f) = c.fns[ki] {
                let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
                // Safety: each pointer is a live buffer of the size the kernel was generated for.
                if unsafe { f(ptrs.as_ptr()) } != 0 {
                    let value = &p.buffer(k.outputs[0]).value;
                    return Err(runtime_err(&k.name, value, "integer division by zero or exponent < 0"));
                }
            } else {
                let results = oar::reference::run_kernel(p, ki, &self.weights, &mut |id| tensor(p, &bufs, id))?;
                for (id, t) in k.outputs.iter().zip(&results) {
                    copy_in(&mut bufs[id.index()], t.bytes());
                }
            }
        }
        let output = |(name, id): &(String, BufferId)| Ok((name.clone(), tensor(p, &bufs, *id)?));
        p.outputs.iter().map(output).collect()
    }
}
