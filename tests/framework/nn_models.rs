//! Containers, initializers and loss layers: parameter paths, state_dict round trips,
//! train/eval recursion, initializer statistics, loss values by hand, errors.

use oar::nn::{self, *};
use oar::{DType, Tensor, sequential};

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn vals(x: &Tensor) -> Vec<f64> {
    x.to_vec::<f64>().unwrap()
}

fn model() -> Sequential {
    sequential![
        Conv2D::new(2, 4, 3).unwrap().padding(1),
        BatchNorm2D::new(4).unwrap(),
        ReLU::new(),
        sequential![Dropout::new(0.5).unwrap(), AdaptiveAvgPool2D::new(1)],
        Flatten::default(),
        Linear::new(4, 3).unwrap(),
    ]
}

#[test]
fn sequential_names_sublayers_by_index() {
    let m = model();
    assert_eq!(m.len(), 6);
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"]
    );
    let bufs: Vec<String> = m.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(bufs, ["1._mean", "1._variance"]);
    assert_eq!(m.parameters().len(), 6);
    assert!(m.parameters().iter().all(|p| p.requires_grad()));
    assert!(m.named_buffers().iter().all(|(_, b)| !b.requires_grad()));
    let y = m.forward(&oar::rand(&[2, 2, 5, 5], DType::F32).unwrap()).unwrap();
    assert_eq!(y.shape(), [2, 3]);
    // Built step by step, the same structure.
    let m2 = Sequential::new().add(Linear::new(2, 2).unwrap()).add(Tanh::new());
    assert_eq!(m2.len(), 2);
    assert!(Sequential::new().is_empty());
}

#[test]
fn train_and_eval_recurse_through_nested_containers() {
    let mut m = model();
    let flags = |m: &Sequential| -> Vec<bool> {
        let inner = m.get(3).unwrap();
        vec![
            m.is_training(),
            m.get(1).unwrap().is_training(),
            inner.is_training(),
            inner.sublayers()[0].1.is_training(),
        ]
    };
    assert_eq!(flags(&m), [true; 4]);
    m.eval();
    assert_eq!(flags(&m), [false; 4]);
    // In eval mode dropout is off and batch norm uses (unchanged) running stats: deterministic.
    let x = oar::rand(&[2, 2, 5, 5], DType::F32).unwrap();
    let before = m.state_dict();
    let (a, b) = (m.forward(&x).unwrap(), m.forward(&x).unwrap());
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let after = m.state_dict();
    for (k, v) in &before {
        assert_eq!(v.to_vec::<f32>().unwrap(), after[k].to_vec::<f32>().unwrap(), "{k}");
    }
    m.train();
    assert_eq!(flags(&m), [true; 4]);
}

#[test]
fn state_dict_round_trip_reproduces_the_model() {
    let mut a = model();
    // One training step's worth of running-stat updates, so buffers differ from defaults.
    a.forward(&oar::rand(&[3, 2, 5, 5], DType::F32).unwrap()).unwrap();
    let mut b = model();
    let state = a.state_dict().into_iter().map(|(k, v)| (k, v.data())).collect();
    b.set_state_dict(&state).unwrap();
    a.eval();
    b.eval();
    let x = oar::rand(&[2, 2, 5, 5], DType::F32).unwrap();
    assert_eq!(
        a.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        b.forward(&x).unwrap().to_vec::<f32>().unwrap()
    );
    // A state for another architecture is rejected and names the problem; nothing changes.
    let other = sequential![Linear::new(4, 3).unwrap()];
    let bad = other.state_dict().into_iter().map(|(k, v)| (k, v.data())).collect();
    let e = b.set_state_dict(&bad).unwrap_err().to_string();
    assert!(e.contains("missing `1._mean`") && e.contains("`0.weight`"), "{e}");
}

#[test]
fn sequential_errors_name_the_failing_layer() {
    let m = sequential![Linear::new(4, 3).unwrap(), ReLU::new(), Linear::new(4, 2).unwrap()];
    let e = m
        .forward(&oar::zeros(&[2, 4], DType::F32).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Sequential[2]") && e.contains("Linear(in_features=4, out_features=2)"),
        "{e}"
    );
    assert!(e.contains("f32[2,3]"), "{e}");
}

