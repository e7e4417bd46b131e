//! Device runtimes by kind, and the eager dispatch onto them: one compiled executable per
//! (runtime, device, op, input types), kept in a bounded cache.

use super::Device;
use crate::error::{Error, Result};
use oar_ir::backend::BoundedCache;
use oar_ir::{BackendError, DeviceExecutable, DeviceRuntime, DeviceTensor, Graph, Op, TensorData, TensorType};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

/// Most compiled eager ops kept; the cache is emptied when full (memory stays bounded).
const CACHE_CAPACITY: usize = 2048;

fn registry() -> &'static RwLock<Vec<Arc<dyn DeviceRuntime>>> {
    static RUNTIMES: OnceLock<RwLock<Vec<Arc<dyn DeviceRuntime>>>> = OnceLock::new();
    RUNTIMES.get_or_init(|| {
        // The PTX runtime serves `gpu`: constructing it touches no driver; without one, every
        // use reports `BackendError::Unavailable`.
        RwLock::new(vec![
            Arc::new(oar_backend_ptx::eager::PtxRuntime) as Arc<dyn DeviceRuntime>
        ])
    })
}

/// Register (or replace) the runtime for its device kind: afterwards `Tensor::to` accepts
/// devices of that kind and eager ops on such tensors run through it.
pub fn register_runtime(runtime: Arc<dyn DeviceRuntime>) {
    let kind = runtime.kind().to_string();
    let mut list = registry().write().unwrap_or_else(|e| e.into_inner());
    list.retain(|r| r.kind() != kind);
    list.push(runtime);
    // Executables of the replaced runtime go; other kinds' stay.
    cache().map.retain(|k, _| k.kind != kind);
}

/// Every registered device runtime, in registration order.
pub fn runtimes() -> Vec<Arc<dyn DeviceRuntime>> {
    registry().read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The runtime serving `device`'s kind, checked usable for its index.
pub fn runtime_for(device: &Device) -> Result<Arc<dyn DeviceRuntime>> {
    let list = registry().read().unwrap_or_else(|e| e.into_inner());
    let r = list
        .iter()
        .find(|r| r.kind() == device.kind())
        .cloned()
        .ok_or_else(|| {
            let known: Vec<String> = std::iter::once("cpu".to_string())
                .chain(list.iter().map(|r| format!("{} ({})", r.kind(), r.name())))
                .collect();
            Error::invalid(
                "device",
                format!("no runtime for device {device} (device kinds: {})", known.join(", ")),
            )
        })?;
    drop(list);
    r.check(device.index())?;
    Ok(r)
}

/// Copy host data to `device`.
pub(crate) fn upload(device: &Device, data: &TensorData) -> Result<DeviceTensor> {
    Ok(runtime_for(device)?.upload(device.index(), data)?)
}

/// Copy a tensor on `device` to the host.
pub(crate) fn download(device: &Device, t: &DeviceTensor) -> Result<TensorData> {
    Ok(runtime_for(device)?.download(t)?)
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    kind: String,
    index: usize,
    op: Op,
    inputs: Vec<TensorType>,
}

struct Cache {
    map: BoundedCache<Key, Arc<dyn DeviceExecutable>>,
    hits: AtomicU64,
    compiles: AtomicU64,
}

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Cache {
        map: BoundedCache::new(CACHE_CAPACITY),
        hits: AtomicU64::new(0),
        compiles: AtomicU64::new(0),
    })
}

/// Counters of the eager device-op cache, since the process started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheStats {
    /// Ops that found their compiled executable.
    pub hits: u64,
    /// Ops compiled (first use of an op, dtype and shape on a device).
    pub compiles: u64,
    /// Executables held now.
    pub entries: usize,
}

/// The eager device-op cache's counters.
pub fn cache_stats() -> CacheStats {
    let c = cache();
    CacheStats {
        hits: c.hits.load(Ordering::Relaxed),
        compiles: c.compiles.load(Ordering::Relaxed),
        entries: c.map.len(),
    }
}

/// Drop every cached device executable (counters keep counting).
pub fn clear_cache() {
    cache().map.clear();
}

/// A one-op graph: inputs `x0..`, outputs `y0..`.
fn op_graph(op: &Op, inputs: &[TensorType]) -> Result<Graph> {
    let mut g = Graph::new(op.name());
    let mut args = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        args.push(g.add_input(&format!("x{i}"), t.clone())?);
    }
    for (i, v) in g.add_op(op.clone(), &args)?.into_iter().enumerate() {
        g.add_output(&format!("y{i}"), v)?;
    }
    Ok(g)
}

/// Run primitive `op` on `device` with device-resident inputs whose types the shared rules
/// accepted (`expect` are the outputs' types).
pub(crate) fn run_op(
    device: &Device,
    op: &Op,
    inputs: &[&DeviceTensor],
    expect: &[TensorType],
) -> Result<Vec<DeviceTensor>> {
    let runtime = runtime_for(device)?;
    let key = Key {
        kind: device.kind().to_string(),
        index: device.index(),
        op: op.clone(),
        inputs: inputs.iter().map(|t| t.tensor_type()).collect(),
    };
    let c = cache();
    let exe = match c.map.get(&key) {
        Some(exe) => {
            c.hits.fetch_add(1, Ordering::Relaxed);
            exe
        }
        None => {
            let graph = op_graph(op, &key.inputs)?;
            let exe = runtime.compile(device.index(), &graph)?;
            c.compiles.fetch_add(1, Ordering::Relaxed);
            c.map.insert(key, exe.clone());
            exe
        }
    };
    let outs = exe.run(inputs)?;
    let got: Vec<TensorType> = outs.iter().map(|t| t.tensor_type()).collect();
    if got != expect {
        return Err(BackendError::Runtime {
            op: op.name().to_string(),
            value: device.to_string(),
            detail: format!(
                "the `{}` runtime returned [{}], the op's type rule says [{}]",
                runtime.name(),
                got.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", "),
                expect.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
            ),
        }
        .into());
    }
    Ok(outs)
}
