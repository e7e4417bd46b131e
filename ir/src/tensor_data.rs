//! Dense tensor values on the host: constants in graphs, weights, and backend inputs/outputs.

use crate::{DType, Shape, TensorType};
use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// Largest tensor, in bytes, that oar will create from untrusted sizes (16 GiB): the cap of the
/// default memory budget ([`crate::memory::limit`]).
pub const MAX_TENSOR_BYTES: usize = 1 << 34;

/// A dense, row-major tensor with a static shape; bytes are little-endian, bool is 0/1.
/// Deserializing goes through [`TensorData::from_bytes`], so hostile input cannot build a
/// tensor whose bytes disagree with its shape.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawTensorData")]
pub struct TensorData {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Arc<Vec<u8>>,
}

/// The unchecked serialized fields of a [`TensorData`].
#[derive(Deserialize)]
struct RawTensorData {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl TryFrom<RawTensorData> for TensorData {
    type Error = TensorDataError;
    fn try_from(raw: RawTensorData) -> Result<Self, Self::Error> {
        TensorData::from_bytes(raw.dtype, raw.shape, raw.bytes)
    }
}

/// A Rust scalar type that maps to one [`DType`].
pub trait Element: Copy + Send + Sync + 'static + fmt::Debug + PartialEq {
    /// The dtype.
    const DTYPE: DType;
    /// Append the little-endian bytes.
    fn write_le(self, out: &mut Vec<u8>);
    /// Read from little-endian bytes (exactly `size_bytes` long).
    fn read_le(b: &[u8]) -> Self;
    /// Convert to f64 (bool → 0/1).
    fn to_f64(self) -> f64;
    /// Convert from f64 with Rust `as` semantics (saturating for ints; nonzero → true).
    fn from_f64(v: f64) -> Self;
    /// All values as little-endian bytes (one copy for plain-old-data types).
    fn slice_to_le_bytes(values: &[Self]) -> Vec<u8> {
        let mut out = Vec::with_capacity(std::mem::size_of_val(values));
        values.iter().for_each(|v| v.write_le(&mut out));
        out
    }
    /// Values from little-endian bytes (one copy for plain-old-data types).
    fn vec_from_le_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes
            .chunks_exact(Self::DTYPE.size_bytes())
            .map(Self::read_le)
            .collect()
    }
}

/// On little-endian targets the in-memory layout of these types is the file layout, so
/// conversions are a single `memcpy` instead of a loop over elements.
macro_rules! pod_bytes {
    () => {
        #[cfg(target_endian = "little")]
        fn slice_to_le_bytes(values: &[Self]) -> Vec<u8> {
            bytemuck::cast_slice(values).to_vec()
        }
        #[cfg(target_endian = "little")]
        fn vec_from_le_bytes(bytes: &[u8]) -> Vec<Self> {
            bytemuck::pod_collect_to_vec(bytes)
        }
    };
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element width"))
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            pod_bytes!();
        }
    };
}
element!(f32, DType::F32);
element!(f64, DType::F64);
element!(i8, DType::I8);
element!(u8, DType::U8);
element!(i32, DType::I32);
element!(i64, DType::I64);

macro_rules! half_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element width"))
            }
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            pod_bytes!();
        }
    };
}
half_element!(f16, DType::F16);
half_element!(bf16, DType::BF16);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn read_le(b: &[u8]) -> Self {
        b[0] != 0
    }
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
}

/// Why bytes and a shape do not make a tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorDataError {
    /// The byte count does not match the shape and dtype.
    #[error("{dtype}{shape:?} needs {expected} bytes, got {got}")]
    SizeMismatch {
        /// Element type.
        dtype: DType,
        /// Shape.
        shape: Vec<usize>,
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The shape's size overflows or exceeds the memory budget ([`crate::memory::limit`]).
    #[error("{dtype}{shape:?} is too large: {} bytes, the memory limit is {limit} bytes ({})", bytes.map_or("more than 2^64".to_string(), |b| b.to_string()), crate::memory::limit_source())]
    TooLarge {
        /// Element type.
        dtype: DType,
        /// Shape.
        shape: Vec<usize>,
        /// Its size in bytes (`None`: more than `usize` holds).
        bytes: Option<usize>,
        /// The memory limit it exceeds.
        limit: u64,
    },
    /// A bool tensor holds a byte other than 0 or 1.
    #[error("bool element {index} is the byte {byte}, not 0 or 1")]
    NotBool {
        /// Element index.
        index: usize,
        /// The byte found.
        byte: u8,
    },
    /// Asked for elements of the wrong type.
    #[error("tensor holds {actual}, not {requested}")]
    WrongDType {
        /// The tensor's dtype.
        actual: DType,
        /// The dtype asked for.
        requested: DType,
    },
}

