//! An encoder-decoder Transformer for translation-style tasks (Vaswani et al. 2017, as Paddle's
//! WMT Transformer example): source and target token embeddings scaled by √d_model plus
//! sinusoidal position encodings, dropout, [`Transformer`], and a linear projection to target
//! vocabulary logits. The PyTorch equivalent (`nn.Embedding` ×2, `nn.Transformer`,
//! `nn.Linear`) has the same parameter count.

use crate::error::{Error, Result};
use crate::nn::functional as F;
use crate::nn::{Embedding, Layer, Linear, Transformer, TransformerConfig};
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData};

/// The hyper-parameters of [`TransformerSeq2Seq`].
#[derive(Clone, Debug, PartialEq)]
pub struct Seq2SeqConfig {
    /// Size of the source vocabulary.
    pub src_vocab_size: usize,
    /// Size of the target vocabulary (the logits' width).
    pub tgt_vocab_size: usize,
    /// Longest source or target sequence (rows of the position encoding table).
    pub max_length: usize,
    /// The padding id: keys holding it are masked out of every attention. Sequences should
    /// start with a real token (BOS), since a query that sees only padding has nothing to attend.
    pub pad_id: Option<i64>,
    /// The encoder-decoder; its `dropout` also applies to the embeddings.
    pub transformer: TransformerConfig,
}

/// Sinusoidal position encodings `[length, d]`: `sin(p / 10000^(2i/d))` at even features `2i`,
/// `cos` at odd ones.
fn position_encoding(length: usize, d: usize) -> Result<Tensor> {
    let values: Vec<f64> = (0..length * d)
        .map(|k| {
            let (pos, i) = ((k / d) as f64, k % d);
            let angle = pos / 10000f64.powf((i - i % 2) as f64 / d as f64);
            if i % 2 == 0 { angle.sin() } else { angle.cos() }
        })
        .collect();
    Ok(Tensor::from_data(TensorData::from_f64_slice(
        DType::F32,
        vec![length, d],
        &values,
    )?))
}

/// Token embeddings, a [`Transformer`] and an output projection. Parameters `src_embedding.weight`,
/// `tgt_embedding.weight`, `transformer.encoder.…`, `transformer.decoder.…`, `output.weight`,
/// `output.bias`; buffer `position_encoding`. Embeddings start from `N(0, 1/d_model)`.
pub struct TransformerSeq2Seq {
    config: Seq2SeqConfig,
    training: bool,
    src_embedding: Embedding,
    tgt_embedding: Embedding,
    position_encoding: Tensor,
    transformer: Transformer,
    output: Linear,
}

