//! Eager mode against PyTorch eager (`bench/eager.sh` runs this and `bench/eager_torch.py` in one
//! run and prints the ratios): the first call of an op on a new shape (oar compiles its kernel
//! then), per-op overhead, elementwise, unary and reduction ops at three
//! sizes, views (reshape/transpose/slice/expand, and an add reading a transpose), softmax and layer_norm, scaled-dot-product attention, the MLP and LeNet-5 training steps of `bench/train_step.rs`,
//! and an LSTM training step — all eager, f32.
//!
//! `bench_eager` prints one line per workload, `name milliseconds` (the median of several timed
//! repetitions after a warm-up); `bench_eager rss WORKLOAD` runs only that training step (20
//! steps, or `OAR_BENCH_STEPS`) and prints `rss_WORKLOAD megabytes`, the process's peak resident set.

#[path = "models.rs"]
mod models;
#[path = "timing.rs"]
mod timing;
use models::{lenet, mlp};
use oar::nn::functional::{self as F, cross_entropy};
use oar::nn::{LSTM, Layer, Reduction};
use oar::optimizer::{AdamW, Optimizer};
use oar::{DType, Result, Tensor};
use timing::median_ms;

const BATCH: usize = 64;

/// A training step closure for `name` (forward, loss, backward, AdamW step).
fn train_step(name: &str) -> Result<Box<dyn FnMut() -> Result<()>>> {
    oar::seed(0);
    let labels = || Tensor::from_vec((0..BATCH as i64).map(|i| i % 10).collect::<Vec<i64>>(), &[BATCH]);
    Ok(match name {
        "mlp" | "lenet" => {
            let (model, shape) = if name == "mlp" {
                (mlp()?, vec![BATCH, 784])
            } else {
                (lenet()?, vec![BATCH, 1, 28, 28])
            };
            let x = oar::randn(&shape, DType::F32)?;
            let y = labels()?;
            let mut opt = AdamW::new(model.named_parameters(), 1e-3);
            Box::new(move || {
                let loss = cross_entropy(&model.forward(&x)?, &y, Reduction::Mean)?;
                loss.backward()?;
                opt.step()?;
                opt.clear_grad();
                Ok(())
            })
        }
        "lstm" => {
            // One LSTM layer, 64 → 128, batch 16, 32 steps; loss = mean of the outputs.
            let lstm = LSTM::new(64, 128)?;
            let x = oar::randn(&[16, 32, 64], DType::F32)?;
            let mut opt = AdamW::new(lstm.named_parameters(), 1e-3);
            Box::new(move || {
                let (out, _) = lstm.forward_with_state(&x, None)?;
                out.mean(&[], false)?.backward()?;
                opt.step()?;
                opt.clear_grad();
                Ok(())
            })
        }
        other => {
            return Err(oar::Error::invalid(
                "bench_eager",
                format!("unknown workload `{other}`"),
            ));
        }
    })
}

/// Median milliseconds of `f`, repeated `reps` times per timed sample (for fast ops).
fn per_call(reps: usize, mut f: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    let samples = 15;
    let ms = median_ms(3, samples, || -> Result<()> {
        for _ in 0..reps {
            std::hint::black_box(f()?);
        }
        Ok(())
    })?;
    Ok(ms / reps as f64)
}

