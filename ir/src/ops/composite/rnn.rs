//! Recurrent cells: `lstm_cell` and `gru_cell`, one time step's element-wise part after the
//! two matrix products (`x Wᵢₕᵀ + bᵢₕ` and `h Wₕₕᵀ + bₕₕ`), so an eager RNN runs each step's
//! gates as one fused kernel and their gradient as another instead of a dozen small ops; and
//! `lstm_seq` / `gru_seq`, a whole LSTM / GRU layer's recurrence over a sequence (the cpu
//! backend runs them, and eager mode their gradients, as native kernels). Gate orders follow PyTorch and Paddle.

use super::super::rules::{R, arity, elements, float, out_elements, same_dtype};
use super::super::sample::{Sample, input};
use super::activation::sigmoid;
use super::{V, composite_def, slice};
use crate::eval::{Data, EvalCx, Res, Value};
use crate::ops::{BinaryOp, Composite, Concat, OpDef, Permute, SliceRange, UnaryOp, op_struct};
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

op_struct! {
    /// A whole LSTM layer's recurrence after its input projection:
    /// `lstm_seq(xg[N, T, 4H], w_hh[4H, H], h0[N, H], c0[N, H]) -> (y[N, T, H], h[N, H], c[N, H])`.
    /// Step by step — from `t = 0`, or from the last step with `reverse` —
    /// `(h, c) = lstm_cell(xg[:, t], h w_hhᵀ, c)` and `y[:, t] = h`; the results are `y` and the
    /// last step's `h` and `c`. Both biases belong in `xg` (`x Wᵢₕᵀ + bᵢₕ + bₕₕ`).
    LstmSeq "lstm_seq" {
        /// Run the steps from the last to the first (a bidirectional layer's backward half).
        reverse: bool,
    }
}

