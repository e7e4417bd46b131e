//! Helpers shared by the framework tests.

use oar::ir::TensorData;
use oar::{Tensor, no_grad};

/// Central differences of `loss` against backward for `entries` of the f64 tensor `p` (step
/// 1e-6, tolerance 1e-6 + 1e-5·|numeric|). No gradient at all (nothing reached `p`) counts as
/// zeros.
pub fn check_grad(p: &Tensor, entries: &[usize], loss: &dyn Fn() -> Tensor, what: &str) {
    p.clear_grad();
    loss().backward().unwrap();
    let g = p
        .grad()
        .map_or_else(|| vec![0.0; p.numel()], |g| g.to_vec::<f64>().unwrap());
    let orig = p.to_vec::<f64>().unwrap();
    let h = 1e-6;
    for &k in entries {
        let eval = |d: f64| {
            let mut v = orig.clone();
            v[k] += d;
            p.set_data(TensorData::from_vec(p.shape(), v).unwrap()).unwrap();
            let _g = no_grad();
            loss().item().unwrap()
        };
        let numeric = (eval(h) - eval(-h)) / (2.0 * h);
        p.set_data(TensorData::from_vec(p.shape(), orig.clone()).unwrap())
            .unwrap();
        assert!(
            (numeric - g[k]).abs() <= 1e-6 + 1e-5 * numeric.abs(),
            "{what}[{k}]: backward {} vs finite difference {numeric}",
            g[k]
        );
    }
}

/// Overwrite `model`'s parameters from a generator of its own, so tests running beside this
/// one (which draw from oar's global generator) cannot change its starting point: matrices and
/// kernels uniform in ±1/√fan-in, biases zero, other vectors (norm scales) as they are.
pub fn deterministic(model: &dyn oar::nn::Layer, seed: u64) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for (name, p) in model.named_parameters() {
        let shape = p.shape();
        let n: usize = shape.iter().product();
        let values: Vec<f32> = if shape.len() >= 2 {
            let fan_in = if shape.len() == 2 { shape[0] } else { n / shape[0] };
            let b = 1.0 / (fan_in as f32).sqrt();
            (0..n).map(|_| rng.random_range(-b..b)).collect()
        } else if name.ends_with("bias") {
            vec![0.0; n]
        } else {
            continue;
        };
        p.set_data(oar::ir::TensorData::from_vec(shape, values).unwrap())
            .unwrap();
    }
}

/// The digits CNN: conv 1→16 3×3, relu, 2×2 max-pool, conv 16→32 3×3, relu, 2×2 max-pool,
/// linear 128→10.
pub fn digits_cnn() -> oar::nn::Sequential {
    oar::nn::Sequential::new()
        .add(oar::nn::Conv2D::new(1, 16, 3).unwrap().padding(1))
        .add(oar::nn::ReLU)
        .add(oar::nn::MaxPool2D::new(2).stride(2))
        .add(oar::nn::Conv2D::new(16, 32, 3).unwrap().padding(1))
        .add(oar::nn::ReLU)
        .add(oar::nn::MaxPool2D::new(2).stride(2))
        .add(oar::nn::Flatten::new(1, -1))
        .add(oar::nn::Linear::new(128, 10).unwrap())
}
