//! The PTX backend as a device runtime (`oar_ir::DeviceRuntime`) for eager tensors on
//! `gpu:0`: tensors live in [`GpuMemory`], and each eager op is compiled once (by the eager
//! layer's cache, per op, dtype and shape) through the same pipeline as whole graphs —
//! lowering, fusion, PTX generation — and run on device-resident buffers
//! ([`GpuProgram::run_resident`]).

use crate::compile_to_ptx;
use crate::runtime::{GpuMemory, GpuProgram, gpu};
use oar_ir::{BackendError, DeviceExecutable, DeviceMemory, DeviceRuntime, DeviceTensor, Graph, TensorData, Weights};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The `gpu` device runtime (registered by `oar` for device kind `gpu`).
#[derive(Clone, Copy, Debug, Default)]
pub struct PtxRuntime;

const NAME: &str = "ptx";

impl DeviceMemory for GpuMemory {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct OpExecutable {
    program: GpuProgram,
    inputs: Vec<String>,
    index: usize,
}

impl DeviceExecutable for OpExecutable {
    fn run(&self, inputs: &[&DeviceTensor]) -> Result<Vec<DeviceTensor>, BackendError> {
        if inputs.len() != self.inputs.len() {
            return Err(BackendError::Runtime {
                op: NAME.into(),
                value: "eager op".into(),
                detail: format!("takes {} inputs, got {}", self.inputs.len(), inputs.len()),
            });
        }
        let mut ptrs = BTreeMap::new();
        for (name, t) in self.inputs.iter().zip(inputs) {
            ptrs.insert(name.clone(), t.memory_as::<GpuMemory>(NAME)?.ptr());
        }
        let outs = self.program.run_resident(&ptrs)?;
        let p = self.program.program();
        Ok(p.outputs
            .iter()
            .zip(outs)
            .map(|((_, id), (_, m))| {
                let ty = &p.buffer(*id).ty;
                DeviceTensor {
                    dtype: ty.dtype,
                    shape: ty.shape.as_static().unwrap_or_default(),
                    index: self.index,
                    memory: Arc::new(m),
                }
            })
            .collect())
    }
}

impl DeviceRuntime for PtxRuntime {
    fn name(&self) -> &str {
        NAME
    }

    fn kind(&self) -> &str {
        "gpu"
    }

    fn check(&self, index: usize) -> Result<(), BackendError> {
        let g = gpu()?;
        if index != 0 {
            return Err(BackendError::Unavailable {
                backend: NAME.into(),
                reason: format!("gpu:{index}: the ptx runtime drives device 0 only ({})", g.name),
            });
        }
        Ok(())
    }

    fn upload(&self, index: usize, data: &TensorData) -> Result<DeviceTensor, BackendError> {
        self.check(index)?;
        let what = data.tensor_type().to_string();
        Ok(DeviceTensor {
            dtype: data.dtype(),
            shape: data.shape().to_vec(),
            index,
            memory: Arc::new(GpuMemory::upload(data.bytes(), &what)?),
        })
    }

    fn download(&self, tensor: &DeviceTensor) -> Result<TensorData, BackendError> {
        let what = tensor.tensor_type().to_string();
        tensor
            .memory_as::<GpuMemory>(NAME)?
            .to_tensor(tensor.dtype, &tensor.shape, &what)
    }

    fn compile(&self, index: usize, graph: &Graph) -> Result<Arc<dyn DeviceExecutable>, BackendError> {
        self.check(index)?;
        oar_ir::verify(graph)?;
        let arch = gpu()?.arch;
        let (program, module) = compile_to_ptx(graph, &BTreeMap::new(), arch)?;
        let inputs = graph.input_specs().into_iter().map(|(n, _)| n).collect();
        Ok(Arc::new(OpExecutable {
            program: GpuProgram::load(program, module, &Weights::new())?,
            inputs,
            index,
        }))
    }
}
