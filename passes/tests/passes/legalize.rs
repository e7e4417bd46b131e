//! `legalize`'s expansions against the reference, in ulps: each op is put in a one-kernel
//! program (`y[i] = op(x[i])`), legalized with nothing native, run by the reference's kernel
//! interpreter, and compared with the reference's own evaluation of the op (f64 libm, rounded
//! once) over dense grids that include ±0, ±inf, NaN, subnormals and overflow.
//!
//! Bounds (ulps of the result's dtype): exp, log, tanh ≤ 1 (f32), ≤ 2 (f64, against a libm
//! that is itself within about an ulp); sin/cos ≤ 2 for
//! |x| ≤ 8000; erf ≤ 2 (f32), ≤ 3 (f64); f16/bf16 ≤ 1; rsqrt, float and integer rem,
//! NaN-propagating max/min and saturating casts exactly; pow ≤ 1 (f32) and ≤ 2e-13 relative
//! (f64, the error of `ln` scaled by `|b·ln a|`).

use oar_backend_reference::run_kernel_program;
use oar_ir::kernel::{
    Buffer, BufferId, BufferKind, IndexMap, Inst, Kernel, KernelBody, KernelProgram, Load, LoopKernel, ScalarOp,
};
use oar_ir::ops::{BinaryOp, UnaryOp};
use oar_ir::{DType, Dim, TensorData, TensorType, Weights};
use oar_passes::legalize::{Natives, legalize};
use std::collections::BTreeMap;

/// `y = op(x0[, x1])` elementwise over `n` elements; inputs `x0`, `x1`.
fn program(op: ScalarOp, ins: &[DType], out: DType, n: usize) -> KernelProgram {
    let shape = vec![Dim::Static(n)];
    let mut buffers: Vec<Buffer> = ins
        .iter()
        .enumerate()
        .map(|(i, &d)| Buffer {
            kind: BufferKind::Input { name: format!("x{i}") },
            ty: TensorType::new(d, shape.clone()),
            value: format!("%{i}"),
        })
        .collect();
    buffers.push(Buffer {
        kind: BufferKind::Output,
        ty: TensorType::new(out, shape.clone()),
        value: "%y".into(),
    });
    let mut body: Vec<Inst> = ins
        .iter()
        .enumerate()
        .map(|(i, &d)| Inst {
            op: ScalarOp::Load(i),
            dtype: d,
        })
        .collect();
    body.push(Inst { op, dtype: out });
    let loads = (0..ins.len())
        .map(|i| Load {
            buffer: BufferId(i as u32),
            map: IndexMap::identity(&shape),
        })
        .collect();
    KernelProgram {
        name: "legalize".into(),
        kernels: vec![Kernel {
            name: "k".into(),
            body: KernelBody::Loop(LoopKernel {
                shape: shape.clone(),
                loads,
                outer: 1,
                reduce: vec![],
                body,
            }),
            outputs: vec![BufferId(ins.len() as u32)],
        }],
        outputs: vec![("y".into(), BufferId(ins.len() as u32))],
        buffers,
    }
}

/// The op on `inputs`, legalized and as is (the reference's own evaluation).
fn both(op: ScalarOp, inputs: &[TensorData], out: DType) -> (TensorData, TensorData) {
    let dts: Vec<DType> = inputs.iter().map(|t| t.dtype()).collect();
    let n = inputs[0].len();
    let plain = program(op, &dts, out, n);
    let mut legal = plain.clone();
    legalize(&mut legal, &Natives::none());
    assert_ne!(legal, plain, "nothing was expanded");
    let feed: BTreeMap<String, TensorData> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("x{i}"), t.clone()))
        .collect();
    let run = |p: &KernelProgram| run_kernel_program(p, &Weights::new(), &feed).unwrap().remove(0).1;
    (run(&legal), run(&plain))
}

