//! Eager tensors and autograd: values by hand, gradients by hand and by finite differences.

use oar::ir::DType;
use oar::ir::ops::Softmax;
use oar::{Tensor, no_grad};

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
fn ops_compute_immediately() {
    let a = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = t(&[10.0, 20.0], &[2]);
    let c = (&a + &b).unwrap();
    assert_eq!(c.to_vec::<f64>().unwrap(), vec![11.0, 22.0, 13.0, 24.0]);
    let m = a.matmul(&a).unwrap();
    assert_eq!(m.to_vec::<f64>().unwrap(), vec![7.0, 10.0, 15.0, 22.0]);
    assert_eq!(a.sum(&[], false).unwrap().item().unwrap(), 10.0);
    assert_eq!(a.mean(&[-1], false).unwrap().to_vec::<f64>().unwrap(), vec![1.5, 3.5]);
    assert_eq!(a.reshape(&[-1]).unwrap().shape(), vec![4]);
    assert_eq!(a.t().unwrap().to_vec::<f64>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
    assert_eq!(a.get(-1).unwrap().to_vec::<f64>().unwrap(), vec![3.0, 4.0]);
    let s = oar::stack(&[&b, &b], 0).unwrap();
    // Paddle-style free functions are the methods.
    assert_eq!(
        oar::sum(&a, &[0], false).unwrap().to_vec::<f64>().unwrap(),
        vec![4.0, 6.0]
    );
    assert_eq!(oar::sqrt(&a).unwrap().to_vec::<f64>().unwrap()[3], 2.0);
    assert_eq!(
        oar::transpose(&a, &[1, 0]).unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 3.0, 2.0, 4.0]
    );
    assert_eq!(s.shape(), vec![2, 2]);
    // Errors are typed and name the op and the shapes.
    let e = a.matmul(&t(&[1.0, 2.0, 3.0], &[3, 1])).unwrap_err().to_string();
    assert!(
        e.contains("matmul") && e.contains("f64[2,2]") && e.contains("f64[3,1]"),
        "{e}"
    );
    assert!(a.reshape(&[3, -1]).is_err());
    assert!(a.get(2).is_err());
}

#[test]
fn creation_and_seeded_randomness() {
    assert_eq!(
        oar::arange(0.0, 5.0, 2.0, DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![0, 2, 4]
    );
    assert_eq!(
        oar::linspace(0.0, 1.0, 5, DType::F64).unwrap().to_vec::<f64>().unwrap(),
        vec![0.0, 0.25, 0.5, 0.75, 1.0]
    );
    oar::seed(7);
    let a = oar::randn(&[100], DType::F32).unwrap().to_vec::<f32>().unwrap();
    oar::seed(7);
    let b = oar::randn(&[100], DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b);
    let mean = a.iter().sum::<f32>() / 100.0;
    assert!(mean.abs() < 0.3, "{mean}");
    let u = oar::rand(&[1000], DType::F64).unwrap().to_vec::<f64>().unwrap();
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    assert!(oar::rand(&[2], DType::I32).is_err());
    assert!(oar::arange(0.0, 1.0, 0.0, DType::F32).is_err());
    assert!(oar::zeros(&[usize::MAX, 4], DType::F32).is_err());
}

#[test]
fn backward_through_an_mlp_matches_hand_gradients() {
    // loss = sum(relu(x @ w + b)); d/dw = xᵀ · mask, d/db = colsum(mask)
    let x = t(&[1.0, -2.0, 0.5, 3.0], &[2, 2]);
    let w = t(&[0.5, -1.0, 1.5, 2.0], &[2, 2]).requires_grad_(true).unwrap();
    let b = t(&[0.1, -0.2], &[2]).requires_grad_(true).unwrap();
    let h = (&x.matmul(&w).unwrap() + &b).unwrap();
    let zero = oar::zeros(&[], DType::F64).unwrap();
    let y = h.maximum(&zero).unwrap();
    let loss = y.sum(&[], false).unwrap();
    assert!(loss.requires_grad() && !loss.is_leaf());
    loss.backward().unwrap();
    // h = [[1*.5-2*1.5+.1, 1*-1-2*2-.2], [.5*.5+3*1.5+.1, .5*-1+3*2-.2]] = [[-2.4,-5.2],[4.85,5.3]]
    // mask = [[0,0],[1,1]]; dW = xᵀ mask = [[0.5,0.5],[3,3]]; db = [1,1]
    assert_eq!(w.grad().unwrap().to_vec::<f64>().unwrap(), vec![0.5, 0.5, 3.0, 3.0]);
    assert_eq!(b.grad().unwrap().to_vec::<f64>().unwrap(), vec![1.0, 1.0]);
    assert!(x.grad().is_none(), "x has stop_gradient = true");
}

#[test]
fn gradients_accumulate_until_cleared() {
    let w = t(&[2.0], &[1]).requires_grad_(true).unwrap();
    for _ in 0..3 {
        let y = (&w * &w).unwrap().sum(&[], false).unwrap();
        y.backward().unwrap();
    }
    assert_eq!(w.grad().unwrap().to_vec::<f64>().unwrap(), vec![12.0]);
    w.clear_grad();
    assert!(w.grad().is_none());
}

#[test]
fn slice_gradients_add_into_their_windows() {
    // y = 3x is used whole and through three slices (rows, strided columns, negative start,
    // twice); the tape adds each slice's gradient into its window of y's gradient in place.
    // dx = 3 (wy + wa on rows 1..3 + wb on columns 0, 2, 4 + 2 on the last two columns).
    for dtype in [DType::F64, DType::F32] {
        let (r, c) = (4usize, 6usize);
        let vals = |seed: f64| -> Vec<f64> { (0..r * c).map(|i| ((i as f64 + seed) * 0.37).sin()).collect() };
        let x = t(&vals(0.0), &[r, c])
            .cast(dtype)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let wy = t(&vals(1.0), &[r, c]).cast(dtype).unwrap();
        let wa: Vec<f64> = vals(2.0)[..2 * c].to_vec();
        let wb: Vec<f64> = vals(3.0)[..r * 3].to_vec();
        let y = (&x * 3.0).unwrap();
        let a = y.slice(0, 1, 3, 1).unwrap();
        let b = y.slice(1, 0, 6, 2).unwrap();
        let cut = |y: &Tensor| y.slice(1, -2, i64::MAX, 1).unwrap().sum(&[], false).unwrap();
        let terms = [
            (&y * &wy).unwrap().sum(&[], false).unwrap(),
            (&a * &t(&wa, &[2, c]).cast(dtype).unwrap())
                .unwrap()
                .sum(&[], false)
                .unwrap(),
            (&b * &t(&wb, &[r, 3]).cast(dtype).unwrap())
                .unwrap()
                .sum(&[], false)
                .unwrap(),
            cut(&y),
            cut(&y),
        ];
        let mut loss = terms[0].clone();
        for term in &terms[1..] {
            loss = (&loss + term).unwrap();
        }
        loss.backward().unwrap();
        let wyv = vals(1.0);
        let mut want = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                let mut d = wyv[i * c + j];
                if (1..3).contains(&i) {
                    d += wa[(i - 1) * c + j];
                }
                if j % 2 == 0 {
                    d += wb[i * 3 + j / 2];
                }
                if j >= c - 2 {
                    d += 2.0;
                }
                want[i * c + j] = 3.0 * d;
            }
        }
        let got = x.grad().unwrap().cast(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        assert!(close(&got, &want, tol), "{dtype}: {got:?} vs {want:?}");
    }
}

