//! The import table: every ONNX op type oar maps, each with its converter — the one place an
//! op's import is defined. Dispatch and [`supported_ops`] come from it; a converter returns one
//! oar value per ONNX output.

use crate::ops::{NodeCx, R};
use crate::ops_elementwise as ew;
use crate::ops_nn as nn;
use crate::ops_rnn::{self as rnn, Kind};
use crate::ops_shape::{self as shape, Reduction, plain};
use crate::ops_vision as vision;
use oar_ir::ops::{ArgReduceOp, BinaryOp as B, ReduceOp, UnaryOp as U};
use oar_ir::{Composite, Op, ValueId};

/// A converter: the node (in its context) to oar values, one per ONNX output.
pub(crate) type Convert = fn(&mut NodeCx<'_>) -> R<Vec<ValueId>>;

fn one(v: R<ValueId>) -> R<Vec<ValueId>> {
    v.map(|v| vec![v])
}

/// Every default-domain ONNX op type oar imports, in alphabetical order.
const TABLE: &[(&str, Convert)] = &[
    ("Abs", |cx| one(cx.unary(U::Abs))),
    ("Add", |cx| one(cx.binary(B::Add))),
    ("And", |cx| one(cx.binary(B::And))),
    ("ArgMax", |cx| one(cx.arg_reduce(ArgReduceOp::ArgMax))),
    ("ArgMin", |cx| one(cx.arg_reduce(ArgReduceOp::ArgMin))),
    ("AveragePool", |cx| one(nn::pool(cx, false))),
    ("BatchNormalization", |cx| one(nn::batch_norm(cx))),
    ("Cast", |cx| one(ew::cast(cx))),
    ("CastLike", |cx| one(ew::cast_like(cx))),
    ("Ceil", |cx| one(cx.unary(U::Ceil))),
    ("Celu", |cx| one(nn::activation(cx, "Celu"))),
    ("Clip", |cx| one(nn::clip(cx))),
    ("Concat", |cx| one(shape::concat(cx))),
    ("Constant", |cx| one(cx.constant())),
    ("ConstantOfShape", |cx| one(ew::constant_of_shape(cx))),
    ("Conv", |cx| one(nn::conv(cx))),
    ("ConvTranspose", |cx| one(vision::conv_transpose(cx))),
    ("Cos", |cx| one(cx.unary(U::Cos))),
    ("Cosh", |cx| one(nn::activation(cx, "Cosh"))),
    ("CumSum", |cx| one(vision::cumsum(cx))),
    ("Div", |cx| one(cx.binary(B::Div))),
    ("Dropout", nn::dropout),
    ("Einsum", |cx| one(vision::einsum(cx))),
    ("Elu", |cx| one(nn::activation(cx, "Elu"))),
    ("Equal", |cx| one(cx.binary(B::Eq))),
    ("Erf", |cx| one(cx.unary(U::Erf))),
    ("Exp", |cx| one(cx.unary(U::Exp))),
    ("Expand", |cx| one(shape::expand(cx))),
    ("Flatten", |cx| one(shape::flatten(cx))),
    ("Floor", |cx| one(cx.unary(U::Floor))),
    ("Gather", |cx| one(shape::gather(cx))),
    ("Gelu", |cx| one(nn::gelu(cx))),
    ("Gemm", |cx| one(nn::gemm(cx))),
    ("GlobalAveragePool", |cx| one(nn::global_pool(cx, ReduceOp::Mean))),
    ("GlobalMaxPool", |cx| one(nn::global_pool(cx, ReduceOp::Max))),
    ("Greater", |cx| one(cx.binary(B::Gt))),
    ("GreaterOrEqual", |cx| one(cx.binary(B::Ge))),
    ("GroupNormalization", |cx| one(vision::group_norm(cx))),
    ("GRU", |cx| rnn::convert(cx, Kind::Gru)),
    ("HardSigmoid", |cx| one(nn::activation(cx, "HardSigmoid"))),
    ("HardSwish", |cx| one(nn::activation(cx, "HardSwish"))),
    ("Identity", |cx| one(cx.input(0))),
    ("InstanceNormalization", |cx| one(vision::instance_norm(cx))),
    ("LayerNormalization", |cx| one(nn::layer_norm(cx))),
    ("LeakyRelu", |cx| one(nn::activation(cx, "LeakyRelu"))),
    ("Less", |cx| one(cx.binary(B::Lt))),
    ("LessOrEqual", |cx| one(cx.binary(B::Le))),
    ("Log", |cx| one(cx.unary(U::Log))),
    ("LogSoftmax", |cx| one(nn::softmax(cx, true))),
    ("LSTM", |cx| rnn::convert(cx, Kind::Lstm)),
    ("MatMul", |cx| one(nn::matmul(cx))),
    ("Max", |cx| one(ew::variadic(cx, B::Max, false))),
    ("MaxPool", |cx| one(nn::pool(cx, true))),
    ("Mean", |cx| one(ew::variadic(cx, B::Add, true))),
    ("Min", |cx| one(ew::variadic(cx, B::Min, false))),
    ("Mish", |cx| one(nn::activation(cx, "Mish"))),
    ("Mod", |cx| one(ew::modulo(cx))),
    ("Mul", |cx| one(cx.binary(B::Mul))),
    ("Neg", |cx| one(cx.unary(U::Neg))),
    ("Not", |cx| one(cx.unary(U::Not))),
    ("OneHot", |cx| one(vision::one_hot(cx))),
    ("Or", |cx| one(cx.binary(B::Or))),
    ("Pad", |cx| one(shape::pad(cx))),
    ("Pow", |cx| one(ew::pow(cx))),
    ("PRelu", |cx| one(nn::activation(cx, "PRelu"))),
    ("Range", |cx| one(shape::range(cx))),
    ("Reciprocal", |cx| one(cx.unary(U::Recip))),
    ("ReduceL1", |cx| {
        one(shape::reduce(
            cx,
            Reduction {
                pre: Some(U::Abs),
                ..plain(ReduceOp::Sum)
            },
        ))
    }),
    ("ReduceL2", |cx| {
        one(shape::reduce(
            cx,
            Reduction {
                square: true,
                post: Some(U::Sqrt),
                ..plain(ReduceOp::Sum)
            },
        ))
    }),
    ("ReduceLogSum", |cx| {
        one(shape::reduce(
            cx,
            Reduction {
                post: Some(U::Log),
                ..plain(ReduceOp::Sum)
            },
        ))
    }),
    ("ReduceLogSumExp", |cx| {
        one(shape::reduce(
            cx,
            Reduction {
                pre: Some(U::Exp),
                post: Some(U::Log),
                ..plain(ReduceOp::Sum)
            },
        ))
    }),
    ("ReduceMax", |cx| one(shape::reduce(cx, plain(ReduceOp::Max)))),
    ("ReduceMean", |cx| one(shape::reduce(cx, plain(ReduceOp::Mean)))),
    ("ReduceMin", |cx| one(shape::reduce(cx, plain(ReduceOp::Min)))),
    ("ReduceProd", |cx| one(shape::reduce(cx, plain(ReduceOp::Prod)))),
    ("ReduceSum", |cx| {
        one(shape::reduce(
            cx,
            Reduction {
                axes_input_from: 13,
                ..plain(ReduceOp::Sum)
            },
        ))
    }),
    ("ReduceSumSquare", |cx| {
        one(shape::reduce(
            cx,
            Reduction {
                square: true,
                ..plain(ReduceOp::Sum)
            },
        ))
    }),
    ("Relu", |cx| one(nn::composite1(cx, Composite::Relu))),
    ("Reshape", |cx| one(shape::reshape(cx))),
    ("Resize", |cx| one(vision::resize(cx, false))),
    ("RNN", |cx| rnn::convert(cx, Kind::Rnn)),
    ("Round", |cx| one(cx.unary(U::Round))),
    ("Selu", |cx| one(nn::activation(cx, "Selu"))),
    ("Shape", |cx| one(ew::shape(cx))),
    ("Sigmoid", |cx| one(nn::composite1(cx, Composite::Sigmoid))),
    ("Sign", |cx| one(cx.unary(U::Sign))),
    ("Sin", |cx| one(cx.unary(U::Sin))),
    ("Sinh", |cx| one(nn::activation(cx, "Sinh"))),
    ("Size", |cx| one(ew::size(cx))),
    ("Slice", |cx| one(shape::slice(cx))),
    ("Softmax", |cx| one(nn::softmax(cx, false))),
    ("Softplus", |cx| one(nn::activation(cx, "Softplus"))),
    ("Softsign", |cx| one(nn::activation(cx, "Softsign"))),
    ("Split", nn::split),
    ("Sqrt", |cx| one(cx.unary(U::Sqrt))),
    ("Squeeze", |cx| one(shape::squeeze(cx, true))),
    ("Sub", |cx| one(cx.binary(B::Sub))),
    ("Sum", |cx| one(ew::variadic(cx, B::Add, false))),
    ("Tan", |cx| one(nn::activation(cx, "Tan"))),
    ("Tanh", |cx| one(cx.unary(U::Tanh))),
    ("ThresholdedRelu", |cx| one(nn::activation(cx, "ThresholdedRelu"))),
    ("Tile", |cx| one(shape::tile(cx))),
    ("TopK", vision::topk),
    ("Transpose", |cx| one(shape::transpose(cx))),
    ("Unsqueeze", |cx| one(shape::squeeze(cx, false))),
    ("Upsample", |cx| one(vision::resize(cx, true))),
    ("Where", |cx| {
        let (c, a, b) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        one(cx.op(Op::Where, &[c, a, b]))
    }),
    ("Xor", |cx| one(cx.binary(B::Xor))),
];

/// The converter of `op_type`, if oar imports it.
pub(crate) fn converter(op_type: &str) -> Option<Convert> {
    TABLE.iter().find(|(name, _)| *name == op_type).map(|(_, f)| *f)
}

/// Every default-domain ONNX op type oar imports.
pub fn supported_ops() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|(name, _)| *name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_is_sorted_and_has_no_duplicates() {
        let names: Vec<&str> = super::supported_ops().collect();
        for w in names.windows(2) {
            assert!(w[0].to_lowercase() < w[1].to_lowercase(), "{} before {}", w[0], w[1]);
        }
    }
}
