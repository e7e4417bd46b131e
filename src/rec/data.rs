//! Synthetic Criteo-like click data for the parameter-server example (issue 22 point 5),
//! generated to files and streamed back from them.
//!
//! [`generate`] writes rows in Criteo's TSV format (`label`, 13 integer columns `I1..I13`, 26
//! categorical columns `C1..C26` of 8 hex digits; any feature column may be empty = missing).
//! Categorical ids follow a Zipf law (exponent ≈ 1.1) over per-field vocabularies whose total
//! is ≥ 10⁶ by default ([`default_vocab`]), sampled in O(1) by [`Zipf`]; dense columns are
//! log-normal counts. Labels are drawn from a planted [`Teacher`]: a logistic model with
//! dense weights, one effect per feature id and a few pairwise field interactions, all computed
//! from counter-based hashes so nothing vocabulary-sized is held in memory. Its AUC on the
//! generated rows (in `meta.json`) is the best any model can reach: 0.78 at the defaults, with a
//! 25% click rate.
//!
//! [`CtrStream`] reads such files — or real Criteo day files, plain or gzip — in [`CtrBatch`]es:
//! dense `log(1 + x)`, categorical values hashed to global feature ids by [`feature_id`] (what a
//! parameter server keys its rows by), labels as floats.

mod generate;
mod sample;
mod stream;
mod teacher;
mod zipf;

pub use generate::{GeneratedInfo, generate, generate_rows, part_file_name};
pub use stream::{CtrBatch, CtrStream, MAX_LINE_BYTES};
pub use teacher::Teacher;
pub use zipf::Zipf;

use crate::error::{Error, Result};
use oar_ir::ops::random_stream::{bits, mix64};

/// Criteo's number of integer (dense) columns.
pub const CRITEO_DENSE: usize = 13;
/// Criteo's number of categorical columns (fields).
pub const CRITEO_FIELDS: usize = 26;

/// What [`generate`] draws: the layout, the vocabularies, the Zipf exponent and the base click
/// rate. Everything else (dense distributions, missing rates, the teacher) follows from `seed`.
#[derive(Clone, Debug, PartialEq)]
pub struct CriteoLikeConfig {
    /// Number of integer columns (Criteo: 13).
    pub dense: usize,
    /// Number of categorical columns (Criteo: 26); must equal `vocab.len()`.
    pub fields: usize,
    /// Vocabulary size of each field: field `f` draws raw ids (Zipf ranks) in `1..=vocab[f]`.
    pub vocab: Vec<u64>,
    /// Zipf exponent of every field (> 0; Criteo's heads look like ≈ 1.1).
    pub zipf_s: f64,
    /// The mean click probability the teacher's bias is calibrated to (in (0, 1)).
    pub target_ctr: f64,
    /// Seeds everything; the same config and row count give the same bytes.
    pub seed: u64,
}

impl Default for CriteoLikeConfig {
    /// Criteo's layout: 13 dense, 26 fields with [`default_vocab`] (1.16·10⁶ ids in all),
    /// `zipf_s` 1.1, a 25% click rate, seed 0.
    fn default() -> CriteoLikeConfig {
        CriteoLikeConfig {
            dense: CRITEO_DENSE,
            fields: CRITEO_FIELDS,
            vocab: default_vocab(CRITEO_FIELDS),
            zipf_s: 1.1,
            target_ctr: 0.25,
            seed: 0,
        }
    }
}

impl CriteoLikeConfig {
    /// Number of integer columns.
    pub fn num_dense(&self) -> usize {
        self.dense
    }

    /// Number of categorical columns.
    pub fn num_fields(&self) -> usize {
        self.fields
    }

    /// Σ of the vocabulary sizes: the number of distinct categorical ids that can occur.
    pub fn total_vocab(&self) -> u64 {
        self.vocab.iter().sum()
    }

    /// An [`Error::Invalid`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: String| Err(Error::invalid("CriteoLikeConfig", detail));
        if self.fields == 0 {
            return bad("fields must be >= 1".into());
        }
        if self.vocab.len() != self.fields {
            return bad(format!(
                "vocab has {} sizes for {} fields (default_vocab({}) gives a Criteo-like set)",
                self.vocab.len(),
                self.fields,
                self.fields
            ));
        }
        if let Some(f) = self.vocab.iter().position(|&v| v == 0 || v > 1 << 40) {
            return bad(format!("vocab[{f}] = {} is not in 1..=2^40", self.vocab[f]));
        }
        if !(self.zipf_s > 0.0 && self.zipf_s.is_finite()) {
            return bad(format!("zipf_s = {} must be finite and > 0", self.zipf_s));
        }
        if !(self.target_ctr > 0.0 && self.target_ctr < 1.0) {
            return bad(format!("target_ctr = {} must be in (0, 1)", self.target_ctr));
        }
        Ok(())
    }
}

