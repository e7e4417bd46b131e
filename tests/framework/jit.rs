//! to_static: traced graphs agree with eager code (values, gradients, batch-norm state) for a
//! layer zoo; one graph serves every batch size; save → load → fine-tune → save round trips.

use oar::jit::{InputSpec, TranslatedLayer, load, save, to_static, to_static_layer};
use oar::nn::functional::cross_entropy;
use oar::nn::{
    BatchNorm2D, Conv2D, Flatten, LSTM, Layer, Linear, MaxPool2D, ReLU, Reduction, Sequential, TransformerEncoderLayer,
};
use oar::optimizer::{Adam, Optimizer};
use oar::{DType, Tensor};

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.cast(DType::F64).unwrap(), b.cast(DType::F64).unwrap());
    a.to_vec::<f64>()
        .unwrap()
        .iter()
        .zip(b.to_vec::<f64>().unwrap())
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f64::max)
}

fn mlp() -> Sequential {
    Sequential::new()
        .add(Linear::new(4, 8).unwrap())
        .add(ReLU)
        .add(Linear::new(8, 3).unwrap())
}

#[test]
fn one_graph_serves_every_batch_size() {
    oar::seed(1);
    let model = mlp();
    let f = to_static_layer(&model, &InputSpec::new(&[None, Some(4)], DType::F32, "x")).unwrap();
    let g = f.graph();
    assert_eq!(g.input_specs()[0].1.to_string(), "f32[N,4]");
    assert_eq!(g.output_types()[0].to_string(), "f32[N,3]");
    assert_eq!(g.params().len(), 4, "{g}");
    let _ng = oar::no_grad();
    for n in [1, 3, 7] {
        let x = oar::randn(&[n, 4], DType::F32).unwrap();
        let eager = model.forward(&x).unwrap();
        let stat = f.call(&[&x]).unwrap().remove(0);
        assert!(max_rel_diff(&stat, &eager) < 1e-6, "batch {n}");
    }
    // A shape that does not match the spec is a clear error.
    let bad = oar::randn(&[2, 5], DType::F32).unwrap();
    let e = f.call(&[&bad]).unwrap_err().to_string();
    assert!(e.contains("f32[N,4]") && e.contains("f32[2,5]"), "{e}");
}

