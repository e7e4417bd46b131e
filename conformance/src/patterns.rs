//! The patterns section: small graphs in the shapes fusion meets — elementwise chains through
//! broadcast, transpose, slice and reshape; softmax, layer norm and GELU written in
//! primitives; matmul + bias + activation; conv + batch norm + relu (+ residual); attention
//! with `kᵀ`; reductions feeding elementwise ops.

use super::build::{Builder, Domain, R, dims, s};
use super::{Case, Section};
use oar_ir::ops::{
    ArgReduce, BatchNorm, Broadcast, Cast, Concat, Conv, Gather, Gelu, Iota, LayerNorm, LogSoftmax, MaxPool2d, Pad,
    Permute, Random, Reduce, Reshape, ScaledDotProductAttention, Slice, Softmax,
};
use oar_ir::ops::{BinaryOp, RandomDist, ReduceOp, SliceRange, UnaryOp};
use oar_ir::{Composite, DType, Dim, Float, Op, TensorData, TensorType, ValueId};

const PATTERNS: Section = Section::Patterns;
const F: DType = DType::F32;

impl Builder {
    fn un(&mut self, op: UnaryOp, x: ValueId) -> R<ValueId> {
        self.op(Op::Unary(op), &[x])
    }

    fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> R<ValueId> {
        self.op(Op::Binary(op), &[a, b])
    }

    /// `x op c` with a scalar constant of x's dtype.
    fn bin_c(&mut self, op: BinaryOp, x: ValueId, c: f64) -> R<ValueId> {
        let dt = self.g.value_type(x).dtype;
        let k = self.scalar(dt, c);
        self.bin(op, x, k)
    }

    fn reduce(&mut self, op: ReduceOp, x: ValueId, axes: &[usize], keepdim: bool) -> R<ValueId> {
        self.op(
            Op::Reduce(Reduce {
                op,
                axes: axes.to_vec(),
                keepdim,
            }),
            &[x],
        )
    }

    fn permute(&mut self, x: ValueId, perm: &[usize]) -> R<ValueId> {
        self.op(Op::Permute(Permute { perm: perm.to_vec() }), &[x])
    }

    fn reshape(&mut self, x: ValueId, shape: &[usize]) -> R<ValueId> {
        self.op(Op::Reshape(Reshape { shape: dims(shape) }), &[x])
    }

    fn matmul(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.op(Op::MatMul, &[a, b])
    }

    fn relu(&mut self, x: ValueId) -> R<ValueId> {
        self.bin_c(BinaryOp::Max, x, 0.0)
    }

    /// Softmax along `axis` in primitives: `exp(x - max) / sum(exp(x - max))`.
    fn softmax_prims(&mut self, x: ValueId, axis: usize) -> R<ValueId> {
        let m = self.reduce(ReduceOp::Max, x, &[axis], true)?;
        let d = self.bin(BinaryOp::Sub, x, m)?;
        let e = self.un(UnaryOp::Exp, d)?;
        let z = self.reduce(ReduceOp::Sum, e, &[axis], true)?;
        self.bin(BinaryOp::Div, e, z)
    }

    /// A 2-d convolution with `pad` on every side.
    fn conv2d(&mut self, x: ValueId, w: ValueId, stride: usize, pad: usize) -> R<ValueId> {
        self.op(
            Op::Conv(Conv {
                stride: vec![stride; 2],
                pad_before: vec![pad; 2],
                pad_after: vec![pad; 2],
                dilation: vec![1; 2],
                groups: 1,
            }),
            &[x, w],
        )
    }

    /// Eval-mode batch norm with fresh params `{name}.scale/bias/mean/var` for `c` channels.
    fn batch_norm_eval(&mut self, x: ValueId, name: &str, c: usize) -> R<ValueId> {
        let scale = self.param(&format!("{name}.scale"), F, &[c], &Domain::Range(0.5, 1.5))?;
        let bias = self.param(&format!("{name}.bias"), F, &[c], &Domain::Range(-0.3, 0.3))?;
        let mean = self.param(&format!("{name}.mean"), F, &[c], &Domain::Range(-0.3, 0.3))?;
        let var = self.param(&format!("{name}.var"), F, &[c], &Domain::Range(0.5, 2.0))?;
        self.op(
            Op::Composite(Composite::BatchNorm(BatchNorm {
                epsilon: Float(1e-5),
                momentum: Float(0.9),
                training: false,
            })),
            &[x, scale, bias, mean, var],
        )
    }

