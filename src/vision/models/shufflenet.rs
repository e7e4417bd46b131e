//! ShuffleNet V2 (Ma et al. 2018) laid out as torchvision's `torchvision.models.shufflenet_v2_*`
//! (`conv1`, `stage2`–`stage4` of units with `branch1`/`branch2`, `conv5`, `fc`), so a
//! torchvision state dict maps onto it by name (batch-norm `running_mean`/`running_var` are
//! `_mean`/`_variance`; linear weights are stored `[in, out]`, the transpose of PyTorch's).

use crate::error::{Error, Result};
use crate::nn::{BatchNorm2D, Conv2D, Layer, Linear, MaxPool2D, ReLU, Sequential};
use crate::tensor::{Tensor, concat};
use oar_ir::Dim;

/// Interleave the channels of `x [N, C, H, W]` across `groups` groups: view as
/// `[N, groups, C/groups, H, W]`, swap axes 1 and 2, flatten back.
fn channel_shuffle(x: &Tensor, groups: usize) -> Result<Tensor> {
    let dims = x.dims();
    let (Some(channels), 4) = (dims.get(1).and_then(Dim::as_static), dims.len()) else {
        return Err(Error::invalid(
            "channel_shuffle",
            format!("expects [N, C, H, W] with a known C, got {}", x.tensor_type()),
        ));
    };
    let split = [
        dims[0].clone(),
        Dim::Static(groups),
        Dim::Static(channels / groups),
        dims[2].clone(),
        dims[3].clone(),
    ];
    x.reshape_dims(&split)?.transpose(&[0, 2, 1, 3, 4])?.reshape_dims(&dims)
}

/// A 3×3 depthwise conv (no bias) with `stride` and padding 1.
fn depthwise(channels: usize, stride: usize) -> Result<Conv2D> {
    Ok(Conv2D::new(channels, channels, 3)?
        .stride(stride)
        .padding(1)
        .groups(channels)?
        .bias(false))
}

/// A 1×1 conv (no bias).
fn pointwise(inp: usize, out: usize) -> Result<Conv2D> {
    Ok(Conv2D::new(inp, out, 1)?.bias(false))
}

/// A ShuffleNet V2 unit (torchvision's `InvertedResidual`). Stride 1: the channels are split
/// in half, the second half goes through `branch2` (1×1, depthwise 3×3, 1×1). Stride 2: the
/// whole input goes through `branch1` (depthwise 3×3/2, 1×1) and `branch2`. The halves are
/// concatenated and shuffled.
struct ShuffleUnit {
    branch1: Option<Sequential>,
    branch2: Sequential,
    branch_features: usize,
}

impl ShuffleUnit {
    fn new(inp: usize, oup: usize, stride: usize) -> Result<ShuffleUnit> {
        let bf = oup / 2;
        if !(1..=3).contains(&stride) || (stride == 1 && inp != 2 * bf) {
            return Err(Error::invalid(
                "ShuffleNetV2",
                format!("a unit of stride {stride} cannot map {inp} to {oup} channels"),
            ));
        }
        let branch1 = if stride > 1 {
            Some(
                Sequential::new()
                    .add(depthwise(inp, stride)?)
                    .add(BatchNorm2D::new(inp)?)
                    .add(pointwise(inp, bf)?)
                    .add(BatchNorm2D::new(bf)?)
                    .add(ReLU),
            )
        } else {
            None
        };
        let branch2 = Sequential::new()
            .add(pointwise(if stride > 1 { inp } else { bf }, bf)?)
            .add(BatchNorm2D::new(bf)?)
            .add(ReLU)
            .add(depthwise(bf, stride)?)
            .add(BatchNorm2D::new(bf)?)
            .add(pointwise(bf, bf)?)
            .add(BatchNorm2D::new(bf)?)
            .add(ReLU);
        Ok(ShuffleUnit {
            branch1,
            branch2,
            branch_features: bf,
        })
    }
}

