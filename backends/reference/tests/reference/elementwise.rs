//! Elementwise ops against hand-computed values. Float tolerance: 1e-6 relative (f32
//! results are rounded once from f64, so most are exact).

use crate::common::*;
use oar_ir::ops::Cast;
use oar_ir::ops::{BinaryOp, UnaryOp};
use oar_ir::{DType, Op};

fn un(op: UnaryOp, x: &oar_ir::TensorData) -> oar_ir::TensorData {
    op1(Op::Unary(op), std::slice::from_ref(x))
}

fn bin(op: BinaryOp, a: &oar_ir::TensorData, b: &oar_ir::TensorData) -> oar_ir::TensorData {
    op1(Op::Binary(op), &[a.clone(), b.clone()])
}

#[test]
fn float_unary_ops() {
    let x = f32s(&[4], &[-1.5, 0.0, 0.5, 2.5]);
    use UnaryOp::*;
    assert_close(&un(Neg, &x), &[4], &[1.5, -0.0, -0.5, -2.5], 0.0);
    assert_close(&un(Abs, &x), &[4], &[1.5, 0.0, 0.5, 2.5], 0.0);
    assert_close(&un(Floor, &x), &[4], &[-2.0, 0.0, 0.0, 2.0], 0.0);
    assert_close(&un(Ceil, &x), &[4], &[-1.0, 0.0, 1.0, 3.0], 0.0);
    // Half to even: -1.5 → -2, 0.5 → 0, 2.5 → 2.
    assert_close(&un(Round, &x), &[4], &[-2.0, 0.0, 0.0, 2.0], 0.0);
    assert_close(&un(Sign, &x), &[4], &[-1.0, 0.0, 1.0, 1.0], 0.0);
    let p = f32s(&[3], &[0.25, 1.0, 4.0]);
    assert_close(&un(Sqrt, &p), &[3], &[0.5, 1.0, 2.0], 0.0);
    assert_close(&un(Rsqrt, &p), &[3], &[2.0, 1.0, 0.5], 0.0);
    assert_close(&un(Recip, &p), &[3], &[4.0, 1.0, 0.25], 0.0);
    assert_close(
        &un(Log, &p),
        &[3],
        &[-1.3862943611198906, 0.0, 1.3862943611198906],
        1e-6,
    );
    assert_close(
        &un(Exp, &p),
        &[3],
        &[1.2840254166877414, std::f64::consts::E, 54.598150033144236],
        1e-6,
    );
    let a = f32s(&[3], &[0.0, 0.5, -1.0]);
    assert_close(&un(Sin, &a), &[3], &[0.0, 0.479425538604203, -0.8414709848078965], 1e-6);
    assert_close(&un(Cos, &a), &[3], &[1.0, 0.8775825618903728, 0.5403023058681398], 1e-6);
    assert_close(
        &un(Tanh, &a),
        &[3],
        &[0.0, 0.46211715726000974, -0.7615941559557649],
        1e-6,
    );
    assert_close(
        &un(Erf, &a),
        &[3],
        &[0.0, 0.5204998778130465, -0.8427007929497149],
        1e-6,
    );
    // Edge values: log(0) = -inf, log(-1) = NaN, sign(NaN) = NaN.
    let e = f32s(&[3], &[0.0, -1.0, f64::NAN]);
    assert_close(&un(Log, &e), &[3], &[f64::NEG_INFINITY, f64::NAN, f64::NAN], 0.0);
    assert_close(&un(Sign, &e), &[3], &[0.0, -1.0, f64::NAN], 0.0);
}

#[test]
fn integer_and_bool_unary_ops() {
    let x = tensor(DType::I8, &[3], &[-128.0, -3.0, 5.0]);
    // numpy: -(-128) wraps to -128 in int8; abs likewise.
    assert_exact(&un(UnaryOp::Neg, &x), DType::I8, &[3], &[-128.0, 3.0, -5.0]);
    assert_exact(&un(UnaryOp::Abs, &x), DType::I8, &[3], &[-128.0, 3.0, 5.0]);
    assert_exact(&un(UnaryOp::Sign, &x), DType::I8, &[3], &[-1.0, -1.0, 1.0]);
    assert_exact(&un(UnaryOp::Not, &x), DType::I8, &[3], &[127.0, 2.0, -6.0]);
    let u = tensor(DType::U8, &[2], &[5.0, 0.0]);
    assert_exact(&un(UnaryOp::Not, &u), DType::U8, &[2], &[250.0, 255.0]);
    assert_exact(&un(UnaryOp::Neg, &u), DType::U8, &[2], &[251.0, 0.0]);
    let b = bools(&[2], &[true, false]);
    assert_exact(&un(UnaryOp::Not, &b), DType::Bool, &[2], &[0.0, 1.0]);
}

