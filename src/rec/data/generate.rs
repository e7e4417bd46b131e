//! Writing synthetic rows as Criteo TSV part files plus a `meta.json`, streaming (one row in
//! memory per file being written) and in parallel over files.

use super::sample::{KEY_ROWS, RawRow, RowSampler};
use super::{CriteoLikeConfig, Draws, Teacher, derive_key};
use crate::error::{Error, Result};
use rayon::prelude::*;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Probability bins of the AUC histogram: the AUC is exact up to ties inside a bin of width
/// 2⁻¹⁶ (counted as half), i.e. to about 10⁻⁴, in 1 MiB whatever the row count.
const AUC_BINS: usize = 1 << 16;

/// What [`generate`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedInfo {
    /// The part files, in order (`dir/part-00000.txt`, ...).
    pub files: Vec<PathBuf>,
    /// `dir/meta.json`.
    pub meta: PathBuf,
    /// Rows written.
    pub rows: u64,
    /// Rows labelled 1.
    pub positives: u64,
    /// The teacher's ROC AUC on the written rows: the best any model can reach on them
    /// (`NaN` without both classes).
    pub teacher_auc: f64,
    /// The teacher's mean log loss on the written rows (`NaN` for no rows).
    pub teacher_logloss: f64,
    /// The teacher's calibrated bias.
    pub teacher_bias: f64,
}

impl GeneratedInfo {
    /// `positives / rows`.
    pub fn click_rate(&self) -> f64 {
        self.positives as f64 / self.rows as f64
    }
}

/// The name of part file `k`: `part-00000.txt`, `part-00001.txt`, ...
pub fn part_file_name(k: usize) -> String {
    format!("part-{k:05}.txt")
}

/// Write `rows` rows drawn from `config` to `files` part files in `dir` (created if needed),
/// plus `dir/meta.json` (the config, counts and the teacher's AUC and log loss).
///
/// Row `g` (global index) depends only on `(config, g)`, and file `k` holds rows
/// `[k·rows/files, (k+1)·rows/files)`, so the concatenated files are the same bytes whatever
/// `files` is, and files are written in parallel. Part files of an earlier run numbered
/// `files` or more are removed so that reading `dir` sees only this run.
pub fn generate(config: &CriteoLikeConfig, dir: impl AsRef<Path>, rows: u64, files: usize) -> Result<GeneratedInfo> {
    generate_rows(config, dir, 0..rows, files)
}

/// [`generate`] of the rows `range` of the same stream: a held-out set of the same teacher is
/// the rows after the training set's, e.g. `generate_rows(c, "test", n..n + m, 1)` after
/// `generate(c, "train", n, k)`.
pub fn generate_rows(
    config: &CriteoLikeConfig,
    dir: impl AsRef<Path>,
    range: std::ops::Range<u64>,
    files: usize,
) -> Result<GeneratedInfo> {
    let dir = dir.as_ref();
    let (first, rows) = (range.start, range.end.saturating_sub(range.start));
    if files == 0 {
        return Err(Error::invalid("generate", "want at least one file"));
    }
    let teacher = Teacher::new(config)?;
    let sampler = RowSampler::new(config)?;
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, format!("cannot create directory: {e}")))?;
    remove_stale_parts(dir, files)?;
    let paths: Vec<PathBuf> = (0..files).map(|k| dir.join(part_file_name(k))).collect();
    let bounds = |k: usize| first + (rows as u128 * k as u128 / files as u128) as u64;
    let stats = paths
        .par_iter()
        .enumerate()
        .map(|(k, path)| write_part(config, &sampler, &teacher, path, bounds(k)..bounds(k + 1)))
        .try_reduce(Stats::default, |a, b| Ok(a.merge(b)))?;
    let info = GeneratedInfo {
        files: paths,
        meta: dir.join("meta.json"),
        rows,
        positives: stats.positives,
        teacher_auc: stats.auc(),
        teacher_logloss: stats.logloss_sum / rows as f64,
        teacher_bias: teacher.bias(),
    };
    std::fs::write(&info.meta, meta_json(config, &info))
        .map_err(|e| io_error(&info.meta, format!("cannot write: {e}")))?;
    Ok(info)
}