/// Distance in units in the last place of `want`'s dtype (0 when both are NaN or equal).
fn ulps(dtype: DType, got: f64, want: f64) -> f64 {
    if got.is_nan() && want.is_nan() || got == want {
        return 0.0;
    }
    if got.is_nan() || want.is_nan() || got.is_infinite() || want.is_infinite() {
        return f64::INFINITY;
    }
    let ulp = match dtype {
        DType::F32 => {
            let w = want as f32;
            ((f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64).max(f32::from_bits(1) as f64)
        }
        DType::F16 => half::f16::from_f64(want).to_f64().abs().max(6.1e-5) * 2f64.powi(-10),
        DType::BF16 => half::bf16::from_f64(want).to_f64().abs().max(1.2e-38) * 2f64.powi(-7),
        _ => (f64::from_bits(want.abs().to_bits() + 1) - want.abs()).max(f64::from_bits(1)),
    };
    (got - want).abs() / ulp
}

fn check_ulps(what: &str, inputs: &[TensorData], op: ScalarOp, out: DType, bound: f64) {
    let (got, want) = both(op, inputs, out);
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let x = inputs[0].to_f64_vec();
    let mut worst = (0.0, 0.0);
    for i in 0..g.len() {
        let e = ulps(out, g[i], w[i]);
        assert!(
            e <= bound,
            "{what}({}) = {} but the reference gives {} ({e} ulps > {bound})",
            x[i],
            g[i],
            w[i]
        );
        if e > worst.0 {
            worst = (e, x[i]);
        }
    }
    eprintln!("{what}: max {} ulps at {}", worst.0, worst.1);
}

fn grid(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    (0..n).map(|i| lo + (hi - lo) * i as f64 / (n - 1) as f64).collect()
}

fn specials() -> Vec<f64> {
    vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1.0,
        -1.0,
        1e-40,
        -1e-40,
        1e-310,
    ]
}

fn tensor(dtype: DType, v: &[f64]) -> TensorData {
    TensorData::from_f64_slice(dtype, vec![v.len()], v).unwrap()
}

fn unary(u: UnaryOp, dtype: DType, values: &[f64], bound: f64) {
    let mut v = values.to_vec();
    v.extend(specials());
    check_ulps(
        &format!("{} {dtype}", u.name()),
        &[tensor(dtype, &v)],
        ScalarOp::Unary(u, 0),
        dtype,
        bound,
    );
}

#[test]
fn exp_log_tanh_erf_within_their_ulp_bounds() {
    use UnaryOp::*;
    for (dt, b) in [(DType::F32, 1.0), (DType::F64, 2.0)] {
        unary(Exp, dt, &grid(-750.0, 720.0, 20001), b);
        unary(Exp, dt, &grid(-110.0, 95.0, 20001), b);
        let mut pos: Vec<f64> = (0..20001)
            .map(|i| 10f64.powf(-320.0 + 640.0 * i as f64 / 20000.0))
            .collect();
        pos.extend(grid(0.5, 2.0, 4001));
        pos.extend(grid(-3.0, -0.1, 11));
        unary(Log, dt, &pos, b);
        unary(Tanh, dt, &grid(-25.0, 25.0, 20001), b);
        unary(Tanh, dt, &grid(-1.0, 1.0, 4001), b);
    }
    unary(Erf, DType::F32, &grid(-6.0, 6.0, 20001), 2.0);
    unary(Erf, DType::F64, &grid(-7.0, 7.0, 20001), 3.0);
    for dt in [DType::F16, DType::BF16] {
        unary(Exp, dt, &grid(-20.0, 11.0, 4001), 1.0);
        unary(Log, dt, &grid(0.001, 1000.0, 4001), 1.0);
        unary(Tanh, dt, &grid(-5.0, 5.0, 4001), 1.0);
        unary(Erf, dt, &grid(-4.0, 4.0, 4001), 1.0);
    }
}

