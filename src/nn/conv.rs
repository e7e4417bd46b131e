//! Convolution layers: `Conv1D` (`x[N,C,L]`) and `Conv2D` (`x[N,C,H,W]`).
//!
//! Initialization follows Paddle's conv default `Normal(0, √(2 / fan_in))` (Kaiming-normal for
//! ReLU), with the true fan-in `C/groups · ∏kernel`; bias zero.

use super::functional::{self as F, Pad2d, Pair};
use super::util::{ctx, param, recast};
use super::{Layer, init};
use crate::error::{Error, Result};
use crate::quantization::{QuantPair, Quantizer};
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData};

/// Shared state of the conv layers: parameters, channel counts and groups.
struct ConvCore {
    weight: Tensor,
    bias: Option<Tensor>,
    in_channels: usize,
    out_channels: usize,
    groups: usize,
}

impl ConvCore {
    fn new(layer: &str, in_channels: usize, out_channels: usize, kernel: &[usize], groups: usize) -> Result<ConvCore> {
        if groups == 0 || !in_channels.is_multiple_of(groups) || !out_channels.is_multiple_of(groups) {
            return Err(Error::invalid(
                layer,
                format!(
                    "groups={groups} must be ≥ 1 and divide in_channels={in_channels} and out_channels={out_channels}"
                ),
            ));
        }
        let mut shape = vec![out_channels, in_channels / groups];
        shape.extend_from_slice(kernel);
        let weight = param(&shape, DType::F32)?;
        init::kaiming_normal(&weight, 0.0)?;
        Ok(ConvCore {
            weight,
            bias: Some(param(&[out_channels], DType::F32)?),
            in_channels,
            out_channels,
            groups,
        })
    }

    /// Rebuild for new groups, keeping dtype and whether there is a bias.
    fn regroup(&self, layer: &str, kernel: &[usize], groups: usize) -> Result<ConvCore> {
        let mut c = ConvCore::new(layer, self.in_channels, self.out_channels, kernel, groups)?;
        let dtype = self.weight.dtype();
        c.weight = recast(&c.weight, dtype)?;
        c.bias = match self.bias {
            Some(_) => Some(recast(c.bias.as_ref().expect("new() makes a bias"), dtype)?),
            None => None,
        };
        Ok(c)
    }

    fn set_bias(&mut self, on: bool) {
        if !on {
            self.bias = None;
        } else if self.bias.is_none() {
            self.bias = param(&[self.out_channels], self.weight.dtype()).ok();
        }
    }

    fn recast(&mut self, dtype: DType) -> Result<()> {
        self.weight = recast(&self.weight, dtype)?;
        self.bias = self.bias.as_ref().map(|b| recast(b, dtype)).transpose()?;
        Ok(())
    }

    fn params(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        v.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        v
    }
}

/// 2-d convolution. Parameters: `weight` `[out, in/groups, kh, kw]`, `bias` `[out]`.
/// Options: `.stride(s)`, `.padding(p)`, `.dilation(d)`, `.groups(g)?`, `.bias(false)`.
pub struct Conv2D {
    core: ConvCore,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
    dilation: [usize; 2],
    quant: Option<QuantPair>,
}

impl Conv2D {
    /// A float32 convolution from `in_channels` to `out_channels` with `kernel` (`3` or `[3, 5]`).
    pub fn new(in_channels: usize, out_channels: usize, kernel: impl Into<Pair>) -> Result<Conv2D> {
        let kernel = kernel.into().0;
        Ok(Conv2D {
            core: ConvCore::new("Conv2D", in_channels, out_channels, &kernel, 1)?,
            kernel,
            stride: [1, 1],
            padding: [0; 4],
            dilation: [1, 1],
            quant: None,
        })
    }

    /// Stride (`2` or `[sh, sw]`).
    pub fn stride(mut self, s: impl Into<Pair>) -> Conv2D {
        self.stride = s.into().0;
        self
    }

    /// Zero padding (`1`, `[ph, pw]` or `[top, left, bottom, right]`).
    pub fn padding(mut self, p: impl Into<Pad2d>) -> Conv2D {
        self.padding = p.into().0;
        self
    }

    /// Dilation (`2` or `[dh, dw]`).
    pub fn dilation(mut self, d: impl Into<Pair>) -> Conv2D {
        self.dilation = d.into().0;
        self
    }

