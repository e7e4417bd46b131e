//! ResNet-18/34 (He et al. 2016) with basic blocks, laid out as `paddle.vision.models.resnet18`.

use crate::error::Result;
use crate::nn::functional as F;
use crate::nn::{AdaptiveAvgPool2D, BatchNorm2D, Conv2D, Layer, Linear, MaxPool2D, Sequential};
use crate::tensor::Tensor;

/// Two 3×3 conv + batch-norm layers with a residual connection (a 1×1 conv when the shape
/// changes).
pub struct BasicBlock {
    conv1: Conv2D,
    bn1: BatchNorm2D,
    conv2: Conv2D,
    bn2: BatchNorm2D,
    downsample: Option<Sequential>,
}

impl BasicBlock {
    /// A block from `inplanes` to `planes` channels with the given stride.
    pub fn new(inplanes: usize, planes: usize, stride: usize) -> Result<BasicBlock> {
        let downsample = if stride != 1 || inplanes != planes {
            Some(
                Sequential::new()
                    .add(Conv2D::new(inplanes, planes, 1)?.stride(stride).bias(false))
                    .add(BatchNorm2D::new(planes)?),
            )
        } else {
            None
        };
        Ok(BasicBlock {
            conv1: Conv2D::new(inplanes, planes, 3)?.stride(stride).padding(1).bias(false),
            bn1: BatchNorm2D::new(planes)?,
            conv2: Conv2D::new(planes, planes, 3)?.padding(1).bias(false),
            bn2: BatchNorm2D::new(planes)?,
            downsample,
        })
    }
}

impl Layer for BasicBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = F::relu(&self.bn1.forward(&self.conv1.forward(x)?)?)?;
        let h = self.bn2.forward(&self.conv2.forward(&h)?)?;
        let identity = match &self.downsample {
            Some(d) => d.forward(x)?,
            None => x.clone(),
        };
        F::relu(&(&h + &identity)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![
            ("conv1".into(), &self.conv1),
            ("bn1".into(), &self.bn1),
            ("conv2".into(), &self.conv2),
            ("bn2".into(), &self.bn2),
        ];
        if let Some(d) = &self.downsample {
            v.push(("downsample".into(), d));
        }
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![
            ("conv1".into(), &mut self.conv1),
            ("bn1".into(), &mut self.bn1),
            ("conv2".into(), &mut self.conv2),
            ("bn2".into(), &mut self.bn2),
        ];
        if let Some(d) = &mut self.downsample {
            v.push(("downsample".into(), d));
        }
        v
    }
}

/// A ResNet of basic blocks: stem (7×7 conv, batch norm, relu, 3×3 max-pool), four stages,
/// global average pooling and a linear classifier.
pub struct ResNet {
    conv1: Conv2D,
    bn1: BatchNorm2D,
    maxpool: MaxPool2D,
    layers: Vec<Sequential>,
    avgpool: AdaptiveAvgPool2D,
    fc: Linear,
}

impl ResNet {
    /// `blocks[i]` basic blocks in stage `i` (64, 128, 256, 512 channels) and `num_classes`
    /// outputs.
    pub fn new(blocks: [usize; 4], num_classes: usize) -> Result<ResNet> {
        let mut layers = Vec::with_capacity(4);
        let mut inplanes = 64;
        for (stage, &n) in blocks.iter().enumerate() {
            let planes = 64 << stage;
            let mut seq = Sequential::new();
            for b in 0..n {
                let stride = if b == 0 && stage > 0 { 2 } else { 1 };
                seq = seq.add(BasicBlock::new(inplanes, planes, stride)?);
                inplanes = planes;
            }
            layers.push(seq);
        }
        Ok(ResNet {
            conv1: Conv2D::new(3, 64, 7)?.stride(2).padding(3).bias(false),
            bn1: BatchNorm2D::new(64)?,
            maxpool: MaxPool2D::new(3).stride(2).padding(1),
            layers,
            avgpool: AdaptiveAvgPool2D::new(1),
            fc: Linear::new(512, num_classes)?,
        })
    }
}

impl Layer for ResNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self
            .maxpool
            .forward(&F::relu(&self.bn1.forward(&self.conv1.forward(x)?)?)?)?;
        for l in &self.layers {
            h = l.forward(&h)?;
        }
        self.fc.forward(&self.avgpool.forward(&h)?.flatten(1, -1)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![("conv1".into(), &self.conv1), ("bn1".into(), &self.bn1)];
        for (i, l) in self.layers.iter().enumerate() {
            v.push((format!("layer{}", i + 1), l));
        }
        v.push(("fc".into(), &self.fc));
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> =
            vec![("conv1".into(), &mut self.conv1), ("bn1".into(), &mut self.bn1)];
        for (i, l) in self.layers.iter_mut().enumerate() {
            v.push((format!("layer{}", i + 1), l));
        }
        v.push(("fc".into(), &mut self.fc));
        v
    }
}

/// ResNet-18.
pub fn resnet18(num_classes: usize) -> Result<ResNet> {
    ResNet::new([2, 2, 2, 2], num_classes)
}

/// ResNet-34.
pub fn resnet34(num_classes: usize) -> Result<ResNet> {
    ResNet::new([3, 4, 6, 3], num_classes)
}
