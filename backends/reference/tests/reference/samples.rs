//! Every op's own samples (`OpDef::samples`, declared with the op): the op's type rule accepts
//! them, its text form round-trips, and — for composites — the decomposition computes what the
//! reference computes natively. Tolerance: each element within `tol · (|want| + max|want|)`
//! (1e-5 for f32, 1e-11 for f64: the decomposition rounds after every primitive, the native op
//! once); integers, bools and non-finite values exactly.

use oar_backend_reference::run_graph;
use oar_ir::decompose::decompose;
use oar_ir::ops::sample::SampleRng;
use oar_ir::ops::{OpDef, infer_types};
use oar_ir::{DType, Graph, Op, TensorData, Weights};
use std::collections::BTreeMap;

/// The sample's graph (the op applied to inputs `x0..`) and its drawn inputs.
fn sample_graph(s: &oar_ir::ops::Sample, decomposed: bool) -> (Graph, BTreeMap<String, TensorData>) {
    let mut g = Graph::new("sample");
    let mut feed = BTreeMap::new();
    let mut rng = SampleRng::for_case(&s.name, 7);
    let mut vals = Vec::new();
    for (i, inp) in s.inputs.iter().enumerate() {
        let name = format!("x{i}");
        let t = inp.domain.tensor(inp.dtype, &inp.shape, &mut rng);
        vals.push(g.add_input(&name, t.tensor_type()).unwrap());
        feed.insert(name, t);
    }
    let outs = match (&s.op, decomposed) {
        (Op::Composite(c), true) => decompose(c, &mut g, &vals).unwrap_or_else(|e| panic!("{}: {e}", s.name)),
        _ => g
            .add_op(s.op.clone(), &vals)
            .unwrap_or_else(|e| panic!("{}: {e}", s.name)),
    };
    for (i, v) in outs.iter().enumerate() {
        g.add_output(&format!("y{i}"), *v).unwrap();
    }
    (g, feed)
}

fn close(name: &str, got: &TensorData, want: &TensorData) {
    assert_eq!(got.tensor_type(), want.tensor_type(), "{name}");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let tol = match want.dtype() {
        DType::F32 => 1e-5,
        DType::F64 => 1e-11,
        DType::F16 | DType::BF16 => 1e-2,
        _ => 0.0,
    };
    let scale = w.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = if b.is_finite() {
            (a - b).abs() <= tol * (b.abs() + scale)
        } else {
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
        };
        assert!(ok, "{name}[{i}]: decomposition {a} vs native {b}");
    }
}

#[test]
fn every_sample_types_round_trips_and_decomposes_to_the_native_result() {
    let samples = Op::all_samples();
    assert!(samples.len() >= 30, "only {} samples", samples.len());
    for s in &samples {
        let types: Vec<_> = s
            .inputs
            .iter()
            .map(|i| oar_ir::TensorType::of(i.dtype, &i.shape))
            .collect();
        infer_types(&s.op, &types, &[]).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        assert!(
            s.name.starts_with(s.op.name()),
            "{} is not named after {}",
            s.name,
            s.op.name()
        );
        let (g, feed) = sample_graph(s, false);
        let text = oar_ir::text::print_graph(&g);
        let back = oar_ir::text::parse_graph(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", s.name));
        assert_eq!(oar_ir::text::print_graph(&back), text, "{}", s.name);
        let native = run_graph(&g, &Weights::new(), &feed).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        if let Op::Composite(_) = &s.op {
            let (d, _) = sample_graph(s, true);
            assert!(d.node_ids().all(|n| d.node(n).op.is_primitive()), "{}", s.name);
            let dec = run_graph(&d, &Weights::new(), &feed).unwrap_or_else(|e| panic!("{}: {e}", s.name));
            for ((_, a), (_, b)) in dec.iter().zip(&native) {
                close(&s.name, a, b);
            }
        }
        let _ = s.op.flops(&types, &[]);
    }
}