/// Vocabulary sizes spaced geometrically from 10 (field 0) to 400 000 (the last field), like
/// Criteo's skew; for 26 fields they total 1 163 784 ids.
pub fn default_vocab(fields: usize) -> Vec<u64> {
    let (lo, hi) = (10f64, 400_000f64);
    match fields {
        0 => Vec::new(),
        1 => vec![hi as u64],
        _ => (0..fields)
            .map(|f| (lo * (hi / lo).powf(f as f64 / (fields - 1) as f64)).round() as u64)
            .collect(),
    }
}

/// Keeps feature ids non-negative as i64.
const ID_MASK: u64 = (1 << 62) - 1;
/// Salts the feature-id hash so it differs from the other streams built on `mix64`.
const ID_SALT: u64 = 0x6f61_722d_6374_7231;

/// The global feature id of field `field`'s raw categorical value `raw` (the 32-bit number its
/// 8 hex digits spell): a bijective hash of `(field, raw)` masked to 62 bits, so it fits a
/// non-negative i64 and ids of different fields (almost surely) differ. Used by the generator's
/// teacher and by [`CtrStream`].
pub fn feature_id(field: usize, raw: u32) -> u64 {
    mix64(ID_SALT ^ (((field as u64) << 33) | raw as u64)) & ID_MASK
}

/// The feature id of a missing (empty) value of field `field`: its own id per field, never
/// `feature_id(field, raw)` for any raw value (up to a 2⁻³⁰ chance of a 62-bit collision).
pub fn missing_id(field: usize) -> u64 {
    mix64(ID_SALT ^ (((field as u64) << 33) | 1 << 32)) & ID_MASK
}

/// Criteo's usual dense transform: `ln(1 + x)`, with missing values and negative counts
/// (Criteo's `I2` has a few) mapped to 0.
pub fn dense_transform(x: Option<i64>) -> f64 {
    x.map_or(0.0, |x| (x.max(0) as f64).ln_1p())
}

/// A sub-stream key of `seed` for one purpose (rows, teacher, hex codes ...).
fn derive_key(seed: u64, purpose: u64) -> u64 {
    mix64(seed ^ mix64(purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

/// Counter-based random numbers: the `i`-th draw of stream `key` is `bits(key, i)`, so a row
/// that owns its key can be regenerated alone.
#[derive(Clone, Debug)]
struct Draws {
    key: u64,
    next: u64,
}

impl Draws {
    fn new(key: u64) -> Draws {
        Draws { key, next: 0 }
    }

    fn u64(&mut self) -> u64 {
        let b = bits(self.key, self.next);
        self.next += 1;
        b
    }

    /// A uniform f64 in `[0, 1)`.
    fn uniform(&mut self) -> f64 {
        unit(self.u64())
    }
}

/// 53 bits of `b` as a uniform f64 in `[0, 1)`.
fn unit(b: u64) -> f64 {
    (b >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// An approximately standard normal number from 64 random bits: the centered sum of four
/// 16-bit uniforms (Irwin–Hall), scaled to unit variance. Cheaper than Box–Muller and good
/// enough for planted effects; its tails stop at ±2√3.
fn approx_normal(b: u64) -> f64 {
    let sum: f64 = (0..4).map(|i| ((b >> (16 * i)) & 0xffff) as f64 + 0.5).sum();
    (sum / 65536.0 - 2.0) * 3f64.sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_vocab_is_criteo_sized() {
        let v = default_vocab(CRITEO_FIELDS);
        assert_eq!((v[0], v[25]), (10, 400_000));
        assert!(v.windows(2).all(|w| w[0] < w[1]));
        let total: u64 = v.iter().sum();
        assert!(total >= 1_000_000, "total vocabulary {total}");
        assert_eq!(total, CriteoLikeConfig::default().total_vocab());
        CriteoLikeConfig::default().validate().unwrap();
    }

    #[test]
    fn feature_ids_are_non_negative_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for field in 0..CRITEO_FIELDS {
            assert!(seen.insert(missing_id(field)));
            for raw in [0, 1, 2, 0xffff_ffff, 0x68fd_1e64] {
                let id = feature_id(field, raw);
                assert!(id <= i64::MAX as u64);
                assert!(seen.insert(id), "field {field} raw {raw:#x} collides");
            }
        }
    }

    #[test]
    fn bad_configs_are_named() {
        let mut c = CriteoLikeConfig {
            fields: 3,
            ..CriteoLikeConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("26 sizes for 3 fields"));
        c.vocab = vec![10, 0, 5];
        assert!(c.validate().unwrap_err().to_string().contains("vocab[1]"));
        c.vocab = vec![10, 4, 5];
        c.target_ctr = 1.0;
        assert!(c.validate().unwrap_err().to_string().contains("target_ctr"));
    }

    #[test]
    fn approx_normal_has_unit_moments() {
        let n = 100_000;
        let xs: Vec<f64> = (0..n).map(|i| approx_normal(bits(5, i))).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // Standard errors at 100k draws: 0.003 for the mean, 0.005 for the variance.
        assert!(mean.abs() < 0.015 && (var - 1.0).abs() < 0.025, "mean {mean} var {var}");
    }
}