#[test]
fn sin_cos_within_two_ulps() {
    for dt in [DType::F32, DType::F64] {
        for u in [UnaryOp::Sin, UnaryOp::Cos] {
            unary(u, dt, &grid(-8000.0, 8000.0, 40001), 2.0);
            unary(u, dt, &grid(-7.0, 7.0, 20001), 2.0);
        }
    }
}

#[test]
fn rsqrt_rem_minmax_and_casts_are_exact() {
    let mut pos = grid(1e-3, 1e4, 20001);
    pos.extend([0.0, f64::INFINITY, -1.0, f64::NAN, 1e-40]);
    for dt in [DType::F32, DType::F64, DType::F16] {
        check_ulps(
            "rsqrt",
            &[tensor(dt, &pos)],
            ScalarOp::Unary(UnaryOp::Rsqrt, 0),
            dt,
            0.0,
        );
    }
    let mut a = grid(-50.0, 50.0, 4001);
    let mut b: Vec<f64> = (0..4001).map(|i| [3.0, -3.0, 0.7, -0.25, 7.5][i % 5]).collect();
    // Infinite, zero and NaN operands.
    let inf = f64::INFINITY;
    a.extend([2.5, 2.5, -2.5, -2.5, 0.0, -0.0, inf, 2.5, f64::NAN, 3.0, 1e8]);
    b.extend([inf, -inf, inf, -inf, -inf, inf, 3.0, 0.0, 2.0, f64::NAN, 7.0]);
    for dt in [DType::F32, DType::F64] {
        check_ulps(
            "rem",
            &[tensor(dt, &a), tensor(dt, &b)],
            ScalarOp::Binary(BinaryOp::Rem, 0, 1),
            dt,
            0.0,
        );
        let mut x = a.clone();
        let mut y = b.clone();
        x.extend([f64::NAN, 1.0, f64::NAN, -0.0, 0.0]);
        y.extend([1.0, f64::NAN, f64::NAN, 0.0, -0.0]);
        for op in [BinaryOp::Max, BinaryOp::Min] {
            check_ulps(
                op.name(),
                &[tensor(dt, &x), tensor(dt, &y)],
                ScalarOp::Binary(op, 0, 1),
                dt,
                0.0,
            );
        }
    }
    let ia: Vec<f64> = grid(-40.0, 40.0, 81);
    let ib: Vec<f64> = (0..81).map(|i| [3.0, -3.0, 7.0, -1.0][i % 4]).collect();
    for dt in [DType::I32, DType::I64] {
        check_ulps(
            "int rem",
            &[tensor(dt, &ia), tensor(dt, &ib)],
            ScalarOp::Binary(BinaryOp::Rem, 0, 1),
            dt,
            0.0,
        );
    }
    let mut c = grid(-3e9, 3e9, 2001);
    c.extend([
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        255.7,
        -0.9,
        2147483647.0,
        1e19,
        -1e19,
    ]);
    for from in [DType::F32, DType::F64] {
        for to in [DType::I8, DType::U8, DType::I32, DType::I64] {
            check_ulps(
                &format!("cast {from}->{to}"),
                &[tensor(from, &c)],
                ScalarOp::Cast(0),
                to,
                0.0,
            );
        }
    }
}

