//! `oar`: inspect, run and draw oar models from the command line.

use clap::{Parser, Subcommand};
use oar_ir::file::Model;
use oar_ir::{Graph, TensorData};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "oar",
    version,
    about = "oar: a deep-learning compiler — inspect, run and draw models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
        /// Backend to run on (see `oar backends`).
        #[arg(long, short = 'b', default_value = oar::backend::DEFAULT_BACKEND)]
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
    /// List the registered backends.
    Backends,
}

type CliResult<T> = Result<T, String>;

fn main() -> ExitCode {
    // Safety net: a bug must still end in one clear line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error (please report): {info}");
    }));
    let cli = Cli::parse();
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
        Command::Inspect { file, binds, summary } => inspect(&file, &binds, summary),
        Command::Run {
            file,
            inputs,
            output,
            backend,
        } => run_model(&file, &inputs, output.as_deref(), &backend),
        Command::Dot { file, output } => {
            let model = load(&file)?;
            let dot = oar_ir::dot::to_dot(&model.graph);
            match output {
                Some(p) => std::fs::write(&p, dot).map_err(|e| format!("{}: {e}", p.display())),
                None => {
                    print!("{dot}");
                    Ok(())
                }
            }
        }
        Command::Backends => {
            for b in oar::backend::registry().list() {
                println!("{:<12} {}", b.name(), b.description());
            }
            Ok(())
        }
    }
}

/// Load a `.oar` model, or an IR text file as a model without weights.
fn load(path: &Path) -> CliResult<Model> {
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

fn parse_binds(binds: &[String]) -> CliResult<BTreeMap<String, usize>> {
    binds
        .iter()
        .map(|b| {
            let (k, v) = b
                .split_once('=')
                .ok_or_else(|| format!("--bind `{b}`: expected SYM=SIZE"))?;
            let n = v
                .parse::<usize>()
                .map_err(|_| format!("--bind `{b}`: `{v}` is not a size"))?;
            Ok((k.to_string(), n))
        })
        .collect()
}

fn inspect(file: &Path, binds: &[String], summary_only: bool) -> CliResult<()> {
    let model = load(file)?;
    let binds = parse_binds(binds)?;
    if !summary_only {
        println!("{}", oar_ir::text::print_graph(&model.graph));
    }
    print_summary(&model.graph, &binds);
    Ok(())
}

fn print_summary(graph: &Graph, binds: &BTreeMap<String, usize>) {
    let stats = oar_ir::stats::graph_stats(graph, &|s| Some(binds.get(s).copied().unwrap_or(1)));
    println!("graph @{}", graph.name());
    for (name, ty) in graph.input_specs() {
        println!("  input  {name}: {ty}");
    }
    for (o, ty) in graph.outputs().iter().zip(graph.output_types()) {
        println!("  output {}: {ty}", o.name);
    }
    let total: usize = stats.op_counts.values().sum();
    println!("ops: {total} nodes");
    for (op, n) in &stats.op_counts {
        println!("  {op:<22} {n}");
    }
    println!(
        "parameters: {} tensors, {} elements, {}",
        stats.params,
        stats.param_elements,
        human_bytes(stats.param_bytes)
    );
    let bound = if binds.is_empty() {
        "symbolic dims = 1".to_string()
    } else {
        binds
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match stats.flops {
        Some(f) => println!("flops: {} per run ({bound})", human_count(f)),
        None => println!("flops: unknown (a shape stayed symbolic)"),
    }
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.2} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} G", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.2} K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

fn run_model(file: &Path, inputs: &[String], output: Option<&Path>, backend: &str) -> CliResult<()> {
    let model = load(file)?;
    let mut feeds = BTreeMap::new();
    for spec in inputs {
        let (name, path) = spec
            .split_once('=')
            .ok_or_else(|| format!("--input `{spec}`: expected NAME=FILE.npy"))?;
        let t = oar_ir::npy::read_npy(Path::new(path)).map_err(|e| format!("--input {name}: {e}"))?;
        if feeds.insert(name.to_string(), t).is_some() {
            return Err(format!("--input `{name}` is given twice"));
        }
    }
    let backend = oar::backend::get(backend).map_err(|e| e.to_string())?;
    let exe = backend
        .compile(&model.graph, &model.weights)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let outs = exe.run(&feeds).map_err(|e| e.to_string())?;
    if let Some(dir) = output {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    for (name, t) in &outs {
        println!("{name}: {}", preview(t));
        if let Some(dir) = output {
            let path = dir.join(format!("{}.npy", sanitize(name)));
            oar_ir::npy::write_npy(&path, t).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// Output names become file names: keep them to a safe character set.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn preview(t: &TensorData) -> String {
    let v = t.to_f64_vec();
    let shown: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
    let more = if v.len() > 6 { ", ..." } else { "" };
    format!("{} [{}{more}]", t.tensor_type(), shown.join(", "))
}
