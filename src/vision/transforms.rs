//! Image transforms, as `paddle.vision.transforms` and torchvision's tensor transforms: each
//! maps one image, a `[C, H, W]` float tensor (what [`ToTensor`] makes of an `[H, W, C]` u8
//! image), to another; [`Compose`] chains them. Random transforms draw from oar's global
//! generator, so `oar::seed` fixes them; inside a seeded `DataLoader` each sample draws from its
//! own generator, the same for any worker count.
//!
//! Tested against onnxruntime's `Resize` and numpy's `pad` (`tools/gen_transform_fixtures.py`)
//! and torchvision's color adjustments (`tools/gen_color_fixtures.py`).

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
    fn window(&self, top: usize, left: usize, h: usize, w: usize) -> Image {
        let mut v = Vec::with_capacity(self.c * h * w);
        for c in 0..self.c {
            for y in top..top + h {
                v.extend((left..left + w).map(|x| self.at(c, y, x)));
            }
        }
        Image { c: self.c, h, w, v }
    }

    /// [`Image::window`] as a tensor.
    fn crop(&self, top: usize, left: usize, h: usize, w: usize) -> Result<Tensor> {
        self.window(top, left, h, w).into_tensor()
    }

    fn into_tensor(self) -> Result<Tensor> {
        Image::tensor(self.c, self.h, self.w, self.v)
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

/// `im` resized bilinearly to `h × w` ([`Resize`]'s arithmetic).
fn resize(op: &str, im: &Image, h: usize, w: usize) -> Result<Tensor> {
    if im.h == 0 || im.w == 0 {
        return Err(Error::invalid(op, "an empty image"));
    }
    let (ty, tx) = (taps(im.h, h), taps(im.w, w));
    let mut v = Vec::with_capacity(im.c * h * w);
    for c in 0..im.c {
        for &(y0, y1, wy) in &ty {
            for &(x0, x1, wx) in &tx {
                let top = im.at(c, y0, x0) * (1.0 - wx) + im.at(c, y0, x1) * wx;
                let bottom = im.at(c, y1, x0) * (1.0 - wx) + im.at(c, y1, x1) * wx;
                v.push(top * (1.0 - wy) + bottom * wy);
            }
        }
    }
    Image::tensor(im.c, h, w, v)
}

impl Transform for Resize {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        resize("Resize", &Image::of("Resize", image)?, self.h, self.w)
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

/// A random window of random area and aspect ratio, resized to `h × w` (torchvision's and
/// Paddle's `RandomResizedCrop`, the ImageNet training crop): up to ten tries draw an area
/// fraction uniformly from `scale` and an aspect ratio log-uniformly from `ratio`, and take the
/// first window that fits, at a uniform position; if none fits, the largest central window
/// whose ratio is within `ratio`. Resizing is [`Resize`]'s bilinear.
pub struct RandomResizedCrop {
    h: usize,
    w: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
}

impl RandomResizedCrop {
    /// Output `h × w`, with the defaults `scale = (0.08, 1.0)`, `ratio = (3/4, 4/3)`.
    pub fn new(h: usize, w: usize) -> Result<RandomResizedCrop> {
        if h == 0 || w == 0 {
            return Err(Error::invalid("RandomResizedCrop", format!("size {h} × {w} is empty")));
        }
        Ok(RandomResizedCrop {
            h,
            w,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
        })
    }

    /// The range of the window's area as a fraction of the image's (`0 < lo ≤ hi`).
    pub fn scale(mut self, lo: f64, hi: f64) -> Result<RandomResizedCrop> {
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            return Err(Error::invalid(
                "RandomResizedCrop",
                format!("scale ({lo}, {hi}) must satisfy 0 < lo <= hi"),
            ));
        }
        self.scale = (lo, hi);
        Ok(self)
    }

    /// The range of the window's width / height (`0 < lo ≤ hi`).
    pub fn ratio(mut self, lo: f64, hi: f64) -> Result<RandomResizedCrop> {
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            return Err(Error::invalid(
                "RandomResizedCrop",
                format!("ratio ({lo}, {hi}) must satisfy 0 < lo <= hi"),
            ));
        }
        self.ratio = (lo, hi);
        Ok(self)
    }

    /// The window `(top, left, height, width)` for an `ih × iw` image.
    fn window(&self, ih: usize, iw: usize) -> (usize, usize, usize, usize) {
        let area = (ih * iw) as f64;
        let (log_lo, log_hi) = (self.ratio.0.ln(), self.ratio.1.ln());
        for _ in 0..10 {
            let (target, aspect) = crate::tensor::with_rng(|r| {
                (
                    area * r.random_range(self.scale.0..=self.scale.1),
                    r.random_range(log_lo..=log_hi).exp(),
                )
            });
            let w = (target * aspect).sqrt().round() as usize;
            let h = (target / aspect).sqrt().round() as usize;
            if (1..=iw).contains(&w) && (1..=ih).contains(&h) {
                let (top, left) = crate::tensor::with_rng(|r| (r.random_range(0..=ih - h), r.random_range(0..=iw - w)));
                return (top, left, h, w);
            }
        }
        let in_ratio = iw as f64 / ih as f64;
        let (h, w) = if in_ratio < self.ratio.0 {
            ((iw as f64 / self.ratio.0).round() as usize, iw)
        } else if in_ratio > self.ratio.1 {
            (ih, (ih as f64 * self.ratio.1).round() as usize)
        } else {
            (ih, iw)
        };
        let (h, w) = (h.clamp(1, ih), w.clamp(1, iw));
        ((ih - h) / 2, (iw - w) / 2, h, w)
    }
}

