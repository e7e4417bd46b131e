//! Checks the reference backend against independent numpy fixtures, and that the fixtures
//! cover every op.
//!
//! The fixtures live in `tests/fixtures/ops/*.json` and come from `tools/gen_op_fixtures.py`
//! (numpy, float64 math rounded once to the output dtype). Each case is one op applied to
//! graph inputs `x0..xk`; its outputs are compared with the case's `rtol`/`atol`
//! (`|got - want| <= atol + rtol * |want|`; NaN must meet NaN, infinities must match exactly;
//! integers and bools must be equal). Cases marked `expect_error` must fail with an error,
//! not a panic and not a result.

use oar_ir::ops::OpDef;
use oar_ir::{BackendError, DType, Graph, Op, TensorData, TensorType, Weights};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

/// One fixture case as stored; `op` stays raw JSON so a bad op is reported, not fatal.
#[derive(Deserialize)]
struct RawCase {
    name: String,
    op: Value,
    inputs: Vec<RawTensor>,
    outputs: Vec<RawTensor>,
    rtol: f64,
    atol: f64,
    #[serde(default)]
    expect_error: bool,
}

/// A tensor as stored: floats are numbers or "nan"/"inf"/"-inf"; ints are integers; bools are bools.
#[derive(Deserialize)]
struct RawTensor {
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<Value>,
}

/// A case ready to run.
struct Case {
    name: String,
    graph: Graph,
    inputs: BTreeMap<String, TensorData>,
    outputs: Vec<TensorData>,
    rtol: f64,
    atol: f64,
    expect_error: bool,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ops")
}

/// Every raw case of every fixture file, tagged `file:name`.
fn load_raw() -> Vec<(String, RawCase)> {
    let mut files: Vec<_> = std::fs::read_dir(fixture_dir())
        .expect("tests/fixtures/ops exists (run tools/gen_op_fixtures.py)")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixture files in {}", fixture_dir().display());
    let mut out = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let cases: Vec<RawCase> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let stem = path.file_stem().expect("file name").to_string_lossy().into_owned();
        out.extend(cases.into_iter().map(|c| (format!("{stem}:{}", c.name), c)));
    }
    out
}

fn float_of(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| format!("{n} is not a float")),
        Value::String(s) => match s.as_str() {
            "nan" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            _ => Err(format!("bad float string {s:?}")),
        },
        _ => Err(format!("{v} is not a float")),
    }
}

fn ints_as<T: oar_ir::Element + TryFrom<i64>>(data: &[Value]) -> Result<Vec<T>, String> {
    data.iter()
        .map(|v| {
            let i = v.as_i64().ok_or_else(|| format!("{v} is not an integer"))?;
            T::try_from(i).map_err(|_| format!("{i} does not fit {}", T::DTYPE))
        })
        .collect()
}

impl RawTensor {
    fn to_tensor(&self) -> Result<TensorData, String> {
        let shape = self.shape.clone();
        let t = match self.dtype {
            d if d.is_float() => {
                let vals = self.data.iter().map(float_of).collect::<Result<Vec<_>, _>>()?;
                TensorData::from_f64_slice(d, shape, &vals)
            }
            DType::I8 => TensorData::from_vec(shape, ints_as::<i8>(&self.data)?),
            DType::U8 => TensorData::from_vec(shape, ints_as::<u8>(&self.data)?),
            DType::I32 => TensorData::from_vec(shape, ints_as::<i32>(&self.data)?),
            DType::I64 => TensorData::from_vec(shape, ints_as::<i64>(&self.data)?),
            DType::Bool => {
                let vals = self
                    .data
                    .iter()
                    .map(|v| v.as_bool().ok_or_else(|| format!("{v} is not a bool")));
                TensorData::from_vec(shape, vals.collect::<Result<Vec<_>, _>>()?)
            }
            d => return Err(format!("unsupported fixture dtype {d}")),
        };
        t.map_err(|e| e.to_string())
    }
}

