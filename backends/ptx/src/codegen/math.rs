//! f32 transcendental functions as PTX instruction sequences (f16/bf16 use them and round).
//!
//! Accuracy (relative to the exact result, for f32 inputs; ftz: results below 2^-126 flush
//! to zero and denormal inputs read as zero):
//! - `exp`: Cody–Waite range reduction `x = k·ln2 + r`, `ex2.approx` on `r·log2e` (|·| ≤ 0.5)
//!   and on `k`: ≤ 2 ulp each, ≤ ~4e-7 relative overall.
//! - `log`: `lg2.approx·ln2` (relative error ≤ 2^-22 outside [0.5, 2], absolute ≤ 2^-22 inside),
//!   and a degree-12 series of `log1p` for |x−1| < 0.25, so ≤ ~8e-7 relative everywhere.
//! - `sin`/`cos`: reduction by π/2 in three parts (exact quadrant up to |x| ≈ 1e5), Taylor
//!   polynomials on [−π/4, π/4] (truncation < 1e-11): ≤ ~2 ulp.
//! - `tanh`: odd Taylor series to x^15 for |x| < 0.55 (truncation < 5e-8), else
//!   `(1−e)/(1+e)` with `e = exp(−2|x|) ≤ 1/3`: ≤ ~6e-7 relative.
//! - `erf`: Maclaurin series to x^25 for |x| < 1 (truncation < 1e-10); else `1 − erfc` with the
//!   Chebyshev fit of Numerical Recipes `erfcc` (fractional error 1.2e-7 on erfc ≤ 0.16): ≤ ~3e-7.
//! - `pow(a, b) = exp(b·log|a|)` with numpy's special cases: relative error about
//!   `1e-6·max(1, |b·ln a|)` (the error of `log` scaled by the exponent).

use super::emit::{Class, Emitter, f32_imm};
use oar_ir::ops::UnaryOp;

/// `op x` for an f32 register; returns the result register.
pub fn unary_f32(e: &mut Emitter, op: UnaryOp, x: &str) -> String {
    match op {
        UnaryOp::Exp => exp(e, x),
        UnaryOp::Log => log(e, x),
        UnaryOp::Sin => sin_cos(e, x, false),
        UnaryOp::Cos => sin_cos(e, x, true),
        UnaryOp::Tanh => tanh(e, x),
        _ => erf(e, x),
    }
}

fn imm(v: f64) -> String {
    f32_imm(v as f32)
}

/// Horner: `c[0] + x·(c[1] + x·(...))`.
fn poly(e: &mut Emitter, x: &str, c: &[f64]) -> String {
    let r = e.reg(Class::F32);
    e.ins(format!("mov.f32 {r}, {}", imm(c[c.len() - 1])));
    for &k in c[..c.len() - 1].iter().rev() {
        e.ins(format!("fma.rn.f32 {r}, {r}, {x}, {}", imm(k)));
    }
    r
}

fn exp(e: &mut Emitter, x: &str) -> String {
    let (t, k, r, s) = (
        e.reg(Class::F32),
        e.reg(Class::F32),
        e.reg(Class::F32),
        e.reg(Class::F32),
    );
    e.ins(format!("mul.rn.f32 {t}, {x}, 0f3FB8AA3B"));
    e.ins(format!("cvt.rni.f32.f32 {k}, {t}"));
    // Clamp k (NaN turns into a bound; `r` then carries the NaN or the infinity).
    e.ins(format!("max.f32 {k}, {k}, 0fC3160000"));
    e.ins(format!("min.f32 {k}, {k}, 0f43160000"));
    e.ins(format!("fma.rn.f32 {r}, {k}, 0fBF317200, {x}"));
    e.ins(format!("fma.rn.f32 {r}, {k}, 0fB5BFBE8E, {r}"));
    e.ins(format!("mul.rn.f32 {r}, {r}, 0f3FB8AA3B"));
    e.ins(format!("ex2.approx.ftz.f32 {r}, {r}"));
    e.ins(format!("ex2.approx.ftz.f32 {s}, {k}"));
    e.ins(format!("mul.rn.f32 {r}, {r}, {s}"));
    r
}

