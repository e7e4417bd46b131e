//! Shapes with static and symbolic dimensions, tensor types, and numpy broadcasting.

use crate::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One dimension of a shape: a known size or a named symbol such as the batch dim `N`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dim {
    /// A size known when the graph is built.
    Static(usize),
    /// A size bound when the graph runs; equal names mean equal sizes.
    Sym(String),
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
            Dim::Sym(_) => None,
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
        }
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

    /// Element count if static; `None` if symbolic or if it overflows `usize`.
    pub fn num_elements(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, d| acc.checked_mul(d.as_static()?))
    }

    /// Replace symbols with sizes from `bind`; unknown symbols stay symbolic.
    pub fn bind(&self, bind: &dyn Fn(&str) -> Option<usize>) -> Shape {
        Shape(
            self.0
                .iter()
                .map(|d| match d {
                    Dim::Sym(s) => bind(s).map(Dim::Static).unwrap_or_else(|| d.clone()),
                    _ => d.clone(),
                })
                .collect(),
        )
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
}
