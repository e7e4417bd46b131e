//! The `.oar` model file: magic, format version, the graph (serde) and weights (safetensors).
//!
//! Layout (all integers little-endian):
//! `b"OARMODEL"`, `u32` version, `u64` graph length, graph as JSON ([`GraphDef`]),
//! `u64` weights length, weights as a safetensors blob; nothing after.
//!
//! Loading treats the bytes as hostile: every length is checked against the bytes that remain
//! before anything is sliced or allocated, the graph is rebuilt through the `Graph` API and
//! verified, and the weights must match the params exactly.

use crate::graph_def::GraphDef;
use crate::ops::Param;
use crate::{DType, Graph, IrError, Op, TensorData, TensorType, Weights};
use safetensors::{Dtype as StDtype, SafeTensors, tensor::TensorView};
use std::collections::BTreeMap;
use std::path::Path;

/// The first eight bytes of every `.oar` file.
pub const MAGIC: &[u8; 8] = b"OARMODEL";
/// The format version this oar writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Deepest region nesting a file can hold. serde_json stops at 128 nested JSON levels (which
/// keeps hostile input from overflowing the stack); each region level costs 4 of them and a
/// node's op up to 6 more, so 28 leaves a margin. Saving a deeper graph is refused up front.
pub const MAX_FILE_REGION_DEPTH: usize = 28;

/// Name used in errors for a model that has no file path.
const IN_MEMORY: &str = "<in-memory model>";

/// A model: a graph and the weights of its params.
#[derive(Clone, Debug)]
pub struct Model {
    /// The graph.
    pub graph: Graph,
    /// One tensor per param name.
    pub weights: Weights,
}

