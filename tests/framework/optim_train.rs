//! Optimizers minimizing least squares, gradient clipping, schedules, and state round trips.

use oar::optimizer::lr::{CosineAnnealingDecay, LRScheduler, LinearWarmup, StepDecay};
use oar::optimizer::{
    Adam, AdamW, ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue, Momentum, Optimizer, SGD, clip_grad_norm,
};
use oar::{DType, Tensor};

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol, "{what}: got {got:?}, want {want:?} (tol {tol})");
    }
}

/// A least-squares problem `min_w mean((X w - y)^2)` with an exact solution `w = [1, -2, 0.5]`.
struct Problem {
    x: Tensor,
    y: Tensor,
}

impl Problem {
    fn new(dtype: DType) -> Problem {
        oar::seed(3);
        let x = oar::randn(&[16, 3], dtype).unwrap();
        let w = Tensor::from_vec(vec![1.0, -2.0, 0.5], &[3, 1])
            .unwrap()
            .cast(dtype)
            .unwrap();
        let y = x.matmul(&w).unwrap();
        Problem { x, y }
    }

    fn loss(&self, w: &Tensor) -> Tensor {
        let d = (&self.x.matmul(w).unwrap() - &self.y).unwrap();
        (&d * &d).unwrap().mean(&[], false).unwrap()
    }

    /// One training step; returns the loss before the update.
    fn step(&self, w: &Tensor, opt: &mut dyn Optimizer) -> f64 {
        opt.clear_grad();
        let loss = self.loss(w);
        loss.backward().unwrap();
        opt.step().unwrap();
        loss.item().unwrap()
    }
}

fn weights(dtype: DType) -> Tensor {
    oar::zeros(&[3, 1], dtype).unwrap().requires_grad_(true).unwrap()
}

#[test]
fn every_optimizer_minimizes_least_squares() {
    type Make = fn(Tensor) -> Box<dyn Optimizer>;
    let cases: [(&str, Make, usize); 6] = [
        ("SGD", |w| Box::new(SGD::new(vec![w], 0.1)), 300),
        ("Momentum", |w| Box::new(Momentum::new(vec![w], 0.05)), 300),
        (
            "Nesterov",
            |w| Box::new(Momentum::new(vec![w], 0.05).use_nesterov(true)),
            300,
        ),
        ("Adam", |w| Box::new(Adam::new(vec![w], 0.05)), 400),
        ("AdamW", |w| Box::new(AdamW::new(vec![w], 0.05).weight_decay(1e-4)), 400),
        (
            "Adam+clip",
            |w| Box::new(Adam::new(vec![w], 0.05).grad_clip(ClipGradByGlobalNorm::new(1.0))),
            400,
        ),
    ];
    for dtype in [DType::F64, DType::F32] {
        let problem = Problem::new(dtype);
        for (name, make, steps) in cases {
            let w = weights(dtype);
            let mut opt = make(w.clone());
            let first = problem.step(&w, opt.as_mut());
            let mut last = first;
            for _ in 0..steps {
                last = problem.step(&w, opt.as_mut());
            }
            assert!(first > 1.0, "{name}: starting loss {first}");
            assert!(last < 1e-3, "{name} {dtype}: loss {first} -> {last}");
            let got = w.data().to_f64_vec();
            assert_close(&got, &[1.0, -2.0, 0.5], 0.05, name);
        }
    }
}

/// Two parameters with gradients [3, 4] and [12]: global norm 13.
fn two_params_with_grads() -> (Tensor, Tensor) {
    let a = oar::zeros(&[2], DType::F64).unwrap().requires_grad_(true).unwrap();
    let b = oar::zeros(&[1], DType::F64).unwrap().requires_grad_(true).unwrap();
    let ca = Tensor::from_slice(&[3.0, 4.0]);
    let cb = Tensor::from_slice(&[12.0]);
    let loss = (&(&a * &ca).unwrap().sum(&[], false).unwrap() + &(&b * &cb).unwrap().sum(&[], false).unwrap()).unwrap();
    loss.backward().unwrap();
    (a, b)
}

