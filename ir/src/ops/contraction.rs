//! Contractions: batched `matmul` (batch dims broadcast) and N-d `conv` (cross-correlation,
//! no bias). Their gradients are contractions too (`conv_grad`).
//!
//! Reference: float matmul uses ndarray's `dot` on f64; integer matmul wraps; convolution is
//! a direct loop.

use super::conv_grad::{conv_grad_input, conv_grad_weight};
use super::rules::{R, arity, float, out_elements, same_dtype, window_out};
use super::{Grads, Op, OpDef, OpFamily, VjpArgs, op_struct};
use crate::eval::{Data, EvalCx, Res, Site, Value, broadcast_dims};
use crate::shape::broadcast_shapes;
use crate::{Dim, Emitter, Graph, Shape, TensorType};
use ndarray::{Array2, ArrayD, ArrayView2, Axis, Ix2, IxDyn};

op_struct! {
    /// Batched matrix product `[.., M, K] x [.., K, N] -> [.., M, N]`, batch dims broadcast.
    MatMul "matmul"
}

op_struct! {
    /// N-d convolution (cross-correlation), no bias: `x[N, C, *S]`, `w[O, C/groups, *K]`.
    Conv "conv" {
        /// Stride per spatial axis.
        stride: Vec<usize>,
        /// Padding before each spatial axis.
        pad_before: Vec<usize>,
        /// Padding after each spatial axis.
        pad_after: Vec<usize>,
        /// Dilation per spatial axis.
        dilation: Vec<usize>,
        /// Number of groups (C and O divisible by it).
        groups: usize,
    }
}

/// The type rule of matmul (also used by composites).
pub(crate) fn matmul_type(a: &TensorType, b: &TensorType) -> Result<TensorType, String> {
    same_dtype(a, b)?;
    if a.rank() < 2 || b.rank() < 2 || !a.dtype.is_numeric() {
        return Err(format!("matmul needs numeric operands of rank ≥ 2, got {a} x {b}"));
    }
    let (ra, rb) = (a.rank(), b.rank());
    if a.shape.0[ra - 1] != b.shape.0[rb - 2] {
        return Err(format!("matmul inner dims differ: {a} x {b}"));
    }
    let batch = broadcast_shapes(
        &Shape(a.shape.0[..ra - 2].to_vec()),
        &Shape(b.shape.0[..rb - 2].to_vec()),
    )
    .map_err(|e| format!("matmul batch dims of {a} x {b}: {e}"))?;
    let mut s = batch.0;
    s.push(a.shape.0[ra - 2].clone());
    s.push(b.shape.0[rb - 1].clone());
    Ok(TensorType::new(a.dtype, s))
}

impl OpDef for MatMul {
    fn family(&self) -> OpFamily {
        OpFamily::Contraction
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 2)?;
        Ok(vec![matmul_type(&inputs[0], &inputs[1])?])
    }

    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        let a = &inputs.first()?.shape.0;
        let k = a.last()?.as_static()? as u64;
        Some(2u64.saturating_mul(k).saturating_mul(out_elements(outputs)?))
    }

    fn vjp<E: Emitter>(&self, e: &mut E, x: &VjpArgs<E::Value>) -> Grads<E> {
        let (a, b, g) = (x.inputs[0], x.inputs[1], x.g);
        let ga = if x.want(0) {
            let bt = e.transpose_last(b)?;
            let m = e.add_op1(Op::MatMul, &[g, bt])?;
            Some(e.sum_to(m, &e.value_type(a).shape)?)
        } else {
            None
        };
        let gb = if x.want(1) {
            let at = e.transpose_last(a)?;
            let m = e.add_op1(Op::MatMul, &[at, g])?;
            Some(e.sum_to(m, &e.value_type(b).shape)?)
        } else {
            None
        };
        Ok(vec![ga, gb])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[2])?;
        Ok(vec![matmul(cx.site(), ins[0], ins[1])?])
    }
}

