//! Opaque ops the runtime runs natively (`Step::Native`) instead of through the reference
//! interpreter: pad, concat, gather, scatter, iota, random, argmax/argmin and sort. Each test
//! checks the step is native and the bytes equal the reference's (the conformance suite checks
//! them again within tolerance); bad indices are typed errors naming the kernel and index.

use oar_backend_cpu::CpuBackend;
use oar_ir::backend::Backend;
use oar_ir::{DType, TensorData, Weights};
use std::collections::BTreeMap;

const G: &str = r#"
graph @moves {
  %x = input "x" : f32[2,3]
  %i = input "i" : i64[2]
  %0 = pad(%x) {before = [1, 0], after = [0, 2], value = -inf} : f32[3,5]
  %1 = gather(%0, %i) {axis = 1} : f32[3,2]
  %2 = concat(%1, %1) {axis = 0} : f32[6,2]
  output "y" = %2
}
"#;

/// `g` lowered for the cpu backend, asserting no kernel is left to the interpreter.
fn lower_without_interpreter(g: &oar_ir::Graph) -> oar_backend_cpu::lower::Lowered {
    let lowered = oar_backend_cpu::lower::lower(g, &BTreeMap::new()).unwrap();
    let interpreted: Vec<_> = lowered
        .cpu
        .steps
        .iter()
        .filter(|s| matches!(s, oar_cpu_runtime::Step::Interpret { .. }))
        .collect();
    assert!(interpreted.is_empty(), "{interpreted:?}");
    lowered
}

type Outputs = Vec<(String, TensorData)>;

/// `g` run on `feeds` by the cpu backend and by the reference.
fn cpu_and_reference(g: &oar_ir::Graph, feeds: &BTreeMap<String, TensorData>) -> (Outputs, Outputs) {
    let exe = CpuBackend::new().compile(g, &Weights::new()).unwrap();
    let got = exe.run(feeds).unwrap();
    let want = oar_backend_reference::run_graph(g, &Weights::new(), feeds).unwrap();
    (got, want)
}

/// Every output has the reference's type and bytes.
fn assert_same_bytes(got: &Outputs, want: &Outputs, what: &str) {
    for ((name, a), (_, b)) in got.iter().zip(want) {
        assert_eq!(a.tensor_type(), b.tensor_type(), "{name}");
        assert!(
            a.bytes() == b.bytes(),
            "{name} ({what}): {:?} vs reference {:?}",
            a.to_f64_vec(),
            b.to_f64_vec()
        );
    }
}

