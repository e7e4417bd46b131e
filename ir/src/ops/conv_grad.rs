//! Gradients of the N-d convolution, expressed as convolutions (plus pads, slices, reshapes).

use super::{Concat, Conv, Gather, Pad, Slice};
use super::{Op, SliceRange};
use crate::emit::Emitter;
use crate::{Dim, Float, IrError, Shape, TensorData};

fn stat(d: &Dim) -> Result<usize, IrError> {
    d.as_static().ok_or_else(|| IrError::Type {
        op: "conv".into(),
        value: "<vjp>".into(),
        detail: format!("gradient needs static channel/spatial dims, got {d}"),
    })
}

fn conv<E: Emitter>(
    e: &mut E,
    x: E::Value,
    w: E::Value,
    stride: Vec<usize>,
    dilation: Vec<usize>,
    groups: usize,
) -> Result<E::Value, E::Error> {
    let sp = stride.len();
    e.add_op1(
        Op::Conv(Conv {
            stride,
            pad_before: vec![0; sp],
            pad_after: vec![0; sp],
            dilation,
            groups,
        }),
        &[x, w],
    )
}

/// Keep the first `len[i]` (from `start[i]`) elements of each spatial axis.
fn slice_spatial<E: Emitter>(e: &mut E, x: E::Value, start: &[usize], len: &[usize]) -> Result<E::Value, E::Error> {
    let rank = e.value_type(x).rank();
    let mut ranges = vec![SliceRange::FULL; rank];
    let mut trivial = true;
    for i in 0..start.len() {
        let cur = stat(&e.value_type(x).shape.0[2 + i])?;
        if start[i] != 0 || len[i] != cur {
            trivial = false;
        }
        ranges[2 + i] = SliceRange::new(start[i] as i64, (start[i] + len[i]) as i64);
    }
    if trivial {
        Ok(x)
    } else {
        e.add_op1(Op::Slice(Slice { ranges }), &[x])
    }
}

fn pad<E: Emitter>(e: &mut E, x: E::Value, before: Vec<usize>, after: Vec<usize>) -> Result<E::Value, E::Error> {
    if before.iter().chain(&after).all(|&p| p == 0) {
        return Ok(x);
    }
    e.add_op1(
        Op::Pad(Pad {
            before,
            after,
            value: Float(0.0),
        }),
        &[x],
    )
}

/// Insert `s - 1` zeros between elements along spatial axis `axis` (2-based in the tensor).
fn dilate<E: Emitter>(e: &mut E, x: E::Value, axis: usize, s: usize) -> Result<E::Value, E::Error> {
    if s == 1 {
        return Ok(x);
    }
    let t = e.value_type(x);
    let n = stat(&t.shape.0[axis])?;
    let mut dims = t.shape.0.clone();
    dims.insert(axis + 1, Dim::Static(1));
    let r = e.reshape(x, &Shape(dims))?;
    let mut after = vec![0; t.rank() + 1];
    after[axis + 1] = s - 1;
    let p = pad(e, r, vec![0; t.rank() + 1], after)?;
    let mut flat = t.shape.0.clone();
    flat[axis] = Dim::Static(n * s);
    let f = e.reshape(p, &Shape(flat))?;
    let mut ranges = vec![SliceRange::FULL; t.rank()];
    ranges[axis] = SliceRange::new(0, ((n - 1) * s + 1) as i64);
    e.add_op1(Op::Slice(Slice { ranges }), &[f])
}

/// ∂L/∂x of `conv(x, w)`: `conv_transpose(g, w)` with the convolution's attributes and the
/// `output_padding` that gives back x's spatial sizes. A composite, so a backend with a native
/// transposed convolution (the cpu runtime's col2im) runs it whole; its decomposition is
/// [`transposed_conv`]: a stride-1 convolution of the dilated, padded cotangent with the
/// flipped, channel-transposed weight.
pub(crate) fn conv_grad_input<E: Emitter>(
    e: &mut E,
    a: &Conv,
    x: E::Value,
    w: E::Value,
    g: E::Value,
) -> Result<E::Value, E::Error> {
    let (xt, wt, gt) = (e.value_type(x), e.value_type(w), e.value_type(g));
    let sp = a.stride.len();
    let mut output_padding = Vec::with_capacity(sp);
    for i in 0..sp {
        let (s, k, y) = (
            stat(&xt.shape.0[2 + i])?,
            stat(&wt.shape.0[2 + i])?,
            stat(&gt.shape.0[2 + i])?,
        );
        // The input rows past the last window: conv's floor division dropped them.
        let covered = (y.max(1) - 1) * a.stride[i] + a.dilation[i] * (k.max(1) - 1) + 1;
        output_padding.push((s + a.pad_before[i] + a.pad_after[i]).saturating_sub(covered));
    }
    let ct = super::ConvTranspose {
        stride: a.stride.clone(),
        pad_before: a.pad_before.clone(),
        pad_after: a.pad_after.clone(),
        output_padding,
        dilation: a.dilation.clone(),
        groups: a.groups,
    };
    e.add_op1(Op::Composite(super::Composite::ConvTranspose(ct)), &[g, w])
}

