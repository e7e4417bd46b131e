//! MultiHeadAttention against a per-head plain-f64 reference; TransformerEncoderLayer (post- and
//! pre-norm) against a composition of functional ops; dropout in train/eval; Paddle names;
//! finite-difference gradients; typed errors.

use crate::common::check_grad;
use oar::Tensor;
use oar::ir::{DType, TensorData};
use oar::nn::functional as F;
use oar::nn::{Activation, Layer, MultiHeadAttention, TransformerEncoder, TransformerEncoderLayer};
use std::collections::BTreeMap;

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn vals(x: &Tensor) -> Vec<f64> {
    x.to_vec::<f64>().unwrap()
}

fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
    }
}

/// Deterministic values in (-1, 1).
fn pattern(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 40503) % 1000) as f64 / 500.0 - 1.0) * 0.9)
        .collect()
}

fn params(l: &dyn Layer) -> BTreeMap<String, Tensor> {
    l.named_parameters().into_iter().collect()
}

/// Paddle-layout projection of rows `x [R, in]` by `w [in, out]` + `b`.
fn proj(x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
    let (out, inp) = (b.len(), w.len() / b.len());
    x.chunks(inp)
        .flat_map(|row| (0..out).map(move |j| b[j] + (0..inp).map(|i| row[i] * w[i * out + j]).sum::<f64>()))
        .collect()
}

/// Multi-head attention by hand: `q [N, L, E]`, `k [N, S, kdim]`, `v [N, S, vdim]`;
/// `keep(b, h, l, s)` false excludes a key.
#[allow(clippy::too_many_arguments)]
fn mha_reference(
    p: &BTreeMap<String, Tensor>,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (n, l, s, e): (usize, usize, usize, usize),
    heads: usize,
    keep: &dyn Fn(usize, usize, usize, usize) -> bool,
) -> Vec<f64> {
    let w = |name: &str| vals(&p[name]);
    let qp = proj(q, &w("q_proj.weight"), &w("q_proj.bias"));
    let kp = proj(k, &w("k_proj.weight"), &w("k_proj.bias"));
    let vp = proj(v, &w("v_proj.weight"), &w("v_proj.bias"));
    let hd = e / heads;
    let mut merged = vec![0.0; n * l * e];
    for b in 0..n {
        for h in 0..heads {
            for i in 0..l {
                let qi = &qp[(b * l + i) * e + h * hd..(b * l + i) * e + (h + 1) * hd];
                let scores: Vec<Option<f64>> = (0..s)
                    .map(|j| {
                        let kj = &kp[(b * s + j) * e + h * hd..(b * s + j) * e + (h + 1) * hd];
                        let dot: f64 = qi.iter().zip(kj).map(|(a, c)| a * c).sum();
                        keep(b, h, i, j).then_some(dot / (hd as f64).sqrt())
                    })
                    .collect();
                let max = scores.iter().flatten().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|x| x.map_or(0.0, |x| (x - max).exp())).collect();
                let total: f64 = ex.iter().sum();
                for d in 0..hd {
                    merged[(b * l + i) * e + h * hd + d] = (0..s)
                        .map(|j| ex[j] / total * vp[(b * s + j) * e + h * hd + d])
                        .sum::<f64>();
                }
            }
        }
    }
    proj(&merged, &w("out_proj.weight"), &w("out_proj.bias"))
}

