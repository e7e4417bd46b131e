//! LSTM / GRU layers and cells against a plain-f64 reference written here (no oar ops), plus
//! finite-difference gradients, parameter names, train/eval dropout and typed errors.

use crate::common::check_grad;
use oar::Tensor;
use oar::ir::DType;
use oar::nn::{Direction, GRU, GRUCell, LSTM, LSTMCell, Layer};
use std::collections::BTreeMap;

const TOL: f64 = 1e-12;

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

/// Deterministic values in (-1, 1), so tests need no RNG of their own.
fn pattern(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 40503) % 1000) as f64 / 500.0 - 1.0) * 0.9)
        .collect()
}

fn params(l: &dyn Layer) -> BTreeMap<String, Vec<f64>> {
    l.named_parameters().into_iter().map(|(k, v)| (k, vals(&v))).collect()
}

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `w [rows, cols] · v + b`.
fn affine(w: &[f64], b: &[f64], v: &[f64]) -> Vec<f64> {
    let cols = v.len();
    b.iter()
        .enumerate()
        .map(|(r, bias)| bias + (0..cols).map(|c| w[r * cols + c] * v[c]).sum::<f64>())
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Lstm,
    Gru,
}

/// One step of the reference cell: `(h', c')` from `x`, `h`, `c` (c unused for GRU).
fn ref_step(kind: Kind, p: &[&Vec<f64>; 4], x: &[f64], h: &[f64], c: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let hs = h.len();
    let gx = affine(p[0], p[2], x);
    let gh = affine(p[1], p[3], h);
    match kind {
        Kind::Lstm => {
            let mut h2 = vec![0.0; hs];
            let mut c2 = vec![0.0; hs];
            for j in 0..hs {
                let g = |k: usize| gx[k * hs + j] + gh[k * hs + j];
                let (i, f, cand, o) = (sig(g(0)), sig(g(1)), g(2).tanh(), sig(g(3)));
                c2[j] = f * c[j] + i * cand;
                h2[j] = o * c2[j].tanh();
            }
            (h2, c2)
        }
        Kind::Gru => {
            let h2 = (0..hs)
                .map(|j| {
                    let r = sig(gx[j] + gh[j]);
                    let z = sig(gx[hs + j] + gh[hs + j]);
                    let n = (gx[2 * hs + j] + r * gh[2 * hs + j]).tanh();
                    (1.0 - z) * n + z * h[j]
                })
                .collect();
            (h2, vec![])
        }
    }
}

/// The whole stacked (bi)directional network on `x [N, T, I]`, flattened row-major; returns
/// `out [N, T, D·H]`, `h [L·D, N, H]`, `c [L·D, N, H]`.
#[allow(clippy::too_many_arguments)]
fn reference(
    kind: Kind,
    p: &BTreeMap<String, Vec<f64>>,
    x: &[f64],
    (n, t, i): (usize, usize, usize),
    hs: usize,
    layers: usize,
    dirs: usize,
    init: Option<(&[f64], &[f64])>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut input: Vec<Vec<Vec<f64>>> = (0..n)
        .map(|b| {
            (0..t)
                .map(|s| x[(b * t + s) * i..(b * t + s + 1) * i].to_vec())
                .collect()
        })
        .collect();
    let (mut hf, mut cf) = (vec![], vec![]);
    for l in 0..layers {
        let mut out = vec![vec![vec![]; t]; n];
        for d in 0..dirs {
            let sfx = format!("_l{l}{}", if d == 1 { "_reverse" } else { "" });
            let names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"];
            let w: Vec<&Vec<f64>> = names.iter().map(|k| &p[&format!("{k}{sfx}")]).collect();
            let w = [w[0], w[1], w[2], w[3]];
            let idx = l * dirs + d;
            for b in 0..n {
                let st = |src: &[f64]| src[(idx * n + b) * hs..(idx * n + b + 1) * hs].to_vec();
                let (mut h, mut c) = init.map_or((vec![0.0; hs], vec![0.0; hs]), |(h0, c0)| (st(h0), st(c0)));
                let order: Vec<usize> = if d == 0 {
                    (0..t).collect()
                } else {
                    (0..t).rev().collect()
                };
                for s in order {
                    let (h2, c2) = ref_step(kind, &w, &input[b][s], &h, &c);
                    out[b][s].extend(&h2);
                    h = h2;
                    c = c2;
                }
                hf.extend(h);
                cf.extend(c);
            }
        }
        input = out;
    }
    let out = input.into_iter().flatten().flatten().collect();
    (out, hf, cf)
}

