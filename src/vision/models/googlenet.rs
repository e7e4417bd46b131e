//! GoogLeNet (Inception v1, Szegedy et al. 2015) laid out as torchvision's
//! `torchvision.models.googlenet` (module names, channel table, ceil-mode pooling, the 3×3
//! "5×5" branch of torchvision's port, optional auxiliary classifiers), so a torchvision
//! state dict maps onto it by name (batch-norm `running_mean`/`running_var` are
//! `_mean`/`_variance`; linear weights are stored `[in, out]`, the transpose of PyTorch's).
//!
//! Also the pieces the Inception v3 port shares: `BasicConv2d` and `transform_input`.

use crate::error::{Error, Result};
use crate::nn::functional::{self as F, Pad2d, Pair};
use crate::nn::{BatchNorm2D, Conv2D, Dropout, Layer, Linear, MaxPool2D, Sequential};
use crate::tensor::{Tensor, concat};

/// Implements `sublayers` and `sublayers_mut` from a list of fields, each named after itself or
/// `as "Name"`; after `; optional`, `Option` fields listed the same way, named when present.
macro_rules! sublayers {
    (
        $($field:ident $(as $name:literal)?),* $(,)?
        $(; optional $($opt:ident $(as $opt_name:literal)?),* $(,)?)?
    ) => {
        fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
            #[allow(unused_mut)]
            let mut v: Vec<(String, &dyn Layer)> =
                vec![$((sublayers!(@name $field $($name)?), &self.$field as &dyn Layer)),*];
            $($(if let Some(l) = &self.$opt {
                v.push((sublayers!(@name $opt $($opt_name)?), l));
            })*)?
            v
        }

        fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
            #[allow(unused_mut)]
            let mut v: Vec<(String, &mut dyn Layer)> =
                vec![$((sublayers!(@name $field $($name)?), &mut self.$field as &mut dyn Layer)),*];
            $($(if let Some(l) = &mut self.$opt {
                v.push((sublayers!(@name $opt $($opt_name)?), l));
            })*)?
            v
        }
    };
    (@name $field:ident) => {
        stringify!($field).to_string()
    };
    (@name $field:ident $name:literal) => {
        $name.to_string()
    };
}
pub(super) use sublayers;

/// torchvision's `BasicConv2d`: conv (no bias), batch norm (ε = 0.001), ReLU; parameters
/// `conv.weight`, `bn.{weight, bias, _mean, _variance}`.
pub(super) struct BasicConv2d {
    conv: Conv2D,
    bn: BatchNorm2D,
}

impl BasicConv2d {
    /// From `inp` to `out` channels with `kernel` (`3` or `[1, 7]`), stride 1, no padding.
    pub(super) fn new(inp: usize, out: usize, kernel: impl Into<Pair>) -> Result<BasicConv2d> {
        Ok(BasicConv2d {
            conv: Conv2D::new(inp, out, kernel)?.bias(false),
            bn: BatchNorm2D::new(out)?.epsilon(1e-3)?,
        })
    }

    /// The convolution's stride.
    pub(super) fn stride(mut self, s: impl Into<Pair>) -> BasicConv2d {
        self.conv = self.conv.stride(s);
        self
    }

    /// The convolution's zero padding (`1`, `[ph, pw]`).
    pub(super) fn padding(mut self, p: impl Into<Pad2d>) -> BasicConv2d {
        self.conv = self.conv.padding(p);
        self
    }
}

impl Layer for BasicConv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::relu(&self.bn.forward(&self.conv.forward(x)?)?)
    }

    sublayers!(conv, bn);
}

/// torchvision's `transform_input`: map images normalized with the ImageNet mean and std to
/// the `(x − 0.5) / 0.5` normalization the original weights expect, channel by channel.
pub(super) fn transform_input(x: &Tensor) -> Result<Tensor> {
    const MEAN_STD: [(f64, f64); 3] = [(0.485, 0.229), (0.456, 0.224), (0.406, 0.225)];
    if x.ndim() != 4 || x.shape()[1] != 3 {
        return Err(Error::invalid(
            "transform_input",
            format!("expects RGB images [N, 3, H, W], got {}", x.tensor_type()),
        ));
    }
    let channels = MEAN_STD
        .iter()
        .zip(0i64..)
        .map(|(&(mean, std), c)| x.slice(1, c, c + 1, 1)?.scale(std / 0.5, (mean - 0.5) / 0.5))
        .collect::<Result<Vec<_>>>()?;
    concat(&channels.iter().collect::<Vec<_>>(), 1)
}

