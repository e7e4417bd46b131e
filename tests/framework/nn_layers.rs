//! nn layers: outputs against hand computation or direct loops, parameter names, state_dict
//! round trips, train/eval behaviour and shape errors. Tolerances are stated per check.

use oar::DType;
use oar::Tensor;
use oar::nn::*;

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn vals(x: &Tensor) -> Vec<f64> {
    x.to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "lengths {} vs {}", a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "[{i}]: {x} vs {y}");
    }
}

fn names(l: &dyn Layer) -> Vec<String> {
    l.named_parameters().into_iter().map(|(n, _)| n).collect()
}

/// Copy a layer's state into another through `state_dict` / `set_state_dict`.
fn copy_state(from: &dyn Layer, to: &dyn Layer) {
    let s = from.state_dict().into_iter().map(|(k, v)| (k, v.data())).collect();
    to.set_state_dict(&s).unwrap();
}

fn ramp(n: usize, scale: f64, shift: f64) -> Vec<f64> {
    (0..n).map(|i| ((i * 7 % 11) as f64 - 5.0) * scale + shift).collect()
}

#[test]
fn linear_matches_x_w_plus_b() {
    let l = Linear::new(3, 2).unwrap().dtype(DType::F64).unwrap();
    assert_eq!(names(&l), ["weight", "bias"]);
    assert_eq!(l.weight().shape(), [3, 2]);
    assert_eq!(vals(l.bias_tensor().unwrap()), [0.0, 0.0], "Paddle: zero bias");
    // Xavier-uniform bound √(6 / (3 + 2)).
    assert!(vals(l.weight()).iter().all(|w| w.abs() <= (6.0f64 / 5.0).sqrt()));
    l.weight()
        .set_data(t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).data())
        .unwrap();
    l.bias_tensor().unwrap().set_data(t(&[0.5, -1.0], &[2]).data()).unwrap();
    let y = l.forward(&t(&[1.0, 0.0, -1.0, 2.0, 1.0, 0.5], &[2, 3])).unwrap();
    // [1,0,-1]·W = [1-5, 2-6] = [-4,-4]; [2,1,.5]·W = [2+3+2.5, 4+4+3] = [7.5, 11]; plus b.
    assert_eq!(vals(&y), [-3.5, -5.0, 8.0, 10.0]);
    let nb = Linear::new(3, 2).unwrap().bias(false);
    assert_eq!(names(&nb), ["weight"]);
    // Linear(4, 3) on [2, 5]: the error names the layer and the shapes.
    let e = Linear::new(4, 3)
        .unwrap()
        .forward(&oar::zeros(&[2, 5], DType::F32).unwrap());
    let e = e.unwrap_err().to_string();
    assert!(
        e.contains("Linear(in_features=4, out_features=3)") && e.contains("f32[2,5]"),
        "{e}"
    );
    // state_dict round trip into a fresh layer.
    let fresh = Linear::new(3, 2).unwrap().dtype(DType::F64).unwrap();
    copy_state(&l, &fresh);
    assert_eq!(vals(fresh.weight()), vals(l.weight()));
    assert_eq!(vals(fresh.bias_tensor().unwrap()), [0.5, -1.0]);
}

/// Direct convolution loop: x[N,C,H,W], w[O,C/g,kh,kw], padding (top, left, bottom, right).
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    b: &[f64],
    stride: [usize; 2],
    pad: [usize; 4],
    dil: [usize; 2],
    groups: usize,
) -> (Vec<f64>, [usize; 4]) {
    let [n, c, h, wd] = xs;
    let [o, cg, kh, kw] = ws;
    let oh = (h + pad[0] + pad[2] - dil[0] * (kh - 1) - 1) / stride[0] + 1;
    let ow = (wd + pad[1] + pad[3] - dil[1] * (kw - 1) - 1) / stride[1] + 1;
    let og = o / groups;
    let mut out = vec![0.0; n * o * oh * ow];
    for ni in 0..n {
        for oi in 0..o {
            let g = oi / og;
            for y in 0..oh {
                for xx in 0..ow {
                    let mut s = b.get(oi).copied().unwrap_or(0.0);
                    for ci in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * stride[0] + ky * dil[0]) as isize - pad[0] as isize;
                                let ix = (xx * stride[1] + kx * dil[1]) as isize - pad[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let cin = g * cg + ci;
                                s += x[((ni * c + cin) * h + iy as usize) * wd + ix as usize]
                                    * w[((oi * cg + ci) * kh + ky) * kw + kx];
                            }
                        }
                    }
                    out[((ni * o + oi) * oh + y) * ow + xx] = s;
                }
            }
        }
    }
    (out, [n, o, oh, ow])
}