#[test]
fn lstm_matches_reference_and_final_state_is_last_step() {
    let lstm = LSTM::new(2, 3).unwrap().dtype(DType::F64).unwrap();
    let x = pattern(2 * 3 * 2, 1);
    let (out, (h, c)) = lstm.forward_with_state(&t(&x, &[2, 3, 2]), None).unwrap();
    assert_eq!(
        (out.shape(), h.shape(), c.shape()),
        (vec![2, 3, 3], vec![1, 2, 3], vec![1, 2, 3])
    );
    let (ro, rh, rc) = reference(Kind::Lstm, &params(&lstm), &x, (2, 3, 2), 3, 1, 1, None);
    assert_close(&vals(&out), &ro, TOL, "out");
    assert_close(&vals(&h), &rh, TOL, "h");
    assert_close(&vals(&c), &rc, TOL, "c");
    // h is the output at the last step.
    assert_eq!(vals(&out.slice(1, 2, 3, 1).unwrap().reshape(&[-1]).unwrap()), vals(&h));
    // forward() is the output alone, and an explicit initial state is honored.
    assert_eq!(vals(&lstm.forward(&t(&x, &[2, 3, 2])).unwrap()), vals(&out));
    let (h0, c0) = (pattern(6, 2), pattern(6, 3));
    let (out2, (h2, c2)) = lstm
        .forward_with_state(&t(&x, &[2, 3, 2]), Some((&t(&h0, &[1, 2, 3]), &t(&c0, &[1, 2, 3]))))
        .unwrap();
    let (ro, rh, rc) = reference(Kind::Lstm, &params(&lstm), &x, (2, 3, 2), 3, 1, 1, Some((&h0, &c0)));
    assert_close(&vals(&out2), &ro, TOL, "out with state");
    assert_close(&vals(&h2), &rh, TOL, "h with state");
    assert_close(&vals(&c2), &rc, TOL, "c with state");
    assert!(vals(&out2) != vals(&out));
}

#[test]
fn gru_matches_reference() {
    let gru = GRU::new(2, 3).unwrap().dtype(DType::F64).unwrap();
    let x = pattern(12, 4);
    let h0 = pattern(6, 5);
    let (out, h) = gru
        .forward_with_state(&t(&x, &[2, 3, 2]), Some(&t(&h0, &[1, 2, 3])))
        .unwrap();
    let (ro, rh, _) = reference(Kind::Gru, &params(&gru), &x, (2, 3, 2), 3, 1, 1, Some((&h0, &h0)));
    assert_close(&vals(&out), &ro, TOL, "out");
    assert_close(&vals(&h), &rh, TOL, "h");
    assert_eq!(vals(&out.slice(1, 2, 3, 1).unwrap().reshape(&[-1]).unwrap()), vals(&h));
    let names: Vec<String> = gru.named_parameters().into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]);
    assert_eq!(gru.named_parameters()[0].1.shape(), vec![9, 2]);
}

