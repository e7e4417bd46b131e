//! Recurrent text classifiers: token ids → embedding → (bi)LSTM or GRU → the last hidden state
//! or the mean over time → linear logits. The PyTorch equivalent is `nn.Embedding(vocab,
//! embed)`, `nn.LSTM(embed, hidden, num_layers, bidirectional=…, batch_first=True)` (or
//! `nn.GRU`) and `nn.Linear(directions · hidden, classes)`, with the same parameter count.
//!
//! Every sequence is read in full: pad sequences to one length and expect the padding to take
//! part in the recurrence (there is no `sequence_length` input).

use crate::error::{Error, Result};
use crate::nn::{Direction, Embedding, GRU, LSTM, Layer, Linear};
use crate::tensor::Tensor;

/// How a recurrent classifier reduces the sequence to one vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The last layer's final hidden state; forward and backward concatenated when
    /// bidirectional (PyTorch's `cat(h_n[-2], h_n[-1])`).
    #[default]
    Last,
    /// The mean of the last layer's outputs over time.
    Mean,
}

/// The hyper-parameters of [`LstmClassifier`] and [`GruClassifier`].
#[derive(Clone, Debug, PartialEq)]
pub struct RnnClassifierConfig {
    /// Size of the token vocabulary.
    pub vocab_size: usize,
    /// Width of the token embeddings.
    pub embed_dim: usize,
    /// Hidden units per direction.
    pub hidden_size: usize,
    /// Stacked recurrent layers.
    pub num_layers: usize,
    /// Read both ways.
    pub bidirectional: bool,
    /// Output classes.
    pub num_classes: usize,
    /// How the sequence is reduced.
    pub pooling: Pooling,
}

impl RnnClassifierConfig {
    fn direction(&self) -> Direction {
        if self.bidirectional {
            Direction::Bidirect
        } else {
            Direction::Forward
        }
    }

    fn directions(&self) -> usize {
        if self.bidirectional { 2 } else { 1 }
    }
}

/// What the classifiers need from a recurrent layer: the outputs `[N, T, D·H]` and final hidden
/// states `[L·D, N, H]`.
trait Recurrent: Layer {
    fn run(&self, x: &Tensor) -> Result<(Tensor, Tensor)>;
}

impl Recurrent for LSTM {
    fn run(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let (out, (h, _)) = self.forward_with_state(x, None)?;
        Ok((out, h))
    }
}

impl Recurrent for GRU {
    fn run(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        self.forward_with_state(x, None)
    }
}

/// The shared body of both classifiers; `name` is the model's and `rnn_name` its recurrent
/// layer's parameter prefix.
struct Classifier<R> {
    name: &'static str,
    rnn_name: &'static str,
    config: RnnClassifierConfig,
    embedding: Embedding,
    rnn: R,
    fc: Linear,
}

