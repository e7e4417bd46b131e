//! The `simplify` pass, rule by rule: each rule fires on a small graph where it must (checked by
//! op counts) and stays put where it must not; every rewritten graph verifies and computes the
//! same outputs as the original on the reference backend, bit for bit (every rule is exact, so
//! the tolerance is zero; NaN equals NaN).

use oar_backend_reference::run_graph;
use oar_ir::ops::{BinaryOp, SliceRange, UnaryOp};
use oar_ir::ops::{Broadcast, Cast, Iota, Pad, Permute, Reshape, Slice};
use oar_ir::{DType, Dim, Float, Graph, Op, TensorData, TensorType, ValueId, Weights};
use oar_passes::{Pass, PassManager, Simplify, pass_by_name};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn t(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::of(dtype, dims)
}

fn graph_with(inputs: &[(&str, TensorType)]) -> (Graph, Vec<ValueId>) {
    let mut g = Graph::new("g");
    let vs = inputs
        .iter()
        .map(|(n, ty)| g.add_input(n, ty.clone()).unwrap())
        .collect();
    (g, vs)
}

fn un(g: &mut Graph, op: UnaryOp, x: ValueId) -> ValueId {
    g.unary(op, x).unwrap()
}

fn bin(g: &mut Graph, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
    g.binary(op, a, b).unwrap()
}

fn op1(g: &mut Graph, op: Op, x: ValueId) -> ValueId {
    g.add_op1(op, &[x]).unwrap()
}

/// A constant of `dtype` and `dims` filled with `v`.
fn full(g: &mut Graph, dtype: DType, dims: &[usize], v: f64) -> ValueId {
    g.add_constant(TensorData::full(dtype, dims.to_vec(), v).unwrap())
}

/// How many nodes of the graph (regions excluded) have this mnemonic.
fn count(g: &Graph, name: &str) -> usize {
    g.node_ids().filter(|&n| g.node(n).op.name() == name).count()
}

/// Deterministic inputs: floats in [-4, 4) with some specials, small ints, bools; symbols bound to 3.
fn inputs_for(g: &Graph, seed: u64) -> BTreeMap<String, TensorData> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = BTreeMap::new();
    for (name, ty) in g.input_specs() {
        let shape: Vec<usize> = ty.shape.bind(&|_| Some(3)).as_static().unwrap();
        let n: usize = shape.iter().product();
        let vals: Vec<f64> = (0..n)
            .map(|i| match ty.dtype {
                DType::Bool => (next() % 2) as f64,
                d if d.is_int() => (next() % 11) as f64 - 5.0,
                // A few specials so that float-unsafe rewrites would show.
                _ if i == 1 => -0.0,
                _ if i == 2 && n > 6 => f64::NAN,
                _ if i == 3 && n > 6 => f64::INFINITY,
                _ => (next() % 1024) as f64 / 128.0 - 4.0,
            })
            .collect();
        out.insert(name, TensorData::from_f64_slice(ty.dtype, shape, &vals).unwrap());
    }
    out
}

fn assert_same_results(before: &Graph, after: &Graph) {
    for seed in 1..4 {
        let inputs = inputs_for(before, seed);
        let a = run_graph(before, &Weights::new(), &inputs).unwrap();
        let b = run_graph(after, &Weights::new(), &inputs).unwrap();
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            assert_eq!(x.tensor_type(), y.tensor_type(), "{name}");
            let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
            for (p, q) in x.iter().zip(&y) {
                assert!(
                    p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                    "{name}: {p} vs {q}"
                );
            }
        }
    }
}

/// Run `simplify` (verifying before and after) and check the numbers; returns the result.
fn simplify(g: &Graph) -> Graph {
    let mut s = g.clone();
    let mut pm = PassManager::new();
    pm.add(Simplify::new()).verify_each(true);
    pm.run(&mut s).unwrap();
    assert_same_results(g, &s);
    s
}

/// One-input graph `f(x)` with output `y`.
fn unary_graph(ty: TensorType, f: impl Fn(&mut Graph, ValueId) -> ValueId) -> Graph {
    let (mut g, v) = graph_with(&[("x", ty)]);
    let y = f(&mut g, v[0]);
    g.add_output("y", y).unwrap();
    g
}

