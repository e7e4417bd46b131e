//! numpy `.npy` files: read and write [`crate::TensorData`].
//!
//! Supported: format versions 1.0, 2.0 and 3.0; C order; little-endian `<f4 <f8 <f2 <i4 <i8`
//! and single-byte `|i1 |u1 |b1`. bf16 has no numpy dtype, so writing a bf16 tensor is an
//! error: cast it to f32 first (that is what `torch.Tensor.numpy()` asks for too).
//! The header is a Python dict literal; this is a small strict parser for exactly the subset
//! numpy writes (`{'descr': ..., 'fortran_order': ..., 'shape': (...), }`).

use crate::tensor_data::checked_byte_len;
use crate::{DType, TensorData};
use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// numpy aligns the data start to this many bytes.
const ALIGN: usize = 64;
/// Name used in errors for bytes that have no file path.
const IN_MEMORY: &str = "<npy bytes>";

/// An npy error, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {kind}")]
pub struct NpyError {
    /// The file (or `<npy bytes>`).
    pub path: String,
    /// What is wrong.
    pub kind: NpyErrorKind,
}

/// What is wrong with an npy file or tensor.
#[derive(Debug, thiserror::Error)]
pub enum NpyErrorKind {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The bytes do not start with `\x93NUMPY`.
    #[error("not an npy file (bad magic bytes)")]
    BadMagic,
    /// A format version other than 1.0, 2.0, 3.0.
    #[error("npy format version {major}.{minor} is not supported (1.0, 2.0 and 3.0 are)")]
    UnsupportedVersion {
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
    /// The file ends early.
    #[error("file is truncated in the {0}")]
    Truncated(&'static str),
    /// The header dict is malformed.
    #[error("bad header: {0}")]
    Header(String),
    /// Big-endian data.
    #[error("dtype '{0}' is big-endian; oar reads little-endian npy only (arr.astype(arr.dtype.newbyteorder('<')))")]
    BigEndian(String),
    /// A dtype oar does not read.
    #[error("dtype '{0}' is not supported (oar reads <f4 <f8 <f2 <i4 <i8 |i1 |u1 |b1, little-endian)")]
    UnsupportedDType(String),
    /// Fortran-order data.
    #[error("fortran_order arrays are not supported; save a C-order array (np.ascontiguousarray)")]
    FortranOrder,
    /// The data size does not match the shape.
    #[error("shape {shape:?} of '{descr}' needs {expected} data bytes, the file has {got}")]
    DataSize {
        /// The dtype string.
        descr: String,
        /// The shape.
        shape: Vec<usize>,
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// A bool array holds bytes other than 0 and 1.
    #[error("bool array holds bytes other than 0 and 1")]
    BadBool,
    /// The shape is too large.
    #[error("{0}")]
    TooLarge(#[from] crate::tensor_data::TensorDataError),
    /// The tensor's dtype has no numpy equivalent.
    #[error("{0} has no numpy dtype; cast to f32 before writing npy")]
    NoNumpyDType(DType),
}

fn err(path: &str, kind: NpyErrorKind) -> NpyError {
    NpyError {
        path: path.into(),
        kind,
    }
}

/// The npy dtype string of `dtype`, if numpy has one.
fn descr_of(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::Bool => "|b1",
        DType::BF16 => return None,
    })
}

/// Read an npy file.
pub fn read_npy(path: &Path) -> Result<TensorData, NpyError> {
    let shown = path.display().to_string();
    let io = |e: std::io::Error| err(&shown, e.into());
    // Only regular files (a FIFO or a device would block or never end), and no larger than
    // the memory budget allows (the header is small).
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let limit = crate::memory::limit();
    if meta.len() > limit.saturating_add(1 << 16) {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} bytes is more than the memory limit of {limit} bytes ({})",
                meta.len(),
                crate::memory::limit_source()
            ),
        )));
    }
    let bytes = std::fs::read(path).map_err(io)?;
    parse(&bytes).map_err(|k| err(&shown, k))
}

/// Parse npy bytes.
pub fn read_npy_bytes(bytes: &[u8]) -> Result<TensorData, NpyError> {
    parse(bytes).map_err(|k| err(IN_MEMORY, k))
}

/// The file name (without `.npy`) an output named `name` is written to: letters, digits, `-`,
/// `_` and `.` as they are, every other byte as `%XX`, so different names never share a file
/// (`a/b` → `a%2Fb`, `a_b` → `a_b`) and no name leaves the directory.
pub fn output_file_stem(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    if s.is_empty() || s.chars().all(|c| c == '.') {
        s.insert(0, '%'); // `.` / `..` / an empty name: not a directory entry of its own
    }
    s
}