impl<R: Recurrent> Classifier<R> {
    fn new(
        name: &'static str,
        rnn_name: &'static str,
        c: &RnnClassifierConfig,
        make_rnn: impl FnOnce(usize, usize) -> Result<R>,
    ) -> Result<Classifier<R>> {
        let sizes = [
            ("vocab_size", c.vocab_size),
            ("embed_dim", c.embed_dim),
            ("hidden_size", c.hidden_size),
            ("num_layers", c.num_layers),
            ("num_classes", c.num_classes),
        ];
        if let Some((field, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(Error::invalid(name, format!("{field} must be positive")));
        }
        Ok(Classifier {
            name,
            rnn_name,
            config: c.clone(),
            embedding: Embedding::new(c.vocab_size, c.embed_dim)?,
            rnn: make_rnn(c.embed_dim, c.hidden_size)?,
            fc: Linear::new(c.directions() * c.hidden_size, c.num_classes)?,
        })
    }

    fn logits(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.ndim() != 2 {
            return Err(Error::invalid(
                self.name,
                format!("expects token ids [N, T], got {}", ids.tensor_type()),
            ));
        }
        let (out, h) = self.rnn.run(&self.embedding.forward(ids)?)?;
        let pooled = match self.config.pooling {
            Pooling::Mean => out.mean(&[1], false)?,
            Pooling::Last => {
                // The last layer's rows of `h [L·D, N, H]`, as [N, D·H] (forward first).
                let d = self.config.directions() as i64;
                let rows = self.config.num_layers as i64 * d;
                let last = h.slice(0, rows - d, rows, 1)?.transpose(&[1, 0, 2])?;
                last.reshape(&[0, -1])?
            }
        };
        self.fc.forward(&pooled)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("embedding".into(), &self.embedding as &dyn Layer),
            (self.rnn_name.into(), &self.rnn),
            ("fc".into(), &self.fc),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![(self.rnn_name.into(), &mut self.rnn as &mut dyn Layer)]
    }
}

macro_rules! classifier {
    ($(#[$doc:meta])* $name:ident, $rnn:ident, $rnn_name:literal) => {
        $(#[$doc])*
        pub struct $name(Classifier<$rnn>);

        impl $name {
            /// A randomly initialized classifier (f32).
            pub fn new(config: &RnnClassifierConfig) -> Result<$name> {
                let make = |input, hidden| {
                    $rnn::new(input, hidden)?
                        .num_layers(config.num_layers)?
                        .direction(config.direction())
                };
                Ok($name(Classifier::new(stringify!($name), $rnn_name, config, make)?))
            }

            /// The configuration.
            pub fn config(&self) -> &RnnClassifierConfig {
                &self.0.config
            }
        }

        impl Layer for $name {
            /// Logits `[N, num_classes]` of token ids `[N, T]`.
            fn forward(&self, ids: &Tensor) -> Result<Tensor> {
                self.0.logits(ids)
            }

            fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
                self.0.sublayers()
            }

            fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
                self.0.sublayers_mut()
            }
        }
    };
}

classifier!(
    /// Embedding, (bi)LSTM and a linear layer: parameters `embedding.weight`,
    /// `lstm.weight_ih_l0`, … (PyTorch's and Paddle's names), `fc.weight`, `fc.bias`.
    LstmClassifier,
    LSTM,
    "lstm"
);

classifier!(
    /// Embedding, (bi)GRU and a linear layer: parameters `embedding.weight`, `gru.weight_ih_l0`,
    /// …, `fc.weight`, `fc.bias`.
    GruClassifier,
    GRU,
    "gru"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::functional as F;

    fn count(l: &dyn Layer) -> usize {
        l.parameters().iter().map(Tensor::numel).sum()
    }

    fn config(bidirectional: bool, num_layers: usize, pooling: Pooling) -> RnnClassifierConfig {
        RnnClassifierConfig {
            vocab_size: 20,
            embed_dim: 6,
            hidden_size: 5,
            num_layers,
            bidirectional,
            num_classes: 3,
            pooling,
        }
    }

    #[test]
    fn parameter_counts_match_torch() {
        // nn.Embedding(20, 6) + nn.LSTM / nn.GRU(6, 5, layers, bidirectional) + nn.Linear(5·D, 3).
        for (bi, layers, lstm, gru) in [
            (false, 1, 398, 333),
            (false, 2, 638, 513),
            (true, 1, 673, 543),
            (true, 2, 1353, 1053),
        ] {
            let c = config(bi, layers, Pooling::Last);
            assert_eq!(count(&LstmClassifier::new(&c).unwrap()), lstm, "lstm {bi} {layers}");
            assert_eq!(count(&GruClassifier::new(&c).unwrap()), gru, "gru {bi} {layers}");
        }
        // A realistic size: vocab 30000, embed 128, hidden 256, 2 bidirectional layers, 2 classes.
        let c = RnnClassifierConfig {
            vocab_size: 30000,
            embed_dim: 128,
            hidden_size: 256,
            num_layers: 2,
            bidirectional: true,
            num_classes: 2,
            pooling: Pooling::Mean,
        };
        assert_eq!(count(&LstmClassifier::new(&c).unwrap()), 6_208_514);
        assert_eq!(count(&GruClassifier::new(&c).unwrap()), 5_616_642);
        let names: Vec<String> = LstmClassifier::new(&config(true, 2, Pooling::Last))
            .unwrap()
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        for expected in [
            "embedding.weight",
            "lstm.weight_ih_l0",
            "lstm.bias_hh_l1_reverse",
            "fc.weight",
            "fc.bias",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
        }
    }

    /// `fc(pooled)` with the classifier's own parameters.
    fn head(state: &std::collections::BTreeMap<String, Tensor>, pooled: &Tensor) -> Vec<f32> {
        F::linear(pooled, &state["fc.weight"], Some(&state["fc.bias"]))
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
    }

    #[test]
    fn pooling_reads_the_right_states() {
        let tokens = Tensor::from_vec(vec![1i64, 5, 19, 0, 7, 7, 2, 3], &[2, 4]).unwrap();
        for bi in [false, true] {
            // Last pooling: the forward direction ends at step T-1, the backward one at step 0.
            let m = LstmClassifier::new(&config(bi, 2, Pooling::Last)).unwrap();
            let sd = m.state_dict();
            let (out, _) = m.0.rnn.run(&m.0.embedding.forward(&tokens).unwrap()).unwrap();
            let fwd = out
                .slice(1, 3, 4, 1)
                .unwrap()
                .slice(2, 0, 5, 1)
                .unwrap()
                .squeeze(&[1])
                .unwrap();
            let pooled = if bi {
                let bwd = out
                    .slice(1, 0, 1, 1)
                    .unwrap()
                    .slice(2, 5, 10, 1)
                    .unwrap()
                    .squeeze(&[1])
                    .unwrap();
                crate::tensor::concat(&[&fwd, &bwd], 1).unwrap()
            } else {
                fwd
            };
            let y = m.forward(&tokens).unwrap();
            assert_eq!(y.shape(), vec![2, 3]);
            assert!(
                close(&y.to_vec::<f32>().unwrap(), &head(&sd, &pooled)),
                "lstm last, bi={bi}"
            );
            // Mean pooling: the mean of the outputs over time.
            let m = GruClassifier::new(&config(bi, 1, Pooling::Mean)).unwrap();
            let sd = m.state_dict();
            let (out, _) = m.0.rnn.run(&m.0.embedding.forward(&tokens).unwrap()).unwrap();
            let pooled = out.mean(&[1], false).unwrap();
            let y = m.forward(&tokens).unwrap().to_vec::<f32>().unwrap();
            assert!(close(&y, &head(&sd, &pooled)), "gru mean, bi={bi}");
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let m = GruClassifier::new(&config(true, 1, Pooling::Last)).unwrap();
        let e = m.forward(&Tensor::from_vec(vec![1i64, 2], &[2]).unwrap()).unwrap_err();
        assert!(
            e.to_string().contains("GruClassifier") && e.to_string().contains("[N, T]"),
            "{e}"
        );
        assert!(
            m.forward(&Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]).unwrap())
                .is_err()
        );
        assert!(m.forward(&Tensor::from_vec(vec![20i64, 2], &[1, 2]).unwrap()).is_err());
        let e = LstmClassifier::new(&RnnClassifierConfig {
            hidden_size: 0,
            ..config(false, 1, Pooling::Last)
        });
        assert!(e.err().unwrap().to_string().contains("hidden_size"));
        assert_eq!(m.config().num_classes, 3);
    }
}
