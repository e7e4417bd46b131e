//! The Cranelift code generator against the reference backend: every unary/binary op for
//! every supported dtype, every cast pair, where, views (broadcast, transpose, slice,
//! reshape), every reduction over first/middle/last/all axes, remainders, empty tensors,
//! NaN/inf, in-place plans, thread splits, softmax / layer_norm / GELU, and the legalized
//! math (exp, log, sin, cos, tanh, erf of f32 and f64) over wide ranges.
//!
//! Tolerances: bit-exact for everything but the legalized transcendentals and `pow` (1e-6
//! relative for f32, 1e-15 for f64, plus a tiny absolute for subnormal results) and float
//! reductions (the
//! accumulation order differs: 1e-6 relative to the sum of magnitudes, f64 accumulation for
//! f32) and composite models (1e-5 relative + 1e-6 absolute). Every kernel named "compiled"
//! is checked to run as generated code (no `Step::Interpret`).

use oar_backend_cpu::lower::{Lowered, lower};
use oar_backend_reference::run_graph;
use oar_cpu_runtime::{KernelFn, Model, Step};
use oar_ir::ops::{
    BatchNorm, Broadcast, Cast, Concat, Conv2d, Gelu, LayerNorm, LogSoftmax, Permute, Reduce, Reshape, Slice, Softmax,
};
use oar_ir::ops::{BinaryOp, Composite, ReduceOp, SliceRange, UnaryOp};
use oar_ir::{DType, Dim, Float, Graph, Op, TensorData, TensorType, ValueId, Weights};
use std::collections::BTreeMap;
use std::sync::Arc;

// ---------------------------------------------------------------- data

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        self.next() as f64 / (1u64 << 53) as f64
    }
}

const FLOAT_SPECIALS: [f64; 16] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    -0.0,
    1e30,
    -1e30,
    1e-40,
    -1e-42,
    88.72,
    -103.5,
    0.5,
    2.5,
    -2.5,
    1.0,
    -0.625,
];

/// Random values of `dtype`: floats in [-4, 4] with specials mixed in (if `specials`), ints
/// across their range, bools.
fn data(dtype: DType, shape: &[usize], seed: u64, specials: bool) -> TensorData {
    let n: usize = shape.iter().product();
    let mut r = Rng(seed.wrapping_mul(0x9e3779b97f4a7c15) ^ 0x1234_5678);
    let v: Vec<f64> = (0..n)
        .map(|i| match dtype {
            DType::F32 | DType::F64 => {
                if specials && i % 7 == 3 {
                    FLOAT_SPECIALS[(r.next() % FLOAT_SPECIALS.len() as u64) as usize]
                } else {
                    r.unit() * 8.0 - 4.0
                }
            }
            DType::I8 => (r.next() % 256) as f64 - 128.0,
            DType::U8 => (r.next() % 256) as f64,
            DType::I32 => match i % 11 {
                3 => i32::MIN as f64,
                5 => i32::MAX as f64,
                7 => 0.0,
                _ => (r.next() % 2001) as f64 - 1000.0,
            },
            DType::I64 => match i % 11 {
                3 => -9.0e18,
                5 => 9.0e18,
                7 => 0.0,
                _ => (r.next() % 2001) as f64 - 1000.0,
            },
            DType::Bool => (r.next() % 2) as f64,
            _ => unreachable!(),
        })
        .collect();
    TensorData::from_f64_slice(dtype, shape.to_vec(), &v).unwrap()
}

fn f32_data(shape: &[usize], seed: u64) -> TensorData {
    data(DType::F32, shape, seed, false)
}

// ---------------------------------------------------------------- running

/// How closely the compiled result must match the reference.
#[derive(Clone, Copy, Debug)]
struct Tol {
    rel: f64,
    abs: f64,
}

const EXACT: Tol = Tol { rel: 0.0, abs: 0.0 };

/// The legalized general `pow`: f32 is computed in f64 (≤ 1 ulp); f64's `exp(b·ln|a|)` carries
/// the logarithm's rounding times `|b·ln a|` (≤ 745) ulps.
fn pow_tol(dt: DType) -> Tol {
    if dt == DType::F64 {
        Tol {
            rel: 2e-13,
            abs: 1e-300,
        }
    } else {
        math_tol(dt)
    }
}

/// The legalized transcendentals (≤ 3 ulp; see `oar_passes::legalize`).
fn math_tol(dt: DType) -> Tol {
    if dt == DType::F64 {
        Tol {
            rel: 1e-15,
            abs: 1e-300,
        }
    } else {
        Tol { rel: 1e-6, abs: 1e-40 }
    }
}

/// A lowered graph with its machine code.
struct Compiled {
    lowered: Lowered,
    funcs: Vec<KernelFn>,
}

/// The host ISA as `oar_backend_cpu::machine::host_isa` configures it, but not PIC (cranelift-jit
/// refuses PIC code).
fn jit_isa() -> cranelift_codegen::isa::OwnedTargetIsa {
    use cranelift_codegen::settings::{self, Configurable};
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").unwrap();
    flags.set("is_pic", "false").unwrap();
    flags.set("enable_verifier", "true").unwrap();
    cranelift_native::builder()
        .unwrap()
        .finish(settings::Flags::new(flags))
        .unwrap()
}

/// Lower and JIT-compile `g` (the module is leaked: tests keep their code to the end).
fn compile(g: &Graph) -> Arc<Compiled> {
    let lowered = lower(g, &BTreeMap::new()).unwrap_or_else(|e| panic!("{e}\n{}", oar_ir::text::print_graph(g)));
    let builder = cranelift_jit::JITBuilder::with_isa(jit_isa(), cranelift_module::default_libcall_names());
    let mut module = cranelift_jit::JITModule::new(builder);
    let ids: Vec<_> = lowered
        .funcs
        .iter()
        .map(|spec| {
            oar_backend_cpu::codegen::define_function(&mut module, spec, &spec.buffers, false)
                .unwrap_or_else(|e| panic!("{e}\n{}", lowered.cpu.program))
                .0
        })
        .collect();
    module.finalize_definitions().unwrap();
    let funcs = ids
        .into_iter()
        .map(|id| unsafe { std::mem::transmute::<*const u8, KernelFn>(module.get_finalized_function(id)) })
        .collect();
    Box::leak(Box::new(module));
    Arc::new(Compiled { lowered, funcs })
}

/// The kernels that were interpreted, with the reason.
fn interpreted(c: &Compiled) -> Vec<String> {
    c.lowered
        .cpu
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Interpret { kernel, reason } => Some(format!("kernel {kernel}: {reason}")),
            _ => None,
        })
        .collect()
}

fn assert_compiled(c: &Compiled) {
    let i = interpreted(c);
    assert!(i.is_empty(), "interpreted: {i:?}\n{}", c.lowered.cpu.program);
}

fn close(a: f64, b: f64, tol: Tol) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    (a - b).abs() <= tol.abs + tol.rel * a.abs()
}

fn run_model(
    c: &Compiled,
    w: &Weights,
    inputs: &BTreeMap<String, TensorData>,
    threads: usize,
) -> Vec<(String, TensorData)> {
    let mut weights = c.lowered.consts.clone();
    for (k, v) in w {
        weights.insert(k.clone(), v.clone());
    }
    let mut m = Model::new(c.lowered.cpu.clone(), c.funcs.clone(), &weights).unwrap();
    m.set_threads(threads);
    // Inputs the optimized program no longer reads are not fed.
    let used: BTreeMap<String, TensorData> = m
        .inputs()
        .into_iter()
        .map(|(n, _)| (n.clone(), inputs[&n].clone()))
        .collect();
    m.run(&used).unwrap()
}

/// Compile `g`, run it (1 thread and `threads` threads) and the reference, compare.
fn check_with(
    g: &Graph,
    w: &Weights,
    inputs: &BTreeMap<String, TensorData>,
    tol: Tol,
    compiled: bool,
) -> Arc<Compiled> {
    let c = compile(g);
    if compiled {
        assert_compiled(&c);
    }
    let want = run_graph(g, w, inputs).unwrap();
    for threads in [1, 5] {
        let got = run_model(&c, w, inputs, threads);
        assert_eq!(want.len(), got.len());
        for ((n1, a), (n2, b)) in want.iter().zip(&got) {
            assert_eq!(n1, n2);
            assert_eq!(a.dtype(), b.dtype(), "{n1}");
            assert_eq!(a.shape(), b.shape(), "{n1}");
            let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
            for (i, (x, y)) in av.iter().zip(&bv).enumerate() {
                if !close(*x, *y, tol) {
                    let ins: Vec<String> = inputs
                        .iter()
                        .map(|(k, t)| format!("{k}[{i}]={:?}", t.to_f64_vec().get(i)))
                        .collect();
                    panic!(
                        "{n1}[{i}]: reference {x:e} vs compiled {y:e} (threads {threads}, {ins:?})\n{}\n{}",
                        oar_ir::text::print_graph(g),
                        c.lowered.cpu.program
                    );
                }
            }
        }
    }
    c
}

fn check(g: &Graph, inputs: &BTreeMap<String, TensorData>, tol: Tol) -> Arc<Compiled> {
    check_with(g, &Weights::new(), inputs, tol, true)
}

fn feeds(pairs: &[(&str, TensorData)]) -> BTreeMap<String, TensorData> {
    pairs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect()
}

fn input(g: &mut Graph, name: &str, dtype: DType, shape: &[usize]) -> ValueId {
    g.add_input(name, TensorType::of(dtype, shape)).unwrap()
}

const SHAPES: [&[usize]; 6] = [&[1], &[3], &[5], &[17], &[33, 3], &[1000]];
const NUMERIC: [DType; 6] = [DType::F32, DType::F64, DType::I8, DType::U8, DType::I32, DType::I64];

// ---------------------------------------------------------------- elementwise

fn unary_ok(op: UnaryOp, dt: DType) -> bool {
    if dt.is_float() {
        op != UnaryOp::Not
    } else if dt.is_int() {
        !op.float_only()
    } else {
        op == UnaryOp::Not
    }
}

#[test]
fn every_unary_op_for_every_dtype() {
    for &op in UnaryOp::ALL {
        for dt in NUMERIC.into_iter().chain([DType::Bool]) {
            if !unary_ok(op, dt) {
                continue;
            }
            let tol = if op.is_transcendental() { math_tol(dt) } else { EXACT };
            for (s, shape) in SHAPES.iter().enumerate() {
                let mut g = Graph::new("unary");
                let x = input(&mut g, "x", dt, shape);
                let y = g.add_op1(Op::Unary(op), &[x]).unwrap();
                g.add_output("y", y).unwrap();
                let mut x = data(dt, shape, s as u64, true);
                if matches!(op, UnaryOp::Sin | UnaryOp::Cos) {
                    // The legalized sin/cos reduce accurately for |x| ≤ 8192 (f32), 1e9 (f64).
                    let v: Vec<f64> = x.to_f64_vec().iter().map(|v| v.clamp(-8192.0, 8192.0)).collect();
                    x = TensorData::from_f64_slice(dt, shape.to_vec(), &v).unwrap();
                }
                check(&g, &feeds(&[("x", x)]), tol);
            }
        }
    }
}

fn binary_ok(op: BinaryOp, dt: DType) -> bool {
    if op.is_comparison() {
        return true;
    }
    if dt.is_float() {
        !op.is_logical()
    } else if dt.is_int() {
        true
    } else {
        op.is_logical()
    }
}

#[test]
fn every_binary_op_for_every_dtype_with_broadcasting() {
    for &op in BinaryOp::ALL {
        for dt in NUMERIC.into_iter().chain([DType::Bool]) {
            if !binary_ok(op, dt) {
                continue;
            }
            // Integer div/rem/pow are compiled; a zero divisor or a negative exponent is
            // reported by the kernel (tested below), so the data here keeps them defined.
            let fallible = dt.is_int() && matches!(op, BinaryOp::Div | BinaryOp::Rem | BinaryOp::Pow);
            for (i, (sa, sb)) in [
                (&[17usize][..], &[17usize][..]),
                (&[5, 17], &[17]),
                (&[6, 9], &[6, 1]),
                (&[3], &[1]),
                (&[1000], &[1000]),
            ]
            .into_iter()
            .enumerate()
            {
                let mut g = Graph::new("binary");
                let a = input(&mut g, "a", dt, sa);
                let b = input(&mut g, "b", dt, sb);
                let y = g.add_op1(Op::Binary(op), &[a, b]).unwrap();
                g.add_output("y", y).unwrap();
                let mut bd = data(dt, sb, 100 + i as u64, true);
                if fallible {
                    // Keep the integer ops defined (non-zero divisors, small exponents).
                    let v: Vec<f64> = bd.to_f64_vec().iter().map(|&x| (x.abs() % 5.0) + 1.0).collect();
                    bd = TensorData::from_f64_slice(dt, sb.to_vec(), &v).unwrap();
                }
                let mut ad = data(dt, sa, i as u64, true);
                if dt.is_float() && op == BinaryOp::Rem {
                    // The legalized float rem is exact while |a/b| < 2^29: no 1e30 / 1e-40.
                    let tame = |d: &TensorData, f: fn(f64) -> f64| {
                        let v: Vec<f64> = d.to_f64_vec().into_iter().map(f).collect();
                        TensorData::from_f64_slice(dt, d.shape().to_vec(), &v).unwrap()
                    };
                    ad = tame(&ad, |x| x.clamp(-1e6, 1e6));
                    bd = tame(&bd, |x| if x != 0.0 && x.abs() < 0.01 { x.signum() } else { x });
                }
                check_with(
                    &g,
                    &Weights::new(),
                    &feeds(&[("a", ad), ("b", bd)]),
                    if dt.is_float() && op == BinaryOp::Pow {
                        pow_tol(dt)
                    } else {
                        EXACT
                    },
                    true,
                );
            }
        }
    }
}

