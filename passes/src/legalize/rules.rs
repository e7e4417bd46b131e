//! The arithmetic rules (pow, rem, NaN-propagating max/min, saturating casts, rsqrt) and the
//! dispatch of each expansion to its dtype: f16 and bf16 compute in f32 (or f64) and round once.

use super::Expand;
use super::build::B;
use super::math::{self, F32, F64, Fmt};
use oar_ir::DType;
use oar_ir::kernel::ScalarOp;
use oar_ir::ops::{BinaryOp, UnaryOp};

/// The instructions computing `op` (operands already renumbered) as `e` says, of `dtype`.
pub(crate) fn expand(b: &mut B, e: Expand, op: &ScalarOp, dtype: DType) -> usize {
    match (e, op) {
        (Expand::Exp, ScalarOp::Unary(_, x)) => in_f32(b, *x, dtype, math::exp),
        (Expand::Log, ScalarOp::Unary(_, x)) => in_f32(b, *x, dtype, math::log),
        (Expand::Sin, ScalarOp::Unary(_, x)) => in_f32(b, *x, dtype, |b, f, x| math::sin_cos(b, f, x, false)),
        (Expand::Cos, ScalarOp::Unary(_, x)) => in_f32(b, *x, dtype, |b, f, x| math::sin_cos(b, f, x, true)),
        (Expand::Tanh, ScalarOp::Unary(_, x)) => in_f32(b, *x, dtype, math::tanh),
        (Expand::Erf, ScalarOp::Unary(_, x)) => in_f32(b, *x, dtype, math::erf),
        (Expand::Rsqrt, ScalarOp::Unary(_, x)) => {
            // In f64, as the reference computes it (then rounded once).
            let w = b.cast(*x, DType::F64);
            let s = b.un(UnaryOp::Sqrt, w);
            let one = b.c(DType::F64, 1.0);
            let r = b.div(one, s);
            b.cast(r, dtype)
        }
        (Expand::Pow, ScalarOp::Binary(_, x, y)) => pow(b, *x, *y, dtype),
        (Expand::FloatRem, ScalarOp::Binary(_, x, y)) => float_rem(b, *x, *y, dtype),
        (Expand::IntRem, ScalarOp::Binary(_, x, y)) => int_rem(b, *x, *y),
        (Expand::NanMinMax, ScalarOp::Binary(op, x, y)) => {
            let m = if *op == BinaryOp::Max {
                b.max(*x, *y)
            } else {
                b.min(*x, *y)
            };
            let ny = b.is_nan(*y);
            let m = b.sel(ny, *y, m);
            let nx = b.is_nan(*x);
            b.sel(nx, *x, m)
        }
        (Expand::SaturatingCast, ScalarOp::Cast(x)) => saturating_cast(b, *x, dtype),
        _ => unreachable!("`needs` pairs each expansion with its op"),
    }
}

/// `f` on `x` in its own format (f32, f64), or for f16/bf16 in f32 and rounded.
fn in_f32(b: &mut B, x: usize, dtype: DType, f: impl Fn(&mut B, Fmt, usize) -> usize) -> usize {
    match dtype {
        DType::F64 => f(b, F64, x),
        DType::F32 => f(b, F32, x),
        _ => {
            let w = b.cast(x, DType::F32);
            let r = f(b, F32, w);
            b.cast(r, dtype)
        }
    }
}

