//! `oar::save` / `oar::load`: named tensors as a safetensors file (Paddle's `paddle.save` /
//! `paddle.load` for state dicts), readable by every safetensors tool.

use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData};
use safetensors::{Dtype as StDtype, SafeTensors, tensor::TensorView};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A value `oar::save` can write: a [`Tensor`] or a [`TensorData`].
pub trait ToTensorData {
    /// The value to write.
    fn to_tensor_data(&self) -> TensorData;
}

impl ToTensorData for TensorData {
    fn to_tensor_data(&self) -> TensorData {
        self.clone()
    }
}

impl ToTensorData for Tensor {
    fn to_tensor_data(&self) -> TensorData {
        self.data()
    }
}

fn io_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
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

/// Encode named tensors as safetensors bytes.
pub fn to_safetensors_bytes<V: ToTensorData>(state: &BTreeMap<String, V>) -> Result<Vec<u8>> {
    let datas: Vec<(&str, TensorData)> = state.iter().map(|(k, v)| (k.as_str(), v.to_tensor_data())).collect();
    let mut views = Vec::with_capacity(datas.len());
    for (name, d) in &datas {
        if *name == "__metadata__" {
            return Err(Error::invalid(
                "save",
                "a tensor cannot be named `__metadata__` (reserved by safetensors)",
            ));
        }
        let view = TensorView::new(to_st_dtype(d.dtype()), d.shape().to_vec(), d.bytes())
            .map_err(|e| Error::invalid("save", format!("`{name}`: {e}")))?;
        views.push((*name, view));
    }
    safetensors::serialize(views, None).map_err(|e| Error::invalid("save", e.to_string()))
}

/// Decode safetensors bytes; `what` names the source in errors.
pub fn from_safetensors_bytes(bytes: &[u8], what: &Path) -> Result<BTreeMap<String, TensorData>> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| io_err(what, format!("not a valid safetensors file: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        let dtype = DType::ALL
            .into_iter()
            .find(|&o| to_st_dtype(o) == view.dtype())
            .ok_or_else(|| {
                io_err(
                    what,
                    format!("`{name}` has dtype {:?}, which oar does not support", view.dtype()),
                )
            })?;
        if dtype == DType::Bool && view.data().iter().any(|&b| b > 1) {
            return Err(io_err(
                what,
                format!("`{name}` is bool but holds bytes other than 0 and 1"),
            ));
        }
        let d = TensorData::from_bytes(dtype, view.shape().to_vec(), view.data().to_vec())
            .map_err(|e| io_err(what, format!("`{name}`: {e}")))?;
        out.insert(name.to_string(), d);
    }
    Ok(out)
}

static SAVE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Write named tensors (`layer.state_dict()`, `optimizer.state_dict()`) to `path` as
/// safetensors. The file is written to a temporary file in the same directory and renamed over
/// `path`, so a crash never destroys an earlier save.
pub fn save<V: ToTensorData>(state: &BTreeMap<String, V>, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_safetensors_bytes(state).map_err(|e| io_err(path, e))?;
    let file_name = path
        .file_name()
        .ok_or_else(|| io_err(path, "the path does not name a file"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    // Process id and a counter: concurrent saves (threads or processes) never share a temp file.
    tmp_name.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        SAVE_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = path.with_file_name(tmp_name);
    let written = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        // Best effort: the temp file is garbage now; the original error is what matters.
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| io_err(path, e))
}

/// Read a safetensors file written by [`save`] (or any safetensors tool) into named values.
/// A missing, truncated or malformed file is an error naming the path.
pub fn load(path: impl AsRef<Path>) -> Result<BTreeMap<String, TensorData>> {
    let path = path.as_ref();
    // Memory is bounded by the file size; safetensors checks every offset against it.
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    from_safetensors_bytes(&bytes, path)
}

/// Save a layer's parameters and buffers (`layer.state_dict()`) to `path`.
pub fn save_layer<L: Layer + ?Sized>(layer: &L, path: impl AsRef<Path>) -> Result<()> {
    save(&layer.state_dict(), path)
}

/// Load `path` into a layer with [`Layer::set_state_dict`] (every entry must match; on any
/// mismatch nothing changes and the error names the entries and the file).
pub fn load_layer<L: Layer + ?Sized>(layer: &L, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let state = load(path)?;
    layer.set_state_dict(&state).map_err(|e| io_err(path, e))
}