fn inputs(idx: [i64; 2]) -> BTreeMap<String, TensorData> {
    BTreeMap::from([
        (
            "x".to_string(),
            TensorData::from_vec(vec![2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
        ),
        ("i".to_string(), TensorData::from_vec(vec![2], idx.to_vec()).unwrap()),
    ])
}

#[test]
fn pad_gather_concat_run_natively_and_match_the_reference() {
    let g = oar_ir::text::parse_graph(G).unwrap();
    let lowered = oar_backend_cpu::lower::lower(&g, &BTreeMap::new()).unwrap();
    let native = lowered
        .cpu
        .steps
        .iter()
        .filter(|s| matches!(s, oar_cpu_runtime::Step::Native { .. }))
        .count();
    assert_eq!(native, 3, "{:?}", lowered.cpu.steps);
    let exe = CpuBackend::new().compile(&g, &Weights::new()).unwrap();
    let got = exe.run(&inputs([-1, 0])).unwrap();
    let want = oar_backend_reference::run_graph(&g, &Weights::new(), &inputs([-1, 0])).unwrap();
    assert_eq!(got[0].1.to_f64_vec(), want[0].1.to_f64_vec());
    // Row 0 is padding, columns -1 (padding) and 0: [-inf, -inf], then [-inf, 1], [-inf, 4].
    assert_eq!(
        got[0].1.to_f64_vec()[..6],
        [
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
            1.0,
            f64::NEG_INFINITY,
            4.0
        ]
    );
}

/// Pads of every run shape the native copy distinguishes — single elements into a strided
/// output (a max-pool gradient's interleave), 8-byte runs, short rows copied in 16-byte blocks
/// with an overlapping tail, long rows, a whole tensor — on 1-, 2-, 4- and 8-byte dtypes give
/// the reference's bytes.
#[test]
fn pads_of_every_run_length_match_the_reference() {
    use oar_ir::ops::Pad;
    use oar_ir::{Float, Graph, Op, TensorType};
    let cases: [(&[usize], &[usize], &[usize]); 7] = [
        (&[4, 3, 5, 1], &[0, 0, 0, 0], &[0, 0, 0, 1]),
        (&[3, 7, 2], &[0, 1, 0], &[0, 0, 1]),
        (&[2, 3, 9], &[0, 0, 0], &[0, 1, 2]),
        (&[2, 5, 27], &[1, 0, 1], &[0, 2, 0]),
        (&[3, 100], &[0, 3], &[1, 2]),
        (&[2, 3, 4], &[1, 0, 0], &[2, 0, 0]),
        (&[6], &[2], &[3]),
    ];
    for dt in [DType::I8, DType::F16, DType::F32, DType::F64] {
        for &(shape, before, after) in &cases {
            let mut g = Graph::new("pad");
            let x = g.add_input("x", TensorType::of(dt, shape)).unwrap();
            let pad = Pad {
                before: before.to_vec(),
                after: after.to_vec(),
                value: Float(-3.0),
            };
            let y = g.add_op1(Op::Pad(pad), &[x]).unwrap();
            g.add_output("y", y).unwrap();
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n).map(|i| (i % 97) as f64 - 40.0).collect();
            let feeds = BTreeMap::from([(
                "x".to_string(),
                TensorData::from_f64_slice(dt, shape.to_vec(), &v).unwrap(),
            )]);
            let lowered = oar_backend_cpu::lower::lower(&g, &BTreeMap::new()).unwrap();
            assert!(
                matches!(lowered.cpu.steps.as_slice(), [oar_cpu_runtime::Step::Native { .. }]),
                "{:?}",
                lowered.cpu.steps
            );
            let got = CpuBackend::new()
                .compile(&g, &Weights::new())
                .unwrap()
                .run(&feeds)
                .unwrap();
            let want = oar_backend_reference::run_graph(&g, &Weights::new(), &feeds).unwrap();
            assert_eq!(
                got[0].1.bytes(),
                want[0].1.bytes(),
                "{dt} {shape:?} {before:?} {after:?}"
            );
        }
    }
}

#[test]
fn gather_index_out_of_range_is_a_typed_error() {
    let g = oar_ir::text::parse_graph(G).unwrap();
    let exe = CpuBackend::new().compile(&g, &Weights::new()).unwrap();
    let e = exe.run(&inputs([0, 5])).unwrap_err().to_string();
    assert!(e.contains("gather index 5 out of range for axis 1 of size 5"), "{e}");
}

/// iota and random fill their buffers from the op definitions' `write_elements` (no f64
/// tensor): every dtype, integer wrap-around (an i8 iota past 127), and outputs large enough to
/// be filled in parallel chunks give the reference's bytes exactly.
#[test]
fn generators_run_natively_and_match_the_reference_bit_for_bit() {
    let g = oar_ir::text::parse_graph(
        r#"
graph @gen {
  %0 = iota() {axis = 1} : f32[3,5]
  %1 = iota() {axis = 0} : i8[300]
  %2 = iota() {axis = 2} : bf16[2,3,700]
  %3 = iota() {axis = 0} : i64[4,2]
  %4 = random() {dist = uniform, low = -2.0, high = 3.0, seed = 7} : f32[300000]
  %5 = random() {dist = normal, mean = 0.5, std = 2.0, seed = 11} : f16[1000]
  %6 = random() {dist = normal, mean = 0.0, std = 1.0, seed = 3} : f64[140000]
  %7 = random() {dist = uniform, low = 0.0, high = 1.0, seed = 0} : bf16[33]
  output "a" = %0
  output "b" = %1
  output "c" = %2
  output "d" = %3
  output "e" = %4
  output "f" = %5
  output "g" = %6
  output "h" = %7
}
"#,
    )
    .unwrap();
    let lowered = oar_backend_cpu::lower::lower(&g, &BTreeMap::new()).unwrap();
    let native = lowered
        .cpu
        .steps
        .iter()
        .filter(|s| matches!(s, oar_cpu_runtime::Step::Native { .. }))
        .count();
    assert_eq!(native, 8, "{:?}", lowered.cpu.steps);
    let want = oar_backend_reference::run_graph(&g, &Weights::new(), &BTreeMap::new()).unwrap();
    let code = oar_backend_cpu::machine::compile(&lowered).unwrap();
    for threads in [1, 4] {
        let mut m = oar_cpu_runtime::Model::new(lowered.cpu.clone(), code.funcs.clone(), &lowered.consts).unwrap();
        m.set_threads(threads);
        let got = m.run(&BTreeMap::new()).unwrap();
        assert_same_bytes(&got, &want, &format!("{threads} threads"));
    }
    // The i8 iota wraps like numpy's astype: 127, then -128.
    let b = want[1].1.to_vec::<i8>().unwrap();
    assert_eq!((b[127], b[128], b[299]), (127, -128, 43));
}

/// argmax/argmin and sort run natively on every dtype with the definitions' semantics — the
/// first extremum on ties, NaN the largest (first NaN wins), stable sorts both ways — and give
/// the reference's bytes exactly; inputs that share memory with an output are copied first.
#[test]
fn arg_reduce_and_sort_run_natively_and_match_the_reference() {
    let g = oar_ir::text::parse_graph(
        r#"
graph @lanes {
  %x = input "x" : f32[3,4]
  %n = input "n" : i32[2,5]
  %b = input "b" : bool[6]
  %0 = argmax(%x) {axis = 1, keepdim = false} : i64[3]
  %1 = argmin(%x) {axis = 0, keepdim = true} : i64[1,4]
  %2 = argmax(%n) {axis = 1, keepdim = false} : i64[2]
  %3 = argmin(%b) {axis = 0, keepdim = false} : i64[]
  %4:2 = sort(%x) {axis = 1, descending = false} : f32[3,4], i64[3,4]
  %6:2 = sort(%n) {axis = 1, descending = true} : i32[2,5], i64[2,5]
  %8:2 = sort(%b) {axis = 0, descending = true} : bool[6], i64[6]
  %10 = neg(%x) : f32[3,4]
  %11:2 = sort(%10) {axis = 0, descending = true} : f32[3,4], i64[3,4]
  output "amax" = %0
  output "amin" = %1
  output "namax" = %2
  output "bamin" = %3
  output "sv" = %4#0
  output "si" = %4#1
  output "nv" = %6#0
  output "ni" = %6#1
  output "bv" = %8#0
  output "bi" = %8#1
  output "negv" = %11#0
  output "negi" = %11#1
}
"#,
    )
    .unwrap();
    let nan = f32::NAN;
    let feeds = BTreeMap::from([
        (
            "x".to_string(),
            TensorData::from_vec(
                vec![3, 4],
                vec![1.0f32, 3.0, 3.0, -1.0, nan, 2.0, nan, 0.0, -0.0, 0.0, -5.0, -5.0],
            )
            .unwrap(),
        ),
        (
            "n".to_string(),
            TensorData::from_vec(vec![2, 5], vec![4i32, -2, 4, 9, 9, 0, 0, -7, 3, -7]).unwrap(),
        ),
        (
            "b".to_string(),
            TensorData::from_vec(vec![6], vec![true, true, false, true, false, false]).unwrap(),
        ),
    ]);
    lower_without_interpreter(&g);
    let (got, want) = cpu_and_reference(&g, &feeds);
    assert_same_bytes(&got, &want, "lanes");
    // Hand-checked: row 0 [1, 3, 3, -1] → argmax 1 (first of the tie); row 1 → the first NaN,
    // 0; row 2 [-0, 0, -5, -5] → 0 (-0 == 0, the first wins).
    let by = |n: &str| got.iter().find(|(k, _)| k == n).unwrap().1.to_f64_vec();
    assert_eq!(by("amax"), [1.0, 0.0, 0.0]);
    assert_eq!(by("namax"), [3.0, 3.0]);
    assert_eq!(by("bamin"), [2.0]);
    // Row 1 ascending: 0, 2, then the NaNs in their original order (columns 0 and 2).
    assert_eq!(by("si")[4..8], [3.0, 1.0, 0.0, 2.0]);
    // Descending i32 row 1 [0, 0, -7, 3, -7]: 3, then the zeros and the -7s in order.
    assert_eq!(by("ni")[5..], [3.0, 0.0, 1.0, 2.0, 4.0]);
}

/// scatter runs natively with the reference's semantics: the last update wins for `replace`;
/// `add` with repeated indices sums floats in f64 and rounds once, wraps i8;
/// negative indices count from the end; a bad index is a typed error naming it.
#[test]
fn scatter_runs_natively_and_matches_the_reference() {
    let g = oar_ir::text::parse_graph(
        r#"
graph @scatter {
  %d = input "d" : f32[4,3]
  %i = input "i" : i64[5]
  %u = input "u" : f32[5,3]
  %h = input "h" : f16[2]
  %hi = input "hi" : i32[40]
  %hu = input "hu" : f16[40]
  %b = input "b" : i8[3]
  %bu = input "bu" : i8[5]
  %0 = scatter(%d, %i, %u) {axis = 0, reduce = add} : f32[4,3]
  %1 = scatter(%d, %i, %u) {axis = 0, reduce = replace} : f32[4,3]
  %2 = scatter(%h, %hi, %hu) {axis = 0, reduce = add} : f16[2]
  %3 = scatter(%b, %i, %bu) {axis = 0, reduce = add} : i8[3]
  output "add" = %0
  output "replace" = %1
  output "half" = %2
  output "wrap" = %3
}
"#,
    )
    .unwrap();
    let feeds = |idx: Vec<i64>| {
        BTreeMap::from([
            (
                "d".to_string(),
                TensorData::from_vec(vec![4, 3], (0..12).map(|v| v as f32 * 0.1).collect()).unwrap(),
            ),
            ("i".to_string(), TensorData::from_vec(vec![5], idx).unwrap()),
            (
                "u".to_string(),
                TensorData::from_vec(vec![5, 3], (0..15).map(|v| 1.0 + v as f32 / 3.0).collect()).unwrap(),
            ),
            (
                "h".to_string(),
                TensorData::from_f64_slice(DType::F16, vec![2], &[1.0; 2]).unwrap(),
            ),
            (
                "hi".to_string(),
                TensorData::from_vec(vec![40], vec![1i32; 40]).unwrap(),
            ),
            (
                "hu".to_string(),
                TensorData::from_f64_slice(DType::F16, vec![40], &[1e-3; 40]).unwrap(),
            ),
            (
                "b".to_string(),
                TensorData::from_vec(vec![3], vec![100i8, 0, -3]).unwrap(),
            ),
            (
                "bu".to_string(),
                TensorData::from_vec(vec![5], vec![100i8, 5, 7, 1, 2]).unwrap(),
            ),
        ])
    };
    lower_without_interpreter(&g);
    let exe = CpuBackend::new().compile(&g, &Weights::new()).unwrap();
    // Index 0 twice, -1 (the last row) and 2: repeated, negative and plain.
    let inputs = feeds(vec![0, 2, -1, 0, 2]);
    let (got, want) = cpu_and_reference(&g, &inputs);
    assert_same_bytes(&got, &want, "scatter");
    let by = |n: &str| got.iter().find(|(k, _)| k == n).unwrap().1.to_f64_vec();
    // 1 + 40 · f16(0.001) summed in f64 and rounded once to f16: 1.0400390625.
    assert_eq!(by("half"), [1.0, 1.0400390625]);
    // i8, indices [0, 2, 2 (from -1), 0, 2]: 100 + 100 + 1 wraps to -55; -3 + 5 + 7 + 2 = 11.
    assert_eq!(by("wrap"), [-55.0, 0.0, 11.0]);
    let e = exe.run(&feeds(vec![0, 4, 1, 1, 1])).unwrap_err().to_string();
    assert!(e.contains("scatter index 4 out of range for axis 0 of size 4"), "{e}");
}

/// f16/bf16 loop kernels compile (legalize::widen_half): converted to f32 by native casts,
/// computed in f32 with every half result rounded, converted back — the reference's bits for
/// arithmetic, casts (f32 → f16 → f32 rounds, with subnormals, overflow to inf and NaN), max,
/// where and comparisons; transcendentals within an ulp of the half dtype; no interpreter step.
#[test]
fn half_precision_loops_compile_and_give_the_references_bits() {
    let g = oar_ir::text::parse_graph(
        r#"
graph @half {
  %a = input "a" : f16[64]
  %b = input "b" : f16[64]
  %x = input "x" : f32[64]
  %p = input "p" : bf16[4,16]
  %0 = mul(%a, %b) : f16[64]
  %1 = add(%0, %a) : f16[64]
  %2 = div(%1, %b) : f16[64]
  %3 = sqrt(%2) : f16[64]
  %4 = cast(%x) : f16[64]
  %5 = cast(%4) : f32[64]
  %6 = cast(%x) : bf16[64]
  %7 = max(%3, %4) : f16[64]
  %8 = gt(%a, %b) : bool[64]
  %9 = where(%8, %a, %b) : f16[64]
  %10 = mul(%p, %p) : bf16[4,16]
  %11 = sub(%10, %p) : bf16[4,16]
  %12 = exp(%a) : f16[64]
  %13 = tanh(%p) : bf16[4,16]
  output "arith" = %2
  output "sqrt" = %3
  output "round_trip" = %5
  output "to_bf16" = %6
  output "max" = %7
  output "where" = %9
  output "bf16" = %11
  output "exp" = %12
  output "tanh" = %13
}
"#,
    )
    .unwrap();
    let n = 64;
    let vals = |f: &dyn Fn(usize) -> f64| (0..n).map(f).collect::<Vec<f64>>();
    // f32 inputs that exercise the rounding: ties, f16 subnormals, overflow, NaN, signs.
    let mut xs = vals(&|i| (i as f64 - 32.0) * 1.37e-3 + 1.0 / (1 << (i % 20)) as f64);
    xs[0] = 65519.0;
    xs[1] = 65520.0;
    xs[2] = -70000.0;
    xs[3] = f64::NAN;
    xs[4] = 1.0 + 2f64.powi(-11); // a tie: to even, 1.0
    xs[5] = 1.0 + 3.0 * 2f64.powi(-11); // a tie: to even, 1 + 2^-9
    xs[6] = 3.0 * 2f64.powi(-25); // f16 subnormal tie
    xs[7] = -1e-9; // underflows to -0
    let feeds = BTreeMap::from([
        (
            "a".to_string(),
            TensorData::from_f64_slice(DType::F16, vec![n], &vals(&|i| 0.1 + i as f64 * 0.173)).unwrap(),
        ),
        (
            "b".to_string(),
            TensorData::from_f64_slice(DType::F16, vec![n], &vals(&|i| 3.0 - i as f64 * 0.0917)).unwrap(),
        ),
        (
            "x".to_string(),
            TensorData::from_f64_slice(DType::F32, vec![n], &xs).unwrap(),
        ),
        (
            "p".to_string(),
            TensorData::from_f64_slice(DType::BF16, vec![4, 16], &vals(&|i| (i as f64 - 20.0) * 0.31)).unwrap(),
        ),
    ]);
    lower_without_interpreter(&g);
    let (got, want) = cpu_and_reference(&g, &feeds);
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        assert_eq!(a.tensor_type(), b.tensor_type(), "{name}");
        let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
        if name == "exp" || name == "tanh" {
            // One ulp of the half dtype (2^-10 for f16, 2^-7 for bf16, relative).
            let ulp = if name == "exp" { 2f64.powi(-10) } else { 2f64.powi(-7) };
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                assert!((p - q).abs() <= ulp * q.abs().max(1e-3), "{name}[{i}]: {p} vs {q}");
            }
        } else {
            // Bit for bit, except that any NaN matches any NaN (payloads are not specified).
            let same = x
                .iter()
                .zip(&y)
                .all(|(p, q)| (p.is_nan() && q.is_nan()) || (p == q && p.is_sign_negative() == q.is_sign_negative()));
            assert!(same, "{name}: {x:?}\nvs reference {y:?}");
        }
    }
    let rt = got.iter().find(|(k, _)| k == "round_trip").unwrap().1.to_f64_vec();
    assert_eq!(rt[..3], [65504.0, f64::INFINITY, f64::NEG_INFINITY]);
    assert!(rt[3].is_nan());
    assert_eq!(rt[4..7], [1.0, 1.0 + 2f64.powi(-9), 4.0 * 2f64.powi(-25)]);
    assert!(rt[7] == 0.0 && rt[7].is_sign_negative());
}

