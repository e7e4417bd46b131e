//! Embeddings whose table lives on a parameter server (`oar-ps`, feature `ps`): the trainer
//! holds only the rows of the current batch.
//!
//! [`SparseEmbedding::forward`] pulls the rows of the batch's unique ids (creating them on the
//! servers in training) into a leaf tensor and looks the ids up in it, so autograd gives that
//! leaf the rows' gradients; [`SparseEmbedding::push_gradients`] sends them, after `backward`,
//! to be applied by the servers' optimizer (sync mode: call it every step, before the next
//! forward). Forwards before a push accumulate: each one's rows are pushed.

use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

pub use oar_ps::{Optimizer as ServerOptimizer, PsClient, RunningServer, ServerConfig, TableConfig};

fn ps_err(e: oar_ps::PsError) -> Error {
    Error::invalid("parameter server", e.to_string())
}

/// An embedding table on a parameter server: `forward` maps integer ids `[*]` to rows
/// `[*, dim]` (see the module docs).
pub struct SparseEmbedding {
    client: Arc<PsClient>,
    table: String,
    dim: usize,
    training: Cell<bool>,
    /// The pulled rows of each forward since the last push: the ids and their leaf.
    pulled: RefCell<Vec<(Vec<u64>, Tensor)>>,
}

impl SparseEmbedding {
    /// The sparse table `table` (of `dim` values per row) on the servers `client` talks to.
    pub fn new(client: Arc<PsClient>, table: &str, dim: usize) -> Result<SparseEmbedding> {
        if dim == 0 {
            return Err(Error::invalid("SparseEmbedding", "dim must be positive"));
        }
        Ok(SparseEmbedding {
            client,
            table: table.to_string(),
            dim,
            training: Cell::new(true),
            pulled: RefCell::new(Vec::new()),
        })
    }

    /// Send the gradients of the rows every forward since the last push pulled (rows without
    /// a gradient send none), for the servers to apply; then forget them.
    pub fn push_gradients(&self) -> Result<()> {
        let pulled = std::mem::take(&mut *self.pulled.borrow_mut());
        for (ids, rows) in pulled {
            let Some(g) = rows.grad() else { continue };
            let g = g
                .try_data()?
                .to_vec::<f32>()
                .map_err(|e| Error::invalid("SparseEmbedding", e.to_string()))?;
            self.client
                .push_sparse(&self.table, &ids, &g, self.dim)
                .map_err(ps_err)?;
        }
        Ok(())
    }
}

impl Layer for SparseEmbedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.dtype().is_float() || ids.dtype() == DType::Bool {
            return Err(Error::invalid(
                "SparseEmbedding",
                format!("ids must be integers, got {}", ids.tensor_type()),
            ));
        }
        let all: Vec<i64> = ids
            .cast(DType::I64)?
            .try_data()?
            .to_vec::<i64>()
            .map_err(|e| Error::invalid("SparseEmbedding", e.to_string()))?;
        // Unique ids in order of first appearance, and each id's row among them.
        let mut slot: HashMap<i64, i64> = HashMap::new();
        let mut unique = Vec::new();
        let index: Vec<i64> = all
            .iter()
            .map(|&id| {
                *slot.entry(id).or_insert_with(|| {
                    unique.push(id as u64);
                    unique.len() as i64 - 1
                })
            })
            .collect();
        let training = self.training.get();
        let (dim, values) = self
            .client
            .pull_sparse(&self.table, &unique, training)
            .map_err(ps_err)?;
        if dim != self.dim {
            return Err(Error::invalid(
                "SparseEmbedding",
                format!("table `{}` has rows of {dim} values, not {}", self.table, self.dim),
            ));
        }
        let data = TensorData::from_vec(vec![unique.len(), dim], values)
            .map_err(|e| Error::invalid("SparseEmbedding", e.to_string()))?;
        let rows = Tensor::from_data(data);
        let rows = if training && crate::is_grad_enabled() {
            rows.requires_grad_(true)?
        } else {
            rows
        };
        let index = Tensor::from_vec(index, &ids.shape())?;
        let out = crate::nn::functional::embedding(&index, &rows)?;
        if rows.requires_grad() {
            self.pulled.borrow_mut().push((unique, rows));
        }
        Ok(out)
    }

    fn set_training(&mut self, training: bool) {
        self.training.set(training);
    }

    fn is_training(&self) -> bool {
        self.training.get()
    }
}
