//! `oar quantize MODEL.oar --calibrate DATA.npy [--method kl] [--per-channel] -o MODEL.int8.oar`:
//! post-training static quantization of a saved model (`oar::quantization::quantize_model`).

use crate::{CliResult, load};
use oar::quantization::{ActivationObserver, Calibration, StaticQuantConfig, quantize_model};
use oar_ir::{Dim, TensorData};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The options of `oar quantize`.
#[derive(clap::Args)]
pub(crate) struct QuantizeArgs {
    /// The float `.oar` model.
    pub file: PathBuf,
    /// Calibration data: `FILE.npy` for a model with one input, else `NAME=FILE.npy` per input
    /// (repeat); the first axis is split into batches.
    #[arg(long = "calibrate", short = 'c', value_name = "[NAME=]FILE.npy", required = true)]
    pub calibrate: Vec<String>,
    /// How inputs are calibrated: `minmax`, `percentile` (99.99), `percentile=P`, or `kl`
    /// (entropy).
    #[arg(long, default_value = "minmax")]
    pub method: String,
    /// One weight scale per output channel (default: one per tensor).
    #[arg(long)]
    pub per_channel: bool,
    /// Weights on 7 bits, as onnxruntime's `reduce_range` (for x86 runtimes without VNNI, whose
    /// 8-bit kernels saturate; oar's do not).
    #[arg(long)]
    pub reduce_range: bool,
    /// Rows per calibration batch (default: the model's batch size when it is fixed, else 32).
    #[arg(long, value_name = "N")]
    pub batch_size: Option<usize>,
    /// Use at most this many batches.
    #[arg(long, value_name = "N")]
    pub batches: Option<usize>,
    /// The quantized model (default: MODEL.int8.oar next to MODEL).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Also write the quantization as a QDQ ONNX model (QuantizeLinear / DequantizeLinear
    /// around float products) for other runtimes.
    #[arg(long, value_name = "FILE.onnx")]
    pub onnx: Option<PathBuf>,
}

/// `--method`: an observer of the inputs.
fn parse_method(s: &str) -> Result<ActivationObserver, String> {
    match s {
        "minmax" | "min-max" => Ok(ActivationObserver::MinMax),
        "kl" | "entropy" => Ok(ActivationObserver::Histogram(Calibration::Entropy)),
        "percentile" => Ok(ActivationObserver::Histogram(Calibration::Percentile(99.99))),
        _ => match s.strip_prefix("percentile=").map(str::parse::<f64>) {
            Some(Ok(p)) if p > 0.0 && p <= 100.0 => Ok(ActivationObserver::Histogram(Calibration::Percentile(p))),
            Some(_) => Err(format!("--method `{s}`: the percentile must be a number in (0, 100]")),
            None => Err(format!(
                "--method `{s}` is not a calibration method (minmax, percentile, percentile=P, kl)"
            )),
        },
    }
}

/// Rows `[start, end)` of `t` along its first axis.
fn rows(t: &TensorData, start: usize, end: usize) -> CliResult<TensorData> {
    let n = t.shape()[0];
    let row = t.bytes().len() / n.max(1);
    let mut shape = t.shape().to_vec();
    shape[0] = end - start;
    TensorData::from_bytes(t.dtype(), shape, t.bytes()[start * row..end * row].to_vec()).map_err(|e| e.to_string())
}

pub(crate) fn quantize(args: QuantizeArgs) -> CliResult<()> {
    let method = parse_method(&args.method)?;
    let model = load(&args.file)?;
    let specs = model.graph.input_specs();
    let mut data: BTreeMap<String, TensorData> = BTreeMap::new();
    for c in &args.calibrate {
        let (name, path) = match c.split_once('=') {
            Some((n, p)) => (n.to_string(), p),
            None if specs.len() == 1 && args.calibrate.len() == 1 => (specs[0].0.clone(), c.as_str()),
            None => {
                return Err(format!(
                    "--calibrate `{c}`: the model has {} inputs ({}); give NAME=FILE.npy for each",
                    specs.len(),
                    specs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
                ));
            }
        };
        if !specs.iter().any(|(n, _)| *n == name) {
            return Err(format!(
                "--calibrate `{c}`: the model has no input `{name}` (its inputs: {})",
                specs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
        let t = oar_ir::npy::read_npy(Path::new(path)).map_err(|e| format!("--calibrate {name}: {e}"))?;
        if t.shape().is_empty() || t.shape()[0] == 0 {
            return Err(format!(
                "--calibrate {name}: {path} has shape {:?}; calibration needs rows along its first axis",
                t.shape()
            ));
        }
        if data.insert(name.clone(), t).is_some() {
            return Err(format!("--calibrate `{name}` is given twice"));
        }
    }
    if let Some((missing, _)) = specs.iter().find(|(n, _)| !data.contains_key(n)) {
        return Err(format!("--calibrate: no data for the model's input `{missing}`"));
    }
    let n = data.values().next().map_or(0, |t| t.shape()[0]);
    if let Some((name, t)) = data.iter().find(|(_, t)| t.shape()[0] != n) {
        return Err(format!(
            "--calibrate {name}: {} rows, but the other inputs have {n}",
            t.shape()[0]
        ));
    }
    // A fixed batch dim sets the batch size.
    let fixed = specs.iter().find_map(|(_, t)| match t.shape.dims().first() {
        Some(Dim::Static(b)) => Some(*b),
        _ => None,
    });
    let batch = match (args.batch_size, fixed) {
        (Some(0), _) => return Err("--batch-size must be at least 1".into()),
        (Some(b), Some(f)) if b != f => {
            return Err(format!("--batch-size {b}: the model's batch size is fixed at {f}"));
        }
        (Some(b), _) => b,
        (None, Some(f)) => f,
        (None, None) => 32.min(n),
    };
    let mut batches = Vec::new();
    let mut start = 0;
    while start + batch <= n || (fixed.is_none() && start < n) {
        let end = (start + batch).min(n);
        let mut feeds = BTreeMap::new();
        for (name, t) in &data {
            feeds.insert(name.clone(), rows(t, start, end)?);
        }
        batches.push(feeds);
        start = end;
        if args.batches.is_some_and(|m| batches.len() >= m) {
            break;
        }
    }
    if batches.is_empty() {
        return Err(format!(
            "--calibrate: {n} rows make no batch of the model's fixed size {batch}"
        ));
    }
    let config = StaticQuantConfig {
        method,
        per_channel: args.per_channel,
        reduce_range: args.reduce_range,
        ..StaticQuantConfig::default()
    };
    let q = quantize_model(&model, &batches, &config).map_err(|e| format!("{}: {e}", args.file.display()))?;
    let output = args.output.unwrap_or_else(|| {
        let stem = args
            .file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        args.file.with_file_name(format!("{stem}.int8.oar"))
    });
    q.model.save(&output).map_err(|e| e.to_string())?;
    if let Some(path) = &args.onnx {
        oar_onnx::save(&q.qdq, path).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("QDQ ONNX: {}", path.display());
    }
    let bytes = |w: &oar_ir::Weights| w.values().map(|t| t.bytes().len()).sum::<usize>();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &q.layers {
        *kinds.entry(l.op).or_default() += 1;
    }
    println!(
        "{}: quantized {} product(s) ({}) from {} calibration batches; weights {} -> {} bytes; wrote {}",
        args.file.display(),
        q.layers.len(),
        kinds
            .iter()
            .map(|(op, n)| format!("{n} {op}"))
            .collect::<Vec<_>>()
            .join(", "),
        batches.len(),
        bytes(&model.weights),
        bytes(&q.model.weights),
        output.display()
    );
    Ok(())
}
