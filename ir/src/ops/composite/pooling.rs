//! 2-d pooling: `max_pool2d` / `avg_pool2d` (kernel, stride, padding, ceil mode) and
//! `adaptive_max_pool2d` / `adaptive_avg_pool2d`.
//!
//! Windows follow PyTorch. Regular pooling: output `i` covers `[i*s - pad_before,
//! i*s - pad_before + k)`, clipped to the input; with `ceil_mode` the last window must start
//! inside the input or the leading padding. Max ignores the (implicit -inf) padding and
//! propagates NaN. Average divides by the in-bounds count, or with `count_include_pad` by the
//! window clipped to the padded extent `[-pad_before, size + pad_after)` (PyTorch's divisor,
//! which differs from `kh*kw` only for ceil-mode windows hanging past the padding).
//! Adaptive pooling: output `i` covers `[floor(i*in/out), ceil((i+1)*in/out))`.
//!
//! Decompositions: sums/maxima of strided slices (fixed windows) or of per-cell slices
//! (adaptive).
//!
//! `max_pool2d` differentiates as a whole: its VJP is `max_pool2d_grad(x, dy)`, whose
//! decomposition is the gradient of `max_pool2d`'s decomposition (the pairwise tree of `max`
//! over the window slices: the larger side takes the cotangent, a tie halves it, a NaN stops
//! it), so a backend with a native kernel (the cpu runtime) runs one op where the decomposed
//! gradient takes a slice, comparisons and a select per kernel position.

use super::super::rules::same_dtype;
use super::super::rules::{R, arity, elements, float, out_elements, window_out};
use super::super::sample::{Domain, Sample, input, input_in};
use super::{composite_def, dims, lowest, one, reshape, slice, unsupported};
use crate::eval::{Data, EvalCx, Res, Site, Value, array};
use crate::ops::{BinaryOp, Composite, Concat, Float, Grads, OpDef, Pad, ReduceOp, SliceRange, VjpArgs, op_struct};
use crate::{DType, Dim, Emitter, Graph, Op, TensorData, TensorType};
use ndarray::{ArrayD, IxDyn};

op_struct! {
    /// `max_pool2d(x[N,C,H,W])`; padding is implicit -inf.
    MaxPool2d "max_pool2d" {
        /// (kh, kw)
        kernel: [usize; 2],
        /// (sh, sw)
        stride: [usize; 2],
        /// (top, left, bottom, right)
        padding: [usize; 4],
        /// Use ceil instead of floor for the output size.
        ceil_mode: bool,
    }
}

op_struct! {
    /// `max_pool2d_grad(x[N,C,H,W], dy[N,C,OH,OW])`: the gradient of `max_pool2d` (these
    /// attributes) at `x` for the cotangent `dy`, shaped as `x`.
    MaxPool2dGrad "max_pool2d_grad" {
        /// (kh, kw)
        kernel: [usize; 2],
        /// (sh, sw)
        stride: [usize; 2],
        /// (top, left, bottom, right)
        padding: [usize; 4],
        /// Use ceil instead of floor for the output size.
        ceil_mode: bool,
    }
}

op_struct! {
    /// `avg_pool2d(x[N,C,H,W])`.
    AvgPool2d "avg_pool2d" {
        /// (kh, kw)
        kernel: [usize; 2],
        /// (sh, sw)
        stride: [usize; 2],
        /// (top, left, bottom, right)
        padding: [usize; 4],
        /// Use ceil instead of floor for the output size.
        ceil_mode: bool,
        /// Divide by the window clipped to the padded input (true, PyTorch's rule) or only by
        /// the in-bounds elements (false; Paddle's `exclusive=True`).
        count_include_pad: bool,
    }
}

op_struct! {
    /// `adaptive_avg_pool2d(x[N,C,H,W]) -> [N,C,oh,ow]` (PyTorch's window rule).
    AdaptiveAvgPool2d "adaptive_avg_pool2d" {
        /// (oh, ow)
        output_size: [usize; 2],
    }
}

