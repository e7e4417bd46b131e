//! Image transforms, as `paddle.vision.transforms` and torchvision's tensor transforms: each
//! maps one image, a `[C, H, W]` float tensor (what [`ToTensor`] makes of an `[H, W, C]` u8
//! image), to another; [`Compose`] chains them. Random transforms draw from oar's global
//! generator, so `oar::seed` fixes them (in a `DataLoader` with workers the draws interleave
//! as the workers run).
//!
//! Tested against onnxruntime's `Resize` and numpy's `pad` (`tools/gen_transform_fixtures.py`).

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData};
use rand::Rng;

/// One image in, one image out.
pub trait Transform: Send + Sync {
    /// Transform `image`.
    fn apply(&self, image: &Tensor) -> Result<Tensor>;
}

/// A `[C, H, W]` image's values, row-major.
struct Image {
    c: usize,
    h: usize,
    w: usize,
    v: Vec<f32>,
}

impl Image {
    /// `t`'s `[C, H, W]`, if it is a float image.
    fn check(op: &str, t: &Tensor) -> Result<[usize; 3]> {
        let shape = t.shape();
        let [c, h, w] = shape[..] else {
            return Err(Error::invalid(op, format!("an image is [C, H, W], got {shape:?}")));
        };
        if !t.dtype().is_float() {
            return Err(Error::invalid(
                op,
                format!("images are float [C, H, W] (ToTensor makes them), got {}", t.dtype()),
            ));
        }
        Ok([c, h, w])
    }

    fn of(op: &str, t: &Tensor) -> Result<Image> {
        let [c, h, w] = Image::check(op, t)?;
        let v = t
            .detach()
            .try_data()?
            .to_f64_vec()
            .into_iter()
            .map(|x| x as f32)
            .collect();
        Ok(Image { c, h, w, v })
    }

    fn at(&self, c: usize, y: usize, x: usize) -> f32 {
        self.v[(c * self.h + y) * self.w + x]
    }

    fn tensor(c: usize, h: usize, w: usize, v: Vec<f32>) -> Result<Tensor> {
        Ok(Tensor::from_data(TensorData::from_vec(vec![c, h, w], v)?))
    }

    /// The window `h × w` at (`top`, `left`), inside the image.
    fn crop(&self, top: usize, left: usize, h: usize, w: usize) -> Result<Tensor> {
        let mut v = Vec::with_capacity(self.c * h * w);
        for c in 0..self.c {
            for y in top..top + h {
                v.extend((left..left + w).map(|x| self.at(c, y, x)));
            }
        }
        Image::tensor(self.c, h, w, v)
    }
}

/// Transforms applied in order.
pub struct Compose(pub Vec<Box<dyn Transform>>);

impl Transform for Compose {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        let mut x = image.clone();
        for t in &self.0 {
            x = t.apply(&x)?;
        }
        Ok(x)
    }
}

/// An `[H, W, C]` (or `[H, W]`) u8 image to a `[C, H, W]` f32 one in `[0, 1]` (÷ 255).
pub struct ToTensor;

impl Transform for ToTensor {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        let shape = image.shape();
        let (h, w, c) = match shape[..] {
            [h, w, c] => (h, w, c),
            [h, w] => (h, w, 1),
            _ => {
                return Err(Error::invalid(
                    "ToTensor",
                    format!("an image is [H, W, C] or [H, W] u8, got {shape:?}"),
                ));
            }
        };
        if image.dtype() != DType::U8 {
            return Err(Error::invalid(
                "ToTensor",
                format!("takes u8 images, got {}", image.dtype()),
            ));
        }
        let px = image.detach().try_data()?.to_f64_vec();
        let mut v = vec![0f32; c * h * w];
        for (i, p) in px.iter().enumerate() {
            let (y, x, ch) = (i / (w * c), (i / c) % w, i % c);
            v[(ch * h + y) * w + x] = (*p / 255.0) as f32;
        }
        Image::tensor(c, h, w, v)
    }
}

/// `(x - mean[c]) / std[c]` per channel.
pub struct Normalize {
    mean: Vec<f32>,
    std: Vec<f32>,
}