/// Counts gathered while writing.
#[derive(Default)]
struct Stats {
    positives: u64,
    logloss_sum: f64,
    /// Positives and negatives per probability bin (empty until a row is counted).
    pos: Vec<u64>,
    neg: Vec<u64>,
}

impl Stats {
    fn add(&mut self, p: f64, label: bool) {
        if self.pos.is_empty() {
            self.pos = vec![0; AUC_BINS];
            self.neg = vec![0; AUC_BINS];
        }
        let bin = ((p * AUC_BINS as f64) as usize).min(AUC_BINS - 1);
        let p = p.clamp(1e-15, 1.0 - 1e-15);
        if label {
            self.positives += 1;
            self.pos[bin] += 1;
            self.logloss_sum -= p.ln();
        } else {
            self.neg[bin] += 1;
            self.logloss_sum -= (1.0 - p).ln();
        }
    }

    fn merge(mut self, other: Stats) -> Stats {
        if self.pos.is_empty() {
            self.pos = other.pos;
            self.neg = other.neg;
        } else if !other.pos.is_empty() {
            self.pos.iter_mut().zip(&other.pos).for_each(|(a, b)| *a += b);
            self.neg.iter_mut().zip(&other.neg).for_each(|(a, b)| *a += b);
        }
        self.positives += other.positives;
        self.logloss_sum += other.logloss_sum;
        self
    }

    /// ROC AUC from the histogram: each negative counts the positives in higher bins plus half
    /// of those in its own.
    fn auc(&self) -> f64 {
        let (mut above, mut area, mut negatives) = (0f64, 0f64, 0f64);
        for (p, n) in self.pos.iter().zip(&self.neg).rev() {
            area += *n as f64 * (above + 0.5 * *p as f64);
            above += *p as f64;
            negatives += *n as f64;
        }
        area / (above * negatives)
    }
}

/// Write rows `range` to `path`.
fn write_part(
    config: &CriteoLikeConfig,
    sampler: &RowSampler,
    teacher: &Teacher,
    path: &Path,
    range: std::ops::Range<u64>,
) -> Result<Stats> {
    let file = File::create(path).map_err(|e| io_error(path, format!("cannot create: {e}")))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let rows_key = derive_key(config.seed, KEY_ROWS);
    let (mut row, mut dense, mut ids) = (RawRow::default(), Vec::new(), Vec::new());
    let mut line = String::new();
    let mut stats = Stats::default();
    for g in range {
        let mut draws = Draws::new(RowSampler::row_key(rows_key, g));
        sampler.sample(&mut draws, &mut row);
        row.features(&mut dense, &mut ids);
        let p = teacher.prob(&dense, &ids);
        let label = draws.uniform() < p;
        stats.add(p, label);
        format_row(&mut line, label, &row);
        out.write_all(line.as_bytes())
            .map_err(|e| io_error(path, format!("cannot write: {e}")))?;
    }
    out.flush().map_err(|e| io_error(path, format!("cannot write: {e}")))?;
    Ok(stats)
}

/// One TSV line: `label`, the integer columns, the categorical columns as 8 lowercase hex
/// digits; missing values are empty.
fn format_row(line: &mut String, label: bool, row: &RawRow) {
    line.clear();
    line.push(if label { '1' } else { '0' });
    for x in &row.dense {
        line.push('\t');
        if let Some(x) = x {
            write!(line, "{x}").expect("writing to a String");
        }
    }
    for c in &row.cats {
        line.push('\t');
        if let Some(c) = c {
            write!(line, "{c:08x}").expect("writing to a String");
        }
    }
    line.push('\n');
}

/// Remove `dir/part-N.txt` for `N >= keep`, left by a run with more files.
fn remove_stale_parts(dir: &Path, keep: usize) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, format!("cannot list: {e}")))?;
    for entry in entries {
        let path = entry.map_err(|e| io_error(dir, format!("cannot list: {e}")))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let index = name
            .strip_prefix("part-")
            .and_then(|n| n.strip_suffix(".txt"))
            .filter(|n| n.len() >= 5 && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<usize>().ok());
        if index.is_some_and(|k| k >= keep) {
            std::fs::remove_file(&path).map_err(|e| io_error(&path, format!("cannot remove stale part file: {e}")))?;
        }
    }
    Ok(())
}

