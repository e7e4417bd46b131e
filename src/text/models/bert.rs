//! BERT (Devlin et al. 2019) laid out as PaddleNLP's `BertModel` and
//! `BertForSequenceClassification`: word, position and token-type embeddings summed, layer norm
//! and dropout; a stack of post-norm [`TransformerEncoderLayer`]s (GELU); a pooler (dense + tanh
//! on the first, `[CLS]`, token); for classification, dropout and a linear layer on the pooled
//! output. ERNIE (PaddleNLP's `ErnieModel` / `ErnieForSequenceClassification`, 1.0 to 3.0) has the
//! same layout: build it from ERNIE's config values (ERNIE 1.0 uses ReLU, `hidden_act`).
//!
//! Parameter counts equal HuggingFace's `BertModel` / `BertForSequenceClassification` for the
//! same config (bert-base: 109,483,778 with two labels). Initialization follows both: weight
//! matrices and embeddings `N(0, initializer_range²)`, biases zero, norms one/zero. Linear
//! weights are stored in Paddle's `[in, out]` layout (a HuggingFace checkpoint's are `[out, in]`).

use crate::error::{Error, Result};
use crate::nn::functional as F;
use crate::nn::{
    Activation, Dropout, Embedding, Layer, LayerNorm, Linear, TransformerEncoder, TransformerEncoderLayer,
};
use crate::tensor::Tensor;

/// The hyper-parameters of a BERT model, with HuggingFace's and PaddleNLP's field names.
/// `Default` is bert-base-uncased with two labels.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Size of the token vocabulary.
    pub vocab_size: usize,
    /// Width of every hidden state.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer (must divide `hidden_size`).
    pub num_attention_heads: usize,
    /// Hidden width of each feed-forward block.
    pub intermediate_size: usize,
    /// The feed-forward activation (GELU for BERT, ReLU for ERNIE 1.0).
    pub hidden_act: Activation,
    /// Dropout on the embeddings, after each block and before the classifier.
    pub hidden_dropout_prob: f64,
    /// Dropout on the attention weights.
    pub attention_probs_dropout_prob: f64,
    /// Longest sequence the position embeddings cover.
    pub max_position_embeddings: usize,
    /// Number of token types (segments).
    pub type_vocab_size: usize,
    /// Standard deviation of the initial weights.
    pub initializer_range: f64,
    /// ε of every layer norm.
    pub layer_norm_eps: f64,
    /// Classes of [`BertForSequenceClassification`].
    pub num_labels: usize,
}

impl Default for BertConfig {
    fn default() -> BertConfig {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: Activation::Gelu,
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            initializer_range: 0.02,
            layer_norm_eps: 1e-12,
            num_labels: 2,
        }
    }
}

impl BertConfig {
    /// The parameter count of `BertForSequenceClassification::new(self)` without building it;
    /// `BertModel::new(self)` has `(hidden_size + 1) · num_labels` fewer.
    pub fn num_parameters(&self) -> usize {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h;
        // Four attention projections, two feed-forward layers, two layer norms.
        let layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h;
        let pooler = h * h + h;
        embeddings + self.num_hidden_layers * layer + pooler + (h + 1) * self.num_labels
    }

    fn validate(&self) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
            ("num_labels", self.num_labels),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(Error::invalid("BertConfig", format!("{name} must be positive")));
        }
        Ok(())
    }
}

/// Re-draw every weight matrix and embedding table of `layer` from `N(0, std²)`.
fn init_weights(layer: &dyn Layer, std: f64) -> Result<()> {
    for p in layer.parameters().iter().filter(|p| p.ndim() == 2) {
        crate::nn::init::normal(p, 0.0, std)?;
    }
    Ok(())
}

/// The sum of word, position and token-type embeddings, normalized, with dropout.
struct BertEmbeddings {
    word_embeddings: Embedding,
    position_embeddings: Embedding,
    token_type_embeddings: Embedding,
    layer_norm: LayerNorm,
    dropout: Dropout,
}

