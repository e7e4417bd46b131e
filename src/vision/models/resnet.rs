//! ResNet (He et al. 2016), ResNeXt (Xie et al. 2017) and Wide ResNet (Zagoruyko & Komodakis
//! 2016) with torchvision's architecture and module names (`torchvision.models.resnet50` & co.,
//! which `paddle.vision.models` shares): a stem (`conv1` 7×7/2, `bn1`, relu, 3×3/2 max-pool),
//! four stages `layer1`..`layer4` of [`BasicBlock`]s or [`BottleneckBlock`]s, global average
//! pooling and a linear classifier `fc`.
//!
//! The names map 1:1 onto a torchvision `state_dict` once batch-norm `running_mean` /
//! `running_var` read `_mean` / `_variance` and linear weights are transposed to `[in, out]`.

use crate::error::{Error, Result};
use crate::nn::functional as F;
use crate::nn::{AdaptiveAvgPool2D, BatchNorm2D, Conv2D, Layer, Linear, MaxPool2D, Sequential};
use crate::tensor::Tensor;

/// The shortcut of a block whose shape changes: 1×1 conv with `stride` (no bias) + batch norm
/// (`downsample.0`, `downsample.1`); `None` when `stride == 1` and the channels are kept.
fn downsample(inplanes: usize, outplanes: usize, stride: usize) -> Result<Option<Sequential>> {
    if stride == 1 && inplanes == outplanes {
        return Ok(None);
    }
    Ok(Some(
        Sequential::new()
            .add(Conv2D::new(inplanes, outplanes, 1)?.stride(stride).bias(false))
            .add(BatchNorm2D::new(outplanes)?),
    ))
}

/// `relu(h + shortcut(x))`.
fn residual(h: &Tensor, x: &Tensor, downsample: Option<&Sequential>) -> Result<Tensor> {
    let identity = match downsample {
        Some(d) => d.forward(x)?,
        None => x.clone(),
    };
    F::relu(&(h + &identity)?)
}

/// Two 3×3 conv + batch-norm layers with a residual connection (a 1×1 conv when the shape
/// changes): torchvision's `BasicBlock` (expansion 1).
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
        Ok(BasicBlock {
            conv1: Conv2D::new(inplanes, planes, 3)?.stride(stride).padding(1).bias(false),
            bn1: BatchNorm2D::new(planes)?,
            conv2: Conv2D::new(planes, planes, 3)?.padding(1).bias(false),
            bn2: BatchNorm2D::new(planes)?,
            downsample: downsample(inplanes, planes, stride)?,
        })
    }
}

impl Layer for BasicBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = F::relu(&self.bn1.forward(&self.conv1.forward(x)?)?)?;
        let h = self.bn2.forward(&self.conv2.forward(&h)?)?;
        residual(&h, x, self.downsample.as_ref())
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

/// torchvision's `Bottleneck` (ResNet v1.5: the stride sits on the 3×3 conv): 1×1 conv to
/// `width = planes · width_per_group / 64 · groups` channels, 3×3 conv (`stride`, `groups`,
/// `dilation`), 1×1 conv to `4 · planes` channels, each followed by batch norm, with a
/// residual connection (a 1×1 conv when the shape changes).
pub struct BottleneckBlock {
    conv1: Conv2D,
    bn1: BatchNorm2D,
    conv2: Conv2D,
    bn2: BatchNorm2D,
    conv3: Conv2D,
    bn3: BatchNorm2D,
    downsample: Option<Sequential>,
}

impl BottleneckBlock {
    /// Output channels per `planes`.
    pub const EXPANSION: usize = 4;

    /// A block from `inplanes` to `4 · planes` channels (torchvision's `base_width` is
    /// `width_per_group`).
    pub fn new(
        inplanes: usize,
        planes: usize,
        stride: usize,
        groups: usize,
        width_per_group: usize,
        dilation: usize,
    ) -> Result<BottleneckBlock> {
        if groups == 0 || width_per_group == 0 || dilation == 0 {
            return Err(Error::invalid(
                "BottleneckBlock",
                format!("groups ({groups}), width_per_group ({width_per_group}) and dilation ({dilation}) must be ≥ 1"),
            ));
        }
        let width = planes * width_per_group / 64 * groups;
        let out = planes * Self::EXPANSION;
        Ok(BottleneckBlock {
            conv1: Conv2D::new(inplanes, width, 1)?.bias(false),
            bn1: BatchNorm2D::new(width)?,
            conv2: Conv2D::new(width, width, 3)?
                .stride(stride)
                .padding(dilation)
                .dilation(dilation)
                .groups(groups)?
                .bias(false),
            bn2: BatchNorm2D::new(width)?,
            conv3: Conv2D::new(width, out, 1)?.bias(false),
            bn3: BatchNorm2D::new(out)?,
            downsample: downsample(inplanes, out, stride)?,
        })
    }
}