/// Why a model could not be saved or loaded. Every variant names the file (or
/// `<in-memory model>`).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with `OARMODEL`.
    #[error("{path}: not an oar model file (it does not start with \"OARMODEL\")")]
    BadMagic {
        /// The file.
        path: String,
    },
    /// The format version is not one this oar reads.
    #[error("{path}: model format version {found} {}", version_hint(*.found, *.supported))]
    UnsupportedVersion {
        /// The file.
        path: String,
        /// Version in the file.
        found: u32,
        /// Version this oar reads.
        supported: u32,
    },
    /// The file ends inside a section.
    #[error("{path}: file is truncated in the {section}")]
    Truncated {
        /// The file.
        path: String,
        /// Which section was cut short.
        section: &'static str,
    },
    /// The graph section is not valid JSON for a graph.
    #[error("{path}: graph section, JSON line {line} column {column}: {message}")]
    GraphJson {
        /// The file.
        path: String,
        /// 1-based line in the graph JSON.
        line: usize,
        /// 1-based column in the graph JSON.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// The graph is structurally or type-wise invalid (or cannot be stored).
    #[error("{path}: graph: {source}")]
    Graph {
        /// The file.
        path: String,
        /// The graph error.
        #[source]
        source: IrError,
    },
    /// The weights section is not a valid safetensors blob of supported tensors.
    #[error("{path}: weights: {detail}")]
    Weights {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// A param has no weight.
    #[error("{path}: param `{name}` ({expected}) has no weight")]
    MissingWeight {
        /// The file.
        path: String,
        /// Param name.
        name: String,
        /// The param's declared type.
        expected: String,
    },
    /// A weight's dtype or shape differs from its param's type.
    #[error("{path}: weight `{name}` is {got} but its param declares {expected}")]
    WeightMismatch {
        /// The file.
        path: String,
        /// Param name.
        name: String,
        /// The param's declared type.
        expected: String,
        /// The weight's type.
        got: String,
    },
    /// A weight that no param uses.
    #[error("{path}: weight `{name}` does not belong to any param of the graph")]
    UnexpectedWeight {
        /// The file.
        path: String,
        /// Weight name.
        name: String,
    },
    /// A param with a symbolic dim cannot hold a weight.
    #[error("{path}: param `{name}` has symbolic type {ty}; params need static shapes")]
    SymbolicParam {
        /// The file.
        path: String,
        /// Param name.
        name: String,
        /// The param's declared type.
        ty: String,
    },
    /// Bytes after the weights section.
    #[error("{path}: {count} unexpected bytes after the weights section")]
    TrailingBytes {
        /// The file.
        path: String,
        /// How many.
        count: usize,
    },
}

fn version_hint(found: u32, supported: u32) -> String {
    if found > supported {
        format!("was written by a newer oar (this oar reads version {supported}); upgrade oar")
    } else {
        format!("is not a version oar ever wrote (this oar reads version {supported})")
    }
}

impl Model {
    /// Write the model to `path` atomically: a temp file in the same directory, then a rename,
    /// so a crash never leaves a half-written model over a good one.
    pub fn save(&self, path: &Path) -> Result<(), FileError> {
        let shown = path.display().to_string();
        let bytes = self.encode(&shown)?;
        let io = |source| FileError::Io {
            path: shown.clone(),
            source,
        };
        write_atomically(path, &bytes).map_err(io)
    }

    /// Read and check a model file.
    pub fn load(path: &Path) -> Result<Model, FileError> {
        let shown = path.display().to_string();
        // Memory use is bounded by the file size; every section length is checked against it.
        let bytes = std::fs::read(path).map_err(|source| FileError::Io {
            path: shown.clone(),
            source,
        })?;
        decode(&bytes, &shown)
    }

    /// The file bytes of this model (after checking it as `load` would).
    pub fn to_bytes(&self) -> Result<Vec<u8>, FileError> {
        self.encode(IN_MEMORY)
    }

    /// Parse and check model bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Model, FileError> {
        decode(bytes, IN_MEMORY)
    }

    /// Every param (in the graph and its regions) has a weight of exactly its dtype and static
    /// shape, and every weight belongs to a param.
    pub fn check_weights(&self) -> Result<(), FileError> {
        self.check_weights_at(IN_MEMORY)
    }

    fn check_weights_at(&self, path: &str) -> Result<(), FileError> {
        let params = all_params(&self.graph);
        for (name, ty) in &params {
            let Some(dims) = ty.shape.as_static() else {
                return Err(FileError::SymbolicParam {
                    path: path.into(),
                    name: name.clone(),
                    ty: ty.to_string(),
                });
            };
            let w = self.weights.get(name).ok_or_else(|| FileError::MissingWeight {
                path: path.into(),
                name: name.clone(),
                expected: ty.to_string(),
            })?;
            if w.dtype() != ty.dtype || w.shape() != dims.as_slice() {
                return Err(FileError::WeightMismatch {
                    path: path.into(),
                    name: name.clone(),
                    expected: ty.to_string(),
                    got: w.tensor_type().to_string(),
                });
            }
        }
        if let Some(name) = self.weights.keys().find(|n| !params.contains_key(*n)) {
            return Err(FileError::UnexpectedWeight {
                path: path.into(),
                name: name.clone(),
            });
        }
        Ok(())
    }

    fn encode(&self, path: &str) -> Result<Vec<u8>, FileError> {
        let graph_err = |source| FileError::Graph {
            path: path.into(),
            source,
        };
        crate::verify(&self.graph).map_err(graph_err)?;
        self.check_weights_at(path)?;
        let def = GraphDef::from_graph(&self.graph);
        if def.region_depth() > MAX_FILE_REGION_DEPTH {
            return Err(graph_err(IrError::Structure {
                graph: self.graph.name().into(),
                detail: format!("regions nest deeper than a model file holds ({MAX_FILE_REGION_DEPTH})"),
            }));
        }
        let json = serde_json::to_vec(&def).map_err(|e| {
            graph_err(IrError::Structure {
                graph: self.graph.name().into(),
                detail: format!("cannot serialize: {e}"),
            })
        })?;
        let weights = encode_weights(&self.weights).map_err(|detail| FileError::Weights {
            path: path.into(),
            detail,
        })?;
        let mut out = Vec::with_capacity(MAGIC.len() + 4 + 8 + json.len() + 8 + weights.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&json);
        out.extend_from_slice(&(weights.len() as u64).to_le_bytes());
        out.extend_from_slice(&weights);
        Ok(out)
    }
}

/// Every param of `graph` and its regions, by name. The verifier guarantees one type per name.
fn all_params(graph: &Graph) -> BTreeMap<String, TensorType> {
    let mut params = BTreeMap::new();
    let mut stack = vec![graph];
    while let Some(g) = stack.pop() {
        for id in g.node_ids() {
            let node = g.node(id);
            if let Op::Param(Param { name, ty }) = &node.op {
                params.entry(name.clone()).or_insert_with(|| ty.clone());
            }
            stack.extend(node.regions.iter());
        }
    }
    params
}

/// A cursor over hostile bytes: every read checks the remaining length first.
struct Reader<'a> {
    rest: &'a [u8],
    path: &'a str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, section: &'static str) -> Result<&'a [u8], FileError> {
        let truncated = || FileError::Truncated {
            path: self.path.into(),
            section,
        };
        let n = usize::try_from(n).map_err(|_| truncated())?;
        if n > self.rest.len() {
            return Err(truncated());
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u32(&mut self, section: &'static str) -> Result<u32, FileError> {
        let b = self.take(4, section)?;
        Ok(u32::from_le_bytes(b.try_into().expect("took 4 bytes")))
    }

    fn u64(&mut self, section: &'static str) -> Result<u64, FileError> {
        let b = self.take(8, section)?;
        Ok(u64::from_le_bytes(b.try_into().expect("took 8 bytes")))
    }
}

