//! Vision Transformer (Dosovitskiy et al. 2021) laid out as torchvision's
//! `torchvision.models.VisionTransformer` / `vit_b_16`: patch embedding `conv_proj`, a
//! `class_token`, `encoder` (`pos_embedding`, pre-norm blocks `layers.encoder_layer_{i}` with
//! `ln_1`, `self_attention`, `ln_2`, `mlp`; final `ln`, ε = 1e-6) and `heads` (`head`, or
//! `pre_logits` → tanh → `head` with a representation size).
//!
//! A torchvision state dict maps onto it by name, with oar's usual layouts (every linear
//! weight is stored `[in, out]`, the transpose of PyTorch's `[out, in]`) and one split: the
//! attention is [`MultiHeadAttention`], so PyTorch's packed `self_attention.in_proj_weight`
//! `[3D, D]` becomes `self_attention.{q,k,v}_proj.weight`, rows `0..D`, `D..2D`, `2D..3D`,
//! each transposed to `[D, D]`, and `in_proj_bias` `[3D]` becomes `{q,k,v}_proj.bias` in the
//! same thirds; `self_attention.out_proj.{weight, bias}` is a linear layer. Layer norms, the
//! conv, the class token and the position embedding have PyTorch's shapes. (Keeping oar's
//! attention layer means one attention implementation, and every ViT weight loads with the
//! same rules as oar's other Transformers; `tools/torchvision_to_oar.py` does this split.)

use crate::error::{Error, Result};
use crate::nn::functional as F;
use crate::nn::{Conv2D, Dropout, GELU, Layer, LayerNorm, Linear, MultiHeadAttention, Sequential, init};
use crate::tensor::{self, Tensor, concat};
use oar_ir::{DType, Dim};

/// Layer-norm ε of every block and of the final norm.
const LN_EPS: f64 = 1e-6;

/// A trainable f32 tensor of `shape` filled with zeros.
fn zero_param(shape: &[usize]) -> Result<Tensor> {
    Tensor::parameter(tensor::zeros(shape, DType::F32)?.data())
}

/// A pre-norm Transformer block (torchvision's `EncoderBlock`):
/// `x = x + dropout(attn(ln_1(x)))`, then `x + mlp(ln_2(x))` with `mlp` = linear, GELU,
/// dropout, linear, dropout (parameters at `mlp.0` and `mlp.3`).
struct EncoderBlock {
    ln_1: LayerNorm,
    self_attention: MultiHeadAttention,
    dropout: Dropout,
    ln_2: LayerNorm,
    mlp: Sequential,
}

impl EncoderBlock {
    fn new(c: &ViTConfig) -> Result<EncoderBlock> {
        let d = c.hidden_dim;
        Ok(EncoderBlock {
            ln_1: LayerNorm::new(&[d])?.epsilon(LN_EPS)?,
            self_attention: MultiHeadAttention::new(d, c.num_heads)?.dropout(c.attention_dropout)?,
            dropout: Dropout::new(c.dropout)?,
            ln_2: LayerNorm::new(&[d])?.epsilon(LN_EPS)?,
            mlp: Sequential::new()
                .add(Linear::new(d, c.mlp_dim)?)
                .add(GELU::new())
                .add(Dropout::new(c.dropout)?)
                .add(Linear::new(c.mlp_dim, d)?)
                .add(Dropout::new(c.dropout)?),
        })
    }
}

impl Layer for EncoderBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let a = self
            .dropout
            .forward(&self.self_attention.forward(&self.ln_1.forward(x)?)?)?;
        let x = (&a + x)?;
        &x + &self.mlp.forward(&self.ln_2.forward(&x)?)?
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("ln_1".into(), &self.ln_1),
            ("self_attention".into(), &self.self_attention),
            ("dropout".into(), &self.dropout),
            ("ln_2".into(), &self.ln_2),
            ("mlp".into(), &self.mlp),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("ln_1".into(), &mut self.ln_1),
            ("self_attention".into(), &mut self.self_attention),
            ("dropout".into(), &mut self.dropout),
            ("ln_2".into(), &mut self.ln_2),
            ("mlp".into(), &mut self.mlp),
        ]
    }
}

