//! ONNX `TensorProto` ⇄ oar [`TensorData`], including external data files.
//!
//! Every size is checked before anything is allocated: dims must be non-negative, the byte size
//! must fit oar's tensor limit, and inline or external data must have exactly that many bytes.

use crate::error::OnnxError;
use crate::proto::{TensorProto, tensor_proto::DataType};
use oar_ir::tensor_data::checked_byte_len;
use oar_ir::{DType, TensorData};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

/// The oar dtype of an ONNX element type code, if oar has one.
pub fn dtype_from_onnx(code: i32) -> Option<DType> {
    Some(match DataType::try_from(code).ok()? {
        DataType::Float => DType::F32,
        DataType::Double => DType::F64,
        DataType::Float16 => DType::F16,
        DataType::Bfloat16 => DType::BF16,
        DataType::Int8 => DType::I8,
        DataType::Uint8 => DType::U8,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Bool => DType::Bool,
        _ => return None,
    })
}

/// The ONNX element type code of an oar dtype.
pub fn dtype_to_onnx(dtype: DType) -> i32 {
    (match dtype {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::Uint8,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::Bool => DataType::Bool,
    }) as i32
}

/// A human name for an ONNX element type code (`FLOAT`, `STRING`, ...).
pub fn onnx_type_name(code: i32) -> String {
    DataType::try_from(code)
        .map(|t| t.as_str_name().to_string())
        .unwrap_or_else(|_| format!("type code {code}"))
}

fn terr(name: &str, detail: impl Into<String>) -> OnnxError {
    OnnxError::Tensor {
        name: name.to_string(),
        detail: detail.into(),
    }
}

/// Decode a tensor; `model_dir` resolves external data (`None`: external data is an error).
pub fn tensor_from_proto(t: &TensorProto, model_dir: Option<&Path>) -> Result<TensorData, OnnxError> {
    let name = t.name.as_deref().unwrap_or("<unnamed>");
    let code = t.data_type.unwrap_or(0);
    let dtype = dtype_from_onnx(code)
        .ok_or_else(|| terr(name, format!("element type {} is not supported", onnx_type_name(code))))?;
    let mut shape = Vec::with_capacity(t.dims.len().min(64));
    for &d in &t.dims {
        shape.push(usize::try_from(d).map_err(|_| terr(name, format!("negative dim {d} in {:?}", t.dims)))?);
    }
    let nbytes = checked_byte_len(dtype, &shape).map_err(|e| terr(name, e.to_string()))?;
    let count = nbytes.checked_div(dtype.size_bytes()).unwrap_or(0);
    if t.segment.is_some() {
        return Err(terr(name, "segmented tensors are not supported"));
    }
    let bytes = if t.data_location == Some(1) {
        read_external(t, name, nbytes, model_dir)?
    } else if let Some(raw) = &t.raw_data {
        if raw.len() != nbytes {
            return Err(terr(
                name,
                format!("raw_data has {} bytes, {dtype}{shape:?} needs {nbytes}", raw.len()),
            ));
        }
        raw.clone()
    } else {
        typed_bytes(t, name, dtype, count)?
    };
    TensorData::from_bytes(dtype, shape, bytes).map_err(|e| terr(name, e.to_string()))
}

/// Little-endian bytes from the typed `*_data` fields (whose lengths are checked first).
fn typed_bytes(t: &TensorProto, name: &str, dtype: DType, count: usize) -> Result<Vec<u8>, OnnxError> {
    let check = |have: usize, field: &str| {
        if have == count {
            Ok(())
        } else {
            Err(terr(
                name,
                format!("{field} has {have} elements, the shape needs {count}"),
            ))
        }
    };
    let mut out = Vec::with_capacity(count * dtype.size_bytes());
    match dtype {
        DType::F32 => {
            check(t.float_data.len(), "float_data")?;
            t.float_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        DType::F64 => {
            check(t.double_data.len(), "double_data")?;
            t.double_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        DType::I64 => {
            check(t.int64_data.len(), "int64_data")?;
            t.int64_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        DType::I32 => {
            check(t.int32_data.len(), "int32_data")?;
            t.int32_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        DType::I8 | DType::U8 | DType::Bool => {
            check(t.int32_data.len(), "int32_data")?;
            for &v in &t.int32_data {
                if dtype == DType::Bool && !(0..=1).contains(&v) {
                    return Err(terr(name, format!("bool element {v} is not 0 or 1")));
                }
                out.push(v as u8);
            }
        }
        DType::F16 | DType::BF16 => {
            check(t.int32_data.len(), "int32_data")?;
            t.int32_data
                .iter()
                .for_each(|v| out.extend_from_slice(&(*v as u16).to_le_bytes()));
        }
    }
    Ok(out)
}

/// Read `nbytes` of external data, refusing paths that leave the model's directory.
fn read_external(t: &TensorProto, name: &str, nbytes: usize, model_dir: Option<&Path>) -> Result<Vec<u8>, OnnxError> {
    let entry = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key.as_deref() == Some(key))
            .and_then(|e| e.value.clone())
    };
    let location = entry("location").ok_or_else(|| terr(name, "external data has no `location`"))?;
    let rel = Path::new(&location);
    if rel.as_os_str().is_empty()
        || !rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(terr(
            name,
            format!("external data location `{location}` must be a relative path inside the model's directory"),
        ));
    }
    let dir = model_dir.ok_or_else(|| terr(name, "external data needs the model's file path (load it from a file)"))?;
    let parse = |key: &str| -> Result<Option<u64>, OnnxError> {
        entry(key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| terr(name, format!("external data {key} `{v}` is not a number")))
            })
            .transpose()
    };
    let offset = parse("offset")?.unwrap_or(0);
    if let Some(len) = parse("length")?
        && len != nbytes as u64
    {
        return Err(terr(
            name,
            format!("external data length {len} but the shape needs {nbytes} bytes"),
        ));
    }
    let joined = dir.join(rel);
    let io = |source| OnnxError::Io {
        path: joined.display().to_string(),
        source,
    };
    // Symlinks are resolved before the check: a link (or a linked directory) pointing out of the
    // model's directory is refused like `../`, as onnx and onnxruntime do. Only regular files are
    // read (a FIFO would block).
    let path = joined.canonicalize().map_err(io)?;
    let root = dir.canonicalize().map_err(io)?;
    if !path.starts_with(&root) {
        return Err(terr(
            name,
            format!(
                "external data location `{location}` resolves to {}, outside the model's directory {}",
                path.display(),
                root.display()
            ),
        ));
    }
    if !std::fs::metadata(&path).map_err(io)?.is_file() {
        return Err(terr(
            name,
            format!("external data location `{location}` is not a regular file"),
        ));
    }
    let mut f = std::fs::File::open(&path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    if offset.checked_add(nbytes as u64).is_none_or(|end| end > size) {
        return Err(terr(
            name,
            format!(
                "external data {}: {nbytes} bytes at offset {offset} exceed the file ({size} bytes)",
                path.display()
            ),
        ));
    }
    f.seek(SeekFrom::Start(offset)).map_err(io)?;
    let mut buf = vec![0u8; nbytes];
    f.read_exact(&mut buf).map_err(io)?;
    Ok(buf)
}

/// Encode a tensor with `raw_data`.
pub fn tensor_to_proto(name: &str, t: &TensorData) -> TensorProto {
    TensorProto {
        name: Some(name.to_string()),
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(dtype_to_onnx(t.dtype())),
        raw_data: Some(t.bytes().to_vec()),
        ..Default::default()
    }
}