#[test]
fn float_binary_ops_broadcast() {
    let a = f32s(&[2, 1], &[1.0, -7.0]);
    let b = f32s(&[3], &[2.0, -3.0, 0.5]);
    use BinaryOp::*;
    assert_close(&bin(Add, &a, &b), &[2, 3], &[3.0, -2.0, 1.5, -5.0, -10.0, -6.5], 0.0);
    assert_close(&bin(Sub, &a, &b), &[2, 3], &[-1.0, 4.0, 0.5, -9.0, -4.0, -7.5], 0.0);
    assert_close(&bin(Mul, &a, &b), &[2, 3], &[2.0, -3.0, 0.5, -14.0, 21.0, -3.5], 0.0);
    assert_close(
        &bin(Div, &a, &b),
        &[2, 3],
        &[0.5, -1.0 / 3.0, 2.0, -3.5, 7.0 / 3.0, -14.0],
        1e-7,
    );
    // numpy mod: sign of the divisor. 1 % -3 = -2, -7 % 2 = 1, -7 % -3 = -1, -7 % 0.5 = 0.
    assert_close(&bin(Rem, &a, &b), &[2, 3], &[1.0, -2.0, 0.0, 1.0, -1.0, 0.0], 0.0);
    assert_close(
        &bin(Pow, &f32s(&[2], &[2.0, 9.0]), &f32s(&[2], &[3.0, 0.5])),
        &[2],
        &[8.0, 3.0],
        0.0,
    );
    let n = f32s(&[3], &[f64::NAN, 1.0, 2.0]);
    let m = f32s(&[3], &[0.0, f64::NAN, 1.0]);
    assert_close(&bin(Max, &n, &m), &[3], &[f64::NAN, f64::NAN, 2.0], 0.0);
    assert_close(&bin(Min, &n, &m), &[3], &[f64::NAN, f64::NAN, 1.0], 0.0);
    // float division by zero is IEEE, not an error.
    assert_close(
        &bin(Div, &f32s(&[1], &[1.0]), &f32s(&[1], &[0.0])),
        &[1],
        &[f64::INFINITY],
        0.0,
    );
}

#[test]
fn comparisons_and_logic() {
    let a = f32s(&[4], &[1.0, 2.0, f64::NAN, 3.0]);
    let b = f32s(&[4], &[1.0, 3.0, f64::NAN, 2.0]);
    use BinaryOp::*;
    assert_exact(&bin(Eq, &a, &b), DType::Bool, &[4], &[1.0, 0.0, 0.0, 0.0]);
    assert_exact(&bin(Ne, &a, &b), DType::Bool, &[4], &[0.0, 1.0, 1.0, 1.0]);
    assert_exact(&bin(Lt, &a, &b), DType::Bool, &[4], &[0.0, 1.0, 0.0, 0.0]);
    assert_exact(&bin(Le, &a, &b), DType::Bool, &[4], &[1.0, 1.0, 0.0, 0.0]);
    assert_exact(&bin(Gt, &a, &b), DType::Bool, &[4], &[0.0, 0.0, 0.0, 1.0]);
    assert_exact(&bin(Ge, &a, &b), DType::Bool, &[4], &[1.0, 0.0, 0.0, 1.0]);
    let p = bools(&[4], &[true, true, false, false]);
    let q = bools(&[4], &[true, false, true, false]);
    assert_exact(&bin(And, &p, &q), DType::Bool, &[4], &[1.0, 0.0, 0.0, 0.0]);
    assert_exact(&bin(Or, &p, &q), DType::Bool, &[4], &[1.0, 1.0, 1.0, 0.0]);
    assert_exact(&bin(Xor, &p, &q), DType::Bool, &[4], &[0.0, 1.0, 1.0, 0.0]);
    assert_exact(&bin(Lt, &q, &p), DType::Bool, &[4], &[0.0, 1.0, 0.0, 0.0]);
    let i = tensor(DType::I32, &[2], &[12.0, -1.0]);
    let j = tensor(DType::I32, &[2], &[10.0, 6.0]);
    assert_exact(&bin(And, &i, &j), DType::I32, &[2], &[8.0, 6.0]);
    assert_exact(&bin(Or, &i, &j), DType::I32, &[2], &[14.0, -1.0]);
    assert_exact(&bin(Xor, &i, &j), DType::I32, &[2], &[6.0, -7.0]);
}

