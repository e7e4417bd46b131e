//! LeNet-5 (LeCun et al. 1998) as `paddle.vision.models.LeNet`: two conv + relu + max-pool
//! stages and three linear layers, for 1×28×28 images.

use crate::error::Result;
use crate::nn::{Conv2D, Layer, Linear, MaxPool2D, ReLU, Sequential};
use crate::tensor::Tensor;

/// LeNet: `features` (conv 1→6 3×3 pad 1, relu, 2×2 max-pool, conv 6→16 5×5, relu, 2×2
/// max-pool) and, when `num_classes > 0`, a classifier `fc` (400 → 120 → 84 → classes).
pub struct LeNet {
    features: Sequential,
    fc: Option<Sequential>,
}

impl LeNet {
    /// LeNet for 1×28×28 inputs with `num_classes` outputs (0: features only, `[N, 16, 5, 5]`).
    pub fn new(num_classes: usize) -> Result<LeNet> {
        let features = Sequential::new()
            .add(Conv2D::new(1, 6, 3)?.padding(1))
            .add(ReLU)
            .add(MaxPool2D::new(2).stride(2))
            .add(Conv2D::new(6, 16, 5)?)
            .add(ReLU)
            .add(MaxPool2D::new(2).stride(2));
        let fc = if num_classes > 0 {
            Some(
                Sequential::new()
                    .add(Linear::new(400, 120)?)
                    .add(Linear::new(120, 84)?)
                    .add(Linear::new(84, num_classes)?),
            )
        } else {
            None
        };
        Ok(LeNet { features, fc })
    }
}

impl Layer for LeNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.features.forward(x)?;
        match &self.fc {
            Some(fc) => fc.forward(&h.flatten(1, -1)?),
            None => Ok(h),
        }
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![("features".into(), &self.features)];
        if let Some(fc) = &self.fc {
            v.push(("fc".into(), fc));
        }
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![("features".into(), &mut self.features)];
        if let Some(fc) = &mut self.fc {
            v.push(("fc".into(), fc));
        }
        v
    }
}

/// LeNet with `num_classes` outputs (Paddle's default is 10).
pub fn lenet(num_classes: usize) -> Result<LeNet> {
    LeNet::new(num_classes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parameter_count_matches_paddle() {
        use crate::nn::Layer;
        // paddle.vision.models.LeNet(): 60 + 2416 + 48120 + 10164 + 850.
        let net = super::lenet(10).unwrap();
        let n: usize = net.parameters().iter().map(|p| p.numel()).sum();
        assert_eq!(n, 61_610);
        assert!(net.named_parameters().iter().any(|(n, _)| n == "fc.2.weight"));
    }
}