#[test]
fn stacked_and_bidirectional_match_reference() {
    for kind in [Kind::Lstm, Kind::Gru] {
        for (layers, dir) in [
            (2, Direction::Forward),
            (1, Direction::Bidirect),
            (2, Direction::Bidirect),
        ] {
            let d = if dir == Direction::Bidirect { 2 } else { 1 };
            let x = pattern(2 * 3 * 2, 7);
            let xt = t(&x, &[2, 3, 2]);
            let (p, out, h, c) = match kind {
                Kind::Lstm => {
                    let l = LSTM::new(2, 3)
                        .unwrap()
                        .num_layers(layers)
                        .unwrap()
                        .direction(dir)
                        .unwrap();
                    let l = l.dtype(DType::F64).unwrap();
                    let (o, (h, c)) = l.forward_with_state(&xt, None).unwrap();
                    (params(&l), o, h, Some(c))
                }
                Kind::Gru => {
                    let l = GRU::new(2, 3).unwrap().dtype(DType::F64).unwrap();
                    let l = l.direction(dir).unwrap().num_layers(layers).unwrap();
                    let (o, h) = l.forward_with_state(&xt, None).unwrap();
                    (params(&l), o, h, None)
                }
            };
            assert_eq!(p.len(), 4 * layers * d);
            assert_eq!(p["weight_ih_l0"].len(), 3 * if kind == Kind::Lstm { 4 } else { 3 } * 2);
            if layers == 2 {
                // The second layer reads D·H features.
                assert_eq!(p["weight_ih_l1"].len(), p["weight_hh_l1"].len() * d);
            }
            let (ro, rh, rc) = reference(kind, &p, &x, (2, 3, 2), 3, layers, d, None);
            assert_eq!(out.shape(), vec![2, 3, 3 * d]);
            assert_eq!(h.shape(), vec![layers * d, 2, 3]);
            assert_close(&vals(&out), &ro, TOL, "out");
            assert_close(&vals(&h), &rh, TOL, "h");
            if let Some(c) = c {
                assert_close(&vals(&c), &rc, TOL, "c");
            }
            if d == 2 {
                assert!(p.contains_key(&format!("bias_hh_l{}_reverse", layers - 1)));
                // The reverse direction ends at step 0: its final h is the second half of out[:, 0].
                let back = out.slice(1, 0, 1, 1).unwrap().slice(2, 3, 6, 1).unwrap();
                let h_rev = h.get(-1).unwrap();
                assert_eq!(vals(&back.reshape(&[-1]).unwrap()), vals(&h_rev));
            }
        }
    }
}

#[test]
fn time_major_transposes_input_and_output() {
    let lstm = LSTM::new(2, 3).unwrap().dtype(DType::F64).unwrap();
    let x = t(&pattern(12, 9), &[2, 3, 2]);
    let batch_first = lstm.forward(&x).unwrap();
    let lstm = lstm.time_major(true);
    let tm = lstm.forward(&x.transpose(&[1, 0, 2]).unwrap()).unwrap();
    assert_eq!(tm.shape(), vec![3, 2, 3]);
    assert_eq!(vals(&tm.transpose(&[1, 0, 2]).unwrap()), vals(&batch_first));
}

#[test]
fn cells_match_one_reference_step() {
    let x = pattern(4, 11);
    let (h, c) = (pattern(6, 12), pattern(6, 13));
    let cell = LSTMCell::new(2, 3).unwrap().dtype(DType::F64).unwrap();
    let p = params(&cell);
    let w = [&p["weight_ih"], &p["weight_hh"], &p["bias_ih"], &p["bias_hh"]];
    let (h2, c2) = cell
        .step(&t(&x, &[2, 2]), Some((&t(&h, &[2, 3]), &t(&c, &[2, 3]))))
        .unwrap();
    for b in 0..2 {
        let (rh, rc) = ref_step(
            Kind::Lstm,
            &w,
            &x[b * 2..b * 2 + 2],
            &h[b * 3..b * 3 + 3],
            &c[b * 3..b * 3 + 3],
        );
        assert_close(&vals(&h2)[b * 3..b * 3 + 3], &rh, TOL, "lstm cell h");
        assert_close(&vals(&c2)[b * 3..b * 3 + 3], &rc, TOL, "lstm cell c");
    }
    let cell = GRUCell::new(2, 3).unwrap().dtype(DType::F64).unwrap();
    let p = params(&cell);
    let w = [&p["weight_ih"], &p["weight_hh"], &p["bias_ih"], &p["bias_hh"]];
    let h2 = cell.step(&t(&x, &[2, 2]), Some(&t(&h, &[2, 3]))).unwrap();
    for b in 0..2 {
        let (rh, _) = ref_step(Kind::Gru, &w, &x[b * 2..b * 2 + 2], &h[b * 3..b * 3 + 3], &[]);
        assert_close(&vals(&h2)[b * 3..b * 3 + 3], &rh, TOL, "gru cell h");
    }
    assert_eq!(p["weight_hh"].len(), 9 * 3);
    assert!(cell.step(&t(&x, &[2, 2]), Some(&t(&h, &[3, 2]))).is_err());
}

