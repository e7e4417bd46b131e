//! Text format round trips: a graph holding every op variant, every attribute and constants of
//! every dtype prints, parses back to the same ops bit for bit, and prints to the same text;
//! mangled versions of that text give `Ok` or `Err` but never panic.

use oar_ir::ops::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm, Conv2d, CrossEntropy, Dropout, Gelu, LayerNorm,
    LogSoftmax, MaxPool2d, ScaledDotProductAttention, Softmax,
};
use oar_ir::ops::{
    ArgReduce, Broadcast, Cast, Concat, Conv, Gather, Iota, Pad, Permute, Random, Reduce, Reshape, Scatter, Slice,
};
use oar_ir::ops::{ArgReduceOp, BinaryOp, RandomDist, ReduceOp, Reduction, ScatterReduce, SliceRange, UnaryOp};
use oar_ir::text::{parse_graph, print_graph};
use oar_ir::{Composite, DType, Dim, Float, Graph, NodeId, Op, TensorData, TensorType, ValueId};

fn ty(d: DType, dims: &[usize]) -> TensorType {
    TensorType::of(d, dims)
}

fn sym(d: DType, dims: &[&str]) -> TensorType {
    TensorType::new(
        d,
        dims.iter()
            .map(|s| s.parse::<usize>().map(Dim::Static).unwrap_or_else(|_| Dim::sym(s)))
            .collect::<Vec<_>>(),
    )
}

fn one(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    let name = op.name();
    g.add_op1(op, inputs).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn composite(g: &mut Graph, c: Composite, inputs: &[ValueId]) -> ValueId {
    one(g, Op::Composite(c), inputs)
}

/// Constants of every dtype, with the floats that break naive printers.
fn add_constants(g: &mut Graph) {
    let odd_nan32 = f32::from_bits(0x7FC0_0001);
    let f32s = vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        1e-45,
        f32::MAX,
        -f32::NAN,
        odd_nan32,
    ];
    g.add_constant(TensorData::from_vec(vec![2, 4], f32s).unwrap());
    let f64s = vec![
        0.1,
        -0.0,
        f64::NAN,
        5e-324,
        f64::from_bits(0xFFF0_0000_0000_0002),
        1e300,
    ];
    g.add_constant(TensorData::from_vec(vec![6], f64s).unwrap());
    let f16s = [65504.0f32, f32::NAN, -0.0, 6e-8, 1.0 / 3.0];
    let f16s: Vec<half::f16> = f16s.iter().map(|&v| half::f16::from_f32(v)).collect();
    g.add_constant(TensorData::from_vec(vec![5], f16s).unwrap());
    let bf16s = vec![
        half::bf16::from_f32(1.0 / 3.0),
        half::bf16::from_bits(0x7F81),
        half::bf16::MIN_POSITIVE,
    ];
    g.add_constant(TensorData::from_vec(vec![1, 3], bf16s).unwrap());
    g.add_constant(TensorData::from_vec(vec![2], vec![i8::MIN, i8::MAX]).unwrap());
    g.add_constant(TensorData::from_vec(vec![2], vec![0u8, 255]).unwrap());
    g.add_constant(TensorData::from_vec(vec![2, 1], vec![i32::MIN, i32::MAX]).unwrap());
    g.add_constant(TensorData::from_vec(vec![2], vec![i64::MIN, i64::MAX]).unwrap());
    g.add_constant(TensorData::from_vec(vec![3], vec![true, false, true]).unwrap());
    // Scalars, empty tensors of several ranks, a long one (hex form).
    g.add_constant(TensorData::scalar(-2.5f32));
    g.add_constant(TensorData::scalar(false));
    g.add_constant(TensorData::scalar(7u8));
    g.add_constant(TensorData::from_vec::<f32>(vec![0], vec![]).unwrap());
    g.add_constant(TensorData::from_vec::<f32>(vec![2, 0], vec![]).unwrap());
    g.add_constant(TensorData::from_vec::<i64>(vec![0, 3], vec![]).unwrap());
    g.add_constant(TensorData::from_vec::<bool>(vec![1_000_000, 0], vec![]).unwrap());
    let long: Vec<f32> = (0..100).map(|i| i as f32 * 0.37 - 5.0).collect();
    g.add_constant(TensorData::from_vec(vec![4, 25], long).unwrap());
}

