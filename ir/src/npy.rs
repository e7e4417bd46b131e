//! numpy `.npy` files: read and write [`crate::TensorData`].
