//! CIFAR-10 in its binary format: records of 1 label byte (0..=9) and 3072 pixel bytes
//! (1024 red, 1024 green, 1024 blue, each a row-major 32×32 plane).

use super::files::{MAX_PAYLOAD, io_error, open};
use super::{Split, image_sample};
use crate::error::Result;
use crate::io::dataset::{Dataset, out_of_range};
use crate::tensor::Tensor;
use std::path::Path;

/// Bytes per record: label + 3 × 32 × 32 pixels.
const RECORD: usize = 1 + 3 * 32 * 32;

/// CIFAR-10 images and labels: samples are f32 `[3, 32, 32]` in `[0, 1]` (pixel / 255) and i64
/// scalar labels 0..=9.
pub struct Cifar10 {
    /// Whole records, as in the files.
    records: Vec<u8>,
}

impl Cifar10 {
    /// Read and concatenate binary batch files (`data_batch_1.bin`, ...); gzip is accepted.
    pub fn from_binary<P: AsRef<Path>>(paths: &[P]) -> Result<Cifar10> {
        let mut records = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let file = open(path)?;
            if let Some(len) = file.raw_len()
                && (len == 0 || len % RECORD as u64 != 0)
            {
                return Err(io_error(
                    path,
                    format!("{len} bytes is not a whole number of {RECORD}-byte CIFAR-10 records (truncated?)"),
                ));
            }
            let bytes = file.read_all(path, MAX_PAYLOAD)?;
            if bytes.is_empty() || bytes.len() % RECORD != 0 {
                return Err(io_error(
                    path,
                    format!(
                        "{} bytes is not a whole number of {RECORD}-byte CIFAR-10 records (truncated?)",
                        bytes.len()
                    ),
                ));
            }
            if let Some((i, rec)) = bytes.chunks_exact(RECORD).enumerate().find(|(_, r)| r[0] > 9) {
                return Err(io_error(
                    path,
                    format!("record {i} has label {}; CIFAR-10 labels are 0..=9", rec[0]),
                ));
            }
            records.extend_from_slice(&bytes);
        }
        Ok(Cifar10 { records })
    }

    /// Load a split from the extracted `cifar-10-batches-bin` directory.
    pub fn from_dir(dir: impl AsRef<Path>, split: Split) -> Result<Cifar10> {
        let names: Vec<String> = match split {
            Split::Train => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
            Split::Test => vec!["test_batch.bin".to_string()],
        };
        let paths: Vec<_> = names.iter().map(|n| dir.as_ref().join(n)).collect();
        Cifar10::from_binary(&paths)
    }

    /// The class names, indexed by label.
    pub const CLASSES: [&'static str; 10] = [
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    ];
}

impl Dataset for Cifar10 {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.records.len() / RECORD
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        if index >= self.len() {
            return Err(out_of_range("Cifar10", index, self.len()));
        }
        let rec = &self.records[index * RECORD..(index + 1) * RECORD];
        image_sample(&rec[1..], &[3, 32, 32], 255.0, rec[0] as i64)
    }
}
