//! [`HostRuntime`]: a device runtime whose "device memory" is host memory and whose kernels
//! come from any registered [`Backend`]. It exercises the whole eager device path (placement,
//! dispatch, the op cache, autograd, copies) on machines without an accelerator, and is the
//! smallest complete example of the [`DeviceRuntime`] contract for a vendor to start from.

use oar_ir::{
    Backend, BackendError, DeviceExecutable, DeviceMemory, DeviceRuntime, DeviceTensor, Executable, Graph, TensorData,
    Weights,
};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A device kind backed by host memory, compiling through `backend`.
pub struct HostRuntime {
    kind: String,
    name: String,
    devices: usize,
    backend: Arc<dyn Backend>,
    compiles: AtomicUsize,
    downloads: AtomicUsize,
}

impl HostRuntime {
    /// Devices `kind:0 .. kind:devices-1`, kernels compiled by `backend`.
    pub fn new(kind: &str, devices: usize, backend: Arc<dyn Backend>) -> HostRuntime {
        HostRuntime {
            kind: kind.to_string(),
            name: format!("host+{}", backend.name()),
            devices,
            backend,
            compiles: AtomicUsize::new(0),
            downloads: AtomicUsize::new(0),
        }
    }

    /// How many graphs this runtime compiled.
    pub fn compiles(&self) -> usize {
        self.compiles.load(Ordering::Relaxed)
    }

    /// How many tensors were copied from this runtime's devices to the host.
    pub fn downloads(&self) -> usize {
        self.downloads.load(Ordering::Relaxed)
    }
}

struct HostMemory(TensorData);

impl DeviceMemory for HostMemory {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct HostExecutable {
    graph: Graph,
    exe: Box<dyn Executable>,
    index: usize,
    runtime: String,
}

impl DeviceExecutable for HostExecutable {
    fn run(&self, inputs: &[&DeviceTensor]) -> Result<Vec<DeviceTensor>, BackendError> {
        let specs = self.graph.input_specs();
        if specs.len() != inputs.len() {
            return Err(BackendError::Runtime {
                op: self.graph.name().to_string(),
                value: self.runtime.clone(),
                detail: format!("takes {} inputs, got {}", specs.len(), inputs.len()),
            });
        }
        let mut feeds = BTreeMap::new();
        for ((name, _), t) in specs.iter().zip(inputs) {
            feeds.insert(name.clone(), t.memory_as::<HostMemory>(&self.runtime)?.0.clone());
        }
        Ok(self
            .exe
            .run(&feeds)?
            .into_iter()
            .map(|(_, d)| device_tensor(self.index, d))
            .collect())
    }
}

fn device_tensor(index: usize, d: TensorData) -> DeviceTensor {
    DeviceTensor {
        dtype: d.dtype(),
        shape: d.shape().to_vec(),
        index,
        memory: Arc::new(HostMemory(d)),
    }
}

impl DeviceRuntime for HostRuntime {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &str {
        &self.kind
    }

    fn check(&self, index: usize) -> Result<(), BackendError> {
        if index < self.devices {
            return Ok(());
        }
        Err(BackendError::Unavailable {
            backend: self.name.clone(),
            reason: format!("no device {}:{index} (it has {} devices)", self.kind, self.devices),
        })
    }

    fn upload(&self, index: usize, data: &TensorData) -> Result<DeviceTensor, BackendError> {
        self.check(index)?;
        Ok(device_tensor(index, data.clone()))
    }

    fn download(&self, tensor: &DeviceTensor) -> Result<TensorData, BackendError> {
        self.downloads.fetch_add(1, Ordering::Relaxed);
        Ok(tensor.memory_as::<HostMemory>(&self.name)?.0.clone())
    }

    fn compile(&self, index: usize, graph: &Graph) -> Result<Arc<dyn DeviceExecutable>, BackendError> {
        self.check(index)?;
        let exe = self.backend.compile(graph, &Weights::new())?;
        self.compiles.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(HostExecutable {
            graph: graph.clone(),
            exe,
            index,
            runtime: self.name.clone(),
        }))
    }
}