fn decode(bytes: &[u8], path: &str) -> Result<Model, FileError> {
    let head = &bytes[..bytes.len().min(MAGIC.len())];
    if !MAGIC.starts_with(head) || head.is_empty() {
        return Err(FileError::BadMagic { path: path.into() });
    }
    let mut r = Reader { rest: bytes, path };
    r.take(MAGIC.len() as u64, "magic")?;
    let found = r.u32("version")?;
    if found != FORMAT_VERSION {
        return Err(FileError::UnsupportedVersion {
            path: path.into(),
            found,
            supported: FORMAT_VERSION,
        });
    }
    let graph_len = r.u64("graph length")?;
    let graph_json = r.take(graph_len, "graph section")?;
    let weights_len = r.u64("weights length")?;
    let weights_blob = r.take(weights_len, "weights section")?;
    if !r.rest.is_empty() {
        return Err(FileError::TrailingBytes {
            path: path.into(),
            count: r.rest.len(),
        });
    }
    // serde_json's default recursion limit (128) stays on: it is what keeps deeply nested
    // hostile JSON from overflowing the stack.
    let def: GraphDef = serde_json::from_slice(graph_json).map_err(|e| FileError::GraphJson {
        path: path.into(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let graph_err = |source| FileError::Graph {
        path: path.into(),
        source,
    };
    let graph = def.to_graph().map_err(graph_err)?;
    let weights = decode_weights(weights_blob).map_err(|detail| FileError::Weights {
        path: path.into(),
        detail,
    })?;
    let model = Model { graph, weights };
    model.check_weights_at(path)?;
    Ok(model)
}

/// The safetensors dtype of an oar dtype (bool is one byte, 0 or 1, in both).
fn to_st_dtype(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I8 => StDtype::I8,
        DType::U8 => StDtype::U8,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::Bool => StDtype::BOOL,
    }
}

/// The oar dtype of a safetensors dtype, if oar has one.
fn from_st_dtype(d: StDtype) -> Option<DType> {
    DType::ALL.into_iter().find(|&o| to_st_dtype(o) == d)
}

/// Write `bytes` to `path` through a temp file in the same directory (`.NAME.PID-N.tmp`),
/// fsync and a rename, so a crash never leaves a half-written file over a good one; temp files
/// for the same `path` left by crashed processes are removed first. Shared by every oar file
/// writer (model files, IR text, ONNX, npy outputs, dot, compiled binaries).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_parts_atomically(path, &[bytes])
}

/// [`write_atomically`] of the concatenation of `parts`, without building it in memory (an npy
/// header and a large tensor's bytes, say).
pub fn write_parts_atomically(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path does not name a file"))?;
    remove_stale_temps(path);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    // Unique per process and per call, so concurrent saves never share a temp file.
    static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tmp_name.push(format!(".{}-{n}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        for part in parts {
            f.write_all(part)?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        // Best effort: the temp file is garbage now; the original error is what matters.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Remove `.NAME.PID-N.tmp` files next to `path` whose process is gone (a crash mid-write).
/// Best effort; only where process liveness can be checked (`/proc`).
pub fn remove_stale_temps(path: &Path) {
    let (Some(name), Some(dir)) = (path.file_name().and_then(|n| n.to_str()), path.parent()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    if !Path::new("/proc/self").exists() {
        return;
    }
    let prefix = format!(".{name}.");
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(f) = file.to_str() else { continue };
        let Some(rest) = f.strip_prefix(&prefix).and_then(|r| r.strip_suffix(".tmp")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Named tensors as a safetensors blob (every oar dtype; `__metadata__` is reserved).
pub fn encode_weights(weights: &Weights) -> Result<Vec<u8>, String> {
    let mut views = Vec::with_capacity(weights.len());
    for (name, t) in weights {
        if name == "__metadata__" {
            return Err("a weight cannot be named `__metadata__` (reserved by safetensors)".into());
        }
        let view = TensorView::new(to_st_dtype(t.dtype()), t.shape().to_vec(), t.bytes())
            .map_err(|e| format!("`{name}`: {e}"))?;
        views.push((name.as_str(), view));
    }
    safetensors::serialize(views, None).map_err(|e| e.to_string())
}

/// Named tensors from a safetensors blob; dtypes oar lacks and bool bytes other than 0/1 are
/// errors, every size is checked against the blob.
pub fn decode_weights(blob: &[u8]) -> Result<Weights, String> {
    let st = SafeTensors::deserialize(blob).map_err(|e| e.to_string())?;
    let mut weights = Weights::new();
    for (name, view) in st.iter() {
        let dtype = from_st_dtype(view.dtype())
            .ok_or_else(|| format!("`{name}` has dtype {:?}, which oar does not support", view.dtype()))?;
        if dtype == DType::Bool && view.data().iter().any(|&b| b > 1) {
            return Err(format!("`{name}` is bool but holds bytes other than 0 and 1"));
        }
        let t = TensorData::from_bytes(dtype, view.shape().to_vec(), view.data().to_vec())
            .map_err(|e| format!("`{name}`: {e}"))?;
        weights.insert(name.to_string(), t);
    }
    Ok(weights)
}
