//! The op set. Each op is defined once, in its family's module: its typed attributes (whose
//! text form is derived from them), type rule, FLOPs, VJP, decomposition (composites) and the
//! reference evaluation ([`OpDef`]). The [`Op`] and [`Composite`] enums are generated from the
//! tables below, and with them every name list, the parser's table and the dispatch.
//!
//! | family | module | ops |
//! |---|---|---|
//! | leaves | `leaf` | input, param, constant |
//! | elementwise | `unary`, `binary`, `elementwise` | neg … not, add … xor, where, cast |
//! | reductions | `reduce` | reduce_*, argmax, argmin |
//! | movement | `movement` | reshape, permute, broadcast, slice, pad, concat |
//! | indexing | `indexing`, `sort` | gather, scatter, sort |
//! | generators | `generator` | iota, random |
//! | contractions | `contraction` | matmul, conv |
//! | communication | `collective` | all_reduce_*, all_gather, reduce_scatter, c_identity, mp_allreduce, c_split, c_concat |
//! | control flow | `control` | cond, while |
//! | composites | `composite::*` | linear, conv2d, pooling, norms, activations, losses, attention |
//!
//! Every attribute derives `Hash`/`Eq`, so passes compare ops structurally (CSE, e-graphs),
//! never through strings. Axes are normalized (non-negative) when an op is built.

mod binary;
pub mod collective;
mod composite;
mod contraction;
mod control;
mod conv_grad;
mod def;
mod elementwise;
mod float;
mod generator;
mod indexing;
mod leaf;
mod movement;
mod reduce;
pub mod rules;
pub mod sample;
mod sort;
mod unary;

pub use binary::BinaryOp;
pub use collective::{Collective, CollectiveKind, Communicator};
pub use composite::*;
pub use contraction::{Conv, MatMul};
pub use control::{Cond, While};
pub use def::{Grads, OpDef, OpText, VjpArgs};
pub use elementwise::{Cast, Where};
pub use float::Float;
pub use generator::{Iota, Random, RandomDist, random_stream};
pub use indexing::{Gather, Scatter, ScatterReduce};
pub use leaf::{Input, Param};
pub use movement::{Broadcast, Concat, Pad, Permute, Reshape, Slice, SliceRange};
pub use reduce::{ArgReduce, ArgReduceOp, Reduce, ReduceOp};
pub use sample::{Domain, Sample, SampleInput};
pub use sort::Sort;
pub use unary::UnaryOp;

pub(crate) use def::{named_enum, op_set, op_struct};

use crate::{Dim, Graph, TensorData, TensorType};
use std::fmt;

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
    /// Collectives (communication between processes).
    Communication,
}

op_set! {
    /// An operation: what a graph node computes.
    pub enum Op {
        // ---- graph boundary ---------------------------------------------------------
        /// A graph input (or a region argument), fed by the caller by name.
        Input(Input),
        /// A named parameter (weight); its value lives in the model's weights.
        Param(Param),
        /// A constant tensor stored in the graph.
        Constant(TensorData),
        // ---- primitives -------------------------------------------------------------
        /// Elementwise unary op.
        Unary(UnaryOp),
        /// Elementwise binary op with numpy broadcasting.
        Binary(BinaryOp),
        /// `where(cond, a, b)`: elementwise select with broadcasting; `cond` is bool.
        Where,
        /// Reduction over axes.
        Reduce(Reduce),
        /// Index of the max/min along one axis.
        ArgReduce(ArgReduce),
        /// Same elements, new shape.
        Reshape(Reshape),
        /// Permute axes.
        Permute(Permute),
        /// numpy `broadcast_to`.
        Broadcast(Broadcast),
        /// Strided slice.
        Slice(Slice),
        /// Constant padding.
        Pad(Pad),
        /// Concatenate along an axis.
        Concat(Concat),
        /// Gather along an axis.
        Gather(Gather),
        /// Scatter along an axis (gather's transpose).
        Scatter(Scatter),
        /// Stable sort along an axis: values and source indices.
        Sort(Sort),
        /// Convert to another dtype.
        Cast(Cast),
        /// Each element is its index along an axis.
        Iota(Iota),
        /// Counter-based random numbers.
        Random(Random),
        /// Batched matrix product.
        MatMul,
        /// N-d convolution.
        Conv(Conv),
        // ---- communication ----------------------------------------------------------
        /// A collective over a process group (all-reduce, gather, scatter, split).
        Collective(Collective),
        // ---- composites -------------------------------------------------------------
        /// A composite op with a decomposition into primitives.
        Composite(Composite),
        // ---- control flow -----------------------------------------------------------
        /// `cond(pred, args...)`: runs region 0 (then) or region 1 (else) on `args`.
        Cond,
        /// `while(init...)`: region 0 is the condition, region 1 the body.
        While,
    }
}

impl Op {
    /// The op's mnemonic in the text format (`matmul`, `reduce_sum`, `layer_norm`, ...).
    pub fn name(&self) -> &'static str {
        OpText::name(self)
    }

    /// The op's family.
    pub fn family(&self) -> OpFamily {
        OpDef::family(self)
    }

    /// True for primitives (everything but composites); leaves and control flow count as primitive.
    pub fn is_primitive(&self) -> bool {
        !matches!(self, Op::Composite(_))
    }

    /// Number of regions (sub-graphs) the op holds.
    pub fn num_regions(&self) -> usize {
        OpDef::num_regions(self)
    }

    /// Every mnemonic of the op set (for listings and "did you mean" hints).
    pub fn all_mnemonics() -> &'static [&'static str] {
        <Op as OpText>::mnemonics()
    }

    /// The op's target-shape attribute (reshape, broadcast, iota, random), if it has one: the
    /// dims that binding or renaming symbols rewrites.
    pub fn shape_attr(&self) -> Option<&[Dim]> {
        match self {
            Op::Reshape(Reshape { shape })
            | Op::Broadcast(Broadcast { shape })
            | Op::Iota(Iota { shape, .. })
            | Op::Random(Random { shape, .. }) => Some(shape),
            _ => None,
        }
    }

    /// The shape attribute, mutably (see [`Op::shape_attr`]).
    pub fn shape_attr_mut(&mut self) -> Option<&mut Vec<Dim>> {
        match self {
            Op::Reshape(Reshape { shape })
            | Op::Broadcast(Broadcast { shape })
            | Op::Iota(Iota { shape, .. })
            | Op::Random(Random { shape, .. }) => Some(shape),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Output types of `op` applied to `inputs` (with `regions` for control flow).
pub fn infer_types(op: &Op, inputs: &[TensorType], regions: &[Graph]) -> rules::R {
    if regions.len() != op.num_regions() {
        return Err(format!("expects {} regions, got {}", op.num_regions(), regions.len()));
    }
    op.infer(inputs, regions)
}

/// Estimated FLOPs of one op (multiply-add = 2); `None` when a shape is symbolic.
/// Elementwise ops count one per output element, reductions one per input element.
pub fn flops(op: &Op, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
    OpDef::flops(op, inputs, outputs)
}
