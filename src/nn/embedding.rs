//! `Embedding`: a lookup table `weight[num_embeddings, embedding_dim]` indexed by integers.

use super::functional as F;
use super::util::{ctx, param, recast};
use super::{Layer, init};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::DType;

/// A lookup table. Initialization follows Paddle's default for weights: Xavier-uniform
/// (`fan_in = num_embeddings`, `fan_out = embedding_dim`).
///
/// With `.padding_idx(i)`, lookups of index `i` return zeros and contribute no gradient to
/// row `i` (Paddle's semantics): the output is multiplied by the mask `indices != i`, so the
/// row's stored values are kept but never used.
pub struct Embedding {
    weight: Tensor,
    num_embeddings: usize,
    embedding_dim: usize,
    padding_idx: Option<i64>,
}

impl Embedding {
    /// A float32 table of `num_embeddings` rows of size `embedding_dim`.
    pub fn new(num_embeddings: usize, embedding_dim: usize) -> Result<Embedding> {
        let weight = param(&[num_embeddings, embedding_dim], DType::F32)?;
        init::xavier_uniform(&weight, 1.0)?;
        Ok(Embedding {
            weight,
            num_embeddings,
            embedding_dim,
            padding_idx: None,
        })
    }

    /// The index whose lookups are zeros with no gradient; negative counts from the end.
    pub fn padding_idx(mut self, idx: i64) -> Result<Embedding> {
        let v = self.num_embeddings as i64;
        if idx < -v || idx >= v {
            return Err(Error::invalid(
                "Embedding",
                format!("padding_idx {idx} is out of range for {v} embeddings"),
            ));
        }
        self.padding_idx = Some(if idx < 0 { idx + v } else { idx });
        Ok(self)
    }

    /// The same layer with the table converted to `dtype`.
    pub fn dtype(mut self, dtype: DType) -> Result<Embedding> {
        self.weight = recast(&self.weight, dtype)?;
        Ok(self)
    }

    /// The table `[num_embeddings, embedding_dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    fn describe(&self) -> String {
        format!(
            "Embedding(num_embeddings={}, embedding_dim={})",
            self.num_embeddings, self.embedding_dim
        )
    }

    fn lookup(&self, indices: &Tensor) -> Result<Tensor> {
        if indices.dtype().is_float() || indices.dtype() == DType::Bool {
            return Err(Error::invalid(
                "embedding",
                format!("indices must be integers, got {}", indices.tensor_type()),
            ));
        }
        let y = F::embedding(indices, &self.weight)?;
        let Some(pad) = self.padding_idx else {
            return Ok(y);
        };
        let keep = indices
            .not_equal(&indices.scalar_like(pad as f64)?)?
            .cast(self.weight.dtype())?
            .unsqueeze(-1)?;
        y.multiply(&keep)
    }
}

impl Layer for Embedding {
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        ctx(|| self.describe(), self.lookup(indices))
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".into(), self.weight.clone())]
    }
}
