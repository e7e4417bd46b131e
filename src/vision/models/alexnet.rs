//! AlexNet (Krizhevsky et al. 2012, the one-GPU variant of "One weird trick", Krizhevsky 2014)
//! with torchvision's architecture and module names (`torchvision.models.alexnet`):
//! `features` (five convs with relus and three 3×3/2 max-pools), adaptive average pooling to
//! 6×6 and `classifier` (dropout, linear 9216→4096, relu, dropout, linear 4096→4096, relu,
//! linear 4096→classes).

use crate::error::{Error, Result};
use crate::nn::{AdaptiveAvgPool2D, Conv2D, Dropout, Layer, Linear, MaxPool2D, ReLU, Sequential};
use crate::tensor::Tensor;

/// AlexNet: `features`, 6×6 adaptive average pooling and `classifier`.
pub struct AlexNet {
    features: Sequential,
    avgpool: AdaptiveAvgPool2D,
    classifier: Sequential,
}

impl AlexNet {
    /// AlexNet with `num_classes` outputs and dropout probability 0.5.
    pub fn new(num_classes: usize) -> Result<AlexNet> {
        if num_classes == 0 {
            return Err(Error::invalid("AlexNet", "num_classes must be positive"));
        }
        let pool = || MaxPool2D::new(3).stride(2);
        let features = Sequential::new()
            .add(Conv2D::new(3, 64, 11)?.stride(4).padding(2))
            .add(ReLU)
            .add(pool())
            .add(Conv2D::new(64, 192, 5)?.padding(2))
            .add(ReLU)
            .add(pool())
            .add(Conv2D::new(192, 384, 3)?.padding(1))
            .add(ReLU)
            .add(Conv2D::new(384, 256, 3)?.padding(1))
            .add(ReLU)
            .add(Conv2D::new(256, 256, 3)?.padding(1))
            .add(ReLU)
            .add(pool());
        let classifier = Sequential::new()
            .add(Dropout::new(0.5)?)
            .add(Linear::new(256 * 6 * 6, 4096)?)
            .add(ReLU)
            .add(Dropout::new(0.5)?)
            .add(Linear::new(4096, 4096)?)
            .add(ReLU)
            .add(Linear::new(4096, num_classes)?);
        Ok(AlexNet {
            features,
            avgpool: AdaptiveAvgPool2D::new(6),
            classifier,
        })
    }
}

impl Layer for AlexNet {
    /// Logits `[N, num_classes]` for images `x[N, 3, H, W]` (H, W ≥ 63).
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

/// AlexNet with `num_classes` outputs (`torchvision.models.alexnet`).
pub fn alexnet(num_classes: usize) -> Result<AlexNet> {
    AlexNet::new(num_classes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_count_names_and_shape() {
        // torchvision.models.alexnet(weights=None): 61,100,840 parameters.
        let net = alexnet(1000).unwrap();
        let n: usize = net.parameters().iter().map(|p| p.numel()).sum();
        assert_eq!(n, 61_100_840);
        let state = net.state_dict();
        for key in [
            "features.0.weight",
            "features.3.bias",
            "features.10.weight",
            "classifier.1.weight",
            "classifier.4.bias",
            "classifier.6.weight",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert_eq!(state.len(), 16);
        let x = crate::tensor::randn(&[1, 3, 64, 64], oar_ir::DType::F32).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [1, 1000]);
        assert!(alexnet(0).is_err());
    }
}
