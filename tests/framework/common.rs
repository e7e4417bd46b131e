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
