//! Fusion: kernel counts and kinds for MLP, ResNet block, transformer layer and elementwise
//! chains, and every fused program checked against the reference backend on the original graph.
//! Tolerance: 1e-5 relative + 1e-6 absolute (the kernel interpreter uses the reference's op
//! semantics; only reduction/contraction grouping can differ).

use oar_backend_reference::{run_graph, run_kernel_program};
use oar_ir::kernel::{KernelBody, KernelProgram, ScalarOp};
use oar_ir::ops::{
    ArgReduce, BatchNorm, Cast, Concat, Conv2d, Gelu, LayerNorm, Permute, Reduce, Reshape, Slice, Softmax,
};
use oar_ir::ops::{BinaryOp, Composite, ReduceOp, SliceRange, UnaryOp};
use oar_ir::{DType, Dim, Float, Graph, Op, TensorData, TensorType, ValueId, Weights};
use oar_passes::fuse::{fuse, fuse_keeping};
use std::collections::BTreeMap;

/// Deterministic values in [-1, 1).
fn data(shape: &[usize], seed: u64) -> TensorData {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64 * 2.0 - 1.0) as f32
        })
        .collect();
    TensorData::from_vec(shape.to_vec(), v).unwrap()
}

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::of(DType::F32, dims)
}

fn param(g: &mut Graph, w: &mut Weights, name: &str, dims: &[usize]) -> ValueId {
    w.insert(name.into(), data(dims, w.len() as u64 + 100));
    g.add_param(name, f32t(dims)).unwrap()
}

fn comp(g: &mut Graph, c: Composite, ins: &[ValueId]) -> ValueId {
    g.add_op1(Op::Composite(c), ins).unwrap()
}

/// Fuse, run both ways, compare; returns the program.
fn check(g: &Graph, w: &Weights, inputs: &BTreeMap<String, TensorData>) -> KernelProgram {
    let p = fuse(g).unwrap();
    let want = run_graph(g, w, inputs).unwrap();
    let got = run_kernel_program(&p, w, inputs).unwrap_or_else(|e| panic!("{e}\n{p}"));
    assert_eq!(want.len(), got.len());
    for ((n1, a), (n2, b)) in want.iter().zip(&got) {
        assert_eq!(n1, n2);
        assert_eq!(a.shape(), b.shape(), "{n1}");
        for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
            assert!((x - y).abs() <= 1e-6 + 1e-5 * x.abs(), "{n1}: {x} vs {y}\n{p}");
        }
    }
    // The description round-trips through serde.
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<KernelProgram>(&json).unwrap(), p);
    p
}

fn contraction_ops(p: &KernelProgram) -> Vec<Vec<String>> {
    p.kernels
        .iter()
        .filter_map(|k| match &k.body {
            KernelBody::Contraction(c) => Some(c.epilogue.iter().map(|i| i.op.to_string()).collect()),
            _ => None,
        })
        .collect()
}

#[test]
fn mlp_fuses_bias_and_relu_into_matmul_epilogues_with_symbolic_batch() {
    let mut g = Graph::new("mlp");
    let mut w = Weights::new();
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(8)]))
        .unwrap();
    let (w1, b1) = (
        param(&mut g, &mut w, "w1", &[8, 16]),
        param(&mut g, &mut w, "b1", &[16]),
    );
    let (w2, b2) = (param(&mut g, &mut w, "w2", &[16, 4]), param(&mut g, &mut w, "b2", &[4]));
    let h = comp(&mut g, Composite::Linear, &[x, w1, b1]);
    let h = comp(&mut g, Composite::Relu, &[h]);
    let y = comp(&mut g, Composite::Linear, &[h, w2, b2]);
    let y = comp(&mut g, Composite::Relu, &[y]);
    g.add_output("y", y).unwrap();
    let inputs = BTreeMap::from([("x".to_string(), data(&[5, 8], 1))]);
    let p = check(&g, &w, &inputs);
    println!("{p}");
    assert_eq!(p.kernels.len(), 2, "{p}");
    assert_eq!(p.kernel_counts(), (0, 2, 0));
    for epi in contraction_ops(&p) {
        assert!(
            epi.iter().any(|o| o.starts_with("add")) && epi.iter().any(|o| o.starts_with("max")),
            "{epi:?}"
        );
    }
    // N stays symbolic in the program; a different N runs the same program.
    assert!(p.buffers.iter().any(|b| b.ty.shape.0[0] == Dim::sym("N")));
    let inputs = BTreeMap::from([("x".to_string(), data(&[2, 8], 2))]);
    check(&g, &w, &inputs);
}