#[test]
fn integer_arithmetic_wraps_truncates_and_errors() {
    use BinaryOp::*;
    let a = tensor(DType::I32, &[4], &[7.0, -7.0, 7.0, -7.0]);
    let b = tensor(DType::I32, &[4], &[2.0, 2.0, -2.0, -2.0]);
    assert_exact(&bin(Div, &a, &b), DType::I32, &[4], &[3.0, -3.0, -3.0, 3.0]);
    assert_exact(&bin(Rem, &a, &b), DType::I32, &[4], &[1.0, 1.0, -1.0, -1.0]);
    let e = tensor(DType::I32, &[4], &[2.0, 3.0, 0.0, 31.0]);
    let base = tensor(DType::I32, &[4], &[7.0, -7.0, -7.0, 2.0]);
    // 2^31 wraps to i32::MIN.
    assert_exact(
        &bin(Pow, &base, &e),
        DType::I32,
        &[4],
        &[49.0, -343.0, 1.0, -2147483648.0],
    );
    let u = tensor(DType::U8, &[2], &[250.0, 3.0]);
    let v = tensor(DType::U8, &[2], &[10.0, 5.0]);
    assert_exact(&bin(Add, &u, &v), DType::U8, &[2], &[4.0, 8.0]);
    assert_exact(&bin(Sub, &u, &v), DType::U8, &[2], &[240.0, 254.0]);
    let big = tensor(DType::I32, &[1], &[65536.0]);
    assert_exact(&bin(Mul, &big, &big), DType::I32, &[1], &[0.0]);
    assert_exact(
        &bin(
            Pow,
            &tensor(DType::I64, &[1], &[3.0]),
            &tensor(DType::I64, &[1], &[4.0]),
        ),
        DType::I64,
        &[1],
        &[81.0],
    );
    let zero = tensor(DType::I32, &[4], &[1.0, 0.0, 1.0, 1.0]);
    let e = op_err(Op::Binary(Div), &[a.clone(), zero.clone()]);
    assert!(e.contains("div") && e.contains("by zero") && e.contains('%'), "{e}");
    assert!(op_err(Op::Binary(Rem), &[a.clone(), zero]).contains("by zero"));
    let neg = op_err(Op::Binary(Pow), &[a, tensor(DType::I32, &[1], &[-1.0])]);
    assert!(neg.contains("negative exponent"), "{neg}");
}

#[test]
fn where_broadcasts_three_ways() {
    let c = bools(&[2, 1], &[true, false]);
    let a = f32s(&[3], &[1.0, 2.0, 3.0]);
    let b = f32s(&[], &[-1.0]);
    let y = op1(Op::Where, &[c, a, b]);
    assert_close(&y, &[2, 3], &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0], 0.0);
}

#[test]
fn casts_truncate_saturate_and_wrap() {
    let x = f32s(&[6], &[2.9, -2.9, 300.0, -300.0, f64::NAN, 0.0]);
    let c = |to| op1(Op::Cast(Cast { to }), std::slice::from_ref(&x));
    assert_exact(&c(DType::I32), DType::I32, &[6], &[2.0, -2.0, 300.0, -300.0, 0.0, 0.0]);
    assert_exact(&c(DType::I8), DType::I8, &[6], &[2.0, -2.0, 127.0, -128.0, 0.0, 0.0]);
    assert_exact(&c(DType::U8), DType::U8, &[6], &[2.0, 0.0, 255.0, 0.0, 0.0, 0.0]);
    assert_exact(&c(DType::Bool), DType::Bool, &[6], &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
    let i = tensor(DType::I64, &[3], &[300.0, -1.0, 0.0]);
    let ci = |to| op1(Op::Cast(Cast { to }), std::slice::from_ref(&i));
    assert_exact(&ci(DType::U8), DType::U8, &[3], &[44.0, 255.0, 0.0]);
    assert_exact(&ci(DType::I8), DType::I8, &[3], &[44.0, -1.0, 0.0]);
    assert_exact(&ci(DType::F16), DType::F16, &[3], &[300.0, -1.0, 0.0]);
    let b = bools(&[2], &[true, false]);
    assert_exact(
        &op1(Op::Cast(Cast { to: DType::F32 }), &[b]),
        DType::F32,
        &[2],
        &[1.0, 0.0],
    );
    // f64 → f32 rounds to nearest.
    let d = tensor(DType::F64, &[1], &[0.1]);
    assert_eq!(
        op1(Op::Cast(Cast { to: DType::F32 }), &[d]).to_vec::<f32>().unwrap(),
        vec![0.1f32]
    );
}

#[test]
fn half_precision_rounds_after_each_op() {
    // In f16, 1 + 2^-11 is a tie between 1 and 1 + 2^-10 and rounds to even (1.0).
    let a = tensor(DType::F16, &[1], &[1.0]);
    let b = tensor(DType::F16, &[1], &[1.0 / 2048.0]);
    assert_exact(&bin(BinaryOp::Add, &a, &b), DType::F16, &[1], &[1.0]);
    // 1 + 3·2^-11 rounds up to 1 + 2^-9.
    let c = tensor(DType::F16, &[1], &[3.0 / 2048.0]);
    assert_exact(&bin(BinaryOp::Add, &a, &c), DType::F16, &[1], &[1.0 + 1.0 / 512.0]);
    // bf16 keeps 8 significand bits: 1 + 2^-8 rounds to 1.
    let x = tensor(DType::BF16, &[1], &[1.0]);
    let y = tensor(DType::BF16, &[1], &[1.0 / 256.0]);
    assert_exact(&bin(BinaryOp::Add, &x, &y), DType::BF16, &[1], &[1.0]);
    // f16 overflow goes to inf.
    let big = tensor(DType::F16, &[1], &[60000.0]);
    assert_exact(&bin(BinaryOp::Add, &big, &big), DType::F16, &[1], &[f64::INFINITY]);
}
