//! f64 transcendental functions as PTX instruction sequences (PTX has no f64 approximations
//! besides `rcp`/`sqrt`, so everything is range reduction plus polynomials).
//!
//! Accuracy (relative, for normal results; checked in a float64 simulation of these exact
//! sequences against libm):
//! - `exp`: Cody–Waite reduction by ln2 (hi part exact), Taylor to r^13 on |r| ≤ 0.35,
//!   scaling by 2^k built from exponent bits in two halves (so denormal and overflowing results
//!   round once): ≤ ~2 ulp.
//! - `log`: exponent/mantissa split (denormals pre-scaled by 2^54), `m ∈ [√½, √2)`,
//!   `log m = 2·atanh((m−1)/(m+1))` to s^21: ≤ ~2 ulp.
//! - `sin`/`cos`: reduction by π/2 in three parts (accurate quadrant for |x| ≲ 1e6), Taylor to
//!   r^21 / r^22 on [−π/4, π/4]: ≤ ~2 ulp.
//! - `tanh`: `(1−e)/(1+e)`, `e = exp(−2|x|)`, and `x − x³/3 + 2x⁵/15` for |x| < 1e-4: ≤ ~1e-12.
//! - `erf`: Maclaurin series (52 terms) for |x| < 3, else `1 − erfc` with the Numerical Recipes
//!   `erfcc` fit (fractional error 1.2e-7 on erfc ≤ 2.2e-5): ≤ ~1e-14.
//! - `pow(a, b) = exp(b·log|a|)` with the C/numpy special cases: ~1e-16·max(1, |b·ln a|).

use super::emit::{Class, Emitter};
use oar_ir::ops::UnaryOp;

/// ln 2 in two parts (fdlibm): the high part has trailing zero bits, so `k·LN2_HI` is exact.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// π/2 in three parts (fdlibm), each with trailing zero bits.
const PIO2_1: f64 = f64::from_bits(0x3FF9_21FB_5440_0000);
const PIO2_2: f64 = f64::from_bits(0x3DD0_B461_1A60_0000);
const PIO2_3: f64 = f64::from_bits(0x3BA3_198A_2E00_0000);

fn imm(v: f64) -> String {
    format!("0d{:016X}", v.to_bits())
}

/// `op x` for an f64 register; returns the result register.
pub fn unary_f64(e: &mut Emitter, op: UnaryOp, x: &str) -> String {
    match op {
        UnaryOp::Exp => exp(e, x),
        UnaryOp::Log => log(e, x),
        UnaryOp::Sin => sin_cos(e, x, false),
        UnaryOp::Cos => sin_cos(e, x, true),
        UnaryOp::Tanh => tanh(e, x),
        _ => erf(e, x),
    }
}

/// Horner: `c[0] + x·(c[1] + x·(...))`.
fn poly(e: &mut Emitter, x: &str, c: &[f64]) -> String {
    let r = e.reg(Class::F64);
    e.ins(format!("mov.f64 {r}, {}", imm(c[c.len() - 1])));
    for &k in c[..c.len() - 1].iter().rev() {
        e.ins(format!("fma.rn.f64 {r}, {r}, {x}, {}", imm(k)));
    }
    r
}

/// 2^k for an integral s32 register `k` with |k| ≤ 1022.
fn pow2(e: &mut Emitter, k: &str) -> String {
    let (b, f) = (e.reg(Class::R64), e.reg(Class::F64));
    e.ins(format!("cvt.s64.s32 {b}, {k}"));
    e.ins(format!("add.s64 {b}, {b}, 1023"));
    e.ins(format!("shl.b64 {b}, {b}, 52"));
    e.ins(format!("mov.b64 {f}, {b}"));
    f
}