    /// A conv weight `[o, i, k, k]` with He-uniform values.
    fn conv_weight(&mut self, name: &str, o: usize, i: usize, k: usize) -> R<ValueId> {
        let bound = (6.0 / (i * k * k) as f64).sqrt();
        self.param(name, F, &[o, i, k, k], &Domain::Range(-bound, bound))
    }
}

fn std_dom() -> Domain {
    Domain::standard()
}

fn pattern(v: &mut Vec<Case>, name: &str, f: impl Fn(&mut Builder) -> R<()> + Send + Sync + 'static) {
    v.push(Case::built(PATTERNS, name, f));
}

/// All pattern cases.
pub(crate) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    elementwise(&mut v);
    normalization(&mut v);
    contraction(&mut v);
    attention(&mut v);
    reductions(&mut v);
    v
}

fn elementwise(v: &mut Vec<Case>) {
    use BinaryOp::*;
    use UnaryOp::*;
    pattern(v, "ewise/chain", |b| {
        let x = b.input("x", F, &[4, 33], &std_dom())?;
        let z = b.input("z", F, &[4, 33], &std_dom())?;
        let t = b.bin_c(Mul, x, 0.5)?;
        let t = b.bin_c(Add, t, 1.0)?;
        let t = b.un(Exp, t)?;
        let t = b.bin(Mul, t, z)?;
        let t = b.un(Tanh, t)?;
        let y = b.bin(Sub, t, x)?;
        b.out("y", y)
    });
    pattern(v, "ewise/broadcast_bias_relu_scale", |b| {
        let x = b.input("x", F, &[4, 8], &std_dom())?;
        let bias = b.param("bias", F, &[8], &std_dom())?;
        let sc = b.input("scale", F, &[4, 1], &std_dom())?;
        let t = b.bin(Add, x, bias)?;
        let t = b.relu(t)?;
        let y = b.bin(Mul, t, sc)?;
        b.out("y", y)
    });
    pattern(v, "ewise/through_transpose", |b| {
        let x = b.input("x", F, &[3, 5], &std_dom())?;
        let y = b.input("y", F, &[5, 3], &std_dom())?;
        let t = b.permute(x, &[1, 0])?;
        let t = b.bin(Add, t, y)?;
        let o = b.un(Neg, t)?;
        b.out("out", o)?;
        // NCHW -> NHWC of an elementwise result, then more elementwise work.
        let z = b.input("z", F, &[2, 3, 4, 5], &std_dom())?;
        let t = b.bin_c(Mul, z, 2.0)?;
        let t = b.permute(t, &[0, 2, 3, 1])?;
        let t = b.bin_c(Add, t, 1.0)?;
        let o = b.un(Sin, t)?;
        b.out("nhwc", o)
    });
    pattern(v, "ewise/through_slice", |b| {
        let x = b.input("x", F, &[6, 8], &std_dom())?;
        let r = |start, end, step| SliceRange { start, end, step };
        let a = b.op(
            Op::Slice(Slice {
                ranges: vec![r(1, 5, 1), r(0, 8, 2)],
            }),
            &[x],
        )?;
        let c = b.op(
            Op::Slice(Slice {
                ranges: vec![r(2, 6, 1), r(1, 8, 2)],
            }),
            &[x],
        )?;
        let t = b.bin_c(Mul, a, 2.0)?;
        let y = b.bin(Add, t, c)?;
        b.out("y", y)
    });
    pattern(v, "ewise/through_reshape", |b| {
        let x = b.input("x", F, &[2, 3, 4], &std_dom())?;
        let y = b.input("y", F, &[6, 4], &std_dom())?;
        let t = b.bin_c(Add, x, 1.0)?;
        let t = b.reshape(t, &[6, 4])?;
        let o = b.bin(Mul, t, y)?;
        b.out("out", o)?;
        // Reshape of a transposed (non-contiguous) value.
        let t = b.permute(x, &[2, 0, 1])?;
        let t = b.reshape(t, &[4, 6])?;
        let o = b.un(Exp, t)?;
        b.out("after_permute", o)
    });
    pattern(v, "ewise/through_broadcast", |b| {
        let x = b.input("x", F, &[3, 1], &std_dom())?;
        let y = b.input("y", F, &[2, 3, 5], &std_dom())?;
        let t = b.un(Abs, x)?;
        let t = b.op(
            Op::Broadcast(Broadcast {
                shape: dims(&[2, 3, 5]),
            }),
            &[t],
        )?;
        let t = b.bin(Mul, t, y)?;
        let o = b.un(Sqrt, t)?;
        b.out("y", o)
    });
    pattern(v, "ewise/cast_chain", |b| {
        let x = b.input("x", F, &[5, 7], &Domain::Range(-4.0, 4.0))?;
        let t = b.bin_c(Mul, x, 3.0)?;
        let i = b.op(Op::Cast(Cast { to: DType::I32 }), &[t])?;
        let i = b.bin_c(Add, i, 2.0)?;
        let f = b.op(Op::Cast(Cast { to: F }), &[i])?;
        let y = b.bin_c(Div, f, 2.0)?;
        b.out("y", y)?;
        b.out("i", i)
    });
    pattern(v, "ewise/where_mask", |b| {
        let x = b.input("x", F, &[4, 9], &std_dom())?;
        let y = b.input("y", F, &[4, 9], &std_dom())?;
        let zero = b.scalar(F, 0.0);
        let m = b.bin(Gt, x, zero)?;
        let p = b.bin(Mul, x, y)?;
        let n = b.un(Neg, x)?;
        let o = b.op(Op::Where, &[m, p, n])?;
        b.out("y", o)
    });
    pattern(v, "ewise/pad_then_add", |b| {
        let x = b.input("x", F, &[3, 4], &std_dom())?;
        let y = b.input("y", F, &[5, 7], &std_dom())?;
        let t = b.un(Exp, x)?;
        let t = b.op(
            Op::Pad(Pad {
                before: vec![1, 2],
                after: vec![1, 1],
                value: Float(0.5),
            }),
            &[t],
        )?;
        let o = b.bin(Add, t, y)?;
        b.out("y", o)
    });
    pattern(v, "ewise/concat_of_elementwise", |b| {
        let x = b.input("x", F, &[3, 4], &std_dom())?;
        let y = b.input("y", F, &[3, 2], &std_dom())?;
        let e = b.un(Exp, x)?;
        let n = b.un(Neg, y)?;
        let c = b.op(Op::Concat(Concat { axis: 1 }), &[e, n])?;
        let o = b.bin_c(Mul, c, 2.0)?;
        b.out("y", o)
    });
    pattern(v, "ewise/iota_causal_mask", |b| {
        let x = b.input("x", F, &[6, 6], &std_dom())?;
        let iota = |axis| {
            Op::Iota(Iota {
                shape: dims(&[6, 6]),
                axis,
                dtype: DType::I64,
            })
        };
        let rows = b.op(iota(0), &[])?;
        let cols = b.op(iota(1), &[])?;
        let keep = b.bin(Ge, rows, cols)?;
        let neg = b.scalar(F, -1e4);
        let t = b.op(Op::Where, &[keep, x, neg])?;
        let o = b.softmax_prims(t, 1)?;
        b.out("y", o)
    });
    pattern(v, "ewise/random_plus_input", |b| {
        let x = b.input("x", F, &[4, 9], &std_dom())?;
        let r = b.op(
            Op::Random(Random {
                dist: RandomDist::Uniform {
                    low: Float(-1.0),
                    high: Float(1.0),
                },
                shape: dims(&[4, 9]),
                dtype: F,
                seed: 3,
            }),
            &[],
        )?;
        let o = b.bin(Mul, x, r)?;
        let o = b.bin_c(Add, o, 1.0)?;
        b.out("y", o)
    });
    pattern(v, "ewise/multi_output_shared", |b| {
        let x = b.input("x", F, &[4, 9], &std_dom())?;
        let y = b.input("y", F, &[4, 9], &std_dom())?;
        let a = b.un(Exp, x)?;
        let o1 = b.bin_c(Mul, a, 2.0)?;
        let o2 = b.bin(Add, a, y)?;
        let o3 = b.reduce(ReduceOp::Sum, a, &[1], false)?;
        b.out("twice", o1)?;
        b.out("plus", o2)?;
        b.out("sum", o3)
    });
    pattern(v, "ewise/symbolic_batch", |b| {
        let n = 3;
        let data = b.data(F, &[n, 8], &std_dom())?;
        let ty = TensorType::new(F, vec![Dim::sym("N"), Dim::Static(8)]);
        let x = b.input_typed("x", ty, data)?;
        let w = b.param("w", F, &[8, 5], &std_dom())?;
        let bias = b.param("b", F, &[5], &std_dom())?;
        let t = b.matmul(x, w)?;
        let t = b.bin(Add, t, bias)?;
        let t = b.relu(t)?;
        let m = b.reduce(ReduceOp::Mean, t, &[0], true)?;
        let o = b.bin(Sub, t, m)?;
        b.out("y", o)
    });
}

