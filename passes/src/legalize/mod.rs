//! `legalize`: the math every code generator needs, written once, as rewrites of the kernel
//! description into a small core ALU set.
//!
//! A backend declares what it computes natively ([`Natives`]); `legalize` replaces every other
//! op of the list below by its expansion, so the cpu, ptx, mlir and vendor code generators carry
//! no math library of their own and compute the same bits for the same kernel:
//!
//! | expansion | replaces | by | accuracy (vs the reference's f64 libm, rounded) |
//! |---|---|---|---|
//! | [`Expand::Exp`] | `exp` | Cody–Waite reduction, polynomial (Cephes f64, a degree-5 fit f32), `2^k` from exponent bits in two factors (subnormal results round once) | ≤ 1 ulp f32, ≤ 2 ulp f64 |
//! | [`Expand::Log`] | `log` | exponent/mantissa split by bits, Cephes polynomial (f32) / rational (f64) | ≤ 1 ulp |
//! | [`Expand::Sin`], [`Expand::Cos`] | `sin`, `cos` | reduction by π/4 in three parts, Cephes polynomials | ≤ 1 ulp for \|x\| ≤ 8192 (f32), 1e9 (f64); inaccurate beyond |
//! | [`Expand::Tanh`] | `tanh` | odd polynomial (f32) / rational (f64) below 0.625, `1 − 2/(e^{2\|x\|}+1)` above | ≤ 1 ulp f32, ≤ 2 ulp f64 |
//! | [`Expand::Erf`] | `erf` | two polynomial pieces (f32); Cephes rational and `erfc` (f64) | ≤ 2 ulp f32, ≤ 3 ulp f64 |
//! | [`Expand::Rsqrt`] | `rsqrt` | `1/sqrt(x)` in f64 | exact (as the reference) |
//! | [`Expand::Pow`] | float `pow` | products for the constant exponents 0, ±1, 2 (and 3, 4 below f64); else `exp(b·ln\|a\|)` in f64 with numpy's special cases | exact / ≤ 1 ulp f32; f64 within `\|b·ln a\|` ulp |
//! | [`Expand::FloatRem`] | float `rem` | truncated quotient in f64, remainder by Dekker's exact product, fixed to the divisor's sign | exact while \|a/b\| < 2²⁹ |
//! | [`Expand::IntRem`] | integer `rem` | `a − (a/b)·b`, fixed to the divisor's sign | exact |
//! | [`Expand::NanMinMax`] | float `max`/`min` | NaN checks around the core `max`/`min` | exact |
//! | [`Expand::SaturatingCast`] | float → int `cast` | NaN → 0, clamp to the range, then the core cast | exact |
//!
//! f16 and bf16 use the f32 expansions (and `rsqrt`, `pow` and `rem` the f64 ones) and round
//! once. Polynomials use fused multiply-adds. The core set every backend implements after
//! `legalize`: float `add sub mul div sqrt neg abs floor ceil round` and comparisons, integer
//! `add sub mul div and or xor` and comparisons, `where`, casts whose operands are in range,
//! and the kernel description's `bitcast`, `shl`, `shr` and `muladd`. The core `max`/`min`
//! may return either operand for a NaN; a backend whose max/min propagate NaN (NanMinMax
//! native) gets shorter expansions (no NaN fix-up after a clamp). Accuracy is tested in ulps
//! against the reference (`passes/tests/passes/legalize.rs`).

mod build;
mod half;
mod math;
mod rules;

pub use half::{HalfSupport, SHARE_SPAN, fold_operand_casts, widen_half};

use build::B;
use oar_ir::DType;
use oar_ir::kernel::{Inst, KernelBody, KernelProgram, ScalarOp};
use oar_ir::ops::{BinaryOp, UnaryOp};
use std::collections::BTreeSet;

/// An op `legalize` can expand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Expand {
    /// `exp` on floats.
    Exp,
    /// `log` on floats.
    Log,
    /// `sin` on floats.
    Sin,
    /// `cos` on floats.
    Cos,
    /// `tanh` on floats.
    Tanh,
    /// `erf` on floats.
    Erf,
    /// `rsqrt` on floats.
    Rsqrt,
    /// `pow` on floats.
    Pow,
    /// `rem` (numpy `mod`) on floats.
    FloatRem,
    /// `rem` (numpy `mod`) on integers.
    IntRem,
    /// NaN-propagating float `max` / `min`.
    NanMinMax,
    /// Saturating float → integer casts (NaN → 0).
    SaturatingCast,
}

impl Expand {
    /// The expansion named as in its variant (`Exp`, `NanMinMax`, ...).
    pub fn from_name(name: &str) -> Option<Expand> {
        Expand::ALL.into_iter().find(|e| format!("{e:?}") == name)
    }

