//! Export check: oar graphs exported with `oar_onnx::to_bytes` run in onnxruntime (through
//! `tools/ort_run.py`, CPU execution provider, after `onnx.checker`'s full check) and must
//! compute what oar's reference backend computes.
//!
//! Tolerance: `|ort - oar| <= 1e-5 * max(|oar|, 1e-2)` per element for the hand-built graphs
//! (1e-5 relative with an absolute floor of 1e-7), exact for integer outputs; the real models
//! re-exported after import (ResNet, MobileNet, transformer encoder, LSTM) are held to the
//! import test's `1e-4 * max(|oar|, 1e-2)`, since onnxruntime sums long dot products in a
//! different order.
//!
//! Needs `python3` with `onnxruntime` and `onnx` (`scripts/test.sh` installs them). When they
//! are missing the tests fail and say so; they never pass without running onnxruntime.

use oar_ir::file::Model;
use oar_ir::npy::{read_npy, write_npy};
use oar_ir::ops::{
    AdaptiveAvgPool2d, ArgReduce, AvgPool2d, BatchNorm, Broadcast, Cast, Concat, Conv2d, Gelu, LayerNorm, LogSoftmax,
    MaxPool2d, Pad, Permute, Reduce, Reshape, Slice, Softmax,
};
use oar_ir::ops::{BinaryOp, ReduceOp, SliceRange, UnaryOp};
use oar_ir::{Composite, DType, Dim, Float, Graph, Op, TensorData, TensorType, ValueId, Weights};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Deterministic values in [-scale, scale] (xorshift).
fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn tensor(seed: u64, shape: &[usize], scale: f32) -> TensorData {
    TensorData::from_vec(shape.to_vec(), values(seed, shape.iter().product(), scale)).unwrap()
}

/// A graph under construction plus its weights.
struct B {
    g: Graph,
    w: Weights,
    seed: u64,
}

impl B {
    fn new(name: &str) -> B {
        B {
            g: Graph::new(name),
            w: Weights::new(),
            seed: 1,
        }
    }
    fn param(&mut self, name: &str, shape: &[usize], scale: f32) -> ValueId {
        self.seed += 1;
        let v = self.g.add_param(name, TensorType::of(DType::F32, shape)).unwrap();
        self.w.insert(name.into(), tensor(self.seed, shape, scale));
        v
    }
    fn param_t(&mut self, name: &str, t: TensorData) -> ValueId {
        let v = self.g.add_param(name, t.tensor_type()).unwrap();
        self.w.insert(name.into(), t);
        v
    }
    fn op(&mut self, op: Op, ins: &[ValueId]) -> ValueId {
        self.g.add_op1(op, ins).unwrap()
    }
    fn c(&mut self, c: Composite, ins: &[ValueId]) -> ValueId {
        self.op(Op::Composite(c), ins)
    }
    fn bin(&mut self, b: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
        self.op(Op::Binary(b), &[x, y])
    }
    fn un(&mut self, u: UnaryOp, x: ValueId) -> ValueId {
        self.op(Op::Unary(u), &[x])
    }
    fn scalar(&mut self, v: f64) -> ValueId {
        self.g.add_scalar(DType::F32, v)
    }
    fn linear(&mut self, name: &str, x: ValueId, i: usize, o: usize) -> ValueId {
        let w = self.param(&format!("{name}.weight"), &[i, o], 1.0 / (i as f32).sqrt());
        let b = self.param(&format!("{name}.bias"), &[o], 0.1);
        self.c(Composite::Linear, &[x, w, b])
    }
    fn done(self) -> Model {
        Model {
            graph: self.g,
            weights: self.w,
        }
    }
}

