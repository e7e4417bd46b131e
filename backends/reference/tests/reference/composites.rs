//! Composite ops against hand-computed values or explicit formulas (tolerance 1e-6 rel).

use crate::common::*;
use oar_ir::ops::Reduction;
use oar_ir::ops::random_stream::uniform;
use oar_ir::ops::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm, Conv2d, CrossEntropy, Dropout, Gelu, LayerNorm,
    LogSoftmax, MaxPool2d, ScaledDotProductAttention, Softmax,
};
use oar_ir::{Composite, DType, Float, Op};

fn comp(c: Composite, ins: &[oar_ir::TensorData]) -> oar_ir::TensorData {
    op1(Op::Composite(c), ins)
}

#[test]
fn linear_with_and_without_bias() {
    let x = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let w = f32s(&[2, 3], &[1.0, 0.0, -1.0, 2.0, 1.0, 0.0]);
    let b = f32s(&[3], &[0.5, 0.0, -0.5]);
    let y = comp(Composite::Linear, &[x.clone(), w.clone(), b]);
    assert_close(&y, &[2, 3], &[5.5, 2.0, -1.5, 11.5, 4.0, -3.5], 0.0);
    let x3 = f32s(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
    assert_close(
        &comp(Composite::Linear, &[x3, w]),
        &[2, 1, 3],
        &[5.0, 2.0, -1.0, 11.0, 4.0, -3.0],
        0.0,
    );
}

#[test]
fn conv2d_adds_bias_per_channel() {
    let c = Composite::Conv2d(Conv2d {
        stride: [1, 1],
        padding: [0; 4],
        dilation: [1, 1],
        groups: 1,
    });
    let y = comp(
        c,
        &[
            f32s(&[1, 1, 2, 2], &[1.0; 4]),
            f32s(&[2, 1, 1, 1], &[2.0, 3.0]),
            f32s(&[2], &[1.0, -1.0]),
        ],
    );
    assert_close(&y, &[1, 2, 2, 2], &[3.0, 3.0, 3.0, 3.0, 2.0, 2.0, 2.0, 2.0], 0.0);
}

fn row(v: &[f64]) -> oar_ir::TensorData {
    f32s(&[1, 1, 1, v.len()], v)
}

#[test]
fn max_pool_ceil_mode_and_padding() {
    let x = row(&[1.0, 5.0, 2.0, 4.0, 3.0]);
    let mp = |kw, sw, padding, ceil_mode| {
        Composite::MaxPool2d(MaxPool2d {
            kernel: [1, kw],
            stride: [1, sw],
            padding,
            ceil_mode,
        })
    };
    assert_close(
        &comp(mp(2, 2, [0; 4], false), std::slice::from_ref(&x)),
        &[1, 1, 1, 2],
        &[5.0, 4.0],
        0.0,
    );
    assert_close(
        &comp(mp(2, 2, [0; 4], true), std::slice::from_ref(&x)),
        &[1, 1, 1, 3],
        &[5.0, 4.0, 3.0],
        0.0,
    );
    // Padding is -inf: windows [-1,2), [1,4), [3,6) clipped.
    assert_close(
        &comp(mp(3, 2, [0, 1, 0, 1], false), std::slice::from_ref(&x)),
        &[1, 1, 1, 3],
        &[5.0, 5.0, 4.0],
        0.0,
    );
    let neg = row(&[-3.0, -1.0]);
    assert_close(
        &comp(mp(3, 1, [0, 1, 0, 1], false), &[neg]),
        &[1, 1, 1, 2],
        &[-1.0, -1.0],
        0.0,
    );
    // 2-d window over a 4x4 input, 2x2 stride 2.
    let x2 = f32s(&[1, 1, 4, 4], &(0..16).map(f64::from).collect::<Vec<_>>());
    let c = Composite::MaxPool2d(MaxPool2d {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0; 4],
        ceil_mode: false,
    });
    assert_close(&comp(c, &[x2]), &[1, 1, 2, 2], &[5.0, 7.0, 13.0, 15.0], 0.0);
}

