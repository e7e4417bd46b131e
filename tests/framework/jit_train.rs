//! Whole training steps traced into one graph: N static steps give the same parameters as N
//! eager steps (≤ 1e-5 relative, f32) for SGD-momentum and AdamW.

use oar::jit::{InputSpec, to_static_train_step};
use oar::nn::functional::cross_entropy;
use oar::nn::{Layer, Linear, ReLU, Reduction, Sequential};
use oar::optimizer::{AdamW, Momentum, Optimizer};
use oar::{DType, Tensor};

fn mlp() -> Sequential {
    Sequential::new()
        .add(Linear::new(4, 8).unwrap())
        .add(ReLU)
        .add(Linear::new(8, 3).unwrap())
}

fn twin(a: &Sequential) -> Sequential {
    let b = mlp();
    b.set_state_dict(&a.state_dict().into_iter().map(|(k, t)| (k, t.data())).collect())
        .unwrap();
    b
}

fn max_rel(a: &Sequential, b: &Sequential) -> f64 {
    let mut worst = 0.0f64;
    for ((_, x), (_, y)) in a.state_dict().iter().zip(b.state_dict()) {
        for (p, q) in x.to_vec::<f32>().unwrap().iter().zip(y.to_vec::<f32>().unwrap()) {
            worst = worst.max(((p - q).abs() / (1.0 + q.abs())) as f64);
        }
    }
    worst
}

fn data(n: usize) -> (Tensor, Tensor) {
    let x = oar::randn(&[n, 4], DType::F32).unwrap();
    let y = Tensor::from_vec((0..n as i64).map(|i| i % 3).collect::<Vec<_>>(), &[n]).unwrap();
    (x, y)
}

fn check(make: impl Fn(&Sequential) -> Box<dyn Optimizer>, label: &str) {
    oar::seed(11);
    let eager = mlp();
    let staticm = twin(&eager);
    let mut opt_e = make(&eager);
    let mut opt_s = make(&staticm);
    let specs = [
        InputSpec::new(&[None, Some(4)], DType::F32, "x"),
        InputSpec::new(&[None], DType::I64, "y"),
    ];
    let step = to_static_train_step(&staticm, opt_s.as_mut(), &specs, |xs| {
        cross_entropy(&staticm.forward(&xs[0])?, &xs[1], Reduction::Mean)
    })
    .unwrap();
    let g = step.graph();
    assert!(
        g.outputs()
            .iter()
            .filter(|o| o.name.starts_with(oar::jit::STATE_PREFIX))
            .count()
            >= 4,
        "{g}"
    );
    assert!(
        g.params()
            .iter()
            .any(|(n, _)| n.starts_with(oar::optimizer::OPT_PREFIX)),
        "{g}"
    );
    // Adam's update is recorded as one op per parameter (the cpu backend runs it in one pass).
    if label == "adamw" {
        let text = g.to_string();
        assert_eq!(text.matches("adam_update").count(), staticm.parameters().len(), "{g}");
    }
    // Tracing changed nothing.
    assert_eq!(max_rel(&eager, &staticm), 0.0);
    for (i, n) in [8, 5, 8, 3, 8].into_iter().enumerate() {
        let (x, y) = data(n);
        let loss_e = cross_entropy(&eager.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
        loss_e.backward().unwrap();
        opt_e.step().unwrap();
        opt_e.clear_grad();
        let loss_s = step.call(&[&x, &y]).unwrap().remove(0);
        let (le, ls) = (loss_e.item().unwrap(), loss_s.item().unwrap());
        assert!(
            (le - ls).abs() <= 1e-5 * (1.0 + le.abs()),
            "{label} step {i}: loss {le} vs {ls}"
        );
        let d = max_rel(&eager, &staticm);
        assert!(d <= 1e-5, "{label} step {i}: parameters differ by {d}");
    }
    // Hand the optimizer state back to eager training; one more step each stays in lockstep.
    step.sync_optimizer(opt_s.as_mut()).unwrap();
    let (x, y) = data(6);
    for (m, opt) in [(&eager, &mut opt_e), (&staticm, &mut opt_s)] {
        let loss = cross_entropy(&m.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.clear_grad();
    }
    let d = max_rel(&eager, &staticm);
    assert!(d <= 1e-5, "{label} after sync: parameters differ by {d}");
}

#[test]
fn momentum_static_steps_match_eager() {
    check(
        |m| Box::new(Momentum::new(m.named_parameters(), 0.1).momentum(0.9)),
        "momentum",
    );
}

#[test]
fn nesterov_and_weight_decay() {
    check(
        |m| {
            Box::new(
                Momentum::new(m.named_parameters(), 0.05)
                    .momentum(0.8)
                    .use_nesterov(true)
                    .weight_decay(0.01),
            )
        },
        "nesterov",
    );
}

#[test]
fn adamw_static_steps_match_eager() {
    check(
        |m| Box::new(AdamW::new(m.named_parameters(), 0.01).weight_decay(0.05)),
        "adamw",
    );
}
