//! Eager tensors: values you can inspect at any time, with autograd.

mod apply;
mod create;
mod display;
pub(crate) mod intercept;
mod methods;
mod operators;
mod ordering;
mod view;

pub(crate) use apply::{apply, apply1};

/// Apply any IR op to eager tensors (the escape hatch under every method).
pub fn apply_op(op: oar_ir::Op, inputs: &[&Tensor]) -> crate::Result<Vec<Tensor>> {
    apply(op, inputs)
}

/// How many (op, operand types) eager CPU ops have been compiled to machine code and are
/// cached in this process (each later call with the same op and types reuses its code).
pub fn compiled_eager_ops() -> usize {
    crate::kernels::cached()
}

/// The eager CPU kernels compiled in this process that leave a part of their program to the
/// reference interpreter (`op: kernel k: reason`; the first 1024). Empty is the design: every
/// eager op runs generated or native code (`random` the runtime's generator; constants and
/// control flow are run by the caller), and the interpreter is only the tests' oracle.
pub fn interpreted_eager_kernels() -> Vec<String> {
    crate::kernels::interpreted()
}
pub use create::{arange, full, full_dims, linspace, normal, ones, rand, randn, seed, uniform, zeros, zeros_dims};
pub(crate) use create::{with_generator, with_rng, with_sample_rng};
pub use intercept::SYMBOLIC_SIZE;
pub use methods::{
    abs, add, cast, ceil, concat, cos, divide, erf, exp, floor, log, matmul, max, maximum, mean, min, minimum,
    multiply, prod, reshape, round, rsqrt, sign, sin, sqrt, stack, subtract, sum, tanh, transpose, where_,
};
#[allow(unused_imports)]
pub(crate) use methods::{norm_axes, norm_axis};

use crate::autograd::GradNode;
use crate::device::Device;
use crate::error::{Error, Result};
use oar_ir::{DType, DeviceTensor, Dim, Element, TensorData, TensorType};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A handle to an eager tensor. Cloning is cheap and shares the tensor (like a Python reference).
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Inner>);

pub(crate) struct Inner {
    pub(crate) id: u64,
    data: RwLock<Storage>,
    pub(crate) stop_gradient: AtomicBool,
    grad: Mutex<Option<Tensor>>,
    /// The recorded op that produced this tensor, and which of its outputs it is.
    pub(crate) creator: Option<(Arc<GradNode>, usize)>,
    /// Set while `jit::to_static` traces: the tensor is a value of the graph being built and
    /// has no data (`data` holds an empty placeholder).
    pub(crate) trace: Option<intercept::Traced>,
}

/// A host tensor's value held for writing ([`Tensor::host_data_mut`]).
pub(crate) struct HostDataMut<'a>(std::sync::RwLockWriteGuard<'a, Storage>);

impl HostDataMut<'_> {
    /// The value (always `Some`: the guard is made for host storage only).
    pub(crate) fn data(&mut self) -> Option<&mut TensorData> {
        match &mut *self.0 {
            Storage::Host(d) => Some(d),
            Storage::View(_) | Storage::Device { .. } => None,
        }
    }
}

/// Where a tensor's elements are: host memory, or a device runtime's memory.
#[derive(Clone)]
pub(crate) enum Storage {
    Host(TensorData),
    /// A zero-copy view of host bytes (reshape, permute, slice, expand): see [`view`].
    View(view::View),
    Device {
        device: Device,
        tensor: DeviceTensor,
    },
}

impl Storage {
    pub(crate) fn dtype(&self) -> DType {
        match self {
            Storage::Host(d) => d.dtype(),
            Storage::View(v) => v.dtype(),
            Storage::Device { tensor, .. } => tensor.dtype,
        }
    }

    fn shape(&self) -> Vec<usize> {
        match self {
            Storage::Host(d) => d.shape().to_vec(),
            Storage::View(v) => v.shape().to_vec(),
            Storage::Device { tensor, .. } => tensor.shape.clone(),
        }
    }