/// Integer division, remainder and power are compiled (scalar lanes): truncating division, the
/// remainder with the divisor's sign, `MIN / -1` wrapping to MIN, u8 unsigned, wrapping powers;
/// a zero divisor or a negative exponent anywhere — also in a chunk run on another thread — is
/// the reference's error, not a trap.
#[test]
fn integer_division_and_power_are_compiled_and_report_their_errors() {
    // Large enough to be split across threads.
    const N: usize = 1 << 20;
    for dt in [DType::I8, DType::U8, DType::I32, DType::I64] {
        let mut g = Graph::new("idiv");
        let a = input(&mut g, "a", dt, &[N]);
        let b = input(&mut g, "b", dt, &[N]);
        let e = input(&mut g, "e", dt, &[N]);
        let q = g.add_op1(Op::Binary(BinaryOp::Div), &[a, b]).unwrap();
        let r = g.add_op1(Op::Binary(BinaryOp::Rem), &[a, b]).unwrap();
        let p = g.add_op1(Op::Binary(BinaryOp::Pow), &[a, e]).unwrap();
        g.add_output("q", q).unwrap();
        g.add_output("r", r).unwrap();
        g.add_output("p", p).unwrap();
        let (lo, hi) = match dt {
            DType::I8 => (-128.0, 127.0),
            DType::U8 => (0.0, 255.0),
            DType::I32 => (i32::MIN as f64, i32::MAX as f64),
            _ => (i64::MIN as f64, i64::MAX as f64),
        };
        let make = |v: &[f64]| TensorData::from_f64_slice(dt, vec![N], v).unwrap();
        let mut av: Vec<f64> = (0..N)
            .map(|i| ((i * 7919 % 4001) as f64 - 2000.0).clamp(lo, hi))
            .collect();
        let mut bv: Vec<f64> = (0..N).map(|i| ((i * 31 % 23) as f64 - 11.0).clamp(lo, hi)).collect();
        for v in &mut bv {
            if *v == 0.0 {
                *v = if dt == DType::U8 { 3.0 } else { -7.0 };
            }
        }
        if dt != DType::U8 {
            // MIN / -1 wraps.
            av[0] = lo;
            bv[0] = -1.0;
        }
        // Exponents 0..=66: past the width, so the products wrap as the reference's do.
        let ev: Vec<f64> = (0..N).map(|i| ((i * 13 % 67) as f64).min(hi)).collect();
        let (ad, bd, ed) = (make(&av), make(&bv), make(&ev));
        let c = check_with(
            &g,
            &Weights::new(),
            &feeds(&[("a", ad.clone()), ("b", bd.clone()), ("e", ed.clone())]),
            EXACT,
            true,
        );
        assert_compiled(&c);
        // A zero divisor (or a negative exponent) deep in the array: an error on 1 and 4
        // threads, never a crash.
        let mut bz = bv.clone();
        bz[N - 1000] = 0.0;
        let mut en = ev.clone();
        en[N - 5] = -2.0;
        let mut cases = vec![(
            feeds(&[("a", ad.clone()), ("b", make(&bz)), ("e", ed.clone())]),
            "by zero",
        )];
        if dt != DType::U8 {
            cases.push((
                feeds(&[("a", ad.clone()), ("b", bd.clone()), ("e", make(&en))]),
                "negative exponent",
            ));
        }
        for (inputs, want) in cases {
            assert!(run_graph(&g, &Weights::new(), &inputs).is_err());
            for threads in [1, 4] {
                let mut m = Model::new(c.lowered.cpu.clone(), c.funcs.clone(), &c.lowered.consts).unwrap();
                m.set_threads(threads);
                let err = m.run(&inputs).unwrap_err().to_string();
                assert!(err.contains(want), "{dt}, {threads} threads: {err}");
            }
        }
    }
}

#[test]
fn pow_with_constant_exponents() {
    for dt in [DType::F32, DType::F64] {
        for e in [0.0, 1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 2.5] {
            let mut g = Graph::new("pow");
            let x = input(&mut g, "x", dt, &[37]);
            let c = g.add_scalar(dt, e);
            let y = g.add_op1(Op::Binary(BinaryOp::Pow), &[x, c]).unwrap();
            g.add_output("y", y).unwrap();
            // Integer exponents are products (x³ and x⁴ of f32 round once in f64 like the
            // reference's pow); others are exp(e·ln|x|).
            let product = [0.0, 1.0, 2.0, -1.0].contains(&e) || (dt == DType::F32 && (e == 3.0 || e == 4.0));
            let tol = if product { EXACT } else { pow_tol(dt) };
            check(&g, &feeds(&[("x", data(dt, &[37], 7, true))]), tol);
        }
    }
}

#[test]
fn max_min_with_constants_propagate_nan() {
    for dt in [DType::F32, DType::F64] {
        for op in [BinaryOp::Max, BinaryOp::Min] {
            for (c0, swap) in [(0.0, false), (6.0, true), (-1.5, false)] {
                let mut g = Graph::new("clip");
                let x = input(&mut g, "x", dt, &[41]);
                let c = g.add_scalar(dt, c0);
                let ins = if swap { [c, x] } else { [x, c] };
                let y = g.add_op1(Op::Binary(op), &ins).unwrap();
                g.add_output("y", y).unwrap();
                check(&g, &feeds(&[("x", data(dt, &[41], 3, true))]), EXACT);
            }
        }
    }
}

#[test]
fn every_cast_pair() {
    let all = [
        DType::F32,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];
    for from in all {
        for to in all {
            for shape in [&[9usize][..], &[1000]] {
                let mut g = Graph::new("cast");
                let x = input(&mut g, "x", from, shape);
                let y = g.add_op1(Op::Cast(Cast { to }), &[x]).unwrap();
                g.add_output("y", y).unwrap();
                let mut t = data(from, shape, 11, true);
                if from.is_float() {
                    // Values around every integer type's range.
                    let extra = [
                        127.9,
                        -128.9,
                        255.5,
                        256.0,
                        -1.0,
                        3e9,
                        -3e9,
                        1e19,
                        -1e19,
                        2147483647.0,
                        9.3e18,
                    ];
                    let mut v = t.to_f64_vec();
                    for (i, e) in extra.iter().enumerate() {
                        let k = (i * 5 + 1) % v.len();
                        v[k] = *e;
                    }
                    t = TensorData::from_f64_slice(from, shape.to_vec(), &v).unwrap();
                }
                if from == DType::I64 {
                    // i64 -> f32 rounds once (not through f64).
                    let mut v: Vec<i64> = t.to_vec().unwrap();
                    v[0] = (1i64 << 60) + (1 << 36) + 1;
                    t = TensorData::from_vec(shape.to_vec(), v).unwrap();
                }
                check(&g, &feeds(&[("x", t)]), EXACT);
            }
        }
    }
}

#[test]
fn where_with_comparisons_and_broadcast() {
    for dt in [DType::F32, DType::F64, DType::I32, DType::I64, DType::U8, DType::Bool] {
        let mut g = Graph::new("where");
        let a = input(&mut g, "a", dt, &[7, 19]);
        let b = input(&mut g, "b", dt, &[19]);
        let c = input(&mut g, "c", DType::Bool, &[7, 1]);
        let lt = g.add_op1(Op::Binary(BinaryOp::Lt), &[a, b]).unwrap();
        let both = g.add_op1(Op::Binary(BinaryOp::Xor), &[lt, c]).unwrap();
        let y = g.add_op1(Op::Where, &[both, a, b]).unwrap();
        g.add_output("y", y).unwrap();
        check(
            &g,
            &feeds(&[
                ("a", data(dt, &[7, 19], 1, true)),
                ("b", data(dt, &[19], 2, true)),
                ("c", data(DType::Bool, &[7, 1], 3, false)),
            ]),
            EXACT,
        );
    }
}

#[test]
fn comparisons_feed_casts_in_vector_code() {
    // f32 -> bool mask -> f32 / i32 inside one vectorized kernel.
    let mut g = Graph::new("mask");
    let x = input(&mut g, "x", DType::F32, &[2, 1001]);
    let z = g.add_scalar(DType::F32, 0.25);
    let gt = g.add_op1(Op::Binary(BinaryOp::Gt), &[x, z]).unwrap();
    let f = g.add_op1(Op::Cast(Cast { to: DType::F32 }), &[gt]).unwrap();
    let y = g.add_op1(Op::Binary(BinaryOp::Mul), &[x, f]).unwrap();
    let i = g.add_op1(Op::Cast(Cast { to: DType::I32 }), &[y]).unwrap();
    let nb = g.add_op1(Op::Unary(UnaryOp::Not), &[gt]).unwrap();
    let ib = g.add_op1(Op::Cast(Cast { to: DType::I32 }), &[nb]).unwrap();
    let s = g.add_op1(Op::Binary(BinaryOp::Add), &[i, ib]).unwrap();
    g.add_output("y", y).unwrap();
    g.add_output("s", s).unwrap();
    check(&g, &feeds(&[("x", data(DType::F32, &[2, 1001], 5, true))]), EXACT);
}

fn slice(start: i64, end: i64, step: i64) -> SliceRange {
    SliceRange { start, end, step }
}

#[test]
fn views_broadcast_transpose_slice_reshape() {
    for (m, n) in [(3usize, 5usize), (17, 33), (64, 100)] {
        let mut g = Graph::new("views");
        let x = input(&mut g, "x", DType::F32, &[m, n]);
        let y = input(&mut g, "y", DType::F32, &[n, m]);
        let b = input(&mut g, "b", DType::F32, &[n]);
        let z = input(&mut g, "z", DType::F32, &[m * n]);
        // transpose
        let yt = g.add_op1(Op::Permute(Permute { perm: vec![1, 0] }), &[y]).unwrap();
        let s = g.add_op1(Op::Binary(BinaryOp::Add), &[x, yt]).unwrap();
        // broadcast
        let s = g.add_op1(Op::Binary(BinaryOp::Mul), &[s, b]).unwrap();
        // reshape of a buffer (a view)
        let zr = g
            .add_op1(
                Op::Reshape(Reshape {
                    shape: vec![Dim::Static(m), Dim::Static(n)],
                }),
                &[z],
            )
            .unwrap();
        let s = g.add_op1(Op::Binary(BinaryOp::Sub), &[s, zr]).unwrap();
        g.add_output("s", s).unwrap();
        // strided slice with a step, of a transposed input
        let sl = g
            .add_op1(
                Op::Slice(Slice {
                    ranges: vec![slice(1, n as i64, 2), slice(0, m as i64, 1)],
                }),
                &[y],
            )
            .unwrap();
        let e = g.add_op1(Op::Unary(UnaryOp::Exp), &[sl]).unwrap();
        g.add_output("e", e).unwrap();
        // explicit broadcast to a new leading axis
        let bb = g
            .add_op1(
                Op::Broadcast(Broadcast {
                    shape: vec![Dim::Static(4), Dim::Static(n)],
                }),
                &[b],
            )
            .unwrap();
        let bb = g.add_op1(Op::Unary(UnaryOp::Neg), &[bb]).unwrap();
        g.add_output("bb", bb).unwrap();
        check(
            &g,
            &feeds(&[
                ("x", f32_data(&[m, n], 1)),
                ("y", f32_data(&[n, m], 2)),
                ("b", f32_data(&[n], 3)),
                ("z", f32_data(&[m * n], 4)),
            ]),
            Tol { rel: 1e-6, abs: 0.0 },
        );
    }
}

#[test]
fn four_d_broadcasts_like_batch_norm() {
    // [N, C, H, W] with per-channel parameters: hoisted per-channel math, remainders.
    for (n, c, h, w) in [(2usize, 3usize, 5usize, 7usize), (1, 16, 14, 14), (2, 4, 1, 1)] {
        let mut g = Graph::new("bn");
        let x = input(&mut g, "x", DType::F32, &[n, c, h, w]);
        let scale = input(&mut g, "scale", DType::F32, &[c, 1, 1]);
        let var = input(&mut g, "var", DType::F32, &[c, 1, 1]);
        let eps = g.add_scalar(DType::F32, 1e-5);
        let v = g.add_op1(Op::Binary(BinaryOp::Add), &[var, eps]).unwrap();
        let r = g.add_op1(Op::Unary(UnaryOp::Rsqrt), &[v]).unwrap();
        let k = g.add_op1(Op::Binary(BinaryOp::Mul), &[scale, r]).unwrap();
        let y = g.add_op1(Op::Binary(BinaryOp::Mul), &[x, k]).unwrap();
        let zero = g.add_scalar(DType::F32, 0.0);
        let y = g.add_op1(Op::Binary(BinaryOp::Max), &[y, zero]).unwrap();
        g.add_output("y", y).unwrap();
        let vd: Vec<f32> = (0..c).map(|i| 0.5 + i as f32).collect();
        check(
            &g,
            &feeds(&[
                ("x", data(DType::F32, &[n, c, h, w], 1, true)),
                ("scale", f32_data(&[c, 1, 1], 2)),
                ("var", TensorData::from_vec(vec![c, 1, 1], vd).unwrap()),
            ]),
            EXACT,
        );
    }
}

#[test]
fn large_elementwise_splits_across_threads() {
    // One long row (blocked into the outer loop) and a wide 2-D case.
    for shape in [&[100_003usize][..], &[3, 50_001], &[257, 129]] {
        let mut g = Graph::new("big");
        let x = input(&mut g, "x", DType::F32, shape);
        let t = g.add_op1(Op::Unary(UnaryOp::Tanh), &[x]).unwrap();
        let two = g.add_scalar(DType::F32, 2.0);
        let y = g.add_op1(Op::Binary(BinaryOp::Mul), &[t, two]).unwrap();
        g.add_output("y", y).unwrap();
        check(&g, &feeds(&[("x", f32_data(shape, 9))]), Tol { rel: 1e-6, abs: 1e-40 });
    }
}

#[test]
fn empty_tensors() {
    let mut g = Graph::new("empty");
    let x = input(&mut g, "x", DType::F32, &[0, 5]);
    let y = g.add_op1(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    g.add_output("y", y).unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Mean] {
        let r = g
            .add_op1(
                Op::Reduce(Reduce {
                    op,
                    axes: vec![0],
                    keepdim: false,
                }),
                &[x],
            )
            .unwrap();
        g.add_output(op.name(), r).unwrap();
    }
    check(&g, &feeds(&[("x", f32_data(&[0, 5], 1))]), EXACT);
}