/// Parse the op, convert tensors and build the one-op graph.
fn build(raw: &RawCase, name: &str) -> Result<Case, String> {
    let op: Op = serde_json::from_value(raw.op.clone()).map_err(|e| format!("op {} does not parse: {e}", raw.op))?;
    // serde ignores unknown fields; a round trip catches misspelled or stray attributes.
    let back = serde_json::to_value(&op).map_err(|e| e.to_string())?;
    if back != raw.op {
        return Err(format!("op {} reads back as {back}", raw.op));
    }
    let mut graph = Graph::new(name);
    let mut inputs = BTreeMap::new();
    let mut vals = Vec::new();
    for (i, t) in raw.inputs.iter().enumerate() {
        let data = t.to_tensor().map_err(|e| format!("input {i}: {e}"))?;
        let ty = TensorType::of(data.dtype(), data.shape());
        vals.push(graph.add_input(&format!("x{i}"), ty).map_err(|e| e.to_string())?);
        inputs.insert(format!("x{i}"), data);
    }
    let outs = graph.add_op(op, &vals).map_err(|e| format!("graph: {e}"))?;
    for (j, v) in outs.iter().enumerate() {
        graph.add_output(&format!("y{j}"), *v).map_err(|e| e.to_string())?;
    }
    let outputs = raw
        .outputs
        .iter()
        .enumerate()
        .map(|(j, t)| t.to_tensor().map_err(|e| format!("output {j}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if !raw.expect_error {
        let want: Vec<_> = outputs.iter().map(TensorData::tensor_type).collect();
        let got = graph.output_types();
        if got != want {
            return Err(format!("type rule gives {got:?}, numpy gives {want:?}"));
        }
    }
    Ok(Case {
        name: name.to_string(),
        graph,
        inputs,
        outputs,
        rtol: raw.rtol,
        atol: raw.atol,
        expect_error: raw.expect_error,
    })
}

/// Every case, built; panics listing every case that does not parse or type-check.
fn load_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut bad = Vec::new();
    let mut names = BTreeSet::new();
    for (name, raw) in load_raw() {
        if !names.insert(raw.name.clone()) {
            bad.push(format!("{name}: duplicate case name"));
        }
        match build(&raw, &name) {
            Ok(c) => cases.push(c),
            Err(e) => bad.push(format!("{name}: {e}")),
        }
    }
    assert!(
        bad.is_empty(),
        "{} fixture cases are malformed:\n{}",
        bad.len(),
        bad.join("\n")
    );
    cases
}

/// Integers of any int/bool tensor, exactly.
fn int_values(t: &TensorData) -> Vec<i128> {
    match t.dtype() {
        DType::I64 => t.to_vec::<i64>().expect("i64").into_iter().map(i128::from).collect(),
        _ => t.to_f64_vec().into_iter().map(|v| v as i128).collect(),
    }
}

/// `Ok` if `got` matches `want` within tolerance; otherwise the max errors and the first bad index.
fn compare(got: &TensorData, want: &TensorData, rtol: f64, atol: f64) -> Result<(), String> {
    if got.dtype() != want.dtype() || got.shape() != want.shape() {
        return Err(format!(
            "type {}{:?}, want {}{:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        ));
    }
    if !want.dtype().is_float() {
        let (g, w) = (int_values(got), int_values(want));
        let bad: Vec<usize> = (0..w.len()).filter(|&i| g[i] != w[i]).collect();
        return match bad.first() {
            None => Ok(()),
            Some(&i) => Err(format!(
                "{} of {} elements differ; first at {i}: got {}, want {}",
                bad.len(),
                w.len(),
                g[i],
                w[i]
            )),
        };
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let (mut max_abs, mut max_rel, mut bad, mut first) = (0.0f64, 0.0f64, 0usize, None);
    for i in 0..w.len() {
        let (a, b) = (g[i], w[i]);
        let ok = if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if a.is_infinite() || b.is_infinite() {
            a == b
        } else {
            let err = (a - b).abs();
            max_abs = max_abs.max(err);
            max_rel = max_rel.max(err / b.abs().max(f64::MIN_POSITIVE));
            err <= atol + rtol * b.abs()
        };
        if !ok {
            bad += 1;
            first.get_or_insert(i);
        }
    }
    match first {
        None => Ok(()),
        Some(i) => Err(format!(
            "{bad} of {} elements off (rtol {rtol:e}, atol {atol:e}); max abs err {max_abs:e}, max rel err \
             {max_rel:e}; first at {i}: got {}, want {}",
            w.len(),
            g[i],
            w[i]
        )),
    }
}

/// Run one case on the reference backend; `Err` describes the mismatch.
fn check(case: &Case) -> Result<(), String> {
    let run = catch_unwind(AssertUnwindSafe(|| {
        oar_backend_reference::run_graph(&case.graph, &Weights::new(), &case.inputs)
    }));
    let result = match run {
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Err(format!("panicked: {msg}"));
        }
        Ok(r) => r,
    };
    match (result, case.expect_error) {
        (Err(BackendError::Runtime { .. }), true) => Ok(()),
        (Err(e), true) => Err(format!("expected a runtime error, got: {e}")),
        (Ok(_), true) => Err("returned a result, expected an error".into()),
        (Err(e), false) => Err(format!("error: {e}")),
        (Ok(outs), false) => {
            if outs.len() != case.outputs.len() {
                return Err(format!("{} outputs, want {}", outs.len(), case.outputs.len()));
            }
            let errs: Vec<String> = outs
                .iter()
                .zip(&case.outputs)
                .enumerate()
                .filter_map(|(j, ((_, got), want))| {
                    compare(got, want, case.rtol, case.atol)
                        .err()
                        .map(|e| format!("output {j}: {e}"))
                })
                .collect();
            if errs.is_empty() { Ok(()) } else { Err(errs.join("; ")) }
        }
    }
}

#[test]
fn reference_backend_matches_numpy_fixtures() {
    let cases = load_cases();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| check(c).err().map(|e| format!("  {}: {e}", c.name)))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} fixture cases fail on the reference backend:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Ops and modes the fixtures deliberately skip: graph leaves, control flow, and
/// generator-specific randomness (tested by the shared random-stream tests instead); and the
/// collectives ([`skipped`]), which numpy cannot run on several processes (closed forms in
/// `oar_ir::ops::collective`'s tests, real ranks in `tests/distributed`).
const SKIPPED: &[&str] = &[
    "input",
    "param",
    "constant",
    "cond",
    "while",
    "random",
    "random/uniform",
    "random/normal",
    "dropout/train",
];

/// The coverage keys of an op: its mnemonic and its mode (from the op's definition).
fn coverage_keys(op: &Op) -> Vec<String> {
    let mut keys = vec![op.name().to_string()];
    keys.extend(OpDef::mode(op));
    keys.retain(|k| !skipped(k));
    keys
}

fn skipped(key: &str) -> bool {
    SKIPPED.contains(&key) || oar_ir::ops::CollectiveKind::NAMES.contains(&key)
}

/// Every coverage key the fixtures must hit at least once: every mnemonic and mode of the op
/// set, as the definitions declare them, but the skipped ones.
fn required_keys() -> BTreeSet<String> {
    Op::all_mnemonics()
        .iter()
        .map(|s| s.to_string())
        .chain(Op::all_modes())
        .filter(|k| !skipped(k))
        .collect()
}

#[test]
fn fixtures_parse_type_check_and_cover_every_op() {
    let cases = load_cases();
    let covered: BTreeSet<String> = cases
        .iter()
        .filter(|c| !c.expect_error)
        .flat_map(|c| c.graph.node_ids().flat_map(|n| coverage_keys(&c.graph.node(n).op)))
        .collect();
    let missing: Vec<_> = required_keys().difference(&covered).cloned().collect();
    assert!(missing.is_empty(), "ops without a fixture case: {missing:?}");
    // Batch norm in training mode returns three values; make sure that path is exercised.
    assert!(cases.iter().any(|c| c.outputs.len() == 3), "no multi-output case");
    assert!(cases.len() > 300, "only {} fixture cases", cases.len());
}

#[test]
fn comparison_rules_catch_mismatches() {
    let t = |v: &[f64]| TensorData::from_f64_slice(DType::F32, vec![v.len()], v).expect("tensor");
    let nan = f64::NAN;
    assert!(compare(&t(&[1.0, nan, f64::INFINITY]), &t(&[1.0, nan, f64::INFINITY]), 0.0, 0.0).is_ok());
    assert!(compare(&t(&[1.0, 0.0]), &t(&[1.0, nan]), 1.0, 1.0).is_err());
    assert!(compare(&t(&[f64::INFINITY]), &t(&[f64::NEG_INFINITY]), 1.0, 1.0).is_err());
    assert!(compare(&t(&[1.001]), &t(&[1.0]), 1e-2, 0.0).is_ok());
    let e = compare(&t(&[1.0, 2.5]), &t(&[1.0, 2.0]), 1e-3, 0.0).unwrap_err();
    assert!(e.contains("first at 1") && e.contains("1 of 2"), "{e}");
    let i = TensorData::from_vec(vec![2], vec![i64::MAX, 1]).expect("tensor");
    let j = TensorData::from_vec(vec![2], vec![i64::MAX - 1, 1]).expect("tensor");
    assert!(
        compare(&i, &j, 1.0, 1.0).is_err(),
        "i64 compared exactly, not through f64"
    );
    assert!(compare(&t(&[1.0]), &i, 0.0, 0.0).is_err());
}
