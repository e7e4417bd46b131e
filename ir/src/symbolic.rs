//! Symbolic sizes: integer polynomials in named symbols (and floor quotients), in a canonical
//! form so that equal sizes compare equal (`N*C == C*N`, `(N*4)/4 == N`, `(2*N+1)/2 == N`).
//!
//! [`SymExpr`] is the algebra; [`crate::Dim`] uses it for dims that are neither a constant nor a
//! lone symbol, and the ONNX importer for shape tensors (whose entries may be negative, `-1`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A factor of a monomial: a symbol, or the floor quotient of an expression by a constant.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Atom {
    /// A named size.
    Sym(String),
    /// `floor(expr / k)`, `k ≥ 2`, where `expr` is not a multiple of `k`.
    FloorDiv(Box<SymExpr>, u64),
}

/// `coef · f₁ · f₂ · …` with factors sorted (a multiset); no factors is a constant.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Term {
    /// The factors, sorted.
    pub factors: Vec<Atom>,
    /// The coefficient (never 0).
    pub coef: i64,
}

/// A sum of terms, sorted by factors, one term per distinct monomial, no zero coefficients:
/// the canonical form of an integer polynomial. The empty sum is 0.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct SymExpr {
    terms: Vec<Term>,
}

/// Error of symbolic arithmetic (overflow, division that cannot be expressed).
pub type SymError = String;

impl SymExpr {
    /// The constant `c`.
    pub fn constant(c: i64) -> SymExpr {
        SymExpr::from_terms(vec![Term {
            factors: Vec::new(),
            coef: c,
        }])
    }

    /// The symbol `name`.
    pub fn sym(name: &str) -> SymExpr {
        SymExpr::atom(Atom::Sym(name.to_string()))
    }

    fn atom(a: Atom) -> SymExpr {
        SymExpr {
            terms: vec![Term {
                factors: vec![a],
                coef: 1,
            }],
        }
    }

    /// Canonical form of any list of terms: merge equal monomials, drop zeros, sort.
    fn from_terms(terms: Vec<Term>) -> SymExpr {
        let mut merged: BTreeMap<Vec<Atom>, i64> = BTreeMap::new();
        for mut t in terms {
            t.factors.sort();
            let c = merged.entry(t.factors).or_insert(0);
            *c = c.saturating_add(t.coef);
        }
        SymExpr {
            terms: merged
                .into_iter()
                .filter(|(_, c)| *c != 0)
                .map(|(factors, coef)| Term { factors, coef })
                .collect(),
        }
    }

    /// The terms, in canonical order.
    pub fn terms(&self) -> &[Term] {
        &self.terms
    }

    /// The value if the expression is a constant.
    pub fn as_constant(&self) -> Option<i64> {
        match self.terms.as_slice() {
            [] => Some(0),
            [t] if t.factors.is_empty() => Some(t.coef),
            _ => None,
        }
    }