fn f32x(dims: &[usize]) -> TensorType {
    t(DType::F32, dims)
}

// ---- arithmetic ------------------------------------------------------------------------

#[test]
fn neg_neg_and_not_not() {
    let s = simplify(&unary_graph(f32x(&[8]), |g, x| {
        let n = un(g, UnaryOp::Neg, x);
        un(g, UnaryOp::Neg, n)
    }));
    assert_eq!(count(&s, "neg"), 0, "{s}");
    assert_eq!(s.outputs()[0].value, s.input_values()[0]);
    let s = simplify(&unary_graph(t(DType::Bool, &[8]), |g, x| {
        let n = un(g, UnaryOp::Not, x);
        un(g, UnaryOp::Not, n)
    }));
    assert_eq!(count(&s, "not"), 0, "{s}");
}

#[test]
fn abs_of_abs_and_of_neg() {
    let s = simplify(&unary_graph(f32x(&[8]), |g, x| {
        let n = un(g, UnaryOp::Neg, x);
        let a = un(g, UnaryOp::Abs, n);
        un(g, UnaryOp::Abs, a)
    }));
    assert_eq!((count(&s, "abs"), count(&s, "neg")), (1, 0), "{s}");
}

#[test]
fn sub_neg_and_add_neg() {
    let (mut g, v) = graph_with(&[("x", f32x(&[8])), ("y", f32x(&[8]))]);
    let n = un(&mut g, UnaryOp::Neg, v[1]);
    let a = bin(&mut g, BinaryOp::Sub, v[0], n);
    let b = bin(&mut g, BinaryOp::Add, v[0], n);
    g.add_output("a", a).unwrap();
    g.add_output("b", b).unwrap();
    let s = simplify(&g);
    assert_eq!((count(&s, "neg"), count(&s, "add"), count(&s, "sub")), (0, 1, 1), "{s}");
}

#[test]
fn division_by_a_power_of_two_becomes_a_multiplication() {
    for dtype in [DType::F32, DType::F64] {
        let s = simplify(&unary_graph(t(dtype, &[8]), |g, x| {
            let c = full(g, dtype, &[], 4.0);
            bin(g, BinaryOp::Div, x, c)
        }));
        assert_eq!((count(&s, "div"), count(&s, "mul")), (0, 1), "{s}");
    }
}

#[test]
fn division_by_three_stays() {
    let s = simplify(&unary_graph(f32x(&[8]), |g, x| {
        let c = full(g, DType::F32, &[], 3.0);
        bin(g, BinaryOp::Div, x, c)
    }));
    assert_eq!((count(&s, "div"), count(&s, "mul")), (1, 0), "{s}");
}

#[test]
fn integer_division_is_never_a_multiplication() {
    let s = simplify(&unary_graph(t(DType::I32, &[8]), |g, x| {
        let c = full(g, DType::I32, &[], 4.0);
        bin(g, BinaryOp::Div, x, c)
    }));
    assert_eq!(count(&s, "div"), 1, "{s}");
}

fn mul_mul(dtype: DType, c1: f64, c2: f64) -> Graph {
    unary_graph(t(dtype, &[8]), |g, x| {
        let (a, b) = (full(g, dtype, &[], c1), full(g, dtype, &[], c2));
        let m = bin(g, BinaryOp::Mul, x, a);
        bin(g, BinaryOp::Mul, m, b)
    })
}

#[test]
fn constant_multiplications_fold_when_exact() {
    assert_eq!(count(&simplify(&mul_mul(DType::F32, 2.0, 3.0)), "mul"), 1);
    assert_eq!(count(&simplify(&mul_mul(DType::I32, 3.0, 5.0)), "mul"), 1);
    assert_eq!(
        count(&simplify(&mul_mul(DType::I8, 100.0, 7.0)), "mul"),
        1,
        "wrapping folds too"
    );
    // Not exact for floats: the inner constant is no power of two, or the outer one shrinks.
    assert_eq!(count(&simplify(&mul_mul(DType::F32, 3.0, 2.0)), "mul"), 2);
    assert_eq!(count(&simplify(&mul_mul(DType::F32, 2.0, 0.5)), "mul"), 2);
}

