//! The ops section: every primitive op of the IR for every dtype it accepts, with several
//! attribute sets, and every composite.

use super::build::{Builder, Domain, R, dims, s};
use super::{Case, Section};
use oar_ir::ops::{
    ArgReduce, Broadcast, Cast, Concat, Conv, Gather, Iota, Pad, Permute, Random, Reduce, Reshape, Scatter, Slice,
};
use oar_ir::ops::{ArgReduceOp, BinaryOp, RandomDist, ReduceOp, ScatterReduce, SliceRange, UnaryOp, infer_types};
use oar_ir::{Composite, DType, Float, Graph, Op, TensorType, ValueId};

const OPS: Section = Section::Ops;

/// All op cases.
pub(crate) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    leaves(&mut v);
    unary(&mut v);
    binary(&mut v);
    where_(&mut v);
    cast(&mut v);
    reduce(&mut v);
    arg_reduce(&mut v);
    movement(&mut v);
    indexing(&mut v);
    generators(&mut v);
    matmul(&mut v);
    conv(&mut v);
    composites(&mut v);
    control(&mut v);
    samples(&mut v);
    v
}

/// The samples every op definition declares (`OpDef::samples`): new ops are covered here by
/// being defined.
fn samples(v: &mut Vec<Case>) {
    for s in Op::all_samples() {
        let inputs = s.inputs.into_iter().map(|i| (i.dtype, i.shape, i.domain)).collect();
        op_case(v, s.name, s.op, inputs);
    }
}

/// True if the IR's type rule accepts `op` on inputs of these types.
fn accepts(op: &Op, inputs: &[TensorType]) -> bool {
    infer_types(op, inputs, &[]).is_ok()
}

/// A case computing `op` on fresh inputs `x0, x1, ...` (dtype, shape, domain each); every
/// output of the op is a graph output.
fn op_case(v: &mut Vec<Case>, name: String, op: Op, inputs: Vec<(DType, Vec<usize>, Domain)>) {
    v.push(Case::built(OPS, name, move |b| {
        let mut args = Vec::new();
        for (i, (dt, shape, dom)) in inputs.iter().enumerate() {
            args.push(b.input(&format!("x{i}"), *dt, shape, dom)?);
        }
        let outs = b.ops(op.clone(), &args)?;
        b.outs(&outs)
    }));
}

fn leaves(v: &mut Vec<Case>) {
    v.push(Case::built(OPS, "leaf/input_param_constant", |b| {
        let x = b.input("x", DType::F32, &[3, 5], &Domain::standard())?;
        let w = b.param("w", DType::F32, &[5], &Domain::standard())?;
        let c = b.constant(DType::F32, &[3, 1], &Domain::standard())?;
        let y = b.g.binary(BinaryOp::Mul, w, c).map_err(s)?;
        let y = b.g.binary(BinaryOp::Add, x, y).map_err(s)?;
        b.out("y", y)?;
        // An input passed straight through, and a param returned as is.
        b.out("x", x)?;
        b.out("w", w)
    }));
}

fn unary_domain(u: UnaryOp) -> Domain {
    use Domain::*;
    use UnaryOp::*;
    match u {
        Neg | Abs | Sign => Range(-10.0, 10.0),
        Exp | Tanh => Range(-4.0, 4.0),
        Log => Range(0.05, 8.0),
        Sqrt => Range(0.0, 9.0),
        Rsqrt => Range(0.05, 9.0),
        Recip => AwayFromZero(-4.0, 4.0, 0.25),
        Sin | Cos => Range(-6.0, 6.0),
        Erf => Range(-3.0, 3.0),
        Floor | Ceil | Round => WithSpecials(
            vec![0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0, -3.0, 0.499_999_97, -0.0],
            Box::new(Range(-5.0, 5.0)),
        ),
        Not => Range(-100.0, 100.0),
    }
}

fn unary(v: &mut Vec<Case>) {
    let shape = vec![3, 37];
    for &u in UnaryOp::ALL {
        for dt in DType::ALL {
            if accepts(&Op::Unary(u), &[TensorType::of(dt, &shape)]) {
                op_case(
                    v,
                    format!("unary/{}/{dt}", u.name()),
                    Op::Unary(u),
                    vec![(dt, shape.clone(), unary_domain(u))],
                );
            }
        }
    }
    // IEEE special values where the op is defined on them.
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    for (u, vals) in [
        (UnaryOp::Sign, vec![nan, -0.0, 0.0, inf, -inf, 3.0, -2.0]),
        (UnaryOp::Abs, vec![nan, -0.0, inf, -inf, -3.0]),
        (UnaryOp::Neg, vec![nan, 0.0, inf, -inf, 3.0]),
        (UnaryOp::Exp, vec![nan, inf, -inf, 100.0, -120.0, 0.0]),
        (UnaryOp::Tanh, vec![nan, inf, -inf, 30.0, -30.0, 0.0]),
        (UnaryOp::Floor, vec![nan, inf, -inf, -0.0, 1e9 + 0.5]),
    ] {
        op_case(
            v,
            format!("unary/{}/f32/special", u.name()),
            Op::Unary(u),
            vec![(DType::F32, vec![vals.len()], Domain::Values(vals))],
        );
    }
}