#[test]
fn in_place_plans_read_before_they_write() {
    // An opaque concat makes `t` a temporary; `t * 2 + 1` then writes over it in place.
    let mut g = Graph::new("inplace");
    let x = input(&mut g, "x", DType::F32, &[9, 37]);
    let t = g.add_op1(Op::Concat(Concat { axis: 1 }), &[x, x]).unwrap();
    let two = g.add_scalar(DType::F32, 2.0);
    let one = g.add_scalar(DType::F32, 1.0);
    let u = g.add_op1(Op::Binary(BinaryOp::Mul), &[t, two]).unwrap();
    let u = g.add_op1(Op::Binary(BinaryOp::Add), &[u, one]).unwrap();
    let e = g.add_op1(Op::Unary(UnaryOp::Exp), &[u]).unwrap();
    let v = g.add_op1(Op::Concat(Concat { axis: 0 }), &[e, u]).unwrap();
    g.add_output("v", v).unwrap();
    let c = check_with(
        &g,
        &Weights::new(),
        &feeds(&[("x", f32_data(&[9, 37], 3))]),
        Tol { rel: 1e-6, abs: 0.0 },
        false,
    );
    assert!(!c.lowered.cpu.plan.in_place.is_empty(), "{:?}", c.lowered.cpu.plan);
    // The elementwise kernels are compiled; only the concats are interpreted.
    for r in interpreted(&c) {
        assert!(r.contains("concat"), "{r}");
    }
}

// ---------------------------------------------------------------- reductions

fn reduce_graph(op: ReduceOp, dt: DType, shape: &[usize], axes: &[usize], keepdim: bool) -> Graph {
    let mut g = Graph::new("reduce");
    let x = input(&mut g, "x", dt, shape);
    let r = g
        .add_op1(
            Op::Reduce(Reduce {
                op,
                axes: axes.to_vec(),
                keepdim,
            }),
            &[x],
        )
        .unwrap();
    g.add_output("r", r).unwrap();
    g
}

#[test]
fn every_reduction_over_first_middle_last_and_all_axes() {
    let cases: [(&[usize], &[&[usize]]); 5] = [
        (&[1000], &[&[0]]),
        (&[3, 5, 17], &[&[0], &[1], &[2], &[0, 1, 2], &[0, 2], &[1, 2]]),
        (&[33, 7], &[&[0], &[1]]),
        (&[4, 1, 6], &[&[1], &[0, 2]]),
        (&[2, 9, 33], &[&[0], &[2], &[1, 2]]),
    ];
    for op in [
        ReduceOp::Sum,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
        ReduceOp::Mean,
    ] {
        for dt in NUMERIC {
            if op == ReduceOp::Mean && !dt.is_float() {
                continue;
            }
            let tol = if dt.is_float() && matches!(op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod) {
                Tol { rel: 1e-6, abs: 1e-6 }
            } else {
                EXACT
            };
            for (si, (shape, axes_list)) in cases.iter().enumerate() {
                for axes in axes_list.iter() {
                    for keepdim in [false, true] {
                        let g = reduce_graph(op, dt, shape, axes, keepdim);
                        eprintln!("case {op:?} {dt} {shape:?} {axes:?} {keepdim}");
                        let mut x = data(dt, shape, si as u64, false);
                        if dt.is_float() && op == ReduceOp::Prod {
                            // Keep products finite and away from underflow.
                            let v: Vec<f64> = x.to_f64_vec().iter().map(|v| 1.0 + v / 400.0).collect();
                            x = TensorData::from_f64_slice(dt, shape.to_vec(), &v).unwrap();
                        }
                        check(&g, &feeds(&[("x", x)]), tol);
                    }
                }
            }
        }
    }
}

#[test]
fn float_reductions_propagate_nan_and_inf() {
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean] {
        for dt in [DType::F32, DType::F64] {
            for (shape, axes) in [(&[5usize, 37][..], &[1usize][..]), (&[37, 5], &[0]), (&[41], &[0])] {
                let g = reduce_graph(op, dt, shape, axes, false);
                check(
                    &g,
                    &feeds(&[("x", data(dt, shape, 4, true))]),
                    Tol { rel: 1e-6, abs: 1e-6 },
                );
            }
        }
    }
}

#[test]
fn long_f32_sums_stay_within_1e_5() {
    // 1e5 elements along a contiguous axis, a strided axis, and everything.
    for (shape, axes) in [
        (&[100_000usize][..], &[0usize][..]),
        (&[4, 25_000], &[1]),
        (&[25_000, 8], &[0]),
        (&[50, 40, 50], &[0, 2]),
    ] {
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let g = reduce_graph(op, DType::F32, shape, axes, true);
            check(&g, &feeds(&[("x", f32_data(shape, 21))]), Tol { rel: 1e-5, abs: 1e-5 });
        }
    }
}

#[test]
fn blocked_f32_sums_cover_partial_blocks_and_tails() {
    // Long enough to add in f32 blocks: along the rows (a partial block and a scalar tail
    // of 3), across outputs (a partial block of rows, 4 vector + 2 scalar columns), both.
    for (shape, axes) in [
        (&[3usize, 2051][..], &[1usize][..]),
        (&[1027, 6], &[0]),
        (&[300, 2, 259], &[0, 2]),
    ] {
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let g = reduce_graph(op, DType::F32, shape, axes, false);
            check(&g, &feeds(&[("x", f32_data(shape, 9))]), Tol { rel: 1e-6, abs: 1e-6 });
        }
    }
}

#[test]
fn reduction_epilogues_and_bodies_fuse() {
    // sum((x - m)^2) / n with an rsqrt epilogue: layer-norm's variance kernel.
    let mut g = Graph::new("var");
    let x = input(&mut g, "x", DType::F32, &[6, 1000]);
    let m = g
        .add_op1(
            Op::Reduce(Reduce {
                op: ReduceOp::Mean,
                axes: vec![1],
                keepdim: true,
            }),
            &[x],
        )
        .unwrap();
    let d = g.add_op1(Op::Binary(BinaryOp::Sub), &[x, m]).unwrap();
    let d2 = g.add_op1(Op::Binary(BinaryOp::Mul), &[d, d]).unwrap();
    let v = g
        .add_op1(
            Op::Reduce(Reduce {
                op: ReduceOp::Mean,
                axes: vec![1],
                keepdim: true,
            }),
            &[d2],
        )
        .unwrap();
    let eps = g.add_scalar(DType::F32, 1e-5);
    let v = g.add_op1(Op::Binary(BinaryOp::Add), &[v, eps]).unwrap();
    let r = g.add_op1(Op::Unary(UnaryOp::Rsqrt), &[v]).unwrap();
    g.add_output("r", r).unwrap();
    check(
        &g,
        &feeds(&[("x", f32_data(&[6, 1000], 5))]),
        Tol { rel: 1e-6, abs: 1e-7 },
    );
}

#[test]
fn max_over_an_empty_axis_is_an_error_like_the_reference() {
    // (op, dtype, shape, axis, fails): an empty reduction fails only for a nonempty output.
    for (op, dt, shape, axis, fails) in [
        (ReduceOp::Max, DType::F32, [0usize, 3], 0usize, true),
        (ReduceOp::Min, DType::I32, [4, 0], 1, true),
        (ReduceOp::Max, DType::F32, [0, 3], 1, false),
    ] {
        let g = reduce_graph(op, dt, &shape, &[axis], false);
        let c = compile(&g);
        assert!(interpreted(&c).is_empty(), "{:?}", interpreted(&c));
        let fail_steps = c
            .lowered
            .cpu
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Fail { .. }))
            .count();
        assert_eq!(fail_steps, fails as usize, "{op:?} {dt} {shape:?}");
        let x = feeds(&[("x", TensorData::full(dt, shape.to_vec(), 0.0).unwrap())]);
        let m = Model::new(c.lowered.cpu.clone(), c.funcs.clone(), &c.lowered.consts).unwrap();
        match (run_graph(&g, &Weights::new(), &x), m.run(&x)) {
            (Err(want), Err(got)) => {
                assert!(fails);
                for e in [want.to_string(), got.to_string()] {
                    assert!(
                        e.contains(&format!("{} over an empty axis has no identity", op.name())),
                        "{e}"
                    );
                }
            }
            (Ok(want), Ok(got)) => {
                assert!(!fails);
                assert_eq!(want, got);
            }
            (want, got) => panic!("{op:?} {dt} {shape:?}: reference {want:?}, cpu {got:?}"),
        }
    }
}

// ---------------------------------------------------------------- composites

fn composite(c: Composite, shape: &[usize]) -> (Graph, BTreeMap<String, TensorData>, Weights) {
    composite_of(c, shape, DType::F32)
}

/// A graph applying `c` to an input `x` of `dt` (layer norm: with params `gamma`, `beta`), and
/// its feeds (values in [-12, 12]) and weights.
fn composite_of(c: Composite, shape: &[usize], dt: DType) -> (Graph, BTreeMap<String, TensorData>, Weights) {
    let mut g = Graph::new(c.name());
    let x = input(&mut g, "x", dt, shape);
    let mut w = Weights::new();
    let mut ins = vec![x];
    let of = |t: TensorData, scale: f64| {
        let v: Vec<f64> = t.to_f64_vec().iter().map(|v| v * scale).collect();
        TensorData::from_f64_slice(dt, t.shape().to_vec(), &v).unwrap()
    };
    if let Composite::LayerNorm(LayerNorm { normalized_ndim, .. }) = c {
        let d = &shape[shape.len() - normalized_ndim..];
        for (name, seed) in [("gamma", 7), ("beta", 8)] {
            w.insert(name.into(), of(f32_data(d, seed), 1.0));
            ins.push(g.add_param(name, TensorType::of(dt, d)).unwrap());
        }
    }
    let y = g.add_op1(Op::Composite(c), &ins).unwrap();
    g.add_output("y", y).unwrap();
    (g, feeds(&[("x", of(f32_data(shape, 3), 3.0))]), w)
}

#[test]
fn softmax_layer_norm_and_gelu_are_compiled() {
    let tol = Tol { rel: 1e-5, abs: 1e-6 };
    for shape in [&[4usize, 7][..], &[2, 3, 128], &[3, 1000]] {
        let last = shape.len() - 1;
        for c in [
            Composite::Softmax(Softmax { axis: last }),
            Composite::Softmax(Softmax { axis: 0 }),
            Composite::LogSoftmax(LogSoftmax { axis: last }),
            Composite::LayerNorm(LayerNorm {
                normalized_ndim: 1,
                epsilon: Float(1e-5),
            }),
            Composite::Gelu(Gelu { approximate: false }),
            Composite::Gelu(Gelu { approximate: true }),
        ] {
            let (g, x, w) = composite(c, shape);
            check_with(&g, &w, &x, tol, true);
        }
    }
}

/// The ops of a compiled program's opaque (native) kernels, in order.
fn native_ops(c: &Compiled) -> Vec<String> {
    c.lowered
        .cpu
        .program
        .kernels
        .iter()
        .filter_map(|k| match &k.body {
            oar_ir::kernel::KernelBody::Opaque(o) => Some(o.op.name().to_string()),
            _ => None,
        })
        .collect()
}

/// PyTorch's ONNX export spells GELU out (`mul(mul(x, add(erf(div(x, √2)), 1)), 0.5)`, or
/// the tanh form): the cpu backend recomposes it and runs the runtime's gelu after the
/// matmul + bias. Compared with the reference's `gelu` (f64) on the same matmul: the
/// spelled-out chain itself, evaluated in f32, is up to 6% off in the negative tail (`1 +
/// erf` cancels), the native kernel within 1e-5. Inputs are multiples of 1/8 and weights of
/// 1/16, so the matmul is exact in f32 and only GELU's error is measured.
#[test]
fn spelled_out_gelu_runs_the_native_kernel() {
    let grid = |t: TensorData, scale: f64, step: f64| {
        let v: Vec<f64> = t
            .to_f64_vec()
            .iter()
            .map(|v| (v * scale / step).round() * step)
            .collect();
        TensorData::from_f64_slice(DType::F32, t.shape().to_vec(), &v).unwrap()
    };
    let ff = |g: &mut Graph, w: &mut Weights| {
        let x = input(g, "x", DType::F32, &[64, 32]);
        let k = param(g, w, "w", &[32, 48]);
        let b = param(g, w, "b", &[48]);
        let m = g.add_op1(Op::MatMul, &[x, k]).unwrap();
        g.add_op1(Op::Binary(BinaryOp::Add), &[b, m]).unwrap()
    };
    let inputs = feeds(&[("x", grid(f32_data(&[64, 32], 5), 6.0, 0.125))]);
    for approximate in [false, true] {
        let (mut whole, mut w) = (Graph::new("ff"), Weights::new());
        let h = ff(&mut whole, &mut w);
        let w: Weights = w.into_iter().map(|(k, t)| (k, grid(t, 1.0, 0.0625))).collect();
        let y = whole
            .add_op1(Op::Composite(Composite::Gelu(Gelu { approximate })), &[h])
            .unwrap();
        whole.add_output("y", y).unwrap();
        let want = run_graph(&whole, &w, &inputs).unwrap().remove(0).1.to_f64_vec();
        let mut g = Graph::new("ff");
        let h = ff(&mut g, &mut Weights::new());
        let scalar = |g: &mut Graph, v: f64| g.add_scalar(DType::F32, v);
        let bin = |g: &mut Graph, op, a, b| g.add_op1(Op::Binary(op), &[a, b]).unwrap();
        let inner = if approximate {
            let three = scalar(&mut g, 3.0);
            let h3 = bin(&mut g, BinaryOp::Pow, h, three);
            let c = scalar(&mut g, 0.044715);
            let h3 = bin(&mut g, BinaryOp::Mul, h3, c);
            let s = bin(&mut g, BinaryOp::Add, h, h3);
            let c = scalar(&mut g, (2.0 / std::f64::consts::PI).sqrt());
            let s = bin(&mut g, BinaryOp::Mul, s, c);
            g.add_op1(Op::Unary(UnaryOp::Tanh), &[s]).unwrap()
        } else {
            let c = scalar(&mut g, std::f64::consts::SQRT_2);
            let d = bin(&mut g, BinaryOp::Div, h, c);
            g.add_op1(Op::Unary(UnaryOp::Erf), &[d]).unwrap()
        };
        let one = scalar(&mut g, 1.0);
        let a = bin(&mut g, BinaryOp::Add, inner, one);
        let p = bin(&mut g, BinaryOp::Mul, h, a);
        let half = scalar(&mut g, 0.5);
        let y = bin(&mut g, BinaryOp::Mul, p, half);
        g.add_output("y", y).unwrap();
        let compiled = compile(&g);
        assert_compiled(&compiled);
        for threads in [1, 5] {
            let got = run_model(&compiled, &w, &inputs, threads).remove(0).1.to_f64_vec();
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                let tol = Tol { rel: 1e-5, abs: 1e-6 };
                assert!(close(*a, *b, tol), "approximate {approximate}: y[{i}] {a:e} vs {b:e}");
            }
        }
        let natives = native_ops(&compiled);
        assert_eq!(
            natives,
            ["gelu"],
            "approximate {approximate}:\n{}",
            compiled.lowered.cpu.program
        );
    }
}