#[test]
fn mha_matches_per_head_reference_with_and_without_masks() {
    let (n, l, s, e, heads) = (2, 3, 4, 4, 2);
    let mha = MultiHeadAttention::new(e, heads)
        .unwrap()
        .kdim(5)
        .unwrap()
        .vdim(2)
        .unwrap();
    let mha = mha.dtype(DType::F64).unwrap();
    let p = params(&mha);
    // Non-zero biases so a missing bias would show.
    for (k, v) in &p {
        if k.ends_with("bias") {
            v.set_data(TensorData::from_vec(v.shape(), pattern(v.numel(), 77)).unwrap())
                .unwrap();
        }
    }
    let (q, k, v) = (pattern(n * l * e, 1), pattern(n * s * 5, 2), pattern(n * s * 2, 3));
    let (qt, kt, vt) = (t(&q, &[n, l, e]), t(&k, &[n, s, 5]), t(&v, &[n, s, 2]));
    let dims = (n, l, s, e);

    let out = mha.attend(&qt, &kt, &vt, None).unwrap();
    assert_eq!(out.shape(), vec![n, l, e]);
    let r = mha_reference(&p, &q, &k, &v, dims, heads, &|_, _, _, _| true);
    assert_close(&vals(&out), &r, 1e-12, "no mask");

    // A per-batch key-padding bool mask [N, 1, 1, S]: batch 1 ignores its last two keys.
    let pad = |b: usize, j: usize| !(b == 1 && j >= 2);
    let m: Vec<bool> = (0..n * s).map(|i| pad(i / s, i % s)).collect();
    let mask = Tensor::from_vec(m, &[n, 1, 1, s]).unwrap();
    let out = mha.attend(&qt, &kt, &vt, Some(&mask)).unwrap();
    let r = mha_reference(&p, &q, &k, &v, dims, heads, &|b, _, _, j| pad(b, j));
    assert_close(&vals(&out), &r, 1e-12, "padding mask");
    // The same mask as integers (Paddle: non-zero keeps) and as an additive float mask.
    let mi = Tensor::from_vec((0..n * s).map(|i| pad(i / s, i % s) as i64).collect(), &[n, 1, 1, s]).unwrap();
    assert_close(
        &vals(&mha.attend(&qt, &kt, &vt, Some(&mi)).unwrap()),
        &r,
        1e-12,
        "int mask",
    );
    let mf: Vec<f64> = (0..n * s)
        .map(|i| if pad(i / s, i % s) { 0.0 } else { -1e30 })
        .collect();
    let out_f = mha.attend(&qt, &kt, &vt, Some(&t(&mf, &[n, 1, 1, s]))).unwrap();
    assert_close(&vals(&out_f), &r, 1e-12, "additive mask");

    // A causal-like [L, S] mask that differs per query row, broadcast over batch and heads.
    let causal = |i: usize, j: usize| j <= i + 1;
    let m: Vec<bool> = (0..l * s).map(|x| causal(x / s, x % s)).collect();
    let out = mha
        .attend(&qt, &kt, &vt, Some(&Tensor::from_vec(m, &[l, s]).unwrap()))
        .unwrap();
    let r_causal = mha_reference(&p, &q, &k, &v, dims, heads, &|_, _, i, j| causal(i, j));
    assert_close(&vals(&out), &r_causal, 1e-12, "causal mask");
    assert!(vals(&out) != r, "masks change the result");
}

#[test]
fn mha_self_attention_names_and_shapes() {
    let mha = MultiHeadAttention::new(6, 3).unwrap().dtype(DType::F64).unwrap();
    let names: Vec<(String, Vec<usize>)> = mha
        .named_parameters()
        .into_iter()
        .map(|(k, v)| (k, v.shape()))
        .collect();
    let expect: Vec<(String, Vec<usize>)> = ["q_proj", "k_proj", "v_proj", "out_proj"]
        .iter()
        .flat_map(|p| [(format!("{p}.weight"), vec![6, 6]), (format!("{p}.bias"), vec![6])])
        .collect();
    assert_eq!(names, expect);
    assert_eq!((mha.embed_dim(), mha.num_heads()), (6, 3));
    let x = pattern(2 * 2 * 6, 5);
    let y = mha.forward(&t(&x, &[2, 2, 6])).unwrap();
    let r = mha_reference(&params(&mha), &x, &x, &x, (2, 2, 2, 6), 3, &|_, _, _, _| true);
    assert_close(&vals(&y), &r, 1e-12, "self-attention");
    // Paddle's Linear init: Xavier-uniform weights, zero biases.
    let w = vals(&params(&mha)["k_proj.weight"]);
    assert!(w.iter().all(|x| x.abs() <= 0.5f64.sqrt() + 1e-7) && w.iter().any(|x| x.abs() > 0.2));
    assert!(vals(&params(&mha)["k_proj.bias"]).iter().all(|&x| x == 0.0));
}

