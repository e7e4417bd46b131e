//! MobileNets: V1 (Howard et al. 2017) as Paddle's `paddle.vision.models.MobileNetV1`, V2
//! (Sandler et al. 2018) with torchvision's architecture and Paddle's layer names
//! (`paddle.vision.models.MobileNetV2`), and V3 (Howard et al. 2019) as torchvision's
//! `mobilenet_v3_small` / `mobilenet_v3_large`.
//!
//! MobileNetV2: a 3×3 stem, inverted residual blocks (1×1 expansion, 3×3 depthwise conv, 1×1
//! linear projection; ReLU6 activations; a residual connection when the shape is kept), a 1×1
//! conv to 1280 channels, global average pooling, dropout and a linear classifier.
//!
//! The torchvision ports take a torchvision state dict by name: batch-norm
//! `running_mean`/`running_var` are `_mean`/`_variance`, and linear weights are stored
//! `[in, out]`, the transpose of PyTorch's.

use crate::error::{Error, Result};
use crate::nn::{
    AdaptiveAvgPool2D, BatchNorm2D, Conv2D, Dropout, Hardsigmoid, Hardswish, Layer, Linear, ReLU, Sequential,
};
use crate::tensor::Tensor;

/// `min(max(x, 0), 6)`: now [`crate::nn::ReLU6`], still reachable here.
pub use crate::nn::ReLU6;

/// torchvision's `_make_divisible`: round `v` to the nearest multiple of `divisor` (at least
/// `divisor`), never going more than 10% below `v`.
fn make_divisible(v: f64, divisor: usize) -> usize {
    let d = divisor as f64;
    let mut new_v = divisor.max(((v + d / 2.0) as usize) / divisor * divisor);
    if (new_v as f64) < 0.9 * v {
        new_v += divisor;
    }
    new_v
}

/// Conv (no bias) + batch norm + ReLU6, padding `(kernel - 1) / 2`: torchvision's
/// `Conv2dNormActivation` (layers `0`, `1`, `2`).
fn conv_bn_relu6(inp: usize, out: usize, kernel: usize, stride: usize, groups: usize) -> Result<Sequential> {
    Ok(Sequential::new()
        .add(
            Conv2D::new(inp, out, kernel)?
                .stride(stride)
                .padding((kernel - 1) / 2)
                .groups(groups)?
                .bias(false),
        )
        .add(BatchNorm2D::new(out)?)
        .add(ReLU6))
}

/// An inverted residual block: expand (1×1, unless `expand_ratio` is 1), depthwise 3×3 with
/// `stride`, project (1×1, no activation); `x + block(x)` when `stride == 1` and the channel
/// count is kept.
pub struct InvertedResidual {
    conv: Sequential,
    use_res_connect: bool,
}

impl InvertedResidual {
    /// A block from `inp` to `oup` channels.
    pub fn new(inp: usize, oup: usize, stride: usize, expand_ratio: usize) -> Result<InvertedResidual> {
        if stride != 1 && stride != 2 {
            return Err(Error::invalid(
                "InvertedResidual",
                format!("stride must be 1 or 2, got {stride}"),
            ));
        }
        let hidden = inp * expand_ratio;
        let mut conv = Sequential::new();
        if expand_ratio != 1 {
            conv = conv.add(conv_bn_relu6(inp, hidden, 1, 1, 1)?);
        }
        conv = conv
            .add(conv_bn_relu6(hidden, hidden, 3, stride, hidden)?)
            .add(Conv2D::new(hidden, oup, 1)?.bias(false))
            .add(BatchNorm2D::new(oup)?);
        Ok(InvertedResidual {
            conv,
            use_res_connect: stride == 1 && inp == oup,
        })
    }
}

impl Layer for InvertedResidual {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.conv.forward(x)?;
        if self.use_res_connect { x + &y } else { Ok(y) }
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("conv".into(), &self.conv)]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("conv".into(), &mut self.conv)]
    }
}

/// MobileNetV2: `features` (stem, 17 inverted residual blocks, 1×1 conv to the last
/// channels), global average pooling and `classifier` (dropout 0.2, linear).
pub struct MobileNetV2 {
    features: Sequential,
    pool: AdaptiveAvgPool2D,
    classifier: Sequential,
}