/// Attention as PyTorch exports it (`q` and `kᵀ` each times `√scale`, matmul, softmax on the
/// last axis, matmul with `v`) and as written by hand (`q kᵀ / √d + mask`): the cpu backend
/// recomposes both into its native `sdpa` and agrees with the reference on the spelled-out
/// graph (1e-5 relative, 1e-5 absolute: outputs are weighted means of `v`, values up to 2.5,
/// some of them near 0 where they cancel).
#[test]
fn spelled_out_attention_runs_the_native_kernel() {
    for masked in [false, true] {
        let mut g = Graph::new("attention");
        let t = [2usize, 3, 40, 16];
        let q = input(&mut g, "q", DType::F32, &t);
        let k = input(&mut g, "k", DType::F32, &t);
        let v = input(&mut g, "v", DType::F32, &t);
        let mask = input(&mut g, "mask", DType::F32, &[40, 40]);
        let kt = g
            .add_op1(Op::Permute(Permute { perm: vec![0, 1, 3, 2] }), &[k])
            .unwrap();
        let scores = if masked {
            let sc = g.add_op1(Op::MatMul, &[q, kt]).unwrap();
            let d = g.add_scalar(DType::F32, 4.0);
            let sc = g.add_op1(Op::Binary(BinaryOp::Div), &[sc, d]).unwrap();
            g.add_op1(Op::Binary(BinaryOp::Add), &[sc, mask]).unwrap()
        } else {
            let s = g.add_scalar(DType::F32, 0.5);
            let qs = g.add_op1(Op::Binary(BinaryOp::Mul), &[q, s]).unwrap();
            let ks = g.add_op1(Op::Binary(BinaryOp::Mul), &[kt, s]).unwrap();
            g.add_op1(Op::MatMul, &[qs, ks]).unwrap()
        };
        let p = g
            .add_op1(Op::Composite(Composite::Softmax(Softmax { axis: 3 })), &[scores])
            .unwrap();
        let y = g.add_op1(Op::MatMul, &[p, v]).unwrap();
        g.add_output("y", y).unwrap();
        let causal: Vec<f64> = (0..1600).map(|i| if i % 40 > i / 40 { -1e9 } else { 0.0 }).collect();
        let inputs = feeds(&[
            ("q", f32_data(&t, 1)),
            ("k", f32_data(&t, 2)),
            ("v", f32_data(&t, 3)),
            (
                "mask",
                TensorData::from_f64_slice(DType::F32, vec![40, 40], &causal).unwrap(),
            ),
        ]);
        let compiled = check_with(&g, &Weights::new(), &inputs, Tol { rel: 1e-5, abs: 1e-5 }, true);
        let natives = native_ops(&compiled);
        assert_eq!(natives, ["sdpa"], "masked {masked}:\n{}", compiled.lowered.cpu.program);
    }
}

/// The row steps of a compiled model: `(rows, per-row iterations of each piece)`.
fn row_steps(c: &Compiled) -> Vec<(u64, Vec<u64>)> {
    c.lowered
        .cpu
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Rows { rows, pieces, .. } => Some((*rows, pieces.iter().map(|p| p.per_row).collect())),
            _ => None,
        })
        .collect()
}

/// `g` with every composite replaced by primitives.
fn decomposed(g: &Graph) -> Graph {
    use oar_passes::Pass;
    let mut g = g.clone();
    oar_passes::Decompose::all().run(&mut g).unwrap();
    g
}

/// softmax / log_softmax / layer_norm stay whole and run as the runtime's row kernels (one
/// native step), over any axis, matching the reference on f32, f64 and bf16.
#[test]
fn kept_composites_run_as_native_row_kernels() {
    let ln = |n| {
        Composite::LayerNorm(LayerNorm {
            normalized_ndim: n,
            epsilon: Float(1e-5),
        })
    };
    for (c, shape) in [
        (ln(1), &[64usize, 4, 96][..]),
        (ln(2), &[6, 4, 33]),
        (Composite::Softmax(Softmax { axis: 2 }), &[64, 4, 96]),
        (Composite::Softmax(Softmax { axis: 1 }), &[5, 7, 19]),
        (Composite::LogSoftmax(LogSoftmax { axis: 1 }), &[300, 33]),
        (Composite::LogSoftmax(LogSoftmax { axis: 0 }), &[9, 20]),
    ] {
        let (g, x, w) = composite(c.clone(), shape);
        let compiled = check_with(&g, &w, &x, Tol { rel: 2e-6, abs: 1e-6 }, true);
        let steps = &compiled.lowered.cpu.steps;
        assert!(
            matches!(steps.as_slice(), [Step::Native { .. }]),
            "{c:?}: {steps:?}\n{}",
            compiled.lowered.cpu.program
        );
        for dt in [DType::F64, DType::BF16] {
            let (g, x, w) = composite_of(c.clone(), shape, dt);
            let tol = if dt == DType::F64 {
                Tol { rel: 1e-13, abs: 1e-15 }
            } else {
                Tol { rel: 2e-2, abs: 1e-2 }
            };
            check_with(&g, &w, &x, tol, true);
        }
    }
}

/// `lstm_seq` and `gru_seq` (a whole LSTM / GRU layer's recurrence) run as one native kernel in
/// f32 and f64 — both directions, a hidden size off the vector width, a single step — within
/// rounding of the reference; bf16, which the kernels do not take, still runs (interpreted).
#[test]
fn recurrences_run_as_one_native_kernel() {
    use oar_ir::ops::{GruSeq, LstmSeq};
    for (n, t, h, reverse) in [(3usize, 5usize, 19usize, false), (2, 4, 8, true), (1, 1, 3, false)] {
        let cases = [
            (
                Composite::LstmSeq(LstmSeq { reverse }),
                vec![
                    ("xg", vec![n, t, 4 * h]),
                    ("w_hh", vec![4 * h, h]),
                    ("h0", vec![n, h]),
                    ("c0", vec![n, h]),
                ],
                &["y", "h", "c"][..],
            ),
            (
                Composite::GruSeq(GruSeq { reverse }),
                vec![
                    ("xg", vec![n, t, 3 * h]),
                    ("w_hh", vec![3 * h, h]),
                    ("b_hh", vec![3 * h]),
                    ("h0", vec![n, h]),
                ],
                &["y", "h"][..],
            ),
        ];
        for (op, shapes, results) in cases {
            for dt in [DType::F32, DType::F64, DType::BF16] {
                let mut g = Graph::new(op.name());
                let ins: Vec<ValueId> = shapes.iter().map(|(name, s)| input(&mut g, name, dt, s)).collect();
                let ys = g.add_op(Op::Composite(op.clone()), &ins).unwrap();
                for (name, y) in results.iter().zip(ys) {
                    g.add_output(name, y).unwrap();
                }
                let x: BTreeMap<String, TensorData> = shapes
                    .iter()
                    .enumerate()
                    .map(|(i, (name, s))| {
                        // Inputs up to ±3 (saturating gates and tails of exp too); recurrent
                        // weights scaled by 1/√H as initializers do (larger ones make the
                        // recurrence chaotic: f32 rounding then grows step by step).
                        let scale = if *name == "w_hh" { 1.0 / (h as f64).sqrt() } else { 3.0 };
                        let v: Vec<f64> = f32_data(s, 30 + i as u64)
                            .to_f64_vec()
                            .iter()
                            .map(|v| scale * v)
                            .collect();
                        (name.to_string(), TensorData::from_f64_slice(dt, s.clone(), &v).unwrap())
                    })
                    .collect();
                let tol = match dt {
                    DType::F32 => Tol { rel: 1e-5, abs: 1e-5 },
                    DType::F64 => Tol { rel: 1e-12, abs: 1e-13 },
                    _ => Tol { rel: 2e-2, abs: 1e-2 },
                };
                let compiled = check_with(&g, &Weights::new(), &x, tol, dt != DType::BF16);
                if dt != DType::BF16 {
                    let steps = &compiled.lowered.cpu.steps;
                    assert!(
                        matches!(steps.as_slice(), [Step::Native { .. }]),
                        "{} {dt} {n}x{t}x{h}: {steps:?}\n{}",
                        op.name(),
                        compiled.lowered.cpu.program
                    );
                }
            }
        }
    }
}

#[test]
fn staged_kernels_run_a_block_of_rows_at_a_time() {
    let tol = Tol { rel: 1e-5, abs: 1e-6 };
    let ln = |n| {
        Composite::LayerNorm(LayerNorm {
            normalized_ndim: n,
            epsilon: Float(1e-5),
        })
    };
    // The backend runs these composites natively (`kept_composites_run_as_native_row_kernels`);
    // decomposed, they are the reductions and epilogues staged kernels are made of.
    // (composite, shape, rows): one kernel of stages each, rows aligned in every piece.
    for (c, shape, rows) in [
        (ln(1), &[64usize, 4, 96][..], 256u64),
        (ln(2), &[64, 4, 96], 64),
        (Composite::Softmax(Softmax { axis: 2 }), &[64, 4, 96], 256),
        (Composite::LogSoftmax(LogSoftmax { axis: 1 }), &[300, 33], 300),
    ] {
        let (g, x, w) = composite(c.clone(), shape);
        let compiled = check_with(&decomposed(&g), &w, &x, tol, true);
        let steps = row_steps(&compiled);
        assert_eq!(steps.len(), 1, "{c:?}: {steps:?}\n{}", compiled.lowered.cpu.program);
        let (r, per_row) = &steps[0];
        assert_eq!(*r, rows, "{c:?}");
        // Two stages then the epilogue; every piece runs whole rows.
        assert_eq!(per_row.len(), 3, "{c:?}: {per_row:?}");
        assert!(per_row.iter().all(|&p| p > 0), "{c:?}: {per_row:?}");
    }
    // Softmax over rows of a transposed input: the stages vectorize across rows (their
    // reductions are strided), so the pieces run one after another (same results).
    let mut g = Graph::new("softmax_t");
    let xt = input(&mut g, "xt", DType::F32, &[24, 40]);
    let x = g.add_op1(Op::Permute(Permute { perm: vec![1, 0] }), &[xt]).unwrap();
    let y = g
        .add_op1(Op::Composite(Composite::Softmax(Softmax { axis: 1 })), &[x])
        .unwrap();
    g.add_output("y", y).unwrap();
    let compiled = check_with(
        &decomposed(&g),
        &Weights::new(),
        &feeds(&[("xt", f32_data(&[24, 40], 5))]),
        tol,
        true,
    );
    let steps = row_steps(&compiled);
    assert_eq!(steps.len(), 1, "{steps:?}\n{}", compiled.lowered.cpu.program);
    assert!(steps[0].1.contains(&0), "{steps:?}");
}

// ---------------------------------------------------------------- inline math accuracy

fn dense(lo: f32, hi: f32, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n).map(|i| lo + (hi - lo) * i as f32 / (n - 1) as f32).collect();
    v.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        f32::MAX,
        f32::MIN,
        1e-30,
        -1e-30,
        1e-42,
        88.72283,
        88.7229,
        -87.33,
        -103.97,
        -104.5,
        0.625,
        -0.625,
        0.62499994,
        1.0,
        -1.0,
        3.92,
        4.0,
        -4.0,
    ]);
    v
}

/// The legalized math (`oar_passes::legalize`) as generated code, scalar and vector lanes,
/// against the reference's libm, f32 and f64, over wide ranges and the special values.
#[test]
fn legalized_math_matches_libm_over_wide_ranges() {
    for (op, lo, hi) in [
        (UnaryOp::Exp, -110.0, 95.0),
        (UnaryOp::Exp, -1.0, 1.0),
        (UnaryOp::Log, 0.0, 1e4),
        (UnaryOp::Log, 0.5, 2.0),
        (UnaryOp::Sin, -100.0, 100.0),
        (UnaryOp::Cos, -8000.0, 8000.0),
        (UnaryOp::Tanh, -12.0, 12.0),
        (UnaryOp::Tanh, -1e-3, 1e-3),
        (UnaryOp::Erf, -6.0, 6.0),
        (UnaryOp::Erf, -1e-3, 1e-3),
    ] {
        let trig = matches!(op, UnaryOp::Sin | UnaryOp::Cos);
        // sin/cos keep their accuracy for |x| ≤ 8192 (f32): leave the huge specials out.
        let v: Vec<f64> = dense(lo, hi, 100_001)
            .into_iter()
            .filter(|x| !trig || !x.is_finite() || x.abs() <= 8192.0)
            .map(f64::from)
            .collect();
        let n = v.len();
        for (dt, tol) in [
            (DType::F32, Tol { rel: 1e-6, abs: 1e-40 }),
            (
                DType::F64,
                Tol {
                    rel: 1e-15,
                    abs: 1e-300,
                },
            ),
        ] {
            let mut g = Graph::new("math");
            let x = input(&mut g, "x", dt, &[n]);
            let y = g.add_op1(Op::Unary(op), &[x]).unwrap();
            g.add_output("y", y).unwrap();
            let t = TensorData::from_f64_slice(dt, vec![n], &v).unwrap();
            check(&g, &feeds(&[("x", t)]), tol);
        }
    }
}

// ---------------------------------------------------------------- CLIF and other ISAs

/// `(function name, CLIF text)` of every generated function of `g`.
fn clif_of(g: &Graph) -> Vec<(String, String)> {
    let lowered = oar_backend_cpu::lower::lower(g, &BTreeMap::new()).unwrap();
    let builder = cranelift_jit::JITBuilder::with_isa(jit_isa(), cranelift_module::default_libcall_names());
    let mut module = cranelift_jit::JITModule::new(builder);
    lowered
        .funcs
        .iter()
        .map(|spec| {
            let (_, clif) = oar_backend_cpu::codegen::define_function(&mut module, spec, &spec.buffers, true).unwrap();
            (spec.name.clone(), clif.unwrap())
        })
        .collect()
}