fn conv_bn(g: &mut Graph, w: &mut Weights, x: ValueId, name: &str, c: usize) -> ValueId {
    let k = param(g, w, &format!("{name}.w"), &[c, c, 3, 3]);
    let y = g
        .add_op1(
            Op::Composite(Composite::Conv2d(Conv2d {
                stride: [1, 1],
                padding: [1, 1, 1, 1],
                dilation: [1, 1],
                groups: 1,
            })),
            &[x, k],
        )
        .unwrap();
    let scale = param(g, w, &format!("{name}.scale"), &[c]);
    let bias = param(g, w, &format!("{name}.bias"), &[c]);
    let mean = param(g, w, &format!("{name}.mean"), &[c]);
    w.insert(
        format!("{name}.var"),
        TensorData::from_vec(vec![c], vec![0.5f32; c]).unwrap(),
    );
    let var = g.add_param(&format!("{name}.var"), f32t(&[c])).unwrap();
    comp(
        g,
        Composite::BatchNorm(BatchNorm {
            epsilon: Float(1e-5),
            momentum: Float(0.9),
            training: false,
        }),
        &[y, scale, bias, mean, var],
    )
}

/// A ResNet basic block on `x: f32[2, 4, 6, 6]`: relu(bn(conv(relu(bn(conv(x))))) + x).
fn basic_block() -> (Graph, Weights) {
    let mut g = Graph::new("block");
    let mut w = Weights::new();
    let x = g.add_input("x", f32t(&[2, 4, 6, 6])).unwrap();
    let h = conv_bn(&mut g, &mut w, x, "c1", 4);
    let h = comp(&mut g, Composite::Relu, &[h]);
    let h = conv_bn(&mut g, &mut w, h, "c2", 4);
    let s = g.binary(BinaryOp::Add, h, x).unwrap();
    let y = comp(&mut g, Composite::Relu, &[s]);
    g.add_output("y", y).unwrap();
    (g, w)
}

#[test]
fn resnet_basic_block_is_two_conv_kernels() {
    let (g, w) = basic_block();
    let p = check(&g, &w, &BTreeMap::from([("x".to_string(), data(&[2, 4, 6, 6], 3))]));
    assert_eq!(p.kernel_counts(), (0, 2, 0), "{p}");
    // The residual add reads x in the second conv's epilogue.
    let epi = &contraction_ops(&p)[1];
    assert!(epi.iter().filter(|o| o.starts_with("load")).count() >= 4, "{epi:?}");
}

/// For a runtime that runs weight-only kernels once per model (the cpu backend), what the
/// batch norms compute from their parameters alone (the per-channel scale `γ / sqrt(σ² + ε)`)
/// is a loop kernel of its own that reads only weights, not inline in every element of the
/// convolutions' epilogues; the program still computes the graph.
#[test]
fn weight_only_values_get_kernels_of_their_own_where_the_runtime_runs_them_once() {
    let (g, w) = basic_block();
    let p = oar_passes::fuse::lower_to_kernels_hoisting_weights(&g, &BTreeMap::new(), &[], |_, _| true).unwrap();
    let inputs = BTreeMap::from([("x".to_string(), data(&[2, 4, 6, 6], 3))]);
    let want = run_graph(&g, &w, &inputs).unwrap();
    let got = run_kernel_program(&p, &w, &inputs).unwrap();
    for ((n, a), (_, b)) in got.iter().zip(&want) {
        for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
            assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{n}: {x} vs {y}");
        }
    }
    let (loops, contractions, opaque) = p.kernel_counts();
    assert_eq!((contractions, opaque), (2, 0), "{p}");
    assert!(loops >= 1, "{p}");
    // Buffers computed from weights alone so far.
    let mut fixed: Vec<bool> = p.buffers.iter().map(|b| b.kind.is_weight()).collect();
    for k in &p.kernels {
        if matches!(k.body, KernelBody::Loop(_)) {
            let weight_only = k.reads().iter().all(|&b| fixed[b.index()]);
            assert!(weight_only, "{} reads more than weights\n{p}", k.name);
            for o in &k.outputs {
                fixed[o.index()] = true;
            }
        }
    }
    for c in contraction_ops(&p) {
        assert!(!c.iter().any(|o| o.contains("rsqrt") || o.contains("sqrt")), "{c:?}");
    }
}