fn exp(e: &mut Emitter, x: &str) -> String {
    let (t, k, r) = (e.reg(Class::F64), e.reg(Class::F64), e.reg(Class::F64));
    e.ins(format!("mul.rn.f64 {t}, {x}, {}", imm(std::f64::consts::LOG2_E)));
    e.ins(format!("cvt.rni.f64.f64 {k}, {t}"));
    e.ins(format!("max.f64 {k}, {k}, {}", imm(-1100.0)));
    e.ins(format!("min.f64 {k}, {k}, {}", imm(1100.0)));
    e.ins(format!("fma.rn.f64 {r}, {k}, {}, {x}", imm(-LN2_HI)));
    e.ins(format!("fma.rn.f64 {r}, {k}, {}, {r}", imm(-LN2_LO)));
    let mut fact = 1.0f64;
    let c: Vec<f64> = (0..14)
        .map(|n| {
            if n > 0 {
                fact *= n as f64;
            }
            1.0 / fact
        })
        .collect();
    let p = poly(e, &r, &c);
    let (ki, k1, k2) = (e.reg(Class::R32), e.reg(Class::R32), e.reg(Class::R32));
    e.ins(format!("cvt.rzi.s32.f64 {ki}, {k}"));
    e.ins(format!("shr.s32 {k1}, {ki}, 1"));
    e.ins(format!("sub.s32 {k2}, {ki}, {k1}"));
    let (s1, s2) = (pow2(e, &k1), pow2(e, &k2));
    e.ins(format!("mul.rn.f64 {p}, {p}, {s1}"));
    e.ins(format!("mul.rn.f64 {p}, {p}, {s2}"));
    // Beyond the range: exact 0 / inf (also for ±inf inputs, where `r` is not finite).
    let (lo, hi) = (e.reg(Class::Pred), e.reg(Class::Pred));
    e.ins(format!("setp.lt.f64 {lo}, {x}, {}", imm(-746.0)));
    e.ins(format!("setp.gt.f64 {hi}, {x}, {}", imm(710.0)));
    e.ins(format!("selp.f64 {p}, 0d0000000000000000, {p}, {lo}"));
    e.ins(format!("selp.f64 {p}, 0d7FF0000000000000, {p}, {hi}"));
    p
}

fn log(e: &mut Emitter, x: &str) -> String {
    let (small, xs) = (e.reg(Class::Pred), e.reg(Class::F64));
    e.ins(format!("setp.lt.f64 {small}, {x}, 0d0010000000000000"));
    e.ins(format!("mul.rn.f64 {xs}, {x}, {}", imm(2f64.powi(54))));
    e.ins(format!("selp.f64 {xs}, {xs}, {x}, {small}"));
    let (bits, ex, mb) = (e.reg(Class::R64), e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("mov.b64 {bits}, {xs}"));
    e.ins(format!("shr.u64 {ex}, {bits}, 52"));
    e.ins(format!("and.b64 {ex}, {ex}, 2047"));
    e.ins(format!("sub.s64 {ex}, {ex}, 1023"));
    let adj = e.reg(Class::R64);
    e.ins(format!("selp.b64 {adj}, 54, 0, {small}"));
    e.ins(format!("sub.s64 {ex}, {ex}, {adj}"));
    e.ins(format!("and.b64 {mb}, {bits}, 4503599627370495"));
    e.ins(format!("or.b64 {mb}, {mb}, 4607182418800017408"));
    let m = e.reg(Class::F64);
    e.ins(format!("mov.b64 {m}, {mb}"));
    let (big, half) = (e.reg(Class::Pred), e.reg(Class::F64));
    e.ins(format!("setp.gt.f64 {big}, {m}, {}", imm(std::f64::consts::SQRT_2)));
    e.ins(format!("mul.rn.f64 {half}, {m}, 0d3FE0000000000000"));
    e.ins(format!("selp.f64 {m}, {half}, {m}, {big}"));
    let one = e.reg(Class::R64);
    e.ins(format!("selp.b64 {one}, 1, 0, {big}"));
    e.ins(format!("add.s64 {ex}, {ex}, {one}"));
    let (s, den, s2) = (e.reg(Class::F64), e.reg(Class::F64), e.reg(Class::F64));
    e.ins(format!("sub.rn.f64 {s}, {m}, 0d3FF0000000000000"));
    e.ins(format!("add.rn.f64 {den}, {m}, 0d3FF0000000000000"));
    e.ins(format!("div.rn.f64 {s}, {s}, {den}"));
    e.ins(format!("mul.rn.f64 {s2}, {s}, {s}"));
    let c: Vec<f64> = (0..11).map(|i| 1.0 / (2 * i + 1) as f64).collect();
    let l = poly(e, &s2, &c);
    e.ins(format!("mul.rn.f64 {l}, {l}, {s}"));
    e.ins(format!("add.rn.f64 {l}, {l}, {l}"));
    let ef = e.reg(Class::F64);
    e.ins(format!("cvt.rn.f64.s64 {ef}, {ex}"));
    e.ins(format!("fma.rn.f64 {l}, {ef}, {}, {l}", imm(LN2_LO)));
    e.ins(format!("fma.rn.f64 {l}, {ef}, {}, {l}", imm(LN2_HI)));
    // log 0 = −inf, log(x < 0) = NaN, log inf = inf, NaN stays NaN.
    let p = e.reg(Class::Pred);
    e.ins(format!("setp.eq.f64 {p}, {x}, 0d0000000000000000"));
    e.ins(format!("selp.f64 {l}, 0dFFF0000000000000, {l}, {p}"));
    e.ins(format!("setp.lt.f64 {p}, {x}, 0d0000000000000000"));
    e.ins(format!("selp.f64 {l}, 0d7FF8000000000000, {l}, {p}"));
    e.ins(format!("setp.eq.f64 {p}, {x}, 0d7FF0000000000000"));
    e.ins(format!("selp.f64 {l}, {x}, {l}, {p}"));
    e.ins(format!("setp.nan.f64 {p}, {x}, {x}"));
    e.ins(format!("selp.f64 {l}, {x}, {l}, {p}"));
    l
}

