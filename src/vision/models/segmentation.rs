//! Semantic segmentation models: FCN with a dilated ResNet backbone (Long et al. 2015, as
//! `torchvision.models.segmentation.fcn_resnet50`) and U-Net (Ronneberger et al. 2015, as the
//! widely used `milesial/Pytorch-UNet`), both with their reference's module names. Both map
//! `x[N, C, H, W]` to per-pixel logits `[N, num_classes, H, W]`.

use super::resnet::{ResNet, ResNetBlock, ResNetConfig};
use crate::error::{Error, Result};
use crate::nn::functional::{self as F, Interpolation};
use crate::nn::{BatchNorm2D, Conv2D, ConvTranspose, Dropout, Layer, MaxPool2D, ReLU, Sequential, Upsample};
use crate::tensor::{Tensor, concat};

/// The spatial size `[H, W]` of `x[N, C, H, W]`.
fn spatial_size(op: &str, x: &Tensor) -> Result<[usize; 2]> {
    match x.shape()[..] {
        [_, _, h, w] => Ok([h, w]),
        _ => Err(Error::invalid(
            op,
            format!("expects images x[N, C, H, W], got {}", x.tensor_type()),
        )),
    }
}

/// torchvision's `FCNHead`: 3×3 conv to `in_channels / 4` (no bias), batch norm, relu,
/// dropout 0.1, 1×1 conv to `channels` (layers `0`..`4`).
fn fcn_head(in_channels: usize, channels: usize) -> Result<Sequential> {
    let inter = in_channels / 4;
    Ok(Sequential::new()
        .add(Conv2D::new(in_channels, inter, 3)?.padding(1).bias(false))
        .add(BatchNorm2D::new(inter)?)
        .add(ReLU)
        .add(Dropout::new(0.1)?)
        .add(Conv2D::new(inter, channels, 1)?))
}

/// A fully convolutional network: `backbone` (a ResNet with dilated `layer3` and `layer4`,
/// output stride 8, no pooling or `fc`), `classifier` (an FCN head on `layer4`) and, with
/// `aux_loss`, `aux_classifier` (an FCN head on `layer3`); the logits are resized bilinearly
/// (`align_corners = false`) to the input size.
pub struct FCN {
    backbone: ResNet,
    classifier: Sequential,
    aux_classifier: Option<Sequential>,
}

impl FCN {
    /// An FCN on a bottleneck ResNet with `layers[i]` blocks in stage `i`.
    fn resnet(layers: [usize; 4], num_classes: usize, aux_loss: bool) -> Result<FCN> {
        if num_classes == 0 {
            return Err(Error::invalid("FCN", "num_classes must be positive"));
        }
        let config =
            ResNetConfig::new(ResNetBlock::Bottleneck, layers).replace_stride_with_dilation([false, true, true]);
        let channels = config.out_channels();
        Ok(FCN {
            backbone: ResNet::backbone(&config)?,
            classifier: fcn_head(channels, num_classes)?,
            aux_classifier: if aux_loss {
                Some(fcn_head(channels / 2, num_classes)?)
            } else {
                None
            },
        })
    }

    /// The main logits and, with `aux_loss`, the auxiliary logits (torchvision's `"out"` and
    /// `"aux"`), both `[N, num_classes, H, W]`.
    pub fn forward_with_aux(&self, x: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        let size = spatial_size("FCN", x)?;
        let stages = self.backbone.stage_features(x)?;
        let [.., layer3, layer4] = stages.as_slice() else {
            return Err(Error::invalid("FCN", "the backbone has fewer than two stages"));
        };
        let resize = |h: &Tensor| F::interpolate(h, Some(&size), None, Interpolation::Linear, false);
        let out = resize(&self.classifier.forward(layer4)?)?;
        let aux = match &self.aux_classifier {
            Some(head) => Some(resize(&head.forward(layer3)?)?),
            None => None,
        };
        Ok((out, aux))
    }
}

impl Layer for FCN {
    /// The main logits `[N, num_classes, H, W]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let size = spatial_size("FCN", x)?;
        let h = self.classifier.forward(&self.backbone.features(x)?)?;
        F::interpolate(&h, Some(&size), None, Interpolation::Linear, false)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![
            ("backbone".into(), &self.backbone),
            ("classifier".into(), &self.classifier),
        ];
        if let Some(aux) = &self.aux_classifier {
            v.push(("aux_classifier".into(), aux));
        }
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![
            ("backbone".into(), &mut self.backbone),
            ("classifier".into(), &mut self.classifier),
        ];
        if let Some(aux) = &mut self.aux_classifier {
            v.push(("aux_classifier".into(), aux));
        }
        v
    }
}