impl Layer for BottleneckBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = F::relu(&self.bn1.forward(&self.conv1.forward(x)?)?)?;
        let h = F::relu(&self.bn2.forward(&self.conv2.forward(&h)?)?)?;
        let h = self.bn3.forward(&self.conv3.forward(&h)?)?;
        residual(&h, x, self.downsample.as_ref())
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![
            ("conv1".into(), &self.conv1),
            ("bn1".into(), &self.bn1),
            ("conv2".into(), &self.conv2),
            ("bn2".into(), &self.bn2),
            ("conv3".into(), &self.conv3),
            ("bn3".into(), &self.bn3),
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
            ("conv3".into(), &mut self.conv3),
            ("bn3".into(), &mut self.bn3),
        ];
        if let Some(d) = &mut self.downsample {
            v.push(("downsample".into(), d));
        }
        v
    }
}

/// Which residual block a [`ResNet`] stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResNetBlock {
    /// [`BasicBlock`]: two 3×3 convs, expansion 1 (ResNet-18/34).
    Basic,
    /// [`BottleneckBlock`]: 1×1, 3×3, 1×1 convs, expansion 4 (ResNet-50 and deeper, ResNeXt,
    /// Wide ResNet).
    Bottleneck,
}

impl ResNetBlock {
    /// Output channels per `planes`.
    pub fn expansion(self) -> usize {
        match self {
            ResNetBlock::Basic => 1,
            ResNetBlock::Bottleneck => BottleneckBlock::EXPANSION,
        }
    }
}

/// The architecture arguments of torchvision's `ResNet(block, layers, groups=1,
/// width_per_group=64, replace_stride_with_dilation=None)`; build with [`ResNetConfig::new`]
/// and the builder methods, then [`ResNet::from_config`] or [`ResNet::backbone`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResNetConfig {
    block: ResNetBlock,
    layers: [usize; 4],
    groups: usize,
    width_per_group: usize,
    replace_stride_with_dilation: [bool; 3],
}

impl ResNetConfig {
    /// `layers[i]` blocks of kind `block` in stage `i`, one group, width 64 per group, no
    /// dilation.
    pub fn new(block: ResNetBlock, layers: [usize; 4]) -> ResNetConfig {
        ResNetConfig {
            block,
            layers,
            groups: 1,
            width_per_group: 64,
            replace_stride_with_dilation: [false; 3],
        }
    }

    /// Groups of the 3×3 convs (ResNeXt's cardinality; bottleneck blocks only).
    pub fn groups(mut self, groups: usize) -> ResNetConfig {
        self.groups = groups;
        self
    }

    /// Channels per group of the bottleneck 3×3 convs at `planes = 64` (64 is ResNet, 128 is
    /// Wide ResNet-2; bottleneck blocks only).
    pub fn width_per_group(mut self, width_per_group: usize) -> ResNetConfig {
        self.width_per_group = width_per_group;
        self
    }

    /// For `layer2`..`layer4`: replace the stage's stride 2 by dilation (output stride 8 or
    /// 16, as segmentation backbones; bottleneck blocks only).
    pub fn replace_stride_with_dilation(mut self, replace: [bool; 3]) -> ResNetConfig {
        self.replace_stride_with_dilation = replace;
        self
    }

    /// Channels out of `layer4`: `512 · expansion`.
    pub fn out_channels(&self) -> usize {
        512 * self.block.expansion()
    }

    fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(Error::invalid("ResNet", msg));
        if self.layers.contains(&0) {
            return fail(format!("every stage needs ≥ 1 block, got {:?}", self.layers));
        }
        if self.groups == 0 || self.width_per_group == 0 {
            return fail(format!(
                "groups ({}) and width_per_group ({}) must be ≥ 1",
                self.groups, self.width_per_group
            ));
        }
        if self.block == ResNetBlock::Basic {
            if self.groups != 1 || self.width_per_group != 64 {
                return fail("basic blocks only support groups = 1 and width_per_group = 64".into());
            }
            if self.replace_stride_with_dilation.contains(&true) {
                return fail("basic blocks do not support dilation".into());
            }
        }
        Ok(())
    }
}