/// `cond(pred, args)` whose then-branch applies `then_op` and else-branch negates.
fn cond_regions(arg: &TensorType, then_op: UnaryOp) -> Vec<Graph> {
    let mut then = Graph::new("then");
    let a = then.add_input("a", arg.clone()).unwrap();
    let r = then.unary(then_op, a).unwrap();
    then.add_output("r", r).unwrap();
    let mut els = Graph::new("else branch"); // a name that must be quoted
    let a = els.add_input("0", arg.clone()).unwrap(); // an input name that is not an identifier
    let r = els.unary(UnaryOp::Neg, a).unwrap();
    els.add_output("r", r).unwrap();
    vec![then, els]
}

/// `while (i < 10) { i += 1; v = cond(i > 5, v) ... }`: nested regions, a param in a region.
fn while_regions(v_ty: &TensorType) -> Vec<Graph> {
    let i_ty = ty(DType::I32, &[]);
    let mut c = Graph::new("cond");
    let i = c.add_input("i", i_ty.clone()).unwrap();
    c.add_input("v", v_ty.clone()).unwrap();
    let ten = c.add_constant(TensorData::scalar(10i32));
    let lt = c.binary(BinaryOp::Lt, i, ten).unwrap();
    c.add_output("go", lt).unwrap();

    let mut b = Graph::new("body");
    let i = b.add_input("i", i_ty).unwrap();
    let v = b.add_input("v", v_ty.clone()).unwrap();
    let one = b.add_constant(TensorData::scalar(1i32));
    let i2 = b.binary(BinaryOp::Add, i, one).unwrap();
    let five = b.add_constant(TensorData::scalar(5i32));
    let big = b.binary(BinaryOp::Gt, i2, five).unwrap();
    let v2 = b
        .add_region_op(Op::Cond, &[big, v], cond_regions(v_ty, UnaryOp::Tanh))
        .unwrap()[0];
    let w = b.add_param("w", ty(DType::F32, &[4, 5])).unwrap();
    let _unused = b.add_op1(Op::MatMul, &[v2, w]).unwrap();
    b.add_output("i", i2).unwrap();
    b.add_output("v", v2).unwrap();
    vec![c, b]
}

