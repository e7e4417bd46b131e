//! Composite ops: each decomposes into primitives (`OpDef::decompose`) and is differentiated
//! through that decomposition; the reference evaluates it natively, so decompositions are
//! checked against an independent computation. Layouts follow Paddle 2 (NCHW images, `Linear`
//! weight `[in, out]`).
//!
//! Adding a composite: define it in the file of its family (attributes with `op_struct!`, then
//! `impl OpDef`), and add its line to the table below.

mod activation;
mod attention;
mod conv;
mod einsum;
mod loss;
mod nn;
mod norm;
mod optim;
mod ordering;
mod padding;
mod pooling;
mod qlinear;
mod quant;
mod resize;
mod rnn;
mod scan;
mod select;
mod shape_of;

pub use activation::{Dropout, Gelu, LogSoftmax, Relu, Sigmoid, Silu, Softmax};
pub use attention::ScaledDotProductAttention;
pub use conv::{Conv2d, ConvTranspose, ConvWeightGrad};
pub use einsum::Einsum;
pub use loss::{CrossEntropy, Reduction};
pub use nn::{Embedding, Linear};
pub use norm::{BatchNorm, GroupNorm, InstanceNorm, LayerNorm};
pub use optim::{AdamConstants, AdamUpdate};
pub use ordering::{ArgSort, Flip, TopK};
pub use padding::{BorderPad, PadMode};
pub use pooling::{AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d, MaxPool2dGrad};
pub use qlinear::{ConvInteger, MatMulInteger, Requantize};
pub use quant::{DequantizeLinear, FakeQuant, QuantizeLinear, quant_range};
pub use resize::{CoordMode, NearestMode, Resize, ResizeMode};
pub use rnn::{GruCell, GruSeq, LstmCell, LstmSeq};
pub use scan::CumSum;
pub use select::{MaskedFill, OneHot, Trilu};
pub use shape_of::ShapeOf;

use super::op_set;
use crate::{DType, Dim, Emitter, IrError, Op, TensorType};

op_set! {
    /// Composite ops, each with a decomposition into primitives.
    pub enum Composite {
        /// `linear(x[.., in], w[in, out], b[out]?) = x @ w + b`.
        Linear,
        /// `conv2d(x[N,C,H,W], w[O,C/g,kh,kw], b[O]?)`.
        Conv2d(Conv2d),
        /// `conv_transpose(x[N,Cin,*S], w[Cin,Cout/g,*K], b[Cout]?)`.
        ConvTranspose(ConvTranspose),
        /// `conv_weight_grad(x[N,C,*S], dy[N,O,*Y])`: a convolution's weight gradient.
        ConvWeightGrad(ConvWeightGrad),
        /// `max_pool2d(x[N,C,H,W])`.
        MaxPool2d(MaxPool2d),
        /// `max_pool2d_grad(x[N,C,H,W], dy)`: max_pool2d's gradient.
        MaxPool2dGrad(MaxPool2dGrad),
        /// `avg_pool2d(x[N,C,H,W])`.
        AvgPool2d(AvgPool2d),
        /// `adaptive_avg_pool2d(x[N,C,H,W])`.
        AdaptiveAvgPool2d(AdaptiveAvgPool2d),
        /// `adaptive_max_pool2d(x[N,C,H,W])`.
        AdaptiveMaxPool2d(AdaptiveMaxPool2d),
        /// `resize(x)`: nearest / linear / cubic resampling of the trailing axes.
        Resize(Resize),
        /// `batch_norm(x, scale, bias, running_mean, running_var)`.
        BatchNorm(BatchNorm),
        /// `layer_norm(x, weight?, bias?)`.
        LayerNorm(LayerNorm),
        /// `group_norm(x, weight?, bias?)`.
        GroupNorm(GroupNorm),
        /// `instance_norm(x, weight?, bias?)`.
        InstanceNorm(InstanceNorm),
        /// `softmax(x)` along an axis.
        Softmax(Softmax),
        /// `log_softmax(x)` along an axis.
        LogSoftmax(LogSoftmax),
        /// `cross_entropy(logits[N,C], labels[N])`.
        CrossEntropy(CrossEntropy),
        /// `max(x, 0)`.
        Relu,
        /// GELU.
        Gelu(Gelu),
        /// `x * sigmoid(x)`.
        Silu,
        /// `1 / (1 + exp(-x))`.
        Sigmoid,
        /// Dropout (`upscale_in_train`).
        Dropout(Dropout),
        /// `embedding(indices, weight[V, D])`.
        Embedding,
        /// One LSTM step's gates: `(h', c')` from the gate pre-activations and `c`.
        LstmCell,
        /// One GRU step's gates: `h'` from the gate pre-activations and `h`.
        GruCell,
        /// A whole LSTM layer's recurrence over a sequence.
        LstmSeq(LstmSeq),
        /// A whole GRU layer's recurrence over a sequence.
        GruSeq(GruSeq),
        /// Scaled dot-product attention.
        ScaledDotProductAttention(ScaledDotProductAttention),
        /// Padding from the tensor's own elements (reflect, replicate, circular).
        BorderPad(BorderPad),
        /// Running sums along an axis.
        CumSum(CumSum),
        /// The k largest (smallest) elements along an axis, with their indices.
        TopK(TopK),
        /// Indices that sort an axis.
        ArgSort(ArgSort),
        /// Reverse the order along axes.
        Flip(Flip),
        /// `where(mask, value, x)`.
        MaskedFill(MaskedFill),
        /// One-hot encoding of indices.
        OneHot(OneHot),
        /// Upper or lower triangle of the last two axes (`triu`/`tril`).
        Trilu(Trilu),
        /// Einstein summation.
        Einsum(Einsum),
        /// The input's shape as a tensor.
        ShapeOf,
        /// One Adam / AdamW update of a parameter and its moments.
        AdamUpdate(AdamUpdate),
        /// `saturate(round(x / scale) + zero_point)` into i8/u8 (ONNX QuantizeLinear).
        QuantizeLinear(QuantizeLinear),
        /// `(x - zero_point) * scale` (ONNX DequantizeLinear).
        DequantizeLinear(DequantizeLinear),
        /// Quantize then dequantize, with a straight-through gradient (QAT).
        FakeQuant(FakeQuant),
        /// `(a - a_zp) @ (b - b_zp)` of 8-bit operands, in i32 (ONNX MatMulInteger).
        MatMulInteger,
        /// Convolution of 8-bit operands less their zero points, in i32 (ONNX ConvInteger).
        ConvInteger(ConvInteger),
        /// `saturate(round(f32(acc) * multiplier) + zero_point)`: i32 sums back to 8 bits.
        Requantize(Requantize),
    }
}

