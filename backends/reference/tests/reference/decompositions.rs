//! Every composite's decomposition (`oar_ir::decompose`) against the reference backend's
//! native implementation of the composite, on random inputs.
//!
//! For each case: build a graph holding the composite, run it natively; replace the composite
//! by its decomposition (what the `decompose` pass of oar-passes does, inlined here because
//! this crate does not depend on oar-passes), check no composite is left, run that; compare.
//! Tolerance: each element within `tol · (|expected| + max|expected|)` with tol = 1e-5 for f32
//! and 1e-12 for f64 (the decomposition rounds after every primitive while the native op
//! rounds once, and centered quantities such as `x - mean` carry absolute, not relative, error);
//! integer and bool outputs, and non-finite values, must match exactly.

use oar_backend_reference::run_graph;
use oar_ir::decompose::decompose;
use oar_ir::ops::Reduction;
use oar_ir::ops::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm, Conv2d, CrossEntropy, Dropout, Gelu, LayerNorm,
    LogSoftmax, MaxPool2d, ScaledDotProductAttention, Softmax,
};
use oar_ir::{Composite, DType, Dim, Float, Graph, Op, TensorData, TensorType, ValueId, Weights};
use std::collections::BTreeMap;

/// xorshift64*: tiny, deterministic, good enough for test inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// How an input's values are drawn.
#[derive(Clone, Copy)]
enum Gen {
    /// Uniform floats in `[lo, hi)`.
    Float(f64, f64),
    /// Uniform integers in `[lo, hi)`.
    Int(i64, i64),
    /// Bools, true with this probability; element 0 of each last-axis row is always true.
    Bool(f64),
}

/// One operand: its declared type (maybe symbolic), its actual shape, and its values.
struct In {
    ty: TensorType,
    shape: Vec<usize>,
    generator: Gen,
}

/// A float operand of static shape, values in `[-1, 1)`.
fn f(dt: DType, shape: &[usize]) -> In {
    In {
        ty: TensorType::of(dt, shape),
        shape: shape.to_vec(),
        generator: Gen::Float(-1.0, 1.0),
    }
}

/// Like [`f`] with axis 0 declared as the symbolic batch dim `N`.
fn fsym(dt: DType, shape: &[usize]) -> In {
    let mut x = f(dt, shape);
    x.ty.shape.0[0] = Dim::sym("N");
    x
}

impl In {
    fn range(mut self, lo: f64, hi: f64) -> In {
        self.generator = match self.generator {
            Gen::Int(..) => Gen::Int(lo as i64, hi as i64),
            _ => Gen::Float(lo, hi),
        };
        self
    }

    fn data(&self, rng: &mut Rng) -> TensorData {
        let n: usize = self.shape.iter().product();
        let last = self.shape.last().copied().unwrap_or(1).max(1);
        let vals: Vec<f64> = (0..n)
            .map(|i| match self.generator {
                Gen::Float(lo, hi) => rng.uniform(lo, hi),
                Gen::Int(lo, hi) => lo as f64 + (rng.next() % (hi - lo) as u64) as f64,
                Gen::Bool(p) => f64::from(i % last == 0 || rng.uniform(0.0, 1.0) < p),
            })
            .collect();
        TensorData::from_f64_slice(self.ty.dtype, self.shape.clone(), &vals).expect("test tensor")
    }
}

/// An integer operand with values in `[lo, hi)`.
fn ints(dt: DType, shape: &[usize], lo: i64, hi: i64) -> In {
    In {
        ty: TensorType::of(dt, shape),
        shape: shape.to_vec(),
        generator: Gen::Int(lo, hi),
    }
}

/// A bool operand (true with probability `p`).
fn bools(shape: &[usize], p: f64) -> In {
    In {
        ty: TensorType::of(DType::Bool, shape),
        shape: shape.to_vec(),
        generator: Gen::Bool(p),
    }
}

/// Replace every composite of `g` by its decomposition, as the `decompose` pass does.
fn decomposed(g: &Graph) -> Graph {
    let mut d = g.clone();
    for node in d.topo_order() {
        let (op, inputs) = match &d.node(node).op {
            Op::Composite(c) => (c.clone(), d.node(node).inputs().to_vec()),
            _ => continue,
        };
        let outs = decompose(&op, &mut d, &inputs).unwrap_or_else(|e| panic!("decompose {}: {e}", op.name()));
        for (i, v) in outs.into_iter().enumerate() {
            d.replace_all_uses(ValueId { node, output: i as u32 }, v).unwrap();
        }
        d.remove_node(node).unwrap();
    }
    d
}