/// MLP over a symbolic batch: linear → relu → linear → gelu (erf) → linear → tanh-gelu →
/// linear, with log_softmax and softmax outputs.
fn mlp() -> Model {
    let mut b = B::new("mlp");
    let x =
        b.g.add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(8)]))
            .unwrap();
    let h = b.linear("fc1", x, 8, 16);
    let h = b.c(Composite::Relu, &[h]);
    let h = b.linear("fc2", h, 16, 16);
    let h = b.c(Composite::Gelu(Gelu { approximate: false }), &[h]);
    let h = b.linear("fc3", h, 16, 12);
    let h = b.c(Composite::Gelu(Gelu { approximate: true }), &[h]);
    let y = b.linear("fc4", h, 12, 4);
    let lp = b.c(Composite::LogSoftmax(LogSoftmax { axis: 1 }), &[y]);
    let p = b.c(Composite::Softmax(Softmax { axis: 1 }), &[y]);
    b.g.add_output("log_probs", lp).unwrap();
    b.g.add_output("probs", p).unwrap();
    b.done()
}

/// Small CNN: conv → batch_norm → relu → max_pool → grouped strided conv → silu →
/// avg_pool (exclusive padding) → adaptive_avg_pool 1×1 → reshape → linear → softmax.
fn cnn() -> Model {
    let mut b = B::new("cnn");
    let x =
        b.g.add_input("image", TensorType::of(DType::F32, &[2, 3, 16, 16]))
            .unwrap();
    let w1 = b.param("conv1.weight", &[8, 3, 3, 3], 0.4);
    let b1 = b.param("conv1.bias", &[8], 0.1);
    let conv = |stride, pad, groups| {
        Composite::Conv2d(Conv2d {
            stride: [stride, stride],
            padding: [pad, pad, pad, pad],
            dilation: [1, 1],
            groups,
        })
    };
    let h = b.c(conv(1, 1, 1), &[x, w1, b1]);
    let scale = b.param("bn.weight", &[8], 0.2);
    let shift = b.param("bn.bias", &[8], 0.1);
    let mean = b.param("bn.mean", &[8], 0.1);
    let var = b.param_t(
        "bn.var",
        TensorData::from_vec(vec![8], values(99, 8, 0.25).iter().map(|v| v + 1.0).collect()).unwrap(),
    );
    let h = b.c(
        Composite::BatchNorm(BatchNorm {
            epsilon: Float(1e-5),
            momentum: Float(0.9),
            training: false,
        }),
        &[h, scale, shift, mean, var],
    );
    let h = b.c(Composite::Relu, &[h]);
    let h = b.c(
        Composite::MaxPool2d(MaxPool2d {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0, 0, 0],
            ceil_mode: false,
        }),
        &[h],
    );
    let w2 = b.param("conv2.weight", &[8, 4, 3, 3], 0.3);
    let h = b.c(conv(2, 1, 2), &[h, w2]);
    let h = b.c(Composite::Silu, &[h]);
    let h = b.c(
        Composite::AvgPool2d(AvgPool2d {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1, 1, 1],
            ceil_mode: false,
            count_include_pad: false,
        }),
        &[h],
    );
    let h = b.c(
        Composite::AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size: [1, 1] }),
        &[h],
    );
    let h = b.op(
        Op::Reshape(Reshape {
            shape: vec![Dim::Static(2), Dim::Static(8)],
        }),
        &[h],
    );
    let y = b.linear("fc", h, 8, 5);
    let p = b.c(Composite::Softmax(Softmax { axis: 1 }), &[y]);
    b.g.add_output("probs", p).unwrap();
    b.done()
}