    /// Grouped convolution; re-creates and re-initializes the weight `[out, in/groups, kh, kw]`.
    pub fn groups(mut self, groups: usize) -> Result<Conv2D> {
        self.core = self.core.regroup("Conv2D", &self.kernel, groups)?;
        Ok(self)
    }

    /// Keep (`true`, the default) or drop the bias.
    pub fn bias(mut self, on: bool) -> Conv2D {
        self.core.set_bias(on);
        self
    }

    /// The same layer with parameters converted to `dtype`.
    pub fn dtype(mut self, dtype: DType) -> Result<Conv2D> {
        self.core.recast(dtype)?;
        Ok(self)
    }

    /// The weight `[out, in/groups, kh, kw]`.
    pub fn weight(&self) -> &Tensor {
        &self.core.weight
    }

    /// The bias `[out]`, if any.
    pub fn bias_tensor(&self) -> Option<&Tensor> {
        self.core.bias.as_ref()
    }

    fn fold(&mut self, scale: &[f32], shift: &[f32]) -> Result<()> {
        let c = &mut self.core;
        let o = c.out_channels;
        if self.quant.is_some() {
            return Err(Error::invalid(
                "Conv2D",
                "fold batch norms before quantizing: the weight quantizer has observed the unfolded weight",
            ));
        }
        if scale.len() != o || shift.len() != o {
            return Err(Error::invalid(
                "Conv2D",
                format!(
                    "cannot fold a {}-channel batch norm into {o} output channels",
                    scale.len()
                ),
            ));
        }
        if c.weight.dtype() != DType::F32 {
            return Err(Error::invalid(
                "Conv2D",
                format!("folds f32 weights, not {}", c.weight.dtype()),
            ));
        }
        let w = c.weight.try_data()?;
        let mut wv = w.to_vec::<f32>()?;
        let per = wv.len() / o.max(1);
        for (ch, row) in wv.chunks_mut(per.max(1)).enumerate() {
            row.iter_mut().for_each(|v| *v *= scale[ch]);
        }
        c.weight.set_data(TensorData::from_vec(w.shape().to_vec(), wv)?)?;
        let b: Vec<f32> = match &c.bias {
            Some(b) => b.try_data()?.to_vec::<f32>()?,
            None => vec![0.0; o],
        };
        let folded: Vec<f32> = (0..o).map(|ch| b[ch] * scale[ch] + shift[ch]).collect();
        let data = TensorData::from_vec(vec![o], folded)?;
        match &c.bias {
            Some(b) => b.set_data(data)?,
            None => c.bias = Some(Tensor::parameter(data)?),
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let c = &self.core;
        format!(
            "Conv2D(in_channels={}, out_channels={}, kernel={:?}, stride={:?}, padding={:?}, dilation={:?}, groups={})",
            c.in_channels, c.out_channels, self.kernel, self.stride, self.padding, self.dilation, c.groups
        )
    }
}

impl Layer for Conv2D {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = &self.core;
        let conv = |x: &Tensor, w: &Tensor| {
            F::conv2d(
                x,
                w,
                c.bias.as_ref(),
                self.stride,
                self.padding,
                self.dilation,
                c.groups,
            )
        };
        let y = match &self.quant {
            Some(q) => q.apply(x, &c.weight).and_then(|(x, w)| conv(&x, &w)),
            None => conv(x, &c.weight),
        };
        ctx(|| self.describe(), y)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        self.core.params()
    }

    /// Fake quantization of the input and of the weight per output channel (axis 0).
    fn quantize_with(&mut self, q: &dyn Quantizer) -> Result<usize> {
        self.quant = Some(q.pair(0, self.core.out_channels)?);
        Ok(1)
    }

    /// `weight[o] · scale[o]`, `bias[o] · scale[o] + shift[o]` (a bias is added if there was
    /// none): a following batch norm folded in. f32 weights, before quantization.
    fn fold_affine(&mut self, scale: &[f32], shift: &[f32]) -> Option<Result<()>> {
        Some(self.fold(scale, shift))
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        self.quant.as_ref().map_or_else(Vec::new, QuantPair::sublayers)
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        self.quant.as_mut().map_or_else(Vec::new, QuantPair::sublayers_mut)
    }
}