op_struct! {
    /// A whole GRU layer's recurrence after its input projection:
    /// `gru_seq(xg[N, T, 3H], w_hh[3H, H], b_hh[3H], h0[N, H]) -> (y[N, T, H], h[N, H])`.
    /// Step by step — from `t = 0`, or from the last step with `reverse` —
    /// `h = gru_cell(xg[:, t], h w_hhᵀ + b_hh, h)` and `y[:, t] = h`; the results are `y` and the
    /// last step's `h`. `b_ih` belongs in `xg`; `b_hh` stays apart (its `n` part is scaled by `r`).
    GruSeq "gru_seq" {
        /// Run the steps from the last to the first (a bidirectional layer's backward half).
        reverse: bool,
    }
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

/// The checks both sequence ops share, on `xg[N, T, G·H]` (operand 0), `w_hh[G·H, H]` (operand 1)
/// and the state `h0[N, H]` (operand `state`), with `layout` naming every operand for errors:
/// `(N, T, H)` as dims and the state type. Each op checks its remaining operand itself.
fn seq_types(
    name: &str,
    layout: &str,
    inputs: &[TensorType],
    gates: usize,
    state: usize,
) -> Result<(Dim, usize, usize, TensorType), String> {
    arity(inputs, 4)?;
    let (xg, w, h0) = (&inputs[0], &inputs[1], &inputs[state]);
    float(xg)?;
    for t in &inputs[1..] {
        same_dtype(xg, t)?;
    }
    let got: Vec<String> = inputs.iter().map(|t| t.to_string()).collect();
    let err = || format!("{name} needs {layout}, got {}", got.join(", "));
    if xg.rank() != 3 || w.rank() != 2 || h0.rank() != 2 || xg.shape.0[0] != h0.shape.0[0] {
        return Err(err());
    }
    let (Some(t), Some(g), Some(h)) = (
        xg.shape.0[1].as_static(),
        xg.shape.0[2].as_static(),
        h0.shape.0[1].as_static(),
    ) else {
        return Err(format!(
            "{name} needs a static sequence length and hidden size, got xg {xg} and h0 {h0}"
        ));
    };
    let w_ok = w.shape.0[0].as_static() == Some(gates * h) && w.shape.0[1].as_static() == Some(h);
    if g != gates * h || !w_ok || t == 0 {
        return Err(err());
    }
    Ok((xg.shape.0[0].clone(), t, h, h0.clone()))
}

/// The steps of a sequence of `t` in the order the recurrence runs them.
fn steps(t: usize, reverse: bool) -> Vec<usize> {
    if reverse {
        (0..t).rev().collect()
    } else {
        (0..t).collect()
    }
}

/// The decomposition both sequence ops share: for each step `s` (in [`steps`] order), `xg[:, s]`
/// as `[N, G·H]` and `h w_hhᵀ` (`h` the state's first value) go to `cell`, which returns the new
/// state; results `[y, state…]`, `y` the steps' `h` concatenated on axis 1.
fn unroll<E: Emitter>(
    g: &mut E,
    (xg, w): (E::Value, E::Value),
    mut state: Vec<E::Value>,
    state_ty: &TensorType,
    (t, gates, reverse): (usize, usize, bool),
    mut cell: impl FnMut(&mut E, E::Value, E::Value, &[E::Value]) -> Result<Vec<E::Value>, E::Error>,
) -> Result<Vec<E::Value>, E::Error> {
    let (n, h) = (state_ty.shape.0[0].clone(), hidden(state_ty));
    let w_t = g.add_op1(Op::Permute(Permute { perm: vec![1, 0] }), &[w])?;
    let mut ys = vec![None; t];
    for s in steps(t, reverse) {
        let r = SliceRange::new(s as i64, s as i64 + 1);
        let xs = slice(g, xg, vec![SliceRange::FULL, r, SliceRange::FULL])?;
        let xs = super::reshape(g, xs, vec![n.clone(), Dim::Static(gates * h)])?;
        let hg = g.add_op1(Op::MatMul, &[state[0], w_t])?;
        state = cell(g, xs, hg, &state)?;
        ys[s] = Some(super::reshape(
            g,
            state[0],
            vec![n.clone(), Dim::Static(1), Dim::Static(h)],
        )?);
    }
    let ys: Vec<E::Value> = ys.into_iter().flatten().collect();
    let y = if ys.len() == 1 {
        ys[0]
    } else {
        g.add_op1(Op::Concat(Concat { axis: 1 }), &ys)?
    };
    Ok(std::iter::once(y).chain(state).collect())
}

/// The type of a sequence op's `y[N, T, H]`.
fn seq_output(n: Dim, t: usize, h: usize, state: &TensorType) -> TensorType {
    TensorType::new(state.dtype, crate::Shape(vec![n, Dim::Static(t), Dim::Static(h)]))
}

impl OpDef for LstmSeq {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        let layout = "xg[N, T, 4H], w_hh[4H, H], h0[N, H] and c0[N, H]";
        let (n, t, h, state) = seq_types("lstm_seq", layout, inputs, 4, 2)?;
        if inputs[3] != state {
            return Err(format!("lstm_seq needs c0 of h0's type {state}, got {}", inputs[3]));
        }
        Ok(vec![seq_output(n, t, h, &state), state.clone(), state])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        // Per step and state element: the recurrent product's 4H multiply-adds, and the cell.
        let state = elements(inputs.get(2)?)?;
        let (t, h) = (
            inputs[0].shape.0[1].as_static()? as u64,
            inputs[2].shape.0[1].as_static()? as u64,
        );
        Some(t * state * (8 * h + 30))
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let (t, state) = (types[0].shape.0[1].as_static().unwrap_or(0), &types[2]);
        let gates = TensorType::new(
            state.dtype,
            crate::Shape(vec![state.shape.0[0].clone(), Dim::Static(4 * hidden(state))]),
        );
        let cell_types = [gates.clone(), gates, state.clone()];
        let run = unroll(
            g,
            (x[0], x[1]),
            vec![x[2], x[3]],
            state,
            (t, 4, self.reverse),
            |g, xs, hg, hc| {
                LstmCell
                    .decompose(g, &[xs, hg, hc[1]], &cell_types, &[])
                    .expect("lstm_cell decomposes")
            },
        );
        Some(run)
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[4])?;
        let f = |i: usize| ins[i].as_f(cx.site(), "operand");
        let (xg, w, h0, c0) = (f(0)?, f(1)?, f(2)?, f(3)?);
        let (n, t, h) = (xg.shape()[0], xg.shape()[1], h0.shape()[1]);
        let (mut hs, mut cs) = (h0.to_owned(), c0.to_owned());
        let mut y = ArrayD::<f64>::zeros(vec![n, t, h]);
        for s in steps(t, self.reverse) {
            let (mut h2, mut c2) = (hs.clone(), cs.clone());
            for r in 0..n {
                for j in 0..h {
                    let z = |k: usize| {
                        let rec: f64 = (0..h).map(|i| hs[[r, i]] * w[[k * h + j, i]]).sum();
                        xg[[r, s, k * h + j]] + rec
                    };
                    let cn = sig(z(1)) * cs[[r, j]] + sig(z(0)) * z(2).tanh();
                    c2[[r, j]] = cn;
                    h2[[r, j]] = sig(z(3)) * cn.tanh();
                    y[[r, s, j]] = h2[[r, j]];
                }
            }
            (hs, cs) = (h2, c2);
        }
        Ok(vec![
            ins[2].with(Data::F(y)),
            ins[2].with(Data::F(hs)),
            ins[2].with(Data::F(cs)),
        ])
    }

    fn samples() -> Vec<Sample> {
        let seq = |reverse| Op::Composite(Composite::LstmSeq(LstmSeq { reverse }));
        let case = |d: DType, n: usize, t: usize, h: usize| {
            vec![
                input(d, &[n, t, 4 * h]),
                input(d, &[4 * h, h]),
                input(d, &[n, h]),
                input(d, &[n, h]),
            ]
        };
        vec![
            Sample::new("lstm_seq/f32", seq(false), case(DType::F32, 2, 3, 2)),
            Sample::new("lstm_seq/f32/reverse", seq(true), case(DType::F32, 3, 4, 3)),
            Sample::new("lstm_seq/f64/one_step", seq(false), case(DType::F64, 2, 1, 3)),
        ]
    }
}