#[test]
fn clif_text_names_the_function_and_uses_vectors() {
    let mut g = Graph::new("clif");
    let x = input(&mut g, "x", DType::F32, &[8, 64]);
    let e = g.add_op1(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    g.add_output("y", e).unwrap();
    for (name, clif) in clif_of(&g) {
        assert!(clif.contains(&format!("function %{name}(")), "{clif}");
        assert!(clif.contains("load.f32x4") && clif.contains("store"), "{clif}");
        // The legalized exp: no call per element.
        assert!(!clif.contains("call"), "{clif}");
    }
}

/// An optimizer-style update: a f64 scalar (a step count) cast to f32 and raised to a power is
/// loop-invariant, so the f32 loop still vectorizes (the scalar part runs once — since fusion
/// gives a costly one-element value its own kernel, in that kernel — and is splatted), and the
/// results match the reference.
#[test]
fn loop_invariant_scalars_of_another_width_keep_the_loop_vectorized() {
    let mut g = Graph::new("update");
    let p = input(&mut g, "p", DType::F32, &[4, 37]);
    let v = input(&mut g, "v", DType::F32, &[4, 37]);
    let t = input(&mut g, "t", DType::F64, &[]);
    let t32 = g.add_op1(Op::Cast(Cast { to: DType::F32 }), &[t]).unwrap();
    let beta = g.add_constant(TensorData::from_vec(vec![], vec![0.9f32]).unwrap());
    let bt = g.add_op1(Op::Binary(BinaryOp::Pow), &[beta, t32]).unwrap();
    let s = g.add_op1(Op::Unary(UnaryOp::Sqrt), &[v]).unwrap();
    let d = g.add_op1(Op::Binary(BinaryOp::Div), &[s, bt]).unwrap();
    let y = g.add_op1(Op::Binary(BinaryOp::Sub), &[p, d]).unwrap();
    g.add_output("y", y).unwrap();
    let clifs = clif_of(&g);
    let all = clifs.iter().map(|(_, c)| c.as_str()).collect::<Vec<_>>().join("\n");
    assert!(
        clifs
            .iter()
            .any(|(_, c)| c.contains("load.f32x4") && c.contains("splat.f32x4")),
        "the loop is vectorized: {all}"
    );
    assert!(all.contains("load.f64"), "the f64 scalar is loaded: {all}");
    let pv = TensorData::from_vec(vec![4, 37], (0..148).map(|i| i as f32 * 0.25 - 7.0).collect()).unwrap();
    let vv = TensorData::from_vec(
        vec![4, 37],
        (0..148).map(|i| (i as f32 * 0.37).sin().abs() + 0.1).collect(),
    )
    .unwrap();
    let tv = TensorData::from_vec(vec![], vec![3.0f64]).unwrap();
    check(
        &g,
        &feeds(&[("p", pv), ("v", vv), ("t", tv)]),
        Tol { rel: 1e-6, abs: 1e-6 },
    );
}

/// Every kernel of these graphs also compiles for a plain SSE4.2 x86-64 (no AVX), the floor
/// of what AOT binaries assume.
#[test]
fn kernels_compile_for_baseline_x86_64() {
    use cranelift_codegen::settings::{self, Configurable};
    use std::str::FromStr;
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").unwrap();
    flags.set("is_pic", "true").unwrap();
    flags.enable("enable_verifier").unwrap();
    let mut isa_b =
        cranelift_codegen::isa::lookup(target_lexicon::Triple::from_str("x86_64-unknown-linux-gnu").unwrap()).unwrap();
    isa_b.enable("sse42").unwrap();
    let isa = isa_b.finish(settings::Flags::new(flags)).unwrap();
    let mut graphs = Vec::new();
    for &op in UnaryOp::ALL {
        for dt in NUMERIC.into_iter().chain([DType::Bool]) {
            if unary_ok(op, dt) {
                let mut g = Graph::new("u");
                let x = input(&mut g, "x", dt, &[64]);
                let y = g.add_op1(Op::Unary(op), &[x]).unwrap();
                g.add_output("y", y).unwrap();
                graphs.push(g);
            }
        }
    }
    for &op in BinaryOp::ALL {
        for dt in NUMERIC.into_iter().chain([DType::Bool]) {
            if binary_ok(op, dt) {
                let mut g = Graph::new("b");
                let a = input(&mut g, "a", dt, &[64]);
                let b = input(&mut g, "b", dt, &[64]);
                let y = g.add_op1(Op::Binary(op), &[a, b]).unwrap();
                g.add_output("y", y).unwrap();
                graphs.push(g);
            }
        }
    }
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
        for dt in NUMERIC {
            for axes in [&[0usize][..], &[1]] {
                graphs.push(reduce_graph(op, dt, &[16, 16], axes, false));
            }
        }
    }
    for from in NUMERIC.into_iter().chain([DType::Bool]) {
        for to in NUMERIC.into_iter().chain([DType::Bool]) {
            let mut g = Graph::new("c");
            let x = input(&mut g, "x", from, &[64]);
            let y = g.add_op1(Op::Cast(Cast { to }), &[x]).unwrap();
            g.add_output("y", y).unwrap();
            graphs.push(g);
        }
    }
    let builder =
        cranelift_object::ObjectBuilder::new(isa, "kernels", cranelift_module::default_libcall_names()).unwrap();
    let mut module = cranelift_object::ObjectModule::new(builder);
    let mut n = 0;
    for g in &graphs {
        let lowered = oar_backend_cpu::lower::lower(g, &BTreeMap::new()).unwrap();
        for spec in &lowered.funcs {
            let mut spec = spec.clone();
            spec.name = format!("{}_{n}", spec.name);
            n += 1;
            oar_backend_cpu::codegen::define_function(&mut module, &spec, &spec.buffers, false)
                .unwrap_or_else(|e| panic!("{e}\n{}", oar_ir::text::print_graph(g)));
        }
    }
    assert!(n > 100);
    module.finish();
}

// ---------------------------------------------------------------- model blocks

fn param(g: &mut Graph, w: &mut Weights, name: &str, dims: &[usize]) -> ValueId {
    w.insert(name.into(), f32_data(dims, w.len() as u64 + 100));
    g.add_param(name, TensorType::of(DType::F32, dims)).unwrap()
}

/// Every loop kernel and every matmul/conv epilogue of a transformer encoder layer and a
/// ResNet basic block is generated code; when the runtime runs contractions, the whole block
/// matches the reference (until then the run is skipped).
#[test]
fn transformer_layer_and_resnet_block_kernels_are_all_compiled() {
    // Outputs reach ~2e3 (q·kᵀ ~6e3 inside) from sums that cancel, so f32 rounding leaves
    // absolute errors of a few 1e-3 on every element, small ones included (~3e-6 of the
    // largest); an absolute 1e-2 is that, with margin.
    let tol = Tol { rel: 1e-4, abs: 1e-2 };
    // Transformer encoder layer (one head).
    let (b, s, d, f) = (2, 16, 32, 64);
    let mut g = Graph::new("encoder");
    let mut w = Weights::new();
    let x = input(&mut g, "x", DType::F32, &[b, s, d]);
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
    let scale = g.add_scalar(DType::F32, 1.0 / (d as f64).sqrt());
    let sc = g.add_op1(Op::Binary(BinaryOp::Mul), &[sc, scale]).unwrap();
    let a = g
        .add_op1(Op::Composite(Composite::Softmax(Softmax { axis: 2 })), &[sc])
        .unwrap();
    let att = g.add_op1(Op::MatMul, &[a, v]).unwrap();
    let o = lin(&mut g, &mut w, att, "o", d, d);
    let r1 = g.add_op1(Op::Binary(BinaryOp::Add), &[x, o]).unwrap();
    let h2 = ln(&mut g, &mut w, r1, "ln2");
    let f1 = lin(&mut g, &mut w, h2, "ff1", d, f);
    let f1 = g
        .add_op1(Op::Composite(Composite::Gelu(Gelu { approximate: false })), &[f1])
        .unwrap();
    let f2 = lin(&mut g, &mut w, f1, "ff2", f, d);
    let y = g.add_op1(Op::Binary(BinaryOp::Add), &[r1, f2]).unwrap();
    g.add_output("y", y).unwrap();
    let encoder = (g, w, feeds(&[("x", f32_data(&[b, s, d], 6))]));
    // ResNet basic block: conv-bn-relu-conv-bn (+x) relu.
    let c = 8;
    let mut g = Graph::new("block");
    let mut w = Weights::new();
    let x = input(&mut g, "x", DType::F32, &[1, c, 10, 10]);
    let conv_bn = |g: &mut Graph, w: &mut Weights, x, n: &str| {
        let k = param(g, w, &format!("{n}.w"), &[c, c, 3, 3]);
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
        let ps: Vec<ValueId> = ["scale", "bias", "mean"]
            .iter()
            .map(|p| param(g, w, &format!("{n}.{p}"), &[c]))
            .collect();
        w.insert(
            format!("{n}.var"),
            TensorData::from_vec(vec![c], vec![0.5f32; c]).unwrap(),
        );
        let var = g
            .add_param(&format!("{n}.var"), TensorType::of(DType::F32, &[c]))
            .unwrap();
        let bn = Composite::BatchNorm(BatchNorm {
            epsilon: Float(1e-5),
            momentum: Float(0.9),
            training: false,
        });
        g.add_op1(Op::Composite(bn), &[y, ps[0], ps[1], ps[2], var]).unwrap()
    };
    let h = conv_bn(&mut g, &mut w, x, "c1");
    let h = g.add_op1(Op::Composite(Composite::Relu), &[h]).unwrap();
    let h = conv_bn(&mut g, &mut w, h, "c2");
    let h = g.add_op1(Op::Binary(BinaryOp::Add), &[h, x]).unwrap();
    let h = g.add_op1(Op::Composite(Composite::Relu), &[h]).unwrap();
    g.add_output("y", h).unwrap();
    let block = (g, w, feeds(&[("x", f32_data(&[1, c, 10, 10], 7))]));
    for (g, w, x) in [encoder, block] {
        let c = compile(&g);
        assert_compiled(&c);
        let steps = &c.lowered.cpu.steps;
        assert!(
            steps
                .iter()
                .any(|s| matches!(s, Step::Contraction { epilogue: Some(_), .. }))
        );
        let mut weights = c.lowered.consts.clone();
        weights.extend(w.clone());
        let m = Model::new(c.lowered.cpu.clone(), c.funcs.clone(), &weights).unwrap();
        match m.run(&x) {
            Err(oar_ir::BackendError::Unsupported { .. }) => continue,
            Err(e) => panic!("{e}"),
            Ok(_) => {
                check_with(&g, &w, &x, tol, true);
            }
        }
    }
}

/// Convolution epilogues (bias, a residual input, relu) applied by the convolution itself,
/// plane by plane, where the path completes whole planes (depthwise convolutions, with a
/// channel multiplier and strides, and a single-input-channel one), and in a pass of their own
/// where it does not (a dense 3 × 3): the steps say the epilogue may run by plane; the values
/// match the reference with 1 and 5 threads (an epilogue skipped or applied twice would not).
#[test]
fn conv_epilogues_run_plane_by_plane() {
    // (x, w, stride, padding, groups)
    type Case = ([usize; 4], [usize; 4], usize, usize, usize);
    let cases: [Case; 5] = [
        ([2, 6, 9, 9], [6, 1, 3, 3], 1, 1, 6),
        ([1, 16, 14, 14], [16, 1, 3, 3], 2, 1, 16),
        ([2, 3, 8, 8], [6, 1, 3, 3], 1, 1, 3),
        ([3, 1, 12, 12], [4, 1, 5, 5], 1, 0, 1),
        ([2, 8, 10, 10], [12, 8, 3, 3], 1, 1, 1),
    ];
    for (xs, ws, s, p, groups) in cases {
        let mut g = Graph::new("conv_epilogue");
        let mut w = Weights::new();
        let x = input(&mut g, "x", DType::F32, &xs);
        let k = param(&mut g, &mut w, "w", &ws);
        let b = param(&mut g, &mut w, "b", &[ws[0]]);
        let conv = Conv2d {
            stride: [s, s],
            padding: [p; 4],
            dilation: [1, 1],
            groups,
        };
        let y = g.add_op1(Op::Composite(Composite::Conv2d(conv)), &[x, k, b]).unwrap();
        let out = (xs[2] + 2 * p - ws[2]) / s + 1;
        let r = input(&mut g, "r", DType::F32, &[xs[0], ws[0], out, out]);
        let y = g.add_op1(Op::Binary(BinaryOp::Add), &[y, r]).unwrap();
        let y = g.add_op1(Op::Composite(Composite::Relu), &[y]).unwrap();
        g.add_output("y", y).unwrap();
        let feeds = feeds(&[("x", f32_data(&xs, 3)), ("r", f32_data(&[xs[0], ws[0], out, out], 4))]);
        // f32 sums of up to 72 products in another order than the reference's.
        let c = check_with(&g, &w, &feeds, Tol { rel: 1e-4, abs: 1e-4 }, true);
        let by_plane = c
            .lowered
            .cpu
            .steps
            .iter()
            .any(|st| matches!(st, Step::Contraction { epilogue: Some(_), plane_iters, .. } if *plane_iters > 0));
        assert!(by_plane, "{xs:?} {ws:?}: {:?}", c.lowered.cpu.steps);
    }
}

