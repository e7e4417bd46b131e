//! The type/shape rule of every op: hand-computed result types, and errors that name the op and
//! the offending types.

use oar_ir::ops::{
    ArgReduce, Broadcast, Cast, Concat, Conv, Gather, Iota, Pad, Permute, Random, Reduce, Reshape, Scatter, Slice,
};
use oar_ir::ops::{
    ArgReduceOp, BinaryOp, RandomDist, ReduceOp, Reduction, ScatterReduce, SliceRange, UnaryOp, infer_types,
};
use oar_ir::{Composite, DType, Dim, Float, Graph, Op, Shape, TensorData, TensorType};

/// `"f32[N,3]"` → a tensor type.
fn ty(s: &str) -> TensorType {
    let (d, rest) = s.split_once('[').expect("type like f32[2,3]");
    let dims = rest.trim_end_matches(']');
    let dims = if dims.is_empty() {
        vec![]
    } else {
        dims.split(',').map(|x| x.parse::<Dim>().expect("a dim")).collect()
    };
    TensorType::new(d.parse::<DType>().unwrap(), Shape(dims))
}

fn infer(op: Op, inputs: &[&str]) -> Result<String, String> {
    let ts: Vec<_> = inputs.iter().map(|s| ty(s)).collect();
    infer_types(&op, &ts, &[]).map(|o| o.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", "))
}

fn ok(op: Op, inputs: &[&str], expected: &str) {
    let name = op.name();
    assert_eq!(
        infer(op, inputs).unwrap_or_else(|e| panic!("{name}: {e}")),
        expected,
        "{name}"
    );
}

/// The error must mention every `needles` string (the offending types).
fn err(op: Op, inputs: &[&str], needles: &[&str]) {
    let name = op.name();
    let e = infer(op, inputs).expect_err(name);
    for n in needles {
        assert!(e.contains(n), "{name}: error {e:?} should mention {n:?}");
    }
}

fn dims(v: &[&str]) -> Vec<Dim> {
    ty(&format!("f32[{}]", v.join(","))).shape.0
}

#[test]
fn elementwise() {
    ok(Op::Unary(UnaryOp::Exp), &["f32[N,3]"], "f32[N,3]");
    ok(Op::Unary(UnaryOp::Neg), &["i32[2]"], "i32[2]");
    ok(Op::Unary(UnaryOp::Not), &["bool[2]"], "bool[2]");
    err(Op::Unary(UnaryOp::Exp), &["i32[2]"], &["exp", "i32[2]"]);
    err(Op::Unary(UnaryOp::Not), &["f32[2]"], &["not", "f32[2]"]);
    err(Op::Unary(UnaryOp::Abs), &["bool[2]"], &["abs", "bool[2]"]);
    ok(Op::Binary(BinaryOp::Add), &["f32[N,1,5]", "f32[7,1]"], "f32[N,7,5]");
    ok(Op::Binary(BinaryOp::Lt), &["i64[3]", "i64[]"], "bool[3]");
    ok(Op::Binary(BinaryOp::And), &["bool[3]", "bool[3]"], "bool[3]");
    err(
        Op::Binary(BinaryOp::Add),
        &["f32[2,3]", "f32[4,3]"],
        &["[2,3]", "[4,3]"],
    );
    err(Op::Binary(BinaryOp::Mul), &["f32[2]", "f64[2]"], &["f32[2]", "f64[2]"]);
    err(Op::Binary(BinaryOp::Xor), &["f32[2]", "f32[2]"], &["xor", "f32[2]"]);
    err(Op::Binary(BinaryOp::Sub), &["bool[2]", "bool[2]"], &["sub"]);
    ok(Op::Where, &["bool[N,1]", "f32[3]", "f32[]"], "f32[N,3]");
    err(Op::Where, &["f32[3]", "f32[3]", "f32[3]"], &["bool", "f32[3]"]);
    ok(Op::Cast(Cast { to: DType::BF16 }), &["i64[N]"], "bf16[N]");
    err(
        Op::Cast(Cast { to: DType::F32 }),
        &["f32[1]", "f32[1]"],
        &["1 operands, got 2"],
    );
}