#[test]
fn static_gradients_equal_eager_gradients() {
    oar::seed(2);
    let model = mlp();
    let f = to_static_layer(&model, &InputSpec::new(&[None, Some(4)], DType::F32, "x")).unwrap();
    let x = oar::randn(&[5, 4], DType::F32).unwrap();
    let y = Tensor::from_vec(vec![0i64, 2, 1, 1, 0], &[5]).unwrap();
    let loss = cross_entropy(&model.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
    loss.backward().unwrap();
    let eager: Vec<Tensor> = model.parameters().iter().map(|p| p.grad().unwrap()).collect();
    model.clear_gradients();
    let loss = cross_entropy(&f.call(&[&x]).unwrap()[0], &y, Reduction::Mean).unwrap();
    loss.backward().unwrap();
    for (p, e) in model.parameters().iter().zip(&eager) {
        assert!(max_rel_diff(&p.grad().unwrap(), e) < 1e-6);
    }
}

#[test]
fn cnn_with_batch_norm_in_train_and_eval_mode() {
    oar::seed(3);
    let build = || {
        Sequential::new()
            .add(Conv2D::new(2, 4, 3).unwrap().padding(1))
            .add(BatchNorm2D::new(4).unwrap())
            .add(ReLU)
            .add(MaxPool2D::new(2))
            .add(Flatten::new(1, -1))
            .add(Linear::new(4 * 3 * 3, 5).unwrap())
    };
    let eager = build();
    let traced = build();
    traced
        .set_state_dict(&eager.state_dict().into_iter().map(|(k, t)| (k, t.data())).collect())
        .unwrap();
    let spec = InputSpec::new(&[None, Some(2), Some(6), Some(6)], DType::F32, "img");
    let f = to_static_layer(&traced, &spec).unwrap();
    assert!(
        f.graph()
            .outputs()
            .iter()
            .any(|o| o.name.starts_with(oar::jit::STATE_PREFIX))
    );
    let _ng = oar::no_grad();
    for n in [2, 3] {
        let x = oar::randn(&[n, 2, 6, 6], DType::F32).unwrap();
        let a = eager.forward(&x).unwrap();
        let b = f.call(&[&x]).unwrap().remove(0);
        assert!(max_rel_diff(&a, &b) < 1e-5, "train-mode output, batch {n}");
    }
    // Running statistics were updated identically by both.
    for ((k, a), (_, b)) in eager.named_buffers().iter().zip(traced.named_buffers()) {
        assert!(max_rel_diff(a, &b) < 1e-6, "{k}");
    }
    let (mut eager, mut traced) = (eager, traced);
    eager.eval();
    traced.eval();
    let f = to_static_layer(&traced, &spec).unwrap();
    let x = oar::randn(&[3, 2, 6, 6], DType::F32).unwrap();
    assert!(max_rel_diff(&eager.forward(&x).unwrap(), &f.call(&[&x]).unwrap()[0]) < 1e-5);
}

#[test]
fn lstm_and_transformer_encoder_layer() {
    oar::seed(4);
    let lstm = LSTM::new(3, 5).unwrap();
    let f = to_static_layer(&lstm, &InputSpec::new(&[None, Some(4), Some(3)], DType::F32, "seq")).unwrap();
    let _ng = oar::no_grad();
    for n in [1, 2] {
        let x = oar::randn(&[n, 4, 3], DType::F32).unwrap();
        assert!(max_rel_diff(&lstm.forward(&x).unwrap(), &f.call(&[&x]).unwrap()[0]) < 1e-5);
    }
    let mut enc = TransformerEncoderLayer::new(8, 2, 16).unwrap();
    enc.eval();
    let f = to_static_layer(&enc, &InputSpec::new(&[None, Some(5), Some(8)], DType::F32, "tokens")).unwrap();
    let x = oar::randn(&[3, 5, 8], DType::F32).unwrap();
    assert!(max_rel_diff(&enc.forward(&x).unwrap(), &f.call(&[&x]).unwrap()[0]) < 1e-5);
}

#[test]
fn save_load_fine_tune_save() {
    oar::seed(5);
    let dir = tempfile::tempdir().unwrap();
    let model = mlp();
    let spec = InputSpec::new(&[None, Some(4)], DType::F32, "x");
    save(&model, dir.path().join("m.oar"), &spec).unwrap();
    let mut loaded: TranslatedLayer = load(dir.path().join("m.oar")).unwrap();
    let x = oar::randn(&[16, 4], DType::F32).unwrap();
    {
        let _ng = oar::no_grad();
        assert!(max_rel_diff(&loaded.forward(&x).unwrap(), &model.forward(&x).unwrap()) < 1e-6);
    }
    assert_eq!(loaded.parameters().len(), 4);
    loaded.train();
    let y = Tensor::from_vec((0..16).map(|i| i % 3).collect::<Vec<i64>>(), &[16]).unwrap();
    let mut opt = Adam::new(loaded.parameters(), 0.05);
    let loss_of = |m: &TranslatedLayer| cross_entropy(&m.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
    let before = loss_of(&loaded).item().unwrap();
    for _ in 0..30 {
        let loss = loss_of(&loaded);
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.clear_grad();
    }
    let after = loss_of(&loaded).item().unwrap();
    assert!(
        after < 0.7 * before,
        "fine-tuning lowered the loss only from {before} to {after}"
    );
    loaded.save(dir.path().join("m2.oar")).unwrap();
    let again = load(dir.path().join("m2.oar")).unwrap();
    let _ng = oar::no_grad();
    assert!(max_rel_diff(&again.forward(&x).unwrap(), &loaded.forward(&x).unwrap()) < 1e-7);
}

/// A loaded model inside a traced function: its graph's batch size `N` binds to the caller's
/// symbolic dims (here `2*B`), so the trace serves every batch; its parameters keep the saved
/// layer's order; a shape that does not fit is a typed error naming the input, not a panic.
#[test]
fn a_loaded_layer_traces_inside_to_static() {
    oar::seed(8);
    let dir = tempfile::tempdir().unwrap();
    let model = mlp();
    let spec = InputSpec::new(&[None, Some(4)], DType::F32, "x");
    save(&model, dir.path().join("m.oar"), &spec).unwrap();
    let loaded = load(dir.path().join("m.oar")).unwrap();
    let names = |l: &dyn Layer| l.named_parameters().into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names(&loaded), names(&model));
    let outer = InputSpec::with_dims(
        vec![oar::Dim::sym("B"), oar::Dim::Static(2), oar::Dim::Static(4)],
        DType::F32,
        "x",
    );
    let f = to_static(
        |xs| {
            let b = xs[0].dims()[0].mul(&oar::Dim::Static(2)).unwrap();
            let flat = xs[0].reshape_dims(&[b, oar::Dim::Static(4)])?;
            Ok(vec![loaded.forward(&flat)?])
        },
        std::slice::from_ref(&outer),
    )
    .unwrap();
    assert_eq!(f.graph().output_types()[0].to_string(), "f32[2*B,3]", "{}", f.graph());
    let _ng = oar::no_grad();
    for b in [1usize, 3] {
        let x = oar::randn(&[b, 2, 4], DType::F32).unwrap();
        let want = model.forward(&x.reshape(&[2 * b as i64, 4]).unwrap()).unwrap();
        assert!(
            max_rel_diff(&f.call(&[&x]).unwrap().remove(0), &want) < 1e-6,
            "batch {b}"
        );
    }
    let wide = InputSpec::new(&[None, Some(5)], DType::F32, "x");
    let e = to_static(|xs| Ok(vec![loaded.forward(&xs[0])?]), &[wide])
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("input `x`") && e.contains("f32[N,4]") && e.contains("axis 1"),
        "{e}"
    );
}