impl TransformerSeq2Seq {
    /// A randomly initialized model (f32).
    pub fn new(config: &Seq2SeqConfig) -> Result<TransformerSeq2Seq> {
        let c = config;
        let d = c.transformer.d_model;
        let sizes = [
            ("src_vocab_size", c.src_vocab_size),
            ("tgt_vocab_size", c.tgt_vocab_size),
            ("max_length", c.max_length),
            ("transformer.d_model", d),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(Error::invalid("TransformerSeq2Seq", format!("{name} must be positive")));
        }
        let src_embedding = Embedding::new(c.src_vocab_size, d)?;
        let tgt_embedding = Embedding::new(c.tgt_vocab_size, d)?;
        for e in [&src_embedding, &tgt_embedding] {
            crate::nn::init::normal(e.weight(), 0.0, (d as f64).powf(-0.5))?;
        }
        Ok(TransformerSeq2Seq {
            config: c.clone(),
            training: true,
            src_embedding,
            tgt_embedding,
            position_encoding: position_encoding(c.max_length, d)?,
            transformer: Transformer::new(&c.transformer)?,
            output: Linear::new(d, c.tgt_vocab_size)?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Seq2SeqConfig {
        &self.config
    }

    /// The encoder-decoder.
    pub fn transformer(&self) -> &Transformer {
        &self.transformer
    }

    /// `dropout(table(ids) · √d + position_encoding[..L])`.
    fn embed(&self, table: &Embedding, ids: &Tensor) -> Result<Tensor> {
        let len = ids.shape()[1] as i64;
        let d = self.config.transformer.d_model as f64;
        let x = table.forward(ids)?.scale(d.sqrt(), 0.0)?;
        let x = (&x + &self.position_encoding.slice(0, 0, len, 1)?)?;
        F::dropout(&x, self.config.transformer.dropout, self.training)
    }

    /// `[N, 1, 1, L]`: true where `ids` is not padding (None without a pad id).
    fn key_keep(&self, ids: &Tensor) -> Result<Option<Tensor>> {
        self.config
            .pad_id
            .map(|pad| ids.not_equal(&ids.scalar_like(pad as f64)?)?.unsqueeze(1)?.unsqueeze(1))
            .transpose()
    }

    /// Logits `[N, T, tgt_vocab_size]` for target ids `tgt [N, T]` given source ids
    /// `src [N, S]` (teacher forcing): target position `t` sees target positions `≤ t` (a causal
    /// mask) and the whole source; padding keys are masked when `pad_id` is set.
    pub fn forward_pair(&self, src: &Tensor, tgt: &Tensor) -> Result<Tensor> {
        let integer = |t: &Tensor| !t.dtype().is_float() && t.dtype() != DType::Bool;
        let (s, t) = (src.shape(), tgt.shape());
        let max = self.config.max_length;
        let fits = |shape: &[usize]| shape.len() == 2 && (1..=max).contains(&shape[1]);
        if !(fits(&s) && fits(&t) && integer(src) && integer(tgt) && s[0] == t[0]) {
            return Err(Error::invalid(
                "TransformerSeq2Seq",
                format!(
                    "expects integer ids src [N, S] and tgt [N, T] with 1 ≤ S, T ≤ max_length ({max}), got {} and {}",
                    src.tensor_type(),
                    tgt.tensor_type()
                ),
            ));
        }
        let n = t[1];
        let causal: Vec<bool> = (0..n * n).map(|k| k % n <= k / n).collect();
        let causal = Tensor::from_vec(causal, &[n, n])?;
        let src_keep = self.key_keep(src)?;
        let tgt_mask = match self.key_keep(tgt)? {
            Some(keep) => keep.logical_and(&causal)?,
            None => causal,
        };
        let h = self.transformer.forward_with_masks(
            &self.embed(&self.src_embedding, src)?,
            &self.embed(&self.tgt_embedding, tgt)?,
            src_keep.as_ref(),
            Some(&tgt_mask),
            src_keep.as_ref(),
        )?;
        self.output.forward(&h)
    }
}

impl Layer for TransformerSeq2Seq {
    /// An error: the model needs source and target ids (use [`TransformerSeq2Seq::forward_pair`]).
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::invalid(
            "TransformerSeq2Seq",
            "needs two inputs; call `forward_pair(src, tgt)` instead of `forward`",
        ))
    }

    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        vec![("position_encoding".into(), self.position_encoding.clone())]
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("src_embedding".into(), &self.src_embedding as &dyn Layer),
            ("tgt_embedding".into(), &self.tgt_embedding),
            ("transformer".into(), &self.transformer),
            ("output".into(), &self.output),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("transformer".into(), &mut self.transformer as &mut dyn Layer)]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(l: &dyn Layer) -> usize {
        l.parameters().iter().map(Tensor::numel).sum()
    }

    fn vals(t: &Tensor) -> Vec<f64> {
        t.to_vec::<f64>().unwrap()
    }

