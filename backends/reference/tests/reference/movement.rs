//! Movement and indexing ops against hand-computed values (exact).

use crate::common::*;
use oar_ir::ops::{Broadcast, Concat, Gather, Pad, Permute, Reshape, Scatter, Slice};
use oar_ir::ops::{ScatterReduce, SliceRange};
use oar_ir::{DType, Dim, Op};

fn iota6() -> oar_ir::TensorData {
    f32s(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
}

#[test]
fn reshape_permute_broadcast() {
    let y = op1(
        Op::Reshape(Reshape {
            shape: vec![Dim::Static(3), Dim::Static(2)],
        }),
        &[iota6()],
    );
    assert_close(&y, &[3, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 0.0);
    let t = op1(Op::Permute(Permute { perm: vec![1, 0] }), &[iota6()]);
    assert_close(&t, &[3, 2], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], 0.0);
    // Reshape after permute reads the permuted (logical) order.
    let mut g = oar_ir::Graph::new("t");
    let x = g.add_input("x", ty(DType::F32, &[2, 3])).unwrap();
    let p = g.add_op1(Op::Permute(Permute { perm: vec![1, 0] }), &[x]).unwrap();
    let r = g
        .add_op1(
            Op::Reshape(Reshape {
                shape: vec![Dim::Static(6)],
            }),
            &[p],
        )
        .unwrap();
    g.add_output("r", r).unwrap();
    let out = run(&g, &Default::default(), &[("x", iota6())]).unwrap();
    assert_close(&out[0], &[6], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], 0.0);
    let x3 = f32s(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
    let p3 = op1(Op::Permute(Permute { perm: vec![2, 0, 1] }), &[x3]);
    assert_close(&p3, &[2, 2, 1], &[1.0, 3.0, 2.0, 4.0], 0.0);
    let b = op1(
        Op::Broadcast(Broadcast {
            shape: vec![Dim::Static(2), Dim::Static(2), Dim::Static(3)],
        }),
        &[f32s(&[2, 1], &[7.0, 8.0])],
    );
    assert_close(
        &b,
        &[2, 2, 3],
        &[7.0, 7.0, 7.0, 8.0, 8.0, 8.0, 7.0, 7.0, 7.0, 8.0, 8.0, 8.0],
        0.0,
    );
}

#[test]
fn slice_python_semantics() {
    let x = f32s(&[10], &(0..10).map(f64::from).collect::<Vec<_>>());
    let s = |start, end, step| {
        op1(
            Op::Slice(Slice {
                ranges: vec![SliceRange { start, end, step }],
            }),
            std::slice::from_ref(&x),
        )
    };
    assert_close(&s(2, 8, 3), &[2], &[2.0, 5.0], 0.0);
    assert_close(&s(-3, i64::MAX, 1), &[3], &[7.0, 8.0, 9.0], 0.0);
    assert_close(&s(-20, 3, 1), &[3], &[0.0, 1.0, 2.0], 0.0);
    assert_close(&s(1, -1, 4), &[2], &[1.0, 5.0], 0.0);
    assert_close(&s(5, 2, 1), &[0], &[], 0.0);
    assert_close(&s(9, 100, 5), &[1], &[9.0], 0.0);
    let y = op1(
        Op::Slice(Slice {
            ranges: vec![
                SliceRange::new(-1, i64::MAX),
                SliceRange {
                    start: 0,
                    end: 3,
                    step: 2,
                },
            ],
        }),
        &[iota6()],
    );
    assert_close(&y, &[1, 2], &[3.0, 5.0], 0.0);
}

#[test]
fn pad_with_value_and_dtypes() {
    let y = op1(
        Op::Pad(Pad {
            before: vec![1, 0],
            after: vec![0, 2],
            value: oar_ir::Float(-1.0),
        }),
        &[f32s(&[1, 2], &[5.0, 6.0])],
    );
    assert_close(&y, &[2, 4], &[-1.0, -1.0, -1.0, -1.0, 5.0, 6.0, -1.0, -1.0], 0.0);
    // The fill converts like a cast: 300 saturates to 255 in u8.
    let u = op1(
        Op::Pad(Pad {
            before: vec![1],
            after: vec![1],
            value: oar_ir::Float(300.0),
        }),
        &[tensor(DType::U8, &[1], &[7.0])],
    );
    assert_exact(&u, DType::U8, &[3], &[255.0, 7.0, 255.0]);
}

#[test]
fn concat_along_axes() {
    let a = f32s(&[2, 1], &[1.0, 2.0]);
    let b = f32s(&[2, 2], &[3.0, 4.0, 5.0, 6.0]);
    let y = op1(Op::Concat(Concat { axis: 1 }), &[a.clone(), b]);
    assert_close(&y, &[2, 3], &[1.0, 3.0, 4.0, 2.0, 5.0, 6.0], 0.0);
    let z = op1(Op::Concat(Concat { axis: 0 }), &[a.clone(), a]);
    assert_close(&z, &[4, 1], &[1.0, 2.0, 1.0, 2.0], 0.0);
    let i = op1(Op::Concat(Concat { axis: 0 }), &[i64s(&[1], &[9]), i64s(&[2], &[8, 7])]);
    assert_exact(&i, DType::I64, &[3], &[9.0, 8.0, 7.0]);
}

#[test]
fn gather_with_negative_indices_and_errors() {
    let data = iota6();
    let y = op1(
        Op::Gather(Gather { axis: 1 }),
        &[data.clone(), i64s(&[2, 2], &[2, -3, -1, 1])],
    );
    // Output [2 rows] ++ [2,2] indices: row r picks columns (2, 0, 2, 1).
    assert_close(&y, &[2, 2, 2], &[2.0, 0.0, 2.0, 1.0, 5.0, 3.0, 5.0, 4.0], 0.0);
    let z = op1(
        Op::Gather(Gather { axis: 0 }),
        &[data.clone(), tensor(DType::I32, &[], &[-1.0])],
    );
    assert_close(&z, &[3], &[3.0, 4.0, 5.0], 0.0);
    let e = op_err(Op::Gather(Gather { axis: 1 }), &[data.clone(), i64s(&[1], &[3])]);
    assert!(
        e.contains("gather") && e.contains("index 3") && e.contains("size 3"),
        "{e}"
    );
    assert!(op_err(Op::Gather(Gather { axis: 1 }), &[data, i64s(&[1], &[-4])]).contains("index -4"));
}

#[test]
fn scatter_replace_and_add() {
    let data = f32s(&[2, 3], &[0.0; 6]);
    let upd = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    // Indices (0, -1) along axis 1 → columns 0 and 2.
    let y = op1(
        Op::Scatter(Scatter {
            axis: 1,
            reduce: ScatterReduce::Replace,
        }),
        &[data.clone(), i64s(&[2], &[0, -1]), upd.clone()],
    );
    assert_close(&y, &[2, 3], &[1.0, 0.0, 2.0, 3.0, 0.0, 4.0], 0.0);
    // Repeated index: replace keeps the last update, add sums them.
    let rep = i64s(&[2], &[1, 1]);
    let r = op1(
        Op::Scatter(Scatter {
            axis: 1,
            reduce: ScatterReduce::Replace,
        }),
        &[data.clone(), rep.clone(), upd.clone()],
    );
    assert_close(&r, &[2, 3], &[0.0, 2.0, 0.0, 0.0, 4.0, 0.0], 0.0);
    let base = f32s(&[2, 3], &[10.0; 6]);
    let a = op1(
        Op::Scatter(Scatter {
            axis: 1,
            reduce: ScatterReduce::Add,
        }),
        &[base, rep, upd.clone()],
    );
    assert_close(&a, &[2, 3], &[10.0, 13.0, 10.0, 10.0, 17.0, 10.0], 0.0);
    let e = op_err(
        Op::Scatter(Scatter {
            axis: 1,
            reduce: ScatterReduce::Add,
        }),
        &[data, i64s(&[2], &[0, 3]), upd],
    );
    assert!(e.contains("scatter") && e.contains("index 3"), "{e}");
}
