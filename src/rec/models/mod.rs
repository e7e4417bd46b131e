//! Click-through-rate models in the manner of PaddleRec, randomly initialized: [`WideDeep`] and
//! [`DeepFM`].
//!
//! Both read `F` categorical (sparse) fields and `D` dense features per example. Field `f` has
//! its own vocabulary of `field_dims[f]` ids (`0..field_dims[f]`); all fields share one
//! embedding table of `Σ field_dims` rows, field `f`'s id `i` being row
//! `Σ_{g<f} field_dims[g] + i` (pytorch-fm's layout). The inputs are given apart —
//! `forward_parts(dense, sparse)` with dense `[N, D]` floats (`[N, 0]` when `D = 0`) and sparse
//! `[N, F]` integer ids — or packed in one float tensor for
//! [`Layer::forward`](crate::nn::Layer::forward): `[N, D + F]`, the `D` dense features first,
//! then the `F` ids as whole numbers (exact up to 2²⁴ in f32). Eager inputs are checked: an id
//! outside its field's vocabulary is an error naming the field.

mod deepfm;
mod features;
mod wide_deep;

pub use deepfm::DeepFM;
pub use features::CtrConfig;
pub use wide_deep::WideDeep;