/// The type rule of conv (also used by composites).
pub(crate) fn conv_type(x: &TensorType, w: &TensorType, c: &Conv) -> Result<TensorType, String> {
    same_dtype(x, w)?;
    float(x)?;
    let sp = x.rank().saturating_sub(2);
    if sp == 0 || w.rank() != x.rank() {
        return Err(format!(
            "conv needs x[N,C,*spatial] and w[O,C/groups,*kernel] of equal rank ≥ 3, got {x} and {w}"
        ));
    }
    if [c.stride.len(), c.pad_before.len(), c.pad_after.len(), c.dilation.len()]
        .iter()
        .any(|&l| l != sp)
    {
        return Err(format!("conv attributes must have {sp} entries (one per spatial axis)"));
    }
    let groups = c.groups;
    if groups == 0 || c.stride.contains(&0) || c.dilation.contains(&0) {
        return Err("conv groups, stride and dilation must be ≥ 1".into());
    }
    let stat = |d: &Dim, what: &str| {
        d.as_static()
            .ok_or_else(|| format!("conv {what} must be static, got {x} and {w}"))
    };
    let o = stat(&w.shape.0[0], "output channels")?;
    // Without groups the reduced channel axis may be symbolic (a weight gradient contracts over
    // the batch: x[C, N, ..] with g[O, N, ..]); it must then be the same size on both sides.
    let symbolic_ok = groups == 1 && x.shape.0[1].is_symbolic() && x.shape.0[1] == w.shape.0[1];
    let (ch, wc) = if symbolic_ok {
        (1, 1)
    } else {
        (
            stat(&x.shape.0[1], "channels")?,
            stat(&w.shape.0[1], "weight channels")?,
        )
    };
    if ch % groups != 0 || o % groups != 0 || wc != ch / groups {
        return Err(format!(
            "conv channels: x {x}, w {w}, groups {groups} (need w[1] = C/groups, O % groups = 0)"
        ));
    }
    let mut s = vec![x.shape.0[0].clone(), Dim::Static(o)];
    for i in 0..sp {
        let inp = stat(&x.shape.0[2 + i], "spatial dims")?;
        let k = stat(&w.shape.0[2 + i], "kernel dims")?;
        let out = c.pad_before[i]
            .checked_add(c.pad_after[i])
            .and_then(|p| window_out(inp, p, k, c.stride[i], c.dilation[i], false))
            .ok_or_else(|| format!("conv window does not fit: x {x}, w {w}, spatial axis {i}"))?;
        s.push(Dim::Static(out));
    }
    Ok(TensorType::new(x.dtype, s))
}

/// FLOPs of a convolution: 2 per weight element (of one group) per output element.
pub(crate) fn conv_flops(inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
    let w = inputs.get(1)?.shape.as_static()?;
    let per_out = w[1..].iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
    Some(
        2u64.saturating_mul(per_out)
            .saturating_mul(super::rules::elements(outputs.first()?)?),
    )
}

impl OpDef for Conv {
    fn family(&self) -> OpFamily {
        OpFamily::Contraction
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 2)?;
        Ok(vec![conv_type(&inputs[0], &inputs[1], self)?])
    }

    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        conv_flops(inputs, outputs)
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let (x, w, g) = (a.inputs[0], a.inputs[1], a.g);
        let gx = if a.want(0) {
            Some(conv_grad_input(e, self, x, w, g)?)
        } else {
            None
        };
        let gw = if a.want(1) {
            Some(conv_grad_weight(e, self, x, w, g)?)
        } else {
            None
        };
        Ok(vec![gx, gw])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[2])?;
        Ok(vec![conv(cx.site(), ins[0], ins[1], self)?])
    }
}

/// Which input element each (output position, kernel tap) of a convolution reads, for the
/// reference evaluations of conv and of its gradients (`conv_transpose`, `conv_weight_grad`):
/// positions and taps are flat row-major indices over the spatial axes.
pub(crate) struct ConvTaps<'a> {
    spec: &'a Conv,
    sin: &'a [usize],
    kd: &'a [usize],
    sout: &'a [usize],
    sin_st: Vec<usize>,
    k_st: Vec<usize>,
    out_st: Vec<usize>,
}

impl<'a> ConvTaps<'a> {
    /// The convolution `spec` of spatial input `sin` by kernel `kd` giving spatial output `sout`.
    pub(crate) fn new(spec: &'a Conv, sin: &'a [usize], kd: &'a [usize], sout: &'a [usize]) -> Self {
        ConvTaps {
            spec,
            sin,
            kd,
            sout,
            sin_st: strides(sin),
            k_st: strides(kd),
            out_st: strides(sout),
        }
    }

