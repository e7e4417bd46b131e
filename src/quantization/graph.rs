//! Post-training quantization of a saved graph (`oar quantize MODEL.oar --calibrate DATA.npy`),
//! and conversion of a QAT / PTQ model into integer kernels.
//!
//! [`quantize_model`] first folds inference batch norms into the convolutions before them
//! (`fold-batch-norm`, then `jit::fold_parameters`), then finds every `matmul`, `linear` and `conv2d` whose weight is a parameter,
//! runs the calibration batches through the float graph (on the default backend) with each such
//! product's input as an extra output, and lets one observer per input learn its range. Then it
//! writes the QDQ form onnxruntime's static quantizer writes — the input quantized and
//! dequantized (per tensor, affine u8), the weight stored as i8 integers and dequantized
//! (symmetric, per tensor or per output channel) — and runs the `quantize` pass, which turns
//! each product into `matmul_integer` / `conv_integer` on the integers times `s_a·s_w`, plus the
//! float bias. Everything else stays in float. [`convert`] does the same for an eager model that
//! QAT or PTQ quantized: trace, `fake-quant-to-qdq`, `quantize`.

use super::{ActivationObserver, QuantSpec, activation_observer};
use crate::error::{Error, Result};
use crate::jit::{InputSpec, TranslatedLayer};
use crate::nn::Layer;
use oar_ir::file::Model;
use oar_ir::ops::{DequantizeLinear, Param, QuantizeLinear};
use oar_ir::{Composite, DType, Graph, NodeId, Op, TensorData, ValueId};
use oar_passes::Pass;
use std::collections::BTreeMap;

/// How [`quantize_model`] quantizes a graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StaticQuantConfig {
    /// How the products' inputs are calibrated (min-max by default).
    pub method: ActivationObserver,
    /// Weights get one scale per output channel (conv2d: axis 0 of the weight; matmul and
    /// linear: its columns) instead of one per tensor.
    pub per_channel: bool,
    /// Weights on 7 bits (`[-64, 64]`) instead of `[-127, 127]`, as onnxruntime's
    /// `reduce_range`: a u8 × i8 pair sum then fits 16 bits, which x86 kernels without VNNI
    /// (`vpmaddubsw`) need to be exact — oar's are exact either way.
    pub reduce_range: bool,
    /// The inputs' quantization: per-tensor affine u8 by default (per tensor only).
    pub activation: QuantSpec,
}

impl Default for StaticQuantConfig {
    /// Min-max calibrated affine u8 inputs, per-tensor symmetric i8 weights (onnxruntime's
    /// `quantize_static` defaults).
    fn default() -> StaticQuantConfig {
        StaticQuantConfig {
            method: ActivationObserver::MinMax,
            per_channel: false,
            reduce_range: false,
            activation: QuantSpec::activation(),
        }
    }
}

/// One product [`quantize_model`] quantized.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedLayer {
    /// `matmul`, `linear` or `conv2d`.
    pub op: &'static str,
    /// The weight parameter's name (its integers are `<name>.int8`).
    pub weight: String,
    /// The input's scale and zero point.
    pub input_scale: f32,
    /// The input's zero point.
    pub input_zero_point: i64,
    /// The weight's scales (one, or one per output channel).
    pub weight_scales: Vec<f32>,
}

/// A model [`quantize_model`] made, and what it quantized.
#[derive(Clone, Debug)]
pub struct QuantizedModel {
    /// The integer graph and its weights (quantized weights as i8, the rest as they were).
    pub model: Model,
    /// The same quantization before the `quantize` pass: the QDQ graph (quantize/dequantize
    /// pairs around float products), what `oar quantize --onnx` writes for other runtimes.
    pub qdq: Model,
    /// The quantized products, in graph order.
    pub layers: Vec<QuantizedLayer>,
}

/// A product with a parameter weight: its node, the op's name, the weight's value and name, and
/// the weight's output-channel axis.
struct Target {
    node: NodeId,
    op: &'static str,
    weight: ValueId,
    name: String,
    axis: usize,
}

fn targets(g: &Graph) -> Vec<Target> {
    let mut out = Vec::new();
    for n in g.topo_order() {
        let node = g.node(n);
        let (op, axis, rank) = match &node.op {
            Op::MatMul => ("matmul", 1, 2),
            Op::Composite(Composite::Linear) => ("linear", 1, 2),
            Op::Composite(Composite::Conv2d(_)) => ("conv2d", 0, 4),
            _ => continue,
        };
        let ins = node.inputs();
        let (x, w) = (ins[0], ins[1]);
        let Op::Param(Param { name, .. }) = &g.node(w.node).op else {
            continue;
        };
        let f32s = [x, w, ValueId::first(n)]
            .iter()
            .all(|&v| g.value_type(v).dtype == DType::F32);
        if !f32s || g.value_type(w).rank() != rank || g.value_type(x).rank() < 2 {
            continue;
        }
        out.push(Target {
            node: n,
            op,
            weight: w,
            name: name.clone(),
            axis,
        });
    }
    out
}

