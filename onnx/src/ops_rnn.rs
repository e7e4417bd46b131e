//! Recurrent ops (LSTM, GRU, RNN). An LSTM with the default activations, no peepholes and no
//! `clip`, and such a GRU with `linear_before_reset` (PyTorch's), become one `lstm_seq` /
//! `gru_seq` op per direction (a loop over fused cells on the cpu backend); everything else is
//! unrolled over a static sequence length:
//!
//! The input projection of every time step is one matmul (`X · Wᵀ + b` over `[seq, batch, in]`);
//! each step then adds `H · Rᵀ`, slices the gates and applies the activations. Forward, reverse
//! and bidirectional directions, `layout` 0 and 1, initial states, LSTM peepholes, `clip`,
//! GRU's `linear_before_reset` and the ONNX activation list (with `activation_alpha/beta`) are
//! supported. `sequence_lens` must be a constant equal to the sequence length for every batch
//! entry (variable lengths are an error), and LSTM's `input_forget=1` is an error.

use crate::ops::{NodeCx, R};
use crate::table::Table;
use oar_ir::ops::{BinaryOp as B, UnaryOp as U};
use oar_ir::ops::{Broadcast, Concat, Permute};
use oar_ir::{Composite, Dim, Op, ValueId};

/// The three recurrent op types.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Lstm,
    Gru,
    Rnn,
}

impl Kind {
    fn gates(self) -> usize {
        match self {
            Kind::Lstm => 4,
            Kind::Gru => 3,
            Kind::Rnn => 1,
        }
    }
    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Kind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
            Kind::Gru => &["Sigmoid", "Tanh"],
            Kind::Rnn => &["Tanh"],
        }
    }
}

/// One activation of the ONNX RNN activation list, with its alpha and beta.
#[derive(Clone, Debug)]
struct Act {
    name: String,
    alpha: f64,
    beta: f64,
}

/// Activations that take an alpha (and which also take a beta), with ONNX's defaults.
fn act_params(name: &str) -> Option<(f64, Option<f64>)> {
    match name {
        "leakyrelu" => Some((0.01, None)),
        "thresholdedrelu" => Some((1.0, None)),
        "elu" => Some((1.0, None)),
        "hardsigmoid" => Some((0.2, Some(0.5))),
        "scaledtanh" => Some((1.0, Some(1.0))),
        "affine" => Some((1.0, Some(0.0))),
        _ => None,
    }
}

const KNOWN_ACTS: &[&str] = &[
    "sigmoid",
    "tanh",
    "relu",
    "leakyrelu",
    "thresholdedrelu",
    "elu",
    "hardsigmoid",
    "scaledtanh",
    "affine",
    "softsign",
    "softplus",
];

