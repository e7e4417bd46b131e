//! One step to static: a CNN whose `forward` carries `#[oar::to_static]` trains on the digits
//! eagerly; `jit::save` traces that forward into a graph with a symbolic batch dim and writes
//! it with the weights; `jit::load` brings it back as an eager layer that keeps training and is
//! saved again. `scripts/demo.sh` then inspects and runs the saved file with the `oar` CLI.

use oar::io::DataLoader;
use oar::io::datasets::{Digits, Split};
use oar::jit::{InputSpec, TranslatedLayer};
use oar::nn::functional::{self as F, cross_entropy};
use oar::nn::{BatchNorm2D, Conv2D, Layer, Linear, Reduction};
use oar::optimizer::{Adam, Optimizer};
use oar::{DType, Result, Tensor};

/// conv 3×3 → batch norm → relu → max-pool 2 → linear.
struct DigitsCnn {
    conv: Conv2D,
    bn: BatchNorm2D,
    fc: Linear,
}

impl Layer for DigitsCnn {
    #[oar::to_static]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = F::relu(&self.bn.forward(&self.conv.forward(x)?)?)?;
        let h = F::max_pool2d(&h, 2, None, 0, false)?.flatten(1, -1)?;
        self.fc.forward(&h)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("conv".into(), &self.conv),
            ("bn".into(), &self.bn),
            ("fc".into(), &self.fc),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("conv".into(), &mut self.conv),
            ("bn".into(), &mut self.bn),
            ("fc".into(), &mut self.fc),
        ]
    }
}
use std::path::PathBuf;

fn accuracy(model: &dyn Layer) -> Result<f64> {
    let _g = oar::no_grad();
    let (mut right, mut total) = (0, 0);
    for batch in &DataLoader::new(Digits::new(Split::Test)?).batch_size(120) {
        let (x, y) = batch?;
        let pred = model.forward(&x)?.argmax(-1, false)?.to_vec::<i64>()?;
        right += pred.iter().zip(y.to_vec::<i64>()?).filter(|(p, w)| **p == *w).count();
        total += pred.len();
    }
    Ok(right as f64 / total as f64)
}

fn train(model: &mut dyn Layer, epochs: usize, lr: f64) -> Result<f64> {
    model.train();
    let mut opt = Adam::new(model.parameters(), lr);
    let data = DataLoader::new(Digits::new(Split::Train)?)
        .batch_size(64)
        .shuffle(true)
        .seed(1);
    let mut last = 0.0;
    for _ in 0..epochs {
        for batch in &data {
            let (x, y) = batch?;
            let loss = cross_entropy(&model.forward(&x)?, &y, Reduction::Mean)?;
            loss.backward()?;
            opt.step()?;
            opt.clear_grad();
            last = loss.item()?;
        }
    }
    model.eval();
    Ok(last)
}

fn main() -> Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "target/demo".into()));
    std::fs::create_dir_all(&dir).map_err(|e| oar::Error::Io {
        path: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    oar::seed(0);
    let mut model = DigitsCnn {
        conv: Conv2D::new(1, 8, 3)?.padding(1),
        bn: BatchNorm2D::new(8)?,
        fc: Linear::new(8 * 4 * 4, 10)?,
    };
    let loss = train(&mut model, 3, 1e-2)?;
    println!(
        "eager CNN: 3 epochs, last loss {loss:.4}, test accuracy {:.2}%",
        accuracy(&model)? * 100.0
    );

    let spec = InputSpec::new(&[None, Some(1), Some(8), Some(8)], DType::F32, "image");
    let path = dir.join("digits_cnn.oar");
    oar::jit::save(&model, &path, &spec)?;
    println!(
        "jit::save → {} (graph input {})",
        path.display(),
        spec.dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("×")
    );

    let mut loaded: TranslatedLayer = oar::jit::load(&path)?;
    println!(
        "jit::load → TranslatedLayer with {} trainable tensors; test accuracy {:.2}%",
        loaded.parameters().len(),
        accuracy(&loaded)? * 100.0
    );
    let loss = train(&mut loaded, 2, 2e-3)?;
    let acc = accuracy(&loaded)?;
    println!(
        "fine-tuned the loaded model 2 more epochs: last loss {loss:.4}, test accuracy {:.2}%",
        acc * 100.0
    );
    let tuned = dir.join("digits_cnn_tuned.oar");
    loaded.save(&tuned)?;
    println!("saved again → {}", tuned.display());

    // An input file for `oar run`: the first 4 test digits.
    let (x, y) = DataLoader::new(Digits::new(Split::Test)?)
        .batch_size(4)
        .iter()
        .next()
        .expect("a batch")?;
    x.save_npy(dir.join("digits4.npy"))?;
    println!(
        "wrote {} (labels {:?})",
        dir.join("digits4.npy").display(),
        y.to_vec::<i64>()?
    );
    // The whole held-out split for the compiled executable: images, labels and their count
    // (the batch size `oar compile --bind N=...` specializes the executable to).
    let test = Digits::new(Split::Test)?;
    let n = oar::io::Dataset::len(&test);
    let (x, y) = DataLoader::new(test).batch_size(n).iter().next().expect("a batch")?;
    x.save_npy(dir.join("digits_test.npy"))?;
    y.save_npy(dir.join("digits_test_labels.npy"))?;
    std::fs::write(dir.join("digits_test.count"), n.to_string()).map_err(|e| oar::Error::Io {
        path: dir.join("digits_test.count").display().to_string(),
        detail: e.to_string(),
    })?;
    println!(
        "wrote {} ({n} held-out digits) and their labels",
        dir.join("digits_test.npy").display()
    );
    // 256 training digits to calibrate post-training quantization on (`oar quantize`).
    let (x, _) = DataLoader::new(Digits::new(Split::Train)?)
        .batch_size(256)
        .iter()
        .next()
        .expect("a batch")?;
    x.save_npy(dir.join("digits_calib.npy"))?;
    println!(
        "wrote {} (256 training digits, for calibration)",
        dir.join("digits_calib.npy").display()
    );
    if acc < 0.9 {
        return Err(oar::Error::invalid(
            "to_static example",
            format!("accuracy {acc} is too low"),
        ));
    }
    Ok(())
}