/// Primitives: layer_norm, permute, slice, pad, concat, reductions, rsqrt, where, comparisons,
/// float remainder, sigmoid, cast, argmax (an i64 output) and broadcast.
fn mix() -> Model {
    let mut b = B::new("mix");
    let x = b.g.add_input("x", TensorType::of(DType::F32, &[3, 4, 5])).unwrap();
    let lw = b.param("ln.weight", &[5], 0.5);
    let lb = b.param("ln.bias", &[5], 0.1);
    let ln = Composite::LayerNorm(LayerNorm {
        normalized_ndim: 1,
        epsilon: Float(1e-5),
    });
    let h = b.c(ln.clone(), &[x, lw, lb]);
    let h2 = b.c(ln, &[x]);
    let h = b.bin(BinaryOp::Add, h, h2);
    let t = b.op(Op::Permute(Permute { perm: vec![0, 2, 1] }), &[h]); // [3,5,4]
    let s = b.op(
        Op::Slice(Slice {
            ranges: vec![SliceRange::FULL, SliceRange::new(1, 4), SliceRange::FULL],
        }),
        &[t],
    ); // [3,3,4]
    let p = b.op(
        Op::Pad(Pad {
            before: vec![0, 1, 0],
            after: vec![0, 1, 0],
            value: Float(0.5),
        }),
        &[s],
    ); // [3,5,4]
    let cat = b.op(Op::Concat(Concat { axis: 2 }), &[t, p]); // [3,5,8]
    let m = b.op(
        Op::Reduce(Reduce {
            op: ReduceOp::Mean,
            axes: vec![1],
            keepdim: true,
        }),
        &[cat],
    ); // [3,1,8]
    let mx = b.op(
        Op::Reduce(Reduce {
            op: ReduceOp::Max,
            axes: vec![2],
            keepdim: false,
        }),
        &[cat],
    ); // [3,5]
    let sq = b.bin(BinaryOp::Mul, cat, cat);
    let one = b.scalar(1.0);
    let sq1 = b.bin(BinaryOp::Add, sq, one);
    let r = b.un(UnaryOp::Rsqrt, sq1);
    let centered = b.bin(BinaryOp::Sub, cat, m);
    let y = b.bin(BinaryOp::Mul, centered, r);
    let zero = b.scalar(0.0);
    let pos = b.bin(BinaryOp::Gt, y, zero);
    let tenth = b.scalar(0.1);
    let neg = b.bin(BinaryOp::Mul, y, tenth);
    let y = b.op(Op::Where, &[pos, y, neg]);
    let q = b.scalar(0.3);
    let rem = b.bin(BinaryOp::Rem, y, q);
    let ne = b.bin(BinaryOp::Ne, rem, zero);
    let nef = b.op(Op::Cast(Cast { to: DType::F32 }), &[ne]);
    let y = b.bin(BinaryOp::Add, rem, nef);
    let y = b.c(Composite::Sigmoid, &[y]);
    let e = b.un(UnaryOp::Exp, mx);
    let e = b.un(UnaryOp::Tanh, e);
    let e = b.op(
        Op::Reshape(Reshape {
            shape: vec![Dim::Static(3), Dim::Static(5), Dim::Static(1)],
        }),
        &[e],
    );
    let e = b.op(
        Op::Broadcast(Broadcast {
            shape: vec![Dim::Static(3), Dim::Static(5), Dim::Static(8)],
        }),
        &[e],
    );
    let y = b.bin(BinaryOp::Mul, y, e);
    let am = b.op(
        Op::ArgReduce(ArgReduce {
            op: oar_ir::ops::ArgReduceOp::ArgMax,
            axis: 2,
            keepdim: false,
        }),
        &[y],
    );
    b.g.add_output("y", y).unwrap();
    b.g.add_output("argmax", am).unwrap();
    b.done()
}

/// Token classifier: embedding (i64 ids over a symbolic batch) → layer_norm → mean over the
/// sequence → linear.
fn embed() -> Model {
    let mut b = B::new("embed");
    let ids =
        b.g.add_input("ids", TensorType::new(DType::I64, vec![Dim::sym("B"), Dim::Static(6)]))
            .unwrap();
    let table = b.param("emb.weight", &[11, 8], 1.0);
    let e = b.c(Composite::Embedding, &[ids, table]);
    let e = b.c(
        Composite::LayerNorm(LayerNorm {
            normalized_ndim: 1,
            epsilon: Float(1e-5),
        }),
        &[e],
    );
    let m = b.op(
        Op::Reduce(Reduce {
            op: ReduceOp::Mean,
            axes: vec![1],
            keepdim: false,
        }),
        &[e],
    );
    let y = b.linear("head", m, 8, 3);
    b.g.add_output("logits", y).unwrap();
    b.done()
}

/// Export `m`, run it in onnxruntime and compare with the reference backend. Returns the
/// largest relative error.
fn check(label: &str, m: &Model, inputs: BTreeMap<String, TensorData>, rtol: f64) -> f64 {
    let want = oar_backend_reference::run_graph(&m.graph, &m.weights, &inputs)
        .unwrap_or_else(|e| panic!("{label}: reference: {e}"));
    let dir = tempfile::tempdir().unwrap();
    oar_onnx::save(m, &dir.path().join("model.onnx")).unwrap_or_else(|e| panic!("{label}: export: {e}"));
    let got = run_ort_batch(&[(dir.path().to_path_buf(), inputs)]).remove(0);
    compare(label, &want, &got.unwrap_or_else(|e| panic!("{label}: {e}")), rtol)
}