impl Layer for ShuffleUnit {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = match &self.branch1 {
            Some(b1) => concat(&[&b1.forward(x)?, &self.branch2.forward(x)?], 1)?,
            None => {
                let bf = self.branch_features as i64;
                let x2 = self.branch2.forward(&x.slice(1, bf, 2 * bf, 1)?)?;
                concat(&[&x.slice(1, 0, bf, 1)?, &x2], 1)?
            }
        };
        channel_shuffle(&out, 2)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = Vec::new();
        if let Some(b) = &self.branch1 {
            v.push(("branch1".into(), b));
        }
        v.push(("branch2".into(), &self.branch2));
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = Vec::new();
        if let Some(b) = &mut self.branch1 {
            v.push(("branch1".into(), b));
        }
        v.push(("branch2".into(), &mut self.branch2));
        v
    }
}

/// ShuffleNet V2: `conv1` (3×3/2 conv, batch norm, ReLU), 3×3/2 max-pool, `stage2`–`stage4`
/// (a stride-2 unit then stride-1 units), `conv5` (1×1 conv, batch norm, ReLU), global average
/// pooling and `fc`.
pub struct ShuffleNetV2 {
    conv1: Sequential,
    maxpool: MaxPool2D,
    stages: Vec<Sequential>,
    conv5: Sequential,
    fc: Linear,
}

/// Conv (no bias), batch norm, ReLU.
fn conv_bn_relu(conv: Conv2D, out: usize) -> Result<Sequential> {
    Ok(Sequential::new().add(conv).add(BatchNorm2D::new(out)?).add(ReLU))
}

impl ShuffleNetV2 {
    /// torchvision's `ShuffleNetV2(stages_repeats, stages_out_channels, num_classes)`: units
    /// per stage and the output channels of `conv1`, the three stages and `conv5`.
    pub fn new(
        stages_repeats: [usize; 3],
        stages_out_channels: [usize; 5],
        num_classes: usize,
    ) -> Result<ShuffleNetV2> {
        if num_classes == 0 || stages_repeats.contains(&0) || stages_out_channels.contains(&0) {
            return Err(Error::invalid(
                "ShuffleNetV2",
                format!(
                    "num_classes ({num_classes}), stage repeats {stages_repeats:?} and channels \
                     {stages_out_channels:?} must be positive"
                ),
            ));
        }
        let [c1, s2, s3, s4, c5] = stages_out_channels;
        let mut input = c1;
        let mut stages = Vec::with_capacity(3);
        for (repeats, out) in stages_repeats.into_iter().zip([s2, s3, s4]) {
            let mut stage = Sequential::new().add(ShuffleUnit::new(input, out, 2)?);
            for _ in 1..repeats {
                stage = stage.add(ShuffleUnit::new(out, out, 1)?);
            }
            stages.push(stage);
            input = out;
        }
        Ok(ShuffleNetV2 {
            conv1: conv_bn_relu(Conv2D::new(3, c1, 3)?.stride(2).padding(1).bias(false), c1)?,
            maxpool: MaxPool2D::new(3).stride(2).padding(1),
            stages,
            conv5: conv_bn_relu(pointwise(input, c5)?, c5)?,
            fc: Linear::new(c5, num_classes)?,
        })
    }
}

impl Layer for ShuffleNetV2 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.maxpool.forward(&self.conv1.forward(x)?)?;
        for s in &self.stages {
            h = s.forward(&h)?;
        }
        self.fc.forward(&self.conv5.forward(&h)?.mean(&[2, 3], false)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![("conv1".into(), &self.conv1)];
        for (i, s) in self.stages.iter().enumerate() {
            v.push((format!("stage{}", i + 2), s));
        }
        v.push(("conv5".into(), &self.conv5));
        v.push(("fc".into(), &self.fc));
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![("conv1".into(), &mut self.conv1)];
        for (i, s) in self.stages.iter_mut().enumerate() {
            v.push((format!("stage{}", i + 2), s));
        }
        v.push(("conv5".into(), &mut self.conv5));
        v.push(("fc".into(), &mut self.fc));
        v
    }
}