/// bf16 loop kernels read and write their bf16 buffers directly (16-bit loads widened to f32
/// lanes, the rounded results' high halves stored), with no f32 copy of any buffer: contiguous
/// vectors with a scalar tail, a transposed (per-lane) load, a broadcast, a reduction, and
/// a NaN whose payload lies in the low half only (stored as a NaN, not an infinity). The
/// reference's bytes, NaNs included (the rounding quiets them as bf16 conversion does).
#[test]
fn bf16_loops_read_and_write_bf16_without_copies() {
    let g = oar_ir::text::parse_graph(
        r#"
graph @bf16_mem {
  %p = input "p" : bf16[5,33]
  %q = input "q" : bf16[33,5]
  %x = input "x" : f32[5,33]
  %r = input "r" : bf16[33]
  %0 = mul(%p, %p) : bf16[5,33]
  %1 = add(%0, %r) : bf16[5,33]
  %2 = permute(%q) {perm = [1, 0]} : bf16[5,33]
  %3 = sub(%1, %2) : bf16[5,33]
  %4 = neg(%x) : f32[5,33]
  %5 = cast(%4) : bf16[5,33]
  %6 = reduce_sum(%p) {axes = [1], keepdim = false} : bf16[5]
  output "fused" = %3
  output "nan" = %5
  output "sum" = %6
}
"#,
    )
    .unwrap();
    let vals = |n: usize, f: &dyn Fn(usize) -> f64| (0..n).map(f).collect::<Vec<f64>>();
    let bf = |shape: Vec<usize>, v: Vec<f64>| TensorData::from_f64_slice(DType::BF16, shape, &v).unwrap();
    let mut xbits: Vec<u32> = vals(165, &|i| (i as f64 - 80.0) * 0.37)
        .iter()
        .map(|&v| (v as f32).to_bits())
        .collect();
    xbits[3] = 0x7F80_0001; // NaN, payload in the low half only
    xbits[4] = 0xFF80_0100; // negative NaN, likewise
    xbits[5] = 0x7F7F_FFFF; // f32::MAX: its negation rounds to bf16 -infinity
    let feeds = BTreeMap::from([
        (
            "p".to_string(),
            bf(vec![5, 33], vals(165, &|i| (i as f64 - 70.0) * 0.113)),
        ),
        (
            "q".to_string(),
            bf(vec![33, 5], vals(165, &|i| (i as f64 * 0.071).sin())),
        ),
        (
            "x".to_string(),
            TensorData::from_bytes(
                DType::F32,
                vec![5, 33],
                xbits.iter().flat_map(|b| b.to_le_bytes()).collect(),
            )
            .unwrap(),
        ),
        ("r".to_string(), bf(vec![33], vals(33, &|i| i as f64 * 0.5 - 3.0))),
    ]);
    let lowered = lower_without_interpreter(&g);
    let f32_copies: Vec<&str> = lowered
        .cpu
        .program
        .buffers
        .iter()
        .filter(|b| b.ty.dtype == DType::F32 && b.value.ends_with("_f32"))
        .map(|b| b.value.as_str())
        .collect();
    assert!(f32_copies.is_empty(), "f32 copies of bf16 buffers: {f32_copies:?}");
    let (got, want) = cpu_and_reference(&g, &feeds);
    assert_same_bytes(&got, &want, "bf16 loops");
    let nan = got.iter().find(|(k, _)| k == "nan").unwrap().1.to_f64_vec();
    assert!(nan[3].is_nan() && nan[4].is_nan(), "{:?}", &nan[..6]);
    assert_eq!(nan[5], f64::NEG_INFINITY);
}

