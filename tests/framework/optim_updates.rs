//! Each optimizer's first updates against values computed by hand (literals) or by an
//! independent scalar re-implementation of the published update rule.

use oar::Tensor;
use oar::optimizer::{Adam, AdamW, ClipGradByGlobalNorm, Momentum, Optimizer, SGD};

fn param(v: &[f64]) -> Tensor {
    Tensor::from_slice(v).requires_grad_(true).unwrap()
}

fn param_f32(v: &[f32]) -> Tensor {
    Tensor::from_slice(v).requires_grad_(true).unwrap()
}

fn vals(p: &Tensor) -> Vec<f64> {
    p.data().to_f64_vec()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol, "{what}: got {got:?}, want {want:?} (tol {tol})");
    }
}

/// loss = sum(c * p): the gradient is `c` whatever `p` is.
fn linear_grad(p: &Tensor, c: &[f64]) {
    p.clear_grad();
    let c = Tensor::from_vec(c.to_vec(), &[c.len()])
        .unwrap()
        .cast(p.dtype())
        .unwrap();
    (p * &c).unwrap().sum(&[], false).unwrap().backward().unwrap();
}

/// loss = sum(p * p): the gradient is `2p`.
fn square_grad(p: &Tensor) {
    p.clear_grad();
    (p * p).unwrap().sum(&[], false).unwrap().backward().unwrap();
}

#[test]
fn sgd_first_three_updates() {
    let p = param(&[1.0, -2.0]);
    let mut opt = SGD::new(vec![p.clone()], 0.1);
    let want = [[0.95, -1.9], [0.9, -1.8], [0.85, -1.7]];
    for w in want {
        linear_grad(&p, &[0.5, -1.0]);
        opt.step().unwrap();
        assert_close(&vals(&p), &w, 1e-12, "sgd");
    }
    assert_eq!(opt.get_lr(), 0.1);
}

#[test]
fn sgd_l2_weight_decay_adds_coeff_times_param_to_the_gradient() {
    let p = param(&[1.0, -2.0]);
    let mut opt = SGD::new(vec![p.clone()], 0.1).weight_decay(0.5);
    // g' = c + 0.5 p; step 1: [0.5+0.5, -1-1] = [1, -2] -> p = [0.9, -1.8]
    // step 2: g' = [0.5+0.45, -1-0.9] = [0.95, -1.9] -> p = [0.805, -1.61]
    // step 3: g' = [0.5+0.4025, -1-0.805] = [0.9025, -1.805] -> p = [0.71475, -1.4295]
    for w in [[0.9, -1.8], [0.805, -1.61], [0.71475, -1.4295]] {
        linear_grad(&p, &[0.5, -1.0]);
        opt.step().unwrap();
        assert_close(&vals(&p), &w, 1e-12, "sgd l2");
    }
}

#[test]
fn momentum_first_three_updates() {
    let p = param(&[1.0, -2.0]);
    let mut opt = Momentum::new(vec![p.clone()], 0.1).momentum(0.9);
    // v = 0.9 v + g; p -= 0.1 v.  g = [0.5, -1]
    // v1 = [0.5, -1] p = [0.95, -1.9]; v2 = [0.95, -1.9] p = [0.855, -1.71];
    // v3 = [1.355, -2.71] p = [0.7195, -1.439]
    for w in [[0.95, -1.9], [0.855, -1.71], [0.7195, -1.439]] {
        linear_grad(&p, &[0.5, -1.0]);
        opt.step().unwrap();
        assert_close(&vals(&p), &w, 1e-12, "momentum");
    }
    let st = opt.state_dict();
    assert_close(&st["param_0.velocity"].to_f64_vec(), &[1.355, -2.71], 1e-12, "velocity");
}

#[test]
fn nesterov_momentum_first_three_updates() {
    let p = param(&[1.0]);
    let mut opt = Momentum::new(vec![p.clone()], 0.1).momentum(0.9).use_nesterov(true);
    // p -= 0.1 (g + 0.9 v) with v after its update; g = 0.5
    // v1 = 0.5 p = 1 - 0.1*0.95 = 0.905; v2 = 0.95 p = 0.905 - 0.1*1.355 = 0.7695;
    // v3 = 1.355 p = 0.7695 - 0.1*(0.5 + 1.2195) = 0.59755
    for w in [0.905, 0.7695, 0.59755] {
        linear_grad(&p, &[0.5]);
        opt.step().unwrap();
        assert_close(&vals(&p), &[w], 1e-12, "nesterov");
    }
}