    fn device(&self) -> Device {
        match self {
            Storage::Host(_) | Storage::View(_) => Device::CPU,
            Storage::Device { device, .. } => device.clone(),
        }
    }

    fn to_host(&self) -> Result<TensorData> {
        match self {
            Storage::Host(d) => Ok(d.clone()),
            Storage::View(v) => Ok(v.materialize()),
            Storage::Device { device, tensor } => crate::device::download(device, tensor),
        }
    }

    /// This value placed on `device` (a download, an upload, or both). The target's runtime
    /// is checked before anything is copied.
    fn moved_to(&self, device: &Device) -> Result<Storage> {
        if device.is_cpu() {
            return Ok(Storage::Host(self.to_host()?));
        }
        let runtime = crate::device::runtime_for(device)?;
        Ok(Storage::Device {
            tensor: runtime.upload(device.index(), &self.to_host()?)?,
            device: device.clone(),
        })
    }
}

impl Tensor {
    /// A tensor holding `data` (on the CPU, no gradient).
    pub fn from_data(data: TensorData) -> Tensor {
        Tensor::make(data, None)
    }

    pub(crate) fn make(data: TensorData, creator: Option<(Arc<GradNode>, usize)>) -> Tensor {
        Tensor::make_in(Storage::Host(data), creator)
    }

