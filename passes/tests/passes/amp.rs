//! The AMP table and the `amp` pass: which ops get which dtype, casts at the boundaries only,
//! exact round trips removed, the signature kept, idempotence, and numerics against f32.

use oar_backend_reference::run_graph;
use oar_ir::ops::{BinaryOp, LayerNorm, Reduce, ReduceOp, Softmax, UnaryOp};
use oar_ir::{Composite, DType, Graph, Op, TensorData, TensorType, ValueId, Weights};
use oar_passes::amp::{AmpClass, AmpConfig, AmpLevel, default_class};
use oar_passes::{Amp, Pass, PassError, pass_from_spec};
use std::collections::BTreeMap;

fn o1() -> AmpConfig {
    AmpConfig::new(AmpLevel::O1, DType::BF16).unwrap()
}

#[test]
fn the_table_puts_products_low_and_sensitive_ops_in_f32() {
    let softmax = Op::Composite(Composite::Softmax(Softmax { axis: 1 }));
    let sum = Op::Reduce(Reduce {
        op: ReduceOp::Sum,
        axes: vec![0],
        keepdim: false,
    });
    let max = Op::Reduce(Reduce {
        op: ReduceOp::Max,
        axes: vec![0],
        keepdim: false,
    });
    assert_eq!(default_class(&Op::MatMul), Some(AmpClass::Low));
    assert_eq!(default_class(&Op::Composite(Composite::Linear)), Some(AmpClass::Low));
    assert_eq!(default_class(&softmax), Some(AmpClass::F32));
    assert_eq!(default_class(&sum), Some(AmpClass::F32));
    assert_eq!(default_class(&Op::Unary(UnaryOp::Exp)), Some(AmpClass::F32));
    assert_eq!(default_class(&Op::Binary(BinaryOp::Pow)), Some(AmpClass::F32));
    assert_eq!(default_class(&max), Some(AmpClass::Promote));
    assert_eq!(default_class(&Op::Binary(BinaryOp::Add)), Some(AmpClass::Promote));
    assert_eq!(default_class(&Op::Cast(oar_ir::ops::Cast { to: DType::F16 })), None);
    // Quantization divides by small scales: its float operands stay f32 (integers are never cast).
    let fq = Op::Composite(Composite::FakeQuant(oar_ir::ops::FakeQuant {
        axis: 0,
        qmin: -128,
        qmax: 127,
    }));
    assert_eq!(default_class(&fq), Some(AmpClass::F32));
    assert_eq!(
        o1().plan(&fq, &[(DType::BF16, 2), (DType::F32, 0)]),
        vec![Some(DType::F32), None]
    );
    let dq = Op::Composite(Composite::DequantizeLinear(oar_ir::ops::DequantizeLinear { axis: 0 }));
    assert_eq!(
        o1().plan(&dq, &[(DType::I8, 2), (DType::BF16, 0)]),
        vec![None, Some(DType::F32)]
    );
}

#[test]
fn plans_cast_operands_by_class_level_and_rank() {
    let c = o1();
    let (f32v, bf16v) = ((DType::F32, 2), (DType::BF16, 2));
    assert_eq!(c.plan(&Op::MatMul, &[f32v, f32v]), vec![Some(DType::BF16); 2]);
    assert_eq!(c.plan(&Op::MatMul, &[bf16v, f32v]), vec![None, Some(DType::BF16)]);
    let softmax = Op::Composite(Composite::Softmax(Softmax { axis: 1 }));
    assert_eq!(c.plan(&softmax, &[bf16v]), vec![Some(DType::F32)]);
    let add = Op::Binary(BinaryOp::Add);
    // O1: mixed ranked operands meet at the widest; equal ones stay.
    assert_eq!(c.plan(&add, &[bf16v, f32v]), vec![Some(DType::F32), None]);
    assert_eq!(c.plan(&add, &[bf16v, bf16v]), vec![None, None]);
    // A rank-0 operand follows the ranked one instead of widening it.
    assert_eq!(c.plan(&add, &[bf16v, (DType::F32, 0)]), vec![None, Some(DType::BF16)]);
    // f16 meets bf16 in f32.
    assert_eq!(
        c.plan(&add, &[(DType::F16, 1), bf16v]),
        vec![Some(DType::F32), Some(DType::F32)]
    );
    // An f64 operand: left alone. Integer operands are never cast.
    assert_eq!(c.plan(&Op::MatMul, &[(DType::F64, 2), f32v]), vec![None, None]);
    let gather = Op::Gather(oar_ir::ops::Gather { axis: 0 });
    assert_eq!(c.plan(&gather, &[bf16v, (DType::I64, 1)]), vec![None, None]);
    // O2: everything but the deny list in the low dtype.
    let o2 = AmpConfig::new(AmpLevel::O2, DType::F16).unwrap();
    assert_eq!(o2.plan(&add, &[f32v, f32v]), vec![Some(DType::F16); 2]);
    assert_eq!(o2.plan(&softmax, &[(DType::F16, 2)]), vec![Some(DType::F32)]);
}