/// f16/bf16 matmul and conv (with epilogues) run on the f32 gemm path: operands converted, the
/// result rounded to the half dtype where the epilogue reads it; within the half dtype's
/// tolerance of the reference (which accumulates in f64), no interpreter step.
#[test]
fn half_precision_contractions_run_on_the_f32_gemm_path() {
    let g = oar_ir::text::parse_graph(
        r#"
graph @half_mm {
  %a = input "a" : f16[8,32]
  %b = input "b" : f16[32,16]
  %c = input "c" : f16[16]
  %x = input "x" : bf16[1,3,8,8]
  %w = input "w" : bf16[4,3,3,3]
  %0 = matmul(%a, %b) : f16[8,16]
  %1 = add(%0, %c) : f16[8,16]
  %2 = relu(%1) : f16[8,16]
  %3 = conv2d(%x, %w) {stride = [1, 1], padding = [1, 1, 1, 1], dilation = [1, 1], groups = 1} : bf16[1,4,8,8]
  output "mm" = %2
  output "conv" = %3
}
"#,
    )
    .unwrap();
    let vals = |n: usize, s: f64| (0..n).map(|i| ((i * 37 % 23) as f64 - 11.0) * s).collect::<Vec<f64>>();
    let feeds = BTreeMap::from([
        (
            "a".to_string(),
            TensorData::from_f64_slice(DType::F16, vec![8, 32], &vals(256, 0.05)).unwrap(),
        ),
        (
            "b".to_string(),
            TensorData::from_f64_slice(DType::F16, vec![32, 16], &vals(512, 0.03)).unwrap(),
        ),
        (
            "c".to_string(),
            TensorData::from_f64_slice(DType::F16, vec![16], &vals(16, 0.1)).unwrap(),
        ),
        (
            "x".to_string(),
            TensorData::from_f64_slice(DType::BF16, vec![1, 3, 8, 8], &vals(192, 0.07)).unwrap(),
        ),
        (
            "w".to_string(),
            TensorData::from_f64_slice(DType::BF16, vec![4, 3, 3, 3], &vals(108, 0.04)).unwrap(),
        ),
    ]);
    lower_without_interpreter(&g);
    let (got, want) = cpu_and_reference(&g, &feeds);
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        assert_eq!(a.tensor_type(), b.tensor_type(), "{name}");
        // The kit's half tolerances: f16 rtol 2e-3 / atol 1e-4, bf16 1.6e-2 / 1e-3.
        let (rtol, atol) = if name == "mm" { (2e-3, 1e-4) } else { (1.6e-2, 1e-3) };
        for (i, (p, q)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
            assert!((p - q).abs() <= atol + rtol * q.abs(), "{name}[{i}]: {p} vs {q}");
        }
    }
}

