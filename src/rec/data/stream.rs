//! Streaming Criteo TSV files (generated or real, plain or gzip) into tensor batches, one line
//! in memory at a time, sharded over trainers.

use super::generate::io_error;
use super::sample::RawRow;
use super::{CRITEO_DENSE, CRITEO_FIELDS};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind};
use std::path::{Path, PathBuf};

/// The longest line [`CtrStream`] accepts (Criteo's are under 1 KiB): a longer one is an error,
/// so a corrupt file cannot make the reader hold unbounded memory.
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// A batch of `B` examples.
#[derive(Clone, Debug)]
pub struct CtrBatch {
    /// f32 `[B, dense]`: `ln(1 + x)` of each integer column, 0 when missing or negative
    /// ([`super::dense_transform`]).
    pub dense: Tensor,
    /// i64 `[B, fields]`: global feature ids, [`super::feature_id`]`(field, value)` of each
    /// categorical column and [`super::missing_id`]`(field)` when it is empty.
    pub ids: Tensor,
    /// f32 `[B, 1]`: the click labels, 0 or 1.
    pub label: Tensor,
}

impl CtrBatch {
    /// Number of examples `B`.
    pub fn rows(&self) -> usize {
        self.label.shape()[0]
    }
}

/// Reads Criteo TSV files in [`CtrBatch`]es of `batch_size` rows (the last one may be
/// smaller), as an iterator of `Result`s that ends after the first error.
///
/// Each line is `label`, the integer columns and the categorical columns, tab-separated (13
/// and 26 by default, see [`CtrStream::with_layout`]); feature columns may be empty. A line
/// with the wrong number of columns, a label other than 0/1, a bad integer, a categorical value
/// that is not 1–8 hex digits, or more than [`MAX_LINE_BYTES`] bytes is an [`Error::Io`]
/// naming the file and the line.
pub struct CtrStream {
    /// Every file given, in order.
    all_files: Vec<PathBuf>,
    /// This trainer's files.
    files: Vec<PathBuf>,
    batch_size: usize,
    dense: usize,
    fields: usize,
    trainer: usize,
    trainers: usize,
    /// Sharded by line (every trainer reads every file) rather than by file.
    by_line: bool,
    next_file: usize,
    current: Option<OpenFile>,
    /// Lines read so far over all files (for sharding by line).
    line_index: u64,
    done: bool,
    line: Vec<u8>,
    raw: RawRow,
}

struct OpenFile {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    /// 1-based number of the last line read.
    line: u64,
}