#[test]
fn closures_and_errors() {
    let f = to_static(
        |xs| {
            let y = (&xs[0] * &xs[1])?;
            Ok(vec![y.sum(&[-1], false)?, y.exp()?])
        },
        &[
            InputSpec::new(&[None, Some(3)], DType::F64, "a"),
            InputSpec::new(&[Some(3)], DType::F64, "b"),
        ],
    )
    .unwrap();
    let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let b = Tensor::from_vec(vec![1.0, 0.0, -1.0], &[3]).unwrap();
    let outs = f.call(&[&a, &b]).unwrap();
    assert_eq!(outs[0].to_vec::<f64>().unwrap(), vec![-2.0, -2.0]);
    assert_eq!(outs[1].shape(), vec![2, 3]);
    // A size computed from `shape()` of a symbolic dim is an error naming the way out, not a
    // wrong constant in the graph.
    let e = to_static(
        |xs| Ok(vec![xs[0].reshape(&[xs[0].shape()[0] as i64 * 3])?]),
        &[InputSpec::new(&[None, Some(3)], DType::F32, "x")],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("reshape") && e.contains("dims()"), "{e}");
    let e = to_static(
        |xs| Ok(vec![(&xs[0] + &oar::zeros(&[xs[0].shape()[0], 3], DType::F32)?)?]),
        &[InputSpec::new(&[None, Some(3)], DType::F32, "x")],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("full") && e.contains("full_dims"), "{e}");
    // Reading a traced value is an error, not a wrong number.
    let e = to_static(
        |xs| Ok(vec![Tensor::scalar(xs[0].item()? as f32)]),
        &[InputSpec::new(&[Some(1)], DType::F32, "x")],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("traced"), "{e}");
}

/// Gradients of `sum(f(x) * r)` w.r.t. every parameter and the input: eager vs the traced graph.
fn grads_agree(model: &dyn Layer, spec: &InputSpec, x: &Tensor, what: &str) {
    let f = to_static_layer(model, spec).unwrap();
    let r = oar::randn(&model.forward(x).unwrap().shape(), DType::F32).unwrap();
    let run = |y: Tensor| (&y * &r).unwrap().sum(&[], false).unwrap().backward().unwrap();
    let x1 = x.detach().requires_grad_(true).unwrap();
    run(model.forward(&x1).unwrap());
    let eager: Vec<Tensor> = model.parameters().iter().map(|p| p.grad().unwrap()).collect();
    model.clear_gradients();
    let x2 = x.detach().requires_grad_(true).unwrap();
    run(f.call(&[&x2]).unwrap().remove(0));
    for ((name, p), e) in model.named_parameters().iter().zip(&eager) {
        let d = max_rel_diff(
            &p.grad().unwrap_or_else(|| panic!("{what}: no static grad for {name}")),
            e,
        );
        assert!(d < 1e-5, "{what}: gradient of {name} differs by {d}");
    }
    assert!(
        max_rel_diff(&x2.grad().unwrap(), &x1.grad().unwrap()) < 1e-5,
        "{what}: input gradient"
    );
    model.clear_gradients();
}