#[test]
fn conv2d_matches_a_direct_loop() {
    let conv = Conv2D::new(4, 6, [3, 2])
        .unwrap()
        .stride([2, 1])
        .padding([1, 0, 2, 1])
        .dilation([1, 2])
        .groups(2)
        .unwrap()
        .dtype(DType::F64)
        .unwrap();
    assert_eq!(names(&conv), ["weight", "bias"]);
    assert_eq!(conv.weight().shape(), [6, 2, 3, 2]);
    let b = ramp(6, 0.1, 0.0);
    conv.bias_tensor().unwrap().set_data(t(&b, &[6]).data()).unwrap();
    let x = ramp(2 * 4 * 5 * 6, 0.1, 0.05);
    let y = conv.forward(&t(&x, &[2, 4, 5, 6])).unwrap();
    let w = vals(conv.weight());
    let (want, shape) = conv_ref(&x, [2, 4, 5, 6], &w, [6, 2, 3, 2], &b, [2, 1], [1, 0, 2, 1], [1, 2], 2);
    assert_eq!(y.shape(), shape);
    close(&vals(&y), &want, 1e-12);
    // Paddle's conv init N(0, 2/fan_in) with fan_in = C/groups·kh·kw = 12: loose check on the spread.
    let c = Conv2D::new(8, 64, 3).unwrap();
    let w = c.weight().to_vec::<f32>().unwrap();
    let std = (w.iter().map(|v| (v * v) as f64).sum::<f64>() / w.len() as f64).sqrt();
    assert!((std - (2.0f64 / 72.0).sqrt()).abs() < 0.02, "std {std}");
    // Errors: wrong channel count, bad groups.
    let e = c
        .forward(&oar::zeros(&[1, 3, 5, 5], DType::F32).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Conv2D(in_channels=8") && e.contains("f32[1,3,5,5]"), "{e}");
    assert!(Conv2D::new(3, 4, 3).unwrap().groups(2).is_err());
    let fresh = Conv2D::new(4, 6, [3, 2])
        .unwrap()
        .groups(2)
        .unwrap()
        .dtype(DType::F64)
        .unwrap();
    copy_state(&conv, &fresh);
    assert_eq!(vals(fresh.weight()), vals(conv.weight()));
}

#[test]
fn conv1d_matches_a_direct_loop() {
    let conv = Conv1D::new(2, 3, 3)
        .unwrap()
        .stride(2)
        .padding([1, 2])
        .dtype(DType::F64)
        .unwrap();
    let x = ramp(2 * 2 * 7, 0.2, 0.0);
    let y = conv.forward(&t(&x, &[2, 2, 7])).unwrap();
    let w = vals(conv.weight());
    let (want, [n, o, _, l]) = conv_ref(&x, [2, 2, 1, 7], &w, [3, 2, 1, 3], &[], [1, 2], [0, 1, 0, 2], [1, 1], 1);
    assert_eq!(y.shape(), [n, o, l]);
    close(&vals(&y), &want, 1e-12);
    assert_eq!(names(&Conv1D::new(2, 3, 3).unwrap().bias(false)), ["weight"]);
    let e = conv.forward(&t(&x, &[4, 7])).unwrap_err().to_string();
    assert!(e.contains("Conv1D") && e.contains("f64[4,7]"), "{e}");
}

#[test]
fn batch_norm_train_updates_running_stats_and_eval_uses_them() {
    let mut bn = BatchNorm2D::new(2).unwrap().dtype(DType::F64).unwrap();
    assert_eq!(names(&bn), ["weight", "bias"]);
    let bufs: Vec<String> = bn.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(bufs, ["_mean", "_variance"]);
    bn.weight().set_data(t(&[2.0, 1.0], &[2]).data()).unwrap();
    bn.bias().set_data(t(&[0.0, 1.0], &[2]).data()).unwrap();
    // x[2,2,1,2]: channel 0 holds {1,3,5,7}, channel 1 holds {0,0,4,4}.
    let x = t(&[1.0, 3.0, 0.0, 0.0, 5.0, 7.0, 4.0, 4.0], &[2, 2, 1, 2]);
    let y = bn.forward(&x).unwrap();
    // ch0: mean 4, biased var 5; ch1: mean 2, var 4.
    let (s0, s1) = (1.0 / (5.0f64 + 1e-5).sqrt(), 1.0 / (4.0f64 + 1e-5).sqrt());
    let want = [
        2.0 * -3.0 * s0,
        -2.0 * s0,
        1.0 - 2.0 * s1,
        1.0 - 2.0 * s1,
        2.0 * s0,
        2.0 * 3.0 * s0,
        1.0 + 2.0 * s1,
        1.0 + 2.0 * s1,
    ];
    close(&vals(&y), &want, 1e-12);
    // running = 0.9·running + 0.1·batch (biased variance, Paddle's rule).
    close(&vals(bn.running_mean()), &[0.4, 0.2], 1e-12);
    close(&vals(bn.running_var()), &[0.9 + 0.5, 0.9 + 0.4], 1e-12);
    let before = vals(bn.running_mean());
    bn.eval();
    assert!(!bn.is_training());
    let y = bn.forward(&x).unwrap();
    let e0 = 1.0 / (1.4f64 + 1e-5).sqrt();
    close(&vals(&y)[..2], &[2.0 * 0.6 * e0, 2.0 * 2.6 * e0], 1e-12);
    assert_eq!(vals(bn.running_mean()), before, "eval leaves the running stats alone");
    // state_dict carries the buffers.
    let fresh = BatchNorm2D::new(2).unwrap().dtype(DType::F64).unwrap();
    copy_state(&bn, &fresh);
    assert_eq!(vals(fresh.running_var()), vals(bn.running_var()));
    // BatchNorm1D takes [N,C] and [N,C,L]; rank and channel errors name the layer.
    let b1 = BatchNorm1D::new(3).unwrap();
    assert_eq!(
        b1.forward(&oar::rand(&[4, 3], DType::F32).unwrap()).unwrap().shape(),
        [4, 3]
    );
    assert_eq!(
        b1.forward(&oar::rand(&[4, 3, 5], DType::F32).unwrap()).unwrap().shape(),
        [4, 3, 5]
    );
    let e = b1
        .forward(&oar::rand(&[4, 3, 5, 5], DType::F32).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("BatchNorm1D") && e.contains("f32[4,3,5,5]"), "{e}");
    let e = b1
        .forward(&oar::rand(&[4, 2], DType::F32).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("BatchNorm1D(num_features=3)") && e.contains("f32[4,2]"),
        "{e}"
    );
}

#[test]
fn layer_norm_matches_hand_values() {
    let ln = LayerNorm::new(&[2]).unwrap().dtype(DType::F64).unwrap();
    assert_eq!(names(&ln), ["weight", "bias"]);
    ln.weight().unwrap().set_data(t(&[1.0, 2.0], &[2]).data()).unwrap();
    ln.bias().unwrap().set_data(t(&[0.5, 0.0], &[2]).data()).unwrap();
    let y = ln.forward(&t(&[1.0, 3.0, -2.0, -2.0], &[2, 2])).unwrap();
    // Row [1,3]: mean 2, var 1 → [-1, 1]/√(1+eps); row [-2,-2]: var 0 → zeros.
    let s = 1.0 / (1.0f64 + 1e-5).sqrt();
    close(&vals(&y), &[0.5 - s, 2.0 * s, 0.5, 0.0], 1e-12);
    let plain = LayerNorm::new(&[2, 2]).unwrap().affine(false).unwrap();
    assert!(names(&plain).is_empty());
    let y = plain.forward(&t(&[1.0, 2.0, 3.0, 4.0], &[1, 2, 2])).unwrap();
    let s = 1.0 / (1.25f64 + 1e-5).sqrt();
    close(&vals(&y), &[-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s], 1e-12);
    let e = plain.forward(&t(&[1.0, 2.0, 3.0], &[1, 3])).unwrap_err().to_string();
    assert!(e.contains("LayerNorm") && e.contains("f64[1,3]"), "{e}");
}

#[test]
fn embedding_lookup_and_padding_idx() {
    let emb = Embedding::new(4, 2)
        .unwrap()
        .dtype(DType::F64)
        .unwrap()
        .padding_idx(-1)
        .unwrap();
    assert_eq!(names(&emb), ["weight"]);
    emb.weight()
        .set_data(t(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], &[4, 2]).data())
        .unwrap();
    let idx = Tensor::from_vec(vec![2i64, 3, 0, 2], &[2, 2]).unwrap();
    let y = emb.forward(&idx).unwrap();
    assert_eq!(y.shape(), [2, 2, 2]);
    // Index 3 is the padding index: zeros.
    assert_eq!(vals(&y), [4.0, 5.0, 0.0, 0.0, 0.0, 1.0, 4.0, 5.0]);
    y.sum(&[], false).unwrap().backward().unwrap();
    // Row 2 looked up twice, row 0 once, padding row 3 gets no gradient.
    assert_eq!(
        vals(&emb.weight().grad().unwrap()),
        [1.0, 1.0, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0]
    );
    assert!(Embedding::new(4, 2).unwrap().padding_idx(4).is_err());
    let e = emb.forward(&t(&[1.0], &[1])).unwrap_err().to_string();
    assert!(e.contains("Embedding") && e.contains("f64[1]"), "{e}");
}

#[test]
fn dropout_train_drops_and_scales_eval_is_identity() {
    let mut d = Dropout::new(0.3).unwrap();
    let x = oar::ones(&[20000], DType::F64).unwrap();
    oar::seed(11);
    let y = vals(&d.forward(&x).unwrap());
    let zeros = y.iter().filter(|&&v| v == 0.0).count() as f64 / y.len() as f64;
    // Binomial std of the fraction is √(0.21/20000) ≈ 0.0032; allow 5σ.
    assert!((zeros - 0.3).abs() < 0.016, "zero fraction {zeros}");
    assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.7).abs() < 1e-12));
    oar::seed(11);
    assert_eq!(vals(&d.forward(&x).unwrap()), y, "seeded masks repeat");
    d.eval();
    assert_eq!(vals(&d.forward(&x).unwrap()), vals(&x));
    assert!(Dropout::new(1.0).is_err() && Dropout::new(-0.1).is_err());
}