/// Element-wise comparison with the tolerance stated at the top of the file.
fn assert_close(what: &str, got: &TensorData, want: &TensorData) {
    assert_eq!(got.tensor_type(), want.tensor_type(), "{what}: types differ");
    let tol = match want.dtype() {
        DType::F32 => 1e-5,
        DType::F64 => 1e-12,
        DType::F16 | DType::BF16 => 1e-2,
        _ => 0.0,
    };
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = if a.is_finite() && b.is_finite() {
            (a - b).abs() <= tol * (b.abs() + scale)
        } else {
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
        };
        assert!(ok, "{what}: element {i}: decomposed {a} vs native {b} (tol {tol})");
    }
}

/// Run `op` natively and decomposed on random `ins`; returns (native, decomposed) outputs.
fn check(what: &str, op: Composite, ins: Vec<In>) -> Vec<(TensorData, TensorData)> {
    let mut g = Graph::new(what);
    let vals: Vec<ValueId> = ins
        .iter()
        .enumerate()
        .map(|(i, x)| g.add_input(&format!("x{i}"), x.ty.clone()).unwrap())
        .collect();
    let outs = g.add_op(Op::Composite(op), &vals).unwrap();
    for (i, v) in outs.iter().enumerate() {
        g.add_output(&format!("y{i}"), *v).unwrap();
    }
    let d = decomposed(&g);
    oar_ir::verify(&d).unwrap();
    assert!(
        d.node_ids().all(|n| d.node(n).op.is_primitive()),
        "{what}: composite left"
    );
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let feed: BTreeMap<String, TensorData> = ins
        .iter()
        .enumerate()
        .map(|(i, x)| (format!("x{i}"), x.data(&mut rng)))
        .collect();
    let weights = Weights::new();
    let native = run_graph(&g, &weights, &feed).unwrap_or_else(|e| panic!("{what} native: {e}"));
    let dec = run_graph(&d, &weights, &feed).unwrap_or_else(|e| panic!("{what} decomposed: {e}"));
    assert_eq!(native.len(), dec.len());
    native
        .into_iter()
        .zip(dec)
        .map(|((name, n), (_, e))| {
            assert_close(&format!("{what} {name}"), &e, &n);
            (n, e)
        })
        .collect()
}

const FLOATS: [DType; 2] = [DType::F32, DType::F64];

#[test]
fn linear() {
    for dt in FLOATS {
        check(
            "linear bias",
            Composite::Linear,
            vec![fsym(dt, &[4, 5]), f(dt, &[5, 3]), f(dt, &[3])],
        );
        check(
            "linear rank3",
            Composite::Linear,
            vec![f(dt, &[2, 3, 5]), f(dt, &[5, 4])],
        );
        check(
            "linear rank1",
            Composite::Linear,
            vec![f(dt, &[5]), f(dt, &[5, 2]), f(dt, &[2])],
        );
    }
}

#[test]
fn conv2d() {
    let conv = |stride, padding, dilation, groups| {
        Composite::Conv2d(Conv2d {
            stride,
            padding,
            dilation,
            groups,
        })
    };
    for dt in FLOATS {
        let plain = conv([1, 1], [0; 4], [1, 1], 1);
        check(
            "conv plain",
            plain,
            vec![fsym(dt, &[2, 3, 6, 5]), f(dt, &[4, 3, 3, 3]), f(dt, &[4])],
        );
        let odd = conv([2, 1], [1, 0, 1, 2], [1, 2], 2);
        check(
            "conv strided grouped",
            odd,
            vec![f(dt, &[2, 4, 7, 7]), f(dt, &[6, 2, 3, 2]), f(dt, &[6])],
        );
        let depthwise = conv([1, 2], [1, 1, 1, 1], [2, 1], 3);
        check(
            "conv depthwise",
            depthwise,
            vec![f(dt, &[1, 3, 6, 6]), f(dt, &[3, 1, 2, 3])],
        );
    }
}

/// A pooling geometry: kernel, stride, padding, input H, W.
type PoolGeometry = ([usize; 2], [usize; 2], [usize; 4], usize, usize);