    /// Every expansion.
    pub const ALL: [Expand; 12] = [
        Expand::Exp,
        Expand::Log,
        Expand::Sin,
        Expand::Cos,
        Expand::Tanh,
        Expand::Erf,
        Expand::Rsqrt,
        Expand::Pow,
        Expand::FloatRem,
        Expand::IntRem,
        Expand::NanMinMax,
        Expand::SaturatingCast,
    ];
}

/// What a backend computes natively: `legalize` leaves these ops alone and expands the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Natives(pub BTreeSet<Expand>);

impl Natives {
    /// Nothing native: every expansion applies (a backend with only the core set).
    pub fn none() -> Natives {
        Natives::default()
    }

    /// These ops are native.
    pub fn of(ops: &[Expand]) -> Natives {
        Natives(ops.iter().copied().collect())
    }

    fn has(&self, e: Expand) -> bool {
        self.0.contains(&e)
    }
}

/// Which expansion an instruction of `body` needs, if any.
fn needs(body: &[Inst], inst: &Inst, natives: &Natives) -> Option<Expand> {
    let float = inst.dtype.is_float();
    let e = match &inst.op {
        ScalarOp::Unary(u, _) if float => match u {
            UnaryOp::Exp => Expand::Exp,
            UnaryOp::Log => Expand::Log,
            UnaryOp::Sin => Expand::Sin,
            UnaryOp::Cos => Expand::Cos,
            UnaryOp::Tanh => Expand::Tanh,
            UnaryOp::Erf => Expand::Erf,
            UnaryOp::Rsqrt => Expand::Rsqrt,
            _ => return None,
        },
        ScalarOp::Binary(b, a, _) => {
            let from = body[*a].dtype;
            match b {
                BinaryOp::Pow if from.is_float() => Expand::Pow,
                BinaryOp::Rem if from.is_float() => Expand::FloatRem,
                BinaryOp::Rem if from.is_int() => Expand::IntRem,
                BinaryOp::Max | BinaryOp::Min if from.is_float() => Expand::NanMinMax,
                _ => return None,
            }
        }
        ScalarOp::Cast(a) if body[*a].dtype.is_float() && inst.dtype.is_int() => Expand::SaturatingCast,
        _ => return None,
    };
    (!natives.has(e)).then_some(e)
}

/// `body` with every non-native op expanded; `None` when nothing changes.
pub fn legalize_body(body: &[Inst], natives: &Natives) -> Option<Vec<Inst>> {
    if !body.iter().any(|i| needs(body, i, natives).is_some()) {
        return None;
    }
    Some(rewrite_body(
        body,
        natives.has(Expand::NanMinMax),
        |b, inst, op| match needs(body, inst, natives) {
            None => b.push(op, inst.dtype),
            Some(e) => rules::expand(b, e, &op, inst.dtype),
        },
    ))
}

/// Rebuild `body` instruction by instruction: `rewrite` appends what replaces `inst` (given its
/// op with operands already renumbered) and returns the index of its value. The body's value
/// stays its last instruction.
fn rewrite_body(
    body: &[Inst],
    nan_minmax: bool,
    mut rewrite: impl FnMut(&mut B, &Inst, ScalarOp) -> usize,
) -> Vec<Inst> {
    let mut out: Vec<Inst> = Vec::with_capacity(body.len() * 4);
    let mut map: Vec<usize> = Vec::with_capacity(body.len());
    for inst in body {
        let op = inst.op.map_operands(|a| map[a]);
        let mut b = B {
            out: &mut out,
            nan_minmax,
        };
        map.push(rewrite(&mut b, inst, op));
    }
    let last = *map.last().expect("a non-empty body");
    if last != out.len() - 1 {
        let dtype = out[last].dtype;
        let always = B {
            out: &mut out,
            nan_minmax: false,
        }
        .c(DType::Bool, 1.0);
        let keep = ScalarOp::Where(always, last, last);
        out.push(Inst { op: keep, dtype });
    }
    out
}

/// Expand, in every kernel of `program`, the ops a backend with `natives` does not compute.
pub fn legalize(program: &mut KernelProgram, natives: &Natives) {
    let fix = |body: &mut Vec<Inst>| {
        if let Some(b) = legalize_body(body, natives) {
            *body = b;
        }
    };
    for k in &mut program.kernels {
        match &mut k.body {
            KernelBody::Loop(l) => {
                for r in &mut l.reduce {
                    fix(&mut r.body);
                }
                fix(&mut l.body);
            }
            KernelBody::Contraction(c) => fix(&mut c.epilogue),
            KernelBody::Opaque(_) => {}
        }
    }
}