/// An Inception block: four branches (1×1; 1×1 → 3×3; 1×1 → 3×3; 3×3 max-pool → 1×1)
/// concatenated along channels. torchvision's third branch uses a 3×3 conv where the paper
/// has 5×5; its weights need it, so it is kept.
struct Inception {
    branch1: BasicConv2d,
    branch2: Sequential,
    branch3: Sequential,
    branch4: Sequential,
}

impl Inception {
    /// torchvision's `Inception(in_channels, ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj)`.
    fn new(inp: usize, [c1, c3r, c3, c5r, c5, pool]: [usize; 6]) -> Result<Inception> {
        Ok(Inception {
            branch1: BasicConv2d::new(inp, c1, 1)?,
            branch2: Sequential::new()
                .add(BasicConv2d::new(inp, c3r, 1)?)
                .add(BasicConv2d::new(c3r, c3, 3)?.padding(1)),
            branch3: Sequential::new()
                .add(BasicConv2d::new(inp, c5r, 1)?)
                .add(BasicConv2d::new(c5r, c5, 3)?.padding(1)),
            branch4: Sequential::new()
                .add(MaxPool2D::new(3).stride(1).padding(1).ceil_mode(true))
                .add(BasicConv2d::new(inp, pool, 1)?),
        })
    }
}

impl Layer for Inception {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = [
            self.branch1.forward(x)?,
            self.branch2.forward(x)?,
            self.branch3.forward(x)?,
            self.branch4.forward(x)?,
        ];
        concat(&b.iter().collect::<Vec<_>>(), 1)
    }

    sublayers!(branch1, branch2, branch3, branch4);
}

/// An auxiliary classifier: adaptive average pooling to 4×4, 1×1 conv to 128 channels,
/// linear 2048 → 1024, ReLU, dropout 0.7, linear 1024 → classes.
struct InceptionAux {
    conv: BasicConv2d,
    fc1: Linear,
    fc2: Linear,
    dropout: Dropout,
}

impl InceptionAux {
    fn new(inp: usize, num_classes: usize) -> Result<InceptionAux> {
        Ok(InceptionAux {
            conv: BasicConv2d::new(inp, 128, 1)?,
            fc1: Linear::new(2048, 1024)?,
            fc2: Linear::new(1024, num_classes)?,
            dropout: Dropout::new(0.7)?,
        })
    }
}

impl Layer for InceptionAux {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.conv.forward(&F::adaptive_avg_pool2d(x, 4)?)?.flatten(1, -1)?;
        let h = F::relu(&self.fc1.forward(&h)?)?;
        self.fc2.forward(&self.dropout.forward(&h)?)
    }

    sublayers!(conv, fc1, fc2, dropout);
}

/// The inception blocks after the stem: `(name, in_channels, [ch1x1, ch3x3red, ch3x3,
/// ch5x5red, ch5x5, pool_proj])`, torchvision's table.
const BLOCKS: [(&str, usize, [usize; 6]); 9] = [
    ("inception3a", 192, [64, 96, 128, 16, 32, 32]),
    ("inception3b", 256, [128, 128, 192, 32, 96, 64]),
    ("inception4a", 480, [192, 96, 208, 16, 48, 64]),
    ("inception4b", 512, [160, 112, 224, 24, 64, 64]),
    ("inception4c", 512, [128, 128, 256, 24, 64, 64]),
    ("inception4d", 512, [112, 144, 288, 32, 64, 64]),
    ("inception4e", 528, [256, 160, 320, 32, 128, 128]),
    ("inception5a", 832, [256, 160, 320, 32, 128, 128]),
    ("inception5b", 832, [384, 192, 384, 48, 128, 128]),
];

