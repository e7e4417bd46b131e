//! Broadcasts: a broadcast of a broadcast is one broadcast, and a broadcast to the operand's own
//! shape is the operand.

use super::{OarEGraph, OarRewrite, Term, code_rule, find_op, op_of, ty};
use crate::simplify::lang::OarLang;
use egg::Id;
use oar_ir::Op;
use oar_ir::ops::Broadcast;

/// The rules of this topic.
pub(super) fn rules() -> Vec<OarRewrite> {
    vec![
        code_rule("broadcast-broadcast", broadcast_broadcast),
        code_rule("broadcast-identity", broadcast_identity),
    ]
}

/// `broadcast(broadcast(x, s1), s2) → broadcast(x, s2)`: numpy broadcasting composes (`x` fits
/// `s1`, `s1` fits `s2`, so `x` fits `s2` and every output element reads the same `x` element).
fn broadcast_broadcast(eg: &OarEGraph, _: Id, node: &OarLang) -> Option<Term> {
    let (Op::Broadcast(Broadcast { shape }), kids) = op_of(eg, node)? else {
        return None;
    };
    let ((), inner) = find_op(eg, kids[0], |op| matches!(op, Op::Broadcast(_)).then_some(()))?;
    Some(Term::Op(
        Op::Broadcast(Broadcast { shape }),
        vec![Term::Class(inner[0])],
    ))
}

/// `broadcast(x, shape(x))` → `x`.
fn broadcast_identity(eg: &OarEGraph, class: Id, node: &OarLang) -> Option<Term> {
    let (Op::Broadcast(_), kids) = op_of(eg, node)? else {
        return None;
    };
    (ty(eg, kids[0]).is_some() && ty(eg, kids[0]) == ty(eg, class)).then_some(Term::Class(kids[0]))
}