#[test]
fn constant_additions_fold_for_integers_only() {
    let add_add = |dtype| {
        unary_graph(t(dtype, &[8]), move |g, x| {
            let (a, b) = (full(g, dtype, &[], 3.0), full(g, dtype, &[], 4.0));
            let m = bin(g, BinaryOp::Add, x, a);
            bin(g, BinaryOp::Add, m, b)
        })
    };
    assert_eq!(count(&simplify(&add_add(DType::I64)), "add"), 1);
    assert_eq!(count(&simplify(&add_add(DType::F32)), "add"), 2);
}

// ---- constants -------------------------------------------------------------------------

/// `x op c` (or `c op x`) with a constant of `dims` filled with `v`.
fn with_const(dtype: DType, op: BinaryOp, v: f64, dims: &[usize], left: bool) -> Graph {
    unary_graph(t(dtype, &[2, 4]), |g, x| {
        let c = full(g, dtype, dims, v);
        if left { bin(g, op, c, x) } else { bin(g, op, x, c) }
    })
}

#[test]
fn identities_with_one_and_zero_disappear() {
    use BinaryOp::*;
    let cases = [
        (DType::F32, Mul, 1.0, false),
        (DType::F32, Mul, 1.0, true),
        (DType::F32, Div, 1.0, false),
        (DType::F32, Pow, 1.0, false),
        (DType::F32, Sub, 0.0, false),
        (DType::F32, Add, -0.0, false),
        (DType::I32, Add, 0.0, false),
        (DType::I32, Add, 0.0, true),
        (DType::I32, Mul, 1.0, true),
    ];
    for (dtype, op, v, left) in cases {
        let s = simplify(&with_const(dtype, op, v, &[4], left));
        assert_eq!(count(&s, op.name()), 0, "{dtype} {} {v}: {s}", op.name());
        assert_eq!(s.outputs()[0].value, s.input_values()[0]);
    }
}

#[test]
fn an_identity_with_a_wider_constant_leaves_a_broadcast() {
    let s = simplify(&with_const(DType::F32, BinaryOp::Mul, 1.0, &[3, 2, 4], false));
    assert_eq!((count(&s, "mul"), count(&s, "broadcast")), (0, 1), "{s}");
}

#[test]
fn float_zero_identities_that_are_not_exact_stay() {
    // x + 0.0 turns -0.0 into +0.0; x - (-0.0) likewise.
    let s = simplify(&with_const(DType::F32, BinaryOp::Add, 0.0, &[], false));
    assert_eq!(count(&s, "add"), 1, "{s}");
    let s = simplify(&with_const(DType::F32, BinaryOp::Sub, -0.0, &[], false));
    assert_eq!(count(&s, "sub"), 1, "{s}");
}

#[test]
fn times_zero_is_zero_for_integers_only() {
    let s = simplify(&with_const(DType::I32, BinaryOp::Mul, 0.0, &[], false));
    assert_eq!(count(&s, "mul"), 0, "{s}");
    let s = simplify(&with_const(DType::I32, BinaryOp::Mul, 0.0, &[], true));
    assert_eq!(count(&s, "mul"), 0, "{s}");
    // NaN * 0 and inf * 0 are NaN: floats keep the multiplication.
    let s = simplify(&with_const(DType::F32, BinaryOp::Mul, 0.0, &[], false));
    assert_eq!(count(&s, "mul"), 1, "{s}");
}

// ---- movement and broadcast ------------------------------------------------------------

fn permute(perm: &[usize]) -> Op {
    Op::Permute(Permute { perm: perm.to_vec() })
}

