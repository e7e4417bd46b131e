//! Inception v3 (Szegedy et al. 2016) laid out as torchvision's `torchvision.models.inception_v3`
//! (`Inception3`: module names `Conv2d_1a_3x3` … `Mixed_7c`, `AuxLogits`, `fc`; blocks
//! `InceptionA`–`InceptionE`; batch norm ε = 0.001), so a torchvision state dict maps onto it by
//! name (batch-norm `running_mean`/`running_var` are `_mean`/`_variance`; linear weights are
//! stored `[in, out]`, the transpose of PyTorch's). Inputs must be at least 75×75; 299×299 is
//! the standard size and the smallest the auxiliary classifier (run in training only) accepts.

use super::googlenet::{BasicConv2d, sublayers, transform_input};
use crate::error::{Error, Result};
use crate::nn::functional::{self as F, Pair};
use crate::nn::{Dropout, Layer, Linear};
use crate::tensor::{Tensor, concat};

/// `concat(xs, 1)`: the channel concatenation that ends every block.
fn cat(xs: &[Tensor]) -> Result<Tensor> {
    concat(&xs.iter().collect::<Vec<_>>(), 1)
}

/// 3×3 average pooling, stride 1, padding 1, counting the padding (PyTorch's
/// `count_include_pad=True`): the pool branch of blocks A, C and E.
fn avg_pool_3x3(x: &Tensor) -> Result<Tensor> {
    F::avg_pool2d(x, 3, Some(Pair([1, 1])), 1, false, false)
}

/// 3×3 max-pooling with stride 2.
fn max_pool_3x3_s2(x: &Tensor) -> Result<Tensor> {
    F::max_pool2d(x, 3, Some(Pair([2, 2])), 0, false)
}

/// Block A (35×35): 1×1; 1×1 → 5×5; 1×1 → 3×3 → 3×3; avg-pool → 1×1 (`pool_features`).
struct InceptionA {
    branch1x1: BasicConv2d,
    branch5x5_1: BasicConv2d,
    branch5x5_2: BasicConv2d,
    branch3x3dbl_1: BasicConv2d,
    branch3x3dbl_2: BasicConv2d,
    branch3x3dbl_3: BasicConv2d,
    branch_pool: BasicConv2d,
}

impl InceptionA {
    fn new(inp: usize, pool_features: usize) -> Result<InceptionA> {
        Ok(InceptionA {
            branch1x1: BasicConv2d::new(inp, 64, 1)?,
            branch5x5_1: BasicConv2d::new(inp, 48, 1)?,
            branch5x5_2: BasicConv2d::new(48, 64, 5)?.padding(2),
            branch3x3dbl_1: BasicConv2d::new(inp, 64, 1)?,
            branch3x3dbl_2: BasicConv2d::new(64, 96, 3)?.padding(1),
            branch3x3dbl_3: BasicConv2d::new(96, 96, 3)?.padding(1),
            branch_pool: BasicConv2d::new(inp, pool_features, 1)?,
        })
    }
}

impl Layer for InceptionA {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        cat(&[
            self.branch1x1.forward(x)?,
            self.branch5x5_2.forward(&self.branch5x5_1.forward(x)?)?,
            self.branch3x3dbl_3
                .forward(&self.branch3x3dbl_2.forward(&self.branch3x3dbl_1.forward(x)?)?)?,
            self.branch_pool.forward(&avg_pool_3x3(x)?)?,
        ])
    }

    sublayers!(
        branch1x1,
        branch5x5_1,
        branch5x5_2,
        branch3x3dbl_1,
        branch3x3dbl_2,
        branch3x3dbl_3,
        branch_pool
    );
}

/// Block B (35×35 → 17×17): 3×3/2; 1×1 → 3×3 → 3×3/2; max-pool 3×3/2.
struct InceptionB {
    branch3x3: BasicConv2d,
    branch3x3dbl_1: BasicConv2d,
    branch3x3dbl_2: BasicConv2d,
    branch3x3dbl_3: BasicConv2d,
}

impl InceptionB {
    fn new(inp: usize) -> Result<InceptionB> {
        Ok(InceptionB {
            branch3x3: BasicConv2d::new(inp, 384, 3)?.stride(2),
            branch3x3dbl_1: BasicConv2d::new(inp, 64, 1)?,
            branch3x3dbl_2: BasicConv2d::new(64, 96, 3)?.padding(1),
            branch3x3dbl_3: BasicConv2d::new(96, 96, 3)?.stride(2),
        })
    }
}

