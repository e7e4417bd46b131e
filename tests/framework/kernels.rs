//! The eager CPU kernels (gemm matmul, im2col+gemm conv) against the reference interpreter.

use oar::ir::ops::Conv;
use oar::ir::{DType, Op, TensorData};
use oar::tensor::apply_op;
use oar::{Tensor, seed};

fn reference(op: &Op, inputs: &[TensorData]) -> TensorData {
    oar::reference::run_op(op, inputs).unwrap().remove(0)
}

/// Max |a - b| ≤ tol · (1 + |b|) elementwise, same shape.
fn assert_close(a: &TensorData, b: &TensorData, tol: f64, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    for (i, (x, y)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
    }
}

fn rand(shape: &[usize], dtype: DType) -> Tensor {
    oar::uniform(shape, -1.0, 1.0, dtype).unwrap()
}

#[test]
fn matmul_matches_reference() {
    seed(1);
    for (a, b) in [
        (vec![3, 5], vec![5, 4]),
        (vec![2, 1, 3, 5], vec![4, 5, 2]),
        (vec![7, 0], vec![0, 3]),
        (vec![64, 96], vec![96, 80]),
    ] {
        for dtype in [DType::F32, DType::F64] {
            let (x, y) = (rand(&a, dtype), rand(&b, dtype));
            let got = apply_op(Op::MatMul, &[&x, &y]).unwrap().remove(0).data();
            let want = reference(&Op::MatMul, &[x.data(), y.data()]);
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
            assert_close(&got, &want, tol, &format!("matmul {a:?}x{b:?} {dtype}"));
        }
    }
}

#[test]
fn conv_matches_reference() {
    seed(2);
    let conv = |s: Vec<usize>, pb: Vec<usize>, pa: Vec<usize>, d: Vec<usize>, groups| {
        Op::Conv(Conv {
            stride: s,
            pad_before: pb,
            pad_after: pa,
            dilation: d,
            groups,
        })
    };
    let cases = [
        (
            conv(vec![1, 1], vec![1, 1], vec![1, 1], vec![1, 1], 1),
            vec![2, 3, 8, 8],
            vec![4, 3, 3, 3],
        ),
        (
            conv(vec![2, 1], vec![0, 2], vec![1, 0], vec![1, 2], 1),
            vec![1, 2, 9, 7],
            vec![3, 2, 3, 2],
        ),
        (
            conv(vec![1, 1], vec![1, 1], vec![1, 1], vec![1, 1], 4),
            vec![2, 8, 5, 5],
            vec![8, 2, 3, 3],
        ),
        (
            conv(vec![2], vec![1], vec![2], vec![3], 2),
            vec![3, 4, 20],
            vec![6, 2, 4],
        ),
        (
            conv(vec![1, 2, 1], vec![1, 0, 0], vec![0, 1, 0], vec![1, 1, 1], 1),
            vec![1, 2, 4, 5, 3],
            vec![2, 2, 2, 3, 2],
        ),
        // Small planes and more images than threads: several images per product.
        (
            conv(vec![1, 1], vec![1, 1], vec![1, 1], vec![1, 1], 1),
            vec![5, 8, 1, 1],
            vec![6, 8, 3, 3],
        ),
        (
            conv(vec![1, 1], vec![1, 1], vec![1, 1], vec![1, 1], 2),
            vec![7, 4, 4, 4],
            vec![6, 2, 3, 3],
        ),
        (
            conv(vec![2, 1], vec![0, 1], vec![1, 0], vec![1, 2], 1),
            vec![9, 3, 6, 5],
            vec![4, 3, 2, 3],
        ),
    ];
    for (op, xs, ws) in cases {
        for dtype in [DType::F32, DType::F64] {
            let (x, w) = (rand(&xs, dtype), rand(&ws, dtype));
            let got = apply_op(op.clone(), &[&x, &w]).unwrap().remove(0).data();
            let want = reference(&op, &[x.data(), w.data()]);
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
            assert_close(&got, &want, tol, &format!("conv {xs:?} {ws:?} {dtype}"));
        }
    }
}