/// Bytes needed for `shape` of `dtype`, checked against overflow and the memory budget
/// ([`crate::memory::limit`]).
pub fn checked_byte_len(dtype: DType, shape: &[usize]) -> Result<usize, TensorDataError> {
    let bytes = shape.iter().try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d));
    let limit = crate::memory::limit();
    match bytes {
        Some(n) if n as u64 <= limit => Ok(n),
        _ => Err(TensorDataError::TooLarge {
            dtype,
            shape: shape.to_vec(),
            bytes,
            limit,
        }),
    }
}

impl TensorData {
    /// The bytes, taken without a copy when no other `TensorData` shares them (else `self`
    /// back): how a runtime reuses the allocation of an output its caller has let go of.
    pub fn try_into_bytes(self) -> Result<Vec<u8>, TensorData> {
        let TensorData { dtype, shape, bytes } = self;
        Arc::try_unwrap(bytes).map_err(|bytes| TensorData { dtype, shape, bytes })
    }

    /// A tensor from raw little-endian bytes; checks the length.
    pub fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Result<Self, TensorDataError> {
        let expected = checked_byte_len(dtype, &shape)?;
        if bytes.len() != expected {
            return Err(TensorDataError::SizeMismatch {
                dtype,
                shape,
                expected,
                got: bytes.len(),
            });
        }
        // A byte above 1 has a bit above bit 0: one OR over all bytes (a vector loop) finds
        // whether there is one, a search only then where.
        if dtype == DType::Bool
            && bytes.iter().fold(0u8, |acc, &b| acc | b) > 1
            && let Some((index, &byte)) = bytes.iter().enumerate().find(|(_, b)| **b > 1)
        {
            return Err(TensorDataError::NotBool { index, byte });
        }
        Ok(TensorData {
            dtype,
            shape,
            bytes: Arc::new(bytes),
        })
    }

    /// A tensor from elements; checks the count.
    pub fn from_vec<T: Element>(shape: Vec<usize>, values: Vec<T>) -> Result<Self, TensorDataError> {
        Self::from_bytes(T::DTYPE, shape, T::slice_to_le_bytes(&values))
    }

    /// A scalar (shape `[]`).
    pub fn scalar<T: Element>(v: T) -> Self {
        Self::from_vec(vec![], vec![v]).expect("one element fits a scalar")
    }

    /// A tensor of `dtype` filled with `value` (converted with `as` semantics).
    pub fn full(dtype: DType, shape: Vec<usize>, value: f64) -> Result<Self, TensorDataError> {
        let n = checked_byte_len(dtype, &shape)? / dtype.size_bytes().max(1);
        let mut one = Vec::new();
        write_f64_as(dtype, value, &mut one);
        Self::from_bytes(dtype, shape, one.repeat(n))
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Static shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The tensor type (static shape).
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype, Shape::of(&self.shape))
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The raw bytes for writing in place (copied first when another value shares them).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        Arc::make_mut(&mut self.bytes).as_mut_slice()
    }

    /// The same data with another shape of equal element count.
    pub fn reshaped(&self, shape: Vec<usize>) -> Result<Self, TensorDataError> {
        let expected = checked_byte_len(self.dtype, &shape)?;
        if expected != self.bytes.len() {
            return Err(TensorDataError::SizeMismatch {
                dtype: self.dtype,
                shape,
                expected,
                got: self.bytes.len(),
            });
        }
        Ok(TensorData {
            dtype: self.dtype,
            shape,
            bytes: self.bytes.clone(),
        })
    }

    /// The elements as `T`; `T` must be the tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, TensorDataError> {
        if T::DTYPE != self.dtype {
            return Err(TensorDataError::WrongDType {
                actual: self.dtype,
                requested: T::DTYPE,
            });
        }
        Ok(T::vec_from_le_bytes(&self.bytes))
    }

    /// Every element converted to f64 (any dtype).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        // One typed loop per dtype (no per-element dispatch): optimizers convert every step.
        fn conv<T: Element>(b: &[u8]) -> Vec<f64> {
            b.chunks_exact(std::mem::size_of::<T>())
                .map(|c| T::read_le(c).to_f64())
                .collect()
        }
        by_dtype!(self.dtype, conv, &self.bytes)
    }

    /// A tensor of `dtype` from f64 values (converted with `as` semantics).
    pub fn from_f64_slice(dtype: DType, shape: Vec<usize>, values: &[f64]) -> Result<Self, TensorDataError> {
        fn conv<T: Element>(values: &[f64]) -> Vec<u8> {
            let typed: Vec<T> = values.iter().map(|&v| T::from_f64(v)).collect();
            T::slice_to_le_bytes(&typed)
        }
        Self::from_bytes(dtype, shape, by_dtype!(dtype, conv, values))
    }
}