/// Milliseconds of one call of `f` (a first call: it includes compiling the op's kernel).
fn first_call(f: impl FnOnce() -> Result<Tensor>) -> Result<f64> {
    let t = std::time::Instant::now();
    std::hint::black_box(f()?);
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

fn ops() -> Result<()> {
    let one = oar::randn(&[1], DType::F32)?;
    let other = oar::randn(&[1], DType::F32)?;
    println!("overhead_add_1 {:.6}", per_call(2000, || oar::add(&one, &other))?);
    // First calls (after the warm-up above) on a shape nothing else uses: what compiling
    // an op's kernel costs.
    let (fa, fb) = (
        oar::randn(&[257, 129], DType::F32)?,
        oar::randn(&[257, 129], DType::F32)?,
    );
    println!("first_add_257x129 {:.6}", first_call(|| oar::add(&fa, &fb))?);
    println!("first_softmax_257x129 {:.6}", first_call(|| F::softmax(&fa, -1))?);
    println!(
        "first_layer_norm_257x129 {:.6}",
        first_call(|| F::layer_norm(&fa, 1, None, None, 1e-5))?
    );
    for (label, shape) in [("4k", [4usize, 1024]), ("64k", [64, 1024]), ("1m", [1024, 1024])] {
        let n = shape[0] * shape[1];
        let reps = (4_000_000 / n).clamp(2, 1000);
        let a = oar::randn(&shape, DType::F32)?;
        let b = oar::randn(&shape, DType::F32)?;
        println!("add_{label} {:.6}", per_call(reps, || oar::add(&a, &b))?);
        println!("mul_{label} {:.6}", per_call(reps, || oar::multiply(&a, &b))?);
        println!("tanh_{label} {:.6}", per_call(reps, || a.tanh())?);
        println!("exp_{label} {:.6}", per_call(reps, || a.exp())?);
        println!("relu_{label} {:.6}", per_call(reps, || F::relu(&a))?);
        println!("sum_rows_{label} {:.6}", per_call(reps, || a.sum(&[1], false))?);
        println!("mean_all_{label} {:.6}", per_call(reps, || a.mean(&[], false))?);
        // The rest of the elementwise / reduction families: more unary functions, a
        // comparison and a select, a max reduction, row and column broadcasts.
        let (row, col) = (
            oar::randn(&[1, 1024], DType::F32)?,
            oar::randn(&[shape[0], 1], DType::F32)?,
        );
        let mask = a.greater_than(&b)?;
        println!("sigmoid_{label} {:.6}", per_call(reps, || F::sigmoid(&a))?);
        println!("sin_{label} {:.6}", per_call(reps, || a.sin())?);
        println!("gelu_{label} {:.6}", per_call(reps, || F::gelu(&a, false))?);
        println!("maximum_{label} {:.6}", per_call(reps, || a.maximum(&b))?);
        println!("gt_{label} {:.6}", per_call(reps, || a.greater_than(&b))?);
        println!("where_{label} {:.6}", per_call(reps, || oar::where_(&mask, &a, &b))?);
        println!("max_rows_{label} {:.6}", per_call(reps, || a.max(&[1], false))?);
        println!("add_row_{label} {:.6}", per_call(reps, || oar::add(&a, &row))?);
        println!("add_col_{label} {:.6}", per_call(reps, || oar::add(&a, &col))?);
    }
    // Other dtypes at 1M: f64 add, and bf16 / f16 add and gelu (computed in f32 lanes).
    for (label, dtype) in [("f64", DType::F64), ("bf16", DType::BF16), ("f16", DType::F16)] {
        let a = oar::randn(&[1024, 1024], DType::F32)?.cast(dtype)?;
        let b = oar::randn(&[1024, 1024], DType::F32)?.cast(dtype)?;
        println!("add_{label}_1m {:.6}", per_call(4, || oar::add(&a, &b))?);
        if dtype != DType::F64 {
            println!("gelu_{label}_1m {:.6}", per_call(4, || F::gelu(&a, false))?);
        }
    }
    // Views (zero-copy in both): reshape, transpose, slice and expand of a 1024×1024 tensor,
    // then an add that reads a transpose.
    let a = oar::randn(&[1024, 1024], DType::F32)?;
    let b = oar::randn(&[1024, 1024], DType::F32)?;
    let row = oar::randn(&[1, 1024], DType::F32)?;
    println!(
        "views_1m {:.6}",
        per_call(1000, || {
            std::hint::black_box(a.reshape(&[-1])?);
            std::hint::black_box(a.t()?);
            std::hint::black_box(a.slice(1, 1, 513, 1)?);
            row.broadcast_to(&[1024, 1024])
        })?
    );
    println!("t_add_1m {:.6}", per_call(4, || oar::add(&a.t()?, &b))?);
    let x = oar::randn(&[512, 1024], DType::F32)?;
    let w = oar::ones(&[1024], DType::F32)?;
    let bias = oar::zeros(&[1024], DType::F32)?;
    println!("softmax_512x1024 {:.6}", per_call(5, || F::softmax(&x, -1))?);
    println!(
        "layer_norm_512x1024 {:.6}",
        per_call(5, || F::layer_norm(&x, 1, Some(&w), Some(&bias), 1e-5))?
    );
    // Scaled-dot-product attention, [batch 4, heads 8, sequence 128, head 64]: forward, causal
    // forward, and forward + backward to q, k and v.
    let qkv = || oar::randn(&[4, 8, 128, 64], DType::F32);
    let (q, k, v) = (qkv()?, qkv()?, qkv()?);
    let guard = oar::no_grad();
    println!(
        "sdpa_4x8x128x64 {:.6}",
        per_call(5, || F::scaled_dot_product_attention(&q, &k, &v, None, false, None))?
    );
    println!(
        "sdpa_causal_4x8x128x64 {:.6}",
        per_call(5, || F::scaled_dot_product_attention(&q, &k, &v, None, true, None))?
    );
    drop(guard);
    let (q, k, v) = (
        qkv()?.requires_grad_(true)?,
        qkv()?.requires_grad_(true)?,
        qkv()?.requires_grad_(true)?,
    );
    println!(
        "sdpa_grad_4x8x128x64 {:.6}",
        per_call(3, || {
            let o = F::scaled_dot_product_attention(&q, &k, &v, None, false, None)?;
            o.sum(&[], false)?.backward()?;
            Ok(o)
        })?
    );
    for name in ["mlp", "lenet", "lstm"] {
        let mut step = train_step(name)?;
        let runs = if name == "mlp" { 31 } else { 11 };
        println!("{name}_step {:.6}", median_ms(3, runs, &mut step)?);
    }
    Ok(())
}

/// Peak resident set of this process, in MB (Linux: `VmHWM` of /proc/self/status, in kB — what
/// `ru_maxrss`, which the PyTorch side reads, reports).
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => ops(),
        [op, name] if op == "op" => {
            // One op of `ops()` at 1M elements (OAR_BENCH_ROWS × 1024), repeated (OAR_BENCH_STEPS, default 2000): for a
            // profile (perf record) of that op alone.
            let reps = std::env::var("OAR_BENCH_STEPS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(2000);
            // OAR_BENCH_ROWS: rows of 1024 (default 1024: 1M elements).
            let rows = std::env::var("OAR_BENCH_ROWS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1024);
            let a = oar::randn(&[rows, 1024], DType::F32)?;
            let b = oar::randn(&[rows, 1024], DType::F32)?;
            let f = |a: &Tensor, b: &Tensor| -> Result<Tensor> {
                match name.as_str() {
                    "add" => oar::add(a, b),
                    "t_add" => oar::add(&a.t()?, b),
                    "relu" => F::relu(a),
                    "tanh" => a.tanh(),
                    "gelu" => F::gelu(a, false),
                    "sin" => a.sin(),
                    "gt" => a.greater_than(b),
                    "max_rows" => a.max(&[1], false),
                    "sum_rows" => a.sum(&[1], false),
                    "mean_all" => a.mean(&[], false),
                    "softmax" => F::softmax(a, -1),
                    "layer_norm" => F::layer_norm(a, 1, None, None, 1e-5),
                    other => Err(oar::Error::invalid("bench_eager", format!("unknown op `{other}`"))),
                }
            };
            for _ in 0..reps {
                std::hint::black_box(f(&a, &b)?);
            }
            Ok(())
        }
        [rss, name] if rss == "rss" => {
            let mut step = train_step(name)?;
            // OAR_BENCH_STEPS: more steps, for a profile of one workload (perf record).
            let steps = std::env::var("OAR_BENCH_STEPS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(20);
            for _ in 0..steps {
                step()?;
            }
            println!("rss_{name} {:.1}", peak_rss_mb());
            Ok(())
        }
        _ => Err(oar::Error::invalid(
            "bench_eager",
            "usage: bench_eager [rss mlp|lenet|lstm | op add|relu|tanh|sum_rows|mean_all|softmax|layer_norm]",
        )),
    }
}
