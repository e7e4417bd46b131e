//! oar-onnx: ONNX import and export.

/// The ONNX protobuf messages, generated from `proto/onnx.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}
