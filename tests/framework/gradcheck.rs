//! Every differentiable primitive's VJP rule against central finite differences in f64.
//!
//! For each case the graph computes `loss = sum(op(x...) * r)` with a fixed random `r`;
//! `append_backward` adds the gradient nodes; the reference backend evaluates both. Tolerance:
//! |analytic − numeric| ≤ 1e-6 + 1e-5·|numeric| with step 1e-6.

use oar::ir::autodiff::append_backward;
use oar::ir::ops::{BinaryOp, ReduceOp, ScatterReduce, SliceRange, UnaryOp};
use oar::ir::ops::{Broadcast, Concat, Conv, Gather, Pad, Permute, Reduce, Reshape, Scatter, Slice};
use oar::ir::{DType, Float, Graph, Op, TensorData, TensorType, ValueId};
use std::collections::BTreeMap;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| lo + (hi - lo) * self.next()).collect()
    }
}

/// One input: its data, and whether to differentiate with respect to it.
struct Arg {
    data: TensorData,
    diff: bool,
}

fn f64s(shape: &[usize], v: Vec<f64>) -> Arg {
    Arg {
        data: TensorData::from_vec(shape.to_vec(), v).unwrap(),
        diff: true,
    }
}

fn ints(shape: &[usize], v: Vec<i64>) -> Arg {
    Arg {
        data: TensorData::from_vec(shape.to_vec(), v).unwrap(),
        diff: false,
    }
}

fn bools(shape: &[usize], v: Vec<bool>) -> Arg {
    Arg {
        data: TensorData::from_vec(shape.to_vec(), v).unwrap(),
        diff: false,
    }
}

fn run(g: &Graph, inputs: &BTreeMap<String, TensorData>) -> Vec<TensorData> {
    oar::reference::run_graph(g, &BTreeMap::new(), inputs)
        .unwrap_or_else(|e| panic!("reference failed: {e}\n{g}"))
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

/// Build `loss = sum(build(xs) * r)`; returns the graph (outputs: loss, then gradients).
fn check(name: &str, args: Vec<Arg>, build: impl Fn(&mut Graph, &[ValueId]) -> ValueId) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
    let mut g = Graph::new(name);
    let xs: Vec<ValueId> = args
        .iter()
        .enumerate()
        .map(|(i, a)| g.add_input(&format!("x{i}"), a.data.tensor_type()).unwrap())
        .collect();
    let y = build(&mut g, &xs);
    let yt: TensorType = g.value_type(y).clone();
    assert_eq!(yt.dtype, DType::F64, "{name}: cases are f64");
    let n = yt.shape.num_elements().unwrap();
    let r = g.add_constant(TensorData::from_vec(yt.shape.as_static().unwrap(), rng.vec(n, -1.0, 1.0)).unwrap());
    let prod = g.binary(BinaryOp::Mul, y, r).unwrap();
    let axes = (0..yt.rank()).collect();
    let loss = g
        .add_op1(
            Op::Reduce(Reduce {
                op: ReduceOp::Sum,
                axes,
                keepdim: false,
            }),
            &[prod],
        )
        .unwrap();
    g.add_output("loss", loss).unwrap();
    let forward = g.clone();
    let wrt: Vec<ValueId> = xs.iter().zip(&args).filter(|(_, a)| a.diff).map(|(x, _)| *x).collect();
    let grads = append_backward(&mut g, loss, &wrt).unwrap_or_else(|e| panic!("{name}: backward: {e}"));
    for (i, gr) in grads.iter().enumerate() {
        let gr = gr.unwrap_or_else(|| panic!("{name}: no gradient for input {i}"));
        g.add_output(&format!("grad{i}"), gr).unwrap();
    }
    oar::ir::verify(&g).unwrap();

    let mut feed: BTreeMap<String, TensorData> = args
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("x{i}"), a.data.clone()))
        .collect();
    let outs = run(&g, &feed);
    let eps = 1e-6;
    let mut gi = 0;
    for (i, a) in args.iter().enumerate() {
        if !a.diff {
            continue;
        }
        gi += 1;
        let analytic = outs[gi].to_vec::<f64>().unwrap();
        assert_eq!(outs[gi].shape(), a.data.shape(), "{name}: grad shape of x{i}");
        let base = a.data.to_vec::<f64>().unwrap();
        for j in 0..base.len() {
            let mut eval = |delta: f64| {
                let mut v = base.clone();
                v[j] += delta;
                feed.insert(
                    format!("x{i}"),
                    TensorData::from_vec(a.data.shape().to_vec(), v).unwrap(),
                );
                run(&forward, &feed)[0].to_vec::<f64>().unwrap()[0]
            };
            let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
            let err = (analytic[j] - numeric).abs();
            assert!(
                err <= 1e-6 + 1e-5 * numeric.abs(),
                "{name}: d/dx{i}[{j}] analytic {} vs numeric {numeric} (err {err:.3e})",
                analytic[j]
            );
        }
        feed.insert(format!("x{i}"), a.data.clone());
    }
}