#[test]
fn mha_gradients_match_finite_differences() {
    let mha = MultiHeadAttention::new(4, 2).unwrap().dtype(DType::F64).unwrap();
    let x = t(&pattern(24, 8), &[2, 3, 4]).requires_grad_(true).unwrap();
    let m: Vec<bool> = (0..9).map(|i| i % 3 <= i / 3).collect();
    let mask = Tensor::from_vec(m, &[3, 3]).unwrap();
    let r = t(&pattern(24, 9), &[2, 3, 4]);
    let loss = || {
        let y = mha.attend(&x, &x, &x, Some(&mask)).unwrap();
        (&y * &r).unwrap().sum(&[], false).unwrap()
    };
    let p = params(&mha);
    check_grad(&p["q_proj.weight"], &[0, 5, 15], &loss, "q_proj.weight");
    check_grad(&p["k_proj.bias"], &[1, 3], &loss, "k_proj.bias");
    check_grad(&p["v_proj.weight"], &[2, 9], &loss, "v_proj.weight");
    check_grad(&p["out_proj.weight"], &[4, 11], &loss, "out_proj.weight");
    check_grad(&x, &[0, 7, 23], &loss, "x");
}

/// The encoder layer spelled out with functional ops and the names Paddle gives its parameters.
fn encoder_reference(p: &BTreeMap<String, Tensor>, x: &Tensor, heads: usize, pre: bool, gelu: bool) -> Tensor {
    let lin = |x: &Tensor, name: &str| {
        F::linear(x, &p[&format!("{name}.weight")], Some(&p[&format!("{name}.bias")])).unwrap()
    };
    let norm = |x: &Tensor, name: &str| {
        F::layer_norm(
            x,
            1,
            Some(&p[&format!("{name}.weight")]),
            Some(&p[&format!("{name}.bias")]),
            1e-5,
        )
        .unwrap()
    };
    let (n, l, e) = (x.shape()[0] as i64, x.shape()[1] as i64, x.shape()[2] as i64);
    let hd = e / heads as i64;
    let split = |y: Tensor| {
        y.reshape(&[n, l, heads as i64, hd])
            .unwrap()
            .transpose(&[0, 2, 1, 3])
            .unwrap()
    };
    let attn = |x: &Tensor| {
        let q = split(lin(x, "self_attn.q_proj"));
        let k = split(lin(x, "self_attn.k_proj"));
        let v = split(lin(x, "self_attn.v_proj"));
        let s = q
            .matmul(&k.t().unwrap())
            .unwrap()
            .scale(1.0 / (hd as f64).sqrt(), 0.0)
            .unwrap();
        let o = F::softmax(&s, -1).unwrap().matmul(&v).unwrap();
        lin(
            &o.transpose(&[0, 2, 1, 3]).unwrap().reshape(&[n, l, e]).unwrap(),
            "self_attn.out_proj",
        )
    };
    let ff = |x: &Tensor| {
        let h = lin(x, "linear1");
        let h = if gelu {
            F::gelu(&h, false).unwrap()
        } else {
            F::relu(&h).unwrap()
        };
        lin(&h, "linear2")
    };
    if pre {
        let x = (x + &attn(&norm(x, "norm1"))).unwrap();
        (&x + &ff(&norm(&x, "norm2"))).unwrap()
    } else {
        let x = norm(&(x + &attn(x)).unwrap(), "norm1");
        norm(&(&x + &ff(&x)).unwrap(), "norm2")
    }
}

