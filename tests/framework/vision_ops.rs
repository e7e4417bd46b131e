//! The eager API of the segmentation / detection / generative ops against PyTorch (the
//! committed `tests/fixtures/ops/torch_*.json`, `tools/gen_torch_op_fixtures.py`): each API call
//! must give PyTorch's answer for the same arguments, so the mapping from PyTorch-style
//! arguments (symmetric padding, `[left, right, ...]` pad order, interpolate modes) to the IR
//! op is checked, not just the op. Then the layers, `to_static` of a model using them on the
//! reference and cpu backends, and `jit::save` → `load`.
//!
//! Tolerance: each fixture's own `rtol`/`atol` (`|got - want| ≤ atol + rtol·|want|`).

use oar::ir::{DType, TensorData};
use oar::jit::{InputSpec, load, save, to_static_layer};
use oar::nn::functional::{self as F, Interpolation};
use oar::nn::{ConvTranspose, GroupNorm, InstanceNorm2D, Layer, Pad, ReLU, Sequential, Upsample};
use oar::{Tensor, no_grad};
use serde_json::Value;

/// The inputs and outputs of fixture `name` in `tests/fixtures/ops/{file}.json`, with its
/// tolerance.
fn fixture(file: &str, name: &str) -> (Vec<Tensor>, Vec<TensorData>, f64, f64) {
    let path = format!("{}/tests/fixtures/ops/{file}.json", env!("CARGO_MANIFEST_DIR"));
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let c = cases
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{file}:{name}"));
    let tensor = |v: &Value| -> TensorData {
        let dtype: DType = serde_json::from_value(v["dtype"].clone()).unwrap();
        let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).unwrap();
        let data: Vec<f64> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| match x {
                Value::Bool(b) => f64::from(u8::from(*b)),
                Value::String(s) => s.parse().unwrap(),
                x => x.as_f64().unwrap(),
            })
            .collect();
        TensorData::from_f64_slice(dtype, shape, &data).unwrap()
    };
    let ins = c["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| Tensor::from_data(tensor(v)))
        .collect();
    let outs = c["outputs"].as_array().unwrap().iter().map(tensor).collect();
    (ins, outs, c["rtol"].as_f64().unwrap(), c["atol"].as_f64().unwrap())
}

fn assert_close(what: &str, got: &Tensor, want: &TensorData, rtol: f64, atol: f64) {
    assert_eq!(got.tensor_type(), want.tensor_type(), "{what}");
    for (i, (g, w)) in got.data().to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!(
            (g - w).abs() <= atol + rtol * w.abs() || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: {g} vs PyTorch {w}"
        );
    }
}

