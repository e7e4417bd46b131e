//! The pass pipeline on three models built with oar's API (an MLP, ResNet-18 at 224×224, a
//! 4-layer transformer encoder): nodes after each pass, time per pass, kernels after fusion, and
//! peak temporary memory before/after planning (batch N = 1). Numbers go to docs/PASSES.md.

use oar::ir::Graph;
use oar::jit::{InputSpec, to_static_layer};
use oar::nn::{Layer, Linear, ReLU, Sequential, TransformerEncoder, TransformerEncoderLayer};
use oar::passes::PassManager;
use oar::{DType, Result};
use std::collections::BTreeMap;
use std::time::Instant;

const PIPELINE: &[&str] = &["canonicalize", "fold", "cse", "simplify", "decompose", "dce", "cse"];

fn report(name: &str, graph: &Graph) -> Result<()> {
    let mut g = graph.clone();
    let start = Instant::now();
    let report = PassManager::from_names(PIPELINE)
        .map_err(|e| oar::Error::invalid("passes", e.to_string()))?
        .run(&mut g)
        .map_err(|e| oar::Error::invalid("passes", e.to_string()))?;
    let fuse_start = Instant::now();
    let program = oar::passes::fuse::fuse(&g).map_err(|e| oar::Error::invalid("fuse", e.to_string()))?;
    let fuse_time = fuse_start.elapsed();
    let plan_start = Instant::now();
    let plan = oar::passes::memory_plan(&program, &BTreeMap::from([("N".to_string(), 1)]))
        .map_err(|e| oar::Error::invalid("memory_plan", e.to_string()))?;
    let plan_time = plan_start.elapsed();
    let total = start.elapsed();
    let (loops, contractions, opaque) = program.kernel_counts();
    println!("## {name}\n");
    println!("| pass | nodes before | nodes after | time |\n|---|---|---|---|");
    for r in &report.records {
        println!(
            "| {} | {} | {} | {:.2} ms |",
            r.name,
            r.nodes_before,
            r.nodes_after,
            r.duration.as_secs_f64() * 1e3
        );
    }
    println!(
        "| fuse | {} | {} kernels ({loops} loop, {contractions} matmul/conv, {opaque} other) | {:.2} ms |",
        g.node_count(),
        loops + contractions + opaque,
        fuse_time.as_secs_f64() * 1e3
    );
    println!("| memory plan | | | {:.2} ms |", plan_time.as_secs_f64() * 1e3);
    println!(
        "\npeak temporaries (N = 1): {:.1} KiB without reuse → {:.1} KiB planned arena ({} in-place); whole pipeline {:.1} ms\n",
        plan.peak_naive_bytes as f64 / 1024.0,
        plan.arena_bytes as f64 / 1024.0,
        plan.in_place.len(),
        total.as_secs_f64() * 1e3
    );
    Ok(())
}

fn main() -> Result<()> {
    oar::seed(0);
    let mut mlp = Sequential::new()
        .add(Linear::new(784, 256)?)
        .add(ReLU)
        .add(Linear::new(256, 10)?);
    mlp.eval();
    let g = to_static_layer(&mlp, &InputSpec::new(&[None, Some(784)], DType::F32, "x"))?;
    report("MLP 784-256-10", g.graph())?;

    let mut resnet = oar::vision::models::resnet18(1000)?;
    resnet.eval();
    let g = to_static_layer(
        &resnet,
        &InputSpec::new(&[None, Some(3), Some(224), Some(224)], DType::F32, "image"),
    )?;
    report("ResNet-18 (224×224)", g.graph())?;
    if let Some(path) = std::env::args().nth(1) {
        g.save(&path)?;
        println!("(saved ResNet-18 to {path})\n");
    }

    let mut enc = TransformerEncoder::new(|| TransformerEncoderLayer::new(256, 4, 1024), 4)?;
    enc.eval();
    let g = to_static_layer(
        &enc,
        &InputSpec::new(&[None, Some(128), Some(256)], DType::F32, "tokens"),
    )?;
    report(
        "Transformer encoder (4 layers, hidden 256, 4 heads, seq 128)",
        g.graph(),
    )?;
    Ok(())
}