#[test]
fn init_is_uniform_within_one_over_sqrt_hidden() {
    oar::seed(3);
    let lstm = LSTM::new(5, 16).unwrap();
    let k = 1.0 / 4.0;
    for (name, p) in lstm.named_parameters() {
        assert_eq!(p.dtype(), DType::F32, "{name}");
        assert!(p.requires_grad(), "{name}");
        let v = p.to_vec::<f32>().unwrap();
        assert!(v.iter().all(|&x| (x as f64).abs() <= k), "{name}");
        assert!(v.iter().any(|&x| (x as f64).abs() > k / 2.0), "{name} spans the range");
    }
}

#[test]
fn lstm_and_gru_gradients_match_finite_differences() {
    let x = t(&pattern(12, 21), &[2, 3, 2]).requires_grad_(true).unwrap();
    let lstm = LSTM::new(2, 3).unwrap().num_layers(2).unwrap();
    let lstm = lstm.direction(Direction::Bidirect).unwrap().dtype(DType::F64).unwrap();
    let r_out = t(&pattern(36, 22), &[2, 3, 6]);
    let r_state = t(&pattern(24, 23), &[4, 2, 3]);
    let loss = || {
        let (o, (h, c)) = lstm.forward_with_state(&x, None).unwrap();
        let a = (&o * &r_out).unwrap().sum(&[], false).unwrap();
        let b = (&h * &r_state).unwrap().sum(&[], false).unwrap();
        let c = (&c * &r_state).unwrap().sum(&[], false).unwrap();
        (&(&a + &b).unwrap() + &c).unwrap()
    };
    let p: BTreeMap<String, Tensor> = lstm.named_parameters().into_iter().collect();
    check_grad(&p["weight_ih_l0"], &[0, 7, 23], &loss, "lstm weight_ih_l0");
    check_grad(
        &p["weight_hh_l1_reverse"],
        &[1, 20, 35],
        &loss,
        "lstm weight_hh_l1_reverse",
    );
    check_grad(&p["bias_ih_l1"], &[2, 11], &loss, "lstm bias_ih_l1");
    check_grad(&x, &[0, 5, 11], &loss, "lstm x");

    let h0 = t(&pattern(6, 24), &[1, 2, 3]).requires_grad_(true).unwrap();
    let gru = GRU::new(2, 3).unwrap().dtype(DType::F64).unwrap();
    let r = t(&pattern(18, 25), &[2, 3, 3]);
    let loss = || {
        let (o, h) = gru.forward_with_state(&x, Some(&h0)).unwrap();
        let a = (&o * &r).unwrap().sum(&[], false).unwrap();
        (&a + &h.sum(&[], false).unwrap()).unwrap()
    };
    let p: BTreeMap<String, Tensor> = gru.named_parameters().into_iter().collect();
    check_grad(&p["weight_ih_l0"], &[0, 9, 17], &loss, "gru weight_ih_l0");
    check_grad(&p["weight_hh_l0"], &[3, 14, 26], &loss, "gru weight_hh_l0");
    check_grad(&p["bias_hh_l0"], &[0, 4, 8], &loss, "gru bias_hh_l0 (inside r ∘ ·)");
    check_grad(&x, &[1, 6], &loss, "gru x");
    check_grad(&h0, &[0, 5], &loss, "gru h0");
}

