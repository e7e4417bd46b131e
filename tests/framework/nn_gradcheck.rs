//! Gradients of every `nn::functional` composite and loss through the eager tape, against
//! central finite differences in f64.
//!
//! Each case computes `loss = sum(f(x...) * r)` with a fixed pseudo-random `r`, calls
//! `backward()`, and compares every input's `.grad()` with `(L(x+h) − L(x−h)) / 2h`, h = 1e-6.
//! Tolerance: |analytic − numeric| ≤ 1e-6 + 1e-5·|numeric|. Inputs to kinked functions (relu,
//! max pooling) are drawn away from the kinks and ties.

use oar::nn::functional::{self as F, Reduction};
use oar::{Result, Tensor};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| lo + (hi - lo) * self.next()).collect()
    }
    /// Values with |v| in [0.1, 1]: away from relu's kink at 0.
    fn away_from_zero(&mut self, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let m = 0.1 + 0.9 * self.next();
                if self.next() < 0.5 { -m } else { m }
            })
            .collect()
    }
}

/// A differentiable f64 input.
struct In(Vec<f64>, Vec<usize>);

fn rnd(rng: &mut Rng, shape: &[usize]) -> In {
    In(rng.vec(shape.iter().product(), -1.0, 1.0), shape.to_vec())
}