/// `fold-batch-norm`: both inference batch norms of a basic block fold into their
/// convolutions (weight · γ/sqrt(σ²+ε), bias (0 − μ)·k + β), the numbers stay within float
/// rounding (1e-5 relative), and a convolution whose result has another reader keeps its
/// batch norm.
#[test]
fn batch_norm_folds_into_the_convolution_before_it() {
    use oar_passes::{FoldBatchNorm, Pass};
    let (g, w) = basic_block();
    let inputs = BTreeMap::from([("x".to_string(), data(&[2, 4, 6, 6], 3))]);
    let want = run_graph(&g, &w, &inputs).unwrap();
    let mut folded = g.clone();
    assert!(FoldBatchNorm.run(&mut folded).unwrap());
    let text = folded.to_string();
    assert!(!text.contains("batch_norm"), "{text}");
    assert_eq!(text.matches("conv2d").count(), 2, "{text}");
    let got = run_graph(&folded, &w, &inputs).unwrap();
    for (a, b) in want[0].1.to_f64_vec().iter().zip(got[0].1.to_f64_vec()) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
    }
    assert!(!FoldBatchNorm.run(&mut folded).unwrap(), "nothing left to fold");

    // The convolution's result is also an output: folding would change it.
    let mut g2 = Graph::new("shared");
    let mut w2 = Weights::new();
    let x = g2.add_input("x", f32t(&[1, 4, 6, 6])).unwrap();
    let y = conv_bn(&mut g2, &mut w2, x, "c", 4);
    let conv = g2.node(y.node).inputs()[0];
    g2.add_output("y", y).unwrap();
    g2.add_output("conv", conv).unwrap();
    assert!(!FoldBatchNorm.run(&mut g2).unwrap());
}