/// The encoder: add `pos_embedding [1, S, D]` (normal, std 0.02), dropout, the blocks
/// `layers.encoder_layer_{i}`, final layer norm `ln`.
struct Encoder {
    pos_embedding: Tensor,
    dropout: Dropout,
    layers: Vec<EncoderBlock>,
    ln: LayerNorm,
}

impl Layer for Encoder {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.dropout.forward(&(x + &self.pos_embedding)?)?;
        for l in &self.layers {
            h = l.forward(&h)?;
        }
        self.ln.forward(&h)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("pos_embedding".into(), self.pos_embedding.clone())]
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![("dropout".into(), &self.dropout)];
        for (i, l) in self.layers.iter().enumerate() {
            v.push((format!("layers.encoder_layer_{i}"), l));
        }
        v.push(("ln".into(), &self.ln));
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![("dropout".into(), &mut self.dropout)];
        for (i, l) in self.layers.iter_mut().enumerate() {
            v.push((format!("layers.encoder_layer_{i}"), l));
        }
        v.push(("ln".into(), &mut self.ln));
        v
    }
}

/// The classifier on the class token: `head`, or `pre_logits` → tanh → `head`.
struct Heads {
    pre_logits: Option<Linear>,
    head: Linear,
}

impl Layer for Heads {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.pre_logits {
            Some(p) => self.head.forward(&F::tanh(&p.forward(x)?)?),
            None => self.head.forward(x),
        }
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = Vec::new();
        if let Some(p) = &self.pre_logits {
            v.push(("pre_logits".into(), p));
        }
        v.push(("head".into(), &self.head));
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = Vec::new();
        if let Some(p) = &mut self.pre_logits {
            v.push(("pre_logits".into(), p));
        }
        v.push(("head".into(), &mut self.head));
        v
    }
}

/// The shape and options of a [`VisionTransformer`] (torchvision's constructor arguments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ViTConfig {
    /// Side of the square input images (a multiple of `patch_size`).
    pub image_size: usize,
    /// Side of the square patches (the patch-embedding conv's kernel and stride).
    pub patch_size: usize,
    /// Number of encoder blocks.
    pub num_layers: usize,
    /// Attention heads (must divide `hidden_dim`).
    pub num_heads: usize,
    /// Token width `D`.
    pub hidden_dim: usize,
    /// Hidden width of each block's MLP.
    pub mlp_dim: usize,
    /// Dropout after the position embedding, the attention and in the MLPs (default 0).
    pub dropout: f64,
    /// Dropout on the attention weights (default 0).
    pub attention_dropout: f64,
    /// Classifier outputs.
    pub num_classes: usize,
    /// With `Some(r)`, a `pre_logits` linear layer to `r` features and tanh before `head`.
    pub representation_size: Option<usize>,
}

impl ViTConfig {
    /// A configuration with no dropout and no representation layer.
    pub fn new(
        image_size: usize,
        patch_size: usize,
        num_layers: usize,
        num_heads: usize,
        hidden_dim: usize,
        mlp_dim: usize,
        num_classes: usize,
    ) -> ViTConfig {
        ViTConfig {
            image_size,
            patch_size,
            num_layers,
            num_heads,
            hidden_dim,
            mlp_dim,
            dropout: 0.0,
            attention_dropout: 0.0,
            num_classes,
            representation_size: None,
        }
    }

    /// ViT-B/16 at 224×224: 12 blocks, 12 heads, width 768, MLP 3072.
    pub fn b_16(num_classes: usize) -> ViTConfig {
        ViTConfig::new(224, 16, 12, 12, 768, 3072, num_classes)
    }