fn sin_cos(e: &mut Emitter, x: &str, cos: bool) -> String {
    let (t, k, r, r2) = (
        e.reg(Class::F64),
        e.reg(Class::F64),
        e.reg(Class::F64),
        e.reg(Class::F64),
    );
    e.ins(format!("mul.rn.f64 {t}, {x}, {}", imm(std::f64::consts::FRAC_2_PI)));
    e.ins(format!("cvt.rni.f64.f64 {k}, {t}"));
    e.ins(format!("fma.rn.f64 {r}, {k}, {}, {x}", imm(-PIO2_1)));
    e.ins(format!("fma.rn.f64 {r}, {k}, {}, {r}", imm(-PIO2_2)));
    e.ins(format!("fma.rn.f64 {r}, {k}, {}, {r}", imm(-PIO2_3)));
    e.ins(format!("mul.rn.f64 {r2}, {r}, {r}"));
    let fact = |n: u32| (1..=n).map(f64::from).product::<f64>();
    let sc: Vec<f64> = (0..11)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 } / fact(2 * i + 1))
        .collect();
    let cc: Vec<f64> = (0..12)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 } / fact(2 * i))
        .collect();
    let s = poly(e, &r2, &sc);
    e.ins(format!("mul.rn.f64 {s}, {s}, {r}"));
    let c = poly(e, &r2, &cc);
    let (q, qi) = (e.reg(Class::R32), e.reg(Class::R32));
    e.ins(format!("cvt.rzi.s32.f64 {qi}, {k}"));
    if cos {
        e.ins(format!("add.s32 {qi}, {qi}, 1"));
    }
    let (odd, neg) = (e.reg(Class::Pred), e.reg(Class::Pred));
    e.ins(format!("and.b32 {q}, {qi}, 1"));
    e.ins(format!("setp.ne.b32 {odd}, {q}, 0"));
    e.ins(format!("and.b32 {q}, {qi}, 2"));
    e.ins(format!("setp.ne.b32 {neg}, {q}, 0"));
    let v = e.reg(Class::F64);
    e.ins(format!("selp.f64 {v}, {c}, {s}, {odd}"));
    let n = e.reg(Class::F64);
    e.ins(format!("neg.f64 {n}, {v}"));
    e.ins(format!("selp.f64 {v}, {n}, {v}, {neg}"));
    v
}

fn tanh(e: &mut Emitter, x: &str) -> String {
    let (ax, m2) = (e.reg(Class::F64), e.reg(Class::F64));
    e.ins(format!("abs.f64 {ax}, {x}"));
    e.ins(format!("mul.rn.f64 {m2}, {ax}, 0dC000000000000000"));
    let ee = exp(e, &m2);
    let (num, den) = (e.reg(Class::F64), e.reg(Class::F64));
    e.ins(format!("sub.rn.f64 {num}, 0d3FF0000000000000, {ee}"));
    e.ins(format!("add.rn.f64 {den}, 0d3FF0000000000000, {ee}"));
    e.ins(format!("div.rn.f64 {num}, {num}, {den}"));
    e.ins(format!("copysign.f64 {num}, {x}, {num}"));
    let x2 = e.reg(Class::F64);
    e.ins(format!("mul.rn.f64 {x2}, {x}, {x}"));
    let small = poly(e, &x2, &[1.0, -1.0 / 3.0, 2.0 / 15.0]);
    e.ins(format!("mul.rn.f64 {small}, {small}, {x}"));
    let p = e.reg(Class::Pred);
    e.ins(format!("setp.lt.f64 {p}, {ax}, {}", imm(1e-4)));
    e.ins(format!("selp.f64 {num}, {small}, {num}, {p}"));
    num
}