impl BertEmbeddings {
    fn new(c: &BertConfig) -> Result<BertEmbeddings> {
        Ok(BertEmbeddings {
            word_embeddings: Embedding::new(c.vocab_size, c.hidden_size)?,
            position_embeddings: Embedding::new(c.max_position_embeddings, c.hidden_size)?,
            token_type_embeddings: Embedding::new(c.type_vocab_size, c.hidden_size)?,
            layer_norm: LayerNorm::new(&[c.hidden_size])?.epsilon(c.layer_norm_eps)?,
            dropout: Dropout::new(c.hidden_dropout_prob)?,
        })
    }

    /// `ids [N, L]` (checked by the caller) at positions `0..L`, token types 0 unless given.
    fn embed(&self, ids: &Tensor, token_type_ids: Option<&Tensor>) -> Result<Tensor> {
        let len = ids.shape()[1] as i64;
        let words = self.word_embeddings.forward(ids)?;
        let positions = self.position_embeddings.weight().slice(0, 0, len, 1)?;
        let types = match token_type_ids {
            Some(t) => self.token_type_embeddings.forward(t)?,
            None => self.token_type_embeddings.weight().slice(0, 0, 1, 1)?,
        };
        let sum = (&(&words + &positions)? + &types)?;
        self.dropout.forward(&self.layer_norm.forward(&sum)?)
    }
}

impl Layer for BertEmbeddings {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.embed(ids, None)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("word_embeddings".into(), &self.word_embeddings as &dyn Layer),
            ("position_embeddings".into(), &self.position_embeddings),
            ("token_type_embeddings".into(), &self.token_type_embeddings),
            ("layer_norm".into(), &self.layer_norm),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("dropout".into(), &mut self.dropout as &mut dyn Layer)]
    }
}

/// `tanh(dense(h[:, 0]))`: the pooled representation of the first token.
struct BertPooler {
    dense: Linear,
}

impl Layer for BertPooler {
    fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        F::tanh(&self.dense.forward(&hidden.slice(1, 0, 1, 1)?.squeeze(&[1])?)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("dense".into(), &self.dense as &dyn Layer)]
    }
}

/// The BERT encoder (PaddleNLP `BertModel`): parameters `embeddings.…`, `encoder.layers.{i}.…`,
/// `pooler.dense.…`. [`Layer::forward`] takes token ids `[N, L]` (any integer type, `L ≤
/// max_position_embeddings`) and returns the last hidden states `[N, L, hidden_size]`;
/// [`BertModel::forward_with_mask`] takes token types and an attention mask too and returns the
/// pooled output as well.
pub struct BertModel {
    config: BertConfig,
    embeddings: BertEmbeddings,
    encoder: TransformerEncoder,
    pooler: BertPooler,
}

impl BertModel {
    /// A randomly initialized model (f32).
    pub fn new(config: &BertConfig) -> Result<BertModel> {
        let model = BertModel::build(config)?;
        init_weights(&model, config.initializer_range)?;
        Ok(model)
    }