    fn check(&self) -> Result<()> {
        let c = self;
        let sizes = [
            c.image_size,
            c.patch_size,
            c.num_layers,
            c.num_heads,
            c.hidden_dim,
            c.mlp_dim,
            c.num_classes,
        ];
        let problem = if sizes.contains(&0) || c.representation_size == Some(0) {
            "sizes and counts must be positive".to_string()
        } else if !c.image_size.is_multiple_of(c.patch_size) {
            format!(
                "image_size {} is not a multiple of patch_size {}",
                c.image_size, c.patch_size
            )
        } else if !c.hidden_dim.is_multiple_of(c.num_heads) {
            format!(
                "hidden_dim {} is not a multiple of num_heads {}",
                c.hidden_dim, c.num_heads
            )
        } else if !(0.0..1.0).contains(&c.dropout) || !(0.0..1.0).contains(&c.attention_dropout) {
            format!(
                "dropout {} and attention_dropout {} must be in [0, 1)",
                c.dropout, c.attention_dropout
            )
        } else {
            return Ok(());
        };
        Err(Error::invalid("VisionTransformer", problem))
    }
}

/// A Vision Transformer: split the image into patches with `conv_proj` (kernel and stride
/// `patch_size`), prepend `class_token`, run `encoder`, classify the class token with
/// `heads`. Takes `[N, 3, image_size, image_size]` images, returns `[N, num_classes]`.
pub struct VisionTransformer {
    conv_proj: Conv2D,
    class_token: Tensor,
    encoder: Encoder,
    heads: Heads,
    image_size: usize,
    hidden_dim: usize,
}

impl VisionTransformer {
    /// A randomly initialized model: class token zeros, position embedding normal (std 0.02),
    /// head zeros (as torchvision), every other layer oar's default initialization.
    pub fn new(config: &ViTConfig) -> Result<VisionTransformer> {
        config.check()?;
        let d = config.hidden_dim;
        let seq_length = (config.image_size / config.patch_size).pow(2) + 1;
        let pos_embedding = zero_param(&[1, seq_length, d])?;
        init::normal(&pos_embedding, 0.0, 0.02)?;
        let (pre_logits, head_in) = match config.representation_size {
            Some(r) => (Some(Linear::new(d, r)?), r),
            None => (None, d),
        };
        let head = Linear::new(head_in, config.num_classes)?;
        init::constant(head.weight(), 0.0)?;
        Ok(VisionTransformer {
            conv_proj: Conv2D::new(3, d, config.patch_size)?.stride(config.patch_size),
            class_token: zero_param(&[1, 1, d])?,
            encoder: Encoder {
                pos_embedding,
                dropout: Dropout::new(config.dropout)?,
                layers: (0..config.num_layers)
                    .map(|_| EncoderBlock::new(config))
                    .collect::<Result<_>>()?,
                ln: LayerNorm::new(&[d])?.epsilon(LN_EPS)?,
            },
            heads: Heads { pre_logits, head },
            image_size: config.image_size,
            hidden_dim: d,
        })
    }
}

impl Layer for VisionTransformer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        let side = Dim::Static(self.image_size);
        if dims.len() != 4 || dims[1] != Dim::Static(3) || dims[2] != side || dims[3] != side {
            return Err(Error::invalid(
                "VisionTransformer",
                format!(
                    "expects images [N, 3, {s}, {s}], got {}",
                    x.tensor_type(),
                    s = self.image_size
                ),
            ));
        }
        // [N, D, h, w] → [N, h·w, D].
        let patches = self.conv_proj.forward(x)?.flatten(2, 3)?.transpose(&[0, 2, 1])?;
        let d = Dim::Static(self.hidden_dim);
        let cls = self
            .class_token
            .broadcast_to_dims(&[dims[0].clone(), Dim::Static(1), d])?;
        let h = self.encoder.forward(&concat(&[&cls, &patches], 1)?)?;
        self.heads.forward(&h.slice(1, 0, 1, 1)?.squeeze(&[1])?)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("class_token".into(), self.class_token.clone())]
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("conv_proj".into(), &self.conv_proj),
            ("encoder".into(), &self.encoder),
            ("heads".into(), &self.heads),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("conv_proj".into(), &mut self.conv_proj),
            ("encoder".into(), &mut self.encoder),
            ("heads".into(), &mut self.heads),
        ]
    }
}

