//! Convolution layers: `conv2d` (conv + bias) and `conv_transpose` (1-D, 2-D, 3-D; groups,
//! stride, dilation, padding, output_padding), whose decomposition is the transposed
//! convolution conv's own input gradient uses; and `conv_weight_grad`, conv's weight gradient
//! (the op its VJP emits, so backends with a native kernel run it whole).
//!
//! `conv_transpose(x[N, Cin, *S], w[Cin, Cout/groups, *K], b[Cout]?)`, with PyTorch's and
//! ONNX's output size per spatial axis:
//! `stride·(S-1) + dilation·(K-1) + 1 + output_padding - pad_before - pad_after`.

use super::super::contraction::{ConvTaps, conv, conv_flops, conv_type};
use super::super::conv_grad::{transposed_conv, weight_grad_conv};
use super::super::rules::{R, arity, arity_range, float, out_elements, same_dtype};
use super::super::sample::{Sample, input};
use super::{composite_def, one, reshape, vector_of};
use crate::eval::{EvalCx, Res, Value, array};
use crate::ops::binary::eval as binary;
use crate::ops::movement::reshape as reshape_value;
use crate::ops::{BinaryOp, Composite, Conv, OpDef, op_struct};
use crate::{DType, Dim, Emitter, Graph, Op, TensorType};

op_struct! {
    /// `conv2d(x[N,C,H,W], w[O,C/g,kh,kw], b[O]?)`.
    Conv2d "conv2d" {
        /// (sh, sw)
        stride: [usize; 2],
        /// (top, left, bottom, right)
        padding: [usize; 4],
        /// (dh, dw)
        dilation: [usize; 2],
        /// groups
        groups: usize,
    }
}

op_struct! {
    /// `conv_transpose(x[N, Cin, *S], w[Cin, Cout/groups, *K], b[Cout]?)`: the transpose
    /// (gradient) of a convolution with these attributes, plus a bias.
    ConvTranspose "conv_transpose" {
        /// Stride per spatial axis.
        stride: Vec<usize>,
        /// Padding removed before each spatial axis.
        pad_before: Vec<usize>,
        /// Padding removed after each spatial axis.
        pad_after: Vec<usize>,
        /// Extra output rows after each spatial axis (< max(stride, dilation)).
        output_padding: Vec<usize>,
        /// Dilation per spatial axis.
        dilation: Vec<usize>,
        /// Number of groups (Cin and Cout divisible by it).
        groups: usize,
    }
}

op_struct! {
    /// `conv_weight_grad(x[N, C, *S], dy[N, O, *Y])`: the gradient `[O, C/groups, *kernel]` of
    /// a convolution's weight — the convolution with these attributes of `x` by a weight of
    /// that shape gave an output whose cotangent is `dy`.
    ConvWeightGrad "conv_weight_grad" {
        /// Stride per spatial axis.
        stride: Vec<usize>,
        /// Padding before each spatial axis.
        pad_before: Vec<usize>,
        /// Padding after each spatial axis.
        pad_after: Vec<usize>,
        /// Dilation per spatial axis.
        dilation: Vec<usize>,
        /// Number of groups.
        groups: usize,
        /// The weight's spatial (kernel) sizes.
        kernel: Vec<usize>,
    }
}

impl Conv2d {
    /// The primitive convolution this layer runs (before the bias).
    pub fn conv(&self) -> Conv {
        Conv {
            stride: self.stride.to_vec(),
            pad_before: self.padding[..2].to_vec(),
            pad_after: self.padding[2..].to_vec(),
            dilation: self.dilation.to_vec(),
            groups: self.groups,
        }
    }
}

impl OpDef for Conv2d {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[2, 3])?;
        let (x, w) = (&inputs[0], &inputs[1]);
        if x.rank() != 4 {
            return Err(format!("conv2d needs x[N,C,H,W], got {x}"));
        }
        let y = conv_type(x, w, &self.conv())?;
        if let Some(b) = inputs.get(2) {
            vector_of(b, &w.shape.0[0], "conv2d bias", x)?;
        }
        Ok(vec![y])
    }

    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        Some(conv_flops(inputs, outputs)? + out_elements(outputs)?)
    }

    /// The primitive conv, then the bias as `[O, 1, 1]`.
    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let y = g.add_op1(Op::Conv(self.conv()), &[x[0], x[1]]);
        one::<E>(y.and_then(|y| add_channel_bias(g, y, x.get(2).copied())))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2, 3])?;
        let y = conv(site, ins[0], ins[1], &self.conv())?;
        Ok(vec![channel_bias_eval(cx, y, ins.get(2).copied())?])
    }
}

