//! int8 inference on the `cpu` backend against f32 and onnxruntime (`bench/quant.sh` runs it):
//! ResNet-18 and MobileNetV2 (oar's zoo, seeded weights, eval mode), batch 1, 224 × 224.
//!
//! `bench_quant DIR export` traces both models, writes them as ONNX (`DIR/<model>.onnx`, for
//! onnxruntime's `quantize_static`) and 16 calibration images (`DIR/<model>.calib.npy`).
//! `bench_quant DIR time [RUNS]` prints `model variant median_ms` per variant:
//! - `f32`: the traced float graph;
//! - `int8`: the same graph quantized by `oar::quantization::quantize_model` (batch norms folded,
//!   min-max calibration on the 16 images, per-channel i8 weights, u8 inputs);
//! - `int8_rr`: the same with 7-bit weights (`reduce_range`), which run on `vpmaddubsw`;
//! - `int8_ort_qdq`: onnxruntime's QDQ model of it (`DIR/<model>.qdq.onnx`, when present)
//!   imported and run through the `quantize` pass.
//!
//! `OAR_BENCH_VARIANTS=int8,f32` times only those variants. With `OAR_CPU_PROFILE=1` it prints the time per kernel of each int8 variant.

#[path = "timing.rs"]
mod timing;
use oar::ir::file::Model;
use oar::ir::{DType, TensorData};
use oar::jit::{InputSpec, to_static_layer};
use oar::nn::Layer;
use oar::passes::Pass;
use oar::quantization::{StaticQuantConfig, quantize_model};
use std::collections::BTreeMap;
use std::path::Path;
use timing::median_ms;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const MODELS: [&str; 2] = ["resnet18", "mobilenet_v2"];

fn traced(name: &str) -> Res<Model> {
    oar::seed(0);
    let mut model: Box<dyn Layer> = match name {
        "resnet18" => Box::new(oar::vision::models::resnet18(1000)?),
        _ => Box::new(oar::vision::models::mobilenet_v2(1.0, 1000)?),
    };
    model.eval();
    let f = to_static_layer(
        model.as_ref(),
        &InputSpec::new(&[Some(1), Some(3), Some(224), Some(224)], DType::F32, "x"),
    )?;
    Ok(Model {
        graph: f.graph().clone(),
        weights: f.weights(),
    })
}

fn time(model: &Model, label: &str, variant: &str, x: &TensorData, runs: usize) -> Res<()> {
    if let Ok(only) = std::env::var("OAR_BENCH_VARIANTS")
        && !only.split(',').any(|v| v == variant)
    {
        return Ok(());
    }
    let exe = oar::backend::get("cpu")?.compile(&model.graph, &model.weights)?;
    let input = model.graph.input_specs()[0].0.clone();
    let inputs = BTreeMap::from([(input, x.clone())]);
    let _ = oar_cpu_runtime::profile::take();
    let ms = median_ms(2, runs, || exe.run(&inputs).map(|_| ()))?;
    println!("{label} {variant} {ms:.3}");
    if oar_cpu_runtime::profile::enabled() {
        eprintln!(
            "== {label} {variant}: per kernel\n{}",
            oar_cpu_runtime::profile::report()
        );
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let (dir, mode) = match args.as_slice() {
        [_, d, m, ..] => (Path::new(d), m.as_str()),
        _ => return Err("usage: bench_quant DIR export|time [RUNS]".into()),
    };
    let runs: usize = args.get(3).map(|r| r.parse()).transpose()?.unwrap_or(20);
    std::fs::create_dir_all(dir)?;
    for name in MODELS {
        let model = traced(name)?;
        oar::seed(1);
        let calib = oar::randn(&[16, 3, 224, 224], DType::F32)?.data();
        if mode == "export" {
            oar::onnx::save(&model, &dir.join(format!("{name}.onnx")))?;
            oar::ir::npy::write_npy(&dir.join(format!("{name}.calib.npy")), &calib)?;
            continue;
        }
        let x = oar::randn(&[1, 3, 224, 224], DType::F32)?.data();
        time(&model, name, "f32", &x, runs)?;
        let row = calib.bytes().len() / 16;
        let batches: Vec<_> = (0..16)
            .map(|i| {
                let t = TensorData::from_bytes(
                    DType::F32,
                    vec![1, 3, 224, 224],
                    calib.bytes()[i * row..(i + 1) * row].to_vec(),
                );
                t.map(|t| BTreeMap::from([("x".to_string(), t)]))
            })
            .collect::<Result<_, _>>()?;
        let config = StaticQuantConfig {
            per_channel: true,
            ..Default::default()
        };
        let q = quantize_model(&model, &batches, &config)?;
        eprintln!("{name}: {} products quantized", q.layers.len());
        time(&q.model, name, "int8", &x, runs)?;
        let config = StaticQuantConfig {
            reduce_range: true,
            ..config
        };
        let q = quantize_model(&model, &batches, &config)?;
        time(&q.model, name, "int8_rr", &x, runs)?;
        let qdq = dir.join(format!("{name}.qdq.onnx"));
        if qdq.exists() {
            let mut m = oar::onnx::load(&qdq)?;
            oar::passes::Quantize.run(&mut m.graph)?;
            oar::jit::fold_parameters(&mut m)?;
            time(&m, name, "int8_ort_qdq", &x, runs)?;
        }
    }
    Ok(())
}