#[test]
fn custom_lists_override_the_table_and_bad_names_are_errors() {
    let c = o1().allow(["softmax"]).unwrap().deny(["matmul"]).unwrap();
    let softmax = Op::Composite(Composite::Softmax(Softmax { axis: 1 }));
    assert_eq!(c.class(&softmax), Some(AmpClass::Low));
    assert_eq!(c.class(&Op::MatMul), Some(AmpClass::F32));
    assert_eq!(c.plan(&Op::MatMul, &[(DType::BF16, 2); 2]), vec![Some(DType::F32); 2]);
    let err = o1().allow(["matmull"]).unwrap_err();
    assert!(err.contains("unknown op `matmull`"), "{err}");
    let err = o1().deny(["cast"]).unwrap_err();
    assert!(err.contains("`cast` is not subject"), "{err}");
    let err = o1().allow(["exp"]).unwrap().deny(["exp"]).unwrap_err();
    assert!(err.contains("both"), "{err}");
    assert!(AmpConfig::new(AmpLevel::O1, DType::F32).is_err());
}

/// `y = layer_norm(relu(x @ w + b)) ; s = softmax(y @ w2)`, with outputs `y` and `s`.
fn mlp() -> (Graph, Weights, BTreeMap<String, TensorData>) {
    let mut g = Graph::new("mlp");
    let x = g.add_input("x", TensorType::of(DType::F32, &[4, 8])).unwrap();
    let w = g.add_param("w", TensorType::of(DType::F32, &[8, 16])).unwrap();
    let b = g.add_param("b", TensorType::of(DType::F32, &[16])).unwrap();
    let w2 = g.add_param("w2", TensorType::of(DType::F32, &[16, 5])).unwrap();
    let h = g.add_op1(Op::Composite(Composite::Linear), &[x, w, b]).unwrap();
    let h = g.add_op1(Op::Composite(Composite::Relu), &[h]).unwrap();
    let ln = Op::Composite(Composite::LayerNorm(LayerNorm {
        normalized_ndim: 1,
        epsilon: oar_ir::Float(1e-5),
    }));
    let y = g.add_op1(ln, &[h]).unwrap();
    let z = g.add_op1(Op::MatMul, &[y, w2]).unwrap();
    // The weight used a second time: one cast serves both uses.
    let z2 = g.add_op1(Op::MatMul, &[y, w2]).unwrap();
    let z = g.binary(BinaryOp::Add, z, z2).unwrap();
    let s = g
        .add_op1(Op::Composite(Composite::Softmax(Softmax { axis: 1 })), &[z])
        .unwrap();
    g.add_output("y", y).unwrap();
    g.add_output("s", s).unwrap();
    let vals = |n: usize, k: f64| (0..n).map(|i| ((i as f64 * k).sin() * 0.5) as f32).collect::<Vec<_>>();
    let mut wts = Weights::new();
    wts.insert("w".into(), TensorData::from_vec(vec![8, 16], vals(128, 0.37)).unwrap());
    wts.insert("b".into(), TensorData::from_vec(vec![16], vals(16, 1.3)).unwrap());
    wts.insert("w2".into(), TensorData::from_vec(vec![16, 5], vals(80, 0.71)).unwrap());
    let inputs = BTreeMap::from([(
        "x".to_string(),
        TensorData::from_vec(vec![4, 8], vals(32, 0.9)).unwrap(),
    )]);
    (g, wts, inputs)
}

fn casts(g: &Graph) -> usize {
    g.node_ids().filter(|&n| matches!(g.node(n).op, Op::Cast(_))).count()
}

fn dtype_of(g: &Graph, op: &str) -> Vec<DType> {
    let mut v: Vec<_> = g
        .node_ids()
        .filter(|&n| g.node(n).op.name() == op)
        .map(|n| g.value_type(ValueId::first(n)).dtype)
        .collect();
    v.sort_by_key(|d| d.name());
    v
}