/// `y + b` with the bias `[C]` on the channel axis of `y[N, C, *S]`.
fn add_channel_bias<E: Emitter>(g: &mut E, y: E::Value, b: Option<E::Value>) -> super::V<E> {
    let Some(b) = b else { return Ok(y) };
    let rank = g.value_type(y).rank();
    let mut dims = vec![g.value_type(b).shape.0[0].clone()];
    dims.extend(std::iter::repeat_n(Dim::Static(1), rank - 2));
    let b = reshape(g, b, dims)?;
    g.binary(BinaryOp::Add, y, b)
}

fn channel_bias_eval(cx: &dyn EvalCx, y: Value, b: Option<&Value>) -> Res<Value> {
    let site = cx.site();
    let Some(b) = b else { return Ok(y) };
    let mut shape = vec![1, b.shape().iter().product()];
    shape.extend(std::iter::repeat_n(1, y.shape().len() - 2));
    binary(site, BinaryOp::Add, &y, &reshape_value(site, b, &shape)?)
}

impl ConvTranspose {
    /// The forward convolution this op is the transpose of.
    pub fn forward(&self) -> Conv {
        Conv {
            stride: self.stride.clone(),
            pad_before: self.pad_before.clone(),
            pad_after: self.pad_after.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
        }
    }

    /// Output spatial sizes for input spatial sizes `s` and kernel sizes `k`, or why not.
    pub fn output_sizes(&self, s: &[usize], k: &[usize]) -> Result<Vec<usize>, String> {
        let sp = s.len();
        let attrs = [
            self.stride.len(),
            self.pad_before.len(),
            self.pad_after.len(),
            self.output_padding.len(),
            self.dilation.len(),
        ];
        if attrs.iter().any(|&l| l != sp) {
            return Err(format!(
                "conv_transpose attributes must have {sp} entries (one per spatial axis)"
            ));
        }
        if self.groups == 0 || self.stride.contains(&0) || self.dilation.contains(&0) {
            return Err("conv_transpose groups, stride and dilation must be ≥ 1".into());
        }
        (0..sp)
            .map(|i| {
                if self.output_padding[i] >= self.stride[i].max(self.dilation[i]) {
                    return Err(format!(
                        "output_padding {:?} must be smaller than stride or dilation on each axis",
                        self.output_padding
                    ));
                }
                let full = (s[i].max(1) - 1)
                    .checked_mul(self.stride[i])
                    .and_then(|v| v.checked_add(self.dilation[i].checked_mul(k[i].checked_sub(1)?)?))
                    .and_then(|v| v.checked_add(1 + self.output_padding[i]))
                    .ok_or("conv_transpose size overflows")?;
                let cut = self.pad_before[i].saturating_add(self.pad_after[i]);
                match full.checked_sub(cut) {
                    Some(n) if n > 0 && s[i] > 0 => Ok(n),
                    _ => Err(format!(
                        "conv_transpose output is empty on spatial axis {i} (input {}, kernel {}, padding {cut})",
                        s[i], k[i]
                    )),
                }
            })
            .collect()
    }
}

impl ConvWeightGrad {
    /// The forward convolution whose weight gradient this is.
    pub fn forward(&self) -> Conv {
        Conv {
            stride: self.stride.clone(),
            pad_before: self.pad_before.clone(),
            pad_after: self.pad_after.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
        }
    }

    /// The weight's type for input `x` and cotangent `dy`, and the forward convolution's
    /// output type (which `dy` must have), or why not.
    fn weight_type(&self, x: &TensorType, dy: &TensorType) -> Result<(TensorType, TensorType), String> {
        let sp = x.rank().saturating_sub(2);
        if sp == 0 || dy.rank() != x.rank() || self.kernel.len() != sp {
            return Err(format!(
                "conv_weight_grad needs x[N,C,*spatial] and dy[N,O,*out] of equal rank ≥ 3 and {} kernel sizes, got {x}, {dy} and {:?}",
                sp.max(1),
                self.kernel
            ));
        }
        let (c, o) = (x.shape.0[1].as_static(), dy.shape.0[1].as_static());
        let (Some(c), Some(o)) = (c, o) else {
            return Err(format!("conv_weight_grad needs static channels, got {x} and {dy}"));
        };
        if self.groups == 0 || c % self.groups != 0 {
            return Err(format!(
                "conv_weight_grad channels: x {x}, groups {} (need C % groups = 0)",
                self.groups
            ));
        }
        let mut w = vec![Dim::Static(o), Dim::Static(c / self.groups)];
        w.extend(self.kernel.iter().map(|&k| Dim::Static(k)));
        let w = TensorType::new(x.dtype, w);
        let y = conv_type(x, &w, &self.forward())?;
        Ok((w, y))
    }
}

