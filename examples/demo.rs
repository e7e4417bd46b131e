//! The demo: build a small classifier graph with a symbolic batch dim, save it as a `.oar`
//! model, decompose it into primitives, and run both forms on the reference backend.
//!
//! `scripts/demo.sh` runs this, then `oar inspect` and `oar run` on the saved model.

use oar::ir::file::Model;
use oar::ir::ops::{Gelu, Softmax};
use oar::ir::{Composite, DType, Dim, Graph, Op, TensorData, TensorType};
use oar::passes::PassManager;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Deterministic pseudo-random numbers in [-1, 1) (xorshift64*), so the demo needs no crate.
fn uniform(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed >> 12;
            *seed ^= *seed << 25;
            *seed ^= *seed >> 27;
            let r = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
            (r as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn build() -> Result<Model, Box<dyn std::error::Error>> {
    let (inp, hidden, classes) = (64, 32, 10);
    let mut g = Graph::new("mlp");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(inp)]))?;
    let mut weights = BTreeMap::new();
    let mut seed = 0x5EED_u64;
    let mut param = |g: &mut Graph, name: &str, dims: &[usize]| -> Result<_, Box<dyn std::error::Error>> {
        let n = dims.iter().product();
        let scale = 1.0 / (dims[0] as f32).sqrt();
        weights.insert(
            name.to_string(),
            TensorData::from_vec(dims.to_vec(), uniform(&mut seed, n, scale))?,
        );
        Ok(g.add_param(name, TensorType::of(DType::F32, dims))?)
    };
    let w1 = param(&mut g, "fc1.weight", &[inp, hidden])?;
    let b1 = param(&mut g, "fc1.bias", &[hidden])?;
    let w2 = param(&mut g, "fc2.weight", &[hidden, classes])?;
    let b2 = param(&mut g, "fc2.bias", &[classes])?;
    let h = g.add_op1(Op::Composite(Composite::Linear), &[x, w1, b1])?;
    let h = g.add_op1(Op::Composite(Composite::Gelu(Gelu { approximate: false })), &[h])?;
    let logits = g.add_op1(Op::Composite(Composite::Linear), &[h, w2, b2])?;
    let probs = g.add_op1(Op::Composite(Composite::Softmax(Softmax { axis: 1 })), &[logits])?;
    g.add_output("probs", probs)?;
    Ok(Model { graph: g, weights })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "target/demo".into()));
    std::fs::create_dir_all(&dir)?;
    let model = build()?;
    let path = dir.join("mlp.oar");
    model.save(&path)?;
    println!("saved {} ({} bytes)", path.display(), std::fs::metadata(&path)?.len());

    let batch = 4;
    let x = TensorData::from_vec(vec![batch, 64], uniform(&mut 42, batch * 64, 1.0))?;
    oar::ir::npy::write_npy(&dir.join("x.npy"), &x)?;
    let inputs = BTreeMap::from([("x".to_string(), x)]);

    let loaded = Model::load(&path)?;
    println!("\n{}", oar::ir::text::print_graph(&loaded.graph));
    let eager = oar::reference::run_graph(&loaded.graph, &loaded.weights, &inputs)?;

    let mut primitive = loaded.graph.clone();
    let report = PassManager::from_names(&["decompose", "dce"])?.run(&mut primitive)?;
    println!("{report}");
    println!("{primitive}");
    println!(
        "decomposed into primitives: {} nodes -> {} nodes",
        loaded.graph.node_count(),
        primitive.node_count()
    );
    let lowered = oar::reference::run_graph(&primitive, &loaded.weights, &inputs)?;

    let (a, b) = (eager[0].1.to_vec::<f32>()?, lowered[0].1.to_vec::<f32>()?);
    let max_diff = a.iter().zip(&b).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
    for row in a.chunks(10) {
        let best = row
            .iter()
            .enumerate()
            .max_by(|p, q| p.1.total_cmp(q.1))
            .map(|p| p.0)
            .unwrap_or(0);
        println!("class {best}  p={:.3}  sum={:.4}", row[best], row.iter().sum::<f32>());
    }
    println!("composite vs decomposed graph: max |diff| = {max_diff:.2e}");
    if max_diff > 1e-5 {
        return Err(format!("decomposed graph disagrees with the composite one by {max_diff}").into());
    }
    Ok(())
}