/// The transpose of `conv` with attributes `a` and weight `w[O, C/G, K]`, applied to `g[N, O,
/// *Y]`: `[N, C, *sizes]`, where `sizes` are the forward input's spatial sizes (several fit one
/// output size when the stride is above 1; the extra rows past the last window get zeros, as
/// `output_padding` asks). This is both conv's input gradient and `conv_transpose`.
pub(crate) fn transposed_conv<E: Emitter>(
    e: &mut E,
    a: &Conv,
    w: E::Value,
    g: E::Value,
    sizes: &[usize],
) -> Result<E::Value, E::Error> {
    let (wt, gt) = (e.value_type(w), e.value_type(g));
    let sp = a.stride.len();
    let (o, cg) = (stat(&wt.shape.0[0])?, stat(&wt.shape.0[1])?);
    let groups = a.groups;
    let mut gd = g;
    for i in 0..sp {
        gd = dilate(e, gd, 2 + i, a.stride[i])?;
    }
    let (mut before, mut after) = (vec![0; sp + 2], vec![0; sp + 2]);
    for i in 0..sp {
        let (s, k, y) = (sizes[i], stat(&wt.shape.0[2 + i])?, stat(&gt.shape.0[2 + i])?);
        let p = s + a.pad_before[i] + a.pad_after[i];
        let span = a.dilation[i] * (k - 1);
        let rest = p - span - 1 - (y - 1) * a.stride[i];
        before[2 + i] = span;
        after[2 + i] = span + rest;
    }
    let gp = pad(e, gd, before, after)?;
    // w[O, C/G, K] → [G, O/G, C/G, K] → [G, C/G, O/G, K] → [C, O/G, K], then flip K.
    let mut dims = vec![Dim::Static(groups), Dim::Static(o / groups), Dim::Static(cg)];
    dims.extend(wt.shape.0[2..].iter().cloned());
    let w5 = e.reshape(w, &Shape(dims))?;
    let mut perm = vec![0, 2, 1];
    perm.extend(3..3 + sp);
    let w5 = e.permute(w5, perm)?;
    let mut dims = vec![Dim::Static(cg * groups), Dim::Static(o / groups)];
    dims.extend(wt.shape.0[2..].iter().cloned());
    let mut wf = e.reshape(w5, &Shape(dims))?;
    for i in 0..sp {
        let k = stat(&wt.shape.0[2 + i])?;
        if k > 1 {
            let rev: Vec<i64> = (0..k as i64).rev().collect();
            let idx = e.add_constant(TensorData::from_vec(vec![k], rev).expect("k indices"))?;
            wf = e.add_op1(Op::Gather(Gather { axis: 2 + i }), &[wf, idx])?;
        }
    }
    let full = conv(e, gp, wf, vec![1; sp], a.dilation.to_vec(), groups)?;
    slice_spatial(e, full, &a.pad_before, sizes)
}

/// ∂L/∂w of `conv(x, w)` (w's kernel sizes `kernel`): the `conv_weight_grad` composite, so a
/// backend with a native weight gradient (the cpu runtime's) runs it whole; its decomposition
/// is [`weight_grad_conv`].
pub(crate) fn conv_grad_weight<E: Emitter>(
    e: &mut E,
    a: &Conv,
    x: E::Value,
    w: E::Value,
    g: E::Value,
) -> Result<E::Value, E::Error> {
    let wt = e.value_type(w);
    let kernel = wt.shape.0[2..].iter().map(stat).collect::<Result<Vec<_>, _>>()?;
    let cw = super::ConvWeightGrad {
        stride: a.stride.clone(),
        pad_before: a.pad_before.clone(),
        pad_after: a.pad_after.clone(),
        dilation: a.dilation.clone(),
        groups: a.groups,
        kernel,
    };
    e.add_op1(Op::Composite(super::Composite::ConvWeightGrad(cw)), &[x, g])
}

