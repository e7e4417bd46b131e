//! Observers: what a quantizer learns about a tensor's range from the values it sees, and the
//! scale and zero point that range gives ([`QuantSpec::qparams`]).
//!
//! - [`MinMaxObserver`]: the running minimum and maximum (per tensor or per channel).
//! - [`MovingAverageMinMaxObserver`]: an exponential moving average of each batch's extremes
//!   (PyTorch's, for activations during QAT).
//! - [`HistogramObserver`]: a histogram of `|x|`, cut at a percentile or where the KL divergence
//!   between the float and the quantized distribution is smallest (TensorRT's entropy
//!   calibration), for post-training calibration of activations.

use crate::error::{Error, Result};
use oar_ir::{DType, TensorData};

/// How values map onto the integer range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Zero point 0, the range `[-t, t]` onto `[-127, 127]` (i8): weights.
    Symmetric,
    /// The range `[min, max]` (widened to include 0) onto the whole integer range, with a zero
    /// point: activations.
    Affine,
}

/// What a tensor is quantized to: the integer dtype, the scheme, and the axis of per-channel
/// parameters (`None`: one scale for the whole tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantSpec {
    /// `I8` or `U8`.
    pub dtype: DType,
    /// Symmetric or affine.
    pub scheme: Scheme,
    /// The channel axis of per-channel parameters.
    pub axis: Option<usize>,
}

/// A scale and zero point per channel (one entry when per-tensor).
#[derive(Clone, Debug, PartialEq)]
pub struct QParams {
    /// `x ≈ (q - zero_point) · scale`.
    pub scale: Vec<f32>,
    /// Integers, held as floats (what `fake_quant` reads).
    pub zero_point: Vec<f32>,
}

impl QuantSpec {
    /// Per-channel symmetric i8 along `axis`: the weight default.
    pub fn weight(axis: usize) -> QuantSpec {
        QuantSpec {
            dtype: DType::I8,
            scheme: Scheme::Symmetric,
            axis: Some(axis),
        }
    }

    /// Per-tensor affine u8: the activation default.
    pub fn activation() -> QuantSpec {
        QuantSpec {
            dtype: DType::U8,
            scheme: Scheme::Affine,
            axis: None,
        }
    }

    /// The integer range: `[-127, 127]` for symmetric i8 (so `-t` and `t` both fit), else the
    /// dtype's whole range.
    pub fn range(&self) -> Result<(i64, i64)> {
        match (self.dtype, self.scheme) {
            (DType::I8, Scheme::Symmetric) => Ok((-127, 127)),
            (DType::I8, Scheme::Affine) => Ok((-128, 127)),
            (DType::U8, Scheme::Affine) => Ok((0, 255)),
            (d, s) => Err(Error::invalid(
                "quantization",
                format!("{s:?} quantization to {d} is not supported (symmetric i8, affine i8 or u8)"),
            )),
        }
    }

    /// Scale and zero point for the observed ranges `lo[c] ≤ x ≤ hi[c]`. Symmetric: `scale =
    /// max(|lo|, |hi|) / 127`, zero point 0. Affine: the range widened to hold 0, `scale = (hi -
    /// lo) / (qmax - qmin)`, `zero_point = clamp(qmin - round(lo / scale))`. A scale is never
    /// below `f32::EPSILON` (an all-zero channel still quantizes).
    pub fn qparams(&self, lo: &[f32], hi: &[f32]) -> Result<QParams> {
        let (qmin, qmax) = self.range()?;
        if lo.len() != hi.len() || lo.is_empty() {
            return Err(Error::invalid(
                "quantization",
                format!("{} minima for {} maxima", lo.len(), hi.len()),
            ));
        }
        if let Some(bad) = lo.iter().chain(hi).find(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "quantization",
                format!("the observed range holds {bad}: quantization parameters need finite values"),
            ));
        }
        let (mut scale, mut zero_point) = (Vec::with_capacity(lo.len()), Vec::with_capacity(lo.len()));
        for (&l, &h) in lo.iter().zip(hi) {
            let (l, h) = (l.min(0.0), h.max(0.0));
            match self.scheme {
                Scheme::Symmetric => {
                    scale.push((l.abs().max(h) / qmax as f32).max(f32::EPSILON));
                    zero_point.push(0.0);
                }
                Scheme::Affine => {
                    let s = ((h - l) / (qmax - qmin) as f32).max(f32::EPSILON);
                    let z = (qmin as f32 - (l / s).round_ties_even()).clamp(qmin as f32, qmax as f32);
                    scale.push(s);
                    zero_point.push(z);
                }
            }
        }
        Ok(QParams { scale, zero_point })
    }
}

/// Learns a tensor's range from the values it observes.
pub trait Observer: Send {
    /// Take a batch of values into account.
    fn observe(&mut self, x: &TensorData) -> Result<()>;