#[test]
fn avg_pool_count_include_pad_and_ceil_mode() {
    let x = row(&[1.0, 5.0, 2.0, 4.0, 3.0]);
    let ap = |kw, sw, padding, ceil_mode, count_include_pad| {
        Composite::AvgPool2d(AvgPool2d {
            kernel: [1, kw],
            stride: [1, sw],
            padding,
            ceil_mode,
            count_include_pad,
        })
    };
    let pad = [0, 1, 0, 1];
    assert_close(
        &comp(ap(3, 2, pad, false, true), std::slice::from_ref(&x)),
        &[1, 1, 1, 3],
        &[2.0, 11.0 / 3.0, 7.0 / 3.0],
        1e-6,
    );
    assert_close(
        &comp(ap(3, 2, pad, false, false), std::slice::from_ref(&x)),
        &[1, 1, 1, 3],
        &[3.0, 11.0 / 3.0, 3.5],
        1e-6,
    );
    // PyTorch: avg_pool1d([1,5,2,4,6], 2, 2, ceil_mode=True) = [3, 3, 6] — the window hanging
    // past the end counts only what lies inside input + padding.
    let y = row(&[1.0, 5.0, 2.0, 4.0, 6.0]);
    assert_close(
        &comp(ap(2, 2, [0; 4], true, true), &[y]),
        &[1, 1, 1, 3],
        &[3.0, 3.0, 6.0],
        0.0,
    );
}

#[test]
fn adaptive_pools_use_pytorch_windows() {
    // in 5 → out 3: windows [0,2), [1,4), [3,5).
    let x = row(&[1.0, 5.0, 2.0, 4.0, 6.0]);
    let avg = comp(
        Composite::AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size: [1, 3] }),
        std::slice::from_ref(&x),
    );
    assert_close(&avg, &[1, 1, 1, 3], &[3.0, 11.0 / 3.0, 5.0], 1e-6);
    let max = comp(
        Composite::AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size: [1, 3] }),
        std::slice::from_ref(&x),
    );
    assert_close(&max, &[1, 1, 1, 3], &[5.0, 5.0, 6.0], 0.0);
    let x2 = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 6.0]);
    assert_close(
        &comp(
            Composite::AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size: [1, 1] }),
            &[x2],
        ),
        &[1, 1, 1, 1],
        &[3.0],
        0.0,
    );
}

#[test]
fn batch_norm_training_updates_running_stats() {
    // x[N=2, C=2, L=1]: channel 0 = (1, 3), channel 1 = (2, 6).
    let x = f32s(&[2, 2, 1], &[1.0, 2.0, 3.0, 6.0]);
    let scale = f32s(&[2], &[2.0, 1.0]);
    let bias = f32s(&[2], &[0.0, 1.0]);
    let rm = f32s(&[2], &[0.0, 0.0]);
    let rv = f32s(&[2], &[1.0, 1.0]);
    let c = Composite::BatchNorm(BatchNorm {
        epsilon: Float(0.0),
        momentum: Float(0.9),
        training: true,
    });
    let outs = try_op(Op::Composite(c), &[x.clone(), scale.clone(), bias.clone(), rm, rv]).unwrap();
    assert_eq!(outs.len(), 3);
    // Batch stats: mean (2, 4), biased var (1, 4).
    assert_close(&outs[0], &[2, 2, 1], &[-2.0, 0.0, 2.0, 2.0], 1e-6);
    assert_close(&outs[1], &[2], &[0.2, 0.4], 1e-6);
    assert_close(&outs[2], &[2], &[1.0, 1.3], 1e-6);
    let eval = Composite::BatchNorm(BatchNorm {
        epsilon: Float(0.0),
        momentum: Float(0.9),
        training: false,
    });
    let y = comp(
        eval,
        &[x, scale, bias, f32s(&[2], &[1.0, 2.0]), f32s(&[2], &[4.0, 1.0])],
    );
    assert_close(&y, &[2, 2, 1], &[0.0, 1.0, 2.0, 5.0], 1e-6);
}

#[test]
fn layer_norm_with_affine() {
    let x = f32s(&[2, 2], &[1.0, 3.0, 2.0, 2.0]);
    let c = Composite::LayerNorm(LayerNorm {
        normalized_ndim: 1,
        epsilon: Float(1e-5),
    });
    let y = comp(
        c.clone(),
        &[x.clone(), f32s(&[2], &[2.0, 3.0]), f32s(&[2], &[1.0, 1.0])],
    );
    let s = 1.0 / (1.0f64 + 1e-5).sqrt();
    assert_close(&y, &[2, 2], &[1.0 - 2.0 * s, 1.0 + 3.0 * s, 1.0, 1.0], 1e-6);
    let c2 = Composite::LayerNorm(LayerNorm {
        normalized_ndim: 2,
        epsilon: Float(0.0),
    });
    // Over all four values: mean 2, var 0.5.
    let z = comp(c2, &[x]);
    let r = 0.5f64.sqrt();
    assert_close(&z, &[2, 2], &[-1.0 / r, 1.0 / r, 0.0, 0.0], 1e-6);
}

