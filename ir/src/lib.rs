//! oar-ir: the one intermediate representation every door of oar produces and every pass and
//! backend consumes — dtypes, shapes with symbolic dims, the op set with type rules and
//! decompositions, the dataflow graph with control-flow regions, the verifier, the text format,
//! the `.oar` model file, and the backend contract.

pub mod autodiff;
pub mod backend;
pub mod decompose;
pub mod device;
pub mod dot;
pub mod dtype;
pub mod emit;
pub mod error;
pub mod eval;
pub mod file;
pub mod graph;
pub mod graph_def;
pub mod kernel;
pub mod memory;
pub mod npy;
pub mod numerics;
pub mod ops;
pub mod runner;
pub mod shape;
pub mod stats;
pub mod symbolic;
pub mod tensor_data;
pub mod text;
pub mod verify;

pub use backend::{Backend, BackendError, Executable, Registry, Weights};
pub use device::{DeviceExecutable, DeviceMemory, DeviceRuntime, DeviceTensor};
pub use dtype::DType;
pub use emit::Emitter;
pub use error::IrError;
pub use graph::{Graph, Node, NodeId, Output, ValueId};
pub use ops::{Composite, Float, Op};
pub use shape::{Bindings, Dim, Shape, TensorType, bind_dims, broadcast_shapes};
pub use symbolic::SymExpr;
pub use tensor_data::{Element, TensorData};
pub use verify::verify;