    /// The layers with their constructors' initialization.
    fn build(c: &BertConfig) -> Result<BertModel> {
        c.validate()?;
        let encoder = TransformerEncoder::new(
            || {
                TransformerEncoderLayer::new(c.hidden_size, c.num_attention_heads, c.intermediate_size)?
                    .dropout(c.hidden_dropout_prob)?
                    .attn_dropout(c.attention_probs_dropout_prob)?
                    .act_dropout(0.0)?
                    .activation(c.hidden_act)
                    .layer_norm_eps(c.layer_norm_eps)
            },
            c.num_hidden_layers,
        )?;
        Ok(BertModel {
            config: c.clone(),
            embeddings: BertEmbeddings::new(c)?,
            encoder,
            pooler: BertPooler {
                dense: Linear::new(c.hidden_size, c.hidden_size)?,
            },
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Encode `input_ids [N, L]`. `token_type_ids` (`[N, L]`, integers below `type_vocab_size`)
    /// default to 0; `attention_mask` (`[N, L]`, HuggingFace's convention: non-zero or `true` for
    /// real tokens, 0 for padding; padding keys get −10⁴ added to their scores, as PaddleNLP)
    /// defaults to attending everywhere. Returns the last hidden states `[N, L, hidden_size]` and
    /// the pooled output `[N, hidden_size]`.
    pub fn forward_with_mask(
        &self,
        input_ids: &Tensor,
        token_type_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        self.check(input_ids, token_type_ids, attention_mask)?;
        // PaddleNLP's additive mask: −10⁴ on the scores of padding keys, [N, 1, 1, L] so every
        // head and query sees the same keys.
        let dtype = self.embeddings.word_embeddings.weight().dtype();
        let bias = attention_mask
            .map(|m| {
                let keep = if m.dtype() == oar_ir::DType::Bool {
                    m.clone()
                } else {
                    m.not_equal(&m.scalar_like(0.0)?)?
                };
                keep.cast(dtype)?.scale(1e4, -1e4)?.unsqueeze(1)?.unsqueeze(1)
            })
            .transpose()?;
        let h = self.embeddings.embed(input_ids, token_type_ids)?;
        let h = self.encoder.forward_with_mask(&h, bias.as_ref())?;
        let pooled = self.pooler.forward(&h)?;
        Ok((h, pooled))
    }

    fn check(&self, ids: &Tensor, types: Option<&Tensor>, mask: Option<&Tensor>) -> Result<()> {
        let integer = |t: &Tensor| !t.dtype().is_float() && t.dtype() != oar_ir::DType::Bool;
        let s = ids.shape();
        let max = self.config.max_position_embeddings;
        if s.len() != 2 || !integer(ids) || s[1] == 0 || s[1] > max {
            return Err(Error::invalid(
                "BertModel",
                format!(
                    "input_ids must be integer [N, L] with 1 ≤ L ≤ max_position_embeddings ({max}), got {}",
                    ids.tensor_type()
                ),
            ));
        }
        if let Some(t) = types
            && (t.shape() != s || !integer(t))
        {
            return Err(Error::invalid(
                "BertModel",
                format!(
                    "token_type_ids must be integer and shaped like input_ids {}, got {}",
                    ids.tensor_type(),
                    t.tensor_type()
                ),
            ));
        }
        if let Some(m) = mask
            && m.shape() != s
        {
            return Err(Error::invalid(
                "BertModel",
                format!(
                    "attention_mask must be shaped like input_ids {}, got {}",
                    ids.tensor_type(),
                    m.tensor_type()
                ),
            ));
        }
        Ok(())
    }
}

impl Layer for BertModel {
    /// The last hidden states `[N, L, hidden_size]` of `input_ids [N, L]`, no mask.
    fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_mask(input_ids, None, None)?.0)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("embeddings".into(), &self.embeddings as &dyn Layer),
            ("encoder".into(), &self.encoder),
            ("pooler".into(), &self.pooler),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("embeddings".into(), &mut self.embeddings as &mut dyn Layer),
            ("encoder".into(), &mut self.encoder),
        ]
    }
}

/// BERT with a classification head (PaddleNLP / HuggingFace `BertForSequenceClassification`):
/// dropout and `classifier` (linear, `num_labels` outputs) on the pooled output. Parameters
/// `bert.…`, `classifier.weight`, `classifier.bias`. [`Layer::forward`] maps token ids `[N, L]`
/// to logits `[N, num_labels]`.
pub struct BertForSequenceClassification {
    bert: BertModel,
    dropout: Dropout,
    classifier: Linear,
}

