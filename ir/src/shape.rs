//! Shapes with static and symbolic dimensions, tensor types, and numpy broadcasting.

use crate::DType;
use crate::symbolic::{SymError, SymExpr, parse_sym_expr};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One dimension of a shape: a known size, a named symbol such as the batch dim `N`, or an
/// expression of symbols (`N*C`, `N+1`, `N/2`; see [`crate::symbolic`]).
///
/// Dims are kept canonical: an expression that is a constant is `Static`, one that is a lone
/// symbol is `Sym`, so equal sizes compare equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dim {
    /// A size known when the graph is built.
    Static(usize),
    /// A size bound when the graph runs; equal names mean equal sizes.
    Sym(String),
    /// A size computed from symbols (never a constant or a lone symbol).
    Expr(SymExpr),
}

impl Dim {
    /// A symbolic dim with this name.
    pub fn sym(name: &str) -> Dim {
        Dim::Sym(name.to_string())
    }

    /// The static size, if known.
    pub fn as_static(&self) -> Option<usize> {
        match self {
            Dim::Static(n) => Some(*n),
            _ => None,
        }
    }

    /// True unless the size is known when the graph is built.
    pub fn is_symbolic(&self) -> bool {
        !matches!(self, Dim::Static(_))
    }

    /// The dim as a polynomial.
    pub fn to_expr(&self) -> SymExpr {
        match self {
            Dim::Static(n) => SymExpr::constant(i64::try_from(*n).unwrap_or(i64::MAX)),
            Dim::Sym(s) => SymExpr::sym(s),
            Dim::Expr(e) => e.clone(),
        }
    }

    /// The canonical dim of an expression; an error if it is a negative constant.
    pub fn from_expr(e: SymExpr) -> Result<Dim, SymError> {
        if let Some(c) = e.as_constant() {
            return usize::try_from(c)
                .map(Dim::Static)
                .map_err(|_| format!("size {c} is negative"));
        }
        Ok(match e.as_sym() {
            Some(s) => Dim::sym(s),
            None => Dim::Expr(e),
        })
    }

    /// `self · other` (`N*C`).
    pub fn mul(&self, other: &Dim) -> Result<Dim, SymError> {
        if let (Dim::Static(a), Dim::Static(b)) = (self, other) {
            return a
                .checked_mul(*b)
                .map(Dim::Static)
                .ok_or_else(|| format!("{a}*{b} overflows"));
        }
        Dim::from_expr(self.to_expr().mul(&other.to_expr())?)
    }

    /// `self + other` (`N+1`).
    pub fn add(&self, other: &Dim) -> Result<Dim, SymError> {
        if let (Dim::Static(a), Dim::Static(b)) = (self, other) {
            return a
                .checked_add(*b)
                .map(Dim::Static)
                .ok_or_else(|| format!("{a}+{b} overflows"));
        }
        Dim::from_expr(self.to_expr().add(&other.to_expr())?)
    }

    /// `self / other` when it divides exactly as a polynomial (`(N*C)/C = N`), else `None`.
    pub fn div_exact(&self, other: &Dim) -> Option<Dim> {
        Dim::from_expr(self.to_expr().div_exact(&other.to_expr())?).ok()
    }

    /// `floor(self / k)` (`N/2`).
    pub fn floor_div(&self, k: usize) -> Result<Dim, SymError> {
        let k = i64::try_from(k).map_err(|_| format!("divisor {k} is too large"))?;
        Dim::from_expr(self.to_expr().floor_div(k)?)
    }

    /// The product of `dims` (1 for none).
    pub fn product<'a>(dims: impl IntoIterator<Item = &'a Dim>) -> Result<Dim, SymError> {
        dims.into_iter().try_fold(Dim::Static(1), |acc, d| acc.mul(d))
    }

    /// The symbols the dim mentions.
    pub fn symbols(&self) -> Vec<String> {
        match self {
            Dim::Static(_) => Vec::new(),
            Dim::Sym(s) => vec![s.clone()],
            Dim::Expr(e) => e.symbols(),
        }
    }

    /// The size with symbols bound by `bind`; `None` if one is unbound (or the value is out of
    /// range).
    pub fn eval(&self, bind: &dyn Fn(&str) -> Option<usize>) -> Option<usize> {
        match self {
            Dim::Static(n) => Some(*n),
            Dim::Sym(s) => bind(s),
            Dim::Expr(e) => usize::try_from(e.eval(&|s| bind(s).and_then(|v| i64::try_from(v).ok()))?).ok(),
        }
    }

    /// The dim with the symbols `bind` knows replaced by their sizes, simplified.
    pub fn bind(&self, bind: &dyn Fn(&str) -> Option<usize>) -> Dim {
        match self {
            Dim::Static(_) => self.clone(),
            Dim::Sym(s) => bind(s).map_or_else(|| self.clone(), Dim::Static),
            Dim::Expr(e) => e
                .substitute(&|s| bind(s).and_then(|v| i64::try_from(v).ok()))
                .ok()
                .and_then(|e| Dim::from_expr(e).ok())
                .unwrap_or_else(|| self.clone()),
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Static(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
            Dim::Expr(e) => write!(f, "{e}"),
        }
    }
}