/// A ResNet: stem (7×7 conv, batch norm, relu, 3×3 max-pool), four stages, global average
/// pooling and a linear classifier (absent in a [`ResNet::backbone`]).
pub struct ResNet {
    conv1: Conv2D,
    bn1: BatchNorm2D,
    maxpool: MaxPool2D,
    layers: Vec<Sequential>,
    avgpool: AdaptiveAvgPool2D,
    fc: Option<Linear>,
}

impl ResNet {
    /// `blocks[i]` basic blocks in stage `i` (64, 128, 256, 512 channels) and `num_classes`
    /// outputs.
    pub fn new(blocks: [usize; 4], num_classes: usize) -> Result<ResNet> {
        ResNet::from_config(&ResNetConfig::new(ResNetBlock::Basic, blocks), num_classes)
    }

    /// The network `config` describes, with `num_classes` outputs.
    pub fn from_config(config: &ResNetConfig, num_classes: usize) -> Result<ResNet> {
        if num_classes == 0 {
            return Err(Error::invalid("ResNet", "num_classes must be positive"));
        }
        let mut net = ResNet::backbone(config)?;
        net.fc = Some(Linear::new(config.out_channels(), num_classes)?);
        Ok(net)
    }

    /// The network without average pooling and classifier (torchvision's
    /// `IntermediateLayerGetter` over `layer4`, as detection and segmentation models use it):
    /// parameters `conv1`, `bn1`, `layer1`..`layer4`; `forward` is [`ResNet::features`].
    pub fn backbone(config: &ResNetConfig) -> Result<ResNet> {
        config.validate()?;
        let expansion = config.block.expansion();
        let mut layers = Vec::with_capacity(4);
        let mut inplanes = 64;
        let mut dilation = 1;
        for (stage, &n) in config.layers.iter().enumerate() {
            let planes = 64 << stage;
            let mut stride = if stage == 0 { 1 } else { 2 };
            let previous_dilation = dilation;
            if stage > 0 && config.replace_stride_with_dilation[stage - 1] {
                dilation *= stride;
                stride = 1;
            }
            let mut seq = Sequential::new();
            for b in 0..n {
                let (s, d) = if b == 0 {
                    (stride, previous_dilation)
                } else {
                    (1, dilation)
                };
                seq = match config.block {
                    ResNetBlock::Basic => seq.add(BasicBlock::new(inplanes, planes, s)?),
                    ResNetBlock::Bottleneck => seq.add(BottleneckBlock::new(
                        inplanes,
                        planes,
                        s,
                        config.groups,
                        config.width_per_group,
                        d,
                    )?),
                };
                inplanes = planes * expansion;
            }
            layers.push(seq);
        }
        Ok(ResNet {
            conv1: Conv2D::new(3, 64, 7)?.stride(2).padding(3).bias(false),
            bn1: BatchNorm2D::new(64)?,
            maxpool: MaxPool2D::new(3).stride(2).padding(1),
            layers,
            avgpool: AdaptiveAvgPool2D::new(1),
            fc: None,
        })
    }

    /// Conv, batch norm, relu, max-pool: `[N, 64, H/4, W/4]`.
    fn stem(&self, x: &Tensor) -> Result<Tensor> {
        self.maxpool
            .forward(&F::relu(&self.bn1.forward(&self.conv1.forward(x)?)?)?)
    }

    /// The outputs of `layer1`..`layer4` for images `x[N, 3, H, W]`.
    pub fn stage_features(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let mut h = self.stem(x)?;
        let mut out = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            h = l.forward(&h)?;
            out.push(h.clone());
        }
        Ok(out)
    }

    /// The output of `layer4`: `[N, 512 · expansion, H/32, W/32]` (H/16 or H/8 with
    /// dilated stages).
    pub fn features(&self, x: &Tensor) -> Result<Tensor> {
        self.layers.iter().try_fold(self.stem(x)?, |h, l| l.forward(&h))
    }
}