/// Adam's hyperparameters for the reference.
struct Cfg {
    lr: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    l2: f64,
    coeff: f64,
}

/// PyTorch's Adam (and AdamW with `coeff`), written out per element.
fn adam_reference(p0: &[f64], steps: usize, c: Cfg) -> Vec<Vec<f64>> {
    let Cfg {
        lr,
        b1,
        b2,
        eps,
        l2,
        coeff,
    } = c;
    let mut p = p0.to_vec();
    let mut m = vec![0.0; p.len()];
    let mut v = vec![0.0; p.len()];
    let mut out = Vec::new();
    for t in 1..=steps {
        let t = t as i32;
        for i in 0..p.len() {
            let g = 2.0 * p[i] + l2 * p[i];
            p[i] -= lr * coeff * p[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let mhat = m[i] / (1.0 - b1.powi(t));
            let vhat = v[i] / (1.0 - b2.powi(t));
            p[i] -= lr * mhat / (vhat.sqrt() + eps);
        }
        out.push(p.clone());
    }
    out
}

#[test]
fn adam_first_update_by_hand_and_three_against_the_reference() {
    let p = param(&[1.0, -2.0]);
    let mut opt = Adam::new(vec![p.clone()], 0.1).beta1(0.9).beta2(0.99).epsilon(0.1);
    // g = 2p = [2, -4]; m = [0.2, -0.4]; v = [0.04, 0.16]; m̂ = [2, -4]; v̂ = [4, 16]
    // p = [1 - 0.1*2/(2+0.1), -2 + 0.1*4/(4+0.1)]
    square_grad(&p);
    opt.step().unwrap();
    assert_close(&vals(&p), &[1.0 - 0.2 / 2.1, -2.0 + 0.4 / 4.1], 1e-12, "adam step 1");
    let reference = adam_reference(
        &[1.0, -2.0],
        3,
        Cfg {
            lr: 0.1,
            b1: 0.9,
            b2: 0.99,
            eps: 0.1,
            l2: 0.0,
            coeff: 0.0,
        },
    );
    for want in &reference[1..] {
        square_grad(&p);
        opt.step().unwrap();
        assert_close(&vals(&p), want, 1e-12, "adam");
    }
    let st = opt.state_dict();
    assert_eq!(st["param_0.step"].to_vec::<i64>().unwrap(), vec![3]);
}

#[test]
fn adam_l2_weight_decay_matches_the_reference() {
    let p = param(&[1.0, -2.0]);
    let mut opt = Adam::new(vec![p.clone()], 0.05).weight_decay(0.3);
    let reference = adam_reference(
        &[1.0, -2.0],
        3,
        Cfg {
            lr: 0.05,
            b1: 0.9,
            b2: 0.999,
            eps: 1e-8,
            l2: 0.3,
            coeff: 0.0,
        },
    );
    for want in &reference {
        square_grad(&p);
        opt.step().unwrap();
        assert_close(&vals(&p), want, 1e-12, "adam l2");
    }
}

#[test]
fn adamw_decays_decoupled_from_the_gradient() {
    let p = param(&[1.0, -2.0]);
    let mut opt = AdamW::new(vec![p.clone()], 0.1)
        .beta1(0.9)
        .beta2(0.99)
        .epsilon(0.1)
        .weight_decay(0.1);
    // p *= 1 - 0.1*0.1 = 0.99, then the Adam step of the first test (gradient of the old p).
    square_grad(&p);
    opt.step().unwrap();
    assert_close(&vals(&p), &[0.99 - 0.2 / 2.1, -1.98 + 0.4 / 4.1], 1e-12, "adamw step 1");
    let reference = adam_reference(
        &[1.0, -2.0],
        3,
        Cfg {
            lr: 0.1,
            b1: 0.9,
            b2: 0.99,
            eps: 0.1,
            l2: 0.0,
            coeff: 0.1,
        },
    );
    for want in &reference[1..] {
        square_grad(&p);
        opt.step().unwrap();
        assert_close(&vals(&p), want, 1e-12, "adamw");
    }
}

#[test]
fn adamw_default_coeff_is_paddles_0_01() {
    let p = param(&[1.0]);
    let mut opt = AdamW::new(vec![p.clone()], 0.1);
    square_grad(&p);
    opt.step().unwrap();
    // p*(1 - 0.001) - 0.1 * 2/(2 + 1e-8)
    assert_close(&vals(&p), &[0.999 - 0.1 * 2.0 / (2.0 + 1e-8)], 1e-12, "adamw default");
}

#[test]
fn f32_parameters_follow_the_f64_reference_within_f32_rounding() {
    let p = param_f32(&[1.0, -2.0]);
    let mut opt = Adam::new(vec![p.clone()], 0.1).beta1(0.9).beta2(0.99).epsilon(0.1);
    let reference = adam_reference(
        &[1.0, -2.0],
        3,
        Cfg {
            lr: 0.1,
            b1: 0.9,
            b2: 0.99,
            eps: 0.1,
            l2: 0.0,
            coeff: 0.0,
        },
    );
    for want in &reference {
        square_grad(&p);
        opt.step().unwrap();
        assert_eq!(p.dtype(), oar::DType::F32);
        assert_close(&vals(&p), want, 1e-6, "adam f32");
    }
    let st = opt.state_dict();
    assert_eq!(
        st["param_0.moment1"].dtype(),
        oar::DType::F32,
        "state is kept in the param's f32"
    );
}

#[test]
fn parameters_without_gradients_are_skipped() {
    let a = param(&[1.0]);
    let b = param(&[5.0]);
    let frozen = param(&[7.0]);
    let mut opt = Adam::new(vec![a.clone(), b.clone(), frozen.clone()], 0.1);
    linear_grad(&a, &[1.0]);
    linear_grad(&frozen, &[1.0]);
    frozen.set_stop_gradient(true).unwrap();
    opt.step().unwrap();
    assert!(vals(&a)[0] < 1.0);
    assert_eq!(vals(&b), vec![5.0], "no gradient: untouched");
    assert_eq!(vals(&frozen), vec![7.0], "stop_gradient: untouched");
    let st = opt.state_dict();
    assert!(st.contains_key("param_0.moment1"));
    assert!(!st.contains_key("param_1.moment1") && !st.contains_key("param_2.step"));
    // The skipped parameter's bias correction starts at its own first step.
    linear_grad(&b, &[1.0]);
    opt.clear_grad();
    linear_grad(&b, &[1.0]);
    opt.step().unwrap();
    assert_close(&vals(&b), &[5.0 - 0.1 / (1.0 + 1e-8)], 1e-12, "first step of b");
    assert_eq!(opt.state_dict()["param_1.step"].to_vec::<i64>().unwrap(), vec![1]);
}

#[test]
fn clear_grad_clears_every_parameter() {
    let a = param(&[1.0]);
    let opt = SGD::new(vec![a.clone()], 0.1);
    linear_grad(&a, &[1.0]);
    assert!(a.grad().is_some());
    opt.clear_grad();
    assert!(a.grad().is_none());
}

#[test]
fn bad_hyperparameters_are_errors_that_name_the_optimizer() {
    let p = param(&[1.0]);
    linear_grad(&p, &[1.0]);
    let e = Adam::new(vec![p.clone()], 0.1)
        .beta1(1.5)
        .step()
        .unwrap_err()
        .to_string();
    assert!(e.contains("Adam") && e.contains("beta1"), "{e}");
    let e = SGD::new(vec![p.clone()], -1.0).step().unwrap_err().to_string();
    assert!(e.contains("SGD") && e.contains("learning rate"), "{e}");
    let e = Momentum::new(vec![p.clone()], 0.1)
        .momentum(f64::NAN)
        .step()
        .unwrap_err()
        .to_string();
    assert!(e.contains("Momentum") && e.contains("momentum"), "{e}");
    let e = AdamW::new(vec![p.clone()], 0.1)
        .weight_decay(-1.0)
        .step()
        .unwrap_err()
        .to_string();
    assert!(e.contains("AdamW"), "{e}");
    let e = SGD::new(vec![("w".to_string(), p.clone()), ("w".to_string(), p.clone())], 0.1)
        .step()
        .unwrap_err()
        .to_string();
    assert!(e.contains("`w`"), "{e}");
    assert_eq!(vals(&p), vec![1.0], "a failed step changes nothing");
}

#[test]
fn minimize_backpropagates_and_steps() {
    let p = param(&[3.0]);
    let mut opt = SGD::new(vec![p.clone()], 0.25);
    let loss = (&p * &p).unwrap().sum(&[], false).unwrap();
    opt.minimize(&loss).unwrap();
    assert_close(&vals(&p), &[1.5], 1e-12, "minimize");
}

/// The in-place update of a parameter's own memory (no clipping) and the host-vector path
/// (taken with a clip bound no gradient reaches, which changes nothing) give the same bits;
/// a value read with `.data()` before a step keeps what it saw.
#[test]
fn in_place_updates_match_the_host_path_bit_for_bit() {
    let n = 70_001;
    let start: Vec<f32> = (0..n).map(|i| ((i * 53 % 997) as f32 - 498.0) / 300.0).collect();
    let run = |host: bool, momentum: bool| {
        let p = param_f32(&start);
        let mut opt: Box<dyn Optimizer> = match (momentum, host) {
            (true, true) => Box::new(Momentum::new(vec![p.clone()], 0.01).grad_clip(ClipGradByGlobalNorm::new(1e30))),
            (true, false) => Box::new(Momentum::new(vec![p.clone()], 0.01)),
            (false, true) => Box::new(
                AdamW::new(vec![p.clone()], 0.01)
                    .weight_decay(0.1)
                    .grad_clip(ClipGradByGlobalNorm::new(1e30)),
            ),
            (false, false) => Box::new(AdamW::new(vec![p.clone()], 0.01).weight_decay(0.1)),
        };
        let before = p.data();
        for _ in 0..3 {
            square_grad(&p);
            opt.step().unwrap();
        }
        assert_eq!(
            before.to_vec::<f32>().unwrap(),
            start,
            "a value read before the steps changed"
        );
        (p.data(), opt.state_dict())
    };
    for momentum in [false, true] {
        let (p1, s1) = run(true, momentum);
        let (p2, s2) = run(false, momentum);
        assert!(p1.bytes() == p2.bytes(), "parameter (momentum: {momentum})");
        assert_eq!(s1, s2, "state (momentum: {momentum})");
    }
}

/// A large parameter's update runs in chunks across threads: the result and the state are the
/// same bits as one call on one thread (AdamW and Momentum, an f32 parameter of 200 003
/// elements, so the last chunk is partial, three steps each).
#[test]
fn chunked_updates_across_threads_give_the_same_bits() {
    let n = 200_003;
    let start: Vec<f32> = (0..n).map(|i| ((i * 37 % 1000) as f32 - 500.0) / 250.0).collect();
    let run = |threads: usize, momentum: bool| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let p = param_f32(&start);
            let mut opt: Box<dyn Optimizer> = if momentum {
                Box::new(Momentum::new(vec![p.clone()], 0.01).use_nesterov(true))
            } else {
                Box::new(AdamW::new(vec![p.clone()], 0.01))
            };
            for _ in 0..3 {
                square_grad(&p);
                opt.step().unwrap();
            }
            (p.data(), opt.state_dict())
        })
    };
    for momentum in [false, true] {
        let (p1, s1) = run(1, momentum);
        let (p3, s3) = run(3, momentum);
        assert!(p1.bytes() == p3.bytes(), "parameter (momentum: {momentum})");
        assert_eq!(s1, s3, "state (momentum: {momentum})");
        assert_ne!(
            p1.to_f64_vec()[..10],
            start[..10].iter().map(|&x| x as f64).collect::<Vec<_>>()[..]
        );
    }
}

