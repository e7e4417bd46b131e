//! CIFAR-10 and CIFAR-100 in their binary formats: records of label bytes (CIFAR-10: one label
//! 0..=9; CIFAR-100: a coarse label 0..=19, then a fine label 0..=99) and 3072 pixel bytes
//! (1024 red, 1024 green, 1024 blue, each a row-major 32×32 plane).

use super::files::{MAX_PAYLOAD, io_error, open, plain_or_gz, require_files};
use super::{Split, image_sample};
use crate::error::Result;
use crate::io::dataset::{Dataset, out_of_range};
use crate::tensor::Tensor;
use std::path::{Path, PathBuf};

/// Pixel bytes per record: 3 × 32 × 32.
const PIXELS: usize = 3 * 32 * 32;

/// One binary CIFAR variant: label bytes per record and each label's bound.
struct Format {
    name: &'static str,
    /// Per label byte: its name and the number of classes.
    labels: &'static [(&'static str, u8)],
}

const CIFAR10: Format = Format {
    name: "CIFAR-10",
    labels: &[("label", 10)],
};

const CIFAR100: Format = Format {
    name: "CIFAR-100",
    labels: &[("coarse label", 20), ("fine label", 100)],
};

impl Format {
    fn record(&self) -> usize {
        self.labels.len() + PIXELS
    }

    /// Read and concatenate whole records from `paths` (gzip accepted), checking sizes and labels.
    fn read<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Vec<u8>> {
        let record = self.record();
        let not_whole = |path: &Path, len: u64| {
            io_error(
                path,
                format!(
                    "{len} bytes is not a whole number of {record}-byte {} records (truncated?)",
                    self.name
                ),
            )
        };
        let mut records = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let file = open(path)?;
            if let Some(len) = file.raw_len()
                && (len == 0 || len % record as u64 != 0)
            {
                return Err(not_whole(path, len));
            }
            let bytes = file.read_all(path, MAX_PAYLOAD)?;
            if bytes.is_empty() || bytes.len() % record != 0 {
                return Err(not_whole(path, bytes.len() as u64));
            }
            for (i, rec) in bytes.chunks_exact(record).enumerate() {
                for (&(what, classes), &label) in self.labels.iter().zip(rec) {
                    if label >= classes {
                        return Err(io_error(
                            path,
                            format!(
                                "record {i} has {what} {label}; {} {what}s are 0..={}",
                                self.name,
                                classes - 1
                            ),
                        ));
                    }
                }
            }
            records.extend_from_slice(&bytes);
        }
        Ok(records)
    }
}

/// CIFAR-10 images and labels: samples are f32 `[3, 32, 32]` in `[0, 1]` (pixel / 255) and i64
/// scalar labels 0..=9.
pub struct Cifar10 {
    /// Whole records, as in the files.
    records: Vec<u8>,
}

impl Cifar10 {
    /// Read and concatenate binary batch files (`data_batch_1.bin`, ...); gzip is accepted.
    pub fn from_binary<P: AsRef<Path>>(paths: &[P]) -> Result<Cifar10> {
        Ok(Cifar10 {
            records: CIFAR10.read(paths)?,
        })
    }

    /// Load a split from the extracted `cifar-10-batches-bin` directory; missing files are an
    /// error saying which to put there.
    pub fn from_dir(dir: impl AsRef<Path>, split: Split) -> Result<Cifar10> {
        let names: Vec<String> = match split {
            Split::Train => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
            Split::Test => vec!["test_batch.bin".to_string()],
        };
        Cifar10::from_binary(&files_in(dir.as_ref(), &names)?)
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

/// The paths of `names` in `dir`, after checking they are there.
fn files_in(dir: &Path, names: &[String]) -> Result<Vec<PathBuf>> {
    let source = "https://www.cs.toronto.edu/~kriz/cifar.html (the binary version)";
    require_files("CIFAR", dir, names, source)?;
    Ok(names.iter().map(|n| plain_or_gz(dir, n)).collect())
}

impl Dataset for Cifar10 {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.records.len() / CIFAR10.record()
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        if index >= self.len() {
            return Err(out_of_range("Cifar10", index, self.len()));
        }
        let r = CIFAR10.record();
        let rec = &self.records[index * r..(index + 1) * r];
        image_sample(&rec[1..], &[3, 32, 32], 255.0, rec[0] as i64)
    }
}

/// CIFAR-100 images with their fine labels 0..=99 (or, after
/// [`coarse_labels`](Cifar100::coarse_labels), their superclass labels 0..=19): samples are f32
/// `[3, 32, 32]` in `[0, 1]` and i64 scalar labels.
pub struct Cifar100 {
    records: Vec<u8>,
    coarse: bool,
}

impl Cifar100 {
    /// Read binary files (`train.bin`, `test.bin`); gzip is accepted.
    pub fn from_binary<P: AsRef<Path>>(paths: &[P]) -> Result<Cifar100> {
        Ok(Cifar100 {
            records: CIFAR100.read(paths)?,
            coarse: false,
        })
    }

    /// Load a split from the extracted `cifar-100-binary` directory; missing files are an
    /// error saying which to put there.
    pub fn from_dir(dir: impl AsRef<Path>, split: Split) -> Result<Cifar100> {
        let name = match split {
            Split::Train => "train.bin",
            Split::Test => "test.bin",
        };
        Cifar100::from_binary(&files_in(dir.as_ref(), &[name.to_string()])?)
    }

    /// Label samples with the 20 superclasses instead of the 100 classes.
    pub fn coarse_labels(mut self, on: bool) -> Cifar100 {
        self.coarse = on;
        self
    }
}

impl Dataset for Cifar100 {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.records.len() / CIFAR100.record()
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        if index >= self.len() {
            return Err(out_of_range("Cifar100", index, self.len()));
        }
        let r = CIFAR100.record();
        let rec = &self.records[index * r..(index + 1) * r];
        let label = if self.coarse { rec[0] } else { rec[1] };
        image_sample(&rec[2..], &[3, 32, 32], 255.0, label as i64)
    }
}
