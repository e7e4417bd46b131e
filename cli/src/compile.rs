//! `oar compile`: ahead-of-time compilation of a model for the host CPU (a standalone
//! executable, a shared library with a C header, an object file, or a CLIF listing), or for
//! NVIDIA GPUs (the PTX module of its kernels), or (with the `mlir` feature) the MLIR module
//! of its kernels and the LLVM IR MLIR lowers it to, or the PTX module MLIR lowers its kernels
//! to (`--target mlir-gpu`, what the `mlir-gpu` backend loads).

use crate::{CliResult, load, parse_binds};
use oar_backend_cpu::aot::{self, AotOptions, Emit, WeightsMode};
use std::path::PathBuf;

/// The options of `oar compile`.
#[derive(clap::Args)]
pub(crate) struct CompileArgs {
    /// A `.oar` model or a `.oir` IR text file.
    pub file: PathBuf,
    /// The target: `cpu` (the host CPU), `ptx` (NVIDIA GPUs), `mlir` (the MLIR backend's
    /// text; the binary must be built with `--features mlir` for `--emit llvm`) or `mlir-gpu`
    /// (the PTX module MLIR makes for NVIDIA GPUs; needs `--features mlir`, no GPU).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "ptx", "mlir", "mlir-gpu"])]
    pub target: String,
    /// What to write. cpu: a standalone executable (default), a shared library (+ C header),
    /// an object file (+ C header; link it with the runtime library), or the CLIF text of
    /// every kernel. ptx: the PTX module (default; kernels that run on the host are listed).
    /// mlir: the MLIR module before lowering (`mlir`, default) or the LLVM IR after it (`llvm`).
    #[arg(long, value_parser = ["exe", "so", "obj", "clif", "ptx", "mlir", "llvm"])]
    pub emit: Option<String>,
    /// The GPU architecture for `--target ptx` and `--target mlir-gpu`.
    #[arg(long, default_value = "sm_80", value_parser = ["sm_80", "sm_90"])]
    pub arch: String,
    /// The file to write (`-`: standard output, for the text targets `ptx` and `mlir`).
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Bind a symbolic dim (`N=1`); every symbolic dim must be bound (repeatable).
    #[arg(long = "bind", value_name = "SYM=SIZE")]
    pub binds: Vec<String>,
    /// Where the parameters go: inside the binary, or in OUTPUT.weights (safetensors) read
    /// when the model loads.
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "external"])]
    pub weights: String,
    /// The runtime static library to link with (default: $OAR_CPU_RUNTIME_LIB, else the one
    /// this program carries, else the one cargo built beside it).
    #[arg(long, value_name = "LIB.a")]
    pub runtime_lib: Option<PathBuf>,
    /// The CPUs the generated code is for: `portable` (any x86-64 since 2009: x86-64-v2; the
    /// runtime's kernels still pick AVX2 or AVX-512 when the binary starts) or `native` (every
    /// feature of this machine; the binary may not run on an older one).
    #[arg(long, default_value = "portable", value_parser = ["portable", "native"])]
    pub cpu: String,
    /// Compute precision: `f32` as the model is, or mixed precision by the AMP lists (`bf16`,
    /// `f16`: the `amp` pass at level O1 — matmuls and convolutions in the low dtype with f32
    /// accumulation, reductions, softmax and norms in f32; inputs and outputs keep their types).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "f16"])]
    pub precision: String,
}

/// The model, rewritten by the `amp` pass when `--precision` asks for mixed precision.
fn load_at_precision(args: &CompileArgs) -> CliResult<oar_ir::file::Model> {
    let mut model = load(&args.file)?;
    if args.precision != "f32" {
        use oar_passes::Pass;
        let amp = oar_passes::Amp::parse(&args.precision).map_err(|e| e.to_string())?;
        amp.run(&mut model.graph).map_err(|e| e.to_string())?;
    }
    Ok(model)
}

pub(crate) fn compile(args: CompileArgs) -> CliResult<()> {
    if args.target == "ptx" {
        return compile_ptx(&args);
    }
    if args.target == "mlir" {
        return compile_mlir(&args);
    }
    if args.target == "mlir-gpu" {
        return compile_mlir_gpu(&args);
    }
    let emit = args.emit.as_deref().unwrap_or("exe");
    if matches!(emit, "ptx" | "mlir" | "llvm") {
        return Err(format!(
            "--emit {emit} needs --target {}",
            if emit == "ptx" { "ptx" } else { "mlir" }
        ));
    }
    let model = load_at_precision(&args)?;
    let emit: Emit = emit.parse()?;
    // The runtime library of this very build, so an installed `oar` links anywhere.
    if let Some(gz) = oar_cpu_runtime_embed::embedded_runtime!() {
        aot::embed_runtime(gz);
    }
    let weights: WeightsMode = args.weights.parse()?;
    let opts = AotOptions {
        emit,
        output: args.output.clone(),
        bindings: parse_binds(&args.binds, &model.graph)?,
        weights,
        runtime_lib: args.runtime_lib.clone(),
        cpu: args.cpu.parse()?,
    };
    let report =
        aot::compile(&model.graph, &model.weights, &opts).map_err(|e| format!("{}: {e}", args.file.display()))?;
    for (path, size) in &report.files {
        println!("wrote {} ({})", path.display(), human(*size));
    }
    println!(
        "{} kernels: {} generated functions, {} interpreted",
        report.kernels,
        report.functions,
        report.interpreted.len()
    );
    for (k, reason) in &report.interpreted {
        println!("  interpreted `{k}`: {reason}");
    }
    Ok(())
}