/// Integer matmul runs in the runtime (no interpreter step): products and sums wrap in the
/// element type as the reference's do, with transposed operands, broadcast batches and an
/// epilogue compiled after it.
#[test]
fn integer_matmul_runs_in_the_runtime_and_wraps_like_the_reference() {
    for dt in [DType::I8, DType::U8, DType::I32, DType::I64] {
        let text = r#"
graph @imm {
  %a = input "a" : T[2,5,7]
  %b = input "b" : T[3,7]
  %c = input "c" : T[1,7,4]
  %bt = permute(%b) {perm = [1, 0]} : T[7,3]
  %0 = matmul(%a, %bt) : T[2,5,3]
  %1 = add(%0, %0) : T[2,5,3]
  %2 = matmul(%a, %c) : T[2,5,4]
  output "shared_rhs" = %1
  output "broadcast_batch" = %2
}
"#
        .replace('T', &dt.to_string());
        let g = oar_ir::text::parse_graph(&text).unwrap();
        let lowered = lower_without_interpreter(&g);
        let contractions = lowered
            .cpu
            .steps
            .iter()
            .filter(|s| matches!(s, oar_cpu_runtime::Step::Contraction { .. }))
            .count();
        assert_eq!(contractions, 2, "{dt}: {:?}", lowered.cpu.steps);
        // Values up to ±120 (0..240 for u8): 7 products of up to 14400 overflow i8/u8 on purpose.
        let data = |shape: Vec<usize>, seed: i64| {
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n as i64)
                .map(|i| {
                    let x = (i * 37 + seed * 11) % 241 - 120;
                    if dt == DType::U8 { (x + 120) as f64 } else { x as f64 }
                })
                .collect();
            TensorData::from_f64_slice(dt, shape, &v).unwrap()
        };
        let feeds = BTreeMap::from([
            ("a".to_string(), data(vec![2, 5, 7], 1)),
            ("b".to_string(), data(vec![3, 7], 2)),
            ("c".to_string(), data(vec![1, 7, 4], 3)),
        ]);
        let (got, want) = cpu_and_reference(&g, &feeds);
        assert_same_bytes(&got, &want, &dt.to_string());
        // Hand-checked element [0, 0, 0] of the first product against a wrapping dot product.
        let a = feeds["a"].to_f64_vec();
        let b = feeds["b"].to_f64_vec();
        let dot: i64 = (0..7).map(|p| a[p] as i64 * b[p] as i64).sum();
        let wrapped = match dt {
            DType::I8 => (2 * dot) as i8 as f64,
            DType::U8 => (2 * dot) as u8 as f64,
            DType::I32 => (2 * dot) as i32 as f64,
            _ => (2 * dot) as f64,
        };
        assert_eq!(got[0].1.to_f64_vec()[0], wrapped, "{dt}");
    }
}

