//! Neural-network layers (class API) and `nn::functional` (functional API).

pub mod functional;
mod layer;
pub mod rnn;
pub mod transformer;

pub use layer::Layer;
pub use rnn::{Direction, GRU, GRUCell, LSTM, LSTMCell};
pub use transformer::{Activation, MultiHeadAttention, TransformerEncoder, TransformerEncoderLayer};
