//! Neural-network layers (class API) and `nn::functional` (functional API).

mod activation;
mod container;
mod conv;
mod dropout;
mod embedding;
pub mod functional;
pub mod init;
mod layer;
mod linear;
mod loss;
mod norm;
mod pooling;
pub mod rnn;
mod spatial;
pub mod transformer;
pub(crate) mod util;

pub use activation::{GELU, Hardsigmoid, Hardswish, LogSoftmax, ReLU, ReLU6, SiLU, Sigmoid, Softmax, Tanh};
pub use container::Sequential;
pub use conv::{Conv1D, Conv2D, ConvTranspose};
pub use dropout::{Dropout, Flatten};
pub use embedding::Embedding;
pub use functional::Reduction;
pub use layer::Layer;
pub use linear::Linear;
pub use loss::{BCEWithLogitsLoss, CrossEntropyLoss, Loss, MSELoss, NLLLoss};
pub use norm::{
    BatchNorm1D, BatchNorm2D, BatchNorm3D, GroupNorm, InstanceNorm1D, InstanceNorm2D, InstanceNorm3D, LayerNorm,
};
pub use pooling::{AdaptiveAvgPool2D, AdaptiveMaxPool2D, AvgPool2D, MaxPool2D};
pub use rnn::{Direction, GRU, GRUCell, LSTM, LSTMCell};
pub use spatial::{Pad, Upsample};
pub use transformer::{
    Activation, MultiHeadAttention, Transformer, TransformerConfig, TransformerDecoder, TransformerDecoderLayer,
    TransformerEncoder, TransformerEncoderLayer,
};
