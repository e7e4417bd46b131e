//! Ahead-of-time compilation for the host CPU: object files, standalone executables, shared
//! libraries with a C header, and CLIF listings (`oar compile`).
//!
//! A model is lowered like the JIT does it ([`crate::lower::lower`]), then written to one
//! relocatable object holding:
//! - every generated kernel function (the code the JIT would run);
//! - the blob: the model's signature, its [`oar_cpu_runtime::CpuProgram`] and its weights
//!   (constants always; parameters too unless `--weights external`), see
//!   [`oar_cpu_runtime::capi::encode_aot_blob`];
//! - a table of pointers to the kernel functions (function-address relocations);
//! - an entry function: `main(argc, argv)` for executables, which calls the runtime's
//!   `oar_rt_exe_main`, or `oar_model_create(weights_path, error)` for libraries and objects,
//!   which calls the runtime's `oar_rt_model_create` (the rest of the C API lives in the
//!   runtime).
//!
//! Executables and shared libraries are linked by the system C compiler (`cc`) against the
//! runtime's static library (`liboar_cpu_runtime*.a`: the one a program registered with
//! [`embed_runtime`] — the `oar` tool carries its own — else [`find_runtime_lib`]), so they
//! depend on nothing beyond libc.
//!
//! The generated code targets [`CpuTarget::Portable`] unless asked otherwise: one binary runs
//! on any x86-64 CPU, and the runtime's hand-written kernels pick their AVX2 or AVX-512
//! instances when it starts (`OAR_CPU_SIMD=avx2|baseline` narrows that choice).

mod header;
mod link;
mod object;

use crate::CpuError;
use crate::lower::{Lowered, lower};
use oar_cpu_runtime::capi::{AotMeta, encode_aot_blob};
use oar_ir::{Dim, Graph, Shape, TensorType, Weights};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use crate::machine::CpuTarget;
pub use header::c_header;
pub use link::{embed_runtime, find_runtime_lib};
pub use object::clif_listing;

/// What `oar compile` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    /// A standalone executable (`./model --input x=x.npy`).
    Exe,
    /// A shared library with the C API, and its header (`OUT` with extension `.h`).
    So,
    /// A relocatable object with the C API's `oar_model_create` (link it with the runtime
    /// static library), and its header.
    Obj,
    /// The CLIF text of every generated function, with a listing of how each kernel runs.
    Clif,
}

impl std::str::FromStr for Emit {
    type Err = String;
    fn from_str(s: &str) -> Result<Emit, String> {
        match s {
            "exe" => Ok(Emit::Exe),
            "so" => Ok(Emit::So),
            "obj" => Ok(Emit::Obj),
            "clif" => Ok(Emit::Clif),
            _ => Err(format!("unknown emit kind `{s}` (exe, so, obj, clif)")),
        }
    }
}

/// Where the parameters go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightsMode {
    /// Inside the binary (one self-contained file).
    #[default]
    Embedded,
    /// In `OUT.weights` (safetensors), read when the model is loaded; constants folded into
    /// the program stay embedded.
    External,
}

impl std::str::FromStr for WeightsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<WeightsMode, String> {
        match s {
            "embedded" => Ok(WeightsMode::Embedded),
            "external" => Ok(WeightsMode::External),
            _ => Err(format!("unknown weights mode `{s}` (embedded, external)")),
        }
    }
}

/// Options of [`compile`].
#[derive(Clone, Debug)]
pub struct AotOptions {
    /// What to write.
    pub emit: Emit,
    /// The file to write.
    pub output: PathBuf,
    /// Sizes of the graph's symbolic dims (every one must be bound).
    pub bindings: BTreeMap<String, usize>,
    /// Where the parameters go.
    pub weights: WeightsMode,
    /// The runtime static library (default: [`find_runtime_lib`]); only exe and so link.
    pub runtime_lib: Option<PathBuf>,
    /// Which CPUs the generated code runs on (the runtime's kernels choose theirs at run time).
    pub cpu: CpuTarget,
}

/// What [`compile`] did.
#[derive(Clone, Debug)]
pub struct AotReport {
    /// Files written, with their sizes in bytes (the main output first).
    pub files: Vec<(PathBuf, u64)>,
    /// Kernels in the program.
    pub kernels: usize,
    /// Generated functions (loop kernels and contraction epilogues).
    pub functions: usize,
    /// Kernels run by the reference interpreter, with the reason.
    pub interpreted: Vec<(String, String)>,
}