fn normalization(v: &mut Vec<Case>) {
    use BinaryOp::*;
    use UnaryOp::*;
    for (label, shape, axis) in [("last_axis", [4, 33], 1), ("first_axis", [7, 5], 0)] {
        pattern(v, &format!("softmax/primitives_{label}"), move |b| {
            let x = b.input("x", F, &shape, &Domain::Range(-5.0, 5.0))?;
            let o = b.softmax_prims(x, axis)?;
            b.out("y", o)
        });
    }
    pattern(v, "softmax/composite_then_log", |b| {
        let x = b.input("x", F, &[4, 10], &Domain::Range(-5.0, 5.0))?;
        let p = b.op(Op::Composite(Composite::Softmax(Softmax { axis: 1 })), &[x])?;
        let o = b.un(Log, p)?;
        b.out("y", o)
    });
    pattern(v, "layer_norm/primitives", |b| {
        let x = b.input("x", F, &[4, 32], &std_dom())?;
        let w = b.param("w", F, &[32], &Domain::Range(0.5, 1.5))?;
        let bias = b.param("b", F, &[32], &std_dom())?;
        let mean = b.reduce(ReduceOp::Mean, x, &[1], true)?;
        let d = b.bin(Sub, x, mean)?;
        let sq = b.bin(Mul, d, d)?;
        let var = b.reduce(ReduceOp::Mean, sq, &[1], true)?;
        let ve = b.bin_c(Add, var, 1e-5)?;
        let r = b.un(Rsqrt, ve)?;
        let n = b.bin(Mul, d, r)?;
        let n = b.bin(Mul, n, w)?;
        let o = b.bin(Add, n, bias)?;
        b.out("y", o)
    });
    pattern(v, "layer_norm/composite_residual", |b| {
        let x = b.input("x", F, &[2, 5, 16], &std_dom())?;
        let h = b.input("h", F, &[2, 5, 16], &std_dom())?;
        let w = b.param("w", F, &[16], &Domain::Range(0.5, 1.5))?;
        let bias = b.param("b", F, &[16], &std_dom())?;
        let t = b.bin(Add, x, h)?;
        let o = b.op(
            Op::Composite(Composite::LayerNorm(LayerNorm {
                normalized_ndim: 1,
                epsilon: Float(1e-5),
            })),
            &[t, w, bias],
        )?;
        b.out("y", o)
    });
    pattern(v, "gelu/erf_primitives", |b| {
        let x = b.input("x", F, &[4, 33], &Domain::Range(-4.0, 4.0))?;
        let t = b.bin_c(Mul, x, std::f64::consts::FRAC_1_SQRT_2)?;
        let t = b.un(Erf, t)?;
        let t = b.bin_c(Add, t, 1.0)?;
        let t = b.bin(Mul, x, t)?;
        let o = b.bin_c(Mul, t, 0.5)?;
        b.out("y", o)
    });
    pattern(v, "gelu/tanh_primitives", |b| {
        let x = b.input("x", F, &[4, 33], &Domain::Range(-4.0, 4.0))?;
        let x3 = b.bin(Mul, x, x)?;
        let x3 = b.bin(Mul, x3, x)?;
        let t = b.bin_c(Mul, x3, 0.044715)?;
        let t = b.bin(Add, x, t)?;
        let t = b.bin_c(Mul, t, (2.0 / std::f64::consts::PI).sqrt())?;
        let t = b.un(Tanh, t)?;
        let t = b.bin_c(Add, t, 1.0)?;
        let t = b.bin(Mul, x, t)?;
        let o = b.bin_c(Mul, t, 0.5)?;
        b.out("y", o)
    });
}

