//! Recurrent cells: `lstm_cell` and `gru_cell`, one time step's element-wise part after the
//! two matrix products (`x Wᵢₕᵀ + bᵢₕ` and `h Wₕₕᵀ + bₕₕ`), so an eager RNN runs each step's
//! gates as one fused kernel and their gradient as another instead of a dozen small ops.
//! Gate orders follow PyTorch and Paddle.

use super::super::rules::{R, arity, elements, float, out_elements, same_dtype};
use super::super::sample::{Sample, input};
use super::activation::sigmoid;
use super::{V, composite_def, slice};
use crate::eval::{Data, EvalCx, Res, Value};
use crate::ops::{BinaryOp, Composite, OpDef, SliceRange, UnaryOp, op_struct};
use crate::{DType, Dim, Emitter, Graph, Op, TensorType};
use ndarray::{ArrayD, Ix2};

op_struct! {
    /// One LSTM step: `lstm_cell(xg[N, 4H], hg[N, 4H], c[N, H]) -> (h', c')` with the gate
    /// pre-activations `xg + hg` split as i, f, g, o: `c' = σ(f) c + σ(i) tanh(g)`,
    /// `h' = σ(o) tanh(c')`.
    LstmCell "lstm_cell"
}

op_struct! {
    /// One GRU step: `gru_cell(xg[N, 3H], hg[N, 3H], h[N, H]) -> h'` with r, z, n:
    /// `r = σ(x_r + h_r)`, `z = σ(x_z + h_z)`, `n = tanh(x_n + r h_n)`, `h' = n + z (h − n)`.
    GruCell "gru_cell"
}

/// The type rule both cells share: `gates` gate blocks of the state's width `H`.
fn cell_types(inputs: &[TensorType], gates: usize, name: &str) -> Result<TensorType, String> {
    arity(inputs, 3)?;
    let (xg, hg, s) = (&inputs[0], &inputs[1], &inputs[2]);
    float(xg)?;
    same_dtype(xg, hg)?;
    same_dtype(xg, s)?;
    let err = || format!("{name} needs xg[N, {gates}H], hg[N, {gates}H] and a state [N, H], got {xg}, {hg} and {s}");
    if xg.shape != hg.shape || xg.rank() != 2 || s.rank() != 2 || xg.shape.0[0] != s.shape.0[0] {
        return Err(err());
    }
    match (&xg.shape.0[1], &s.shape.0[1]) {
        (Dim::Static(g), Dim::Static(h)) if *g == gates * h => Ok(s.clone()),
        (Dim::Static(_), Dim::Static(_)) => Err(err()),
        _ => Err(format!("{name} needs a static hidden size, got {s}")),
    }
}

/// Gate block `k` (of width `h`) of `v[N, G·H]`.
fn gate<E: Emitter>(g: &mut E, v: E::Value, k: usize, h: usize) -> V<E> {
    slice(
        g,
        v,
        vec![SliceRange::FULL, SliceRange::new((k * h) as i64, ((k + 1) * h) as i64)],
    )
}

/// The hidden size of a cell from its state's type.
fn hidden(t: &TensorType) -> usize {
    t.shape.0[1].as_static().unwrap_or(0)
}

/// The 2-d float operands of a cell for the reference.
fn matrices<'a>(cx: &dyn EvalCx, ins: &[&'a Value]) -> Res<Vec<ndarray::ArrayView2<'a, f64>>> {
    crate::eval::arity(cx.site(), ins, &[3])?;
    ins.iter()
        .map(|v| {
            v.as_f(cx.site(), "operand")?
                .view()
                .into_dimensionality::<Ix2>()
                .map_err(|e| cx.site().err(e.to_string()))
        })
        .collect()
}

/// The samples of a cell with `gates` gate blocks: f32 (batch 3, hidden 2) and f64 (batch 2,
/// hidden 3).
fn cell_samples(name: &str, cell: Composite, gates: usize) -> Vec<Sample> {
    [(DType::F32, 3, 2), (DType::F64, 2, 3)]
        .into_iter()
        .map(|(d, n, h)| {
            Sample::new(
                format!("{name}/{d}"),
                Op::Composite(cell.clone()),
                vec![input(d, &[n, gates * h]), input(d, &[n, gates * h]), input(d, &[n, h])],
            )
        })
        .collect()
}

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