/// Post-training static quantization of `model` calibrated on `calibration` (each batch maps
/// the graph's input names to values): see the module docs. Errors name the batch, input or
/// weight at fault; a graph without a product to quantize is an error too.
pub fn quantize_model(
    model: &Model,
    calibration: &[BTreeMap<String, TensorData>],
    config: &StaticQuantConfig,
) -> Result<QuantizedModel> {
    let op = "quantize";
    if config.activation.axis.is_some() {
        return Err(Error::invalid(op, "inputs are quantized per tensor (axis: None)"));
    }
    config.activation.range()?;
    // Batch norms folded into their convolutions, and what that computes from parameters
    // made parameters: the convolutions' weights are then parameters to quantize.
    let mut prepared = model.clone();
    oar_passes::FoldBatchNorm
        .run(&mut prepared.graph)
        .map_err(|e| Error::invalid(op, e.to_string()))?;
    crate::jit::fold_parameters(&mut prepared)?;
    let model = &prepared;
    let found = targets(&model.graph);
    if found.is_empty() {
        return Err(Error::invalid(
            op,
            format!(
                "graph `{}` has no matmul, linear or conv2d with an f32 parameter weight to quantize",
                model.graph.name()
            ),
        ));
    }
    if calibration.is_empty() {
        return Err(Error::invalid(op, "no calibration batches: PTQ needs at least one"));
    }

    // Calibration: each distinct product input is an extra output of the float graph.
    let mut inputs: Vec<ValueId> = Vec::new();
    for t in &found {
        let x = model.graph.node(t.node).inputs()[0];
        if !inputs.contains(&x) {
            inputs.push(x);
        }
    }
    let mut probe = model.graph.clone();
    let first = probe.outputs().len();
    for (k, &x) in inputs.iter().enumerate() {
        probe.add_output(&format!("quantize.calibration.{k}"), x)?;
    }
    let backend = crate::backend::get(crate::backend::DEFAULT_BACKEND)?;
    let exe = backend.compile(&probe, &model.weights)?;
    let mut observers = inputs
        .iter()
        .map(|_| activation_observer(config.method))
        .collect::<Result<Vec<_>>>()?;
    for (b, feeds) in calibration.iter().enumerate() {
        let outs = exe
            .run(feeds)
            .map_err(|e| Error::invalid(op, format!("calibration batch {b}: {e}")))?;
        for (obs, (_, x)) in observers.iter_mut().zip(&outs[first..]) {
            obs.observe(x)?;
        }
    }
    let mut act = BTreeMap::new();
    for (&x, obs) in inputs.iter().zip(&observers) {
        let (lo, hi) = obs
            .range()
            .ok_or_else(|| Error::invalid(op, "an observer saw no values"))?;
        let p = config.activation.qparams(&lo, &hi)?;
        act.insert(x, (p.scale[0], p.zero_point[0] as i64));
    }

    // The QDQ graph.
    let Model {
        graph: mut g,
        mut weights,
    } = prepared;
    let mut dq_inputs: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    let mut dq_weights: BTreeMap<ValueId, (ValueId, Vec<f32>)> = BTreeMap::new();
    let mut layers = Vec::new();
    let adtype = config.activation.dtype;
    for t in &found {
        let x = g.node(t.node).inputs()[0];
        let (s, z) = act[&x];
        let xd = match dq_inputs.get(&x) {
            Some(&v) => v,
            None => {
                let sv = g.add_scalar(DType::F32, s as f64);
                let zv = g.add_scalar(adtype, z as f64);
                let q = g.add_op1(
                    Op::Composite(Composite::QuantizeLinear(QuantizeLinear { axis: 0, dtype: adtype })),
                    &[x, sv, zv],
                )?;
                let d = g.add_op1(
                    Op::Composite(Composite::DequantizeLinear(DequantizeLinear { axis: 0 })),
                    &[q, sv, zv],
                )?;
                dq_inputs.insert(x, d);
                d
            }
        };
        g.set_operand(t.node, 0, xd)?;
        let (wd, scales) = match dq_weights.get(&t.weight) {
            Some(v) => v.clone(),
            None => {
                let data = weights
                    .get(&t.name)
                    .ok_or_else(|| Error::invalid(op, format!("weight `{}` has no value in the model", t.name)))?;
                let axis = config.per_channel.then_some(t.axis);
                let (q, scales) =
                    quantize_weight(data, axis, if config.reduce_range { 64 } else { 127 }).map_err(|e| match e {
                        Error::Invalid { detail, .. } => Error::invalid(op, format!("weight `{}`: {detail}", t.name)),
                        e => e,
                    })?;
                let qname = format!("{}.int8", t.name);
                let qv = g.add_param(&qname, q.tensor_type())?;
                weights.insert(qname, q);
                let sv = if scales.len() == 1 {
                    g.add_scalar(DType::F32, scales[0] as f64)
                } else {
                    g.add_constant(TensorData::from_vec(vec![scales.len()], scales.clone())?)
                };
                let d = g.add_op1(
                    Op::Composite(Composite::DequantizeLinear(DequantizeLinear { axis: t.axis })),
                    &[qv, sv],
                )?;
                dq_weights.insert(t.weight, (d, scales.clone()));
                (d, scales)
            }
        };
        g.set_operand(t.node, 1, wd)?;
        layers.push(QuantizedLayer {
            op: t.op,
            weight: t.name.clone(),
            input_scale: s,
            input_zero_point: z,
            weight_scales: scales,
        });
    }
    g.remove_dead_nodes();
    let qdq = with_live_weights(g.clone(), &weights);
    oar_passes::Quantize
        .run(&mut g)
        .map_err(|e| Error::invalid(op, e.to_string()))?;
    g.remove_dead_nodes();
    Ok(QuantizedModel {
        model: with_live_weights(g, &weights),
        qdq,
        layers,
    })
}