/// `(expand ratio t, channels c, repeats n, first stride s)` per stage (torchvision's table).
const INVERTED_RESIDUAL_SETTING: [[usize; 4]; 7] = [
    [1, 16, 1, 1],
    [6, 24, 2, 2],
    [6, 32, 3, 2],
    [6, 64, 4, 2],
    [6, 96, 3, 1],
    [6, 160, 3, 2],
    [6, 320, 1, 1],
];

impl MobileNetV2 {
    /// MobileNetV2 with channel multiplier `width_mult` (torchvision's `width_mult`, Paddle's
    /// `scale`; 1.0 is the standard network) and `num_classes` outputs.
    pub fn new(width_mult: f64, num_classes: usize) -> Result<MobileNetV2> {
        if !(width_mult.is_finite() && width_mult > 0.0) {
            return Err(Error::invalid(
                "MobileNetV2",
                format!("width_mult must be positive, got {width_mult}"),
            ));
        }
        if num_classes == 0 {
            return Err(Error::invalid("MobileNetV2", "num_classes must be positive"));
        }
        let round = 8;
        let mut input_channel = make_divisible(32.0 * width_mult, round);
        let last_channel = make_divisible(1280.0 * width_mult.max(1.0), round);
        let mut features = Sequential::new().add(conv_bn_relu6(3, input_channel, 3, 2, 1)?);
        for [t, c, n, s] in INVERTED_RESIDUAL_SETTING {
            let output_channel = make_divisible(c as f64 * width_mult, round);
            for i in 0..n {
                let stride = if i == 0 { s } else { 1 };
                features = features.add(InvertedResidual::new(input_channel, output_channel, stride, t)?);
                input_channel = output_channel;
            }
        }
        features = features.add(conv_bn_relu6(input_channel, last_channel, 1, 1, 1)?);
        Ok(MobileNetV2 {
            features,
            pool: AdaptiveAvgPool2D::new(1),
            classifier: Sequential::new()
                .add(Dropout::new(0.2)?)
                .add(Linear::new(last_channel, num_classes)?),
        })
    }
}

impl Layer for MobileNetV2 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.pool.forward(&self.features.forward(x)?)?;
        self.classifier.forward(&h.flatten(1, -1)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("features".into(), &self.features),
            ("classifier".into(), &self.classifier),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("features".into(), &mut self.features),
            ("classifier".into(), &mut self.classifier),
        ]
    }
}

/// MobileNetV2 with `width_mult` and `num_classes` (torchvision's `mobilenet_v2`).
pub fn mobilenet_v2(width_mult: f64, num_classes: usize) -> Result<MobileNetV2> {
    MobileNetV2::new(width_mult, num_classes)
}

/// Paddle's `ConvNormActivation` with its defaults: conv (no bias), batch norm, ReLU (layers
/// `0`, `1`, `2`).
fn conv_bn_relu(conv: Conv2D, out: usize) -> Result<Sequential> {
    Ok(Sequential::new().add(conv).add(BatchNorm2D::new(out)?).add(ReLU))
}

/// A MobileNetV1 block (Paddle's `DepthwiseSeparable`): `_depthwise_conv` (3×3 depthwise with
/// `stride`, padding 1) then `_pointwise_conv` (1×1), each conv, batch norm, ReLU.
struct DepthwiseSeparable {
    depthwise: Sequential,
    pointwise: Sequential,
}

impl DepthwiseSeparable {
    fn new(inp: usize, out: usize, stride: usize) -> Result<DepthwiseSeparable> {
        let dw = Conv2D::new(inp, inp, 3)?
            .stride(stride)
            .padding(1)
            .groups(inp)?
            .bias(false);
        Ok(DepthwiseSeparable {
            depthwise: conv_bn_relu(dw, inp)?,
            pointwise: conv_bn_relu(Conv2D::new(inp, out, 1)?.bias(false), out)?,
        })
    }
}

impl Layer for DepthwiseSeparable {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.pointwise.forward(&self.depthwise.forward(x)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("_depthwise_conv".into(), &self.depthwise),
            ("_pointwise_conv".into(), &self.pointwise),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("_depthwise_conv".into(), &mut self.depthwise),
            ("_pointwise_conv".into(), &mut self.pointwise),
        ]
    }
}

