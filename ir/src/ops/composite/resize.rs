//! `resize` (ONNX Resize, PyTorch `interpolate`): nearest, linear (bilinear, trilinear) and
//! cubic resampling of the trailing axes, with ONNX's coordinate transformations.
//!
//! Each resized axis is resampled on its own (the modes are separable): output index `i` maps
//! to a source coordinate `c` (`half_pixel`: `(i + 0.5)/s - 0.5`; `pytorch_half_pixel`: the
//! same, or 0 when the output has one element; `align_corners`: `i·(n-1)/(s·n-1)`;
//! `asymmetric`: `i/s`; `half_pixel_symmetric`: `half_pixel` shifted by `n/2·(1 - m/(s·n))`;
//! `s` is the given scale or `m/n`), which picks one source element (nearest, rounded
//! by `nearest`), two (linear) or four (cubic, Keys' kernel with coefficient `cubic_a`) with
//! weights; source indices outside the axis are clamped to its edge (or, with
//! `exclude_outside`, dropped and the weights renormalized). PyTorch's modes: `nearest` is
//! `asymmetric` + `floor`, `nearest-exact` is `half_pixel` + `round_prefer_ceil`,
//! `(bi|tri)linear`/`bicubic` are `half_pixel` (or `align_corners`) with `cubic_a = -0.75`.
//!
//! Decomposition: per resized axis and tap, a `gather` with a constant index vector times a
//! constant weight vector, summed — primitives every backend has, differentiable through
//! gather's scatter-add.

use super::super::rules::{R, arity, float, out_elements};
use super::super::sample::{Domain, Sample, input, input_in};
use super::{V, composite_def, one, reshape};
use crate::eval::{Data, EvalCx, Res, Value};
use crate::ops::{BinaryOp, Composite, Float, Gather, OpDef, named_enum, op_struct};
use crate::text::word_attr;
use crate::{DType, Dim, Emitter, Graph, Op, TensorData, TensorType};
use ndarray::{ArrayD, Axis};

named_enum!(
    /// How `resize` interpolates.
    ResizeMode {
        /// The nearest source element.
        Nearest => "nearest",
        /// Linear between the two neighbours (bilinear, trilinear over several axes).
        Linear => "linear",
        /// Cubic over four neighbours.
        Cubic => "cubic",
    }
);
word_attr!(ResizeMode);

named_enum!(
    /// How an output index maps to a source coordinate (ONNX `coordinate_transformation_mode`).
    CoordMode {
        /// `(i + 0.5)/s - 0.5`.
        HalfPixel => "half_pixel",
        /// `(i + 0.5)/s - 0.5`, or 0 for a one-element output.
        PytorchHalfPixel => "pytorch_half_pixel",
        /// `i·(n-1)/(m-1)`: the corners of input and output align.
        AlignCorners => "align_corners",
        /// `i/s`.
        Asymmetric => "asymmetric",
        /// `half_pixel` with the sampled span centred on the input (ONNX opset 19).
        HalfPixelSymmetric => "half_pixel_symmetric",
    }
);
word_attr!(CoordMode);

named_enum!(
    /// How `nearest` rounds a source coordinate (ONNX `nearest_mode`).
    NearestMode {
        /// Round half down.
        RoundPreferFloor => "round_prefer_floor",
        /// Round half up.
        RoundPreferCeil => "round_prefer_ceil",
        /// Toward -inf.
        Floor => "floor",
        /// Toward +inf.
        Ceil => "ceil",
    }
);
word_attr!(NearestMode);

op_struct! {
    /// `resize(x)`: the trailing `sizes.len()` axes resampled to `sizes`.
    Resize "resize" {
        /// Output sizes of the trailing axes.
        sizes: Vec<usize>,
        /// Scales for the coordinate transformation, one per resized axis; empty: `out/in`.
        scales: Vec<Float>,
        /// Interpolation.
        mode: ResizeMode,
        /// Coordinate transformation.
        coordinate: CoordMode,
        /// Rounding of `nearest`.
        nearest: NearestMode,
        /// Keys' cubic coefficient (ONNX default -0.75, as PyTorch).
        cubic_a: Float,
        /// Drop cubic taps outside the input and renormalize instead of clamping them.
        exclude_outside: bool,
    }
}