#[test]
fn global_norm_clipping_scales_all_gradients_together() {
    let (a, b) = two_params_with_grads();
    let mut opt = SGD::new(vec![a.clone(), b.clone()], 1.0).grad_clip(ClipGradByGlobalNorm::new(1.0));
    opt.step().unwrap();
    assert_close(&a.data().to_f64_vec(), &[-3.0 / 13.0, -4.0 / 13.0], 1e-12, "a");
    assert_close(&b.data().to_f64_vec(), &[-12.0 / 13.0], 1e-12, "b");
    assert_eq!(
        a.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![3.0, 4.0],
        ".grad() is left alone"
    );

    // Below the bound nothing is scaled.
    let (a, b) = two_params_with_grads();
    let mut opt = SGD::new(vec![a.clone(), b.clone()], 1.0).grad_clip(ClipGradByGlobalNorm::new(100.0));
    opt.step().unwrap();
    assert_close(&a.data().to_f64_vec(), &[-3.0, -4.0], 1e-12, "unclipped");

    let (a, b) = two_params_with_grads();
    let mut opt = SGD::new(vec![a.clone(), b], 1.0).grad_clip(ClipGradByGlobalNorm::new(-1.0));
    let e = opt.step().unwrap_err().to_string();
    assert!(e.contains("ClipGradByGlobalNorm"), "{e}");
}

#[test]
fn per_tensor_and_value_clipping() {
    let (a, b) = two_params_with_grads();
    let mut opt = SGD::new(vec![a.clone(), b.clone()], 1.0).grad_clip(ClipGradByNorm::new(2.0));
    opt.step().unwrap();
    // |[3,4]| = 5 -> scaled to norm 2; |[12]| = 12 -> 2
    assert_close(&a.data().to_f64_vec(), &[-1.2, -1.6], 1e-12, "by norm a");
    assert_close(&b.data().to_f64_vec(), &[-2.0], 1e-12, "by norm b");

    let (a, b) = two_params_with_grads();
    let mut opt = SGD::new(vec![a.clone(), b.clone()], 1.0).grad_clip(ClipGradByValue::new(-3.5, 3.5));
    opt.step().unwrap();
    assert_close(&a.data().to_f64_vec(), &[-3.0, -3.5], 1e-12, "by value a");
    assert_close(&b.data().to_f64_vec(), &[-3.5], 1e-12, "by value b");
}

#[test]
fn clip_grad_norm_rewrites_grads_and_returns_the_norm() {
    let (a, b) = two_params_with_grads();
    let unused = oar::zeros(&[2], DType::F64).unwrap().requires_grad_(true).unwrap();
    let norm = clip_grad_norm(&[a.clone(), b.clone(), unused.clone()], 6.5).unwrap();
    assert_close(&[norm], &[13.0], 1e-12, "norm");
    let coef = 6.5 / (13.0 + 1e-6);
    assert_close(
        &a.grad().unwrap().data().to_f64_vec(),
        &[3.0 * coef, 4.0 * coef],
        1e-12,
        "a.grad",
    );
    assert_close(&b.grad().unwrap().data().to_f64_vec(), &[12.0 * coef], 1e-12, "b.grad");
    assert!(unused.grad().is_none());
    // Under the bound: untouched.
    let (a, b) = two_params_with_grads();
    assert_close(
        &[clip_grad_norm(&[a.clone(), b], 20.0).unwrap()],
        &[13.0],
        1e-12,
        "norm",
    );
    assert_eq!(a.grad().unwrap().to_vec::<f64>().unwrap(), vec![3.0, 4.0]);
    assert!(clip_grad_norm(&[a], 0.0).is_err());
}

fn lr_sequence(s: &dyn LRScheduler, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let lr = s.get_lr();
            s.step();
            lr
        })
        .collect()
}