/// Convert LSTM / GRU / RNN; returns `[Y, Y_h]` (and `Y_c` for LSTM).
pub(crate) fn convert(cx: &mut NodeCx<'_>, kind: Kind) -> R<Vec<ValueId>> {
    let gates = kind.gates();
    let (x, w, r) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let b = cx.opt_input(3);
    let h0 = cx.opt_input(5);
    let (c0, p) = if kind == Kind::Lstm {
        (cx.opt_input(6), cx.opt_input(7))
    } else {
        (None, None)
    };
    let dt = cx.ty(x).dtype;
    if !dt.is_float() {
        return Err(cx.err(format!("{} needs a float input, got {dt}", cx.op_type())));
    }
    if kind == Kind::Lstm && cx.attr_i("input_forget", 0) != 0 {
        return Err(cx.err("input_forget=1 is not supported"));
    }
    let layout = cx.attr_i("layout", 0);
    if !(0..=1).contains(&layout) {
        return Err(cx.err(format!("layout {layout} is not 0 or 1")));
    }
    let direction = cx.attr_s("direction").unwrap_or_else(|| "forward".into());
    let dirs: Vec<bool> = match direction.as_str() {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        other => return Err(cx.err(format!("direction `{other}` is not forward, reverse or bidirectional"))),
    };
    let nd = dirs.len();

    // Shapes: X [S, B, I] (layout 0) or [B, S, I]; W [D, g·H, I]; R [D, g·H, H].
    let xt = cx.ty(x);
    if xt.rank() != 3 {
        return Err(cx.err(format!("X must have rank 3, got {xt}")));
    }
    let x = if layout == 1 {
        cx.op(Op::Permute(Permute { perm: vec![1, 0, 2] }), &[x])?
    } else {
        x
    };
    let xdims = cx.ty(x).shape.0;
    let seq = xdims[0]
        .as_static()
        .ok_or_else(|| cx.err(format!("the sequence length must be static (got {})", xdims[0])))?;
    let batch = xdims[1].clone();
    let rs = cx.static_shape(r)?;
    if rs.len() != 3 || rs[0] != nd || rs[1] % gates != 0 || rs[1] / gates != rs[2] {
        return Err(cx.err(format!("R must be [{nd}, {gates}·hidden, hidden], got {rs:?}")));
    }
    let hidden = rs[2];
    let hs = cx.attr_i("hidden_size", hidden as i64);
    if hs != hidden as i64 {
        return Err(cx.err(format!("hidden_size {hs} does not match R's shape {rs:?}")));
    }
    let ws = cx.static_shape(w)?;
    let input = xdims[2].clone();
    if ws.len() != 3 || ws[0] != nd || ws[1] != gates * hidden || Dim::Static(ws[2]) != input {
        return Err(cx.err(format!("W must be [{nd}, {}, {input}], got {ws:?}", gates * hidden)));
    }
    if cx.opt_input(4).is_some() {
        let lens = cx
            .const_ints(4)?
            .ok_or_else(|| cx.err("sequence_lens must be a constant"))?;
        if lens.iter().any(|&l| l != seq as i64) {
            return Err(cx.err(format!(
                "variable sequence lengths {lens:?} are not supported (all must be {seq})"
            )));
        }
    }
    let clip = cx.attr_f_opt("clip").map(f64::from);
    let acts = activations(cx, kind, nd)?;
    let linear_before_reset = kind == Kind::Gru && cx.attr_i("linear_before_reset", 0) != 0;
    // LSTM with the default activations, no peepholes and no clip, and GRU likewise with
    // `linear_before_reset` (PyTorch's GRU, as torch exports it), are whole-layer recurrence ops:
    // one `lstm_seq` / `gru_seq` per direction, which the cpu backend runs as a native loop
    // over fused cells. Anything else is unrolled step by step.
    let default_acts = acts
        .iter()
        .zip(kind.default_activations().iter().cycle())
        .all(|(a, d)| a.name.eq_ignore_ascii_case(d));
    let whole = default_acts
        && clip.is_none()
        && match kind {
            Kind::Lstm => p.is_none(),
            Kind::Gru => linear_before_reset,
            Kind::Rnn => false,
        };

    // Initial states, layout 1 [B, D, H] → [D, B, H].
    let state = |cx: &mut NodeCx<'_>, v: Option<ValueId>| -> R<Option<ValueId>> {
        match v {
            Some(v) if layout == 1 => cx.op(Op::Permute(Permute { perm: vec![1, 0, 2] }), &[v]).map(Some),
            v => Ok(v),
        }
    };
    let (h0, c0) = (state(cx, h0)?, state(cx, c0)?);
    let zeros = |cx: &mut NodeCx<'_>| -> R<ValueId> {
        let z = cx.scalar(dt, 0.0);
        cx.op(
            Op::Broadcast(Broadcast {
                shape: vec![batch.clone(), Dim::Static(hidden)],
            }),
            &[z],
        )
    };

    let gh = gates * hidden;
    let mut outs = DirOuts {
        ys: Vec::with_capacity(nd),
        last_h: Vec::with_capacity(nd),
        last_c: Vec::with_capacity(nd),
        seq,
        batch: batch.clone(),
        hidden,
    };
    for (d, &reverse) in dirs.iter().enumerate() {
        let dir_slice = |cx: &mut NodeCx<'_>, v: ValueId, dims: Vec<Dim>| -> R<ValueId> {
            let s = cx.slice_axis(v, 0, d as i64, d as i64 + 1)?;
            cx.reshape(s, dims)
        };
        let wd = dir_slice(cx, w, vec![Dim::Static(gh), input.clone()])?;
        let rd = dir_slice(cx, r, vec![Dim::Static(gh), Dim::Static(hidden)])?;
        let bd = match b {
            Some(b) => Some(dir_slice(cx, b, vec![Dim::Static(2 * gh)])?),
            None => None,
        };
        let mut h = match h0 {
            Some(h0) => dir_slice(cx, h0, vec![batch.clone(), Dim::Static(hidden)])?,
            None => zeros(cx)?,
        };
        let mut c = match (kind, c0) {
            (Kind::Lstm, Some(c0)) => Some(dir_slice(cx, c0, vec![batch.clone(), Dim::Static(hidden)])?),
            (Kind::Lstm, None) => Some(zeros(cx)?),
            _ => None,
        };
        if whole {
            let layer = Layer {
                kind,
                reverse,
                hidden,
                w: wd,
                r: rd,
                b: bd,
            };
            let (y, h, c) = whole_layer(cx, &layer, x, h, c)?;
            outs.push(cx, y, h, c)?;
            continue;
        }
        // Wᵀ [I, gH], Rᵀ [H, gH].
        let wt = cx.op(Op::Permute(Permute { perm: vec![1, 0] }), &[wd])?;
        let rt = cx.op(Op::Permute(Permute { perm: vec![1, 0] }), &[rd])?;
        // Biases: Wb [gH] and Rb [gH]. Rb joins the input projection except for GRU's
        // candidate gate under linear_before_reset (there it sits inside r ⊙ (...)).
        let (x_bias, h_bias) = match bd {
            None => (None, None),
            Some(bd) => {
                let wb = cx.slice_axis(bd, 0, 0, gh as i64)?;
                let rb = cx.slice_axis(bd, 0, gh as i64, 2 * gh as i64)?;
                if linear_before_reset {
                    let rb_zr = cx.slice_axis(rb, 0, 0, 2 * hidden as i64)?;
                    let wb_zr = cx.slice_axis(wb, 0, 0, 2 * hidden as i64)?;
                    let zr = cx.bin(B::Add, wb_zr, rb_zr)?;
                    let wb_h = cx.slice_axis(wb, 0, 2 * hidden as i64, gh as i64)?;
                    let xb = cx.op(Op::Concat(Concat { axis: 0 }), &[zr, wb_h])?;
                    let rb_h = cx.slice_axis(rb, 0, 2 * hidden as i64, gh as i64)?;
                    (Some(xb), Some(rb_h))
                } else {
                    (Some(cx.bin(B::Add, wb, rb)?), None)
                }
            }
        };
        // X·Wᵀ + bias over all steps: [S, B, gH].
        let mut xw = cx.op(Op::MatMul, &[x, wt])?;
        if let Some(xb) = x_bias {
            xw = cx.bin(B::Add, xw, xb)?;
        }
        // Peepholes [3H] in order i, o, f.
        let peep = match p {
            Some(p) => {
                let pd = dir_slice(cx, p, vec![Dim::Static(3 * hidden)])?;
                let part = |cx: &mut NodeCx<'_>, k: usize| {
                    cx.slice_axis(pd, 0, (k * hidden) as i64, ((k + 1) * hidden) as i64)
                };
                Some((part(cx, 0)?, part(cx, 1)?, part(cx, 2)?))
            }
            None => None,
        };
        let a = &acts[d * acts.len() / nd..(d + 1) * acts.len() / nd];
        let mut step_h: Vec<Option<ValueId>> = vec![None; seq];
        let order: Vec<usize> = if reverse {
            (0..seq).rev().collect()
        } else {
            (0..seq).collect()
        };
        for t in order {
            let xt = cx.slice_axis(xw, 0, t as i64, t as i64 + 1)?;
            let xt = cx.reshape(xt, vec![batch.clone(), Dim::Static(gh)])?;
            let gate = |cx: &mut NodeCx<'_>, v: ValueId, k: usize| {
                cx.slice_axis(v, 1, (k * hidden) as i64, ((k + 1) * hidden) as i64)
            };
            match kind {
                Kind::Lstm => {
                    let hr = cx.op(Op::MatMul, &[h, rt])?;
                    let g = cx.bin(B::Add, xt, hr)?;
                    let c_prev = c.expect("LSTM has a cell state");
                    let (mut gi, mut go, mut gf, gc) =
                        (gate(cx, g, 0)?, gate(cx, g, 1)?, gate(cx, g, 2)?, gate(cx, g, 3)?);
                    if let Some((pi, _, pf)) = peep {
                        let t = cx.bin(B::Mul, c_prev, pi)?;
                        gi = cx.bin(B::Add, gi, t)?;
                        let t = cx.bin(B::Mul, c_prev, pf)?;
                        gf = cx.bin(B::Add, gf, t)?;
                    }
                    let i = activate(cx, &a[0], gi, clip)?;
                    let f = activate(cx, &a[0], gf, clip)?;
                    let cc = activate(cx, &a[1], gc, clip)?;
                    let fc = cx.bin(B::Mul, f, c_prev)?;
                    let ic = cx.bin(B::Mul, i, cc)?;
                    let c_new = cx.bin(B::Add, fc, ic)?;
                    if let Some((_, po, _)) = peep {
                        let t = cx.bin(B::Mul, c_new, po)?;
                        go = cx.bin(B::Add, go, t)?;
                    }
                    let o = activate(cx, &a[0], go, clip)?;
                    let hc = activate(cx, &a[2], c_new, None)?;
                    h = cx.bin(B::Mul, o, hc)?;
                    c = Some(c_new);
                }
                Kind::Gru => {
                    let hr = cx.op(Op::MatMul, &[h, rt])?;
                    let (xz, xr, xh) = (gate(cx, xt, 0)?, gate(cx, xt, 1)?, gate(cx, xt, 2)?);
                    let (hz, hrr, hh) = (gate(cx, hr, 0)?, gate(cx, hr, 1)?, gate(cx, hr, 2)?);
                    let gz = cx.bin(B::Add, xz, hz)?;
                    let z = activate(cx, &a[0], gz, clip)?;
                    let gr = cx.bin(B::Add, xr, hrr)?;
                    let rg = activate(cx, &a[0], gr, clip)?;
                    let cand = if linear_before_reset {
                        let hh = match h_bias {
                            Some(rb) => cx.bin(B::Add, hh, rb)?,
                            None => hh,
                        };
                        cx.bin(B::Mul, rg, hh)?
                    } else {
                        // (r ⊙ H)·R_hᵀ: the last hidden columns of Rᵀ.
                        let rh = cx.slice_axis(rt, 1, 2 * hidden as i64, gh as i64)?;
                        let rhp = cx.bin(B::Mul, rg, h)?;
                        cx.op(Op::MatMul, &[rhp, rh])?
                    };
                    let gh_in = cx.bin(B::Add, xh, cand)?;
                    let ht = activate(cx, &a[1], gh_in, clip)?;
                    // H = (1 - z) ⊙ h̃ + z ⊙ H = h̃ + z ⊙ (H - h̃).
                    let diff = cx.bin(B::Sub, h, ht)?;
                    let zd = cx.bin(B::Mul, z, diff)?;
                    h = cx.bin(B::Add, ht, zd)?;
                }
                Kind::Rnn => {
                    let hr = cx.op(Op::MatMul, &[h, rt])?;
                    let g = cx.bin(B::Add, xt, hr)?;
                    h = activate(cx, &a[0], g, clip)?;
                }
            }
            step_h[t] = Some(h);
        }
        let steps: Vec<ValueId> = step_h
            .into_iter()
            .map(|v| {
                let v = v.expect("every step ran");
                cx.reshape(v, vec![Dim::Static(1), batch.clone(), Dim::Static(hidden)])
            })
            .collect::<R<_>>()?;
        let y = if steps.len() == 1 {
            steps[0]
        } else {
            cx.op(Op::Concat(Concat { axis: 0 }), &steps)?
        };
        outs.push(cx, y, h, c)?;
    }
    let DirOuts { ys, last_h, last_c, .. } = outs;
    let cat = |cx: &mut NodeCx<'_>, vs: Vec<ValueId>, axis: usize| {
        if vs.len() == 1 {
            Ok(vs[0])
        } else {
            cx.op(Op::Concat(Concat { axis }), &vs)
        }
    };
    // Y [S, D, B, H] (layout 1: [B, S, D, H]); Y_h, Y_c [D, B, H] (layout 1: [B, D, H]).
    let mut y = cat(cx, ys, 1)?;
    let mut yh = cat(cx, last_h, 0)?;
    if layout == 1 {
        y = cx.op(Op::Permute(Permute { perm: vec![2, 0, 1, 3] }), &[y])?;
        yh = cx.op(Op::Permute(Permute { perm: vec![1, 0, 2] }), &[yh])?;
    }
    let mut outs = vec![y, yh];
    if kind == Kind::Lstm {
        let mut yc = cat(cx, last_c, 0)?;
        if layout == 1 {
            yc = cx.op(Op::Permute(Permute { perm: vec![1, 0, 2] }), &[yc])?;
        }
        outs.push(yc);
    }
    Ok(outs)
}