/// Give every parameter distinct, non-trivial values (norm weights near 1, biases non-zero).
fn scramble(l: &dyn Layer) {
    for (i, (name, p)) in l.named_parameters().into_iter().enumerate() {
        let mut v = pattern(p.numel(), 100 + i as u64);
        if name.starts_with("norm") || name.contains(".norm") {
            v.iter_mut().for_each(|x| *x = 1.0 + 0.3 * *x);
        }
        p.set_data(TensorData::from_vec(p.shape(), v).unwrap()).unwrap();
    }
}

#[test]
fn encoder_layer_post_and_pre_norm_match_functional_composition() {
    let x = t(&pattern(2 * 3 * 4, 40), &[2, 3, 4]);
    for pre in [false, true] {
        for act in [Activation::Relu, Activation::Gelu] {
            let layer = TransformerEncoderLayer::new(4, 2, 8).unwrap().dropout(0.0).unwrap();
            let layer = layer.normalize_before(pre).activation(act).dtype(DType::F64).unwrap();
            scramble(&layer);
            let y = layer.forward(&x).unwrap();
            let r = encoder_reference(&params(&layer), &x, 2, pre, act == Activation::Gelu);
            assert_eq!(y.shape(), vec![2, 3, 4]);
            assert_close(&vals(&y), &vals(&r), 1e-12, &format!("pre={pre} act={act:?}"));
        }
    }
}

#[test]
fn encoder_layer_state_dict_keys_follow_paddle() {
    let layer = TransformerEncoderLayer::new(4, 2, 8).unwrap();
    let sd = layer.state_dict();
    let keys: Vec<&str> = sd.keys().map(|k| k.as_str()).collect();
    let mut expect = vec![
        "linear1.bias",
        "linear1.weight",
        "linear2.bias",
        "linear2.weight",
        "norm1.bias",
        "norm1.weight",
        "norm2.bias",
        "norm2.weight",
    ];
    for p in ["k_proj", "out_proj", "q_proj", "v_proj"] {
        expect.push(Box::leak(format!("self_attn.{p}.bias").into_boxed_str()));
        expect.push(Box::leak(format!("self_attn.{p}.weight").into_boxed_str()));
    }
    expect.sort();
    assert_eq!(keys, expect);
    assert_eq!(sd["linear1.weight"].shape(), vec![4, 8]);
    assert_eq!(sd["linear2.weight"].shape(), vec![8, 4]);
    assert_eq!(sd["norm1.weight"].to_vec::<f32>().unwrap(), vec![1.0; 4]);
    assert!(sd.values().all(|p| p.dtype() == DType::F32 && p.requires_grad()));
}

#[test]
fn eval_disables_every_dropout() {
    let x = t(&pattern(2 * 5 * 8, 41), &[2, 5, 8]);
    // Paddle's default dropout is 0.1 for all three places; make it large so training differs.
    let mut layer = TransformerEncoderLayer::new(8, 2, 16).unwrap().dropout(0.5).unwrap();
    layer = layer.dtype(DType::F64).unwrap();
    scramble(&layer);
    let a = vals(&layer.forward(&x).unwrap());
    let b = vals(&layer.forward(&x).unwrap());
    assert!(a != b, "training forwards differ");
    layer.eval();
    let a = vals(&layer.forward(&x).unwrap());
    let b = vals(&layer.forward(&x).unwrap());
    assert_eq!(a, b);
    let r = encoder_reference(&params(&layer), &x, 2, false, false);
    assert_close(&a, &vals(&r), 1e-12, "eval equals the dropout-free composition");
    // Attention-weight dropout alone also acts in training (and only there).
    let mut only_attn = TransformerEncoderLayer::new(8, 2, 16).unwrap().dropout(0.0).unwrap();
    only_attn = only_attn.attn_dropout(0.5).unwrap().dtype(DType::F64).unwrap();
    assert!(vals(&only_attn.forward(&x).unwrap()) != vals(&only_attn.forward(&x).unwrap()));
    only_attn.eval();
    assert_eq!(
        vals(&only_attn.forward(&x).unwrap()),
        vals(&only_attn.forward(&x).unwrap())
    );
    only_attn.train();
    assert!(vals(&only_attn.forward(&x).unwrap()) != vals(&only_attn.forward(&x).unwrap()));
}

