//! Attention and the Transformer with Paddle 2 names and layouts: `MultiHeadAttention`
//! (`q_proj.weight [E, E]`, …), `TransformerEncoderLayer` (`self_attn`, `linear1`, `linear2`,
//! `norm1`, `norm2`), `TransformerEncoder` (`layers.0.…`, optional `norm`),
//! `TransformerDecoderLayer` (`self_attn`, `cross_attn`, `linear1`, `linear2`, `norm1`–`norm3`),
//! `TransformerDecoder` and the encoder-decoder `Transformer` (`encoder.…`, `decoder.…`).
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

impl Activation {
    fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => F::relu(x),
            Activation::Gelu => F::gelu(x, false),
        }
    }
}

fn check_eps(layer: &str, eps: f64) -> Result<f64> {
    if !(eps.is_finite() && eps > 0.0) {
        return Err(Error::invalid(layer, format!("layer_norm_eps {eps} must be positive")));
    }
    Ok(eps)
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
/// `nn.LayerNorm` defaults; `layer_norm_eps` changes ε). Private for the same reason as [`Proj`].
struct Norm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

const NORM_EPS: f64 = 1e-5;

impl Norm {
    fn new(dim: usize) -> Result<Norm> {
        Ok(Norm {
            weight: Tensor::parameter(crate::tensor::ones(&[dim], DType::F32)?.data())?,
            bias: Tensor::parameter(crate::tensor::zeros(&[dim], DType::F32)?.data())?,
            eps: NORM_EPS,
        })
    }

    fn recast(&self, dtype: DType) -> Result<Norm> {
        Ok(Norm {
            weight: recast(&self.weight, dtype)?,
            bias: recast(&self.bias, dtype)?,
            eps: self.eps,
        })
    }

    /// A norm like this one (width, dtype, ε) with fresh parameters.
    fn like(&self) -> Result<Norm> {
        Ok(Norm {
            eps: self.eps,
            ..Norm::new(self.weight.numel())?.recast(self.weight.dtype())?
        })
    }
}

impl Layer for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::layer_norm(x, 1, Some(&self.weight), Some(&self.bias), self.eps)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }
}

/// How a Transformer layer wraps each block: `x + dropout(block(norm(x)))` before the block
/// (pre-norm) or `norm(x + dropout(block(x)))` after it (post-norm).
struct Residual {
    pre: bool,
    p: f64,
    training: bool,
}

impl Residual {
    fn apply(&self, x: &Tensor, norm: &Norm, block: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let input = if self.pre { norm.forward(x)? } else { x.clone() };
        let y = (x + &F::dropout(&block(&input)?, self.p, self.training)?)?;
        if self.pre { Ok(y) } else { norm.forward(&y) }
    }
}

/// The feed-forward block `linear2(dropout(act(linear1(x))))`.
fn feed_forward(
    x: &Tensor,
    (linear1, linear2): (&Proj, &Proj),
    act: Activation,
    p: f64,
    training: bool,
) -> Result<Tensor> {
    linear2.forward(&F::dropout(&act.apply(&linear1.forward(x)?)?, p, training)?)
}

