//! Drawing one row's features: log-normal dense counts and Zipf categorical ids, each column
//! with its own (seeded) distribution and missing rate, written as Criteo writes them.

use super::{
    CriteoLikeConfig, Draws, Zipf, approx_normal, bits, dense_transform, derive_key, feature_id, missing_id, unit,
};
use crate::error::Result;

/// Purposes for [`derive_key`].
pub(super) const KEY_ROWS: u64 = 1;
pub(super) const KEY_PILOT: u64 = 2;
const KEY_HEX: u64 = 3;
const KEY_COLUMNS: u64 = 4;
pub(super) const KEY_TEACHER: u64 = 5;

/// One integer column: `⌊exp(mu + sigma·z)⌋` with `z` ~ N(0, 1), empty with probability `missing`.
#[derive(Clone, Debug)]
pub(super) struct DenseColumn {
    mu: f64,
    pub(super) sigma: f64,
    missing: f64,
}

/// One row as the file holds it: integer columns and the categorical columns' 32-bit values.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct RawRow {
    pub(super) dense: Vec<Option<i64>>,
    pub(super) cats: Vec<Option<u32>>,
}

impl RawRow {
    /// The teacher's (and the reader's) view: transformed dense values and feature ids.
    pub(super) fn features(&self, dense: &mut Vec<f64>, ids: &mut Vec<u64>) {
        dense.clear();
        dense.extend(self.dense.iter().map(|&x| dense_transform(x)));
        ids.clear();
        ids.extend(self.cats.iter().enumerate().map(|(f, c)| match c {
            Some(raw) => feature_id(f, *raw),
            None => missing_id(f),
        }));
    }
}

/// Draws rows for one config. Row `g` of a stream keyed `key` uses only `bits(row_key(g), ·)`.
#[derive(Clone, Debug)]
pub(super) struct RowSampler {
    pub(super) dense: Vec<DenseColumn>,
    zipf: Vec<Zipf>,
    cat_missing: Vec<f64>,
    /// Per field: the key hashing a Zipf rank into the 32-bit value written as hex.
    hex_keys: Vec<u64>,
}

impl RowSampler {
    pub(super) fn new(config: &CriteoLikeConfig) -> Result<RowSampler> {
        config.validate()?;
        let columns = derive_key(config.seed, KEY_COLUMNS);
        let dense = (0..config.dense as u64)
            .map(|j| {
                let u = |c: u64| unit(bits(columns, 4 * j + c));
                DenseColumn {
                    mu: 4.0 * u(0),
                    sigma: 0.8 + u(1),
                    // Skewed to small rates; Criteo's run from 0% to 77%.
                    missing: 0.5 * u(2) * u(2),
                }
            })
            .collect();
        let cat_missing = (0..config.fields as u64)
            .map(|f| {
                let u = |c: u64| unit(bits(columns, (1 << 32) + 2 * f + c));
                // About a quarter of the fields have missing values (up to 45%), as in Criteo.
                if u(0) < 0.25 { 0.45 * u(1) } else { 0.0 }
            })
            .collect();
        let zipf = config
            .vocab
            .iter()
            .map(|&n| Zipf::new(n, config.zipf_s))
            .collect::<Result<_>>()?;
        let hex = derive_key(config.seed, KEY_HEX);
        let hex_keys = (0..config.fields as u64).map(|f| bits(hex, f)).collect();
        Ok(RowSampler {
            dense,
            zipf,
            cat_missing,
            hex_keys,
        })
    }

    /// The key of row `g` in the stream keyed `stream`.
    pub(super) fn row_key(stream: u64, g: u64) -> u64 {
        bits(stream, g)
    }

    /// Draw one row into `row`; `draws` is left positioned for the label's uniform.
    pub(super) fn sample(&self, draws: &mut Draws, row: &mut RawRow) {
        row.dense.clear();
        for col in &self.dense {
            let present = draws.uniform() >= col.missing;
            let z = approx_normal(draws.u64());
            row.dense
                .push(present.then(|| (col.mu + col.sigma * z).exp().floor() as i64));
        }
        row.cats.clear();
        for ((zipf, &missing), &key) in self.zipf.iter().zip(&self.cat_missing).zip(&self.hex_keys) {
            let present = draws.uniform() >= missing;
            let rank = zipf.sample(|| draws.uniform());
            row.cats.push(present.then(|| (bits(key, rank) >> 32) as u32));
        }
    }
}
