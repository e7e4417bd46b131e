//! ResNet-18 on CIFAR-10 with `oar::Model`: the binary CIFAR-10 files when they are in
//! `$OAR_DATA_DIR/cifar-10-batches-bin` (or the directory given), else a synthetic set in the
//! same format (ten classes of colored, oriented stripes under noise), written to a temporary
//! directory and read back through the same reader. Training augments with a padded random
//! crop and a horizontal flip (per-sample seeded, so any worker count gives the same batches),
//! loads on two worker threads, and runs the step compiled (`to_static`).
//!
//! `cargo run --release --example fit_cifar [CIFAR_DIR] [--epochs N] [--limit N] [--eager]`
//! (default 3 epochs; `--limit` trains on the first N images; `--eager` skips `to_static`). The
//! synthetic set has 2,000 training and 500 test images; on it the example fails below 80% test
//! accuracy after 3 or more epochs (it reaches about 90%).

use oar::io::datasets::{Cifar10, Split, Transformed};
use oar::io::{DataLoader, Dataset, Subset};
use oar::metric::Accuracy;
use oar::nn::Layer;
use oar::nn::functional::{Reduction, cross_entropy};
use oar::optimizer::Momentum;
use oar::vision::models::resnet18;
use oar::vision::transforms::{Compose, Normalize, Pad, PadMode, RandomCrop, RandomHorizontalFlip};
use oar::{Model, Result};
use std::path::{Path, PathBuf};

const MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
const STD: [f32; 3] = [0.247, 0.243, 0.261];

/// Write `n` synthetic CIFAR-10 records to `path`: class `c` is a stripe pattern with its own
/// color and angle, shifted at random, plus noise.
fn synthetic(path: &Path, n: usize, seed: u64) -> std::io::Result<()> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as f32 / (1u64 << 31) as f32
    };
    let mut bytes = Vec::with_capacity(n * 3073);
    for i in 0..n {
        let class = i % 10;
        let angle = class as f32 * std::f32::consts::PI / 10.0;
        let (dx, dy) = (angle.cos(), angle.sin());
        let shift = next() * 6.0;
        bytes.push(class as u8);
        for ch in 0..3 {
            let tint = ((class * 3 + ch) % 7) as f32 / 6.0;
            for y in 0..32 {
                for x in 0..32 {
                    let stripe = ((x as f32 * dx + y as f32 * dy + shift) * 0.8).sin() * 0.5 + 0.5;
                    let v = 0.6 * stripe * tint + 0.2 + 0.25 * next();
                    bytes.push((v.clamp(0.0, 1.0) * 255.0) as u8);
                }
            }
        }
    }
    std::fs::write(path, bytes)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let epochs = flag("--epochs").unwrap_or(3);
    let limit = flag("--limit");
    let dir = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .unwrap_or_else(|| oar::io::datasets::data_dir().join("cifar-10-batches-bin"));
    let tmp;
    let real = dir.join("data_batch_1.bin").exists();
    let (train, test) = if real {
        println!("CIFAR-10 from {}", dir.display());
        (
            Cifar10::from_dir(&dir, Split::Train)?,
            Cifar10::from_dir(&dir, Split::Test)?,
        )
    } else {
        tmp = tempfile::tempdir().map_err(|e| oar::Error::invalid("fit_cifar", e.to_string()))?;
        let write = |name: &str, n, seed| {
            let p = tmp.path().join(name);
            synthetic(&p, n, seed)
                .map(|_| p)
                .map_err(|e| oar::Error::invalid("fit_cifar", e.to_string()))
        };
        let (tr, te) = (write("train.bin", 2000, 1)?, write("test.bin", 500, 2)?);
        println!(
            "no CIFAR-10 files in {}: a synthetic set in the same format",
            dir.display()
        );
        (Cifar10::from_binary(&[tr])?, Cifar10::from_binary(&[te])?)
    };
    let n = limit.unwrap_or(train.len()).min(train.len());
    let train = Subset::new(train, (0..n).collect())?;
    let augment = Compose(vec![
        Box::new(RandomCrop::new(32, 32).padding(Pad::new(4, 4, 4, 4, PadMode::Constant(0.0)))),
        Box::new(RandomHorizontalFlip::new(0.5)?),
        Box::new(Normalize::new(&MEAN, &STD)?),
    ]);
    let train = DataLoader::new(Transformed::new(train, augment))
        .batch_size(64)
        .shuffle(true)
        .seed(0)
        .num_workers(2);
    // fit takes one dataset type for both loaders: the test set is a (whole) Subset too.
    let all = (0..test.len()).collect();
    let test_set = Transformed::new(Subset::new(test, all)?, Normalize::new(&MEAN, &STD)?);
    println!("{} training, {} test images", train.dataset().len(), test_set.len());
    let test = DataLoader::new(test_set).batch_size(250);

    oar::seed(0);
    let net = resnet18(10)?;
    let opt = Momentum::new(net.named_parameters(), 0.05).momentum(0.9);
    let mut model = Model::new(net);
    model.prepare(
        opt,
        |y, t| cross_entropy(y, t, Reduction::Mean),
        vec![Box::new(Accuracy::new())],
    );
    if !args.iter().any(|a| a == "--eager") {
        model.to_static(true)?;
    }
    let history = model.fit(&train, Some(&test), epochs)?;
    for h in &history {
        println!(
            "epoch {}: train loss {:.3}, test loss {:.3}, test accuracy {:.1}%",
            h.epoch + 1,
            h.train["loss"],
            h.eval["loss"],
            100.0 * h.eval["acc_top1"]
        );
    }
    // The synthetic classes are easy: three epochs on all of them reach about 90%.
    let acc = history.last().map_or(0.0, |h| h.eval["acc_top1"]);
    if !real && limit.is_none() && epochs >= 3 && acc < 0.8 {
        return Err(oar::Error::invalid(
            "fit_cifar",
            format!("synthetic test accuracy {acc:.3} is below 0.8"),
        ));
    }
    Ok(())
}