/// onnxruntime's outputs `got` against the reference's `want`: floats within `rtol ·
/// max(|want|, 1e-2)`, integers exactly. Returns the largest relative error.
fn compare(label: &str, want: &[(String, TensorData)], got: &[TensorData], rtol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{label}: number of outputs");
    let mut worst = 0.0f64;
    for ((name, w), g) in want.iter().zip(got) {
        assert_eq!(g.shape(), w.shape(), "{label}/{name}: shape");
        assert_eq!(g.dtype(), w.dtype(), "{label}/{name}: dtype");
        let (gv, wv) = (g.to_f64_vec(), w.to_f64_vec());
        if !w.dtype().is_float() {
            assert_eq!(gv, wv, "{label}/{name}: integer output differs");
            continue;
        }
        for (i, (a, b)) in gv.iter().zip(&wv).enumerate() {
            let e = if a.is_nan() && b.is_nan() {
                0.0
            } else {
                (a - b).abs() / b.abs().max(1e-2)
            };
            assert!(
                e <= rtol,
                "{label}/{name}[{i}]: onnxruntime {a} vs oar {b} (relative error {e:.3e} > {rtol:e})"
            );
            worst = worst.max(e);
        }
    }
    eprintln!("{label}: max rel err {worst:.3e}");
    worst
}

/// Run many exported models in one onnxruntime process (`tools/ort_run.py --batch`): for each
/// `(directory holding model.onnx, inputs)`, its outputs or onnxruntime's error.
fn run_ort_batch(cases: &[(PathBuf, BTreeMap<String, TensorData>)]) -> Vec<Result<Vec<TensorData>, String>> {
    let list = tempfile::NamedTempFile::new().unwrap();
    let mut lines = String::new();
    for (dir, inputs) in cases {
        let mut feeds = serde_json::Map::new();
        for (i, (name, t)) in inputs.iter().enumerate() {
            let p = dir.join(format!("input_{i}.npy"));
            write_npy(&p, t).unwrap();
            feeds.insert(name.clone(), p.display().to_string().into());
        }
        let line = serde_json::json!({
            "model": dir.join("model.onnx").display().to_string(),
            "out": dir.join("out").display().to_string(),
            "inputs": feeds,
        });
        lines.push_str(&format!("{line}\n"));
    }
    std::fs::write(list.path(), lines).unwrap();
    let out = Command::new("python3")
        .arg(repo().join("tools/ort_run.py"))
        .arg("--batch")
        .arg(list.path())
        .arg("--check")
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `python3` ({e}): the ONNX export check needs python3 with onnxruntime and onnx")
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(2) => panic!("the ONNX export check needs onnxruntime and onnx in python3: {stderr}"),
        _ => panic!("tools/ort_run.py --batch failed ({}):\n{stderr}", out.status),
    }
    cases
        .iter()
        .map(|(dir, _)| {
            let out = dir.join("out");
            if let Ok(e) = std::fs::read_to_string(out.join("error.txt")) {
                return Err(e);
            }
            let n: usize = std::fs::read_to_string(out.join("outputs.txt"))
                .map_err(|e| format!("no outputs from onnxruntime: {e}"))?
                .trim()
                .parse()
                .map_err(|e| format!("outputs.txt: {e}"))?;
            Ok((0..n)
                .map(|i| read_npy(&out.join(format!("output_{i}.npy"))).unwrap())
                .collect())
        })
        .collect()
}

#[test]
fn exported_mlp_matches_onnxruntime() {
    let x = tensor(7, &[5, 8], 2.0);
    check("mlp", &mlp(), BTreeMap::from([("x".into(), x)]), 1e-5);
}

#[test]
fn exported_cnn_matches_onnxruntime() {
    let x = tensor(8, &[2, 3, 16, 16], 1.0);
    check("cnn", &cnn(), BTreeMap::from([("image".into(), x)]), 1e-5);
}