#[test]
fn functional_api_matches_pytorch() {
    let _g = no_grad();
    let (x, y, r, a) = fixture("torch_conv_transpose", "2d_symmetric_f64");
    let got = F::conv_transpose(&x[0], &x[1], Some(&x[2]), &[2, 2], &[1, 1], &[1, 1], &[1, 1], 1).unwrap();
    assert_close("conv_transpose", &got, &y[0], r, a);

    for (name, size, mode, align) in [
        ("nearest_up", &[6usize, 5][..], Interpolation::Nearest, false),
        ("nearest_exact", &[7], Interpolation::NearestExact, false),
        ("bilinear_up_down", &[7, 3], Interpolation::Linear, false),
        ("bilinear_align_corners", &[5, 9], Interpolation::Linear, true),
        ("bicubic_half_pixel", &[8, 6], Interpolation::Cubic, false),
        ("bicubic_align_corners", &[7, 3], Interpolation::Cubic, true),
        ("trilinear", &[3, 4, 5], Interpolation::Linear, false),
    ] {
        let (x, y, r, a) = fixture("torch_resize", name);
        let got = F::interpolate(&x[0], Some(size), None, mode, align).unwrap();
        assert_close(name, &got, &y[0], r, a);
    }

    for (name, pad, mode) in [
        ("reflect_2d", &[1usize, 3, 2, 1][..], "reflect"),
        ("replicate_1d", &[3, 2], "replicate"),
        ("circular_2d", &[2, 4, 1, 3], "circular"),
        ("replicate_3d", &[0, 3, 2, 0, 1, 2], "replicate"),
    ] {
        let (x, y, r, a) = fixture("torch_pad", name);
        assert_close(name, &F::pad(&x[0], pad, mode, 0.0).unwrap(), &y[0], r, a);
    }

    let (x, y, r, a) = fixture("torch_norm", "group_norm_affine");
    let got = F::group_norm(&x[0], 3, Some(&x[1]), Some(&x[2]), 1e-5).unwrap();
    assert_close("group_norm", &got, &y[0], r, a);
    let (x, y, r, a) = fixture("torch_norm", "instance_norm_affine");
    let got = F::instance_norm(&x[0], Some(&x[1]), Some(&x[2]), 1e-5).unwrap();
    assert_close("instance_norm", &got, &y[0], r, a);

    let (x, y, r, a) = fixture("torch_cumsum", "f32_axis1");
    assert_close("cumsum", &x[0].cumsum(-2).unwrap(), &y[0], r, a);
    let (x, y, _, _) = fixture("torch_sort", "sort_f32_ties_nan");
    let (v, i) = x[0].sort(-1, false).unwrap();
    assert_close("sort values", &v, &y[0], 0.0, 0.0);
    assert_close("sort indices", &i, &y[1], 0.0, 0.0);
    let (x, y, _, _) = fixture("torch_sort", "topk_f32_largest");
    let (v, i) = x[0].topk(3, 1, true).unwrap();
    assert_close("topk values", &v, &y[0], 0.0, 0.0);
    assert_close("topk indices", &i, &y[1], 0.0, 0.0);
    let (x, y, _, _) = fixture("torch_sort", "argsort_i64_descending");
    assert_close("argsort", &x[0].argsort(1, true).unwrap(), &y[0], 0.0, 0.0);
    let (x, y, _, _) = fixture("torch_select", "masked_fill_broadcast");
    assert_close("masked_fill", &x[0].masked_fill(&x[1], -1e4).unwrap(), &y[0], 0.0, 0.0);
    let (x, y, _, _) = fixture("torch_select", "one_hot_f32");
    assert_close("one_hot", &F::one_hot(&x[0], 5, DType::F32).unwrap(), &y[0], 0.0, 0.0);
    let (x, y, r, a) = fixture("torch_einsum", "bilinear");
    let got = oar::einsum("bn,anm,bm->ba", &[&x[0], &x[1], &x[2]]).unwrap();
    assert_close("einsum", &got, &y[0], r, a);
    let (x, y, _, _) = fixture("torch_flip", "f64_two_axes");
    assert_close("flip", &x[0].flip(&[1, -3]).unwrap(), &y[0], 0.0, 0.0);
    let (x, y, _, _) = fixture("torch_trilu", "f32_triu_batched");
    assert_close("triu", &x[0].triu(1).unwrap(), &y[0], 0.0, 0.0);
    let (x, y, _, _) = fixture("torch_trilu", "i32_tril");
    assert_close("tril", &x[0].tril(0).unwrap(), &y[0], 0.0, 0.0);
}

/// flip and triu/tril trace to static graphs (a symbolic batch) that compute what eager does
/// on the reference and the cpu backend.
#[test]
fn flip_and_trilu_trace_to_static() {
    let x = oar::randn(&[3, 4, 5], DType::F32).unwrap();
    let f = |x: &Tensor| -> oar::Result<Tensor> {
        let a = x.flip(&[-1, 1])?.triu(1)?;
        oar::add(&a, &x.tril(-1)?)
    };
    let eager = f(&x).unwrap();
    for backend in ["reference", "cpu"] {
        let spec = InputSpec::new(&[None, Some(4), Some(5)], DType::F32, "x");
        let st = oar::jit::to_static(|xs| Ok(vec![f(&xs[0])?]), &[spec]).unwrap();
        let s = st.with_backend(backend).unwrap();
        let got = s.call(&[&x]).unwrap().remove(0);
        assert_eq!(max_abs_diff(&got, &eager), 0.0, "{backend}");
    }
}