#[test]
fn permutes_compose() {
    let s = simplify(&unary_graph(f32x(&[2, 3, 4]), |g, x| {
        let p = op1(g, permute(&[1, 2, 0]), x);
        op1(g, permute(&[0, 2, 1]), p)
    }));
    assert_eq!(count(&s, "permute"), 1, "{s}");
    // [1,2,0] then [2,0,1] is the identity: nothing is left.
    let s = simplify(&unary_graph(f32x(&[2, 3, 4]), |g, x| {
        let p = op1(g, permute(&[1, 2, 0]), x);
        op1(g, permute(&[2, 0, 1]), p)
    }));
    assert_eq!(count(&s, "permute"), 0, "{s}");
    let s = simplify(&unary_graph(f32x(&[2, 3]), |g, x| op1(g, permute(&[0, 1]), x)));
    assert_eq!(count(&s, "permute"), 0, "{s}");
}

#[test]
fn reshapes_compose_and_identity_reshapes_vanish() {
    let reshape = |d: &[usize]| {
        Op::Reshape(Reshape {
            shape: d.iter().map(|&n| Dim::Static(n)).collect(),
        })
    };
    let s = simplify(&unary_graph(f32x(&[2, 3, 4]), |g, x| {
        let a = op1(g, reshape(&[6, 4]), x);
        op1(g, reshape(&[4, 6]), a)
    }));
    assert_eq!(count(&s, "reshape"), 1, "{s}");
    let s = simplify(&unary_graph(f32x(&[2, 3, 4]), |g, x| {
        let a = op1(g, reshape(&[6, 4]), x);
        op1(g, reshape(&[2, 3, 4]), a)
    }));
    assert_eq!(count(&s, "reshape"), 0, "{s}");
}

#[test]
fn full_slices_and_empty_pads_vanish_but_real_ones_stay() {
    let s = simplify(&unary_graph(f32x(&[2, 3]), |g, x| {
        let a = op1(
            g,
            Op::Slice(Slice {
                ranges: vec![SliceRange::FULL, SliceRange::new(0, 3)],
            }),
            x,
        );
        op1(
            g,
            Op::Pad(Pad {
                before: vec![0, 0],
                after: vec![0, 0],
                value: Float(1.0),
            }),
            a,
        )
    }));
    assert_eq!((count(&s, "slice"), count(&s, "pad")), (0, 0), "{s}");
    let s = simplify(&unary_graph(f32x(&[2, 3]), |g, x| {
        let ranges = vec![SliceRange::FULL, SliceRange::new(1, 3)];
        op1(g, Op::Slice(Slice { ranges }), x)
    }));
    assert_eq!(count(&s, "slice"), 1, "{s}");
}

fn broadcast(d: &[usize]) -> Op {
    Op::Broadcast(Broadcast {
        shape: d.iter().map(|&n| Dim::Static(n)).collect(),
    })
}

#[test]
fn broadcasts_compose_and_identity_broadcasts_vanish() {
    let s = simplify(&unary_graph(f32x(&[4]), |g, x| {
        let a = op1(g, broadcast(&[3, 4]), x);
        op1(g, broadcast(&[2, 3, 4]), a)
    }));
    assert_eq!(count(&s, "broadcast"), 1, "{s}");
    let s = simplify(&unary_graph(f32x(&[3, 4]), |g, x| op1(g, broadcast(&[3, 4]), x)));
    assert_eq!(count(&s, "broadcast"), 0, "{s}");
}

// ---- casts -----------------------------------------------------------------------------

fn casts(from: DType, chain: &[DType]) -> Graph {
    unary_graph(t(from, &[8]), |g, x| {
        chain.iter().fold(x, |v, &to| op1(g, Op::Cast(Cast { to }), v))
    })
}

#[test]
fn lossless_cast_chains_collapse() {
    use DType::*;
    assert_eq!(count(&simplify(&casts(F32, &[F64, I32])), "cast"), 1);
    assert_eq!(count(&simplify(&casts(I8, &[I32, F32])), "cast"), 1);
    assert_eq!(count(&simplify(&casts(F32, &[F64, F32])), "cast"), 0);
    assert_eq!(
        count(&simplify(&casts(F32, &[F32])), "cast"),
        0,
        "cast to the same dtype"
    );
}

#[test]
fn lossy_cast_chains_stay() {
    use DType::*;
    assert_eq!(count(&simplify(&casts(F32, &[F16, F32])), "cast"), 2);
    assert_eq!(count(&simplify(&casts(I32, &[I8, I32])), "cast"), 2);
    assert_eq!(count(&simplify(&casts(F32, &[I32, F32])), "cast"), 2);
}