/// Whether the cpu runtime's hand-written vector kernels run on this host (AVX2 and FMA, not
/// narrowed to the baseline by `OAR_CPU_SIMD`).
fn vector_host() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && !matches!(std::env::var("OAR_CPU_SIMD").as_deref(), Ok("baseline"));
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The convolution epilogue chains the runtime applies at full vector width
/// (`oar_cpu_runtime`'s `epilogue`): bias; bias then `relu6` (max then min) or min then max;
/// a residual, then `relu`; bias and residual; and chains it leaves to the generated code (the
/// residual before the bias, a clamp by NaN, a `max` between the sums and a tensor) — on a
/// depthwise layer (the epilogue by planes) and a dense one (after the product), odd plane
/// sizes (vector tails). The sums are exact (small integers), the residuals hold NaN, ±∞,
/// ±0 and huge values: every value must equal the reference's (NaN for NaN).
#[test]
fn conv_epilogue_chains_match_the_reference_exactly() {
    let scalar = |g: &mut Graph, v: f32| g.add_constant(TensorData::from_vec(vec![], vec![v]).unwrap());
    let ints = |shape: &[usize], seed: u64, first: Option<f32>| {
        let n: usize = shape.iter().product();
        let mut v: Vec<f32> = (0..n).map(|i| ((i as u64 * 7 + seed * 3) % 9) as f32 - 4.0).collect();
        if let Some(f) = first {
            v[0] = f;
        }
        TensorData::from_vec(shape.to_vec(), v).unwrap()
    };
    // (x, w, groups)
    let layers: [([usize; 4], [usize; 4], usize); 2] =
        [([2, 5, 9, 7], [5, 1, 3, 3], 5), ([1, 4, 6, 5], [6, 4, 3, 3], 1)];
    for (xs, ws, groups) in layers {
        for chain in 0..7 {
            let mut g = Graph::new("conv_chain");
            let x = input(&mut g, "x", DType::F32, &xs);
            let k = input(&mut g, "k", DType::F32, &ws);
            let b = input(&mut g, "b", DType::F32, &[ws[0], 1, 1]);
            let os = [xs[0], ws[0], xs[2], xs[3]];
            let r = input(&mut g, "r", DType::F32, &os);
            let conv = oar_ir::ops::Conv {
                stride: vec![1, 1],
                pad_before: vec![1, 1],
                pad_after: vec![1, 1],
                dilation: vec![1, 1],
                groups,
            };
            let y = g.add_op1(Op::Conv(conv), &[x, k]).unwrap();
            let bin = |g: &mut Graph, op: BinaryOp, a: ValueId, b: ValueId| g.add_op1(Op::Binary(op), &[a, b]).unwrap();
            let (zero, six, nan) = (scalar(&mut g, 0.0), scalar(&mut g, 6.0), scalar(&mut g, f32::NAN));
            let y = match chain {
                0 => bin(&mut g, BinaryOp::Add, y, b),
                1 => {
                    let y = bin(&mut g, BinaryOp::Add, b, y);
                    let y = bin(&mut g, BinaryOp::Max, y, zero);
                    bin(&mut g, BinaryOp::Min, six, y)
                }
                2 => {
                    let y = bin(&mut g, BinaryOp::Add, y, r);
                    let y = bin(&mut g, BinaryOp::Min, y, six);
                    bin(&mut g, BinaryOp::Max, y, zero)
                }
                3 => {
                    let y = bin(&mut g, BinaryOp::Add, y, b);
                    let y = bin(&mut g, BinaryOp::Add, r, y);
                    bin(&mut g, BinaryOp::Max, y, zero)
                }
                4 => {
                    let y = bin(&mut g, BinaryOp::Add, y, r);
                    bin(&mut g, BinaryOp::Add, y, b)
                }
                5 => {
                    let y = bin(&mut g, BinaryOp::Add, y, b);
                    bin(&mut g, BinaryOp::Max, y, nan)
                }
                _ => {
                    let y = bin(&mut g, BinaryOp::Max, y, r);
                    bin(&mut g, BinaryOp::Add, y, b)
                }
            };
            g.add_output("y", y).unwrap();
            let feeds = feeds(&[
                ("x", ints(&xs, 1, None)),
                ("k", ints(&ws, 2, None)),
                ("b", ints(&[ws[0], 1, 1], 5, Some(-0.0))),
                ("r", data(DType::F32, &os, 7 + chain, true)),
            ]);
            let c = check_with(&g, &Weights::new(), &feeds, EXACT, true);
            let p = &c.lowered.cpu.program;
            let native = p.kernels.iter().any(|k| oar_cpu_runtime::native_epilogue(k, p));
            let vectors = vector_host();
            assert_eq!(native, chain < 4 && vectors, "chain {chain}: {p}");
        }
    }
}

/// An inverted-residual stack on the blocked channel layout: a first layer (3 channels,
/// stride 2) from the NCHW input into blocked channels, 1 × 1 and 3 × 3 depthwise layers
/// (stride 1 and 2) between blocked buffers with bias / relu6 chains, a projection adding a blocked residual, and layers
/// back to NCHW outputs (a 1 × 1 one and a depthwise one); a 7 × 7 first layer read by a max
/// pool, both blocked, and one straight to an output. Small integer data, so every sum
/// is exact: the values must equal the reference's on 1 and 5 threads, and on a vector host
/// the steps must run blocked as planned. CI runs this test on the AVX2 instances too
/// (`scripts/test.sh`, `OAR_CPU_SIMD=avx2`: blocks of 8).
#[test]
fn blocked_layout_networks_match_the_reference_exactly() {
    let scalar = |g: &mut Graph, v: f32| g.add_constant(TensorData::from_vec(vec![], vec![v]).unwrap());
    let ints = |shape: &[usize], seed: u64| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| ((i as u64 * 7 + seed * 3) % 9) as f32 - 4.0).collect();
        TensorData::from_vec(shape.to_vec(), v).unwrap()
    };
    let mut g = Graph::new("blocked");
    let mut feeds_v = vec![("x".to_string(), ints(&[2, 3, 17, 13], 1))];
    let x = input(&mut g, "x", DType::F32, &[2, 3, 17, 13]);
    let (zero, six) = (scalar(&mut g, 0.0), scalar(&mut g, 6.0));
    let layer = |g: &mut Graph,
                 feeds_v: &mut Vec<(String, TensorData)>,
                 x: ValueId,
                 o: usize,
                 c: usize,
                 k: usize,
                 stride: usize,
                 relu6: bool| {
        let i = feeds_v.len();
        let depthwise = c == o && k == 3;
        let ws = [o, if depthwise { 1 } else { c }, k, k];
        let (wn, bn) = (format!("w{i}"), format!("b{i}"));
        let w = input(g, &wn, DType::F32, &ws);
        let b = input(g, &bn, DType::F32, &[o, 1, 1]);
        feeds_v.push((wn, ints(&ws, i as u64 + 2)));
        feeds_v.push((bn, ints(&[o, 1, 1], i as u64 + 5)));
        let pad = k / 2;
        let conv = oar_ir::ops::Conv {
            stride: vec![stride, stride],
            pad_before: vec![pad, pad],
            pad_after: vec![pad, pad],
            dilation: vec![1, 1],
            groups: if depthwise { c } else { 1 },
        };
        let y = g.add_op1(Op::Conv(conv), &[x, w]).unwrap();
        let y = g.add_op1(Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
        if relu6 {
            let y = g.add_op1(Op::Binary(BinaryOp::Max), &[y, zero]).unwrap();
            g.add_op1(Op::Binary(BinaryOp::Min), &[y, six]).unwrap()
        } else {
            y
        }
    };
    let image = x;
    let x = layer(&mut g, &mut feeds_v, x, 16, 3, 3, 2, true);
    let t0 = layer(&mut g, &mut feeds_v, x, 16, 16, 1, 1, false);
    let t1 = layer(&mut g, &mut feeds_v, t0, 32, 16, 1, 1, true);
    let t2 = layer(&mut g, &mut feeds_v, t1, 32, 32, 3, 1, true);
    let t3 = layer(&mut g, &mut feeds_v, t2, 16, 32, 1, 1, false);
    let t3 = g.add_op1(Op::Binary(BinaryOp::Add), &[t3, t0]).unwrap();
    let t4 = layer(&mut g, &mut feeds_v, t3, 16, 16, 3, 2, true);
    let y1 = layer(&mut g, &mut feeds_v, t4, 24, 16, 1, 1, false);
    let y2 = layer(&mut g, &mut feeds_v, t3, 16, 16, 3, 1, false);
    // 20 channels: padded to whole blocks (of 8 or 16) between 1 × 1 layers, a residual
    // among them; NCHW where a depthwise layer reads them.
    let p0 = layer(&mut g, &mut feeds_v, t3, 20, 16, 1, 1, true);
    let p1 = layer(&mut g, &mut feeds_v, p0, 20, 20, 1, 1, false);
    let p1 = g.add_op1(Op::Binary(BinaryOp::Add), &[p1, p0]).unwrap();
    let y3 = layer(&mut g, &mut feeds_v, p1, 8, 20, 1, 1, true);
    let q = layer(&mut g, &mut feeds_v, t3, 20, 16, 1, 1, false);
    let y4 = layer(&mut g, &mut feeds_v, q, 20, 20, 3, 1, false);
    // A 7 × 7 first layer straight to an output: NCHW on both sides, run by the first-layer
    // kernel on AVX2 only.
    let y5 = layer(&mut g, &mut feeds_v, image, 20, 3, 7, 2, true);
    // ResNet's stem: a first layer into blocked channels, read by a blocked 3 × 3 stride-2
    // max pool into an NCHW output.
    let stem = layer(&mut g, &mut feeds_v, image, 20, 3, 7, 2, true);
    let pool = oar_ir::ops::MaxPool2d {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1, 1, 1],
        ceil_mode: false,
    };
    let y6 = g.add_op1(Op::Composite(Composite::MaxPool2d(pool)), &[stem]).unwrap();
    g.add_output("y1", y1).unwrap();
    g.add_output("y2", y2).unwrap();
    g.add_output("y3", y3).unwrap();
    g.add_output("y4", y4).unwrap();
    g.add_output("y5", y5).unwrap();
    g.add_output("y6", y6).unwrap();
    let feeds_v: Vec<(&str, TensorData)> = feeds_v.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let c = check_with(&g, &Weights::new(), &feeds(&feeds_v), EXACT, true);
    let layouts: Vec<(bool, bool)> = oar_cpu_runtime::blocked_layouts(&c.lowered.cpu)
        .into_iter()
        .flatten()
        .collect();
    let vectors = vector_host();
    if vectors && std::env::var("OAR_CPU_BLOCKED").is_err() {
        // The first layer in, 5 blocked to blocked (with the residual), the 24-channel
        // output's 1 × 1 layer and the depthwise output layer out; the padded 20-channel
        // pair blocked, their reader out, and the 1 × 1 layer feeding the depthwise one out
        // (that depthwise layer NCHW on both sides: not blocked).
        let mut want = vec![
            (false, true),
            (true, true),
            (true, true),
            (true, true),
            (true, true),
            (true, true),
            (true, false),
            (true, false),
            (true, true),
            (true, true),
            (true, false),
            (true, false),
        ];
        #[cfg(target_arch = "x86_64")]
        let avx2 = !std::arch::is_x86_feature_detected!("avx512f")
            || matches!(std::env::var("OAR_CPU_SIMD").as_deref(), Ok("avx2"));
        #[cfg(not(target_arch = "x86_64"))]
        let avx2 = false;
        if avx2 {
            want.push((false, false));
        }
        want.extend([(false, true), (true, false)]);
        assert_eq!(layouts, want, "{}", c.lowered.cpu.program);
    } else if !vectors {
        assert!(layouts.is_empty());
    }
}

// ---------------------------------------------------------------- random programs

/// Random f32 programs mixing broadcasts, transposes, unary/binary ops, comparisons with
/// where, and keepdim reductions feeding back into elementwise ops: hoisting levels, loop
/// collapsing, every loop mode and their vector/scalar paths meet in unplanned ways.
#[test]
fn random_programs_match_the_reference() {
    let dims = [1usize, 2, 3, 5, 8, 17, 33, 64];
    let mut r = Rng(42);
    for case in 0..200 {
        let rank = 1 + (r.next() % 4) as usize;
        let shape: Vec<usize> = (0..rank)
            .map(|_| dims[(r.next() % dims.len() as u64) as usize])
            .collect();
        let mut g = Graph::new("random");
        let mut ins = Vec::new();
        let mut vals: Vec<ValueId> = Vec::new();
        for i in 0..3 {
            // Full, broadcast (some axes 1) or transposed (reversed, permuted back) inputs.
            let kind = r.next() % 3;
            let name = format!("x{i}");
            let v = match kind {
                0 => {
                    let s: Vec<usize> = shape
                        .iter()
                        .map(|&d| if r.next().is_multiple_of(2) { 1 } else { d })
                        .collect();
                    ins.push((name.clone(), f32_data(&s, case * 10 + i)));
                    input(&mut g, &name, DType::F32, &s)
                }
                1 if rank > 1 => {
                    let s: Vec<usize> = shape.iter().rev().copied().collect();
                    ins.push((name.clone(), f32_data(&s, case * 10 + i)));
                    let x = input(&mut g, &name, DType::F32, &s);
                    let perm: Vec<usize> = (0..rank).rev().collect();
                    g.add_op1(Op::Permute(Permute { perm }), &[x]).unwrap()
                }
                _ => {
                    ins.push((name.clone(), f32_data(&shape, case * 10 + i)));
                    input(&mut g, &name, DType::F32, &shape)
                }
            };
            vals.push(v);
        }
        let pick = |r: &mut Rng, vals: &[ValueId]| vals[(r.next() % vals.len() as u64) as usize];
        let mut cur = pick(&mut r, &vals);
        for _ in 0..6 {
            let other = pick(&mut r, &vals);
            cur = match r.next() % 7 {
                0 => {
                    let op = [
                        UnaryOp::Neg,
                        UnaryOp::Abs,
                        UnaryOp::Exp,
                        UnaryOp::Tanh,
                        UnaryOp::Floor,
                        UnaryOp::Sign,
                    ][(r.next() % 6) as usize];
                    g.add_op1(Op::Unary(op), &[cur]).unwrap()
                }
                1 | 2 => {
                    let op = [
                        BinaryOp::Add,
                        BinaryOp::Sub,
                        BinaryOp::Mul,
                        BinaryOp::Max,
                        BinaryOp::Min,
                    ][(r.next() % 5) as usize];
                    g.add_op1(Op::Binary(op), &[cur, other]).unwrap()
                }
                3 => {
                    let c = g.add_op1(Op::Binary(BinaryOp::Gt), &[cur, other]).unwrap();
                    g.add_op1(Op::Where, &[c, other, cur]).unwrap()
                }
                _ => {
                    // Reduce over some axes (keepdim), then combine with the unreduced value.
                    let cur_rank = g.value_type(cur).rank();
                    let axes: Vec<usize> = (0..cur_rank).filter(|_| r.next().is_multiple_of(2)).collect();
                    let axes = if axes.is_empty() { vec![cur_rank - 1] } else { axes };
                    let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean][(r.next() % 4) as usize];
                    let red = g
                        .add_op1(
                            Op::Reduce(Reduce {
                                op,
                                axes,
                                keepdim: true,
                            }),
                            &[cur],
                        )
                        .unwrap();
                    g.add_op1(Op::Binary(BinaryOp::Sub), &[cur, red]).unwrap()
                }
            };
            if r.next().is_multiple_of(4) {
                vals.push(cur);
            }
        }
        g.add_output("y", cur).unwrap();
        let refs: Vec<(&str, TensorData)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        check(&g, &feeds(&refs), Tol { rel: 1e-5, abs: 1e-5 });
    }
}