impl Normalize {
    /// Per-channel means and standard deviations (none zero).
    pub fn new(mean: &[f32], std: &[f32]) -> Result<Normalize> {
        if mean.len() != std.len() || std.iter().any(|s| *s == 0.0 || !s.is_finite()) {
            return Err(Error::invalid(
                "Normalize",
                format!("mean {mean:?} and std {std:?}: one of each per channel, std finite and nonzero"),
            ));
        }
        Ok(Normalize {
            mean: mean.to_vec(),
            std: std.to_vec(),
        })
    }
}

impl Transform for Normalize {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        let im = Image::of("Normalize", image)?;
        if im.c != self.mean.len() {
            return Err(Error::invalid(
                "Normalize",
                format!("{} channels for {} means", im.c, self.mean.len()),
            ));
        }
        let plane = im.h * im.w;
        let v =
            im.v.iter()
                .enumerate()
                .map(|(i, x)| (x - self.mean[i / plane]) / self.std[i / plane])
                .collect();
        Image::tensor(im.c, im.h, im.w, v)
    }
}

/// Bilinear resizing to `h × w`, pixel centers aligned (half-pixel; no antialiasing:
/// torchvision's tensor `Resize(antialias=False)`, onnxruntime's linear `Resize`).
pub struct Resize {
    h: usize,
    w: usize,
}

impl Resize {
    /// To `h × w` (both ≥ 1).
    pub fn new(h: usize, w: usize) -> Result<Resize> {
        if h == 0 || w == 0 {
            return Err(Error::invalid("Resize", format!("size {h} × {w} is empty")));
        }
        Ok(Resize { h, w })
    }
}

/// For each output index along an axis of `n_in` → `n_out`: the two input indices and the
/// second one's weight.
fn taps(n_in: usize, n_out: usize) -> Vec<(usize, usize, f32)> {
    let scale = n_out as f32 / n_in as f32;
    (0..n_out)
        .map(|o| {
            let src = ((o as f32 + 0.5) / scale - 0.5).clamp(0.0, (n_in - 1) as f32);
            let i0 = src.floor() as usize;
            let i1 = (i0 + 1).min(n_in - 1);
            (i0, i1, src - i0 as f32)
        })
        .collect()
}

impl Transform for Resize {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        let im = Image::of("Resize", image)?;
        if im.h == 0 || im.w == 0 {
            return Err(Error::invalid("Resize", "an empty image"));
        }
        let (ty, tx) = (taps(im.h, self.h), taps(im.w, self.w));
        let mut v = Vec::with_capacity(im.c * self.h * self.w);
        for c in 0..im.c {
            for &(y0, y1, wy) in &ty {
                for &(x0, x1, wx) in &tx {
                    let top = im.at(c, y0, x0) * (1.0 - wx) + im.at(c, y0, x1) * wx;
                    let bottom = im.at(c, y1, x0) * (1.0 - wx) + im.at(c, y1, x1) * wx;
                    v.push(top * (1.0 - wy) + bottom * wy);
                }
            }
        }
        Image::tensor(im.c, self.h, self.w, v)
    }
}

/// The central `h × w` window (the offset rounded half to even, as torchvision and Paddle).
pub struct CenterCrop {
    h: usize,
    w: usize,
}

impl CenterCrop {
    /// An `h × w` crop.
    pub fn new(h: usize, w: usize) -> CenterCrop {
        CenterCrop { h, w }
    }
}

impl Transform for CenterCrop {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        let im = Image::of("CenterCrop", image)?;
        if self.h > im.h || self.w > im.w {
            return Err(Error::invalid(
                "CenterCrop",
                format!("a {} × {} crop of a {} × {} image", self.h, self.w, im.h, im.w),
            ));
        }
        let off = |n: usize, k: usize| ((n - k) as f64 / 2.0).round_ties_even() as usize;
        im.crop(off(im.h, self.h), off(im.w, self.w), self.h, self.w)
    }
}

/// How [`Pad`] fills the border.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// A constant value.
    Constant(f32),
    /// The nearest edge pixel.
    Edge,
    /// The mirror image without repeating the edge (`numpy.pad` `reflect`).
    Reflect,
}

/// Padding by `(top, left, bottom, right)` pixels.
#[derive(Clone, Copy, Debug)]
pub struct Pad {
    top: usize,
    left: usize,
    bottom: usize,
    right: usize,
    mode: PadMode,
}