#[test]
fn initializers_fill_in_place_with_the_right_statistics() {
    use nn::init;
    assert_eq!(init::fans(&[3, 5]), (3, 5));
    assert_eq!(init::fans(&[8, 4, 3, 3]), (36, 72));
    assert_eq!(init::fans(&[7]), (7, 7));
    assert_eq!(init::fans(&[]), (1, 1));
    let w = oar::zeros(&[200, 300], DType::F64).unwrap();
    let stats = |w: &Tensor| {
        let v = vals(w);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        (mean, var.sqrt(), v.iter().fold(0.0f64, |m, x| m.max(x.abs())))
    };
    // Uniform(-a, a) has std a/√3; 60000 samples keep the estimates within ~1%.
    init::xavier_uniform(&w, 1.0).unwrap();
    let a = (6.0f64 / 500.0).sqrt();
    let (m, s, mx) = stats(&w);
    assert!(
        mx <= a && m.abs() < 0.01 * a && (s - a / 3f64.sqrt()).abs() < 0.02 * a,
        "{m} {s} {mx}"
    );
    init::xavier_normal(&w, 2.0).unwrap();
    let (_, s, _) = stats(&w);
    assert!((s - 2.0 * (2.0f64 / 500.0).sqrt()).abs() < 0.02 * s, "{s}");
    init::kaiming_uniform(&w, 0.0).unwrap();
    let (_, _, mx) = stats(&w);
    let bound = (6.0f64 / 200.0).sqrt();
    assert!(mx <= bound && mx > 0.95 * bound, "{mx}");
    init::kaiming_normal(&w, 0.0).unwrap();
    let (_, s, _) = stats(&w);
    assert!((s - (2.0f64 / 200.0).sqrt()).abs() < 0.02 * s, "{s}");
    init::normal(&w, 3.0, 0.5).unwrap();
    let (m, s, _) = stats(&w);
    assert!((m - 3.0).abs() < 0.01 && (s - 0.5).abs() < 0.01, "{m} {s}");
    init::uniform(&w, 1.0, 2.0).unwrap();
    assert!(vals(&w).iter().all(|v| (1.0..2.0).contains(v)));
    init::constant(&w, 0.25).unwrap();
    assert!(vals(&w).iter().all(|&v| v == 0.25));
    // Seeded initializers repeat; the tensor identity is kept (filled in place).
    let l = Linear::new(3, 4).unwrap();
    let id = l.weight().id();
    oar::seed(5);
    init::xavier_uniform(l.weight(), 1.0).unwrap();
    let first = l.weight().to_vec::<f32>().unwrap();
    oar::seed(5);
    init::xavier_uniform(l.weight(), 1.0).unwrap();
    assert_eq!(l.weight().to_vec::<f32>().unwrap(), first);
    assert_eq!(l.weight().id(), id);
    // Errors name the initializer.
    let ints = oar::zeros(&[2], DType::I64).unwrap();
    assert!(
        init::normal(&ints, 0.0, 1.0)
            .unwrap_err()
            .to_string()
            .contains("init.normal")
    );
    assert!(init::uniform(&w, 2.0, 1.0).is_err());
    assert!(init::normal(&w, 0.0, -1.0).is_err());
    assert!((init::calculate_gain("tanh", None).unwrap() - 5.0 / 3.0).abs() < 1e-15);
    assert!(init::calculate_gain("swish", None).is_err());
}

#[test]
fn loss_layers_match_hand_values() {
    let x = t(&[1.0, 2.0, -1.0, 0.5], &[2, 2]);
    let y = t(&[0.0, 2.0, 1.0, 1.0], &[2, 2]);
    // Squared errors 1, 0, 4, 0.25.
    assert_eq!(MSELoss::new().forward(&x, &y).unwrap().item().unwrap(), 5.25 / 4.0);
    let none = MSELoss::new().reduction(Reduction::None).forward(&x, &y).unwrap();
    assert_eq!(vals(&none), [1.0, 0.0, 4.0, 0.25]);
    // BCE with logits: −[y log σ(x) + (1−y) log(1−σ(x))].
    let s = |v: f64| 1.0 / (1.0 + (-v).exp());
    let targets = t(&[0.0, 1.0, 1.0, 0.25], &[2, 2]);
    let want: f64 = [(1.0, 0.0), (2.0, 1.0), (-1.0, 1.0), (0.5, 0.25)]
        .iter()
        .map(|&(x, y)| -(y * s(x).ln() + (1.0 - y) * (1.0 - s(x)).ln()))
        .sum();
    let got = BCEWithLogitsLoss::new()
        .reduction(Reduction::Sum)
        .forward(&x, &targets)
        .unwrap();
    assert!((got.item().unwrap() - want).abs() < 1e-12);
    // Large logits stay finite (the stable form).
    let big = BCEWithLogitsLoss::new().forward(&t(&[1000.0, -1000.0], &[2]), &t(&[0.0, 1.0], &[2]));
    assert_eq!(big.unwrap().item().unwrap(), 1000.0);
    // NLL picks −input[n, label[n]]; labels may be [N] or [N, 1].
    let logp = t(&[-0.1, -2.0, -3.0, -1.5, -0.7, -2.5], &[2, 3]);
    let labels = Tensor::from_vec(vec![0i64, 2], &[2, 1]).unwrap();
    assert_eq!(
        NLLLoss::new().forward(&logp, &labels).unwrap().item().unwrap(),
        (0.1 + 2.5) / 2.0
    );
    let ce_labels = Tensor::from_vec(vec![0i64, 1], &[2]).unwrap();
    let ce = CrossEntropyLoss::new()
        .reduction(Reduction::Sum)
        .forward(&x, &ce_labels);
    let lse = |a: f64, b: f64| (a.exp() + b.exp()).ln();
    let want = (lse(1.0, 2.0) - 1.0) + (lse(-1.0, 0.5) - 0.5);
    assert!((ce.unwrap().item().unwrap() - want).abs() < 1e-12);
    // Errors name the loss and the shapes.
    let e = MSELoss::new().forward(&x, &t(&[1.0; 3], &[3])).unwrap_err().to_string();
    assert!(
        e.contains("mse_loss") && e.contains("f64[2,2]") && e.contains("f64[3]"),
        "{e}"
    );
    let bad = Tensor::from_vec(vec![0i64, 3], &[2]).unwrap();
    let e = NLLLoss::new().forward(&logp, &bad).unwrap_err().to_string();
    assert!(e.contains("nll_loss") && e.contains("label 3"), "{e}");
    let e = CrossEntropyLoss::new().forward(&x, &labels).unwrap_err().to_string();
    assert!(
        e.contains("cross_entropy") && e.contains("label 2 is out of range for 2 classes"),
        "{e}"
    );
    let e = NLLLoss::new()
        .forward(&logp, &t(&[0.0, 1.0], &[2]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("integer label"), "{e}");
}