#[test]
fn dropout_between_layers_only_in_training() {
    let mut lstm = LSTM::new(2, 8).unwrap().num_layers(2).unwrap().dropout(0.5).unwrap();
    let x = Tensor::from_vec(pattern(12, 31).iter().map(|&v| v as f32).collect(), &[2, 3, 2]).unwrap();
    let a = lstm.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let b = lstm.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_ne!(a, b, "training applies dropout");
    lstm.eval();
    assert!(!lstm.is_training());
    let a = lstm.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let b = lstm.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b);
    assert!(LSTM::new(2, 3).unwrap().dropout(1.0).is_err());
}

#[test]
fn bad_inputs_are_typed_errors_naming_layer_and_shapes() {
    let lstm = LSTM::new(2, 3).unwrap().dtype(DType::F64).unwrap();
    let e = lstm.forward(&t(&pattern(6, 1), &[3, 2])).unwrap_err().to_string();
    assert!(e.contains("LSTM") && e.contains("f64[3,2]"), "{e}");
    let e = lstm.forward(&t(&pattern(12, 1), &[2, 2, 3])).unwrap_err().to_string();
    assert!(
        e.contains("LSTM") && e.contains("input_size 2") && e.contains("f64[2,2,3]"),
        "{e}"
    );
    let x32 = Tensor::from_vec(vec![0f32; 12], &[2, 3, 2]).unwrap();
    let e = lstm.forward(&x32).unwrap_err().to_string();
    assert!(e.contains("f32[2,3,2]") && e.contains("f64"), "{e}");
    let e = lstm.forward(&t(&[], &[2, 0, 2])).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");
    let x = t(&pattern(12, 1), &[2, 3, 2]);
    let bad = t(&pattern(6, 1), &[2, 1, 3]);
    let good = t(&pattern(6, 1), &[1, 2, 3]);
    let e = lstm
        .forward_with_state(&x, Some((&bad, &good)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("LSTM") && e.contains("initial h") && e.contains("[1, 2, 3]"),
        "{e}"
    );
    let e = lstm
        .forward_with_state(&x, Some((&good, &bad)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("initial c"), "{e}");
    let gru = GRU::new(2, 3).unwrap();
    let e = gru.forward(&x).unwrap_err().to_string();
    assert!(e.contains("GRU") && e.contains("f32"), "{e}");
    assert!(LSTM::new(0, 3).is_err());
    assert!(GRU::new(2, 3).unwrap().num_layers(0).is_err());
    assert!(LSTM::new(2, 3).unwrap().dtype(DType::I32).is_err());
    let e = LSTMCell::new(2, 3).unwrap().forward(&x).unwrap_err().to_string();
    assert!(e.contains("LSTMCell") && e.contains("f32"), "{e}");
}

/// Give `to` (an f32 layer) the parameters of `from` (the same layer in f64).
fn copy_params(from: &dyn Layer, to: &dyn Layer) {
    for ((n64, p64), (n32, p32)) in from.named_parameters().into_iter().zip(to.named_parameters()) {
        assert_eq!(n64, n32);
        p32.set_data(p64.cast(DType::F32).unwrap().data()).unwrap();
    }
}

/// The output `o`, the input's gradient and every parameter's gradient of `l`, in f64, by name.
fn results(l: &dyn Layer, o: &Tensor, x: &Tensor) -> Vec<(String, Vec<f64>)> {
    let mut got = vec![("out".to_string(), o.clone()), ("x".into(), x.grad().unwrap())];
    for (name, p) in l.named_parameters() {
        got.push((name, p.grad().unwrap()));
    }
    got.into_iter()
        .map(|(k, v)| (k, vals(&v.cast(DType::F64).unwrap())))
        .collect()
}

/// f32 `got` within 1e-4 of f64 `want`, relative to each value's largest magnitude.
fn assert_f32_close(want: Vec<(String, Vec<f64>)>, got: Vec<(String, Vec<f64>)>) {
    for ((name, want), (_, got)) in want.into_iter().zip(got) {
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * scale.max(1.0),
                "{name}[{i}]: f32 {a} vs f64 {b}"
            );
        }
    }
}