#[test]
fn pooling_layers_match_hand_values() {
    let x = t(&(0..16).map(|v| v as f64).collect::<Vec<_>>(), &[1, 1, 4, 4]);
    assert_eq!(vals(&MaxPool2D::new(2).forward(&x).unwrap()), [5.0, 7.0, 13.0, 15.0]);
    assert_eq!(vals(&AvgPool2D::new(2).forward(&x).unwrap()), [2.5, 4.5, 10.5, 12.5]);
    // 3x3 windows, stride 2, padding 1: top-left window covers {0,1,4,5}.
    let p = MaxPool2D::new(3).stride(2).padding(1);
    assert_eq!(vals(&p.forward(&x).unwrap()), [5.0, 7.0, 13.0, 15.0]);
    let ex = AvgPool2D::new(3).stride(2).padding(1);
    assert_eq!(vals(&ex.forward(&x).unwrap())[0], 2.5, "exclusive: (0+1+4+5)/4");
    let inc = AvgPool2D::new(3).stride(2).padding(1).exclusive(false);
    assert_eq!(vals(&inc.forward(&x).unwrap())[0], 10.0 / 9.0, "inclusive: 10/9");
    assert_eq!(vals(&AdaptiveAvgPool2D::new(1).forward(&x).unwrap()), [7.5]);
    assert_eq!(vals(&AdaptiveMaxPool2D::new([2, 1]).forward(&x).unwrap()), [7.0, 15.0]);
    assert_eq!(
        vals(&MaxPool2D::new(3).ceil_mode(true).forward(&x).unwrap()),
        [10.0, 11.0, 14.0, 15.0]
    );
    let e = MaxPool2D::new(2)
        .forward(&t(&[1.0; 4], &[2, 2]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("MaxPool2D") && e.contains("f64[2,2]"), "{e}");
}

#[test]
fn flatten_and_activations() {
    let x = oar::zeros(&[2, 3, 4, 5], DType::F32).unwrap();
    assert_eq!(Flatten::default().forward(&x).unwrap().shape(), [2, 60]);
    assert_eq!(Flatten::new(1, 2).forward(&x).unwrap().shape(), [2, 12, 5]);
    assert!(
        Flatten::new(2, 1)
            .forward(&x)
            .unwrap_err()
            .to_string()
            .contains("Flatten")
    );
    let v = [-2.0, -0.5, 0.0, 1.0];
    let x = t(&v, &[4]);
    assert_eq!(vals(&ReLU::new().forward(&x).unwrap()), [0.0, 0.0, 0.0, 1.0]);
    let sig: Vec<f64> = v.iter().map(|a| 1.0 / (1.0 + (-a).exp())).collect();
    close(&vals(&Sigmoid::new().forward(&x).unwrap()), &sig, 1e-14);
    let silu: Vec<f64> = v.iter().zip(&sig).map(|(a, s)| a * s).collect();
    close(&vals(&SiLU::new().forward(&x).unwrap()), &silu, 1e-14);
    let th: Vec<f64> = v.iter().map(|a| a.tanh()).collect();
    close(&vals(&Tanh::new().forward(&x).unwrap()), &th, 1e-14);
    // Exact GELU at -2, -0.5, 0, 1 (x·Φ(x), tabulated to 16 digits).
    let exact = [-0.04550026389635842, -0.15426876936299347, 0.0, 0.8413447460685429];
    close(&vals(&GELU::new().forward(&x).unwrap()), &exact, 1e-12);
    let tanh_gelu: Vec<f64> = v
        .iter()
        .map(|a| 0.5 * a * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (a + 0.044715 * a * a * a)).tanh()))
        .collect();
    close(
        &vals(&GELU::new().approximate(true).forward(&x).unwrap()),
        &tanh_gelu,
        1e-12,
    );
    let m = t(&[1.0, 2.0, 3.0, 1.0, 1.0, 1.0], &[2, 3]);
    let e: f64 = 1f64.exp() + 2f64.exp() + 3f64.exp();
    let want = [
        1f64.exp() / e,
        2f64.exp() / e,
        3f64.exp() / e,
        1.0 / 3.0,
        1.0 / 3.0,
        1.0 / 3.0,
    ];
    close(&vals(&Softmax::default().forward(&m).unwrap()), &want, 1e-14);
    let logw: Vec<f64> = want.iter().map(|w| w.ln()).collect();
    close(&vals(&LogSoftmax::new(1).forward(&m).unwrap()), &logw, 1e-12);
    let col = vals(&Softmax::new(0).forward(&m).unwrap());
    close(&[col[0] + col[3]], &[1.0], 1e-14);
}
