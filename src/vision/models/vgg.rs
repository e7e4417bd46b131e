//! VGG (Simonyan & Zisserman 2015) with torchvision's architecture and module names
//! (`torchvision.models.vgg16` & co.; `paddle.vision.models.vgg16` has the same layout):
//! `features` (3×3 convs with padding 1, each followed by relu — and batch norm in between
//! for the `_bn` variants — and 2×2 max-pools), adaptive average pooling to 7×7 and
//! `classifier` (linear 25088→4096, relu, dropout 0.5, linear 4096→4096, relu, dropout 0.5,
//! linear 4096→classes).

use crate::error::{Error, Result};
use crate::nn::{AdaptiveAvgPool2D, BatchNorm2D, Conv2D, Dropout, Layer, Linear, MaxPool2D, ReLU, Sequential};
use crate::tensor::Tensor;

/// A max-pool in a configuration; other entries are 3×3 convs to that many channels.
const M: usize = 0;

/// torchvision's `cfgs["A"]`: VGG-11.
const CFG_A: &[usize] = &[64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M];
/// `cfgs["B"]`: VGG-13.
const CFG_B: &[usize] = &[64, 64, M, 128, 128, M, 256, 256, M, 512, 512, M, 512, 512, M];
/// `cfgs["D"]`: VGG-16.
const CFG_D: &[usize] = &[
    64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512, M, 512, 512, 512, M,
];
/// `cfgs["E"]`: VGG-19.
const CFG_E: &[usize] = &[
    64, 64, M, 128, 128, M, 256, 256, 256, 256, M, 512, 512, 512, 512, M, 512, 512, 512, 512, M,
];

/// VGG: `features`, 7×7 adaptive average pooling and `classifier`.
pub struct VGG {
    features: Sequential,
    avgpool: AdaptiveAvgPool2D,
    classifier: Sequential,
}

impl VGG {
    /// VGG with `depth` weight layers (11, 13, 16 or 19: torchvision's configurations A, B,
    /// D, E), batch norm after every conv when `batch_norm`, and `num_classes` outputs.
    pub fn new(depth: usize, batch_norm: bool, num_classes: usize) -> Result<VGG> {
        let cfg = match depth {
            11 => CFG_A,
            13 => CFG_B,
            16 => CFG_D,
            19 => CFG_E,
            _ => {
                return Err(Error::invalid(
                    "VGG",
                    format!("depth must be 11, 13, 16 or 19, got {depth}"),
                ));
            }
        };
        if num_classes == 0 {
            return Err(Error::invalid("VGG", "num_classes must be positive"));
        }
        let mut features = Sequential::new();
        let mut in_channels = 3;
        for &out in cfg {
            if out == M {
                features = features.add(MaxPool2D::new(2).stride(2));
                continue;
            }
            features = features.add(Conv2D::new(in_channels, out, 3)?.padding(1));
            if batch_norm {
                features = features.add(BatchNorm2D::new(out)?);
            }
            features = features.add(ReLU);
            in_channels = out;
        }
        Ok(VGG {
            features,
            avgpool: AdaptiveAvgPool2D::new(7),
            classifier: Sequential::new()
                .add(Linear::new(512 * 7 * 7, 4096)?)
                .add(ReLU)
                .add(Dropout::new(0.5)?)
                .add(Linear::new(4096, 4096)?)
                .add(ReLU)
                .add(Dropout::new(0.5)?)
                .add(Linear::new(4096, num_classes)?),
        })
    }
}

impl Layer for VGG {
    /// Logits `[N, num_classes]` for images `x[N, 3, H, W]` (H, W ≥ 32).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.avgpool.forward(&self.features.forward(x)?)?;
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

/// VGG-11 (`torchvision.models.vgg11`, or `vgg11_bn` when `batch_norm`).
pub fn vgg11(batch_norm: bool, num_classes: usize) -> Result<VGG> {
    VGG::new(11, batch_norm, num_classes)
}

/// VGG-13 (`torchvision.models.vgg13`, or `vgg13_bn` when `batch_norm`).
pub fn vgg13(batch_norm: bool, num_classes: usize) -> Result<VGG> {
    VGG::new(13, batch_norm, num_classes)
}

/// VGG-16 (`torchvision.models.vgg16`, or `vgg16_bn` when `batch_norm`).
pub fn vgg16(batch_norm: bool, num_classes: usize) -> Result<VGG> {
    VGG::new(16, batch_norm, num_classes)
}

/// VGG-19 (`torchvision.models.vgg19`, or `vgg19_bn` when `batch_norm`).
pub fn vgg19(batch_norm: bool, num_classes: usize) -> Result<VGG> {
    VGG::new(19, batch_norm, num_classes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checks on vgg11_bn: torchvision's state-dict names and the logits' shape.
    fn check_vgg11_bn(net: &VGG) {
        let state = net.state_dict();
        for key in [
            "features.0.weight",
            "features.1._mean",
            "features.26.bias",
            "classifier.0.weight",
            "classifier.3.weight",
            "classifier.6.bias",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert_eq!(state["classifier.0.weight"].shape(), [25088, 4096]);
        let x = crate::tensor::randn(&[1, 3, 32, 32], oar_ir::DType::F32).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [1, 1000]);
    }

    #[test]
    fn parameter_counts_and_names_match_torchvision() {
        // torchvision.models.vgg{11,13,16,19}[_bn](weights=None), 1000 classes.
        for (depth, plain, with_bn) in [
            (11, 132_863_336, 132_868_840),
            (13, 133_047_848, 133_053_736),
            (16, 138_357_544, 138_365_992),
            (19, 143_667_240, 143_678_248),
        ] {
            for (batch_norm, want) in [(false, plain), (true, with_bn)] {
                let net = VGG::new(depth, batch_norm, 1000).unwrap();
                let n: usize = net.parameters().iter().map(|p| p.numel()).sum();
                assert_eq!(n, want, "vgg{depth} batch_norm={batch_norm}");
                match (depth, batch_norm) {
                    (11, true) => check_vgg11_bn(&net),
                    (16, false) => assert!(net.state_dict().contains_key("features.28.weight")),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(VGG::new(12, false, 10).is_err());
        assert!(vgg11(false, 0).is_err());
    }
}