/// One output element's sources along an axis: `(index, weight)` pairs.
type Taps = Vec<(usize, f64)>;

impl Resize {
    /// The sources of every output index along an axis of `n` elements resized to `m`, with
    /// the resized axis' position `k` among [`Resize::sizes`].
    pub fn taps(&self, n: usize, m: usize, k: usize) -> Vec<Taps> {
        let scale = self.scales.get(k).map_or(m as f64 / n as f64, |s| s.0);
        // The output length the scale describes (ONNX: not rounded to the element count).
        let out_len = scale * n as f64;
        let coord = |i: usize| -> f64 {
            let i = i as f64;
            match self.coordinate {
                CoordMode::HalfPixel => (i + 0.5) / scale - 0.5,
                CoordMode::PytorchHalfPixel if m > 1 => (i + 0.5) / scale - 0.5,
                CoordMode::PytorchHalfPixel => 0.0,
                CoordMode::AlignCorners if out_len != 1.0 => i * (n as f64 - 1.0) / (out_len - 1.0),
                CoordMode::AlignCorners => 0.0,
                CoordMode::Asymmetric => i / scale,
                CoordMode::HalfPixelSymmetric => {
                    let offset = n as f64 / 2.0 * (1.0 - m as f64 / out_len);
                    offset + (i + 0.5) / scale - 0.5
                }
            }
        };
        let clamp = |j: i64| j.clamp(0, n as i64 - 1) as usize;
        (0..m)
            .map(|i| {
                let c = coord(i);
                match self.mode {
                    ResizeMode::Nearest => {
                        let r = match self.nearest {
                            NearestMode::RoundPreferFloor if c.fract().abs() == 0.5 => c.floor(),
                            NearestMode::RoundPreferCeil if c.fract().abs() == 0.5 => c.ceil(),
                            NearestMode::RoundPreferFloor | NearestMode::RoundPreferCeil => c.round(),
                            NearestMode::Floor => c.floor(),
                            NearestMode::Ceil => c.ceil(),
                        };
                        vec![(clamp(r as i64), 1.0)]
                    }
                    ResizeMode::Linear => {
                        let x0 = c.floor();
                        let t = c - x0;
                        vec![(clamp(x0 as i64), 1.0 - t), (clamp(x0 as i64 + 1), t)]
                    }
                    ResizeMode::Cubic => {
                        let x0 = c.floor();
                        let t = c - x0;
                        let a = self.cubic_a.0;
                        let w = [
                            ((a * (t + 1.0) - 5.0 * a) * (t + 1.0) + 8.0 * a) * (t + 1.0) - 4.0 * a,
                            ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0,
                            ((a + 2.0) * (1.0 - t) - (a + 3.0)) * (1.0 - t) * (1.0 - t) + 1.0,
                            ((a * (2.0 - t) - 5.0 * a) * (2.0 - t) + 8.0 * a) * (2.0 - t) - 4.0 * a,
                        ];
                        let mut taps: Taps = Vec::with_capacity(4);
                        for (d, &wd) in w.iter().enumerate() {
                            let j = x0 as i64 - 1 + d as i64;
                            let inside = (0..n as i64).contains(&j);
                            if inside || !self.exclude_outside {
                                taps.push((clamp(j), wd));
                            }
                        }
                        if self.exclude_outside {
                            let total: f64 = taps.iter().map(|t| t.1).sum();
                            taps.iter_mut().for_each(|t| t.1 /= total);
                        }
                        taps
                    }
                }
            })
            .collect()
    }