#[test]
fn api_errors_name_the_problem() {
    let x = oar::randn(&[1, 2, 4, 4], DType::F32).unwrap();
    let e = F::pad(&x, &[1, 2, 3], "reflect", 0.0).unwrap_err().to_string();
    assert!(e.contains("pad") && e.contains("pairs"), "{e}");
    let e = F::pad(&x, &[5, 0], "reflect", 0.0).unwrap_err().to_string();
    assert!(e.contains("reflect") && e.contains("axis 3"), "{e}");
    let e = F::pad(&x, &[1, 1], "mirror", 0.0).unwrap_err().to_string();
    assert!(e.contains("unknown mode `mirror`"), "{e}");
    let e = F::interpolate(&x, Some(&[8]), None, Interpolation::Linear, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("interpolate") && e.contains("2 entries"), "{e}");
    assert!(
        "area"
            .parse::<Interpolation>()
            .unwrap_err()
            .to_string()
            .contains("unknown mode `area`")
    );
    let e = F::group_norm(&x, 3, None, None, 1e-5).unwrap_err().to_string();
    assert!(e.contains("group_norm") && e.contains("3 groups"), "{e}");
    let e = x.topk(5, -1, true).unwrap_err().to_string();
    assert!(e.contains("topk") && e.contains("k=5"), "{e}");
    let e = oar::einsum("ij,jk->ik", &[&x]).unwrap_err().to_string();
    assert!(e.contains("einsum") && e.contains("2 operands"), "{e}");
    let e = x.flip(&[1, -3]).unwrap_err().to_string();
    assert!(e.contains("flip") && e.contains("twice"), "{e}");
    let e = oar::randn(&[4], DType::F32).unwrap().triu(0).unwrap_err().to_string();
    assert!(e.contains("trilu") && e.contains("rank ≥ 2"), "{e}");
    let w = oar::randn(&[3, 2, 3, 3], DType::F32).unwrap();
    let e = F::conv_transpose(&x, &w, None, &[1, 1], &[0, 0], &[0, 0], &[1, 1], 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("conv_transpose") && e.contains("Cin"), "{e}");
    assert!(GroupNorm::new(3, 8).is_err() && ConvTranspose::new(2, 4, &[]).is_err());
    assert!(Pad::new(&[1], "reflect").is_err() && Pad::new(&[1, 1], "nope").is_err());
}

/// A small generator / segmentation head: transposed conv, group norm, upsampling, reflect
/// padding, instance norm.
fn decoder() -> Sequential {
    Sequential::new()
        .add(
            ConvTranspose::new(4, 6, &[4, 4])
                .unwrap()
                .stride(&[2])
                .unwrap()
                .padding(&[1])
                .unwrap(),
        )
        .add(GroupNorm::new(3, 6).unwrap())
        .add(ReLU)
        .add(Upsample::scale(&[2.0, 2.0]).mode("bilinear").unwrap())
        .add(Pad::new(&[1, 1, 1, 1], "reflect").unwrap())
        .add(InstanceNorm2D::new(6).unwrap())
}

#[test]
fn layers_trace_compile_save_and_train() {
    oar::seed(21);
    let model = decoder();
    let shapes: Vec<_> = model
        .named_parameters()
        .iter()
        .map(|(n, t)| (n.clone(), t.shape()))
        .collect();
    assert_eq!(shapes[0], ("0.weight".to_string(), vec![4, 6, 4, 4]), "{shapes:?}");
    assert_eq!(
        model.parameters().len(),
        6,
        "conv w+b, group norm w+b, instance norm w+b"
    );
    let x = oar::randn(&[2, 4, 3, 5], DType::F32).unwrap();
    let eager = no_grad_forward(&model, &x);
    assert_eq!(eager.shape(), vec![2, 6, 14, 22]);
    let spec = InputSpec::new(&[None, Some(4), Some(3), Some(5)], DType::F32, "x");
    for backend in ["reference", "cpu"] {
        let f = to_static_layer(&model, &spec).unwrap().with_backend(backend).unwrap();
        let _g = no_grad();
        let stat = f.call(&[&x]).unwrap().remove(0);
        let diff = max_abs_diff(&stat, &eager);
        assert!(diff < 1e-4, "{backend}: static vs eager {diff}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decoder.oar");
    save(&model, &path, &spec).unwrap();
    let loaded = load(&path).unwrap();
    let again = no_grad_forward(&loaded, &x);
    assert!(max_abs_diff(&again, &eager) < 1e-5);
    // One training step through every new op's gradient moves the loss.
    let loss = |m: &dyn Layer| {
        let y = m.forward(&x).unwrap();
        oar::multiply(&y, &y).unwrap().mean(&[], false).unwrap()
    };
    let before = loss(&model);
    before.backward().unwrap();
    for p in model.parameters() {
        let g = p.grad().expect("every parameter gets a gradient");
        p.set_data(oar::subtract(&p, &g.scale(0.5, 0.0).unwrap()).unwrap().data())
            .unwrap();
    }
    let after = loss(&model);
    assert!(
        after.item().unwrap() < before.item().unwrap(),
        "{} → {}",
        before.item().unwrap(),
        after.item().unwrap()
    );
}

fn no_grad_forward(m: &dyn Layer, x: &Tensor) -> Tensor {
    let _g = no_grad();
    m.forward(x).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.data().to_f64_vec(), b.data().to_f64_vec());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}