/// FCN-ResNet50: torchvision's `fcn_resnet50(weights=None, weights_backbone=None,
/// num_classes, aux_loss)` (torchvision's default is 21 classes, no auxiliary head).
pub fn fcn_resnet50(num_classes: usize, aux_loss: bool) -> Result<FCN> {
    FCN::resnet([3, 4, 6, 3], num_classes, aux_loss)
}

/// FCN-ResNet101: torchvision's `fcn_resnet101(weights=None, weights_backbone=None,
/// num_classes, aux_loss)`.
pub fn fcn_resnet101(num_classes: usize, aux_loss: bool) -> Result<FCN> {
    FCN::resnet([3, 4, 23, 3], num_classes, aux_loss)
}

/// `(3×3 conv (no bias), batch norm, relu) × 2` through `mid` channels: layers
/// `double_conv.0`, `.1`, `.3`, `.4`.
struct DoubleConv {
    double_conv: Sequential,
}

impl DoubleConv {
    fn new(in_channels: usize, out_channels: usize, mid: usize) -> Result<DoubleConv> {
        Ok(DoubleConv {
            double_conv: Sequential::new()
                .add(Conv2D::new(in_channels, mid, 3)?.padding(1).bias(false))
                .add(BatchNorm2D::new(mid)?)
                .add(ReLU)
                .add(Conv2D::new(mid, out_channels, 3)?.padding(1).bias(false))
                .add(BatchNorm2D::new(out_channels)?)
                .add(ReLU),
        })
    }
}

impl Layer for DoubleConv {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.double_conv.forward(x)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("double_conv".into(), &self.double_conv)]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("double_conv".into(), &mut self.double_conv)]
    }
}

/// 2×2 max-pool then a [`DoubleConv`]: `maxpool_conv.1.double_conv.*`.
struct Down {
    maxpool_conv: Sequential,
}

impl Layer for Down {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.maxpool_conv.forward(x)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("maxpool_conv".into(), &self.maxpool_conv)]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("maxpool_conv".into(), &mut self.maxpool_conv)]
    }
}

/// Upsample ×2 (`up`: a 2×2/2 transposed conv halving the channels, or parameter-free bilinear
/// resizing with `align_corners = true`), zero-pad to the skip connection's size, concatenate
/// `[skip, upsampled]` and apply `conv`, a [`DoubleConv`].
struct Up {
    up: Box<dyn Layer>,
    conv: DoubleConv,
}

impl Up {
    fn new(in_channels: usize, out_channels: usize, bilinear: bool) -> Result<Up> {
        let (up, conv): (Box<dyn Layer>, _) = if bilinear {
            (
                Box::new(Upsample::scale(&[2.0, 2.0]).mode("bilinear")?.align_corners(true)),
                DoubleConv::new(in_channels, out_channels, in_channels / 2)?,
            )
        } else {
            (
                Box::new(ConvTranspose::new(in_channels, in_channels / 2, &[2, 2])?.stride(&[2])?),
                DoubleConv::new(in_channels, out_channels, out_channels)?,
            )
        };
        Ok(Up { up, conv })
    }

    /// The decoder step for input `x` and the encoder's `skip` features.
    fn forward_skip(&self, x: &Tensor, skip: &Tensor) -> Result<Tensor> {
        let x = self.up.forward(x)?;
        let [h, w] = spatial_size("UNet", &x)?;
        let [sh, sw] = spatial_size("UNet", skip)?;
        let (Some(dy), Some(dx)) = (sh.checked_sub(h), sw.checked_sub(w)) else {
            return Err(Error::invalid(
                "UNet",
                format!("upsampled features {h}×{w} exceed the skip connection's {sh}×{sw}"),
            ));
        };
        let x = if dy == 0 && dx == 0 {
            x
        } else {
            F::pad(&x, &[dx / 2, dx - dx / 2, dy / 2, dy - dy / 2], "constant", 0.0)?
        };
        self.conv.forward(&concat(&[skip, &x], 1)?)
    }
}

impl Layer for Up {
    /// Not callable alone: a decoder step needs the skip connection too (see `UNet`).
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::invalid(
            "UNet",
            "an up block takes the decoder input and the skip connection; run the whole UNet",
        ))
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("up".into(), &*self.up), ("conv".into(), &self.conv)]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("up".into(), &mut *self.up), ("conv".into(), &mut self.conv)]
    }
}