#[test]
fn encoder_stacks_layers_and_final_norm() {
    let mut enc = TransformerEncoder::new(
        || TransformerEncoderLayer::new(4, 2, 8)?.dropout(0.3)?.dtype(DType::F64),
        2,
    )
    .unwrap()
    .with_norm()
    .unwrap();
    assert_eq!(enc.num_layers(), 2);
    scramble(&enc);
    let sd = enc.state_dict();
    assert!(sd.contains_key("layers.0.self_attn.q_proj.weight"));
    assert!(sd.contains_key("layers.1.linear2.bias"));
    assert!(sd.contains_key("norm.weight") && sd["norm.weight"].dtype() == DType::F64);
    assert_eq!(sd.len(), 2 * 16 + 2);
    enc.eval();
    let x = t(&pattern(24, 42), &[2, 3, 4]);
    let y = enc.forward(&x).unwrap();
    let p = params(&enc);
    let sub = |prefix: &str| -> BTreeMap<String, Tensor> {
        p.iter()
            .filter_map(|(k, v)| k.strip_prefix(prefix).map(|s| (s.to_string(), v.clone())))
            .collect()
    };
    let h = encoder_reference(&sub("layers.0."), &x, 2, false, false);
    let h = encoder_reference(&sub("layers.1."), &h, 2, false, false);
    let r = F::layer_norm(&h, 1, Some(&p["norm.weight"]), Some(&p["norm.bias"]), 1e-5).unwrap();
    assert_close(&vals(&y), &vals(&r), 1e-12, "encoder");
}

#[test]
fn bad_inputs_are_typed_errors_naming_layer_and_shapes() {
    let e = MultiHeadAttention::new(5, 2).err().unwrap().to_string();
    assert!(
        e.contains("MultiHeadAttention") && e.contains("5") && e.contains("2"),
        "{e}"
    );
    let mha = MultiHeadAttention::new(4, 2).unwrap().dtype(DType::F64).unwrap();
    let x = t(&pattern(24, 1), &[2, 3, 4]);
    let e = mha
        .forward(&t(&pattern(24, 1), &[2, 3, 4]).reshape(&[6, 4]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("MultiHeadAttention") && e.contains("f64[6,4]"), "{e}");
    let e = mha.forward(&t(&pattern(18, 1), &[2, 3, 3])).unwrap_err().to_string();
    assert!(e.contains("MultiHeadAttention") && e.contains("f64[2,3,3]"), "{e}");
    let k = t(&pattern(16, 1), &[2, 2, 4]);
    let e = mha.attend(&x, &k, &x, None).unwrap_err().to_string();
    assert!(e.contains("f64[2,2,4]") && e.contains("f64[2,3,4]"), "{e}");
    let bad_mask = Tensor::from_vec(vec![true; 6], &[3, 2]).unwrap();
    let e = mha.attend(&x, &x, &x, Some(&bad_mask)).unwrap_err().to_string();
    assert!(
        e.contains("attn_mask") && e.contains("bool[3,2]") && e.contains("[2, 2, 3, 3]"),
        "{e}"
    );
    let f32_mask = Tensor::from_vec(vec![0f32; 9], &[3, 3]).unwrap();
    assert!(mha.attend(&x, &x, &x, Some(&f32_mask)).is_err());
    assert!(mha.dropout(1.5).is_err());
    let layer = TransformerEncoderLayer::new(4, 2, 8).unwrap();
    let e = layer.forward(&t(&pattern(24, 1), &[2, 4, 3])).unwrap_err().to_string();
    assert!(e.contains("TransformerEncoderLayer") && e.contains("f64[2,4,3]"), "{e}");
    assert!(TransformerEncoderLayer::new(4, 3, 8).is_err());
    assert!(TransformerEncoderLayer::new(4, 2, 0).is_err());
    assert!(TransformerEncoder::new(|| TransformerEncoderLayer::new(4, 2, 8), 0).is_err());
}