/// f32 parameters update in f32 arithmetic (vectorized, as PyTorch's optimizers) and f64 ones
/// in f64: five steps of SGD, Momentum (plain and Nesterov), Adam with L2 decay and AdamW on
/// the same values agree within f32 rounding (2e-6 relative), over a length with a partial
/// last block.
#[test]
fn f32_updates_match_the_f64_rule_within_rounding() {
    let n = 1_037;
    let start: Vec<f64> = (0..n).map(|i| ((i * 37 % 101) as f64 - 50.0) / 40.0).collect();
    type Make = fn(Tensor) -> Box<dyn Optimizer>;
    let makers: [(&str, Make); 5] = [
        ("sgd", |p| Box::new(SGD::new(vec![p], 0.05))),
        ("momentum", |p| Box::new(Momentum::new(vec![p], 0.05))),
        ("nesterov", |p| {
            Box::new(Momentum::new(vec![p], 0.05).use_nesterov(true))
        }),
        ("adam l2", |p| Box::new(Adam::new(vec![p], 0.01).weight_decay(0.1))),
        ("adamw", |p| Box::new(AdamW::new(vec![p], 0.01).weight_decay(0.1))),
    ];
    for (name, make) in makers {
        let run = |p: Tensor| {
            let mut opt = make(p.clone());
            for _ in 0..5 {
                square_grad(&p);
                opt.step().unwrap();
            }
            vals(&p)
        };
        let want = run(param(&start));
        let got = run(param_f32(&start.iter().map(|&v| v as f32).collect::<Vec<_>>()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 2e-6 * (1.0 + w.abs()),
                "{name}[{i}]: f32 {g} vs f64 {w}"
            );
        }
    }
}

