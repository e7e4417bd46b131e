//! Identities with constant operands: `x*1`, `x/1`, `x^1`, `x-0`, `x+0`, and `x*0` for integers.
//!
//! Float caveats, why some rules are narrower than algebra suggests:
//! - `x*0` is not `0` for floats (`NaN*0`, `inf*0` are NaN, `-1*0` is `-0`): integers only.
//! - `x + 0.0` turns `-0.0` into `+0.0`, so floats only drop an added `-0.0` (an identity for
//!   every float); integers drop any zero.
//! - `x - 0.0` is exact for every float (`-0 - +0 = -0`), but `x - (-0.0)` is not: `+0.0` only.
//!
//! A constant with a wider shape than `x` leaves `broadcast(x)` behind (see [`Operand`]).

use super::{OarEGraph, OarRewrite, Operand, Term, is_float, is_int, splat, ty, zeros};
use egg::{Applier, Id, PatternAst, Subst, Symbol, Var, rewrite as rw};

fn is_one(v: f64) -> bool {
    v == 1.0
}
fn is_zero(v: f64) -> bool {
    v == 0.0
}
fn is_pos_zero(v: f64) -> bool {
    v.to_bits() == 0.0f64.to_bits()
}
fn is_neg_zero(v: f64) -> bool {
    v.to_bits() == (-0.0f64).to_bits()
}

/// The rules of this topic.
pub(super) fn rules() -> Vec<OarRewrite> {
    vec![
        rw!("mul-one"; "(mul ?x ?c)" => { Operand::of("?x") } if splat("?c", is_one)),
        rw!("mul-one-left"; "(mul ?c ?x)" => { Operand::of("?x") } if splat("?c", is_one)),
        rw!("div-one"; "(div ?x ?c)" => { Operand::of("?x") } if splat("?c", is_one)),
        rw!("pow-one"; "(pow ?x ?c)" => { Operand::of("?x") } if splat("?c", is_one)),
        rw!("sub-zero"; "(sub ?x ?c)" => { Operand::of("?x") } if splat("?c", is_pos_zero)),
        rw!("add-zero-int"; "(add ?x ?c)" => { Operand::of("?x") } if is_int("?x") if splat("?c", is_zero)),
        rw!("add-zero-int-left"; "(add ?c ?x)" => { Operand::of("?x") } if is_int("?x") if splat("?c", is_zero)),
        rw!("add-neg-zero"; "(add ?x ?c)" => { Operand::of("?x") } if is_float("?x") if splat("?c", is_neg_zero)),
        rw!("mul-zero-int"; "(mul ?x ?c)" => { Zeros } if is_int("?x") if splat("?c", is_zero)),
        rw!("mul-zero-int-left"; "(mul ?c ?x)" => { Zeros } if is_int("?x") if splat("?c", is_zero)),
    ]
}

/// Applier: the matched class is all zeros of its own type.
struct Zeros;

impl Applier<super::OarLang, crate::simplify::lang::OarAnalysis> for Zeros {
    fn apply_one(
        &self,
        eg: &mut OarEGraph,
        eclass: Id,
        _: &Subst,
        _: Option<&PatternAst<super::OarLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let Some(want) = ty(eg, eclass).cloned() else {
            return vec![];
        };
        let term: Term = zeros(&want);
        super::add_term(eg, eclass, &term)
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}