impl BertForSequenceClassification {
    /// A randomly initialized classifier (f32).
    pub fn new(config: &BertConfig) -> Result<BertForSequenceClassification> {
        let model = BertForSequenceClassification {
            bert: BertModel::build(config)?,
            dropout: Dropout::new(config.hidden_dropout_prob)?,
            classifier: Linear::new(config.hidden_size, config.num_labels)?,
        };
        init_weights(&model, config.initializer_range)?;
        Ok(model)
    }

    /// The encoder.
    pub fn bert(&self) -> &BertModel {
        &self.bert
    }

    /// Logits `[N, num_labels]` of `input_ids [N, L]` with optional token types and attention
    /// mask (see [`BertModel::forward_with_mask`]).
    pub fn forward_with_mask(
        &self,
        input_ids: &Tensor,
        token_type_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (_, pooled) = self.bert.forward_with_mask(input_ids, token_type_ids, attention_mask)?;
        self.classifier.forward(&self.dropout.forward(&pooled)?)
    }
}

impl Layer for BertForSequenceClassification {
    /// Logits `[N, num_labels]` of `input_ids [N, L]`, no mask.
    fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        self.forward_with_mask(input_ids, None, None)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("bert".into(), &self.bert as &dyn Layer),
            ("classifier".into(), &self.classifier),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("bert".into(), &mut self.bert as &mut dyn Layer),
            ("dropout".into(), &mut self.dropout),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::{DType, TensorData};

    fn count(l: &dyn Layer) -> usize {
        l.parameters().iter().map(Tensor::numel).sum()
    }

    fn vals(t: &Tensor) -> Vec<f64> {
        t.to_vec::<f64>().unwrap()
    }