    /// The observed ranges `(lo, hi)`, one entry per channel (or one), or `None` before any
    /// observation.
    fn range(&self) -> Option<(Vec<f32>, Vec<f32>)>;
}

/// Each channel's values (along `axis`) or all of them, as f32.
fn channels(x: &TensorData, axis: Option<usize>) -> Result<Vec<Vec<f32>>> {
    let v: Vec<f32> = x.to_f64_vec().into_iter().map(|v| v as f32).collect();
    let shape = x.shape();
    let Some(axis) = axis else {
        return Ok(vec![v]);
    };
    let Some(&c) = shape.get(axis) else {
        return Err(Error::invalid(
            "observer",
            format!("channel axis {axis} is out of range for shape {shape:?}"),
        ));
    };
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = vec![Vec::with_capacity(v.len() / c.max(1)); c];
    for (i, x) in v.into_iter().enumerate() {
        out[(i / inner.max(1)) % c].push(x);
    }
    Ok(out)
}

/// The smallest and largest finite value of `v` (`(0, 0)` when it has none).
fn extremes(v: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &x in v.iter().filter(|x| x.is_finite()) {
        lo = lo.min(x);
        hi = hi.max(x);
    }
    if lo > hi { (0.0, 0.0) } else { (lo, hi) }
}

/// Running minimum and maximum, per tensor or per channel along `axis`.
#[derive(Clone, Debug, Default)]
pub struct MinMaxObserver {
    axis: Option<usize>,
    seen: Option<(Vec<f32>, Vec<f32>)>,
}

impl MinMaxObserver {
    /// Per-tensor (`axis = None`) or per-channel.
    pub fn new(axis: Option<usize>) -> MinMaxObserver {
        MinMaxObserver { axis, seen: None }
    }
}

impl Observer for MinMaxObserver {
    fn observe(&mut self, x: &TensorData) -> Result<()> {
        let (lo, hi): (Vec<f32>, Vec<f32>) = channels(x, self.axis)?.iter().map(|c| extremes(c)).unzip();
        self.seen = Some(match self.seen.take() {
            None => (lo, hi),
            Some((l, h)) if l.len() == lo.len() => (
                l.iter().zip(&lo).map(|(a, b)| a.min(*b)).collect(),
                h.iter().zip(&hi).map(|(a, b)| a.max(*b)).collect(),
            ),
            Some((l, _)) => {
                return Err(Error::invalid(
                    "MinMaxObserver",
                    format!("{} channels after {}", lo.len(), l.len()),
                ));
            }
        });
        Ok(())
    }

    fn range(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        self.seen.clone()
    }
}

/// An exponential moving average of each batch's extremes: `m ← m + c·(batch − m)` (the first
/// batch sets them), as PyTorch's `MovingAverageMinMaxObserver` (`c` = `averaging_constant`,
/// 0.01 by default).
#[derive(Clone, Debug)]
pub struct MovingAverageMinMaxObserver {
    inner: MinMaxObserver,
    constant: f32,
}

impl MovingAverageMinMaxObserver {
    /// Per-tensor or per-channel, averaging with `constant` in `(0, 1]`.
    pub fn new(axis: Option<usize>, constant: f32) -> Result<MovingAverageMinMaxObserver> {
        if !(constant > 0.0 && constant <= 1.0) {
            return Err(Error::invalid(
                "MovingAverageMinMaxObserver",
                format!("averaging constant {constant} is not in (0, 1]"),
            ));
        }
        Ok(MovingAverageMinMaxObserver {
            inner: MinMaxObserver::new(axis),
            constant,
        })
    }
}

impl Observer for MovingAverageMinMaxObserver {
    fn observe(&mut self, x: &TensorData) -> Result<()> {
        let (lo, hi): (Vec<f32>, Vec<f32>) = channels(x, self.inner.axis)?.iter().map(|c| extremes(c)).unzip();
        let c = self.constant;
        let avg = |old: &[f32], new: &[f32]| old.iter().zip(new).map(|(o, n)| o + c * (n - o)).collect();
        self.inner.seen = Some(match self.inner.seen.take() {
            None => (lo, hi),
            Some((l, h)) if l.len() == lo.len() => (avg(&l, &lo), avg(&h, &hi)),
            Some((l, _)) => {
                return Err(Error::invalid(
                    "MovingAverageMinMaxObserver",
                    format!("{} channels after {}", lo.len(), l.len()),
                ));
            }
        });
        Ok(())
    }

    fn range(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        self.inner.range()
    }
}

/// How a [`HistogramObserver`] picks its threshold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Calibration {
    /// The given percentile (e.g. 99.99) of `|x|`.
    Percentile(f64),
    /// The threshold whose 128-level quantization of the histogram has the smallest KL
    /// divergence from it (TensorRT's entropy calibration).
    Entropy,
}

