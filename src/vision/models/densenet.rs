//! DenseNet (Huang et al. 2017) with torchvision's architecture and module names
//! (`torchvision.models.densenet121` & co.): `features` (`conv0` 7×7/2, `norm0`, relu, `pool0`
//! 3×3/2 max-pool, then `denseblock1`..`denseblockK` with `transition1`..`transition{K-1}`
//! between them, and `norm5`), relu, global average pooling and a linear `classifier`.
//!
//! A dense layer `denseblockI.denselayerJ` is batch norm `norm1`, relu, 1×1 conv `conv1` to
//! `bn_size · growth_rate` channels, `norm2`, relu, 3×3 conv `conv2` to `growth_rate` channels
//! (no conv biases); it sees the concatenation of the block input and every earlier layer's
//! output. A transition is `norm`, relu, 1×1 conv `conv` halving the channels, 2×2 average pool.

use crate::error::{Error, Result};
use crate::nn::functional as F;
use crate::nn::{AdaptiveAvgPool2D, AvgPool2D, BatchNorm2D, Conv2D, Layer, Linear, MaxPool2D};
use crate::tensor::{Tensor, concat};

/// torchvision's `_DenseLayer`: `norm1`, relu, `conv1` (1×1), `norm2`, relu, `conv2` (3×3),
/// then dropout with `drop_rate` in training.
struct DenseLayer {
    norm1: BatchNorm2D,
    conv1: Conv2D,
    norm2: BatchNorm2D,
    conv2: Conv2D,
    drop_rate: f64,
    training: bool,
}

impl DenseLayer {
    fn new(in_channels: usize, growth_rate: usize, bn_size: usize, drop_rate: f64) -> Result<DenseLayer> {
        let mid = bn_size * growth_rate;
        Ok(DenseLayer {
            norm1: BatchNorm2D::new(in_channels)?,
            conv1: Conv2D::new(in_channels, mid, 1)?.bias(false),
            norm2: BatchNorm2D::new(mid)?,
            conv2: Conv2D::new(mid, growth_rate, 3)?.padding(1).bias(false),
            drop_rate,
            training: true,
        })
    }
}

impl Layer for DenseLayer {
    /// `growth_rate` new channels from the concatenated earlier features `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.conv1.forward(&F::relu(&self.norm1.forward(x)?)?)?;
        let h = self.conv2.forward(&F::relu(&self.norm2.forward(&h)?)?)?;
        F::dropout(&h, self.drop_rate, self.training)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("norm1".into(), &self.norm1),
            ("conv1".into(), &self.conv1),
            ("norm2".into(), &self.norm2),
            ("conv2".into(), &self.conv2),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("norm1".into(), &mut self.norm1),
            ("conv1".into(), &mut self.conv1),
            ("norm2".into(), &mut self.norm2),
            ("conv2".into(), &mut self.conv2),
        ]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// torchvision's `_DenseBlock`: `denselayer1`..`denselayerN`, each fed the concatenation of
/// the block input and all earlier outputs; the output is the concatenation of all of them.
struct DenseBlock {
    layers: Vec<DenseLayer>,
}

impl Layer for DenseBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut features = vec![x.clone()];
        for l in &self.layers {
            let input = concat(&features.iter().collect::<Vec<_>>(), 1)?;
            features.push(l.forward(&input)?);
        }
        concat(&features.iter().collect::<Vec<_>>(), 1)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("denselayer{}", i + 1), l as &dyn Layer))
            .collect()
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        self.layers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| (format!("denselayer{}", i + 1), l as &mut dyn Layer))
            .collect()
    }
}

/// torchvision's `_Transition`: `norm`, relu, `conv` (1×1, no bias), 2×2 average pool.
struct Transition {
    norm: BatchNorm2D,
    conv: Conv2D,
    pool: AvgPool2D,
}

impl Layer for Transition {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.conv.forward(&F::relu(&self.norm.forward(x)?)?)?;
        self.pool.forward(&h)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("norm".into(), &self.norm), ("conv".into(), &self.conv)]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("norm".into(), &mut self.norm), ("conv".into(), &mut self.conv)]
    }
}

/// DenseNet's `features`: stem, dense blocks with transitions between them, `norm5`.
struct Features {
    conv0: Conv2D,
    norm0: BatchNorm2D,
    pool0: MaxPool2D,
    blocks: Vec<DenseBlock>,
    transitions: Vec<Transition>,
    norm5: BatchNorm2D,
}