/// Pooling geometries covering padding, uneven strides and overhanging ceil-mode windows.
const POOLS: [PoolGeometry; 4] = [
    ([3, 3], [2, 2], [1, 1, 1, 1], 7, 8),
    ([2, 2], [2, 2], [0, 0, 0, 0], 7, 5),
    ([3, 2], [1, 2], [1, 0, 0, 1], 6, 7),
    ([3, 3], [3, 2], [0, 1, 1, 0], 8, 9),
];

#[test]
fn max_pool2d() {
    for (kernel, stride, padding, h, w) in POOLS {
        for ceil_mode in [false, true] {
            let op = Composite::MaxPool2d(MaxPool2d {
                kernel,
                stride,
                padding,
                ceil_mode,
            });
            let what = format!("max_pool {kernel:?} {stride:?} {padding:?} ceil={ceil_mode}");
            for dt in FLOATS {
                check(&what, op.clone(), vec![fsym(dt, &[2, 3, h, w])]);
            }
            check(&what, op.clone(), vec![ints(DType::I32, &[1, 2, h, w], -50, 50)]);
            check(&what, op, vec![bools(&[1, 2, h, w], 0.1)]);
        }
    }
}

#[test]
fn avg_pool2d() {
    for (kernel, stride, padding, h, w) in POOLS {
        for ceil_mode in [false, true] {
            for count_include_pad in [false, true] {
                let op = Composite::AvgPool2d(AvgPool2d {
                    kernel,
                    stride,
                    padding,
                    ceil_mode,
                    count_include_pad,
                });
                let what =
                    format!("avg_pool {kernel:?} {stride:?} {padding:?} ceil={ceil_mode} cip={count_include_pad}");
                for dt in FLOATS {
                    check(&what, op.clone(), vec![fsym(dt, &[2, 3, h, w])]);
                }
            }
        }
    }
}

#[test]
fn adaptive_pools() {
    // Divisible, non-divisible, mixed, global, and upsampling output sizes for a 6x8 input.
    for output_size in [[2, 4], [4, 3], [3, 5], [1, 1], [8, 10], [6, 8]] {
        for dt in FLOATS {
            let what = format!("adaptive {output_size:?} {dt}");
            check(
                &what,
                Composite::AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size }),
                vec![fsym(dt, &[2, 3, 6, 8])],
            );
            check(
                &what,
                Composite::AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size }),
                vec![fsym(dt, &[2, 3, 6, 8])],
            );
        }
        let x = ints(DType::I64, &[1, 2, 6, 8], -9, 9);
        check(
            "adaptive max i64",
            Composite::AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size }),
            vec![x],
        );
    }
}

#[test]
fn batch_norm() {
    for dt in FLOATS {
        for training in [false, true] {
            let op = Composite::BatchNorm(BatchNorm {
                epsilon: Float(1e-5),
                momentum: Float(0.9),
                training,
            });
            let stats = |c| {
                vec![
                    f(dt, &[c]).range(0.5, 1.5),
                    f(dt, &[c]),
                    f(dt, &[c]),
                    f(dt, &[c]).range(0.5, 1.5),
                ]
            };
            let mut ins = vec![fsym(dt, &[4, 3, 5, 2]).range(-2.0, 3.0)];
            ins.extend(stats(3));
            let outs = check(&format!("batch_norm 4d train={training}"), op.clone(), ins);
            assert_eq!(outs.len(), if training { 3 } else { 1 });
            let mut ins = vec![fsym(dt, &[6, 4])];
            ins.extend(stats(4));
            check(&format!("batch_norm 2d train={training}"), op, ins);
        }
    }
}

#[test]
fn layer_norm() {
    for dt in FLOATS {
        for n in [1, 2] {
            let op = Composite::LayerNorm(LayerNorm {
                normalized_ndim: n,
                epsilon: Float(1e-5),
            });
            let tail = &[4, 5][2 - n..];
            check(
                "layer_norm plain",
                op.clone(),
                vec![fsym(dt, &[3, 4, 5]).range(-1.0, 4.0)],
            );
            check(
                "layer_norm affine",
                op,
                vec![fsym(dt, &[3, 4, 5]), f(dt, tail), f(dt, tail)],
            );
        }
    }
}