#[test]
fn reductions() {
    let sum = |axes: Vec<usize>, keepdim| {
        Op::Reduce(Reduce {
            op: ReduceOp::Sum,
            axes,
            keepdim,
        })
    };
    ok(sum(vec![1], false), &["f32[N,3,4]"], "f32[N,4]");
    ok(sum(vec![0, 2], true), &["f32[N,3,4]"], "f32[1,3,1]");
    ok(sum(vec![], false), &["i32[2]"], "i32[2]");
    err(sum(vec![3], false), &["f32[N,3,4]"], &["axis 3", "rank 3"]);
    err(sum(vec![1, 0], false), &["f32[2,2]"], &["sorted"]);
    err(
        Op::Reduce(Reduce {
            op: ReduceOp::Mean,
            axes: vec![0],
            keepdim: false,
        }),
        &["i32[4]"],
        &["reduce_mean", "i32[4]"],
    );
    ok(
        Op::ArgReduce(ArgReduce {
            op: ArgReduceOp::ArgMax,
            axis: 1,
            keepdim: false,
        }),
        &["f32[N,10]"],
        "i64[N]",
    );
    ok(
        Op::ArgReduce(ArgReduce {
            op: ArgReduceOp::ArgMin,
            axis: 0,
            keepdim: true,
        }),
        &["i32[4,2]"],
        "i64[1,2]",
    );
    err(
        Op::ArgReduce(ArgReduce {
            op: ArgReduceOp::ArgMax,
            axis: 0,
            keepdim: true,
        }),
        &["f32[0]"],
        &["empty"],
    );
}

#[test]
fn movement() {
    ok(
        Op::Reshape(Reshape {
            shape: dims(&["N", "12"]),
        }),
        &["f32[N,3,4]"],
        "f32[N,12]",
    );
    ok(
        Op::Reshape(Reshape {
            shape: dims(&["6", "4"]),
        }),
        &["f32[2,3,4]"],
        "f32[6,4]",
    );
    err(
        Op::Reshape(Reshape { shape: dims(&["5"]) }),
        &["f32[2,3]"],
        &["f32[2,3]", "[5]"],
    );
    err(
        Op::Reshape(Reshape { shape: dims(&["6"]) }),
        &["f32[N,6]"],
        &["f32[N,6]"],
    );
    // Symbolic dims merge and split as expressions: the element counts are equal polynomials.
    ok(
        Op::Reshape(Reshape {
            shape: dims(&["N*3", "4"]),
        }),
        &["f32[N,3,4]"],
        "f32[3*N,4]",
    );
    ok(
        Op::Reshape(Reshape {
            shape: dims(&["N", "C", "2"]),
        }),
        &["f32[C*N*2]"],
        "f32[N,C,2]",
    );
    err(
        Op::Reshape(Reshape { shape: dims(&["N*C"]) }),
        &["f32[N,3]"],
        &["element counts"],
    );
    ok(
        Op::Permute(Permute { perm: vec![2, 0, 1] }),
        &["f32[N,3,4]"],
        "f32[4,N,3]",
    );
    err(
        Op::Permute(Permute { perm: vec![0, 0] }),
        &["f32[2,3]"],
        &["[0, 0]", "f32[2,3]"],
    );
    ok(
        Op::Broadcast(Broadcast {
            shape: dims(&["N", "2", "3"]),
        }),
        &["f32[1,3]"],
        "f32[N,2,3]",
    );
    err(
        Op::Broadcast(Broadcast { shape: dims(&["4"]) }),
        &["f32[3]"],
        &["f32[3]", "[4]"],
    );
    let r = |start, end, step| SliceRange { start, end, step };
    ok(
        Op::Slice(Slice {
            ranges: vec![SliceRange::FULL, r(-3, i64::MAX, 1), r(1, 8, 3)],
        }),
        &["f32[N,5,10]"],
        "f32[N,3,3]",
    );
    err(
        Op::Slice(Slice {
            ranges: vec![r(0, 2, 1)],
        }),
        &["f32[N]"],
        &["symbolic", "f32[N]"],
    );
    ok(
        Op::Slice(Slice {
            ranges: vec![r(1, -2, 1), r(1, i64::MAX, 2)],
        }),
        &["f32[N,M]"],
        "f32[N-3,M/2]",
    );
    err(
        Op::Slice(Slice {
            ranges: vec![r(0, 2, 0)],
        }),
        &["f32[4]"],
        &["step 0"],
    );
    ok(
        Op::Pad(Pad {
            before: vec![0, 1],
            after: vec![0, 2],
            value: Float(0.0),
        }),
        &["f32[N,3]"],
        "f32[N,6]",
    );
    ok(
        Op::Pad(Pad {
            before: vec![1],
            after: vec![2],
            value: Float(0.0),
        }),
        &["f32[N]"],
        "f32[N+3]",
    );
    ok(
        Op::Concat(Concat { axis: 1 }),
        &["f32[N,2]", "f32[N,3]", "f32[N,1]"],
        "f32[N,6]",
    );
    ok(
        Op::Concat(Concat { axis: 0 }),
        &["f32[N,2]", "f32[1,2]", "f32[N,2]"],
        "f32[2*N+1,2]",
    );
    err(
        Op::Concat(Concat { axis: 1 }),
        &["f32[2,2]", "f32[3,3]"],
        &["f32[2,2]", "f32[3,3]"],
    );
    err(Op::Concat(Concat { axis: 0 }), &[], &["at least one"]);
}