impl Layer for ResNet {
    /// Logits `[N, num_classes]`, or a backbone's `layer4` features.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.features(x)?;
        match &self.fc {
            Some(fc) => fc.forward(&self.avgpool.forward(&h)?.flatten(1, -1)?),
            None => Ok(h),
        }
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![("conv1".into(), &self.conv1), ("bn1".into(), &self.bn1)];
        for (i, l) in self.layers.iter().enumerate() {
            v.push((format!("layer{}", i + 1), l));
        }
        if let Some(fc) = &self.fc {
            v.push(("fc".into(), fc));
        }
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> =
            vec![("conv1".into(), &mut self.conv1), ("bn1".into(), &mut self.bn1)];
        for (i, l) in self.layers.iter_mut().enumerate() {
            v.push((format!("layer{}", i + 1), l));
        }
        if let Some(fc) = &mut self.fc {
            v.push(("fc".into(), fc));
        }
        v
    }
}

/// ResNet-18 (`torchvision.models.resnet18`): basic blocks `[2, 2, 2, 2]`.
pub fn resnet18(num_classes: usize) -> Result<ResNet> {
    ResNet::new([2, 2, 2, 2], num_classes)
}

/// ResNet-34 (`torchvision.models.resnet34`): basic blocks `[3, 4, 6, 3]`.
pub fn resnet34(num_classes: usize) -> Result<ResNet> {
    ResNet::new([3, 4, 6, 3], num_classes)
}

/// ResNet-50 (`torchvision.models.resnet50`): bottleneck blocks `[3, 4, 6, 3]`.
pub fn resnet50(num_classes: usize) -> Result<ResNet> {
    ResNet::from_config(&ResNetConfig::new(ResNetBlock::Bottleneck, [3, 4, 6, 3]), num_classes)
}

/// ResNet-101 (`torchvision.models.resnet101`): bottleneck blocks `[3, 4, 23, 3]`.
pub fn resnet101(num_classes: usize) -> Result<ResNet> {
    ResNet::from_config(&ResNetConfig::new(ResNetBlock::Bottleneck, [3, 4, 23, 3]), num_classes)
}

/// ResNet-152 (`torchvision.models.resnet152`): bottleneck blocks `[3, 8, 36, 3]`.
pub fn resnet152(num_classes: usize) -> Result<ResNet> {
    ResNet::from_config(&ResNetConfig::new(ResNetBlock::Bottleneck, [3, 8, 36, 3]), num_classes)
}

/// ResNeXt-50 32×4d (`torchvision.models.resnext50_32x4d`): ResNet-50 with 32 groups of 4
/// channels.
pub fn resnext50_32x4d(num_classes: usize) -> Result<ResNet> {
    let config = ResNetConfig::new(ResNetBlock::Bottleneck, [3, 4, 6, 3])
        .groups(32)
        .width_per_group(4);
    ResNet::from_config(&config, num_classes)
}

/// ResNeXt-101 32×8d (`torchvision.models.resnext101_32x8d`).
pub fn resnext101_32x8d(num_classes: usize) -> Result<ResNet> {
    let config = ResNetConfig::new(ResNetBlock::Bottleneck, [3, 4, 23, 3])
        .groups(32)
        .width_per_group(8);
    ResNet::from_config(&config, num_classes)
}

/// ResNeXt-101 64×4d (`torchvision.models.resnext101_64x4d`).
pub fn resnext101_64x4d(num_classes: usize) -> Result<ResNet> {
    let config = ResNetConfig::new(ResNetBlock::Bottleneck, [3, 4, 23, 3])
        .groups(64)
        .width_per_group(4);
    ResNet::from_config(&config, num_classes)
}

/// Wide ResNet-50-2 (`torchvision.models.wide_resnet50_2`): ResNet-50 with bottleneck 3×3
/// convs twice as wide.
pub fn wide_resnet50_2(num_classes: usize) -> Result<ResNet> {
    let config = ResNetConfig::new(ResNetBlock::Bottleneck, [3, 4, 6, 3]).width_per_group(128);
    ResNet::from_config(&config, num_classes)
}