op_struct! {
    /// `adaptive_max_pool2d(x[N,C,H,W]) -> [N,C,oh,ow]`.
    AdaptiveMaxPool2d "adaptive_max_pool2d" {
        /// (oh, ow)
        output_size: [usize; 2],
    }
}

/// The window of a fixed-size pooling.
#[derive(Clone, Copy, Debug)]
struct Window {
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
    ceil_mode: bool,
}

fn pool_out(x: &TensorType, w: Window) -> Result<TensorType, String> {
    let (kernel, stride, padding) = (w.kernel, w.stride, w.padding);
    if x.rank() != 4 {
        return Err(format!("pooling needs x[N,C,H,W], got {x}"));
    }
    let mut s = x.shape.0[..2].to_vec();
    for i in 0..2 {
        let inp = x.shape.0[2 + i]
            .as_static()
            .ok_or_else(|| format!("pooling needs static spatial dims, got {x}"))?;
        let (pb, pa) = (padding[i], padding[i + 2]);
        if kernel[i] == 0 || pb > kernel[i] / 2 || pa > kernel[i] / 2 {
            return Err(format!(
                "pool padding {padding:?} must be at most half the kernel {kernel:?}"
            ));
        }
        let mut out = window_out(inp, pb + pa, kernel[i], stride[i], 1, w.ceil_mode)
            .ok_or_else(|| format!("pool window {kernel:?} stride {stride:?} does not fit {x}"))?;
        // PyTorch rule: the last window must start inside the input or the leading padding.
        if w.ceil_mode && (out - 1) * stride[i] >= inp + pb {
            out -= 1;
        }
        s.push(Dim::Static(out));
    }
    Ok(TensorType::new(x.dtype, s))
}

fn adaptive_out(x: &TensorType, output_size: [usize; 2], avg: bool) -> R {
    if x.rank() != 4 || output_size.contains(&0) || !x.shape.0[2..].iter().all(|d| d.as_static().is_some_and(|n| n > 0))
    {
        return Err(format!(
            "adaptive pooling needs x[N,C,H,W] with static H, W > 0 and output size ≥ 1, got {x} -> {output_size:?}"
        ));
    }
    if avg {
        float(x)?;
    }
    let mut s = x.shape.0[..2].to_vec();
    s.extend(output_size.iter().map(|&n| Dim::Static(n)));
    Ok(vec![TensorType::new(x.dtype, s)])
}

impl MaxPool2d {
    fn window(&self) -> Window {
        Window {
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
            ceil_mode: self.ceil_mode,
        }
    }
}

impl AvgPool2d {
    fn window(&self) -> Window {
        Window {
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
            ceil_mode: self.ceil_mode,
        }
    }
}

impl OpDef for MaxPool2d {
    composite_def!(with_vjp);

    /// `max_pool2d_grad(x, g)` (float inputs; other dtypes have no gradient).
    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let x = a.inputs[0];
        if !a.want(0) || !e.value_type(x).dtype.is_float() {
            return Ok(vec![None]);
        }
        let grad = Composite::MaxPool2dGrad(MaxPool2dGrad {
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
            ceil_mode: self.ceil_mode,
        });
        Ok(vec![Some(e.add_op1(Op::Composite(grad), &[x, a.g])?)])
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        Ok(vec![pool_out(&inputs[0], self.window())?])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(out_elements(outputs)?.saturating_mul((self.kernel[0] as u64).saturating_mul(self.kernel[1] as u64)))
    }

    /// Maximum of the window slices of the input padded with the dtype's lowest value.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        want: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let xt = &types[0];
        let mut run = || {
            let sizes = spatial(xt, &want[0], "max_pool2d")?;
            let parts = window_slices(g, x[0], sizes, self.window(), lowest(xt.dtype), "max_pool2d")?;
            // Bool has no numeric max; "any" is its maximum.
            let op = if xt.dtype == DType::Bool {
                BinaryOp::Or
            } else {
                BinaryOp::Max
            };
            combine(g, op, parts)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        let (wh, ww) = spec_windows(cx.site(), ins[0], self.window())?;
        Ok(vec![max_pool(cx.site(), ins[0], &wh, &ww)?])
    }
}

