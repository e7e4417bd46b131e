//! oar: a deep-learning framework and compiler in Rust.
//!
//! Eager by default: [`Tensor`]s compute immediately and record a tape for [`Tensor::backward`].
//! Everything meets in one IR ([`ir`]): graphs come from tracing, ONNX import or IR text, pass
//! through [`passes`], and run on a [`backend`] (the reference interpreter today; Cranelift,
//! PTX and MLIR code generators build on the same contract).

pub mod amp;
pub mod autograd;
pub mod backend;
pub mod device;
pub mod distributed;
pub mod error;
pub mod hapi;
pub mod io;
pub mod jit;
mod kernels;
pub mod lowering;
pub mod metric;
pub mod nn;
pub mod optimizer;
#[cfg(feature = "ps")]
pub mod ps;
pub mod quantization;
pub mod rec;
pub mod serialization;
pub mod tensor;
pub mod text;
pub mod vision;

pub use autograd::{is_grad_enabled, no_grad, set_grad_enabled, with_no_grad};
pub use device::Device;
pub use error::{Error, Result};
pub use hapi::Model;
pub use nn::functional::einsum;
pub use oar_ir::DType;
pub use oar_ir::Dim;
pub use oar_ir::numerics::check_nan_inf;
pub use oar_macros::to_static;
pub use serialization::{load, load_layer, save, save_layer};
pub use tensor::{
    SYMBOLIC_SIZE, Tensor, abs, add, arange, cast, ceil, concat, cos, divide, erf, exp, floor, full, full_dims,
    linspace, log, matmul, max, maximum, mean, min, minimum, multiply, normal, ones, prod, rand, randn, reshape, round,
    rsqrt, seed, sign, sin, sqrt, stack, subtract, sum, tanh, transpose, uniform, where_, zeros, zeros_dims,
};

pub use oar_backend_cpu as cpu;
pub use oar_backend_reference as reference;
pub use oar_ir as ir;
pub use oar_onnx as onnx;
pub use oar_passes as passes;
