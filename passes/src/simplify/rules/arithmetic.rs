//! Arithmetic: involutions, sign folding, division by a power of two, and constant
//! reassociation where it is exact.
//!
//! - `x / 2^k → x * 2^-k`: both are one correctly rounded operation on the same real number, so
//!   the result is bit-identical whenever `2^-k` is exactly representable (checked).
//! - `(x * c1) * c2 → x * (c1*c2)`: always for integers (wrapping arithmetic is a ring). For
//!   floats only when `c1` is `±2^k` with `k ≥ 0` and `|c2| ≥ 1`: then `x*c1` is exact (or
//!   overflows, and so does the product), so both sides round once at the same real number.
//! - `(x + c1) + c2 → x + (c1+c2)`: integers only (float addition does not associate).

use super::{OarEGraph, OarRewrite, Term, exact_in, is_float, is_int, is_pow2, splat, ty};
use crate::simplify::lang::{OarAnalysis, OarLang, SplatConst};
use egg::{Applier, Id, PatternAst, Subst, Symbol, Var, rewrite as rw};
use oar_ir::ops::BinaryOp;
use oar_ir::{DType, Op};

/// The rules of this topic.
pub(super) fn rules() -> Vec<OarRewrite> {
    vec![
        rw!("neg-neg"; "(neg (neg ?x))" => "?x"),
        rw!("not-not"; "(not (not ?x))" => "?x"),
        rw!("abs-abs"; "(abs (abs ?x))" => "(abs ?x)"),
        rw!("abs-neg"; "(abs (neg ?x))" => "(abs ?x)"),
        rw!("sub-neg"; "(sub ?x (neg ?y))" => "(add ?x ?y)"),
        rw!("add-neg"; "(add ?x (neg ?y))" => "(sub ?x ?y)"),
        rw!("div-pow2"; "(div ?x ?c)" => { MulByReciprocal } if is_float("?x") if splat("?c", is_pow2)),
        rw!("mul-mul-const"; "(mul (mul ?x ?c1) ?c2)" => { FoldInto(BinaryOp::Mul) }),
        rw!("add-add-const-int"; "(add (add ?x ?c1) ?c2)" => { FoldInto(BinaryOp::Add) } if is_int("?x")),
    ]
}

fn var(s: &str) -> Var {
    s.parse().expect("valid variable")
}

/// Applier for `x / c → x * (1/c)`, when `1/c` is exact in the dtype.
struct MulByReciprocal;

impl Applier<OarLang, OarAnalysis> for MulByReciprocal {
    fn apply_one(
        &self,
        eg: &mut OarEGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<OarLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let c = s[var("?c")];
        let (Some(v), Some(t)) = (eg[c].data.splat, ty(eg, c).cloned()) else {
            return vec![];
        };
        let (recip, Some(shape)) = (1.0 / v, t.shape.as_static()) else {
            return vec![];
        };
        if !exact_in(t.dtype, recip) {
            return vec![];
        }
        let term = Term::Op(
            Op::Binary(BinaryOp::Mul),
            vec![
                Term::Class(s[var("?x")]),
                Term::Splat(SplatConst::new(t.dtype, shape, recip)),
            ],
        );
        super::add_term(eg, eclass, &term)
    }

    fn vars(&self) -> Vec<Var> {
        vec![var("?x"), var("?c")]
    }
}

/// Applier for `(x op c1) op c2 → x op (c1 op c2)` with the constants folded, when exact and
/// when `x` alone already has the result's type (the constants do not widen it).
struct FoldInto(BinaryOp);

impl FoldInto {
    fn fold(&self, dtype: DType, c1: f64, c2: f64) -> Option<f64> {
        if dtype.is_int() {
            let (a, b) = (c1 as i64, c2 as i64);
            let r = if self.0 == BinaryOp::Mul {
                a.wrapping_mul(b)
            } else {
                a.wrapping_add(b)
            };
            let r = match dtype {
                DType::I8 => r as i8 as i64,
                DType::U8 => r as u8 as i64,
                DType::I32 => r as i32 as i64,
                _ => r,
            };
            return exact_in(DType::I64, r as f64).then_some(r as f64);
        }
        // Floats: multiplication only, `c1 = ±2^k (k ≥ 0)` and `|c2| ≥ 1` (see the module docs).
        let ok = self.0 == BinaryOp::Mul && is_pow2(c1) && c1.abs() >= 1.0 && c2.abs() >= 1.0;
        let r = c1 * c2;
        (ok && exact_in(dtype, r) && exact_in(dtype, c2)).then_some(r)
    }
}

impl Applier<OarLang, OarAnalysis> for FoldInto {
    fn apply_one(
        &self,
        eg: &mut OarEGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<OarLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let x = s[var("?x")];
        let (Some(c1), Some(c2)) = (eg[s[var("?c1")]].data.splat, eg[s[var("?c2")]].data.splat) else {
            return vec![];
        };
        let (Some(tx), Some(want)) = (ty(eg, x), ty(eg, eclass)) else {
            return vec![];
        };
        if tx != want {
            return vec![];
        }
        let dtype = tx.dtype;
        let Some(folded) = self.fold(dtype, c1, c2) else {
            return vec![];
        };
        let term = Term::Op(
            Op::Binary(self.0),
            vec![Term::Class(x), Term::Splat(SplatConst::new(dtype, vec![], folded))],
        );
        super::add_term(eg, eclass, &term)
    }

    fn vars(&self) -> Vec<Var> {
        vec![var("?x"), var("?c1"), var("?c2")]
    }
}