impl Composite {
    /// The mnemonic used in the text format.
    pub fn name(&self) -> &'static str {
        super::OpText::name(self)
    }

    /// Every composite's mnemonic, in table order (for keep-lists and listings).
    pub fn names() -> &'static [&'static str] {
        <Composite as super::OpText>::mnemonics()
    }
}

/// The parts every composite's [`super::OpDef`] shares: the family, and gradients through
/// the decomposition.
macro_rules! composite_def {
    () => {
        fn family(&self) -> $crate::ops::OpFamily {
            $crate::ops::OpFamily::Composite
        }
        fn vjp<E: $crate::Emitter>(&self, _: &mut E, _: &$crate::ops::VjpArgs<E::Value>) -> $crate::ops::Grads<E> {
            $crate::ops::def::composite_vjp::<E>($crate::ops::OpText::name(self))
        }
        fn has_vjp(&self) -> bool {
            false
        }
    };
    // A composite with a gradient rule of its own (its `vjp`, written beside).
    (with_vjp) => {
        fn family(&self) -> $crate::ops::OpFamily {
            $crate::ops::OpFamily::Composite
        }
    };
}
pub(crate) use composite_def;

// ---- builders the decompositions share, on top of [`Emitter`]'s own helpers ------------

/// Result of applying one op through an emitter.
pub(crate) type V<E> = Result<<E as Emitter>::Value, <E as Emitter>::Error>;

/// The dtype of a value.
pub(crate) fn dtype<E: Emitter>(g: &E, v: E::Value) -> DType {
    g.value_type(v).dtype
}

/// The dims of a value.
pub(crate) fn dims<E: Emitter>(g: &E, v: E::Value) -> Vec<Dim> {
    g.value_type(v).shape.0
}

/// A scalar constant with the dtype of `like`.
pub(crate) fn scalar_like<E: Emitter>(g: &mut E, like: E::Value, value: f64) -> V<E> {
    let d = dtype(g, like);
    g.add_scalar(d, value)
}

/// Strided slice with one range per axis.
pub(crate) fn slice<E: Emitter>(g: &mut E, x: E::Value, ranges: Vec<super::SliceRange>) -> V<E> {
    g.add_op1(Op::Slice(super::Slice { ranges }), &[x])
}

/// An `iota` of `shape` counting along `axis`, in `dtype`.
pub(crate) fn iota<E: Emitter>(g: &mut E, shape: Vec<Dim>, axis: usize, dtype: DType) -> V<E> {
    g.add_op1(Op::Iota(super::Iota { shape, axis, dtype }), &[])
}

/// `where(c, a, b)`.
pub(crate) fn select<E: Emitter>(g: &mut E, c: E::Value, a: E::Value, b: E::Value) -> V<E> {
    g.add_op1(Op::Where, &[c, a, b])
}

/// Reshape to `dims` (no op when the shape already matches).
pub(crate) fn reshape<E: Emitter>(g: &mut E, x: E::Value, dims: Vec<Dim>) -> V<E> {
    g.reshape(x, &crate::Shape(dims))
}

/// The smallest value of a dtype, used as the identity of max (−inf for floats).
pub(crate) fn lowest(d: DType) -> f64 {
    d.lowest()
}

/// A type error raised by a decomposition itself (operands the rule accepts but the
/// decomposition cannot express).
pub(crate) fn unsupported(op: &str, detail: String) -> IrError {
    IrError::Type {
        op: op.to_string(),
        value: "<new>".into(),
        detail,
    }
}

/// `t` is a vector `[n]` of x's dtype.
pub(crate) fn vector_of(t: &TensorType, n: &Dim, what: &str, x: &TensorType) -> Result<(), String> {
    if t.shape.0 != [n.clone()] || t.dtype != x.dtype {
        return Err(format!("{what} must be {}[{n}] for x {x}, got {t}", x.dtype));
    }
    Ok(())
}

/// Wrap one decomposed value as the op's only output.
pub(crate) fn one<E: Emitter>(r: V<E>) -> Option<Result<Vec<E::Value>, E::Error>> {
    Some(r.map(|v| vec![v]))
}