impl Layer for InceptionB {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        cat(&[
            self.branch3x3.forward(x)?,
            self.branch3x3dbl_3
                .forward(&self.branch3x3dbl_2.forward(&self.branch3x3dbl_1.forward(x)?)?)?,
            max_pool_3x3_s2(x)?,
        ])
    }

    sublayers!(branch3x3, branch3x3dbl_1, branch3x3dbl_2, branch3x3dbl_3);
}

/// Block C (17×17) with factorized 7×7 convolutions of `c7` channels: 1×1; 1×1 → 1×7 → 7×1;
/// 1×1 → 7×1 → 1×7 → 7×1 → 1×7; avg-pool → 1×1.
struct InceptionC {
    branch1x1: BasicConv2d,
    branch7x7_1: BasicConv2d,
    branch7x7_2: BasicConv2d,
    branch7x7_3: BasicConv2d,
    branch7x7dbl_1: BasicConv2d,
    branch7x7dbl_2: BasicConv2d,
    branch7x7dbl_3: BasicConv2d,
    branch7x7dbl_4: BasicConv2d,
    branch7x7dbl_5: BasicConv2d,
    branch_pool: BasicConv2d,
}

/// A 1×7 conv (padding 0, 3).
fn conv_1x7(inp: usize, out: usize) -> Result<BasicConv2d> {
    Ok(BasicConv2d::new(inp, out, [1, 7])?.padding([0, 3]))
}

/// A 7×1 conv (padding 3, 0).
fn conv_7x1(inp: usize, out: usize) -> Result<BasicConv2d> {
    Ok(BasicConv2d::new(inp, out, [7, 1])?.padding([3, 0]))
}

/// A 1×3 conv (padding 0, 1).
fn conv_1x3(inp: usize, out: usize) -> Result<BasicConv2d> {
    Ok(BasicConv2d::new(inp, out, [1, 3])?.padding([0, 1]))
}

/// A 3×1 conv (padding 1, 0).
fn conv_3x1(inp: usize, out: usize) -> Result<BasicConv2d> {
    Ok(BasicConv2d::new(inp, out, [3, 1])?.padding([1, 0]))
}

impl InceptionC {
    fn new(inp: usize, c7: usize) -> Result<InceptionC> {
        Ok(InceptionC {
            branch1x1: BasicConv2d::new(inp, 192, 1)?,
            branch7x7_1: BasicConv2d::new(inp, c7, 1)?,
            branch7x7_2: conv_1x7(c7, c7)?,
            branch7x7_3: conv_7x1(c7, 192)?,
            branch7x7dbl_1: BasicConv2d::new(inp, c7, 1)?,
            branch7x7dbl_2: conv_7x1(c7, c7)?,
            branch7x7dbl_3: conv_1x7(c7, c7)?,
            branch7x7dbl_4: conv_7x1(c7, c7)?,
            branch7x7dbl_5: conv_1x7(c7, 192)?,
            branch_pool: BasicConv2d::new(inp, 192, 1)?,
        })
    }
}

impl Layer for InceptionC {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b7 = [&self.branch7x7_1, &self.branch7x7_2, &self.branch7x7_3]
            .iter()
            .try_fold(x.clone(), |h, c| c.forward(&h))?;
        let b7dbl = [
            &self.branch7x7dbl_1,
            &self.branch7x7dbl_2,
            &self.branch7x7dbl_3,
            &self.branch7x7dbl_4,
            &self.branch7x7dbl_5,
        ]
        .iter()
        .try_fold(x.clone(), |h, c| c.forward(&h))?;
        cat(&[
            self.branch1x1.forward(x)?,
            b7,
            b7dbl,
            self.branch_pool.forward(&avg_pool_3x3(x)?)?,
        ])
    }

    sublayers!(
        branch1x1,
        branch7x7_1,
        branch7x7_2,
        branch7x7_3,
        branch7x7dbl_1,
        branch7x7dbl_2,
        branch7x7dbl_3,
        branch7x7dbl_4,
        branch7x7dbl_5,
        branch_pool
    );
}

/// Block D (17×17 → 8×8): 1×1 → 3×3/2; 1×1 → 1×7 → 7×1 → 3×3/2; max-pool 3×3/2.
struct InceptionD {
    branch3x3_1: BasicConv2d,
    branch3x3_2: BasicConv2d,
    branch7x7x3_1: BasicConv2d,
    branch7x7x3_2: BasicConv2d,
    branch7x7x3_3: BasicConv2d,
    branch7x7x3_4: BasicConv2d,
}

