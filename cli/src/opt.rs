//! `oar opt`: run a pass pipeline over a model, with MLIR-style observability (print IR
//! around passes, dump each stage to files, time passes) and a numerics check that names the
//! pass (and step) that changed the results.

use crate::{CliResult, load};
use oar_ir::file::Model;
use oar_ir::ops::Param;
use oar_ir::{Graph, Op};
use oar_passes::{NumericsCheck, PassError, PassManager, SpecializeShapes, list_passes, pass_from_spec};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The options of `oar opt`.
#[derive(clap::Args)]
pub(crate) struct OptArgs {
    /// A `.oar` model or a `.oir` IR text file.
    #[arg(required_unless_present = "list_passes")]
    pub file: Option<PathBuf>,
    /// Passes to run, in order, comma-separated (see --list-passes); a pass that takes an
    /// argument is given as `name=arg` (`amp=bf16`, `amp=f16:O2`).
    #[arg(
        long = "passes",
        visible_alias = "pass",
        short = 'p',
        value_delimiter = ',',
        value_name = "PASS,..."
    )]
    pub passes: Vec<String>,
    /// Output: `.oar` (graph and weights) or `.oir` (IR text); default: IR text on stdout.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Print the IR (to stderr) before every pass.
    #[arg(long)]
    pub print_before_all: bool,
    /// Print the IR (to stderr) after every pass.
    #[arg(long)]
    pub print_after_all: bool,
    /// Print the IR before each run of this pass (repeatable).
    #[arg(long, value_name = "PASS")]
    pub print_before: Vec<String>,
    /// Print the IR after each run of this pass (repeatable).
    #[arg(long, value_name = "PASS")]
    pub print_after: Vec<String>,
    /// Write the IR of every stage to numbered files (00-input.oir, 01-<pass>.oir, ...).
    #[arg(long, value_name = "DIR")]
    pub dump_dir: Option<PathBuf>,
    /// Report the time, node counts and changes of each pass (to stderr).
    #[arg(long)]
    pub time_passes: bool,
    /// Run the graph on the reference backend before and after each pass (random inputs,
    /// the model's weights) and name the first pass (and step) that changes the outputs.
    #[arg(long)]
    pub check_numerics: bool,
    /// Relative tolerance of --check-numerics (default 1e-4).
    #[arg(long)]
    pub rtol: Option<f64>,
    /// Absolute tolerance of --check-numerics (default 1e-5).
    #[arg(long)]
    pub atol: Option<f64>,
    /// Bind a symbolic dim (`N=8`) for specialize-shapes and --check-numerics (repeatable).
    #[arg(long = "bind", value_name = "SYM=SIZE")]
    pub binds: Vec<String>,
    /// Run only the first N passes.
    #[arg(long, value_name = "N")]
    pub stop_after: Option<usize>,
    /// List the registered passes with their descriptions.
    #[arg(long)]
    pub list_passes: bool,
}

/// The pipeline for `names`; `specialize-shapes` gets the `--bind` sizes.
fn pipeline(names: &[String], binds: &[(String, usize)]) -> CliResult<PassManager> {
    let mut pm = PassManager::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        if name == "specialize-shapes" {
            pm.add(SpecializeShapes::new(binds.iter().map(|(k, v)| (k.as_str(), *v))));
            continue;
        }
        let pass = pass_from_spec(name).map_err(|e| e.to_string())?.ok_or_else(|| {
            PassError::UnknownPass {
                name: name.to_string(),
                known: list_passes().iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            }
            .to_string()
        })?;
        pm.add_boxed(pass);
    }
    Ok(pm)
}

/// Names of the params of `graph` and its regions.
fn param_names(graph: &Graph, out: &mut BTreeSet<String>) {
    for id in graph.node_ids() {
        let node = graph.node(id);
        if let Op::Param(Param { name, .. }) = &node.op {
            out.insert(name.clone());
        }
        for r in &node.regions {
            param_names(r, out);
        }
    }
}

fn write_output(path: &Path, model: Model) -> CliResult<()> {
    if path.extension().is_some_and(|e| e == "oir") {
        return oar_ir::file::write_atomically(path, oar_ir::text::print_graph(&model.graph).as_bytes())
            .map_err(|e| format!("{}: {e}", path.display()));
    }
    if path.extension().is_none_or(|e| e != "oar") {
        return Err(format!("{}: the output must end in .oar or .oir", path.display()));
    }
    // Passes may have removed params (dce): keep only the weights still used.
    let mut used = BTreeSet::new();
    param_names(&model.graph, &mut used);
    let weights: BTreeMap<_, _> = model.weights.into_iter().filter(|(k, _)| used.contains(k)).collect();
    Model {
        graph: model.graph,
        weights,
    }
    .save(path)
    .map_err(|e| e.to_string())
}

pub(crate) fn opt(args: OptArgs) -> CliResult<()> {
    if args.list_passes {
        for (name, description) in list_passes() {
            println!("{name:<20} {description}");
        }
        return Ok(());
    }
    let file = args
        .file
        .as_deref()
        .ok_or("no input file (usage: oar opt FILE -p PASS,... [-o OUT])")?;
    let mut model = load(file)?;
    let binds = crate::parse_binds::<Vec<_>>(&args.binds, &model.graph)?;
    let mut pm = pipeline(&args.passes, &binds)?;
    pm.verify_each(true);
    if args.print_before_all {
        pm.print_before_all();
    }
    if args.print_after_all {
        pm.print_after_all();
    }
    for p in &args.print_before {
        pm.print_before(p);
    }
    for p in &args.print_after {
        pm.print_after(p);
    }
    pm.print_ir_to_stderr();
    if let Some(dir) = &args.dump_dir {
        pm.dump_dir(dir);
    }
    if let Some(n) = args.stop_after {
        pm.stop_after(n);
    }
    if args.check_numerics {
        let mut check = NumericsCheck::new().weights(model.weights.clone());
        for (k, v) in &binds {
            check = check.bind(k, *v);
        }
        if args.rtol.is_some() || args.atol.is_some() {
            check = check.tolerance(
                args.rtol.unwrap_or(oar_passes::DEFAULT_RTOL),
                args.atol.unwrap_or(oar_passes::DEFAULT_ATOL),
            );
        }
        pm.check_numerics(check);
    }
    let report = pm
        .run(&mut model.graph)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    if args.time_passes {
        eprintln!("{report}");
    }
    if args.check_numerics {
        eprintln!("numerics check passed after {} passes", report.records.len());
    }
    match &args.output {
        Some(path) => write_output(path, model),
        None => {
            print!("{}", oar_ir::text::print_graph(&model.graph));
            Ok(())
        }
    }
}
