//! The models section: whole networks from `oar::nn` and the vision zoo, traced with
//! [`oar::jit::to_static_layer`] in eval mode, with weights redrawn from the suite's seed
//! (so a case is the same in every process, whatever the global generator did).

use super::build::{Domain, Rng};
use super::{Case, CaseData, Section, Tolerance};
use oar::jit::{InputSpec, to_static_layer};
use oar::nn::{Layer, Linear, ReLU, Sequential, TransformerEncoder, TransformerEncoderLayer};
use oar::vision::models::{lenet, mobilenet_v2, resnet18};
use oar_ir::ops::sample::SampleRng;
use oar_ir::{DType, TensorData, Weights};
use std::collections::BTreeMap;

const MODELS: Section = Section::Models;

/// Whole models accumulate f32 rounding through many layers in orders a backend chooses
/// (gemm blocking, fused reductions): relative 1e-4 with an absolute floor of 1e-4 on outputs
/// of order one (logits, normalized features).
pub const MODEL_TOLERANCE: Tolerance = Tolerance { rtol: 1e-4, atol: 1e-4 };

type MakeFn = fn(&ModelSize) -> oar::Result<Box<dyn Layer>>;

/// Sizes of one model case.
#[derive(Clone, Debug)]
struct ModelSize {
    /// Input shape (batch first).
    input: Vec<usize>,
    /// Classes (classifiers) or width (transformer).
    width: usize,
    /// Layers (transformer).
    layers: usize,
}

fn mlp(s: &ModelSize) -> oar::Result<Box<dyn Layer>> {
    let d = s.input[1];
    Ok(Box::new(
        Sequential::new()
            .add(Linear::new(d, 2 * d)?)
            .add(ReLU)
            .add(Linear::new(2 * d, d)?)
            .add(ReLU)
            .add(Linear::new(d, s.width)?),
    ))
}

fn lenet_model(s: &ModelSize) -> oar::Result<Box<dyn Layer>> {
    Ok(Box::new(lenet(s.width)?))
}

fn resnet18_model(s: &ModelSize) -> oar::Result<Box<dyn Layer>> {
    Ok(Box::new(resnet18(s.width)?))
}

fn mobilenet_v2_model(s: &ModelSize) -> oar::Result<Box<dyn Layer>> {
    Ok(Box::new(mobilenet_v2(1.0, s.width)?))
}

fn transformer(s: &ModelSize) -> oar::Result<Box<dyn Layer>> {
    let d = s.width;
    let enc = TransformerEncoder::new(
        || TransformerEncoderLayer::new(d, if d >= 512 { 8 } else { 4 }, if d >= 512 { 4 * d } else { 2 * d }),
        s.layers,
    )?
    .with_norm()?;
    Ok(Box::new(enc))
}

/// A fresh value for weight `name` whose initial value is `init`, drawn from `rng`:
/// constants (batch-norm scales, shifts and running statistics, layer-norm affine params)
/// become `c ± 0.25`, so variances stay positive; matrices and kernels are uniform with
/// variance `1/fan_in` (fan-in: `shape[0]` for `[in, out]` linear weights, the product of
/// the trailing dims for conv kernels); other vectors (biases) are uniform in `±0.1`.
fn redraw(init: &TensorData, rng: &mut SampleRng) -> Result<TensorData, String> {
    let vals = init.to_f64_vec();
    let shape = init.shape().to_vec();
    let n = vals.len();
    let constant = vals.windows(2).all(|w| w[0] == w[1]);
    let dom = if constant && n > 0 {
        Domain::Range(vals[0] - 0.25, vals[0] + 0.25)
    } else if shape.len() >= 2 {
        let fan_in: usize = if shape.len() == 2 {
            shape[0]
        } else {
            shape[1..].iter().product()
        };
        let bound = (3.0 / fan_in.max(1) as f64).sqrt();
        Domain::Range(-bound, bound)
    } else {
        Domain::Range(-0.1, 0.1)
    };
    if !init.dtype().is_float() {
        return Ok(init.clone());
    }
    Ok(dom.tensor(init.dtype(), &shape, rng))
}

fn build_model(name: &str, make: MakeFn, size: &ModelSize) -> Result<CaseData, String> {
    let e = |e: oar::Error| e.to_string();
    let mut layer = make(size).map_err(e)?;
    layer.eval();
    let _no_grad = oar::no_grad();
    let mut spec: Vec<Option<usize>> = size.input.iter().map(|&d| Some(d)).collect();
    spec[0] = None; // the batch dim stays symbolic, as `to_static` users trace it
    let f = to_static_layer(&*layer, &InputSpec::new(&spec, DType::F32, "x")).map_err(e)?;
    let mut weights = Weights::new();
    for (k, t) in f.weights() {
        let mut rng = Rng::for_case(&format!("models/{name}/{k}"));
        weights.insert(k.clone(), redraw(&t, &mut rng)?);
    }
    let mut rng = Rng::for_case(&format!("models/{name}/input"));
    let x = Domain::standard().tensor(DType::F32, &size.input, &mut rng);
    Ok(CaseData {
        graph: f.graph().clone(),
        weights,
        inputs: BTreeMap::from([("x".to_string(), x)]),
    })
}

fn model(name: &str, make: MakeFn, size: ModelSize) -> Case {
    let label = name.to_string();
    Case::new(MODELS, name, move || build_model(&label, make, &size)).with_tolerance(MODEL_TOLERANCE)
}

/// Model cases at CI sizes; `full` adds the standard sizes (224×224 images, 1000 classes, a
/// base-size Transformer encoder).
pub(crate) fn cases(full: bool) -> Vec<Case> {
    let size = |input: &[usize], width, layers| ModelSize {
        input: input.to_vec(),
        width,
        layers,
    };
    let mut v = vec![
        model("mlp/b4_d64", mlp, size(&[4, 64], 10, 0)),
        model("lenet/b2_28x28", lenet_model, size(&[2, 1, 28, 28], 10, 0)),
        model("resnet18/b2_32x32", resnet18_model, size(&[2, 3, 32, 32], 10, 0)),
        model(
            "mobilenet_v2/b2_64x64",
            mobilenet_v2_model,
            size(&[2, 3, 64, 64], 10, 0),
        ),
        model(
            "transformer_encoder/b2_l8_d32_x2",
            transformer,
            size(&[2, 8, 32], 32, 2),
        ),
    ];
    if full {
        v.extend([
            model(
                "resnet18/full_b1_224x224",
                resnet18_model,
                size(&[1, 3, 224, 224], 1000, 0),
            ),
            model(
                "mobilenet_v2/full_b1_224x224",
                mobilenet_v2_model,
                size(&[1, 3, 224, 224], 1000, 0),
            ),
            model(
                "transformer_encoder/full_b2_l128_d512_x6",
                transformer,
                size(&[2, 128, 512], 512, 6),
            ),
        ]);
    }
    v
}
