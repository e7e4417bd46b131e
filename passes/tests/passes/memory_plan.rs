//! Memory planning: reuse lowers the arena below the naive total, in-place pairs are found,
//! and executing with the plan (temporaries in one shared arena) matches the reference.

use oar_backend_reference::{run_graph, run_kernel_program_planned};
use oar_ir::kernel::BufferKind;
use oar_ir::ops::Reduce;
use oar_ir::ops::{BinaryOp, ReduceOp};
use oar_ir::{DType, Dim, Graph, Op, TensorData, TensorType, ValueId, Weights};
use oar_passes::fuse::fuse;
use oar_passes::memory_plan;
use std::collections::BTreeMap;

fn data(shape: &[usize], seed: u64) -> TensorData {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| (((i as u64 * 7919 + seed * 104729) % 1000) as f32) / 500.0 - 1.0)
        .collect();
    TensorData::from_vec(shape.to_vec(), v).unwrap()
}

/// x[N,16] → 4 × (matmul, relu), then `t / (sum(t) + 1) + h1` (h1: the first layer's output,
/// live across the chain) and a last matmul.
fn chain() -> (Graph, Weights) {
    let mut g = Graph::new("chain");
    let mut w = Weights::new();
    let mut h = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(16)]))
        .unwrap();
    let mut first = None;
    for i in 0..4 {
        let name = format!("w{i}");
        w.insert(name.clone(), data(&[16, 16], i + 1));
        let wv = g.add_param(&name, TensorType::of(DType::F32, &[16, 16])).unwrap();
        let m = g.add_op1(Op::MatMul, &[h, wv]).unwrap();
        let z = g.add_scalar(DType::F32, 0.0);
        h = g.binary(BinaryOp::Max, m, z).unwrap();
        first.get_or_insert(h);
    }
    // h is read by a reduction and by the division: materialized; the division (with the sum
    // as a reduction stage per row) can overwrite it.
    let s = g
        .add_op1(
            Op::Reduce(Reduce {
                op: ReduceOp::Sum,
                axes: vec![1],
                keepdim: true,
            }),
            &[h],
        )
        .unwrap();
    let one = g.add_scalar(DType::F32, 1.0);
    let s1 = g.binary(BinaryOp::Add, s, one).unwrap();
    let d = g.binary(BinaryOp::Div, h, s1).unwrap();
    let d = g.binary(BinaryOp::Add, d, first.unwrap()).unwrap();
    w.insert("wo".into(), data(&[16, 4], 9));
    let wo: ValueId = g.add_param("wo", TensorType::of(DType::F32, &[16, 4])).unwrap();
    let y = g.add_op1(Op::MatMul, &[d, wo]).unwrap();
    g.add_output("y", y).unwrap();
    (g, w)
}

#[test]
fn reuse_lowers_peak_and_planned_execution_matches_reference() {
    let (g, w) = chain();
    let p = fuse(&g).unwrap();
    println!("{p}");
    let n = 6;
    let plan = memory_plan(&p, &BTreeMap::from([("N".to_string(), n)])).unwrap();
    println!("{plan:#?}");
    let temps = p.buffers.iter().filter(|b| b.kind == BufferKind::Temp).count();
    assert!(temps >= 5, "{p}");
    assert_eq!(plan.offsets.len(), temps);
    let one = n * 16 * 4;
    // Every temporary is [N,16]: the sum is a stage of the division kernel, not a buffer.
    assert_eq!(plan.peak_naive_bytes, temps * one, "{plan:?}");
    // Three [N,16] temporaries live at once at most (h1, a matmul's operand and result).
    assert!(plan.arena_bytes <= 3 * one, "{plan:?}");
    assert!(plan.arena_bytes < plan.peak_naive_bytes);
    assert!(plan.peak_live_bytes <= plan.arena_bytes);
    assert_eq!(plan.in_place.len(), 1, "{plan:?}");
    let (out, inp) = plan.in_place[0];
    assert_eq!(plan.offsets[&out], plan.offsets[&inp]);
    // Overlapping slots only for buffers whose lifetimes do not overlap: checked by running.
    let inputs = BTreeMap::from([("x".to_string(), data(&[n, 16], 42))]);
    let want = run_graph(&g, &w, &inputs).unwrap();
    let got = run_kernel_program_planned(&p, &plan, &w, &inputs).unwrap();
    for (a, b) in want[0].1.to_f64_vec().iter().zip(got[0].1.to_f64_vec()) {
        assert!((a - b).abs() <= 1e-6 + 1e-5 * a.abs(), "{a} vs {b}");
    }
}

#[test]
fn a_bad_plan_is_caught_by_planned_execution_and_unbound_symbols_are_errors() {
    let (g, w) = chain();
    let p = fuse(&g).unwrap();
    assert!(
        memory_plan(&p, &BTreeMap::new())
            .unwrap_err()
            .to_string()
            .contains("`N`")
    );
    let mut plan = memory_plan(&p, &BTreeMap::from([("N".to_string(), 3)])).unwrap();
    // Put every temporary at offset 0: live buffers now clobber each other.
    for off in plan.offsets.values_mut() {
        *off = 0;
    }
    let inputs = BTreeMap::from([("x".to_string(), data(&[3, 16], 1))]);
    let want = run_graph(&g, &w, &inputs).unwrap();
    let got = run_kernel_program_planned(&p, &plan, &w, &inputs).unwrap();
    assert_ne!(want[0].1, got[0].1);
    // A plan for another N is refused.
    let other = BTreeMap::from([("x".to_string(), data(&[4, 16], 1))]);
    assert!(run_kernel_program_planned(&p, &plan, &w, &other).is_err());
}