#[test]
fn indexing_and_generators() {
    ok(
        Op::Gather(Gather { axis: 1 }),
        &["f32[N,5,7]", "i64[2,3]"],
        "f32[N,2,3,7]",
    );
    err(
        Op::Gather(Gather { axis: 0 }),
        &["f32[5]", "f32[2]"],
        &["i32 or i64", "f32[2]"],
    );
    ok(
        Op::Scatter(Scatter {
            axis: 0,
            reduce: ScatterReduce::Add,
        }),
        &["f32[5,4]", "i32[3]", "f32[3,4]"],
        "f32[5,4]",
    );
    err(
        Op::Scatter(Scatter {
            axis: 0,
            reduce: ScatterReduce::Add,
        }),
        &["f32[5,4]", "i32[3]", "f32[2,4]"],
        &["[3,4]", "f32[2,4]"],
    );
    ok(
        Op::Iota(Iota {
            shape: dims(&["N", "4"]),
            axis: 1,
            dtype: DType::I64,
        }),
        &[],
        "i64[N,4]",
    );
    err(
        Op::Iota(Iota {
            shape: dims(&["4"]),
            axis: 1,
            dtype: DType::I64,
        }),
        &[],
        &["axis 1"],
    );
    let uniform = RandomDist::Uniform {
        low: Float(0.0),
        high: Float(1.0),
    };
    ok(
        Op::Random(Random {
            dist: uniform,
            shape: dims(&["N", "2"]),
            dtype: DType::F16,
            seed: 7,
        }),
        &[],
        "f16[N,2]",
    );
    err(
        Op::Random(Random {
            dist: uniform,
            shape: dims(&["2"]),
            dtype: DType::I32,
            seed: 7,
        }),
        &[],
        &["float", "i32"],
    );
    let bad = RandomDist::Normal {
        mean: Float(0.0),
        std: Float(-1.0),
    };
    err(
        Op::Random(Random {
            dist: bad,
            shape: dims(&["2"]),
            dtype: DType::F32,
            seed: 7,
        }),
        &[],
        &["std=-1.0"],
    );
    let c = TensorData::from_vec(vec![2], vec![1i32, 2]).unwrap();
    ok(Op::Constant(c), &[], "i32[2]");
}

#[test]
fn contractions() {
    ok(Op::MatMul, &["f32[N,1,4,3]", "f32[5,3,2]"], "f32[N,5,4,2]");
    err(Op::MatMul, &["f32[4,3]", "f32[4,3]"], &["inner", "f32[4,3]"]);
    err(Op::MatMul, &["f32[3]", "f32[3,3]"], &["rank ≥ 2", "f32[3]"]);
    let conv = |s: usize, p: usize, d: usize, g: usize| {
        Op::Conv(Conv {
            stride: vec![s, s],
            pad_before: vec![p, p],
            pad_after: vec![p, p],
            dilation: vec![d, d],
            groups: g,
        })
    };
    // (32 + 2 - 3) / 2 + 1 = 16; dilation 2: span 5, (32 + 2 - 5) / 1 + 1 = 30
    ok(conv(2, 1, 1, 1), &["f32[N,3,32,32]", "f32[8,3,3,3]"], "f32[N,8,16,16]");
    ok(conv(1, 1, 2, 1), &["f32[N,3,32,32]", "f32[8,3,3,3]"], "f32[N,8,30,30]");
    ok(conv(1, 0, 1, 4), &["f32[1,8,5,5]", "f32[12,2,3,3]"], "f32[1,12,3,3]");
    err(conv(1, 0, 1, 3), &["f32[1,8,5,5]", "f32[12,2,3,3]"], &["groups 3"]);
    err(conv(1, 0, 1, 1), &["f32[1,3,2,2]", "f32[4,3,3,3]"], &["does not fit"]);
    let conv1d = Op::Conv(Conv {
        stride: vec![1],
        pad_before: vec![2],
        pad_after: vec![0],
        dilation: vec![1],
        groups: 1,
    });
    ok(conv1d, &["f64[2,1,10]", "f64[3,1,3]"], "f64[2,3,10]");
}

