//! [`Float`]: an f64 attribute with bit-exact equality and hashing.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::hash::{Hash, Hasher};

/// An f64 attribute that compares and hashes by its bit pattern (so `NaN == NaN`, `0.0 != -0.0`).
/// Serialized as a number when finite and as a string otherwise (`"inf"`, `"-inf"`, `"nan"`,
/// or `"nan:<bits hex>"` for other NaNs), because JSON has no NaN or infinity.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(into = "FloatRepr", try_from = "FloatRepr")]
pub struct Float(pub f64);

/// The serialized form of a [`Float`].
#[derive(Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum FloatRepr {
    Number(f64),
    Special(String),
}

impl From<Float> for FloatRepr {
    fn from(f: Float) -> FloatRepr {
        let v = f.0;
        match v {
            _ if v.is_finite() => FloatRepr::Number(v),
            f64::INFINITY => FloatRepr::Special("inf".into()),
            f64::NEG_INFINITY => FloatRepr::Special("-inf".into()),
            _ if v.to_bits() == f64::NAN.to_bits() => FloatRepr::Special("nan".into()),
            _ => FloatRepr::Special(format!("nan:{:016x}", v.to_bits())),
        }
    }
}

impl TryFrom<FloatRepr> for Float {
    type Error = String;
    fn try_from(r: FloatRepr) -> Result<Float, String> {
        let s = match r {
            FloatRepr::Number(v) => return Ok(Float(v)),
            FloatRepr::Special(s) => s,
        };
        let v = match s.as_str() {
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            "nan" => f64::NAN,
            _ => s
                .strip_prefix("nan:")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .map(f64::from_bits)
                .filter(|v| v.is_nan())
                .ok_or_else(|| format!("`{s}` is not a float (expected a number, inf, -inf or nan)"))?,
        };
        Ok(Float(v))
    }
}

impl PartialEq for Float {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Float {}
impl Hash for Float {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}
impl fmt::Display for Float {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:?}` prints the shortest string that parses back to the same f64 (keeps `.0`).
        write!(f, "{:?}", self.0)
    }
}