#[test]
fn the_pass_rewrites_by_the_table_keeps_the_signature_and_is_idempotent() {
    let (mut g, w, inputs) = mlp();
    let want = run_graph(&g, &w, &inputs).unwrap();
    let sig = (g.input_types(), g.output_types());
    assert!(Amp::default().run(&mut g).unwrap());
    oar_ir::verify(&g).unwrap();
    assert_eq!((g.input_types(), g.output_types()), sig, "the signature is kept");
    assert_eq!(dtype_of(&g, "linear"), vec![DType::BF16]);
    assert_eq!(dtype_of(&g, "relu"), vec![DType::BF16], "relu follows its operand");
    assert_eq!(dtype_of(&g, "layer_norm"), vec![DType::F32]);
    assert_eq!(dtype_of(&g, "matmul"), vec![DType::BF16, DType::BF16]);
    assert_eq!(dtype_of(&g, "softmax"), vec![DType::F32]);
    // Casts: x, w, b → bf16; relu → f32 (layer_norm); y → bf16 (one cast for both matmuls);
    // w2 → bf16 (shared); the sum → f32 (softmax). The bf16 add of the two matmuls needs none.
    assert_eq!(casts(&g), 7, "{g}");
    let text = g.to_string();
    assert!(!Amp::default().run(&mut g).unwrap(), "a second run changes nothing");
    assert_eq!(g.to_string(), text);
    // bf16 has 8 significant bits: outputs within a few bf16 steps of f32.
    let got = run_graph(&g, &w, &inputs).unwrap();
    for ((name, a), (_, b)) in want.iter().zip(&got) {
        assert_eq!(a.dtype(), b.dtype());
        let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
        let scale = a.iter().fold(0f64, |m, v| m.max(v.abs()));
        let err = a.iter().zip(&b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(err <= 3e-2 * scale, "{name}: max error {err} vs scale {scale}");
        assert!(err > 0.0, "{name}: bf16 arithmetic must round somewhere");
    }
}

#[test]
fn exact_cast_round_trips_go_and_lossy_ones_stay() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::of(DType::BF16, &[3])).unwrap();
    let up = g.add_op1(Op::Cast(oar_ir::ops::Cast { to: DType::F32 }), &[x]).unwrap();
    let down = g
        .add_op1(Op::Cast(oar_ir::ops::Cast { to: DType::BF16 }), &[up])
        .unwrap();
    let y = g.unary(UnaryOp::Neg, down).unwrap();
    let f = g.add_input("f", TensorType::of(DType::F32, &[3])).unwrap();
    let lossy = g
        .add_op1(Op::Cast(oar_ir::ops::Cast { to: DType::BF16 }), &[f])
        .unwrap();
    let back = g
        .add_op1(Op::Cast(oar_ir::ops::Cast { to: DType::F32 }), &[lossy])
        .unwrap();
    g.add_output("y", y).unwrap();
    g.add_output("r", back).unwrap();
    assert!(Amp::default().run(&mut g).unwrap());
    // bf16 → f32 → bf16 is the identity; f32 → bf16 → f32 rounds and must stay.
    assert_eq!(casts(&g), 2, "{g}");
    let neg = g.node_ids().find(|&n| g.node(n).op.name() == "neg").unwrap();
    assert!(matches!(g.node(g.node(neg).inputs()[0].node).op, Op::Input(_)));
}

#[test]
fn regions_are_rewritten_inside_their_own_signature() {
    let mut g = Graph::new("g");
    let p = g.add_input("p", TensorType::of(DType::Bool, &[])).unwrap();
    let x = g.add_input("x", TensorType::of(DType::F32, &[2, 2])).unwrap();
    let branch = |square: bool| {
        let mut r = Graph::new("b");
        let a = r.add_input("a", TensorType::of(DType::F32, &[2, 2])).unwrap();
        let y = if square {
            r.add_op1(Op::MatMul, &[a, a]).unwrap()
        } else {
            a
        };
        r.add_output("y", y).unwrap();
        r
    };
    let y = g
        .add_region_op(Op::Cond, &[p, x], vec![branch(true), branch(false)])
        .unwrap()[0];
    g.add_output("y", y).unwrap();
    assert!(Amp::default().run(&mut g).unwrap());
    oar_ir::verify(&g).unwrap();
    let cond = g.node_ids().find(|&n| matches!(g.node(n).op, Op::Cond)).unwrap();
    let then = &g.node(cond).regions[0];
    assert_eq!(dtype_of(then, "matmul"), vec![DType::BF16]);
    assert_eq!(then.output_types()[0].dtype, DType::F32);
}

#[test]
fn the_pass_is_found_by_spec_with_its_argument() {
    let amp = pass_from_spec("amp=f16:O2").unwrap().unwrap();
    assert_eq!(amp.name(), "amp");
    assert!(pass_from_spec("nope=1").unwrap().is_none());
    let err = pass_from_spec("amp=f64").err().unwrap();
    assert!(matches!(&err, PassError::Config { pass, .. } if pass == "amp"), "{err}");
    assert!(err.to_string().contains("f64"), "{err}");
    let err = pass_from_spec("dce=3").err().unwrap();
    assert!(err.to_string().contains("takes no argument"), "{err}");
    assert!(pass_from_spec("amp=bf16:O3").err().unwrap().to_string().contains("O3"));
}