#[test]
fn exported_primitives_match_onnxruntime() {
    let x = tensor(9, &[3, 4, 5], 2.0);
    check("mix", &mix(), BTreeMap::from([("x".into(), x)]), 1e-5);
}

#[test]
fn exported_embedding_matches_onnxruntime() {
    let ids = TensorData::from_vec(vec![3, 6], (0..18).map(|i| (i * 7 % 11) as i64).collect()).unwrap();
    check("embed", &embed(), BTreeMap::from([("ids".into(), ids)]), 1e-5);
}

/// The committed PyTorch exports, imported into oar and exported again, run in onnxruntime.
#[test]
fn reexported_torch_models_match_onnxruntime() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models");
    for name in ["resnet18", "mobilenet_v2", "transformer_encoder", "lstm"] {
        let m = oar_onnx::load(&dir.join(format!("{name}.onnx"))).unwrap();
        let x = read_npy(&dir.join(format!("{name}.input_0.npy"))).unwrap();
        let input = m.graph.input_specs()[0].0.clone();
        check(&format!("{name} (re-exported)"), &m, BTreeMap::from([(input, x)]), 1e-4);
    }
}

/// Every op sample (`OpDef::samples`: the ops declared with samples, e.g. conv_transpose,
/// resize, group/instance norm, border_pad, cumsum, sort, topk, argsort, masked_fill, one_hot,
/// einsum) exported, run in onnxruntime, and imported back: both must compute what the reference
/// computes (tolerance: `1e-5 · max(|oar|, 1e-2)` relative; integers exactly).
#[test]
fn every_op_sample_exports_to_onnxruntime_and_imports_back() {
    #[cfg(target_arch = "x86_64")]
    fn vnni() -> bool {
        std::arch::is_x86_feature_detected!("avx512vnni") || std::arch::is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    fn vnni() -> bool {
        true
    }
    use oar_ir::ops::sample::SampleRng;
    let samples = Op::all_samples();
    let total = samples.len();
    let root = tempfile::tempdir().unwrap();
    let mut cases = Vec::new();
    let mut runs = Vec::new();
    for (k, s) in samples.iter().enumerate() {
        let mut g = Graph::new("sample");
        let mut rng = SampleRng::for_case(&s.name, 5);
        let mut inputs = BTreeMap::new();
        let mut vals = Vec::new();
        for (i, inp) in s.inputs.iter().enumerate() {
            let t = inp.domain.tensor(inp.dtype, &inp.shape, &mut rng);
            vals.push(g.add_input(&format!("x{i}"), t.tensor_type()).unwrap());
            inputs.insert(format!("x{i}"), t);
        }
        let outs = g.add_op(s.op.clone(), &vals).unwrap();
        for (i, v) in outs.iter().enumerate() {
            g.add_output(&format!("y{i}"), *v).unwrap();
        }
        let m = Model {
            graph: g,
            weights: Weights::new(),
        };
        let dir = root.path().join(format!("case{k}"));
        std::fs::create_dir_all(&dir).unwrap();
        oar_onnx::save(&m, &dir.join("model.onnx")).unwrap_or_else(|e| panic!("{}: export: {e}", s.name));
        runs.push((dir, inputs.clone()));
        cases.push((m, inputs));
    }
    let mut ran = 0;
    for ((s, (m, inputs)), got) in samples.iter().zip(&cases).zip(run_ort_batch(&runs)) {
        let want = oar_backend_reference::run_graph(&m.graph, &m.weights, inputs)
            .unwrap_or_else(|e| panic!("{}: reference: {e}", s.name));
        // A valid model (onnx.checker passed) whose dtype onnxruntime has no kernel for is
        // reported, not failed: the import-back check below still runs.
        match got {
            // onnxruntime's u8 × i8 integer kernels on x86 without VNNI add pairs of products
            // in 16 bits with saturation (`vpmaddubsw`): the sample's extreme values overflow
            // them. Its output is then checked only where the host has VNNI (exact).
            Ok(got) if s.name.starts_with("matmul_integer/u8s8") && !vnni() => {
                let differs = want[0].1.to_f64_vec() != got[0].to_f64_vec();
                eprintln!(
                    "{}: onnxruntime saturates u8 x i8 pair sums on this host (differs: {differs})",
                    s.name
                );
                ran += 1;
            }
            Ok(got) => {
                compare(&s.name, &want, &got, 1e-5);
                ran += 1;
            }
            Err(e) if e.contains("NOT_IMPLEMENTED") => eprintln!(
                "{}: onnxruntime lacks a kernel: {}",
                s.name,
                e.lines().last().unwrap_or("")
            ),
            Err(e) => panic!("{}: {e}", s.name),
        }
        let back =
            oar_onnx::from_bytes(&oar_onnx::to_bytes(m).unwrap()).unwrap_or_else(|e| panic!("{}: import: {e}", s.name));
        let got = oar_backend_reference::run_graph(&back.graph, &back.weights, inputs)
            .unwrap_or_else(|e| panic!("{}: imported graph: {e}", s.name));
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            assert_eq!(g.tensor_type(), w.tensor_type(), "{}/{name}", s.name);
            for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1e-2) || (a.is_nan() && b.is_nan()),
                    "{}/{name}: {a} vs {b}",
                    s.name
                );
            }
        }
    }
    assert!(ran * 5 >= total * 4, "onnxruntime ran only {ran} of {total} samples");
}