    /// The first resized axis of a rank-`rank` tensor.
    fn first_axis(&self, rank: usize) -> usize {
        rank - self.sizes.len()
    }
}

impl OpDef for Resize {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        if self.sizes.is_empty() || self.sizes.len() > x.rank() || self.sizes.contains(&0) {
            return Err(format!(
                "resize sizes {:?} must be positive, one per trailing axis of {x}",
                self.sizes
            ));
        }
        if !self.scales.is_empty()
            && (self.scales.len() != self.sizes.len()
                || self
                    .scales
                    .iter()
                    .any(|s| s.0.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)))
        {
            return Err(format!(
                "resize scales {:?} must be positive, one per size",
                self.scales
            ));
        }
        if self.mode != ResizeMode::Nearest {
            float(x)?;
        }
        let first = self.first_axis(x.rank());
        let mut shape = x.shape.0[..first].to_vec();
        for (d, &m) in x.shape.0[first..].iter().zip(&self.sizes) {
            match d.as_static() {
                Some(n) if n > 0 => shape.push(Dim::Static(m)),
                _ => return Err(format!("resize needs static, non-empty resized axes, got {x}")),
            }
        }
        Ok(vec![TensorType::new(x.dtype, shape)])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        let taps = match self.mode {
            ResizeMode::Nearest => 0,
            ResizeMode::Linear => 3,
            ResizeMode::Cubic => 7,
        };
        Some(taps * self.sizes.len() as u64 * out_elements(outputs)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let xt = &types[0];
        let mut run = || -> V<E> {
            let first = self.first_axis(xt.rank());
            let mut y = x[0];
            for (k, &m) in self.sizes.iter().enumerate() {
                let axis = first + k;
                let n = xt.shape.0[axis].as_static().unwrap_or(1);
                if n == m && self.scales.get(k).is_none_or(|s| s.0 == 1.0) {
                    continue;
                }
                y = resample_axis(g, y, axis, &self.taps(n, m, k), xt.dtype)?;
            }
            Ok(y)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[1])?;
        let x = ins[0];
        let rank = x.shape().len();
        if self.sizes.is_empty() || self.sizes.len() > rank {
            return Err(site.err(format!("sizes {:?} for a rank-{rank} input", self.sizes)));
        }
        let first = self.first_axis(rank);
        let mut data = x.data.clone();
        for (k, &m) in self.sizes.iter().enumerate() {
            let axis = first + k;
            let n = x.shape()[axis];
            if n == 0 {
                return Err(site.err(format!("axis {axis} is empty")));
            }
            let taps = self.taps(n, m, k);
            data = match data {
                Data::F(a) => Data::F(resample_f64(&a, axis, &taps)),
                Data::I(a) if self.mode == ResizeMode::Nearest => Data::I(pick(&a, axis, &taps)),
                Data::B(a) if self.mode == ResizeMode::Nearest => Data::B(pick(&a, axis, &taps)),
                _ => return Err(site.err(format!("{} resize needs a float input", self.mode.name()))),
            };
        }
        Ok(vec![x.with(data)])
    }

    fn samples() -> Vec<Sample> {
        let rs = |sizes: &[usize], mode, coordinate, nearest| {
            Op::Composite(Composite::Resize(Resize {
                sizes: sizes.to_vec(),
                scales: Vec::new(),
                mode,
                coordinate,
                nearest,
                cubic_a: Float(-0.75),
                exclude_outside: false,
            }))
        };
        let (f, fl) = (DType::F32, NearestMode::Floor);
        vec![
            Sample::new(
                "resize/nearest/asymmetric_floor",
                rs(&[6, 5], ResizeMode::Nearest, CoordMode::Asymmetric, fl),
                vec![input(f, &[1, 2, 3, 4])],
            )
            .no_grad(),
            Sample::new(
                "resize/nearest/half_pixel_ceil_i32",
                rs(
                    &[7],
                    ResizeMode::Nearest,
                    CoordMode::HalfPixel,
                    NearestMode::RoundPreferCeil,
                ),
                vec![input_in(DType::I32, &[2, 3, 4], Domain::Ints(-50, 50))],
            )
            .no_grad(),
            Sample::new(
                "resize/linear/half_pixel_up_down",
                rs(&[7, 3], ResizeMode::Linear, CoordMode::HalfPixel, fl),
                vec![input(f, &[2, 1, 4, 5])],
            ),
            Sample::new(
                "resize/linear/align_corners_f64",
                rs(&[5, 9], ResizeMode::Linear, CoordMode::AlignCorners, fl),
                vec![input(DType::F64, &[1, 2, 3, 4])],
            ),
            Sample::new(
                "resize/cubic/half_pixel",
                rs(&[8, 6], ResizeMode::Cubic, CoordMode::HalfPixel, fl),
                vec![input(f, &[1, 2, 5, 4])],
            ),
            Sample::new(
                "resize/linear/trilinear",
                rs(&[3, 4, 5], ResizeMode::Linear, CoordMode::PytorchHalfPixel, fl),
                vec![input(f, &[1, 1, 2, 3, 2])],
            ),
        ]
    }
}

