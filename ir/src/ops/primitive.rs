//! Attribute types of the primitive op families.

use super::Float;
use serde::{Deserialize, Serialize};

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name { $($(#[$vm])* $v,)* }
        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v,)*];
            /// The mnemonic used in the text format.
            pub fn name(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }
            /// The variant with this mnemonic.
            pub fn from_name(s: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|v| v.name() == s)
            }
        }
    };
}

named_enum!(
    /// Elementwise unary ops.
    UnaryOp {
        /// `-x`
        Neg => "neg",
        /// `|x|`
        Abs => "abs",
        /// `e^x`
        Exp => "exp",
        /// natural log
        Log => "log",
        /// square root
        Sqrt => "sqrt",
        /// `1/sqrt(x)`
        Rsqrt => "rsqrt",
        /// `1/x`
        Recip => "recip",
        /// sine
        Sin => "sin",
        /// cosine
        Cos => "cos",
        /// hyperbolic tangent
        Tanh => "tanh",
        /// error function
        Erf => "erf",
        /// round toward -inf
        Floor => "floor",
        /// round toward +inf
        Ceil => "ceil",
        /// round half to even
        Round => "round",
        /// -1, 0 or 1 (0 for NaN → NaN for floats)
        Sign => "sign",
        /// logical not (bool) or bitwise not (ints)
        Not => "not",
    }
);

impl UnaryOp {
    /// True for ops defined only on floats.
    pub fn float_only(self) -> bool {
        use UnaryOp::*;
        matches!(
            self,
            Exp | Log | Sqrt | Rsqrt | Recip | Sin | Cos | Tanh | Erf | Floor | Ceil | Round
        )
    }
}

named_enum!(
    /// Elementwise binary ops (numpy broadcasting).
    BinaryOp {
        /// `a + b`
        Add => "add",
        /// `a - b`
        Sub => "sub",
        /// `a * b`
        Mul => "mul",
        /// `a / b` (ints: truncating; division by zero is a runtime error)
        Div => "div",
        /// `a ^ b`
        Pow => "pow",
        /// elementwise max (NaN propagates)
        Max => "max",
        /// elementwise min (NaN propagates)
        Min => "min",
        /// remainder with the sign of the divisor (numpy `mod`)
        Rem => "rem",
        /// `a == b` → bool
        Eq => "eq",
        /// `a != b` → bool
        Ne => "ne",
        /// `a < b` → bool
        Lt => "lt",
        /// `a <= b` → bool
        Le => "le",
        /// `a > b` → bool
        Gt => "gt",
        /// `a >= b` → bool
        Ge => "ge",
        /// logical (bool) or bitwise (ints) and
        And => "and",
        /// logical (bool) or bitwise (ints) or
        Or => "or",
        /// logical (bool) or bitwise (ints) xor
        Xor => "xor",
    }
);

impl BinaryOp {
    /// True for comparisons, whose result is bool.
    pub fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge)
    }

    /// True for logical/bitwise ops (bool or ints only).
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }

    /// True if `a op b == b op a`.
    pub fn is_commutative(self) -> bool {
        use BinaryOp::*;
        matches!(self, Add | Mul | Max | Min | Eq | Ne | And | Or | Xor)
    }
}

named_enum!(
    /// Reductions.
    ReduceOp {
        /// sum
        Sum => "reduce_sum",
        /// max
        Max => "reduce_max",
        /// min
        Min => "reduce_min",
        /// product
        Prod => "reduce_prod",
        /// arithmetic mean (floats only)
        Mean => "reduce_mean",
    }
);

named_enum!(
    /// Index-of-extremum reductions.
    ArgReduceOp {
        /// index of the max
        ArgMax => "argmax",
        /// index of the min
        ArgMin => "argmin",
    }
);

named_enum!(
    /// How [`super::Op::Scatter`] combines updates with existing values.
    ScatterReduce {
        /// The last update wins (indices should be unique).
        Replace => "replace",
        /// Updates are summed into the data.
        Add => "add",
    }
);

/// One axis of a slice: Python `start:end:step` (negative start/end count from the end;
/// out-of-range values clamp), with `step ≥ 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceRange {
    /// First index.
    pub start: i64,
    /// One past the last index (exclusive); `i64::MAX` means "to the end".
    pub end: i64,
    /// Stride, ≥ 1.
    pub step: i64,
}

impl SliceRange {
    /// The whole axis.
    pub const FULL: SliceRange = SliceRange {
        start: 0,
        end: i64::MAX,
        step: 1,
    };

    /// `start..end` with step 1.
    pub fn new(start: i64, end: i64) -> SliceRange {
        SliceRange { start, end, step: 1 }
    }

    /// True if this keeps the whole axis whatever its size.
    pub fn is_full(&self) -> bool {
        *self == Self::FULL
    }

    /// For an axis of `size`: the first index, and how many elements are taken.
    pub fn resolve(&self, size: usize) -> (usize, usize) {
        let size_i = size as i64;
        let clamp = |v: i64| if v < 0 { (v + size_i).max(0) } else { v.min(size_i) };
        let (s, e) = (clamp(self.start), clamp(self.end));
        let step = self.step.max(1);
        // (e - s) ≤ size, so this never overflows even for step = i64::MAX.
        let n = if e > s { (e - s - 1) / step + 1 } else { 0 };
        (s as usize, n as usize)
    }
}

/// A random distribution for [`super::Op::Random`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RandomDist {
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound.
        low: Float,
        /// Upper bound.
        high: Float,
    },
    /// Normal with `mean` and standard deviation `std`.
    Normal {
        /// Mean.
        mean: Float,
        /// Standard deviation.
        std: Float,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_resolve_follows_python() {
        // list(range(10))[2:8:3] == [2, 5]
        assert_eq!(
            SliceRange {
                start: 2,
                end: 8,
                step: 3
            }
            .resolve(10),
            (2, 2)
        );
        // [-3:] of 10 → 7,8,9
        assert_eq!(
            SliceRange {
                start: -3,
                end: i64::MAX,
                step: 1
            }
            .resolve(10),
            (7, 3)
        );
        // [5:2] is empty; [-20:3] clamps
        assert_eq!(SliceRange::new(5, 2).resolve(10).1, 0);
        assert_eq!(SliceRange::new(-20, 3).resolve(10), (0, 3));
        assert_eq!(SliceRange::FULL.resolve(4), (0, 4));
        assert_eq!(
            SliceRange {
                start: 0,
                end: i64::MAX,
                step: i64::MAX
            }
            .resolve(4),
            (0, 1)
        );
    }

    #[test]
    fn names_are_unique_and_parse_back() {
        for u in UnaryOp::ALL {
            assert_eq!(UnaryOp::from_name(u.name()), Some(*u));
        }
        for b in BinaryOp::ALL {
            assert_eq!(BinaryOp::from_name(b.name()), Some(*b));
        }
        assert!(BinaryOp::Lt.is_comparison() && !BinaryOp::Sub.is_commutative());
    }
}
