//! Mixed precision on the `cpu` backend: f32 vs bf16 vs f16 in one run, for ResNet-18
//! inference (batch 1, 224 × 224, the `amp` pass on the traced f32 graph, as `oar compile
//! --precision` does) and the MLP and LeNet-5 training steps (batch 64, the loss function in
//! an O1 `auto_cast` scope, traced whole with `to_static_train_step`). `bench/amp.sh` runs it.
//!
//! Prints one line per (model, precision): `model precision median_ms arena_bytes
//! saved_bytes`, where `arena_bytes` is the compiled program's planned memory for temporaries
//! — for a training step, the activations kept for the backward pass and the gradients — and
//! `saved_bytes`, for a training step, its activation memory: the temporaries live when the
//! loss is computed that the backward reads later (0 for inference). With
//! `OAR_BENCH_PEAK=1` it also prints, per training step, the temporaries live at the peak
//! (largest first); with `OAR_CPU_PROFILE=1`, the time per kernel.

#[path = "models.rs"]
mod models;
#[path = "timing.rs"]
mod timing;
use models::{lenet, mlp};
use oar::amp::{self, AmpLevel};
use oar::ir::{DType, Graph};
use oar::jit::{InputSpec, to_static_layer, to_static_train_step};
use oar::nn::functional::cross_entropy;
use oar::nn::{Layer, Reduction};
use oar::optimizer::AdamW;
use oar::passes::{Amp, Pass};
use oar::{Result, Tensor};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;
use std::collections::BTreeMap;
use timing::{interleaved_medians_ms, median_ms};

const PRECISIONS: [(&str, Option<DType>); 3] = [("f32", None), ("bf16", Some(DType::BF16)), ("f16", Some(DType::F16))];

/// The planned bytes of temporaries of `graph` compiled for the cpu backend.
fn arena_bytes(graph: &Graph) -> Res<usize> {
    Ok(oar::cpu::lower::lower(graph, &BTreeMap::new())?.cpu.plan.arena_bytes)
}

/// The first and last kernel touching each buffer of `p` (`usize::MAX` and 0 for none).
fn lifetimes(p: &oar::ir::kernel::KernelProgram) -> (Vec<usize>, Vec<usize>) {
    let n = p.buffers.len();
    let (mut first, mut last) = (vec![usize::MAX; n], vec![0usize; n]);
    for (ki, k) in p.kernels.iter().enumerate() {
        for b in k.reads().into_iter().chain(k.outputs.iter().copied()) {
            first[b.index()] = first[b.index()].min(ki);
            last[b.index()] = last[b.index()].max(ki);
        }
    }
    (first, last)
}

/// A training step's activation memory: the bytes of the temporaries that are written by the
/// time the kernel computing the loss (output `output`) runs and read after it — what the
/// forward pass keeps for the backward.
fn saved_bytes(lowered: &oar::cpu::lower::Lowered) -> Res<usize> {
    let (p, plan) = (&lowered.cpu.program, &lowered.cpu.plan);
    let loss = p
        .outputs
        .iter()
        .find(|(n, _)| n == "output")
        .map(|(_, b)| *b)
        .ok_or("the step has no `output`")?;
    let at = p
        .kernels
        .iter()
        .position(|k| k.outputs.contains(&loss))
        .ok_or("no kernel computes the loss")?;
    let (first, last) = lifetimes(p);
    Ok(plan
        .sizes
        .iter()
        .filter(|(b, _)| first[b.index()] <= at && last[b.index()] > at)
        .map(|(_, s)| s)
        .sum())
}

fn resnet18(runs: usize) -> Res<()> {
    oar::seed(0);
    let mut model = oar::vision::models::resnet18(1000)?;
    model.eval();
    let x = oar::randn(&[1, 3, 224, 224], DType::F32)?;
    let f = to_static_layer(
        &model,
        &InputSpec::new(&[Some(1), Some(3), Some(224), Some(224)], DType::F32, "x"),
    )?;
    let weights = f.weights();
    let inputs = BTreeMap::from([("x".to_string(), x.data())]);
    let backend = oar::backend::get("cpu")?;
    let mut graphs = Vec::new();
    let mut exes = Vec::new();
    for (_, dtype) in PRECISIONS {
        let mut graph = f.graph().clone();
        if let Some(d) = dtype {
            Amp::parse(if d == DType::BF16 { "bf16" } else { "f16" })?.run(&mut graph)?;
        }
        exes.push(backend.compile(&graph, &weights)?);
        graphs.push(graph);
    }
    if oar_cpu_runtime::profile::enabled() {
        // Per kernel, one precision at a time (the profile does not tell them apart).
        for ((name, _), exe) in PRECISIONS.iter().zip(&exes) {
            let _ = oar_cpu_runtime::profile::take();
            median_ms(2, runs, || exe.run(&inputs).map(|_| ()))?;
            eprintln!("== resnet18 {name}: per kernel\n{}", oar_cpu_runtime::profile::report());
        }
    }
    let inputs = &inputs;
    let mut calls: Vec<_> = exes.iter().map(|exe| move || exe.run(inputs).map(|_| ())).collect();
    let mut fs: Vec<&mut dyn FnMut() -> std::result::Result<(), _>> = calls.iter_mut().map(|f| f as _).collect();
    let ms = interleaved_medians_ms(2, runs, &mut fs)?;
    for (((name, _), graph), ms) in PRECISIONS.iter().zip(&graphs).zip(ms) {
        println!("resnet18_infer {name} {ms:.4} {} 0", arena_bytes(graph)?);
    }
    Ok(())
}