fn tensor(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn ints(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

/// Check `d sum(f(xs) * r) / d xs` against finite differences.
fn gradcheck(name: &str, inputs: Vec<In>, f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|In(v, s)| tensor(v, s).requires_grad_(true).unwrap())
        .collect();
    let y = f(&leaves).unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    let r = tensor(&rng.vec(y.numel(), -1.0, 1.0), &y.shape());
    let objective = |y: &Tensor| y.multiply(&r).unwrap().sum(&[], false).unwrap();
    objective(&y).backward().unwrap();
    let h = 1e-6;
    for (i, (leaf, In(base, shape))) in leaves.iter().zip(&inputs).enumerate() {
        let g = leaf
            .grad()
            .unwrap_or_else(|| panic!("{name}: input {i} got no gradient"))
            .to_vec::<f64>()
            .unwrap();
        for j in 0..base.len() {
            let eval = |delta: f64| {
                let xs: Vec<Tensor> = inputs
                    .iter()
                    .enumerate()
                    .map(|(k, In(v, s))| {
                        let mut v = v.clone();
                        if k == i {
                            v[j] += delta;
                        }
                        tensor(&v, s)
                    })
                    .collect();
                objective(&f(&xs).unwrap()).item().unwrap()
            };
            let num = (eval(h) - eval(-h)) / (2.0 * h);
            assert!(
                (g[j] - num).abs() <= 1e-6 + 1e-5 * num.abs(),
                "{name}: d/dx{i}{shape:?}[{j}]: tape {} vs numeric {num}",
                g[j]
            );
        }
    }
}

#[test]
fn linear() {
    let mut r = Rng(1);
    let ins = vec![rnd(&mut r, &[3, 4]), rnd(&mut r, &[4, 5]), rnd(&mut r, &[5])];
    gradcheck("linear", ins, |x| F::linear(&x[0], &x[1], Some(&x[2])));
    let ins = vec![rnd(&mut r, &[2, 3, 4]), rnd(&mut r, &[4, 2])];
    gradcheck("linear (no bias, batched)", ins, |x| F::linear(&x[0], &x[1], None));
}

#[test]
fn conv2d_stride_padding_dilation_groups() {
    let mut r = Rng(2);
    let ins = vec![
        rnd(&mut r, &[2, 4, 5, 6]),
        rnd(&mut r, &[6, 2, 3, 2]),
        rnd(&mut r, &[6]),
    ];
    gradcheck("conv2d", ins, |x| {
        F::conv2d(&x[0], &x[1], Some(&x[2]), [2, 1], [1, 0, 2, 1], [1, 2], 2)
    });
    let ins = vec![rnd(&mut r, &[1, 2, 4, 4]), rnd(&mut r, &[3, 2, 2, 2])];
    gradcheck("conv2d (plain)", ins, |x| F::conv2d(&x[0], &x[1], None, 1, 0, 1, 1));
    let ins = vec![rnd(&mut r, &[2, 4, 7]), rnd(&mut r, &[4, 2, 3]), rnd(&mut r, &[4])];
    gradcheck("conv1d", ins, |x| F::conv1d(&x[0], &x[1], Some(&x[2]), 2, [1, 2], 2, 2));
}

/// Distinct values with gaps ≫ h so no pooling window has a near-tie.
fn untied(r: &mut Rng, shape: &[usize]) -> In {
    let n: usize = shape.iter().product();
    let mut v: Vec<f64> = (0..n).map(|i| i as f64 * 0.01 - 0.3).collect();
    for i in (1..n).rev() {
        let j = (r.next() * (i + 1) as f64) as usize;
        v.swap(i, j);
    }
    In(v, shape.to_vec())
}

#[test]
fn pooling() {
    let mut r = Rng(3);
    gradcheck("max_pool2d", vec![untied(&mut r, &[2, 2, 5, 5])], |x| {
        F::max_pool2d(&x[0], 3, Some([2, 2].into()), 1, false)
    });
    gradcheck("max_pool2d ceil", vec![untied(&mut r, &[1, 2, 5, 6])], |x| {
        F::max_pool2d(&x[0], [2, 3], None, 0, true)
    });
    for exclusive in [true, false] {
        gradcheck(
            &format!("avg_pool2d exclusive={exclusive}"),
            vec![rnd(&mut r, &[2, 2, 5, 5])],
            |x| F::avg_pool2d(&x[0], 3, Some([2, 2].into()), 1, false, exclusive),
        );
        gradcheck(
            &format!("avg_pool2d ceil exclusive={exclusive}"),
            vec![rnd(&mut r, &[1, 1, 5, 6])],
            |x| F::avg_pool2d(&x[0], 2, None, [1, 0, 0, 1], true, exclusive),
        );
    }
    gradcheck("adaptive_avg_pool2d", vec![rnd(&mut r, &[2, 2, 5, 7])], |x| {
        F::adaptive_avg_pool2d(&x[0], [2, 3])
    });
    gradcheck("adaptive_max_pool2d", vec![untied(&mut r, &[2, 2, 5, 7])], |x| {
        F::adaptive_max_pool2d(&x[0], [3, 2])
    });
}

#[test]
fn batch_norm_train_and_eval() {
    let mut r = Rng(4);
    for shape in [vec![4, 3, 2, 2], vec![5, 3], vec![3, 3, 4]] {
        let mean = tensor(&r.vec(3, -0.5, 0.5), &[3]);
        let var = tensor(&r.vec(3, 0.5, 1.5), &[3]);
        for training in [true, false] {
            let ins = vec![rnd(&mut r, &shape), rnd(&mut r, &[3]), rnd(&mut r, &[3])];
            gradcheck(&format!("batch_norm {shape:?} training={training}"), ins, |x| {
                F::batch_norm(&x[0], &mean, &var, &x[1], &x[2], training, 0.9, 1e-5)
            });
        }
    }
}

#[test]
fn layer_norm_with_and_without_affine() {
    let mut r = Rng(5);
    let ins = vec![rnd(&mut r, &[3, 4, 5]), rnd(&mut r, &[4, 5]), rnd(&mut r, &[4, 5])];
    gradcheck("layer_norm affine", ins, |x| {
        F::layer_norm(&x[0], 2, Some(&x[1]), Some(&x[2]), 1e-5)
    });
    gradcheck("layer_norm plain", vec![rnd(&mut r, &[3, 6])], |x| {
        F::layer_norm(&x[0], 1, None, None, 1e-5)
    });
}

#[test]
fn softmax_log_softmax_cross_entropy() {
    let mut r = Rng(6);
    for axis in [0, 1, -1] {
        gradcheck(&format!("softmax axis {axis}"), vec![rnd(&mut r, &[3, 4, 2])], |x| {
            F::softmax(&x[0], axis)
        });
        gradcheck(
            &format!("log_softmax axis {axis}"),
            vec![rnd(&mut r, &[3, 4, 2])],
            |x| F::log_softmax(&x[0], axis),
        );
    }
    let labels = ints(&[2, 0, 3, 3], &[4]);
    for red in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        gradcheck(&format!("cross_entropy {red:?}"), vec![rnd(&mut r, &[4, 5])], |x| {
            F::cross_entropy(&x[0], &labels, red)
        });
    }
}

