//! Train an MLP on the UCI handwritten digits (shipped in `data/digits/`, no download) in eager
//! mode: `Dataset` + `DataLoader`, `nn` layers, cross-entropy, Adam, and an indicatif progress
//! bar showing loss and accuracy. Exits non-zero unless test accuracy reaches 95%.

use indicatif::{ProgressBar, ProgressStyle};
use oar::io::DataLoader;
use oar::io::datasets::{Digits, Split};
use oar::nn::functional::cross_entropy;
use oar::nn::{Flatten, Layer, Linear, ReLU, Reduction, Sequential};
use oar::optimizer::{Adam, Optimizer};
use oar::{Result, Tensor};
use std::time::Instant;

const EPOCHS: usize = 12;
const BATCH: usize = 64;
const TARGET: f64 = 0.95;

/// Fraction of `labels` equal to the argmax of `logits`.
fn correct(logits: &Tensor, labels: &Tensor) -> Result<usize> {
    let pred = logits.argmax(-1, false)?.to_vec::<i64>()?;
    let want = labels.to_vec::<i64>()?;
    Ok(pred.iter().zip(&want).filter(|(p, w)| p == w).count())
}

fn evaluate(model: &mut Sequential, split: Split) -> Result<f64> {
    model.eval();
    let _g = oar::no_grad();
    let data = DataLoader::new(Digits::new(split)?).batch_size(256);
    let (mut right, mut total) = (0, 0);
    for batch in &data {
        let (x, y) = batch?;
        right += correct(&model.forward(&x)?, &y)?;
        total += y.numel();
    }
    model.train();
    Ok(right as f64 / total as f64)
}

fn main() -> Result<()> {
    oar::seed(0);
    let mut model = Sequential::new()
        .add(Flatten::new(1, -1))
        .add(Linear::new(64, 128)?)
        .add(ReLU)
        .add(Linear::new(128, 10)?);
    let params = model.parameters();
    let count: usize = params.iter().map(Tensor::numel).sum();
    println!("MLP 64-128-10: {} parameters in {} tensors", count, params.len());
    let mut opt = Adam::new(model.named_parameters(), 5e-3);
    let train = DataLoader::new(Digits::new(Split::Train)?)
        .batch_size(BATCH)
        .shuffle(true)
        .seed(0);

    let start = Instant::now();
    let bar = ProgressBar::new((EPOCHS * train.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("epoch {prefix:>2} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    for epoch in 1..=EPOCHS {
        bar.set_prefix(epoch.to_string());
        let (mut loss_sum, mut right, mut seen) = (0.0, 0, 0);
        for batch in &train {
            let (x, y) = batch?;
            let logits = model.forward(&x)?;
            let loss = cross_entropy(&logits, &y, Reduction::Mean)?;
            loss.backward()?;
            opt.step()?;
            opt.clear_grad();
            loss_sum += loss.item()? * y.numel() as f64;
            right += correct(&logits, &y)?;
            seen += y.numel();
            bar.set_message(format!(
                "loss {:.4}  train acc {:.3}",
                loss_sum / seen as f64,
                right as f64 / seen as f64
            ));
            bar.inc(1);
        }
    }
    bar.finish();
    let secs = start.elapsed().as_secs_f64();
    let acc = evaluate(&mut model, Split::Test)?;
    let steps = EPOCHS * train.len();
    println!(
        "trained {EPOCHS} epochs ({steps} steps) in {secs:.2}s, {:.2} ms per eager step on compiled \
         CPU kernels ({} compiled, {} threads); test accuracy {:.2}% (360 held-out digits)",
        1e3 * secs / steps as f64,
        oar::tensor::compiled_eager_ops(),
        rayon::current_num_threads(),
        acc * 100.0
    );
    if acc < TARGET {
        return Err(oar::Error::invalid(
            "mlp_digits",
            format!("test accuracy {acc:.3} is below {TARGET}"),
        ));
    }
    Ok(())
}