    /// The symbol if the expression is exactly one symbol.
    pub fn as_sym(&self) -> Option<&str> {
        match self.terms.as_slice() {
            [Term { factors, coef: 1 }] => match factors.as_slice() {
                [Atom::Sym(s)] => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    /// `self + other`.
    pub fn add(&self, other: &SymExpr) -> Result<SymExpr, SymError> {
        let mut terms = self.terms.clone();
        terms.extend(other.terms.iter().cloned());
        // Overflowing coefficients saturate in `from_terms`; report them instead.
        let sum = SymExpr::from_terms(terms);
        if sum.terms.iter().any(|t| t.coef == i64::MAX || t.coef == i64::MIN) {
            return Err(format!("{self} + {other} overflows"));
        }
        Ok(sum)
    }

    /// `self - other`.
    pub fn sub(&self, other: &SymExpr) -> Result<SymExpr, SymError> {
        self.add(&other.scale(-1)?)
    }

    /// `k · self`.
    pub fn scale(&self, k: i64) -> Result<SymExpr, SymError> {
        let terms = self
            .terms
            .iter()
            .map(|t| {
                t.coef.checked_mul(k).map(|coef| Term {
                    factors: t.factors.clone(),
                    coef,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("{k}*({self}) overflows"))?;
        Ok(SymExpr::from_terms(terms))
    }

    /// `self · other`.
    pub fn mul(&self, other: &SymExpr) -> Result<SymExpr, SymError> {
        let mut terms = Vec::with_capacity(self.terms.len() * other.terms.len());
        for a in &self.terms {
            for b in &other.terms {
                let coef = a
                    .coef
                    .checked_mul(b.coef)
                    .ok_or_else(|| format!("({self})*({other}) overflows"))?;
                let mut factors = a.factors.clone();
                factors.extend(b.factors.iter().cloned());
                terms.push(Term { factors, coef });
            }
        }
        Ok(SymExpr::from_terms(terms))
    }

    /// `floor(self / k)` for a constant `k ≥ 1`. The multiple-of-`k` part leaves the floor:
    /// `floor((k·q + r) / k) = q + floor(r / k)` for integer-valued `q`, so `(2N+1)/2 = N`.
    pub fn floor_div(&self, k: i64) -> Result<SymExpr, SymError> {
        if k < 1 {
            return Err(format!("({self}) / {k}: the divisor must be ≥ 1"));
        }
        let (mut q, mut r) = (Vec::new(), Vec::new());
        for t in &self.terms {
            let (tq, tr) = (t.coef.div_euclid(k), t.coef.rem_euclid(k));
            for (part, c) in [(&mut q, tq), (&mut r, tr)] {
                if c != 0 {
                    part.push(Term {
                        factors: t.factors.clone(),
                        coef: c,
                    });
                }
            }
        }
        let q = SymExpr::from_terms(q);
        let r = SymExpr::from_terms(r);
        let rest = match r.as_constant() {
            Some(c) => SymExpr::constant(c.div_euclid(k)),
            None => SymExpr::atom(Atom::FloorDiv(Box::new(r), k as u64)),
        };
        q.add(&rest)
    }

    /// `self / other` when it divides exactly as polynomials: by a constant dividing every
    /// coefficient, or by one monomial dividing every term (`(N*C*4)/(C*2) = 2*N`).
    pub fn div_exact(&self, other: &SymExpr) -> Option<SymExpr> {
        let [d] = other.terms.as_slice() else {
            return None;
        };
        let mut terms = Vec::with_capacity(self.terms.len());
        for t in &self.terms {
            if d.coef == 0 || t.coef % d.coef != 0 {
                return None;
            }
            let mut factors = t.factors.clone();
            for f in &d.factors {
                let i = factors.iter().position(|x| x == f)?;
                factors.remove(i);
            }
            terms.push(Term {
                factors,
                coef: t.coef / d.coef,
            });
        }
        Some(SymExpr::from_terms(terms))
    }

    /// The symbols it mentions, sorted, each once.
    pub fn symbols(&self) -> Vec<String> {
        fn walk(e: &SymExpr, out: &mut Vec<String>) {
            for t in &e.terms {
                for f in &t.factors {
                    match f {
                        Atom::Sym(s) => out.push(s.clone()),
                        Atom::FloorDiv(inner, _) => walk(inner, out),
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out.sort();
        out.dedup();
        out
    }

    /// The value with every symbol bound by `bind`; `None` if a symbol is unbound or the
    /// arithmetic overflows `i64`.
    pub fn eval(&self, bind: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        let mut sum: i64 = 0;
        for t in &self.terms {
            let mut p = t.coef;
            for f in &t.factors {
                let v = match f {
                    Atom::Sym(s) => bind(s)?,
                    Atom::FloorDiv(e, k) => e.eval(bind)?.div_euclid(i64::try_from(*k).ok()?),
                };
                p = p.checked_mul(v)?;
            }
            sum = sum.checked_add(p)?;
        }
        Some(sum)
    }

    /// Substitute known values for symbols (unknown ones stay), simplifying.
    pub fn substitute(&self, bind: &dyn Fn(&str) -> Option<i64>) -> Result<SymExpr, SymError> {
        self.substitute_exprs(&|s| bind(s).map(SymExpr::constant))
    }

    /// Substitute expressions for symbols (unknown ones stay), simplifying: a graph's sizes in
    /// terms of its caller's (`N` ↦ `2*B`).
    pub fn substitute_exprs(&self, bind: &dyn Fn(&str) -> Option<SymExpr>) -> Result<SymExpr, SymError> {
        let mut out = SymExpr::default();
        for t in &self.terms {
            let mut p = SymExpr::constant(t.coef);
            for f in &t.factors {
                let v = match f {
                    Atom::Sym(s) => bind(s).unwrap_or_else(|| SymExpr::sym(s)),
                    Atom::FloorDiv(e, k) => e.substitute_exprs(bind)?.floor_div(*k as i64)?,
                };
                p = p.mul(&v)?;
            }
            out = out.add(&p)?;
        }
        Ok(out)
    }

    /// If the expression is `a·s + b` in the one symbol `s` (a ≠ 0, `b` constant), `(s, a, b)`:
    /// the shape a size can be solved for.
    pub fn as_linear(&self) -> Option<(&str, i64, i64)> {
        let mut lin = None;
        let mut b = 0;
        for t in &self.terms {
            match t.factors.as_slice() {
                [] => b = t.coef,
                [Atom::Sym(s)] if lin.is_none() => lin = Some((s.as_str(), t.coef)),
                _ => return None,
            }
        }
        lin.map(|(s, a)| (s, a, b))
    }
}

impl fmt::Display for SymExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        // Constants last reads naturally: `2*N+1`.
        let (consts, rest): (Vec<&Term>, Vec<&Term>) = self.terms.iter().partition(|t| t.factors.is_empty());
        for (i, t) in rest.iter().chain(consts.iter()).enumerate() {
            let c = if i == 0 {
                t.coef
            } else if t.coef < 0 {
                f.write_str("-")?;
                -t.coef
            } else {
                f.write_str("+")?;
                t.coef
            };
            let mut first = true;
            // A leading `-` binds tighter than `/` when parsed back (`-N/2` is `(-N)/2`), so a
            // quotient after it is parenthesized: `-(N/2)`.
            let mut negated = false;
            if c != 1 || t.factors.is_empty() {
                if c == -1 && !t.factors.is_empty() {
                    f.write_str("-")?;
                    negated = true;
                } else {
                    write!(f, "{c}")?;
                    first = false;
                }
            }
            let many = t.factors.len() > 1 || !first || negated;
            for a in &t.factors {
                if !first {
                    f.write_str("*")?;
                }
                first = false;
                match a {
                    Atom::Sym(s) => f.write_str(s)?,
                    Atom::FloorDiv(e, k) => match (e.as_sym().is_some(), many) {
                        (true, false) => write!(f, "{e}/{k}")?,
                        (true, true) => write!(f, "({e}/{k})")?,
                        (false, false) => write!(f, "({e})/{k}")?,
                        (false, true) => write!(f, "(({e})/{k})")?,
                    },
                }
            }
        }
        Ok(())
    }
}

/// Parse `2*N*C+1`, `(N+1)/2`, `N-1`: integers, identifiers, `+ - * /` (floor division by a
/// positive constant) and parentheses, with the usual precedence.
pub fn parse_sym_expr(text: &str) -> Result<SymExpr, SymError> {
    let mut p = ExprParser {
        s: text.as_bytes(),
        i: 0,
        depth: 0,
    };
    let e = p.sum()?;
    p.skip_ws();
    if p.i != p.s.len() {
        return Err(format!("unexpected '{}' in size expression `{text}`", p.s[p.i] as char));
    }
    Ok(e)
}

struct ExprParser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
}

impl ExprParser<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }

    fn sum(&mut self) -> Result<SymExpr, SymError> {
        let mut e = self.product()?;
        while let Some(c @ (b'+' | b'-')) = self.peek() {
            self.i += 1;
            let r = self.product()?;
            e = if c == b'+' { e.add(&r)? } else { e.sub(&r)? };
        }
        Ok(e)
    }

    fn product(&mut self) -> Result<SymExpr, SymError> {
        let mut e = self.factor()?;
        while let Some(c @ (b'*' | b'/')) = self.peek() {
            self.i += 1;
            let r = self.factor()?;
            e = if c == b'*' {
                e.mul(&r)?
            } else {
                let k = r
                    .as_constant()
                    .filter(|&k| k >= 1)
                    .ok_or_else(|| format!("a size can only be divided by a positive constant, not `{r}`"))?;
                e.floor_div(k)?
            };
        }
        Ok(e)
    }

    fn factor(&mut self) -> Result<SymExpr, SymError> {
        match self.peek() {
            Some(b'(') => {
                self.depth += 1;
                if self.depth > 64 {
                    return Err("size expression nested too deeply".into());
                }
                self.i += 1;
                let e = self.sum()?;
                if self.peek() != Some(b')') {
                    return Err("expected ')' in size expression".into());
                }
                self.i += 1;
                self.depth -= 1;
                Ok(e)
            }
            Some(b'-') => {
                self.i += 1;
                self.factor()?.scale(-1)
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.i;
                while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                    self.i += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                t.parse::<i64>()
                    .map(SymExpr::constant)
                    .map_err(|_| format!("size {t} is too large"))
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.i;
                while self
                    .s
                    .get(self.i)
                    .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
                {
                    self.i += 1;
                }
                Ok(SymExpr::sym(std::str::from_utf8(&self.s[start..self.i]).unwrap_or("")))
            }
            Some(c) => Err(format!("unexpected '{}' in size expression", c as char)),
            None => Err("size expression ends early".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SymExpr {
        parse_sym_expr(s).unwrap()
    }

    #[test]
    fn canonical_forms_compare_equal() {
        assert_eq!(p("N*C"), p("C*N"));
        assert_eq!(p("N*4/4"), p("N"));
        assert_eq!(p("(2*N+1)/2"), p("N"));
        assert_eq!(p("(N+1)+(N-1)"), p("2*N"));
        assert_eq!(p("(N+2)*(N-2)"), p("N*N-4"));
        assert_ne!(p("N/2*2"), p("N"));
        assert_eq!(p("N-N"), SymExpr::constant(0));
    }

    #[test]
    fn prints_what_it_parses() {
        for s in [
            "N*C",
            "2*N+1",
            "N/2",
            "(N+1)/2",
            "M*(N/2)",
            "-N+3",
            "N*N-4",
            "((N+1)/2)/3",
            "12",
            // A negated quotient first: `-N/2` would parse back as `(-N)/2` (found by fuzzing).
            "-(N/333)+M",
            "-((N+1)/2)",
            "-(N/2)-(M/3)",
        ] {
            let e = p(s);
            assert_eq!(p(&e.to_string()), e, "{s} printed as {e}");
        }
        assert_eq!(p("C*N+1").to_string(), "C*N+1");
        assert_eq!(p("1+2*N").to_string(), "2*N+1");
        assert_eq!(p("-(N/2)").to_string(), "-(N/2)");
    }

    #[test]
    fn evaluates_with_floor_division() {
        let b = |s: &str| match s {
            "N" => Some(7),
            "C" => Some(3),
            _ => None,
        };
        assert_eq!(p("N*C+1").eval(&b), Some(22));
        assert_eq!(p("N/2").eval(&b), Some(3));
        assert_eq!(p("(N+1)/2").eval(&b), Some(4));
        assert_eq!(p("N*H").eval(&b), None);
        assert_eq!(p("N*H").substitute(&b).unwrap(), p("7*H"));
    }

    #[test]
    fn substitutes_expressions_for_symbols() {
        let b = |s: &str| match s {
            "N" => Some(p("2*B")),
            "C" => Some(p("B+1")),
            _ => None,
        };
        assert_eq!(p("N*C").substitute_exprs(&b).unwrap(), p("2*B*B+2*B"));
        assert_eq!(p("(N+1)/2").substitute_exprs(&b).unwrap(), p("B"));
        assert_eq!(p("N*H/4").substitute_exprs(&b).unwrap(), p("(2*B*H)/4"));
    }

    #[test]
    fn exact_division_and_linear_solving() {
        assert_eq!(p("4*N*C").div_exact(&p("2*C")), Some(p("2*N")));
        assert_eq!(p("4*N+2").div_exact(&p("2")), Some(p("2*N+1")));
        assert_eq!(p("N+1").div_exact(&p("N")), None);
        assert_eq!(p("3*N+2").as_linear(), Some(("N", 3, 2)));
        assert_eq!(p("N*C").as_linear(), None);
    }

    #[test]
    fn rejects_bad_text() {
        for s in ["N/M", "N/0", "(N", "N+", "N$", "99999999999999999999"] {
            assert!(parse_sym_expr(s).is_err(), "{s}");
        }
    }
}
