//! `oar::save` / `oar::load`: named tensors as a safetensors file (Paddle's `paddle.save` /
//! `paddle.load` for state dicts), readable by every safetensors tool.

use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::tensor::Tensor;
use oar_ir::TensorData;
use oar_ir::file::{decode_weights, encode_weights, write_atomically};
use std::collections::BTreeMap;
use std::path::Path;

/// A value `oar::save` can write: a [`Tensor`] or a [`TensorData`].
pub trait ToTensorData {
    /// The value to write (a device tensor is downloaded; a traced one is an error).
    fn to_tensor_data(&self) -> Result<TensorData>;
}

impl ToTensorData for TensorData {
    fn to_tensor_data(&self) -> Result<TensorData> {
        Ok(self.clone())
    }
}

impl ToTensorData for Tensor {
    fn to_tensor_data(&self) -> Result<TensorData> {
        self.try_data()
    }
}

fn io_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// Encode named tensors as safetensors bytes.
pub fn to_safetensors_bytes<V: ToTensorData>(state: &BTreeMap<String, V>) -> Result<Vec<u8>> {
    let weights = state
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.to_tensor_data()?)))
        .collect::<Result<_>>()?;
    encode_weights(&weights).map_err(|e| Error::invalid("save", e))
}

/// Decode safetensors bytes; `what` names the source in errors.
pub fn from_safetensors_bytes(bytes: &[u8], what: &Path) -> Result<BTreeMap<String, TensorData>> {
    decode_weights(bytes).map_err(|e| io_err(what, format!("not a readable safetensors file: {e}")))
}

/// Write named tensors (`layer.state_dict()`, `optimizer.state_dict()`) to `path` as
/// safetensors. The file is written to a temporary file in the same directory and renamed over
/// `path`, so a crash never destroys an earlier save.
pub fn save<V: ToTensorData>(state: &BTreeMap<String, V>, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_safetensors_bytes(state).map_err(|e| io_err(path, e))?;
    write_atomically(path, &bytes).map_err(|e| io_err(path, e))
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