/// `f::<T>(args)` for the element type `T` of `dtype`.
macro_rules! by_dtype {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            DType::I8 => $f::<i8>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::Bool => $f::<bool>($($arg),*),
        }
    };
}
use by_dtype;

/// Read one element of `dtype` from little-endian bytes as f64.
pub fn read_as_f64(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::read_le(b).to_f64(),
        DType::F64 => f64::read_le(b),
        DType::F16 => f16::read_le(b).to_f64(),
        DType::BF16 => bf16::read_le(b).to_f64(),
        DType::I8 => i8::read_le(b).to_f64(),
        DType::U8 => u8::read_le(b).to_f64(),
        DType::I32 => i32::read_le(b).to_f64(),
        DType::I64 => i64::read_le(b).to_f64(),
        DType::Bool => bool::read_le(b).to_f64(),
    }
}

/// Append `v` converted to `dtype` as little-endian bytes.
pub fn write_f64_as(dtype: DType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => f32::from_f64(v).write_le(out),
        DType::F64 => v.write_le(out),
        DType::F16 => f16::from_f64(v).write_le(out),
        DType::BF16 => bf16::from_f64(v).write_le(out),
        DType::I8 => i8::from_f64(v).write_le(out),
        DType::U8 => u8::from_f64(v).write_le(out),
        DType::I32 => i32::from_f64(v).write_le(out),
        DType::I64 => i64::from_f64(v).write_le(out),
        DType::Bool => bool::from_f64(v).write_le(out),
    }
}

/// Store `v` converted to `dtype` (as [`write_f64_as`]) into the element slice `out`, without
/// allocating (per-element loops use it).
pub fn store_f64_as(dtype: DType, v: f64, out: &mut [u8]) {
    fn put<const N: usize>(out: &mut [u8], b: [u8; N]) {
        out[..N].copy_from_slice(&b);
    }
    match dtype {
        DType::F32 => put(out, f32::from_f64(v).to_le_bytes()),
        DType::F64 => put(out, v.to_le_bytes()),
        DType::F16 => put(out, f16::from_f64(v).to_le_bytes()),
        DType::BF16 => put(out, bf16::from_f64(v).to_le_bytes()),
        DType::I8 => put(out, i8::from_f64(v).to_le_bytes()),
        DType::U8 => put(out, u8::from_f64(v).to_le_bytes()),
        DType::I32 => put(out, i32::from_f64(v).to_le_bytes()),
        DType::I64 => put(out, i64::from_f64(v).to_le_bytes()),
        DType::Bool => put(out, [u8::from(bool::from_f64(v))]),
    }
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vals = self.to_f64_vec();
        let shown: Vec<_> = vals.iter().take(8).collect();
        write!(f, "TensorData({}{:?}, {:?}", self.dtype, self.shape, shown)?;
        if vals.len() > 8 {
            write!(f, " ... {} elements", vals.len())?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_checks() {
        let t = TensorData::from_vec(vec![2, 2], vec![1.0f32, -2.5, 3.0, 4.0]).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, -2.5, 3.0, 4.0]);
        assert_eq!(t.to_f64_vec(), vec![1.0, -2.5, 3.0, 4.0]);
        assert!(t.to_vec::<f64>().is_err());
        assert!(TensorData::from_vec(vec![3], vec![1i64, 2]).is_err());
        assert!(TensorData::from_bytes(DType::F32, vec![usize::MAX, 2], vec![]).is_err());
        let h = TensorData::from_f64_slice(DType::BF16, vec![2], &[1.5, -3.0]).unwrap();
        assert_eq!(h.to_f64_vec(), vec![1.5, -3.0]);
        let b = TensorData::full(DType::Bool, vec![3], 2.0).unwrap();
        assert_eq!(b.bytes(), &[1, 1, 1]);
        assert!(matches!(
            TensorData::from_bytes(DType::Bool, vec![2], vec![1, 7]),
            Err(TensorDataError::NotBool { index: 1, byte: 7 })
        ));
        assert_eq!(t.reshaped(vec![4]).unwrap().shape(), &[4]);
    }
}
