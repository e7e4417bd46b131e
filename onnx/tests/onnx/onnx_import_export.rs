//! Import, export and hostile-input tests for oar-onnx, with the reference backend as oracle.

use oar_ir::file::Model;
use oar_ir::ops::Softmax;
use oar_ir::{Composite, DType, Dim, Graph, Op, TensorData, TensorType, Weights};
use oar_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
    tensor_shape_proto::{Dimension, dimension},
    type_proto,
};
use oar_onnx::{OnnxError, tensor::tensor_to_proto};
use prost::Message;
use std::collections::BTreeMap;

fn run(m: &Model, x: &TensorData) -> Vec<f64> {
    let name = m.graph.input_specs()[0].0.clone();
    let inputs = BTreeMap::from([(name, x.clone())]);
    oar_backend_reference::run_graph(&m.graph, &m.weights, &inputs).unwrap()[0]
        .1
        .to_f64_vec()
}

/// linear(4→3) + relu + softmax over a symbolic batch.
fn mlp() -> Model {
    let mut g = Graph::new("mlp");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(4)]))
        .unwrap();
    let w = g.add_param("fc.weight", TensorType::of(DType::F32, &[4, 3])).unwrap();
    let b = g.add_param("fc.bias", TensorType::of(DType::F32, &[3])).unwrap();
    let h = g.add_op1(Op::Composite(Composite::Linear), &[x, w, b]).unwrap();
    let h = g.add_op1(Op::Composite(Composite::Relu), &[h]).unwrap();
    let y = g
        .add_op1(Op::Composite(Composite::Softmax(Softmax { axis: 1 })), &[h])
        .unwrap();
    g.add_output("y", y).unwrap();
    let mut weights = Weights::new();
    let wv: Vec<f32> = (0..12).map(|i| (i as f32 - 6.0) * 0.1).collect();
    weights.insert("fc.weight".into(), TensorData::from_vec(vec![4, 3], wv).unwrap());
    weights.insert(
        "fc.bias".into(),
        TensorData::from_vec(vec![3], vec![0.1f32, -0.2, 0.3]).unwrap(),
    );
    Model { graph: g, weights }
}

#[test]
fn export_then_import_computes_the_same() {
    let m = mlp();
    let bytes = oar_onnx::to_bytes(&m).unwrap();
    let back = oar_onnx::from_bytes(&bytes).unwrap();
    assert_eq!(
        back.graph.input_specs()[0].1.shape.0[0],
        Dim::sym("N"),
        "dim_param stays symbolic"
    );
    assert_eq!(back.weights.len(), 2);
    let x = TensorData::from_vec(vec![2, 4], vec![1.0f32, 2.0, -1.0, 0.5, 0.0, -3.0, 2.0, 1.0]).unwrap();
    let (a, b) = (run(&m, &x), run(&back, &x));
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() < 1e-6, "{a:?} vs {b:?}");
    }
}

fn vi(name: &str, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Ok(n) => dimension::Value::DimValue(*n),
                Err(s) => dimension::Value::DimParam(s.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op: &str, ins: &[&str], out: &str, attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        // Node names are unique in a valid model (onnxruntime refuses duplicates).
        name: Some(format!("{op}_{}", {
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        })),
        attribute: attrs,
        ..Default::default()
    }
}

