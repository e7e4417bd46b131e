//! The op set: graph-boundary ops, primitives (grouped in families), composites and control flow.
//!
//! Every attribute derives `Hash`/`Eq`, so passes compare ops structurally (CSE, e-graphs),
//! never through strings. Axes are normalized (non-negative) when an op is built.

mod composite;
mod flops;
mod infer;
mod infer_composite;
mod primitive;

pub use composite::{Composite, Reduction};
pub use flops::flops;
pub use infer::infer_types;
pub use primitive::{ArgReduceOp, BinaryOp, RandomDist, ReduceOp, ScatterReduce, SliceRange, UnaryOp};

use crate::{DType, Dim, TensorData};
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

/// An operation: what a graph node computes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    // ---- graph boundary -------------------------------------------------------------
    /// A graph input (or a region argument), fed by the caller by name.
    Input {
        /// The name callers use.
        name: String,
        /// Its declared type.
        ty: crate::TensorType,
    },
    /// A named parameter (weight); its value lives in the model's weights.
    Param {
        /// The weight's name (`fc1.weight`).
        name: String,
        /// Its declared type.
        ty: crate::TensorType,
    },
    /// A constant tensor stored in the graph.
    Constant(TensorData),

    // ---- primitives -----------------------------------------------------------------
    /// Elementwise unary op.
    Unary(UnaryOp),
    /// Elementwise binary op with numpy broadcasting.
    Binary(BinaryOp),
    /// `where(cond, a, b)`: elementwise select with broadcasting; `cond` is bool.
    Where,
    /// Reduction over `axes` (sorted, unique).
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Axes reduced.
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keepdim: bool,
    },
    /// Index of the max/min along one axis (first occurrence), as i64.
    ArgReduce {
        /// ArgMax or ArgMin.
        op: ArgReduceOp,
        /// Axis reduced.
        axis: usize,
        /// Keep the axis as size 1.
        keepdim: bool,
    },
    /// Same elements, new shape (equal element count).
    Reshape {
        /// Target shape.
        shape: Vec<Dim>,
    },
    /// Permute axes: output axis `i` is input axis `perm[i]`.
    Permute {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// numpy `broadcast_to`.
    Broadcast {
        /// Target shape.
        shape: Vec<Dim>,
    },
    /// Strided slice, one range per axis (Python semantics, step ≥ 1).
    Slice {
        /// One range per input axis.
        ranges: Vec<SliceRange>,
    },
    /// Constant padding; `before[i]`/`after[i]` elements on axis `i`.
    Pad {
        /// Elements added before each axis.
        before: Vec<usize>,
        /// Elements added after each axis.
        after: Vec<usize>,
        /// Fill value.
        value: Float,
    },
    /// Concatenate all inputs along `axis`.
    Concat {
        /// The axis.
        axis: usize,
    },
    /// `gather(data, indices)` along `axis` (ONNX Gather): output shape is
    /// `data[..axis] ++ indices ++ data[axis+1..]`; negative indices count from the end.
    Gather {
        /// The axis indexed.
        axis: usize,
    },
    /// `scatter(data, indices, updates)`, the transpose of [`Op::Gather`]: `updates` has
    /// gather's output shape; each slice is written to (or added into) `data` along `axis`.
    Scatter {
        /// The axis indexed.
        axis: usize,
        /// Replace or accumulate.
        reduce: ScatterReduce,
    },
    /// Convert elements to another dtype (float→int truncates toward zero, saturating).
    Cast {
        /// Target dtype.
        to: DType,
    },
    /// `iota`: each element is its index along `axis`.
    Iota {
        /// Output shape.
        shape: Vec<Dim>,
        /// Axis whose index is the value.
        axis: usize,
        /// Output dtype.
        dtype: DType,
    },
    /// Random numbers from a seeded, counter-based generator.
    Random {
        /// The distribution.
        dist: RandomDist,
        /// Output shape.
        shape: Vec<Dim>,
        /// Output dtype (a float type).
        dtype: DType,
        /// The seed; the same seed gives the same numbers on every backend.
        seed: u64,
    },
    /// Batched matrix product `[.., M, K] x [.., K, N] -> [.., M, N]`, batch dims broadcast.
    MatMul,
    /// N-d convolution (cross-correlation), no bias: `x[N, C, *S]`, `w[O, C/groups, *K]`.
    Conv {
        /// Stride per spatial axis.
        stride: Vec<usize>,
        /// Padding before each spatial axis.
        pad_before: Vec<usize>,
        /// Padding after each spatial axis.
        pad_after: Vec<usize>,
        /// Dilation per spatial axis.
        dilation: Vec<usize>,
        /// Number of groups (C and O divisible by it).
        groups: usize,
    },

    // ---- composites -----------------------------------------------------------------
    /// A composite op with a decomposition into primitives.
    Composite(Composite),

    // ---- control flow ---------------------------------------------------------------
    /// `cond(pred, args...)`: runs region 0 (then) or region 1 (else) on `args`; both
    /// regions return the same types.
    Cond,
    /// `while(init...)`: region 0 maps the carried values to a bool scalar; while true,
    /// region 1 maps carried values to new carried values.
    While,
}

