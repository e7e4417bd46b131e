//! `oar inspect`: the IR text and a summary (ops, parameters, FLOPs).

use crate::{CliResult, load};
use oar_ir::Graph;
use std::collections::BTreeMap;
use std::path::Path;

pub(crate) fn inspect(file: &Path, binds: &[String], summary_only: bool) -> CliResult<()> {
    let model = load(file)?;
    let binds: BTreeMap<String, usize> = crate::parse_binds(binds, &model.graph)?;
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
        Some(u64::MAX) => println!(
            "flops: more than {} per run, overflows u64 ({bound})",
            human_count(u64::MAX)
        ),
        Some(f) => println!("flops: {} per run ({bound})", human_count(f)),
        None => println!("flops: unknown (a shape stayed symbolic, or its size overflows)"),
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