#[test]
fn softmax_and_log_softmax_are_stable() {
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 1000.0, 1000.0, -1000.0]);
    let s = (-2.0f64).exp() + (-1.0f64).exp() + 1.0;
    let sm = comp(Composite::Softmax(Softmax { axis: 1 }), std::slice::from_ref(&x));
    assert_close(
        &sm,
        &[2, 3],
        &[(-2.0f64).exp() / s, (-1.0f64).exp() / s, 1.0 / s, 0.5, 0.5, 0.0],
        1e-6,
    );
    let ls = comp(Composite::LogSoftmax(LogSoftmax { axis: 1 }), std::slice::from_ref(&x));
    let l2 = 2.0f64.ln();
    assert_close(
        &ls,
        &[2, 3],
        &[-2.0 - s.ln(), -1.0 - s.ln(), -s.ln(), -l2, -l2, -2000.0 - l2],
        1e-6,
    );
    let col = comp(Composite::Softmax(Softmax { axis: 0 }), &[f32s(&[2, 1], &[0.0, 0.0])]);
    assert_close(&col, &[2, 1], &[0.5, 0.5], 0.0);
}

#[test]
fn cross_entropy_by_hand_and_label_errors() {
    let logits = f32s(&[2, 3], &[1.0, 2.0, 3.0, 1.0, 1.0, 1.0]);
    let labels = i64s(&[2], &[2, 0]);
    let l0 = (1.0f64.exp() + 2.0f64.exp() + 3.0f64.exp()).ln() - 3.0;
    let l1 = 3.0f64.ln();
    let ce = |reduction| {
        comp(
            Composite::CrossEntropy(CrossEntropy { reduction }),
            &[logits.clone(), labels.clone()],
        )
    };
    assert_close(&ce(Reduction::None), &[2], &[l0, l1], 1e-6);
    assert_close(&ce(Reduction::Sum), &[], &[l0 + l1], 1e-6);
    assert_close(&ce(Reduction::Mean), &[], &[(l0 + l1) / 2.0], 1e-6);
    for bad in [3, -1] {
        let e = op_err(
            Op::Composite(Composite::CrossEntropy(CrossEntropy {
                reduction: Reduction::Mean,
            })),
            &[logits.clone(), i64s(&[2], &[0, bad])],
        );
        assert!(
            e.contains("cross_entropy") && e.contains(&format!("label {bad}")),
            "{e}"
        );
    }
}

#[test]
fn activations() {
    let x = f32s(&[4], &[-1.0, 0.0, 1.0, f64::NAN]);
    assert_close(
        &comp(Composite::Relu, std::slice::from_ref(&x)),
        &[4],
        &[0.0, 0.0, 1.0, f64::NAN],
        0.0,
    );
    assert_exact(
        &comp(Composite::Relu, &[tensor(DType::I32, &[2], &[-4.0, 4.0])]),
        DType::I32,
        &[2],
        &[0.0, 4.0],
    );
    let g = comp(Composite::Gelu(Gelu { approximate: false }), std::slice::from_ref(&x));
    assert_close(
        &g,
        &[4],
        &[-0.15865525393145707, 0.0, 0.8413447460685429, f64::NAN],
        1e-6,
    );
    let ga = comp(Composite::Gelu(Gelu { approximate: true }), std::slice::from_ref(&x));
    assert_close(
        &ga,
        &[4],
        &[-0.15880800939172324, 0.0, 0.8411919906082768, f64::NAN],
        1e-6,
    );
    let sg = 0.7310585786300049;
    assert_close(
        &comp(Composite::Sigmoid, std::slice::from_ref(&x)),
        &[4],
        &[1.0 - sg, 0.5, sg, f64::NAN],
        1e-6,
    );
    assert_close(
        &comp(Composite::Silu, std::slice::from_ref(&x)),
        &[4],
        &[-(1.0 - sg), 0.0, sg, f64::NAN],
        1e-6,
    );
    // Sigmoid saturates without overflow trouble.
    assert_close(
        &comp(Composite::Sigmoid, &[f32s(&[2], &[-1000.0, 1000.0])]),
        &[2],
        &[0.0, 1.0],
        0.0,
    );
}

