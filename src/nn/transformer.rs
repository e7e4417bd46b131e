//! Attention and the Transformer encoder with Paddle 2 names and layouts: `MultiHeadAttention`
//! (`q_proj.weight [E, E]`, …), `TransformerEncoderLayer` (`self_attn`, `linear1`, `linear2`,
//! `norm1`, `norm2`) and `TransformerEncoder` (`layers.0.…`, optional `norm`).
//!
//! Inputs are batch-first `[N, L, E]`. Attention masks broadcast to `[N, heads, L, S]`; a bool
//! mask keeps `true` positions, a float mask is added to the scores, an integer mask keeps
//! non-zero positions (as Paddle converts it).

use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::nn::functional as F;
use crate::tensor::Tensor;
use oar_ir::DType;

/// The feed-forward activation of a Transformer layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)` (Paddle's default).
    #[default]
    Relu,
    /// Exact (erf) GELU.
    Gelu,
}

fn check_p(layer: &str, what: &str, p: f64) -> Result<f64> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::invalid(layer, format!("{what} p={p} must be in [0, 1)")));
    }
    Ok(p)
}

/// A trainable copy of `t` in `dtype` (for the `.dtype(..)` builders).
fn recast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    Tensor::parameter(t.cast(dtype)?.data())
}

/// `x W + b` with Paddle's layout `W [in, out]`; Xavier-uniform weight, zero bias as Paddle's
/// `nn.Linear`. Private: the public `Linear` layer lives in its own module.
struct Proj {
    weight: Tensor,
    bias: Tensor,
}

impl Proj {
    fn new(input: usize, output: usize) -> Result<Proj> {
        let limit = (6.0 / (input + output) as f64).sqrt();
        Ok(Proj {
            weight: Tensor::parameter(crate::tensor::uniform(&[input, output], -limit, limit, DType::F32)?.data())?,
            bias: Tensor::parameter(crate::tensor::zeros(&[output], DType::F32)?.data())?,
        })
    }

    fn recast(&self, dtype: DType) -> Result<Proj> {
        Ok(Proj {
            weight: recast(&self.weight, dtype)?,
            bias: recast(&self.bias, dtype)?,
        })
    }
}

impl Layer for Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::linear(x, &self.weight, Some(&self.bias))
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }
}

/// Layer normalization over the last axis with weight ones, bias zeros, ε = 1e-5 (Paddle's
/// `nn.LayerNorm` defaults). Private for the same reason as [`Proj`].
struct Norm {
    weight: Tensor,
    bias: Tensor,
}

const NORM_EPS: f64 = 1e-5;

impl Norm {
    fn new(dim: usize) -> Result<Norm> {
        Ok(Norm {
            weight: Tensor::parameter(crate::tensor::ones(&[dim], DType::F32)?.data())?,
            bias: Tensor::parameter(crate::tensor::zeros(&[dim], DType::F32)?.data())?,
        })
    }

    fn recast(&self, dtype: DType) -> Result<Norm> {
        Ok(Norm {
            weight: recast(&self.weight, dtype)?,
            bias: recast(&self.bias, dtype)?,
        })
    }
}

impl Layer for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::layer_norm(x, 1, Some(&self.weight), Some(&self.bias), NORM_EPS)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }
}

/// Whether a mask of shape `m` broadcasts (numpy rules) to `target`.
fn broadcasts(m: &[usize], target: &[usize]) -> bool {
    m.len() <= target.len() && m.iter().rev().zip(target.iter().rev()).all(|(&a, &b)| a == 1 || a == b)
}

/// Multi-head attention (Paddle `nn.MultiHeadAttention`): project, split into heads, scaled
/// dot-product attention per head, merge, project out.
pub struct MultiHeadAttention {
    embed_dim: usize,
    num_heads: usize,
    dropout: f64,
    training: bool,
    q_proj: Proj,
    k_proj: Proj,
    v_proj: Proj,
    out_proj: Proj,
}

