//! Quantization-aware training (QAT) and post-training quantization (PTQ), Paddle 2 style:
//! `QAT::new(config).quantize(&mut model)` / `PTQ::new(..).quantize(&mut model)` give every
//! `Linear` and `Conv2D` below `model` fake quantization of its weight (per output channel,
//! symmetric i8, min-max) and of its input (per tensor, affine u8, observed), in place.
//!
//! - QAT: train as usual. In training mode each [`FakeQuantize`] observes its input (a moving
//!   average of the extremes by default) and updates its scale and zero point; `fake_quant`'s
//!   straight-through gradient trains through the rounding. Eval mode freezes them.
//! - PTQ: run calibration batches (any mode): the observers (min-max, percentile or entropy
//!   histograms for activations) only watch, the model computes in float; then
//!   [`PTQ::freeze`] fixes the parameters and the fake quantization applies.
//!
//! Scales and zero points are buffers (`<layer>.weight_quant.scale`, `...input_quant.zero_point`,
//! and `...calibrated`, 1 once observed), so `state_dict`, `save` and `to_static` carry them: a
//! model restored from a checkpoint quantizes as it did. A traced call never observes (tracing has
//! no values): trace after calibrating. The ops are in docs/QUANTIZATION.md.

mod fold;
mod graph;
mod observer;

pub use fold::fold_batch_norms;
pub use graph::{QuantizedLayer, QuantizedModel, StaticQuantConfig, convert, quantize_model};

pub use observer::{
    Calibration, HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver, Observer, QParams, QuantSpec, Scheme,
};