#[test]
fn unary_ops() {
    let mut rng = Rng(1);
    for u in UnaryOp::ALL {
        let (lo, hi) = match u {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => (0.5, 2.0),
            _ => (-2.0, 2.0),
        };
        if matches!(
            u,
            UnaryOp::Not | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign
        ) {
            continue; // piecewise constant: zero gradient, nothing to difference
        }
        // Keep |x| away from 0 so abs is differentiable at every sample.
        let v: Vec<f64> = rng
            .vec(6, lo, hi)
            .into_iter()
            .map(|x| if x.abs() < 0.1 { x + 0.3 } else { x })
            .collect();
        check(u.name(), vec![f64s(&[2, 3], v)], |g, x| g.unary(*u, x[0]).unwrap());
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    let mut rng = Rng(2);
    for b in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Rem,
    ] {
        let a = rng.vec(6, 0.5, 2.0);
        let c = rng.vec(3, 0.6, 1.9);
        check(
            b.name(),
            vec![f64s(&[2, 3], a.clone()), f64s(&[3], c.clone())],
            |g, x| g.binary(b, x[0], x[1]).unwrap(),
        );
        check(
            b.name(),
            vec![f64s(&[2, 1], a[..2].to_vec()), f64s(&[1, 3], c)],
            |g, x| g.binary(b, x[0], x[1]).unwrap(),
        );
    }
    // Ties in max split the gradient evenly.
    check(
        "max_tie",
        vec![f64s(&[2], vec![1.0, 2.0]), f64s(&[2], vec![1.5, 2.0])],
        |g, x| g.binary(BinaryOp::Max, x[0], x[1]).unwrap(),
    );
}

#[test]
fn where_and_reductions() {
    let mut rng = Rng(3);
    check(
        "where",
        vec![
            bools(&[2, 1], vec![true, false]),
            f64s(&[2, 3], rng.vec(6, -1.0, 1.0)),
            f64s(&[3], rng.vec(3, -1.0, 1.0)),
        ],
        |g, x| g.add_op1(Op::Where, &[x[0], x[1], x[2]]).unwrap(),
    );
    for r in ReduceOp::ALL {
        for (axes, keepdim) in [(vec![1], false), (vec![0, 2], true), (vec![0, 1, 2], false)] {
            let x = rng.vec(24, 0.5, 1.5);
            check(r.name(), vec![f64s(&[2, 3, 4], x)], |g, x| {
                g.add_op1(
                    Op::Reduce(Reduce {
                        op: *r,
                        axes: axes.clone(),
                        keepdim,
                    }),
                    &[x[0]],
                )
                .unwrap()
            });
        }
    }
}

#[test]
fn movement_ops() {
    let mut rng = Rng(4);
    let x = || f64s(&[2, 3, 4], Rng(5).vec(24, -1.0, 1.0));
    check("reshape", vec![x()], |g, x| {
        g.add_op1(
            Op::Reshape(Reshape {
                shape: vec![6.into(), 4.into()],
            }),
            &[x[0]],
        )
        .unwrap()
    });
    check("permute", vec![x()], |g, x| {
        g.add_op1(Op::Permute(Permute { perm: vec![2, 0, 1] }), &[x[0]])
            .unwrap()
    });
    check("broadcast", vec![f64s(&[3, 1], rng.vec(3, -1.0, 1.0))], |g, x| {
        g.add_op1(
            Op::Broadcast(Broadcast {
                shape: vec![2.into(), 3.into(), 4.into()],
            }),
            &[x[0]],
        )
        .unwrap()
    });
    let r = |start, end, step| SliceRange { start, end, step };
    check("slice", vec![x()], |g, x| {
        g.add_op1(
            Op::Slice(Slice {
                ranges: vec![SliceRange::FULL, r(-2, i64::MAX, 1), r(1, 4, 2)],
            }),
            &[x[0]],
        )
        .unwrap()
    });
    check("slice_step3", vec![f64s(&[7], rng.vec(7, -1.0, 1.0))], |g, x| {
        g.add_op1(
            Op::Slice(Slice {
                ranges: vec![r(0, 7, 3)],
            }),
            &[x[0]],
        )
        .unwrap()
    });
    check("pad", vec![x()], |g, x| {
        g.add_op1(
            Op::Pad(Pad {
                before: vec![0, 1, 2],
                after: vec![1, 0, 1],
                value: Float(0.5),
            }),
            &[x[0]],
        )
        .unwrap()
    });
    check("concat", vec![x(), f64s(&[2, 1, 4], rng.vec(8, -1.0, 1.0))], |g, x| {
        g.add_op1(Op::Concat(Concat { axis: 1 }), &[x[0], x[1]]).unwrap()
    });
}