impl std::str::FromStr for Dim {
    type Err = SymError;

    /// `3`, `N`, `N*C`, `(N+1)/2`.
    fn from_str(s: &str) -> Result<Dim, SymError> {
        Dim::from_expr(parse_sym_expr(s)?)
    }
}

/// Symbol bindings of a run: name → size.
pub type Bindings = std::collections::BTreeMap<String, usize>;

/// Bind the symbols of `dims` from the actual `sizes` (extending `binds`) and check every dim:
/// lone symbols bind directly, an expression linear in its one unbound symbol (`2*N+1`) is
/// solved for it, and the rest must evaluate to the actual size. The error names the axis.
pub fn bind_dims(dims: &[Dim], sizes: &[usize], binds: &mut Bindings) -> Result<(), String> {
    if dims.len() != sizes.len() {
        return Err(format!("rank {} where {} axes are expected", sizes.len(), dims.len()));
    }
    let mut pending: Vec<usize> = (0..dims.len()).collect();
    loop {
        let before = pending.len();
        let mut still = Vec::new();
        for i in pending {
            let (d, n) = (&dims[i], sizes[i]);
            let mismatch = || format!("axis {i} is {n} where {d} is expected");
            match d {
                Dim::Static(k) if *k != n => return Err(mismatch()),
                Dim::Static(_) => {}
                Dim::Sym(s) => match binds.get(s) {
                    Some(&b) if b != n => return Err(format!("axis {i} is {n} but {s} = {b} elsewhere")),
                    Some(_) => {}
                    None => {
                        binds.insert(s.clone(), n);
                    }
                },
                Dim::Expr(e) => {
                    let known = |s: &str| binds.get(s).and_then(|&v| i64::try_from(v).ok());
                    let rest = e.substitute(&known)?;
                    if let Some(v) = rest.as_constant() {
                        if i64::try_from(n) != Ok(v) {
                            return Err(mismatch());
                        }
                    } else if let Some((s, a, b)) = rest.as_linear() {
                        let t = i64::try_from(n).map_err(|_| mismatch())? - b;
                        if t % a != 0 || t / a < 0 {
                            return Err(mismatch());
                        }
                        binds.insert(s.to_string(), (t / a) as usize);
                    } else {
                        still.push(i);
                    }
                }
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        if still.len() == before {
            let i = still[0];
            return Err(format!(
                "axis {i} ({}) does not determine its symbols; bind them through another input",
                dims[i]
            ));
        }
        pending = still;
    }
}

/// A shape: one [`Dim`] per axis; the empty shape is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// A fully static shape.
    pub fn of(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Static(d)).collect())
    }

    /// The scalar shape `[]`.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The dims.
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    /// All dims as sizes, if every dim is static.
    pub fn as_static(&self) -> Option<Vec<usize>> {
        self.0.iter().map(Dim::as_static).collect()
    }

    /// True when every dim is static.
    pub fn is_static(&self) -> bool {
        self.0.iter().all(|d| matches!(d, Dim::Static(_)))
    }

    /// The element count as a dim (`N*784`).
    pub fn num_elements_dim(&self) -> Result<Dim, SymError> {
        Dim::product(&self.0)
    }

    /// Element count if static; `None` if symbolic or if it overflows `usize`.
    pub fn num_elements(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, d| acc.checked_mul(d.as_static()?))
    }

    /// Replace symbols with sizes from `bind` (evaluating expressions); unknown symbols stay.
    pub fn bind(&self, bind: &dyn Fn(&str) -> Option<usize>) -> Shape {
        Shape(self.0.iter().map(|d| d.bind(bind)).collect())
    }
}

