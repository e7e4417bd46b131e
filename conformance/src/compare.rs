//! Comparing a backend's outputs with the oracle's.

use super::{Mismatch, Status, Tolerance};
use oar_ir::tensor_data::read_as_f64;
use oar_ir::{DType, TensorData};

/// Errors of one output against the oracle.
#[derive(Default)]
struct Errors {
    max_abs: f64,
    max_rel: f64,
    /// Elements outside the tolerance.
    bad: usize,
    /// The worst element: (flat index, got, want, excess = error / allowed error).
    worst: Option<(usize, f64, f64, f64)>,
}

/// `index` (row-major) as a multi-index of `shape`.
fn unravel(mut index: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for (o, &d) in out.iter_mut().zip(shape).rev() {
        if d > 0 {
            *o = index % d;
            index /= d;
        }
    }
    out
}

fn float_errors(got: &TensorData, want: &TensorData, tol: Tolerance) -> Errors {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut e = Errors::default();
    for (i, (&g, &w)) in g.iter().zip(&w).enumerate() {
        let (ok, abs, allowed) = if w.is_nan() {
            (g.is_nan(), if g.is_nan() { 0.0 } else { f64::INFINITY }, 0.0)
        } else if w.is_infinite() || !g.is_finite() {
            (g == w, if g == w { 0.0 } else { f64::INFINITY }, 0.0)
        } else {
            let abs = (g - w).abs();
            let allowed = tol.atol + tol.rtol * w.abs();
            (abs <= allowed, abs, allowed)
        };
        e.max_abs = e.max_abs.max(abs);
        if w.abs() > tol.atol && w.is_finite() {
            e.max_rel = e.max_rel.max(abs / w.abs());
        } else if abs.is_infinite() {
            e.max_rel = f64::INFINITY;
        }
        if !ok {
            e.bad += 1;
            let excess = if allowed > 0.0 { abs / allowed } else { f64::INFINITY };
            if e.worst.is_none_or(|(_, _, _, x)| excess > x) {
                e.worst = Some((i, g, w, excess));
            }
        }
    }
    e
}

fn exact_errors(got: &TensorData, want: &TensorData) -> Errors {
    let size = got.dtype().size_bytes();
    let mut e = Errors::default();
    for (i, (g, w)) in got
        .bytes()
        .chunks_exact(size)
        .zip(want.bytes().chunks_exact(size))
        .enumerate()
    {
        if g != w {
            let (g, w) = (read_as_f64(got.dtype(), g), read_as_f64(want.dtype(), w));
            e.max_abs = e.max_abs.max((g - w).abs());
            if w != 0.0 {
                e.max_rel = e.max_rel.max((g - w).abs() / w.abs());
            }
            e.bad += 1;
            if e.worst.is_none() {
                e.worst = Some((i, g, w, f64::INFINITY));
            }
        }
    }
    e
}

/// Compare `got` with `want` output by output: same names, dtypes and shapes; exact values for
/// integer and bool outputs; floats within `tol(dtype)` (`|got − want| ≤ atol + rtol·|want|`,
/// NaN matches NaN, infinities match exactly).
pub(crate) fn compare(
    got: &[(String, TensorData)],
    want: &[(String, TensorData)],
    tol: &dyn Fn(DType) -> Option<Tolerance>,
) -> Status {
    let fail = |output: &str, detail: String| {
        Status::Fail(Mismatch {
            output: output.to_string(),
            detail,
            max_abs: f64::INFINITY,
            max_rel: f64::INFINITY,
        })
    };
    if got.len() != want.len() {
        return fail("-", format!("{} outputs, the oracle returns {}", got.len(), want.len()));
    }
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        if gn != wn {
            return fail(gn, format!("output named `{gn}`, the oracle's is `{wn}`"));
        }
        if g.dtype() != w.dtype() || g.shape() != w.shape() {
            return fail(gn, format!("got {}, want {}", g.tensor_type(), w.tensor_type()));
        }
        let t = tol(w.dtype());
        let e = match t {
            Some(t) => float_errors(g, w, t),
            None => exact_errors(g, w),
        };
        max_abs = max_abs.max(e.max_abs);
        max_rel = max_rel.max(e.max_rel);
        if let Some((i, gv, wv, _)) = e.worst {
            let how = match t {
                Some(t) => format!("rtol {:e}, atol {:e}", t.rtol, t.atol),
                None => "exact".to_string(),
            };
            return Status::Fail(Mismatch {
                output: gn.clone(),
                detail: format!(
                    "`{gn}`{:?}: got {gv}, want {wv} ({} of {} elements off, {how})",
                    unravel(i, w.shape()),
                    e.bad,
                    w.len()
                ),
                max_abs: e.max_abs,
                max_rel: e.max_rel,
            });
        }
    }
    Status::Pass { max_abs, max_rel }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32]) -> Vec<(String, TensorData)> {
        vec![("y".into(), TensorData::from_vec(vec![v.len()], v.to_vec()).unwrap())]
    }

    #[test]
    fn floats_within_tolerance_pass_and_outside_fail() {
        let tol = |_| Some(Tolerance::F32);
        assert!(matches!(
            compare(&t(&[1.0, 0.0, f32::NAN]), &t(&[1.00005, 5e-6, f32::NAN]), &tol),
            Status::Pass { .. }
        ));
        match compare(&t(&[1.0, 2.0, 3.0]), &t(&[1.0, 2.01, 3.0]), &tol) {
            Status::Fail(m) => assert!(m.detail.contains("[1]") && m.detail.contains("1 of 3"), "{}", m.detail),
            s => panic!("{s:?}"),
        }
        assert!(matches!(
            compare(&t(&[f32::INFINITY]), &t(&[f32::NEG_INFINITY]), &tol),
            Status::Fail(_)
        ));
        assert!(matches!(compare(&t(&[1.0]), &t(&[f32::NAN]), &tol), Status::Fail(_)));
        assert!(matches!(compare(&t(&[1.0, 2.0]), &t(&[1.0]), &tol), Status::Fail(_)));
    }

    #[test]
    fn integers_are_exact() {
        let a = vec![(
            "y".into(),
            TensorData::from_vec(vec![2, 2], vec![1i64, 2, 3, 4]).unwrap(),
        )];
        let b = vec![(
            "y".into(),
            TensorData::from_vec(vec![2, 2], vec![1i64, 2, 3, 5]).unwrap(),
        )];
        assert!(matches!(compare(&a, &a, &|_| None), Status::Pass { .. }));
        match compare(&a, &b, &|_| None) {
            Status::Fail(m) => assert!(
                m.detail.contains("[1, 1]") && m.detail.contains("exact"),
                "{}",
                m.detail
            ),
            s => panic!("{s:?}"),
        }
    }
}
