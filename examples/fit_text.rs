//! A text classifier with `oar::Model`: a `label<TAB>text` file read by
//! `TextClassification` (tokenized, a vocabulary built from the training file, padded to 16
//! ids), a bidirectional LSTM classifier from the zoo (`oar::text::models`), trained with
//! `fit` and evaluated on a held-out file. Without arguments the files are synthetic movie
//! reviews (positive and negative words among neutral ones) written to a temporary
//! directory; the example then fails below 90% test accuracy.
//!
//! `cargo run --release --example fit_text [TRAIN.tsv TEST.tsv] [--epochs N]`

use oar::io::DataLoader;
use oar::io::datasets::TextClassification;
use oar::metric::Accuracy;
use oar::nn::Layer;
use oar::nn::functional::{Reduction, cross_entropy};
use oar::optimizer::Adam;
use oar::text::models::{LstmClassifier, Pooling, RnnClassifierConfig};
use oar::{Model, Result};
use std::path::{Path, PathBuf};

const POSITIVE: [&str; 8] = [
    "good",
    "great",
    "excellent",
    "fun",
    "loved",
    "wonderful",
    "best",
    "enjoyed",
];
const NEGATIVE: [&str; 8] = ["bad", "awful", "boring", "hated", "worst", "poor", "dull", "terrible"];
const NEUTRAL: [&str; 12] = [
    "the", "movie", "plot", "actors", "was", "a", "and", "it", "this", "film", "story", "very",
];

/// `n` synthetic reviews: 6 to 12 words, one to three of them from the label's list.
fn reviews(path: &Path, n: usize, seed: u64) -> std::io::Result<()> {
    let mut state = seed;
    let mut next = move |k: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % k as u64) as usize
    };
    let mut text = String::new();
    for i in 0..n {
        let positive = i % 2 == 0;
        let len = 6 + next(7);
        let mut words: Vec<&str> = (0..len).map(|_| NEUTRAL[next(NEUTRAL.len())]).collect();
        for _ in 0..1 + next(3) {
            let w = if positive { POSITIVE[next(8)] } else { NEGATIVE[next(8)] };
            let at = next(words.len() + 1);
            words.insert(at, w);
        }
        let label = if positive { "pos" } else { "neg" };
        text.push_str(&format!("{label}\t{}\n", words.join(" ")));
    }
    std::fs::write(path, text)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let epochs = args
        .iter()
        .position(|a| a == "--epochs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let files: Vec<&String> = args.iter().take_while(|a| !a.starts_with("--")).collect();
    let tmp = tempfile::tempdir().map_err(|e| oar::Error::invalid("fit_text", e.to_string()))?;
    let synthetic = files.len() < 2;
    let (train_path, test_path) = if synthetic {
        let (a, b) = (tmp.path().join("train.tsv"), tmp.path().join("test.tsv"));
        reviews(&a, 800, 1)
            .and_then(|_| reviews(&b, 200, 2))
            .map_err(|e| oar::Error::invalid("fit_text", e.to_string()))?;
        println!("synthetic reviews: 800 training, 200 test");
        (a, b)
    } else {
        (PathBuf::from(files[0]), PathBuf::from(files[1]))
    };
    let train = TextClassification::from_tsv(&train_path, 16, 1)?;
    let test = TextClassification::from_tsv_with(&test_path, 16, train.vocab().clone(), train.classes().to_vec())?;
    println!(
        "vocabulary of {} tokens, classes {:?}",
        train.vocab().len(),
        train.classes()
    );

    oar::seed(0);
    let net = LstmClassifier::new(&RnnClassifierConfig {
        vocab_size: train.vocab().len(),
        embed_dim: 16,
        hidden_size: 32,
        num_layers: 1,
        bidirectional: true,
        num_classes: train.classes().len(),
        pooling: Pooling::Mean,
    })?;
    let opt = Adam::new(net.named_parameters(), 1e-2);
    let mut model = Model::new(net);
    model.prepare(
        opt,
        |y, t| cross_entropy(y, t, Reduction::Mean),
        vec![Box::new(Accuracy::new())],
    );
    let train = DataLoader::new(train).batch_size(32).shuffle(true).seed(0);
    let test = DataLoader::new(test).batch_size(100);
    let history = model.fit(&train, Some(&test), epochs)?;
    let acc = history.last().map_or(0.0, |h| h.eval["acc_top1"]);
    println!("test accuracy after {epochs} epochs: {:.1}%", acc * 100.0);
    if synthetic && epochs >= 4 && acc < 0.9 {
        return Err(oar::Error::invalid(
            "fit_text",
            format!("test accuracy {acc:.3} is below 0.9"),
        ));
    }
    Ok(())
}