/// A one-line summary of a tensor: its type and first six values.
pub fn preview(t: &TensorData) -> String {
    // Only the shown elements are converted: a preview of a 1 GiB output costs nothing.
    let w = t.dtype().size_bytes();
    let shown: Vec<String> = t
        .bytes()
        .chunks_exact(w)
        .take(6)
        .map(|b| format!("{:.6}", crate::tensor_data::read_as_f64(t.dtype(), b)))
        .collect();
    let more = if t.len() > 6 { ", ..." } else { "" };
    format!("{} [{}{more}]", t.tensor_type(), shown.join(", "))
}

/// Write `t` as an npy file.
pub fn write_npy(path: &Path, t: &TensorData) -> Result<(), NpyError> {
    let shown = path.display().to_string();
    // The header and the tensor's bytes are written as they are: no copy of the data.
    let header = encode_header(t).map_err(|k| err(&shown, k))?;
    crate::file::write_parts_atomically(path, &[&header, t.bytes()]).map_err(|e| err(&shown, e.into()))
}

/// The npy bytes of `t` (format 1.0, or 2.0 when the header needs it), as numpy writes them.
pub fn to_npy_bytes(t: &TensorData) -> Result<Vec<u8>, NpyError> {
    encode(t).map_err(|k| err(IN_MEMORY, k))
}

fn encode(t: &TensorData) -> Result<Vec<u8>, NpyErrorKind> {
    let mut out = encode_header(t)?;
    out.extend_from_slice(t.bytes());
    Ok(out)
}

/// The npy header of `t`: magic, version, length and the padded dict.
fn encode_header(t: &TensorData) -> Result<Vec<u8>, NpyErrorKind> {
    let descr = descr_of(t.dtype()).ok_or(NpyErrorKind::NoNumpyDType(t.dtype()))?;
    let shape = match t.shape() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        dims => format!(
            "({})",
            dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
        ),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // numpy pads with spaces and a final newline so the data starts 64-byte aligned; the pad is
    // never empty. Version 1.0 has a u16 header length, 2.0 a u32.
    let padded = |len_bytes: usize| {
        let used = MAGIC.len() + 2 + len_bytes + dict.len() + 1;
        dict.len() + (ALIGN - used % ALIGN) + 1
    };
    let (version, len_bytes) = if padded(2) <= u16::MAX as usize { (1, 2) } else { (2, 4) };
    let header_len = padded(len_bytes);
    let len_field = u32::try_from(header_len).map_err(|_| NpyErrorKind::Header("header longer than 4 GiB".into()))?;
    let mut out = Vec::with_capacity(MAGIC.len() + 2 + len_bytes + header_len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    out.extend_from_slice(&len_field.to_le_bytes()[..len_bytes]);
    let header_end = out.len() + header_len;
    out.extend_from_slice(dict.as_bytes());
    out.resize(header_end - 1, b' ');
    out.push(b'\n');
    Ok(out)
}

fn parse(bytes: &[u8]) -> Result<TensorData, NpyErrorKind> {
    let head = &bytes[..bytes.len().min(MAGIC.len())];
    if head.is_empty() || !MAGIC.starts_with(head) {
        return Err(NpyErrorKind::BadMagic);
    }
    if bytes.len() < MAGIC.len() + 2 {
        return Err(NpyErrorKind::Truncated("magic and version"));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let len_bytes = match (major, minor) {
        (1, 0) => 2,
        (2, 0) | (3, 0) => 4,
        _ => return Err(NpyErrorKind::UnsupportedVersion { major, minor }),
    };
    let rest = &bytes[8..];
    let len_field = rest.get(..len_bytes).ok_or(NpyErrorKind::Truncated("header length"))?;
    let header_len = len_field.iter().rev().fold(0usize, |acc, &b| (acc << 8) | b as usize);
    let rest = &rest[len_bytes..];
    if header_len > rest.len() {
        return Err(NpyErrorKind::Truncated("header"));
    }
    let (header, data) = rest.split_at(header_len);
    // v1/v2 headers are latin-1, v3 UTF-8; the accepted subset is ASCII either way.
    let header = std::str::from_utf8(header)
        .ok()
        .filter(|h| h.is_ascii())
        .ok_or_else(|| NpyErrorKind::Header("header is not ASCII".into()))?;
    let h = parse_header(header)?;
    let dtype = match h.descr.as_str() {
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        "<f2" => DType::F16,
        "|i1" => DType::I8,
        "|u1" => DType::U8,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "|b1" => DType::Bool,
        d if d.starts_with('>') => return Err(NpyErrorKind::BigEndian(h.descr)),
        _ => return Err(NpyErrorKind::UnsupportedDType(h.descr)),
    };
    if h.fortran_order {
        return Err(NpyErrorKind::FortranOrder);
    }
    let expected = checked_byte_len(dtype, &h.shape)?;
    if data.len() != expected {
        return Err(NpyErrorKind::DataSize {
            descr: h.descr,
            shape: h.shape,
            expected,
            got: data.len(),
        });
    }
    if dtype == DType::Bool && data.iter().any(|&b| b > 1) {
        return Err(NpyErrorKind::BadBool);
    }
    Ok(TensorData::from_bytes(dtype, h.shape, data.to_vec())?)
}

/// The three header fields.
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// A value in the header dict.
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
}

/// A cursor over the header text.
struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }

    fn bad(&self, what: &str) -> NpyErrorKind {
        NpyErrorKind::Header(format!("{what} at byte {}", self.i))
    }

    fn expect(&mut self, c: u8) -> Result<(), NpyErrorKind> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.bad(&format!("expected `{}`", c as char)))
        }
    }

    fn string(&mut self) -> Result<String, NpyErrorKind> {
        let q = self
            .peek()
            .filter(|&c| c == b'\'' || c == b'"')
            .ok_or_else(|| self.bad("expected a string"))?;
        let start = self.i + 1;
        let len = self.s[start..]
            .iter()
            .position(|&c| c == q)
            .ok_or_else(|| self.bad("unterminated string"))?;
        self.i = start + len + 1;
        Ok(String::from_utf8_lossy(&self.s[start..start + len]).into_owned())
    }

    fn word(&mut self) -> String {
        self.skip_ws();
        let start = self.i;
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_alphanumeric()) {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }

    fn value(&mut self) -> Result<Value, NpyErrorKind> {
        match self.peek() {
            Some(b'\'' | b'"') => Ok(Value::Str(self.string()?)),
            Some(b'(') => {
                self.i += 1;
                let mut dims = Vec::new();
                loop {
                    if self.peek() == Some(b')') {
                        self.i += 1;
                        return Ok(Value::Tuple(dims));
                    }
                    let w = self.word();
                    let d = w
                        .parse::<usize>()
                        .map_err(|_| self.bad(&format!("bad dimension `{w}`")))?;
                    dims.push(d);
                    // `(3)` is an int, not a tuple; numpy always writes `(3,)`.
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b')') if dims.len() > 1 => {}
                        _ => return Err(self.bad("expected `,` in shape tuple")),
                    }
                }
            }
            _ => match self.word().as_str() {
                "True" => Ok(Value::Bool(true)),
                "False" => Ok(Value::Bool(false)),
                w => Err(self.bad(&format!("unexpected `{w}`"))),
            },
        }
    }
}