fn binary_domains(op: BinaryOp, dt: DType) -> (Domain, Domain) {
    use BinaryOp::*;
    use Domain::*;
    let f = dt.is_float();
    match op {
        Add | Sub | Mul | Max | Min if f => (Range(-4.0, 4.0), Range(-4.0, 4.0)),
        Add | Sub | Mul | Max | Min => (Range(-10.0, 10.0), Range(-10.0, 10.0)),
        Div if f => (Range(-4.0, 4.0), AwayFromZero(-4.0, 4.0, 0.5)),
        Div => (Range(-20.0, 20.0), AwayFromZero(-5.0, 5.0, 1.0)),
        Pow if f => (Range(0.25, 3.0), Range(-2.0, 2.0)),
        Pow => (Range(-3.0, 3.0), Range(0.0, 3.0)),
        Rem if f => (Range(-6.0, 6.0), AwayFromZero(-3.0, 3.0, 0.5)),
        Rem => (Range(-20.0, 20.0), AwayFromZero(-5.0, 5.0, 1.0)),
        Eq | Ne | Lt | Le | Gt | Ge => (Ints(-2, 2), Ints(-2, 2)),
        And | Or | Xor => (Range(-100.0, 100.0), Range(-100.0, 100.0)),
    }
}

fn binary(v: &mut Vec<Case>) {
    for &op in BinaryOp::ALL {
        for dt in DType::ALL {
            let (da, db) = binary_domains(op, dt);
            let mut variants = vec![("", vec![4, 29], vec![4, 29])];
            if matches!(dt, DType::F32 | DType::I32 | DType::Bool) {
                variants.push(("/broadcast", vec![3, 1, 29], vec![5, 1]));
            }
            if dt == DType::F32 {
                variants.push(("/scalar", vec![4, 29], vec![]));
            }
            for (suffix, sa, sb) in variants {
                let ty = [TensorType::of(dt, &sa), TensorType::of(dt, &sb)];
                if accepts(&Op::Binary(op), &ty) {
                    op_case(
                        v,
                        format!("binary/{}/{dt}{suffix}", op.name()),
                        Op::Binary(op),
                        vec![(dt, sa, da.clone()), (dt, sb, db.clone())],
                    );
                }
            }
        }
    }
    // NaN propagates through max and min; infinities order.
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    let a = vec![nan, 1.0, nan, -inf, 2.0, -0.0, inf];
    let b = vec![1.0, nan, nan, 3.0, inf, 0.0, -inf];
    for op in [BinaryOp::Max, BinaryOp::Min] {
        op_case(
            v,
            format!("binary/{}/f32/nan", op.name()),
            Op::Binary(op),
            vec![
                (DType::F32, vec![a.len()], Domain::Values(a.clone())),
                (DType::F32, vec![b.len()], Domain::Values(b.clone())),
            ],
        );
    }
}

fn where_(v: &mut Vec<Case>) {
    for dt in DType::ALL {
        op_case(
            v,
            format!("where/{dt}"),
            Op::Where,
            vec![
                (DType::Bool, vec![4, 1, 13], Domain::standard()),
                (dt, vec![4, 7, 13], Domain::Range(-10.0, 10.0)),
                (dt, vec![13], Domain::Range(-10.0, 10.0)),
            ],
        );
    }
}

fn cast_domain(from: DType) -> Domain {
    use Domain::*;
    match from {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => WithSpecials(
            vec![
                0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, 127.9, 128.5, -128.5, -129.0, 255.5, 256.0, 40000.0, -40000.0,
                1e-3,
            ],
            Box::new(Range(-300.0, 300.0)),
        ),
        DType::I8 | DType::U8 => Range(-1000.0, 1000.0),
        DType::I32 => WithSpecials(
            vec![i32::MAX as f64, i32::MIN as f64, 65504.0, 65520.0, 16_777_217.0],
            Box::new(Range(-70000.0, 70000.0)),
        ),
        DType::I64 => WithSpecials(
            vec![1_099_511_627_777.0, -(2f64.powi(62)), i64::MIN as f64, 16_777_217.0],
            Box::new(Range(-1e6, 1e6)),
        ),
        DType::Bool => Domain::standard(),
    }
}

fn cast(v: &mut Vec<Case>) {
    for from in DType::ALL {
        for to in DType::ALL {
            op_case(
                v,
                format!("cast/{from}->{to}"),
                Op::Cast(Cast { to }),
                vec![(from, vec![2, 23], cast_domain(from))],
            );
        }
    }
}