impl InceptionD {
    fn new(inp: usize) -> Result<InceptionD> {
        Ok(InceptionD {
            branch3x3_1: BasicConv2d::new(inp, 192, 1)?,
            branch3x3_2: BasicConv2d::new(192, 320, 3)?.stride(2),
            branch7x7x3_1: BasicConv2d::new(inp, 192, 1)?,
            branch7x7x3_2: conv_1x7(192, 192)?,
            branch7x7x3_3: conv_7x1(192, 192)?,
            branch7x7x3_4: BasicConv2d::new(192, 192, 3)?.stride(2),
        })
    }
}

impl Layer for InceptionD {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b7 = [
            &self.branch7x7x3_1,
            &self.branch7x7x3_2,
            &self.branch7x7x3_3,
            &self.branch7x7x3_4,
        ]
        .iter()
        .try_fold(x.clone(), |h, c| c.forward(&h))?;
        cat(&[
            self.branch3x3_2.forward(&self.branch3x3_1.forward(x)?)?,
            b7,
            max_pool_3x3_s2(x)?,
        ])
    }

    sublayers!(
        branch3x3_1,
        branch3x3_2,
        branch7x7x3_1,
        branch7x7x3_2,
        branch7x7x3_3,
        branch7x7x3_4
    );
}

/// Block E (8×8) with split 1×3 / 3×1 outputs: 1×1; 1×1 → (1×3 ‖ 3×1); 1×1 → 3×3 →
/// (1×3 ‖ 3×1); avg-pool → 1×1.
struct InceptionE {
    branch1x1: BasicConv2d,
    branch3x3_1: BasicConv2d,
    branch3x3_2a: BasicConv2d,
    branch3x3_2b: BasicConv2d,
    branch3x3dbl_1: BasicConv2d,
    branch3x3dbl_2: BasicConv2d,
    branch3x3dbl_3a: BasicConv2d,
    branch3x3dbl_3b: BasicConv2d,
    branch_pool: BasicConv2d,
}

impl InceptionE {
    fn new(inp: usize) -> Result<InceptionE> {
        Ok(InceptionE {
            branch1x1: BasicConv2d::new(inp, 320, 1)?,
            branch3x3_1: BasicConv2d::new(inp, 384, 1)?,
            branch3x3_2a: conv_1x3(384, 384)?,
            branch3x3_2b: conv_3x1(384, 384)?,
            branch3x3dbl_1: BasicConv2d::new(inp, 448, 1)?,
            branch3x3dbl_2: BasicConv2d::new(448, 384, 3)?.padding(1),
            branch3x3dbl_3a: conv_1x3(384, 384)?,
            branch3x3dbl_3b: conv_3x1(384, 384)?,
            branch_pool: BasicConv2d::new(inp, 192, 1)?,
        })
    }
}

impl Layer for InceptionE {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b3 = self.branch3x3_1.forward(x)?;
        let b3dbl = self.branch3x3dbl_2.forward(&self.branch3x3dbl_1.forward(x)?)?;
        cat(&[
            self.branch1x1.forward(x)?,
            cat(&[self.branch3x3_2a.forward(&b3)?, self.branch3x3_2b.forward(&b3)?])?,
            cat(&[
                self.branch3x3dbl_3a.forward(&b3dbl)?,
                self.branch3x3dbl_3b.forward(&b3dbl)?,
            ])?,
            self.branch_pool.forward(&avg_pool_3x3(x)?)?,
        ])
    }

    sublayers!(
        branch1x1,
        branch3x3_1,
        branch3x3_2a,
        branch3x3_2b,
        branch3x3dbl_1,
        branch3x3dbl_2,
        branch3x3dbl_3a,
        branch3x3dbl_3b,
        branch_pool
    );
}

/// The auxiliary classifier on the 17×17 features: 5×5/3 average pooling, 1×1 conv to 128,
/// 5×5 conv to 768, global average pooling, linear 768 → classes.
struct InceptionAux {
    conv0: BasicConv2d,
    conv1: BasicConv2d,
    fc: Linear,
}

impl InceptionAux {
    fn new(inp: usize, num_classes: usize) -> Result<InceptionAux> {
        Ok(InceptionAux {
            conv0: BasicConv2d::new(inp, 128, 1)?,
            conv1: BasicConv2d::new(128, 768, 5)?,
            fc: Linear::new(768, num_classes)?,
        })
    }
}