/// MobileNetV1's depthwise-separable blocks at scale 1: `(name, in, out, stride)`; at scale `s`
/// every channel count `c` becomes `int(c · s)`.
///
/// Trainable parameters at scale 1 with 1000 classes (conv weights; batch norm has a weight and
/// a bias per channel; a block from `i` to `o` has `9i + 2i + i·o + 2o`):
///
/// | layer        | shape                       | parameters  |
/// |--------------|-----------------------------|-------------|
/// | conv1        | 3×3/2 conv 3 → 32           | 864 + 64 = 928 |
/// | conv2_1      | 32 → 64                     | 2,528       |
/// | conv2_2      | 64 → 128, stride 2          | 9,152       |
/// | conv3_1      | 128 → 128                   | 18,048      |
/// | conv3_2      | 128 → 256, stride 2         | 34,688      |
/// | conv4_1      | 256 → 256                   | 68,864      |
/// | conv4_2      | 256 → 512, stride 2         | 134,912     |
/// | conv5_1–5_5  | 512 → 512, five times       | 5 × 268,800 = 1,344,000 |
/// | conv5_6      | 512 → 1024, stride 2        | 531,968     |
/// | conv6        | 1024 → 1024                 | 1,061,888   |
/// | fc           | linear 1024 → 1000          | 1,024,000 + 1,000 = 1,025,000 |
/// | total        |                             | 4,231,976   |
const V1_BLOCKS: [(&str, usize, usize, usize); 13] = [
    ("conv2_1", 32, 64, 1),
    ("conv2_2", 64, 128, 2),
    ("conv3_1", 128, 128, 1),
    ("conv3_2", 128, 256, 2),
    ("conv4_1", 256, 256, 1),
    ("conv4_2", 256, 512, 2),
    ("conv5_1", 512, 512, 1),
    ("conv5_2", 512, 512, 1),
    ("conv5_3", 512, 512, 1),
    ("conv5_4", 512, 512, 1),
    ("conv5_5", 512, 512, 1),
    ("conv5_6", 512, 1024, 2),
    ("conv6", 1024, 1024, 1),
];

/// MobileNetV1 as Paddle's `MobileNetV1(scale, num_classes)`: `conv1` (3×3/2 conv, batch norm,
/// ReLU), the 13 depthwise-separable blocks `conv2_1` … `conv6`, global average pooling and
/// `fc`.
pub struct MobileNetV1 {
    conv1: Sequential,
    blocks: Vec<DepthwiseSeparable>,
    pool: AdaptiveAvgPool2D,
    fc: Linear,
}

impl MobileNetV1 {
    /// MobileNetV1 with channel multiplier `scale` (1.0 is the standard network; channel counts
    /// are truncated, `int(c · scale)`, as Paddle) and `num_classes` outputs.
    pub fn new(scale: f64, num_classes: usize) -> Result<MobileNetV1> {
        // Paddle's `int(c * scale)` for positive values.
        let ch = |c: usize| (c as f64 * scale) as usize;
        if !(scale.is_finite() && ch(32) > 0) {
            return Err(Error::invalid(
                "MobileNetV1",
                format!("scale must be finite and at least 1/32, got {scale}"),
            ));
        }
        if num_classes == 0 {
            return Err(Error::invalid("MobileNetV1", "num_classes must be positive"));
        }
        Ok(MobileNetV1 {
            conv1: conv_bn_relu(Conv2D::new(3, ch(32), 3)?.stride(2).padding(1).bias(false), ch(32))?,
            blocks: V1_BLOCKS
                .iter()
                .map(|&(_, inp, out, stride)| DepthwiseSeparable::new(ch(inp), ch(out), stride))
                .collect::<Result<_>>()?,
            pool: AdaptiveAvgPool2D::new(1),
            fc: Linear::new(ch(1024), num_classes)?,
        })
    }
}

impl Layer for MobileNetV1 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.conv1.forward(x)?;
        for b in &self.blocks {
            h = b.forward(&h)?;
        }
        self.fc.forward(&self.pool.forward(&h)?.flatten(1, -1)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![("conv1".into(), &self.conv1)];
        v.extend(
            V1_BLOCKS
                .iter()
                .zip(&self.blocks)
                .map(|((n, ..), b)| (n.to_string(), b as &dyn Layer)),
        );
        v.push(("fc".into(), &self.fc));
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![("conv1".into(), &mut self.conv1)];
        v.extend(
            V1_BLOCKS
                .iter()
                .zip(&mut self.blocks)
                .map(|((n, ..), b)| (n.to_string(), b as &mut dyn Layer)),
        );
        v.push(("fc".into(), &mut self.fc));
        v
    }
}