use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::nn::functional as F;
use crate::tensor::Tensor;
use oar_ir::TensorData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Fake quantization of one tensor (a weight or a layer's input) with the parameters its
/// observer learns. A [`Layer`] whose buffers are its `scale` and `zero_point`.
pub struct FakeQuantize {
    spec: QuantSpec,
    range: (i64, i64),
    observer: Mutex<Box<dyn Observer>>,
    scale: Tensor,
    zero_point: Tensor,
    training: bool,
    /// PTQ: observe in any mode, and compute in float while observing.
    calibrating: bool,
    /// Cleared by freezing (shared by every quantizer one `QAT` / `PTQ` made).
    active: Arc<AtomicBool>,
    /// 1 once the parameters come from observations (a buffer: a restored checkpoint keeps it).
    calibrated: Tensor,
    /// LSQ: the scale is a parameter the first observation initializes and gradients train.
    learned: bool,
}

impl FakeQuantize {
    /// Fake quantization by `spec` with `observer`; `channels` is the size of the per-channel
    /// axis (ignored per tensor).
    pub fn new(spec: QuantSpec, observer: Box<dyn Observer>, channels: usize) -> Result<FakeQuantize> {
        Self::shared(spec, observer, channels, false, Arc::new(AtomicBool::new(true)), false)
    }

    /// LSQ (learned step size, Esser et al. 2020): the scale is a parameter — the first
    /// observation initializes it, then `fake_quant`'s gradient, scaled by LSQ's `1 / √(N ·
    /// Q_P)` (`N` the elements sharing a step size, `Q_P` the largest quantized value), trains
    /// it with the rest of the model (the zero point stays as first observed).
    pub fn learned(spec: QuantSpec, observer: Box<dyn Observer>, channels: usize) -> Result<FakeQuantize> {
        Self::shared(spec, observer, channels, false, Arc::new(AtomicBool::new(true)), true)
    }

    fn shared(
        spec: QuantSpec,
        observer: Box<dyn Observer>,
        channels: usize,
        calibrating: bool,
        active: Arc<AtomicBool>,
        learned: bool,
    ) -> Result<FakeQuantize> {
        let range = spec.range()?;
        let n = if spec.axis.is_some() { vec![channels] } else { vec![] };
        let len = n.iter().product::<usize>();
        let mut scale = Tensor::from_data(TensorData::from_vec(n.clone(), vec![1.0f32; len])?);
        if learned {
            scale = scale.requires_grad_(true)?;
        }
        let zero_point = Tensor::from_data(TensorData::from_vec(n, vec![0.0f32; len])?);
        Ok(FakeQuantize {
            spec,
            range,
            observer: Mutex::new(observer),
            scale,
            zero_point,
            training: true,
            calibrating,
            active,
            calibrated: Tensor::scalar(0.0f32),
            learned,
        })
    }

    /// The current scale (`[]` or `[channels]`).
    pub fn scale(&self) -> &Tensor {
        &self.scale
    }

    /// The current zero point (floats holding integers).
    pub fn zero_point(&self) -> &Tensor {
        &self.zero_point
    }

    /// The spec it quantizes by.
    pub fn spec(&self) -> QuantSpec {
        self.spec
    }

    fn observing(&self) -> bool {
        let learning = self.learned && self.calibrated.item().is_ok_and(|c| c != 0.0);
        !learning && self.active.load(Ordering::Relaxed) && (self.training || self.calibrating)
    }

    fn observe(&self, x: &Tensor) -> Result<()> {
        let data = x.detach().try_data()?;
        let mut obs = self.observer.lock().unwrap_or_else(|e| e.into_inner());
        obs.observe(&data)?;
        let Some((lo, hi)) = obs.range() else {
            return Ok(());
        };
        let p = self.spec.qparams(&lo, &hi)?;
        let shape = self.scale.shape();
        self.scale.set_data(TensorData::from_vec(shape.clone(), p.scale)?)?;
        self.zero_point.set_data(TensorData::from_vec(shape, p.zero_point)?)?;
        self.calibrated.set_data(TensorData::scalar(1.0f32))?;
        Ok(())
    }
}

impl Layer for FakeQuantize {
    /// Observe (when it should and `x` has values), then `fake_quant(x)` — or `x` itself while
    /// a PTQ observer watches, and before anything was observed.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let observing = self.observing();
        if observing && !x.is_traced() {
            self.observe(x)?;
        }
        if (observing && self.calibrating) || self.calibrated.item()? == 0.0 {
            return Ok(x.clone());
        }
        let (qmin, qmax) = self.range;
        let z = (self.spec.scheme == Scheme::Affine).then_some(&self.zero_point);
        let scale = if self.learned {
            lsq_scale(&self.scale, x.numel(), qmax)?
        } else {
            self.scale.clone()
        };
        F::fake_quant(x, &scale, z, self.spec.axis.unwrap_or(0), qmin, qmax)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        if self.learned {
            vec![("scale".into(), self.scale.clone())]
        } else {
            vec![]
        }
    }

    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        let mut b = vec![
            ("zero_point".into(), self.zero_point.clone()),
            ("calibrated".into(), self.calibrated.clone()),
        ];
        if !self.learned {
            b.insert(0, ("scale".into(), self.scale.clone()));
        }
        b
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// LSQ's gradient scaling: `s` unchanged in value, its gradient times `g = 1 / √(N · Q_P)`
/// — `N` the elements that share one step size (of `numel` quantized ones), `Q_P` the largest
/// quantized value — so that the step size learns at the rate of the weights (Esser et al.
/// 2020, section 2.2). `s.detach() + (g·s − (g·s).detach())`: the bracket is exactly zero, so
/// the forward value is `s`'s bits.
fn lsq_scale(s: &Tensor, numel: usize, qmax: i64) -> Result<Tensor> {
    let n = (numel / s.numel().max(1)).max(1) as f64;
    let g = 1.0 / (n * qmax.max(1) as f64).sqrt();
    let gs = s.scale(g, 0.0)?;
    let zero = (&gs - &gs.detach())?;
    &s.detach() + &zero
}

/// The fake quantization a quantizable layer gets: of its input and of its weight.
pub struct QuantPair {
    /// The input's.
    pub input: FakeQuantize,
    /// The weight's (per output channel).
    pub weight: FakeQuantize,
}

impl QuantPair {
    /// `(input, weight)` fake-quantized.
    pub fn apply(&self, x: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((self.input.forward(x)?, self.weight.forward(w)?))
    }

    /// The two as named sublayers.
    pub fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("input_quant".into(), &self.input as &dyn Layer),
            ("weight_quant".into(), &self.weight as &dyn Layer),
        ]
    }

    /// The two as named sublayers, mutably.
    pub fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("input_quant".into(), &mut self.input as &mut dyn Layer),
            ("weight_quant".into(), &mut self.weight as &mut dyn Layer),
        ]
    }
}

/// What makes the fake quantizers of a layer: [`QAT`] and [`PTQ`].
pub trait Quantizer {
    /// The quantizers of a layer whose weight has `channels` output channels along `axis`.
    fn pair(&self, axis: usize, channels: usize) -> Result<QuantPair>;
}

/// How activations are observed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ActivationObserver {
    /// Running min and max.
    MinMax,
    /// Moving average of each batch's extremes with this constant.
    MovingAverage(f32),
    /// A histogram cut by percentile or entropy.
    Histogram(Calibration),
}

fn activation_observer(kind: ActivationObserver) -> Result<Box<dyn Observer>> {
    Ok(match kind {
        ActivationObserver::MinMax => Box::new(MinMaxObserver::new(None)),
        ActivationObserver::MovingAverage(c) => Box::new(MovingAverageMinMaxObserver::new(None, c)?),
        ActivationObserver::Histogram(m) => Box::new(HistogramObserver::new(m)?),
    })
}

