//! Accuracy of a classifier's saved outputs: `score LOGITS.npy LABELS.npy` prints how many
//! rows' argmax equals the label. The main job uses it on the outputs of the native
//! executable `oar compile` made.

use oar::ir::npy::read_npy;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let [logits, labels] = args.as_slice() else {
        return Err("usage: score LOGITS.npy LABELS.npy".into());
    };
    let (logits, labels) = (read_npy(logits)?, read_npy(labels)?);
    let (rows, classes) = match logits.shape() {
        [r, c] => (*r, *c),
        s => return Err(format!("logits must be [rows, classes], got {s:?}").into()),
    };
    let labels = labels.to_f64_vec();
    if labels.len() != rows {
        return Err(format!("{rows} rows of logits but {} labels", labels.len()).into());
    }
    let values = logits.to_f64_vec();
    let right = values
        .chunks(classes)
        .zip(&labels)
        .filter(|(row, label)| {
            let best = row
                .iter()
                .enumerate()
                .fold((0, f64::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b });
            best.0 as f64 == **label
        })
        .count();
    println!(
        "accuracy of the compiled executable: {right}/{rows} = {:.2}%",
        100.0 * right as f64 / rows as f64
    );
    Ok(())
}
