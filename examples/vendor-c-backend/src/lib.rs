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

use oar::ir::kernel::KernelProgram;
use oar::ir::runner::{Compiled, HostBuffers, HostLauncher, Launched, Specializing};
use oar::ir::{Backend, BackendError, Executable, Graph, Weights};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

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
        // oar's runner does the rest: a program per binding of symbolic dims, buffers, leaf
        // uploads, the kernels in order (ours, or the reference interpreter's), outputs.
        let exe = Specializing::new(graph, weights, oar::reference::run_kernel, compile_program)?;
        Ok(Box::new(exe))
    }
}

/// A fused program and its compiled kernels (`None`: run on the reference interpreter).
struct CProgram {
    program: KernelProgram,
    fns: Vec<Option<KernelFn>>,
    _lib: Option<libloading::Library>,
}

impl Compiled for CProgram {
    fn program(&self) -> &KernelProgram {
        &self.program
    }
}

impl HostLauncher for CProgram {
    /// "Launch": call the kernel's C function on the buffers; this host runtime is synchronous.
    fn launch(&self, index: usize, bufs: &mut HostBuffers) -> Result<Launched, BackendError> {
        let Some(f) = self.fns[index] else {
            return Ok(Launched::Host);
        };
        let ptrs = bufs.pointers();
        // Safety: each pointer is a live buffer of the size the kernel was generated for.
        if unsafe { f(ptrs.as_ptr()) } != 0 {
            let k = &self.program.kernels[index];
            let value = &self.program.buffer(k.outputs[0]).value;
            return Err(runtime_err(&k.name, value, "integer division by zero or exponent < 0"));
        }
        Ok(Launched::Device)
    }
}

/// Fuse with the standard pipeline, emit one C file, compile and load it.
fn compile_program(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<CProgram, BackendError> {
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
    Ok(CProgram {
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