/// numpy's `a ** b` (IEEE `pow` special cases), computed in f64 as `exp(b·ln|a|)` and rounded.
/// Small constant integer exponents are products, bit-identical to the reference: `a²` (and
/// `a³`, `a⁴` of f32, exact or rounded once in f64) and `1/a`.
fn pow(b: &mut B, x: usize, y: usize, dtype: DType) -> usize {
    if let ScalarOp::Const(c) = b.out[y].op {
        let narrow = dtype != DType::F64;
        match c.0 {
            0.0 => return b.like(x, 1.0),
            1.0 => return x,
            -1.0 => {
                let one = b.like(x, 1.0);
                return b.div(one, x);
            }
            2.0 if dtype == DType::F32 || dtype == DType::F64 => return b.mul(x, x),
            e @ (2.0 | 3.0 | 4.0) if narrow => {
                let w = b.cast(x, DType::F64);
                let mut p = b.mul(w, w);
                for _ in 2..e as u32 {
                    p = b.mul(p, w);
                }
                return b.cast(p, dtype);
            }
            _ => {}
        }
    }
    let a = b.cast(x, DType::F64);
    let e = b.cast(y, DType::F64);
    let aa = b.abs(a);
    let l = math::log(b, F64, aa);
    let t = b.mul(e, l);
    let r = math::exp(b, F64, t);
    // An integer exponent: negative bases keep the sign of odd powers; others give NaN.
    let fl = b.floor(e);
    let int = b.eq(fl, e);
    let half = b.mul_c(e, 0.5);
    let hf = b.floor(half);
    let odd_half = b.ne(hf, half);
    let odd = b.and(int, odd_half);
    let neg_base = b.lt_c(a, 0.0);
    let zero_base = b.eq_c(a, 0.0);
    // -0 is a negative base for the sign of odd powers (pow(-0, 3) = -0).
    let ab = b.bitcast(a, DType::I64);
    let sign_bit = b.lt_c(ab, 0.0);
    let signed_zero = b.and(zero_base, sign_bit);
    let negative = b.or(neg_base, signed_zero);
    let flip = b.and(negative, odd);
    let r = b.negate_if(flip, r);
    let t = b_true(b);
    let not_int = b.xor(int, t);
    // A finite negative base with a fractional exponent (−inf's powers are ±0 and ±inf).
    let fin = b.gt_c(a, f64::NEG_INFINITY);
    let finite_neg = b.and(neg_base, fin);
    let bad = b.and(finite_neg, not_int);
    let r = b.sel_c(bad, f64::NAN, r);
    // |a| = 1 (including ±inf exponents and a = −1) → 1; b = 0 → 1, even for NaN bases.
    let one_base = b.eq_c(a, 1.0);
    let m1 = b.eq_c(a, -1.0);
    let ae = b.abs(e);
    let inf_e = b.eq_c(ae, f64::INFINITY);
    let m1_inf = b.and(m1, inf_e);
    let is_one = b.or(one_base, m1_inf);
    let zero_e = b.eq_c(e, 0.0);
    let is_one = b.or(is_one, zero_e);
    let r = b.sel_c(is_one, 1.0, r);
    b.cast(r, dtype)
}

fn b_true(b: &mut B) -> usize {
    b.c(DType::Bool, 1.0)
}

/// numpy's float `a mod b`: the remainder with the sign of `b` (a zero remainder takes `b`'s
/// sign), from the truncated quotient in f64.
fn float_rem(b: &mut B, x: usize, y: usize, dtype: DType) -> usize {
    let a = b.cast(x, DType::F64);
    let d = b.cast(y, DType::F64);
    let q = b.div(a, d);
    // trunc(q) = sign(q)·floor(|q|).
    let aq = b.abs(q);
    let fq = b.floor(aq);
    let qneg = b.lt_c(q, 0.0);
    let tq = b.negate_if(qneg, fq);
    // a − tq·d exactly: Dekker's product splits tq·d into p + e.
    let (p, e) = two_product(b, tq, d);
    // An infinite divisor leaves a finite `a` whole (0·inf would be NaN).
    let adiv = b.abs(d);
    let dinf = b.eq_c(adiv, f64::INFINITY);
    let p = b.sel_c(dinf, 0.0, p);
    let e = b.sel_c(dinf, 0.0, e);
    let ap = b.sub(a, p);
    let r = b.sub(ap, e);
    // Keep |r| < |d| with a's sign (a rounded quotient can be off by one).
    let ar = b.abs(r);
    let ad = b.abs(d);
    let over = b.ge(ar, ad);
    let rneg = b.lt_c(r, 0.0);
    let sd = b.negate_if(rneg, ad);
    let r2 = b.sub(r, sd);
    let r = b.sel(over, r2, r);
    // The divisor's sign: r + d where the signs differ.
    let dneg = b.lt_c(d, 0.0);
    let rneg = b.lt_c(r, 0.0);
    let zero = b.like(r, 0.0);
    let nz = b.ne(r, zero);
    let differ = b.xor(rneg, dneg);
    let fix = b.and(differ, nz);
    let rd = b.add(r, d);
    let r = b.sel(fix, rd, r);
    // A zero remainder takes the divisor's sign.
    let is0 = b.eq_c(r, 0.0);
    let z = b.like(r, 0.0);
    let nz = b.neg(z);
    let sz = b.sel(dneg, nz, z);
    let r = b.sel(is0, sz, r);
    b.cast(r, dtype)
}