fn log(e: &mut Emitter, x: &str) -> String {
    let (l, u, au) = (e.reg(Class::F32), e.reg(Class::F32), e.reg(Class::F32));
    e.ins(format!("lg2.approx.ftz.f32 {l}, {x}"));
    e.ins(format!("mul.rn.f32 {l}, {l}, 0f3F317218"));
    e.ins(format!("sub.rn.f32 {u}, {x}, 0f3F800000"));
    // log1p(u) = u·(1 − u/2 + u²/3 − ...), 12 terms.
    let c: Vec<f64> = (1..=12)
        .map(|n| if n % 2 == 1 { 1.0 / n as f64 } else { -1.0 / n as f64 })
        .collect();
    let p = poly(e, &u, &c);
    e.ins(format!("mul.rn.f32 {p}, {p}, {u}"));
    let small = e.reg(Class::Pred);
    e.ins(format!("abs.f32 {au}, {u}"));
    e.ins(format!("setp.lt.f32 {small}, {au}, 0f3E800000"));
    e.ins(format!("selp.f32 {l}, {p}, {l}, {small}"));
    l
}

fn sin_cos(e: &mut Emitter, x: &str, cos: bool) -> String {
    let (t, k, r, r2) = (
        e.reg(Class::F32),
        e.reg(Class::F32),
        e.reg(Class::F32),
        e.reg(Class::F32),
    );
    e.ins(format!("mul.rn.f32 {t}, {x}, 0f3F22F983"));
    e.ins(format!("cvt.rni.f32.f32 {k}, {t}"));
    e.ins(format!("fma.rn.f32 {r}, {k}, 0fBFC90000, {x}"));
    e.ins(format!("fma.rn.f32 {r}, {k}, 0fB9FDA000, {r}"));
    e.ins(format!("fma.rn.f32 {r}, {k}, 0fB3A22169, {r}"));
    e.ins(format!("mul.rn.f32 {r2}, {r}, {r}"));
    // sin r = r·S(r²), cos r = C(r²).
    let fact = |n: u32| (1..=n).map(f64::from).product::<f64>();
    let sc: Vec<f64> = (0..6)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 } / fact(2 * i + 1))
        .collect();
    let cc: Vec<f64> = (0..7)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 } / fact(2 * i))
        .collect();
    let s = poly(e, &r2, &sc);
    e.ins(format!("mul.rn.f32 {s}, {s}, {r}"));
    let c = poly(e, &r2, &cc);
    let (q, qi) = (e.reg(Class::R32), e.reg(Class::R32));
    e.ins(format!("cvt.rzi.s32.f32 {qi}, {k}"));
    if cos {
        // cos(x) = cos r, −sin r, −cos r, sin r for quadrants 0..3.
        e.ins(format!("add.s32 {qi}, {qi}, 1"));
    }
    let (odd, neg) = (e.reg(Class::Pred), e.reg(Class::Pred));
    e.ins(format!("and.b32 {q}, {qi}, 1"));
    e.ins(format!("setp.ne.b32 {odd}, {q}, 0"));
    e.ins(format!("and.b32 {q}, {qi}, 2"));
    e.ins(format!("setp.ne.b32 {neg}, {q}, 0"));
    let v = e.reg(Class::F32);
    e.ins(format!("selp.f32 {v}, {c}, {s}, {odd}"));
    let n = e.reg(Class::F32);
    e.ins(format!("neg.f32 {n}, {v}"));
    e.ins(format!("selp.f32 {v}, {n}, {v}, {neg}"));
    v
}

fn tanh(e: &mut Emitter, x: &str) -> String {
    let (ax, x2) = (e.reg(Class::F32), e.reg(Class::F32));
    e.ins(format!("abs.f32 {ax}, {x}"));
    e.ins(format!("mul.rn.f32 {x2}, {x}, {x}"));
    let c = [
        1.0,
        -1.0 / 3.0,
        2.0 / 15.0,
        -17.0 / 315.0,
        62.0 / 2835.0,
        -1382.0 / 155925.0,
        21844.0 / 6081075.0,
        -929569.0 / 638512875.0,
    ];
    let small = poly(e, &x2, &c);
    e.ins(format!("mul.rn.f32 {small}, {small}, {x}"));
    let m2 = e.reg(Class::F32);
    e.ins(format!("mul.rn.f32 {m2}, {ax}, 0fC0000000"));
    let ee = exp(e, &m2);
    let (num, den) = (e.reg(Class::F32), e.reg(Class::F32));
    e.ins(format!("sub.rn.f32 {num}, 0f3F800000, {ee}"));
    e.ins(format!("add.rn.f32 {den}, 0f3F800000, {ee}"));
    e.ins(format!("div.rn.f32 {num}, {num}, {den}"));
    e.ins(format!("copysign.f32 {num}, {x}, {num}"));
    let p = e.reg(Class::Pred);
    e.ins(format!("setp.lt.f32 {p}, {ax}, 0f3F0CCCCD"));
    e.ins(format!("selp.f32 {num}, {small}, {num}, {p}"));
    num
}

