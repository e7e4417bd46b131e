//! GPU benchmarks of the PTX backend. `bench/gpu.sh` runs this next to `bench/gpu_torch.py`
//! (PyTorch on the same GPU) and prints the ratios; `scripts/gpu_check.sh` runs it on a lent
//! GPU machine. Prints `name value` lines:
//!
//! - `copy_gbs`: device-to-device copy bandwidth (`cuMemcpyDtoD`, bytes read + written / s).
//! - `fused_gbs`: the fused elementwise kernel `y = tanh(2x + 1) · x` over the same bytes
//!   (one read, one write per element), inputs resident; `fused_of_copy` = the fraction.
//! - `resnet18_b64_ms`: ResNet-18 inference, batch 64, 3×224×224 f32 (eval mode), input
//!   resident on the GPU, output left there.
//! - `mlp_train_ms`: one AdamW training step of an MLP 784-256-128-10, batch 64, traced with
//!   `to_static_train_step` and run by the `ptx` backend (parameters cross to the host each step:
//!   the functional step takes and returns them).
//! - `mlp_train_eager_ms`: the same step in eager mode with the model on `gpu:0`.
//!
//! Medians over several runs after warm-ups. `--dry-run DIR` needs no GPU: it builds every
//! graph, generates its PTX for sm_90 and writes `DIR/<name>.ptx` (for `ptxas`).

#[path = "models.rs"]
mod models;
#[path = "timing.rs"]
mod timing;
use models::mlp;
use oar::jit::{InputSpec, to_static_layer, to_static_train_step};
use oar::nn::functional::cross_entropy;
use oar::nn::{Layer, Reduction, Sequential};
use oar::optimizer::{AdamW, Optimizer};
use oar::{DType, Device, Tensor};
use oar_backend_ptx::runtime::{GpuMemory, GpuProgram};
use oar_backend_ptx::{Arch, compile_to_ptx};
use std::collections::BTreeMap;
use std::path::PathBuf;
use timing::median_ms;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Elements of the bandwidth test: 64 Mi f32 = 256 MiB in, 256 MiB out.
const ELEMENTS: usize = 64 << 20;
const BATCH: usize = 64;

fn fused_graph() -> Res<oar::ir::Graph> {
    let spec = InputSpec::new(&[Some(ELEMENTS)], DType::F32, "x");
    let f = oar::jit::to_static(|xs| Ok(vec![(&xs[0].scale(2.0, 1.0)?.tanh()? * &xs[0])?]), &[spec])?;
    Ok(f.graph().clone())
}

fn resnet18() -> Res<(oar::ir::Graph, oar::ir::Weights)> {
    let mut model = oar::vision::models::resnet18(1000)?;
    model.eval();
    let spec = InputSpec::new(&[Some(BATCH), Some(3), Some(224), Some(224)], DType::F32, "x");
    let f = to_static_layer(&model, &spec)?;
    Ok((f.graph().clone(), f.weights()))
}

fn mlp_train_step() -> Res<(Sequential, oar::jit::StaticFunction)> {
    let model = mlp()?;
    let mut opt = AdamW::new(model.named_parameters(), 1e-3);
    let specs = [
        InputSpec::new(&[Some(BATCH), Some(784)], DType::F32, "x"),
        InputSpec::new(&[Some(BATCH)], DType::I64, "y"),
    ];
    let step = to_static_train_step(&model, &mut opt, &specs, |xs| {
        cross_entropy(&model.forward(&xs[0])?, &xs[1], Reduction::Mean)
    })?;
    Ok((model, step))
}

fn batch() -> Res<(Tensor, Tensor)> {
    oar::seed(0);
    let x = oar::randn(&[BATCH, 784], DType::F32)?;
    let y = Tensor::from_vec((0..BATCH as i64).map(|i| i % 10).collect::<Vec<i64>>(), &[BATCH])?;
    Ok((x, y))
}

fn dry_run(dir: PathBuf) -> Res<()> {
    std::fs::create_dir_all(&dir)?;
    let (resnet, _) = resnet18()?;
    let (_, step) = mlp_train_step()?;
    for (name, graph) in [
        ("fused", fused_graph()?),
        ("resnet18_b64", resnet),
        ("mlp_train", step.graph().clone()),
    ] {
        let (program, module) = compile_to_ptx(&graph, &BTreeMap::new(), Arch::Sm90)?;
        std::fs::write(dir.join(format!("{name}.ptx")), module.text())?;
        println!(
            "{name}: {} kernels, {} launched, {} on the host",
            program.kernels.len(),
            module.entries.len(),
            module.host_steps().len()
        );
    }
    Ok(())
}

