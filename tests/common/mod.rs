//! Helpers shared by the integration tests (each test binary uses a subset).
#![allow(dead_code)]

use oar::ir::TensorData;
use oar::{Tensor, no_grad};
use std::process::{Command, Output};

pub mod ptxas;

/// Run the `oar` binary.
pub fn oar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(args)
        .output()
        .expect("run oar")
}

/// A command's standard output.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's standard error.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failing command prints exactly one `error:` line and no panic.
pub fn assert_clean_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success: {err}");
    assert_eq!(err.lines().count(), 1, "one line expected: {err}");
    assert!(
        err.starts_with("error: ") && err.contains(needle),
        "{err:?} should mention {needle:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// Central differences of `loss` against backward for `entries` of the f64 tensor `p` (step
/// 1e-6, tolerance 1e-6 + 1e-5·|numeric|).
pub fn check_grad(p: &Tensor, entries: &[usize], loss: &dyn Fn() -> Tensor, what: &str) {
    p.clear_grad();
    loss().backward().unwrap();
    let g = p.grad().unwrap().to_vec::<f64>().unwrap();
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