#[test]
fn stride_two_loads_like_pooling() {
    for dt in [DType::F32, DType::F64, DType::I32, DType::I64] {
        for n in [8usize, 9, 37, 64] {
            let mut g = Graph::new("pool");
            let x = input(&mut g, "x", dt, &[3, n]);
            let even = g
                .add_op1(
                    Op::Slice(Slice {
                        ranges: vec![slice(0, 3, 1), slice(0, n as i64 - 1, 2)],
                    }),
                    &[x],
                )
                .unwrap();
            let odd = g
                .add_op1(
                    Op::Slice(Slice {
                        ranges: vec![slice(0, 3, 1), slice(1, n as i64, 2)],
                    }),
                    &[x],
                )
                .unwrap();
            let y = g.add_op1(Op::Binary(BinaryOp::Max), &[even, odd]).unwrap();
            g.add_output("y", y).unwrap();
            check(&g, &feeds(&[("x", data(dt, &[3, n], n as u64, true))]), EXACT);
        }
    }
}

#[test]
fn bool_buffers_in_vector_kernels() {
    // Contiguous, transposed (gathered) and broadcast bool loads; bool stores of 4- and
    // 8-byte lane masks.
    for dt in [DType::F32, DType::F64, DType::I32, DType::I64] {
        for n in [3usize, 9, 33] {
            let mut g = Graph::new("masks");
            let a = input(&mut g, "a", dt, &[5, n]);
            let b = input(&mut g, "b", dt, &[5, n]);
            let m = input(&mut g, "m", DType::Bool, &[5, n]);
            let mt = input(&mut g, "mt", DType::Bool, &[n, 5]);
            let mb = input(&mut g, "mb", DType::Bool, &[n]);
            let mt = g.add_op1(Op::Permute(Permute { perm: vec![1, 0] }), &[mt]).unwrap();
            let both = g.add_op1(Op::Binary(BinaryOp::And), &[m, mt]).unwrap();
            let either = g.add_op1(Op::Binary(BinaryOp::Or), &[both, mb]).unwrap();
            let y = g.add_op1(Op::Where, &[either, a, b]).unwrap();
            g.add_output("y", y).unwrap();
            let lt = g.add_op1(Op::Binary(BinaryOp::Lt), &[a, b]).unwrap();
            let z = g.add_op1(Op::Binary(BinaryOp::Xor), &[lt, m]).unwrap();
            let z = g.add_op1(Op::Unary(UnaryOp::Not), &[z]).unwrap();
            g.add_output("z", z).unwrap();
            check(
                &g,
                &feeds(&[
                    ("a", data(dt, &[5, n], 1, true)),
                    ("b", data(dt, &[5, n], 2, true)),
                    ("m", data(DType::Bool, &[5, n], 3, false)),
                    ("mt", data(DType::Bool, &[n, 5], 4, false)),
                    ("mb", data(DType::Bool, &[n], 5, false)),
                ]),
                EXACT,
            );
            if dt == DType::F32 && n == 33 {
                // Bytes widen to lane masks and narrow back, in vector code.
                let text: String = clif_of(&g).into_iter().map(|(_, c)| c).collect();
                assert!(text.contains("uwiden_low") && text.contains("snarrow"), "{text}");
            }
        }
    }
}

/// 8-bit values in 4-lane vector code (held as their values in 32-bit lanes): a per-row
/// dequantization, a transposed (gathered) one, ReLU and a quantization back to 8 bits; 8-bit
/// max / where / comparisons; i32 → 8-bit wrapping and f32 → 8-bit saturating casts (NaN and
/// infinities included) — exactly the reference's results, for u8 and i8 and row lengths with
/// and without a scalar tail.
#[test]
fn eight_bit_values_in_vector_kernels() {
    use oar_ir::ops::{DequantizeLinear, QuantizeLinear};
    for dt in [DType::U8, DType::I8] {
        for n in [3usize, 9, 33] {
            let mut g = Graph::new("q8");
            let x = input(&mut g, "x", dt, &[5, n]);
            let xt = input(&mut g, "xt", dt, &[n, 5]);
            let s = input(&mut g, "s", DType::F32, &[5]);
            let z = input(&mut g, "z", dt, &[5]);
            let s2 = input(&mut g, "s2", DType::F32, &[]);
            let z2 = input(&mut g, "z2", dt, &[]);
            let xt = g.add_op1(Op::Permute(Permute { perm: vec![1, 0] }), &[xt]).unwrap();
            let dq = |axis| Op::Composite(Composite::DequantizeLinear(DequantizeLinear { axis }));
            let a = g.add_op1(dq(0), &[x, s, z]).unwrap();
            let b = g.add_op1(dq(0), &[xt, s2, z2]).unwrap();
            let sum = g.add_op1(Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
            let zero = g.add_constant(TensorData::from_vec(vec![], vec![0.0f32]).unwrap());
            let r = g.add_op1(Op::Binary(BinaryOp::Max), &[sum, zero]).unwrap();
            let q = Op::Composite(Composite::QuantizeLinear(QuantizeLinear { axis: 0, dtype: dt }));
            let q = g.add_op1(q, &[r, s2, z2]).unwrap();
            g.add_output("q", q).unwrap();
            let gt = g.add_op1(Op::Binary(BinaryOp::Gt), &[x, xt]).unwrap();
            let m = g.add_op1(Op::Where, &[gt, x, xt]).unwrap();
            let mx = g.add_op1(Op::Binary(BinaryOp::Min), &[m, xt]).unwrap();
            g.add_output("m", mx).unwrap();
            let i = input(&mut g, "i", DType::I32, &[5, n]);
            let wrapped = g.add_op1(Op::Cast(Cast { to: dt }), &[i]).unwrap();
            g.add_output("wrapped", wrapped).unwrap();
            let f = input(&mut g, "f", DType::F32, &[5, n]);
            let k = input(&mut g, "k", DType::F32, &[]);
            let f = g.add_op1(Op::Binary(BinaryOp::Mul), &[f, k]).unwrap();
            let sat = g.add_op1(Op::Cast(Cast { to: dt }), &[f]).unwrap();
            g.add_output("sat", sat).unwrap();
            let other = if dt == DType::U8 { DType::I8 } else { DType::U8 };
            let o = g.add_op1(Op::Cast(Cast { to: other }), &[x]).unwrap();
            let o = g.add_op1(Op::Cast(Cast { to: DType::F32 }), &[o]).unwrap();
            let o = g.add_op1(Op::Binary(BinaryOp::Mul), &[o, s2]).unwrap();
            g.add_output("other", o).unwrap();
            check(
                &g,
                &feeds(&[
                    ("x", data(dt, &[5, n], 1, false)),
                    ("xt", data(dt, &[n, 5], 2, false)),
                    (
                        "s",
                        TensorData::from_vec(vec![5], vec![0.02f32, 0.5, 0.013, 1.0, 0.25]).unwrap(),
                    ),
                    ("z", data(dt, &[5], 3, false)),
                    ("s2", TensorData::from_vec(vec![], vec![0.07f32]).unwrap()),
                    ("z2", TensorData::from_f64_slice(dt, vec![], &[3.0]).unwrap()),
                    ("i", data(DType::I32, &[5, n], 4, false)),
                    ("f", data(DType::F32, &[5, n], 5, true)),
                    ("k", TensorData::from_vec(vec![], vec![70.0f32]).unwrap()),
                ]),
                EXACT,
            );
            if n == 33 {
                // Bytes widen into 32-bit lanes and narrow back, in vector code.
                let text: String = clif_of(&g).into_iter().map(|(_, c)| c).collect();
                let widen = if dt == DType::U8 { "uwiden_low" } else { "swiden_low" };
                assert!(
                    text.contains(widen) && text.contains("snarrow") && text.contains("fcvt_to_sint_sat.i32x4"),
                    "{text}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------- control flow

/// A `cond` (params and constants in its branches) feeding a `while` (a counter and a halving).
pub(crate) const CONTROL_FLOW: &str = r#"graph @g {
  %p = input "p" : bool[]
  %x = input "x" : f32[4]
  %y = cond(%p, %x) : f32[4] {
    then @t {
      %a = input "a" : f32[4]
      %w = param "w" : f32[4]
      %m = mul(%a, %w) : f32[4]
      %e = exp(%m) : f32[4]
      output "r" = %e
    }
    else @e {
      %a = input "a" : f32[4]
      %c = constant dense<[1.0, 2.0, 3.0, 4.0]> : f32[4]
      %s = sub(%a, %c) : f32[4]
      output "r" = %s
    }
  }
  %i0 = constant dense<0> : i32[]
  %r:2 = while(%i0, %y) : i32[], f32[4] {
    cond @c {
      %i = input "i" : i32[]
      %v = input "v" : f32[4]
      %n = constant dense<3> : i32[]
      %k = lt(%i, %n) : bool[]
      output "k" = %k
    }
    body @b {
      %i = input "i" : i32[]
      %v = input "v" : f32[4]
      %one = constant dense<1> : i32[]
      %j = add(%i, %one) : i32[]
      %h = constant dense<0.5> : f32[]
      %u = mul(%v, %h) : f32[4]
      output "i" = %j
      output "v" = %u
    }
  }
  output "y" = %r#1
  output "n" = %r#0
}"#;

/// `cond` and `while` run compiled: each region is a program of its own (params read by name,
/// constants of its own), the branch and the loop on the host; no kernel is interpreted.
#[test]
fn cond_and_while_regions_are_compiled() {
    let text = CONTROL_FLOW;
    let g = oar_ir::text::parse_graph(text).unwrap();
    let mut w = Weights::new();
    w.insert(
        "w".into(),
        TensorData::from_vec(vec![4], vec![0.5f32, -1.0, 2.0, 0.25]).unwrap(),
    );
    for p in [true, false] {
        let feeds = feeds(&[
            ("p", TensorData::from_vec(vec![], vec![p]).unwrap()),
            (
                "x",
                TensorData::from_vec(vec![4], vec![0.1f32, -2.0, 1.5, 3.0]).unwrap(),
            ),
        ]);
        let c = check_with(&g, &w, &feeds, math_tol(DType::F32), true);
        let control = c
            .lowered
            .cpu
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Control { .. }))
            .count();
        assert_eq!(control, 2, "cond and while run as Control steps");
        assert_eq!(c.lowered.cpu.regions.len(), 4);
    }
}

/// A chain of 20 000 ops (the reliability reproducer 01 overflowed the stack at ~15k): fusion
/// cuts it into kernels of bounded depth up front, nothing in lowering, code generation or the
/// run recurses per op, and the result matches the reference. Runs on a test thread (2 MiB of
/// stack), in process and through the CpuBackend door.
#[test]
fn a_chain_of_twenty_thousand_ops_compiles_and_runs() {
    let n = 20_000;
    let mut g = Graph::new("chain");
    let x = g.add_input("x", TensorType::of(DType::F32, &[4])).unwrap();
    let mut v = x;
    for i in 0..n {
        // x^(i+2) for even steps, then a unary, so nothing folds away.
        v = if i % 2 == 0 {
            g.add_op1(Op::Binary(BinaryOp::Mul), &[v, x]).unwrap()
        } else {
            g.add_op1(Op::Unary(UnaryOp::Abs), &[v]).unwrap()
        };
    }
    g.add_output("y", v).unwrap();
    let xv = TensorData::from_vec(vec![4], vec![1.0f32, -1.0, 0.9999, 0.5]).unwrap();
    let inputs = BTreeMap::from([("x".to_string(), xv)]);
    let want = run_graph(&g, &Weights::new(), &inputs).unwrap()[0].1.to_f64_vec();
    let cpu = oar_backend_cpu::CpuBackend::new();
    let exe = oar_ir::Backend::compile(&cpu, &g, &Weights::new()).unwrap();
    let got = exe.run(&inputs).unwrap()[0].1.to_f64_vec();
    assert_eq!(want[..2], [1.0, 1.0]);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * b.abs() + 1e-30, "{got:?} vs {want:?}");
    }
    let lowered = lower(&g, &BTreeMap::new()).unwrap();
    let kernels = lowered.cpu.steps.len();
    assert!((50..=200).contains(&kernels), "{kernels} steps");
}

/// Kernels that read only weights (here a transposed, squared weight matrix and a bias
/// reordering) run once when the model is made; runs skip them and read their results as
/// weights. Input-dependent kernels and kernels writing a program output (`e`, though it reads
/// only a weight) still run each time. Results equal the reference's, run after run.
#[test]
fn weight_only_kernels_run_once_when_the_model_is_made() {
    let g = oar_ir::text::parse_graph(
        r#"
graph @hoist {
  %x = input "x" : f32[2,4]
  %w = param "w" : f32[6,4]
  %b = param "b" : f32[6]
  %0 = permute(%w) {perm = [1, 0]} : f32[4,6]
  %1 = mul(%0, %0) : f32[4,6]
  %2 = matmul(%x, %1) : f32[2,6]
  %3 = slice(%b) {ranges = [3:6]} : f32[3]
  %4 = slice(%b) {ranges = [:3]} : f32[3]
  %5 = concat(%3, %4) {axis = 0} : f32[6]
  %6 = add(%2, %5) : f32[2,6]
  %7 = exp(%b) : f32[6]
  output "y" = %6
  output "e" = %7
}
"#,
    )
    .unwrap();
    let vals = |n: usize, seed: f32| (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect::<Vec<f32>>();
    let w = Weights::from([
        (
            "w".to_string(),
            TensorData::from_vec(vec![6, 4], vals(24, 0.1)).unwrap(),
        ),
        ("b".to_string(), TensorData::from_vec(vec![6], vals(6, 0.7)).unwrap()),
    ]);
    let c = compile(&g);
    let m = Model::new(c.lowered.cpu.clone(), c.funcs.clone(), &w).unwrap();
    let hoisted = m.hoisted_kernels();
    let kernels: Vec<&str> = c.lowered.cpu.program.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(!hoisted.is_empty(), "nothing hoisted from {kernels:?}");
    for k in &c.lowered.cpu.program.kernels {
        let reads_input = k.reads().iter().any(|b| {
            matches!(
                c.lowered.cpu.program.buffer(*b).kind,
                oar_ir::kernel::BufferKind::Input { .. }
            )
        });
        let writes_output = k
            .outputs
            .iter()
            .any(|b| c.lowered.cpu.program.buffer(*b).kind == oar_ir::kernel::BufferKind::Output);
        if reads_input || writes_output {
            assert!(!hoisted.contains(&k.name.as_str()), "{} hoisted", k.name);
        }
    }
    for seed in [0.3f32, -1.2] {
        let inputs = BTreeMap::from([(
            "x".to_string(),
            TensorData::from_vec(vec![2, 4], vals(8, seed)).unwrap(),
        )]);
        let want = run_graph(&g, &w, &inputs).unwrap();
        let got = m.run(&inputs).unwrap();
        for ((n, a), (_, b)) in got.iter().zip(&want) {
            for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
                assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{n}: {x} vs {y}");
            }
        }
    }
}

/// A run writes an output into the allocation of one an earlier run handed over and its caller
/// has since dropped (no fresh pages per call, as a training step's new weights replace the
/// old ones); an output the caller still holds is never written again, whatever runs follow.
#[test]
fn outputs_reuse_allocations_their_callers_dropped_and_never_ones_they_hold() {
    let g = oar_ir::text::parse_graph(
        r#"
graph @step {
  %x = input "x" : f32[64,64]
  %0 = mul(%x, %x) : f32[64,64]
  output "y" = %0
}
"#,
    )
    .unwrap();
    let cpu = oar_backend_cpu::CpuBackend::new();
    let exe = oar_ir::Backend::compile(&cpu, &g, &Weights::new()).unwrap();
    let feed = |v: f32| {
        BTreeMap::from([(
            "x".to_string(),
            TensorData::from_vec(vec![64, 64], vec![v; 4096]).unwrap(),
        )])
    };
    let run = |v: f32| exe.run(&feed(v)).unwrap().remove(0).1;
    // Held outputs keep their values through later runs, each in its own allocation.
    let held: Vec<TensorData> = (1..=4).map(|i| run(i as f32)).collect();
    for (i, t) in held.iter().enumerate() {
        let want = ((i + 1) * (i + 1)) as f32;
        assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == want), "run {i}");
    }
    let ptrs: Vec<*const u8> = held.iter().map(|t| t.bytes().as_ptr()).collect();
    assert!(
        (1..ptrs.len()).all(|i| !ptrs[..i].contains(&ptrs[i])),
        "distinct buffers"
    );
    // Dropped outputs are written again.
    drop(held);
    let again = run(5.0);
    assert!(again.to_vec::<f32>().unwrap().iter().all(|&v| v == 25.0));
    assert!(
        ptrs.contains(&again.bytes().as_ptr()),
        "reused one of the dropped allocations"
    );
}