/// `--target ptx`: write the model's PTX module.
fn compile_ptx(args: &CompileArgs) -> CliResult<()> {
    use oar_backend_ptx::Arch;
    let emit = args.emit.as_deref().unwrap_or("ptx");
    if emit != "ptx" {
        return Err(format!("--target ptx writes a PTX module (--emit ptx), not `{emit}`"));
    }
    let model = load_at_precision(args)?;
    let arch = if args.arch == "sm_90" { Arch::Sm90 } else { Arch::Sm80 };
    let bindings = parse_binds(&args.binds, &model.graph)?;
    let (program, module) = oar_backend_ptx::compile_to_ptx(&model.graph, &bindings, arch)
        .map_err(|e| format!("{}: {e}", args.file.display()))?;
    write_ptx(&args.output, &program, &module, "PTX")
}

/// Write a PTX module to `path` (or print it for `-`), then summarize its entries and host
/// steps; `what` names the entries (`PTX`, `MLIR-made PTX`).
fn write_ptx(
    path: &std::path::Path,
    program: &oar::ir::kernel::KernelProgram,
    module: &oar_backend_ptx::PtxModule,
    what: &str,
) -> CliResult<()> {
    if write_text(path, &module.text())? {
        return Ok(());
    }
    let host = module.host_steps();
    println!(
        "{} kernels: {} {what} entries for {}, {} on the host",
        program.kernels.len(),
        module.entries.len(),
        module.arch,
        host.len()
    );
    for (k, reason) in host {
        println!("  host `{}`: {reason}", program.kernels[k].name);
    }
    Ok(())
}

/// Write `text` to `path` and say so, or print it when `path` is `-` (returns true then).
fn write_text(path: &std::path::Path, text: &str) -> CliResult<bool> {
    if path.as_os_str() == "-" {
        print!("{text}");
        return Ok(true);
    }
    oar_ir::file::write_atomically(path, text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("wrote {} ({})", path.display(), human(text.len() as u64));
    Ok(false)
}

/// `--target mlir`: write the model's MLIR module (`--emit mlir`) or its LLVM IR (`--emit llvm`).
fn compile_mlir(args: &CompileArgs) -> CliResult<()> {
    let emit = args.emit.as_deref().unwrap_or("mlir");
    let model = load_at_precision(args)?;
    let bindings = parse_binds(&args.binds, &model.graph)?;
    let fail = |e: oar_backend_mlir::MlirError| format!("{}: {e}", args.file.display());
    let text = match emit {
        "mlir" => oar_backend_mlir::emit_mlir(&model.graph, &bindings).map_err(fail)?,
        #[cfg(feature = "mlir")]
        "llvm" => oar_backend_mlir::emit_llvm(&model.graph, &bindings).map_err(fail)?,
        #[cfg(not(feature = "mlir"))]
        "llvm" => return Err("--emit llvm needs an oar built with `--features mlir` (LLVM/MLIR 19)".into()),
        other => return Err(format!("--target mlir writes `mlir` or `llvm`, not `{other}`")),
    };
    write_text(&args.output, &text)?;
    Ok(())
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// `--target mlir-gpu`: write the PTX module MLIR makes of the model's kernels (the one the
/// `mlir-gpu` backend loads; no GPU needed).
#[cfg(feature = "mlir")]
fn compile_mlir_gpu(args: &CompileArgs) -> CliResult<()> {
    use oar_backend_ptx::Arch;
    let emit = args.emit.as_deref().unwrap_or("ptx");
    if emit != "ptx" {
        return Err(format!(
            "--target mlir-gpu writes a PTX module (--emit ptx), not `{emit}`"
        ));
    }
    let model = load_at_precision(args)?;
    let arch = if args.arch == "sm_90" { Arch::Sm90 } else { Arch::Sm80 };
    let bindings = parse_binds(&args.binds, &model.graph)?;
    let fail = |e: String| format!("{}: {e}", args.file.display());
    let program = oar_backend_ptx::lower(&model.graph, &bindings).map_err(|e| fail(e.to_string()))?;
    let libdevice = oar_backend_mlir::gpu::find_libdevice();
    let module = oar_backend_mlir::ptx_module(&program, arch, libdevice.as_deref()).map_err(|e| fail(e.to_string()))?;
    let missing = oar_backend_mlir::ptx_module::unresolved_externs(&module);
    if !missing.is_empty() {
        eprintln!(
            "warning: libdevice.10.bc not found (set OAR_LIBDEVICE): the module declares {} \
             `.extern` and the CUDA driver will not load it",
            missing.join(", ")
        );
    }
    write_ptx(&args.output, &program, &module, "MLIR-made PTX")
}

#[cfg(not(feature = "mlir"))]
fn compile_mlir_gpu(_args: &CompileArgs) -> CliResult<()> {
    Err("--target mlir-gpu needs an oar built with `--features mlir` (LLVM/MLIR 19)".into())
}
