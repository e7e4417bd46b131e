//! Reading data files safely: optional gzip, sizes checked against headers before allocating,
//! and errors that name the file.

use crate::error::{Error, Result};
use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{BufReader, ErrorKind, Read};
use std::path::Path;

/// Refuse gzip payloads that claim more than this (real MNIST / CIFAR files are well under it),
/// so a hostile header cannot make us inflate and hold an unbounded amount of memory.
pub(crate) const MAX_PAYLOAD: u64 = 4 << 30;

/// An [`Error::Io`] naming `path`.
pub(crate) fn io_error(path: &Path, detail: impl Into<String>) -> Error {
    Error::Io {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

/// `dir/name`, or `dir/name.gz` when only the compressed file is there.
pub(crate) fn plain_or_gz(dir: &Path, name: &str) -> std::path::PathBuf {
    let plain = dir.join(name);
    let gz = dir.join(format!("{name}.gz"));
    if !plain.exists() && gz.exists() { gz } else { plain }
}

/// The error for a data set whose files are not in `dir`: names the directory, the files it
/// must hold and where they come from (oar downloads nothing at run time).
pub(crate) fn require_files(dataset: &str, dir: &Path, files: &[String], source: &str) -> Result<()> {
    let missing: Vec<&str> = files
        .iter()
        .filter(|f| !dir.join(f).exists() && !dir.join(format!("{f}.gz")).exists())
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(io_error(
        dir,
        format!(
            "{dataset} files not found: put {} (optionally .gz) in this directory; they come from {source} \
             (oar downloads nothing)",
            missing.join(", ")
        ),
    ))
}

/// An open data file: a byte stream plus, for uncompressed files, its exact length.
pub(crate) struct DataFile {
    reader: Box<dyn Read>,
    /// `Some(len)` for a plain file; `None` for gzip, whose inflated size is unknown up front.
    raw_len: Option<u64>,
    /// Bytes consumed so far (the header, for the size check).
    consumed: u64,
}

/// Open `path`, decompressing transparently when it starts with the gzip magic bytes.
pub(crate) fn open(path: &Path) -> Result<DataFile> {
    let mut file = File::open(path).map_err(|e| io_error(path, format!("cannot open: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| io_error(path, format!("cannot stat: {e}")))?
        .len();
    let mut magic = [0u8; 2];
    let n = read_up_to(&mut file, &mut magic).map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    let head = std::io::Cursor::new(magic[..n].to_vec());
    let plain = head.chain(file);
    Ok(if n == 2 && magic == [0x1f, 0x8b] {
        DataFile {
            reader: Box::new(MultiGzDecoder::new(BufReader::new(plain))),
            raw_len: None,
            consumed: 0,
        }
    } else {
        DataFile {
            reader: Box::new(BufReader::new(plain)),
            raw_len: Some(len),
            consumed: 0,
        }
    })
}

/// Read as many bytes as available into `buf` (stops early only at end of file).
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

impl DataFile {
    /// The size of a plain file (`None` for gzip).
    pub(crate) fn raw_len(&self) -> Option<u64> {
        self.raw_len
    }

    /// Read exactly `buf.len()` header bytes; a short file is a "truncated" error naming `what`.
    pub(crate) fn read_header(&mut self, path: &Path, buf: &mut [u8], what: &str) -> Result<()> {
        let got = read_up_to(&mut self.reader, buf).map_err(|e| io_error(path, format!("cannot read {what}: {e}")))?;
        if got < buf.len() {
            return Err(io_error(
                path,
                format!(
                    "truncated: the {what} needs {} bytes, the file ends after {got}",
                    buf.len()
                ),
            ));
        }
        self.consumed += got as u64;
        Ok(())
    }

    /// Read the rest of the file, which must be exactly `expected` bytes of `what`.
    ///
    /// Plain files are checked against their size before anything is allocated; gzip payloads
    /// are inflated incrementally and never past `expected`, which is capped by [`MAX_PAYLOAD`].
    pub(crate) fn read_payload(mut self, path: &Path, expected: u64, what: &str) -> Result<Vec<u8>> {
        if let Some(len) = self.raw_len {
            let have = len.saturating_sub(self.consumed);
            if have != expected {
                let kind = if have < expected { "truncated" } else { "too long" };
                return Err(io_error(
                    path,
                    format!("{kind}: the header promises {expected} bytes of {what}, the file holds {have}"),
                ));
            }
        } else if expected > MAX_PAYLOAD {
            return Err(io_error(
                path,
                format!("the header promises {expected} bytes of {what}, more than the {MAX_PAYLOAD}-byte limit"),
            ));
        }
        let mut out = Vec::with_capacity(if self.raw_len.is_some() { expected as usize } else { 0 });
        (&mut self.reader)
            .take(expected)
            .read_to_end(&mut out)
            .map_err(|e| io_error(path, format!("cannot read {what}: {e}")))?;
        if (out.len() as u64) < expected {
            return Err(io_error(
                path,
                format!(
                    "truncated: the header promises {expected} bytes of {what}, got {}",
                    out.len()
                ),
            ));
        }
        let mut extra = [0u8; 1];
        if read_up_to(&mut self.reader, &mut extra).map_err(|e| io_error(path, format!("cannot read: {e}")))? > 0 {
            return Err(io_error(
                path,
                format!("too long: data continues past the {expected} bytes of {what}"),
            ));
        }
        Ok(out)
    }

    /// Read everything that is left, refusing more than `limit` bytes.
    pub(crate) fn read_all(mut self, path: &Path, limit: u64) -> Result<Vec<u8>> {
        if self.raw_len.is_some_and(|len| len > limit) {
            return Err(io_error(
                path,
                format!("larger than the {limit}-byte limit for this format"),
            ));
        }
        let mut out = Vec::new();
        (&mut self.reader)
            .take(limit + 1)
            .read_to_end(&mut out)
            .map_err(|e| io_error(path, format!("cannot read: {e}")))?;
        if out.len() as u64 > limit {
            return Err(io_error(
                path,
                format!("larger than the {limit}-byte limit for this format"),
            ));
        }
        Ok(out)
    }
}