impl Pad {
    /// `(top, left, bottom, right)` in `mode`.
    pub fn new(top: usize, left: usize, bottom: usize, right: usize, mode: PadMode) -> Pad {
        Pad {
            top,
            left,
            bottom,
            right,
            mode,
        }
    }

    fn pad(&self, im: &Image) -> Result<Image> {
        if self.mode == PadMode::Reflect
            && (self.top.max(self.bottom) >= im.h.max(1) || self.left.max(self.right) >= im.w.max(1))
        {
            return Err(Error::invalid(
                "Pad",
                format!(
                    "reflect padding of ({}, {}, {}, {}) needs an image larger than it, got {} × {}",
                    self.top, self.left, self.bottom, self.right, im.h, im.w
                ),
            ));
        }
        if (im.h == 0 || im.w == 0) && !matches!(self.mode, PadMode::Constant(_)) {
            return Err(Error::invalid("Pad", "an empty image has no edge to repeat"));
        }
        let (h, w) = (im.h + self.top + self.bottom, im.w + self.left + self.right);
        let src = |i: isize, n: usize| -> Option<usize> {
            let n = n as isize;
            match self.mode {
                _ if (0..n).contains(&i) => Some(i as usize),
                PadMode::Constant(_) => None,
                PadMode::Edge => Some(i.clamp(0, n - 1) as usize),
                PadMode::Reflect => Some(if i < 0 { -i } else { 2 * (n - 1) - i } as usize),
            }
        };
        let fill = match self.mode {
            PadMode::Constant(v) => v,
            _ => 0.0,
        };
        let mut v = Vec::with_capacity(im.c * h * w);
        for c in 0..im.c {
            for y in 0..h {
                let sy = src(y as isize - self.top as isize, im.h);
                for x in 0..w {
                    let sx = src(x as isize - self.left as isize, im.w);
                    v.push(match (sy, sx) {
                        (Some(sy), Some(sx)) => im.at(c, sy, sx),
                        _ => fill,
                    });
                }
            }
        }
        Ok(Image { c: im.c, h, w, v })
    }
}

impl Transform for Pad {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        let p = self.pad(&Image::of("Pad", image)?)?;
        Image::tensor(p.c, p.h, p.w, p.v)
    }
}

/// Mirror left–right with probability `p`.
pub struct RandomHorizontalFlip {
    p: f64,
}

impl RandomHorizontalFlip {
    /// With probability `p` in `[0, 1]`.
    pub fn new(p: f64) -> Result<RandomHorizontalFlip> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(
                "RandomHorizontalFlip",
                format!("probability {p} is not in [0, 1]"),
            ));
        }
        Ok(RandomHorizontalFlip { p })
    }
}

impl Transform for RandomHorizontalFlip {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        Image::check("RandomHorizontalFlip", image)?;
        if !crate::tensor::with_rng(|r| r.random_bool(self.p)) {
            return Ok(image.clone());
        }
        let im = Image::of("RandomHorizontalFlip", image)?;
        let mut v = im.v;
        for row in v.chunks_mut(im.w.max(1)) {
            row.reverse();
        }
        Image::tensor(im.c, im.h, im.w, v)
    }
}

/// A random `h × w` window, after an optional padding.
pub struct RandomCrop {
    h: usize,
    w: usize,
    pad: Option<Pad>,
}

impl RandomCrop {
    /// An `h × w` crop.
    pub fn new(h: usize, w: usize) -> RandomCrop {
        RandomCrop { h, w, pad: None }
    }

    /// Pad first (CIFAR's `RandomCrop(32, padding=4)`).
    pub fn padding(mut self, pad: Pad) -> RandomCrop {
        self.pad = Some(pad);
        self
    }
}

impl Transform for RandomCrop {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        let mut im = Image::of("RandomCrop", image)?;
        if let Some(p) = &self.pad {
            im = p.pad(&im)?;
        }
        if self.h > im.h || self.w > im.w {
            return Err(Error::invalid(
                "RandomCrop",
                format!("a {} × {} crop of a {} × {} image", self.h, self.w, im.h, im.w),
            ));
        }
        let (top, left) =
            crate::tensor::with_rng(|r| (r.random_range(0..=im.h - self.h), r.random_range(0..=im.w - self.w)));
        im.crop(top, left, self.h, self.w)
    }
}
