//! The device-runtime contract: what a backend implements so that *eager* tensors can live on
//! its device (`Tensor::to(&Device::gpu(0))`) and eager ops run there.
//!
//! A [`DeviceRuntime`] serves one device kind (`gpu`, `npu`, ...). It moves tensors between the
//! host and its memory ([`DeviceRuntime::upload`], [`DeviceRuntime::download`]) and compiles
//! small graphs — in eager mode one primitive op with static shapes — into a
//! [`DeviceExecutable`] whose inputs and outputs stay in device memory. The eager layer (crate
//! `oar`, `oar::device`) owns the dispatch: it checks types with the shared type rules, keeps
//! one compiled executable per (op, input dtypes and shapes) in a bounded cache, records
//! autograd, and frees memory when the last tensor handle drops. See `docs/BACKENDS.md`.

use crate::backend::BackendError;
use crate::{DType, Graph, TensorData, TensorType};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Memory owned by a device runtime; dropping it frees the allocation.
pub trait DeviceMemory: Send + Sync + 'static {
    /// For the runtime that made it, to recover its own type (`downcast_ref`).
    fn as_any(&self) -> &dyn Any;
}

/// A tensor in device memory: its element type, static shape and the memory.
/// Cloning shares the memory.
#[derive(Clone)]
pub struct DeviceTensor {
    /// Element type.
    pub dtype: DType,
    /// Static shape.
    pub shape: Vec<usize>,
    /// Which device of the runtime's kind holds it (`gpu:<index>`).
    pub index: usize,
    /// The memory (row-major, `dtype.size_bytes() * numel` bytes).
    pub memory: Arc<dyn DeviceMemory>,
}

impl DeviceTensor {
    /// dtype and shape as an IR type.
    pub fn tensor_type(&self) -> TensorType {
        TensorType::of(self.dtype, &self.shape)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.numel() * self.dtype.size_bytes()
    }

    /// The memory as the runtime's own type, or a typed error naming `runtime` when the tensor
    /// was made by another runtime.
    pub fn memory_as<M: DeviceMemory>(&self, runtime: &str) -> Result<&M, BackendError> {
        self.memory
            .as_any()
            .downcast_ref::<M>()
            .ok_or_else(|| BackendError::Runtime {
                op: "device".into(),
                value: self.tensor_type().to_string(),
                detail: format!("this tensor's memory was not allocated by the `{runtime}` device runtime"),
            })
    }
}

impl fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceTensor({} on device {})", self.tensor_type(), self.index)
    }
}

/// A graph compiled for a device, run on device-resident tensors.
pub trait DeviceExecutable: Send + Sync {
    /// Run with the graph's inputs in declaration order (already checked against its types);
    /// returns freshly allocated outputs in the graph's output order.
    fn run(&self, inputs: &[&DeviceTensor]) -> Result<Vec<DeviceTensor>, BackendError>;
}

/// A runtime for one kind of device. Register it with `oar::device::register_runtime`.
pub trait DeviceRuntime: Send + Sync {
    /// The runtime's name (for errors: `ptx`).
    fn name(&self) -> &str;
    /// The device kind it serves (`gpu`): tensors on `Device::new(kind, i)` use it.
    fn kind(&self) -> &str;
    /// Whether device `index` is usable; a typed [`BackendError::Unavailable`] saying why not
    /// (no driver, no such device). Must never panic, also without the vendor's libraries.
    fn check(&self, index: usize) -> Result<(), BackendError>;
    /// Copy a host tensor to device `index`.
    fn upload(&self, index: usize, data: &TensorData) -> Result<DeviceTensor, BackendError>;
    /// Copy a device tensor (made by this runtime) to the host.
    fn download(&self, tensor: &DeviceTensor) -> Result<TensorData, BackendError>;
    /// Compile `graph` (static shapes, no parameters) for device `index`.
    fn compile(&self, index: usize, graph: &Graph) -> Result<Arc<dyn DeviceExecutable>, BackendError>;
}