/// The interpreter is the evaluator of last resort only: every op definition's samples, and
/// every unary, binary, reduction and matmul on every dtype its type rule accepts, lower on cpu
/// without a single interpreted kernel.
#[test]
fn every_op_sample_lowers_without_the_interpreter() {
    use oar_ir::ops::{BinaryOp, Reduce, ReduceOp, UnaryOp, infer_types};
    use oar_ir::{Graph, Op, TensorType};
    let mut cases: Vec<(String, Op, Vec<TensorType>)> = Op::all_samples()
        .into_iter()
        .map(|s| {
            let ins = s.inputs.iter().map(|x| TensorType::of(x.dtype, &x.shape)).collect();
            (s.name, s.op, ins)
        })
        .collect();
    let t = |dt: DType, shape: &[usize]| TensorType::of(dt, shape);
    for dt in DType::ALL {
        for &u in UnaryOp::ALL {
            cases.push((format!("{}/{dt}", u.name()), Op::Unary(u), vec![t(dt, &[3, 37])]));
        }
        for &b in BinaryOp::ALL {
            let ins = vec![t(dt, &[3, 37]), t(dt, &[3, 37])];
            cases.push((format!("{}/{dt}", b.name()), Op::Binary(b), ins));
        }
        for &op in ReduceOp::ALL {
            for (shape, axes) in [
                (vec![4usize, 9], vec![1usize]),
                (vec![0, 3], vec![1]),
                (vec![5, 6, 7], vec![0, 2]),
            ] {
                let r = Op::Reduce(Reduce {
                    op,
                    axes: axes.clone(),
                    keepdim: false,
                });
                cases.push((format!("{}/{dt}/{shape:?}", op.name()), r, vec![t(dt, &shape)]));
            }
        }
        cases.push((
            format!("matmul/{dt}"),
            Op::MatMul,
            vec![t(dt, &[2, 3, 5]), t(dt, &[5, 4])],
        ));
    }
    let mut left = Vec::new();
    let mut lowered_cases = 0;
    for (name, op, ins) in &cases {
        if infer_types(op, ins, &[]).is_err() {
            continue; // not an op on these types
        }
        let mut g = Graph::new("sample");
        let ins: Vec<_> = ins
            .iter()
            .enumerate()
            .map(|(i, x)| g.add_input(&format!("x{i}"), x.clone()).unwrap())
            .collect();
        for (i, v) in g.add_op(op.clone(), &ins).unwrap().into_iter().enumerate() {
            g.add_output(&format!("y{i}"), v).unwrap();
        }
        let lowered = oar_backend_cpu::lower::lower(&g, &BTreeMap::new()).unwrap_or_else(|e| panic!("{name}: {e}"));
        for step in &lowered.cpu.steps {
            if let oar_cpu_runtime::Step::Interpret { reason, .. } = step {
                left.push(format!("{name}: {reason}"));
            }
        }
        lowered_cases += 1;
    }
    assert!(lowered_cases > 250, "{lowered_cases} cases");
    assert!(left.is_empty(), "interpreted:\n{}", left.join("\n"));
}