/// MobileNetV1 with channel multiplier `scale` and `num_classes` outputs (Paddle's
/// `mobilenet_v1(scale=..., num_classes=...)`).
pub fn mobilenet_v1(scale: f64, num_classes: usize) -> Result<MobileNetV1> {
    MobileNetV1::new(scale, num_classes)
}

/// The activation closing a MobileNetV3 conv block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    /// None (the linear projection).
    Identity,
    /// ReLU (torchvision's `"RE"`).
    Relu,
    /// Hard swish (torchvision's `"HS"`).
    Hardswish,
}

/// torchvision's `Conv2dNormActivation` as MobileNetV3 uses it: conv (no bias, padding
/// `(kernel − 1) / 2 · dilation`), batch norm (ε 0.001, PyTorch momentum 0.01, which is
/// Paddle's 0.99), then `act` (layers `0`, `1`, `2`).
fn conv_bn_act(
    inp: usize,
    out: usize,
    kernel: usize,
    stride: usize,
    groups: usize,
    dilation: usize,
    act: Act,
) -> Result<Sequential> {
    let conv = Conv2D::new(inp, out, kernel)?
        .stride(stride)
        .padding((kernel - 1) / 2 * dilation)
        .dilation(dilation)
        .groups(groups)?
        .bias(false);
    let seq = Sequential::new()
        .add(conv)
        .add(BatchNorm2D::new(out)?.epsilon(1e-3)?.momentum(0.99)?);
    Ok(match act {
        Act::Identity => seq,
        Act::Relu => seq.add(ReLU),
        Act::Hardswish => seq.add(Hardswish),
    })
}

/// Squeeze-and-excitation (torchvision's `SqueezeExcitation` with a hard-sigmoid gate):
/// `x · hardsigmoid(fc2(relu(fc1(avgpool(x)))))` with 1×1 convs `fc1`, `fc2` (with bias).
struct SqueezeExcitation {
    fc1: Conv2D,
    fc2: Conv2D,
}

impl Layer for SqueezeExcitation {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let s = crate::nn::functional::adaptive_avg_pool2d(x, 1)?;
        let s = self.fc2.forward(&ReLU.forward(&self.fc1.forward(&s)?)?)?;
        &Hardsigmoid.forward(&s)? * x
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("fc1".into(), &self.fc1), ("fc2".into(), &self.fc2)]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("fc1".into(), &mut self.fc1), ("fc2".into(), &mut self.fc2)]
    }
}

/// One MobileNetV3 bottleneck after width scaling (torchvision's `InvertedResidualConfig`).
#[derive(Clone, Copy, Debug)]
struct BneckConfig {
    input: usize,
    kernel: usize,
    expanded: usize,
    out: usize,
    use_se: bool,
    act: Act,
    stride: usize,
    dilation: usize,
}

/// A MobileNetV3 bottleneck (torchvision's `InvertedResidual`): `block` = 1×1 expansion
/// (unless the expanded width equals the input's), depthwise conv, squeeze-and-excitation (if
/// used), 1×1 linear projection; `x + block(x)` when the stride is 1 and the width is kept.
struct Bneck {
    block: Sequential,
    use_res_connect: bool,
}

impl Bneck {
    fn new(c: &BneckConfig) -> Result<Bneck> {
        let mut block = Sequential::new();
        if c.expanded != c.input {
            block = block.add(conv_bn_act(c.input, c.expanded, 1, 1, 1, 1, c.act)?);
        }
        let stride = if c.dilation > 1 { 1 } else { c.stride };
        block = block.add(conv_bn_act(
            c.expanded, c.expanded, c.kernel, stride, c.expanded, c.dilation, c.act,
        )?);
        if c.use_se {
            let squeeze = make_divisible((c.expanded / 4) as f64, 8);
            block = block.add(SqueezeExcitation {
                fc1: Conv2D::new(c.expanded, squeeze, 1)?,
                fc2: Conv2D::new(squeeze, c.expanded, 1)?,
            });
        }
        block = block.add(conv_bn_act(c.expanded, c.out, 1, 1, 1, 1, Act::Identity)?);
        Ok(Bneck {
            block,
            use_res_connect: c.stride == 1 && c.input == c.out,
        })
    }
}