fn contraction(v: &mut Vec<Case>) {
    use BinaryOp::*;
    pattern(v, "matmul/bias_relu", |b| {
        let x = b.input("x", F, &[8, 16], &std_dom())?;
        let w = b.param("w", F, &[16, 32], &std_dom())?;
        let bias = b.param("b", F, &[32], &std_dom())?;
        let t = b.matmul(x, w)?;
        let t = b.bin(Add, t, bias)?;
        let o = b.relu(t)?;
        b.out("y", o)
    });
    pattern(v, "matmul/bias_gelu", |b| {
        let x = b.input("x", F, &[2, 5, 16], &std_dom())?;
        let w = b.param("w", F, &[16, 24], &std_dom())?;
        let bias = b.param("b", F, &[24], &std_dom())?;
        let t = b.matmul(x, w)?;
        let t = b.bin(Add, t, bias)?;
        let o = b.op(Op::Composite(Composite::Gelu(Gelu { approximate: false })), &[t])?;
        b.out("y", o)
    });
    pattern(v, "matmul/linear_sigmoid_scale", |b| {
        let x = b.input("x", F, &[6, 12], &std_dom())?;
        let w = b.param("w", F, &[12, 10], &std_dom())?;
        let bias = b.param("b", F, &[10], &std_dom())?;
        let t = b.op(Op::Composite(Composite::Linear), &[x, w, bias])?;
        let t = b.op(Op::Composite(Composite::Sigmoid), &[t])?;
        let o = b.bin_c(Mul, t, 3.0)?;
        b.out("y", o)
    });
    pattern(v, "matmul/transposed_operand", |b| {
        let x = b.input("x", F, &[7, 9], &std_dom())?;
        let w = b.param("w", F, &[11, 9], &std_dom())?;
        let wt = b.permute(w, &[1, 0])?;
        let t = b.matmul(x, wt)?;
        let o = b.un(UnaryOp::Tanh, t)?;
        b.out("y", o)
    });
    pattern(v, "matmul/then_reduce", |b| {
        let x = b.input("x", F, &[5, 12], &std_dom())?;
        let w = b.param("w", F, &[12, 7], &std_dom())?;
        let t = b.matmul(x, w)?;
        let o = b.reduce(ReduceOp::Sum, t, &[1], false)?;
        b.out("y", o)
    });
    pattern(v, "matmul/two_layer_mlp", |b| {
        let x = b.input("x", F, &[4, 20], &std_dom())?;
        let w1 = b.param("w1", F, &[20, 32], &std_dom())?;
        let b1 = b.param("b1", F, &[32], &std_dom())?;
        let w2 = b.param("w2", F, &[32, 5], &std_dom())?;
        let b2 = b.param("b2", F, &[5], &std_dom())?;
        let t = b.matmul(x, w1)?;
        let t = b.bin(Add, t, b1)?;
        let t = b.relu(t)?;
        let t = b.matmul(t, w2)?;
        let t = b.bin(Add, t, b2)?;
        let o = b.op(Op::Composite(Composite::LogSoftmax(LogSoftmax { axis: 1 })), &[t])?;
        b.out("y", o)
    });
    pattern(v, "conv/bias_add_relu", |b| {
        let x = b.input("x", F, &[2, 4, 9, 9], &std_dom())?;
        let w = b.conv_weight("w", 6, 4, 3)?;
        let bias = b.param("b", F, &[6], &std_dom())?;
        let t = b.conv2d(x, w, 1, 1)?;
        let bb = b.reshape(bias, &[1, 6, 1, 1])?;
        let t = b.bin(Add, t, bb)?;
        let o = b.relu(t)?;
        b.out("y", o)
    });
    pattern(v, "conv/bn_relu", |b| {
        let x = b.input("x", F, &[2, 8, 10, 10], &std_dom())?;
        let w = b.conv_weight("w", 8, 8, 3)?;
        let t = b.conv2d(x, w, 1, 1)?;
        let t = b.batch_norm_eval(t, "bn", 8)?;
        let o = b.op(Op::Composite(Composite::Relu), &[t])?;
        b.out("y", o)
    });
    pattern(v, "conv/resnet_basic_block", |b| {
        let x = b.input("x", F, &[2, 8, 8, 8], &std_dom())?;
        let w1 = b.conv_weight("conv1", 8, 8, 3)?;
        let w2 = b.conv_weight("conv2", 8, 8, 3)?;
        let t = b.conv2d(x, w1, 1, 1)?;
        let t = b.batch_norm_eval(t, "bn1", 8)?;
        let t = b.op(Op::Composite(Composite::Relu), &[t])?;
        let t = b.conv2d(t, w2, 1, 1)?;
        let t = b.batch_norm_eval(t, "bn2", 8)?;
        let t = b.bin(Add, t, x)?;
        let o = b.op(Op::Composite(Composite::Relu), &[t])?;
        b.out("y", o)
    });
    pattern(v, "conv/resnet_downsample_block", |b| {
        let x = b.input("x", F, &[1, 8, 8, 8], &std_dom())?;
        let w1 = b.conv_weight("conv1", 16, 8, 3)?;
        let w2 = b.conv_weight("conv2", 16, 16, 3)?;
        let wd = b.conv_weight("down", 16, 8, 1)?;
        let t = b.conv2d(x, w1, 2, 1)?;
        let t = b.batch_norm_eval(t, "bn1", 16)?;
        let t = b.op(Op::Composite(Composite::Relu), &[t])?;
        let t = b.conv2d(t, w2, 1, 1)?;
        let t = b.batch_norm_eval(t, "bn2", 16)?;
        let d = b.conv2d(x, wd, 2, 0)?;
        let d = b.batch_norm_eval(d, "bnd", 16)?;
        let t = b.bin(Add, t, d)?;
        let o = b.op(Op::Composite(Composite::Relu), &[t])?;
        b.out("y", o)
    });
    pattern(v, "conv/depthwise_relu6_pointwise", |b| {
        let x = b.input("x", F, &[1, 8, 9, 9], &std_dom())?;
        let dw = b.param("dw", F, &[8, 1, 3, 3], &std_dom())?;
        let pw = b.conv_weight("pw", 12, 8, 1)?;
        let t = b.op(
            Op::Conv(Conv {
                stride: vec![2, 2],
                pad_before: vec![1, 1],
                pad_after: vec![1, 1],
                dilation: vec![1, 1],
                groups: 8,
            }),
            &[x, dw],
        )?;
        let t = b.batch_norm_eval(t, "bn1", 8)?;
        let t = b.bin_c(Max, t, 0.0)?;
        let t = b.bin_c(Min, t, 6.0)?;
        let t = b.conv2d(t, pw, 1, 0)?;
        let o = b.batch_norm_eval(t, "bn2", 12)?;
        b.out("y", o)
    });
    pattern(v, "conv/pool_flatten_linear", |b| {
        let x = b.input("x", F, &[2, 3, 12, 12], &std_dom())?;
        let w = b.conv_weight("w", 4, 3, 3)?;
        let t = b.conv2d(x, w, 1, 1)?;
        let t = b.relu(t)?;
        let t = b.op(
            Op::Composite(Composite::MaxPool2d(MaxPool2d {
                kernel: [2, 2],
                stride: [2, 2],
                padding: [0; 4],
                ceil_mode: false,
            })),
            &[t],
        )?;
        let t = b.reshape(t, &[2, 144])?;
        let fw = b.param("fc.w", F, &[144, 5], &Domain::Range(-0.1, 0.1))?;
        let fb = b.param("fc.b", F, &[5], &std_dom())?;
        let o = b.op(Op::Composite(Composite::Linear), &[t, fw, fb])?;
        b.out("y", o)
    });
}

