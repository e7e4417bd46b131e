//! Tensor-dependent control flow: `#[oar::to_static]` functions and the runtime `cond` /
//! `while_loop` give the same results eagerly and as traced `cond`/`while` graphs.

use oar::jit::{InputSpec, cond, to_static, while_loop};
use oar::{DType, Result, Tensor};

fn t(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn count_ops(g: &oar::ir::Graph, name: &str) -> usize {
    g.node_ids().filter(|&id| g.node(id).op.name() == name).count()
}

/// `x * 2` if the mean of `x` is positive, else `x - 1`; then halve while max |x| > 1.
#[oar::to_static]
fn branchy(x: &Tensor) -> Result<Tensor> {
    let zero = Tensor::scalar(0.0f64);
    let mut y = x.clone();
    if x.mean(&[], false)?.greater_than(&zero)? {
        y = y.scale(2.0, 0.0)?;
    } else {
        y = (&y - &Tensor::scalar(1.0f64))?;
    }
    let one = Tensor::scalar(1.0f64);
    while y.abs()?.max(&[], false)?.greater_than(&one)? {
        y = y.scale(0.5, 0.0)?;
    }
    Ok(y)
}

/// Reference in plain Rust.
fn branchy_ref(x: &[f64]) -> Vec<f64> {
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    let mut y: Vec<f64> = x.iter().map(|v| if mean > 0.0 { v * 2.0 } else { v - 1.0 }).collect();
    while y.iter().fold(0.0f64, |m, v| m.max(v.abs())) > 1.0 {
        y.iter_mut().for_each(|v| *v *= 0.5);
    }
    y
}

#[test]
fn macro_if_and_while_eager_equals_static() {
    let f = to_static(
        |xs| Ok(vec![branchy(&xs[0])?]),
        &[InputSpec::new(&[Some(3)], DType::F64, "x")],
    )
    .unwrap();
    let g = f.graph();
    assert_eq!(count_ops(g, "cond"), 1, "{g}");
    assert_eq!(count_ops(g, "while"), 1, "{g}");
    // Each branch, and 0, 1, 2 and 5 halvings.
    for x in [
        [0.1, 0.2, 0.1],
        [-0.5, 0.2, 0.1],
        [0.3, 0.4, -0.2],
        [1.5, -0.2, 0.3],
        [10.0, 3.0, -2.0],
        [-3.0, 1.0, 0.5],
    ] {
        let xt = t(&x);
        let eager = branchy(&xt).unwrap();
        let stat = f.call(&[&xt]).unwrap().remove(0);
        let want = branchy_ref(&x);
        assert_eq!(vals(&eager), want, "eager {x:?}");
        assert_eq!(vals(&stat), want, "static {x:?}");
    }
}

/// A `Tensor` value of an `if` expression, an `else if`, and plain-Rust `if`/`while` left alone.
#[oar::to_static]
fn mixed(x: &Tensor, double: bool, rounds: usize) -> Result<Tensor> {
    let zero = Tensor::scalar(0.0f64);
    let s = x.sum(&[], false)?;
    let y = if s.greater_than(&zero)? {
        x.scale(3.0, 0.0)?
    } else if s.less_than(&zero)? {
        x.scale(-1.0, 0.0)?
    } else {
        x.clone()
    };
    let mut z = y;
    let mut n = 0usize;
    if double {
        z = z.scale(2.0, 0.0)?;
    }
    while n < rounds {
        z = (&z + &Tensor::scalar(1.0f64))?;
        n += 1;
    }
    let flag = rounds > 100;
    if flag {
        return Ok(zero);
    }
    Ok(z)
}

#[test]
fn value_if_else_if_and_plain_control_flow() {
    for (double, rounds) in [(false, 0), (true, 2)] {
        let f = to_static(
            |xs| Ok(vec![mixed(&xs[0], double, rounds)?]),
            &[InputSpec::new(&[None], DType::F64, "x")],
        )
        .unwrap();
        let g = f.graph();
        // Two tensor conditions (the else-if is a cond inside the else region); the plain
        // `while n < rounds` is unrolled, not a `while` op.
        assert_eq!(count_ops(g, "cond"), 1, "{g}");
        assert_eq!(count_ops(g, "while"), 0, "{g}");
        for x in [vec![1.0, 2.0], vec![-1.0, -2.0, 0.5], vec![1.0, -1.0]] {
            let s: f64 = x.iter().sum();
            let m = if s > 0.0 {
                3.0
            } else if s < 0.0 {
                -1.0
            } else {
                1.0
            };
            let want: Vec<f64> = x
                .iter()
                .map(|v| v * m * if double { 2.0 } else { 1.0 } + rounds as f64)
                .collect();
            let xt = t(&x);
            assert_eq!(vals(&mixed(&xt, double, rounds).unwrap()), want);
            assert_eq!(vals(&f.call(&[&xt]).unwrap()[0]), want);
        }
    }
}

#[test]
fn runtime_cond_and_while_loop() {
    // Eager.
    let x = t(&[1.0, 2.0]);
    let r = cond(
        &Tensor::scalar(true),
        || Ok(vec![x.scale(2.0, 0.0)?]),
        || Ok(vec![x.clone()]),
    )
    .unwrap();
    assert_eq!(vals(&r[0]), vec![2.0, 4.0]);
    let r = cond(
        &Tensor::scalar(0i64),
        || Ok(vec![x.scale(2.0, 0.0)?]),
        || Ok(vec![x.clone()]),
    )
    .unwrap();
    assert_eq!(vals(&r[0]), vec![1.0, 2.0]);
    let limit = Tensor::scalar(10.0f64);
    let r = while_loop(
        |c| c[0].less_than(&limit),
        |c| Ok(vec![c[0].scale(3.0, 0.0)?, (&c[1] + &Tensor::scalar(1i64))?]),
        vec![Tensor::scalar(1.0f64), Tensor::scalar(0i64)],
    )
    .unwrap();
    assert_eq!((r[0].item().unwrap(), r[1].item().unwrap()), (27.0, 3.0));
    // Traced: `limit` (eager) and `k` (traced, an outer value used inside) are captured.
    let f = to_static(
        |xs| {
            let k = xs[1].clone();
            let r = while_loop(
                |c| c[0].less_than(&limit),
                |c| Ok(vec![(&c[0] * &k)?, (&c[1] + &Tensor::scalar(1i64))?]),
                vec![xs[0].clone(), Tensor::scalar(0i64)],
            )?;
            let big = r[1].greater_than(&Tensor::scalar(2i64))?;
            let out = cond(&big, || Ok(vec![r[0].scale(-1.0, 0.0)?]), || Ok(vec![(&r[0] + &k)?]))?;
            Ok(vec![out[0].clone(), r[1].clone()])
        },
        &[
            InputSpec::new(&[], DType::F64, "x"),
            InputSpec::new(&[], DType::F64, "k"),
        ],
    )
    .unwrap();
    oar::ir::verify(f.graph()).unwrap();
    // x=1,k=3: 1→3→9→27 (3 steps) → -27; x=5,k=2: 5→10 (1 step) → 12; x=20: no step → 22.
    for (x, k, want, steps) in [(1.0, 3.0, -27.0, 3.0), (5.0, 2.0, 12.0, 1.0), (20.0, 2.0, 22.0, 0.0)] {
        let outs = f.call(&[&Tensor::scalar(x), &Tensor::scalar(k)]).unwrap();
        assert_eq!(outs[0].item().unwrap(), want);
        assert_eq!(outs[1].item().unwrap(), steps);
    }
}

#[test]
fn branch_type_mismatch_is_a_clear_error() {
    let e = to_static(
        |xs| {
            let p = xs[0].sum(&[], false)?.greater_than(&Tensor::scalar(0.0f32))?;
            cond(&p, || Ok(vec![xs[0].clone()]), || Ok(vec![xs[0].cast(DType::F64)?]))
        },
        &[InputSpec::new(&[Some(2)], DType::F32, "x")],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("then branch returns (f32[2])") && e.contains("else branch returns (f64[2])"),
        "{e}"
    );
    let e = to_static(
        |xs| {
            while_loop(
                |c| c[0].sum(&[], false),
                |c| Ok(vec![c[0].cast(DType::F64)?]),
                vec![xs[0].clone()],
            )
        },
        &[InputSpec::new(&[Some(2)], DType::F32, "x")],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("given (f32[2]) but returns (f64[2])"), "{e}");
    // A condition with more than one element.
    let e = cond(&t(&[1.0, 2.0]), || Ok(vec![]), || Ok(vec![]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("one element"), "{e}");
    // Eager loops are capped instead of hanging.
    let e = while_loop(|_| Ok(Tensor::scalar(true)), |c| Ok(c.to_vec()), vec![])
        .unwrap_err()
        .to_string();
    assert!(e.contains("iterations"), "{e}");
}

/// A layer whose `forward` (a method) branches on its input and reads a parameter in a branch.
struct Gate {
    w: Tensor,
}

impl oar::nn::Layer for Gate {
    #[oar::to_static]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        if x.sum(&[], false)?.greater_than(&Tensor::scalar(0.0f32))? {
            y = (&y * &self.w)?;
        }
        Ok(y)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("w".into(), self.w.clone())]
    }
}

#[test]
fn method_on_a_layer_with_a_parameter_in_a_branch() {
    let layer = Gate {
        w: Tensor::from_vec(vec![2.0f32, -3.0], &[2]).unwrap(),
    };
    let f = oar::jit::to_static_layer(&layer, &InputSpec::new(&[None, Some(2)], DType::F32, "x")).unwrap();
    assert_eq!(count_ops(f.graph(), "cond"), 1, "{}", f.graph());
    assert!(f.weights().contains_key("w"));
    let _ng = oar::no_grad();
    for (x, want) in [
        (vec![1.0f32, 2.0, 3.0, 4.0], vec![2.0f32, -6.0, 6.0, -12.0]),
        (vec![-1.0f32, 0.0, 0.0, -4.0], vec![-1.0f32, 0.0, 0.0, -4.0]),
    ] {
        let xt = Tensor::from_vec(x, &[2, 2]).unwrap();
        use oar::nn::Layer;
        assert_eq!(layer.forward(&xt).unwrap().to_vec::<f32>().unwrap(), want);
        assert_eq!(f.call(&[&xt]).unwrap()[0].to_vec::<f32>().unwrap(), want);
    }
}