#[test]
fn gradients_agree_on_the_layer_zoo() {
    oar::seed(6);
    let mut cnn = Sequential::new()
        .add(Conv2D::new(2, 3, 3).unwrap().stride(2).padding(1))
        .add(BatchNorm2D::new(3).unwrap())
        .add(ReLU)
        .add(Flatten::new(1, -1))
        .add(Linear::new(3 * 3 * 3, 4).unwrap());
    cnn.eval();
    let x = oar::randn(&[2, 2, 5, 5], DType::F32).unwrap();
    grads_agree(
        &cnn,
        &InputSpec::new(&[None, Some(2), Some(5), Some(5)], DType::F32, "x"),
        &x,
        "cnn",
    );
    let lstm = LSTM::new(3, 4).unwrap();
    let x = oar::randn(&[2, 3, 3], DType::F32).unwrap();
    grads_agree(
        &lstm,
        &InputSpec::new(&[None, Some(3), Some(3)], DType::F32, "x"),
        &x,
        "lstm",
    );
    let mut enc = TransformerEncoderLayer::new(8, 2, 16).unwrap();
    enc.eval();
    let x = oar::randn(&[2, 4, 8], DType::F32).unwrap();
    grads_agree(
        &enc,
        &InputSpec::new(&[None, Some(4), Some(8)], DType::F32, "x"),
        &x,
        "transformer",
    );
}

/// Symbolic dims as expressions: the batch dim reshaped together with other axes (`N*C`),
/// split again, concatenated (`2*N`), padded (`N+2`), and sizes computed with `dims()`; one
/// graph, checked against eager code at several batch sizes.
#[test]
fn symbolic_dims_merge_split_and_grow() {
    oar::seed(9);
    let w = oar::randn(&[6, 5], DType::F32).unwrap();
    let f = |x: &Tensor| -> oar::error::Result<Vec<Tensor>> {
        // [N, 3, 2] → [N*3, 2] → linear → [N*3, 5] → back to [N, 3, 5].
        let flat = x.reshape(&[-1, 2])?;
        let d = x.dims();
        let merged = x.reshape_dims(&[d[0].mul(&d[1]).unwrap(), d[2].clone()])?;
        assert_eq!(flat.dims(), merged.dims());
        let h = flat.matmul(&w.slice(0, 0, 2, 1)?)?.reshape(&[-1, 3, 5])?;
        let h = h.reshape(&[0, -1])?; // [N, 15]
        let both = oar::concat(&[&h, &h.scale(2.0, 0.0)?], 0)?; // [2*N, 15]
        let padded = both.pad(&[(1, 1), (0, 0)], 0.5)?; // [2*N+2, 15]
        let ones = oar::full_dims(&padded.dims(), 1.0, DType::F32)?;
        Ok(vec![(&padded + &ones)?, flat.sum(&[0], false)?])
    };
    let sf = to_static(
        |xs| f(&xs[0]),
        &[InputSpec::new(&[None, Some(3), Some(2)], DType::F32, "x")],
    )
    .unwrap();
    let g = sf.graph();
    let outs: Vec<String> = g.output_types().iter().map(|t| t.to_string()).collect();
    assert_eq!(outs, ["f32[2*N+2,15]", "f32[2]"], "{g}");
    assert!(g.to_string().contains("3*N"), "{g}");
    let _ng = oar::no_grad();
    for n in [1, 2, 5] {
        let x = oar::randn(&[n, 3, 2], DType::F32).unwrap();
        let want = f(&x).unwrap();
        let got = sf.call(&[&x]).unwrap();
        assert_eq!(got[0].shape(), vec![2 * n + 2, 15]);
        for (a, b) in want.iter().zip(&got) {
            assert!(max_rel_diff(a, b) < 1e-5, "batch {n}");
        }
    }
}