/// `2,3,4`.
fn list(xs: &[usize]) -> String {
    xs.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

fn axes_label(axes: &[usize], keepdim: bool) -> String {
    format!("axes[{}]{}", list(axes), if keepdim { "/keepdim" } else { "" })
}

fn reduce(v: &mut Vec<Case>) {
    for &op in ReduceOp::ALL {
        let float_dom = if op == ReduceOp::Prod {
            Domain::Range(0.5, 1.5)
        } else {
            Domain::Range(-2.0, 2.0)
        };
        let int_dom = if op == ReduceOp::Prod {
            Domain::Range(-3.0, 3.0)
        } else {
            Domain::Range(-10.0, 10.0)
        };
        for (axes, keepdim) in [
            (vec![2], false),
            (vec![0], true),
            (vec![1], false),
            (vec![0, 2], true),
            (vec![0, 1, 2], false),
            (vec![], false),
        ] {
            op_case(
                v,
                format!("{}/f32/{}", op.name(), axes_label(&axes, keepdim)),
                Op::Reduce(Reduce {
                    op,
                    axes: axes.clone(),
                    keepdim,
                }),
                vec![(DType::F32, vec![3, 4, 5], float_dom.clone())],
            );
        }
        for dt in DType::ALL {
            let r = Op::Reduce(Reduce {
                op,
                axes: vec![1],
                keepdim: false,
            });
            if dt != DType::F32 && accepts(&r, &[TensorType::of(dt, &[3, 4, 5])]) {
                let dom = if dt.is_float() {
                    float_dom.clone()
                } else {
                    int_dom.clone()
                };
                op_case(
                    v,
                    format!("{}/{dt}/axes[1]", op.name()),
                    r,
                    vec![(dt, vec![3, 4, 5], dom)],
                );
            }
        }
        // Long reductions: contiguous (inner) and strided (outer).
        let long_dom = if op == ReduceOp::Prod {
            Domain::Range(0.999, 1.001)
        } else {
            float_dom.clone()
        };
        for (label, shape, axis) in [("long_inner", vec![2, 1500], 1), ("long_outer", vec![1500, 3], 0)] {
            op_case(
                v,
                format!("{}/f32/{label}", op.name()),
                Op::Reduce(Reduce {
                    op,
                    axes: vec![axis],
                    keepdim: false,
                }),
                vec![(DType::F32, shape, long_dom.clone())],
            );
        }
    }
}

fn arg_reduce(v: &mut Vec<Case>) {
    for &op in ArgReduceOp::ALL {
        for (axis, keepdim) in [(0, false), (1, true), (2, false)] {
            op_case(
                v,
                format!("{}/f32/{}", op.name(), axes_label(&[axis], keepdim)),
                Op::ArgReduce(ArgReduce { op, axis, keepdim }),
                vec![(DType::F32, vec![3, 4, 5], Domain::Range(-2.0, 2.0))],
            );
        }
        // Ties: the first occurrence wins.
        for dt in DType::ALL {
            op_case(
                v,
                format!("{}/{dt}/ties", op.name()),
                Op::ArgReduce(ArgReduce {
                    op,
                    axis: 1,
                    keepdim: false,
                }),
                vec![(dt, vec![3, 6, 5], Domain::Ints(0, 3))],
            );
        }
    }
}

fn movement(v: &mut Vec<Case>) {
    let std = Domain::Range(-10.0, 10.0);
    // reshape
    for (to, dt) in [
        (vec![6, 4], DType::F32),
        (vec![24], DType::F32),
        (vec![4, 1, 6], DType::F32),
        (vec![2, 12], DType::F32),
        (vec![4, 6], DType::I64),
        (vec![4, 6], DType::Bool),
        (vec![4, 6], DType::F16),
        (vec![4, 6], DType::U8),
    ] {
        op_case(
            v,
            format!("reshape/{dt}/to[{}]", list(&to)),
            Op::Reshape(Reshape { shape: dims(&to) }),
            vec![(dt, vec![2, 3, 4], std.clone())],
        );
    }
    // permute
    for (shape, perm, dt) in [
        (vec![2, 3, 4, 5], vec![0, 1, 3, 2], DType::F32),
        (vec![2, 3, 4, 5], vec![3, 2, 1, 0], DType::F32),
        (vec![2, 3, 4, 5], vec![1, 0, 2, 3], DType::F32),
        (vec![2, 3, 4, 5], vec![0, 2, 3, 1], DType::F32),
        (vec![7, 9], vec![1, 0], DType::F32),
        (vec![33, 65], vec![1, 0], DType::F32),
        (vec![2, 3, 4, 5], vec![0, 2, 3, 1], DType::I8),
        (vec![2, 3, 4, 5], vec![0, 2, 3, 1], DType::F64),
        (vec![2, 3, 4, 5], vec![0, 2, 3, 1], DType::Bool),
    ] {
        op_case(
            v,
            format!("permute/{dt}/[{}]/perm[{}]", list(&shape), list(&perm)),
            Op::Permute(Permute { perm }),
            vec![(dt, shape, std.clone())],
        );
    }
    // broadcast
    for (from, to, dt) in [
        (vec![3, 1], vec![2, 3, 4], DType::F32),
        (vec![], vec![5], DType::F32),
        (vec![1, 4], vec![3, 4], DType::F32),
        (vec![2, 1, 3], vec![2, 5, 3], DType::F32),
        (vec![3, 1], vec![2, 3, 4], DType::Bool),
        (vec![3, 1], vec![2, 3, 4], DType::I64),
    ] {
        op_case(
            v,
            format!("broadcast/{dt}/[{}]->[{}]", list(&from), list(&to)),
            Op::Broadcast(Broadcast { shape: dims(&to) }),
            vec![(dt, from, std.clone())],
        );
    }
    // slice
    let r = |start, end, step| SliceRange { start, end, step };
    let full = SliceRange::FULL;
    for (label, ranges, dt) in [
        ("steps", vec![r(1, 5, 1), full, r(0, 8, 2)], DType::F32),
        (
            "negative",
            vec![r(-3, i64::MAX, 1), r(2, -1, 1), r(1, 8, 3)],
            DType::F32,
        ),
        ("clamped", vec![r(0, 100, 1), r(-100, 3, 1), full], DType::F32),
        ("empty", vec![full, r(5, 2, 1), full], DType::F32),
        ("big_step", vec![full, r(0, i64::MAX, 10), r(7, 8, 1)], DType::F32),
        ("steps", vec![r(1, 5, 1), full, r(0, 8, 2)], DType::I32),
        ("steps", vec![r(1, 5, 1), full, r(0, 8, 2)], DType::Bool),
    ] {
        op_case(
            v,
            format!("slice/{dt}/{label}"),
            Op::Slice(Slice { ranges }),
            vec![(dt, vec![6, 7, 8], std.clone())],
        );
    }
    // pad
    for (label, dt, value) in [
        ("zero", DType::F32, 0.0),
        ("value", DType::F32, -1.5),
        ("value", DType::I32, 7.0),
        ("value", DType::Bool, 1.0),
        ("value", DType::F16, 2.5),
    ] {
        op_case(
            v,
            format!("pad/{dt}/{label}"),
            Op::Pad(Pad {
                before: vec![0, 1, 2],
                after: vec![1, 0, 3],
                value: Float(value),
            }),
            vec![(dt, vec![3, 4, 5], std.clone())],
        );
    }
    // concat
    for (label, shapes, axis, dt) in [
        ("axis0", vec![vec![2, 3], vec![4, 3]], 0, DType::F32),
        (
            "axis1_three",
            vec![vec![2, 3, 4], vec![2, 1, 4], vec![2, 5, 4]],
            1,
            DType::F32,
        ),
        ("axis_last", vec![vec![2, 3], vec![2, 7]], 1, DType::F32),
        ("single", vec![vec![2, 3]], 0, DType::F32),
        ("axis1", vec![vec![2, 3, 4], vec![2, 1, 4]], 1, DType::I64),
        ("axis1", vec![vec![2, 3, 4], vec![2, 1, 4]], 1, DType::Bool),
    ] {
        op_case(
            v,
            format!("concat/{dt}/{label}"),
            Op::Concat(Concat { axis }),
            shapes.into_iter().map(|sh| (dt, sh, std.clone())).collect(),
        );
    }
}

fn indexing(v: &mut Vec<Case>) {
    let std = Domain::Range(-10.0, 10.0);
    // gather: (data dtype, data shape, axis, index dtype, index shape, index domain)
    for (label, ddt, dshape, axis, idt, ishape, idom) in [
        (
            "axis1_negative",
            DType::F32,
            vec![5, 6, 7],
            1,
            DType::I64,
            vec![2, 3],
            Domain::Ints(-6, 5),
        ),
        (
            "axis0_i32",
            DType::F32,
            vec![5, 6, 7],
            0,
            DType::I32,
            vec![4],
            Domain::Ints(0, 4),
        ),
        (
            "axis2_scalar",
            DType::F32,
            vec![5, 6, 7],
            2,
            DType::I64,
            vec![],
            Domain::Values(vec![3.0]),
        ),
        (
            "axis0",
            DType::I64,
            vec![5, 6],
            0,
            DType::I64,
            vec![3],
            Domain::Ints(0, 4),
        ),
    ] {
        op_case(
            v,
            format!("gather/{ddt}/{label}"),
            Op::Gather(Gather { axis }),
            vec![(ddt, dshape, std.clone()), (idt, ishape, idom)],
        );
    }
    // scatter: replace needs unique indices; add accumulates duplicates.
    for (label, reduce, dt, dshape, axis, idt, idx, ushape) in [
        (
            "axis0",
            ScatterReduce::Replace,
            DType::F32,
            vec![6, 5],
            0,
            DType::I64,
            vec![4.0, 0.0, 2.0],
            vec![3, 5],
        ),
        (
            "axis1",
            ScatterReduce::Replace,
            DType::F32,
            vec![4, 7],
            1,
            DType::I32,
            vec![6.0, 1.0, 3.0],
            vec![4, 3],
        ),
        (
            "duplicates",
            ScatterReduce::Add,
            DType::F32,
            vec![6, 5],
            0,
            DType::I64,
            vec![0.0, 2.0, 0.0, -1.0],
            vec![4, 5],
        ),
        (
            "duplicates",
            ScatterReduce::Add,
            DType::I32,
            vec![6, 5],
            0,
            DType::I64,
            vec![0.0, 2.0, 0.0, -1.0],
            vec![4, 5],
        ),
    ] {
        let n = idx.len();
        op_case(
            v,
            format!("scatter/{}/{dt}/{label}", reduce.name()),
            Op::Scatter(Scatter { axis, reduce }),
            vec![
                (dt, dshape, std.clone()),
                (idt, vec![n], Domain::Values(idx)),
                (dt, ushape, std.clone()),
            ],
        );
    }
}

fn generators(v: &mut Vec<Case>) {
    for (shape, axis, dtype) in [
        (vec![3, 5], 1, DType::I64),
        (vec![3, 5], 0, DType::F32),
        (vec![2, 3, 4], 2, DType::I32),
        (vec![4, 4], 0, DType::U8),
        (vec![2, 9], 1, DType::F16),
    ] {
        op_case(
            v,
            format!("iota/{dtype}/[{}]/axis{axis}", list(&shape)),
            Op::Iota(Iota {
                shape: dims(&shape),
                axis,
                dtype,
            }),
            vec![],
        );
    }
    let uniform = |low, high| RandomDist::Uniform {
        low: Float(low),
        high: Float(high),
    };
    let normal = |mean, std| RandomDist::Normal {
        mean: Float(mean),
        std: Float(std),
    };
    for (label, dist, dtype, seed) in [
        ("uniform", uniform(-2.0, 3.0), DType::F32, 7),
        ("normal", normal(0.5, 2.0), DType::F32, 11),
        ("uniform", uniform(0.0, 1.0), DType::F64, 3),
        ("normal", normal(0.0, 1.0), DType::F64, 4),
        ("normal", normal(0.0, 1.0), DType::F16, 5),
        ("uniform", uniform(-1.0, 1.0), DType::BF16, 9),
        ("uniform_seed0", uniform(0.0, 1.0), DType::F32, 0),
    ] {
        op_case(
            v,
            format!("random/{dtype}/{label}"),
            Op::Random(Random {
                dist,
                shape: dims(&[4, 33]),
                dtype,
                seed,
            }),
            vec![],
        );
    }
}

fn matmul(v: &mut Vec<Case>) {
    for (label, a, b, dt) in [
        ("2d", vec![5, 7], vec![7, 3], DType::F32),
        ("gemv_row", vec![1, 64], vec![64, 33], DType::F32),
        ("gemv_col", vec![33, 64], vec![64, 1], DType::F32),
        ("large", vec![64, 96], vec![96, 80], DType::F32),
        ("batched", vec![3, 4, 8], vec![3, 8, 5], DType::F32),
        ("broadcast_batch", vec![2, 1, 4, 8], vec![3, 8, 5], DType::F32),
        ("broadcast_lhs", vec![4, 8], vec![2, 8, 5], DType::F32),
        ("broadcast_rhs", vec![2, 3, 4, 8], vec![8, 5], DType::F32),
        ("2d", vec![5, 7], vec![7, 3], DType::F64),
        ("2d", vec![5, 7], vec![7, 3], DType::F16),
        ("2d", vec![5, 7], vec![7, 3], DType::BF16),
        ("2d", vec![5, 7], vec![7, 3], DType::I32),
        ("batched", vec![3, 4, 8], vec![3, 8, 5], DType::I64),
    ] {
        let dom = if dt.is_float() {
            Domain::standard()
        } else {
            Domain::Range(-5.0, 5.0)
        };
        op_case(
            v,
            format!("matmul/{dt}/{label}"),
            Op::MatMul,
            vec![(dt, a, dom.clone()), (dt, b, dom)],
        );
    }
}

/// A `conv` op (N-d) from its attributes.
fn conv_op(stride: &[usize], pad_before: &[usize], pad_after: &[usize], dilation: &[usize], groups: usize) -> Op {
    Op::Conv(Conv {
        stride: stride.to_vec(),
        pad_before: pad_before.to_vec(),
        pad_after: pad_after.to_vec(),
        dilation: dilation.to_vec(),
        groups,
    })
}

fn conv(v: &mut Vec<Case>) {
    type ConvSpec = (&'static str, Vec<usize>, Vec<usize>, Op, DType);
    let specs: Vec<ConvSpec> = vec![
        (
            "1d/pad",
            vec![2, 4, 17],
            vec![6, 4, 3],
            conv_op(&[1], &[1], &[1], &[1], 1),
            DType::F32,
        ),
        (
            "1d/stride_dilation_groups",
            vec![2, 4, 17],
            vec![6, 2, 3],
            conv_op(&[2], &[2], &[0], &[2], 2),
            DType::F32,
        ),
        (
            "2d/3x3_pad1",
            vec![2, 3, 9, 9],
            vec![4, 3, 3, 3],
            conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 1),
            DType::F32,
        ),
        (
            "2d/stride2_asym_pad",
            vec![2, 3, 9, 9],
            vec![4, 3, 3, 3],
            conv_op(&[2, 2], &[1, 0], &[2, 1], &[1, 1], 1),
            DType::F32,
        ),
        (
            "2d/dilation2",
            vec![1, 3, 11, 10],
            vec![5, 3, 3, 3],
            conv_op(&[1, 1], &[2, 2], &[2, 2], &[2, 2], 1),
            DType::F32,
        ),
        (
            "2d/groups2",
            vec![1, 4, 8, 8],
            vec![6, 2, 3, 3],
            conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 2),
            DType::F32,
        ),
        (
            "2d/depthwise_stride2",
            vec![1, 6, 8, 8],
            vec![6, 1, 3, 3],
            conv_op(&[2, 2], &[1, 1], &[1, 1], &[1, 1], 6),
            DType::F32,
        ),
        (
            "2d/depthwise_multiplier2",
            vec![1, 6, 8, 8],
            vec![12, 1, 3, 3],
            conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 6),
            DType::F32,
        ),
        (
            "2d/1x1",
            vec![2, 16, 5, 5],
            vec![8, 16, 1, 1],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
            DType::F32,
        ),
        (
            "2d/rect_kernel",
            vec![1, 3, 7, 9],
            vec![4, 3, 1, 5],
            conv_op(&[1, 2], &[0, 2], &[0, 2], &[1, 1], 1),
            DType::F32,
        ),
        (
            "2d/wide",
            vec![1, 32, 12, 12],
            vec![32, 32, 3, 3],
            conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 1),
            DType::F32,
        ),
        (
            "2d/3x3_pad1",
            vec![2, 3, 9, 9],
            vec![4, 3, 3, 3],
            conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 1),
            DType::F64,
        ),
        (
            "3d/pad1",
            vec![1, 2, 5, 6, 7],
            vec![3, 2, 3, 3, 3],
            conv_op(&[1, 1, 1], &[1, 1, 1], &[1, 1, 1], &[1, 1, 1], 1),
            DType::F32,
        ),
    ];
    for (label, x, w, op, dt) in specs {
        op_case(
            v,
            format!("conv/{dt}/{label}"),
            op,
            vec![(dt, x, Domain::standard()), (dt, w, Domain::standard())],
        );
    }
}