impl MaxPool2dGrad {
    /// The pooling this is the gradient of.
    pub fn forward(&self) -> MaxPool2d {
        MaxPool2d {
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
            ceil_mode: self.ceil_mode,
        }
    }
}

impl OpDef for MaxPool2dGrad {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 2)?;
        let (x, dy) = (&inputs[0], &inputs[1]);
        float(x)?;
        same_dtype(x, dy)?;
        let y = pool_out(x, self.forward().window())?;
        if y.shape != dy.shape {
            return Err(format!("max_pool2d_grad: pooling x {x} gives {y}, but dy is {dy}"));
        }
        Ok(vec![x.clone()])
    }

    fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
        None
    }

    /// The gradient of `max_pool2d`'s decomposition, emitted.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let fwd = Composite::MaxPool2d(self.forward());
        let grads = crate::autodiff::vjp_through_decomposition(g, &fwd, &x[..1], &[Some(x[1])], &[true]);
        Some(grads.and_then(|gs| match gs.as_slice() {
            [Some(dx)] => Ok(vec![*dx]),
            // The cotangent reaches x through every window: never without a gradient.
            _ => Err(unsupported("max_pool2d_grad", "no gradient reached the input".into()).into()),
        }))
    }

    /// Each window's tree replayed on its values (row-major kernel order; the padding is
    /// -inf and takes no gradient): a node's share goes to its larger child, halves on a tie,
    /// stops at a NaN; the window's cotangent times its leaves' shares is added to `dx`.
    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2])?;
        let (x, dy) = (ins[0].as_f(site, "input")?, ins[1].as_f(site, "cotangent")?);
        let (xs, ys) = (x.shape().to_vec(), dy.shape().to_vec());
        let ty = |s: &[usize]| TensorType::new(DType::F64, s.iter().map(|&d| Dim::Static(d)).collect::<Vec<_>>());
        let y = pool_out(&ty(&xs), self.forward().window()).map_err(|e| site.err(e))?;
        if y.shape != ty(&ys).shape {
            return Err(site.err(format!("cotangent {ys:?} is not the pooled shape {}", y.shape)));
        }
        let (planes, h, w, oh, ow) = (xs[0] * xs[1], xs[2], xs[3], ys[2], ys[3]);
        let (xv, gv): (Vec<f64>, Vec<f64>) = (x.iter().copied().collect(), dy.iter().copied().collect());
        let [kh, kw] = self.kernel;
        let mut dx = vec![0.0f64; xv.len()];
        for p in 0..planes {
            for i in 0..oh {
                for j in 0..ow {
                    let mut leaves = Vec::with_capacity(kh * kw);
                    for di in 0..kh {
                        for dj in 0..kw {
                            let r = (i * self.stride[0] + di)
                                .checked_sub(self.padding[0])
                                .filter(|&r| r < h);
                            let c = (j * self.stride[1] + dj)
                                .checked_sub(self.padding[1])
                                .filter(|&c| c < w);
                            leaves.push(r.zip(c).map(|(r, c)| p * h * w + r * w + c));
                        }
                    }
                    let vals: Vec<f64> = leaves.iter().map(|l| l.map_or(f64::NEG_INFINITY, |a| xv[a])).collect();
                    let g = gv[(p * oh + i) * ow + j];
                    for (leaf, share) in leaves.iter().zip(max_tree_shares(&vals)) {
                        if let Some(a) = leaf
                            && share != 0.0
                        {
                            dx[*a] += g * share;
                        }
                    }
                }
            }
        }
        Ok(vec![Value::float(ins[0].dtype, array(site, &xs, dx)?)])
    }

    fn samples() -> Vec<Sample> {
        let f = DType::F32;
        let grad = |k: [usize; 2], s: [usize; 2], p: [usize; 4], ceil_mode| {
            Op::Composite(Composite::MaxPool2dGrad(MaxPool2dGrad {
                kernel: k,
                stride: s,
                padding: p,
                ceil_mode,
            }))
        };
        // Few distinct values: ties in most windows (as after a ReLU).
        let ties = Domain::Ints(-1, 1);
        vec![
            Sample::new(
                "max_pool2d_grad/k3s2p1",
                grad([3, 3], [2, 2], [1; 4], false),
                vec![input(f, &[2, 3, 9, 9]), input(f, &[2, 3, 5, 5])],
            ),
            Sample::new(
                "max_pool2d_grad/k2s2_ties",
                grad([2, 2], [2, 2], [0; 4], false),
                vec![input_in(f, &[2, 3, 8, 6], ties.clone()), input(f, &[2, 3, 4, 3])],
            )
            .no_grad(),
            Sample::new(
                "max_pool2d_grad/k3x2_s1x2_ceil_ties_f64",
                grad([3, 2], [1, 2], [1, 0, 0, 1], true),
                vec![
                    input_in(DType::F64, &[1, 2, 5, 7], ties),
                    input(DType::F64, &[1, 2, 4, 4]),
                ],
            )
            .no_grad(),
        ]
    }
}

