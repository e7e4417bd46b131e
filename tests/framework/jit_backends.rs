//! A static function picks its backend: the same traced layer (with a `#[oar::to_static]`
//! tensor-dependent branch) gives matching results on `reference` and `cpu`.

use oar::jit::{InputSpec, to_static, to_static_layer};
use oar::nn::{Layer, Linear, ReLU, Sequential};
use oar::{DType, Result, Tensor};

/// `relu(linear(x))`, doubled when its mean is positive, else minus one.
#[oar::to_static]
fn head(model: &Sequential, x: &Tensor) -> Result<Tensor> {
    let mut y = model.forward(x)?;
    if y.mean(&[], false)?.greater_than(&Tensor::scalar(0.0f32))? {
        y = y.scale(2.0, 0.0)?;
    } else {
        y = (&y - &Tensor::scalar(1.0f32))?;
    }
    Ok(y)
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

fn assert_close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        // f32 results; matmul summation order may differ between backends.
        assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs(), "{what}[{i}]: {x} vs {y}");
    }
}

#[test]
fn to_static_runs_on_the_backend_it_is_given() {
    oar::seed(5);
    let model = Sequential::new()
        .add(Linear::new(4, 6).unwrap())
        .add(ReLU)
        .add(Linear::new(6, 3).unwrap());
    let spec = InputSpec::new(&[None, Some(4)], DType::F32, "x");
    let _ng = oar::no_grad();
    let x = oar::randn(&[5, 4], DType::F32).unwrap();
    let eager = values(&head(&model, &x).unwrap());
    let mut results = Vec::new();
    for backend in ["reference", "cpu"] {
        let f = to_static(|xs| Ok(vec![head(&model, &xs[0])?]), std::slice::from_ref(&spec))
            .unwrap()
            .with_backend(backend)
            .unwrap();
        assert_eq!(f.backend(), backend);
        let got = values(&f.call(&[&x]).unwrap()[0]);
        assert_close(&got, &eager, backend);
        let layer = to_static_layer(&model, &spec).unwrap().with_backend(backend).unwrap();
        results.push(values(&layer.call(&[&x]).unwrap()[0]));
    }
    assert_close(&results[0], &results[1], "to_static_layer reference vs cpu");
    assert_close(
        &results[0],
        &values(&model.forward(&x).unwrap()),
        "to_static_layer vs eager",
    );
}

#[test]
fn an_unknown_backend_is_an_error_that_lists_the_registered_ones() {
    let f = to_static(
        |xs| Ok(vec![xs[0].clone()]),
        &[InputSpec::new(&[Some(2)], DType::F32, "x")],
    )
    .unwrap();
    let e = f
        .with_backend("no-such-device")
        .err()
        .expect("an unknown backend is an error")
        .to_string();
    assert!(
        e.contains("no-such-device") && e.contains("reference") && e.contains("cpu"),
        "{e}"
    );
}