impl Layer for Bneck {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.block.forward(x)?;
        if self.use_res_connect { x + &y } else { Ok(y) }
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("block".into(), &self.block)]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("block".into(), &mut self.block)]
    }
}

/// Which MobileNetV3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MobileNetV3Arch {
    /// `mobilenet_v3_small`: 11 bottlenecks, 1024-wide classifier.
    Small,
    /// `mobilenet_v3_large`: 15 bottlenecks, 1280-wide classifier.
    Large,
}

/// A bottleneck row of torchvision's tables before width scaling: `(input, kernel, expanded,
/// out, use_se, hard swish, stride)`.
type BneckRow = (usize, usize, usize, usize, bool, bool, usize);

/// torchvision's `mobilenet_v3_large` table.
const V3_LARGE: [BneckRow; 15] = [
    (16, 3, 16, 16, false, false, 1),
    (16, 3, 64, 24, false, false, 2),
    (24, 3, 72, 24, false, false, 1),
    (24, 5, 72, 40, true, false, 2),
    (40, 5, 120, 40, true, false, 1),
    (40, 5, 120, 40, true, false, 1),
    (40, 3, 240, 80, false, true, 2),
    (80, 3, 200, 80, false, true, 1),
    (80, 3, 184, 80, false, true, 1),
    (80, 3, 184, 80, false, true, 1),
    (80, 3, 480, 112, true, true, 1),
    (112, 3, 672, 112, true, true, 1),
    (112, 5, 672, 160, true, true, 2),
    (160, 5, 960, 160, true, true, 1),
    (160, 5, 960, 160, true, true, 1),
];

/// torchvision's `mobilenet_v3_small` table.
const V3_SMALL: [BneckRow; 11] = [
    (16, 3, 16, 16, true, false, 2),
    (16, 3, 72, 24, false, false, 2),
    (24, 3, 88, 24, false, false, 1),
    (24, 5, 96, 40, true, true, 2),
    (40, 5, 240, 40, true, true, 1),
    (40, 5, 240, 40, true, true, 1),
    (40, 5, 120, 48, true, true, 1),
    (48, 5, 144, 48, true, true, 1),
    (48, 5, 288, 96, true, true, 2),
    (96, 5, 576, 96, true, true, 1),
    (96, 5, 576, 96, true, true, 1),
];

/// MobileNetV3 options (torchvision's `mobilenet_v3_*` keyword arguments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MobileNetV3Config {
    /// Small or large.
    pub arch: MobileNetV3Arch,
    /// Channel multiplier (1.0 is the standard network); widths are rounded to multiples of 8.
    pub width_mult: f64,
    /// Halve the widths of the last stage and the classifier (torchvision's `reduced_tail`).
    pub reduced_tail: bool,
    /// Dilation 2 instead of stride 2 in the last stage (torchvision's `dilated`, for dense
    /// prediction backbones).
    pub dilated: bool,
    /// Classifier dropout (default 0.2).
    pub dropout: f64,
    /// Classifier outputs.
    pub num_classes: usize,
}

impl MobileNetV3Config {
    /// The standard network of `arch`: width 1.0, full tail, no dilation, dropout 0.2.
    pub fn new(arch: MobileNetV3Arch, num_classes: usize) -> MobileNetV3Config {
        MobileNetV3Config {
            arch,
            width_mult: 1.0,
            reduced_tail: false,
            dilated: false,
            dropout: 0.2,
            num_classes,
        }
    }

    /// The bottlenecks after width scaling, `reduced_tail` and `dilated` (the last three rows
    /// form the tail), and the classifier's hidden width.
    fn bottlenecks(&self) -> (Vec<BneckConfig>, usize) {
        let (rows, last): (&[BneckRow], usize) = match self.arch {
            MobileNetV3Arch::Small => (&V3_SMALL, 1024),
            MobileNetV3Arch::Large => (&V3_LARGE, 1280),
        };
        let divider = if self.reduced_tail { 2 } else { 1 };
        let adjust = |c: usize| make_divisible(c as f64 * self.width_mult, 8);
        let tail = rows.len() - 3;
        let configs = rows
            .iter()
            .enumerate()
            .map(|(i, &(input, kernel, expanded, out, use_se, hs, stride))| {
                // The tail's first row keeps its input and expansion widths.
                let (inner, outer) = match i {
                    i if i < tail => (1, 1),
                    i if i == tail => (1, divider),
                    _ => (divider, divider),
                };
                BneckConfig {
                    input: adjust(input / inner),
                    kernel,
                    expanded: adjust(expanded / inner),
                    out: adjust(out / outer),
                    use_se,
                    act: if hs { Act::Hardswish } else { Act::Relu },
                    stride,
                    dilation: if self.dilated && i >= tail { 2 } else { 1 },
                }
            })
            .collect();
        (configs, adjust(last / divider))
    }
}