impl Transform for RandomResizedCrop {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        let im = Image::of("RandomResizedCrop", image)?;
        if im.h == 0 || im.w == 0 {
            return Err(Error::invalid("RandomResizedCrop", "an empty image"));
        }
        let (top, left, h, w) = self.window(im.h, im.w);
        resize("RandomResizedCrop", &im.window(top, left, h, w), self.h, self.w)
    }
}

/// ITU-R 601 luma, as torchvision's `rgb_to_grayscale`.
fn gray(r: f32, g: f32, b: f32) -> f32 {
    0.2989 * r + 0.587 * g + 0.114 * b
}

/// `factor · x + (1 − factor) · other`, clamped to `[0, 1]` (torchvision's `_blend`).
fn blend(x: f32, other: f32, factor: f32) -> f32 {
    (factor * x + (1.0 - factor) * other).clamp(0.0, 1.0)
}

/// The color adjustments of [`ColorJitter`], as torchvision's `adjust_*` functions on float
/// images in `[0, 1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ColorAdjust {
    /// Scale every value by the factor (0 gives black).
    Brightness(f32),
    /// Blend with the image's mean gray level (0 gives a uniform gray).
    Contrast(f32),
    /// Blend with the pixel's gray level (0 gives a gray image); a 1-channel image is left as
    /// it is.
    Saturation(f32),
    /// Rotate the hue by the given fraction of a turn, in `[-0.5, 0.5]`; a 1-channel image is
    /// left as it is.
    Hue(f32),
}

impl ColorAdjust {
    fn apply_to(self, im: &mut Image) -> Result<()> {
        let plane = im.h * im.w;
        // Saturation and hue: true for RGB, false for gray (unchanged, as torchvision).
        let rgb = |op: &str, im: &Image| match im.c {
            3 => Ok(true),
            1 => Ok(false),
            c => Err(Error::invalid(
                op,
                format!("needs a 1- or 3-channel image, got {c} channels"),
            )),
        };
        match self {
            ColorAdjust::Brightness(f) => im.v.iter_mut().for_each(|x| *x = blend(*x, 0.0, f)),
            ColorAdjust::Contrast(f) => {
                let mean = match im.c {
                    3 => {
                        let (r, rest) = im.v.split_at(plane);
                        let (g, b) = rest.split_at(plane);
                        let sum: f64 = (0..plane).map(|i| gray(r[i], g[i], b[i]) as f64).sum();
                        (sum / plane.max(1) as f64) as f32
                    }
                    1 => (im.v.iter().map(|&x| x as f64).sum::<f64>() / plane.max(1) as f64) as f32,
                    c => {
                        return Err(Error::invalid(
                            "ColorJitter",
                            format!("contrast needs a 1- or 3-channel image, got {c} channels"),
                        ));
                    }
                };
                im.v.iter_mut().for_each(|x| *x = blend(*x, mean, f));
            }
            ColorAdjust::Saturation(f) => {
                if !rgb("ColorJitter (saturation)", im)? {
                    return Ok(());
                }
                for i in 0..plane {
                    let l = gray(im.v[i], im.v[plane + i], im.v[2 * plane + i]);
                    for c in 0..3 {
                        let x = &mut im.v[c * plane + i];
                        *x = blend(*x, l, f);
                    }
                }
            }
            ColorAdjust::Hue(f) => {
                if !(-0.5..=0.5).contains(&f) {
                    return Err(Error::invalid(
                        "ColorJitter",
                        format!("hue shift {f} is outside [-0.5, 0.5]"),
                    ));
                }
                if !rgb("ColorJitter (hue)", im)? {
                    return Ok(());
                }
                for i in 0..plane {
                    let (h, s, v) = rgb_to_hsv(im.v[i], im.v[plane + i], im.v[2 * plane + i]);
                    let (r, g, b) = hsv_to_rgb((h + f).rem_euclid(1.0), s, v);
                    (im.v[i], im.v[plane + i], im.v[2 * plane + i]) = (r, g, b);
                }
            }
        }
        Ok(())
    }
}

