//! The eager CPU kernels (gemm matmul, im2col+gemm conv) against the reference interpreter.

use oar::ir::ops::Conv;
use oar::ir::{DType, Op, TensorData};
use oar::tensor::apply_op;
use oar::{Tensor, seed};

fn reference(op: &Op, inputs: &[TensorData]) -> TensorData {
    oar::reference::run_op(op, inputs).unwrap().remove(0)
}

/// Max |a - b| ≤ tol · (1 + |b|) elementwise, same shape.
fn assert_close(a: &TensorData, b: &TensorData, tol: f64, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    for (i, (x, y)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
    }
}

fn rand(shape: &[usize], dtype: DType) -> Tensor {
    oar::uniform(shape, -1.0, 1.0, dtype).unwrap()
}

#[test]
fn matmul_matches_reference() {
    seed(1);
    for (a, b) in [
        (vec![3, 5], vec![5, 4]),
        (vec![2, 1, 3, 5], vec![4, 5, 2]),
        (vec![7, 0], vec![0, 3]),
        (vec![64, 96], vec![96, 80]),
    ] {
        for dtype in [DType::F32, DType::F64] {
            let (x, y) = (rand(&a, dtype), rand(&b, dtype));
            let got = apply_op(Op::MatMul, &[&x, &y]).unwrap().remove(0).data();
            let want = reference(&Op::MatMul, &[x.data(), y.data()]);
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
            assert_close(&got, &want, tol, &format!("matmul {a:?}x{b:?} {dtype}"));
        }
    }
}

#[test]
fn conv_matches_reference() {
    seed(2);
    let conv = |s: Vec<usize>, pb: Vec<usize>, pa: Vec<usize>, d: Vec<usize>, groups| {
        Op::Conv(Conv {
            stride: s,
            pad_before: pb,
            pad_after: pa,
            dilation: d,
            groups,
        })
    };
    let cases = [
        (
            conv(vec![1, 1], vec![1, 1], vec![1, 1], vec![1, 1], 1),
            vec![2, 3, 8, 8],
            vec![4, 3, 3, 3],
        ),
        (
            conv(vec![2, 1], vec![0, 2], vec![1, 0], vec![1, 2], 1),
            vec![1, 2, 9, 7],
            vec![3, 2, 3, 2],
        ),
        (
            conv(vec![1, 1], vec![1, 1], vec![1, 1], vec![1, 1], 4),
            vec![2, 8, 5, 5],
            vec![8, 2, 3, 3],
        ),
        (
            conv(vec![2], vec![1], vec![2], vec![3], 2),
            vec![3, 4, 20],
            vec![6, 2, 4],
        ),
        (
            conv(vec![1, 2, 1], vec![1, 0, 0], vec![0, 1, 0], vec![1, 1, 1], 1),
            vec![1, 2, 4, 5, 3],
            vec![2, 2, 2, 3, 2],
        ),
    ];
    for (op, xs, ws) in cases {
        for dtype in [DType::F32, DType::F64] {
            let (x, w) = (rand(&xs, dtype), rand(&ws, dtype));
            let got = apply_op(op.clone(), &[&x, &w]).unwrap().remove(0).data();
            let want = reference(&op, &[x.data(), w.data()]);
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
            assert_close(&got, &want, tol, &format!("conv {xs:?} {ws:?} {dtype}"));
        }
    }
}
