//! The backend contract: compile a graph into an executable, run it with named tensors.
//!
//! Backends register by name in a [`Registry`]; there is no closed enum to edit.

use crate::{Graph, TensorData};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// Model weights by parameter name.
pub type Weights = BTreeMap<String, TensorData>;

/// Why a backend could not compile or run a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// The backend does not implement an op.
    #[error("backend `{backend}` does not support op `{op}`")]
    Unsupported {
        /// Backend name.
        backend: String,
        /// Op mnemonic.
        op: String,
    },
    /// A graph input was not given.
    #[error("missing input `{name}` (expected {expected})")]
    MissingInput {
        /// Input name.
        name: String,
        /// Its declared type.
        expected: String,
    },
    /// An input was given that the graph does not have.
    #[error("unknown input `{name}` (the graph takes: {known})")]
    UnknownInput {
        /// The name given.
        name: String,
        /// The graph's inputs.
        known: String,
    },
    /// An input's dtype or shape does not match the graph.
    #[error("input `{name}`: expected {expected}, got {got}")]
    InputMismatch {
        /// Input name.
        name: String,
        /// Declared type.
        expected: String,
        /// What was given.
        got: String,
    },
    /// A parameter has no weight, or a weight of the wrong type.
    #[error("parameter `{name}`: {detail}")]
    Weight {
        /// Parameter name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// An op failed while running (index out of range, division by zero, too large, ...).
    #[error("op `{op}` at {value}: {detail}")]
    Runtime {
        /// Op mnemonic.
        op: String,
        /// The value being computed.
        value: String,
        /// What went wrong.
        detail: String,
    },
    /// The graph is invalid.
    #[error("invalid graph: {0}")]
    Graph(#[from] crate::IrError),
    /// The backend's device or driver is not available.
    #[error("backend `{backend}` is unavailable: {reason}")]
    Unavailable {
        /// Backend name.
        backend: String,
        /// Why (no driver, no device, ...).
        reason: String,
    },
    /// No backend of this name is registered.
    #[error("no backend named `{name}` (registered: {known})")]
    UnknownBackend {
        /// The name asked for.
        name: String,
        /// Registered names.
        known: String,
    },
}

/// A compiled graph, ready to run.
pub trait Executable: Send + Sync {
    /// Run with inputs by name; returns outputs by name, in the graph's output order.
    fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError>;
}

/// A code generator and runtime for one kind of device.
pub trait Backend: Send + Sync {
    /// The registry name (`reference`, `cpu`, `ptx`, ...).
    fn name(&self) -> &str;
    /// One line about the backend.
    fn description(&self) -> &str;
    /// Compile `graph` with its `weights` into an executable.
    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError>;
}

/// Backends by name. Later registrations of a name replace earlier ones.
#[derive(Default)]
pub struct Registry {
    backends: RwLock<Vec<Arc<dyn Backend>>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Register (or replace) a backend under its name.
    pub fn register(&self, backend: Arc<dyn Backend>) {
        let mut list = self.backends.write().unwrap_or_else(|e| e.into_inner());
        list.retain(|b| b.name() != backend.name());
        list.push(backend);
    }

    /// The backend with this name.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Backend>, BackendError> {
        let list = self.backends.read().unwrap_or_else(|e| e.into_inner());
        list.iter()
            .find(|b| b.name() == name)
            .cloned()
            .ok_or_else(|| BackendError::UnknownBackend {
                name: name.to_string(),
                known: list.iter().map(|b| b.name().to_string()).collect::<Vec<_>>().join(", "),
            })
    }

    /// Every registered backend, in registration order.
    pub fn list(&self) -> Vec<Arc<dyn Backend>> {
        self.backends.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Check named inputs against a graph's signature (shared by backends).
/// Returns the symbol bindings (`N` → 8) implied by the inputs' shapes.
pub fn check_inputs(
    graph: &Graph,
    inputs: &BTreeMap<String, TensorData>,
) -> Result<BTreeMap<String, usize>, BackendError> {
    let specs = graph.input_specs();
    for name in inputs.keys() {
        if !specs.iter().any(|(n, _)| n == name) {
            return Err(BackendError::UnknownInput {
                name: name.clone(),
                known: specs
                    .iter()
                    .map(|(n, t)| format!("{n}: {t}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    let mut bind = BTreeMap::new();
    for (name, ty) in &specs {
        let t = inputs.get(name).ok_or_else(|| BackendError::MissingInput {
            name: name.clone(),
            expected: ty.to_string(),
        })?;
        let mismatch = || BackendError::InputMismatch {
            name: name.clone(),
            expected: ty.to_string(),
            got: t.tensor_type().to_string(),
        };
        if t.dtype() != ty.dtype || t.shape().len() != ty.rank() {
            return Err(mismatch());
        }
        crate::shape::bind_dims(ty.shape.dims(), t.shape(), &mut bind).map_err(|detail| {
            BackendError::InputMismatch {
                name: name.clone(),
                expected: format!("{ty} ({detail})"),
                got: t.tensor_type().to_string(),
            }
        })?;
    }
    Ok(bind)
}

/// A thread-safe map that keeps at most `capacity` entries — emptied when full, so memory
/// stays bounded — for what backends compile once and reuse: programs per binding of symbolic
/// dims, eager executables per op and shape.
pub struct BoundedCache<K, V> {
    map: std::sync::Mutex<std::collections::HashMap<K, V>>,
    capacity: usize,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> BoundedCache<K, V> {
    /// An empty cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        BoundedCache {
            map: Default::default(),
            capacity,
        }
    }

    /// The value for `key`, if cached.
    pub fn get(&self, key: &K) -> Option<V> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
    }

    /// Cache `value` under `key` (emptying the cache first when it is full).
    pub fn insert(&self, key: K, value: V) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.capacity {
            map.clear();
        }
        map.insert(key, value);
    }

    /// The cached value for `key`, or `make()`'s, cached. `make` runs without the lock held (two
    /// threads missing at once both make a value; the last one stays).
    pub fn get_or_try_insert_with<E>(&self, key: &K, make: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        if let Some(v) = self.get(key) {
            return Ok(v);
        }
        let v = make()?;
        self.insert(key.clone(), v.clone());
        Ok(v)
    }

    /// Keep only the entries for which `keep` is true.
    pub fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, v| keep(k, v));
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop every entry.
    pub fn clear(&self) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod cache_tests {
    use super::BoundedCache;

    #[test]
    fn bounded_cache_reuses_and_stays_bounded() {
        let c: BoundedCache<u32, u32> = BoundedCache::new(2);
        let mut made = 0;
        for k in [1, 1, 2, 1] {
            c.get_or_try_insert_with(&k, || {
                made += 1;
                Ok::<_, ()>(k * 10)
            })
            .unwrap();
        }
        assert_eq!((made, c.len()), (2, 2));
        assert_eq!(c.get_or_try_insert_with(&3, || Ok::<_, ()>(30)), Ok(30));
        assert_eq!(c.len(), 1, "full: emptied before the third key");
        assert_eq!(c.get(&1), None);
        assert_eq!(c.get_or_try_insert_with(&4, || Err("no")), Err("no"));
        assert_eq!(c.get(&4), None, "a failed make caches nothing");
    }
}
