//! Runs ONNX's backend node tests (written by `tools/gen_onnx_node_tests.py`) through the importer
//! and the reference backend; reports pass / fail / unsupported per case and per op type.
//!
//! `cargo run -p oar-onnx --example onnx_conformance -- [CASES_DIR] [--baseline FILE] [--summary FILE]`
//! exits non-zero when fewer cases pass than the baseline file's number.
//! Inputs a node needs at import time (a Reshape shape fed as a graph input) are bound as
//! constants on a retry; values compare with each case's rtol/atol (ONNX: 1e-3 / 1e-7) plus 1e-6 atol.

use oar_ir::TensorData;
use oar_onnx::proto::{ModelProto, TensorProto};
use oar_onnx::{ImportOptions, OnnxError};
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Status {
    Pass,
    Fail,
    Unsupported,
}

fn read_tensor(p: &Path) -> Result<TensorData, String> {
    let b = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let t = TensorProto::decode(b.as_slice()).map_err(|e| format!("{}: {e}", p.display()))?;
    oar_onnx::tensor::tensor_from_proto(&t, None).map_err(|e| e.to_string())
}

fn close(got: &TensorData, want: &TensorData, rtol: f64, atol: f64) -> Result<(), String> {
    if got.dtype() != want.dtype() || got.shape() != want.shape() {
        return Err(format!("got {} want {}", got.tensor_type(), want.tensor_type()));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = if want.dtype().is_float() {
            (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs()
        } else {
            a == b
        };
        if !ok {
            return Err(format!("element {i}: got {a}, want {b}"));
        }
    }
    Ok(())
}

fn run_case(dir: &Path) -> (Status, String) {
    let bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return (Status::Fail, e.to_string()),
    };
    let (rtol, atol) = std::fs::read_to_string(dir.join("tolerance.txt"))
        .ok()
        .and_then(|s| {
            let v: Vec<f64> = s.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            (v.len() == 2).then(|| (v[0], v[1]))
        })
        .unwrap_or((1e-3, 1e-7));
    let proto = ModelProto::decode(bytes.as_slice()).unwrap_or_default();
    let gp = proto.graph.unwrap_or_default();
    let inits: Vec<&str> = gp.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    let in_names: Vec<String> = gp
        .input
        .iter()
        .filter_map(|v| v.name.clone())
        .filter(|n| !inits.contains(&n.as_str()))
        .collect();
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    sets.sort();
    for set in sets {
        let mut inputs = BTreeMap::new();
        for (i, n) in in_names.iter().enumerate() {
            match read_tensor(&set.join(format!("input_{i}.pb"))) {
                Ok(t) => inputs.insert(n.clone(), t),
                Err(e) => return (Status::Unsupported, format!("input: {e}")),
            };
        }
        let mut wants = Vec::new();
        for i in 0.. {
            let p = set.join(format!("output_{i}.pb"));
            if !p.exists() {
                break;
            }
            match read_tensor(&p) {
                Ok(t) => wants.push(t),
                Err(e) => return (Status::Unsupported, format!("output: {e}")),
            }
        }
        let mut opts = ImportOptions::default();
        let model = match oar_onnx::from_bytes_with(&bytes, Some(dir), &opts) {
            Err(OnnxError::NonConstant { .. }) => {
                opts.constant_inputs = inputs.clone();
                inputs.clear();
                oar_onnx::from_bytes_with(&bytes, Some(dir), &opts)
            }
            r => r,
        };
        let model = match model {
            Ok(m) => m,
            Err(e @ OnnxError::Unsupported(_)) => return (Status::Unsupported, e.to_string()),
            Err(e) => return (Status::Fail, format!("import: {e}")),
        };
        let inputs: BTreeMap<String, TensorData> = inputs
            .into_iter()
            .filter(|(n, _)| model.graph.input_specs().iter().any(|(m, _)| m == n))
            .collect();
        let outs = match oar_backend_reference::run_graph(&model.graph, &model.weights, &inputs) {
            Ok(o) => o,
            Err(e) => return (Status::Fail, format!("run: {e}")),
        };
        if outs.len() < wants.len() {
            return (
                Status::Fail,
                format!("{} outputs, expected {}", outs.len(), wants.len()),
            );
        }
        for (i, ((_, got), want)) in outs.iter().zip(&wants).enumerate() {
            if let Err(e) = close(got, want, rtol, atol + 1e-6) {
                return (Status::Fail, format!("output {i}: {e}"));
            }
        }
    }
    (Status::Pass, String::new())
}