impl OpDef for ConvWeightGrad {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 2)?;
        let (x, dy) = (&inputs[0], &inputs[1]);
        same_dtype(x, dy)?;
        float(x)?;
        let (w, y) = self.weight_type(x, dy)?;
        if y.shape != dy.shape {
            return Err(format!(
                "conv_weight_grad: the convolution of x {x} by a weight {w} gives {y}, but dy is {dy}"
            ));
        }
        Ok(vec![w])
    }

    /// As the forward convolution's: 2 per weight element (of one group) per output element.
    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        conv_flops(&[inputs.first()?.clone(), outputs.first()?.clone()], &inputs[1..])
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        one::<E>(weight_grad_conv(g, &self.forward(), x[0], x[1], &self.kernel))
    }

    /// Directly: `dw[o, c, k] = Σ_n Σ_p dy[n, o, p] · x[n, group(o)·C/g + c, p·stride +
    /// k·dilation - pad_before]` over the output positions `p` whose tap `k` is inside x.
    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2])?;
        let (x, dy) = (ins[0].as_f(site, "input")?, ins[1].as_f(site, "cotangent")?);
        let (xs, ys) = (x.shape().to_vec(), dy.shape().to_vec());
        let ty = |s: &[usize]| TensorType::new(DType::F64, s.iter().map(|&d| Dim::Static(d)).collect::<Vec<_>>());
        let (w, y) = self.weight_type(&ty(&xs), &ty(&ys)).map_err(|e| site.err(e))?;
        let want: Vec<usize> = y.shape.0.iter().filter_map(Dim::as_static).collect();
        if want != ys {
            return Err(site.err(format!("dy {ys:?} is not the convolution's output {want:?}")));
        }
        let ws: Vec<usize> = w.shape.0.iter().filter_map(Dim::as_static).collect();
        site.check_size(DType::F64, &ws, "conv_weight_grad output")?;
        let (n, c, o, cg) = (xs[0], xs[1], ws[0], ws[1]);
        let og = o / self.groups;
        let (sin, kd, sout) = (&xs[2..], &self.kernel[..], &ys[2..]);
        let (sin_n, k_n, out_n) = (
            sin.iter().product::<usize>(),
            kd.iter().product::<usize>(),
            sout.iter().product::<usize>(),
        );
        let forward = self.forward();
        let taps = ConvTaps::new(&forward, sin, kd, sout);
        let xf: Vec<f64> = x.iter().copied().collect();
        let yf: Vec<f64> = dy.iter().copied().collect();
        let mut dw = vec![0.0f64; o * cg * k_n];
        for p in 0..out_n {
            for kp in 0..k_n {
                // The input element output position p reads through tap kp, if inside.
                let Some(off) = taps.input_offset(p, kp) else {
                    continue;
                };
                for b in 0..n {
                    for oc in 0..o {
                        let g = yf[(b * o + oc) * out_n + p];
                        let grp = oc / og;
                        for cl in 0..cg {
                            dw[(oc * cg + cl) * k_n + kp] += g * xf[(b * c + grp * cg + cl) * sin_n + off];
                        }
                    }
                }
            }
        }
        Ok(vec![Value::float(ins[0].dtype, array(site, &ws, dw)?)])
    }

    fn samples() -> Vec<Sample> {
        let f = DType::F32;
        let cw = |stride: &[usize], pads: (&[usize], &[usize]), dil: &[usize], groups, kernel: &[usize]| {
            Op::Composite(Composite::ConvWeightGrad(ConvWeightGrad {
                stride: stride.to_vec(),
                pad_before: pads.0.to_vec(),
                pad_after: pads.1.to_vec(),
                dilation: dil.to_vec(),
                groups,
                kernel: kernel.to_vec(),
            }))
        };
        vec![
            // x [2, 3, 7], k 3, stride 2, pads (1, 0): out 3.
            Sample::new(
                "conv_weight_grad/1d/stride2",
                cw(&[2], (&[1], &[0]), &[1], 1, &[3]),
                vec![input(f, &[2, 3, 7]), input(f, &[2, 4, 3])],
            ),
            // x [1, 4, 6, 5], k (2, 3), stride (1, 2), dilation (2, 1), groups 2, pads (1, 0 / 0, 1): out (5, 2).
            Sample::new(
                "conv_weight_grad/2d/groups_dilation",
                cw(&[1, 2], (&[1, 0], &[0, 1]), &[2, 1], 2, &[2, 3]),
                vec![input(f, &[1, 4, 6, 5]), input(f, &[1, 6, 5, 2])],
            ),
            // LeNet's second layer, small: x [2, 3, 8, 8], k 5, same padding.
            Sample::new(
                "conv_weight_grad/2d/same_f64",
                cw(&[1, 1], (&[2, 2], &[2, 2]), &[1, 1], 1, &[5, 5]),
                vec![input(DType::F64, &[2, 3, 8, 8]), input(DType::F64, &[2, 4, 8, 8])],
            ),
            // Stride 1, 5 wide, rows of 8 to 32: the cpu runtime's direct (no patch matrix) kernel.
            Sample::new(
                "conv_weight_grad/2d/same_f32_direct",
                cw(&[1, 1], (&[2, 1], &[2, 3]), &[1, 1], 1, &[5, 5]),
                vec![input(f, &[1, 2, 5, 8]), input(f, &[1, 3, 5, 8])],
            ),
            Sample::new(
                "conv_weight_grad/3d",
                cw(&[1, 2, 1], (&[0, 1, 0], &[0, 1, 0]), &[1, 1, 1], 1, &[2, 3, 2]),
                vec![input(f, &[1, 2, 3, 5, 3]), input(f, &[1, 2, 2, 3, 2])],
            ),
        ]
    }
}