/// Each leaf's share of the root's cotangent in the pairwise tree of `max` over `vals`
/// (level by level, an odd last node passed up as is; NaN propagates up and stops shares).
fn max_tree_shares(vals: &[f64]) -> Vec<f64> {
    let mut levels = vec![vals.to_vec()];
    while levels.last().is_some_and(|l| l.len() > 1) {
        let next = levels[levels.len() - 1]
            .chunks(2)
            .map(|p| match *p {
                [a, b] if a.is_nan() || b.is_nan() => f64::NAN,
                [a, b] => a.max(b),
                [a] => a,
                _ => unreachable!("chunks(2)"),
            })
            .collect();
        levels.push(next);
    }
    let mut share = vec![1.0];
    for level in levels.iter().rev().skip(1) {
        let mut below = vec![0.0; level.len()];
        for (k, &s) in share.iter().enumerate() {
            match (level.get(2 * k), level.get(2 * k + 1)) {
                (Some(&p), Some(&q)) => {
                    let (sp, sq) = if p > q {
                        (1.0, 0.0)
                    } else if p < q {
                        (0.0, 1.0)
                    } else if p == q {
                        (0.5, 0.5)
                    } else {
                        (0.0, 0.0)
                    };
                    below[2 * k] = s * sp;
                    below[2 * k + 1] = s * sq;
                }
                (Some(_), None) => below[2 * k] = s,
                _ => {}
            }
        }
        share = below;
    }
    share
}

impl OpDef for AvgPool2d {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        float(&inputs[0])?;
        Ok(vec![pool_out(&inputs[0], self.window())?])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(out_elements(outputs)?.saturating_mul((self.kernel[0] as u64).saturating_mul(self.kernel[1] as u64)))
    }

    fn mode(&self) -> Option<String> {
        let m = if self.count_include_pad {
            "inclusive"
        } else {
            "exclusive"
        };
        Some(format!("avg_pool2d/{m}"))
    }

    fn modes() -> Vec<String> {
        vec!["avg_pool2d/inclusive".into(), "avg_pool2d/exclusive".into()]
    }

    /// Sum of the window slices of the zero-padded input over a per-cell divisor, a constant
    /// since the spatial shape is static (PyTorch's divisor, as the reference computes it).
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        want: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let (xt, w) = (&types[0], self.window());
        let mut run = || {
            let sizes = spatial(xt, &want[0], "avg_pool2d")?;
            let parts = window_slices(g, x[0], sizes, w, 0.0, "avg_pool2d")?;
            let sum = combine(g, BinaryOp::Add, parts)?;
            let count = |i: usize, o: usize| {
                let start = (o * w.stride[i]) as i64 - w.padding[i] as i64;
                let end = start + w.kernel[i] as i64;
                let (lo, hi) = if self.count_include_pad {
                    (start, (sizes[i].0 + w.padding[i + 2]) as i64)
                } else {
                    (0, sizes[i].0 as i64)
                };
                (end.min(hi) - start.max(lo)).max(0) as f64
            };
            let (oh, ow) = (sizes[0].1, sizes[1].1);
            let mut div = Vec::with_capacity(oh * ow);
            for i in 0..oh {
                for j in 0..ow {
                    div.push(count(0, i) * count(1, j));
                }
            }
            if div.iter().all(|&d| d == div[0]) {
                return g.binary_scalar(BinaryOp::Div, sum, div[0]);
            }
            let data = TensorData::from_f64_slice(xt.dtype, vec![oh, ow], &div)
                .map_err(|e| unsupported("avg_pool2d", format!("divisor constant: {e}")))?;
            let div = g.add_constant(data)?;
            g.binary(BinaryOp::Div, sum, div)
        };
        one::<E>(run())
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        let (wh, ww) = spec_windows(cx.site(), ins[0], self.window())?;
        Ok(vec![avg_pool(cx.site(), ins[0], &wh, &ww, self.count_include_pad)?])
    }
}