fn model(nodes: Vec<NodeProto>, inits: Vec<oar_onnx::proto::TensorProto>, opset: i64) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(GraphProto {
            node: nodes,
            initializer: inits,
            input: vec![vi("x", &[Err("batch"), Ok(2)])],
            output: vec![vi("y", &[Err("batch"), Ok(2)])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn gemm_with_transposed_weight_matches_hand_computation() {
    let w = TensorData::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(); // [out, in]
    let b = TensorData::from_vec(vec![2], vec![0.5f32, -100.0]).unwrap();
    let trans_b = AttributeProto {
        r#type: Some(2),
        name: Some("transB".into()),
        i: Some(1),
        ..Default::default()
    };
    let nodes = vec![
        node("Gemm", &["x", "w", "b"], "h", vec![trans_b]),
        node("Relu", &["h"], "y", vec![]),
    ];
    let m = model(nodes, vec![tensor_to_proto("w", &w), tensor_to_proto("b", &b)], 13);
    let imported = oar_onnx::from_bytes(&m.encode_to_vec()).unwrap();
    let x = TensorData::from_vec(vec![1, 2], vec![1.0f32, 1.0]).unwrap();
    // x @ wᵀ = [1+2, 3+4] = [3, 7]; + b = [3.5, -93]; relu → [3.5, 0].
    assert_eq!(run(&imported, &x), vec![3.5, 0.0]);
}

#[test]
fn shape_chain_folds_to_a_constant_reshape() {
    // y = Reshape(x, Concat(Gather(Shape(x), 0), [-1])) on a static input folds to reshape [2, 2].
    let idx = TensorData::scalar(0i64);
    let neg = TensorData::from_vec(vec![1], vec![-1i64]).unwrap();
    let axes = TensorData::from_vec(vec![1], vec![0i64]).unwrap();
    let nodes = vec![
        node("Shape", &["x"], "s", vec![]),
        node("Gather", &["s", "i"], "d0", vec![]),
        node("Unsqueeze", &["d0", "ax"], "d0v", vec![]),
        node(
            "Concat",
            &["d0v", "m1"],
            "shape",
            vec![AttributeProto {
                r#type: Some(2),
                name: Some("axis".into()),
                i: Some(0),
                ..Default::default()
            }],
        ),
        node("Reshape", &["x", "shape"], "y", vec![]),
    ];
    let mut m = model(
        nodes,
        vec![
            tensor_to_proto("i", &idx),
            tensor_to_proto("m1", &neg),
            tensor_to_proto("ax", &axes),
        ],
        13,
    );
    let g = m.graph.as_mut().unwrap();
    g.input = vec![vi("x", &[Ok(2), Ok(2)])];
    g.output = vec![vi("y", &[Ok(2), Ok(2)])];
    let imported = oar_onnx::from_bytes(&m.encode_to_vec()).unwrap();
    let ops: Vec<&str> = imported
        .graph
        .node_ids()
        .map(|n| imported.graph.node(n).op.name())
        .collect();
    assert!(ops.iter().all(|o| ["input", "reshape"].contains(o)), "{ops:?}");
}

/// A dynamic-batch shape computation: `Reshape(x, Concat(Gather(Shape(x), 0), [-1]))` and a
/// `Reshape` to `[N*2, 3]` built from `Mul(Gather(Shape(x), 0), 2)`, on `x[batch, 2, 3]`: the
/// importer follows the shape tensors symbolically, so the reshapes get `[batch, 6]` and
/// `[2*batch, 3]`, and one imported graph runs every batch size.
#[test]
fn shape_chain_on_a_symbolic_batch_reshapes_symbolically() {
    let axis0 = || AttributeProto {
        r#type: Some(2),
        name: Some("axis".into()),
        i: Some(0),
        ..Default::default()
    };
    let nodes = vec![
        node("Shape", &["x"], "s", vec![]),
        node("Gather", &["s", "i"], "d0", vec![]),
        node("Unsqueeze", &["d0", "ax"], "d0v", vec![]),
        node("Concat", &["d0v", "m1"], "shape", vec![axis0()]),
        node("Reshape", &["x", "shape"], "flat", vec![]),
        node("Mul", &["d0v", "two"], "n2", vec![]),
        node("Concat", &["n2", "three"], "shape2", vec![axis0()]),
        node("Reshape", &["flat", "shape2"], "y", vec![]),
    ];
    let i64s = |v: Vec<i64>| TensorData::from_vec(vec![v.len()], v).unwrap();
    let mut m = model(
        nodes,
        vec![
            tensor_to_proto("i", &TensorData::scalar(0i64)),
            tensor_to_proto("m1", &i64s(vec![-1])),
            tensor_to_proto("ax", &i64s(vec![0])),
            tensor_to_proto("two", &i64s(vec![2])),
            tensor_to_proto("three", &i64s(vec![3])),
        ],
        13,
    );
    let g = m.graph.as_mut().unwrap();
    g.input = vec![vi("x", &[Err("batch"), Ok(2), Ok(3)])];
    g.output = vec![vi("y", &[Err("batch2"), Ok(3)])];
    let imported = oar_onnx::from_bytes(&m.encode_to_vec()).unwrap();
    let out = imported.graph.output_types()[0].to_string();
    assert_eq!(out, "f32[2*batch,3]", "{}", imported.graph);
    for n in [1usize, 4] {
        let v: Vec<f32> = (0..n * 6).map(|k| k as f32).collect();
        let x = TensorData::from_vec(vec![n, 2, 3], v.clone()).unwrap();
        let got = run(&imported, &x);
        assert_eq!(got, v.iter().map(|&k| k as f64).collect::<Vec<_>>(), "batch {n}");
    }
    // Export writes the expression as a dim_param that reads back as the same size.
    let back = oar_onnx::from_bytes(&oar_onnx::to_bytes(&imported).unwrap()).unwrap();
    assert_eq!(back.graph.output_types()[0].to_string(), "f32[2*batch,3]");
}

#[test]
fn unsupported_ops_are_listed_in_one_error() {
    let nodes = vec![
        node("Foo", &["x"], "a", vec![]),
        node("Relu", &["a"], "b", vec![]),
        node("Bar", &["b"], "c", vec![]),
        node("Foo", &["c"], "y", vec![]),
    ];
    let m = model(nodes, vec![], 17);
    let err = oar_onnx::from_bytes(&m.encode_to_vec()).unwrap_err();
    match &err {
        OnnxError::Unsupported(list) => assert_eq!(list.len(), 3),
        e => panic!("{e}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("Foo (opset 17") && msg.contains("Bar (opset 17"), "{msg}");
}

#[test]
fn external_data_outside_the_model_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tensor_to_proto("w", &TensorData::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap());
    w.raw_data = None;
    w.data_location = Some(1);
    w.external_data = vec![oar_onnx::proto::StringStringEntryProto {
        key: Some("location".into()),
        value: Some("../../etc/passwd".into()),
    }];
    let m = model(vec![node("Add", &["x", "w"], "y", vec![])], vec![w], 13);
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let e = oar_onnx::load(&path).unwrap_err().to_string();
    assert!(e.contains("must be a relative path inside"), "{e}");

    // A good external file next to the model loads.
    let mut w2 = tensor_to_proto("w", &TensorData::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap());
    let raw = w2.raw_data.take().unwrap();
    std::fs::write(dir.path().join("w.bin"), &raw).unwrap();
    w2.data_location = Some(1);
    w2.external_data = vec![oar_onnx::proto::StringStringEntryProto {
        key: Some("location".into()),
        value: Some("w.bin".into()),
    }];
    let m = model(vec![node("Add", &["x", "w"], "y", vec![])], vec![w2], 13);
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let loaded = oar_onnx::load(&path).unwrap();
    let x = TensorData::from_vec(vec![1, 2], vec![10.0f32, 20.0]).unwrap();
    assert_eq!(run(&loaded, &x), vec![11.0, 22.0]);

    // Symlinks out of the directory (a file link, a linked directory) are refused like `../`
    // (reliability reproducer 04), and so is anything but a regular file (a FIFO would block).
    #[cfg(unix)]
    {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.bin"), [7u8; 8]).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.bin"), dir.path().join("link.bin")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("d")).unwrap();
        std::fs::create_dir(dir.path().join("fifo_dir")).unwrap();
        let fifo = dir.path().join("fifo_dir/p.bin");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success());
        for (loc, needle) in [
            ("link.bin", "outside the model's directory"),
            ("d/secret.bin", "outside the model's directory"),
            ("fifo_dir/p.bin", "not a regular file"),
        ] {
            if loc.starts_with("fifo") && !made {
                continue;
            }
            let mut w3 = tensor_to_proto("w", &TensorData::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap());
            w3.raw_data = None;
            w3.data_location = Some(1);
            w3.external_data = vec![oar_onnx::proto::StringStringEntryProto {
                key: Some("location".into()),
                value: Some(loc.into()),
            }];
            let m = model(vec![node("Add", &["x", "w"], "y", vec![])], vec![w3], 13);
            std::fs::write(&path, m.encode_to_vec()).unwrap();
            let e = oar_onnx::load(&path).unwrap_err().to_string();
            assert!(e.contains(needle), "{loc}: {e}");
        }
    }
}

#[test]
fn oversized_dims_are_an_error_not_an_allocation() {
    let mut t = tensor_to_proto("w", &TensorData::from_vec(vec![1], vec![1.0f32]).unwrap());
    t.dims = vec![1 << 40, 1 << 40];
    let m = model(vec![node("Add", &["x", "w"], "y", vec![])], vec![t], 13);
    let e = oar_onnx::from_bytes(&m.encode_to_vec()).unwrap_err();
    assert!(matches!(e, OnnxError::Tensor { .. }), "{e}");
}

/// A Conv or ConvTranspose whose weight has no spatial axis is an error, not a slice panic
/// (found by the `load_onnx` fuzz target; its input is `tests/corpus/invalid/
/// fuzz_conv_weight_rank1.onnx`).
#[test]
fn conv_weights_without_spatial_axes_are_an_error() {
    for op in ["Conv", "ConvTranspose"] {
        let w = tensor_to_proto("w", &TensorData::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap());
        let m = model(vec![node(op, &["x", "w"], "y", vec![])], vec![w], 13);
        let e = oar_onnx::from_bytes(&m.encode_to_vec()).unwrap_err().to_string();
        // ConvTranspose first asks for a static input shape (this graph's batch is symbolic).
        let why = if op == "Conv" { "spatial axis" } else { "static shape" };
        assert!(e.contains(op) && e.contains(why), "{op}: {e}");
    }
}

#[test]
fn mutated_models_never_panic() {
    let bytes = oar_onnx::to_bytes(&mlp()).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let x = TensorData::from_vec(vec![1, 4], vec![1.0f32; 4]).unwrap();
    let mut ok = 0;
    for i in 0..600 {
        let mut b = bytes.clone();
        match i % 4 {
            0 => b.truncate((next() as usize) % b.len()),
            1 => {
                for _ in 0..1 + next() % 4 {
                    let p = (next() as usize) % b.len();
                    b[p] ^= 1 << (next() % 8);
                }
            }
            2 => {
                let p = (next() as usize) % b.len();
                b[p] = 0xff;
            }
            _ => {
                let p = (next() as usize) % b.len();
                b.splice(p..p, [0xff, 0xff, 0xff, 0xff, 0x0f]);
            }
        }
        let r = std::panic::catch_unwind(|| {
            if let Ok(m) = oar_onnx::from_bytes(&b) {
                let name = m.graph.input_specs().first().map(|s| s.0.clone()).unwrap_or_default();
                let _ = oar_backend_reference::run_graph(&m.graph, &m.weights, &BTreeMap::from([(name, x.clone())]));
                return true;
            }
            false
        });
        ok += r.unwrap_or_else(|_| panic!("mutation {i} panicked")) as usize;
    }
    assert!(ok < 600, "some mutations must be rejected");
}

/// A 137-byte model asking for a 2^30-element ConstantOfShape (reliability reproducer 03):
/// import does not materialize it (a broadcast scalar computed at run time instead), so import
/// is instant and the imported graph holds no large constant; Expand of constants past the
/// folding limit is also left to run time.
#[test]
fn large_constant_shapes_are_not_folded_at_import() {
    let i64s = |v: Vec<i64>| TensorData::from_vec(vec![v.len()], v).unwrap();
    let nodes = vec![
        node("ConstantOfShape", &["shape"], "c", vec![]),
        node("Expand", &["one", "shape"], "e", vec![]),
        node("Add", &["c", "e"], "s", vec![]),
        node("ReduceSum", &["s"], "y", vec![]),
    ];
    let mut m = model(
        nodes,
        vec![
            tensor_to_proto("shape", &i64s(vec![1 << 30])),
            tensor_to_proto("one", &TensorData::from_vec(vec![1], vec![1.0f32]).unwrap()),
        ],
        13,
    );
    let g = m.graph.as_mut().unwrap();
    g.input = vec![];
    g.output = vec![vi("y", &[Ok(1)])];
    let t = std::time::Instant::now();
    let imported = oar_onnx::from_bytes(&m.encode_to_vec()).unwrap();
    assert!(t.elapsed().as_secs_f64() < 5.0, "import took {:?}", t.elapsed());
    let biggest = imported
        .graph
        .node_ids()
        .filter_map(|n| match &imported.graph.node(n).op {
            Op::Constant(t) => Some(t.len()),
            _ => None,
        })
        .chain(imported.weights.values().map(|t| t.len()))
        .max()
        .unwrap_or(0);
    assert!(biggest <= 1, "a constant of {biggest} elements was materialized");
    assert_eq!(imported.graph.output_types()[0].to_string(), "f32[1]");
}

/// Models onnx.checker and onnxruntime refuse (reliability reproducers 05, committed under
/// `tests/corpus/invalid/`) are refused at import with the rule they break; the conv with
/// pads of 2^62 imports (its shape is well-defined) but no backend will allocate it.
#[test]
fn checker_level_invalid_models_are_refused() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/invalid");
    let cases = [
        ("attr_duplicated", "appears twice"),
        ("attr_wrong_type", "must be INT, got STRING"),
        ("dup_graph_inputs", "declared twice"),
        ("dup_output_def", "already defined"),
        // The `load_onnx` fuzz target's find: a Conv weight of rank 1 panicked.
        ("fuzz_conv_weight_rank1", "spatial axis"),
        ("ir_version_99", "ir_version 99"),
        ("mut_attr_type_missing", "has no type"),
        ("mut_duplicate_node_name", "used by two nodes"),
        ("relu_two_inputs", "takes 1 inputs, got 2"),
        ("unsqueeze_dup_axes", "name an axis twice"),
    ];
    for (name, needle) in cases {
        let e = oar_onnx::load(&dir.join(format!("{name}.onnx")))
            .err()
            .unwrap_or_else(|| panic!("{name} imported"))
            .to_string();
        assert!(e.contains(needle), "{name}: {e}");
    }
    let m = oar_onnx::load(&dir.join("conv_pads_2p62.onnx")).unwrap();
    let cpu = oar_backend_cpu::CpuBackend::new();
    let e = oar_ir::Backend::compile(&cpu, &m.graph, &m.weights)
        .err()
        .map(|e| e.to_string());
    assert!(e.as_deref().is_some_and(|e| e.contains("too large")), "{e:?}");
}

/// f32 values uniform in `[-scale, scale)` from `seed`.
fn noise(dims: &[i64], scale: f64, seed: u64) -> TensorData {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let n: i64 = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale) as f32
        })
        .collect();
    TensorData::from_vec(dims.iter().map(|&x| x as usize).collect(), v).unwrap()
}