/// `meta.json`, written by hand (serde_json is not a dependency of `oar`).
fn meta_json(config: &CriteoLikeConfig, info: &GeneratedInfo) -> String {
    let num = |x: f64| if x.is_finite() { format!("{x}") } else { "null".into() };
    let list = |v: Vec<String>| v.join(", ");
    let names = info
        .files
        .iter()
        .map(|p| format!("\"{}\"", p.file_name().and_then(|n| n.to_str()).unwrap_or("")))
        .collect();
    let vocab = config.vocab.iter().map(u64::to_string).collect();
    format!(
        "{{\n  \"format\": \"criteo-tsv: label, I1..I{d}, C1..C{f}\",\n  \"dense\": {d},\n  \"fields\": {f},\n  \
         \"vocab\": [{vocab}],\n  \"total_vocab\": {total},\n  \"zipf_s\": {s},\n  \"target_ctr\": {ctr},\n  \
         \"seed\": {seed},\n  \"rows\": {rows},\n  \"files\": [{names}],\n  \"positives\": {pos},\n  \
         \"click_rate\": {rate},\n  \"teacher_auc\": {auc},\n  \"teacher_logloss\": {ll},\n  \
         \"teacher_bias\": {bias}\n}}\n",
        d = config.dense,
        f = config.fields,
        vocab = list(vocab),
        total = config.total_vocab(),
        s = num(config.zipf_s),
        ctr = num(config.target_ctr),
        seed = config.seed,
        rows = info.rows,
        names = list(names),
        pos = info.positives,
        rate = num(info.click_rate()),
        auc = num(info.teacher_auc),
        ll = num(info.teacher_logloss),
        bias = num(info.teacher_bias),
    )
}