/// `graph` with the weights it reads (float weights no product reads any more stay out).
fn with_live_weights(graph: Graph, weights: &oar_ir::Weights) -> Model {
    let live: std::collections::BTreeSet<String> = graph.params().into_iter().map(|(n, _)| n).collect();
    let weights = weights
        .iter()
        .filter(|(name, _)| live.contains(*name))
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    Model { graph, weights }
}

/// Symmetric i8 integers of `w` (`round_half_even(w / s)` clamped to `[-qmax, qmax]`, the
/// division in f32 as `quantize_linear` does it) and their scales `max|w| / qmax` (at least
/// `f32::EPSILON`): one, or one per index of `axis`.
fn quantize_weight(w: &TensorData, axis: Option<usize>, qmax: i32) -> Result<(TensorData, Vec<f32>)> {
    let mut obs = super::MinMaxObserver::new(axis);
    super::Observer::observe(&mut obs, w)?;
    let (lo, hi) = super::Observer::range(&obs).unwrap_or((vec![0.0], vec![0.0]));
    let scale: Vec<f32> = lo
        .iter()
        .zip(&hi)
        .map(|(l, h)| (l.abs().max(h.abs()) / qmax as f32).max(f32::EPSILON))
        .collect();
    let shape = w.shape().to_vec();
    let (c, inner) = match axis {
        Some(a) => (shape[a], shape[a + 1..].iter().product::<usize>().max(1)),
        None => (1, 1),
    };
    let q: Vec<i8> = w
        .to_f64_vec()
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let s = scale[(i / inner) % c];
            ((v as f32) / s).round_ties_even().clamp(-qmax as f32, qmax as f32) as i8
        })
        .collect();
    Ok((TensorData::from_vec(shape, q)?, scale))
}

