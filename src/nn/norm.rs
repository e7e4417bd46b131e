//! Normalization layers: `BatchNorm1D/2D/3D`, `LayerNorm`, `GroupNorm` and `InstanceNorm1D/2D/3D`.
//!
//! Batch norm follows Paddle: parameters `weight` (ones) and `bias` (zeros), buffers `_mean`
//! (zeros) and `_variance` (ones), `momentum = 0.9` with the rule
//! `running = momentum · running + (1 − momentum) · batch` (biased batch variance),
//! `epsilon = 1e-5`. Training mode normalizes with batch statistics and updates the buffers;
//! eval mode normalizes with the buffers.

use super::Layer;
use super::functional as F;
use super::util::{buffer, check_rank, ctx, recast};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::DType;

/// State shared by the batch-norm layers.
struct BatchNormCore {
    weight: Tensor,
    bias: Tensor,
    mean: Tensor,
    variance: Tensor,
    num_features: usize,
    momentum: f64,
    epsilon: f64,
    training: bool,
    /// Folded into the convolution before it: the identity, with no state.
    folded: bool,
}

impl BatchNormCore {
    fn new(num_features: usize) -> Result<BatchNormCore> {
        let p = |v| Tensor::parameter(buffer(&[num_features], v, DType::F32)?.data());
        Ok(BatchNormCore {
            weight: p(1.0)?,
            bias: p(0.0)?,
            mean: buffer(&[num_features], 0.0, DType::F32)?,
            variance: buffer(&[num_features], 1.0, DType::F32)?,
            num_features,
            momentum: 0.9,
            epsilon: 1e-5,
            training: true,
            folded: false,
        })
    }

    fn recast(&mut self, dtype: DType) -> Result<()> {
        self.weight = recast(&self.weight, dtype)?;
        self.bias = recast(&self.bias, dtype)?;
        self.mean = recast(&self.mean, dtype)?;
        self.variance = recast(&self.variance, dtype)?;
        Ok(())
    }

    fn forward(&self, name: &str, x: &Tensor, ranks: &[usize], want: &str) -> Result<Tensor> {
        let describe = || format!("{name}(num_features={})", self.num_features);
        ctx(describe, check_rank(name, x, ranks, want))?;
        let y = F::batch_norm(
            x,
            &self.mean,
            &self.variance,
            &self.weight,
            &self.bias,
            self.training,
            self.momentum,
            self.epsilon,
        );
        ctx(describe, y)
    }
}

macro_rules! batch_norm_layer {
    ($(#[$m:meta])* $name:ident, $ranks:expr, $want:literal) => {
        $(#[$m])*
        pub struct $name(BatchNormCore);

        impl $name {
            /// A float32 layer over `num_features` channels (axis 1), in training mode.
            pub fn new(num_features: usize) -> Result<$name> {
                Ok($name(BatchNormCore::new(num_features)?))
            }

            /// Running-stat momentum (Paddle convention; default 0.9).
            pub fn momentum(mut self, momentum: f64) -> Result<$name> {
                if !(0.0..=1.0).contains(&momentum) {
                    return Err(Error::invalid(stringify!($name), format!("momentum {momentum} is not in [0, 1]")));
                }
                self.0.momentum = momentum;
                Ok(self)
            }

            /// Added to the variance (default 1e-5).
            pub fn epsilon(mut self, epsilon: f64) -> Result<$name> {
                if !(epsilon >= 0.0 && epsilon.is_finite()) {
                    return Err(Error::invalid(stringify!($name), format!("epsilon {epsilon} must be finite and ≥ 0")));
                }
                self.0.epsilon = epsilon;
                Ok(self)
            }

            /// The same layer with parameters and buffers converted to `dtype`.
            pub fn dtype(mut self, dtype: DType) -> Result<$name> {
                self.0.recast(dtype)?;
                Ok(self)
            }

            /// The scale `[C]`.
            pub fn weight(&self) -> &Tensor {
                &self.0.weight
            }

            /// The shift `[C]`.
            pub fn bias(&self) -> &Tensor {
                &self.0.bias
            }

            /// The running mean `[C]` (buffer `_mean`).
            pub fn running_mean(&self) -> &Tensor {
                &self.0.mean
            }

            /// The running variance `[C]` (buffer `_variance`).
            pub fn running_var(&self) -> &Tensor {
                &self.0.variance
            }
        }

        impl Layer for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                if self.0.folded {
                    return Ok(x.clone());
                }
                self.0.forward(stringify!($name), x, &$ranks, $want)
            }

            fn own_parameters(&self) -> Vec<(String, Tensor)> {
                if self.0.folded {
                    return Vec::new();
                }
                vec![("weight".into(), self.0.weight.clone()), ("bias".into(), self.0.bias.clone())]
            }

            fn own_buffers(&self) -> Vec<(String, Tensor)> {
                if self.0.folded {
                    return Vec::new();
                }
                vec![("_mean".into(), self.0.mean.clone()), ("_variance".into(), self.0.variance.clone())]
            }

            fn fold_away(&mut self) -> bool {
                self.0.folded = true;
                true
            }

            fn set_training(&mut self, training: bool) {
                self.0.training = training;
            }

            fn is_training(&self) -> bool {
                self.0.training
            }
        }
    };
}

