//! The UCI handwritten digits (8×8, 1797 samples, 10 classes), shipped in `data/digits/`.

use super::files::{io_error, open};
use super::{Split, data_dir, image_sample};
use crate::error::Result;
use crate::io::dataset::{Dataset, out_of_range};
use crate::tensor::Tensor;
use std::path::{Path, PathBuf};

/// Samples in the shipped file.
const SAMPLES: usize = 1797;
/// Samples in the test split (about 20%); the other 1437 are for training.
const TEST_SAMPLES: usize = 360;
/// Seed of the fixed split. Changing it changes every reported digits result: don't.
const SPLIT_SEED: u64 = 2024;
/// The decompressed CSV is 264,712 bytes; anything far larger is not this file.
const MAX_CSV_BYTES: u64 = 16 << 20;

/// UCI handwritten digits: images f32 `[1, 8, 8]` in `[0, 1]` (pixel counts 0..=16 divided by
/// 16) and i64 scalar labels 0..=9, split into fixed train (1437) and test (360) parts.
pub struct Digits {
    /// Pixels 0..=16, 64 per sample.
    pixels: Vec<u8>,
    labels: Vec<i64>,
    /// Each sample's line number (0-based) in the CSV file.
    rows: Vec<usize>,
}

impl Digits {
    /// Load `split` from the shipped file ([`Digits::default_path`]).
    pub fn new(split: Split) -> Result<Digits> {
        Digits::from_path(Digits::default_path(), split)
    }

    /// `$OAR_DATA_DIR/digits/digits.csv.gz`, or `data/digits/digits.csv.gz` in the repository.
    pub fn default_path() -> PathBuf {
        data_dir().join("digits").join("digits.csv.gz")
    }

    /// Load `split` from a `digits.csv(.gz)` file: 1797 lines of 64 pixels and a label.
    pub fn from_path(path: impl AsRef<Path>, split: Split) -> Result<Digits> {
        let path = path.as_ref();
        let (pixels, labels) = parse_csv(path)?;
        let test = test_rows();
        let rows: Vec<usize> = (0..SAMPLES).filter(|r| test[*r] == (split == Split::Test)).collect();
        Ok(Digits {
            pixels: rows
                .iter()
                .flat_map(|&r| pixels[r * 64..(r + 1) * 64].iter().copied())
                .collect(),
            labels: rows.iter().map(|&r| labels[r]).collect(),
            rows,
        })
    }

    /// The labels, in sample order.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// Each sample's line (0-based) in the CSV file, increasing.
    pub fn rows(&self) -> &[usize] {
        &self.rows
    }
}

impl Dataset for Digits {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        let label = *self
            .labels
            .get(index)
            .ok_or_else(|| out_of_range("Digits", index, self.labels.len()))?;
        image_sample(&self.pixels[index * 64..(index + 1) * 64], &[1, 8, 8], 16.0, label)
    }
}

/// Parse and check the whole file: exactly [`SAMPLES`] lines of 64 pixels in 0..=16 and a label in 0..=9.
fn parse_csv(path: &Path) -> Result<(Vec<u8>, Vec<i64>)> {
    let bytes = open(path)?.read_all(path, MAX_CSV_BYTES)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| io_error(path, format!("not UTF-8 text: {e}")))?;
    let mut pixels = Vec::with_capacity(SAMPLES * 64);
    let mut labels = Vec::with_capacity(SAMPLES);
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |detail: String| io_error(path, format!("line {}: {detail}", i + 1));
        let fields: Vec<&str> = line.trim().split(',').collect();
        if fields.len() != 65 {
            return Err(bad(format!("{} fields, expected 64 pixels and a label", fields.len())));
        }
        for (j, f) in fields.iter().enumerate() {
            let v: u8 = f
                .trim()
                .parse()
                .map_err(|_| bad(format!("field {} is {f:?}, not a small integer", j + 1)))?;
            let max = if j < 64 { 16 } else { 9 };
            if v > max {
                return Err(bad(format!("field {} is {v}, outside 0..={max}", j + 1)));
            }
            if j < 64 {
                pixels.push(v);
            } else {
                labels.push(v as i64);
            }
        }
    }
    if labels.len() != SAMPLES {
        return Err(io_error(path, format!("{} samples, expected {SAMPLES}", labels.len())));
    }
    Ok((pixels, labels))
}

/// Which CSV lines form the test split: a seeded Fisher–Yates shuffle picks [`TEST_SAMPLES`] of them.
///
/// SplitMix64 rather than `rand`'s `StdRng`, whose algorithm may change between releases: the
/// split must stay the same forever so results stay comparable.
fn test_rows() -> Vec<bool> {
    let mut state = SPLIT_SEED;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..SAMPLES).collect();
    for i in (1..SAMPLES).rev() {
        // The modulo bias is below 1e-15 for n < 2000: irrelevant for a split.
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mut test = vec![false; SAMPLES];
    for &r in &order[..TEST_SAMPLES] {
        test[r] = true;
    }
    test
}
