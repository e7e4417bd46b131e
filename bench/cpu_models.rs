//! Inference latency of oar's `cpu` backend on models exported from PyTorch to ONNX
//! (`tools/export_torch_models.py --size full`), imported with `oar::onnx`, compiled once and
//! run repeatedly. `bench/cpu_models.sh` runs this next to ONNX Runtime and PyTorch
//! (`bench/cpu_models_ref.py`) on the same files and inputs, and prints the ratios.
//!
//! Usage: `bench_cpu_models DIR [NAME...]`. Prints per model one line:
//! `name median_ms min_ms compile_ms max_rel_err_vs_ort`. With `OAR_BENCH_PRECISION=bf16` (or
//! `f16`) the model first goes through the `amp` pass (what `oar compile --precision` does).

use oar::ir::TensorData;
use oar::ir::npy::read_npy;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn max_rel_err(a: &TensorData, b: &TensorData) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-6);
    a.iter().zip(&b).fold(0f64, |m, (x, y)| m.max((x - y).abs() / scale))
}

fn bench(dir: &Path, name: &str, runs: usize) -> Res<()> {
    let mut model = oar::onnx::load(&dir.join(format!("{name}.onnx")))?;
    if let Ok(p) = std::env::var("OAR_BENCH_PRECISION")
        && p != "f32"
    {
        use oar::passes::Pass;
        oar::passes::Amp::parse(&p)?.run(&mut model.graph)?;
    }
    let mut inputs = BTreeMap::new();
    for (i, (input, _)) in model.graph.input_specs().iter().enumerate() {
        inputs.insert(input.clone(), read_npy(&dir.join(format!("{name}.input_{i}.npy")))?);
    }
    let backend = oar::backend::get("cpu")?;
    let t = Instant::now();
    let exe = backend.compile(&model.graph, &model.weights)?;
    let outs = exe.run(&inputs)?; // symbolic dims compile on first run
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let expected = read_npy(&dir.join(format!("{name}.output_0.npy")))?;
    let err = max_rel_err(&outs[0].1, &expected);
    for _ in 0..3 {
        exe.run(&inputs)?;
    }
    let _ = oar_cpu_runtime::profile::take();
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let s = Instant::now();
        exe.run(&inputs)?;
        times.push(s.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    if oar_cpu_runtime::profile::enabled() {
        // OAR_CPU_PROFILE=1: where the timed runs' time goes, per kernel (stderr).
        eprintln!("== {name}: per kernel\n{}", oar_cpu_runtime::profile::report());
    }
    println!(
        "{name} {:.4} {:.4} {compile_ms:.1} {err:.2e}",
        times[runs / 2],
        times[0]
    );
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().ok_or("usage: bench_cpu_models DIR [NAME...]")?);
    let names: Vec<String> = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        [
            "resnet18",
            "mobilenet_v2",
            "transformer_encoder",
            "lstm",
            "gru",
            "resnet18_b16",
        ]
        .map(String::from)
        .to_vec()
    };
    for name in &names {
        bench(&dir, name, 30)?;
    }
    Ok(())
}