impl OpDef for LstmCell {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        let s = cell_types(inputs, 4, "lstm_cell")?;
        Ok(vec![s.clone(), s])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(30 * elements(outputs.first()?)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let h = hidden(&types[2]);
        let mut run = || -> Result<Vec<E::Value>, E::Error> {
            let gates = g.binary(BinaryOp::Add, x[0], x[1])?;
            let i = gate(g, gates, 0, h)?;
            let i = sigmoid(g, i)?;
            let f = gate(g, gates, 1, h)?;
            let f = sigmoid(g, f)?;
            let c = gate(g, gates, 2, h)?;
            let c = g.unary(UnaryOp::Tanh, c)?;
            let o = gate(g, gates, 3, h)?;
            let o = sigmoid(g, o)?;
            let keep = g.binary(BinaryOp::Mul, f, x[2])?;
            let new = g.binary(BinaryOp::Mul, i, c)?;
            let c2 = g.binary(BinaryOp::Add, keep, new)?;
            let t = g.unary(UnaryOp::Tanh, c2)?;
            let h2 = g.binary(BinaryOp::Mul, o, t)?;
            Ok(vec![h2, c2])
        };
        Some(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let m = matrices(cx, ins)?;
        let (xg, hg, c) = (&m[0], &m[1], &m[2]);
        let (n, h) = c.dim();
        let mut h2 = ArrayD::<f64>::zeros(vec![n, h]);
        let mut c2 = ArrayD::<f64>::zeros(vec![n, h]);
        for r in 0..n {
            for j in 0..h {
                let z = |k: usize| xg[[r, k * h + j]] + hg[[r, k * h + j]];
                let cn = sig(z(1)) * c[[r, j]] + sig(z(0)) * z(2).tanh();
                c2[[r, j]] = cn;
                h2[[r, j]] = sig(z(3)) * cn.tanh();
            }
        }
        Ok(vec![ins[2].with(Data::F(h2)), ins[2].with(Data::F(c2))])
    }

    fn samples() -> Vec<Sample> {
        cell_samples("lstm_cell", Composite::LstmCell, 4)
    }
}

impl OpDef for GruCell {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        Ok(vec![cell_types(inputs, 3, "gru_cell")?])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(25 * out_elements(outputs)?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let h = hidden(&types[2]);
        let mut run = || -> Result<Vec<E::Value>, E::Error> {
            let (xr, hr) = (gate(g, x[0], 0, h)?, gate(g, x[1], 0, h)?);
            let r = g.binary(BinaryOp::Add, xr, hr)?;
            let r = sigmoid(g, r)?;
            let (xz, hz) = (gate(g, x[0], 1, h)?, gate(g, x[1], 1, h)?);
            let z = g.binary(BinaryOp::Add, xz, hz)?;
            let z = sigmoid(g, z)?;
            let (xn, hn) = (gate(g, x[0], 2, h)?, gate(g, x[1], 2, h)?);
            let rh = g.binary(BinaryOp::Mul, r, hn)?;
            let n = g.binary(BinaryOp::Add, xn, rh)?;
            let n = g.unary(UnaryOp::Tanh, n)?;
            let d = g.binary(BinaryOp::Sub, x[2], n)?;
            let zd = g.binary(BinaryOp::Mul, z, d)?;
            Ok(vec![g.binary(BinaryOp::Add, n, zd)?])
        };
        Some(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let m = matrices(cx, ins)?;
        let (xg, hg, hs) = (&m[0], &m[1], &m[2]);
        let (n, h) = hs.dim();
        let mut out = ArrayD::<f64>::zeros(vec![n, h]);
        for r in 0..n {
            for j in 0..h {
                let x = |k: usize| xg[[r, k * h + j]];
                let y = |k: usize| hg[[r, k * h + j]];
                let rg = sig(x(0) + y(0));
                let zg = sig(x(1) + y(1));
                let ng = (x(2) + rg * y(2)).tanh();
                out[[r, j]] = ng + zg * (hs[[r, j]] - ng);
            }
        }
        Ok(vec![ins[2].with(Data::F(out))])
    }

    fn samples() -> Vec<Sample> {
        cell_samples("gru_cell", Composite::GruCell, 3)
    }
}