impl OpDef for ConvTranspose {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity_range(inputs, &[2, 3])?;
        let (x, w) = (&inputs[0], &inputs[1]);
        same_dtype(x, w)?;
        float(x)?;
        let sp = x.rank().saturating_sub(2);
        if sp == 0 || w.rank() != x.rank() {
            return Err(format!(
                "conv_transpose needs x[N,Cin,*spatial] and w[Cin,Cout/groups,*kernel] of equal rank ≥ 3, got {x} and {w}"
            ));
        }
        let stat = |d: &Dim| {
            d.as_static()
                .ok_or_else(|| format!("conv_transpose needs static channels and spatial dims, got {x} and {w}"))
        };
        let (cin, wcin, cout_g) = (stat(&x.shape.0[1])?, stat(&w.shape.0[0])?, stat(&w.shape.0[1])?);
        if self.groups == 0 || cin != wcin || cin % self.groups != 0 {
            return Err(format!(
                "conv_transpose channels: x {x}, w {w}, groups {} (need w[0] = Cin, Cin % groups = 0)",
                self.groups
            ));
        }
        let s: Vec<usize> = x.shape.0[2..].iter().map(stat).collect::<Result<_, _>>()?;
        let k: Vec<usize> = w.shape.0[2..].iter().map(stat).collect::<Result<_, _>>()?;
        let out = self.output_sizes(&s, &k)?;
        let cout = cout_g * self.groups;
        if let Some(b) = inputs.get(2) {
            vector_of(b, &Dim::Static(cout), "conv_transpose bias", x)?;
        }
        let mut shape = vec![x.shape.0[0].clone(), Dim::Static(cout)];
        shape.extend(out.into_iter().map(Dim::Static));
        Ok(vec![TensorType::new(x.dtype, shape)])
    }

    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        // Every input element meets every weight element of its group: 2·|x|·(Cout/g)·|K|.
        let x = inputs.first()?.shape.num_elements()? as u64;
        let w = inputs.get(1)?.shape.as_static()?;
        let per_in = w[1..].iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
        let bias = if inputs.len() > 2 { out_elements(outputs)? } else { 0 };
        Some(2u64.saturating_mul(x).saturating_mul(per_in).saturating_add(bias))
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        _: &[TensorType],
        want: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let sizes: Vec<usize> = want[0].shape.0[2..].iter().filter_map(Dim::as_static).collect();
        let y = transposed_conv(g, &self.forward(), x[1], x[0], &sizes);
        one::<E>(y.and_then(|y| add_channel_bias(g, y, x.get(2).copied())))
    }

    /// Direct scatter of every input element through the kernel:
    /// `y[n, g·Cout/g + oc, i·stride + k·dilation - pad_before] += x[n, g·Cin/g + ic, i] ·
    /// w[g·Cin/g + ic, oc, k]`.
    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        crate::eval::arity(site, ins, &[2, 3])?;
        let (x, w) = (ins[0].as_f(site, "input")?, ins[1].as_f(site, "weight")?);
        let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
        let sp = xs.len().saturating_sub(2);
        if sp == 0 || ws.len() != xs.len() || ws[0] != xs[1] || self.groups == 0 || xs[1] % self.groups != 0 {
            return Err(site.err(format!("needs x[N,Cin,*S] and w[Cin,Cout/g,*K], got {xs:?} and {ws:?}")));
        }
        let out = self.output_sizes(&xs[2..], &ws[2..]).map_err(|e| site.err(e))?;
        let (n, cin, cout_g) = (xs[0], xs[1], ws[1]);
        let (cin_g, cout) = (cin / self.groups, cout_g * self.groups);
        let mut shape = vec![n, cout];
        shape.extend(&out);
        site.check_size(DType::F64, &shape, "conv_transpose output")?;
        let (sin, kd) = (&xs[2..], &ws[2..]);
        let (sin_n, k_n, out_n) = (
            sin.iter().product::<usize>(),
            kd.iter().product::<usize>(),
            out.iter().product::<usize>(),
        );
        // The forward convolution reads this op's output and writes its input.
        let forward = self.forward();
        let taps = ConvTaps::new(&forward, &out, kd, sin);
        let xf: Vec<f64> = x.iter().copied().collect();
        let wf: Vec<f64> = w.iter().copied().collect();
        let mut y = vec![0.0f64; n * cout * out_n];
        for p in 0..sin_n {
            for kp in 0..k_n {
                // The output position input position p reaches through kernel tap kp, if any.
                let Some(off) = taps.input_offset(p, kp) else {
                    continue;
                };
                for b in 0..n {
                    for ci in 0..cin {
                        let grp = ci / cin_g;
                        let xv = xf[(b * cin + ci) * sin_n + p];
                        for oc in 0..cout_g {
                            let o = grp * cout_g + oc;
                            y[(b * cout + o) * out_n + off] += xv * wf[(ci * cout_g + oc) * k_n + kp];
                        }
                    }
                }
            }
        }
        let y = Value::float(ins[0].dtype, array(site, &shape, y)?);
        Ok(vec![channel_bias_eval(cx, y, ins.get(2).copied())?])
    }

    fn samples() -> Vec<Sample> {
        let f = DType::F32;
        let ct = |stride: &[usize], pads: (&[usize], &[usize]), out_pad: &[usize], dil: &[usize], groups| {
            Op::Composite(Composite::ConvTranspose(ConvTranspose {
                stride: stride.to_vec(),
                pad_before: pads.0.to_vec(),
                pad_after: pads.1.to_vec(),
                output_padding: out_pad.to_vec(),
                dilation: dil.to_vec(),
                groups,
            }))
        };
        vec![
            Sample::new(
                "conv_transpose/1d/stride2",
                ct(&[2], (&[1], &[0]), &[1], &[1], 1),
                vec![input(f, &[2, 3, 5]), input(f, &[3, 4, 3]), input(f, &[4])],
            ),
            Sample::new(
                "conv_transpose/2d/groups_dilation",
                ct(&[1, 2], (&[1, 0], &[0, 1]), &[0, 1], &[2, 1], 2),
                vec![input(f, &[1, 4, 4, 3]), input(f, &[4, 3, 3, 2])],
            ),
            Sample::new(
                "conv_transpose/2d/plain_f64",
                ct(&[2, 2], (&[0, 0], &[0, 0]), &[0, 0], &[1, 1], 1),
                vec![
                    input(DType::F64, &[2, 2, 3, 3]),
                    input(DType::F64, &[2, 3, 2, 2]),
                    input(DType::F64, &[3]),
                ],
            ),
            Sample::new(
                "conv_transpose/3d",
                ct(&[1, 2, 1], (&[0, 1, 0], &[0, 1, 0]), &[0, 1, 0], &[1, 1, 1], 1),
                vec![input(f, &[1, 2, 2, 3, 2]), input(f, &[2, 2, 2, 3, 2])],
            ),
        ]
    }
}
