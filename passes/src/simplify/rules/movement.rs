//! Movement chains: permute∘permute → one permute, reshape∘reshape → one reshape, and identity
//! permutes, reshapes, slices and pads → their operand.

use super::{OarEGraph, OarRewrite, Term, code_rule, find_op, op_of, ty};
use crate::simplify::lang::OarLang;
use egg::Id;
use oar_ir::Op;
use oar_ir::ops::{Pad, Permute, Reshape, Slice};

/// The rules of this topic.
pub(super) fn rules() -> Vec<OarRewrite> {
    vec![
        code_rule("permute-permute", permute_permute),
        code_rule("permute-identity", permute_identity),
        code_rule("reshape-reshape", reshape_reshape),
        code_rule("reshape-identity", reshape_identity),
        code_rule("slice-identity", slice_identity),
        code_rule("pad-identity", pad_identity),
    ]
}

/// `permute(permute(x, p1), p2) → permute(x, q)` with `q[i] = p1[p2[i]]` (output axis `i` of the
/// outer permute is axis `p2[i]` of the inner one, which is axis `p1[p2[i]]` of `x`).
fn permute_permute(eg: &OarEGraph, _: Id, node: &OarLang) -> Option<Term> {
    let (Op::Permute(Permute { perm: p2 }), kids) = op_of(eg, node)? else {
        return None;
    };
    let (p1, inner) = find_op(eg, kids[0], |op| match op {
        Op::Permute(Permute { perm }) => Some(perm.clone()),
        _ => None,
    })?;
    let perm: Vec<usize> = p2.iter().map(|&i| p1[i]).collect();
    Some(Term::Op(Op::Permute(Permute { perm }), vec![Term::Class(inner[0])]))
}

/// `permute(x, [0, 1, ..])` → `x`.
fn permute_identity(eg: &OarEGraph, _: Id, node: &OarLang) -> Option<Term> {
    let (Op::Permute(Permute { perm }), kids) = op_of(eg, node)? else {
        return None;
    };
    perm.iter()
        .enumerate()
        .all(|(i, &p)| i == p)
        .then_some(Term::Class(kids[0]))
}

/// `reshape(reshape(x, s1), s2) → reshape(x, s2)`: a reshape only looks at the element order,
/// which reshapes never change.
fn reshape_reshape(eg: &OarEGraph, _: Id, node: &OarLang) -> Option<Term> {
    let (Op::Reshape(Reshape { shape }), kids) = op_of(eg, node)? else {
        return None;
    };
    let ((), inner) = find_op(eg, kids[0], |op| matches!(op, Op::Reshape(_)).then_some(()))?;
    Some(Term::Op(Op::Reshape(Reshape { shape }), vec![Term::Class(inner[0])]))
}

/// `reshape(x, shape(x))` → `x`.
fn reshape_identity(eg: &OarEGraph, class: Id, node: &OarLang) -> Option<Term> {
    identity_if(eg, class, node, |op| matches!(op, Op::Reshape(_)))
}

/// A slice that keeps the type and starts at 0 with step 1 takes every element in order → `x`.
fn slice_identity(eg: &OarEGraph, class: Id, node: &OarLang) -> Option<Term> {
    identity_if(eg, class, node, |op| match op {
        Op::Slice(Slice { ranges }) => ranges.iter().all(|r| r.step == 1 && r.start == 0),
        _ => false,
    })
}

/// The operand of `node`, when `pick` accepts its op and the result has the operand's type.
fn identity_if(eg: &OarEGraph, class: Id, node: &OarLang, pick: fn(&Op) -> bool) -> Option<Term> {
    let (op, kids) = op_of(eg, node)?;
    let x = *kids.first()?;
    (pick(&op) && ty(eg, x).is_some() && ty(eg, x) == ty(eg, class)).then_some(Term::Class(x))
}

/// `pad(x, 0, 0)` → `x`.
fn pad_identity(eg: &OarEGraph, _: Id, node: &OarLang) -> Option<Term> {
    let (Op::Pad(Pad { before, after, .. }), kids) = op_of(eg, node)? else {
        return None;
    };
    before
        .iter()
        .chain(&after)
        .all(|&p| p == 0)
        .then_some(Term::Class(kids[0]))
}