/// Which tensors are quantized how.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantConfig {
    /// Activations (layer inputs), per tensor: affine u8 by default.
    pub activation: QuantSpec,
    /// Their observer.
    pub activation_observer: ActivationObserver,
    /// Weights are symmetric per output channel in this dtype (i8).
    pub weight_dtype: oar_ir::DType,
    /// QAT with learned scales (LSQ): every quantizer's scale is a parameter, initialized by its
    /// first observation and then trained by gradient (create the optimizer after `quantize`).
    pub learn_scale: bool,
}

impl Default for QuantConfig {
    /// Affine u8 activations with a moving average (constant 0.01), symmetric i8 weights.
    fn default() -> QuantConfig {
        QuantConfig {
            activation: QuantSpec::activation(),
            activation_observer: ActivationObserver::MovingAverage(0.01),
            weight_dtype: oar_ir::DType::I8,
            learn_scale: false,
        }
    }
}

fn make_pair(
    c: &QuantConfig,
    axis: usize,
    channels: usize,
    calibrating: bool,
    active: &Arc<AtomicBool>,
) -> Result<QuantPair> {
    let weight = QuantSpec {
        dtype: c.weight_dtype,
        scheme: Scheme::Symmetric,
        axis: Some(axis),
    };
    if c.activation.axis.is_some() {
        return Err(Error::invalid(
            "quantization",
            "activations are quantized per tensor (axis: None)",
        ));
    }
    Ok(QuantPair {
        input: FakeQuantize::shared(
            c.activation,
            activation_observer(c.activation_observer)?,
            1,
            calibrating,
            active.clone(),
            c.learn_scale && !calibrating,
        )?,
        weight: FakeQuantize::shared(
            weight,
            Box::new(MinMaxObserver::new(Some(axis))),
            channels,
            calibrating,
            active.clone(),
            c.learn_scale && !calibrating,
        )?,
    })
}

/// What [`QAT`] and [`PTQ`] share: the config, the switch freezing every quantizer they made,
/// and whether those quantizers only watch (PTQ calibration).
struct Plan {
    config: QuantConfig,
    active: Arc<AtomicBool>,
    calibrating: bool,
}

impl Plan {
    fn new(config: QuantConfig, calibrating: bool) -> Plan {
        Plan {
            config,
            active: Arc::new(AtomicBool::new(true)),
            calibrating,
        }
    }

    fn pair(&self, axis: usize, channels: usize) -> Result<QuantPair> {
        make_pair(&self.config, axis, channels, self.calibrating, &self.active)
    }

    fn freeze(&self) {
        self.active.store(false, Ordering::Relaxed);
    }
}

/// Quantization-aware training (Paddle's `paddle.quantization.QAT`).
pub struct QAT(Plan);

impl QAT {
    /// QAT with `config`.
    pub fn new(config: QuantConfig) -> QAT {
        QAT(Plan::new(config, false))
    }

    /// Give every `Linear` and `Conv2D` in `model` fake quantization, in place; returns how
    /// many layers took it.
    pub fn quantize(&self, model: &mut dyn Layer) -> Result<usize> {
        model.quantize_with(self)
    }

    /// Stop observing (the parameters stay as they are), in any mode.
    pub fn freeze(&self) {
        self.0.freeze();
    }
}

impl Quantizer for QAT {
    fn pair(&self, axis: usize, channels: usize) -> Result<QuantPair> {
        self.0.pair(axis, channels)
    }
}

/// Post-training quantization: observe calibration batches, then freeze.
pub struct PTQ(Plan);

impl PTQ {
    /// PTQ with affine u8 activations observed by `observer` and symmetric i8 weights.
    pub fn new(observer: ActivationObserver) -> PTQ {
        PTQ::with_config(QuantConfig {
            activation_observer: observer,
            ..QuantConfig::default()
        })
    }

    /// PTQ with a whole config.
    pub fn with_config(config: QuantConfig) -> PTQ {
        PTQ(Plan::new(config, true))
    }

    /// Give every `Linear` and `Conv2D` in `model` observers (the model keeps computing in
    /// float until [`PTQ::freeze`]); returns how many layers took them.
    pub fn quantize(&self, model: &mut dyn Layer) -> Result<usize> {
        model.quantize_with(self)
    }

    /// End calibration: the observed parameters are fixed and fake quantization applies.
    pub fn freeze(&self) {
        self.0.freeze();
    }
}

impl Quantizer for PTQ {
    fn pair(&self, axis: usize, channels: usize) -> Result<QuantPair> {
        self.0.pair(axis, channels)
    }
}