/// The f32 LSTM — forward and gradient through the native `lstm_seq` kernels — against the
/// same layer in f64 (also native, checked by finite differences above): a two-layer
/// bidirectional stack with a hidden size off the vector width, given initial states, loss
/// on the output and the final states. Tolerance: 1e-4 relative to the largest value.
#[test]
fn lstm_in_f32_matches_f64() {
    let make = |dt: DType| {
        LSTM::new(5, 19)
            .unwrap()
            .num_layers(2)
            .unwrap()
            .direction(Direction::Bidirect)
            .unwrap()
            .dtype(dt)
            .unwrap()
    };
    let (l64, l32) = (make(DType::F64), make(DType::F32));
    copy_params(&l64, &l32);
    let h0 = t(&pattern(4 * 3 * 19, 32), &[4, 3, 19]);
    let c0 = t(&pattern(4 * 3 * 19, 33), &[4, 3, 19]);
    let r_out = t(&pattern(3 * 7 * 38, 34), &[3, 7, 38]);
    let r_state = t(&pattern(4 * 3 * 19, 35), &[4, 3, 19]);
    let run = |l: &LSTM, dt: DType| {
        let c = |x: &Tensor| x.cast(dt).unwrap();
        // A fresh leaf per run (a cast of a tensor that takes a gradient would not be one).
        let x = c(&t(&pattern(3 * 7 * 5, 31), &[3, 7, 5])).requires_grad_(true).unwrap();
        let (o, (h, cs)) = l.forward_with_state(&x, Some((&c(&h0), &c(&c0)))).unwrap();
        let a = (&o * &c(&r_out)).unwrap().sum(&[], false).unwrap();
        let b = (&h * &c(&r_state)).unwrap().sum(&[], false).unwrap();
        let d = (&cs * &c(&r_state)).unwrap().sum(&[], false).unwrap();
        (&(&a + &b).unwrap() + &d).unwrap().backward().unwrap();
        results(l, &o, &x)
    };
    assert_f32_close(run(&l64, DType::F64), run(&l32, DType::F32));
}

/// The f32 GRU — forward and gradient through the native `gru_seq` kernels — against the same
/// layer in f64: a two-layer bidirectional stack, given the initial state, loss on the output
/// and the final state. Tolerance: 1e-4 relative to the largest value.
#[test]
fn gru_in_f32_matches_f64() {
    let make = |dt: DType| {
        GRU::new(5, 19)
            .unwrap()
            .num_layers(2)
            .unwrap()
            .direction(Direction::Bidirect)
            .unwrap()
            .dtype(dt)
            .unwrap()
    };
    let (l64, l32) = (make(DType::F64), make(DType::F32));
    copy_params(&l64, &l32);
    let h0 = t(&pattern(4 * 3 * 19, 42), &[4, 3, 19]);
    let r_out = t(&pattern(3 * 7 * 38, 43), &[3, 7, 38]);
    let r_state = t(&pattern(4 * 3 * 19, 44), &[4, 3, 19]);
    let run = |l: &GRU, dt: DType| {
        let c = |x: &Tensor| x.cast(dt).unwrap();
        // A fresh leaf per run (a cast of a tensor that takes a gradient would not be one).
        let x = c(&t(&pattern(3 * 7 * 5, 41), &[3, 7, 5])).requires_grad_(true).unwrap();
        let (o, h) = l.forward_with_state(&x, Some(&c(&h0))).unwrap();
        let a = (&o * &c(&r_out)).unwrap().sum(&[], false).unwrap();
        let b = (&h * &c(&r_state)).unwrap().sum(&[], false).unwrap();
        (&a + &b).unwrap().backward().unwrap();
        results(l, &o, &x)
    };
    assert_f32_close(run(&l64, DType::F64), run(&l32, DType::F32));
}

