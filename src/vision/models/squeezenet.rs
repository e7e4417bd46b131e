//! SqueezeNet 1.0 and 1.1 (Iandola et al. 2016) with torchvision's architecture and module
//! names (`torchvision.models.squeezenet1_0` / `squeezenet1_1`): `features` (a stem conv,
//! [`Fire`] modules and 3×3/2 max-pools with `ceil_mode`) and `classifier` (dropout 0.5, 1×1
//! conv to the classes, relu, global average pooling), flattened to `[N, classes]`.

use crate::error::{Error, Result};
use crate::nn::functional as F;
use crate::nn::{AdaptiveAvgPool2D, Conv2D, Dropout, Layer, MaxPool2D, ReLU, Sequential};
use crate::tensor::{Tensor, concat};

/// A Fire module: a 1×1 `squeeze` conv + relu, then `expand1x1` (1×1) and `expand3x3` (3×3,
/// padding 1) convs + relus, concatenated along the channels.
pub struct Fire {
    squeeze: Conv2D,
    expand1x1: Conv2D,
    expand3x3: Conv2D,
}

impl Fire {
    /// A module from `inplanes` channels through `squeeze_planes` to
    /// `expand1x1_planes + expand3x3_planes` channels.
    pub fn new(
        inplanes: usize,
        squeeze_planes: usize,
        expand1x1_planes: usize,
        expand3x3_planes: usize,
    ) -> Result<Fire> {
        Ok(Fire {
            squeeze: Conv2D::new(inplanes, squeeze_planes, 1)?,
            expand1x1: Conv2D::new(squeeze_planes, expand1x1_planes, 1)?,
            expand3x3: Conv2D::new(squeeze_planes, expand3x3_planes, 3)?.padding(1),
        })
    }
}

impl Layer for Fire {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let s = F::relu(&self.squeeze.forward(x)?)?;
        let e1 = F::relu(&self.expand1x1.forward(&s)?)?;
        let e3 = F::relu(&self.expand3x3.forward(&s)?)?;
        concat(&[&e1, &e3], 1)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("squeeze".into(), &self.squeeze),
            ("expand1x1".into(), &self.expand1x1),
            ("expand3x3".into(), &self.expand3x3),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("squeeze".into(), &mut self.squeeze),
            ("expand1x1".into(), &mut self.expand1x1),
            ("expand3x3".into(), &mut self.expand3x3),
        ]
    }
}

/// Which SqueezeNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqueezeNetVersion {
    /// The original network: a 7×7/2 stem conv to 96 channels, pools after fire modules 3
    /// and 7.
    V1_0,
    /// 2.4× less computation, about the same accuracy: a 3×3/2 stem conv to 64 channels,
    /// pools after fire modules 2 and 4.
    V1_1,
}

/// SqueezeNet: `features` and `classifier` (dropout, `classifier.1` 1×1 conv, relu, global
/// average pooling).
pub struct SqueezeNet {
    features: Sequential,
    classifier: Sequential,
}

impl SqueezeNet {
    /// SqueezeNet `version` with `num_classes` outputs and dropout probability 0.5.
    pub fn new(version: SqueezeNetVersion, num_classes: usize) -> Result<SqueezeNet> {
        if num_classes == 0 {
            return Err(Error::invalid("SqueezeNet", "num_classes must be positive"));
        }
        let pool = || MaxPool2D::new(3).stride(2).ceil_mode(true);
        let features = match version {
            SqueezeNetVersion::V1_0 => Sequential::new()
                .add(Conv2D::new(3, 96, 7)?.stride(2))
                .add(ReLU)
                .add(pool())
                .add(Fire::new(96, 16, 64, 64)?)
                .add(Fire::new(128, 16, 64, 64)?)
                .add(Fire::new(128, 32, 128, 128)?)
                .add(pool())
                .add(Fire::new(256, 32, 128, 128)?)
                .add(Fire::new(256, 48, 192, 192)?)
                .add(Fire::new(384, 48, 192, 192)?)
                .add(Fire::new(384, 64, 256, 256)?)
                .add(pool())
                .add(Fire::new(512, 64, 256, 256)?),
            SqueezeNetVersion::V1_1 => Sequential::new()
                .add(Conv2D::new(3, 64, 3)?.stride(2))
                .add(ReLU)
                .add(pool())
                .add(Fire::new(64, 16, 64, 64)?)
                .add(Fire::new(128, 16, 64, 64)?)
                .add(pool())
                .add(Fire::new(128, 32, 128, 128)?)
                .add(Fire::new(256, 32, 128, 128)?)
                .add(pool())
                .add(Fire::new(256, 48, 192, 192)?)
                .add(Fire::new(384, 48, 192, 192)?)
                .add(Fire::new(384, 64, 256, 256)?)
                .add(Fire::new(512, 64, 256, 256)?),
        };
        let classifier = Sequential::new()
            .add(Dropout::new(0.5)?)
            .add(Conv2D::new(512, num_classes, 1)?)
            .add(ReLU)
            .add(AdaptiveAvgPool2D::new(1));
        Ok(SqueezeNet { features, classifier })
    }
}

impl Layer for SqueezeNet {
    /// Scores `[N, num_classes]` (non-negative: the final conv is followed by a relu).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.classifier.forward(&self.features.forward(x)?)?.flatten(1, -1)
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

/// SqueezeNet 1.0 with `num_classes` outputs (`torchvision.models.squeezenet1_0`).
pub fn squeezenet1_0(num_classes: usize) -> Result<SqueezeNet> {
    SqueezeNet::new(SqueezeNetVersion::V1_0, num_classes)
}

/// SqueezeNet 1.1 with `num_classes` outputs (`torchvision.models.squeezenet1_1`).
pub fn squeezenet1_1(num_classes: usize) -> Result<SqueezeNet> {
    SqueezeNet::new(SqueezeNetVersion::V1_1, num_classes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_match_torchvision() {
        // torchvision.models.squeezenet1_{0,1}(weights=None), 1000 classes, and
        // squeezenet1_0(num_classes=10).
        for (build, classes, want) in [
            (squeezenet1_0 as fn(usize) -> Result<SqueezeNet>, 1000, 1_248_424),
            (squeezenet1_1, 1000, 1_235_496),
            (squeezenet1_0, 10, 740_554),
        ] {
            let net = build(classes).unwrap();
            let n: usize = net.parameters().iter().map(|p| p.numel()).sum();
            assert_eq!(n, want);
        }
    }

    #[test]
    fn names_and_forward_shape() {
        let net = squeezenet1_1(10).unwrap();
        let state = net.state_dict();
        for key in [
            "features.0.weight",
            "features.3.squeeze.weight",
            "features.3.expand1x1.bias",
            "features.12.expand3x3.weight",
            "classifier.1.weight",
            "classifier.1.bias",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        // 2 stem + 8 fire modules × 6 + 2 classifier tensors.
        assert_eq!(state.len(), 52);
        let x = crate::tensor::randn(&[2, 3, 64, 64], oar_ir::DType::F32).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [2, 10]);
        let net = squeezenet1_0(10).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [2, 10]);
        assert!(squeezenet1_0(0).is_err());
    }
}