impl Transform for ColorAdjust {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        let mut im = Image::of("ColorJitter", image)?;
        self.apply_to(&mut im)?;
        im.into_tensor()
    }
}

/// torchvision's `_rgb2hsv`: hue in `[0, 1)`.
fn rgb_to_hsv(r: f32, g: f32, b: f32) -> (f32, f32, f32) {
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    let cr = maxc - minc;
    let eqc = cr == 0.0;
    let s = cr / if eqc { 1.0 } else { maxc };
    let crd = if eqc { 1.0 } else { cr };
    let (rc, gc, bc) = ((maxc - r) / crd, (maxc - g) / crd, (maxc - b) / crd);
    let hr = if maxc == r { bc - gc } else { 0.0 };
    let hg = if maxc == g && maxc != r { 2.0 + rc - bc } else { 0.0 };
    let hb = if maxc != g && maxc != r { 4.0 + gc - rc } else { 0.0 };
    let h = ((hr + hg + hb) / 6.0 + 1.0).rem_euclid(1.0);
    (h, s, maxc)
}

/// torchvision's `_hsv2rgb`.
fn hsv_to_rgb(h: f32, s: f32, v: f32) -> (f32, f32, f32) {
    let i = (h * 6.0).floor();
    let f = h * 6.0 - i;
    let i = (i as i64).rem_euclid(6);
    let p = (v * (1.0 - s)).clamp(0.0, 1.0);
    let q = (v * (1.0 - s * f)).clamp(0.0, 1.0);
    let t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0);
    match i {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    }
}

/// Random brightness, contrast, saturation and hue changes in a random order (torchvision's
/// and Paddle's `ColorJitter`): each factor is drawn uniformly from `[max(0, 1 − x), 1 + x]`
/// for brightness, contrast and saturation `x`, the hue shift from `[−hue, hue]`; a zero
/// amount leaves that adjustment out.
pub struct ColorJitter {
    brightness: f32,
    contrast: f32,
    saturation: f32,
    hue: f32,
}

impl ColorJitter {
    /// Amounts for each adjustment (each ≥ 0; `hue` ≤ 0.5).
    pub fn new(brightness: f32, contrast: f32, saturation: f32, hue: f32) -> Result<ColorJitter> {
        for (name, x) in [
            ("brightness", brightness),
            ("contrast", contrast),
            ("saturation", saturation),
        ] {
            if !(x >= 0.0 && x.is_finite()) {
                return Err(Error::invalid("ColorJitter", format!("{name} {x} must be >= 0")));
            }
        }
        if !(0.0..=0.5).contains(&hue) {
            return Err(Error::invalid("ColorJitter", format!("hue {hue} must be in [0, 0.5]")));
        }
        Ok(ColorJitter {
            brightness,
            contrast,
            saturation,
            hue,
        })
    }
}

impl Transform for ColorJitter {
    fn apply(&self, image: &Tensor) -> Result<Tensor> {
        use rand::seq::SliceRandom;
        let mut im = Image::of("ColorJitter", image)?;
        let mut order = [0usize, 1, 2, 3];
        let factor = |r: &mut rand::rngs::StdRng, x: f32| r.random_range((1.0 - x).max(0.0)..=1.0 + x);
        let adjusts = crate::tensor::with_rng(|r| {
            order.shuffle(r);
            order.map(|i| match i {
                0 if self.brightness > 0.0 => Some(ColorAdjust::Brightness(factor(r, self.brightness))),
                1 if self.contrast > 0.0 => Some(ColorAdjust::Contrast(factor(r, self.contrast))),
                2 if self.saturation > 0.0 => Some(ColorAdjust::Saturation(factor(r, self.saturation))),
                3 if self.hue > 0.0 => Some(ColorAdjust::Hue(r.random_range(-self.hue..=self.hue))),
                _ => None,
            })
        });
        for a in adjusts.into_iter().flatten() {
            a.apply_to(&mut im)?;
        }
        im.into_tensor()
    }
}
