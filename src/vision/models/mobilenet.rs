//! MobileNetV2 (Sandler et al. 2018) with torchvision's architecture and Paddle's layer names
//! (`paddle.vision.models.MobileNetV2`): a 3×3 stem, inverted residual blocks (1×1 expansion,
//! 3×3 depthwise conv, 1×1 linear projection; ReLU6 activations; a residual connection when
//! the shape is kept), a 1×1 conv to 1280 channels, global average pooling, dropout and a
//! linear classifier.

use crate::error::{Error, Result};
use crate::nn::{AdaptiveAvgPool2D, BatchNorm2D, Conv2D, Dropout, Layer, Linear, Sequential};
use crate::tensor::Tensor;
use oar_ir::ops::BinaryOp;

/// `min(max(x, 0), 6)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReLU6;

impl Layer for ReLU6 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.binary_scalar(BinaryOp::Max, 0.0)?.binary_scalar(BinaryOp::Min, 6.0)
    }
}

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
}