impl MultiHeadAttention {
    /// Attention over `embed_dim` features split into `num_heads` heads (f32, no dropout).
    pub fn new(embed_dim: usize, num_heads: usize) -> Result<MultiHeadAttention> {
        if embed_dim == 0 || num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(Error::invalid(
                "MultiHeadAttention",
                format!("embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})"),
            ));
        }
        Ok(MultiHeadAttention {
            embed_dim,
            num_heads,
            dropout: 0.0,
            training: true,
            q_proj: Proj::new(embed_dim, embed_dim)?,
            k_proj: Proj::new(embed_dim, embed_dim)?,
            v_proj: Proj::new(embed_dim, embed_dim)?,
            out_proj: Proj::new(embed_dim, embed_dim)?,
        })
    }

    /// Dropout on the attention weights (training only).
    pub fn dropout(mut self, p: f64) -> Result<Self> {
        self.dropout = check_p("MultiHeadAttention", "dropout", p)?;
        Ok(self)
    }

    /// Feature size of keys (`k_proj.weight` becomes `[kdim, E]`; rebuilds that projection).
    pub fn kdim(mut self, kdim: usize) -> Result<Self> {
        self.k_proj = Proj::new(kdim, self.embed_dim)?.recast(self.param_dtype())?;
        Ok(self)
    }

    /// Feature size of values (`v_proj.weight` becomes `[vdim, E]`; rebuilds that projection).
    pub fn vdim(mut self, vdim: usize) -> Result<Self> {
        self.v_proj = Proj::new(vdim, self.embed_dim)?.recast(self.param_dtype())?;
        Ok(self)
    }

    /// Cast every parameter to `dtype` (values kept).
    pub fn dtype(self, dtype: DType) -> Result<Self> {
        Ok(MultiHeadAttention {
            q_proj: self.q_proj.recast(dtype)?,
            k_proj: self.k_proj.recast(dtype)?,
            v_proj: self.v_proj.recast(dtype)?,
            out_proj: self.out_proj.recast(dtype)?,
            ..self
        })
    }

    /// The parameter dtype.
    fn param_dtype(&self) -> DType {
        self.q_proj.weight.dtype()
    }

    /// Features of queries and of the output.
    pub fn embed_dim(&self) -> usize {
        self.embed_dim
    }

    /// Number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    fn check(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
        let dt = self.param_dtype();
        let (kdim, vdim) = (self.k_proj.weight.shape()[0], self.v_proj.weight.shape()[0]);
        let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
        let ok = qs.len() == 3
            && ks.len() == 3
            && vs.len() == 3
            && qs[2] == self.embed_dim
            && ks[2] == kdim
            && vs[2] == vdim
            && qs[0] == ks[0]
            && ks[0] == vs[0]
            && ks[1] == vs[1]
            && [q, k, v].iter().all(|t| t.dtype() == dt);
        if !ok {
            return Err(Error::invalid(
                "MultiHeadAttention",
                format!(
                    "expects query {dt}[N, L, {}], key {dt}[N, S, {kdim}], value {dt}[N, S, {vdim}]; got {}, {}, {}",
                    self.embed_dim,
                    q.tensor_type(),
                    k.tensor_type(),
                    v.tensor_type()
                ),
            ));
        }
        Ok(())
    }

    /// `[N, L, E]` → `[N, heads, L, E/heads]`.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let hd = (self.embed_dim / self.num_heads) as i64;
        x.reshape(&[0, 0, self.num_heads as i64, hd])?.transpose(&[0, 2, 1, 3])
    }

    /// Attention of `q [N, L, E]` over `k [N, S, kdim]`, `v [N, S, vdim]`; `attn_mask` broadcasts
    /// to `[N, heads, L, S]`. Returns `[N, L, E]`.
    pub fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, attn_mask: Option<&Tensor>) -> Result<Tensor> {
        self.check(q, k, v)?;
        let (n, l, s) = (q.shape()[0], q.shape()[1], k.shape()[1]);
        let mask = match attn_mask {
            None => None,
            Some(m) => {
                let target = [n, self.num_heads, l, s];
                let dt = m.dtype();
                if !broadcasts(&m.shape(), &target)
                    || !(dt == DType::Bool || dt == self.param_dtype() || !dt.is_float())
                {
                    return Err(Error::invalid(
                        "MultiHeadAttention",
                        format!(
                            "attn_mask must be bool, integer or {} and broadcast to [N, heads, L, S] = {target:?}, got {}",
                            self.param_dtype(),
                            m.tensor_type()
                        ),
                    ));
                }
                // Paddle treats an integer mask as "non-zero keeps".
                Some(if dt == DType::Bool || dt.is_float() {
                    m.clone()
                } else {
                    m.not_equal(&crate::tensor::zeros(&[], dt)?)?
                })
            }
        };
        let qh = self.split_heads(&self.q_proj.forward(q)?)?;
        let kh = self.split_heads(&self.k_proj.forward(k)?)?;
        let vh = self.split_heads(&self.v_proj.forward(v)?)?;
        let heads = if self.training && self.dropout > 0.0 {
            // The fused composite has no dropout on the weights, so spell attention out here.
            let hd = (self.embed_dim / self.num_heads) as f64;
            let mut scores = qh.matmul(&kh.t()?)?.scale(1.0 / hd.sqrt(), 0.0)?;
            if let Some(m) = &mask {
                scores = if m.dtype() == DType::Bool {
                    let lowest = crate::tensor::full(&[], -1e9, scores.dtype())?;
                    Tensor::where_(m, &scores, &lowest)?
                } else {
                    (&scores + m)?
                };
            }
            let w = F::dropout(&F::softmax(&scores, -1)?, self.dropout, true)?;
            w.matmul(&vh)?
        } else {
            F::scaled_dot_product_attention(&qh, &kh, &vh, mask.as_ref(), false, None)?
        };
        let merged = heads
            .transpose(&[0, 2, 1, 3])?
            .reshape(&[0, 0, self.embed_dim as i64])?;
        self.out_proj.forward(&merged)
    }
}