/// An LSTM or GRU node with weights as initializers and one graph input `x`; outputs `Y`, `Y_h`
/// (and `Y_c`). `clip` of 1e30 changes no value but makes the importer unroll the node.
#[allow(clippy::too_many_arguments)]
fn rnn_model(
    op: &str,
    (s, b, i, h): (i64, i64, i64, i64),
    direction: &str,
    layout: i64,
    with_bias: bool,
    with_state: bool,
    extra: Vec<AttributeProto>,
    seed: u64,
) -> ModelProto {
    let gates = if op == "LSTM" { 4 } else { 3 };
    let d = if direction == "bidirectional" { 2 } else { 1 };
    let mut seed = seed;
    let mut rand = |dims: &[i64], scale: f64| {
        seed += 1;
        noise(dims, scale, seed)
    };
    let mut inits = vec![
        tensor_to_proto("W", &rand(&[d, gates * h, i], 0.5)),
        tensor_to_proto("R", &rand(&[d, gates * h, h], 0.5)),
    ];
    let mut ins = vec!["x", "W", "R", "", "", "", ""];
    if with_bias {
        inits.push(tensor_to_proto("B", &rand(&[d, 2 * gates * h], 0.5)));
        ins[3] = "B";
    }
    let state_dims = if layout == 0 { [d, b, h] } else { [b, d, h] };
    if with_state {
        inits.push(tensor_to_proto("h0", &rand(&state_dims, 1.0)));
        ins[5] = "h0";
        if op == "LSTM" {
            inits.push(tensor_to_proto("c0", &rand(&state_dims, 1.0)));
            ins[6] = "c0";
        }
    }
    while ins.last() == Some(&"") {
        ins.pop();
    }
    let int = |name: &str, v: i64| AttributeProto {
        r#type: Some(2),
        name: Some(name.into()),
        i: Some(v),
        ..Default::default()
    };
    let mut attrs = vec![
        int("hidden_size", h),
        int("layout", layout),
        AttributeProto {
            r#type: Some(3),
            name: Some("direction".into()),
            s: Some(direction.as_bytes().to_vec()),
            ..Default::default()
        },
    ];
    attrs.extend(extra);
    let mut n = node(op, &ins, "Y", attrs);
    n.output = if op == "LSTM" {
        vec!["Y".into(), "Y_h".into(), "Y_c".into()]
    } else {
        vec!["Y".into(), "Y_h".into()]
    };
    // A symbolic batch, unless the initial states (initializers) fix it.
    let bd = if with_state { Ok(b) } else { Err("batch") };
    let (x_dims, y_dims) = if layout == 0 {
        ([Ok(s), bd, Ok(i)], [Ok(s), Ok(d), bd, Ok(h)])
    } else {
        ([bd, Ok(s), Ok(i)], [bd, Ok(s), Ok(d), Ok(h)])
    };
    let sd: Vec<Result<i64, &str>> = if layout == 0 {
        vec![Ok(d), bd, Ok(h)]
    } else {
        vec![bd, Ok(d), Ok(h)]
    };
    let mut outputs = vec![vi("Y", &y_dims), vi("Y_h", &sd)];
    if op == "LSTM" {
        outputs.push(vi("Y_c", &sd));
    }
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(14),
        }],
        graph: Some(GraphProto {
            node: vec![n],
            initializer: inits,
            input: vec![vi("x", &x_dims)],
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Imported LSTMs (default activations, no peepholes, no clip) and GRUs with
/// `linear_before_reset` are one `lstm_seq` / `gru_seq` op per direction; they compute what the
/// unrolled import computes (forced with a no-op `clip`), which the ONNX node tests hold to the
/// ONNX reference outputs: within 1e-5 on the reference backend, and on the cpu backend too.
#[test]
fn imported_lstm_and_gru_become_whole_layer_ops() {
    use oar_ir::backend::Backend;
    let clip = AttributeProto {
        r#type: Some(1),
        name: Some("clip".into()),
        f: Some(1e30),
        ..Default::default()
    };
    let lbr = AttributeProto {
        r#type: Some(2),
        name: Some("linear_before_reset".into()),
        i: Some(1),
        ..Default::default()
    };
    let dims = (5, 3, 4, 6);
    let cpu = oar_backend_cpu::CpuBackend::new();
    let mut seed = 0;
    for op in ["LSTM", "GRU"] {
        for direction in ["forward", "reverse", "bidirectional"] {
            for (layout, with_bias, with_state) in
                [(0, true, true), (1, false, false), (0, false, true), (1, true, false)]
            {
                seed += 1;
                let extra = if op == "GRU" { vec![lbr.clone()] } else { vec![] };
                let mut unrolled_extra = extra.clone();
                unrolled_extra.push(clip.clone());
                let label = format!("{op} {direction} layout {layout} bias {with_bias} state {with_state}");
                let import = |extra: Vec<AttributeProto>| {
                    let m = rnn_model(op, dims, direction, layout, with_bias, with_state, extra, seed);
                    oar_onnx::from_bytes(&m.encode_to_vec()).unwrap_or_else(|e| panic!("{label}: {e}"))
                };
                let (whole, unrolled) = (import(extra), import(unrolled_extra));
                let seqs = |m: &Model| {
                    m.graph
                        .node_ids()
                        .filter(|&n| {
                            matches!(
                                m.graph.node(n).op,
                                Op::Composite(Composite::LstmSeq(_) | Composite::GruSeq(_))
                            )
                        })
                        .count()
                };
                let nd = if direction == "bidirectional" { 2 } else { 1 };
                assert_eq!(seqs(&whole), nd, "{label}");
                assert_eq!(seqs(&unrolled), 0, "{label}");
                assert!(
                    whole.graph.node_ids().count() * 2 < unrolled.graph.node_ids().count(),
                    "{label}: {} nodes whole vs {} unrolled",
                    whole.graph.node_ids().count(),
                    unrolled.graph.node_ids().count()
                );
                let x_shape = if layout == 0 { [5, 3, 4] } else { [3, 5, 4] };
                let x = noise(&x_shape, 2.0, seed + 1000);
                let inputs = BTreeMap::from([("x".to_string(), x)]);
                let want = oar_backend_reference::run_graph(&unrolled.graph, &unrolled.weights, &inputs).unwrap();
                let got = oar_backend_reference::run_graph(&whole.graph, &whole.weights, &inputs).unwrap();
                let on_cpu = cpu
                    .compile(&whole.graph, &whole.weights)
                    .and_then(|exe| exe.run(&inputs))
                    .unwrap_or_else(|e| panic!("{label} on cpu: {e}"));
                assert_eq!(want.len(), got.len(), "{label}");
                for ((name, w), ((_, g), (_, c))) in want.iter().zip(got.iter().zip(&on_cpu)) {
                    assert_eq!(w.shape(), g.shape(), "{label} {name}");
                    assert_eq!(w.shape(), c.shape(), "{label} {name} (cpu)");
                    for (k, ((a, b), c)) in w
                        .to_f64_vec()
                        .iter()
                        .zip(g.to_f64_vec())
                        .zip(c.to_f64_vec())
                        .enumerate()
                    {
                        assert!((a - b).abs() <= 1e-5, "{label} {name}[{k}]: {b} vs unrolled {a}");
                        assert!((a - c).abs() <= 1e-5, "{label} {name}[{k}]: cpu {c} vs unrolled {a}");
                    }
                }
            }
        }
    }
}

/// A collective over several ranks has no ONNX form: the export error names it and the group
/// (over one rank it is exported as the identity: `ort_export`'s op samples).
#[test]
fn a_collective_over_several_ranks_is_an_export_error() {
    use oar_ir::ops::{Collective, CollectiveKind};
    let mut g = Graph::new("tp");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::Static(4)]))
        .unwrap();
    let y = g
        .add_op(Op::Collective(Collective::new(CollectiveKind::MpAllReduce, 7, 2)), &[x])
        .unwrap();
    g.add_output("y", y[0]).unwrap();
    let m = Model {
        graph: g,
        weights: Weights::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let e = oar_onnx::save(&m, &dir.path().join("m.onnx")).unwrap_err().to_string();
    assert!(e.contains("mp_allreduce") && e.contains("2 processes (group 7)"), "{e}");
}