/// An eager model quantized by [`super::QAT`] or [`super::PTQ`] (observers frozen) as an
/// integer graph: traced with `spec`, its fake quantization turned into quantize/dequantize
/// pairs, and its products moved onto the integers by the `quantize` pass. The result is a
/// layer that runs (and saves with `jit::save`) like any translated one.
pub fn convert(model: &dyn Layer, spec: &InputSpec) -> Result<TranslatedLayer> {
    let traced = crate::jit::to_static_layer(model, spec)?;
    let mut graph = traced.graph().clone();
    let fake = |n| matches!(graph.node(n).op, Op::Composite(Composite::FakeQuant(_)));
    if !graph.node_ids().any(fake) {
        return Err(Error::invalid(
            "quantization::convert",
            "the model has no fake quantization: quantize it with QAT or PTQ (and calibrate) first",
        ));
    }
    for pass in [&oar_passes::FakeQuantToQdq as &dyn Pass, &oar_passes::Quantize] {
        pass.run(&mut graph)
            .map_err(|e| Error::invalid("quantization::convert", e.to_string()))?;
    }
    let mut model = Model {
        graph,
        weights: traced.weights(),
    };
    crate::jit::fold_parameters(&mut model)?;
    TranslatedLayer::new(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_quantize_per_channel_along_their_axis() {
        // [K=2, N=3]: column scales max|w| / 127.
        let w = TensorData::from_vec(vec![2, 3], vec![1.0f32, -0.5, 0.0, -2.54, 0.3, 0.0]).unwrap();
        let (q, s) = quantize_weight(&w, Some(1), 127).unwrap();
        assert_eq!(s, vec![2.54 / 127.0, 0.5 / 127.0, f32::EPSILON]);
        assert_eq!(q.to_vec::<i8>().unwrap(), vec![50, -127, 0, -127, 76, 0]);
        let (q, s) = quantize_weight(&w, None, 127).unwrap();
        assert_eq!(s, vec![2.54 / 127.0]);
        assert_eq!(q.to_vec::<i8>().unwrap(), vec![50, -25, 0, -127, 15, 0]);
        // 7 bits: 1.0 / (2.54 / 64) = 25.2, 0.3 / (2.54 / 64) = 7.56.
        let (q, s) = quantize_weight(&w, None, 64).unwrap();
        assert_eq!(s, vec![2.54 / 64.0]);
        assert_eq!(q.to_vec::<i8>().unwrap(), vec![25, -13, 0, -64, 8, 0]);
    }

    /// A convolution with a batch norm after it: the norm folds into the convolution, which
    /// runs on the integers (`conv_integer`, weights `w.folded.int8`), and the outputs stay
    /// within 3% of the float model's largest.
    #[test]
    fn batch_norm_folds_before_quantizing() {
        use oar_ir::ops::{BatchNorm, Conv2d};
        use oar_ir::{Float, TensorType};
        let mut g = Graph::new("convbn");
        let x = g.add_input("x", TensorType::of(DType::F32, &[2, 3, 8, 8])).unwrap();
        let mut weights = oar_ir::Weights::new();
        let mut seed = 7u64;
        let mut data = |shape: &[usize], lo: f32, hi: f32| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    lo + (hi - lo) * ((seed >> 40) as f32 / (1u64 << 24) as f32)
                })
                .collect();
            TensorData::from_vec(shape.to_vec(), v).unwrap()
        };
        let mut param = |g: &mut Graph, name: &str, t: TensorData| {
            let v = g.add_param(name, t.tensor_type()).unwrap();
            weights.insert(name.to_string(), t);
            v
        };
        let w = param(&mut g, "w", data(&[4, 3, 3, 3], -1.0, 1.0));
        let b = param(&mut g, "b", data(&[4], -0.5, 0.5));
        let gamma = param(&mut g, "gamma", data(&[4], 0.5, 2.0));
        let beta = param(&mut g, "beta", data(&[4], -1.0, 1.0));
        let mean = param(&mut g, "mean", data(&[4], -0.5, 0.5));
        let var = param(&mut g, "var", data(&[4], 0.5, 2.0));
        let conv = Conv2d {
            stride: [1, 1],
            padding: [1, 1, 1, 1],
            dilation: [1, 1],
            groups: 1,
        };
        let y = g.add_op1(Op::Composite(Composite::Conv2d(conv)), &[x, w, b]).unwrap();
        let bn = BatchNorm {
            epsilon: Float(1e-5),
            momentum: Float(0.9),
            training: false,
        };
        let y = g
            .add_op1(Op::Composite(Composite::BatchNorm(bn)), &[y, gamma, beta, mean, var])
            .unwrap();
        let y = g.add_op1(Op::Composite(Composite::Relu), &[y]).unwrap();
        g.add_output("y", y).unwrap();
        let model = Model { graph: g, weights };
        let batches: Vec<_> = (0..3)
            .map(|_| BTreeMap::from([("x".to_string(), data(&[2, 3, 8, 8], -1.0, 2.0))]))
            .collect();
        let config = StaticQuantConfig {
            per_channel: true,
            ..Default::default()
        };
        let q = quantize_model(&model, &batches, &config).unwrap();
        assert_eq!(q.layers.len(), 1);
        assert_eq!(q.layers[0].op, "conv2d");
        assert_eq!(q.layers[0].weight, "w.folded");
        let text = q.model.graph.to_string();
        assert!(!text.contains("batch_norm") && text.contains("conv_integer"), "{text}");
        assert_eq!(q.model.weights["w.folded.int8"].dtype(), DType::I8);
        let run = |m: &Model| {
            let feeds = batches[0].clone();
            oar_backend_reference::run_graph(&m.graph, &m.weights, &feeds).unwrap()[0]
                .1
                .to_vec::<f32>()
                .unwrap()
        };
        let (f, i) = (run(&model), run(&q.model));
        let top = f.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, b) in f.iter().zip(&i) {
            assert!((a - b).abs() <= 0.03 * top, "float {a} vs int8 {b} (max {top})");
        }
    }
}