/// `num_layers` layers from `factory`, all of width `d_model(layer)`, for the stack `name`.
fn build_stack<L>(
    name: &str,
    mut factory: impl FnMut() -> Result<L>,
    num_layers: usize,
    d_model: impl Fn(&L) -> usize,
) -> Result<Vec<L>> {
    if num_layers == 0 {
        return Err(Error::invalid(name, "num_layers must be positive"));
    }
    let layers = (0..num_layers).map(|_| factory()).collect::<Result<Vec<_>>>()?;
    let d = d_model(&layers[0]);
    if let Some(bad) = layers.iter().map(&d_model).find(|&b| b != d) {
        return Err(Error::invalid(
            name,
            format!("layers disagree on d_model: {d} and {bad}"),
        ));
    }
    Ok(layers)
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

    /// ε of the layer norms (default 1e-5; PyTorch's `layer_norm_eps`).
    pub fn layer_norm_eps(mut self, eps: f64) -> Result<Self> {
        let eps = check_eps("TransformerEncoderLayer", eps)?;
        self.norm1.eps = eps;
        self.norm2.eps = eps;
        Ok(self)
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
        let res = Residual {
            pre: self.normalize_before,
            p: self.dropout,
            training: self.training,
        };
        let x = res.apply(src, &self.norm1, |a| self.self_attn.attend(a, a, a, src_mask))?;
        res.apply(&x, &self.norm2, |f| {
            feed_forward(
                f,
                (&self.linear1, &self.linear2),
                self.activation,
                self.act_dropout.unwrap_or(self.dropout),
                self.training,
            )
        })
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
        layer_factory: impl FnMut() -> Result<TransformerEncoderLayer>,
        num_layers: usize,
    ) -> Result<TransformerEncoder> {
        let layers = build_stack("TransformerEncoder", layer_factory, num_layers, |l| l.d_model)?;
        Ok(TransformerEncoder { layers, norm: None })
    }

    /// Add a final layer norm (`norm.weight`, `norm.bias`) with the layers' dtype and ε.
    pub fn with_norm(mut self) -> Result<Self> {
        self.norm = Some(self.layers[0].norm1.like()?);
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

/// One Transformer decoder layer (Paddle `nn.TransformerDecoderLayer`; PyTorch's
/// `nn.TransformerDecoderLayer` with `batch_first=True` computes the same, naming the
/// cross-attention `multihead_attn`): self-attention over the target (usually with a causal
/// `tgt_mask`), cross-attention from the target to the encoder's memory, and a feed-forward
/// block, each with a residual connection and layer norm (`norm1`, `norm2`, `norm3`) — after the
/// residual (post-norm, default) or before the block (`normalize_before`).
pub struct TransformerDecoderLayer {
    d_model: usize,
    dropout: f64,
    act_dropout: Option<f64>,
    attn_dropout_set: bool,
    activation: Activation,
    normalize_before: bool,
    training: bool,
    self_attn: MultiHeadAttention,
    cross_attn: MultiHeadAttention,
    linear1: Proj,
    linear2: Proj,
    norm1: Norm,
    norm2: Norm,
    norm3: Norm,
}

impl TransformerDecoderLayer {
    /// A layer of width `d_model`, `nhead` heads and a `dim_feedforward` hidden block; Paddle's
    /// defaults: dropout 0.1 everywhere, ReLU, post-norm, f32.
    pub fn new(d_model: usize, nhead: usize, dim_feedforward: usize) -> Result<TransformerDecoderLayer> {
        if dim_feedforward == 0 {
            return Err(Error::invalid(
                "TransformerDecoderLayer",
                "dim_feedforward must be positive",
            ));
        }
        Ok(TransformerDecoderLayer {
            d_model,
            dropout: 0.1,
            act_dropout: None,
            attn_dropout_set: false,
            activation: Activation::Relu,
            normalize_before: false,
            training: true,
            self_attn: MultiHeadAttention::new(d_model, nhead)?.dropout(0.1)?,
            cross_attn: MultiHeadAttention::new(d_model, nhead)?.dropout(0.1)?,
            linear1: Proj::new(d_model, dim_feedforward)?,
            linear2: Proj::new(dim_feedforward, d_model)?,
            norm1: Norm::new(d_model)?,
            norm2: Norm::new(d_model)?,
            norm3: Norm::new(d_model)?,
        })
    }

    /// Dropout after each block, and on attention weights and the feed-forward activation
    /// unless those were set separately.
    pub fn dropout(mut self, p: f64) -> Result<Self> {
        self.dropout = check_p("TransformerDecoderLayer", "dropout", p)?;
        if !self.attn_dropout_set {
            self.self_attn = self.self_attn.dropout(p)?;
            self.cross_attn = self.cross_attn.dropout(p)?;
        }
        Ok(self)
    }

    /// Dropout on the attention weights (self- and cross-attention) only.
    pub fn attn_dropout(mut self, p: f64) -> Result<Self> {
        self.self_attn = self.self_attn.dropout(p)?;
        self.cross_attn = self.cross_attn.dropout(p)?;
        self.attn_dropout_set = true;
        Ok(self)
    }

    /// Dropout after the feed-forward activation only.
    pub fn act_dropout(mut self, p: f64) -> Result<Self> {
        self.act_dropout = Some(check_p("TransformerDecoderLayer", "act_dropout", p)?);
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

    /// ε of the layer norms (default 1e-5; PyTorch's `layer_norm_eps`).
    pub fn layer_norm_eps(mut self, eps: f64) -> Result<Self> {
        let eps = check_eps("TransformerDecoderLayer", eps)?;
        self.norm1.eps = eps;
        self.norm2.eps = eps;
        self.norm3.eps = eps;
        Ok(self)
    }

    /// Cast every parameter to `dtype` (values kept).
    pub fn dtype(self, dtype: DType) -> Result<Self> {
        Ok(TransformerDecoderLayer {
            self_attn: self.self_attn.dtype(dtype)?,
            cross_attn: self.cross_attn.dtype(dtype)?,
            linear1: self.linear1.recast(dtype)?,
            linear2: self.linear2.recast(dtype)?,
            norm1: self.norm1.recast(dtype)?,
            norm2: self.norm2.recast(dtype)?,
            norm3: self.norm3.recast(dtype)?,
            ..self
        })
    }

    /// Model width.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// Decode `tgt [N, L, d_model]` attending to `memory [N, S, d_model]`. `tgt_mask` broadcasts
    /// to `[N, heads, L, L]` (e.g. [`Transformer::generate_square_subsequent_mask`]),
    /// `memory_mask` to `[N, heads, L, S]`; masks follow [`MultiHeadAttention::attend`].
    pub fn forward_with_masks(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_mask: Option<&Tensor>,
        memory_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (t, m) = (tgt.shape(), memory.shape());
        if t.len() != 3 || m.len() != 3 || t[2] != self.d_model || m[2] != self.d_model || t[0] != m[0] {
            return Err(Error::invalid(
                "TransformerDecoderLayer",
                format!(
                    "tgt must be [N, L, d_model = {d}] and memory [N, S, {d}], got {} and {}",
                    tgt.tensor_type(),
                    memory.tensor_type(),
                    d = self.d_model,
                ),
            ));
        }
        let res = Residual {
            pre: self.normalize_before,
            p: self.dropout,
            training: self.training,
        };
        let x = res.apply(tgt, &self.norm1, |a| self.self_attn.attend(a, a, a, tgt_mask))?;
        let x = res.apply(&x, &self.norm2, |a| {
            self.cross_attn.attend(a, memory, memory, memory_mask)
        })?;
        res.apply(&x, &self.norm3, |f| {
            feed_forward(
                f,
                (&self.linear1, &self.linear2),
                self.activation,
                self.act_dropout.unwrap_or(self.dropout),
                self.training,
            )
        })
    }
}

/// The error of `Layer::forward` on a layer that needs two inputs.
fn needs_two_inputs(layer: &str, method: &str) -> Error {
    Error::invalid(layer, format!("needs two inputs; call `{method}` instead of `forward`"))
}

impl Layer for TransformerDecoderLayer {
    /// An error: decoding needs the encoder memory too (use
    /// [`TransformerDecoderLayer::forward_with_masks`]).
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(needs_two_inputs(
            "TransformerDecoderLayer",
            "forward_with_masks(tgt, memory, tgt_mask, memory_mask)",
        ))
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("self_attn".into(), &self.self_attn as &dyn Layer),
            ("cross_attn".into(), &self.cross_attn),
            ("linear1".into(), &self.linear1),
            ("linear2".into(), &self.linear2),
            ("norm1".into(), &self.norm1),
            ("norm2".into(), &self.norm2),
            ("norm3".into(), &self.norm3),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("self_attn".into(), &mut self.self_attn as &mut dyn Layer),
            ("cross_attn".into(), &mut self.cross_attn),
        ]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// A stack of decoder layers (Paddle `nn.TransformerDecoder`), with an optional final layer norm.
pub struct TransformerDecoder {
    layers: Vec<TransformerDecoderLayer>,
    norm: Option<Norm>,
}

impl TransformerDecoder {
    /// `num_layers` layers, each made by `layer_factory` (Paddle deep-copies one layer; a factory
    /// gives each its own parameters the Rust way).
    pub fn new(
        layer_factory: impl FnMut() -> Result<TransformerDecoderLayer>,
        num_layers: usize,
    ) -> Result<TransformerDecoder> {
        let layers = build_stack("TransformerDecoder", layer_factory, num_layers, |l| l.d_model)?;
        Ok(TransformerDecoder { layers, norm: None })
    }

    /// Add a final layer norm (`norm.weight`, `norm.bias`) with the layers' dtype and ε.
    pub fn with_norm(mut self) -> Result<Self> {
        self.norm = Some(self.layers[0].norm1.like()?);
        Ok(self)
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Decode `tgt [N, L, d_model]` over `memory [N, S, d_model]` through every layer with the
    /// same masks (see [`TransformerDecoderLayer::forward_with_masks`]).
    pub fn forward_with_masks(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_mask: Option<&Tensor>,
        memory_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let mut x = tgt.clone();
        for l in &self.layers {
            x = l.forward_with_masks(&x, memory, tgt_mask, memory_mask)?;
        }
        match &self.norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }
}

impl Layer for TransformerDecoder {
    /// An error: decoding needs the encoder memory too (use
    /// [`TransformerDecoder::forward_with_masks`]).
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(needs_two_inputs(
            "TransformerDecoder",
            "forward_with_masks(tgt, memory, tgt_mask, memory_mask)",
        ))
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

/// The configuration of a [`Transformer`]. `Default` gives the base model of Vaswani et al.
/// (2017) with the defaults of `paddle.nn.Transformer` and `torch.nn.Transformer`: d_model 512,
/// 8 heads, 6 encoder and 6 decoder layers, feed-forward 2048, dropout 0.1, ReLU, post-norm.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerConfig {
    /// Model width.
    pub d_model: usize,
    /// Attention heads (must divide `d_model`).
    pub nhead: usize,
    /// Encoder layers.
    pub num_encoder_layers: usize,
    /// Decoder layers.
    pub num_decoder_layers: usize,
    /// Hidden width of each feed-forward block.
    pub dim_feedforward: usize,
    /// Dropout after each block (and, unless set below, on attention weights and activations).
    pub dropout: f64,
    /// The feed-forward activation.
    pub activation: Activation,
    /// Dropout on the attention weights (default: `dropout`).
    pub attn_dropout: Option<f64>,
    /// Dropout after the feed-forward activation (default: `dropout`).
    pub act_dropout: Option<f64>,
    /// Pre-norm layers (Paddle's `normalize_before`, PyTorch's `norm_first`).
    pub normalize_before: bool,
    /// ε of every layer norm (PyTorch's `layer_norm_eps`).
    pub layer_norm_eps: f64,
}

impl Default for TransformerConfig {
    fn default() -> TransformerConfig {
        TransformerConfig {
            d_model: 512,
            nhead: 8,
            num_encoder_layers: 6,
            num_decoder_layers: 6,
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            attn_dropout: None,
            act_dropout: None,
            normalize_before: false,
            layer_norm_eps: 1e-5,
        }
    }
}

/// The encoder-decoder Transformer (Vaswani et al. 2017) as `paddle.nn.Transformer` and
/// `torch.nn.Transformer` (batch-first): a [`TransformerEncoder`] and a [`TransformerDecoder`],
/// each ending in a layer norm (`encoder.norm`, `decoder.norm`) as both frameworks build them.
/// Inputs are already embedded: `src [N, S, d_model]`, `tgt [N, T, d_model]`.
pub struct Transformer {
    d_model: usize,
    nhead: usize,
    encoder: TransformerEncoder,
    decoder: TransformerDecoder,
}

/// A `$ty` (encoder or decoder layer) set up as the [`TransformerConfig`] `$c` says.
macro_rules! configured_layer {
    ($ty:ident, $c:expr) => {{
        let c = $c;
        let mut l = $ty::new(c.d_model, c.nhead, c.dim_feedforward)?
            .dropout(c.dropout)?
            .activation(c.activation)
            .normalize_before(c.normalize_before)
            .layer_norm_eps(c.layer_norm_eps)?;
        if let Some(p) = c.attn_dropout {
            l = l.attn_dropout(p)?;
        }
        if let Some(p) = c.act_dropout {
            l = l.act_dropout(p)?;
        }
        Ok(l)
    }};
}

impl Transformer {
    /// A Transformer configured by `config` (f32).
    pub fn new(config: &TransformerConfig) -> Result<Transformer> {
        let c = config;
        let encoder = TransformerEncoder::new(|| configured_layer!(TransformerEncoderLayer, c), c.num_encoder_layers)?
            .with_norm()?;
        let decoder = TransformerDecoder::new(|| configured_layer!(TransformerDecoderLayer, c), c.num_decoder_layers)?
            .with_norm()?;
        Ok(Transformer {
            d_model: c.d_model,
            nhead: c.nhead,
            encoder,
            decoder,
        })
    }

    /// Model width.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// Attention heads.
    pub fn nhead(&self) -> usize {
        self.nhead
    }

    /// The encoder (to encode a source once and decode step by step).
    pub fn encoder(&self) -> &TransformerEncoder {
        &self.encoder
    }

    /// The decoder.
    pub fn decoder(&self) -> &TransformerDecoder {
        &self.decoder
    }

    /// `forward_with_masks(src, tgt, None, None, None)`: no masks at all, as Paddle and PyTorch
    /// by default (pass a causal `tgt_mask` to train a decoder).
    pub fn forward_pair(&self, src: &Tensor, tgt: &Tensor) -> Result<Tensor> {
        self.forward_with_masks(src, tgt, None, None, None)
    }

    /// Encode `src [N, S, d_model]` with `src_mask` (broadcasting to `[N, heads, S, S]`), then
    /// decode `tgt [N, T, d_model]` over the memory with `tgt_mask` (`[N, heads, T, T]`) and
    /// `memory_mask` (`[N, heads, T, S]`). Returns `[N, T, d_model]`.
    pub fn forward_with_masks(
        &self,
        src: &Tensor,
        tgt: &Tensor,
        src_mask: Option<&Tensor>,
        tgt_mask: Option<&Tensor>,
        memory_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let memory = self.encoder.forward_with_mask(src, src_mask)?;
        self.decoder.forward_with_masks(tgt, &memory, tgt_mask, memory_mask)
    }

    /// The causal mask `[length, length]` of `dtype` (a float type): 0 where key `j ≤` query `i`,
    /// −∞ above the diagonal — Paddle's and PyTorch's `generate_square_subsequent_mask`.
    pub fn generate_square_subsequent_mask(length: usize, dtype: DType) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(Error::invalid(
                "generate_square_subsequent_mask",
                format!("dtype must be a float type (an additive mask), got {dtype}"),
            ));
        }
        let values: Vec<f64> = (0..length * length)
            .map(|k| {
                if k % length > k / length {
                    f64::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        Ok(Tensor::from_data(oar_ir::TensorData::from_f64_slice(
            dtype,
            vec![length, length],
            &values,
        )?))
    }
}

impl Layer for Transformer {
    /// An error: a Transformer needs a source and a target (use [`Transformer::forward_pair`]
    /// or [`Transformer::forward_with_masks`]).
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(needs_two_inputs("Transformer", "forward_pair(src, tgt)"))
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("encoder".into(), &self.encoder as &dyn Layer),
            ("decoder".into(), &self.decoder),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("encoder".into(), &mut self.encoder as &mut dyn Layer),
            ("decoder".into(), &mut self.decoder),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::TensorData;
    use std::collections::BTreeMap;

    type Params = BTreeMap<String, Tensor>;

    /// Deterministic values in (-0.9, 0.9).
    fn pattern(n: usize, seed: u64) -> Vec<f64> {
        (0..n)
            .map(|i| (((i as u64 * 2654435761 + seed * 40503) % 1000) as f64 / 500.0 - 1.0) * 0.9)
            .collect()
    }

    fn t(v: Vec<f64>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape).unwrap()
    }

    fn vals(x: &Tensor) -> Vec<f64> {
        x.to_vec::<f64>().unwrap()
    }

    fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
        }
    }

    /// Give every parameter distinct values (norm weights near 1, biases non-zero).
    fn scramble(l: &dyn Layer) -> Params {
        for (i, (name, p)) in l.named_parameters().into_iter().enumerate() {
            let mut v = pattern(p.numel(), 100 + i as u64);
            if name.contains("norm") && name.ends_with("weight") {
                v.iter_mut().for_each(|x| *x = 1.0 + 0.3 * *x);
            }
            p.set_data(TensorData::from_vec(p.shape(), v).unwrap()).unwrap();
        }
        l.named_parameters().into_iter().collect()
    }

    fn count(l: &dyn Layer) -> usize {
        l.parameters().iter().map(Tensor::numel).sum()
    }

    // The reference: every block spelled out with matmul, softmax and layer_norm.

    fn lin(p: &Params, name: &str, x: &Tensor) -> Tensor {
        x.matmul(&p[&format!("{name}.weight")])
            .unwrap()
            .add(&p[&format!("{name}.bias")])
            .unwrap()
    }

    fn norm(p: &Params, name: &str, x: &Tensor, eps: f64) -> Tensor {
        let (w, b) = (&p[&format!("{name}.weight")], &p[&format!("{name}.bias")]);
        F::layer_norm(x, 1, Some(w), Some(b), eps).unwrap()
    }

    /// Attention of `q [N, L, E]` over `kv [N, S, E]` with an additive mask.
    fn mha(p: &Params, name: &str, q: &Tensor, kv: &Tensor, heads: usize, mask: Option<&Tensor>) -> Tensor {
        let e = q.shape()[2];
        let hd = (e / heads) as i64;
        let split = |y: Tensor| {
            y.reshape(&[0, 0, heads as i64, hd])
                .unwrap()
                .transpose(&[0, 2, 1, 3])
                .unwrap()
        };
        let qh = split(lin(p, &format!("{name}.q_proj"), q));
        let kh = split(lin(p, &format!("{name}.k_proj"), kv));
        let vh = split(lin(p, &format!("{name}.v_proj"), kv));
        let mut s = qh
            .matmul(&kh.t().unwrap())
            .unwrap()
            .scale(1.0 / (hd as f64).sqrt(), 0.0)
            .unwrap();
        if let Some(m) = mask {
            s = s.add(m).unwrap();
        }
        let o = F::softmax(&s, -1).unwrap().matmul(&vh).unwrap();
        let merged = o.transpose(&[0, 2, 1, 3]).unwrap().reshape(&[0, 0, e as i64]).unwrap();
        lin(p, &format!("{name}.out_proj"), &merged)
    }

    fn ffn(p: &Params, name: &str, x: &Tensor, gelu: bool) -> Tensor {
        let h = lin(p, &format!("{name}linear1"), x);
        let h = if gelu { F::gelu(&h, false) } else { F::relu(&h) }.unwrap();
        lin(p, &format!("{name}linear2"), &h)
    }

    /// `x + f(norm(x))` (pre-norm) or `norm(x + f(x))` (post-norm).
    fn block(p: &Params, norm_name: &str, x: &Tensor, s: &Setup, f: impl Fn(&Tensor) -> Tensor) -> Tensor {
        if s.pre {
            x.add(&f(&norm(p, norm_name, x, s.eps))).unwrap()
        } else {
            norm(p, norm_name, &x.add(&f(x)).unwrap(), s.eps)
        }
    }

    struct Setup {
        heads: usize,
        pre: bool,
        gelu: bool,
        eps: f64,
    }

    fn encoder_layer_ref(p: &Params, l: &str, x: &Tensor, s: &Setup, mask: Option<&Tensor>) -> Tensor {
        let x = block(p, &format!("{l}norm1"), x, s, |a| {
            mha(p, &format!("{l}self_attn"), a, a, s.heads, mask)
        });
        block(p, &format!("{l}norm2"), &x, s, |a| ffn(p, l, a, s.gelu))
    }

    fn decoder_layer_ref(
        p: &Params,
        l: &str,
        (x, mem): (&Tensor, &Tensor),
        s: &Setup,
        (tgt_mask, mem_mask): (Option<&Tensor>, Option<&Tensor>),
    ) -> Tensor {
        let x = block(p, &format!("{l}norm1"), x, s, |a| {
            mha(p, &format!("{l}self_attn"), a, a, s.heads, tgt_mask)
        });
        let x = block(p, &format!("{l}norm2"), &x, s, |a| {
            mha(p, &format!("{l}cross_attn"), a, mem, s.heads, mem_mask)
        });
        block(p, &format!("{l}norm3"), &x, s, |a| ffn(p, l, a, s.gelu))
    }

    fn tiny_decoder_layer(pre: bool, act: Activation) -> TransformerDecoderLayer {
        let mut l = TransformerDecoderLayer::new(4, 2, 6)
            .unwrap()
            .normalize_before(pre)
            .activation(act)
            .dtype(DType::F64)
            .unwrap();
        l.eval();
        l
    }

    #[test]
    fn default_transformer_matches_torch_parameter_count_and_paddle_names() {
        let model = Transformer::new(&TransformerConfig::default()).unwrap();
        // sum(p.numel() for p in torch.nn.Transformer().parameters())
        assert_eq!(count(&model), 44_140_544);
        let sd = model.state_dict();
        for name in [
            "encoder.layers.0.self_attn.q_proj.weight",
            "encoder.layers.5.norm2.bias",
            "encoder.norm.weight",
            "decoder.layers.0.cross_attn.k_proj.weight",
            "decoder.layers.5.norm3.weight",
            "decoder.layers.5.linear1.weight",
            "decoder.norm.bias",
        ] {
            assert!(sd.contains_key(name), "{name} missing");
        }
        assert_eq!(sd["decoder.layers.5.linear1.weight"].shape(), vec![512, 2048]);
        assert_eq!(sd.len(), 6 * 16 + 2 + 6 * 26 + 2);
        assert_eq!((model.d_model(), model.nhead()), (512, 8));
        assert_eq!((model.encoder().num_layers(), model.decoder().num_layers()), (6, 6));
    }

    #[test]
    fn decoder_layer_matches_reference_post_and_pre_norm() {
        let (n, l, s) = (2, 3, 4);
        let tgt = t(pattern(n * l * 4, 1), &[n, l, 4]);
        let mem = t(pattern(n * s * 4, 2), &[n, s, 4]);
        let causal = Transformer::generate_square_subsequent_mask(l, DType::F64).unwrap();
        // Batch 1 ignores its last memory position; as bool for the layer, additive for the reference.
        let keep: Vec<bool> = (0..n * s).map(|i| !(i / s == 1 && i % s == s - 1)).collect();
        let mem_keep = Tensor::from_vec(keep.clone(), &[n, 1, 1, s]).unwrap();
        let mem_add = t(
            keep.iter().map(|&k| if k { 0.0 } else { -1e30 }).collect(),
            &[n, 1, 1, s],
        );
        for pre in [false, true] {
            for act in [Activation::Relu, Activation::Gelu] {
                let layer = tiny_decoder_layer(pre, act);
                let p = scramble(&layer);
                let setup = Setup {
                    heads: 2,
                    pre,
                    gelu: act == Activation::Gelu,
                    eps: 1e-5,
                };
                let what = format!("pre={pre} act={act:?}");
                let y = layer
                    .forward_with_masks(&tgt, &mem, Some(&causal), Some(&mem_keep))
                    .unwrap();
                assert_eq!(y.shape(), vec![n, l, 4]);
                let r = decoder_layer_ref(&p, "", (&tgt, &mem), &setup, (Some(&causal), Some(&mem_add)));
                assert_close(&vals(&y), &vals(&r), 1e-12, &what);
                let y = layer.forward_with_masks(&tgt, &mem, None, None).unwrap();
                let r = decoder_layer_ref(&p, "", (&tgt, &mem), &setup, (None, None));
                assert_close(&vals(&y), &vals(&r), 1e-12, &format!("{what}, no masks"));
            }
        }
    }

    #[test]
    fn transformer_matches_reference_encoder_then_decoder() {
        let config = TransformerConfig {
            d_model: 4,
            nhead: 2,
            num_encoder_layers: 2,
            num_decoder_layers: 2,
            dim_feedforward: 6,
            activation: Activation::Gelu,
            layer_norm_eps: 0.25,
            ..TransformerConfig::default()
        };
        let mut model = Transformer::new(&config).unwrap();
        model.to_dtype(DType::F64).unwrap();
        model.eval();
        let p = scramble(&model);
        let src = t(pattern(2 * 5 * 4, 3), &[2, 5, 4]);
        let tgt = t(pattern(2 * 3 * 4, 4), &[2, 3, 4]);
        let causal = Transformer::generate_square_subsequent_mask(3, DType::F64).unwrap();
        let y = model.forward_with_masks(&src, &tgt, None, Some(&causal), None).unwrap();
        let setup = Setup {
            heads: 2,
            pre: false,
            gelu: true,
            eps: 0.25,
        };
        let mut m = src.clone();
        for i in 0..2 {
            m = encoder_layer_ref(&p, &format!("encoder.layers.{i}."), &m, &setup, None);
        }
        let m = norm(&p, "encoder.norm", &m, 0.25);
        let mut x = tgt.clone();
        for i in 0..2 {
            let l = format!("decoder.layers.{i}.");
            x = decoder_layer_ref(&p, &l, (&x, &m), &setup, (Some(&causal), None));
        }
        let r = norm(&p, "decoder.norm", &x, 0.25);
        assert_close(&vals(&y), &vals(&r), 1e-12, "transformer");
        let unmasked = model.forward_pair(&src, &tgt).unwrap();
        assert!(vals(&unmasked) != vals(&y), "the causal mask changes the result");
    }

    #[test]
    fn causal_mask_hides_future_target_positions() {
        let config = TransformerConfig {
            d_model: 4,
            nhead: 2,
            num_encoder_layers: 1,
            num_decoder_layers: 2,
            dim_feedforward: 8,
            ..TransformerConfig::default()
        };
        let mut model = Transformer::new(&config).unwrap();
        model.to_dtype(DType::F64).unwrap();
        model.eval();
        scramble(&model);
        let (l, e) = (5, 4);
        let src = t(pattern(3 * e, 5), &[1, 3, e]);
        let tgt = pattern(l * e, 6);
        let mut changed = tgt.clone();
        // Change target position 3 only.
        changed[3 * e..4 * e].iter_mut().for_each(|x| *x += 0.5);
        let causal = Transformer::generate_square_subsequent_mask(l, DType::F64).unwrap();
        let run = |v: &[f64], mask: Option<&Tensor>| {
            vals(
                &model
                    .forward_with_masks(&src, &t(v.to_vec(), &[1, l, e]), None, mask, None)
                    .unwrap(),
            )
        };
        let (a, b) = (run(&tgt, Some(&causal)), run(&changed, Some(&causal)));
        assert_eq!(a[..3 * e], b[..3 * e], "positions before the change keep their outputs");
        for pos in 3..l {
            assert!(
                a[pos * e..(pos + 1) * e] != b[pos * e..(pos + 1) * e],
                "position {pos} sees the change"
            );
        }
        // Without the mask every position sees the change.
        let (a, b) = (run(&tgt, None), run(&changed, None));
        assert!(a[..e] != b[..e]);
    }

    /// Check `d loss / d p[k]` from `backward` against central differences.
    fn check_grad(p: &Tensor, entries: &[usize], loss: &dyn Fn() -> Tensor, what: &str) {
        p.clear_grad();
        loss().backward().unwrap();
        let g = vals(&p.grad().unwrap());
        let orig = vals(p);
        let h = 1e-6;
        for &k in entries {
            let eval = |d: f64| {
                let mut v = orig.clone();
                v[k] += d;
                p.set_data(TensorData::from_vec(p.shape(), v).unwrap()).unwrap();
                let _g = crate::autograd::no_grad();
                loss().item().unwrap()
            };
            let numeric = (eval(h) - eval(-h)) / (2.0 * h);
            p.set_data(TensorData::from_vec(p.shape(), orig.clone()).unwrap())
                .unwrap();
            assert!(
                (numeric - g[k]).abs() <= 1e-6 + 1e-5 * numeric.abs(),
                "{what}[{k}]: backward {} vs finite difference {numeric}",
                g[k]
            );
        }
    }

    #[test]
    fn decoder_gradients_match_finite_differences() {
        let decoder = TransformerDecoder::new(|| Ok(tiny_decoder_layer(false, Activation::Gelu)), 2)
            .unwrap()
            .with_norm()
            .unwrap();
        let p = scramble(&decoder);
        let tgt = t(pattern(2 * 3 * 4, 7), &[2, 3, 4]).requires_grad_(true).unwrap();
        let mem = t(pattern(2 * 2 * 4, 8), &[2, 2, 4]).requires_grad_(true).unwrap();
        let causal = Transformer::generate_square_subsequent_mask(3, DType::F64).unwrap();
        let r = t(pattern(2 * 3 * 4, 9), &[2, 3, 4]);
        let loss = || {
            let y = decoder.forward_with_masks(&tgt, &mem, Some(&causal), None).unwrap();
            y.multiply(&r).unwrap().sum(&[], false).unwrap()
        };
        for (name, entries) in [
            ("layers.0.self_attn.q_proj.weight", &[0, 5, 15][..]),
            ("layers.0.cross_attn.k_proj.weight", &[1, 9]),
            ("layers.1.cross_attn.v_proj.bias", &[2]),
            ("layers.1.linear1.weight", &[3, 17]),
            ("layers.0.norm3.weight", &[1]),
            ("norm.bias", &[0, 3]),
        ] {
            check_grad(&p[name], entries, &loss, name);
        }
        check_grad(&tgt, &[0, 7, 23], &loss, "tgt");
        check_grad(&mem, &[2, 11], &loss, "memory");
    }

    #[test]
    fn subsequent_mask_and_dropout_follow_paddle() {
        let m = Transformer::generate_square_subsequent_mask(3, DType::F32).unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(
            m.to_vec::<f32>().unwrap(),
            vec![0.0, inf, inf, 0.0, 0.0, inf, 0.0, 0.0, 0.0]
        );
        assert!(Transformer::generate_square_subsequent_mask(3, DType::I64).is_err());
        // Dropout acts in training only.
        let mut layer = TransformerDecoderLayer::new(4, 2, 8).unwrap().dropout(0.5).unwrap();
        let (x, mem) = (
            Tensor::from_vec(vec![0.5f32; 12], &[1, 3, 4]).unwrap(),
            Tensor::from_vec(vec![0.25f32; 8], &[1, 2, 4]).unwrap(),
        );
        let run = |l: &TransformerDecoderLayer| l.forward_with_masks(&x, &mem, None, None).unwrap().to_vec::<f32>();
        assert!(run(&layer).unwrap() != run(&layer).unwrap());
        // A −∞ causal mask in training (the spelled-out attention with dropout) stays finite.
        let leaf = Tensor::from_vec(vec![0.5f32; 12], &[1, 3, 4])
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let causal = Transformer::generate_square_subsequent_mask(3, DType::F32).unwrap();
        let y = layer.forward_with_masks(&leaf, &mem, Some(&causal), None).unwrap();
        assert!(y.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
        y.sum(&[], false).unwrap().backward().unwrap();
        assert!(
            leaf.grad()
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .all(|v| v.is_finite())
        );
        layer.eval();
        assert_eq!(run(&layer).unwrap(), run(&layer).unwrap());
    }

    #[test]
    fn bad_decoder_inputs_are_typed_errors() {
        let layer = tiny_decoder_layer(false, Activation::Relu);
        let x = t(pattern(24, 1), &[2, 3, 4]);
        let e = layer.forward(&x).unwrap_err().to_string();
        assert!(
            e.contains("TransformerDecoderLayer") && e.contains("forward_with_masks"),
            "{e}"
        );
        let e = layer
            .forward_with_masks(&x, &t(pattern(12, 1), &[1, 3, 4]), None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("f64[2,3,4]") && e.contains("f64[1,3,4]"), "{e}");
        assert!(
            layer
                .forward_with_masks(&x, &t(pattern(18, 1), &[2, 3, 3]), None, None)
                .is_err()
        );
        let bad_mask = Tensor::from_vec(vec![true; 4], &[2, 2]).unwrap();
        assert!(layer.forward_with_masks(&x, &x, Some(&bad_mask), None).is_err());
        assert!(TransformerDecoderLayer::new(4, 3, 8).is_err());
        assert!(TransformerDecoderLayer::new(4, 2, 0).is_err());
        assert!(TransformerDecoderLayer::new(4, 2, 8).unwrap().dropout(1.0).is_err());
        assert!(
            TransformerDecoderLayer::new(4, 2, 8)
                .unwrap()
                .layer_norm_eps(0.0)
                .is_err()
        );
        assert!(
            TransformerEncoderLayer::new(4, 2, 8)
                .unwrap()
                .layer_norm_eps(f64::NAN)
                .is_err()
        );
        assert!(TransformerDecoder::new(|| TransformerDecoderLayer::new(4, 2, 8), 0).is_err());
        let mut widths = [4, 6].into_iter();
        let e = TransformerDecoder::new(|| TransformerDecoderLayer::new(widths.next().unwrap_or(4), 2, 8), 2);
        assert!(e.err().unwrap().to_string().contains("d_model"));
        let bad = TransformerConfig {
            d_model: 6,
            nhead: 4,
            ..TransformerConfig::default()
        };
        assert!(Transformer::new(&bad).is_err());
        let tiny = TransformerConfig {
            d_model: 4,
            nhead: 2,
            num_encoder_layers: 1,
            num_decoder_layers: 1,
            dim_feedforward: 4,
            ..TransformerConfig::default()
        };
        let model = Transformer::new(&tiny).unwrap();
        assert!(model.forward(&x).unwrap_err().to_string().contains("forward_pair"));
    }
}