    /// The offset within one input plane that output position `p` reads through tap `kp`;
    /// `None` in the padding.
    pub(crate) fn input_offset(&self, p: usize, kp: usize) -> Option<usize> {
        let mut off = 0usize;
        for d in 0..self.sin.len() {
            let op = (p / self.out_st[d]) % self.sout[d];
            let k = (kp / self.k_st[d]) % self.kd[d];
            let pos = (op * self.spec.stride[d] + k * self.spec.dilation[d]) as i64 - self.spec.pad_before[d] as i64;
            if pos < 0 || pos >= self.sin[d] as i64 {
                return None;
            }
            off += pos as usize * self.sin_st[d];
        }
        Some(off)
    }
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// For each output batch index, the batch index into an operand with batch dims `own`
/// broadcast to `out` (size-1 dims repeat).
fn batch_map(own: &[usize], out: &[usize]) -> Vec<usize> {
    let total: usize = out.iter().product();
    let off = out.len() - own.len();
    let own_strides = strides(own);
    (0..total)
        .map(|flat| {
            let mut rem = flat;
            let mut idx = 0;
            for (d, &size) in out.iter().enumerate().rev() {
                let i = rem % size;
                rem /= size;
                if d >= off && own[d - off] != 1 {
                    idx += i * own_strides[d - off];
                }
            }
            idx
        })
        .collect()
}

/// Batched product of `a[.., m, k]` and `b[.., k, n]` for any element type.
fn batched<T: Clone + Default>(
    site: &Site,
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    mm: impl Fn(ArrayView2<T>, ArrayView2<T>) -> Array2<T>,
) -> Res<ArrayD<T>> {
    let (ra, rb) = (a.ndim(), b.ndim());
    if ra < 2 || rb < 2 {
        return Err(site.err(format!("matmul needs rank ≥ 2, got {:?} x {:?}", a.shape(), b.shape())));
    }
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    if k != k2 {
        return Err(site.err(format!("matmul inner dims differ: {:?} x {:?}", a.shape(), b.shape())));
    }
    let (ba, bb) = (&a.shape()[..ra - 2], &b.shape()[..rb - 2]);
    let batch = broadcast_dims(site, ba, bb)?;
    let mut out_shape = batch.clone();
    out_shape.extend([m, n]);
    let fail = |e: ndarray::ShapeError| site.err(e.to_string());
    let a3 = a
        .as_standard_layout()
        .into_shape_with_order(IxDyn(&[ba.iter().product(), m, k]))
        .map_err(fail)?;
    let b3 = b
        .as_standard_layout()
        .into_shape_with_order(IxDyn(&[bb.iter().product(), k, n]))
        .map_err(fail)?;
    let (ia, ib) = (batch_map(ba, &batch), batch_map(bb, &batch));
    let mut out = Vec::with_capacity(ia.len() * m * n);
    for (&i, &j) in ia.iter().zip(&ib) {
        let x = a3.index_axis(Axis(0), i).into_dimensionality::<Ix2>().map_err(fail)?;
        let y = b3.index_axis(Axis(0), j).into_dimensionality::<Ix2>().map_err(fail)?;
        out.extend(mm(x, y).iter().cloned());
    }
    ArrayD::from_shape_vec(IxDyn(&out_shape), out).map_err(fail)
}

/// Batched float matmul on f64 arrays (used by composites too).
pub(crate) fn matmul_f64(site: &Site, a: &ArrayD<f64>, b: &ArrayD<f64>) -> Res<ArrayD<f64>> {
    batched(site, a, b, |x, y| x.dot(&y))
}

/// Integer matmul with wrapping accumulation.
fn int_mm(x: ArrayView2<i64>, y: ArrayView2<i64>) -> Array2<i64> {
    let (m, k, n) = (x.nrows(), x.ncols(), y.ncols());
    Array2::from_shape_fn((m, n), |(i, j)| {
        (0..k).fold(0i64, |acc, p| acc.wrapping_add(x[(i, p)].wrapping_mul(y[(p, j)])))
    })
}

/// `matmul(a, b)` (used by composites and the kernel interpreter too).
pub fn matmul(site: &Site, a: &Value, b: &Value) -> Res<Value> {
    let data = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) if a.dtype == b.dtype => Data::F(matmul_f64(site, x, y)?),
        (Data::I(x), Data::I(y)) if a.dtype == b.dtype => Data::I(batched(site, x, y, int_mm)?),
        _ => return Err(site.err(format!("matmul is not defined for {} x {}", a.dtype, b.dtype))),
    };
    Ok(a.with(data))
}