/// Compile `graph` with `weights` ahead of time as `opts` says.
pub fn compile(graph: &Graph, weights: &Weights, opts: &AotOptions) -> Result<AotReport, CpuError> {
    oar_ir::verify(graph).map_err(|e| CpuError::Backend(e.into()))?;
    let lowered = lower(graph, &opts.bindings)?;
    let meta = signature(graph, &opts.bindings, opts.weights == WeightsMode::External)?;
    let interpreted = lowered
        .cpu
        .steps
        .iter()
        .filter_map(|s| match s {
            oar_cpu_runtime::Step::Interpret { kernel, reason } => Some((
                lowered.cpu.program.kernels[*kernel as usize].name.clone(),
                reason.clone(),
            )),
            _ => None,
        })
        .collect();
    let mut report = AotReport {
        files: Vec::new(),
        kernels: lowered.cpu.program.kernels.len(),
        functions: lowered.funcs.len(),
        interpreted,
    };
    let out = &opts.output;
    if opts.emit == Emit::Clif {
        let text = clif_listing(&lowered, opts.cpu)?;
        write_file(out, text.as_bytes())?;
        report.files.push((out.clone(), text.len() as u64));
        return Ok(report);
    }
    let params = collect_params(&lowered, weights)?;
    let mut embedded = lowered.consts.clone();
    let mut external = Weights::new();
    for (k, v) in params {
        match opts.weights {
            WeightsMode::Embedded => embedded.insert(k, v),
            WeightsMode::External => external.insert(k, v),
        };
    }
    let blob = encode_aot_blob(&meta, &lowered.cpu, &embedded).map_err(CpuError::Io)?;
    let entry = if opts.emit == Emit::Exe {
        object::Entry::Main
    } else {
        object::Entry::Library
    };
    let obj = object::build_object(&lowered, &blob, entry, opts.cpu)?;
    match opts.emit {
        Emit::Obj => write_file(out, &obj)?,
        Emit::Exe | Emit::So => {
            let rt = match &opts.runtime_lib {
                Some(p) if p.is_file() => link::Runtime::File(p.clone()),
                Some(p) => {
                    return Err(CpuError::Io(format!(
                        "runtime library {}: no such file (it should be liboar_cpu_runtime*.a)",
                        p.display()
                    )));
                }
                None => link::runtime()?,
            };
            link::link(opts.emit == Emit::So, &obj, &rt, out)?;
        }
        Emit::Clif => unreachable!("handled above"),
    }
    report.files.push((out.clone(), file_size(out)));
    if opts.emit != Emit::Exe {
        let h = header_path(out);
        let text = c_header(&lowered, &meta, &h);
        write_file(&h, text.as_bytes())?;
        report.files.push((h, text.len() as u64));
    }
    if opts.weights == WeightsMode::External {
        let w = weights_path(out);
        let bytes = oar_ir::file::encode_weights(&external).map_err(CpuError::Io)?;
        write_file(&w, &bytes)?;
        report.files.push((w, bytes.len() as u64));
    }
    Ok(report)
}

/// The header written beside a library or object: `OUT` with extension `.h`.
pub fn header_path(out: &Path) -> PathBuf {
    out.with_extension("h")
}

/// The weights file of an AOT binary compiled with [`WeightsMode::External`]: `OUT.weights`
/// (where the binary looks for it by default).
pub fn weights_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".weights");
    PathBuf::from(p)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CpuError> {
    oar_ir::file::write_atomically(path, bytes).map_err(|e| CpuError::Io(format!("{}: {e}", path.display())))
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// The graph's inputs in graph order with every dim bound.
fn signature(graph: &Graph, bindings: &BTreeMap<String, usize>, external_weights: bool) -> Result<AotMeta, CpuError> {
    let mut inputs = Vec::new();
    let mut unbound: Vec<String> = Vec::new();
    for (name, t) in graph.input_specs() {
        let shape: Shape = t.shape.bind(&|s| bindings.get(s).copied());
        for s in shape.dims().iter().flat_map(Dim::symbols) {
            if !unbound.contains(&s) {
                unbound.push(s);
            }
        }
        inputs.push((name, TensorType { dtype: t.dtype, shape }));
    }
    if !unbound.is_empty() {
        return Err(CpuError::Symbolic(unbound));
    }
    Ok(AotMeta {
        name: graph.name().to_string(),
        inputs,
        external_weights,
    })
}

/// The parameters the program (and its control-flow regions) reads, checked against the
/// program's types (so a missing or mistyped weight is a compile error, not a load error).
fn collect_params(lowered: &Lowered, weights: &Weights) -> Result<Weights, CpuError> {
    let mut out = Weights::new();
    for (name, buffer) in lowered.cpu.params() {
        if lowered.consts.contains_key(&name) {
            continue;
        }
        // The runner's check of a param buffer against its weight.
        if let Some(t) = oar_ir::runner::leaf(buffer, weights, &BTreeMap::new())? {
            out.insert(name, t.clone());
        }
    }
    Ok(out)
}