/// A graph with one node per op variant (every unary/binary/reduce op, every composite, both
/// control-flow ops with nested regions) and constants of every dtype.
pub fn every_op_graph() -> Graph {
    use Composite as C;
    let mut g = Graph::new("every_op");
    let x = g.add_input("x", sym(DType::F32, &["N", "4"])).unwrap();
    let b = g.add_input("b", sym(DType::Bool, &["N", "4"])).unwrap();
    let img = g.add_input("img", ty(DType::F32, &[2, 3, 8, 8])).unwrap();
    let idx = g.add_input("idx", ty(DType::I64, &[3])).unwrap();
    let p = g.add_input("p", ty(DType::Bool, &[])).unwrap();
    let odd = g
        .add_input("odd \"name\"\n", sym(DType::I32, &["batch size", "2"]))
        .unwrap();
    let q = g.add_input("q", ty(DType::F32, &[2, 4, 8])).unwrap();
    let kv = g.add_input("kv", ty(DType::F32, &[2, 6, 8])).unwrap();
    let w = g.add_param("w", ty(DType::F32, &[4, 5])).unwrap();
    let bias = g.add_param("fc.bias", ty(DType::F32, &[5])).unwrap();
    let k = g.add_param("conv.weight", ty(DType::F32, &[4, 3, 3, 3])).unwrap();
    let kb = g.add_param("conv.bias", ty(DType::F32, &[4])).unwrap();
    let c3 = g.add_param("bn.scale", ty(DType::F32, &[3])).unwrap();
    let ln = g.add_param("ln.weight", ty(DType::F32, &[4])).unwrap();
    add_constants(&mut g);

    for &u in UnaryOp::ALL {
        g.unary(u, if u == UnaryOp::Not { b } else { x }).unwrap();
    }
    for &op in BinaryOp::ALL {
        let v = if op.is_logical() { b } else { x };
        g.binary(op, v, v).unwrap();
    }
    g.unary(UnaryOp::Abs, odd).unwrap();
    one(&mut g, Op::Where, &[b, x, x]);
    for (i, &op) in ReduceOp::ALL.iter().enumerate() {
        let axes = if i % 2 == 0 { vec![1] } else { vec![0, 1] };
        one(
            &mut g,
            Op::Reduce(Reduce {
                op,
                axes,
                keepdim: i % 2 == 0,
            }),
            &[x],
        );
    }
    for &op in ArgReduceOp::ALL {
        one(
            &mut g,
            Op::ArgReduce(ArgReduce {
                op,
                axis: 1,
                keepdim: op == ArgReduceOp::ArgMax,
            }),
            &[x],
        );
    }
    let shape = vec![Dim::sym("N"), Dim::Static(2), Dim::Static(2)];
    one(&mut g, Op::Reshape(Reshape { shape }), &[x]);
    one(&mut g, Op::Permute(Permute { perm: vec![0, 2, 3, 1] }), &[img]);
    one(
        &mut g,
        Op::Broadcast(Broadcast {
            shape: vec![Dim::sym("N"), Dim::Static(5)],
        }),
        &[bias],
    );
    let ranges = vec![
        SliceRange::FULL,
        SliceRange::new(1, 3),
        SliceRange {
            start: -3,
            end: i64::MAX,
            step: 1,
        },
        SliceRange {
            start: 2,
            end: -1,
            step: 3,
        },
    ];
    one(&mut g, Op::Slice(Slice { ranges }), &[img]);
    let ranges = vec![
        SliceRange {
            start: 0,
            end: i64::MAX,
            step: 2,
        },
        SliceRange::FULL,
        SliceRange::new(5, 2),
    ];
    one(&mut g, Op::Slice(Slice { ranges }), &[q]);
    for value in [
        0.0,
        -0.0,
        f64::NAN,
        f64::from_bits(0x7FF0_0000_0000_0001),
        f64::NEG_INFINITY,
        1e-5,
    ] {
        let pad = Op::Pad(Pad {
            before: vec![0, 0, 1, 2],
            after: vec![0, 0, 2, 0],
            value: Float(value),
        });
        one(&mut g, pad, &[img]);
    }
    one(&mut g, Op::Concat(Concat { axis: 1 }), &[img, img, img]);
    let gathered = one(&mut g, Op::Gather(Gather { axis: 0 }), &[w, idx]);
    for reduce in [ScatterReduce::Replace, ScatterReduce::Add] {
        one(&mut g, Op::Scatter(Scatter { axis: 0, reduce }), &[w, idx, gathered]);
    }
    for to in DType::ALL {
        one(&mut g, Op::Cast(Cast { to }), &[x]);
    }
    one(
        &mut g,
        Op::Iota(Iota {
            shape: vec![Dim::sym("N"), Dim::Static(3)],
            axis: 1,
            dtype: DType::I64,
        }),
        &[],
    );
    let uniform = RandomDist::Uniform {
        low: Float(-0.0),
        high: Float(1.0),
    };
    let shape = vec![Dim::Static(2), Dim::sym("N")];
    one(
        &mut g,
        Op::Random(Random {
            dist: uniform,
            shape,
            dtype: DType::F32,
            seed: 42,
        }),
        &[],
    );
    let normal = RandomDist::Normal {
        mean: Float(0.5),
        std: Float(2.0),
    };
    one(
        &mut g,
        Op::Random(Random {
            dist: normal,
            shape: vec![Dim::Static(3)],
            dtype: DType::BF16,
            seed: u64::MAX,
        }),
        &[],
    );
    one(&mut g, Op::MatMul, &[x, w]);
    let conv = Op::Conv(Conv {
        stride: vec![1, 2],
        pad_before: vec![1, 0],
        pad_after: vec![1, 2],
        dilation: vec![1, 2],
        groups: 1,
    });
    one(&mut g, conv, &[img, k]);

    composite(&mut g, C::Linear, &[x, w, bias]);
    composite(&mut g, C::Linear, &[x, w]);
    let c2 = C::Conv2d(Conv2d {
        stride: [2, 1],
        padding: [1, 0, 1, 0],
        dilation: [1, 1],
        groups: 1,
    });
    composite(&mut g, c2, &[img, k, kb]);
    let mp = C::MaxPool2d(MaxPool2d {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0, 0, 0],
        ceil_mode: false,
    });
    composite(&mut g, mp, &[img]);
    let ap = C::AvgPool2d(AvgPool2d {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1, 1, 1],
        ceil_mode: true,
        count_include_pad: false,
    });
    composite(&mut g, ap, &[img]);
    composite(
        &mut g,
        C::AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size: [1, 1] }),
        &[img],
    );
    composite(
        &mut g,
        C::AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size: [2, 3] }),
        &[img],
    );
    let bn = C::BatchNorm(BatchNorm {
        epsilon: Float(1e-5),
        momentum: Float(0.9),
        training: true,
    });
    let bn_out = g.add_op(Op::Composite(bn), &[img, c3, c3, c3, c3]).unwrap();
    let bn = C::BatchNorm(BatchNorm {
        epsilon: Float(1e-3),
        momentum: Float(0.99),
        training: false,
    });
    g.add_op(Op::Composite(bn), &[img, c3, c3, c3, c3]).unwrap();
    composite(
        &mut g,
        C::LayerNorm(LayerNorm {
            normalized_ndim: 1,
            epsilon: Float(1e-6),
        }),
        &[x, ln, ln],
    );
    composite(
        &mut g,
        C::LayerNorm(LayerNorm {
            normalized_ndim: 2,
            epsilon: Float(1e-5),
        }),
        &[x],
    );
    composite(&mut g, C::Softmax(Softmax { axis: 1 }), &[x]);
    composite(&mut g, C::LogSoftmax(LogSoftmax { axis: 0 }), &[x]);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        composite(&mut g, C::CrossEntropy(CrossEntropy { reduction }), &[gathered, idx]);
    }
    composite(&mut g, C::Relu, &[x]);
    composite(&mut g, C::Gelu(Gelu { approximate: true }), &[x]);
    composite(&mut g, C::Gelu(Gelu { approximate: false }), &[x]);
    composite(&mut g, C::Silu, &[x]);
    composite(&mut g, C::Sigmoid, &[x]);
    composite(
        &mut g,
        C::Dropout(Dropout {
            p: Float(0.1),
            training: true,
            seed: 7,
        }),
        &[x],
    );
    composite(&mut g, C::Embedding, &[idx, w]);
    let sdpa = C::ScaledDotProductAttention(ScaledDotProductAttention {
        causal: true,
        scale: None,
    });
    composite(&mut g, sdpa, &[q, kv, kv]);
    let mask = g.add_input("mask", ty(DType::Bool, &[4, 6])).unwrap();
    let sdpa = C::ScaledDotProductAttention(ScaledDotProductAttention {
        causal: false,
        scale: Some(Float(0.125)),
    });
    let att = composite(&mut g, sdpa, &[q, kv, kv, mask]);

    let x_ty = g.value_type(x).clone();
    let c = g
        .add_region_op(Op::Cond, &[p, x], cond_regions(&x_ty, UnaryOp::Exp))
        .unwrap()[0];
    let zero = g.add_constant(TensorData::scalar(0i32));
    let wl = g.add_region_op(Op::While, &[zero, x], while_regions(&x_ty)).unwrap();
    // A cond without results (regions with no inputs and no outputs).
    g.add_region_op(Op::Cond, &[p], vec![Graph::new("t"), Graph::new("e")])
        .unwrap();

    g.add_output("y", c).unwrap();
    g.add_output("count", wl[0]).unwrap();
    g.add_output("running mean", bn_out[1]).unwrap();
    g.add_output("att", att).unwrap();
    g
}