/// Pseudo-random 8-bit values of `dt` (the first byte 255: extremes included).
fn int8_data(dt: DType, shape: &[usize], seed: u64) -> TensorData {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f64> = (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let b = if i == 0 { 255 } else { (s >> 40) as u8 };
            if dt == DType::I8 { b as i8 as f64 } else { b as f64 }
        })
        .collect();
    TensorData::from_f64_slice(dt, shape.to_vec(), &v).unwrap()
}

/// `matmul_integer` (a quantized model's integer product, 8-bit operands less their zero
/// points) runs as one native kernel, exactly: u8 × i8 with per-column weight zero points and
/// a batched u8 input, i8 × i8 without zero points, extreme values included.
#[test]
fn matmul_integer_runs_natively_and_exactly() {
    let bytes = int8_data;
    for (da, db, a_shape, k, n, zps) in [
        (DType::U8, DType::I8, vec![2, 5, 40], 40, 19, true),
        (DType::I8, DType::I8, vec![7, 33], 33, 16, false),
    ] {
        let mut g = Graph::new("qmm");
        let a = input(&mut g, "a", da, &a_shape);
        let mut w = Weights::new();
        w.insert("b".into(), bytes(db, &[k, n], 2));
        let mut ins = vec![a, g.add_param("b", TensorType::of(db, &[k, n])).unwrap()];
        let mut feed = vec![("a", bytes(da, &a_shape, 1))];
        if zps {
            ins.push(input(&mut g, "za", da, &[]));
            ins.push(input(&mut g, "zb", db, &[n]));
            feed.push(("za", TensorData::from_f64_slice(da, vec![], &[131.0]).unwrap()));
            feed.push(("zb", bytes(db, &[n], 3)));
        }
        let y = g.add_op1(Op::Composite(Composite::MatMulInteger), &ins).unwrap();
        g.add_output("y", y).unwrap();
        let compiled = check_with(&g, &w, &feeds(&feed), Tol { rel: 0.0, abs: 0.0 }, true);
        let steps = &compiled.lowered.cpu.steps;
        assert!(
            matches!(steps.as_slice(), [Step::Native { .. }]),
            "{steps:?}\n{}",
            compiled.lowered.cpu.program
        );
    }
}

/// i8 values halved toward zero: in `[-64, 63]`, as `reduce_range` quantization leaves weights
/// (the `vpmaddubsw` kernel's range).
fn seven_bit(t: TensorData) -> TensorData {
    let v: Vec<f64> = t.to_f64_vec().iter().map(|v| (v / 2.0).trunc()).collect();
    TensorData::from_f64_slice(t.dtype(), t.shape().to_vec(), &v).unwrap()
}

/// `conv_integer` (a quantized convolution) runs as one native kernel, exactly against the
/// reference: u8 × i8 with a per-output-channel weight zero point, stride 2 and padding, and a
/// depthwise i8 × i8 one without zero points; and with 7-bit weights (the `vpmaddubsw` kernel)
/// u8 and i8 inputs with a zero point, a 147-long (not a multiple of 4) reduction.
#[test]
fn conv_integer_runs_natively_and_exactly() {
    use oar_ir::ops::ConvInteger;
    let bytes = int8_data;
    for (dx, dw, x_shape, w_shape, stride, groups, zps, seven) in [
        (DType::U8, DType::I8, [2, 3, 9, 8], [5, 3, 3, 3], 2, 1, true, false),
        (DType::I8, DType::I8, [1, 4, 6, 6], [4, 1, 3, 3], 1, 4, false, false),
        (DType::U8, DType::I8, [2, 3, 19, 18], [9, 3, 7, 7], 2, 1, true, true),
        (DType::I8, DType::I8, [1, 8, 6, 7], [20, 8, 3, 3], 1, 1, true, true),
    ] {
        let mut g = Graph::new("qconv");
        let x = input(&mut g, "x", dx, &x_shape);
        let mut w = Weights::new();
        let weights = bytes(dw, &w_shape, 2);
        w.insert("w".into(), if seven { seven_bit(weights) } else { weights });
        let mut ins = vec![x, g.add_param("w", TensorType::of(dw, &w_shape)).unwrap()];
        let mut feed = vec![("x", bytes(dx, &x_shape, 1))];
        if zps {
            ins.push(input(&mut g, "zx", dx, &[]));
            ins.push(input(&mut g, "zw", dw, &[w_shape[0]]));
            let zx = if dx == DType::I8 { -7.0 } else { 131.0 };
            feed.push(("zx", TensorData::from_f64_slice(dx, vec![], &[zx]).unwrap()));
            let zw = bytes(dw, &[w_shape[0]], 3);
            // Zero points of 7-bit weights keep them in range: 0 or -1.
            let zw = if seven {
                TensorData::from_f64_slice(
                    dw,
                    vec![w_shape[0]],
                    &zw.to_f64_vec()
                        .iter()
                        .map(|z| -((z.abs() as i64 % 2) as f64))
                        .collect::<Vec<_>>(),
                )
                .unwrap()
            } else {
                zw
            };
            feed.push(("zw", zw));
        }
        let c = ConvInteger {
            stride: vec![stride; 2],
            pad_before: vec![1, 1],
            pad_after: vec![1, 0],
            dilation: vec![1, 1],
            groups,
        };
        let y = g.add_op1(Op::Composite(Composite::ConvInteger(c)), &ins).unwrap();
        g.add_output("y", y).unwrap();
        let compiled = check_with(&g, &w, &feeds(&feed), Tol { rel: 0.0, abs: 0.0 }, true);
        let steps = &compiled.lowered.cpu.steps;
        assert!(
            matches!(steps.as_slice(), [Step::Native { .. }]),
            "{steps:?}\n{}",
            compiled.lowered.cpu.program
        );
    }
}

/// An integer convolution's requantization (i32 sums to f32, a per-channel scale and bias,
/// ReLU, quantization to u8 — what the quantization pass leaves after every layer) runs as the
/// convolution's epilogue, one step (applied plane by plane by the depthwise paths, after the
/// product by the others): the general (im2col), 1 × 1, grouped and depthwise paths, with 1
/// and 5 threads, exactly the reference's bytes. The epilogue's result (the next
/// convolution's input) never shares storage with what the convolution reads (its input here
/// dies at the convolution, so an unjoined plan would reuse it).
#[test]
fn integer_convolutions_requantize_in_their_epilogue() {
    use oar_ir::ops::{ConvInteger, QuantizeLinear};
    let bytes = int8_data;
    // (x shape, w shape, stride, pad, groups, 7-bit weights: the `vpmaddubsw` kernel)
    for (xs, ws, stride, pad, groups, seven) in [
        ([1, 3, 9, 8], [5, 3, 3, 3], 1, 1, 1, false),
        // Larger planes (several blocks of epilogue iterations per plane).
        ([1, 3, 90, 90], [5, 3, 3, 3], 1, 1, 1, false),
        ([1, 3, 90, 90], [5, 3, 3, 3], 1, 1, 1, true),
        ([1, 40, 30, 30], [48, 40, 1, 1], 1, 0, 1, false),
        ([1, 40, 30, 30], [48, 40, 1, 1], 1, 0, 1, true),
        ([2, 6, 7, 7], [8, 6, 1, 1], 1, 0, 1, true),
        ([1, 4, 6, 6], [6, 2, 3, 3], 2, 1, 2, false),
        ([2, 4, 10, 9], [4, 1, 3, 3], 1, 1, 4, false),
    ] {
        let o = ws[0];
        let mut g = Graph::new("qconv_requant");
        let x0 = input(&mut g, "x", DType::U8, &xs);
        let floor = g.add_constant(TensorData::from_f64_slice(DType::U8, vec![], &[3.0]).unwrap());
        // A temporary input, dead after the convolution.
        let x = g.add_op1(Op::Binary(BinaryOp::Max), &[x0, floor]).unwrap();
        let mut w = Weights::new();
        let narrow = |t: TensorData| if seven { seven_bit(t) } else { t };
        w.insert("w".into(), narrow(bytes(DType::I8, &ws, 2)));
        let wv = g.add_param("w", TensorType::of(DType::I8, &ws)).unwrap();
        let zx = input(&mut g, "zx", DType::U8, &[]);
        let zw = input(&mut g, "zw", DType::I8, &[o]);
        let c = ConvInteger {
            stride: vec![stride; 2],
            pad_before: vec![pad; 2],
            pad_after: vec![pad; 2],
            dilation: vec![1, 1],
            groups,
        };
        let y = g
            .add_op1(Op::Composite(Composite::ConvInteger(c)), &[x, wv, zx, zw])
            .unwrap();
        let yf = g.add_op1(Op::Cast(Cast { to: DType::F32 }), &[y]).unwrap();
        let s = input(&mut g, "s", DType::F32, &[1, o, 1, 1]);
        let b = input(&mut g, "b", DType::F32, &[1, o, 1, 1]);
        let yf = g.add_op1(Op::Binary(BinaryOp::Mul), &[yf, s]).unwrap();
        let yf = g.add_op1(Op::Binary(BinaryOp::Add), &[yf, b]).unwrap();
        let zero = g.add_constant(TensorData::from_vec(vec![], vec![0.0f32]).unwrap());
        let r = g.add_op1(Op::Binary(BinaryOp::Max), &[yf, zero]).unwrap();
        let sy = input(&mut g, "sy", DType::F32, &[]);
        let zy = input(&mut g, "zy", DType::U8, &[]);
        let q = QuantizeLinear {
            axis: 1,
            dtype: DType::U8,
        };
        let q = g
            .add_op1(Op::Composite(Composite::QuantizeLinear(q)), &[r, sy, zy])
            .unwrap();
        // The next layer reads the requantized values.
        w.insert("w2".into(), narrow(bytes(DType::I8, &[3, o, 1, 1], 4)));
        let w2 = g.add_param("w2", TensorType::of(DType::I8, &[3, o, 1, 1])).unwrap();
        let c2 = ConvInteger {
            stride: vec![1, 1],
            pad_before: vec![0, 0],
            pad_after: vec![0, 0],
            dilation: vec![1, 1],
            groups: 1,
        };
        let y2 = g
            .add_op1(Op::Composite(Composite::ConvInteger(c2)), &[q, w2, zy])
            .unwrap();
        g.add_output("y2", y2).unwrap();
        let scales: Vec<f32> = (0..o).map(|i| 1e-3 * (1.0 + i as f32)).collect();
        let biases: Vec<f32> = (0..o).map(|i| i as f32 * 0.37 - 1.0).collect();
        let feed = feeds(&[
            ("x", bytes(DType::U8, &xs, 1)),
            ("zx", TensorData::from_f64_slice(DType::U8, vec![], &[131.0]).unwrap()),
            (
                "zw",
                if seven {
                    TensorData::from_f64_slice(DType::I8, vec![o], &vec![0.0; o]).unwrap()
                } else {
                    bytes(DType::I8, &[o], 3)
                },
            ),
            ("s", TensorData::from_vec(vec![1, o, 1, 1], scales).unwrap()),
            ("b", TensorData::from_vec(vec![1, o, 1, 1], biases).unwrap()),
            ("sy", TensorData::from_vec(vec![], vec![0.05f32]).unwrap()),
            ("zy", TensorData::from_f64_slice(DType::U8, vec![], &[7.0]).unwrap()),
        ]);
        let compiled = check_with(&g, &w, &feed, Tol { rel: 0.0, abs: 0.0 }, true);
        let cpu = &compiled.lowered.cpu;
        let joined: Vec<(usize, usize)> = cpu
            .steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Step::Native { epilogue: Some(e), .. } => Some((i, e.kernel as usize)),
                _ => None,
            })
            .collect();
        assert_eq!(joined.len(), 1, "{:?}\n{}", cpu.steps, cpu.program);
        let (a, b) = joined[0];
        assert!(
            matches!(cpu.steps[b], Step::Fused { into, .. } if into as usize == a),
            "{:?}",
            cpu.steps
        );
        let range = |id: oar_ir::kernel::BufferId| cpu.plan.offsets.get(&id).map(|&o| o..o + cpu.plan.sizes[&id]);
        let out = range(cpu.program.kernels[b].outputs[0]).expect("a temporary result");
        let ka = &cpu.program.kernels[a];
        for id in ka.reads().into_iter().chain(ka.outputs.iter().copied()) {
            if let Some(r) = range(id) {
                assert!(
                    out.end <= r.start || r.end <= out.start,
                    "{id} at {r:?} overlaps {out:?}"
                );
            }
        }
    }
}