/// A composite case with inputs `x0, x1, ...`.
fn comp(v: &mut Vec<Case>, name: &str, c: Composite, inputs: Vec<(DType, Vec<usize>, Domain)>) {
    op_case(v, name.to_string(), Op::Composite(c), inputs);
}

fn f32_in(shape: &[usize]) -> (DType, Vec<usize>, Domain) {
    (DType::F32, shape.to_vec(), Domain::standard())
}

fn composites(v: &mut Vec<Case>) {
    use Composite::*;
    use oar_ir::ops::{
        AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm, Conv2d, CrossEntropy, Dropout, Gelu, LayerNorm,
        LogSoftmax, MaxPool2d, ScaledDotProductAttention, Softmax,
    };
    let f = DType::F32;
    let std = Domain::standard();
    // linear
    comp(
        v,
        "linear/f32/bias",
        Linear,
        vec![f32_in(&[3, 5, 8]), f32_in(&[8, 6]), f32_in(&[6])],
    );
    comp(v, "linear/f32/no_bias", Linear, vec![f32_in(&[4, 8]), f32_in(&[8, 6])]);
    comp(
        v,
        "linear/f64/bias",
        Linear,
        vec![
            (DType::F64, vec![4, 8], std.clone()),
            (DType::F64, vec![8, 6], std.clone()),
            (DType::F64, vec![6], std.clone()),
        ],
    );
    // conv2d
    comp(
        v,
        "conv2d/f32/bias_pad1",
        Conv2d(Conv2d {
            stride: [1, 1],
            padding: [1, 1, 1, 1],
            dilation: [1, 1],
            groups: 1,
        }),
        vec![f32_in(&[2, 3, 8, 8]), f32_in(&[4, 3, 3, 3]), f32_in(&[4])],
    );
    comp(
        v,
        "conv2d/f32/groups3_stride2_asym",
        Conv2d(Conv2d {
            stride: [2, 2],
            padding: [0, 1, 1, 0],
            dilation: [1, 1],
            groups: 3,
        }),
        vec![f32_in(&[1, 6, 9, 9]), f32_in(&[6, 2, 3, 3]), f32_in(&[6])],
    );
    comp(
        v,
        "conv2d/f32/dilation2_no_bias",
        Conv2d(Conv2d {
            stride: [1, 1],
            padding: [2, 2, 2, 2],
            dilation: [2, 2],
            groups: 1,
        }),
        vec![f32_in(&[1, 3, 9, 9]), f32_in(&[4, 3, 3, 3])],
    );
    // pooling
    let maxp = |k: usize, st: usize, p: usize, ceil_mode| {
        MaxPool2d(MaxPool2d {
            kernel: [k, k],
            stride: [st, st],
            padding: [p; 4],
            ceil_mode,
        })
    };
    comp(
        v,
        "max_pool2d/f32/k3s2p1",
        maxp(3, 2, 1, false),
        vec![f32_in(&[2, 3, 9, 9])],
    );
    comp(
        v,
        "max_pool2d/f32/k2s2_ceil",
        maxp(2, 2, 0, true),
        vec![f32_in(&[1, 2, 7, 7])],
    );
    comp(
        v,
        "max_pool2d/i32/k2s2",
        maxp(2, 2, 0, false),
        vec![(DType::I32, vec![1, 2, 6, 6], Domain::Range(-50.0, 50.0))],
    );
    let avgp = |k: usize, st: usize, p: usize, ceil_mode, count_include_pad| {
        AvgPool2d(AvgPool2d {
            kernel: [k, k],
            stride: [st, st],
            padding: [p; 4],
            ceil_mode,
            count_include_pad,
        })
    };
    comp(
        v,
        "avg_pool2d/f32/k3s2p1_inclusive",
        avgp(3, 2, 1, false, true),
        vec![f32_in(&[2, 3, 9, 9])],
    );
    comp(
        v,
        "avg_pool2d/f32/k3s2p1_exclusive",
        avgp(3, 2, 1, false, false),
        vec![f32_in(&[2, 3, 9, 9])],
    );
    comp(
        v,
        "avg_pool2d/f32/k3s2_ceil_exclusive",
        avgp(3, 2, 0, true, false),
        vec![f32_in(&[1, 2, 8, 8])],
    );
    comp(
        v,
        "avg_pool2d/f32/k2s1_ceil_inclusive",
        avgp(2, 1, 1, true, true),
        vec![f32_in(&[1, 2, 5, 5])],
    );
    for (label, shape, out) in [
        ("7x7->3x3", [2, 3, 7, 7], [3, 3]),
        ("global", [2, 3, 7, 7], [1, 1]),
        ("9x5->4x2", [1, 2, 9, 5], [4, 2]),
    ] {
        comp(
            v,
            &format!("adaptive_avg_pool2d/f32/{label}"),
            AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size: out }),
            vec![f32_in(&shape)],
        );
        comp(
            v,
            &format!("adaptive_max_pool2d/f32/{label}"),
            AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size: out }),
            vec![f32_in(&shape)],
        );
    }
    // normalization
    let bn = |training| {
        BatchNorm(BatchNorm {
            epsilon: Float(1e-5),
            momentum: Float(0.9),
            training,
        })
    };
    let bn_inputs = |x: &[usize], c: usize| {
        vec![
            f32_in(x),
            (f, vec![c], Domain::Range(0.5, 1.5)),
            (f, vec![c], Domain::Range(-0.5, 0.5)),
            (f, vec![c], Domain::Range(-0.5, 0.5)),
            (f, vec![c], Domain::Range(0.5, 2.0)),
        ]
    };
    comp(v, "batch_norm/f32/eval_nchw", bn(false), bn_inputs(&[2, 3, 5, 5], 3));
    comp(v, "batch_norm/f32/eval_ncl", bn(false), bn_inputs(&[2, 3, 7], 3));
    comp(v, "batch_norm/f32/train_nchw", bn(true), bn_inputs(&[2, 3, 5, 5], 3));
    comp(v, "batch_norm/f32/train_nc", bn(true), bn_inputs(&[8, 3], 3));
    let ln = |n| {
        LayerNorm(LayerNorm {
            normalized_ndim: n,
            epsilon: Float(1e-5),
        })
    };
    comp(
        v,
        "layer_norm/f32/last_axis_affine",
        ln(1),
        vec![f32_in(&[4, 16]), (f, vec![16], Domain::Range(0.5, 1.5)), f32_in(&[16])],
    );
    comp(v, "layer_norm/f32/two_axes_plain", ln(2), vec![f32_in(&[2, 3, 8])]);
    comp(
        v,
        "layer_norm/f64/last_axis_plain",
        ln(1),
        vec![(DType::F64, vec![3, 10], std.clone())],
    );
    // softmax family
    let wide = Domain::Range(-5.0, 5.0);
    for axis in [2, 0] {
        comp(
            v,
            &format!("softmax/f32/axis{axis}"),
            Softmax(Softmax { axis }),
            vec![(f, vec![3, 4, 5], wide.clone())],
        );
    }
    comp(
        v,
        "softmax/f32/large_values",
        Softmax(Softmax { axis: 1 }),
        vec![(f, vec![3, 40], Domain::Range(50.0, 90.0))],
    );
    comp(
        v,
        "softmax/f16/axis1",
        Softmax(Softmax { axis: 1 }),
        vec![(DType::F16, vec![3, 9], wide.clone())],
    );
    for axis in [1, 2] {
        comp(
            v,
            &format!("log_softmax/f32/axis{axis}"),
            LogSoftmax(LogSoftmax { axis }),
            vec![(f, vec![3, 4, 5], wide.clone())],
        );
    }
    for (label, reduction, label_dt) in [
        ("mean", oar_ir::ops::Reduction::Mean, DType::I64),
        ("sum", oar_ir::ops::Reduction::Sum, DType::I64),
        ("none", oar_ir::ops::Reduction::None, DType::I64),
        ("mean_i32_labels", oar_ir::ops::Reduction::Mean, DType::I32),
    ] {
        comp(
            v,
            &format!("cross_entropy/f32/{label}"),
            CrossEntropy(CrossEntropy { reduction }),
            vec![
                (f, vec![6, 5], Domain::Range(-3.0, 3.0)),
                (label_dt, vec![6], Domain::Ints(0, 4)),
            ],
        );
    }
    // activations
    comp(v, "relu/f32", Relu, vec![(f, vec![3, 37], Domain::Range(-2.0, 2.0))]);
    comp(
        v,
        "relu/i32",
        Relu,
        vec![(DType::I32, vec![3, 37], Domain::Range(-20.0, 20.0))],
    );
    comp(
        v,
        "relu/f16",
        Relu,
        vec![(DType::F16, vec![3, 37], Domain::Range(-2.0, 2.0))],
    );
    for approximate in [false, true] {
        comp(
            v,
            &format!("gelu/f32/{}", if approximate { "tanh" } else { "erf" }),
            Gelu(Gelu { approximate }),
            vec![(f, vec![3, 37], Domain::Range(-5.0, 5.0))],
        );
    }
    comp(
        v,
        "gelu/f64/erf",
        Gelu(Gelu { approximate: false }),
        vec![(DType::F64, vec![3, 37], Domain::Range(-5.0, 5.0))],
    );
    comp(v, "silu/f32", Silu, vec![(f, vec![3, 37], Domain::Range(-6.0, 6.0))]);
    comp(
        v,
        "sigmoid/f32",
        Sigmoid,
        vec![(f, vec![3, 37], Domain::Range(-8.0, 8.0))],
    );
    comp(
        v,
        "sigmoid/bf16",
        Sigmoid,
        vec![(DType::BF16, vec![3, 37], Domain::Range(-8.0, 8.0))],
    );
    for (label, p, training, seed) in [
        ("train_p0.3", 0.3, true, 5),
        ("eval", 0.5, false, 5),
        ("train_p0", 0.0, true, 1),
    ] {
        comp(
            v,
            &format!("dropout/f32/{label}"),
            Dropout(Dropout {
                p: Float(p),
                training,
                seed,
            }),
            vec![f32_in(&[4, 33])],
        );
    }
    comp(
        v,
        "embedding/f32/i64_indices",
        Embedding,
        vec![(DType::I64, vec![2, 5], Domain::Ints(0, 9)), f32_in(&[10, 4])],
    );
    comp(
        v,
        "embedding/f32/i32_indices",
        Embedding,
        vec![(DType::I32, vec![7], Domain::Ints(0, 9)), f32_in(&[10, 4])],
    );
    // attention
    let sdpa = |causal, scale: Option<f64>| {
        ScaledDotProductAttention(ScaledDotProductAttention {
            causal,
            scale: scale.map(Float),
        })
    };
    comp(
        v,
        "sdpa/f32/full",
        sdpa(false, None),
        vec![f32_in(&[2, 2, 6, 8]), f32_in(&[2, 2, 7, 8]), f32_in(&[2, 2, 7, 5])],
    );
    comp(
        v,
        "sdpa/f32/causal_scale",
        sdpa(true, Some(0.5)),
        vec![f32_in(&[2, 2, 6, 8]), f32_in(&[2, 2, 6, 8]), f32_in(&[2, 2, 6, 5])],
    );
    // A bool mask with every row keeping key 0 (a fully masked row has no softmax).
    let mut keep = Vec::new();
    for i in 0..6 * 7 {
        keep.push(if i % 7 == 0 || (i * 5 + 3) % 4 != 0 { 1.0 } else { 0.0 });
    }
    comp(
        v,
        "sdpa/f32/bool_mask",
        sdpa(false, None),
        vec![
            f32_in(&[2, 2, 6, 8]),
            f32_in(&[2, 2, 7, 8]),
            f32_in(&[2, 2, 7, 5]),
            (DType::Bool, vec![6, 7], Domain::Values(keep)),
        ],
    );
    comp(
        v,
        "sdpa/f32/float_mask",
        sdpa(false, None),
        vec![
            f32_in(&[2, 2, 6, 8]),
            f32_in(&[2, 2, 7, 8]),
            f32_in(&[2, 2, 7, 5]),
            (f, vec![2, 1, 6, 7], Domain::Range(-2.0, 0.0)),
        ],
    );
}