#[test]
fn activations() {
    let mut r = Rng(7);
    let x = || In(Rng(70).away_from_zero(12), vec![3, 4]);
    gradcheck("relu", vec![x()], |x| F::relu(&x[0]));
    gradcheck("gelu exact", vec![rnd(&mut r, &[3, 4])], |x| F::gelu(&x[0], false));
    gradcheck("gelu tanh", vec![rnd(&mut r, &[3, 4])], |x| F::gelu(&x[0], true));
    gradcheck("silu", vec![rnd(&mut r, &[3, 4])], |x| F::silu(&x[0]));
    gradcheck("sigmoid", vec![rnd(&mut r, &[3, 4])], |x| F::sigmoid(&x[0]));
    gradcheck("tanh", vec![rnd(&mut r, &[3, 4])], |x| F::tanh(&x[0]));
}

#[test]
fn embedding_weight_gradient() {
    let mut r = Rng(8);
    // Repeated indices: their rows' gradients must accumulate.
    let idx = ints(&[1, 4, 1, 0, 2, 1], &[2, 3]);
    gradcheck("embedding", vec![rnd(&mut r, &[5, 4])], |x| F::embedding(&idx, &x[0]));
}

#[test]
fn attention_causal_bool_and_float_masks() {
    let mut r = Rng(9);
    let qkv = |r: &mut Rng| vec![rnd(r, &[2, 3, 4]), rnd(r, &[2, 5, 4]), rnd(r, &[2, 5, 3])];
    gradcheck("sdpa", qkv(&mut r), |x| {
        F::scaled_dot_product_attention(&x[0], &x[1], &x[2], None, false, None)
    });
    gradcheck("sdpa causal", qkv(&mut r), |x| {
        F::scaled_dot_product_attention(&x[0], &x[1], &x[2], None, true, Some(0.7))
    });
    // Every query row keeps at least one key.
    let keep: Vec<bool> = (0..15).map(|i| i % 5 == i / 5 || i % 3 == 1).collect();
    let mask = Tensor::from_vec(keep, &[3, 5]).unwrap();
    gradcheck("sdpa bool mask", qkv(&mut r), |x| {
        F::scaled_dot_product_attention(&x[0], &x[1], &x[2], Some(&mask), false, None)
    });
    let mut ins = qkv(&mut r);
    ins.push(rnd(&mut r, &[2, 3, 5]));
    gradcheck("sdpa float mask (mask differentiated too)", ins, |x| {
        F::scaled_dot_product_attention(&x[0], &x[1], &x[2], Some(&x[3]), false, None)
    });
}

#[test]
fn losses() {
    let mut r = Rng(10);
    for red in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        gradcheck(
            &format!("mse {red:?}"),
            vec![rnd(&mut r, &[3, 4]), rnd(&mut r, &[3, 4])],
            |x| F::mse_loss(&x[0], &x[1], red),
        );
        let logits = In(r.vec(12, -4.0, 4.0), vec![3, 4]);
        let targets = In(r.vec(12, 0.0, 1.0), vec![3, 4]);
        gradcheck(&format!("bce_with_logits {red:?}"), vec![logits, targets], |x| {
            F::binary_cross_entropy_with_logits(&x[0], &x[1], red)
        });
        let labels = ints(&[1, 0, 3], &[3]);
        gradcheck(&format!("nll {red:?}"), vec![rnd(&mut r, &[3, 4])], |x| {
            F::nll_loss(&x[0], &labels, red)
        });
    }
}

#[test]
#[should_panic(expected = "tape")]
fn the_harness_catches_a_wrong_gradient() {
    // The tape sees only one factor of x·x (the other is detached): its gradient is x, not 2x.
    gradcheck("detached", vec![In(vec![0.5, -1.0], vec![2])], |x| {
        x[0].detach().multiply(&x[0])
    });
}

#[test]
fn bce_gradient_is_exact_at_zero_logits() {
    // d/dx [softplus(x) − x·y] = sigmoid(x) − y = 0.5 − y at x = 0 (zero-initialized heads).
    let x = tensor(&[0.0, 0.0], &[2]).requires_grad_(true).unwrap();
    let y = tensor(&[1.0, 0.25], &[2]);
    let loss = F::binary_cross_entropy_with_logits(&x, &y, Reduction::Sum).unwrap();
    assert!((loss.item().unwrap() - 2.0 * 2f64.ln()).abs() < 1e-12);
    loss.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![-0.5, 0.25]);
}