batch_norm_layer!(
    /// Batch norm of `x[N,C]` or `x[N,C,L]`.
    BatchNorm1D,
    [2, 3],
    "[N,C] or [N,C,L]"
);
batch_norm_layer!(
    /// Batch norm of images `x[N,C,H,W]`.
    BatchNorm2D,
    [4],
    "[N,C,H,W]"
);
batch_norm_layer!(
    /// Batch norm of volumes `x[N,C,D,H,W]`.
    BatchNorm3D,
    [5],
    "[N,C,D,H,W]"
);

/// Layer norm over the trailing `normalized_shape` axes, with an elementwise affine `weight`
/// (ones) and `bias` (zeros) of that shape unless `.affine(false)`; `epsilon = 1e-5`.
pub struct LayerNorm {
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    normalized_shape: Vec<usize>,
    epsilon: f64,
}

impl LayerNorm {
    /// A float32 layer normalizing the trailing axes `normalized_shape` (e.g. `&[512]`).
    pub fn new(normalized_shape: &[usize]) -> Result<LayerNorm> {
        if normalized_shape.is_empty() {
            return Err(Error::invalid(
                "LayerNorm",
                "normalized_shape must name at least one axis",
            ));
        }
        let p = |v| Tensor::parameter(buffer(normalized_shape, v, DType::F32)?.data());
        Ok(LayerNorm {
            weight: Some(p(1.0)?),
            bias: Some(p(0.0)?),
            normalized_shape: normalized_shape.to_vec(),
            epsilon: 1e-5,
        })
    }

    /// Keep (`true`, the default) or drop the affine weight and bias.
    pub fn affine(mut self, on: bool) -> Result<LayerNorm> {
        if !on {
            self.weight = None;
            self.bias = None;
        } else if self.weight.is_none() {
            let fresh = LayerNorm::new(&self.normalized_shape)?;
            self.weight = fresh.weight;
            self.bias = fresh.bias;
        }
        Ok(self)
    }

    /// Added to the variance (default 1e-5).
    pub fn epsilon(mut self, epsilon: f64) -> Result<LayerNorm> {
        if !(epsilon >= 0.0 && epsilon.is_finite()) {
            return Err(Error::invalid(
                "LayerNorm",
                format!("epsilon {epsilon} must be finite and ≥ 0"),
            ));
        }
        self.epsilon = epsilon;
        Ok(self)
    }

    /// The same layer with parameters converted to `dtype`.
    pub fn dtype(mut self, dtype: DType) -> Result<LayerNorm> {
        self.weight = self.weight.map(|w| recast(&w, dtype)).transpose()?;
        self.bias = self.bias.map(|b| recast(&b, dtype)).transpose()?;
        Ok(self)
    }

    /// The scale, if affine.
    pub fn weight(&self) -> Option<&Tensor> {
        self.weight.as_ref()
    }

    /// The shift, if affine.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
}

impl Layer for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let ns = &self.normalized_shape;
        let describe = || format!("LayerNorm(normalized_shape={ns:?})");
        let shape = x.shape();
        if shape.len() < ns.len() || shape[shape.len() - ns.len()..] != ns[..] {
            return Err(Error::invalid(
                &describe(),
                format!("input {} does not end in {ns:?}", x.tensor_type()),
            ));
        }
        let y = F::layer_norm(x, ns.len(), self.weight.as_ref(), self.bias.as_ref(), self.epsilon);
        ctx(describe, y)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.weight.iter().map(|w| ("weight".into(), w.clone())).collect();
        v.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        v
    }
}

/// A per-channel affine pair `weight` (ones) and `bias` (zeros) of `[C]`, or none.
fn channel_affine(channels: usize, on: bool) -> Result<Option<(Tensor, Tensor)>> {
    if !on {
        return Ok(None);
    }
    let p = |v| Tensor::parameter(buffer(&[channels], v, DType::F32)?.data());
    Ok(Some((p(1.0)?, p(0.0)?)))
}