impl OpDef for GruSeq {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        let layout = "xg[N, T, 3H], w_hh[3H, H], b_hh[3H] and h0[N, H]";
        let (n, t, h, state) = seq_types("gru_seq", layout, inputs, 3, 3)?;
        let b = &inputs[2];
        if b.rank() != 1 || b.shape.0[0].as_static() != Some(3 * h) {
            return Err(format!("gru_seq needs {layout}, got b_hh {b}"));
        }
        Ok(vec![seq_output(n, t, h, &state), state])
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        // Per step and state element: the recurrent product's 3H multiply-adds, and the cell.
        let state = elements(inputs.get(3)?)?;
        let (t, h) = (
            inputs[0].shape.0[1].as_static()? as u64,
            inputs[3].shape.0[1].as_static()? as u64,
        );
        Some(t * state * (6 * h + 25))
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let (t, state) = (types[0].shape.0[1].as_static().unwrap_or(0), &types[3]);
        let gates = TensorType::new(
            state.dtype,
            crate::Shape(vec![state.shape.0[0].clone(), Dim::Static(3 * hidden(state))]),
        );
        let cell_types = [gates.clone(), gates, state.clone()];
        let run = unroll(
            g,
            (x[0], x[1]),
            vec![x[3]],
            state,
            (t, 3, self.reverse),
            |g, xs, hg, h| {
                let hg = g.binary(BinaryOp::Add, hg, x[2])?;
                GruCell
                    .decompose(g, &[xs, hg, h[0]], &cell_types, &[])
                    .expect("gru_cell decomposes")
            },
        );
        Some(run)
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[4])?;
        let f = |i: usize| ins[i].as_f(cx.site(), "operand");
        let (xg, w, b, h0) = (f(0)?, f(1)?, f(2)?, f(3)?);
        let (n, t, h) = (xg.shape()[0], xg.shape()[1], h0.shape()[1]);
        let mut hs = h0.to_owned();
        let mut y = ArrayD::<f64>::zeros(vec![n, t, h]);
        for s in steps(t, self.reverse) {
            let mut h2 = hs.clone();
            for r in 0..n {
                for j in 0..h {
                    let hg = |k: usize| -> f64 {
                        b[[k * h + j]] + (0..h).map(|i| hs[[r, i]] * w[[k * h + j, i]]).sum::<f64>()
                    };
                    let x = |k: usize| xg[[r, s, k * h + j]];
                    let rg = sig(x(0) + hg(0));
                    let zg = sig(x(1) + hg(1));
                    let ng = (x(2) + rg * hg(2)).tanh();
                    h2[[r, j]] = ng + zg * (hs[[r, j]] - ng);
                    y[[r, s, j]] = h2[[r, j]];
                }
            }
            hs = h2;
        }
        Ok(vec![ins[3].with(Data::F(y)), ins[3].with(Data::F(hs))])
    }

    fn samples() -> Vec<Sample> {
        let seq = |reverse| Op::Composite(Composite::GruSeq(GruSeq { reverse }));
        let case = |d: DType, n: usize, t: usize, h: usize| {
            vec![
                input(d, &[n, t, 3 * h]),
                input(d, &[3 * h, h]),
                input(d, &[3 * h]),
                input(d, &[n, h]),
            ]
        };
        vec![
            Sample::new("gru_seq/f32", seq(false), case(DType::F32, 2, 3, 2)),
            Sample::new("gru_seq/f32/reverse", seq(true), case(DType::F32, 3, 4, 3)),
            Sample::new("gru_seq/f64/one_step", seq(false), case(DType::F64, 2, 1, 3)),
        ]
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