    fn ids(v: Vec<i64>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape).unwrap()
    }

    /// Vocabularies 11 and 13, d_model 8, 2 heads, 1 encoder and 2 decoder layers, ffn 16.
    fn tiny(pad_id: Option<i64>) -> Seq2SeqConfig {
        Seq2SeqConfig {
            src_vocab_size: 11,
            tgt_vocab_size: 13,
            max_length: 6,
            pad_id,
            transformer: TransformerConfig {
                d_model: 8,
                nhead: 2,
                num_encoder_layers: 1,
                num_decoder_layers: 2,
                dim_feedforward: 16,
                ..TransformerConfig::default()
            },
        }
    }

    fn tiny_f64(pad_id: Option<i64>) -> TransformerSeq2Seq {
        let mut m = TransformerSeq2Seq::new(&tiny(pad_id)).unwrap();
        m.to_dtype(DType::F64).unwrap();
        m.eval();
        m
    }

    #[test]
    fn parameter_count_matches_torch_and_names() {
        // nn.Embedding(11, 8), nn.Embedding(13, 8), nn.Transformer(8, 2, 1, 2, 16), nn.Linear(8, 13).
        let m = TransformerSeq2Seq::new(&tiny(None)).unwrap();
        assert_eq!(count(&m), 2749);
        let sd = m.state_dict();
        for name in [
            "src_embedding.weight",
            "tgt_embedding.weight",
            "transformer.encoder.layers.0.self_attn.q_proj.weight",
            "transformer.decoder.layers.1.cross_attn.v_proj.bias",
            "transformer.decoder.norm.weight",
            "output.weight",
            "position_encoding",
        ] {
            assert!(sd.contains_key(name), "{name} missing");
        }
        assert_eq!(sd["position_encoding"].shape(), vec![6, 8]);
        assert!(!sd["position_encoding"].requires_grad());
    }

    #[test]
    fn position_encoding_is_sinusoidal() {
        let pe = position_encoding(3, 4).unwrap().to_vec::<f32>().unwrap();
        // Features (2i, 2i + 1) of position p: sin and cos of p / 10000^(2i / 4).
        let expect = [
            [0.0, 1.0, 0.0, 1.0],
            [1f64.sin(), 1f64.cos(), 0.01f64.sin(), 0.01f64.cos()],
            [2f64.sin(), 2f64.cos(), 0.02f64.sin(), 0.02f64.cos()],
        ];
        for (k, (got, want)) in pe.iter().zip(expect.concat()).enumerate() {
            assert!((f64::from(*got) - want).abs() < 1e-7, "[{k}]: {got} vs {want}");
        }
    }

    #[test]
    fn logits_match_embeddings_transformer_and_projection() {
        let m = tiny_f64(None);
        let (src, tgt) = (ids(vec![1, 4, 10, 2, 2, 3], &[2, 3]), ids(vec![0, 12, 5, 6], &[2, 2]));
        let y = m.forward_pair(&src, &tgt).unwrap();
        assert_eq!(y.shape(), vec![2, 2, 13]);
        let sd = m.state_dict();
        let pe = &sd["position_encoding"];
        let embed = |table: &str, x: &Tensor| {
            let l = x.shape()[1] as i64;
            let e = F::embedding(x, &sd[table]).unwrap().scale(8f64.sqrt(), 0.0).unwrap();
            (&e + &pe.slice(0, 0, l, 1).unwrap()).unwrap()
        };
        let causal = Transformer::generate_square_subsequent_mask(2, DType::F64).unwrap();
        let h = m
            .transformer
            .forward_with_masks(
                &embed("src_embedding.weight", &src),
                &embed("tgt_embedding.weight", &tgt),
                None,
                Some(&causal),
                None,
            )
            .unwrap();
        let r = F::linear(&h, &sd["output.weight"], Some(&sd["output.bias"])).unwrap();
        let (a, b) = (vals(&y), vals(&r));
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-12), "{a:?} vs {b:?}");
    }

    #[test]
    fn targets_are_causal_and_padding_is_ignored() {
        let m = tiny_f64(Some(0));
        let src = ids(vec![3, 4, 5], &[1, 3]);
        let run = |s: &Tensor, t: Vec<i64>| vals(&m.forward_pair(s, &ids(t.clone(), &[1, t.len()])).unwrap());
        let base = run(&src, vec![1, 7, 8, 9]);
        let changed = run(&src, vec![1, 7, 2, 9]);
        assert_eq!(base[..2 * 13], changed[..2 * 13], "positions before the change");
        assert!(base[2 * 13..3 * 13] != changed[2 * 13..3 * 13]);
        // Padding the source or the target (id 0) leaves the real positions as they were.
        let padded_src = ids(vec![3, 4, 5, 0, 0], &[1, 5]);
        let a = run(&padded_src, vec![1, 7, 8, 9]);
        assert!(a.iter().zip(&base).all(|(x, y)| (x - y).abs() < 1e-12));
        let b = run(&src, vec![1, 7, 0, 0]);
        let c = run(&src, vec![1, 7]);
        assert!(b[..2 * 13].iter().zip(&c).all(|(x, y)| (x - y).abs() < 1e-12));
        // Without a pad id, source padding is attended to.
        let plain = tiny_f64(None);
        let with = |s: &Tensor| vals(&plain.forward_pair(s, &ids(vec![1, 7], &[1, 2])).unwrap());
        assert!(with(&src) != with(&padded_src));
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let m = TransformerSeq2Seq::new(&tiny(None)).unwrap();
        let x = ids(vec![1, 2, 3, 4], &[2, 2]);
        assert!(m.forward(&x).unwrap_err().to_string().contains("forward_pair"));
        let e = m.forward_pair(&x, &ids(vec![1; 3], &[1, 3])).unwrap_err().to_string();
        assert!(e.contains("TransformerSeq2Seq") && e.contains("i64[1,3]"), "{e}");
        assert!(
            m.forward_pair(&ids(vec![1; 7], &[1, 7]), &ids(vec![1], &[1, 1]))
                .is_err()
        );
        let floats = Tensor::from_vec(vec![1.0f32; 4], &[2, 2]).unwrap();
        assert!(m.forward_pair(&floats, &x).is_err());
        assert!(
            m.forward_pair(&x, &ids(vec![13, 1, 1, 1], &[2, 2])).is_err(),
            "id beyond the vocabulary"
        );
        assert!(
            TransformerSeq2Seq::new(&Seq2SeqConfig {
                max_length: 0,
                ..tiny(None)
            })
            .is_err()
        );
    }
}
