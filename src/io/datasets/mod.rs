//! Ready-made datasets: the shipped UCI [`Digits`], readers for [`Mnist`] and [`FashionMnist`]
//! (IDX files), [`Cifar10`] and [`Cifar100`] (binary batches), [`ImageFolder`] (a directory per
//! class) and [`TextClassification`] (`label<TAB>text` lines, with a [`Vocab`] and
//! [`tokenize`]). Image samples are `(image, label)`: an f32 image `[C, H, W]` scaled to `[0, 1]`
//! and an i64 scalar label. Nothing is downloaded: a data set whose files are absent is an error
//! saying which files to put where.

mod cifar;
mod digits;
mod files;
mod folder;
mod mnist;
mod text;

pub use cifar::{Cifar10, Cifar100};
pub use digits::Digits;
pub use folder::{ImageFolder, Transformed};
pub use mnist::{FashionMnist, Mnist, read_idx_u8};
pub use text::{TextClassification, Vocab, tokenize};

use crate::error::Result;
use crate::tensor::Tensor;
use std::path::PathBuf;

/// Which part of a dataset to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training part.
    Train,
    /// The held-out test part.
    Test,
}

/// Where shipped and downloaded data live: `$OAR_DATA_DIR` if set, else the repository's `data/`.
pub fn data_dir() -> PathBuf {
    match std::env::var_os("OAR_DATA_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data"),
    }
}

/// An `(image, label)` sample from `u8` pixels: f32 `shape` scaled by `1/scale`, i64 label.
fn image_sample(pixels: &[u8], shape: &[usize], scale: f32, label: i64) -> Result<(Tensor, Tensor)> {
    let v: Vec<f32> = pixels.iter().map(|&p| p as f32 / scale).collect();
    Ok((Tensor::from_vec(v, shape)?, Tensor::scalar(label)))
}