#[test]
fn pow_follows_the_special_cases_and_stays_close() {
    let mut a = Vec::new();
    let mut b = Vec::new();
    let bases = [
        -8.0,
        -2.5,
        -1.0,
        -0.5,
        -0.0,
        0.0,
        0.5,
        1.0,
        1.5,
        2.0,
        10.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let exps = [
        -3.0,
        -2.0,
        -1.5,
        -1.0,
        -0.5,
        0.0,
        0.5,
        1.0,
        2.0,
        3.0,
        7.25,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    for &x in &bases {
        for &y in &exps {
            a.push(x);
            b.push(y);
        }
    }
    for (x, y) in grid(0.01, 30.0, 3001).into_iter().zip(grid(-8.0, 8.0, 3001)) {
        a.push(x);
        b.push(y);
    }
    check_ulps(
        "pow f32",
        &[tensor(DType::F32, &a), tensor(DType::F32, &b)],
        ScalarOp::Binary(BinaryOp::Pow, 0, 1),
        DType::F32,
        1.0,
    );
    let (got, want) = both(
        ScalarOp::Binary(BinaryOp::Pow, 0, 1),
        &[tensor(DType::F64, &a), tensor(DType::F64, &b)],
        DType::F64,
    );
    for (i, (g, w)) in got.to_f64_vec().into_iter().zip(want.to_f64_vec()).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 2e-13 * w.abs();
        assert!(ok, "pow({}, {}) = {g}, reference {w}", a[i], b[i]);
    }
}

/// `widen_half` leaves to the code generator what it says it does: with bf16 memory, loop
/// kernels read and write bf16 buffers without f32 copies (f16 ones are still copied); bf16
/// matmul operands keep their dtype only where bf16 products are native, and are copied to f32
/// otherwise; a whole-buffer cast becomes one conversion; every variant computes what the
/// reference does.
#[test]
fn widen_half_copies_only_what_the_code_generator_cannot_read() {
    use oar_passes::legalize::{HalfSupport, widen_half};
    let g = oar_ir::text::parse_graph(
        r#"
graph @mixed {
  %a = input "a" : bf16[8,16]
  %b = input "b" : bf16[16,4]
  %h = input "h" : f16[8,16]
  %x = input "x" : f32[8,16]
  %0 = mul(%a, %a) : bf16[8,16]
  %1 = matmul(%0, %b) : bf16[8,4]
  %2 = add(%h, %h) : f16[8,16]
  %3 = cast(%x) : bf16[8,16]
  output "m" = %1
  output "h2" = %2
  output "c" = %3
}
"#,
    )
    .unwrap();
    let program = oar_passes::fuse::lower_to_kernels(&g, &BTreeMap::new()).unwrap();
    let feeds: BTreeMap<String, TensorData> = [
        ("a", DType::BF16, [8, 16]),
        ("b", DType::BF16, [16, 4]),
        ("h", DType::F16, [8, 16]),
        ("x", DType::F32, [8, 16]),
    ]
    .into_iter()
    .map(|(n, dt, s)| {
        let v: Vec<f64> = (0..s[0] * s[1]).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
        (n.to_string(), TensorData::from_f64_slice(dt, s.to_vec(), &v).unwrap())
    })
    .collect();
    let want = run_kernel_program(&program, &Weights::new(), &feeds).unwrap();
    let copied = |p: &KernelProgram, of: &str| {
        p.buffers
            .iter()
            .filter(|b| b.ty.dtype == DType::F32 && b.value.starts_with(of) && b.value.ends_with("_f32"))
            .count()
    };
    for (bf16_memory, bf16_products) in [(false, false), (true, false), (true, true)] {
        let mut p = program.clone();
        widen_half(
            &mut p,
            HalfSupport {
                bf16_memory,
                bf16_products,
            },
        );
        let what = format!("memory {bf16_memory}, products {bf16_products}");
        // (Buffers %0–%3 are the inputs a, b, h, x; copies are named `<buffer>.<kernel>_f32`.)
        // The f16 input of the add is always copied; the bf16 input of the loop only without
        // bf16 memory.
        assert!(copied(&p, "%2.") >= 1, "{what}");
        assert_eq!(copied(&p, "%0.") >= 1, !bf16_memory, "{what}");
        // The matmul's bf16 operand `b` keeps bf16 only with native products.
        assert_eq!(copied(&p, "%1.") >= 1, !bf16_products, "{what}");
        let contraction = p
            .kernels
            .iter()
            .find_map(|k| match &k.body {
                KernelBody::Contraction(c) => Some(c),
                _ => None,
            })
            .unwrap();
        let lhs = p.buffer(contraction.lhs.load.buffer).ty.dtype;
        assert_eq!(lhs, if bf16_products { DType::BF16 } else { DType::F32 }, "{what}");
        // The cast is one conversion kernel.
        let casts = p
            .kernels
            .iter()
            .filter(|k| matches!(&k.body, KernelBody::Opaque(o) if o.inputs[0] == BufferId(3)))
            .count();
        assert_eq!(casts, 1, "{what}: the cast of x");
        let got = run_kernel_program(&p, &Weights::new(), &feeds).unwrap();
        for ((name, a), (_, b)) in got.iter().zip(&want) {
            assert_eq!(a.tensor_type(), b.tensor_type(), "{what}: {name}");
            if name == "m" {
                // The reference accumulates the widened program's product in f32 too.
                for (p, q) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
                    assert!(
                        (p - q).abs() <= 2f64.powi(-7) * q.abs().max(1.0),
                        "{what}: {name} {p} vs {q}"
                    );
                }
            } else {
                assert_eq!(a.bytes(), b.bytes(), "{what}: {name}");
            }
        }
    }
}