/// Ops, input names, output names and graph names, in print order, recursively.
fn summary(g: &Graph) -> Vec<String> {
    let mut order: Vec<NodeId> = g.inputs().to_vec();
    order.extend(g.topo_order().into_iter().filter(|n| !g.inputs().contains(n)));
    let index = |n: NodeId| order.iter().position(|&m| m == n).unwrap();
    let mut out = vec![format!("graph {:?}", g.name())];
    for &n in &order {
        let node = g.node(n);
        let ins: Vec<_> = node.inputs().iter().map(|v| (index(v.node), v.output)).collect();
        // Debug of TensorData is lossy, so constants are compared by dtype, shape and bytes.
        let op = match &node.op {
            Op::Constant(t) => format!("constant {} {:?} {:?}", t.dtype(), t.shape(), t.bytes()),
            Op::Pad(Pad { before, after, value }) => format!("pad {before:?} {after:?} {:x}", value.0.to_bits()),
            op => format!("{op:?}"),
        };
        out.push(format!("{op} {ins:?} -> {:?}", node.outputs()));
        for r in &node.regions {
            out.extend(summary(r));
        }
    }
    for o in g.outputs() {
        out.push(format!(
            "output {:?} = ({}, {})",
            o.name,
            index(o.value.node),
            o.value.output
        ));
    }
    out
}

