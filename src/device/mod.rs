//! Devices: an open set of kinds (`cpu`, `gpu`, or any vendor's), not a closed enum, and the
//! runtimes that let eager tensors live on them ([`register_runtime`]; the contract is
//! [`oar_ir::DeviceRuntime`]).

use std::borrow::Cow;
use std::fmt;

/// Where a tensor lives: a device kind and an ordinal (`cpu`, `gpu:0`, `npu:1`, ...).
/// Vendors name their own kinds; nothing here needs editing to add one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    kind: Cow<'static, str>,
    index: usize,
}

impl Device {
    /// The host CPU.
    pub const CPU: Device = Device {
        kind: Cow::Borrowed("cpu"),
        index: 0,
    };

    /// The host CPU.
    pub fn cpu() -> Device {
        Device::CPU
    }

    /// GPU number `index`.
    pub fn gpu(index: usize) -> Device {
        Device::new("gpu", index)
    }

    /// A device of any kind.
    pub fn new(kind: &str, index: usize) -> Device {
        Device {
            kind: Cow::Owned(kind.to_string()),
            index,
        }
    }

    /// The kind (`cpu`, `gpu`, ...).
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The ordinal.
    pub fn index(&self) -> usize {
        self.index
    }

    /// True for the host CPU.
    pub fn is_cpu(&self) -> bool {
        self.kind == "cpu"
    }
}

impl Default for Device {
    fn default() -> Device {
        Device::CPU
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_cpu() {
            f.write_str("cpu")
        } else {
            write!(f, "{}:{}", self.kind, self.index)
        }
    }
}

mod host;
mod runtime;

pub use host::HostRuntime;
pub use runtime::{CacheStats, cache_stats, clear_cache, register_runtime, runtime_for, runtimes};
pub(crate) use runtime::{download, run_op, upload};