impl Layer for Features {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = F::relu(&self.norm0.forward(&self.conv0.forward(x)?)?)?;
        h = self.pool0.forward(&h)?;
        for (i, block) in self.blocks.iter().enumerate() {
            h = block.forward(&h)?;
            if let Some(t) = self.transitions.get(i) {
                h = t.forward(&h)?;
            }
        }
        self.norm5.forward(&h)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![("conv0".into(), &self.conv0), ("norm0".into(), &self.norm0)];
        for (i, block) in self.blocks.iter().enumerate() {
            v.push((format!("denseblock{}", i + 1), block));
            if let Some(t) = self.transitions.get(i) {
                v.push((format!("transition{}", i + 1), t));
            }
        }
        v.push(("norm5".into(), &self.norm5));
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> =
            vec![("conv0".into(), &mut self.conv0), ("norm0".into(), &mut self.norm0)];
        let mut transitions = self.transitions.iter_mut();
        for (i, block) in self.blocks.iter_mut().enumerate() {
            v.push((format!("denseblock{}", i + 1), block));
            if let Some(t) = transitions.next() {
                v.push((format!("transition{}", i + 1), t));
            }
        }
        v.push(("norm5".into(), &mut self.norm5));
        v
    }
}

/// The architecture arguments of torchvision's `DenseNet(growth_rate, block_config,
/// num_init_features, bn_size=4, drop_rate=0)`; build with [`DenseNetConfig::new`] and the
/// builder methods, then [`DenseNet::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct DenseNetConfig {
    growth_rate: usize,
    block_config: Vec<usize>,
    num_init_features: usize,
    bn_size: usize,
    drop_rate: f64,
}

impl DenseNetConfig {
    /// `growth_rate` channels per dense layer, `block_config[i]` layers in dense block `i`,
    /// `num_init_features` stem channels; `bn_size` 4 and no dropout.
    pub fn new(growth_rate: usize, block_config: &[usize], num_init_features: usize) -> DenseNetConfig {
        DenseNetConfig {
            growth_rate,
            block_config: block_config.to_vec(),
            num_init_features,
            bn_size: 4,
            drop_rate: 0.0,
        }
    }

    /// The 1×1 bottleneck of a dense layer has `bn_size · growth_rate` channels (default 4).
    pub fn bn_size(mut self, bn_size: usize) -> DenseNetConfig {
        self.bn_size = bn_size;
        self
    }

    /// Dropout probability after each dense layer, in `[0, 1)` (default 0).
    pub fn drop_rate(mut self, drop_rate: f64) -> DenseNetConfig {
        self.drop_rate = drop_rate;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.growth_rate == 0 || self.num_init_features == 0 || self.bn_size == 0 {
            return Err(Error::invalid(
                "DenseNet",
                format!(
                    "growth_rate ({}), num_init_features ({}) and bn_size ({}) must be ≥ 1",
                    self.growth_rate, self.num_init_features, self.bn_size
                ),
            ));
        }
        if self.block_config.is_empty() || self.block_config.contains(&0) {
            return Err(Error::invalid(
                "DenseNet",
                format!("block_config {:?} needs ≥ 1 block of ≥ 1 layers", self.block_config),
            ));
        }
        if !(0.0..1.0).contains(&self.drop_rate) {
            return Err(Error::invalid(
                "DenseNet",
                format!("drop_rate {} is not in [0, 1)", self.drop_rate),
            ));
        }
        Ok(())
    }
}

/// DenseNet: `features`, relu, global average pooling and `classifier`.
pub struct DenseNet {
    features: Features,
    avgpool: AdaptiveAvgPool2D,
    classifier: Linear,
}

impl DenseNet {
    /// The network `config` describes, with `num_classes` outputs.
    pub fn new(config: &DenseNetConfig, num_classes: usize) -> Result<DenseNet> {
        config.validate()?;
        if num_classes == 0 {
            return Err(Error::invalid("DenseNet", "num_classes must be positive"));
        }
        let &DenseNetConfig {
            growth_rate,
            num_init_features,
            bn_size,
            drop_rate,
            ..
        } = config;
        let mut channels = num_init_features;
        let mut blocks = Vec::with_capacity(config.block_config.len());
        let mut transitions = Vec::with_capacity(config.block_config.len() - 1);
        for (i, &n) in config.block_config.iter().enumerate() {
            let layers = (0..n)
                .map(|j| DenseLayer::new(channels + j * growth_rate, growth_rate, bn_size, drop_rate))
                .collect::<Result<Vec<_>>>()?;
            blocks.push(DenseBlock { layers });
            channels += n * growth_rate;
            if i + 1 < config.block_config.len() {
                transitions.push(Transition {
                    norm: BatchNorm2D::new(channels)?,
                    conv: Conv2D::new(channels, channels / 2, 1)?.bias(false),
                    pool: AvgPool2D::new(2).stride(2),
                });
                channels /= 2;
            }
        }
        let features = Features {
            conv0: Conv2D::new(3, num_init_features, 7)?.stride(2).padding(3).bias(false),
            norm0: BatchNorm2D::new(num_init_features)?,
            pool0: MaxPool2D::new(3).stride(2).padding(1),
            blocks,
            transitions,
            norm5: BatchNorm2D::new(channels)?,
        };
        Ok(DenseNet {
            features,
            avgpool: AdaptiveAvgPool2D::new(1),
            classifier: Linear::new(channels, num_classes)?,
        })
    }
}