#[test]
fn composites() {
    use Composite::*;
    use oar_ir::ops::{
        AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm, Conv2d, CrossEntropy, Dropout, Gelu, LayerNorm,
        LogSoftmax, MaxPool2d, ScaledDotProductAttention, Softmax,
    };
    let c = Op::Composite;
    ok(c(Linear), &["f32[N,S,4]", "f32[4,8]", "f32[8]"], "f32[N,S,8]");
    err(c(Linear), &["f32[N,5]", "f32[4,8]"], &["f32[N,5]", "f32[4,8]"]);
    err(c(Linear), &["f32[N,4]", "f32[4,8]", "f32[4]"], &["bias", "f32[4]"]);
    let conv2d = Conv2d(Conv2d {
        stride: [1, 2],
        padding: [1, 0, 1, 0],
        dilation: [1, 1],
        groups: 1,
    });
    ok(
        c(conv2d.clone()),
        &["f32[N,3,8,9]", "f32[4,3,3,3]", "f32[4]"],
        "f32[N,4,8,4]",
    );
    err(
        c(conv2d),
        &["f32[N,3,8,9]", "f32[4,3,3,3]", "f32[3]"],
        &["bias", "f32[3]"],
    );
    let pool = |ceil| {
        MaxPool2d(MaxPool2d {
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1, 1, 1],
            ceil_mode: ceil,
        })
    };
    // floor((112 + 2 - 3) / 2) + 1 = 56
    ok(c(pool(false)), &["f32[N,64,112,112]"], "f32[N,64,56,56]");
    // 5x5, k2 s2: floor gives 2, ceil gives 3
    ok(
        c(MaxPool2d(MaxPool2d {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0; 4],
            ceil_mode: true,
        })),
        &["f32[1,1,5,5]"],
        "f32[1,1,3,3]",
    );
    err(
        c(MaxPool2d(MaxPool2d {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [2, 2, 2, 2],
            ceil_mode: false,
        })),
        &["f32[1,1,5,5]"],
        &["half the kernel"],
    );
    ok(
        c(AvgPool2d(AvgPool2d {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0; 4],
            ceil_mode: false,
            count_include_pad: true,
        })),
        &["f32[1,1,5,5]"],
        "f32[1,1,2,2]",
    );
    ok(
        c(AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size: [1, 1] })),
        &["f32[N,512,7,7]"],
        "f32[N,512,1,1]",
    );
    err(
        c(AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size: [0, 1] })),
        &["f32[N,512,7,7]"],
        &["output size"],
    );
    let bn = |training| {
        BatchNorm(BatchNorm {
            epsilon: Float(1e-5),
            momentum: Float(0.9),
            training,
        })
    };
    let bn_in = ["f32[N,3,4,4]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"];
    ok(c(bn(true)), &bn_in, "f32[N,3,4,4], f32[3], f32[3]");
    ok(c(bn(false)), &bn_in, "f32[N,3,4,4]");
    err(
        c(bn(false)),
        &["f32[N,3,4,4]", "f32[3]", "f32[4]", "f32[3]", "f32[3]"],
        &["bias", "f32[4]"],
    );
    let ln = LayerNorm(LayerNorm {
        normalized_ndim: 2,
        epsilon: Float(1e-5),
    });
    ok(c(ln.clone()), &["f32[N,S,4,8]", "f32[4,8]", "f32[4,8]"], "f32[N,S,4,8]");
    err(c(ln), &["f32[N,S,4,8]", "f32[8]", "f32[8]"], &["f32[8]", "[4,8]"]);
    ok(c(Softmax(Softmax { axis: 1 })), &["f32[N,10]"], "f32[N,10]");
    err(c(LogSoftmax(LogSoftmax { axis: 2 })), &["f32[N,10]"], &["axis 2"]);
    ok(
        c(CrossEntropy(CrossEntropy {
            reduction: Reduction::Mean,
        })),
        &["f32[N,10]", "i64[N]"],
        "f32[]",
    );
    ok(
        c(CrossEntropy(CrossEntropy {
            reduction: Reduction::None,
        })),
        &["f32[N,10]", "i64[N]"],
        "f32[N]",
    );
    err(
        c(CrossEntropy(CrossEntropy {
            reduction: Reduction::Sum,
        })),
        &["f32[N,10]", "f32[N]"],
        &["i32 or i64"],
    );
    ok(c(Relu), &["i32[3]"], "i32[3]");
    ok(c(Gelu(Gelu { approximate: true })), &["bf16[3]"], "bf16[3]");
    err(c(Sigmoid), &["i32[3]"], &["float", "i32[3]"]);
    ok(c(Silu), &["f64[2]"], "f64[2]");
    ok(
        c(Dropout(Dropout {
            p: Float(0.5),
            training: true,
            seed: 1,
        })),
        &["f32[N]"],
        "f32[N]",
    );
    err(
        c(Dropout(Dropout {
            p: Float(1.0),
            training: true,
            seed: 1,
        })),
        &["f32[N]"],
        &["p=1.0"],
    );
    ok(c(Embedding), &["i64[N,S]", "f32[100,16]"], "f32[N,S,16]");
    let sdpa = ScaledDotProductAttention(ScaledDotProductAttention {
        causal: true,
        scale: None,
    });
    ok(
        c(sdpa.clone()),
        &["f32[N,4,10,8]", "f32[N,4,12,8]", "f32[N,4,12,16]"],
        "f32[N,4,10,16]",
    );
    ok(
        c(sdpa.clone()),
        &["f32[N,4,10,8]", "f32[N,4,12,8]", "f32[N,4,12,16]", "bool[10,12]"],
        "f32[N,4,10,16]",
    );
    err(
        c(sdpa.clone()),
        &["f32[N,4,10,8]", "f32[N,4,12,7]", "f32[N,4,12,16]"],
        &["f32[N,4,10,8]"],
    );
    err(
        c(sdpa),
        &["f32[2,10,8]", "f32[2,12,8]", "f32[2,12,16]", "bool[10,11]"],
        &["mask", "bool[10,11]"],
    );
}