fn erf(e: &mut Emitter, x: &str) -> String {
    let (ax, x2) = (e.reg(Class::F32), e.reg(Class::F32));
    e.ins(format!("abs.f32 {ax}, {x}"));
    e.ins(format!("mul.rn.f32 {x2}, {x}, {x}"));
    // erf x = 2/√π · Σ (−1)^n x^(2n+1) / (n! (2n+1)).
    let two_over_sqrt_pi = 2.0 / std::f64::consts::PI.sqrt();
    let mut fact = 1.0f64;
    let c: Vec<f64> = (0..13)
        .map(|n| {
            if n > 0 {
                fact *= n as f64;
            }
            let s = if n % 2 == 0 { 1.0 } else { -1.0 };
            s * two_over_sqrt_pi / (fact * (2 * n + 1) as f64)
        })
        .collect();
    let small = poly(e, &x2, &c);
    e.ins(format!("mul.rn.f32 {small}, {small}, {x}"));
    // erfc z = t·exp(−z² − 1.26551223 + t·P(t)), t = 1/(1 + z/2).
    let t = e.reg(Class::F32);
    e.ins(format!("fma.rn.f32 {t}, {ax}, 0f3F000000, 0f3F800000"));
    e.ins(format!("rcp.rn.f32 {t}, {t}"));
    let pc = [
        -1.26551223,
        1.00002368,
        0.37409196,
        0.09678418,
        -0.18628806,
        0.27886807,
        -1.13520398,
        1.48851587,
        -0.82215223,
        0.17087277,
    ];
    let p = poly(e, &t, &pc);
    let nz2 = e.reg(Class::F32);
    e.ins(format!("neg.f32 {nz2}, {x2}"));
    e.ins(format!("add.rn.f32 {p}, {p}, {nz2}"));
    let ex = exp(e, &p);
    let big = e.reg(Class::F32);
    e.ins(format!("mul.rn.f32 {ex}, {ex}, {t}"));
    e.ins(format!("sub.rn.f32 {big}, 0f3F800000, {ex}"));
    e.ins(format!("copysign.f32 {big}, {x}, {big}"));
    let sp = e.reg(Class::Pred);
    e.ins(format!("setp.lt.f32 {sp}, {ax}, 0f3F800000"));
    e.ins(format!("selp.f32 {big}, {small}, {big}, {sp}"));
    big
}

/// `a ^ b` for f32 registers (numpy/C `pow` special cases for zero, one, negative bases).
pub fn pow_f32(e: &mut Emitter, a: &str, b: &str) -> String {
    let aa = e.reg(Class::F32);
    e.ins(format!("abs.f32 {aa}, {a}"));
    let l = log(e, &aa);
    e.ins(format!("mul.rn.f32 {l}, {l}, {b}"));
    let m = exp(e, &l);
    // Negative base: integral exponents keep the magnitude (negated when odd), others are NaN.
    let (bi, half, hf) = (e.reg(Class::F32), e.reg(Class::F32), e.reg(Class::F32));
    e.ins(format!("cvt.rni.f32.f32 {bi}, {b}"));
    e.ins(format!("mul.rn.f32 {half}, {b}, 0f3F000000"));
    e.ins(format!("cvt.rmi.f32.f32 {hf}, {half}"));
    let (integral, odd, neg) = (e.reg(Class::Pred), e.reg(Class::Pred), e.reg(Class::Pred));
    e.ins(format!("setp.eq.f32 {integral}, {bi}, {b}"));
    e.ins(format!("setp.ne.and.f32 {odd}, {hf}, {half}, {integral}"));
    e.ins(format!("setp.lt.f32 {neg}, {a}, 0f00000000"));
    let n = e.reg(Class::F32);
    e.ins(format!("neg.f32 {n}, {m}"));
    let (p, q) = (e.reg(Class::Pred), e.reg(Class::Pred));
    e.ins(format!("and.pred {p}, {neg}, {odd}"));
    e.ins(format!("selp.f32 {m}, {n}, {m}, {p}"));
    e.ins(format!("not.pred {q}, {integral}"));
    e.ins(format!("and.pred {p}, {neg}, {q}"));
    e.ins(format!("selp.f32 {m}, 0f7FFFFFFF, {m}, {p}"));
    // x^0 = 1 and 1^y = 1, even for NaN.
    e.ins(format!("setp.eq.f32 {p}, {b}, 0f00000000"));
    e.ins(format!("setp.eq.or.f32 {p}, {a}, 0f3F800000, {p}"));
    e.ins(format!("selp.f32 {m}, 0f3F800000, {m}, {p}"));
    m
}