/// The windowed native composites (`max_pool2d`, `max_pool2d_grad`, `conv_transpose`,
/// `conv_weight_grad`) run natively on f16/bf16 operands too — widened to f32, the f32 kernel,
/// the result rounded once — instead of decomposing into padded copies and one widened copy
/// per window tap. Max pooling (and its gradient's routing, which sums at most a few exact
/// values) gives the reference's bits; the convolutions are within the half dtype's tolerance
/// of the reference's f64 accumulation.
#[test]
fn half_precision_windowed_composites_run_natively() {
    use oar_ir::ops::{ConvTranspose, ConvWeightGrad, MaxPool2d, MaxPool2dGrad};
    use oar_ir::{Composite, Graph, Op, TensorType};
    for dt in [DType::F16, DType::BF16] {
        let mut g = Graph::new("half_windows");
        let x = g.add_input("x", TensorType::of(dt, &[1, 3, 9, 9])).unwrap();
        let (kernel, stride, padding) = ([3, 3], [2, 2], [1, 1, 1, 1]);
        let pool = MaxPool2d {
            kernel,
            stride,
            padding,
            ceil_mode: false,
        };
        let p = g.add_op1(Op::Composite(Composite::MaxPool2d(pool)), &[x]).unwrap();
        let grad = MaxPool2dGrad {
            kernel,
            stride,
            padding,
            ceil_mode: false,
        };
        let dx = g
            .add_op1(Op::Composite(Composite::MaxPool2dGrad(grad)), &[x, p])
            .unwrap();
        let w = g.add_input("w", TensorType::of(dt, &[3, 2, 3, 3])).unwrap();
        let ct = ConvTranspose {
            stride: vec![2, 2],
            pad_before: vec![1, 1],
            pad_after: vec![1, 1],
            output_padding: vec![0, 0],
            dilation: vec![1, 1],
            groups: 1,
        };
        let t = g.add_op1(Op::Composite(Composite::ConvTranspose(ct)), &[p, w]).unwrap();
        let dy = g.add_input("dy", TensorType::of(dt, &[1, 2, 9, 9])).unwrap();
        let cw = ConvWeightGrad {
            stride: vec![1, 1],
            pad_before: vec![1, 1],
            pad_after: vec![1, 1],
            dilation: vec![1, 1],
            groups: 1,
            kernel: vec![3, 3],
        };
        let gw = g
            .add_op1(Op::Composite(Composite::ConvWeightGrad(cw)), &[x, dy])
            .unwrap();
        for (name, v) in [("pool", p), ("pool_grad", dx), ("conv_transpose", t), ("wgrad", gw)] {
            g.add_output(name, v).unwrap();
        }
        let lowered = lower_without_interpreter(&g);
        let natives = lowered
            .cpu
            .steps
            .iter()
            .filter(|s| matches!(s, oar_cpu_runtime::Step::Native { .. }))
            .count();
        assert_eq!(natives, 4, "{dt}: {:?}", lowered.cpu.steps);
        let vals = |n: usize, s: f64| (0..n).map(|i| ((i * 37 % 29) as f64 - 14.0) * s).collect::<Vec<f64>>();
        let feeds = BTreeMap::from([
            (
                "x".to_string(),
                TensorData::from_f64_slice(dt, vec![1, 3, 9, 9], &vals(243, 0.07)).unwrap(),
            ),
            (
                "w".to_string(),
                TensorData::from_f64_slice(dt, vec![3, 2, 3, 3], &vals(54, 0.05)).unwrap(),
            ),
            (
                "dy".to_string(),
                TensorData::from_f64_slice(dt, vec![1, 2, 9, 9], &vals(162, 0.03)).unwrap(),
            ),
        ]);
        let (got, want) = cpu_and_reference(&g, &feeds);
        let (rtol, atol) = if dt == DType::F16 { (2e-3, 1e-4) } else { (1.6e-2, 1e-3) };
        for ((name, a), (_, b)) in got.iter().zip(&want) {
            assert_eq!(a.tensor_type(), b.tensor_type(), "{dt} {name}");
            if name.starts_with("pool") {
                assert_eq!(a.bytes(), b.bytes(), "{dt} {name}: max pooling is exact");
                continue;
            }
            for (i, (p, q)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
                assert!((p - q).abs() <= atol + rtol * q.abs(), "{dt} {name}[{i}]: {p} vs {q}");
            }
        }
    }
}