/// ViT-B/16 for 224×224 images with `num_classes` outputs (torchvision's `vit_b_16`).
pub fn vit_b_16(num_classes: usize) -> Result<VisionTransformer> {
    VisionTransformer::new(&ViTConfig::b_16(num_classes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vit_b_16_parameter_count_and_names_match_torchvision() {
        // torchvision.models.vit_b_16(): 86,567,656 parameters.
        let net = vit_b_16(1000).unwrap();
        let n: usize = net.parameters().iter().map(|p| p.numel()).sum();
        assert_eq!(n, 86_567_656);
        let state = net.state_dict();
        let shape = |k: &str| state.get(k).map(|t| t.shape()).unwrap_or_else(|| panic!("{k} missing"));
        assert_eq!(shape("class_token"), [1, 1, 768]);
        assert_eq!(shape("conv_proj.weight"), [768, 3, 16, 16]);
        assert_eq!(shape("encoder.pos_embedding"), [1, 197, 768]);
        assert_eq!(shape("encoder.layers.encoder_layer_0.ln_1.weight"), [768]);
        assert_eq!(
            shape("encoder.layers.encoder_layer_0.self_attention.q_proj.weight"),
            [768, 768]
        );
        assert_eq!(
            shape("encoder.layers.encoder_layer_0.self_attention.v_proj.bias"),
            [768]
        );
        assert_eq!(
            shape("encoder.layers.encoder_layer_11.self_attention.out_proj.weight"),
            [768, 768]
        );
        assert_eq!(shape("encoder.layers.encoder_layer_11.mlp.0.weight"), [768, 3072]);
        assert_eq!(shape("encoder.layers.encoder_layer_11.mlp.3.bias"), [768]);
        assert_eq!(shape("encoder.ln.bias"), [768]);
        assert_eq!(shape("heads.head.weight"), [768, 1000]);
        // torchvision's 152 entries with each block's packed `in_proj_weight` / `in_proj_bias`
        // split into q, k and v (12 blocks × 4 more).
        assert_eq!(state.len(), 152 + 12 * 4);
    }

    fn tiny(representation_size: Option<usize>) -> ViTConfig {
        ViTConfig {
            representation_size,
            dropout: 0.1,
            attention_dropout: 0.1,
            ..ViTConfig::new(8, 4, 2, 2, 8, 16, 3)
        }
    }

    #[test]
    fn forward_shape_and_bad_configs() {
        let x = tensor::randn(&[2, 3, 8, 8], DType::F32).unwrap();
        for r in [None, Some(5)] {
            let mut net = VisionTransformer::new(&tiny(r)).unwrap();
            assert_eq!(net.forward(&x).unwrap().shape(), [2, 3]);
            net.eval();
            assert_eq!(net.forward(&x).unwrap().shape(), [2, 3]);
        }
        let mut net = VisionTransformer::new(&tiny(Some(5))).unwrap();
        assert!(net.state_dict().contains_key("heads.pre_logits.weight"));
        // Traced with a symbolic batch, as eager.
        net.eval();
        let spec = crate::jit::InputSpec::new(&[None, Some(3), Some(8), Some(8)], DType::F32, "x");
        let traced = crate::jit::to_static_layer(&net, &spec).unwrap().call(&[&x]).unwrap();
        let eager = net.forward(&x).unwrap().to_vec::<f32>().unwrap();
        for (t, e) in traced[0].to_vec::<f32>().unwrap().iter().zip(eager) {
            assert!((t - e).abs() < 1e-5, "{t} vs {e}");
        }
        assert!(
            net.forward(&tensor::randn(&[2, 3, 8, 12], DType::F32).unwrap())
                .is_err()
        );
        for bad in [
            ViTConfig {
                patch_size: 3,
                ..tiny(None)
            },
            ViTConfig {
                num_heads: 3,
                ..tiny(None)
            },
            ViTConfig {
                num_classes: 0,
                ..tiny(None)
            },
            ViTConfig {
                dropout: 1.0,
                ..tiny(None)
            },
            ViTConfig {
                attention_dropout: -0.5,
                ..tiny(None)
            },
        ] {
            assert!(VisionTransformer::new(&bad).is_err(), "{bad:?}");
        }
    }
}