/// A histogram of `|x|` over `[0, top)` in `bins` bins (the top doubles, merging bin pairs, when
/// larger values arrive), and the running minimum, cut at a threshold by [`Calibration`]. The
/// range is `[max(min, -t), t]`. Per-tensor.
#[derive(Clone, Debug)]
pub struct HistogramObserver {
    method: Calibration,
    counts: Vec<u64>,
    top: f32,
    lo: f32,
}

impl HistogramObserver {
    /// 2048 bins, cut by `method`.
    pub fn new(method: Calibration) -> Result<HistogramObserver> {
        if let Calibration::Percentile(p) = method
            && !(p > 0.0 && p <= 100.0)
        {
            return Err(Error::invalid(
                "HistogramObserver",
                format!("percentile {p} is not in (0, 100]"),
            ));
        }
        Ok(HistogramObserver {
            method,
            counts: vec![0; 2048],
            top: 0.0,
            lo: 0.0,
        })
    }

    /// The threshold `t` the method picks (0 before any observation).
    pub fn threshold(&self) -> f32 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 || self.top == 0.0 {
            return 0.0;
        }
        let width = self.top / self.counts.len() as f32;
        match self.method {
            Calibration::Percentile(p) => {
                let want = (p / 100.0 * total as f64).ceil() as u64;
                let mut acc = 0;
                for (i, &c) in self.counts.iter().enumerate() {
                    acc += c;
                    if acc >= want {
                        return (i + 1) as f32 * width;
                    }
                }
                self.top
            }
            Calibration::Entropy => (entropy_bins(&self.counts, 128) as f32) * width,
        }
    }
}

impl Observer for HistogramObserver {
    fn observe(&mut self, x: &TensorData) -> Result<()> {
        let v = &channels(x, None)?[0];
        let (lo, hi) = extremes(v);
        self.lo = self.lo.min(lo);
        let amax = lo.abs().max(hi);
        if self.top == 0.0 {
            self.top = amax.max(f32::MIN_POSITIVE);
        }
        while amax > self.top {
            // Double the range: bin pairs merge into the lower half.
            let n = self.counts.len();
            for i in 0..n / 2 {
                self.counts[i] = self.counts[2 * i] + self.counts[2 * i + 1];
            }
            self.counts[n / 2..].fill(0);
            self.top *= 2.0;
        }
        let n = self.counts.len();
        for &x in v.iter().filter(|x| x.is_finite()) {
            let b = ((x.abs() / self.top) * n as f32) as usize;
            self.counts[b.min(n - 1)] += 1;
        }
        Ok(())
    }

    fn range(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        if self.counts.iter().all(|&c| c == 0) {
            return None;
        }
        let t = self.threshold();
        Some((vec![self.lo.max(-t)], vec![t]))
    }
}