/// A graph loaded on the GPU with random inputs resident there, run without host copies.
struct Resident {
    program: GpuProgram,
    /// Input pointers by name (into `_inputs`, which keeps them allocated).
    ptrs: BTreeMap<String, u64>,
    _inputs: Vec<GpuMemory>,
}

impl Resident {
    fn load(graph: &oar::ir::Graph, weights: &oar::ir::Weights, arch: Arch) -> Res<Resident> {
        let (program, module) = compile_to_ptx(graph, &BTreeMap::new(), arch)?;
        let (mut ptrs, mut inputs) = (BTreeMap::new(), Vec::new());
        for (name, ty) in graph.input_specs() {
            let shape = ty.shape.as_static().ok_or("static shapes")?;
            oar::seed(1);
            let m = GpuMemory::upload(oar::randn(&shape, ty.dtype)?.data().bytes(), &name)?;
            ptrs.insert(name, m.ptr());
            inputs.push(m);
        }
        let program = GpuProgram::load(program, module, weights)?;
        Ok(Resident {
            program,
            ptrs,
            _inputs: inputs,
        })
    }

    fn run(&self) -> Res<()> {
        self.program.run_resident(&self.ptrs)?;
        Ok(())
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench_gpu: {e}");
        std::process::exit(1);
    }
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--dry-run") {
        return dry_run(PathBuf::from(args.get(1).map_or("target/gpu-bench", String::as_str)));
    }
    let gpu = oar_backend_ptx::runtime::gpu()?;
    eprintln!("device: {} ({})", gpu.name, gpu.arch.name());

    // Copy bandwidth, then the fused kernel over the same bytes.
    let bytes = ELEMENTS * 4;
    let src = GpuMemory::upload(&vec![0u8; bytes], "copy source")?;
    let mut dst = GpuMemory::alloc(bytes, "copy destination")?;
    // A device-to-device copy returns before it is done: each timed copy waits for it.
    let copy_ms = median_ms(3, 20, || -> Res<()> {
        dst.copy_from(&src, "copy")?;
        Ok(oar_backend_ptx::runtime::synchronize()?)
    })?;
    let copy_gbs = 2.0 * bytes as f64 / (copy_ms * 1e-3) / 1e9;
    drop((src, dst));
    let graph = fused_graph()?;
    let fused = Resident::load(&graph, &BTreeMap::new(), gpu.arch)?;
    let fused_ms = median_ms(3, 20, || fused.run())?;
    let fused_gbs = 2.0 * bytes as f64 / (fused_ms * 1e-3) / 1e9;
    println!("copy_gbs {copy_gbs:.1}");
    println!("fused_gbs {fused_gbs:.1}");
    println!("fused_of_copy {:.3}", fused_gbs / copy_gbs);
    drop(fused);

    let (graph, weights) = resnet18()?;
    let resnet = Resident::load(&graph, &weights, gpu.arch)?;
    let ms = median_ms(2, 10, || resnet.run())?;
    println!("resnet18_b64_ms {ms:.3}");
    if oar_backend_ptx::runtime::profile::enabled() {
        // Where one run's time goes (OAR_GPU_PROFILE=1: every launch synchronized).
        oar_backend_ptx::runtime::profile::take();
        resnet.run()?;
        let rows = oar_backend_ptx::runtime::profile::take();
        let total: f64 = rows.iter().map(|r| r.total.as_secs_f64()).sum();
        println!("# resnet18 b64 kernels, one run, {:.2} ms in launches:", total * 1e3);
        for r in rows.iter().take(25) {
            println!(
                "#  {:8.3} ms {:5.1}% x{} grid {:?} block {:?} {}",
                r.total.as_secs_f64() * 1e3,
                100.0 * r.total.as_secs_f64() / total,
                r.calls,
                r.launch.0,
                r.launch.1,
                r.kernel
            );
        }
    }
    drop(resnet);

    let (x, y) = batch()?;
    let (_, step) = mlp_train_step()?;
    let step = step.with_backend("ptx")?;
    let ms = median_ms(3, 30, || -> Res<()> {
        step.call(&[&x, &y])?;
        Ok(())
    })?;
    println!("mlp_train_ms {ms:.3}");

    let dev = Device::gpu(0);
    let model = mlp()?;
    model.to(&dev)?;
    let (x, y) = (x.to(&dev)?, y.to(&dev)?);
    let mut opt = AdamW::new(model.named_parameters(), 1e-3);
    let ms = median_ms(3, 20, || -> Res<()> {
        let loss = cross_entropy(&model.forward(&x)?, &y, Reduction::Mean)?;
        loss.backward()?;
        opt.step()?;
        opt.clear_grad();
        Ok(())
    })?;
    println!("mlp_train_eager_ms {ms:.3}");
    Ok(())
}