fn attention(v: &mut Vec<Case>) {
    use BinaryOp::*;
    pattern(v, "attention/k_transposed", |b| {
        let q = b.input("q", F, &[2, 6, 8], &std_dom())?;
        let k = b.input("k", F, &[2, 7, 8], &std_dom())?;
        let val = b.input("v", F, &[2, 7, 8], &std_dom())?;
        let kt = b.permute(k, &[0, 2, 1])?;
        let s = b.matmul(q, kt)?;
        let s = b.bin_c(Mul, s, 1.0 / 8f64.sqrt())?;
        let p = b.softmax_prims(s, 2)?;
        let o = b.matmul(p, val)?;
        b.out("y", o)
    });
    pattern(v, "attention/multihead_projections", |b| {
        let (n, l, d, h) = (2, 5, 16, 4);
        let hd = d / h;
        let x = b.input("x", F, &[n, l, d], &std_dom())?;
        let mut heads = Vec::new();
        for name in ["wq", "wk", "wv"] {
            let w = b.param(name, F, &[d, d], &Domain::Range(-0.4, 0.4))?;
            let t = b.matmul(x, w)?;
            let t = b.reshape(t, &[n, l, h, hd])?;
            heads.push(b.permute(t, &[0, 2, 1, 3])?);
        }
        let kt = b.permute(heads[1], &[0, 1, 3, 2])?;
        let s = b.matmul(heads[0], kt)?;
        let s = b.bin_c(Mul, s, 1.0 / (hd as f64).sqrt())?;
        let p = b.op(Op::Composite(Composite::Softmax(Softmax { axis: 3 })), &[s])?;
        let o = b.matmul(p, heads[2])?;
        let o = b.permute(o, &[0, 2, 1, 3])?;
        let o = b.reshape(o, &[n, l, d])?;
        let wo = b.param("wo", F, &[d, d], &Domain::Range(-0.4, 0.4))?;
        let o = b.matmul(o, wo)?;
        let o = b.bin(Add, o, x)?;
        b.out("y", o)
    });
    pattern(v, "attention/sdpa_causal_heads", |b| {
        let q = b.input("q", F, &[1, 3, 8, 4], &std_dom())?;
        let k = b.input("k", F, &[1, 3, 8, 4], &std_dom())?;
        let val = b.input("v", F, &[1, 3, 8, 4], &std_dom())?;
        let o = b.op(
            Op::Composite(Composite::ScaledDotProductAttention(ScaledDotProductAttention {
                causal: true,
                scale: None,
            })),
            &[q, k, val],
        )?;
        let o = b.permute(o, &[0, 2, 1, 3])?;
        let o = b.reshape(o, &[1, 8, 12])?;
        b.out("y", o)
    });
}