/// The number of leading bins `i` (from `levels` to all) whose distribution — the first `i`
/// bins with the tail's mass folded into the last — is closest in KL divergence to itself
/// quantized to `levels` levels (TensorRT's entropy calibration; empty bins stay empty when
/// expanded back).
fn entropy_bins(counts: &[u64], levels: usize) -> usize {
    let n = counts.len();
    if n <= levels {
        return n;
    }
    let mut best = (f64::INFINITY, n);
    for i in levels..=n {
        let mut p: Vec<f64> = counts[..i].iter().map(|&c| c as f64).collect();
        let tail: f64 = counts[i..].iter().map(|&c| c as f64).sum();
        p[i - 1] += tail;
        // Quantize the first i bins (without the folded tail) to `levels` levels and expand.
        let mut q = vec![0.0f64; i];
        for j in 0..levels {
            let (start, end) = (j * i / levels, (j + 1) * i / levels);
            let chunk = &counts[start..end];
            let nonzero = chunk.iter().filter(|&&c| c > 0).count();
            if nonzero == 0 {
                continue;
            }
            let mass: f64 = chunk.iter().map(|&c| c as f64).sum();
            for (k, &c) in chunk.iter().enumerate() {
                if c > 0 {
                    q[start + k] = mass / nonzero as f64;
                }
            }
        }
        let (ps, qs): (f64, f64) = (p.iter().sum(), q.iter().sum());
        if ps == 0.0 || qs == 0.0 {
            continue;
        }
        let mut kl = 0.0;
        for (a, b) in p.iter().zip(&q) {
            if *a > 0.0 {
                let (a, b) = (a / ps, b / qs);
                // A bin the quantized histogram leaves empty costs as if it held almost nothing.
                kl += a * (a / b.max(1e-12)).ln();
            }
        }
        if kl < best.0 {
            best = (kl, i);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_and_symmetric_parameters_by_hand() {
        let a = QuantSpec::activation();
        // [-1, 3] onto [0, 255]: scale 4/255, zero point round(255/4) = 64.
        let p = a.qparams(&[-1.0], &[3.0]).unwrap();
        assert_eq!(p.scale, vec![4.0 / 255.0]);
        assert_eq!(p.zero_point, vec![64.0]);
        // A positive range is widened to hold 0: zero point 0.
        let p = a.qparams(&[0.5], &[2.55]).unwrap();
        assert_eq!((p.scale[0], p.zero_point[0]), (2.55 / 255.0, 0.0));
        let w = QuantSpec::weight(0);
        let p = w.qparams(&[-0.5, -2.54, 0.0], &[1.27, 1.0, 0.0]).unwrap();
        assert_eq!(p.scale, vec![1.27 / 127.0, 2.54 / 127.0, f32::EPSILON]);
        assert_eq!(p.zero_point, vec![0.0; 3]);
        assert!(w.qparams(&[f32::NAN], &[1.0]).is_err());
        let bad = QuantSpec {
            dtype: DType::U8,
            scheme: Scheme::Symmetric,
            axis: None,
        };
        assert!(bad.qparams(&[0.0], &[1.0]).is_err());
    }

    fn data(v: &[f32], shape: &[usize]) -> TensorData {
        TensorData::from_vec(shape.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn min_max_per_tensor_and_per_channel() {
        let mut o = MinMaxObserver::new(Some(1));
        o.observe(&data(&[1.0, -2.0, 3.0, 4.0, 0.5, -6.0], &[2, 3])).unwrap();
        // Columns: (1, 4), (-2, 0.5), (3, -6).
        assert_eq!(o.range().unwrap(), (vec![1.0, -2.0, -6.0], vec![4.0, 0.5, 3.0]));
        o.observe(&data(&[9.0, 0.0, 0.0, 0.0, 0.0, 0.0], &[2, 3])).unwrap();
        assert_eq!(o.range().unwrap(), (vec![0.0, -2.0, -6.0], vec![9.0, 0.5, 3.0]));
        assert!(o.observe(&data(&[1.0; 4], &[2, 2])).is_err());
        let mut t = MinMaxObserver::new(None);
        t.observe(&data(&[1.0, -2.0, f32::NAN, 4.0], &[4])).unwrap();
        assert_eq!(t.range().unwrap(), (vec![-2.0], vec![4.0]));
    }

    #[test]
    fn moving_average_follows_batches() {
        let mut o = MovingAverageMinMaxObserver::new(None, 0.5).unwrap();
        o.observe(&data(&[-1.0, 1.0], &[2])).unwrap();
        o.observe(&data(&[-3.0, 5.0], &[2])).unwrap();
        // -1 + 0.5·(-3 + 1) = -2;  1 + 0.5·(5 - 1) = 3.
        assert_eq!(o.range().unwrap(), (vec![-2.0], vec![3.0]));
        assert!(MovingAverageMinMaxObserver::new(None, 0.0).is_err());
    }

    #[test]
    fn percentile_cuts_the_outliers_and_the_range_grows() {
        let mut o = HistogramObserver::new(Calibration::Percentile(99.0)).unwrap();
        // 990 values in [0, 1), 10 outliers at 100 (arriving later: the histogram regrows).
        let body: Vec<f32> = (0..990).map(|i| i as f32 / 990.0).collect();
        o.observe(&data(&body, &[990])).unwrap();
        o.observe(&data(&[100.0; 10], &[10])).unwrap();
        let t = o.threshold();
        // The 99th percentile is the largest body value (0.999), to a bin's width (128/2048
        // after the regrowth): far below the outliers.
        assert!((0.95..=1.07).contains(&t), "{t}");
        let (lo, hi) = o.range().unwrap();
        assert_eq!((lo[0], hi[0]), (0.0, t));
    }

    #[test]
    fn entropy_keeps_the_body_of_a_long_tailed_distribution() {
        // A Laplace-like body |x| ~ exp(-x) sampled on a grid, and a few huge outliers: the KL
        // threshold sits far below the maximum but above most of the mass.
        let mut v: Vec<f32> = (0..20_000)
            .map(|i| -((1.0 - (i as f32 + 0.5) / 20_000.0).ln()))
            .collect();
        v.extend([60.0f32; 4]);
        let mut o = HistogramObserver::new(Calibration::Entropy).unwrap();
        o.observe(&data(&v, &[v.len()])).unwrap();
        let t = o.threshold();
        assert!(t > 4.0 && t < 30.0, "threshold {t}");
        let mut minmax = MinMaxObserver::new(None);
        minmax.observe(&data(&v, &[v.len()])).unwrap();
        assert_eq!(minmax.range().unwrap().1[0], 60.0);
    }
}
