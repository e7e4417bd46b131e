//! The `Dataset` contract (Paddle's `__len__` / `__getitem__`) and datasets built from tensors.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::sync::Arc;

/// A map-style dataset: `len()` samples, each fetched by index (Paddle `paddle.io.Dataset`).
///
/// `Send + Sync` because [`DataLoader`](super::DataLoader) workers fetch samples from other threads.
pub trait Dataset: Send + Sync {
    /// One sample, e.g. `(image, label)`.
    type Item;
    /// Number of samples.
    fn len(&self) -> usize;
    /// Sample `index` (`0 <= index < len()`); out-of-range indices are an error, not a panic.
    fn get(&self, index: usize) -> Result<Self::Item>;
    /// True if there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Sharing a dataset between loaders (or keeping a handle to it) costs one `Arc`.
impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, index: usize) -> Result<D::Item> {
        (**self).get(index)
    }
}

/// The error for an index past the end, shared by the datasets in this module.
pub(crate) fn out_of_range(op: &str, index: usize, len: usize) -> Error {
    Error::invalid(
        op,
        format!("index {index} is out of range for a dataset of {len} samples"),
    )
}

/// Tensors that share their first dimension; sample `i` is row `i` of each (Paddle `TensorDataset`).
#[derive(Clone)]
pub struct TensorDataset {
    tensors: Vec<Tensor>,
    len: usize,
}

impl TensorDataset {
    /// Wrap `tensors`; all must have at least one axis and the same size along axis 0.
    pub fn new(tensors: Vec<Tensor>) -> Result<TensorDataset> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("TensorDataset", "needs at least one tensor"))?;
        let len = *first
            .shape()
            .first()
            .ok_or_else(|| Error::invalid("TensorDataset", "tensor 0 is 0-d; samples are rows of axis 0"))?;
        for (i, t) in tensors.iter().enumerate() {
            let shape = t.shape();
            if shape.first() != Some(&len) {
                return Err(Error::invalid(
                    "TensorDataset",
                    format!("tensor {i} has shape {shape:?}; every tensor needs {len} rows along axis 0"),
                ));
            }
        }
        Ok(TensorDataset { tensors, len })
    }

    /// The wrapped tensors.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }
}

impl Dataset for TensorDataset {
    type Item = Vec<Tensor>;
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        if index >= self.len {
            return Err(out_of_range("TensorDataset", index, self.len));
        }
        // Samples are data, not part of anyone's graph: slicing them must not grow the tape.
        crate::with_no_grad(|| self.tensors.iter().map(|t| t.get(index as i64)).collect())
    }
}

/// The samples of `dataset` at `indices`, in that order (Paddle `paddle.io.Subset`).
pub struct Subset<D> {
    dataset: D,
    indices: Vec<usize>,
}

impl<D: Dataset> Subset<D> {
    /// A view of `dataset` restricted to `indices`; every index must be in range.
    pub fn new(dataset: D, indices: Vec<usize>) -> Result<Subset<D>> {
        let n = dataset.len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= n) {
            return Err(out_of_range("Subset", bad, n));
        }
        Ok(Subset { dataset, indices })
    }

    /// The indices into the underlying dataset.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }
}

impl<D: Dataset> Dataset for Subset<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn get(&self, index: usize) -> Result<D::Item> {
        let i = *self
            .indices
            .get(index)
            .ok_or_else(|| out_of_range("Subset", index, self.indices.len()))?;
        self.dataset.get(i)
    }
}

/// Split `dataset` into non-overlapping random subsets of the given `lengths` (Paddle
/// `random_split`); `seed` fixes the split, `None` draws from the global generator (`oar::seed`).
pub fn random_split<D: Dataset>(dataset: D, lengths: &[usize], seed: Option<u64>) -> Result<Vec<Subset<Arc<D>>>> {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let n = dataset.len();
    let total = lengths.iter().try_fold(0usize, |a, &l| a.checked_add(l));
    if total != Some(n) {
        return Err(Error::invalid(
            "random_split",
            format!("lengths {lengths:?} do not add up to the dataset's {n} samples"),
        ));
    }
    let mut order: Vec<usize> = (0..n).collect();
    match seed {
        Some(s) => order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(s)),
        None => crate::tensor::with_rng(|r| order.shuffle(r)),
    }
    let dataset = Arc::new(dataset);
    let mut start = 0;
    let mut parts = Vec::with_capacity(lengths.len());
    for &l in lengths {
        parts.push(Subset {
            dataset: dataset.clone(),
            indices: order[start..start + l].to_vec(),
        });
        start += l;
    }
    Ok(parts)
}