#[test]
fn every_op_round_trips_exactly() {
    let g = every_op_graph();
    oar_ir::verify(&g).unwrap();
    let text = print_graph(&g);
    let parsed = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    oar_ir::verify(&parsed).unwrap();
    assert_eq!(print_graph(&parsed), text);
    assert_eq!(summary(&parsed), summary(&g));
    // Display delegates to the printer.
    assert_eq!(parsed.to_string(), text);
    // Every op mnemonic of the op set appears.
    for name in [
        "reduce_prod",
        "argmin",
        "sdpa",
        "adaptive_max_pool2d",
        "while",
        "random",
        "xor",
        "not",
    ] {
        assert!(text.contains(&format!(" {name}(")), "{name} missing:\n{text}");
    }
}

#[test]
fn printed_form_is_readable() {
    let text = print_graph(&every_op_graph());
    for expected in [
        "graph @every_op {\n",
        "  %x = input \"x\" : f32[N,4]\n",
        "input \"odd \\\"name\\\"\\n\" : i32[\"batch size\",2]\n",
        "param \"fc.bias\" : f32[5]\n",
        "constant dense<[[nan, inf, -inf, -0.0], [1e-45, 3.4028235e38, -nan, 0x7FC00001]]> : f32[2,4]\n",
        "constant dense<[0.1, -0.0, nan, 5e-324, 0xFFF0000000000002, 1e300]> : f64[6]\n",
        "constant dense<[65504.0, nan, -0.0, 5.9604645e-8, 0.33325195]> : f16[5]\n",
        "constant dense<[-9223372036854775808, 9223372036854775807]> : i64[2]\n",
        "constant dense<-2.5> : f32[]\n",
        "constant dense<[[], []]> : f32[2,0]\n",
        "constant dense<[]> : i64[0,3]\n",
        "constant dense<\"0x\"> : bool[1000000,0]\n",
        "constant dense<\"0x0000A0C0",
        "reduce_sum(%x) {axes = [1], keepdim = true} : f32[N,1]\n",
        "slice(%img) {ranges = [:, 1:3, -3:, 2:-1:3]} : f32[2,2,3,2]\n",
        "slice(%q) {ranges = [::2, :, 5:2]} : f32[1,4,0]\n",
        "{before = [0, 0, 1, 2], after = [0, 0, 2, 0], value = 0x7FF0000000000001}",
        "reshape(%x) : f32[N,2,2]\n",
        "cast(%x) : bf16[N,4]\n",
        "iota() {axis = 1} : i64[N,3]\n",
        "random() {dist = uniform, low = -0.0, high = 1.0, seed = 42} : f32[2,N]\n",
        "scatter(%w, %idx, %",
        "batch_norm(%img, %", // multi-result definition below
        "{epsilon = 1e-5, momentum = 0.9, training = true} : f32[2,3,8,8], f32[3], f32[3]\n",
        "sdpa(%q, %kv, %kv) {causal = true} : f32[2,4,8]\n",
        "{causal = false, scale = 0.125}",
        "    then @then {\n      %a = input \"a\" : f32[N,4]\n",
        "    else @\"else branch\" {\n      %0 = input \"0\" : f32[N,4]\n",
        "  cond(%p) : () {\n    then @t {\n    }\n    else @e {\n    }\n  }\n",
        "  output \"running mean\" = %",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(text.contains(":3 = batch_norm("), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("  output \"running mean\"") && l.ends_with("#1"))
    );
}