fn erf(e: &mut Emitter, x: &str) -> String {
    let (ax, x2) = (e.reg(Class::F64), e.reg(Class::F64));
    e.ins(format!("abs.f64 {ax}, {x}"));
    e.ins(format!("mul.rn.f64 {x2}, {x}, {x}"));
    let two_over_sqrt_pi = 2.0 / std::f64::consts::PI.sqrt();
    let mut fact = 1.0f64;
    let c: Vec<f64> = (0..52)
        .map(|n| {
            if n > 0 {
                fact *= n as f64;
            }
            let s = if n % 2 == 0 { 1.0 } else { -1.0 };
            s * two_over_sqrt_pi / (fact * (2 * n + 1) as f64)
        })
        .collect();
    let small = poly(e, &x2, &c);
    e.ins(format!("mul.rn.f64 {small}, {small}, {x}"));
    let t = e.reg(Class::F64);
    e.ins(format!("fma.rn.f64 {t}, {ax}, 0d3FE0000000000000, 0d3FF0000000000000"));
    e.ins(format!("rcp.rn.f64 {t}, {t}"));
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
    e.ins(format!("sub.rn.f64 {p}, {p}, {x2}"));
    let ex = exp(e, &p);
    let big = e.reg(Class::F64);
    e.ins(format!("mul.rn.f64 {ex}, {ex}, {t}"));
    e.ins(format!("sub.rn.f64 {big}, 0d3FF0000000000000, {ex}"));
    e.ins(format!("copysign.f64 {big}, {x}, {big}"));
    let sp = e.reg(Class::Pred);
    e.ins(format!("setp.lt.f64 {sp}, {ax}, 0d4008000000000000"));
    e.ins(format!("selp.f64 {big}, {small}, {big}, {sp}"));
    big
}

/// `a ^ b` for f64 registers (C/numpy special cases for zero, one, negative bases).
pub fn pow_f64(e: &mut Emitter, a: &str, b: &str) -> String {
    let aa = e.reg(Class::F64);
    e.ins(format!("abs.f64 {aa}, {a}"));
    let l = log(e, &aa);
    e.ins(format!("mul.rn.f64 {l}, {l}, {b}"));
    let m = exp(e, &l);
    let (bi, half, hf) = (e.reg(Class::F64), e.reg(Class::F64), e.reg(Class::F64));
    e.ins(format!("cvt.rni.f64.f64 {bi}, {b}"));
    e.ins(format!("mul.rn.f64 {half}, {b}, 0d3FE0000000000000"));
    e.ins(format!("cvt.rmi.f64.f64 {hf}, {half}"));
    let (integral, odd, neg) = (e.reg(Class::Pred), e.reg(Class::Pred), e.reg(Class::Pred));
    e.ins(format!("setp.eq.f64 {integral}, {bi}, {b}"));
    e.ins(format!("setp.ne.and.f64 {odd}, {hf}, {half}, {integral}"));
    e.ins(format!("setp.lt.f64 {neg}, {a}, 0d0000000000000000"));
    let n = e.reg(Class::F64);
    e.ins(format!("neg.f64 {n}, {m}"));
    let (p, q) = (e.reg(Class::Pred), e.reg(Class::Pred));
    e.ins(format!("and.pred {p}, {neg}, {odd}"));
    e.ins(format!("selp.f64 {m}, {n}, {m}, {p}"));
    e.ins(format!("not.pred {q}, {integral}"));
    e.ins(format!("and.pred {p}, {neg}, {q}"));
    e.ins(format!("selp.f64 {m}, 0d7FF8000000000000, {m}, {p}"));
    e.ins(format!("setp.eq.f64 {p}, {b}, 0d0000000000000000"));
    e.ins(format!("setp.eq.or.f64 {p}, {a}, 0d3FF0000000000000, {p}"));
    e.ins(format!("selp.f64 {m}, 0d3FF0000000000000, {m}, {p}"));
    m
}