/// An [`Error::Io`] naming `path`.
pub(super) fn io_error(path: &Path, detail: impl Into<String>) -> Error {
    Error::Io {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rec::data::CtrStream;

    /// ROC AUC by sorting (exact).
    fn exact_auc(probs: &[f64], labels: &[bool]) -> f64 {
        // Sort by probability; tied groups count half.
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[a].total_cmp(&probs[b]));
        let (mut negatives, mut area, mut i) = (0f64, 0f64, 0);
        let positives = labels.iter().filter(|&&l| l).count() as f64;
        while i < order.len() {
            let j = (i..order.len())
                .find(|&j| probs[order[j]] != probs[order[i]])
                .unwrap_or(order.len());
            let (pos, neg) = order[i..j].iter().fold(
                (0f64, 0f64),
                |(p, n), &k| {
                    if labels[k] { (p + 1.0, n) } else { (p, n + 1.0) }
                },
            );
            area += pos * (negatives + 0.5 * neg);
            negatives += neg;
            i = j;
        }
        area / (positives * negatives)
    }

    fn small() -> CriteoLikeConfig {
        CriteoLikeConfig {
            seed: 11,
            ..CriteoLikeConfig::default()
        }
    }

    #[test]
    fn same_seed_same_bytes_whatever_the_file_count() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ia = generate(&small(), a.path(), 3000, 1).unwrap();
        let ib = generate(&small(), b.path(), 3000, 4).unwrap();
        let one = std::fs::read(&ia.files[0]).unwrap();
        let four: Vec<u8> = ib.files.iter().flat_map(|p| std::fs::read(p).unwrap()).collect();
        assert_eq!(one, four);
        assert_eq!((ia.positives, ia.teacher_auc), (ib.positives, ib.teacher_auc));
        let again = generate(&small(), a.path(), 3000, 1).unwrap();
        assert_eq!(std::fs::read(&again.files[0]).unwrap(), one);
        let other = CriteoLikeConfig { seed: 12, ..small() };
        generate(&other, b.path(), 3000, 1).unwrap();
        assert_ne!(std::fs::read(&ib.files[0]).unwrap(), one);
        // The run with one file removed the earlier run's part-00001..3.
        assert_eq!(CtrStream::open(&[b.path()], 64).unwrap().files().len(), 1);
        // A held-out set is the rows after: rows 0..1000 then 1000..3000 are the 3000 rows.
        let (c, d) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        generate_rows(&small(), c.path(), 0..1000, 1).unwrap();
        let held = generate_rows(&small(), d.path(), 1000..3000, 2).unwrap();
        assert_eq!(held.rows, 2000);
        let mut joined = std::fs::read(c.path().join(part_file_name(0))).unwrap();
        joined.extend(held.files.iter().flat_map(|p| std::fs::read(p).unwrap()));
        assert_eq!(joined, one);
    }

    #[test]
    fn click_rate_and_teacher_auc_are_criteo_like() {
        let dir = tempfile::tempdir().unwrap();
        let info = generate(&small(), dir.path(), 20_000, 2).unwrap();
        // Binomial noise at 20k rows is ~0.003; the pilot's calibration error a little more.
        assert!(
            (0.2..0.3).contains(&info.click_rate()),
            "click rate {}",
            info.click_rate()
        );
        assert!(
            (0.72..0.84).contains(&info.teacher_auc),
            "teacher AUC {}",
            info.teacher_auc
        );
        let meta = std::fs::read_to_string(&info.meta).unwrap();
        let json: serde_json::Value = serde_json::from_str(&meta).unwrap();
        assert_eq!(json["rows"], 20_000);
        assert_eq!(json["positives"], info.positives);
        assert_eq!(json["teacher_auc"].as_f64(), Some(info.teacher_auc));
        assert_eq!(json["total_vocab"], small().total_vocab());
    }

    #[test]
    fn meta_auc_matches_the_teacher_on_the_files_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let config = small();
        let info = generate(&config, dir.path(), 6000, 3).unwrap();
        let teacher = Teacher::new(&config).unwrap();
        let (mut probs, mut labels) = (Vec::new(), Vec::new());
        for batch in CtrStream::open(&[dir.path()], 512).unwrap() {
            let batch = batch.unwrap();
            probs.extend(teacher.probs(&batch).unwrap());
            labels.extend(batch.label.to_vec::<f32>().unwrap().iter().map(|&l| l == 1.0));
        }
        assert_eq!(labels.len(), 6000);
        assert_eq!(labels.iter().filter(|&&l| l).count() as u64, info.positives);
        // The reader's f32 dense values and the 2^-16 histogram bins move the AUC by < 1e-3.
        let auc = exact_auc(&probs, &labels);
        assert!(
            (auc - info.teacher_auc).abs() < 1e-3,
            "read back {auc}, meta {}",
            info.teacher_auc
        );
    }

    #[test]
    fn histogram_auc_matches_the_sorted_one() {
        let mut draws = Draws::new(9);
        let (mut stats, mut probs, mut labels) = (Stats::default(), Vec::new(), Vec::new());
        for _ in 0..5000 {
            let p = draws.uniform();
            let label = draws.uniform() < p;
            stats.add(p, label);
            probs.push(p);
            labels.push(label);
        }
        let (hist, exact) = (stats.auc(), exact_auc(&probs, &labels));
        assert!((hist - exact).abs() < 1e-4, "histogram {hist}, exact {exact}");
        // A uniform p with label ~ Bernoulli(p) has AUC 5/6 … up to sampling noise of ~0.006.
        assert!((exact - 5.0 / 6.0).abs() < 0.03, "{exact}");
    }

    #[test]
    fn lines_are_criteo_tsv() {
        let dir = tempfile::tempdir().unwrap();
        let info = generate(&small(), dir.path(), 200, 1).unwrap();
        let text = std::fs::read_to_string(&info.files[0]).unwrap();
        let (mut empty_dense, mut empty_cat) = (0, 0);
        for line in text.lines() {
            let cols: Vec<&str> = line.split('\t').collect();
            assert_eq!(cols.len(), 40, "{line}");
            assert!(cols[0] == "0" || cols[0] == "1");
            for c in &cols[1..14] {
                empty_dense += c.is_empty() as usize;
                assert!(c.is_empty() || c.parse::<u64>().is_ok(), "{c}");
            }
            for c in &cols[14..] {
                empty_cat += c.is_empty() as usize;
                assert!(
                    c.is_empty() || (c.len() == 8 && u32::from_str_radix(c, 16).is_ok()),
                    "{c}"
                );
            }
        }
        assert!(
            empty_dense > 0 && empty_cat > 0,
            "Criteo has missing values in both kinds"
        );
    }
}