#[test]
fn schedules_produce_the_hand_computed_sequences() {
    let s = StepDecay::new(0.1, 2, 0.5).unwrap();
    assert_close(
        &lr_sequence(&s, 6),
        &[0.1, 0.1, 0.05, 0.05, 0.025, 0.025],
        1e-15,
        "StepDecay",
    );

    let s = CosineAnnealingDecay::new(1.0, 4, 0.0).unwrap();
    let c = (1.0 + std::f64::consts::FRAC_1_SQRT_2) / 2.0; // (1 + cos(pi/4)) / 2
    assert_close(
        &lr_sequence(&s, 6),
        &[1.0, c, 0.5, 1.0 - c, 0.0, 1.0 - c],
        1e-12,
        "Cosine",
    );
    let s = CosineAnnealingDecay::new(1.0, 2, 0.2).unwrap();
    assert_close(&lr_sequence(&s, 3), &[1.0, 0.6, 0.2], 1e-12, "Cosine eta_min");

    let s = LinearWarmup::new(0.5, 4, 0.0, 0.5).unwrap();
    assert_close(
        &lr_sequence(&s, 6),
        &[0.0, 0.125, 0.25, 0.375, 0.5, 0.5],
        1e-15,
        "Warmup const",
    );

    let inner = StepDecay::new(0.5, 2, 0.1).unwrap();
    let s = LinearWarmup::new(inner.clone(), 2, 0.1, 0.5).unwrap();
    assert_close(
        &lr_sequence(&s, 6),
        &[0.1, 0.3, 0.5, 0.5, 0.05, 0.05],
        1e-15,
        "Warmup step",
    );
    assert_eq!(inner.last_epoch(), 4, "the wrapped schedule follows, as in Paddle");

    assert!(StepDecay::new(0.1, 0, 0.5).is_err());
    assert!(CosineAnnealingDecay::new(0.1, 0, 0.0).is_err());
    assert!(LinearWarmup::new(f64::NAN, 2, 0.0, 0.1).is_err());
}

#[test]
fn optimizers_follow_a_shared_scheduler() {
    let p = Tensor::from_slice(&[0.0f64]).requires_grad_(true).unwrap();
    let sched = StepDecay::new(0.1, 1, 0.5).unwrap();
    let mut opt = SGD::new(vec![p.clone()], sched.clone());
    let mut expected = 0.0;
    for epoch in 0..4 {
        assert_close(&[opt.get_lr()], &[0.1 * 0.5f64.powi(epoch)], 1e-15, "get_lr");
        opt.clear_grad();
        (&p * 1.0).unwrap().sum(&[], false).unwrap().backward().unwrap();
        opt.step().unwrap();
        expected -= 0.1 * 0.5f64.powi(epoch);
        sched.step();
    }
    assert_close(&p.data().to_f64_vec(), &[expected], 1e-15, "p");
    assert_eq!(opt.lr_scheduler().unwrap().last_epoch(), 4);
    opt.set_lr(0.01);
    assert_eq!(opt.get_lr(), 0.01);
    assert!(opt.lr_scheduler().is_none());
}

/// Train `n` steps (stepping the scheduler each time).
fn train(problem: &Problem, w: &Tensor, opt: &mut dyn Optimizer, sched: &dyn LRScheduler, n: usize) {
    for _ in 0..n {
        problem.step(w, opt);
        sched.step();
    }
}

