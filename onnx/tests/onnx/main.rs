//! ONNX import/export tests, in one binary: round trips, ONNX Runtime on exported models, and real PyTorch-exported models.

mod onnx_import_export;
mod ort_export;
mod quant_models;
mod torch_models;