#[test]
fn layer_norm_and_softmax_are_one_kernel_each() {
    let mut g = Graph::new("ln");
    let mut w = Weights::new();
    let x = g.add_input("x", f32t(&[2, 3, 8])).unwrap();
    let (gw, gb) = (param(&mut g, &mut w, "g", &[8]), param(&mut g, &mut w, "b", &[8]));
    let y = comp(
        &mut g,
        Composite::LayerNorm(LayerNorm {
            normalized_ndim: 1,
            epsilon: Float(1e-5),
        }),
        &[x, gw, gb],
    );
    g.add_output("y", y).unwrap();
    let p = check(&g, &w, &BTreeMap::from([("x".to_string(), data(&[2, 3, 8], 4))]));
    println!("{p}");
    // Per row of [2, 3]: the mean, then the variance (which reads the mean), then the
    // normalized, scaled and shifted row.
    assert_eq!(p.kernels.len(), 1, "{p}");
    let KernelBody::Loop(ln) = &p.kernels[0].body else {
        panic!("{p}")
    };
    assert_eq!(ln.outer, 2, "{p}");
    let ops: Vec<ReduceOp> = ln.reduce.iter().map(|r| r.op).collect();
    assert_eq!(ops, [ReduceOp::Mean, ReduceOp::Mean], "{p}");
    assert!(
        ln.reduce[1].body.iter().any(|i| i.op == ScalarOp::Acc(0)),
        "the variance stage reads the mean: {p}"
    );
    for needed in [ScalarOp::Acc(0), ScalarOp::Acc(1)] {
        assert!(ln.body.iter().any(|i| i.op == needed), "{p}");
    }
    assert!(
        ln.body
            .iter()
            .any(|i| matches!(i.op, ScalarOp::Unary(UnaryOp::Rsqrt, _))),
        "{p}"
    );

    // Over 2-d rows (normalized_ndim = 2): still one kernel, one outer loop.
    let mut g = Graph::new("ln2");
    let mut w = Weights::new();
    let x = g.add_input("x", f32t(&[3, 4, 5])).unwrap();
    let (gw, gb) = (param(&mut g, &mut w, "g", &[4, 5]), param(&mut g, &mut w, "b", &[4, 5]));
    let c = Composite::LayerNorm(LayerNorm {
        normalized_ndim: 2,
        epsilon: Float(1e-5),
    });
    let y = comp(&mut g, c, &[x, gw, gb]);
    g.add_output("y", y).unwrap();
    let p = check(&g, &w, &BTreeMap::from([("x".to_string(), data(&[3, 4, 5], 7))]));
    assert_eq!(p.kernels.len(), 1, "{p}");
    let KernelBody::Loop(ln) = &p.kernels[0].body else {
        panic!("{p}")
    };
    assert_eq!((ln.outer, ln.reduce[0].dims.len()), (1, 2), "{p}");

    let mut g = Graph::new("softmax");
    let x = g.add_input("x", f32t(&[4, 5])).unwrap();
    let y = comp(&mut g, Composite::Softmax(Softmax { axis: 1 }), &[x]);
    g.add_output("y", y).unwrap();
    let p = check(
        &g,
        &Weights::new(),
        &BTreeMap::from([("x".to_string(), data(&[4, 5], 5))]),
    );
    // Per row: max; sum of exp(x - max); then exp(x - max) / sum.
    assert_eq!(p.kernels.len(), 1, "{p}");
    let KernelBody::Loop(sm) = &p.kernels[0].body else {
        panic!("{p}")
    };
    let ops: Vec<ReduceOp> = sm.reduce.iter().map(|r| r.op).collect();
    assert_eq!(ops, [ReduceOp::Max, ReduceOp::Sum], "{p}");

    // Softmax over a leading axis reads its reductions at a column, not a row: the
    // reductions get kernels of their own.
    let mut g = Graph::new("softmax0");
    let x = g.add_input("x", f32t(&[4, 5])).unwrap();
    let y = comp(&mut g, Composite::Softmax(Softmax { axis: 0 }), &[x]);
    g.add_output("y", y).unwrap();
    let p = check(
        &g,
        &Weights::new(),
        &BTreeMap::from([("x".to_string(), data(&[4, 5], 6))]),
    );
    assert!(p.kernels.len() > 1, "{p}");
}

