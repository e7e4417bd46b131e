//! Default collation: turning a list of samples into one batch (Paddle's `default_collate_fn`).
//!
//! Collation follows the sample's structure: tensors are stacked along a new axis 0, numbers
//! become a 1-d tensor, and tuples / `Vec`s are collated field by field, so `(image, label)`
//! samples give an `(images, labels)` batch.

use crate::error::{Error, Result};
use crate::tensor::{Tensor, stack};

/// A sample type the [`DataLoader`](super::DataLoader) knows how to batch without a `collate_fn`.
pub trait Collate: Sized {
    /// The batched form (`Tensor` → `Tensor` with a leading batch axis).
    type Batch;
    /// Batch `samples` (never empty: the loader does not make empty batches).
    fn collate(samples: Vec<Self>) -> Result<Self::Batch>;
}

/// Stack tensors along a new axis 0, naming the first sample whose type differs.
fn stack_samples(samples: &[Tensor]) -> Result<Tensor> {
    let first = samples
        .first()
        .ok_or_else(|| Error::invalid("collate", "cannot make a batch of zero samples"))?;
    let want = first.tensor_type();
    if let Some((i, t)) = samples.iter().enumerate().find(|(_, t)| t.tensor_type() != want) {
        return Err(Error::invalid(
            "collate",
            format!(
                "sample {i} is {} but sample 0 is {want}; stacking needs equal dtypes and shapes",
                t.tensor_type()
            ),
        ));
    }
    stack(&samples.iter().collect::<Vec<_>>(), 0)
}

impl Collate for Tensor {
    type Batch = Tensor;
    fn collate(samples: Vec<Tensor>) -> Result<Tensor> {
        stack_samples(&samples)
    }
}

macro_rules! collate_number {
    ($($t:ty),*) => {$(
        /// Numbers become a 1-d tensor of the same element type (labels as `i64`, say).
        impl Collate for $t {
            type Batch = Tensor;
            fn collate(samples: Vec<$t>) -> Result<Tensor> {
                let n = samples.len();
                Tensor::from_vec(samples, &[n])
            }
        }
    )*};
}
collate_number!(f32, f64, i32, i64, u8, bool);

/// Each position collated on its own; every sample must have the same length.
impl<T: Collate> Collate for Vec<T> {
    type Batch = Vec<T::Batch>;
    fn collate(samples: Vec<Vec<T>>) -> Result<Vec<T::Batch>> {
        let width = samples.first().map_or(0, Vec::len);
        if let Some((i, s)) = samples.iter().enumerate().find(|(_, s)| s.len() != width) {
            return Err(Error::invalid(
                "collate",
                format!("sample {i} has {} fields but sample 0 has {width}", s.len()),
            ));
        }
        // Transpose samples × fields into fields × samples, moving (not cloning) each field.
        let mut columns: Vec<Vec<T>> = (0..width).map(|_| Vec::with_capacity(samples.len())).collect();
        for sample in samples {
            for (column, field) in columns.iter_mut().zip(sample) {
                column.push(field);
            }
        }
        columns.into_iter().map(T::collate).collect()
    }
}

macro_rules! collate_tuple {
    ($(($($name:ident $idx:tt),+))*) => {$(
        /// Each field collated on its own (`(image, label)` → `(images, labels)`).
        impl<$($name: Collate),+> Collate for ($($name,)+) {
            type Batch = ($($name::Batch,)+);
            fn collate(samples: Vec<Self>) -> Result<Self::Batch> {
                let mut columns = ($(Vec::<$name>::with_capacity(samples.len()),)+);
                for s in samples {
                    $(columns.$idx.push(s.$idx);)+
                }
                Ok(($($name::collate(columns.$idx)?,)+))
            }
        }
    )*};
}
collate_tuple! {
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
}