#[test]
fn restored_state_resumes_training_identically() {
    type Make = fn(Tensor, StepDecay) -> Box<dyn Optimizer>;
    let cases: [(&str, Make); 3] = [
        ("Adam", |w, s| {
            Box::new(Adam::new(vec![("w".to_string(), w)], s).weight_decay(1e-3))
        }),
        ("AdamW", |w, s| Box::new(AdamW::new(vec![("w".to_string(), w)], s))),
        ("Momentum", |w, s| {
            Box::new(Momentum::new(vec![("w".to_string(), w)], s).use_nesterov(true))
        }),
    ];
    for dtype in [DType::F32, DType::F64] {
        let problem = Problem::new(dtype);
        for (name, make) in cases {
            let w = weights(dtype);
            let sched = StepDecay::new(0.05, 3, 0.7).unwrap();
            let mut opt = make(w.clone(), sched.clone());
            train(&problem, &w, opt.as_mut(), &sched, 5);
            let state = opt.state_dict();
            let snapshot = w.data();
            train(&problem, &w, opt.as_mut(), &sched, 6);
            let continued = w.data();

            // A fresh optimizer and scheduler, state restored through a file.
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("opt.safetensors");
            oar::save(&state, &file).unwrap();
            let loaded = oar::load(&file).unwrap();
            assert_eq!(loaded, state, "{name}: the file round trip is exact");
            let w2 = weights(dtype);
            w2.set_data(snapshot.clone()).unwrap();
            let sched2 = StepDecay::new(0.05, 3, 0.7).unwrap();
            let mut opt2 = make(w2.clone(), sched2.clone());
            opt2.set_state_dict(&loaded).unwrap();
            assert_eq!(sched2.last_epoch(), 5, "{name}: scheduler epoch restored");
            train(&problem, &w2, opt2.as_mut(), &sched2, 6);
            assert_eq!(w2.data(), continued, "{name} {dtype}: resumed training differs");
            assert_eq!(opt2.state_dict(), opt.state_dict(), "{name}: states differ");

            // Without the state the continuation differs (so the comparison above means something).
            let w3 = weights(dtype);
            w3.set_data(snapshot.clone()).unwrap();
            let sched3 = StepDecay::new(0.05, 3, 0.7).unwrap();
            let mut opt3 = make(w3.clone(), sched3.clone());
            train(&problem, &w3, opt3.as_mut(), &sched3, 6);
            assert_ne!(w3.data(), continued, "{name}: a fresh optimizer should not match");
        }
    }
}

#[test]
fn set_state_dict_rejects_bad_state_and_changes_nothing() {
    let w = Tensor::from_slice(&[1.0f64, 2.0]).requires_grad_(true).unwrap();
    let mut opt = Adam::new(vec![w.clone()], 0.1);
    (&w * &w).unwrap().sum(&[], false).unwrap().backward().unwrap();
    opt.step().unwrap();
    let good = opt.state_dict();
    assert!(good.contains_key("@lr") && good.contains_key("param_0.moment2"));

    let mut unknown = good.clone();
    unknown.insert("param_9.moment1".into(), good["param_0.moment1"].clone());
    let e = opt.set_state_dict(&unknown).unwrap_err().to_string();
    assert!(e.contains("param_9"), "{e}");

    let mut wrong_shape = good.clone();
    wrong_shape.insert("param_0.moment1".into(), oar::ir::TensorData::scalar(1.0f64));
    let e = opt.set_state_dict(&wrong_shape).unwrap_err().to_string();
    assert!(e.contains("param_0.moment1") && e.contains("f64[2]"), "{e}");

    let mut incomplete = good.clone();
    incomplete.remove("param_0.step");
    let e = opt.set_state_dict(&incomplete).unwrap_err().to_string();
    assert!(e.contains("incomplete"), "{e}");

    let mut wrong_lr = good.clone();
    wrong_lr.insert("@lr_scheduler.last_epoch".into(), oar::ir::TensorData::scalar(3i64));
    assert!(opt.set_state_dict(&wrong_lr).is_err());

    let mut momentum_state = good.clone();
    momentum_state.insert("param_0.velocity".into(), good["param_0.moment1"].clone());
    let e = opt.set_state_dict(&momentum_state).unwrap_err().to_string();
    assert!(e.contains("velocity"), "{e}");

    assert_eq!(opt.state_dict(), good, "failed loads change nothing");
    let mut lr = good.clone();
    lr.insert("@lr".into(), oar::ir::TensorData::scalar(0.25f64));
    opt.set_state_dict(&lr).unwrap();
    assert_eq!(opt.get_lr(), 0.25);
}