impl CtrStream {
    /// A stream over `paths` in order; a directory stands for its `part-*` files (what
    /// [`super::generate`] writes) in name order. Real Criteo day files (`day_0`, `day_0.gz`,
    /// `train.txt`) are given by path. Files are opened when reached; gzip is detected by its
    /// magic bytes.
    pub fn open<P: AsRef<Path>>(paths: &[P], batch_size: usize) -> Result<CtrStream> {
        if batch_size == 0 {
            return Err(Error::invalid("CtrStream::open", "batch_size must be >= 1"));
        }
        let mut files = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let meta = std::fs::metadata(path).map_err(|e| io_error(path, format!("cannot open: {e}")))?;
            if meta.is_dir() {
                let before = files.len();
                files.extend(part_files(path)?);
                if files.len() == before {
                    return Err(io_error(path, "no part-* files in this directory"));
                }
            } else {
                files.push(path.to_path_buf());
            }
        }
        if files.is_empty() {
            return Err(Error::invalid("CtrStream::open", "no files given"));
        }
        Ok(CtrStream {
            files: files.clone(),
            all_files: files,
            batch_size,
            dense: CRITEO_DENSE,
            fields: CRITEO_FIELDS,
            trainer: 0,
            trainers: 1,
            by_line: false,
            next_file: 0,
            current: None,
            line_index: 0,
            done: false,
            line: Vec::new(),
            raw: RawRow::default(),
        })
    }

    /// Expect `dense` integer and `fields` categorical columns (Criteo: 13 and 26), as in a
    /// [`super::CriteoLikeConfig`] with another layout.
    pub fn with_layout(mut self, dense: usize, fields: usize) -> Result<CtrStream> {
        if fields == 0 {
            return Err(Error::invalid(
                "CtrStream::with_layout",
                "want at least one categorical field",
            ));
        }
        (self.dense, self.fields) = (dense, fields);
        Ok(self)
    }

    /// Keep trainer `trainer`'s share of `trainers` (replacing any earlier sharding; call it
    /// before iterating). With at least as many files as trainers, trainer `t` reads files
    /// `t, t + trainers, ...` whole (give a multiple of `trainers` files of equal size for equal
    /// shares); with fewer files, every trainer reads every file and keeps lines
    /// `t, t + trainers, ...` counted over all files in order. Either way the trainers' shares
    /// cover each line exactly once.
    pub fn shard(mut self, trainer: usize, trainers: usize) -> Result<CtrStream> {
        if trainer >= trainers {
            return Err(Error::invalid(
                "CtrStream::shard",
                format!("trainer {trainer} is not in 0..{trainers}"),
            ));
        }
        self.by_line = self.all_files.len() < trainers;
        self.files = if self.by_line {
            self.all_files.clone()
        } else {
            self.all_files.iter().skip(trainer).step_by(trainers).cloned().collect()
        };
        (self.trainer, self.trainers) = (trainer, trainers);
        (self.next_file, self.current, self.line_index) = (0, None, 0);
        Ok(self)
    }

    /// The files this stream reads, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Whether sharding is by line (fewer files than trainers) rather than by file.
    pub fn sharded_by_line(&self) -> bool {
        self.by_line
    }

    /// The next batch, `None` at the end.
    fn next_batch(&mut self) -> Result<Option<CtrBatch>> {
        let (d, f) = (self.dense, self.fields);
        let mut dense = Vec::with_capacity(self.batch_size * d);
        let mut ids = Vec::with_capacity(self.batch_size * f);
        let mut label = Vec::with_capacity(self.batch_size);
        while label.len() < self.batch_size {
            let Some(index) = self.next_line()? else { break };
            if self.by_line && index % self.trainers as u64 != self.trainer as u64 {
                continue;
            }
            let open = self.current.as_ref().expect("a line was just read from it");
            let clicked = parse_line(&self.line, &mut self.raw, d, f)
                .map_err(|detail| io_error(&open.path, format!("line {}: {detail}", open.line)))?;
            label.push(clicked as u8 as f32);
            dense.extend(self.raw.dense.iter().map(|&x| super::dense_transform(x) as f32));
            ids.extend(self.raw.cats.iter().enumerate().map(|(field, c)| {
                (match c {
                    Some(raw) => super::feature_id(field, *raw),
                    None => super::missing_id(field),
                }) as i64
            }));
        }
        let b = label.len();
        if b == 0 {
            return Ok(None);
        }
        Ok(Some(CtrBatch {
            dense: Tensor::from_vec(dense, &[b, d])?,
            ids: Tensor::from_vec(ids, &[b, f])?,
            label: Tensor::from_vec(label, &[b, 1])?,
        }))
    }

    /// Read the next line into `self.line`, opening files as needed; its index over all files.
    fn next_line(&mut self) -> Result<Option<u64>> {
        loop {
            let open = match &mut self.current {
                Some(open) => open,
                None => {
                    let Some(path) = self.files.get(self.next_file) else {
                        return Ok(None);
                    };
                    self.next_file += 1;
                    let reader = open_reader(path)?;
                    self.current.insert(OpenFile {
                        path: path.clone(),
                        reader,
                        line: 0,
                    })
                }
            };
            let got = read_line(&mut open.reader, &mut self.line)
                .map_err(|e| io_error(&open.path, format!("line {}: cannot read: {e}", open.line + 1)))?;
            match got {
                LineRead::Eof => self.current = None,
                LineRead::TooLong => {
                    return Err(io_error(
                        &open.path,
                        format!("line {}: longer than {MAX_LINE_BYTES} bytes", open.line + 1),
                    ));
                }
                LineRead::Line => {
                    open.line += 1;
                    self.line_index += 1;
                    return Ok(Some(self.line_index - 1));
                }
            }
        }
    }
}