impl Layer for MultiHeadAttention {
    /// Self-attention: `attend(x, x, x, None)`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, x, x, None)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("q_proj".into(), &self.q_proj as &dyn Layer),
            ("k_proj".into(), &self.k_proj),
            ("v_proj".into(), &self.v_proj),
            ("out_proj".into(), &self.out_proj),
        ]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// One Transformer encoder layer (Paddle `nn.TransformerEncoderLayer`): self-attention and a
/// feed-forward block, each with a residual connection and layer norm — after the residual
/// (post-norm, default) or before the block (`normalize_before`).
pub struct TransformerEncoderLayer {
    d_model: usize,
    dropout: f64,
    act_dropout: Option<f64>,
    attn_dropout_set: bool,
    activation: Activation,
    normalize_before: bool,
    training: bool,
    self_attn: MultiHeadAttention,
    linear1: Proj,
    linear2: Proj,
    norm1: Norm,
    norm2: Norm,
}

impl TransformerEncoderLayer {
    /// A layer of width `d_model`, `nhead` heads and a `dim_feedforward` hidden block; Paddle's
    /// defaults: dropout 0.1 everywhere, ReLU, post-norm, f32.
    pub fn new(d_model: usize, nhead: usize, dim_feedforward: usize) -> Result<TransformerEncoderLayer> {
        if dim_feedforward == 0 {
            return Err(Error::invalid(
                "TransformerEncoderLayer",
                "dim_feedforward must be positive",
            ));
        }
        Ok(TransformerEncoderLayer {
            d_model,
            dropout: 0.1,
            act_dropout: None,
            attn_dropout_set: false,
            activation: Activation::Relu,
            normalize_before: false,
            training: true,
            self_attn: MultiHeadAttention::new(d_model, nhead)?.dropout(0.1)?,
            linear1: Proj::new(d_model, dim_feedforward)?,
            linear2: Proj::new(dim_feedforward, d_model)?,
            norm1: Norm::new(d_model)?,
            norm2: Norm::new(d_model)?,
        })
    }

    /// Dropout after each block, and on attention weights and the feed-forward activation
    /// unless those were set separately.
    pub fn dropout(mut self, p: f64) -> Result<Self> {
        self.dropout = check_p("TransformerEncoderLayer", "dropout", p)?;
        if !self.attn_dropout_set {
            self.self_attn = self.self_attn.dropout(p)?;
        }
        Ok(self)
    }

    /// Dropout on the attention weights only.
    pub fn attn_dropout(mut self, p: f64) -> Result<Self> {
        self.self_attn = self.self_attn.dropout(p)?;
        self.attn_dropout_set = true;
        Ok(self)
    }

    /// Dropout after the feed-forward activation only.
    pub fn act_dropout(mut self, p: f64) -> Result<Self> {
        self.act_dropout = Some(check_p("TransformerEncoderLayer", "act_dropout", p)?);
        Ok(self)
    }

    /// The feed-forward activation.
    pub fn activation(mut self, a: Activation) -> Self {
        self.activation = a;
        self
    }

    /// Pre-norm (`true`) or post-norm (`false`, default), Paddle's `normalize_before`.
    pub fn normalize_before(mut self, pre: bool) -> Self {
        self.normalize_before = pre;
        self
    }