/// N-d convolution `x[N, C, *S]` ⋆ `w[O, C/groups, *K]` → `[N, O, *out]` on f64 arrays.
pub(crate) fn conv_f64(site: &Site, x: &ArrayD<f64>, w: &ArrayD<f64>, spec: &Conv) -> Res<ArrayD<f64>> {
    let (xs, ws) = (x.shape(), w.shape());
    let sp = xs.len().saturating_sub(2);
    let bad = |what: &str| site.err(format!("conv {what}: x {xs:?}, w {ws:?}"));
    if sp == 0 || ws.len() != xs.len() {
        return Err(bad("needs x[N,C,*S] and w[O,C/g,*K] of equal rank ≥ 3"));
    }
    if [
        spec.stride.len(),
        spec.pad_before.len(),
        spec.pad_after.len(),
        spec.dilation.len(),
    ]
    .iter()
    .any(|&l| l != sp)
    {
        return Err(bad("attributes need one entry per spatial axis"));
    }
    let (n, c, o, cg) = (xs[0], xs[1], ws[0], ws[1]);
    let g = spec.groups;
    if g == 0 || c % g != 0 || o % g != 0 || cg != c / g || spec.stride.contains(&0) || spec.dilation.contains(&0) {
        return Err(bad(&format!("channels/groups/stride/dilation (groups {g})")));
    }
    let (sin, kdims) = (&xs[2..], &ws[2..]);
    let mut sout = Vec::with_capacity(sp);
    for i in 0..sp {
        let span = kdims[i]
            .checked_sub(1)
            .and_then(|k| k.checked_mul(spec.dilation[i]))
            .map(|s| s + 1);
        let padded = sin[i]
            .checked_add(spec.pad_before[i])
            .and_then(|v| v.checked_add(spec.pad_after[i]));
        match (span, padded) {
            (Some(s), Some(p)) if p >= s => sout.push((p - s) / spec.stride[i] + 1),
            _ => return Err(bad(&format!("window does not fit on spatial axis {i}"))),
        }
    }
    let mut out_shape = vec![n, o];
    out_shape.extend(&sout);
    site.check_size(crate::DType::F64, &out_shape, "conv output")?;
    let xf: Vec<f64> = x.iter().copied().collect();
    let wf: Vec<f64> = w.iter().copied().collect();
    let (sin_n, k_n, out_n): (usize, usize, usize) =
        (sin.iter().product(), kdims.iter().product(), sout.iter().product());
    let taps_of = ConvTaps::new(spec, sin, kdims, &sout);
    let og = o / g;
    let mut out = vec![0.0f64; n * o * out_n];
    // Input offset (within one channel plane) per kernel position for the current output
    // position; None where the tap falls in the padding.
    let mut taps: Vec<Option<usize>> = vec![None; k_n];
    for p in 0..out_n {
        for (kp, tap) in taps.iter_mut().enumerate() {
            *tap = taps_of.input_offset(p, kp);
        }
        for b in 0..n {
            for oc in 0..o {
                let grp = oc / og;
                let mut acc = 0.0;
                for cl in 0..cg {
                    let xbase = (b * c + grp * cg + cl) * sin_n;
                    let wbase = (oc * cg + cl) * k_n;
                    for (kp, tap) in taps.iter().enumerate() {
                        if let Some(off) = tap {
                            acc += xf[xbase + off] * wf[wbase + kp];
                        }
                    }
                }
                out[(b * o + oc) * out_n + p] = acc;
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&out_shape), out).map_err(|e| site.err(e.to_string()))
}

/// `conv(x, w)` (used by composites and the kernel interpreter too).
pub fn conv(site: &Site, x: &Value, w: &Value, spec: &Conv) -> Res<Value> {
    let xa = x.as_f(site, "conv input")?;
    let wa = w.as_f(site, "conv weight")?;
    Ok(x.with(Data::F(conv_f64(site, xa, wa, spec)?)))
}
