//! oar-onnx: the ONNX door of oar. [`load`] / [`from_bytes`] import an `.onnx` model into an
//! [`oar_ir::file::Model`] (graph + weights); [`save`] / [`to_bytes`] export one.
//!
//! Import and export go through one mapping table per op family (`table.rs`: the ONNX op types
//! each family file imports and the oar ops it writes back, side by side; composites without a
//! writer are exported as their decompositions). Import keeps `dim_param` dims
//! symbolic, reads initializers (raw, typed or external data) as weights, and folds nodes whose
//! inputs are all constant. A model with unsupported ops fails with one error listing them all.

mod check;
mod error;
mod export;
mod import;
mod ops;
mod ops_elementwise;
mod ops_nn;
mod ops_quant;
mod ops_rnn;
mod ops_shape;
mod ops_vision;
mod shape_values;
mod table;
pub mod tensor;

/// The ONNX protobuf messages, generated from `proto/onnx.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

pub use error::{OnnxError, UnsupportedNode};
pub use export::{save, to_bytes};
pub use import::{ImportOptions, MAX_OPSET, from_bytes, from_bytes_with, load, model_opset};
pub use table::supported_ops;
