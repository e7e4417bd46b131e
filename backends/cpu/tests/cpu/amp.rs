//! Every op on AMP's allow list (`oar_passes::amp`, class `Low`) computed by the cpu backend in
//! f16 and bf16 against the reference in f32 on the same inputs: each op sample's f32 inputs
//! are rounded to the half dtype (so both sides see the same numbers), the half kernel's result
//! is compared with the f32 result. Tolerance, on the largest error relative to the largest
//! f32 output: f16 4e-3, bf16 3e-2 (the result's own rounding is 2^-11 / 2^-8; products
//! accumulate in f32 in both).

use oar_backend_cpu::CpuBackend;
use oar_ir::backend::Backend;
use oar_ir::ops::sample::{Sample, SampleRng, input};
use oar_ir::{DType, Graph, Op, TensorData, TensorType, Weights};
use oar_passes::amp::{AmpClass, default_class};
use std::collections::{BTreeMap, BTreeSet};

/// `op` as a one-op graph on inputs of these types.
fn one_op(op: &Op, types: &[TensorType]) -> Graph {
    let mut g = Graph::new("amp_op");
    let ins: Vec<_> = types
        .iter()
        .enumerate()
        .map(|(i, t)| g.add_input(&format!("x{i}"), t.clone()).unwrap())
        .collect();
    let outs = g.add_op(op.clone(), &ins).unwrap();
    for (i, v) in outs.into_iter().enumerate() {
        g.add_output(&format!("y{i}"), v).unwrap();
    }
    g
}

/// Samples of the allow-listed ops the op definitions do not list themselves (matmul and the
/// convolutions are sampled by the conformance kit's own cases).
fn extra_samples() -> Vec<Sample> {
    use oar_ir::Composite;
    use oar_ir::ops::{Conv, Conv2d, ScaledDotProductAttention};
    let f = |shape: &[usize]| input(DType::F32, shape);
    vec![
        Sample::new("matmul/batched", Op::MatMul, vec![f(&[2, 5, 37]), f(&[37, 6])]),
        Sample::new(
            "conv/2d_stride_groups",
            Op::Conv(Conv {
                stride: vec![2, 1],
                pad_before: vec![1, 1],
                pad_after: vec![0, 1],
                dilation: vec![1, 1],
                groups: 2,
            }),
            vec![f(&[1, 4, 9, 8]), f(&[6, 2, 3, 3])],
        ),
        Sample::new(
            "linear/bias",
            Op::Composite(Composite::Linear),
            vec![f(&[3, 33]), f(&[33, 7]), f(&[7])],
        ),
        Sample::new(
            "conv2d/bias",
            Op::Composite(Composite::Conv2d(Conv2d {
                stride: [1, 1],
                padding: [1, 1, 1, 1],
                dilation: [1, 1],
                groups: 1,
            })),
            vec![f(&[2, 3, 10, 10]), f(&[8, 3, 3, 3]), f(&[8])],
        ),
        Sample::new(
            "sdpa/causal",
            Op::Composite(Composite::ScaledDotProductAttention(ScaledDotProductAttention {
                causal: true,
                scale: None,
            })),
            vec![f(&[2, 9, 16]), f(&[2, 9, 16]), f(&[2, 9, 16])],
        ),
    ]
}

#[test]
fn allow_listed_ops_in_half_precision_match_f32() {
    let mut covered = BTreeSet::new();
    for sample in Op::all_samples().into_iter().chain(extra_samples()) {
        if default_class(&sample.op) != Some(AmpClass::Low) || sample.inputs.iter().any(|i| i.dtype != DType::F32) {
            continue;
        }
        let mut rng = SampleRng::for_case(&sample.name, 0);
        let drawn: Vec<TensorData> = sample
            .inputs
            .iter()
            .map(|i| i.domain.tensor(i.dtype, &i.shape, &mut rng))
            .collect();
        for (dtype, tol) in [(DType::F16, 4e-3), (DType::BF16, 3e-2)] {
            // The inputs rounded to the half dtype, and the same values in f32.
            let half: Vec<TensorData> = drawn
                .iter()
                .map(|t| TensorData::from_f64_slice(dtype, t.shape().to_vec(), &t.to_f64_vec()).unwrap())
                .collect();
            let wide: Vec<TensorData> = half
                .iter()
                .map(|t| TensorData::from_f64_slice(DType::F32, t.shape().to_vec(), &t.to_f64_vec()).unwrap())
                .collect();
            let feeds = |ts: &[TensorData]| -> BTreeMap<String, TensorData> {
                ts.iter()
                    .enumerate()
                    .map(|(i, t)| (format!("x{i}"), t.clone()))
                    .collect()
            };
            let g_half = one_op(
                &sample.op,
                &half.iter().map(TensorData::tensor_type).collect::<Vec<_>>(),
            );
            let g_wide = one_op(
                &sample.op,
                &wide.iter().map(TensorData::tensor_type).collect::<Vec<_>>(),
            );
            let got = CpuBackend::new()
                .compile(&g_half, &Weights::new())
                .and_then(|e| e.run(&feeds(&half)))
                .unwrap_or_else(|e| panic!("{} {dtype}: {e}", sample.name));
            let want = oar_backend_reference::run_graph(&g_wide, &Weights::new(), &feeds(&wide)).unwrap();
            for ((name, a), (_, b)) in got.iter().zip(&want) {
                assert_eq!(a.dtype(), dtype, "{} {name}", sample.name);
                let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
                let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-6);
                let err = a.iter().zip(&b).fold(0f64, |m, (x, y)| m.max((x - y).abs())) / scale;
                assert!(
                    err <= tol,
                    "{} {dtype} {name}: relative error {err:.2e} > {tol:e}",
                    sample.name
                );
            }
        }
        covered.insert(sample.op.name());
    }
    // The allow list's ops that have f32 samples are all here.
    for op in [
        "matmul",
        "conv",
        "linear",
        "conv2d",
        "conv_transpose",
        "einsum",
        "sdpa",
        "lstm_seq",
        "gru_seq",
    ] {
        assert!(
            covered.contains(op),
            "no f32 sample of {op} was checked (covered: {covered:?})"
        );
    }
}