/// `fold_operand_casts` (native bf16 products): a matmul reading the bf16 cast of an input or a
/// weight reads the f32 buffer itself, rounded as it is read, and the cast kernel and its bf16
/// buffer go; a cast of a temporary folds only into matmuls before that temporary's last reader
/// (no f32 buffer lives longer); the kernel text round-trips the rounding; the reference gives
/// the same bits as the unfolded program.
#[test]
fn fold_operand_casts_reads_f32_operands_rounded_in_place_of_their_copies() {
    use oar_passes::legalize::{HalfSupport, fold_operand_casts, widen_half};
    let g = oar_ir::text::parse_graph(
        r#"
graph @step {
  %x = input "x" : f32[8,16]
  %w = param "w" : f32[16,4]
  %v = param "v" : f32[4,16]
  %0 = cast(%x) : bf16[8,16]
  %1 = cast(%w) : bf16[16,4]
  %2 = matmul(%0, %1) : bf16[8,4]
  %3 = cast(%2) : f32[8,4]
  %4 = exp(%3) : f32[8,4]
  %5 = cast(%4) : bf16[8,4]
  %6 = cast(%v) : bf16[4,16]
  %7 = matmul(%5, %6) : bf16[8,16]
  %8 = cast(%7) : f32[8,16]
  %9 = neg(%8) : f32[8,16]
  %10 = reduce_sum(%4) {axes = [1], keepdim = true} : f32[8,1]
  %11 = add(%9, %10) : f32[8,16]
  %12 = permute(%0) {perm = [1, 0]} : bf16[16,8]
  %13 = matmul(%12, %5) : bf16[16,4]
  %14 = cast(%13) : f32[16,4]
  output "y" = %11
  output "gw" = %14
}
"#,
    )
    .unwrap();
    let mut program = oar_passes::fuse::lower_to_kernels(&g, &BTreeMap::new()).unwrap();
    let support = HalfSupport {
        bf16_memory: true,
        bf16_products: true,
    };
    widen_half(&mut program, support);
    let before = program.clone();
    let folded = fold_operand_casts(&mut program);
    let text = program.to_string();
    // x (twice: the product and the transposed one), w and v fold; the cast of the temporary
    // exp(...) folds into neither matmul if they run after its last reader.
    assert!(folded >= 3, "{folded}\n{text}");
    let rounded: Vec<_> = program
        .kernels
        .iter()
        .filter_map(|k| match &k.body {
            KernelBody::Contraction(c) => Some([&c.lhs, &c.rhs]),
            _ => None,
        })
        .flatten()
        .filter(|o| o.round == Some(DType::BF16))
        .map(|o| program.buffer(o.load.buffer).kind.clone())
        .collect();
    assert!(rounded.len() >= 3, "{text}");
    let conversions_of_leaves = program
        .kernels
        .iter()
        .filter(|k| {
            matches!(&k.body, KernelBody::Opaque(o) if !matches!(program.buffer(o.inputs[0]).kind, BufferKind::Temp))
        })
        .count();
    assert_eq!(conversions_of_leaves, 0, "{text}");
    assert!(program.buffers.len() < before.buffers.len(), "the bf16 copies are gone");
    assert!(text.contains(" round bf16 : "), "{text}");
    // No temporary f32 source is read later than it was.
    let last_read = |p: &KernelProgram, b: BufferId| p.kernels.iter().rposition(|k| k.reads().contains(&b));
    for (i, buf) in program.buffers.iter().enumerate() {
        if buf.kind == BufferKind::Temp && buf.ty.dtype == DType::F32 {
            let old = before.buffers.iter().position(|o| o.value == buf.value).unwrap();
            let (now, was) = (
                last_read(&program, BufferId(i as u32)),
                last_read(&before, BufferId(old as u32)),
            );
            let (kn, kb) = (
                now.map(|k| &program.kernels[k].name),
                was.map(|k| &before.kernels[k].name),
            );
            assert_eq!(kn, kb, "{} read later than before\n{text}", buf.value);
        }
    }
    // The text form keeps the rounding.
    let reparsed = oar_ir::text::parse_kernel_program(&text).unwrap();
    assert_eq!(reparsed, program);
    // Same bits as the unfolded program (the reference rounds the operand as the cast did).
    let feeds = BTreeMap::from([(
        "x".to_string(),
        TensorData::from_f64_slice(
            DType::F32,
            vec![8, 16],
            &(0..128).map(|i| (i as f64 * 0.731).sin() * 1.7).collect::<Vec<_>>(),
        )
        .unwrap(),
    )]);
    let weights: Weights = [("w", vec![16, 4]), ("v", vec![4, 16])]
        .into_iter()
        .map(|(n, s)| {
            let len = s[0] * s[1];
            let v: Vec<f64> = (0..len).map(|i| (i as f64 * 0.377 + 0.1).cos() * 0.9).collect();
            (n.to_string(), TensorData::from_f64_slice(DType::F32, s, &v).unwrap())
        })
        .collect();
    let want = run_kernel_program(&before, &weights, &feeds).unwrap();
    let got = run_kernel_program(&program, &weights, &feeds).unwrap();
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        assert_eq!(a.bytes(), b.bytes(), "{name}");
    }
}

