//! `oar`: inspect, run and draw oar models from the command line.

mod compile;
mod conformance;
mod export;
mod import;
mod inspect;
mod launch;
mod opt;
mod ps;
mod quantize;
mod run;

use clap::{Parser, Subcommand};
use oar_ir::file::Model;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "oar",
    version,
    about = "oar: a deep-learning compiler — inspect, optimize, run and draw models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Largest tensor or arena oar allocates (`512M`, `4G`; default: 3/4 of the available
    /// memory, or OAR_MAX_MEMORY): bigger sizes are an error naming the tensor, not an abort.
    #[arg(long, global = true, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<u64>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    oar_ir::memory::parse_size(s)
}

#[derive(Subcommand)]
enum Command {
    /// Print a model's IR, op counts, parameter count and bytes, and a FLOP estimate.
    Inspect {
        /// A `.oar` model or a `.oir` IR text file.
        file: PathBuf,
        /// Bind a symbolic dim for the FLOP estimate (`N=32`); unbound symbols count as 1.
        #[arg(long = "bind", value_name = "SYM=SIZE")]
        binds: Vec<String>,
        /// Print only the summary, not the IR.
        #[arg(long)]
        summary: bool,
    },
    /// Run a model on .npy inputs and write its outputs as .npy files.
    Run {
        /// A `.oar` model (or a `.oir` IR text file without parameters).
        file: PathBuf,
        /// An input, as NAME=path.npy (repeat for each input).
        #[arg(long = "input", short = 'i', value_name = "NAME=FILE.npy")]
        inputs: Vec<String>,
        /// Directory for the outputs (NAME.npy each); without it outputs are only summarized.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// Backend to run on (see `oar backends`); `--target` is an alias.
        #[arg(long, short = 'b', visible_alias = "target", default_value = oar::backend::DEFAULT_BACKEND)]
        backend: String,
    },
    /// Write the graph in Graphviz dot format.
    Dot {
        /// A `.oar` model or a `.oir` IR text file.
        file: PathBuf,
        /// Output file (default: standard output).
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
    },
    /// List the registered backends and eager device runtimes.
    Backends,
    /// Run a pass pipeline over a model (print, dump, time and numerically check each pass).
    Opt(opt::OptArgs),
    /// Convert an ONNX model into an oar model file.
    Import {
        /// The `.onnx` file (external data is read next to it).
        file: PathBuf,
        /// The `.oar` file to write.
        #[arg(long, short = 'o')]
        output: PathBuf,
    },
    /// Compile a model ahead of time for the host CPU: executable, shared library + C header,
    /// object file, or CLIF listing.
    Compile(compile::CompileArgs),
    /// Run the backend conformance suite (ops, patterns, models) against the reference backend.
    Conformance(conformance::ConformanceArgs),
    /// Post-training quantization: calibrate a float model on .npy data and write it with its
    /// matmuls and convolutions on 8-bit integers.
    Quantize(quantize::QuantizeArgs),
    /// Start a distributed job: PROGRAM on N ranks through mpirun (`oar launch -n 4 ./train`).
    Launch(launch::LaunchArgs),
    /// Parameter server: `oar ps server --shard I --of N --port P --table SPEC...`.
    #[command(subcommand)]
    Ps(ps::PsCommand),
    /// Write an oar model as ONNX (opset 18).
    Export {
        /// A `.oar` model or a `.oir` IR text file.
        file: PathBuf,
        /// The `.onnx` file to write.
        #[arg(long, short = 'o')]
        output: PathBuf,
    },
}

/// `--bind SYM=SIZE` values, parsed; each symbol must be one of `graph`'s (a typo is an error,
/// not a binding silently ignored).
pub(crate) fn parse_binds<C: FromIterator<(String, usize)>>(binds: &[String], graph: &oar_ir::Graph) -> CliResult<C> {
    let mut known: Vec<String> = graph
        .input_specs()
        .iter()
        .flat_map(|(_, t)| t.shape.dims().iter().flat_map(oar_ir::Dim::symbols).collect::<Vec<_>>())
        .collect();
    known.sort();
    known.dedup();
    binds
        .iter()
        .map(|b| {
            let (k, v) = b
                .split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("--bind `{b}`: expected SYM=SIZE"))?;
            let n = v
                .parse::<usize>()
                .map_err(|_| format!("--bind `{b}`: `{v}` is not a size"))?;
            if !known.iter().any(|s| s == k) {
                return Err(format!(
                    "--bind `{b}`: the graph has no symbolic dim `{k}` (its symbols: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ));
            }
            Ok((k.to_string(), n))
        })
        .collect()
}

/// Errors are one line of text, printed as `error: ...`.
pub(crate) type CliResult<T> = Result<T, String>;

fn main() -> ExitCode {
    // `oar inspect m.oar | head`: a closed pipe ends the process quietly, as for any Unix tool,
    // instead of a panic in println!.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Safety net: a bug must still end in one clear line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error (please report): {info}");
    }));
    let cli = Cli::parse();
    if let Some(m) = cli.max_memory {
        oar_ir::memory::set_limit(m);
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> CliResult<()> {
    match command {
        Command::Inspect { file, binds, summary } => inspect::inspect(&file, &binds, summary),
        Command::Run {
            file,
            inputs,
            output,
            backend,
        } => run::run_model(&file, &inputs, output.as_deref(), &backend),
        Command::Dot { file, output } => {
            let model = load(&file)?;
            let dot = oar_ir::dot::to_dot(&model.graph);
            match output {
                Some(p) => {
                    oar_ir::file::write_atomically(&p, dot.as_bytes()).map_err(|e| format!("{}: {e}", p.display()))
                }
                None => {
                    print!("{dot}");
                    Ok(())
                }
            }
        }
        Command::Opt(args) => opt::opt(args),
        Command::Import { file, output } => import::import(&file, &output),
        Command::Export { file, output } => export::export(&file, &output),
        Command::Compile(args) => compile::compile(args),
        Command::Quantize(args) => quantize::quantize(args),
        Command::Launch(args) => launch::launch(args),
        Command::Ps(cmd) => ps::ps(cmd),
        Command::Conformance(args) => conformance::conformance(args),
        Command::Backends => {
            for b in oar::backend::registry().list() {
                println!("{:<12} {}", b.name(), b.description());
            }
            println!("\neager device runtimes (Tensor::to / Layer::to):");
            println!("{:<12} host memory", "cpu");
            for r in oar::device::runtimes() {
                let state = match r.check(0) {
                    Ok(()) => "available".to_string(),
                    Err(e) => e.to_string(),
                };
                println!("{:<12} {} runtime: {state}", r.kind(), r.name());
            }
            Ok(())
        }
    }
}

/// Load a `.oar` model, or an IR text file as a model without weights.
pub(crate) fn load(path: &Path) -> CliResult<Model> {
    if path.extension().is_some_and(|e| e == "oir") {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let graph = oar_ir::text::parse_graph(&text).map_err(|e| format!("{}:{e}", path.display()))?;
        oar_ir::verify(&graph).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(Model {
            graph,
            weights: BTreeMap::new(),
        });
    }
    Model::load(path).map_err(|e| e.to_string())
}