/// The 1×1 output conv (with bias): `conv`.
struct OutConv {
    conv: Conv2D,
}

impl Layer for OutConv {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.conv.forward(x)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("conv".into(), &self.conv)]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("conv".into(), &mut self.conv)]
    }
}

/// U-Net as `milesial/Pytorch-UNet`'s `UNet(n_channels, n_classes, bilinear)` with the widths
/// scaled by `base_width` (64 there): `inc` (a double conv to `w` channels), `down1`..`down4`
/// (2×2 max-pool and double conv to `2w`, `4w`, `8w`, `16w` channels — `8w` when bilinear),
/// `up1`..`up4` (upsample, concatenate the skip connection, double conv) and `outc` (1×1 conv
/// with bias to the classes).
///
/// Every double conv is `(3×3 conv without bias, batch norm, relu) × 2`, as in the reference
/// (its convs drop the bias the batch norm makes redundant). State-dict names:
/// `inc.double_conv.{0,1,3,4}.*`, `down1.maxpool_conv.1.double_conv.{0,1,3,4}.*`,
/// `up1.up.{weight,bias}` (transposed conv only), `up1.conv.double_conv.{0,1,3,4}.*`,
/// `outc.conv.{weight,bias}`. Inputs of any size ≥ 16 work: odd sizes are padded as in the
/// reference.
pub struct UNet {
    inc: DoubleConv,
    downs: Vec<Down>,
    ups: Vec<Up>,
    outc: OutConv,
}

impl UNet {
    /// A U-Net from `in_channels` to `num_classes` with `base_width` channels in the first
    /// stage; the decoder upsamples with transposed convs, or bilinearly when `bilinear`.
    pub fn new(in_channels: usize, num_classes: usize, base_width: usize, bilinear: bool) -> Result<UNet> {
        if in_channels == 0 || num_classes == 0 || base_width == 0 {
            return Err(Error::invalid(
                "UNet",
                format!(
                    "in_channels ({in_channels}), num_classes ({num_classes}) and base_width ({base_width}) must be ≥ 1"
                ),
            ));
        }
        let w = base_width;
        let factor = if bilinear { 2 } else { 1 };
        let down = |i: usize, o: usize| -> Result<Down> {
            Ok(Down {
                maxpool_conv: Sequential::new().add(MaxPool2D::new(2)).add(DoubleConv::new(i, o, o)?),
            })
        };
        Ok(UNet {
            inc: DoubleConv::new(in_channels, w, w)?,
            downs: vec![
                down(w, 2 * w)?,
                down(2 * w, 4 * w)?,
                down(4 * w, 8 * w)?,
                down(8 * w, 16 * w / factor)?,
            ],
            ups: vec![
                Up::new(16 * w, 8 * w / factor, bilinear)?,
                Up::new(8 * w, 4 * w / factor, bilinear)?,
                Up::new(4 * w, 2 * w / factor, bilinear)?,
                Up::new(2 * w, w, bilinear)?,
            ],
            outc: OutConv {
                conv: Conv2D::new(w, num_classes, 1)?,
            },
        })
    }
}

impl Layer for UNet {
    /// Logits `[N, num_classes, H, W]` for `x[N, in_channels, H, W]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.inc.forward(x)?;
        let mut skips = Vec::with_capacity(self.downs.len());
        for d in &self.downs {
            let next = d.forward(&h)?;
            skips.push(std::mem::replace(&mut h, next));
        }
        for (up, skip) in self.ups.iter().zip(skips.iter().rev()) {
            h = up.forward_skip(&h, skip)?;
        }
        self.outc.forward(&h)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![("inc".into(), &self.inc)];
        for (i, d) in self.downs.iter().enumerate() {
            v.push((format!("down{}", i + 1), d));
        }
        for (i, u) in self.ups.iter().enumerate() {
            v.push((format!("up{}", i + 1), u));
        }
        v.push(("outc".into(), &self.outc));
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![("inc".into(), &mut self.inc)];
        for (i, d) in self.downs.iter_mut().enumerate() {
            v.push((format!("down{}", i + 1), d));
        }
        for (i, u) in self.ups.iter_mut().enumerate() {
            v.push((format!("up{}", i + 1), u));
        }
        v.push(("outc".into(), &mut self.outc));
        v
    }
}