/// `x·y` as `p + e` exactly (Dekker): `p` the rounded product, `e` its error (f64).
fn two_product(b: &mut B, x: usize, y: usize) -> (usize, usize) {
    let split = |b: &mut B, v: usize| {
        let c = b.mul_c(v, 134_217_729.0);
        let cv = b.sub(c, v);
        let hi = b.sub(c, cv);
        let lo = b.sub(v, hi);
        (hi, lo)
    };
    let (xh, xl) = split(b, x);
    let (yh, yl) = split(b, y);
    let p = b.mul(x, y);
    let hh = b.mul(xh, yh);
    let t = b.sub(hh, p);
    let hl = b.mul(xh, yl);
    let t = b.add(t, hl);
    let lh = b.mul(xl, yh);
    let t = b.add(t, lh);
    let ll = b.mul(xl, yl);
    let e = b.add(t, ll);
    (p, e)
}

/// numpy's integer `a mod b` from the truncating quotient (`a/b` errs on zero as before).
fn int_rem(b: &mut B, x: usize, y: usize) -> usize {
    let d = b.dt(x);
    let q = b.push(ScalarOp::Binary(BinaryOp::Div, x, y), d);
    let m = b.mul(q, y);
    let r = b.sub(x, m);
    let zero = b.like(r, 0.0);
    let nz = b.ne(r, zero);
    let rneg = b.lt(r, zero);
    let yneg = b.lt(y, zero);
    let differ = b.xor(rneg, yneg);
    let fix = b.and(nz, differ);
    let ry = b.add(r, y);
    b.sel(fix, ry, r)
}

/// Rust's saturating float → int `as`: NaN → 0, out-of-range values clamp.
fn saturating_cast(b: &mut B, x: usize, to: DType) -> usize {
    let (lo, hi) = to.int_range().expect("an integer dtype");
    let nan = b.is_nan(x);
    // The limits as floats: `hi` may round up (2^31, 2^63), so `≥` catches everything above.
    let lo_f = b.like(x, lo as f64);
    let under = b.le(x, lo_f);
    let hi_f = b.like(x, hi as f64);
    let over = b.ge(x, hi_f);
    let zero = b.like(x, 0.0);
    let bad = b.or(under, over);
    let bad = b.or(bad, nan);
    let safe = b.sel(bad, zero, x);
    let v = b.push(ScalarOp::Cast(safe), to);
    let v = b.sel_c(under, lo as f64, v);
    let v = b.sel_c(over, hi as f64, v);
    b.sel_c(nan, 0.0, v)
}

#[cfg(test)]
mod tests {
    use super::super::{Natives, legalize_body};
    use oar_ir::kernel::{Inst, ScalarOp};
    use oar_ir::ops::UnaryOp;
    use oar_ir::{DType, Float};

    #[test]
    fn natives_are_left_alone_and_the_value_stays_last() {
        let body = vec![
            Inst {
                op: ScalarOp::Const(Float(1.0)),
                dtype: DType::F32,
            },
            Inst {
                op: ScalarOp::Unary(UnaryOp::Exp, 0),
                dtype: DType::F32,
            },
        ];
        assert!(legalize_body(&body, &Natives::of(&[super::Expand::Exp])).is_none());
        let out = legalize_body(&body, &Natives::none()).unwrap();
        assert!(out.len() > 20, "{}", out.len());
        assert!(!out.iter().any(|i| matches!(i.op, ScalarOp::Unary(UnaryOp::Exp, _))));
        assert_eq!(out.last().unwrap().dtype, DType::F32);
    }
}