/// A composite without an ONNX writer for its attributes is exported as its decomposition
/// (the default; no per-op export list): adaptive pooling to 2×3 and circular padding (ONNX
/// `wrap` needs opset 19) run in onnxruntime and import back to what the reference computes.
#[test]
fn composites_without_a_writer_export_as_their_decomposition() {
    use oar_ir::ops::{BorderPad, PadMode};
    let mut g = Graph::new("decomposed");
    let x = g.add_input("x", TensorType::of(DType::F32, &[2, 3, 6, 7])).unwrap();
    let pooled = g
        .add_op1(
            Op::Composite(Composite::AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size: [2, 3] })),
            &[x],
        )
        .unwrap();
    let padded = g
        .add_op1(
            Op::Composite(Composite::BorderPad(BorderPad {
                before: vec![0, 0, 1, 2],
                after: vec![0, 0, 2, 1],
                mode: PadMode::Circular,
            })),
            &[x],
        )
        .unwrap();
    g.add_output("pooled", pooled).unwrap();
    g.add_output("padded", padded).unwrap();
    let m = Model {
        graph: g,
        weights: Weights::new(),
    };
    let bytes = oar_onnx::to_bytes(&m).unwrap();
    let back = oar_onnx::from_bytes(&bytes).unwrap();
    for n in back.graph.topo_order() {
        let name = back.graph.node(n).op.name();
        assert!(
            !["adaptive_avg_pool2d", "border_pad"].contains(&name),
            "{name} survived export"
        );
    }
    let inputs = BTreeMap::from([("x".to_string(), tensor(11, &[2, 3, 6, 7], 1.0))]);
    check("decomposed composites", &m, inputs, 1e-5);
}

/// AMP graphs export with their `Cast` nodes and run in onnxruntime: the MLP and the CNN after
/// the `amp` pass at f16 (bf16 would need bf16 MatMul/Conv kernels, which onnxruntime's CPU
/// provider does not have), compared with the reference on the same mixed graph. Tolerance:
/// 5e-3 relative, a few f16 steps (the results are f16, their products summed in other orders;
/// measured 3e-5).
#[test]
fn amp_graphs_export_their_casts_and_run_in_onnxruntime() {
    use oar_passes::Pass;
    for (label, mut m, name, x) in [
        ("amp mlp", mlp(), "x", tensor(7, &[5, 8], 2.0)),
        ("amp cnn", cnn(), "image", tensor(8, &[2, 3, 16, 16], 1.0)),
    ] {
        oar_passes::Amp::parse("f16").unwrap().run(&mut m.graph).unwrap();
        let bytes = oar_onnx::to_bytes(&m).unwrap();
        let proto = <oar_onnx::proto::ModelProto as prost::Message>::decode(bytes.as_slice()).unwrap();
        let casts = proto
            .graph
            .as_ref()
            .unwrap()
            .node
            .iter()
            .filter(|n| n.op_type.as_deref() == Some("Cast"))
            .count();
        assert!(casts >= 4, "{label}: {casts} Cast nodes");
        check(label, &m, BTreeMap::from([(name.into(), x)]), 5e-3);
    }
}

