//! `oar opt`: run a pass pipeline over a model, with MLIR-style observability (print IR
//! around passes, dump each stage to files, time passes) and a numerics check that names the
//! pass (and step) that changed the results.

use crate::{CliResult, load};
use oar_ir::file::Model;
use oar_ir::{Graph, Op};
use oar_passes::{NumericsCheck, PassError, PassManager, SpecializeShapes, list_passes, pass_by_name};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The options of `oar opt` (see the subcommand's help in main.rs).
pub(crate) struct OptArgs {
    pub file: Option<PathBuf>,
    pub passes: Vec<String>,
    pub output: Option<PathBuf>,
    pub print_before_all: bool,
    pub print_after_all: bool,
    pub print_before: Vec<String>,
    pub print_after: Vec<String>,
    pub dump_dir: Option<PathBuf>,
    pub time_passes: bool,
    pub check_numerics: bool,
    pub rtol: Option<f64>,
    pub atol: Option<f64>,
    pub binds: Vec<String>,
    pub stop_after: Option<usize>,
    pub list_passes: bool,
}

fn parse_binds(binds: &[String]) -> CliResult<Vec<(String, usize)>> {
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
            Ok((k.to_string(), n))
        })
        .collect()
}

/// The pipeline for `names`; `specialize-shapes` gets the `--bind` sizes.
fn pipeline(names: &[String], binds: &[(String, usize)]) -> CliResult<PassManager> {
    let mut pm = PassManager::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        if name == "specialize-shapes" {
            pm.add(SpecializeShapes::new(binds.iter().map(|(k, v)| (k.as_str(), *v))));
            continue;
        }
        let pass = pass_by_name(name).ok_or_else(|| {
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
        if let Op::Param { name, .. } = &node.op {
            out.insert(name.clone());
        }
        for r in &node.regions {
            param_names(r, out);
        }
    }
}

fn write_output(path: &Path, model: Model) -> CliResult<()> {
    if path.extension().is_some_and(|e| e == "oir") {
        return std::fs::write(path, oar_ir::text::print_graph(&model.graph))
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
    let binds = parse_binds(&args.binds)?;
    let mut pm = pipeline(&args.passes, &binds)?;
    let mut model = load(file)?;
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
