//! Training throughput: one step (forward, cross-entropy, backward, AdamW) of an MLP and of
//! LeNet-5 (batch 64) and of ResNet-18 on CIFAR-sized images (batch 32; `OAR_BENCH_RESNET=0`
//! skips it), traced with `jit::to_static_train_step` and run compiled on the `cpu`
//! backend, next to the same step in oar's eager mode. `bench/train_step.sh` runs this and
//! `bench/train_step_torch.py` (PyTorch eager, same shapes) in one run and prints the ratios.
//!
//! Prints one line per model: `name static_ms eager_ms` (medians).

#[path = "models.rs"]
mod models;
#[path = "timing.rs"]
mod timing;
use models::{lenet, mlp};
use oar::jit::{InputSpec, to_static_train_step};
use oar::nn::functional::cross_entropy;
use oar::nn::{Layer, Reduction};
use oar::optimizer::{AdamW, Optimizer};
use oar::{DType, Result, Tensor};
use timing::median_ms;

const BATCH: usize = 64;

fn bench<L: Layer>(name: &str, make: fn() -> Result<L>, x_shape: &[usize], runs: usize) -> Result<()> {
    oar::seed(0);
    let x = oar::randn(x_shape, DType::F32)?;
    let batch = x_shape[0];
    let y = Tensor::from_vec((0..batch as i64).map(|i| i % 10).collect::<Vec<i64>>(), &[batch])?;

    let eager = make()?;
    let mut opt = AdamW::new(eager.named_parameters(), 1e-3);
    let eager_ms = median_ms(3, runs, || -> Result<()> {
        let loss = cross_entropy(&eager.forward(&x)?, &y, Reduction::Mean)?;
        loss.backward()?;
        opt.step()?;
        opt.clear_grad();
        Ok(())
    })?;

    let model = make()?;
    let mut opt = AdamW::new(model.named_parameters(), 1e-3);
    // A static batch: conv's weight gradient convolves over the batch axis, and conv
    // channels must be static, so a symbolic batch cannot trace through LeNet's backward.
    let dims: Vec<Option<usize>> = x_shape.iter().map(|&d| Some(d)).collect();
    let specs = [
        InputSpec::new(&dims, DType::F32, "x"),
        InputSpec::new(&[Some(x_shape[0])], DType::I64, "y"),
    ];
    let step = to_static_train_step(&model, &mut opt, &specs, |xs| {
        cross_entropy(&model.forward(&xs[0])?, &xs[1], Reduction::Mean)
    })?
    .with_backend("cpu")?;
    if let Ok(dir) = std::env::var("OAR_BENCH_SAVE") {
        step.save(std::path::Path::new(&dir).join(format!("{name}_train_step.oar")))?;
    }
    // The profile covers the compiled step alone (eager ops above ran one-op programs too).
    let _ = oar_cpu_runtime::profile::take();
    let static_ms = median_ms(3, runs, || -> Result<()> {
        step.call(&[&x, &y])?;
        Ok(())
    })?;
    if oar_cpu_runtime::profile::enabled() {
        // OAR_CPU_PROFILE=1: where the compiled step's time goes, per kernel (stderr).
        eprintln!(
            "== {name}: compiled step, per kernel\n{}",
            oar_cpu_runtime::profile::report()
        );
    }
    println!("{name} {static_ms:.4} {eager_ms:.4}");
    Ok(())
}

fn main() -> Result<()> {
    bench("mlp", mlp, &[BATCH, 784], 41)?;
    bench("lenet", lenet, &[BATCH, 1, 28, 28], 21)?;
    if std::env::var("OAR_BENCH_RESNET").as_deref() != Ok("0") {
        bench("resnet18", || oar::vision::models::resnet18(10), &[32, 3, 32, 32], 5)?;
    }
    Ok(())
}