#[test]
fn indexing_and_cast() {
    let mut rng = Rng(6);
    check(
        "gather",
        vec![f64s(&[4, 3], rng.vec(12, -1.0, 1.0)), ints(&[2, 2], vec![0, -1, 2, 0])],
        |g, x| g.add_op1(Op::Gather(Gather { axis: 0 }), &[x[0], x[1]]).unwrap(),
    );
    for reduce in [ScatterReduce::Add, ScatterReduce::Replace] {
        check(
            reduce.name(),
            vec![
                f64s(&[4, 3], rng.vec(12, -1.0, 1.0)),
                ints(&[2], vec![2, 0]),
                f64s(&[4, 2], rng.vec(8, -1.0, 1.0)),
            ],
            |g, x| {
                g.add_op1(Op::Scatter(Scatter { axis: 1, reduce }), &[x[0], x[1], x[2]])
                    .unwrap_or_else(|e| panic!("{e}"))
            },
        );
    }
}

#[test]
fn matmul_batched_broadcast() {
    let mut rng = Rng(7);
    check(
        "matmul",
        vec![
            f64s(&[2, 1, 3, 4], rng.vec(24, -1.0, 1.0)),
            f64s(&[3, 4, 2], rng.vec(24, -1.0, 1.0)),
        ],
        |g, x| g.add_op1(Op::MatMul, &[x[0], x[1]]).unwrap(),
    );
}

#[test]
fn convolutions() {
    let mut rng = Rng(8);
    let conv = |s: Vec<usize>, pb: Vec<usize>, pa: Vec<usize>, d: Vec<usize>, groups| {
        Op::Conv(Conv {
            stride: s,
            pad_before: pb,
            pad_after: pa,
            dilation: d,
            groups,
        })
    };
    // 2-d, stride 2 with a leftover row, asymmetric padding, dilation.
    let op = conv(vec![2, 1], vec![1, 0], vec![0, 2], vec![1, 2], 1);
    check(
        "conv2d",
        vec![
            f64s(&[2, 2, 6, 5], rng.vec(120, -1.0, 1.0)),
            f64s(&[3, 2, 3, 2], rng.vec(36, -1.0, 1.0)),
        ],
        |g, x| g.add_op1(op.clone(), &[x[0], x[1]]).unwrap(),
    );
    // Grouped (and depthwise-like) 1-d.
    let op = conv(vec![2], vec![1], vec![1], vec![1], 2);
    check(
        "conv1d_groups",
        vec![
            f64s(&[2, 4, 7], rng.vec(56, -1.0, 1.0)),
            f64s(&[6, 2, 3], rng.vec(36, -1.0, 1.0)),
        ],
        |g, x| g.add_op1(op.clone(), &[x[0], x[1]]).unwrap(),
    );
    let op = conv(vec![1, 1, 1], vec![0, 1, 0], vec![0, 1, 0], vec![1, 1, 1], 1);
    check(
        "conv3d",
        vec![
            f64s(&[1, 1, 3, 3, 3], rng.vec(27, -1.0, 1.0)),
            f64s(&[2, 1, 2, 2, 2], rng.vec(16, -1.0, 1.0)),
        ],
        |g, x| g.add_op1(op.clone(), &[x[0], x[1]]).unwrap(),
    );
}

/// Every op definition's differentiable samples (`OpDef::samples` marked `grad`), through the
/// eager tape — composites run as their decompositions, so this checks that each one is
/// differentiable and that the primitives' rules compose to its gradient. Float operands are
/// drawn in f64; `loss = sum(y0 · r)` with a fixed random `r`; backward against central
/// differences on up to 12 elements per operand (tolerance of `common::check_grad`).
#[test]
fn every_differentiable_sample_matches_finite_differences() {
    use crate::common::check_grad;
    use oar::Tensor;
    use oar::ir::ops::sample::SampleRng;
    let samples: Vec<_> = Op::all_samples().into_iter().filter(|s| s.grad).collect();
    assert!(samples.len() >= 20, "only {} differentiable samples", samples.len());
    for s in samples {
        let mut rng = SampleRng::for_case(&s.name, 11);
        let xs: Vec<Tensor> = s
            .inputs
            .iter()
            .map(|i| {
                let dt = if i.dtype.is_float() { DType::F64 } else { i.dtype };
                let t = Tensor::from_data(i.domain.tensor(dt, &i.shape, &mut rng));
                if dt.is_float() {
                    t.requires_grad_(true).unwrap()
                } else {
                    t
                }
            })
            .collect();
        let refs: Vec<&Tensor> = xs.iter().collect();
        let y0 = oar::tensor::apply_op(s.op.clone(), &refs).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        let shape = y0[0].shape();
        let n: usize = shape.iter().product();
        let r =
            Tensor::from_data(TensorData::from_vec(shape.clone(), Rng(0x5EED ^ n as u64).vec(n, -1.0, 1.0)).unwrap());
        let loss = || {
            let y = oar::tensor::apply_op(s.op.clone(), &refs).unwrap();
            oar::multiply(&y[0], &r).unwrap().sum(&[], false).unwrap()
        };
        for (i, x) in xs.iter().enumerate().filter(|(_, x)| x.dtype().is_float()) {
            let step = (x.numel() / 12).max(1);
            let entries: Vec<usize> = (0..x.numel()).step_by(step).collect();
            check_grad(x, &entries, &loss, &format!("{} x{i}", s.name));
        }
    }
}