/// GoogLeNet: stem `conv1` (7×7/2), max-pool, `conv2` (1×1), `conv3` (3×3), max-pool;
/// inception blocks `inception3a`–`inception5b` with max-pools after 3b and 4e (ceil mode,
/// stride 2, 3×3 except the last, 2×2); global average pooling, dropout 0.2 and `fc`. With
/// `aux_logits`, `aux1` (after 4a) and `aux2` (after 4d) are auxiliary classifiers, run in
/// training by [`GoogLeNet::forward_with_aux`]; `forward` returns the main logits only.
pub struct GoogLeNet {
    transform_input: bool,
    training: bool,
    conv1: BasicConv2d,
    conv2: BasicConv2d,
    conv3: BasicConv2d,
    blocks: Vec<Inception>,
    aux1: Option<InceptionAux>,
    aux2: Option<InceptionAux>,
    dropout: Dropout,
    fc: Linear,
}

impl GoogLeNet {
    /// GoogLeNet with `num_classes` outputs, with or without the auxiliary classifiers
    /// (torchvision's `aux_logits`), `transform_input` off.
    pub fn new(num_classes: usize, aux_logits: bool) -> Result<GoogLeNet> {
        if num_classes == 0 {
            return Err(Error::invalid("GoogLeNet", "num_classes must be positive"));
        }
        let aux = |inp| {
            if aux_logits {
                InceptionAux::new(inp, num_classes).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(GoogLeNet {
            transform_input: false,
            training: true,
            conv1: BasicConv2d::new(3, 64, 7)?.stride(2).padding(3),
            conv2: BasicConv2d::new(64, 64, 1)?,
            conv3: BasicConv2d::new(64, 192, 3)?.padding(1),
            blocks: BLOCKS
                .iter()
                .map(|&(_, inp, c)| Inception::new(inp, c))
                .collect::<Result<_>>()?,
            aux1: aux(512)?,
            aux2: aux(528)?,
            dropout: Dropout::new(0.2)?,
            fc: Linear::new(1024, num_classes)?,
        })
    }

    /// Apply torchvision's `transform_input` first (on for its ImageNet weights): re-normalize
    /// ImageNet-normalized RGB input to `(x − 0.5) / 0.5`.
    pub fn transform_input(mut self, on: bool) -> GoogLeNet {
        self.transform_input = on;
        self
    }

    /// The main logits and, in training with `aux_logits`, the auxiliary logits
    /// `(logits, aux2, aux1)` (torchvision's `GoogLeNetOutputs` order); the auxiliary ones are
    /// `None` otherwise.
    pub fn forward_with_aux(&self, x: &Tensor) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
        self.run(x, self.training)
    }

    fn run(&self, x: &Tensor, with_aux: bool) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
        let pool = |x: &Tensor, k: usize| F::max_pool2d(x, k, Some(Pair([2, 2])), 0, true);
        let aux = |a: &Option<InceptionAux>, h: &Tensor| match a {
            Some(a) if with_aux => a.forward(h).map(Some),
            _ => Ok(None),
        };
        let mut h = if self.transform_input {
            transform_input(x)?
        } else {
            x.clone()
        };
        h = pool(&self.conv1.forward(&h)?, 3)?;
        h = pool(&self.conv3.forward(&self.conv2.forward(&h)?)?, 3)?;
        let (mut aux1, mut aux2) = (None, None);
        for ((name, _, _), block) in BLOCKS.iter().zip(&self.blocks) {
            h = block.forward(&h)?;
            match *name {
                "inception3b" => h = pool(&h, 3)?,
                "inception4a" => aux1 = aux(&self.aux1, &h)?,
                "inception4d" => aux2 = aux(&self.aux2, &h)?,
                "inception4e" => h = pool(&h, 2)?,
                _ => {}
            }
        }
        let h = F::adaptive_avg_pool2d(&h, 1)?.flatten(1, -1)?;
        Ok((self.fc.forward(&self.dropout.forward(&h)?)?, aux2, aux1))
    }
}

