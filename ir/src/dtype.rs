//! Element types of tensors.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Boolean, stored as one byte (0 or 1).
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// True for floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// True for the 16-bit floats (f16, bf16).
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// True for integer types (signed or unsigned), not bool.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I32 | DType::I64)
    }

    /// The smallest and largest value of an integer dtype; `None` for floats and bool.
    pub fn int_range(self) -> Option<(i64, i64)> {
        Some(match self {
            DType::I8 => (i8::MIN as i64, i8::MAX as i64),
            DType::U8 => (0, u8::MAX as i64),
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            DType::I64 => (i64::MIN, i64::MAX),
            _ => return None,
        })
    }

    /// The smallest value of the dtype (−inf for floats, false for bool): the identity of max.
    pub fn lowest(self) -> f64 {
        match self.int_range() {
            Some((lo, _)) => lo as f64,
            None if self == DType::Bool => 0.0,
            None => f64::NEG_INFINITY,
        }
    }

    /// The largest value of the dtype (+inf for floats, true for bool): the identity of min.
    pub fn highest(self) -> f64 {
        match self.int_range() {
            Some((_, hi)) => hi as f64,
            None if self == DType::Bool => 1.0,
            None => f64::INFINITY,
        }
    }

    /// True for numeric types (float or integer), i.e. everything but bool.
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// The short name used in the text format (`f32`, `bf16`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error for an unknown dtype name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype `{0}` (expected one of f32, f64, f16, bf16, i8, u8, i32, i64, bool)")]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownDType(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::BF16.size_bytes(), 2);
        assert_eq!(DType::I64.size_bytes(), 8);
        assert!("f8".parse::<DType>().is_err());
        assert!(DType::F16.is_float() && !DType::Bool.is_numeric() && DType::U8.is_int());
    }
}