fn reductions(v: &mut Vec<Case>) {
    use BinaryOp::*;
    use UnaryOp::*;
    pattern(v, "reduce/center", |b| {
        let x = b.input("x", F, &[5, 13], &std_dom())?;
        let m = b.reduce(ReduceOp::Mean, x, &[1], true)?;
        let o = b.bin(Sub, x, m)?;
        b.out("y", o)
    });
    pattern(v, "reduce/l2_normalize", |b| {
        let x = b.input("x", F, &[5, 13], &std_dom())?;
        let sq = b.bin(Mul, x, x)?;
        let ss = b.reduce(ReduceOp::Sum, sq, &[1], true)?;
        let ss = b.bin_c(Add, ss, 1e-6)?;
        let n = b.un(Sqrt, ss)?;
        let o = b.bin(Div, x, n)?;
        b.out("y", o)
    });
    pattern(v, "reduce/column_mean_scale", |b| {
        let x = b.input("x", F, &[9, 6], &std_dom())?;
        let m = b.reduce(ReduceOp::Mean, x, &[0], false)?;
        let o = b.bin(Mul, x, m)?;
        b.out("y", o)
    });
    pattern(v, "reduce/of_elementwise_two_outputs", |b| {
        let x = b.input("x", F, &[3, 4, 17], &std_dom())?;
        let e = b.un(Exp, x)?;
        let s = b.reduce(ReduceOp::Sum, e, &[2], false)?;
        let m = b.reduce(ReduceOp::Max, x, &[0, 2], false)?;
        b.out("sum_exp", s)?;
        b.out("max", m)
    });
    pattern(v, "reduce/global_then_broadcast", |b| {
        let x = b.input("x", F, &[4, 6, 5], &std_dom())?;
        let mx = b.reduce(ReduceOp::Max, x, &[0, 1, 2], false)?;
        let mn = b.reduce(ReduceOp::Min, x, &[0, 1, 2], false)?;
        let r = b.bin(Sub, mx, mn)?;
        let t = b.bin(Sub, x, mn)?;
        let o = b.bin(Div, t, r)?;
        b.out("y", o)
    });
    pattern(v, "reduce/argmax_of_logits", |b| {
        let x = b.input("x", F, &[4, 10], &std_dom())?;
        let w = b.param("w", F, &[10, 6], &std_dom())?;
        let t = b.matmul(x, w)?;
        let a = b.op(
            Op::ArgReduce(ArgReduce {
                op: oar_ir::ops::ArgReduceOp::ArgMax,
                axis: 1,
                keepdim: false,
            }),
            &[t],
        )?;
        b.out("y", a)
    });
    pattern(v, "reduce/gather_rows_then_sum", |b| {
        let table = b.param("table", F, &[10, 8], &std_dom())?;
        let idx = TensorData::from_vec(vec![5], vec![3i64, 0, 9, 3, 7]).map_err(s)?;
        let i = b.input_data("idx", idx)?;
        let rows = b.op(Op::Gather(Gather { axis: 0 }), &[table, i])?;
        let o = b.reduce(ReduceOp::Sum, rows, &[0], false)?;
        b.out("y", o)
    });
}