/// The directions' results as they are produced: `Y` parts `[S, 1, B, H]`, last `h` and `c`
/// parts `[1, B, H]`.
struct DirOuts {
    ys: Vec<ValueId>,
    last_h: Vec<ValueId>,
    last_c: Vec<ValueId>,
    seq: usize,
    batch: Dim,
    hidden: usize,
}

impl DirOuts {
    /// Add one direction's `y` (`S·B·H` elements, steps first), last `h` and `c` (`[B, H]`).
    fn push(&mut self, cx: &mut NodeCx<'_>, y: ValueId, h: ValueId, c: Option<ValueId>) -> R<()> {
        let (b, hd) = (self.batch.clone(), Dim::Static(self.hidden));
        let state = vec![Dim::Static(1), b.clone(), hd.clone()];
        self.ys
            .push(cx.reshape(y, vec![Dim::Static(self.seq), Dim::Static(1), b, hd])?);
        self.last_h.push(cx.reshape(h, state.clone())?);
        if let Some(c) = c {
            self.last_c.push(cx.reshape(c, state)?);
        }
        Ok(())
    }
}

/// One direction of an LSTM or GRU node, in ONNX's gate order (LSTM i, o, f, c; GRU z, r, h):
/// `w [g·H, I]`, `r [g·H, H]` and `b [2·g·H]` (`Wb` then `Rb`).
struct Layer {
    kind: Kind,
    reverse: bool,
    hidden: usize,
    w: ValueId,
    r: ValueId,
    b: Option<ValueId>,
}