impl Iterator for CtrStream {
    type Item = Result<CtrBatch>;

    fn next(&mut self) -> Option<Result<CtrBatch>> {
        if self.done {
            return None;
        }
        let batch = self.next_batch();
        self.done = !matches!(batch, Ok(Some(_)));
        batch.transpose()
    }
}

/// `dir`'s `part-*` files in name order.
fn part_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, format!("cannot list: {e}")))? {
        let entry = entry.map_err(|e| io_error(dir, format!("cannot list: {e}")))?;
        if entry.file_name().to_string_lossy().starts_with("part-") && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// A buffered reader of `path`, inflating gzip.
fn open_reader(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let file = File::open(path).map_err(|e| io_error(path, format!("cannot open: {e}")))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let head = reader
        .fill_buf()
        .map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(BufReader::with_capacity(1 << 16, MultiGzDecoder::new(reader)))
    } else {
        Box::new(reader)
    })
}

enum LineRead {
    Line,
    Eof,
    TooLong,
}

/// Read one line (without its `\n` and a trailing `\r`) into `buf`, refusing to hold more than
/// [`MAX_LINE_BYTES`]. A last line without `\n` counts.
fn read_line(reader: &mut dyn BufRead, buf: &mut Vec<u8>) -> std::io::Result<LineRead> {
    buf.clear();
    loop {
        let avail = match reader.fill_buf() {
            Ok(avail) => avail,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(if buf.is_empty() { LineRead::Eof } else { LineRead::Line });
        }
        let (take, end) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if buf.len() + take > MAX_LINE_BYTES {
            return Ok(LineRead::TooLong);
        }
        buf.extend_from_slice(&avail[..take]);
        reader.consume(take + end as usize);
        if end {
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(LineRead::Line);
        }
    }
}

/// Parse one line into `row`; the label, or what is wrong (naming the column).
fn parse_line(line: &[u8], row: &mut RawRow, dense: usize, fields: usize) -> std::result::Result<bool, String> {
    let want = 1 + dense + fields;
    let got = line.iter().filter(|&&b| b == b'\t').count() + 1;
    if got != want {
        return Err(format!(
            "expected {want} tab-separated columns (label, {dense} integer, {fields} categorical), got {got}"
        ));
    }
    let mut cols = line.split(|&b| b == b'\t');
    let label = match cols.next().expect("one column at least") {
        b"0" => false,
        b"1" => true,
        other => return Err(format!("the label must be 0 or 1, got {}", show(other))),
    };
    row.dense.clear();
    row.cats.clear();
    for (j, col) in cols.by_ref().take(dense).enumerate() {
        let value = if col.is_empty() {
            None
        } else {
            let parsed = std::str::from_utf8(col).ok().and_then(|s| s.parse::<i64>().ok());
            Some(parsed.ok_or_else(|| format!("column I{}: bad integer {}", j + 1, show(col)))?)
        };
        row.dense.push(value);
    }
    for (f, col) in cols.enumerate() {
        let value = if col.is_empty() {
            None
        } else if col.len() <= 8 && col.iter().all(u8::is_ascii_hexdigit) {
            let text = std::str::from_utf8(col).expect("hex digits are ASCII");
            Some(u32::from_str_radix(text, 16).expect("1 to 8 hex digits fit a u32"))
        } else {
            return Err(format!(
                "column C{}: bad hex {} (want 1 to 8 hex digits)",
                f + 1,
                show(col)
            ));
        };
        row.cats.push(value);
    }
    Ok(label)
}

/// A column's bytes for an error message, cut to 40 bytes.
fn show(col: &[u8]) -> String {
    let cut = &col[..col.len().min(40)];
    let more = if col.len() > 40 { "…" } else { "" };
    format!("{:?}{more}", String::from_utf8_lossy(cut))
}

#[cfg(test)]
mod tests;