/// ∂L/∂w (`[O, C/groups, *ksize]`) of `conv(x, w)` for the cotangent `g[N, O, *Y]`: a
/// convolution of the padded input (batch as channels) with the cotangent as the kernel
/// (stride and dilation swap roles).
pub(crate) fn weight_grad_conv<E: Emitter>(
    e: &mut E,
    a: &Conv,
    x: E::Value,
    g: E::Value,
    ksize: &[usize],
) -> Result<E::Value, E::Error> {
    let (xt, gt) = (e.value_type(x), e.value_type(g));
    let sp = a.stride.len();
    let groups = a.groups;
    let (c, o) = (stat(&xt.shape.0[1])?, stat(&gt.shape.0[1])?);
    let mut before = vec![0, 0];
    before.extend_from_slice(&a.pad_before);
    let mut after = vec![0, 0];
    after.extend_from_slice(&a.pad_after);
    let xp = pad(e, x, before, after)?;
    let swap01 = |sp: usize| {
        let mut p = vec![1, 0];
        p.extend(2..2 + sp);
        p
    };
    let one_group = |e: &mut E, xg: E::Value, gg: E::Value| -> Result<E::Value, E::Error> {
        // xg [N, Cg, P], gg [N, Og, Y] → [Og, Cg, K]
        let xs = e.permute(xg, swap01(sp))?;
        let gs = e.permute(gg, swap01(sp))?;
        let r = conv(e, xs, gs, a.dilation.to_vec(), a.stride.to_vec(), 1)?;
        let r = slice_spatial(e, r, &vec![0; sp], ksize)?;
        e.permute(r, swap01(sp))
    };
    if groups == 1 {
        return one_group(e, xp, g);
    }
    let batch = xt.shape.0[0].as_static();
    let (cg, og) = (c / groups, o / groups);
    let Some(n) = batch else {
        // Symbolic batch: one convolution per group, then concatenate.
        let mut parts = Vec::with_capacity(groups);
        for gi in 0..groups {
            let mut rx = vec![SliceRange::FULL; sp + 2];
            rx[1] = SliceRange::new((gi * cg) as i64, ((gi + 1) * cg) as i64);
            let xg = e.add_op1(Op::Slice(Slice { ranges: rx }), &[xp])?;
            let mut rg = vec![SliceRange::FULL; sp + 2];
            rg[1] = SliceRange::new((gi * og) as i64, ((gi + 1) * og) as i64);
            let gg = e.add_op1(Op::Slice(Slice { ranges: rg }), &[g])?;
            parts.push(one_group(e, xg, gg)?);
        }
        return e.add_op1(Op::Concat(Concat { axis: 0 }), &parts);
    };
    // Static batch: fold groups into channels and use a grouped convolution.
    let pt = e.value_type(xp);
    let mut dims = vec![Dim::Static(n), Dim::Static(groups), Dim::Static(cg)];
    dims.extend(pt.shape.0[2..].iter().cloned());
    let x5 = e.reshape(xp, &Shape(dims))?;
    let mut perm = vec![2, 1, 0];
    perm.extend(3..3 + sp);
    let x5 = e.permute(x5, perm)?;
    let mut dims = vec![Dim::Static(cg), Dim::Static(groups * n)];
    dims.extend(pt.shape.0[2..].iter().cloned());
    let xs = e.reshape(x5, &Shape(dims))?;
    let mut dims = vec![Dim::Static(n), Dim::Static(groups), Dim::Static(og)];
    dims.extend(gt.shape.0[2..].iter().cloned());
    let g5 = e.reshape(g, &Shape(dims))?;
    let mut perm = vec![1, 2, 0];
    perm.extend(3..3 + sp);
    let g5 = e.permute(g5, perm)?;
    let mut dims = vec![Dim::Static(o), Dim::Static(n)];
    dims.extend(gt.shape.0[2..].iter().cloned());
    let gs = e.reshape(g5, &Shape(dims))?;
    let r = conv(e, xs, gs, a.dilation.to_vec(), a.stride.to_vec(), groups)?;
    let r = slice_spatial(e, r, &vec![0; sp], ksize)?;
    e.permute(r, swap01(sp))
}