// ---- cost model, limits, symbols, regions ----------------------------------------------

#[test]
fn extraction_picks_the_cheaper_form() {
    // x/2 and x*0.5 are both in the e-graph; division costs more, so the product is kept.
    let s = simplify(&unary_graph(f32x(&[8]), |g, x| {
        let c = full(g, DType::F32, &[], 2.0);
        bin(g, BinaryOp::Div, x, c)
    }));
    assert_eq!((count(&s, "div"), count(&s, "mul")), (0, 1));
    use oar_passes::simplify::cost::op_cost;
    let (a, b) = (f32x(&[64, 64]), f32x(&[64]));
    assert!(
        op_cost(&Op::MatMul, &[a.clone(), a.clone()], &a)
            > op_cost(&Op::Binary(BinaryOp::Add), &[a.clone(), a.clone()], &a)
    );
    assert!(
        op_cost(&permute(&[1, 0]), std::slice::from_ref(&a), &a)
            < op_cost(&Op::Unary(UnaryOp::Neg), std::slice::from_ref(&b), &b)
    );
}

#[test]
fn unchanged_graphs_are_left_alone() {
    let g = unary_graph(f32x(&[8]), |g, x| {
        let e = un(g, UnaryOp::Exp, x);
        bin(g, BinaryOp::Mul, e, x)
    });
    let mut s = g.clone();
    assert!(!Simplify::new().run(&mut s).unwrap());
    assert_eq!(s.to_string(), g.to_string());
}

/// A chain of `n` ops that mostly cancel: neg∘neg, permute pairs, x*1.
fn big_graph(n: usize) -> Graph {
    unary_graph(f32x(&[4, 8]), |g, x| {
        let one = full(g, DType::F32, &[], 1.0);
        let mut v = x;
        for i in 0..n / 5 {
            v = un(g, UnaryOp::Neg, v);
            v = un(g, UnaryOp::Neg, v);
            v = op1(g, permute(&[1, 0]), v);
            v = op1(g, permute(&[1, 0]), v);
            v = if i % 2 == 0 {
                bin(g, BinaryOp::Mul, v, one)
            } else {
                un(g, UnaryOp::Exp, v)
            };
        }
        v
    })
}

#[test]
fn a_five_thousand_node_graph_simplifies_quickly() {
    let g = big_graph(5000);
    assert!(g.node_count() >= 5000);
    let mut s = g.clone();
    let start = Instant::now();
    let stats = Simplify::new().run_with_stats(&mut s).unwrap();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}");
    oar_ir::verify(&s).unwrap();
    assert_eq!(count(&s, "exp"), 500, "{stats:?}");
    assert_eq!(
        count(&s, "neg") + count(&s, "permute") + count(&s, "mul"),
        0,
        "{stats:?}"
    );
    assert_same_results(&g, &s);
    // A second run finds nothing left to do.
    let printed = s.to_string();
    assert!(!Simplify::new().run(&mut s).unwrap());
    assert_eq!(s.to_string(), printed);
}

#[test]
fn tight_limits_stop_gracefully() {
    let g = big_graph(2000);
    for pass in [
        Simplify::new().node_limit(10),
        Simplify::new().iter_limit(1),
        Simplify::new().time_limit(Duration::from_nanos(1)),
    ] {
        let mut s = g.clone();
        let stats = pass.run_with_stats(&mut s).unwrap();
        assert!(stats[0].hit_limit(), "{stats:?}");
        oar_ir::verify(&s).unwrap();
        assert!(s.node_count() <= g.node_count());
        assert_same_results(&g, &s);
    }
}

#[test]
fn symbolic_dims_are_fine() {
    let ty = TensorType::new(DType::I32, vec![Dim::sym("N"), Dim::Static(4)]);
    let s = simplify(&unary_graph(ty, |g, x| {
        let p = op1(g, permute(&[1, 0]), x);
        let p = op1(g, permute(&[1, 0]), p);
        let zero = full(g, DType::I32, &[], 0.0);
        let z = bin(g, BinaryOp::Mul, p, zero);
        let one = full(g, DType::I32, &[4], 1.0);
        let y = bin(g, BinaryOp::Mul, p, one);
        bin(g, BinaryOp::Add, y, z)
    }));
    assert_eq!((count(&s, "permute"), count(&s, "mul")), (0, 0), "{s}");
}

