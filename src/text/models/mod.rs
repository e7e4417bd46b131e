//! Text models with PaddleNLP's layer names, randomly initialized (weights are trained or
//! loaded with `Layer::set_state_dict`; nothing is downloaded): BERT/ERNIE encoders and
//! classifiers, an encoder-decoder Transformer for translation-style tasks, and LSTM/GRU
//! classifiers.

mod bert;
mod rnn;
mod seq2seq;

pub use bert::{BertConfig, BertForSequenceClassification, BertModel};
pub use rnn::{GruClassifier, LstmClassifier, Pooling, RnnClassifierConfig};
pub use seq2seq::{Seq2SeqConfig, TransformerSeq2Seq};