/// `v`'s gate blocks (of `hidden` along `axis`) taken in `order`.
fn regate(cx: &mut NodeCx<'_>, v: ValueId, axis: usize, hidden: usize, order: &[usize]) -> R<ValueId> {
    let parts = order
        .iter()
        .map(|&k| cx.slice_axis(v, axis, (k * hidden) as i64, ((k + 1) * hidden) as i64))
        .collect::<R<Vec<_>>>()?;
    cx.op(Op::Concat(Concat { axis }), &parts)
}

/// One direction as one `lstm_seq` / `gru_seq` op on `x [S, B, I]` from state `h [B, H]` (and
/// `c [B, H]`): `(y [S, B, H], h, c)`. The gate blocks are reordered to PyTorch's (LSTM i, f,
/// g, o; GRU r, z, n) — constant folding does that once for constant weights — and the input
/// projection of every step is one product. LSTM adds both biases to it; GRU adds `Wb` and
/// keeps `Rb` apart (`linear_before_reset`: its `n` part is scaled by `r`).
fn whole_layer(
    cx: &mut NodeCx<'_>,
    l: &Layer,
    x: ValueId,
    h: ValueId,
    c: Option<ValueId>,
) -> R<(ValueId, ValueId, Option<ValueId>)> {
    let order: &[usize] = match l.kind {
        Kind::Lstm => &[0, 2, 3, 1],
        _ => &[1, 0, 2],
    };
    let gh = l.kind.gates() * l.hidden;
    let w = regate(cx, l.w, 0, l.hidden, order)?;
    let wt = cx.op(Op::Permute(Permute { perm: vec![1, 0] }), &[w])?;
    let r = regate(cx, l.r, 0, l.hidden, order)?;
    let xb = cx.op(Op::Permute(Permute { perm: vec![1, 0, 2] }), &[x])?;
    let mut xg = cx.op(Op::MatMul, &[xb, wt])?;
    let biases = match l.b {
        Some(b) => {
            let wb = cx.slice_axis(b, 0, 0, gh as i64)?;
            let rb = cx.slice_axis(b, 0, gh as i64, 2 * gh as i64)?;
            Some((regate(cx, wb, 0, l.hidden, order)?, regate(cx, rb, 0, l.hidden, order)?))
        }
        None => None,
    };
    let (op, operands) = match l.kind {
        Kind::Lstm => {
            if let Some((wb, rb)) = biases {
                let bias = cx.bin(B::Add, wb, rb)?;
                xg = cx.bin(B::Add, xg, bias)?;
            }
            let c = c.ok_or_else(|| cx.err("internal: an LSTM without a cell state"))?;
            let op = Composite::LstmSeq(oar_ir::ops::LstmSeq { reverse: l.reverse });
            (op, vec![xg, r, h, c])
        }
        _ => {
            let b_hh = match biases {
                Some((wb, rb)) => {
                    xg = cx.bin(B::Add, xg, wb)?;
                    rb
                }
                None => {
                    let dt = cx.ty(x).dtype;
                    let z = cx.scalar(dt, 0.0);
                    cx.op(
                        Op::Broadcast(Broadcast {
                            shape: vec![Dim::Static(gh)],
                        }),
                        &[z],
                    )?
                }
            };
            let op = Composite::GruSeq(oar_ir::ops::GruSeq { reverse: l.reverse });
            (op, vec![xg, r, b_hh, h])
        }
    };
    let name = op.name();
    let outs =
        cx.g.add_op(Op::Composite(op), &operands)
            .map_err(|e| cx.err(format!("{name}: {e}")))?;
    let y = cx.op(Op::Permute(Permute { perm: vec![1, 0, 2] }), &[outs[0]])?;
    Ok((y, outs[1], outs.get(2).copied()))
}