fn parse_header(text: &str) -> Result<Header, NpyErrorKind> {
    let mut lx = Lexer {
        s: text.as_bytes(),
        i: 0,
    };
    lx.expect(b'{')?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    loop {
        if lx.peek() == Some(b'}') {
            lx.i += 1;
            break;
        }
        let key = lx.string()?;
        lx.expect(b':')?;
        let value = lx.value()?;
        let slot_taken = match (key.as_str(), value) {
            ("descr", Value::Str(s)) => descr.replace(s).is_some(),
            ("fortran_order", Value::Bool(b)) => fortran.replace(b).is_some(),
            ("shape", Value::Tuple(t)) => shape.replace(t).is_some(),
            ("descr" | "fortran_order" | "shape", _) => {
                return Err(NpyErrorKind::Header(format!("`{key}` has the wrong kind of value")));
            }
            _ => return Err(NpyErrorKind::Header(format!("unexpected key `{key}`"))),
        };
        if slot_taken {
            return Err(NpyErrorKind::Header(format!("key `{key}` appears twice")));
        }
        match lx.peek() {
            Some(b',') => lx.i += 1,
            Some(b'}') => {}
            _ => return Err(lx.bad("expected `,` or `}`")),
        }
    }
    if lx.peek().is_some() {
        return Err(lx.bad("text after the header dict"));
    }
    let missing = |k: &str| NpyErrorKind::Header(format!("missing key `{k}`"));
    Ok(Header {
        descr: descr.ok_or_else(|| missing("descr"))?,
        fortran_order: fortran.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_file_stems_are_distinct_and_stay_in_the_directory() {
        let names = ["a/b", "a_b", "a%2Fb", "", ".", "..", "%", "x y", "ü"];
        let stems: Vec<String> = names.iter().map(|n| output_file_stem(n)).collect();
        let unique: std::collections::BTreeSet<&String> = stems.iter().collect();
        assert_eq!(unique.len(), names.len(), "{stems:?}");
        assert!(
            stems
                .iter()
                .all(|s| !s.contains('/') && !s.is_empty() && s != "." && s != "..")
        );
        assert_eq!(output_file_stem("a_b"), "a_b");
        assert_eq!(output_file_stem("a/b"), "a%2Fb");
    }
}
