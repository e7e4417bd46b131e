//! Neural-network layers (class API) and `nn::functional` (functional API).

pub mod functional;
mod layer;

pub use layer::Layer;