impl Layer for GoogLeNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.run(x, false)?.0)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![
            ("conv1".into(), &self.conv1),
            ("conv2".into(), &self.conv2),
            ("conv3".into(), &self.conv3),
        ];
        v.extend(
            BLOCKS
                .iter()
                .zip(&self.blocks)
                .map(|((n, _, _), b)| (n.to_string(), b as &dyn Layer)),
        );
        v.extend(self.aux1.iter().map(|a| ("aux1".to_string(), a as &dyn Layer)));
        v.extend(self.aux2.iter().map(|a| ("aux2".to_string(), a as &dyn Layer)));
        v.push(("dropout".into(), &self.dropout));
        v.push(("fc".into(), &self.fc));
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![
            ("conv1".into(), &mut self.conv1),
            ("conv2".into(), &mut self.conv2),
            ("conv3".into(), &mut self.conv3),
        ];
        v.extend(
            BLOCKS
                .iter()
                .zip(&mut self.blocks)
                .map(|((n, _, _), b)| (n.to_string(), b as &mut dyn Layer)),
        );
        v.extend(self.aux1.iter_mut().map(|a| ("aux1".to_string(), a as &mut dyn Layer)));
        v.extend(self.aux2.iter_mut().map(|a| ("aux2".to_string(), a as &mut dyn Layer)));
        v.push(("dropout".into(), &mut self.dropout));
        v.push(("fc".into(), &mut self.fc));
        v
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// GoogLeNet with `num_classes` outputs and optional auxiliary classifiers (torchvision's
/// `googlenet(weights=None, aux_logits=..., init_weights=True)`, up to initialization).
pub fn googlenet(num_classes: usize, aux_logits: bool) -> Result<GoogLeNet> {
    GoogLeNet::new(num_classes, aux_logits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_and_names_match_torchvision() {
        // torchvision.models.googlenet(weights=None, aux_logits=False / True, init_weights=True).
        for (aux, count) in [(false, 6_624_904), (true, 13_004_888)] {
            let net = googlenet(1000, aux).unwrap();
            let n: usize = net.parameters().iter().map(|p| p.numel()).sum();
            assert_eq!(n, count, "aux_logits={aux}");
        }
        let net = googlenet(1000, true).unwrap();
        let state = net.state_dict();
        for key in [
            "conv1.conv.weight",
            "conv1.bn._variance",
            "inception3a.branch1.conv.weight",
            "inception3a.branch3.1.conv.weight",
            "inception4e.branch4.1.bn.bias",
            "inception5b.branch2.0.bn._mean",
            "aux1.conv.conv.weight",
            "aux2.fc2.bias",
            "fc.weight",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert_eq!(state["inception3a.branch3.1.conv.weight"].shape(), [32, 16, 3, 3]);
        assert_eq!(state["fc.weight"].shape(), [1024, 1000]);
        // As torchvision's state dict less `num_batches_tracked`: 287, and 9 per auxiliary head.
        assert_eq!(state.len(), 287 + 2 * 9);
    }

    #[test]
    fn forward_shapes_and_aux_outputs() {
        let mut net = googlenet(5, true).unwrap();
        // ceil-mode pools take 32×32 down to 1×1: 16, 8, 4, 2, 1.
        let x = crate::tensor::randn(&[2, 3, 32, 32], oar_ir::DType::F32).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [2, 5]);
        let (logits, aux2, aux1) = net.forward_with_aux(&x).unwrap();
        assert_eq!(logits.shape(), [2, 5]);
        assert_eq!(aux1.unwrap().shape(), [2, 5]);
        assert_eq!(aux2.unwrap().shape(), [2, 5]);
        net.eval();
        let (_, aux2, aux1) = net.forward_with_aux(&x).unwrap();
        assert!(aux1.is_none() && aux2.is_none());
        let net = googlenet(5, false).unwrap().transform_input(true);
        assert_eq!(net.forward(&x).unwrap().shape(), [2, 5]);
        assert!(googlenet(0, false).is_err());
        assert!(
            net.forward(&crate::tensor::randn(&[1, 1, 32, 32], oar_ir::DType::F32).unwrap())
                .is_err()
        );
    }
}