/// The multi-tensor step (every f32 parameter's chunks in one parallel pass) gives the bits of
/// updating each parameter with an optimizer of its own — small parameters and ones of several
/// chunks and an empty one, three steps, states included; a tensor listed twice is updated twice (once per
/// entry, each with its own state), without waiting on itself.
#[test]
fn multi_tensor_step_matches_one_parameter_at_a_time() {
    let sizes = [3usize, 1000, 0, 70_001, 17];
    let start = |n: usize| -> Vec<f32> { (0..n).map(|i| ((i * 31 % 89) as f32 - 44.0) / 30.0).collect() };
    let joint: Vec<Tensor> = sizes.iter().map(|&n| param_f32(&start(n))).collect();
    let mut opt = AdamW::new(joint.clone(), 0.01).weight_decay(0.1);
    for _ in 0..3 {
        joint.iter().for_each(square_grad);
        opt.step().unwrap();
    }
    let state = opt.state_dict();
    for (k, &n) in sizes.iter().enumerate() {
        let p = param_f32(&start(n));
        let mut alone = AdamW::new(vec![p.clone()], 0.01).weight_decay(0.1);
        for _ in 0..3 {
            square_grad(&p);
            alone.step().unwrap();
        }
        assert!(
            p.data().bytes() == joint[k].data().bytes(),
            "parameter {k} ({n} elements)"
        );
        let own = alone.state_dict();
        for slot in ["moment1", "moment2", "step"] {
            assert_eq!(
                own[&format!("param_0.{slot}")],
                state[&format!("param_{k}.{slot}")],
                "{slot} of {k}"
            );
        }
    }
    let p = param_f32(&[1.0, -2.0]);
    let mut twice = SGD::new(vec![p.clone(), p.clone()], 0.1);
    square_grad(&p);
    twice.step().unwrap();
    // p − 0.1·2p, twice with the same gradient 2p: p − 0.4p.
    assert_close(&vals(&p), &[0.6, -1.2], 1e-6, "listed twice");
}

/// A half-precision parameter keeps f32 state (PyTorch's master-state dtype) and follows the
/// f64 update within its rounding: AdamW, three steps, bf16 and f16.
#[test]
fn half_parameters_keep_f32_state() {
    let start = [0.5f64, -1.25, 2.0, -0.75];
    let run = |dtype: oar::DType| {
        let p = Tensor::from_slice(&start)
            .cast(dtype)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let mut opt = AdamW::new(vec![p.clone()], 0.05).weight_decay(0.1);
        for _ in 0..3 {
            square_grad(&p);
            opt.step().unwrap();
        }
        (vals(&p.cast(oar::DType::F64).unwrap()), opt.state_dict())
    };
    let (want, _) = run(oar::DType::F64);
    for (dtype, tol) in [(oar::DType::BF16, 2e-2), (oar::DType::F16, 4e-3)] {
        let (got, state) = run(dtype);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{dtype}: {got:?} vs {want:?}");
        }
        assert_eq!(state["param_0.moment1"].dtype(), oar::DType::F32, "{dtype}");
        assert_eq!(state["param_0.moment2"].shape(), &[4], "{dtype}");
    }
}