    /// A tensor in `storage`, produced by `creator` (none: a leaf without gradient).
    pub(crate) fn make_in(storage: Storage, creator: Option<(Arc<GradNode>, usize)>) -> Tensor {
        let stop = creator.is_none();
        Tensor(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            data: RwLock::new(storage),
            stop_gradient: AtomicBool::new(stop),
            grad: Mutex::new(None),
            creator,
            trace: None,
        }))
    }

    /// A traced tensor: a value of the graph `to_static` is building.
    pub(crate) fn traced(trace: intercept::Traced) -> Tensor {
        let placeholder = placeholder(trace.dtype);
        Tensor(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            data: RwLock::new(Storage::Host(placeholder)),
            stop_gradient: AtomicBool::new(true),
            grad: Mutex::new(None),
            creator: None,
            trace: Some(trace),
        }))
    }

    /// The same traced value, recorded on the tape as output `index` of `node`.
    pub(crate) fn with_creator(self, node: Arc<GradNode>, index: usize) -> Tensor {
        let trace = self.0.trace.clone();
        let float = self.dtype().is_float();
        Tensor(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            data: RwLock::new(self.storage()),
            stop_gradient: AtomicBool::new(!float),
            grad: Mutex::new(None),
            creator: Some((node, index)),
            trace,
        }))
    }

    /// True while this tensor is a value of a graph being traced (it has no data).
    pub fn is_traced(&self) -> bool {
        self.0.trace.is_some()
    }

    fn no_value(&self, op: &str) -> Error {
        Error::invalid(
            op,
            format!(
                "{} is traced by to_static: its value is only known when the graph runs",
                self.tensor_type()
            ),
        )
    }

    /// A tensor from elements and a shape (`Tensor::from_vec(vec![1.0f32, 2.0], &[2])`).
    pub fn from_vec<T: Element>(values: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Ok(Tensor::from_data(TensorData::from_vec(shape.to_vec(), values)?))
    }

    /// A 1-d tensor copied from a slice.
    pub fn from_slice<T: Element>(values: &[T]) -> Tensor {
        Tensor::from_data(TensorData::from_vec(vec![values.len()], values.to_vec()).expect("length matches"))
    }

    /// A 0-d tensor.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor::from_data(TensorData::scalar(v))
    }

    /// A unique id (stable for the tensor's life).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    fn stored(&self) -> std::sync::RwLockReadGuard<'_, Storage> {
        self.0.data.read().unwrap_or_else(|e| e.into_inner())
    }

    fn store(&self, storage: Storage) {
        *self.0.data.write().unwrap_or_else(|e| e.into_inner()) = storage;
    }

    pub(crate) fn storage(&self) -> Storage {
        self.stored().clone()
    }

    /// The tensor's device memory, if it lives on a device.
    pub(crate) fn device_tensor(&self) -> Option<DeviceTensor> {
        match &*self.stored() {
            Storage::Host(_) | Storage::View(_) => None,
            Storage::Device { tensor, .. } => Some(tensor.clone()),
        }
    }

    /// The current value on the host (cheap for a CPU tensor: shares the bytes; a device
    /// tensor is downloaded). A traced tensor has no value, and a download can fail (a lost
    /// device): then this returns an empty placeholder; [`Tensor::try_data`] says why instead.
    pub fn data(&self) -> TensorData {
        self.try_data().unwrap_or_else(|_| placeholder(self.dtype()))
    }

    /// The current value on the host, or an error for a traced tensor or a failed download.
    pub fn try_data(&self) -> Result<TensorData> {
        if self.is_traced() {
            return Err(self.no_value("data"));
        }
        self.storage().to_host()
    }

    /// Whether the elements are dense in row-major order — false for most views (a transpose,
    /// a strided slice, an expand), which [`Tensor::contiguous`] copies. Device tensors are.
    pub fn is_contiguous(&self) -> bool {
        match &*self.stored() {
            Storage::View(v) => v.is_dense(),
            _ => true,
        }
    }

    /// This tensor with its elements in dense memory: itself when they are; for a view, a copy
    /// (gradients flow through it). Kernels read views themselves (each read copies the
    /// elements it needs); call this to copy once when a view is read many times.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() || self.is_traced() {
            return Ok(self.clone());
        }
        apply::dense_copy(self)
    }

    /// Whether the two tensors read the same host memory: a view and its source do (eager
    /// reshape, transpose, slice and expand copy nothing), a copy does not. Device tensors never
    /// report sharing.
    pub fn shares_memory(&self, other: &Tensor) -> bool {
        // The first byte of the host memory read (none for device tensors and empty values).
        let start = |t: &Tensor| {
            let storage = t.stored();
            let bytes = match &*storage {
                Storage::Host(d) => d.bytes(),
                Storage::View(v) => v.base().bytes(),
                Storage::Device { .. } => return None,
            };
            (!bytes.is_empty()).then_some(bytes.as_ptr() as usize)
        };
        matches!((start(self), start(other)), (Some(a), Some(b)) if a == b)
    }

    /// Replace the value in place (same dtype and shape), e.g. an optimizer step. Not recorded
    /// by autograd.
    pub fn set_data(&self, data: TensorData) -> Result<()> {
        if self.is_traced() {
            return Err(self.no_value("set_data"));
        }
        let (dtype, shape, device) = {
            let d = self.stored();
            (d.dtype(), d.shape(), d.device())
        };
        if dtype != data.dtype() || shape != data.shape() {
            return Err(Error::invalid(
                "set_data",
                format!(
                    "tensor is {}, new value is {}",
                    TensorType::of(dtype, &shape),
                    data.tensor_type()
                ),
            ));
        }
        let new = if device.is_cpu() {
            Storage::Host(data)
        } else {
            Storage::Device {
                tensor: crate::device::upload(&device, &data)?,
                device,
            }
        };
        self.store(new);
        Ok(())
    }

    /// Run `f` on this host tensor's value in place (an optimizer step); `None` for a device
    /// or traced tensor. Not recorded by autograd. Bytes shared with another value (a
    /// tensor from [`Tensor::data`], a saved input of a retained graph) are copied before the
    /// first write, so those keep what they saw.
    pub(crate) fn with_host_data_mut<R>(&self, f: impl FnOnce(&mut TensorData) -> R) -> Option<R> {
        if self.is_traced() {
            return None;
        }
        let mut guard = self.0.data.write().unwrap_or_else(|e| e.into_inner());
        if let Storage::View(v) = &*guard {
            *guard = Storage::Host(v.materialize());
        }
        match &mut *guard {
            Storage::Host(d) => Some(f(d)),
            Storage::View(_) | Storage::Device { .. } => None,
        }
    }

    /// Write access to this host tensor's value until the guard drops (an optimizer's
    /// multi-tensor step holds one per parameter at once); `None` for a device or traced
    /// tensor. Not recorded by autograd; shared bytes are copied before the first write, as
    /// in [`Tensor::with_host_data_mut`].
    pub(crate) fn host_data_mut(&self) -> Option<HostDataMut<'_>> {
        if self.is_traced() {
            return None;
        }
        let mut guard = self.0.data.write().unwrap_or_else(|e| e.into_inner());
        if let Storage::View(v) = &*guard {
            *guard = Storage::Host(v.materialize());
        }
        matches!(&*guard, Storage::Host(_)).then_some(HostDataMut(guard))
    }

    /// Whether `other` is this very tensor (not a copy or a view of it).
    pub(crate) fn is(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Replace the value with `value`'s (same dtype and shape; kept on this tensor's device):
    /// shares the memory when both are on the same device, so a device tensor is updated
    /// without a round trip through the host. Not recorded by autograd; the gradient stays.
    pub(crate) fn set_value(&self, value: &Tensor) -> Result<()> {
        if self.is_traced() || value.is_traced() {
            return Err(self.no_value("set_value"));
        }
        if self.tensor_type() != value.tensor_type() {
            return Err(Error::invalid(
                "set_data",
                format!("tensor is {}, new value is {}", self.tensor_type(), value.tensor_type()),
            ));
        }
        if self.device() != value.device() {
            return self.set_data(value.try_data()?);
        }
        let storage = value.storage();
        self.store(storage);
        Ok(())
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match &self.0.trace {
            Some(t) => t.dtype,
            None => self.stored().dtype(),
        }
    }

    /// Shape. While tracing (`jit::to_static`), a symbolic dim reads as
    /// [`SYMBOLIC_SIZE`](intercept::SYMBOLIC_SIZE), which no op or constructor accepts: code
    /// that must run traced reads [`Tensor::dims`] instead.
    pub fn shape(&self) -> Vec<usize> {
        match &self.0.trace {
            Some(t) => t
                .dims
                .iter()
                .map(|d| d.as_static().unwrap_or(intercept::SYMBOLIC_SIZE))
                .collect(),
            None => self.stored().shape(),
        }
    }

    /// The dims: the shape, with symbolic sizes (`N`, `N*C`) while tracing. Sizes computed
    /// from them (`Dim::mul`, `Dim::add`, `Dim::floor_div`) go into [`Tensor::reshape_dims`],
    /// [`Tensor::broadcast_to_dims`] and [`full_dims`].
    pub fn dims(&self) -> Vec<Dim> {
        match &self.0.trace {
            Some(t) => t.dims.clone(),
            None => self.stored().shape().into_iter().map(Dim::Static).collect(),
        }
    }

    /// Number of axes.
    pub fn ndim(&self) -> usize {
        match &self.0.trace {
            Some(t) => t.dims.len(),
            None => self.stored().shape().len(),
        }
    }

    /// Number of elements (saturating while tracing, where symbolic dims are huge).
    pub fn numel(&self) -> usize {
        self.shape().iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// dtype and shape as an IR type (symbolic dims included while tracing).
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype(), self.dims())
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> Device {
        self.stored().device()
    }

    /// The tensor on `device` (`cpu`, `gpu:0`, or any kind with a registered runtime, see
    /// [`crate::device::register_runtime`]): the same tensor if it is there already, else a
    /// copy. A leaf's copy is a leaf with the same `stop_gradient`; moving a tensor that a
    /// recorded op produced is not differentiable (an error: move the leaves instead).
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        let from = self.device();
        if *device == from {
            return Ok(self.clone());
        }
        if self.is_traced() {
            return Err(self.no_value("to"));
        }
        if !self.is_leaf() && self.requires_grad() && crate::is_grad_enabled() {
            return Err(Error::invalid(
                "to",
                format!(
                    "{} on {from} was computed by recorded ops: moving it to {device} would cut \
                     its gradient; move the leaves (inputs, `Layer::to` for parameters) first, or \
                     `.detach()` it",
                    self.tensor_type()
                ),
            ));
        }
        let t = Tensor::make_in(self.storage_on(device)?, None);
        t.0.stop_gradient.store(self.stop_gradient(), Ordering::Relaxed);
        Ok(t)
    }

    /// This tensor's value placed on `device` (a download, an upload, or both).
    pub(crate) fn storage_on(&self, device: &Device) -> Result<Storage> {
        if self.is_traced() {
            return Err(self.no_value("to"));
        }
        self.storage().moved_to(device)
    }

    /// Swap in a moved value (same dtype and shape) and drop the gradient.
    pub(crate) fn replace_storage(&self, storage: Storage) {
        self.store(storage);
        self.clear_grad();
    }

    /// The tensor on the host CPU (`to(&Device::CPU)`).
    pub fn cpu(&self) -> Result<Tensor> {
        self.to(&Device::CPU)
    }

    /// The elements as `T` (must be the tensor's dtype).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.try_data()?.to_vec::<T>()?)
    }

    /// The single element of a one-element tensor, as f64.
    pub fn item(&self) -> Result<f64> {
        let d = self.try_data()?;
        if d.len() != 1 {
            return Err(Error::invalid(
                "item",
                format!("tensor {} has {} elements, not 1", d.tensor_type(), d.len()),
            ));
        }
        Ok(d.to_f64_vec()[0])
    }

    /// Paddle's `stop_gradient`: true means no gradient flows into this tensor.
    pub fn stop_gradient(&self) -> bool {
        self.0.stop_gradient.load(Ordering::Relaxed)
    }

    /// Set `stop_gradient` (false makes a leaf trainable). Only float tensors take gradients.
    pub fn set_stop_gradient(&self, stop: bool) -> Result<()> {
        if !stop && !self.dtype().is_float() {
            return Err(Error::invalid(
                "set_stop_gradient",
                format!("{} cannot require a gradient", self.tensor_type()),
            ));
        }
        self.0.stop_gradient.store(stop, Ordering::Relaxed);
        Ok(())
    }

    /// PyTorch's name for `!stop_gradient`.
    pub fn requires_grad(&self) -> bool {
        !self.stop_gradient()
    }

    /// Builder form of `set_stop_gradient(!requires)`.
    pub fn requires_grad_(self, requires: bool) -> Result<Tensor> {
        self.set_stop_gradient(!requires)?;
        Ok(self)
    }

    /// True if no recorded op produced this tensor.
    pub fn is_leaf(&self) -> bool {
        self.0.creator.is_none()
    }

    /// The accumulated gradient of a leaf, if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.0.grad.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Forget the accumulated gradient (Paddle `clear_gradient`, PyTorch `zero_grad`).
    pub fn clear_grad(&self) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(crate) fn set_grad(&self, g: Option<Tensor>) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = g;
    }

    /// A new leaf sharing this value, cut from the autograd graph.
    pub fn detach(&self) -> Tensor {
        match &self.0.trace {
            Some(t) => Tensor::traced(t.clone()),
            None => Tensor::make_in(self.storage(), None),
        }
    }

    /// Save as a numpy `.npy` file.
    pub fn save_npy(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let p = path.as_ref();
        oar_ir::npy::write_npy(p, &self.try_data()?).map_err(|e| Error::Io {
            path: p.display().to_string(),
            detail: e.to_string(),
        })
    }

    /// Load a numpy `.npy` file.
    pub fn load_npy(path: impl AsRef<std::path::Path>) -> Result<Tensor> {
        let p = path.as_ref();
        let d = oar_ir::npy::read_npy(p).map_err(|e| Error::Io {
            path: p.display().to_string(),
            detail: e.to_string(),
        })?;
        Ok(Tensor::from_data(d))
    }
}

/// The empty value a tensor without data shows (traced, or a failed download).
fn placeholder(dtype: DType) -> TensorData {
    TensorData::from_bytes(dtype, vec![0], vec![]).expect("an empty tensor is valid")
}