/// `Layer::to_dtype(F64)` on layers built in f32 (it replaces the parameters' storage in
/// place): LSTM, GRU and both cells then take f64 inputs and states (and no longer f32 ones)
/// and give their f32 results, within 1e-5 of the largest value.
#[test]
fn to_dtype_f64_layers_take_f64_inputs_and_give_the_f32_results() {
    let x = t(&pattern(3 * 4 * 5, 51), &[3, 4, 5]);
    let h0 = t(&pattern(4 * 3 * 6, 52), &[4, 3, 6]);
    let c0 = t(&pattern(4 * 3 * 6, 53), &[4, 3, 6]);
    let f32 = |v: &Tensor| v.cast(DType::F32).unwrap();
    let f64s = |outs: &[Tensor]| -> Vec<f64> { outs.iter().flat_map(|o| vals(&o.cast(DType::F64).unwrap())).collect() };
    let assert_same = |want: Vec<f64>, got: Vec<f64>, what: &str| {
        let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
        assert_eq!(want.len(), got.len(), "{what}: lengths");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-5 * scale, "{what}[{i}]: f64 {a} vs f32 {b}");
        }
    };

    let lstm = LSTM::new(5, 6)
        .unwrap()
        .num_layers(2)
        .unwrap()
        .direction(Direction::Bidirect)
        .unwrap();
    let run_lstm = |x: &Tensor, h: &Tensor, c: &Tensor| {
        let (o, (h, c)) = lstm.forward_with_state(x, Some((h, c))).unwrap();
        f64s(&[o, h, c])
    };
    let want = run_lstm(&f32(&x), &f32(&h0), &f32(&c0));
    lstm.to_dtype(DType::F64).unwrap();
    assert_same(want, run_lstm(&x, &h0, &c0), "LSTM");
    let e = lstm.forward(&f32(&x)).unwrap_err().to_string();
    assert!(e.contains("dtype f64"), "{e}");

    let gru = GRU::new(5, 6)
        .unwrap()
        .num_layers(2)
        .unwrap()
        .direction(Direction::Bidirect)
        .unwrap();
    let run_gru = |x: &Tensor, h: &Tensor| {
        let (o, h) = gru.forward_with_state(x, Some(h)).unwrap();
        f64s(&[o, h])
    };
    let want = run_gru(&f32(&x), &f32(&h0));
    gru.to_dtype(DType::F64).unwrap();
    assert_same(want, run_gru(&x, &h0), "GRU");
    assert!(gru.forward(&f32(&x)).is_err());

    let step_x = t(&pattern(3 * 5, 54), &[3, 5]);
    let (h, c) = (t(&pattern(3 * 6, 55), &[3, 6]), t(&pattern(3 * 6, 56), &[3, 6]));
    let cell = LSTMCell::new(5, 6).unwrap();
    let run_cell = |x: &Tensor, h: &Tensor, c: &Tensor| {
        let (h, c) = cell.step(x, Some((h, c))).unwrap();
        f64s(&[h, c])
    };
    let want = run_cell(&f32(&step_x), &f32(&h), &f32(&c));
    cell.to_dtype(DType::F64).unwrap();
    assert_same(want, run_cell(&step_x, &h, &c), "LSTMCell");

    let cell = GRUCell::new(5, 6).unwrap();
    let want = f64s(&[cell.step(&f32(&step_x), Some(&f32(&h))).unwrap()]);
    cell.to_dtype(DType::F64).unwrap();
    assert_same(want, f64s(&[cell.step(&step_x, Some(&h)).unwrap()]), "GRUCell");
}