impl Layer for DenseNet {
    /// Logits `[N, num_classes]` for images `x[N, 3, H, W]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = F::relu(&self.features.forward(x)?)?;
        self.classifier.forward(&self.avgpool.forward(&h)?.flatten(1, -1)?)
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

/// DenseNet-121 (`torchvision.models.densenet121`): growth 32, blocks `[6, 12, 24, 16]`, 64
/// stem channels.
pub fn densenet121(num_classes: usize) -> Result<DenseNet> {
    DenseNet::new(&DenseNetConfig::new(32, &[6, 12, 24, 16], 64), num_classes)
}

/// DenseNet-161 (`torchvision.models.densenet161`): growth 48, blocks `[6, 12, 36, 24]`, 96
/// stem channels.
pub fn densenet161(num_classes: usize) -> Result<DenseNet> {
    DenseNet::new(&DenseNetConfig::new(48, &[6, 12, 36, 24], 96), num_classes)
}

/// DenseNet-169 (`torchvision.models.densenet169`): growth 32, blocks `[6, 12, 32, 32]`, 64
/// stem channels.
pub fn densenet169(num_classes: usize) -> Result<DenseNet> {
    DenseNet::new(&DenseNetConfig::new(32, &[6, 12, 32, 32], 64), num_classes)
}

/// DenseNet-201 (`torchvision.models.densenet201`): growth 32, blocks `[6, 12, 48, 32]`, 64
/// stem channels.
pub fn densenet201(num_classes: usize) -> Result<DenseNet> {
    DenseNet::new(&DenseNetConfig::new(32, &[6, 12, 48, 32], 64), num_classes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(net: &DenseNet) -> usize {
        net.parameters().iter().map(|p| p.numel()).sum()
    }

    #[test]
    fn parameter_counts_match_torchvision() {
        // torchvision.models.densenet{121,161,169,201}(weights=None), 1000 classes.
        for (build, want) in [
            (densenet121 as fn(usize) -> Result<DenseNet>, 7_978_856),
            (densenet161, 28_681_000),
            (densenet169, 14_149_480),
            (densenet201, 20_013_928),
        ] {
            assert_eq!(count(&build(1000).unwrap()), want);
        }
        // torchvision.models.DenseNet(growth_rate=8, block_config=(2, 3), num_init_features=16,
        // bn_size=2, num_classes=5).
        let small = DenseNet::new(&DenseNetConfig::new(8, &[2, 3], 16).bn_size(2), 5).unwrap();
        assert_eq!(count(&small), 11_181);
    }

    #[test]
    fn names_and_forward_shape() {
        let net = densenet121(1000).unwrap();
        let state = net.state_dict();
        for key in [
            "features.conv0.weight",
            "features.norm0._mean",
            "features.denseblock1.denselayer1.norm1.weight",
            "features.denseblock1.denselayer6.conv2.weight",
            "features.transition1.norm._variance",
            "features.transition3.conv.weight",
            "features.denseblock4.denselayer16.norm2.bias",
            "features.norm5.weight",
            "classifier.weight",
            "classifier.bias",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert_eq!(state["classifier.weight"].shape(), [1024, 1000]);
        assert_eq!(
            state["features.denseblock2.denselayer3.conv1.weight"].shape(),
            [128, 192, 1, 1]
        );

        let mut small = DenseNet::new(&DenseNetConfig::new(8, &[2, 3], 16).drop_rate(0.2), 5).unwrap();
        let x = crate::tensor::randn(&[2, 3, 32, 32], oar_ir::DType::F32).unwrap();
        assert_eq!(small.forward(&x).unwrap().shape(), [2, 5]);
        small.eval();
        assert!(!small.features.blocks[0].layers[0].is_training());
        assert_eq!(small.forward(&x).unwrap().shape(), [2, 5]);
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(densenet121(0).is_err());
        for config in [
            DenseNetConfig::new(0, &[2], 16),
            DenseNetConfig::new(8, &[], 16),
            DenseNetConfig::new(8, &[2, 0], 16),
            DenseNetConfig::new(8, &[2], 0),
            DenseNetConfig::new(8, &[2], 16).bn_size(0),
            DenseNetConfig::new(8, &[2], 16).drop_rate(1.0),
        ] {
            assert!(DenseNet::new(&config, 5).is_err(), "{config:?}");
        }
    }
}