/// The activation list: the `activations` attribute (one group per direction) or the defaults,
/// with alphas and betas consumed in order by the activations that take them.
fn activations(cx: &NodeCx<'_>, kind: Kind, nd: usize) -> R<Vec<Act>> {
    let per = kind.default_activations().len();
    let names: Vec<String> = match cx.attr_strings("activations") {
        Some(v) if !v.is_empty() => v,
        _ => (0..nd)
            .flat_map(|_| kind.default_activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    if names.len() != per * nd {
        return Err(cx.err(format!(
            "activations {names:?}: expected {} ({per} per direction)",
            per * nd
        )));
    }
    let alphas = cx.attr_floats("activation_alpha").unwrap_or_default();
    let betas = cx.attr_floats("activation_beta").unwrap_or_default();
    let (mut ai, mut bi) = (alphas.iter(), betas.iter());
    names
        .into_iter()
        .map(|n| {
            let lower = n.to_ascii_lowercase();
            if !KNOWN_ACTS.contains(&lower.as_str()) {
                return Err(cx.err(format!("activation `{n}` is not supported")));
            }
            let (mut alpha, mut beta) = (0.0, 0.0);
            if let Some((da, db)) = act_params(&lower) {
                alpha = ai.next().map_or(da, |&a| f64::from(a));
                if let Some(db) = db {
                    beta = bi.next().map_or(db, |&b| f64::from(b));
                }
            }
            Ok(Act {
                name: lower,
                alpha,
                beta,
            })
        })
        .collect()
}

/// Apply one activation (after clipping its input to ±clip when set).
fn activate(cx: &mut NodeCx<'_>, a: &Act, x: ValueId, clip: Option<f64>) -> R<ValueId> {
    let x = match clip {
        Some(c) => {
            let lo = cx.bin_c(B::Max, x, -c)?;
            cx.bin_c(B::Min, lo, c)?
        }
        None => x,
    };
    let dt = cx.ty(x).dtype;
    Ok(match a.name.as_str() {
        "sigmoid" => cx.op(Op::Composite(Composite::Sigmoid), &[x])?,
        "tanh" => cx.un(U::Tanh, x)?,
        "relu" => cx.op(Op::Composite(Composite::Relu), &[x])?,
        "leakyrelu" | "thresholdedrelu" | "elu" => {
            let zero = cx.scalar(dt, 0.0);
            match a.name.as_str() {
                "leakyrelu" => {
                    let neg = cx.bin_c(B::Mul, x, a.alpha)?;
                    let c = cx.bin(B::Lt, x, zero)?;
                    cx.op(Op::Where, &[c, neg, x])?
                }
                "thresholdedrelu" => {
                    let c = cx.bin_c(B::Gt, x, a.alpha)?;
                    cx.op(Op::Where, &[c, x, zero])?
                }
                _ => {
                    let e = cx.un(U::Exp, x)?;
                    let em1 = cx.bin_c(B::Sub, e, 1.0)?;
                    let neg = cx.bin_c(B::Mul, em1, a.alpha)?;
                    let c = cx.bin(B::Lt, x, zero)?;
                    cx.op(Op::Where, &[c, neg, x])?
                }
            }
        }
        "hardsigmoid" => {
            let y = cx.bin_c(B::Mul, x, a.alpha)?;
            let y = cx.bin_c(B::Add, y, a.beta)?;
            let y = cx.bin_c(B::Max, y, 0.0)?;
            cx.bin_c(B::Min, y, 1.0)?
        }
        "scaledtanh" => {
            let y = cx.bin_c(B::Mul, x, a.beta)?;
            let y = cx.un(U::Tanh, y)?;
            cx.bin_c(B::Mul, y, a.alpha)?
        }
        "affine" => {
            let y = cx.bin_c(B::Mul, x, a.alpha)?;
            cx.bin_c(B::Add, y, a.beta)?
        }
        "softsign" => {
            let ax = cx.un(U::Abs, x)?;
            let d = cx.bin_c(B::Add, ax, 1.0)?;
            cx.bin(B::Div, x, d)?
        }
        _ => {
            // softplus: max(x, 0) + log(1 + exp(-|x|)).
            let zero = cx.scalar(dt, 0.0);
            let ax = cx.un(U::Abs, x)?;
            let nax = cx.un(U::Neg, ax)?;
            let e = cx.un(U::Exp, nax)?;
            let e1 = cx.bin_c(B::Add, e, 1.0)?;
            let l = cx.un(U::Log, e1)?;
            let m = cx.bin(B::Max, x, zero)?;
            cx.bin(B::Add, m, l)?
        }
    })
}

/// This family's ONNX mapping (see `table.rs`).
pub(crate) const TABLE: Table = Table {
    imports: &[
        ("GRU", |cx| convert(cx, Kind::Gru)),
        ("LSTM", |cx| convert(cx, Kind::Lstm)),
        ("RNN", |cx| convert(cx, Kind::Rnn)),
    ],
    exports: &[],
};