/// torchvision's stage repeats, shared by every width.
const REPEATS: [usize; 3] = [4, 8, 4];

/// ShuffleNet V2 0.5× (torchvision's `shufflenet_v2_x0_5`).
pub fn shufflenet_v2_x0_5(num_classes: usize) -> Result<ShuffleNetV2> {
    ShuffleNetV2::new(REPEATS, [24, 48, 96, 192, 1024], num_classes)
}

/// ShuffleNet V2 1.0× (torchvision's `shufflenet_v2_x1_0`).
pub fn shufflenet_v2_x1_0(num_classes: usize) -> Result<ShuffleNetV2> {
    ShuffleNetV2::new(REPEATS, [24, 116, 232, 464, 1024], num_classes)
}

/// ShuffleNet V2 1.5× (torchvision's `shufflenet_v2_x1_5`).
pub fn shufflenet_v2_x1_5(num_classes: usize) -> Result<ShuffleNetV2> {
    ShuffleNetV2::new(REPEATS, [24, 176, 352, 704, 1024], num_classes)
}

/// ShuffleNet V2 2.0× (torchvision's `shufflenet_v2_x2_0`).
pub fn shufflenet_v2_x2_0(num_classes: usize) -> Result<ShuffleNetV2> {
    ShuffleNetV2::new(REPEATS, [24, 244, 488, 976, 2048], num_classes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::DType;

    #[test]
    fn parameter_counts_and_names_match_torchvision() {
        // torchvision.models.shufflenet_v2_x*_*() with 1000 classes.
        type Build = fn(usize) -> Result<ShuffleNetV2>;
        let builds: [(Build, usize); 4] = [
            (shufflenet_v2_x0_5, 1_366_792),
            (shufflenet_v2_x1_0, 2_278_604),
            (shufflenet_v2_x1_5, 3_503_624),
            (shufflenet_v2_x2_0, 7_393_996),
        ];
        for (build, count) in builds {
            let n: usize = build(1000).unwrap().parameters().iter().map(|p| p.numel()).sum();
            assert_eq!(n, count);
        }
        let state = shufflenet_v2_x1_0(1000).unwrap().state_dict();
        for key in [
            "conv1.0.weight",
            "conv1.1._mean",
            "stage2.0.branch1.0.weight",
            "stage2.0.branch1.3._variance",
            "stage2.1.branch2.5.weight",
            "stage4.3.branch2.6.bias",
            "conv5.1.weight",
            "fc.weight",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert!(!state.contains_key("stage2.1.branch1.0.weight"));
    }

    #[test]
    fn channel_shuffle_interleaves_the_halves() {
        let x = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[1, 6, 1, 1]).unwrap();
        let y = channel_shuffle(&x, 2).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn forward_shape() {
        let mut net = shufflenet_v2_x0_5(7).unwrap();
        let x = crate::tensor::randn(&[2, 3, 32, 32], DType::F32).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [2, 7]);
        // Traced with a symbolic batch, as eager.
        net.eval();
        let spec = crate::jit::InputSpec::new(&[None, Some(3), Some(32), Some(32)], DType::F32, "x");
        let traced = crate::jit::to_static_layer(&net, &spec).unwrap().call(&[&x]).unwrap();
        let eager = net.forward(&x).unwrap().to_vec::<f32>().unwrap();
        for (t, e) in traced[0].to_vec::<f32>().unwrap().iter().zip(eager) {
            assert!((t - e).abs() < 1e-4, "{t} vs {e}");
        }
        assert!(ShuffleNetV2::new([4, 0, 4], [24, 48, 96, 192, 1024], 10).is_err());
        assert!(ShuffleNetV2::new(REPEATS, [24, 47, 96, 192, 1024], 10).is_err());
    }
}