/// `widen_half` without native half products, on a step-like program (a forward product, a
/// chain of other kernels, then backward-like readers of the forward's half values): a reader
/// within `SHARE_SPAN` kernels shares the f32 copy; a reader far away gets a copy of its own
/// (so no f32 copy lives from the forward to the backward), made from the f32 input again where
/// the half buffer is a cast of it (so the half cast does not live until then either); the
/// program computes what the unwidened one does.
#[test]
fn widen_half_copies_again_for_far_readers() {
    use oar_passes::legalize::{HalfSupport, SHARE_SPAN, widen_half};
    let mut text = String::from(
        r#"
graph @step {
  %x = input "x" : f32[8,16]
  %w = param "w" : f32[16,16]
  %h = input "h" : f16[8,16]
  %0 = cast(%x) : bf16[8,16]
  %1 = cast(%w) : bf16[16,16]
  %2 = matmul(%0, %1) : bf16[8,16]
  %3 = cast(%2) : f32[8,16]
  %t = permute(%h) {perm = [1, 0]} : f16[16,8]
  %4 = matmul(%h, %t) : f16[8,8]
  %5 = matmul(%4, %h) : f16[8,16]
"#,
    );
    // A chain of f32 products, each a kernel of its own, longer than the span.
    let chain = SHARE_SPAN + 3;
    for i in 0..chain {
        text += &format!(
            "  %c{i} = matmul(%{}, %w) : f32[8,16]\n",
            if i == 0 { "3".into() } else { format!("c{}", i - 1) }
        );
    }
    let last = format!("%c{}", chain - 1);
    text += &format!(
        r#"  %6 = cast({last}) : bf16[8,16]
  %7 = permute(%0) {{perm = [1, 0]}} : bf16[16,8]
  %8 = matmul(%7, %6) : bf16[16,16]
  %9 = cast({last}) : f16[8,16]
  %10 = matmul(%9, %t) : f16[8,8]
  output "y" = {last}
  output "gw" = %8
  output "gh" = %10
  output "h2" = %5
}}
"#
    );
    let g = oar_ir::text::parse_graph(&text).unwrap();
    let program = oar_passes::fuse::lower_to_kernels(&g, &BTreeMap::new()).unwrap();
    let mut p = program.clone();
    widen_half(
        &mut p,
        HalfSupport {
            bf16_memory: true,
            bf16_products: false,
        },
    );
    let listing = p.to_string();
    let id = |input: &str| {
        let at = p
            .buffers
            .iter()
            .position(|b| matches!(&b.kind, BufferKind::Input { name } if name == input));
        BufferId(at.unwrap_or_else(|| panic!("no input {input}\n{listing}")) as u32)
    };
    let conversions_from = |b: BufferId| {
        p.kernels
            .iter()
            .filter(|k| matches!(&k.body, KernelBody::Opaque(o) if o.inputs == [b]))
            .count()
    };
    // h: one copy shared by the two products next to each other, one for the far one.
    assert_eq!(conversions_from(id("h")), 2, "{listing}");
    // x: cast once for the forward product, and again (then widened) for the far one.
    assert_eq!(conversions_from(id("x")), 2, "{listing}");
    // No f32 copy is read more than SHARE_SPAN kernels after the kernel that wrote it, and
    // no half temporary that a copy is made of is read that far from where it was written
    // (each lives near its readers).
    for (i, b) in p.buffers.iter().enumerate() {
        let b_id = BufferId(i as u32);
        let (Some(w), Some(r)) = (
            p.kernels.iter().position(|k| k.outputs.contains(&b_id)),
            p.kernels.iter().rposition(|k| k.reads().contains(&b_id)),
        ) else {
            continue;
        };
        let copy = b.value.ends_with("_f32") || b.value.ends_with("_again");
        let cast_of_x = b.ty.dtype == DType::BF16 && b.ty.shape.0 == [Dim::Static(8), Dim::Static(16)];
        if copy || cast_of_x {
            // (Conversions sit between the kernels, so allow for them.)
            assert!(
                r - w <= 2 * (SHARE_SPAN + 1),
                "{} lives from {w} to {r}\n{listing}",
                b.value
            );
        }
    }
    let feeds: BTreeMap<String, TensorData> = [("x", DType::F32), ("h", DType::F16)]
        .into_iter()
        .map(|(n, dt)| {
            let v: Vec<f64> = (0..128).map(|i| (i as f64 * 0.61).sin() * 0.5).collect();
            (n.to_string(), TensorData::from_f64_slice(dt, vec![8, 16], &v).unwrap())
        })
        .collect();
    let weights: Weights = [(
        "w".to_string(),
        TensorData::from_f64_slice(
            DType::F32,
            vec![16, 16],
            &(0..256).map(|i| (i as f64 * 0.377).cos() * 0.3).collect::<Vec<_>>(),
        )
        .unwrap(),
    )]
    .into_iter()
    .collect();
    let want = run_kernel_program(&program, &weights, &feeds).unwrap();
    let got = run_kernel_program(&p, &weights, &feeds).unwrap();
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        assert_eq!(a.tensor_type(), b.tensor_type(), "{name}");
        // Products accumulate in f32 here and in f64 in the reference, rounded to the half
        // dtype once: within two half steps.
        for (g, w) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
            assert!(
                (g - w).abs() <= 2f64.powi(-6) * w.abs().max(0.1),
                "{name}: {g} vs {w}\n{listing}"
            );
        }
    }
}