fn affine_params(a: &Option<(Tensor, Tensor)>) -> Vec<(String, Tensor)> {
    a.iter()
        .flat_map(|(w, b)| [("weight".to_string(), w.clone()), ("bias".to_string(), b.clone())])
        .collect()
}

fn check_epsilon(layer: &str, epsilon: f64) -> Result<f64> {
    if epsilon >= 0.0 && epsilon.is_finite() {
        Ok(epsilon)
    } else {
        Err(Error::invalid(
            layer,
            format!("epsilon {epsilon} must be finite and ≥ 0"),
        ))
    }
}

/// Group norm of `x[N,C,*]` (Paddle `GroupNorm`): the channels in `num_groups` groups, each
/// normalized over its channels and positions, then a per-channel `weight` (ones) and `bias`
/// (zeros) unless `.affine(false)`; `epsilon = 1e-5`.
pub struct GroupNorm {
    affine: Option<(Tensor, Tensor)>,
    num_groups: usize,
    num_channels: usize,
    epsilon: f64,
}

impl GroupNorm {
    /// `num_groups` groups over `num_channels` channels (the groups must divide the channels).
    pub fn new(num_groups: usize, num_channels: usize) -> Result<GroupNorm> {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(Error::invalid(
                "GroupNorm",
                format!("num_groups={num_groups} must be ≥ 1 and divide num_channels={num_channels}"),
            ));
        }
        Ok(GroupNorm {
            affine: channel_affine(num_channels, true)?,
            num_groups,
            num_channels,
            epsilon: 1e-5,
        })
    }

    /// Keep (`true`, the default) or drop the affine weight and bias.
    pub fn affine(mut self, on: bool) -> Result<GroupNorm> {
        self.affine = channel_affine(self.num_channels, on)?;
        Ok(self)
    }

    /// Added to the variance (default 1e-5).
    pub fn epsilon(mut self, epsilon: f64) -> Result<GroupNorm> {
        self.epsilon = check_epsilon("GroupNorm", epsilon)?;
        Ok(self)
    }
}

impl Layer for GroupNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let describe = || {
            format!(
                "GroupNorm(num_groups={}, num_channels={})",
                self.num_groups, self.num_channels
            )
        };
        let (w, b) = (self.affine.as_ref().map(|a| &a.0), self.affine.as_ref().map(|a| &a.1));
        ctx(describe, F::group_norm(x, self.num_groups, w, b, self.epsilon))
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        affine_params(&self.affine)
    }
}

macro_rules! instance_norm_layer {
    ($(#[$m:meta])* $name:ident, $rank:expr, $want:literal) => {
        $(#[$m])*
        pub struct $name {
            affine: Option<(Tensor, Tensor)>,
            num_features: usize,
            epsilon: f64,
        }

        impl $name {
            /// A layer over `num_features` channels (axis 1) with an affine weight and bias.
            pub fn new(num_features: usize) -> Result<$name> {
                Ok($name {
                    affine: channel_affine(num_features, true)?,
                    num_features,
                    epsilon: 1e-5,
                })
            }

            /// Keep (`true`, Paddle's default) or drop the affine weight and bias.
            pub fn affine(mut self, on: bool) -> Result<$name> {
                self.affine = channel_affine(self.num_features, on)?;
                Ok(self)
            }

            /// Added to the variance (default 1e-5).
            pub fn epsilon(mut self, epsilon: f64) -> Result<$name> {
                self.epsilon = check_epsilon(stringify!($name), epsilon)?;
                Ok(self)
            }
        }

        impl Layer for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                let describe = || format!("{}(num_features={})", stringify!($name), self.num_features);
                ctx(describe, check_rank(stringify!($name), x, &[$rank], $want))?;
                let (w, b) = (self.affine.as_ref().map(|a| &a.0), self.affine.as_ref().map(|a| &a.1));
                ctx(describe, F::instance_norm(x, w, b, self.epsilon))
            }

            fn own_parameters(&self) -> Vec<(String, Tensor)> {
                affine_params(&self.affine)
            }
        }
    };
}

instance_norm_layer!(
    /// Instance norm of sequences `x[N,C,L]`: each (sample, channel) normalized over its
    /// positions (no running statistics).
    InstanceNorm1D,
    3,
    "[N,C,L]"
);
instance_norm_layer!(
    /// Instance norm of images `x[N,C,H,W]` (style transfer, GAN generators).
    InstanceNorm2D,
    4,
    "[N,C,H,W]"
);
instance_norm_layer!(
    /// Instance norm of volumes `x[N,C,D,H,W]`.
    InstanceNorm3D,
    5,
    "[N,C,D,H,W]"
);