#[test]
fn a_reduction_read_by_two_kernels_is_stored_once() {
    // s = sum(x, 1) is an output and also normalizes x: one kernel computes it, the other
    // reads its buffer instead of reducing again.
    let mut g = Graph::new("shared_sum");
    let x = g.add_input("x", f32t(&[3, 6])).unwrap();
    let s = g
        .add_op1(
            Op::Reduce(Reduce {
                op: ReduceOp::Sum,
                axes: vec![1],
                keepdim: true,
            }),
            &[x],
        )
        .unwrap();
    let y = g.binary(BinaryOp::Div, x, s).unwrap();
    let s2 = g.binary(BinaryOp::Mul, s, s).unwrap();
    g.add_output("y", y).unwrap();
    g.add_output("s2", s2).unwrap();
    let p = check(
        &g,
        &Weights::new(),
        &BTreeMap::from([("x".to_string(), data(&[3, 6], 8))]),
    );
    let stages: usize = p
        .kernels
        .iter()
        .map(|k| match &k.body {
            KernelBody::Loop(l) => l.reduce.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(stages, 1, "{p}");
}

#[test]
fn transformer_encoder_layer_matches_reference() {
    let (b, s, d, f) = (2, 4, 8, 16);
    let mut g = Graph::new("encoder");
    let mut w = Weights::new();
    let x = g
        .add_input(
            "x",
            TensorType::new(DType::F32, vec![Dim::sym("B"), Dim::Static(s), Dim::Static(d)]),
        )
        .unwrap();
    let ln = |g: &mut Graph, w: &mut Weights, x, n: &str| {
        let (gw, gb) = (
            param(g, w, &format!("{n}.g"), &[d]),
            param(g, w, &format!("{n}.b"), &[d]),
        );
        let c = Composite::LayerNorm(LayerNorm {
            normalized_ndim: 1,
            epsilon: Float(1e-5),
        });
        g.add_op1(Op::Composite(c), &[x, gw, gb]).unwrap()
    };
    let lin = |g: &mut Graph, w: &mut Weights, x, n: &str, i: usize, o: usize| {
        let (ww, wb) = (
            param(g, w, &format!("{n}.w"), &[i, o]),
            param(g, w, &format!("{n}.b"), &[o]),
        );
        g.add_op1(Op::Composite(Composite::Linear), &[x, ww, wb]).unwrap()
    };
    let h = ln(&mut g, &mut w, x, "ln1");
    let q = lin(&mut g, &mut w, h, "q", d, d);
    let k = lin(&mut g, &mut w, h, "k", d, d);
    let v = lin(&mut g, &mut w, h, "v", d, d);
    let kt = g.add_op1(Op::Permute(Permute { perm: vec![0, 2, 1] }), &[k]).unwrap();
    let sc = g.add_op1(Op::MatMul, &[q, kt]).unwrap();
    let sc = g.binary_scalar_f32(sc, 1.0 / (d as f64).sqrt());
    let a = comp(&mut g, Composite::Softmax(Softmax { axis: 2 }), &[sc]);
    let att = g.add_op1(Op::MatMul, &[a, v]).unwrap();
    let o = lin(&mut g, &mut w, att, "o", d, d);
    let r1 = g.binary(BinaryOp::Add, x, o).unwrap();
    let h2 = ln(&mut g, &mut w, r1, "ln2");
    let f1 = lin(&mut g, &mut w, h2, "ff1", d, f);
    let f1 = comp(&mut g, Composite::Gelu(Gelu { approximate: false }), &[f1]);
    let f2 = lin(&mut g, &mut w, f1, "ff2", f, d);
    let y = g.binary(BinaryOp::Add, r1, f2).unwrap();
    g.add_output("y", y).unwrap();
    let p = check(&g, &w, &BTreeMap::from([("x".to_string(), data(&[b, s, d], 6))]));
    println!("{p}");
    let (loops, contractions, opaque) = p.kernel_counts();
    println!(
        "encoder layer: {} kernels ({loops} loop, {contractions} matmul, {opaque} opaque)",
        p.kernels.len()
    );
    assert_eq!(opaque, 0);
    // q, k, v, scores, attention, out proj, ff1, ff2.
    assert_eq!(contractions, 8, "{p}");
    // ln1, softmax (the scores matmul takes the scale as epilogue), ln2: one loop kernel each.
    assert_eq!(loops, 3, "{p}");
    // The k transpose is folded into the scores matmul's operand map, not materialized.
    assert!(p.kernels.iter().all(|k| !k.name.contains("copy")), "{p}");
    // bias + GELU (erf) fused into ff1's epilogue.
    assert!(
        contraction_ops(&p)
            .iter()
            .any(|e| e.iter().any(|o| o.starts_with("erf")))
    );
}

trait ScalarMul {
    fn binary_scalar_f32(&mut self, x: ValueId, s: f64) -> ValueId;
}
impl ScalarMul for Graph {
    fn binary_scalar_f32(&mut self, x: ValueId, s: f64) -> ValueId {
        let c = self.add_scalar(DType::F32, s);
        self.binary(BinaryOp::Mul, x, c).unwrap()
    }
}

#[test]
fn elementwise_chain_with_transpose_broadcast_slice_and_view_is_one_kernel() {
    let mut g = Graph::new("chain");
    let a = g.add_input("a", f32t(&[3, 4])).unwrap();
    let b = g.add_input("b", f32t(&[3])).unwrap();
    let flat = g.add_input("flat", f32t(&[12])).unwrap();
    let at = g.add_op1(Op::Permute(Permute { perm: vec![1, 0] }), &[a]).unwrap(); // [4,3]
    let s = g.binary(BinaryOp::Add, at, b).unwrap(); // b broadcast along rows
    let e = g.unary(UnaryOp::Exp, s).unwrap();
    let v = g
        .add_op1(
            Op::Reshape(Reshape {
                shape: vec![Dim::Static(4), Dim::Static(3)],
            }),
            &[flat],
        )
        .unwrap();
    let m = g.binary(BinaryOp::Mul, e, v).unwrap();
    let sl = g
        .add_op1(
            Op::Slice(Slice {
                ranges: vec![
                    SliceRange {
                        start: 1,
                        end: 4,
                        step: 2,
                    },
                    SliceRange::FULL,
                ],
            }),
            &[m],
        )
        .unwrap(); // rows 1 and 3
    let c = g.add_op1(Op::Cast(Cast { to: DType::F64 }), &[sl]).unwrap();
    g.add_output("y", c).unwrap();
    let inputs = BTreeMap::from([
        ("a".to_string(), data(&[3, 4], 7)),
        ("b".to_string(), data(&[3], 8)),
        ("flat".to_string(), data(&[12], 9)),
    ]);
    let p = check(&g, &Weights::new(), &inputs);
    println!("{p}");
    assert_eq!(p.kernels.len(), 1, "{p}");
    let KernelBody::Loop(k) = &p.kernels[0].body else {
        panic!()
    };
    let maps: Vec<String> = k.loads.iter().map(|l| l.to_string()).collect();
    // a transposed and sliced: row 2*i0+1 of the transpose is column 2*i0+1 of a.
    assert!(maps.contains(&"b0 as [3,4][i1, 2*i0 + 1]".to_string()), "{maps:?}");
    assert!(maps.contains(&"b1 as [3][i1]".to_string()), "{maps:?}");
    assert!(maps.contains(&"b2 as [4,3][2*i0 + 1, i1]".to_string()), "{maps:?}");
}

#[test]
fn opaque_ops_get_their_own_kernels_and_the_program_is_complete() {
    let mut g = Graph::new("opaque");
    let a = g.add_input("a", f32t(&[2, 3])).unwrap();
    let e = g.unary(UnaryOp::Exp, a).unwrap();
    let c = g.add_op1(Op::Concat(Concat { axis: 0 }), &[e, a]).unwrap(); // [4,3]
    let am = g
        .add_op1(
            Op::ArgReduce(ArgReduce {
                op: oar_ir::ops::ArgReduceOp::ArgMax,
                axis: 1,
                keepdim: false,
            }),
            &[c],
        )
        .unwrap();
    let n = g.unary(UnaryOp::Neg, c).unwrap();
    g.add_output("arg", am).unwrap();
    g.add_output("neg", n).unwrap();
    let p = check(
        &g,
        &Weights::new(),
        &BTreeMap::from([("a".to_string(), data(&[2, 3], 10))]),
    );
    assert_eq!(p.kernel_counts(), (2, 0, 2), "{p}");
}

#[test]
fn fuse_pass_is_registered_and_leaves_the_graph_alone() {
    let mut g = Graph::new("t");
    let a = g.add_input("a", f32t(&[2])).unwrap();
    let e = g.unary(UnaryOp::Exp, a).unwrap();
    g.add_output("y", e).unwrap();
    let mut pm = oar_passes::PassManager::from_names(&["fuse"]).unwrap();
    let report = pm.run(&mut g).unwrap();
    assert!(!report.changed());
    let f = oar_passes::Fuse::default();
    oar_passes::Pass::run(&f, &mut g).unwrap();
    assert_eq!(f.last_kernel_count(), Some(1));
}

#[test]
fn kept_composites_become_opaque_kernels() {
    // softmax(layer_norm(x) · w): a backend with its own softmax keeps it whole.
    let mut g = Graph::new("kept");
    let mut w = Weights::new();
    let x = g.add_input("x", f32t(&[3, 8])).unwrap();
    let (gw, gb) = (param(&mut g, &mut w, "g", &[8]), param(&mut g, &mut w, "b", &[8]));
    let c = Composite::LayerNorm(LayerNorm {
        normalized_ndim: 1,
        epsilon: Float(1e-5),
    });
    let h = comp(&mut g, c, &[x, gw, gb]);
    let wm = param(&mut g, &mut w, "w", &[8, 5]);
    let s = g.add_op1(Op::MatMul, &[h, wm]).unwrap();
    let y = comp(&mut g, Composite::Softmax(Softmax { axis: 1 }), &[s]);
    g.add_output("y", y).unwrap();
    let inputs = BTreeMap::from([("x".to_string(), data(&[3, 8], 9))]);
    let p = fuse_keeping(&g, &["softmax"]).unwrap();
    let opaque: Vec<&Op> = p
        .kernels
        .iter()
        .filter_map(|k| match &k.body {
            KernelBody::Opaque(o) => Some(&o.op),
            _ => None,
        })
        .collect();
    assert_eq!(opaque, [&Op::Composite(Composite::Softmax(Softmax { axis: 1 }))], "{p}");
    // layer_norm (not kept) is still one fused row kernel; the matmul its own kernel.
    assert_eq!(p.kernel_counts(), (1, 1, 1), "{p}");
    let want = run_graph(&g, &w, &inputs).unwrap();
    let got = run_kernel_program(&p, &w, &inputs).unwrap_or_else(|e| panic!("{e}\n{p}"));
    for (x, y) in want[0].1.to_f64_vec().iter().zip(got[0].1.to_f64_vec()) {
        assert!((x - y).abs() <= 1e-6 + 1e-5 * x.abs(), "{x} vs {y}\n{p}");
    }
    // Keeping nothing is `fuse`; an unknown name is a typed error listing the known ones.
    assert_eq!(fuse_keeping(&g, &[]).unwrap(), fuse(&g).unwrap());
    let e = fuse_keeping(&g, &["softmaxx"]).unwrap_err().to_string();
    assert!(e.contains("softmaxx") && e.contains("layer_norm"), "{e}");
}

/// A one-element value that takes a division and a `pow` (a bias correction,
/// `lr / (1 - 0.9^t)`) read by a kernel over many elements is computed once, in its own
/// kernel; the wide kernel reads its buffer instead of recomputing `pow` per element. A cheap
/// one-element chain (`t + 1`) stays inline.
#[test]
fn costly_scalars_get_their_own_kernel() {
    let mut g = Graph::new("bias_correction");
    let x = g.add_input("x", f32t(&[256, 64])).unwrap();
    let t = g.add_input("t", f32t(&[])).unwrap();
    let beta = g.add_constant(TensorData::scalar(0.9f32));
    let one = g.add_constant(TensorData::scalar(1.0f32));
    let p = g.add_op1(Op::Binary(BinaryOp::Pow), &[beta, t]).unwrap();
    let d = g.add_op1(Op::Binary(BinaryOp::Sub), &[one, p]).unwrap();
    let s = g.add_op1(Op::Binary(BinaryOp::Div), &[one, d]).unwrap();
    let y = g.add_op1(Op::Binary(BinaryOp::Mul), &[x, s]).unwrap();
    g.add_output("y", y).unwrap();
    let inputs = BTreeMap::from([
        ("x".to_string(), data(&[256, 64], 3)),
        ("t".to_string(), TensorData::scalar(3.0f32)),
    ]);
    let prog = check(&g, &Weights::new(), &inputs);
    assert_eq!(prog.kernels.len(), 2, "{prog}");
    let text = prog.to_string();
    // The kernel that writes the output (`-> b3`, f32[256,64]).
    let wide = text
        .split("\n  k")
        .find(|k| k.lines().next().is_some_and(|l| l.contains("-> b3")))
        .unwrap_or_else(|| panic!("{prog}"));
    assert!(!wide.contains("pow"), "the wide kernel recomputes pow:\n{prog}");

    let mut g = Graph::new("cheap_scalar");
    let x = g.add_input("x", f32t(&[256, 64])).unwrap();
    let t = g.add_input("t", f32t(&[])).unwrap();
    let one = g.add_constant(TensorData::scalar(1.0f32));
    let t1 = g.add_op1(Op::Binary(BinaryOp::Add), &[t, one]).unwrap();
    let y = g.add_op1(Op::Binary(BinaryOp::Mul), &[x, t1]).unwrap();
    g.add_output("y", y).unwrap();
    let prog = check(&g, &Weights::new(), &inputs);
    assert_eq!(prog.kernels.len(), 1, "{prog}");
}
