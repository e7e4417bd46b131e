//! Casts: a cast to the operand's own dtype is the operand; `cast(cast(x, b), c) → cast(x, c)`
//! when `x → b` is lossless (every value of `x`'s dtype is exact in `b`), because every cast is a
//! function of the value alone. A lossy inner cast (`f32 → f16 → f32`) stays.

use super::{OarEGraph, OarRewrite, Term, code_rule, find_op, lossless, op_of, ty};
use crate::simplify::lang::OarLang;
use egg::Id;
use oar_ir::Op;
use oar_ir::ops::Cast;

/// The rules of this topic.
pub(super) fn rules() -> Vec<OarRewrite> {
    vec![
        code_rule("cast-same", cast_same),
        code_rule("cast-cast-lossless", cast_cast),
    ]
}

/// `cast(x, dtype(x))` → `x`.
fn cast_same(eg: &OarEGraph, _: Id, node: &OarLang) -> Option<Term> {
    let (Op::Cast(Cast { to }), kids) = op_of(eg, node)? else {
        return None;
    };
    (ty(eg, kids[0])?.dtype == to).then_some(Term::Class(kids[0]))
}

/// `cast(cast(x, b), c) → cast(x, c)` when `dtype(x) → b` is lossless.
fn cast_cast(eg: &OarEGraph, _: Id, node: &OarLang) -> Option<Term> {
    let (Op::Cast(Cast { to }), kids) = op_of(eg, node)? else {
        return None;
    };
    let (mid, inner) = find_op(eg, kids[0], |op| match op {
        Op::Cast(Cast { to }) => Some(*to),
        _ => None,
    })?;
    let from = ty(eg, inner[0])?.dtype;
    lossless(from, mid).then(|| Term::Op(Op::Cast(Cast { to }), vec![Term::Class(inner[0])]))
}