#[test]
fn retain_graph_allows_a_second_backward() {
    let w = t(&[3.0], &[1]).requires_grad_(true).unwrap();
    let y = w.exp().unwrap().sum(&[], false).unwrap();
    y.backward_with(None, true).unwrap();
    y.backward().unwrap();
    assert!(close(
        &w.grad().unwrap().to_vec::<f64>().unwrap(),
        &[2.0 * 3f64.exp()],
        1e-12
    ));
    let e = y.backward().unwrap_err().to_string();
    assert!(e.contains("retain_graph"), "{e}");
}

#[test]
fn no_grad_and_stop_gradient() {
    let w = t(&[1.0, 2.0], &[2]).requires_grad_(true).unwrap();
    {
        let _g = no_grad();
        let y = (&w * 2.0).unwrap();
        assert!(!y.requires_grad());
    }
    let y = (&w.detach() * 2.0).unwrap();
    assert!(!y.requires_grad());
    assert!(y.sum(&[], false).unwrap().backward().is_err());
    assert!(
        oar::arange(0.0, 3.0, 1.0, DType::I64)
            .unwrap()
            .set_stop_gradient(false)
            .is_err()
    );
}

#[test]
fn composites_run_eagerly_and_differentiate() {
    use oar::ir::{Composite, Op};
    // softmax rows sum to one; d/dx sum(softmax(x) * r) checked by finite differences.
    let x = t(&[0.3, -1.2, 2.0, 0.7, 0.1, -0.4], &[2, 3])
        .requires_grad_(true)
        .unwrap();
    let r = t(&[1.0, -2.0, 0.5, 0.3, 1.5, -1.0], &[2, 3]);
    let f = |x: &Tensor| -> Tensor {
        let s = oar::tensor::apply_op(Op::Composite(Composite::Softmax(Softmax { axis: 1 })), &[x])
            .unwrap()
            .remove(0);
        (&s * &r).unwrap().sum(&[], false).unwrap()
    };
    let loss = f(&x);
    loss.backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f64>().unwrap();
    let base = x.to_vec::<f64>().unwrap();
    for j in 0..base.len() {
        let mut p = base.clone();
        p[j] += 1e-6;
        let mut m = base.clone();
        m[j] -= 1e-6;
        let num = (f(&t(&p, &[2, 3])).item().unwrap() - f(&t(&m, &[2, 3])).item().unwrap()) / 2e-6;
        assert!((g[j] - num).abs() < 1e-6, "d/dx[{j}]: {} vs {num}", g[j]);
    }
}