/// 1-d convolution of `x[N,C,L]`. Parameters: `weight` `[out, in/groups, k]`, `bias` `[out]`.
/// Options: `.stride(s)`, `.padding(p)` (`p` or `[left, right]`), `.dilation(d)`, `.groups(g)?`,
/// `.bias(false)`.
pub struct Conv1D {
    core: ConvCore,
    kernel: usize,
    stride: usize,
    padding: [usize; 2],
    dilation: usize,
}

impl Conv1D {
    /// A float32 convolution from `in_channels` to `out_channels` with kernel size `kernel`.
    pub fn new(in_channels: usize, out_channels: usize, kernel: usize) -> Result<Conv1D> {
        Ok(Conv1D {
            core: ConvCore::new("Conv1D", in_channels, out_channels, &[kernel], 1)?,
            kernel,
            stride: 1,
            padding: [0, 0],
            dilation: 1,
        })
    }

    /// Stride.
    pub fn stride(mut self, s: usize) -> Conv1D {
        self.stride = s;
        self
    }

    /// Zero padding: `p` or `[left, right]`.
    pub fn padding(mut self, p: impl Into<Pair>) -> Conv1D {
        self.padding = p.into().0;
        self
    }

    /// Dilation.
    pub fn dilation(mut self, d: usize) -> Conv1D {
        self.dilation = d;
        self
    }

    /// Grouped convolution; re-creates and re-initializes the weight `[out, in/groups, k]`.
    pub fn groups(mut self, groups: usize) -> Result<Conv1D> {
        self.core = self.core.regroup("Conv1D", &[self.kernel], groups)?;
        Ok(self)
    }

    /// Keep (`true`, the default) or drop the bias.
    pub fn bias(mut self, on: bool) -> Conv1D {
        self.core.set_bias(on);
        self
    }

    /// The same layer with parameters converted to `dtype`.
    pub fn dtype(mut self, dtype: DType) -> Result<Conv1D> {
        self.core.recast(dtype)?;
        Ok(self)
    }

    /// The weight `[out, in/groups, k]`.
    pub fn weight(&self) -> &Tensor {
        &self.core.weight
    }

    /// The bias `[out]`, if any.
    pub fn bias_tensor(&self) -> Option<&Tensor> {
        self.core.bias.as_ref()
    }

    fn describe(&self) -> String {
        let c = &self.core;
        format!(
            "Conv1D(in_channels={}, out_channels={}, kernel={}, stride={}, padding={:?}, dilation={}, groups={})",
            c.in_channels, c.out_channels, self.kernel, self.stride, self.padding, self.dilation, c.groups
        )
    }
}

impl Layer for Conv1D {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = &self.core;
        let y = F::conv1d(
            x,
            &c.weight,
            c.bias.as_ref(),
            self.stride,
            self.padding,
            self.dilation,
            c.groups,
        );
        ctx(|| self.describe(), y)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        self.core.params()
    }
}

/// Transposed convolution over any number of spatial axes (Paddle's `Conv1DTranspose`,
/// `Conv2DTranspose`, `Conv3DTranspose`; the rank comes from the kernel). Parameters:
/// `weight` `[in, out/groups, *kernel]`, `bias` `[out]`. Options (one value for every axis, or
/// one per axis): `.stride(..)`, `.padding(..)`, `.output_padding(..)`, `.dilation(..)`,
/// `.groups(g)?`, `.bias(false)`.
pub struct ConvTranspose {
    weight: Tensor,
    bias: Option<Tensor>,
    in_channels: usize,
    out_channels: usize,
    kernel: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
    output_padding: Vec<usize>,
    dilation: Vec<usize>,
    groups: usize,
}

impl ConvTranspose {
    /// A float32 transposed convolution from `in_channels` to `out_channels` with `kernel`
    /// (`&[4, 4]` for 2-d).
    pub fn new(in_channels: usize, out_channels: usize, kernel: &[usize]) -> Result<ConvTranspose> {
        if kernel.is_empty() || kernel.contains(&0) {
            return Err(Error::invalid(
                "ConvTranspose",
                format!("kernel {kernel:?} needs ≥ 1 positive entries"),
            ));
        }
        let d = kernel.len();
        let mut c = ConvTranspose {
            weight: param(&[1], DType::F32)?,
            bias: None,
            in_channels,
            out_channels,
            kernel: kernel.to_vec(),
            stride: vec![1; d],
            padding: vec![0; d],
            output_padding: vec![0; d],
            dilation: vec![1; d],
            groups: 1,
        };
        c.init(1, true)?;
        Ok(c)
    }