/// MobileNetV3 as torchvision's `MobileNetV3`: `features` (3×3/2 stem with hard swish, the
/// bottlenecks, a 1×1 conv to 6× the last width with hard swish), global average pooling and
/// `classifier` (linear, hard swish, dropout, linear). Batch norms use ε 0.001.
pub struct MobileNetV3 {
    features: Sequential,
    pool: AdaptiveAvgPool2D,
    classifier: Sequential,
}

impl MobileNetV3 {
    /// The network described by `config`.
    pub fn new(config: &MobileNetV3Config) -> Result<MobileNetV3> {
        let width = config.width_mult;
        if !(width.is_finite() && width > 0.0) {
            return Err(Error::invalid(
                "MobileNetV3",
                format!("width_mult must be positive, got {width}"),
            ));
        }
        if config.num_classes == 0 {
            return Err(Error::invalid("MobileNetV3", "num_classes must be positive"));
        }
        let (bottlenecks, last_channel) = config.bottlenecks();
        let first = bottlenecks[0].input;
        let mut features = Sequential::new().add(conv_bn_act(3, first, 3, 2, 1, 1, Act::Hardswish)?);
        for b in &bottlenecks {
            features = features.add(Bneck::new(b)?);
        }
        let last_in = bottlenecks[bottlenecks.len() - 1].out;
        let last_out = 6 * last_in;
        features = features.add(conv_bn_act(last_in, last_out, 1, 1, 1, 1, Act::Hardswish)?);
        Ok(MobileNetV3 {
            features,
            pool: AdaptiveAvgPool2D::new(1),
            classifier: Sequential::new()
                .add(Linear::new(last_out, last_channel)?)
                .add(Hardswish)
                .add(Dropout::new(config.dropout)?)
                .add(Linear::new(last_channel, config.num_classes)?),
        })
    }
}

impl Layer for MobileNetV3 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.pool.forward(&self.features.forward(x)?)?;
        self.classifier.forward(&h.flatten(1, -1)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("features".into(), &self.features),
            ("classifier".into(), &self.classifier),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("features".into(), &mut self.features),
            ("classifier".into(), &mut self.classifier),
        ]
    }
}

/// MobileNetV3-Small with `width_mult` and `num_classes` (torchvision's `mobilenet_v3_small`).
pub fn mobilenet_v3_small(width_mult: f64, num_classes: usize) -> Result<MobileNetV3> {
    MobileNetV3::new(&MobileNetV3Config {
        width_mult,
        ..MobileNetV3Config::new(MobileNetV3Arch::Small, num_classes)
    })
}

/// MobileNetV3-Large with `width_mult` and `num_classes` (torchvision's `mobilenet_v3_large`).
pub fn mobilenet_v3_large(width_mult: f64, num_classes: usize) -> Result<MobileNetV3> {
    MobileNetV3::new(&MobileNetV3Config {
        width_mult,
        ..MobileNetV3Config::new(MobileNetV3Arch::Large, num_classes)
    })
}

#[cfg(test)]
mod tests {
    use super::make_divisible;

    #[test]
    fn make_divisible_follows_torchvision() {
        assert_eq!(make_divisible(32.0, 8), 32);
        assert_eq!(make_divisible(32.0 * 0.5, 8), 16);
        assert_eq!(make_divisible(24.0 * 0.35, 8), 8);
        assert_eq!(make_divisible(96.0 * 0.75, 8), 72);
        // 0.9 rule: 20 * 0.55 = 11 rounds to 8 < 9.9, so it goes up to 16.
        assert_eq!(make_divisible(11.0, 8), 16);
    }