/// A region graph taking `args` and returning what `body` builds.
fn region(
    name: &str,
    args: &[(&str, TensorType)],
    body: impl FnOnce(&mut Graph, &[ValueId]) -> R<Vec<ValueId>>,
) -> R<Graph> {
    let mut g = Graph::new(name);
    let ins = args
        .iter()
        .map(|(n, t)| g.add_input(n, t.clone()).map_err(s))
        .collect::<R<Vec<_>>>()?;
    let outs = body(&mut g, &ins)?;
    for (i, v) in outs.into_iter().enumerate() {
        g.add_output(&format!("r{i}"), v).map_err(s)?;
    }
    Ok(g)
}

fn scalar_of(g: &mut Graph, dtype: DType, v: f64) -> ValueId {
    g.add_scalar(dtype, v)
}

fn control(v: &mut Vec<Case>) {
    use BinaryOp::*;
    for (label, pred) in [("then", 1.0), ("else", 0.0)] {
        v.push(Case::built(OPS, format!("cond/f32/{label}"), move |b: &mut Builder| {
            let p = b.input("p", DType::Bool, &[], &Domain::Values(vec![pred]))?;
            let a = b.input("a", DType::F32, &[4, 5], &Domain::standard())?;
            let c = b.input("c", DType::F32, &[5], &Domain::standard())?;
            let args = [
                ("a", TensorType::of(DType::F32, &[4, 5])),
                ("c", TensorType::of(DType::F32, &[5])),
            ];
            let then = region("then", &args, |g, x| {
                let e = g.unary(UnaryOp::Exp, x[0]).map_err(s)?;
                Ok(vec![g.binary(Add, e, x[1]).map_err(s)?])
            })?;
            let els = region("else", &args, |g, x| {
                let m = g.binary(Mul, x[0], x[1]).map_err(s)?;
                let one = scalar_of(g, DType::F32, 1.0);
                Ok(vec![g.binary(Sub, m, one).map_err(s)?])
            })?;
            let y = b.region_op(Op::Cond, &[p, a, c], vec![then, els])?;
            b.outs(&y)
        }));
    }
    // A counted loop: (i, x) -> (i + 1, x * 1.5 + 0.25) while i < 5.
    v.push(Case::built(OPS, "while/f32/counted", |b: &mut Builder| {
        let i0 = b.input("i", DType::I32, &[], &Domain::Values(vec![0.0]))?;
        let x0 = b.input("x", DType::F32, &[6], &Domain::standard())?;
        let args = [
            ("i", TensorType::of(DType::I32, &[])),
            ("x", TensorType::of(DType::F32, &[6])),
        ];
        let cond = region("cond", &args, |g, c| {
            let five = scalar_of(g, DType::I32, 5.0);
            Ok(vec![g.binary(Lt, c[0], five).map_err(s)?])
        })?;
        let body = region("body", &args, |g, c| {
            let one = scalar_of(g, DType::I32, 1.0);
            let i = g.binary(Add, c[0], one).map_err(s)?;
            let k = scalar_of(g, DType::F32, 1.5);
            let q = scalar_of(g, DType::F32, 0.25);
            let x = g.binary(Mul, c[1], k).map_err(s)?;
            Ok(vec![i, g.binary(Add, x, q).map_err(s)?])
        })?;
        let outs = b.region_op(Op::While, &[i0, x0], vec![cond, body])?;
        b.outs(&outs)
    }));
    // A data-dependent trip count, with a cond inside the body.
    v.push(Case::built(
        OPS,
        "while/f32/data_dependent_nested_cond",
        |b: &mut Builder| {
            let x0 = b.input("x", DType::F32, &[4], &Domain::Range(0.5, 1.0))?;
            let i0 = b.input("i", DType::I64, &[], &Domain::Values(vec![0.0]))?;
            let args = [
                ("x", TensorType::of(DType::F32, &[4])),
                ("i", TensorType::of(DType::I64, &[])),
            ];
            let cond = region("cond", &args, |g, c| {
                let sum = g
                    .add_op1(
                        Op::Reduce(Reduce {
                            op: ReduceOp::Sum,
                            axes: vec![0],
                            keepdim: false,
                        }),
                        &[c[0]],
                    )
                    .map_err(s)?;
                let limit = scalar_of(g, DType::F32, 100.0);
                Ok(vec![g.binary(Lt, sum, limit).map_err(s)?])
            })?;
            let body = region("body", &args, |g, c| {
                let two = scalar_of(g, DType::I64, 2.0);
                let zero = scalar_of(g, DType::I64, 0.0);
                let r = g.binary(Rem, c[1], two).map_err(s)?;
                let even = g.binary(Eq, r, zero).map_err(s)?;
                let arg = [("x", TensorType::of(DType::F32, &[4]))];
                let then = region("then", &arg, |g, x| {
                    let one = scalar_of(g, DType::F32, 1.0);
                    Ok(vec![g.binary(Add, x[0], one).map_err(s)?])
                })?;
                let els = region("else", &arg, |g, x| {
                    let two = scalar_of(g, DType::F32, 2.0);
                    Ok(vec![g.binary(Mul, x[0], two).map_err(s)?])
                })?;
                let x = g.add_region_op(Op::Cond, &[even, c[0]], vec![then, els]).map_err(s)?;
                let one = scalar_of(g, DType::I64, 1.0);
                let i = g.binary(Add, c[1], one).map_err(s)?;
                Ok(vec![x[0], i])
            })?;
            let outs = b.region_op(Op::While, &[x0, i0], vec![cond, body])?;
            b.outs(&outs)
        },
    ));
}