impl OpDef for AdaptiveAvgPool2d {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        adaptive_out(&inputs[0], self.output_size, true)
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        elements(inputs.first()?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(adaptive_pool2d(g, x[0], &types[0], self.output_size, false))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        Ok(vec![adaptive_eval(cx.site(), ins[0], self.output_size, false)?])
    }
}

impl OpDef for AdaptiveMaxPool2d {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        adaptive_out(&inputs[0], self.output_size, false)
    }

    fn flops(&self, inputs: &[TensorType], _: &[TensorType]) -> Option<u64> {
        elements(inputs.first()?)
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(adaptive_pool2d(g, x[0], &types[0], self.output_size, true))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        Ok(vec![adaptive_eval(cx.site(), ins[0], self.output_size, true)?])
    }
}

// ---- decompositions ------------------------------------------------------------------

/// Static spatial sizes `(in, out)` for axes H and W.
fn spatial(x: &TensorType, y: &TensorType, op: &str) -> Result<[(usize, usize); 2], crate::IrError> {
    let get = |t: &TensorType, i: usize| t.shape.0[2 + i].as_static();
    let mut r = [(0, 0); 2];
    for (i, slot) in r.iter_mut().enumerate() {
        *slot = match (get(x, i), get(y, i)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(unsupported(op, format!("needs static spatial dims, got {x}"))),
        };
    }
    Ok(r)
}

/// Pad `x` (with `fill`) so that every one of the `out` windows lies inside, then return the
/// `kh * kw` strided slices whose elementwise combination is the pooling.
fn window_slices<E: Emitter>(
    g: &mut E,
    x: E::Value,
    sizes: [(usize, usize); 2],
    w: Window,
    fill: f64,
    op: &str,
) -> Result<Vec<E::Value>, E::Error> {
    let mut after = [0usize; 2];
    for i in 0..2 {
        let (inp, out) = sizes[i];
        let padded = inp + w.padding[i] + w.padding[i + 2];
        // ceil_mode: the last window may hang past the explicit padding; extend with `fill`.
        let need = (out - 1) * w.stride[i] + w.kernel[i];
        after[i] = w.padding[i + 2] + need.saturating_sub(padded);
    }
    let padded = if w.padding[..2].iter().chain(&after).any(|&p| p > 0) {
        let pad = Op::Pad(Pad {
            before: vec![0, 0, w.padding[0], w.padding[1]],
            after: vec![0, 0, after[0], after[1]],
            value: Float(fill),
        });
        g.add_op1(pad, &[x])?
    } else {
        x
    };
    let range = |start: usize, i: usize| SliceRange {
        start: start as i64,
        end: (start + (sizes[i].1 - 1) * w.stride[i] + 1) as i64,
        step: w.stride[i] as i64,
    };
    let mut parts = Vec::with_capacity(w.kernel[0] * w.kernel[1]);
    for di in 0..w.kernel[0] {
        for dj in 0..w.kernel[1] {
            let ranges = vec![SliceRange::FULL, SliceRange::FULL, range(di, 0), range(dj, 1)];
            parts.push(slice(g, padded, ranges)?);
        }
    }
    if parts.is_empty() {
        return Err(unsupported(op, "empty pooling window".into()).into());
    }
    Ok(parts)
}