fn train_step<L: Layer>(label: &str, make: fn() -> Result<L>, x_shape: &[usize], runs: usize) -> Res<()> {
    oar::seed(0);
    let x = oar::randn(x_shape, DType::F32)?;
    let batch = x_shape[0];
    let y = Tensor::from_vec((0..batch as i64).map(|i| i % 10).collect::<Vec<i64>>(), &[batch])?;
    let dims: Vec<Option<usize>> = x_shape.iter().map(|&d| Some(d)).collect();
    let specs = [
        InputSpec::new(&dims, DType::F32, "x"),
        InputSpec::new(&[Some(batch)], DType::I64, "y"),
    ];
    let mut steps = Vec::new();
    for (_, dtype) in PRECISIONS {
        oar::seed(1);
        let model = make()?;
        let mut opt = AdamW::new(model.named_parameters(), 1e-3);
        let step = to_static_train_step(&model, &mut opt, &specs, |xs| {
            let _amp = dtype.map(|d| amp::auto_cast(AmpLevel::O1, d)).transpose()?;
            cross_entropy(&model.forward(&xs[0])?, &xs[1], Reduction::Mean)
        })?
        .with_backend("cpu")?;
        steps.push(step);
    }
    let (x, y) = (&x, &y);
    let mut calls: Vec<_> = steps
        .iter()
        .map(|step| move || step.call(&[x, y]).map(|_| ()))
        .collect();
    let mut fs: Vec<&mut dyn FnMut() -> Result<()>> = calls.iter_mut().map(|f| f as _).collect();
    let medians = interleaved_medians_ms(3, runs, &mut fs)?;
    for (((name, _), step), ms) in PRECISIONS.iter().zip(&steps).zip(medians) {
        // Lowered once for both memory figures (and the peak listing).
        let lowered = oar::cpu::lower::lower(step.graph(), &BTreeMap::new())?;
        println!(
            "{label}_train {name} {ms:.4} {} {}",
            lowered.cpu.plan.arena_bytes,
            saved_bytes(&lowered)?
        );
        if std::env::var("OAR_BENCH_PEAK").is_ok() {
            let p = &lowered.cpu.program;
            let plan = &lowered.cpu.plan;
            let (first, last) = lifetimes(p);
            let mut best = (0, 0);
            for ki in 0..p.kernels.len() {
                let live: usize = plan
                    .sizes
                    .iter()
                    .filter(|(b, _)| first[b.index()] <= ki && ki <= last[b.index()])
                    .map(|(_, s)| s)
                    .sum();
                if live > best.1 {
                    best = (ki, live);
                }
            }
            eprintln!(
                "peak at kernel {} ({}): {} bytes",
                best.0, p.kernels[best.0].name, best.1
            );
            let mut live: Vec<_> = plan
                .sizes
                .iter()
                .filter(|(b, _)| first[b.index()] <= best.0 && best.0 <= last[b.index()])
                .collect();
            live.sort_by_key(|(_, s)| std::cmp::Reverse(**s));
            for (b, s) in live.iter().take(25) {
                let buf = p.buffer(**b);
                eprintln!(
                    "  {s:>9} {} {} {:?} [{}..{}]",
                    buf.value,
                    buf.ty.dtype,
                    buf.ty.shape.0,
                    first[b.index()],
                    last[b.index()]
                );
            }
        }
    }
    if oar_cpu_runtime::profile::enabled() {
        for ((name, _), step) in PRECISIONS.iter().zip(&steps) {
            let _ = oar_cpu_runtime::profile::take();
            median_ms(1, runs, || step.call(&[x, y]).map(|_| ()))?;
            eprintln!("== {label} {name}: per kernel\n{}", oar_cpu_runtime::profile::report());
        }
    }
    Ok(())
}

fn main() -> Res<()> {
    resnet18(15)?;
    train_step("mlp", mlp, &[64, 784], 41)?;
    train_step("lenet", lenet, &[64, 1, 28, 28], 21)?;
    Ok(())
}
