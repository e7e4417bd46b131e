//! Data loading (Paddle `paddle.io`): the [`Dataset`] contract, [`DataLoader`] with shuffling,
//! batching and worker threads, default collation, and readers for common data sets
//! ([`datasets`]).

mod collate;
mod dataloader;
mod dataset;
pub mod datasets;

pub use collate::Collate;
pub use dataloader::{CollateFn, DataLoader, DataLoaderIter};
pub use dataset::{Dataset, Subset, TensorDataset, random_split};