    /// Cast every parameter to `dtype` (values kept).
    pub fn dtype(self, dtype: DType) -> Result<Self> {
        Ok(TransformerEncoderLayer {
            self_attn: self.self_attn.dtype(dtype)?,
            linear1: self.linear1.recast(dtype)?,
            linear2: self.linear2.recast(dtype)?,
            norm1: self.norm1.recast(dtype)?,
            norm2: self.norm2.recast(dtype)?,
            ..self
        })
    }

    /// Model width.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// Encode `src [N, L, d_model]`; `src_mask` broadcasts to `[N, heads, L, L]`.
    pub fn forward_with_mask(&self, src: &Tensor, src_mask: Option<&Tensor>) -> Result<Tensor> {
        let s = src.shape();
        if s.len() != 3 || s[2] != self.d_model {
            return Err(Error::invalid(
                "TransformerEncoderLayer",
                format!(
                    "src must be [N, L, d_model = {}], got {}",
                    self.d_model,
                    src.tensor_type()
                ),
            ));
        }
        let pre = self.normalize_before;
        let drop = |x: &Tensor, p: f64| F::dropout(x, p, self.training);
        // Attention block.
        let a = if pre { self.norm1.forward(src)? } else { src.clone() };
        let a = self.self_attn.attend(&a, &a, &a, src_mask)?;
        let mut x = (src + &drop(&a, self.dropout)?)?;
        if !pre {
            x = self.norm1.forward(&x)?;
        }
        // Feed-forward block.
        let f = if pre { self.norm2.forward(&x)? } else { x.clone() };
        let h = self.linear1.forward(&f)?;
        let h = match self.activation {
            Activation::Relu => F::relu(&h)?,
            Activation::Gelu => F::gelu(&h, false)?,
        };
        let h = self
            .linear2
            .forward(&drop(&h, self.act_dropout.unwrap_or(self.dropout))?)?;
        let mut y = (&x + &drop(&h, self.dropout)?)?;
        if !pre {
            y = self.norm2.forward(&y)?;
        }
        Ok(y)
    }
}

impl Layer for TransformerEncoderLayer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with_mask(x, None)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("self_attn".into(), &self.self_attn as &dyn Layer),
            ("linear1".into(), &self.linear1),
            ("linear2".into(), &self.linear2),
            ("norm1".into(), &self.norm1),
            ("norm2".into(), &self.norm2),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("self_attn".into(), &mut self.self_attn as &mut dyn Layer)]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// A stack of encoder layers (Paddle `nn.TransformerEncoder`), with an optional final layer norm.
pub struct TransformerEncoder {
    layers: Vec<TransformerEncoderLayer>,
    norm: Option<Norm>,
}

impl TransformerEncoder {
    /// `num_layers` layers, each made by `layer_factory` (Paddle deep-copies one layer; a factory
    /// gives each its own parameters the Rust way).
    pub fn new(
        mut layer_factory: impl FnMut() -> Result<TransformerEncoderLayer>,
        num_layers: usize,
    ) -> Result<TransformerEncoder> {
        if num_layers == 0 {
            return Err(Error::invalid("TransformerEncoder", "num_layers must be positive"));
        }
        let layers = (0..num_layers).map(|_| layer_factory()).collect::<Result<Vec<_>>>()?;
        let d = layers[0].d_model;
        if let Some(bad) = layers.iter().find(|l| l.d_model != d) {
            return Err(Error::invalid(
                "TransformerEncoder",
                format!("layers disagree on d_model: {d} and {}", bad.d_model),
            ));
        }
        Ok(TransformerEncoder { layers, norm: None })
    }

    /// Add a final layer norm (`norm.weight`, `norm.bias`) in the layers' dtype.
    pub fn with_norm(mut self) -> Result<Self> {
        let first = &self.layers[0];
        self.norm = Some(Norm::new(first.d_model)?.recast(first.norm1.weight.dtype())?);
        Ok(self)
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Encode `src [N, L, d_model]` through every layer with the same `src_mask`.
    pub fn forward_with_mask(&self, src: &Tensor, src_mask: Option<&Tensor>) -> Result<Tensor> {
        let mut x = src.clone();
        for l in &self.layers {
            x = l.forward_with_mask(&x, src_mask)?;
        }
        match &self.norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }
}

impl Layer for TransformerEncoder {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with_mask(x, None)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &dyn Layer))
            .collect();
        if let Some(n) = &self.norm {
            v.push(("norm".into(), n));
        }
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        self.layers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &mut dyn Layer))
            .collect()
    }
}