/// Eager ops run the cpu backend's compiled code (cached per op and operand types), not the
/// interpreter: the same bits as a `to_static` graph on `cpu`, close to the reference (the
/// legalized exp is within 2 ulp), with typed errors and random ops still working.
#[test]
fn eager_ops_run_compiled_cpu_kernels() {
    seed(7);
    let x = rand(&[3, 7, 11], DType::F64);
    let before = oar::tensor::compiled_eager_ops();
    let y = x.exp().unwrap();
    let after = oar::tensor::compiled_eager_ops();
    assert!(after > before || after == 4096, "exp on a new shape compiles");
    let again = x.exp().unwrap();
    assert_eq!(again.to_vec::<f64>().unwrap(), y.to_vec::<f64>().unwrap());
    let want = reference(&Op::Unary(oar::ir::ops::UnaryOp::Exp), &[x.data()]);
    assert_close(&y.data(), &want, 1e-15, "eager exp vs reference");
    // The same op traced and compiled on cpu gives the same bits.
    let spec = oar::jit::InputSpec::new(&[Some(3), Some(7), Some(11)], DType::F64, "x");
    let f = oar::jit::to_static(|xs| Ok(vec![xs[0].exp()?]), &[spec]).unwrap();
    let s = f.with_backend("cpu").unwrap().call(&[&x]).unwrap().remove(0);
    assert_eq!(s.to_vec::<f64>().unwrap(), y.to_vec::<f64>().unwrap());
    // Integer division by zero is still a typed error naming the op.
    let a = Tensor::from_vec(vec![1i32, 2, 3], &[3]).unwrap();
    let b = Tensor::from_vec(vec![1i32, 0, 3], &[3]).unwrap();
    let e = (&a / &b).unwrap_err().to_string();
    assert!(e.contains("div"), "{e}");
    // Random ops (a fresh seed per call) stay correct.
    let u = rand(&[1000], DType::F32).to_vec::<f32>().unwrap();
    assert!(u.iter().all(|v| (-1.0..1.0).contains(v)));
}

/// The reference interpreter is not on the eager path: every op definition's samples
/// (`OpDef::samples`, in their declared dtypes) run eagerly — forward, and backward where the
/// sample is differentiable — and no kernel compiled for them leaves a part of its program
/// to the interpreter (`interpreted_eager_kernels` names any that does, with the reason).
#[test]
fn every_sample_runs_eagerly_without_the_interpreter() {
    use oar::ir::ops::sample::SampleRng;
    let samples = Op::all_samples();
    assert!(samples.len() >= 50, "only {} samples", samples.len());
    let mut ops = std::collections::BTreeSet::new();
    for s in samples {
        ops.insert(s.op.name().to_string());
        let mut rng = SampleRng::for_case(&s.name, 3);
        let xs: Vec<Tensor> = s
            .inputs
            .iter()
            .map(|i| {
                let t = Tensor::from_data(i.domain.tensor(i.dtype, &i.shape, &mut rng));
                if s.grad && i.dtype.is_float() {
                    t.requires_grad_(true).unwrap()
                } else {
                    t
                }
            })
            .collect();
        let refs: Vec<&Tensor> = xs.iter().collect();
        let ys = apply_op(s.op.clone(), &refs).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        if s.grad {
            let loss = ys[0].cast(DType::F64).unwrap().sum(&[], false).unwrap();
            loss.backward().unwrap_or_else(|e| panic!("{} backward: {e}", s.name));
        }
    }
    let interpreted: Vec<String> = oar::tensor::interpreted_eager_kernels()
        .into_iter()
        .filter(|e| {
            ops.iter()
                .any(|op| e.starts_with(&format!("{op}:")) || e.starts_with(&format!("{op} (")))
        })
        .collect();
    assert!(
        interpreted.is_empty(),
        "eager kernels that interpret:\n{}",
        interpreted.join("\n")
    );
}