impl Layer for InceptionAux {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = F::avg_pool2d(x, 5, Some(Pair([3, 3])), 0, false, false)?;
        let h = self.conv1.forward(&self.conv0.forward(&h)?)?;
        self.fc.forward(&F::adaptive_avg_pool2d(&h, 1)?.flatten(1, -1)?)
    }

    sublayers!(conv0, conv1, fc);
}

/// Inception v3: the stem (`Conv2d_1a_3x3` 3×3/2, `Conv2d_2a_3x3`, `Conv2d_2b_3x3` pad 1,
/// max-pool 3×3/2, `Conv2d_3b_1x1`, `Conv2d_4a_3x3`, max-pool 3×3/2), blocks `Mixed_5b`–`5d`
/// (A), `Mixed_6a` (B), `Mixed_6b`–`6e` (C), `Mixed_7a` (D), `Mixed_7b`–`7c` (E), global
/// average pooling, dropout 0.5 and `fc` (2048 → classes). With `aux_logits`, `AuxLogits`
/// classifies the `Mixed_6e` output, run in training by [`Inception3::forward_with_aux`];
/// `forward` returns the main logits only.
pub struct Inception3 {
    transform_input: bool,
    training: bool,
    conv2d_1a_3x3: BasicConv2d,
    conv2d_2a_3x3: BasicConv2d,
    conv2d_2b_3x3: BasicConv2d,
    conv2d_3b_1x1: BasicConv2d,
    conv2d_4a_3x3: BasicConv2d,
    mixed_5b: InceptionA,
    mixed_5c: InceptionA,
    mixed_5d: InceptionA,
    mixed_6a: InceptionB,
    mixed_6b: InceptionC,
    mixed_6c: InceptionC,
    mixed_6d: InceptionC,
    mixed_6e: InceptionC,
    aux_logits: Option<InceptionAux>,
    mixed_7a: InceptionD,
    mixed_7b: InceptionE,
    mixed_7c: InceptionE,
    dropout: Dropout,
    fc: Linear,
}

/// The smallest input side the network accepts (torchvision's `min_size`).
const MIN_SIZE: usize = 75;

impl Inception3 {
    /// Inception v3 with `num_classes` outputs, with or without the auxiliary classifier
    /// (torchvision's `aux_logits`), `transform_input` off.
    pub fn new(num_classes: usize, aux_logits: bool) -> Result<Inception3> {
        if num_classes == 0 {
            return Err(Error::invalid("Inception3", "num_classes must be positive"));
        }
        Ok(Inception3 {
            transform_input: false,
            training: true,
            conv2d_1a_3x3: BasicConv2d::new(3, 32, 3)?.stride(2),
            conv2d_2a_3x3: BasicConv2d::new(32, 32, 3)?,
            conv2d_2b_3x3: BasicConv2d::new(32, 64, 3)?.padding(1),
            conv2d_3b_1x1: BasicConv2d::new(64, 80, 1)?,
            conv2d_4a_3x3: BasicConv2d::new(80, 192, 3)?,
            mixed_5b: InceptionA::new(192, 32)?,
            mixed_5c: InceptionA::new(256, 64)?,
            mixed_5d: InceptionA::new(288, 64)?,
            mixed_6a: InceptionB::new(288)?,
            mixed_6b: InceptionC::new(768, 128)?,
            mixed_6c: InceptionC::new(768, 160)?,
            mixed_6d: InceptionC::new(768, 160)?,
            mixed_6e: InceptionC::new(768, 192)?,
            aux_logits: if aux_logits {
                Some(InceptionAux::new(768, num_classes)?)
            } else {
                None
            },
            mixed_7a: InceptionD::new(768)?,
            mixed_7b: InceptionE::new(1280)?,
            mixed_7c: InceptionE::new(2048)?,
            dropout: Dropout::new(0.5)?,
            fc: Linear::new(2048, num_classes)?,
        })
    }

    /// Apply torchvision's `transform_input` first (on for its ImageNet weights): re-normalize
    /// ImageNet-normalized RGB input to `(x − 0.5) / 0.5`.
    pub fn transform_input(mut self, on: bool) -> Inception3 {
        self.transform_input = on;
        self
    }

    /// The main logits and, in training with `aux_logits`, the auxiliary logits (torchvision's
    /// `InceptionOutputs`); the auxiliary ones are `None` otherwise.
    pub fn forward_with_aux(&self, x: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        self.run(x, self.training)
    }

