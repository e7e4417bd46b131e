//! Training in about ten lines with the high-level API: a small CNN on the shipped UCI digits
//! with `oar::Model` — `prepare` (Adam, cross-entropy, top-1 accuracy), `fit` with a progress
//! bar and a callback that draws the loss and accuracy curves as SVG, then `evaluate` on the
//! held-out digits. The user code is the part between the `user code` markers: a test counts
//! its lines (at most 15). Exits non-zero unless test accuracy reaches 95%.
//!
//! `cargo run --release --example fit_digits [PLOT_DIR]` (default `target/demo/plots`).

use oar::hapi::callbacks::PlotCurves;
use oar::io::DataLoader;
use oar::io::datasets::{Digits, Split};
use oar::metric::Accuracy;
use oar::nn::functional::{Reduction, cross_entropy};
use oar::nn::{Conv2D, Flatten, Layer, Linear, MaxPool2D, ReLU, Sequential};
use oar::optimizer::Adam;
use oar::{Model, Result};

fn main() -> Result<()> {
    let plots = std::env::args().nth(1).unwrap_or_else(|| "target/demo/plots".into());
    // user code begin
    oar::seed(0);
    let net = Sequential::new()
        .add(Conv2D::new(1, 16, 3)?.padding(1))
        .add(ReLU)
        .add(MaxPool2D::new(2).stride(2))
        .add(Flatten::new(1, -1))
        .add(Linear::new(16 * 4 * 4, 10)?);
    let opt = Adam::new(net.named_parameters(), 1e-2);
    let mut model = Model::new(net);
    model.prepare(
        opt,
        |y, t| cross_entropy(y, t, Reduction::Mean),
        vec![Box::new(Accuracy::new())],
    );
    let train = DataLoader::new(Digits::new(Split::Train)?)
        .batch_size(32)
        .shuffle(true)
        .seed(0);
    let test = DataLoader::new(Digits::new(Split::Test)?).batch_size(120);
    model
        .verbose(true)
        .fit_with(&train, Some(&test), 8, &mut [&mut PlotCurves::new(&plots)])?;
    let acc = model.evaluate(&test)?["acc_top1"];
    // user code end
    println!(
        "test accuracy {:.2}% on 360 held-out digits; curves in {plots}/loss.svg and {plots}/acc_top1.svg",
        acc * 100.0
    );
    if acc < 0.95 {
        return Err(oar::Error::invalid(
            "fit_digits",
            format!("test accuracy {acc:.3} is below 0.95"),
        ));
    }
    Ok(())
}