#[test]
fn control_flow_regions() {
    let t = ty("f32[N,4]");
    let mut then_g = Graph::new("then");
    let a = then_g.add_input("a", t.clone()).unwrap();
    let e = then_g.unary(UnaryOp::Exp, a).unwrap();
    then_g.add_output("r", e).unwrap();
    let mut else_g = Graph::new("else");
    let a = else_g.add_input("a", t.clone()).unwrap();
    else_g.add_output("r", a).unwrap();

    let mut g = Graph::new("main");
    let p = g.add_input("p", ty("bool[]")).unwrap();
    let x = g.add_input("x", t.clone()).unwrap();
    let y = g
        .add_region_op(Op::Cond, &[p, x], vec![then_g.clone(), else_g.clone()])
        .unwrap();
    assert_eq!(g.value_type(y[0]), &t);
    // A non-scalar predicate is rejected.
    let q = g.add_input("q", ty("bool[2]")).unwrap();
    let e = g
        .add_region_op(Op::Cond, &[q, x], vec![then_g.clone(), else_g.clone()])
        .unwrap_err();
    assert!(e.to_string().contains("bool[2]"), "{e}");
    // A region with the wrong argument types is rejected, naming both.
    let z = g.add_input("z", ty("f32[3]")).unwrap();
    let e = g
        .add_region_op(Op::Cond, &[p, z], vec![then_g.clone(), else_g])
        .unwrap_err()
        .to_string();
    assert!(e.contains("f32[N,4]") && e.contains("f32[3]"), "{e}");

    // while: cond region → bool[], body keeps the carried types.
    let mut cond_g = Graph::new("cond");
    let i = cond_g.add_input("i", ty("i64[]")).unwrap();
    let ten = cond_g.add_scalar(DType::I64, 10.0);
    let lt = cond_g.binary(BinaryOp::Lt, i, ten).unwrap();
    cond_g.add_output("c", lt).unwrap();
    let mut body_g = Graph::new("body");
    let i = body_g.add_input("i", ty("i64[]")).unwrap();
    let one = body_g.add_scalar(DType::I64, 1.0);
    let n = body_g.binary(BinaryOp::Add, i, one).unwrap();
    body_g.add_output("i", n).unwrap();
    let i0 = g.add_scalar(DType::I64, 0.0);
    let r = g
        .add_region_op(Op::While, &[i0], vec![cond_g.clone(), body_g.clone()])
        .unwrap();
    assert_eq!(g.value_type(r[0]).to_string(), "i64[]");
    // Carrying a different type than the regions take is an error naming both.
    let f0 = g.add_scalar(DType::F32, 0.0);
    let e = g
        .add_region_op(Op::While, &[f0], vec![cond_g, body_g])
        .unwrap_err()
        .to_string();
    assert!(e.contains("while") && e.contains("f32[]") && e.contains("i64[]"), "{e}");
    // Wrong number of regions.
    assert!(
        g.add_op(Op::While, &[i0])
            .unwrap_err()
            .to_string()
            .contains("2 regions")
    );
}