/// Combine values pairwise with `op` (a balanced tree keeps the dependency chains short).
fn combine<E: Emitter>(g: &mut E, op: BinaryOp, mut vals: Vec<E::Value>) -> super::V<E> {
    while vals.len() > 1 {
        let mut next = Vec::with_capacity(vals.len().div_ceil(2));
        for pair in vals.chunks(2) {
            next.push(match pair {
                [a, b] => g.binary(op, *a, *b)?,
                [a] => *a,
                _ => unreachable!("chunks(2)"),
            });
        }
        vals = next;
    }
    Ok(vals[0])
}

/// Adaptive pooling, one spatial axis at a time (a mean/max over a rectangle is the mean/max
/// over rows of the mean/max over columns). PyTorch's windows: `[⌊i·in/out⌋, ⌈(i+1)·in/out⌉)`.
fn adaptive_pool2d<E: Emitter>(g: &mut E, x: E::Value, xt: &TensorType, out: [usize; 2], max: bool) -> super::V<E> {
    // Bool has no numeric reduction: take the max as u8 and cast back.
    let x0 = if xt.dtype == DType::Bool {
        g.cast(x, DType::U8)?
    } else {
        x
    };
    let op = if max { ReduceOp::Max } else { ReduceOp::Mean };
    let mut y = x0;
    for (i, &o) in out.iter().enumerate() {
        y = adaptive_axis(g, y, 2 + i, o, op)?;
    }
    g.cast(y, xt.dtype)
}

fn adaptive_axis<E: Emitter>(g: &mut E, x: E::Value, axis: usize, out: usize, op: ReduceOp) -> super::V<E> {
    let d = dims(g, x);
    let inp = d[axis]
        .as_static()
        .ok_or_else(|| unsupported("adaptive_pool2d", "needs a static spatial axis".into()))?;
    if inp == out {
        return Ok(x);
    }
    if inp % out == 0 {
        // Equal, disjoint windows: split the axis into [out, in/out] and reduce the inner part.
        let mut split = d[..axis].to_vec();
        split.extend([Dim::Static(out), Dim::Static(inp / out)]);
        split.extend(d[axis + 1..].iter().cloned());
        let r = reshape(g, x, split)?;
        return g.reduce(op, r, vec![axis + 1], false);
    }
    let mut cells = Vec::with_capacity(out);
    for i in 0..out {
        let start = i * inp / out;
        let end = ((i + 1) * inp).div_ceil(out);
        let mut ranges = vec![SliceRange::FULL; d.len()];
        ranges[axis] = SliceRange::new(start as i64, end as i64);
        let s = slice(g, x, ranges)?;
        cells.push(g.reduce(op, s, vec![axis], true)?);
    }
    g.add_op1(Op::Concat(Concat { axis }), &cells)
}

// ---- reference -------------------------------------------------------------------------

/// One window along one axis: in-bounds `[start, end)` and its count_include_pad length.
#[derive(Clone, Copy, Debug)]
struct Win {
    start: usize,
    end: usize,
    padded_len: usize,
}

/// Windows of a regular pooling along one axis.
fn windows(site: &Site, inp: usize, k: usize, s: usize, pb: usize, pa: usize, ceil: bool) -> Res<Vec<Win>> {
    let total = inp.checked_add(pb).and_then(|t| t.checked_add(pa)).unwrap_or(0);
    if k == 0 || s == 0 || total < k {
        return Err(site.err(format!(
            "pool window {k} stride {s} does not fit size {inp} padded ({pb}, {pa})"
        )));
    }
    let avail = total - k;
    let mut out = if ceil { avail.div_ceil(s) + 1 } else { avail / s + 1 };
    if ceil && (out - 1).checked_mul(s).is_none_or(|start| start >= inp + pb) {
        out -= 1;
    }
    let mut v = Vec::with_capacity(out);
    for i in 0..out {
        let hs = (i * s) as i64 - pb as i64;
        let he = hs.saturating_add(k as i64).min(inp.saturating_add(pa) as i64);
        let (start, end) = (hs.max(0) as usize, he.clamp(0, inp as i64) as usize);
        if start >= end {
            return Err(site.err(format!("pool window {i} on an axis of size {inp} holds no element")));
        }
        v.push(Win {
            start,
            end,
            padded_len: (he - hs) as usize,
        });
    }
    Ok(v)
}