/// `Σ_t gather(x, idx_t, axis) · w_t` for the taps of every output index.
fn resample_axis<E: Emitter>(g: &mut E, x: E::Value, axis: usize, taps: &[Taps], dtype: DType) -> V<E> {
    let rank = g.value_type(x).rank();
    let m = taps.len();
    let slots = taps.iter().map(Vec::len).max().unwrap_or(0);
    let mut acc: Option<E::Value> = None;
    for t in 0..slots {
        let idx: Vec<i64> = taps.iter().map(|ts| ts.get(t).map_or(0, |p| p.0 as i64)).collect();
        let w: Vec<f64> = taps.iter().map(|ts| ts.get(t).map_or(0.0, |p| p.1)).collect();
        let idx = g.add_constant(TensorData::from_vec(vec![m], idx).expect("m indices"))?;
        let picked = g.add_op1(Op::Gather(Gather { axis }), &[x, idx])?;
        let term = if slots == 1 && w.iter().all(|&v| v == 1.0) {
            picked
        } else {
            let wc = g.add_constant(TensorData::from_f64_slice(dtype, vec![m], &w).expect("m weights"))?;
            let mut dims = vec![Dim::Static(m)];
            dims.extend(std::iter::repeat_n(Dim::Static(1), rank - axis - 1));
            let wc = reshape(g, wc, dims)?;
            g.binary(BinaryOp::Mul, picked, wc)?
        };
        acc = Some(match acc {
            Some(a) => g.binary(BinaryOp::Add, a, term)?,
            None => term,
        });
    }
    Ok(acc.expect("every output index has a source"))
}

/// Resample axis `axis` of a float array.
fn resample_f64(a: &ArrayD<f64>, axis: usize, taps: &[Taps]) -> ArrayD<f64> {
    let mut shape = a.shape().to_vec();
    shape[axis] = taps.len();
    let mut out = ArrayD::<f64>::zeros(ndarray::IxDyn(&shape));
    for (i, ts) in taps.iter().enumerate() {
        let mut dst = out.index_axis_mut(Axis(axis), i);
        for &(j, w) in ts {
            dst.scaled_add(w, &a.index_axis(Axis(axis), j));
        }
    }
    out
}

/// Nearest resampling of a non-float array: the first tap of each output index.
fn pick<T: Clone>(a: &ArrayD<T>, axis: usize, taps: &[Taps]) -> ArrayD<T> {
    let views: Vec<_> = taps
        .iter()
        .map(|ts| a.index_axis(Axis(axis), ts[0].0).insert_axis(Axis(axis)))
        .collect();
    ndarray::concatenate(Axis(axis), &views).expect("same shapes")
}