impl From<Vec<Dim>> for Shape {
    fn from(v: Vec<Dim>) -> Shape {
        Shape(v)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The type of a value: element type and shape, printed as `f32[N,784]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type from a dtype and dims.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    /// A static-shaped tensor type.
    pub fn of(dtype: DType, dims: &[usize]) -> TensorType {
        TensorType::new(dtype, Shape::of(dims))
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// Broadcast two shapes with numpy's rules (align right; equal sizes, or one side 1).
///
/// A symbolic dim broadcasts with an equal symbol or with 1; against any other size it is an
/// error, because the rule cannot be checked until the symbol is bound.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Result<Shape, String> {
    let rank = a.rank().max(b.rank());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = (i + a.rank()).checked_sub(rank).map(|j| &a.0[j]);
        let db = (i + b.rank()).checked_sub(rank).map(|j| &b.0[j]);
        let d = match (da, db) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(Dim::Static(1)), Some(y)) => y.clone(),
            (Some(x), Some(Dim::Static(1))) => x.clone(),
            _ => return Err(format!("shapes {a} and {b} do not broadcast (axis {i})")),
        };
        out.push(d);
    }
    Ok(Shape(out))
}

/// True if `from` broadcasts to exactly `to` (numpy `broadcast_to`).
pub fn broadcasts_to(from: &Shape, to: &Shape) -> bool {
    from.rank() <= to.rank() && broadcast_shapes(from, to).is_ok_and(|s| &s == to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[&str]) -> Shape {
        Shape(
            d.iter()
                .map(|x| x.parse::<usize>().map(Dim::Static).unwrap_or(Dim::sym(x)))
                .collect(),
        )
    }

    #[test]
    fn numpy_broadcasting() {
        assert_eq!(broadcast_shapes(&s(&["3", "1"]), &s(&["4"])).unwrap(), s(&["3", "4"]));
        assert_eq!(
            broadcast_shapes(&s(&["N", "1", "5"]), &s(&["7", "1"])).unwrap(),
            s(&["N", "7", "5"])
        );
        assert_eq!(broadcast_shapes(&s(&[]), &s(&["2", "2"])).unwrap(), s(&["2", "2"]));
        assert!(broadcast_shapes(&s(&["3"]), &s(&["4"])).is_err());
        assert!(broadcast_shapes(&s(&["N"]), &s(&["4"])).is_err());
        assert!(broadcast_shapes(&s(&["N"]), &s(&["M"])).is_err());
        let e = broadcast_shapes(&s(&["2", "3"]), &s(&["4", "3"])).unwrap_err();
        assert!(e.contains("[2,3]") && e.contains("[4,3]"), "{e}");
        assert!(broadcasts_to(&s(&["1", "3"]), &s(&["N", "3"])));
        assert!(!broadcasts_to(&s(&["2", "3"]), &s(&["3"])));
    }

    #[test]
    fn display_and_counts() {
        let t = TensorType::new(DType::F32, s(&["N", "784"]));
        assert_eq!(t.to_string(), "f32[N,784]");
        assert_eq!(Shape::of(&[2, 3, 4]).num_elements(), Some(24));
        assert_eq!(s(&["N", "3"]).num_elements(), None);
        assert_eq!(Shape::of(&[usize::MAX, 3]).num_elements(), None);
        assert_eq!(s(&["N", "3"]).bind(&|n| (n == "N").then_some(8)), Shape::of(&[8, 3]));
    }

    #[test]
    fn binding_solves_and_checks_expressions() {
        let d = |x: &str| x.parse::<Dim>().unwrap();
        let mut b = Bindings::new();
        bind_dims(&[d("2*N+1"), d("N*C"), d("C")], &[7, 12, 4], &mut b).unwrap();
        assert_eq!((b["N"], b["C"]), (3, 4));
        assert!(
            bind_dims(&[d("N"), d("N+1")], &[3, 5], &mut Bindings::new())
                .unwrap_err()
                .contains("axis 1")
        );
        assert!(bind_dims(&[d("2*N")], &[5], &mut Bindings::new()).is_err());
        assert!(
            bind_dims(&[d("N*C")], &[6], &mut Bindings::new())
                .unwrap_err()
                .contains("does not determine")
        );
        assert_eq!(d("N*C").eval(&|s| b.get(s).copied()), Some(12));
        assert_eq!(d("N/2").bind(&|s| b.get(s).copied()), Dim::Static(1));
    }
}