/// Wide ResNet-101-2 (`torchvision.models.wide_resnet101_2`).
pub fn wide_resnet101_2(num_classes: usize) -> Result<ResNet> {
    let config = ResNetConfig::new(ResNetBlock::Bottleneck, [3, 4, 23, 3]).width_per_group(128);
    ResNet::from_config(&config, num_classes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::DType;

    /// The checks on resnet50: torchvision's state-dict names and shapes, logits and features.
    fn check_resnet50(net: &ResNet) {
        let state = net.state_dict();
        // 53 convs, 53 batch norms (weight, bias, _mean, _variance), fc weight and bias.
        assert_eq!(state.len(), 53 + 53 * 4 + 2);
        for key in [
            "conv1.weight",
            "bn1._mean",
            "layer1.0.conv3.weight",
            "layer1.0.downsample.0.weight",
            "layer1.0.downsample.1._variance",
            "layer3.5.bn2.bias",
            "layer4.2.bn3.weight",
            "fc.weight",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert_eq!(state["fc.weight"].shape(), [2048, 1000]);
        let x = crate::tensor::randn(&[1, 3, 64, 64], DType::F32).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [1, 1000]);
        assert_eq!(net.features(&x).unwrap().shape(), [1, 2048, 2, 2]);
    }

    #[test]
    fn parameter_counts_and_names_match_torchvision() {
        // sum(p.numel() for p in torchvision.models.<name>(weights=None).parameters()),
        // torchvision 0.29, 1000 classes.
        let cases = [
            ("resnet18", resnet18 as fn(usize) -> Result<ResNet>, 11_689_512),
            ("resnet34", resnet34, 21_797_672),
            ("resnet50", resnet50, 25_557_032),
            ("resnet101", resnet101, 44_549_160),
            ("resnet152", resnet152, 60_192_808),
            ("resnext50_32x4d", resnext50_32x4d, 25_028_904),
            ("resnext101_32x8d", resnext101_32x8d, 88_791_336),
            ("resnext101_64x4d", resnext101_64x4d, 83_455_272),
            ("wide_resnet50_2", wide_resnet50_2, 68_883_240),
            ("wide_resnet101_2", wide_resnet101_2, 126_886_696),
        ];
        for (name, build, want) in cases {
            let net = build(1000).unwrap();
            let n: usize = net.parameters().iter().map(|p| p.numel()).sum();
            assert_eq!(n, want, "{name}");
            match name {
                "resnet50" => check_resnet50(&net),
                // ResNeXt's grouped 3×3 conv: 128 channels in 32 groups.
                "resnext50_32x4d" => assert_eq!(net.state_dict()["layer1.0.conv2.weight"].shape(), [128, 4, 3, 3]),
                _ => {}
            }
        }
    }

    #[test]
    fn dilated_backbone_keeps_output_stride_8() {
        let x = crate::tensor::randn(&[1, 3, 64, 64], DType::F32).unwrap();
        let config =
            ResNetConfig::new(ResNetBlock::Bottleneck, [1, 1, 1, 1]).replace_stride_with_dilation([false, true, true]);
        let backbone = ResNet::backbone(&config).unwrap();
        let stages = backbone.stage_features(&x).unwrap();
        let shapes: Vec<Vec<usize>> = stages.iter().map(|t| t.shape()).collect();
        assert_eq!(
            shapes,
            [
                vec![1, 256, 16, 16],
                vec![1, 512, 8, 8],
                vec![1, 1024, 8, 8],
                vec![1, 2048, 8, 8]
            ]
        );
        assert_eq!(backbone.forward(&x).unwrap().shape(), [1, 2048, 8, 8]);
        assert!(!backbone.state_dict().keys().any(|k| k.starts_with("fc")));
        let net = ResNet::new([1, 1, 1, 1], 4).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [1, 4]);
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(resnet50(0).is_err());
        assert!(ResNet::new([2, 0, 2, 2], 10).is_err());
        let basic = ResNetConfig::new(ResNetBlock::Basic, [2, 2, 2, 2]);
        assert!(ResNet::from_config(&basic.clone().groups(32), 10).is_err());
        assert!(ResNet::from_config(&basic.replace_stride_with_dilation([false, false, true]), 10).is_err());
        let bottleneck = ResNetConfig::new(ResNetBlock::Bottleneck, [1, 1, 1, 1]);
        assert!(ResNet::from_config(&bottleneck.clone().groups(0), 10).is_err());
        assert!(ResNet::from_config(&bottleneck.width_per_group(0), 10).is_err());
        assert!(BottleneckBlock::new(64, 64, 1, 1, 64, 0).is_err());
    }
}