#[test]
fn cond_regions_stay_and_are_simplified_inside() {
    let (mut g, v) = graph_with(&[("p", t(DType::Bool, &[])), ("x", f32x(&[4]))]);
    let n = un(&mut g, UnaryOp::Neg, v[1]);
    let h = un(&mut g, UnaryOp::Neg, n);
    let region = |negs: usize| {
        let mut r = Graph::new("branch");
        let a = r.add_input("a", f32x(&[4])).unwrap();
        let mut y = r.unary(UnaryOp::Exp, a).unwrap();
        for _ in 0..negs {
            y = r.unary(UnaryOp::Neg, y).unwrap();
        }
        r.add_output("y", y).unwrap();
        r
    };
    let out = g
        .add_region_op(Op::Cond, &[v[0], h], vec![region(2), region(3)])
        .unwrap()[0];
    let y = un(&mut g, UnaryOp::Neg, out);
    let y = un(&mut g, UnaryOp::Neg, y);
    g.add_output("y", y).unwrap();
    let mut s = g.clone();
    let stats = Simplify::new().run_with_stats(&mut s).unwrap();
    assert_eq!(stats.len(), 3, "top level and two regions: {stats:?}");
    oar_ir::verify(&s).unwrap();
    assert_eq!((count(&s, "cond"), count(&s, "neg")), (1, 0), "{s}");
    let cond = s.node_ids().find(|&n| s.node(n).op == Op::Cond).unwrap();
    let negs: Vec<usize> = s.node(cond).regions.iter().map(|r| count(r, "neg")).collect();
    assert_eq!(negs, [0, 1]);
    assert_same_results(&g, &s);
    for p in [0.0, 1.0] {
        let mut inputs = inputs_for(&g, 7);
        inputs.insert(
            "p".into(),
            TensorData::from_f64_slice(DType::Bool, vec![], &[p]).unwrap(),
        );
        let a = run_graph(&g, &Weights::new(), &inputs).unwrap();
        let b = run_graph(&s, &Weights::new(), &inputs).unwrap();
        assert_eq!(a[0].1.to_f64_vec().len(), b[0].1.to_f64_vec().len());
        for (x, y) in a[0].1.to_f64_vec().iter().zip(b[0].1.to_f64_vec()) {
            assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
        }
    }
}

#[test]
fn registered_by_name() {
    let p = pass_by_name("simplify").unwrap();
    assert_eq!(p.name(), "simplify");
    let names = oar_passes::simplify::rules::rule_names();
    for r in [
        "mul-one",
        "permute-permute",
        "cast-cast-lossless",
        "broadcast-broadcast",
        "div-pow2",
    ] {
        assert!(names.iter().any(|n| n == r), "{r} missing from {names:?}");
    }
}

/// Rules that look through an operand must not assume one exists: `iota` has none (a regression
/// test for an index-out-of-bounds panic), and iota-derived masks keep their values.
#[test]
fn operandless_generators_survive_simplify() {
    let (mut g, v) = graph_with(&[("x", f32x(&[3, 5]))]);
    let iota = g
        .add_op1(
            Op::Iota(Iota {
                shape: [3, 5].iter().map(|&n| Dim::Static(n)).collect(),
                axis: 1,
                dtype: DType::F32,
            }),
            &[],
        )
        .unwrap();
    let one = full(&mut g, DType::F32, &[3, 5], 1.0);
    let scaled = bin(&mut g, BinaryOp::Mul, iota, one);
    let y = bin(&mut g, BinaryOp::Add, scaled, v[0]);
    g.add_output("y", y).unwrap();
    let s = simplify(&g);
    assert_eq!(count(&s, "iota"), 1);
    assert_eq!(count(&s, "mul"), 0, "x * 1 must fold away");
}
