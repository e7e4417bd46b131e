//! The rule set, one file per topic. Rules go one way and never make code worse; each is a
//! named one-liner (`rw!`) where a pattern can say it, or a small function (a [`code_rule`])
//! where attributes decide (composing permutations, lossless casts).
//!
//! To add a rule: write it in its topic file's `rules()` (or a new topic file listed in
//! [`all_rules`]), add a test to `passes/tests/passes/simplify_rules.rs` where it must fire and one where
//! it must not, and make sure the cost model ranks its right side cheaper.

mod arithmetic;
mod broadcast;
mod cast;
mod constants;
mod movement;

use super::lang::{OarEGraph, OarLang, SplatConst};
use egg::{Applier, ENodeOrVar, Id, PatternAst, RecExpr, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use oar_ir::ops::Broadcast;
use oar_ir::{DType, Op, TensorType};
use std::borrow::Cow;

/// A rewrite over the oar e-graph.
pub type OarRewrite = Rewrite<crate::simplify::lang::OarLang, crate::simplify::lang::OarAnalysis>;

/// Every rule, topic by topic.
pub fn all_rules() -> Vec<OarRewrite> {
    let mut rules = arithmetic::rules();
    rules.extend(constants::rules());
    rules.extend(movement::rules());
    rules.extend(broadcast::rules());
    rules.extend(cast::rules());
    rules
}

/// Names of every rule, in order.
pub fn rule_names() -> Vec<String> {
    all_rules().iter().map(|r| r.name.to_string()).collect()
}

/// A replacement built by a code rule: existing e-classes, new ops and new splat constants.
#[derive(Clone, Debug)]
pub(crate) enum Term {
    /// An existing e-class.
    Class(Id),
    /// A new op over terms.
    Op(Op, Vec<Term>),
    /// A new splat constant.
    Splat(SplatConst),
}

/// A rule as a function of one e-node and its e-class: the term the class equals, if it applies.
pub(crate) type RuleFn = fn(&OarEGraph, Id, &OarLang) -> Option<Term>;

/// Turn `f` into a named rewrite.
pub(crate) fn code_rule(name: &str, f: RuleFn) -> OarRewrite {
    Rewrite::new(name, CodeSearcher(f), CodeApplier).expect("code rules bind no variables")
}

/// Finds the matches of a [`RuleFn`]; the replacement travels to [`CodeApplier`] as the match's
/// pattern AST, its e-class references as variables of the substitution.
struct CodeSearcher(RuleFn);

impl CodeSearcher {
    fn matches(&self, egraph: &OarEGraph, eclass: Id, out: &mut Vec<SearchMatches<'static, OarLang>>, limit: usize) {
        for node in egraph[eclass].iter() {
            if out.len() >= limit {
                return;
            }
            if let Some(term) = (self.0)(egraph, eclass, node) {
                let (ast, subst) = to_pattern(egraph, &term);
                out.push(SearchMatches {
                    eclass,
                    substs: vec![subst],
                    ast: Some(Cow::Owned(ast)),
                });
            }
        }
    }
}

fn to_pattern(egraph: &OarEGraph, term: &Term) -> (PatternAst<OarLang>, Subst) {
    fn go(egraph: &OarEGraph, t: &Term, ast: &mut PatternAst<OarLang>, subst: &mut Subst, nvars: &mut usize) -> Id {
        match t {
            Term::Class(id) => {
                let var: Var = format!("?t{nvars}").parse().expect("valid variable");
                *nvars += 1;
                subst.insert(var, *id);
                ast.add(ENodeOrVar::Var(var))
            }
            Term::Splat(c) => ast.add(ENodeOrVar::ENode(OarLang::Splat(c.clone()))),
            Term::Op(op, kids) => {
                let kids: Vec<Id> = kids.iter().map(|k| go(egraph, k, ast, subst, nvars)).collect();
                let key = egraph.analysis.ops.borrow_mut().intern(op.clone());
                ast.add(ENodeOrVar::ENode(OarLang::Op(key, kids)))
            }
        }
    }
    let (mut ast, mut subst, mut n) = (RecExpr::default(), Subst::default(), 0);
    go(egraph, term, &mut ast, &mut subst, &mut n);
    (ast, subst)
}

impl Searcher<OarLang, crate::simplify::lang::OarAnalysis> for CodeSearcher {
    fn search_eclass_with_limit(
        &self,
        egraph: &OarEGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, OarLang>> {
        let mut out = Vec::new();
        self.matches(egraph, eclass, &mut out, limit.min(1));
        out.pop()
    }

    fn search_with_limit(&self, egraph: &OarEGraph, limit: usize) -> Vec<SearchMatches<'_, OarLang>> {
        let mut out = Vec::new();
        for class in egraph.classes() {
            self.matches(egraph, class.id, &mut out, limit);
        }
        out
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

/// Adds the term a [`CodeSearcher`] found and merges it with the matched class.
struct CodeApplier;

impl Applier<OarLang, crate::simplify::lang::OarAnalysis> for CodeApplier {
    fn apply_matches(&self, egraph: &mut OarEGraph, matches: &[SearchMatches<OarLang>], _rule: Symbol) -> Vec<Id> {
        let mut changed = Vec::new();
        for m in matches {
            let Some(ast) = &m.ast else { continue };
            for subst in &m.substs {
                let id = egraph.add_instantiation(ast, subst);
                if egraph.union(m.eclass, id) {
                    changed.push(id);
                }
            }
        }
        changed
    }

    fn apply_one(&self, _: &mut OarEGraph, _: Id, _: &Subst, _: Option<&PatternAst<OarLang>>, _: Symbol) -> Vec<Id> {
        // Code matches carry their replacement; `apply_matches` handles them.
        Vec::new()
    }
}

/// The type of an e-class.
pub(crate) fn ty(egraph: &OarEGraph, id: Id) -> Option<&TensorType> {
    egraph[id].data.ty.as_ref()
}

/// The op and operands of an op node (cloned out of the table).
pub(crate) fn op_of(egraph: &OarEGraph, node: &OarLang) -> Option<(Op, Vec<Id>)> {
    match node {
        OarLang::Op(k, kids) => Some((egraph.analysis.ops.borrow().op(*k).clone(), kids.clone())),
        _ => None,
    }
}

/// The first node of class `id` whose op `pick` accepts, with `pick`'s result and the operands.
pub(crate) fn find_op<T>(egraph: &OarEGraph, id: Id, pick: impl Fn(&Op) -> Option<T>) -> Option<(T, Vec<Id>)> {
    egraph[id].iter().find_map(|n| {
        let (op, kids) = op_of(egraph, n)?;
        Some((pick(&op)?, kids))
    })
}

/// `x` as a term of type `want`: `x` itself, or `broadcast(x)` when a constant operand only widened
/// the shape. `None` when neither fits.
pub(crate) fn as_type(egraph: &OarEGraph, x: Id, want: &TensorType) -> Option<Term> {
    let have = ty(egraph, x)?;
    if have == want {
        return Some(Term::Class(x));
    }
    let fits = have.dtype == want.dtype && oar_ir::shape::broadcasts_to(&have.shape, &want.shape);
    fits.then(|| {
        Term::Op(
            Op::Broadcast(Broadcast {
                shape: want.shape.0.clone(),
            }),
            vec![Term::Class(x)],
        )
    })
}

/// Condition: the class bound to `var` is a constant whose elements all satisfy `pred`.
pub(crate) fn splat(var: &str, pred: fn(f64) -> bool) -> impl Fn(&mut OarEGraph, Id, &Subst) -> bool {
    let var: Var = var.parse().expect("valid variable");
    move |eg, _, s| eg[s[var]].data.splat.is_some_and(pred)
}

/// Condition: the class bound to `var` has an integer dtype.
pub(crate) fn is_int(var: &str) -> impl Fn(&mut OarEGraph, Id, &Subst) -> bool {
    let var: Var = var.parse().expect("valid variable");
    move |eg, _, s| ty(eg, s[var]).is_some_and(|t| t.dtype.is_int())
}

/// Condition: the class bound to `var` has a float dtype.
pub(crate) fn is_float(var: &str) -> impl Fn(&mut OarEGraph, Id, &Subst) -> bool {
    let var: Var = var.parse().expect("valid variable");
    move |eg, _, s| ty(eg, s[var]).is_some_and(|t| t.dtype.is_float())
}

/// Applier: the matched class equals the operand bound to `var` (broadcast if the other operand,
/// a constant, widened the shape).
pub(crate) struct Operand(pub Var);

impl Operand {
    /// The operand bound to `var`.
    pub(crate) fn of(var: &str) -> Operand {
        Operand(var.parse().expect("valid variable"))
    }
}

impl Applier<OarLang, crate::simplify::lang::OarAnalysis> for Operand {
    fn apply_one(
        &self,
        eg: &mut OarEGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<OarLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let Some(want) = ty(eg, eclass).cloned() else {
            return vec![];
        };
        let Some(term) = as_type(eg, s[self.0], &want) else {
            return vec![];
        };
        add_term(eg, eclass, &term)
    }

    fn vars(&self) -> Vec<Var> {
        vec![self.0]
    }
}

/// Add `term` to the e-graph and merge it with `eclass`; returns the changed classes.
pub(crate) fn add_term(eg: &mut OarEGraph, eclass: Id, term: &Term) -> Vec<Id> {
    let (ast, subst) = to_pattern(eg, term);
    let id = eg.add_instantiation(&ast, &subst);
    if eg.union(eclass, id) { vec![id] } else { vec![] }
}

/// A zero-filled term of type `want` (a scalar splat broadcast to the shape, symbols allowed).
pub(crate) fn zeros(want: &TensorType) -> Term {
    let zero = Term::Splat(SplatConst::new(want.dtype, vec![], 0.0));
    if want.rank() == 0 {
        zero
    } else {
        Term::Op(
            Op::Broadcast(Broadcast {
                shape: want.shape.0.clone(),
            }),
            vec![zero],
        )
    }
}

/// True if every value of `from` is exactly representable in `to` (so a cast is lossless).
pub(crate) fn lossless(from: DType, to: DType) -> bool {
    use DType::*;
    from == to
        || match from {
            Bool => true,
            F16 | BF16 => matches!(to, F32 | F64),
            F32 => to == F64,
            I8 => matches!(to, I32 | I64 | F16 | BF16 | F32 | F64),
            U8 => matches!(to, I32 | I64 | F16 | BF16 | F32 | F64),
            I32 => matches!(to, I64 | F64),
            F64 | I64 => false,
        }
}

/// True if `v` is exactly representable in float dtype `d` (normal or subnormal, finite).
pub(crate) fn exact_in(d: DType, v: f64) -> bool {
    if !v.is_finite() {
        return false;
    }
    match d {
        DType::F64 => true,
        DType::F32 => (v as f32) as f64 == v,
        // Powers of two only (all this module asks of half types), within their exponent range.
        DType::F16 => is_pow2(v) && (-24..=15).contains(&log2(v)),
        DType::BF16 => is_pow2(v) && (-133..=127).contains(&log2(v)),
        _ => v.fract() == 0.0 && v.abs() <= 9_007_199_254_740_992.0,
    }
}

/// True if `|v|` is a power of two.
pub(crate) fn is_pow2(v: f64) -> bool {
    let a = v.abs();
    a.is_finite() && a > 0.0 && a == f64::from_bits(a.to_bits() & 0xfff0_0000_0000_0000) && a.is_normal()
}

fn log2(v: f64) -> i64 {
    v.abs().log2().round() as i64
}