#[test]
fn display_and_npy_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let a = t(&[1.5, -2.0], &[2]).requires_grad_(true).unwrap();
    assert!(a.to_string().contains("stop_gradient=false"));
    let p = dir.path().join("a.npy");
    a.save_npy(&p).unwrap();
    assert_eq!(Tensor::load_npy(&p).unwrap().to_vec::<f64>().unwrap(), vec![1.5, -2.0]);
    let e = Tensor::load_npy(dir.path().join("missing.npy"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.npy"), "{e}");
}

#[test]
fn cross_entropy_rejects_out_of_range_labels() {
    use oar::nn::functional::cross_entropy;
    let logits = t(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[2, 3]);
    let labels = Tensor::from_vec(vec![0i64, 3], &[2]).unwrap();
    let e = cross_entropy(&logits, &labels, oar::nn::Reduction::Mean)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cross_entropy") && e.contains("label 3") && e.contains("3 classes"),
        "{e}"
    );
    let ok = Tensor::from_vec(vec![0i64, 2], &[2]).unwrap();
    // -log softmax: row 0 picks 0.1, row 1 picks 0.6 (the row max); by hand.
    let lse = |a: f64, b: f64, c: f64| (a.exp() + b.exp() + c.exp()).ln();
    let want = ((lse(0.1, 0.2, 0.3) - 0.1) + (lse(0.4, 0.5, 0.6) - 0.6)) / 2.0;
    let got = cross_entropy(&logits, &ok, oar::nn::Reduction::Mean)
        .unwrap()
        .item()
        .unwrap();
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
}

/// Reshape, transpose, slice and expand share the source's memory (O(1), as in PyTorch); the
/// values read through them, the gradients through them, and a later in-place update of the
/// source (which a view must not see: values stay values) are checked by hand.
#[test]
fn views_share_memory_compute_like_copies_and_do_not_alias_writes() {
    use oar::optimizer::Optimizer;
    let v: Vec<f64> = (0..24).map(f64::from).collect();
    let x = t(&v, &[2, 3, 4]).requires_grad_(true).unwrap();
    let r = x.reshape(&[6, 4]).unwrap();
    let p = x.transpose(&[2, 0, 1]).unwrap(); // [4, 2, 3]: p[k][i][j] = x[i][j][k]
    let s = p.slice(2, 1, 3, 1).unwrap(); // [4, 2, 2]
    let e = x.slice(2, 0, 1, 1).unwrap().broadcast_to(&[5, 2, 3, 3]).unwrap();
    for view in [&r, &p, &s, &e] {
        assert!(view.shares_memory(&x), "a view copied its source");
    }
    assert!(r.is_contiguous() && !p.is_contiguous() && !s.is_contiguous() && !e.is_contiguous());
    // A view of a view composes without copying where strides can say it (splitting the
    // transposed axis), and copies where they cannot (merging the sliced axes), as in PyTorch.
    assert!(!s.reshape(&[4, 4]).unwrap().shares_memory(&x));
    let ps = s.reshape(&[2, 2, 2, 2]).unwrap();
    assert!(ps.shares_memory(&x));
    let mut want = Vec::new();
    for k in 0..4 {
        for i in 0..2 {
            for j in 1..3 {
                want.push(v[i * 12 + j * 4 + k]);
            }
        }
    }
    assert_eq!(ps.to_vec::<f64>().unwrap(), want);
    let ev = e.to_vec::<f64>().unwrap();
    assert_eq!(ev.len(), 90);
    assert!(
        ev.chunks(3)
            .enumerate()
            .all(|(q, c)| c.iter().all(|&y| y == v[(q % 6) * 4]))
    );
    // Kernels take views: values and gradients as through copies. d/dx of Σ w·ps puts w's
    // entries back where the transpose and slice took them; untouched elements get 0.
    let w: Vec<f64> = (0..16).map(|i| 1.0 + f64::from(i)).collect();
    let loss = (&ps * &t(&w, &[2, 2, 2, 2])).unwrap().sum(&[], false).unwrap();
    assert_eq!(
        loss.item().unwrap(),
        want.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>()
    );
    loss.backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f64>().unwrap();
    let mut want_g = vec![0.0; 24];
    let mut n = 0;
    for k in 0..4 {
        for i in 0..2 {
            for j in 1..3 {
                want_g[i * 12 + j * 4 + k] = w[n];
                n += 1;
            }
        }
    }
    assert_eq!(g, want_g);
    // `contiguous` copies once; the copy no longer shares memory, the value is the same.
    let c = p.contiguous().unwrap();
    assert!(c.is_contiguous() && !c.shares_memory(&x));
    // An in-place update of the source (an optimizer step) leaves the views' values alone.
    let before = r.to_vec::<f64>().unwrap();
    let r2 = x.reshape(&[4, 6]).unwrap();
    let mut sgd = oar::optimizer::SGD::new(vec![x.clone()], 1.0);
    sgd.step().unwrap();
    assert_eq!(x.to_vec::<f64>().unwrap()[1], v[1] - want_g[1]);
    assert_eq!(r.to_vec::<f64>().unwrap(), before);
    assert_eq!(r2.to_vec::<f64>().unwrap(), v);
}
