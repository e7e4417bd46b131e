//! oar: a deep-learning framework and compiler in Rust.
//!
//! Everything meets in one IR ([`ir`]): graphs come from eager tracing, ONNX import or IR text,
//! pass through [`passes`], and run on a [`backend`] (the reference interpreter today; Cranelift,
//! PTX and MLIR code generators build on the same contract).

pub mod backend;

pub use oar_backend_reference as reference;
pub use oar_ir as ir;
pub use oar_passes as passes;