#[test]
fn dropout_follows_the_documented_generator() {
    let n = 1000;
    let x = f32s(&[n], &vec![2.0; n]);
    let d = |training, seed| {
        comp(
            Composite::Dropout(Dropout {
                p: Float(0.25),
                training,
                seed,
            }),
            std::slice::from_ref(&x),
        )
    };
    let y = d(true, 42).to_f64_vec();
    for (i, &v) in y.iter().enumerate() {
        let keep = uniform(42, i as u64) >= 0.25;
        // Kept: x / (1 - p) rounded to f32.
        let want = if keep { (2.0f64 / 0.75) as f32 as f64 } else { 0.0 };
        assert_eq!(v, want, "{i}");
    }
    let dropped = y.iter().filter(|&&v| v == 0.0).count();
    assert!((200..300).contains(&dropped), "{dropped}");
    assert_eq!(d(true, 42), d(true, 42));
    assert_ne!(d(true, 42), d(true, 43));
    assert_eq!(d(false, 42), x);
}

#[test]
fn embedding_rows_and_index_errors() {
    let w = f32s(&[3, 2], &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
    let y = comp(Composite::Embedding, &[i64s(&[2, 2], &[2, 0, 1, 1]), w.clone()]);
    assert_close(&y, &[2, 2, 2], &[20.0, 21.0, 0.0, 1.0, 10.0, 11.0, 10.0, 11.0], 0.0);
    for bad in [3, -1] {
        let e = op_err(Op::Composite(Composite::Embedding), &[i64s(&[1], &[bad]), w.clone()]);
        assert!(e.contains("embedding") && e.contains(&format!("index {bad}")), "{e}");
    }
}

/// softmax(q kᵀ · scale + bias) v for q[L,E], k[S,E], v[S,Ev]; `bias` is -inf where masked.
fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (l, s, e, ev): (usize, usize, usize, usize),
    scale: f64,
    bias: &dyn Fn(usize, usize) -> f64,
) -> Vec<f64> {
    let mut out = vec![0.0; l * ev];
    for i in 0..l {
        let scores: Vec<f64> = (0..s)
            .map(|j| (0..e).map(|t| q[i * e + t] * k[j * e + t]).sum::<f64>() * scale + bias(i, j))
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = w.iter().sum();
        for c in 0..ev {
            out[i * ev + c] = (0..s).map(|j| w[j] / z * v[j * ev + c]).sum();
        }
    }
    out
}

#[test]
fn sdpa_matches_the_explicit_formula() {
    let (l, s, e, ev) = (2, 3, 2, 2);
    let r = |n, salt| -> Vec<f64> { (0..n).map(|i| (uniform(salt, i) * 2.0 - 1.0) as f32 as f64).collect() };
    let (q, k, v) = (r(4, 1), r(6, 2), r(6, 3));
    let t = |d: &[f64], rows| f32s(&[1, rows, d.len() / rows], d);
    let ins = [t(&q, l), t(&k, s), t(&v, s)];
    let dims = (l, s, e, ev);
    let plain = comp(
        Composite::ScaledDotProductAttention(ScaledDotProductAttention {
            causal: false,
            scale: None,
        }),
        &ins,
    );
    assert_close(
        &plain,
        &[1, 2, 2],
        &attention(&q, &k, &v, dims, 1.0 / 2f64.sqrt(), &|_, _| 0.0),
        1e-6,
    );
    let causal = comp(
        Composite::ScaledDotProductAttention(ScaledDotProductAttention {
            causal: true,
            scale: Some(Float(0.5)),
        }),
        &ins,
    );
    let want = attention(&q, &k, &v, dims, 0.5, &|i, j| {
        if j > i { f64::NEG_INFINITY } else { 0.0 }
    });
    assert_close(&causal, &[1, 2, 2], &want, 1e-6);
    // Bool mask (true keeps), broadcast from [L, S].
    let keep = [true, false, true, false, true, true];
    let mut with_mask = ins.to_vec();
    with_mask.push(bools(&[2, 3], &keep));
    let masked = comp(
        Composite::ScaledDotProductAttention(ScaledDotProductAttention {
            causal: false,
            scale: None,
        }),
        &with_mask,
    );
    let want = attention(&q, &k, &v, dims, 1.0 / 2f64.sqrt(), &|i, j| {
        if keep[i * 3 + j] { 0.0 } else { f64::NEG_INFINITY }
    });
    assert_close(&masked, &[1, 2, 2], &want, 1e-6);
    // Additive float mask.
    let add = [0.5, -1.0, 0.0, 2.0, 0.0, -0.5];
    with_mask[3] = f32s(&[2, 3], &add);
    let added = comp(
        Composite::ScaledDotProductAttention(ScaledDotProductAttention {
            causal: false,
            scale: None,
        }),
        &with_mask,
    );
    let want = attention(&q, &k, &v, dims, 1.0 / 2f64.sqrt(), &|i, j| add[i * 3 + j]);
    assert_close(&added, &[1, 2, 2], &want, 1e-6);
}