/// A tiny xorshift generator: deterministic mutations without a rand dependency.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn parse_never_panics(text: &str) {
    let r = std::panic::catch_unwind(|| {
        if let Ok(g) = parse_graph(text) {
            // Whatever parses must print and parse back to the same text.
            let printed = print_graph(&g);
            let again = parse_graph(&printed).unwrap_or_else(|e| panic!("reprint does not parse: {e}\n{printed}"));
            assert_eq!(print_graph(&again), printed);
        }
    });
    assert!(r.is_ok(), "parser panicked on:\n{text}");
}

#[test]
fn every_prefix_parses_or_errors() {
    let text = print_graph(&every_op_graph());
    // Every prefix of the first 3000 characters, then every 7th (keeps the test fast).
    let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
    for (n, &cut) in cuts.iter().enumerate() {
        if n < 3000 || n % 7 == 0 {
            parse_never_panics(&text[..cut]);
        }
    }
}

#[test]
fn random_mutations_parse_or_error() {
    let text = print_graph(&every_op_graph());
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let pieces: &[&[u8]] = &[
        b"[",
        b"]",
        b"{",
        b"}",
        b"%",
        b"#",
        b"-",
        b"9999999999999999999999",
        b"0x",
        b"\"",
        b"nan",
        b":",
    ];
    for _ in 0..1500 {
        let mut bytes = text.as_bytes().to_vec();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bytes.len());
            match rng.below(4) {
                0 => bytes[at] ^= 1 << rng.below(8),
                1 => {
                    bytes.remove(at);
                }
                2 => {
                    let piece = pieces[rng.below(pieces.len())];
                    bytes.splice(at..at, piece.iter().copied());
                }
                _ => {
                    let len = rng.below(40).min(bytes.len() - at);
                    let chunk = bytes[at..at + len].to_vec();
                    let to = rng.below(bytes.len());
                    bytes.splice(to..to, chunk);
                }
            }
        }
        parse_never_panics(&String::from_utf8_lossy(&bytes));
    }
}

#[test]
fn graphs_built_in_any_order_round_trip() {
    // Inputs added after other nodes, a node removed and its id reused by a later input, uses
    // rewired: the printer still puts inputs first in call order and values before their uses.
    let mut g = Graph::new("edited");
    let w = g.add_param("x", ty(DType::F32, &[3])).unwrap(); // same name as an input below
    let dead = g.add_constant(TensorData::scalar(1.0f32));
    let x = g.add_input("x", ty(DType::F32, &[3])).unwrap();
    let s = g.binary(BinaryOp::Add, x, w).unwrap();
    let t = g.unary(UnaryOp::Exp, s).unwrap();
    g.add_output("t", t).unwrap();
    g.remove_node(dead.node).unwrap();
    let late = g.add_input("late", ty(DType::F32, &[3])).unwrap();
    assert!(late.node < x.node, "petgraph reuses the freed slot");
    let m = g.binary(BinaryOp::Mul, late, x).unwrap();
    g.replace_all_uses(s, m).unwrap();
    oar_ir::verify(&g).unwrap();

    let text = print_graph(&g);
    assert!(
        text.starts_with("graph @edited {\n  %x = input \"x\" : f32[3]\n  %late = input \"late\""),
        "{text}"
    );
    // The param loses the name clash with the input and is numbered instead.
    assert!(text.contains("%0 = param \"x\" : f32[3]\n"), "{text}");
    let parsed = parse_graph(&text).unwrap();
    assert_eq!(print_graph(&parsed), text);
    assert_eq!(summary(&parsed), summary(&g));
    let names: Vec<_> = parsed.input_specs().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["x", "late"]);
}

#[test]
fn empty_and_oddly_named_graphs_round_trip() {
    for name in ["", "with space", "üñí\u{7}", "1st", "a\"b\\c"] {
        let g = Graph::new(name);
        let text = print_graph(&g);
        let parsed = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(parsed.name(), name);
        assert_eq!(print_graph(&parsed), text);
    }
    assert_eq!(print_graph(&Graph::new("g")), "graph @g {\n}\n");
}
