//! Shared fixtures for the `.oar` file tests: a model exercising every feature of the format,
//! and helpers to take file bytes apart and put them back together.

#![allow(dead_code)]

use oar_ir::file::{FORMAT_VERSION, MAGIC, Model};
use oar_ir::ops::{BinaryOp, UnaryOp};
use oar_ir::ops::{Cast, LayerNorm, Pad};
use oar_ir::{Composite, DType, Dim, Float, Graph, Op, TensorData, TensorType, Weights};

/// A model with graph inputs (one symbolic), params of every dtype, constants, composites,
/// non-finite float attributes, and a cond whose regions hold ops and a param.
pub fn sample_model() -> Model {
    let mut g = Graph::new("sample");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(4)]))
        .unwrap();
    let flag = g.add_input("flag", TensorType::of(DType::Bool, &[])).unwrap();
    let w = g.add_param("fc.weight", TensorType::of(DType::F32, &[4, 3])).unwrap();
    let b = g.add_param("fc.bias", TensorType::of(DType::F32, &[3])).unwrap();
    let mut weights = Weights::new();
    weights.insert(
        "fc.weight".into(),
        TensorData::from_vec(vec![4, 3], (0..12).map(|i| i as f32 * 0.5 - 2.0).collect()).unwrap(),
    );
    weights.insert(
        "fc.bias".into(),
        TensorData::from_vec(vec![3], vec![0.25f32, -0.0, 1e-30]).unwrap(),
    );
    // One unused param of every other dtype, so each safetensors dtype mapping is exercised.
    for (i, d) in DType::ALL.into_iter().enumerate() {
        let name = format!("extra.{d}");
        g.add_param(&name, TensorType::of(d, &[2, i + 1])).unwrap();
        let vals: Vec<f64> = (0..2 * (i + 1)).map(|k| (k % 2) as f64 * (i as f64 + 1.5)).collect();
        weights.insert(name, TensorData::from_f64_slice(d, vec![2, i + 1], &vals).unwrap());
    }
    let y = g.add_op1(Op::Composite(Composite::Linear), &[x, w, b]).unwrap();
    let y = g
        .add_op1(
            Op::Composite(Composite::LayerNorm(LayerNorm {
                normalized_ndim: 1,
                epsilon: Float(1e-5),
            })),
            &[y],
        )
        .unwrap();
    let c = g.add_constant(TensorData::from_vec(vec![3], vec![1.0f32, f32::NAN, -0.0]).unwrap());
    let y = g.binary(BinaryOp::Mul, y, c).unwrap();
    let i = g.add_constant(TensorData::from_vec(vec![2], vec![7i64, -1]).unwrap());
    let _unused = g.add_op1(Op::Cast(Cast { to: DType::F16 }), &[i]).unwrap();

    let then_ = {
        let mut r = Graph::new("then");
        let a = r
            .add_input("a", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(3)]))
            .unwrap();
        let e = r.unary(UnaryOp::Exp, a).unwrap();
        r.add_output("r", e).unwrap();
        r
    };
    let else_ = {
        let mut r = Graph::new("else");
        let a = r
            .add_input("a", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(3)]))
            .unwrap();
        let s = r.add_param("else.scale", TensorType::of(DType::F32, &[3])).unwrap();
        let m = r.binary(BinaryOp::Mul, a, s).unwrap();
        r.add_output("r", m).unwrap();
        r
    };
    weights.insert(
        "else.scale".into(),
        TensorData::from_vec(vec![3], vec![2.0f32, 3.0, 4.0]).unwrap(),
    );
    let z = g.add_region_op(Op::Cond, &[flag, y], vec![then_, else_]).unwrap()[0];
    // -inf has no JSON number: checks the Float encoding survives the file.
    let pad = Op::Pad(Pad {
        before: vec![0, 1],
        after: vec![0, 2],
        value: Float(f64::NEG_INFINITY),
    });
    let p = g.add_op1(pad, &[z]).unwrap();
    g.add_output("out", p).unwrap();
    g.add_output("hidden", y).unwrap();
    Model { graph: g, weights }
}

/// The graph JSON and weights blob of valid file bytes.
pub fn sections(bytes: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let glen = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
    let graph = bytes[20..20 + glen].to_vec();
    let wlen = u64::from_le_bytes(bytes[20 + glen..28 + glen].try_into().unwrap()) as usize;
    (graph, bytes[28 + glen..28 + glen + wlen].to_vec())
}

/// File bytes from a version, a graph section and a weights section.
pub fn assemble(version: u32, graph: &[u8], weights: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(graph.len() as u64).to_le_bytes());
    out.extend_from_slice(graph);
    out.extend_from_slice(&(weights.len() as u64).to_le_bytes());
    out.extend_from_slice(weights);
    out
}

/// File bytes with the current version.
pub fn assemble_v1(graph: &[u8], weights: &[u8]) -> Vec<u8> {
    assemble(FORMAT_VERSION, graph, weights)
}

/// A graph whose regions nest `depth` deep: each level is `cond(p, p, a)` whose then-region is
/// the level below and whose else-region is the leaf `neg(a)` (so the size stays linear).
pub fn nested_conds(depth: usize) -> Graph {
    let mut g = Graph::new(&format!("level{depth}"));
    let p = g.add_input("p", TensorType::of(DType::Bool, &[])).unwrap();
    let a = g.add_input("a", TensorType::of(DType::F32, &[2])).unwrap();
    let out = if depth == 0 {
        g.unary(UnaryOp::Neg, a).unwrap()
    } else {
        let regions = vec![nested_conds(depth - 1), nested_conds(0)];
        g.add_region_op(Op::Cond, &[p, p, a], regions).unwrap()[0]
    };
    g.add_output("r", out).unwrap();
    g
}

/// A unique empty temp directory for one test.
pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("oar-file-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