#[test]
fn softmax_and_log_softmax() {
    for dt in FLOATS {
        for axis in 0..3 {
            let x = || fsym(dt, &[3, 4, 5]).range(-30.0, 30.0);
            check("softmax", Composite::Softmax(Softmax { axis }), vec![x()]);
            check("log_softmax", Composite::LogSoftmax(LogSoftmax { axis }), vec![x()]);
        }
    }
}

#[test]
fn cross_entropy() {
    for dt in FLOATS {
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            for label_dt in [DType::I64, DType::I32] {
                let mut labels = ints(label_dt, &[6], 0, 5);
                labels.ty.shape.0[0] = Dim::sym("N");
                let logits = fsym(dt, &[6, 5]).range(-4.0, 4.0);
                check(
                    "cross_entropy",
                    Composite::CrossEntropy(CrossEntropy { reduction }),
                    vec![logits, labels],
                );
            }
        }
    }
}

#[test]
fn activations() {
    for dt in FLOATS {
        let x = || fsym(dt, &[4, 7]).range(-6.0, 6.0);
        check("relu", Composite::Relu, vec![x()]);
        check("gelu erf", Composite::Gelu(Gelu { approximate: false }), vec![x()]);
        check("gelu tanh", Composite::Gelu(Gelu { approximate: true }), vec![x()]);
        check("silu", Composite::Silu, vec![x()]);
        check("sigmoid", Composite::Sigmoid, vec![x()]);
    }
    check("relu i32", Composite::Relu, vec![ints(DType::I32, &[9], -5, 5)]);
}

#[test]
fn dropout() {
    for dt in FLOATS {
        for (p, seed) in [(0.3, 42), (0.0, 1), (0.9, 7)] {
            let op = Composite::Dropout(Dropout {
                p: Float(p),
                training: true,
                seed,
            });
            let outs = check("dropout train", op, vec![fsym(dt, &[16, 33]).range(0.5, 2.0)]);
            let (native, dec) = (outs[0].0.to_f64_vec(), outs[0].1.to_f64_vec());
            // Same seed, same mask: exactly the same elements are dropped.
            let zeros = |v: &[f64]| v.iter().map(|&x| x == 0.0).collect::<Vec<_>>();
            assert_eq!(zeros(&native), zeros(&dec), "dropout p={p}: masks differ");
            let dropped = zeros(&native).iter().filter(|&&z| z).count() as f64 / native.len() as f64;
            assert!((dropped - p).abs() < 0.06, "dropout p={p}: dropped fraction {dropped}");
        }
        let eval = Composite::Dropout(Dropout {
            p: Float(0.5),
            training: false,
            seed: 3,
        });
        let outs = check("dropout eval", eval, vec![fsym(dt, &[4, 5])]);
        assert_eq!(outs[0].0, outs[0].1);
    }
}

#[test]
fn embedding() {
    for dt in FLOATS {
        for idx_dt in [DType::I64, DType::I32] {
            let mut idx = ints(idx_dt, &[4, 3], 0, 10);
            idx.ty.shape.0[0] = Dim::sym("N");
            check("embedding", Composite::Embedding, vec![idx, f(dt, &[10, 6])]);
        }
    }
}

#[test]
fn scaled_dot_product_attention() {
    for dt in FLOATS {
        let qkv = || {
            vec![
                fsym(dt, &[2, 3, 4, 8]),
                fsym(dt, &[2, 3, 5, 8]),
                fsym(dt, &[2, 3, 5, 6]),
            ]
        };
        for causal in [false, true] {
            for scale in [None, Some(Float(0.3))] {
                let op = Composite::ScaledDotProductAttention(ScaledDotProductAttention { causal, scale });
                let what = format!("sdpa causal={causal} scale={scale:?}");
                check(&what, op.clone(), qkv());
                let mut ins = qkv();
                ins.push(bools(&[4, 5], 0.6));
                check(&format!("{what} bool mask"), op.clone(), ins);
                let mut ins = qkv();
                ins.push(f(dt, &[1, 1, 4, 5]).range(-2.0, 2.0));
                check(&format!("{what} float mask"), op, ins);
            }
        }
        // Unbatched attention with L > S.
        let op = Composite::ScaledDotProductAttention(ScaledDotProductAttention {
            causal: true,
            scale: None,
        });
        check("sdpa rank2", op, vec![f(dt, &[6, 4]), f(dt, &[3, 4]), f(dt, &[3, 2])]);
    }
}