/// An inference batch norm after a convolution folds into it when the cpu backend lowers the
/// graph: the convolution's epilogue is a per-channel bias add and the relu (a chain the
/// runtime applies at full vector width), its scale and bias are kernels over weights alone
/// (run once per model), and the result is the unfolded graph's within float rounding.
#[test]
fn inference_batch_norm_folds_into_the_convolution() {
    let g = oar_ir::text::parse_graph(
        r#"
graph @cbr {
  %x = input "x" : f32[1,8,10,10]
  %w = param "w" : f32[16,8,3,3]
  %g = param "g" : f32[16]
  %b = param "b" : f32[16]
  %m = param "m" : f32[16]
  %v = param "v" : f32[16]
  %0 = conv2d(%x, %w) {stride = [1, 1], padding = [1, 1, 1, 1], dilation = [1, 1], groups = 1} : f32[1,16,10,10]
  %1 = batch_norm(%0, %g, %b, %m, %v) {epsilon = 1e-5, momentum = 0.9, training = false} : f32[1,16,10,10]
  %2 = relu(%1) : f32[1,16,10,10]
  output "y" = %2
}
"#,
    )
    .unwrap();
    let lowered = lower_without_interpreter(&g);
    let p = &lowered.cpu.program;
    // Buffers computed from weights alone so far.
    let mut fixed: Vec<bool> = p.buffers.iter().map(|b| b.kind.is_weight()).collect();
    let mut convs = 0;
    for k in &p.kernels {
        match &k.body {
            oar_ir::kernel::KernelBody::Contraction(c) => {
                convs += 1;
                use oar_ir::kernel::ScalarOp;
                use oar_ir::ops::BinaryOp;
                let plain = c.epilogue.iter().all(|i| {
                    matches!(
                        i.op,
                        ScalarOp::Acc(_)
                            | ScalarOp::Load(_)
                            | ScalarOp::Const(_)
                            | ScalarOp::Binary(BinaryOp::Add | BinaryOp::Max, ..)
                    )
                });
                assert!(plain, "the epilogue is more than a bias and a relu:\n{p}");
                for ld in &c.loads {
                    assert!(
                        fixed[ld.buffer.index()],
                        "the bias is computed from weights alone:\n{p}"
                    );
                }
            }
            _ => {
                let weight_only = k.reads().iter().all(|&b| fixed[b.index()]);
                assert!(weight_only, "{} reads more than weights:\n{p}", k.name);
                for o in &k.outputs {
                    fixed[o.index()] = true;
                }
            }
        }
    }
    assert_eq!(convs, 1, "{p}");
    let mut weights = Weights::new();
    for (name, shape, lo) in [
        ("w", vec![16, 8, 3, 3], -0.5),
        ("g", vec![16], 0.5),
        ("b", vec![16], -0.3),
        ("m", vec![16], -0.2),
        ("v", vec![16], 0.1),
    ] {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|i| lo + ((i * 37 % 101) as f64) / 101.0).collect();
        weights.insert(
            name.to_string(),
            TensorData::from_f64_slice(DType::F32, shape, &v).unwrap(),
        );
    }
    let x: Vec<f64> = (0..800).map(|i| ((i as f64) * 0.173).sin()).collect();
    let feeds = BTreeMap::from([(
        "x".to_string(),
        TensorData::from_f64_slice(DType::F32, vec![1, 8, 10, 10], &x).unwrap(),
    )]);
    let got = CpuBackend::new().compile(&g, &weights).unwrap().run(&feeds).unwrap();
    let want = oar_backend_reference::run_graph(&g, &weights, &feeds).unwrap();
    let (a, b) = (got[0].1.to_f64_vec(), want[0].1.to_f64_vec());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
    assert!(scale > 0.5, "a result that tests something: {scale}");
    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
        // One product and one sum per element instead of the normalization's four operations.
        assert!((p - q).abs() <= 1e-5 * scale, "y[{i}] = {p}, reference {q}");
    }
}