    fn ids(v: Vec<i64>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape).unwrap()
    }

    fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
        }
    }

    /// BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
    /// intermediate_size=16, max_position_embeddings=12, type_vocab_size=3, num_labels=5).
    fn tiny() -> BertConfig {
        BertConfig {
            vocab_size: 50,
            hidden_size: 8,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            intermediate_size: 16,
            max_position_embeddings: 12,
            type_vocab_size: 3,
            num_labels: 5,
            ..BertConfig::default()
        }
    }

    /// The tiny classifier in f64 and eval mode, with non-zero biases.
    fn tiny_f64() -> BertForSequenceClassification {
        let mut m = BertForSequenceClassification::new(&tiny()).unwrap();
        m.to_dtype(DType::F64).unwrap();
        m.eval();
        for (i, (name, p)) in m.named_parameters().into_iter().enumerate() {
            if name.ends_with("bias") {
                let v: Vec<f64> = (0..p.numel()).map(|k| 0.01 * ((k + i) % 7) as f64 - 0.03).collect();
                p.set_data(TensorData::from_vec(p.shape(), v).unwrap()).unwrap();
            }
        }
        m
    }

    #[test]
    fn bert_base_parameter_count_matches_huggingface() {
        // sum(p.numel() for p in BertForSequenceClassification(BertConfig(num_labels=2)).parameters());
        // building it takes seconds in a debug build, so the count comes from the formula,
        // checked against built models below.
        assert_eq!(BertConfig::default().num_parameters(), 109_483_778);
        for c in [
            tiny(),
            BertConfig {
                num_hidden_layers: 1,
                type_vocab_size: 1,
                num_labels: 2,
                ..tiny()
            },
            BertConfig {
                hidden_size: 12,
                num_attention_heads: 3,
                intermediate_size: 5,
                ..tiny()
            },
        ] {
            let model = BertForSequenceClassification::new(&c).unwrap();
            assert_eq!(count(&model), c.num_parameters(), "{c:?}");
            let encoder = BertModel::new(&c).unwrap();
            assert_eq!(count(&encoder), c.num_parameters() - (c.hidden_size + 1) * c.num_labels);
        }
    }

    #[test]
    fn tiny_model_count_names_and_initialization() {
        let model = BertForSequenceClassification::new(&tiny()).unwrap();
        // The same count from transformers for the tiny config.
        assert_eq!(count(&model), 1853);
        let sd = model.state_dict();
        for (name, shape) in [
            ("bert.embeddings.word_embeddings.weight", vec![50, 8]),
            ("bert.embeddings.position_embeddings.weight", vec![12, 8]),
            ("bert.embeddings.token_type_embeddings.weight", vec![3, 8]),
            ("bert.embeddings.layer_norm.weight", vec![8]),
            ("bert.encoder.layers.1.self_attn.q_proj.weight", vec![8, 8]),
            ("bert.encoder.layers.1.linear1.weight", vec![8, 16]),
            ("bert.encoder.layers.0.norm2.bias", vec![8]),
            ("bert.pooler.dense.weight", vec![8, 8]),
            ("classifier.weight", vec![8, 5]),
            ("classifier.bias", vec![5]),
        ] {
            assert_eq!(sd.get(name).map(Tensor::shape), Some(shape), "{name}");
        }
        // N(0, 0.02²) weights, zero biases.
        let w = sd["bert.embeddings.word_embeddings.weight"].to_vec::<f32>().unwrap();
        let std = (w.iter().map(|x| x * x).sum::<f32>() / w.len() as f32).sqrt();
        assert!((0.015..0.025).contains(&std), "std {std}");
        assert!(sd["classifier.bias"].to_vec::<f32>().unwrap().iter().all(|&b| b == 0.0));
    }

    #[test]
    fn classifier_matches_a_computation_by_hand() {
        let m = tiny_f64();
        let p = m.state_dict();
        let (n, l, h) = (2, 4, 8);
        let tok = vec![3i64, 17, 0, 49, 5, 5, 1, 2];
        let types = vec![0i64, 0, 1, 1, 0, 2, 2, 2];
        let logits = m
            .forward_with_mask(&ids(tok.clone(), &[n, l]), Some(&ids(types.clone(), &[n, l])), None)
            .unwrap();
        // Embeddings: rows summed, then layer norm with ε = 1e-12.
        let (we, pe, te) = (
            vals(&p["bert.embeddings.word_embeddings.weight"]),
            vals(&p["bert.embeddings.position_embeddings.weight"]),
            vals(&p["bert.embeddings.token_type_embeddings.weight"]),
        );
        let (g, b) = (
            vals(&p["bert.embeddings.layer_norm.weight"]),
            vals(&p["bert.embeddings.layer_norm.bias"]),
        );
        let mut emb = Vec::new();
        for k in 0..n * l {
            let row: Vec<f64> = (0..h)
                .map(|j| we[tok[k] as usize * h + j] + pe[(k % l) * h + j] + te[types[k] as usize * h + j])
                .collect();
            let mean = row.iter().sum::<f64>() / h as f64;
            let var = row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / h as f64;
            emb.extend((0..h).map(|j| (row[j] - mean) / (var + 1e-12).sqrt() * g[j] + b[j]));
        }
        // The encoder stack (tested on its own in nn::transformer).
        let enc = m
            .bert
            .encoder
            .forward(&Tensor::from_vec(emb, &[n, l, h]).unwrap())
            .unwrap();
        let enc = vals(&enc);
        // Pooler on token 0, then the classifier.
        let affine = |x: &[f64], w: &[f64], bias: &[f64]| -> Vec<f64> {
            (0..bias.len())
                .map(|o| {
                    bias[o]
                        + x.iter()
                            .enumerate()
                            .map(|(i, xi)| xi * w[i * bias.len() + o])
                            .sum::<f64>()
                })
                .collect()
        };
        let mut expect = Vec::new();
        for s in 0..n {
            let cls = &enc[s * l * h..s * l * h + h];
            let pooled: Vec<f64> = affine(
                cls,
                &vals(&p["bert.pooler.dense.weight"]),
                &vals(&p["bert.pooler.dense.bias"]),
            )
            .into_iter()
            .map(f64::tanh)
            .collect();
            expect.extend(affine(
                &pooled,
                &vals(&p["classifier.weight"]),
                &vals(&p["classifier.bias"]),
            ));
        }
        assert_eq!(logits.shape(), vec![n, 5]);
        assert_close(&vals(&logits), &expect, 1e-10, "logits");
    }

    #[test]
    fn attention_mask_hides_padding_and_token_types_default_to_zero() {
        let m = tiny_f64();
        let short = ids(vec![7, 8, 9], &[1, 3]);
        let padded = ids(vec![7, 8, 9, 0, 0], &[1, 5]);
        let mask = ids(vec![1, 1, 1, 0, 0], &[1, 5]);
        let (h_short, p_short) = m.bert.forward_with_mask(&short, None, None).unwrap();
        let (h_pad, p_pad) = m.bert.forward_with_mask(&padded, None, Some(&mask)).unwrap();
        assert_eq!(h_pad.shape(), vec![1, 5, 8]);
        assert_close(&vals(&h_pad)[..24], &vals(&h_short), 1e-10, "real tokens");
        assert_close(&vals(&p_pad), &vals(&p_short), 1e-10, "pooled");
        let bool_mask = Tensor::from_vec(vec![true, true, true, false, false], &[1, 5]).unwrap();
        let with_bool = m.forward_with_mask(&padded, None, Some(&bool_mask)).unwrap();
        assert_close(
            &vals(&with_bool),
            &vals(&m.forward(&short).unwrap()),
            1e-10,
            "bool mask",
        );
        // Without the mask the padding is attended to.
        assert!(vals(&m.bert.forward(&padded).unwrap())[..24] != vals(&h_short)[..]);
        // Token types: zeros are the default, others change the result.
        let zeros = ids(vec![0; 3], &[1, 3]);
        let ones = ids(vec![1; 3], &[1, 3]);
        let with_zeros = m.forward_with_mask(&short, Some(&zeros), None).unwrap();
        assert_close(&vals(&with_zeros), &vals(&m.forward(&short).unwrap()), 1e-12, "types 0");
        assert!(vals(&m.forward_with_mask(&short, Some(&ones), None).unwrap()) != vals(&with_zeros));
    }

    #[test]
    fn bad_inputs_and_configs_are_typed_errors() {
        let m = BertForSequenceClassification::new(&tiny()).unwrap();
        let e = m.forward(&ids(vec![1; 13], &[1, 13])).unwrap_err().to_string();
        assert!(
            e.contains("BertModel") && e.contains("max_position_embeddings (12)"),
            "{e}"
        );
        assert!(m.forward(&ids(vec![1; 3], &[3])).is_err());
        assert!(m.forward(&Tensor::from_vec(vec![1.0f32; 3], &[1, 3]).unwrap()).is_err());
        assert!(
            m.forward(&ids(vec![50, 1], &[1, 2])).is_err(),
            "id beyond the vocabulary"
        );
        let x = ids(vec![1; 6], &[2, 3]);
        let e = m
            .forward_with_mask(&x, Some(&ids(vec![0; 3], &[1, 3])), None)
            .unwrap_err();
        assert!(e.to_string().contains("token_type_ids"), "{e}");
        let e = m
            .forward_with_mask(&x, None, Some(&ids(vec![1; 4], &[2, 2])))
            .unwrap_err();
        assert!(e.to_string().contains("attention_mask"), "{e}");
        for bad in [
            BertConfig {
                num_labels: 0,
                ..tiny()
            },
            BertConfig {
                num_attention_heads: 3,
                ..tiny()
            },
            BertConfig {
                hidden_dropout_prob: 1.0,
                ..tiny()
            },
        ] {
            assert!(BertForSequenceClassification::new(&bad).is_err(), "{bad:?}");
        }
    }
}
