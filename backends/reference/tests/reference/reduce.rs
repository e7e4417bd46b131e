//! Reductions and arg-reductions against hand-computed values.

use crate::common::*;
use oar_ir::ops::{ArgReduce, Reduce};
use oar_ir::ops::{ArgReduceOp, ReduceOp};
use oar_ir::{DType, Op};

fn red(op: ReduceOp, axes: &[usize], keepdim: bool, x: &oar_ir::TensorData) -> oar_ir::TensorData {
    op1(
        Op::Reduce(Reduce {
            op,
            axes: axes.to_vec(),
            keepdim,
        }),
        std::slice::from_ref(x),
    )
}

#[test]
fn float_reductions() {
    // [[1, 2, 3], [4, 5, 6]]
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_close(&red(ReduceOp::Sum, &[1], false, &x), &[2], &[6.0, 15.0], 0.0);
    assert_close(&red(ReduceOp::Sum, &[0], true, &x), &[1, 3], &[5.0, 7.0, 9.0], 0.0);
    assert_close(&red(ReduceOp::Sum, &[0, 1], false, &x), &[], &[21.0], 0.0);
    assert_close(&red(ReduceOp::Max, &[1], false, &x), &[2], &[3.0, 6.0], 0.0);
    assert_close(&red(ReduceOp::Min, &[0], false, &x), &[3], &[1.0, 2.0, 3.0], 0.0);
    assert_close(&red(ReduceOp::Prod, &[1], true, &x), &[2, 1], &[6.0, 120.0], 0.0);
    assert_close(&red(ReduceOp::Mean, &[0, 1], false, &x), &[], &[3.5], 0.0);
    let n = f32s(&[3], &[1.0, f64::NAN, 3.0]);
    assert_close(&red(ReduceOp::Max, &[0], false, &n), &[], &[f64::NAN], 0.0);
    assert_close(&red(ReduceOp::Min, &[0], false, &n), &[], &[f64::NAN], 0.0);
    // Reducing a 3-d tensor over the middle axis.
    let y = f32s(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    assert_close(
        &red(ReduceOp::Sum, &[1], false, &y),
        &[2, 2],
        &[4.0, 6.0, 12.0, 14.0],
        0.0,
    );
    assert_close(&red(ReduceOp::Sum, &[0, 2], false, &y), &[2], &[14.0, 22.0], 0.0);
}

#[test]
fn integer_reductions_and_empty_axes() {
    let x = tensor(DType::I8, &[3], &[100.0, 100.0, -3.0]);
    // 197 wraps to -59 in int8 (numpy sum with dtype=int8).
    assert_exact(&red(ReduceOp::Sum, &[0], false, &x), DType::I8, &[], &[-59.0]);
    assert_exact(&red(ReduceOp::Max, &[0], false, &x), DType::I8, &[], &[100.0]);
    assert_exact(
        &red(
            ReduceOp::Prod,
            &[0],
            false,
            &tensor(DType::I32, &[3], &[2.0, -3.0, 4.0]),
        ),
        DType::I32,
        &[],
        &[-24.0],
    );
    let empty = f32s(&[2, 0], &[]);
    assert_close(&red(ReduceOp::Sum, &[1], false, &empty), &[2], &[0.0, 0.0], 0.0);
    assert_close(&red(ReduceOp::Prod, &[1], false, &empty), &[2], &[1.0, 1.0], 0.0);
    assert_close(
        &red(ReduceOp::Mean, &[1], false, &empty),
        &[2],
        &[f64::NAN, f64::NAN],
        0.0,
    );
    let e = op_err(
        Op::Reduce(Reduce {
            op: ReduceOp::Max,
            axes: vec![1],
            keepdim: false,
        }),
        &[empty],
    );
    assert!(e.contains("reduce_max") && e.contains("empty"), "{e}");
}

#[test]
fn argmax_argmin_first_occurrence() {
    let x = f32s(&[2, 4], &[1.0, 3.0, 3.0, 0.0, 2.0, f64::NAN, 5.0, f64::NAN]);
    let am = |op, keepdim| {
        op1(
            Op::ArgReduce(ArgReduce { op, axis: 1, keepdim }),
            std::slice::from_ref(&x),
        )
    };
    assert_exact(&am(ArgReduceOp::ArgMax, false), DType::I64, &[2], &[1.0, 1.0]);
    assert_exact(&am(ArgReduceOp::ArgMin, true), DType::I64, &[2, 1], &[3.0, 1.0]);
    let y = op1(
        Op::ArgReduce(ArgReduce {
            op: ArgReduceOp::ArgMin,
            axis: 0,
            keepdim: false,
        }),
        &[tensor(DType::I32, &[3, 2], &[4.0, 1.0, 2.0, 1.0, 2.0, 0.0])],
    );
    assert_exact(&y, DType::I64, &[2], &[1.0, 2.0]);
    let b = op1(
        Op::ArgReduce(ArgReduce {
            op: ArgReduceOp::ArgMax,
            axis: 0,
            keepdim: false,
        }),
        &[bools(&[3], &[false, true, true])],
    );
    assert_exact(&b, DType::I64, &[], &[1.0]);
}