    /// (Re)create the parameters for `groups`.
    fn init(&mut self, groups: usize, bias: bool) -> Result<()> {
        let (i, o) = (self.in_channels, self.out_channels);
        if groups == 0 || i % groups != 0 || o % groups != 0 {
            return Err(Error::invalid(
                "ConvTranspose",
                format!("groups={groups} must be ≥ 1 and divide in_channels={i} and out_channels={o}"),
            ));
        }
        let mut shape = vec![i, o / groups];
        shape.extend_from_slice(&self.kernel);
        let dtype = self.weight.dtype();
        self.weight = param(&shape, DType::F32)?;
        init::kaiming_normal(&self.weight, 0.0)?;
        self.weight = recast(&self.weight, dtype)?;
        self.bias = if bias { Some(param(&[o], dtype)?) } else { None };
        self.groups = groups;
        Ok(())
    }

    /// One value per spatial axis from `v` (one value for all, or one each).
    fn per_axis(&self, what: &str, v: &[usize]) -> Result<Vec<usize>> {
        match v.len() {
            1 => Ok(vec![v[0]; self.kernel.len()]),
            n if n == self.kernel.len() => Ok(v.to_vec()),
            _ => Err(Error::invalid(
                "ConvTranspose",
                format!("{what} {v:?} needs 1 or {} entries", self.kernel.len()),
            )),
        }
    }

    /// Stride.
    pub fn stride(mut self, s: &[usize]) -> Result<ConvTranspose> {
        self.stride = self.per_axis("stride", s)?;
        Ok(self)
    }

    /// Padding removed on both sides of each axis.
    pub fn padding(mut self, p: &[usize]) -> Result<ConvTranspose> {
        self.padding = self.per_axis("padding", p)?;
        Ok(self)
    }

    /// Extra output rows after each axis (smaller than the stride or dilation).
    pub fn output_padding(mut self, p: &[usize]) -> Result<ConvTranspose> {
        self.output_padding = self.per_axis("output_padding", p)?;
        Ok(self)
    }

    /// Dilation.
    pub fn dilation(mut self, d: &[usize]) -> Result<ConvTranspose> {
        self.dilation = self.per_axis("dilation", d)?;
        Ok(self)
    }

    /// Grouped; re-creates and re-initializes the weight `[in, out/groups, *kernel]`.
    pub fn groups(mut self, groups: usize) -> Result<ConvTranspose> {
        let bias = self.bias.is_some();
        self.init(groups, bias)?;
        Ok(self)
    }

    /// Keep (`true`, the default) or drop the bias.
    pub fn bias(mut self, on: bool) -> ConvTranspose {
        if !on {
            self.bias = None;
        } else if self.bias.is_none() {
            self.bias = param(&[self.out_channels], self.weight.dtype()).ok();
        }
        self
    }

    /// The same layer with parameters converted to `dtype`.
    pub fn dtype(mut self, dtype: DType) -> Result<ConvTranspose> {
        self.weight = recast(&self.weight, dtype)?;
        self.bias = self.bias.as_ref().map(|b| recast(b, dtype)).transpose()?;
        Ok(self)
    }

    /// The weight `[in, out/groups, *kernel]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias `[out]`, if any.
    pub fn bias_tensor(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    fn describe(&self) -> String {
        format!(
            "ConvTranspose(in_channels={}, out_channels={}, kernel={:?}, stride={:?}, padding={:?}, output_padding={:?}, dilation={:?}, groups={})",
            self.in_channels,
            self.out_channels,
            self.kernel,
            self.stride,
            self.padding,
            self.output_padding,
            self.dilation,
            self.groups
        )
    }
}

impl Layer for ConvTranspose {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = F::conv_transpose(
            x,
            &self.weight,
            self.bias.as_ref(),
            &self.stride,
            &self.padding,
            &self.output_padding,
            &self.dilation,
            self.groups,
        );
        ctx(|| self.describe(), y)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        v.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        v
    }
}