    #[test]
    fn parameter_counts_match_torchvision() {
        use crate::nn::Layer;
        // torchvision.models.mobilenet_v2(num_classes=10) and (width_mult=0.5, num_classes=10).
        for (width, count) in [(1.0, 2_236_682), (0.5, 700_490)] {
            let net = super::mobilenet_v2(width, 10).unwrap();
            let n: usize = net.parameters().iter().map(|p| p.numel()).sum();
            assert_eq!(n, count, "width {width}");
        }
        let net = super::mobilenet_v2(1.0, 10).unwrap();
        let names: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
        for expected in [
            "features.0.0.weight",
            "features.1.conv.0.0.weight",
            "features.1.conv.1.weight",
            "features.2.conv.1.0.weight",
            "features.18.1.bias",
            "classifier.1.weight",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected} missing");
        }
    }

    fn count(net: &dyn crate::nn::Layer) -> usize {
        net.parameters().iter().map(|p| p.numel()).sum()
    }

    #[test]
    fn mobilenet_v1_matches_paddle() {
        use crate::nn::Layer;
        // The layer table on `V1_BLOCKS`, summed by hand.
        let net = super::mobilenet_v1(1.0, 1000).unwrap();
        assert_eq!(count(&net), 4_231_976);
        let state = net.state_dict();
        for key in [
            "conv1.0.weight",
            "conv1.1._mean",
            "conv2_1._depthwise_conv.0.weight",
            "conv5_5._pointwise_conv.1._variance",
            "conv6._pointwise_conv.1.bias",
            "fc.weight",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert_eq!(state["conv2_1._depthwise_conv.0.weight"].shape(), [32, 1, 3, 3]);
        // conv1: conv weight and 4 batch-norm entries; 13 blocks × 10; fc weight and bias.
        assert_eq!(state.len(), 5 + 13 * 10 + 2);
        let small = super::mobilenet_v1(0.25, 10).unwrap();
        let x = crate::tensor::randn(&[2, 3, 32, 32], oar_ir::DType::F32).unwrap();
        assert_eq!(small.forward(&x).unwrap().shape(), [2, 10]);
        assert!(super::mobilenet_v1(0.01, 10).is_err());
        assert!(super::mobilenet_v1(1.0, 0).is_err());
    }

    #[test]
    fn mobilenet_v3_parameter_counts_match_torchvision() {
        use super::{MobileNetV3, MobileNetV3Arch, MobileNetV3Config};
        // torchvision.models.mobilenet_v3_*(...) as in each comment.
        let cfg = MobileNetV3Config::new;
        for (config, want) in [
            // mobilenet_v3_small(), mobilenet_v3_large()
            (cfg(MobileNetV3Arch::Small, 1000), 2_542_856),
            (cfg(MobileNetV3Arch::Large, 1000), 5_483_032),
            // mobilenet_v3_small(reduced_tail=True, dilated=True)
            (
                MobileNetV3Config {
                    reduced_tail: true,
                    dilated: true,
                    ..cfg(MobileNetV3Arch::Small, 1000)
                },
                1_099_672,
            ),
            // mobilenet_v3_small(width_mult=0.75, num_classes=10)
            (
                MobileNetV3Config {
                    width_mult: 0.75,
                    ..cfg(MobileNetV3Arch::Small, 10)
                },
                892_610,
            ),
        ] {
            assert_eq!(count(&MobileNetV3::new(&config).unwrap()), want, "{config:?}");
        }
    }

    #[test]
    fn mobilenet_v3_names_and_forward() {
        use crate::nn::Layer;
        let net = super::mobilenet_v3_small(1.0, 6).unwrap();
        let state = net.state_dict();
        for key in [
            "features.0.0.weight",
            "features.0.1._variance",
            "features.1.block.0.0.weight",
            "features.1.block.1.fc1.weight",
            "features.1.block.1.fc2.bias",
            "features.1.block.2.1.bias",
            "features.2.block.0.0.weight",
            "features.11.block.2.fc1.bias",
            "features.12.0.weight",
            "classifier.0.weight",
            "classifier.3.bias",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        // SE squeeze width: _make_divisible(16 // 4, 8) = 8.
        assert_eq!(state["features.1.block.1.fc1.weight"].shape(), [8, 16, 1, 1]);
        let x = crate::tensor::randn(&[2, 3, 32, 32], oar_ir::DType::F32).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [2, 6]);
        assert!(super::mobilenet_v3_large(0.0, 10).is_err());
        assert!(super::mobilenet_v3_large(1.0, 0).is_err());
    }
}