/// How often each ONNX op type occurs in the exported `m`.
fn op_counts(m: &Model) -> BTreeMap<String, usize> {
    let bytes = oar_onnx::to_bytes(m).unwrap();
    let proto = <oar_onnx::proto::ModelProto as prost::Message>::decode(bytes.as_slice()).unwrap();
    let mut counts = BTreeMap::new();
    for n in &proto.graph.unwrap().node {
        *counts.entry(n.op_type.clone().unwrap()).or_insert(0) += 1;
    }
    counts
}

/// relu6 as oar writes it (`min(max(x, 0), 6)`) exports as `Clip` and `max(x, 0)` as `Relu`,
/// as PyTorch writes them (onnxruntime fuses both into the convolution before them); values
/// are named by the nodes computing them, with an `Identity` only per graph output. Where the
/// pattern does not hold — the `max` has a second reader, a bound is not a scalar constant, the
/// constant is not 0 — plain `Max`/`Min` are written. Every form runs in onnxruntime and imports
/// back to what the reference computes.
#[test]
fn bounds_export_as_clip_and_relu() {
    let mut b = B::new("bounds");
    let x = b.g.add_input("x", TensorType::of(DType::F32, &[2, 3, 6, 6])).unwrap();
    let w = b.param("conv.weight", &[4, 3, 3, 3], 0.5);
    let cb = b.param("conv.bias", &[4], 0.1);
    let conv = Composite::Conv2d(Conv2d {
        stride: [1, 1],
        padding: [1, 1, 1, 1],
        dilation: [1, 1],
        groups: 1,
    });
    let h = b.c(conv, &[x, w, cb]);
    // relu6, the constant first in the max: one Clip.
    let (zero, six) = (b.scalar(0.0), b.scalar(6.0));
    let m = b.bin(BinaryOp::Max, zero, h);
    let relu6 = b.bin(BinaryOp::Min, m, six);
    // max(x, 0) on its own: Relu.
    let relu = b.bin(BinaryOp::Max, x, zero);
    // A max read twice stays Max, and so does one with a bound other than 0; the min stays Min.
    let lo = b.scalar(-0.25);
    let shared = b.bin(BinaryOp::Max, h, lo);
    let hi = b.scalar(0.5);
    let clipped = b.bin(BinaryOp::Min, shared, hi);
    let twice = b.bin(BinaryOp::Add, clipped, shared);
    // A bound that is a tensor, not a scalar constant: Max and Min.
    let t = b.param("bound", &[4, 1, 1], 1.0);
    let tm = b.bin(BinaryOp::Max, h, t);
    let tensor_bound = b.bin(BinaryOp::Min, tm, six);
    for (name, v) in [
        ("relu6", relu6),
        ("relu", relu),
        ("twice", twice),
        ("tensor_bound", tensor_bound),
    ] {
        b.g.add_output(name, v).unwrap();
    }
    let m = b.done();
    let counts = op_counts(&m);
    let count = |op: &str| counts.get(op).copied().unwrap_or(0);
    assert_eq!(
        (
            count("Clip"),
            count("Relu"),
            count("Max"),
            count("Min"),
            count("Identity")
        ),
        (1, 1, 2, 2, 4),
        "{counts:?}"
    );
    let inputs = BTreeMap::from([("x".to_string(), tensor(5, &[2, 3, 6, 6], 3.0))]);
    check("bounds", &m, inputs.clone(), 1e-5);
    let back = oar_onnx::from_bytes(&oar_onnx::to_bytes(&m).unwrap()).unwrap();
    let want = oar_backend_reference::run_graph(&m.graph, &m.weights, &inputs).unwrap();
    let got = oar_backend_reference::run_graph(&back.graph, &back.weights, &inputs).unwrap();
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        assert_eq!(w.to_f64_vec(), g.to_f64_vec(), "{name} after import");
    }
}