/// Which family an op belongs to, for passes that treat a family alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpFamily {
    /// Input, Param, Constant.
    Leaf,
    /// Unary, Binary, Where, Cast.
    Elementwise,
    /// Reduce, ArgReduce.
    Reduction,
    /// Reshape, Permute, Broadcast, Slice, Pad, Concat.
    Movement,
    /// Gather, Scatter.
    Indexing,
    /// Iota, Random.
    Generator,
    /// MatMul, Conv.
    Contraction,
    /// Composite ops.
    Composite,
    /// Cond, While.
    ControlFlow,
}

impl Op {
    /// The op's family.
    pub fn family(&self) -> OpFamily {
        use Op::*;
        match self {
            Input { .. } | Param { .. } | Constant(_) => OpFamily::Leaf,
            Unary(_) | Binary(_) | Where | Cast { .. } => OpFamily::Elementwise,
            Reduce { .. } | ArgReduce { .. } => OpFamily::Reduction,
            Reshape { .. } | Permute { .. } | Broadcast { .. } | Slice { .. } | Pad { .. } | Concat { .. } => {
                OpFamily::Movement
            }
            Gather { .. } | Scatter { .. } => OpFamily::Indexing,
            Iota { .. } | Random { .. } => OpFamily::Generator,
            MatMul | Conv { .. } => OpFamily::Contraction,
            Composite(_) => OpFamily::Composite,
            Cond | While => OpFamily::ControlFlow,
        }
    }

    /// True for primitives (everything but composites); leaves and control flow count as primitive.
    pub fn is_primitive(&self) -> bool {
        !matches!(self, Op::Composite(_))
    }

    /// The op's target-shape attribute (reshape, broadcast, iota, random), if it has one: the
    /// dims that binding or renaming symbols rewrites.
    pub fn shape_attr_mut(&mut self) -> Option<&mut Vec<Dim>> {
        match self {
            Op::Reshape { shape } | Op::Broadcast { shape } | Op::Iota { shape, .. } | Op::Random { shape, .. } => {
                Some(shape)
            }
            _ => None,
        }
    }

    /// Number of regions (sub-graphs) the op holds.
    pub fn num_regions(&self) -> usize {
        match self {
            Op::Cond | Op::While => 2,
            _ => 0,
        }
    }

    /// The op's mnemonic in the text format (`matmul`, `reduce_sum`, `layer_norm`, ...).
    pub fn name(&self) -> &'static str {
        use Op::*;
        match self {
            Input { .. } => "input",
            Param { .. } => "param",
            Constant(_) => "constant",
            Unary(u) => u.name(),
            Binary(b) => b.name(),
            Where => "where",
            Reduce { op, .. } => op.name(),
            ArgReduce { op, .. } => op.name(),
            Reshape { .. } => "reshape",
            Permute { .. } => "permute",
            Broadcast { .. } => "broadcast",
            Slice { .. } => "slice",
            Pad { .. } => "pad",
            Concat { .. } => "concat",
            Gather { .. } => "gather",
            Scatter { .. } => "scatter",
            Cast { .. } => "cast",
            Iota { .. } => "iota",
            Random { .. } => "random",
            MatMul => "matmul",
            Conv { .. } => "conv",
            Composite(c) => c.name(),
            Cond => "cond",
            While => "while",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