/// The op type a case tests: the node type whose snake_case name prefixes the case name.
fn case_op(dir: &Path, name: &str) -> String {
    let bytes = std::fs::read(dir.join("model.onnx")).unwrap_or_default();
    let gp = ModelProto::decode(bytes.as_slice())
        .unwrap_or_default()
        .graph
        .unwrap_or_default();
    let snake = |s: &str| {
        let mut o = String::new();
        for (i, c) in s.char_indices() {
            if c.is_uppercase() && i > 0 && !s[..i].ends_with(|p: char| p.is_uppercase()) {
                o.push('_');
            }
            o.extend(c.to_lowercase());
        }
        o
    };
    let bare = name.trim_start_matches("test_").replace('_', "");
    let types: Vec<String> = gp.node.iter().map(|n| n.op_type().to_string()).collect();
    types
        .iter()
        .filter(|t| bare.starts_with(&snake(t).replace('_', "")))
        .max_by_key(|t| t.len())
        .or(types.last())
        .cloned()
        .unwrap_or_else(|| "?".into())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)).cloned();
    let root = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or("target/onnx-node-tests".into());
    let manifest = std::fs::read_to_string(Path::new(&root).join("manifest.txt")).unwrap_or_else(|e| {
        eprintln!("error: {root}/manifest.txt: {e} (run tools/gen_onnx_node_tests.py first)");
        std::process::exit(2);
    });
    std::panic::set_hook(Box::new(|_| {}));
    let mut per_op: BTreeMap<String, [usize; 3]> = BTreeMap::new();
    let mut reasons: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut totals = [0usize; 3];
    let mut lines = Vec::new();
    for name in manifest.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let dir = Path::new(&root).join("cases").join(name);
        let (st, why) = std::panic::catch_unwind(|| run_case(&dir))
            .unwrap_or_else(|_| (Status::Fail, "PANIC (a bug: import must not panic)".into()));
        let op = case_op(&dir, name);
        per_op.entry(op.clone()).or_default()[st as usize] += 1;
        totals[st as usize] += 1;
        if st == Status::Fail {
            let r = reasons.entry(op).or_default();
            if r.len() < 2 {
                r.push(format!("{name}: {}", why.chars().take(160).collect::<String>()));
            }
        }
        lines.push(format!("{name}\t{st:?}\t{why}"));
    }
    let mut md = String::from("| op type | pass | fail | unsupported | failure examples |\n|---|---|---|---|---|\n");
    for (op, [p, f, u]) in &per_op {
        let r = reasons
            .get(op)
            .map(|r| r.join("<br>").replace('|', "\\|"))
            .unwrap_or_default();
        md.push_str(&format!("| {op} | {p} | {f} | {u} | {r} |\n"));
    }
    let summary = format!(
        "onnx node tests: {} pass, {} fail, {} unsupported\n",
        totals[0], totals[1], totals[2]
    );
    print!("{summary}");
    let out = flag("--summary").unwrap_or_else(|| format!("{root}/summary.md"));
    let _ = std::fs::write(&out, format!("{summary}\n{md}"));
    let _ = std::fs::write(format!("{root}/results.tsv"), lines.join("\n") + "\n");
    if let Some(b) = flag("--baseline") {
        let want: usize = std::fs::read_to_string(&b)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if totals[0] < want {
            eprintln!("error: {} node tests pass, baseline {b} says {want}", totals[0]);
            std::process::exit(1);
        }
        println!("baseline {want}: ok");
    }
}
