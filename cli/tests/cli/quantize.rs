//! `oar quantize`: post-training quantization of a saved model from .npy calibration data.

use crate::common::{assert_clean_error, oar, stdout};
use oar::ir::file::Model;
use oar::ir::{Composite, DType, Dim, Graph, Op, TensorData, TensorType};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const K: usize = 16;
const N: usize = 8;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// y = x @ w + b, x: f32[B, 16], w: f32[16, 8] (columns scaled differently), b: f32[8].
fn linear_model(dir: &Path) -> (PathBuf, Vec<f32>, Vec<f32>) {
    let mut g = Graph::new("lin");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("B"), Dim::Static(K)]))
        .unwrap();
    let w = g.add_param("w", TensorType::of(DType::F32, &[K, N])).unwrap();
    let b = g.add_param("b", TensorType::of(DType::F32, &[N])).unwrap();
    let y = g.add_op1(Op::Composite(Composite::Linear), &[x, w, b]).unwrap();
    g.add_output("y", y).unwrap();
    let wv: Vec<f32> = values(K * N, 1)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1 + i % N) as f32)
        .collect();
    let bv = values(N, 2);
    let weights = BTreeMap::from([
        ("w".to_string(), TensorData::from_vec(vec![K, N], wv.clone()).unwrap()),
        ("b".to_string(), TensorData::from_vec(vec![N], bv.clone()).unwrap()),
    ]);
    let path = dir.join("lin.oar");
    Model { graph: g, weights }.save(&path).unwrap();
    (path, wv, bv)
}

fn run(model: &Model, x: &TensorData) -> Vec<f32> {
    let exe = oar::backend::get("cpu")
        .unwrap()
        .compile(&model.graph, &model.weights)
        .unwrap();
    let outs = exe.run(&BTreeMap::from([("x".to_string(), x.clone())])).unwrap();
    outs[0].1.to_vec::<f32>().unwrap()
}

/// Min-max calibration and per-channel weights: the saved model computes the linear layer on
/// i8 weights and u8 inputs (`matmul_integer`), the float weight is gone from the file, and
/// every output is within the error the two roundings allow: per term, the input off by at most
/// one step `s_a` (half a step of rounding, half of the zero point's), the weight by half its
/// column's step `s_w`.
#[test]
fn quantize_calibrates_and_writes_an_integer_model() {
    let dir = tempfile::tempdir().unwrap();
    let (path, w, b) = linear_model(dir.path());
    let rows = 100;
    // Inputs skewed positive, so the zero point is not the middle of the range.
    let xv: Vec<f32> = values(rows * K, 3).iter().map(|v| v * 2.0 + 0.7).collect();
    let x = TensorData::from_vec(vec![rows, K], xv.clone()).unwrap();
    let data = dir.path().join("calib.npy");
    oar::ir::npy::write_npy(&data, &x).unwrap();
    let out = dir.path().join("lin.q.oar");
    let o = oar(&[
        "quantize",
        path.to_str().unwrap(),
        "--calibrate",
        data.to_str().unwrap(),
        "--per-channel",
        "--batch-size",
        "30",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("quantized 1 product(s) (1 linear) from 4 calibration batches"),
        "{text}"
    );

    let float = Model::load(&path).unwrap();
    let int8 = Model::load(&out).unwrap();
    let ir = int8.graph.to_string();
    assert!(ir.contains("matmul_integer"), "{ir}");
    assert_eq!(int8.weights["w.int8"].dtype(), DType::I8);
    assert!(
        !int8.weights.contains_key("w"),
        "the float weight stays out of the file"
    );

    let (lo, hi) = xv.iter().fold((0f32, 0f32), |(l, h), &v| (l.min(v), h.max(v)));
    let sa = (hi - lo) / 255.0;
    let sw: Vec<f32> = (0..N)
        .map(|n| (0..K).map(|k| w[k * N + n].abs()).fold(0.0, f32::max) / 127.0)
        .collect();
    let (yf, yq) = (run(&float, &x), run(&int8, &x));
    for r in 0..rows {
        for n in 0..N {
            let bound: f32 = (0..K)
                .map(|k| xv[r * K + k].abs() * sw[n] / 2.0 + w[k * N + n].abs() * sa + sa * sw[n] / 2.0)
                .sum::<f32>()
                + 1e-4 * (1.0 + b[n].abs());
            let (f, q) = (yf[r * N + n], yq[r * N + n]);
            assert!(
                (f - q).abs() <= bound,
                "row {r} col {n}: float {f}, int8 {q}, bound {bound}"
            );
        }
    }
    assert_ne!(yf, yq, "the integer model rounds");

    // The default output name, and kl calibration.
    let o = oar(&[
        "quantize",
        path.to_str().unwrap(),
        "-c",
        data.to_str().unwrap(),
        "--method",
        "kl",
    ]);
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    assert!(dir.path().join("lin.int8.oar").exists());
}

#[test]
fn quantize_errors_name_the_flag_input_or_model() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _, _) = linear_model(dir.path());
    let p = path.to_str().unwrap();
    let data = dir.path().join("calib.npy");
    oar::ir::npy::write_npy(&data, &TensorData::from_vec(vec![4, K], values(4 * K, 5)).unwrap()).unwrap();
    let d = data.to_str().unwrap();
    assert_clean_error(
        &oar(&["quantize", p, "-c", d, "--method", "median"]),
        "`median` is not a calibration method",
    );
    assert_clean_error(
        &oar(&["quantize", p, "-c", d, "--method", "percentile=120"]),
        "percentile must be a number in (0, 100]",
    );
    assert_clean_error(&oar(&["quantize", p, "-c", &format!("z={d}")]), "no input `z`");
    assert_clean_error(&oar(&["quantize", p, "-c", d, "--batch-size", "0"]), "--batch-size");
    let wrong = dir.path().join("wrong.npy");
    oar::ir::npy::write_npy(&wrong, &TensorData::from_vec(vec![4, 3], vec![0f32; 12]).unwrap()).unwrap();
    assert_clean_error(
        &oar(&["quantize", p, "-c", wrong.to_str().unwrap()]),
        "calibration batch 0",
    );
    assert_clean_error(&oar(&["quantize", "missing.oar", "-c", d]), "missing.oar");
    // Nothing to quantize: a graph without products.
    let mut g = Graph::new("relu");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("B"), Dim::Static(K)]))
        .unwrap();
    let y = g.add_op1(Op::Composite(Composite::Relu), &[x]).unwrap();
    g.add_output("y", y).unwrap();
    let relu = dir.path().join("relu.oar");
    Model {
        graph: g,
        weights: BTreeMap::new(),
    }
    .save(&relu)
    .unwrap();
    assert_clean_error(
        &oar(&["quantize", relu.to_str().unwrap(), "-c", d]),
        "no matmul, linear or conv2d",
    );
}