/// Windows of adaptive pooling along one axis.
fn adaptive_windows(site: &Site, inp: usize, out: usize) -> Res<Vec<Win>> {
    if inp == 0 || out == 0 {
        return Err(site.err(format!("adaptive pooling from size {inp} to {out}")));
    }
    Ok((0..out)
        .map(|i| {
            let (start, end) = (i * inp / out, ((i + 1) * inp).div_ceil(out));
            Win {
                start,
                end,
                padded_len: end - start,
            }
        })
        .collect())
}

/// Apply `f(window elements, count_include_pad divisor)` over every 2-d window of x[N,C,H,W].
fn pool2d<T: Copy>(site: &Site, x: &ArrayD<T>, wh: &[Win], ww: &[Win], f: impl Fn(&[T], usize) -> T) -> Res<ArrayD<T>> {
    let s = x.shape();
    if s.len() != 4 {
        return Err(site.err(format!("pooling needs x[N,C,H,W], got {s:?}")));
    }
    let (planes, h, w) = (s[0] * s[1], s[2], s[3]);
    let flat: Vec<T> = x.iter().copied().collect();
    let mut out = Vec::with_capacity(planes * wh.len() * ww.len());
    let mut buf = Vec::new();
    for p in 0..planes {
        for a in wh {
            for b in ww {
                buf.clear();
                for i in a.start..a.end.min(h) {
                    let row = (p * h + i) * w;
                    buf.extend_from_slice(&flat[row + b.start..row + b.end.min(w)]);
                }
                out.push(f(&buf, a.padded_len * b.padded_len));
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[s[0], s[1], wh.len(), ww.len()]), out).map_err(|e| site.err(e.to_string()))
}

fn max_f(v: &[f64]) -> f64 {
    v.iter().fold(f64::NEG_INFINITY, |m, &x| {
        if m.is_nan() || x.is_nan() { f64::NAN } else { m.max(x) }
    })
}

/// Max over windows of any dtype.
fn max_pool(site: &Site, x: &Value, wh: &[Win], ww: &[Win]) -> Res<Value> {
    let data = match &x.data {
        Data::F(a) => Data::F(pool2d(site, a, wh, ww, |v, _| max_f(v))?),
        Data::I(a) => Data::I(pool2d(site, a, wh, ww, |v, _| {
            v.iter().copied().max().unwrap_or(i64::MIN)
        })?),
        Data::B(a) => Data::B(pool2d(site, a, wh, ww, |v, _| v.iter().any(|&b| b))?),
    };
    Ok(x.with(data))
}

/// Average over windows (float only).
fn avg_pool(site: &Site, x: &Value, wh: &[Win], ww: &[Win], include_pad: bool) -> Res<Value> {
    let a = x.as_f(site, "avg pool input")?;
    let out = pool2d(site, a, wh, ww, |v, padded| {
        let div = if include_pad { padded } else { v.len() };
        v.iter().sum::<f64>() / div as f64
    })?;
    Ok(x.with(Data::F(out)))
}

fn hw(site: &Site, x: &Value) -> Res<(usize, usize)> {
    match x.shape() {
        [_, _, h, w] => Ok((*h, *w)),
        s => Err(site.err(format!("pooling needs x[N,C,H,W], got {s:?}"))),
    }
}

fn spec_windows(site: &Site, x: &Value, p: Window) -> Res<(Vec<Win>, Vec<Win>)> {
    let (h, w) = hw(site, x)?;
    let axis = |i: usize, size: usize| {
        windows(
            site,
            size,
            p.kernel[i],
            p.stride[i],
            p.padding[i],
            p.padding[i + 2],
            p.ceil_mode,
        )
    };
    Ok((axis(0, h)?, axis(1, w)?))
}

fn adaptive_eval(site: &Site, x: &Value, out: [usize; 2], max: bool) -> Res<Value> {
    let (h, w) = hw(site, x)?;
    let (wh, ww) = (adaptive_windows(site, h, out[0])?, adaptive_windows(site, w, out[1])?);
    if max {
        max_pool(site, x, &wh, &ww)
    } else {
        avg_pool(site, x, &wh, &ww, false)
    }
}