/// A conv net's training step traced with a symbolic batch: the weight gradient contracts over
/// `N` (reshapes to `[C, N*H*W]`), and the traced step matches eager training at two batch
/// sizes.
#[test]
fn conv_train_step_with_symbolic_batch() {
    oar::seed(12);
    let make = || {
        Sequential::new()
            .add(Conv2D::new(1, 3, 3).unwrap())
            .add(ReLU)
            .add(Flatten::new(1, -1))
            .add(Linear::new(3 * 4 * 4, 2).unwrap())
    };
    let eager = make();
    let st = make();
    for (a, b) in eager.parameters().iter().zip(st.parameters()) {
        b.set_data(a.data()).unwrap();
    }
    let mut opt_e = oar::optimizer::SGD::new(eager.named_parameters(), 0.1);
    let mut opt_s = oar::optimizer::SGD::new(st.named_parameters(), 0.1);
    let specs = [
        InputSpec::new(&[None, Some(1), Some(6), Some(6)], DType::F32, "x"),
        InputSpec::new(&[None], DType::I64, "y"),
    ];
    let step = oar::jit::to_static_train_step(&st, &mut opt_s, &specs, |xs| {
        cross_entropy(&st.forward(&xs[0])?, &xs[1], Reduction::Mean)
    })
    .unwrap();
    assert_eq!(step.graph().input_specs()[0].1.to_string(), "f32[N,1,6,6]");
    for n in [4, 3, 4] {
        let x = oar::randn(&[n, 1, 6, 6], DType::F32).unwrap();
        let y = Tensor::from_vec((0..n as i64).map(|i| i % 2).collect::<Vec<_>>(), &[n]).unwrap();
        let le = cross_entropy(&eager.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
        le.backward().unwrap();
        opt_e.step().unwrap();
        opt_e.clear_grad();
        let ls = step.call(&[&x, &y]).unwrap().remove(0);
        let (le, ls) = (le.item().unwrap(), ls.item().unwrap());
        assert!(
            (le - ls).abs() <= 1e-5 * (1.0 + le.abs()),
            "batch {n}: loss {le} vs {ls}"
        );
        for (a, b) in eager.parameters().iter().zip(st.parameters()) {
            assert!(max_rel_diff(a, &b) < 1e-5, "batch {n}: parameters differ");
        }
    }
}

/// The NaN/Inf debug mode (`OAR_CHECK_NAN_INF=1`, or `oar::check_nan_inf(true)` on this thread):
/// an eager op and a compiled static graph stop at the op producing NaN/Inf and name it; off,
/// the NaN flows through as IEEE says.
#[test]
fn check_nan_inf_names_the_first_op_that_produced_one() {
    let x = Tensor::from_vec(vec![1.0f32, -1.0, 4.0], &[3]).unwrap();
    let f = to_static(
        |xs| Ok(vec![xs[0].sqrt()?.exp()?.sum(&[], false)?]),
        &[InputSpec::new(&[None], DType::F32, "x")],
    )
    .unwrap();
    assert!(x.sqrt().unwrap().to_vec::<f32>().unwrap()[1].is_nan());
    assert!(f.call(&[&x]).unwrap()[0].item().unwrap().is_nan());
    let _on = oar::check_nan_inf(true);
    let e = x.sqrt().unwrap_err().to_string();
    assert!(
        e.contains("sqrt") && e.contains("NaN") && e.contains("element 1") && e.contains("f32[3]"),
        "{e}"
    );
    // … and where in the user's code the op was called (this test, this file) — when the
    // test has line tables (a `--release` build has none: then no location, not a wrong one).
    if cfg!(debug_assertions) {
        assert!(
            e.contains("called from check_nan_inf_names_the_first_op_that_produced_one")
                && e.contains("tests/framework/jit.rs:"),
            "{e}"
        );
    } else {
        assert!(!e.contains("pthread_create"), "{e}");
    }
    // A compiled graph names the kernel, the graph value it writes and what it read.
    let e = f.call(&[&x]).unwrap_err().to_string();
    assert!(
        e.contains("NaN") && e.contains("OAR_CHECK_NAN_INF") && e.contains("reading [") && e.contains("f32[3]"),
        "{e}"
    );
    // The reference interpreter names the graph op and its operands.
    let r = oar_backend_reference::run_graph(
        f.graph(),
        &oar::ir::Weights::new(),
        &std::collections::BTreeMap::from([("x".to_string(), x.data())]),
    )
    .unwrap_err()
    .to_string();
    assert!(r.contains("sqrt") && r.contains("NaN"), "{r}");
}