    fn run(&self, x: &Tensor, with_aux: bool) -> Result<(Tensor, Option<Tensor>)> {
        let dims = x.dims();
        let small = dims.len() == 4 && dims[2..].iter().any(|d| d.as_static().is_some_and(|s| s < MIN_SIZE));
        if small {
            return Err(Error::invalid(
                "Inception3",
                format!("input must be at least {MIN_SIZE}×{MIN_SIZE}, got {}", x.tensor_type()),
            ));
        }
        let mut h = if self.transform_input {
            transform_input(x)?
        } else {
            x.clone()
        };
        for c in [&self.conv2d_1a_3x3, &self.conv2d_2a_3x3, &self.conv2d_2b_3x3] {
            h = c.forward(&h)?;
        }
        h = max_pool_3x3_s2(&h)?;
        h = self.conv2d_4a_3x3.forward(&self.conv2d_3b_1x1.forward(&h)?)?;
        h = max_pool_3x3_s2(&h)?;
        let blocks: [&dyn Layer; 8] = [
            &self.mixed_5b,
            &self.mixed_5c,
            &self.mixed_5d,
            &self.mixed_6a,
            &self.mixed_6b,
            &self.mixed_6c,
            &self.mixed_6d,
            &self.mixed_6e,
        ];
        for b in blocks {
            h = b.forward(&h)?;
        }
        let aux = match &self.aux_logits {
            Some(a) if with_aux => Some(a.forward(&h)?),
            _ => None,
        };
        for b in [&self.mixed_7a as &dyn Layer, &self.mixed_7b, &self.mixed_7c] {
            h = b.forward(&h)?;
        }
        let h = self.dropout.forward(&F::adaptive_avg_pool2d(&h, 1)?)?.flatten(1, -1)?;
        Ok((self.fc.forward(&h)?, aux))
    }
}

impl Layer for Inception3 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.run(x, false)?.0)
    }

    sublayers!(
        conv2d_1a_3x3 as "Conv2d_1a_3x3",
        conv2d_2a_3x3 as "Conv2d_2a_3x3",
        conv2d_2b_3x3 as "Conv2d_2b_3x3",
        conv2d_3b_1x1 as "Conv2d_3b_1x1",
        conv2d_4a_3x3 as "Conv2d_4a_3x3",
        mixed_5b as "Mixed_5b",
        mixed_5c as "Mixed_5c",
        mixed_5d as "Mixed_5d",
        mixed_6a as "Mixed_6a",
        mixed_6b as "Mixed_6b",
        mixed_6c as "Mixed_6c",
        mixed_6d as "Mixed_6d",
        mixed_6e as "Mixed_6e",
        mixed_7a as "Mixed_7a",
        mixed_7b as "Mixed_7b",
        mixed_7c as "Mixed_7c",
        dropout,
        fc;
        optional aux_logits as "AuxLogits"
    );

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// Inception v3 with `num_classes` outputs and an optional auxiliary classifier (torchvision's
/// `inception_v3(weights=None, aux_logits=..., init_weights=True)`, up to initialization).
pub fn inception_v3(num_classes: usize, aux_logits: bool) -> Result<Inception3> {
    Inception3::new(num_classes, aux_logits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_and_names_match_torchvision() {
        // torchvision.models.inception_v3(weights=None, aux_logits=True / False, init_weights=True).
        for (aux, count) in [(true, 27_161_264), (false, 23_834_568)] {
            let net = inception_v3(1000, aux).unwrap();
            let n: usize = net.parameters().iter().map(|p| p.numel()).sum();
            assert_eq!(n, count, "aux_logits={aux}");
        }
    }

    #[test]
    fn forward_shape_at_the_minimum_size() {
        let net = inception_v3(4, true).unwrap();
        let state = net.state_dict();
        for key in [
            "Conv2d_1a_3x3.conv.weight",
            "Conv2d_4a_3x3.bn._mean",
            "Mixed_5b.branch5x5_2.conv.weight",
            "Mixed_6e.branch7x7dbl_5.bn.weight",
            "Mixed_7c.branch3x3dbl_3b.conv.weight",
            "AuxLogits.conv1.conv.weight",
            "AuxLogits.fc.bias",
            "fc.weight",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert_eq!(state["Mixed_6b.branch7x7_2.conv.weight"].shape(), [128, 128, 1, 7]);
        let x = crate::tensor::randn(&[1, 3, 75, 75], oar_ir::DType::F32).unwrap();
        assert_eq!(net.forward(&x).unwrap().shape(), [1, 4]);
        let small = crate::tensor::randn(&[1, 3, 74, 80], oar_ir::DType::F32).unwrap();
        let err = net.forward(&small).unwrap_err().to_string();
        assert!(err.contains("at least 75"), "{err}");
        assert!(inception_v3(0, false).is_err());
    }
}