/// U-Net from `in_channels` to `num_classes` with `base_width` first-stage channels and
/// transposed-conv upsampling (`milesial/Pytorch-UNet`'s `UNet(in_channels, num_classes)` at
/// `base_width = 64`).
pub fn unet(in_channels: usize, num_classes: usize, base_width: usize) -> Result<UNet> {
    UNet::new(in_channels, num_classes, base_width, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::DType;

    fn count(net: &dyn Layer) -> usize {
        net.parameters().iter().map(|p| p.numel()).sum()
    }

    #[test]
    fn fcn_parameter_counts_and_names_match_torchvision() {
        // torchvision.models.segmentation.fcn_resnet{50,101}(weights=None,
        // weights_backbone=None, num_classes=21, aux_loss=False / True).
        for (build, aux, want) in [
            (fcn_resnet50 as fn(usize, bool) -> Result<FCN>, false, 32_957_013),
            (fcn_resnet50, true, 35_322_218),
            (fcn_resnet101, false, 51_949_141),
            (fcn_resnet101, true, 54_314_346),
        ] {
            assert_eq!(count(&build(21, aux).unwrap()), want, "aux {aux}");
        }
        let state = fcn_resnet50(21, true).unwrap().state_dict();
        for key in [
            "backbone.conv1.weight",
            "backbone.layer4.2.bn3._variance",
            "classifier.0.weight",
            "classifier.1._mean",
            "classifier.4.bias",
            "aux_classifier.0.weight",
            "aux_classifier.4.weight",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert!(!state.keys().any(|k| k.starts_with("backbone.fc")));
        assert_eq!(state["aux_classifier.0.weight"].shape(), [256, 1024, 3, 3]);
        // Dilation keeps the layer4 3×3 conv's weight shape.
        assert_eq!(state["backbone.layer4.0.conv2.weight"].shape(), [512, 512, 3, 3]);
    }

    #[test]
    fn fcn_forward_shapes() {
        let mut net = fcn_resnet50(3, true).unwrap();
        net.eval();
        let x = crate::tensor::randn(&[1, 3, 40, 48], DType::F32).unwrap();
        let (out, aux) = net.forward_with_aux(&x).unwrap();
        assert_eq!(out.shape(), [1, 3, 40, 48]);
        assert_eq!(aux.map(|a| a.shape()), Some(vec![1, 3, 40, 48]));
        assert_eq!(net.forward(&x).unwrap().shape(), [1, 3, 40, 48]);
        assert!(
            net.forward(&crate::tensor::randn(&[3, 40, 48], DType::F32).unwrap())
                .is_err()
        );
        assert!(fcn_resnet50(0, false).is_err());
    }

    #[test]
    fn unet_parameter_counts_and_names_match_the_reference() {
        // milesial/Pytorch-UNet's UNet(3, 2, bilinear=False / True), and the same module with
        // 16 instead of 64 base channels (UNet(1, 3, ...) with every width divided by 4).
        for (c, n, w, bilinear, want) in [
            (3, 2, 64, false, 31_037_698),
            (3, 2, 64, true, 17_263_042),
            (1, 3, 16, false, 1_942_323),
            (1, 3, 16, true, 1_080_675),
        ] {
            assert_eq!(count(&UNet::new(c, n, w, bilinear).unwrap()), want, "{w} {bilinear}");
        }
        let state = unet(3, 2, 64).unwrap().state_dict();
        for key in [
            "inc.double_conv.0.weight",
            "inc.double_conv.4._variance",
            "down1.maxpool_conv.1.double_conv.0.weight",
            "down4.maxpool_conv.1.double_conv.4.bias",
            "up1.up.weight",
            "up1.up.bias",
            "up4.conv.double_conv.3.weight",
            "outc.conv.weight",
            "outc.conv.bias",
        ] {
            assert!(state.contains_key(key), "{key} missing");
        }
        assert_eq!(state["up1.up.weight"].shape(), [1024, 512, 2, 2]);
        assert!(!state.contains_key("inc.double_conv.0.bias"));
    }

    #[test]
    fn unet_forward_shapes() {
        for bilinear in [false, true] {
            let net = UNet::new(1, 3, 4, bilinear).unwrap();
            // 36 and 20 are not multiples of 16: the decoder pads to the skip connections.
            let x = crate::tensor::randn(&[2, 1, 36, 20], DType::F32).unwrap();
            assert_eq!(net.forward(&x).unwrap().shape(), [2, 3, 36, 20], "bilinear {bilinear}");
        }
        assert!(unet(3, 0, 64).is_err());
        assert!(unet(3, 2, 0).is_err());
    }
}
