//! Movement ops: `reshape`, `permute`, `broadcast`, `slice`, `pad`, `concat`. They move
//! elements and compute nothing (0 FLOPs); their gradients move them back.

use super::rules::{R, arity, check_axes, same_dtype};
use super::{Float, Grads, Op, OpDef, OpFamily, OpText, VjpArgs, op_struct};
use crate::eval::{Data, EvalCx, Res, Site, Value, float_to_int, map_data, view_as};
use crate::shape::broadcasts_to;
use crate::text::{Attrs, ParseError, single_result};
use crate::{Dim, Emitter, Graph, Shape, TensorType};
use ndarray::{ArrayD, Axis, IxDyn};
use serde::{Deserialize, Serialize};

/// One axis of a slice: Python `start:end:step` (negative start/end count from the end;
/// out-of-range values clamp), with `step ≥ 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceRange {
    /// First index.
    pub start: i64,
    /// One past the last index (exclusive); `i64::MAX` means "to the end".
    pub end: i64,
    /// Stride, ≥ 1.
    pub step: i64,
}

impl SliceRange {
    /// The whole axis.
    pub const FULL: SliceRange = SliceRange {
        start: 0,
        end: i64::MAX,
        step: 1,
    };

    /// `start..end` with step 1.
    pub fn new(start: i64, end: i64) -> SliceRange {
        SliceRange { start, end, step: 1 }
    }

    /// True if this keeps the whole axis whatever its size.
    pub fn is_full(&self) -> bool {
        *self == Self::FULL
    }

    /// For an axis of `size`: the first index, and how many elements are taken (no overflow).
    pub fn resolve(&self, size: usize) -> (usize, usize) {
        let size_i = size as i64;
        let clamp = |v: i64| {
            if v < 0 {
                v.saturating_add(size_i).max(0)
            } else {
                v.min(size_i)
            }
        };
        let (s, e) = (clamp(self.start), clamp(self.end));
        let step = self.step.max(1);
        // (e - s) ≤ size, so this never overflows even for step = i64::MAX.
        let n = if e > s { (e - s - 1) / step + 1 } else { 0 };
        (s as usize, n as usize)
    }
}

/// The shape given by the result type (reshape, broadcast): the text states it once.
macro_rules! shape_from_result {
    ($t:ident, $mn:literal) => {
        impl OpText for $t {
            fn mnemonics() -> &'static [&'static str] {
                &[$mn]
            }
            fn name(&self) -> &'static str {
                $mn
            }
            fn print_attrs(&self) -> Vec<(&'static str, String)> {
                Vec::new()
            }
            fn parse(name: &str, attrs: &mut Attrs, results: &[TensorType]) -> Result<Self, ParseError> {
                Ok($t {
                    shape: single_result(attrs, name, results)?.shape.0.clone(),
                })
            }
        }
    };
}

/// Same elements in row-major order, new shape (equal element count).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reshape {
    /// Target shape.
    pub shape: Vec<Dim>,
}
shape_from_result!(Reshape, "reshape");

/// numpy `broadcast_to`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Broadcast {
    /// Target shape.
    pub shape: Vec<Dim>,
}
shape_from_result!(Broadcast, "broadcast");

op_struct! {
    /// Permute axes: output axis `i` is input axis `perm[i]`.
    Permute "permute" {
        /// The permutation.
        perm: Vec<usize>,
    }
}

op_struct! {
    /// Strided slice, one range per axis (Python semantics, step ≥ 1).
    Slice "slice" {
        /// One range per input axis.
        ranges: Vec<SliceRange>,
    }
}

op_struct! {
    /// Constant padding; `before[i]`/`after[i]` elements on axis `i`.
    Pad "pad" {
        /// Elements added before each axis.
        before: Vec<usize>,
        /// Elements added after each axis.
        after: Vec<usize>,
        /// Fill value (converted like a cast, saturating for ints).
        value: Float,
    }
}

op_struct! {
    /// Concatenate all inputs along `axis`.
    Concat "concat" {
        /// The axis.
        axis: usize,
    }
}

/// Equal element counts, as polynomials in the symbols (`[N,C,4] ~ [N*C*2, 2]`).
fn same_element_count(a: &Shape, b: &Shape) -> bool {
    match (a.num_elements_dim(), b.num_elements_dim()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// The length of `r` on a symbolic axis of size `d`: full, or from a start `≥ 0` to the end or
/// to `end < 0` before it (what pad's and concat's gradients take), assuming the axis is long
/// enough; other ranges on symbolic axes are an error.
fn symbolic_slice_len(r: &SliceRange, d: &Dim) -> Option<Dim> {
    if r.is_full() {
        return Some(d.clone());
    }
    if r.start < 0 || r.step < 1 || (r.end >= 0 && r.end != i64::MAX) {
        return None;
    }
    let stop = if r.end < 0 {
        d.to_expr().add(&crate::SymExpr::constant(r.end)).ok()?
    } else {
        d.to_expr()
    };
    let span = stop.add(&crate::SymExpr::constant(r.step - 1 - r.start)).ok()?;
    Dim::from_expr(span.floor_div(r.step).ok()?).ok()
}

/// The common parts of a movement op's definition: family and 0 FLOPs.
macro_rules! movement_def {
    () => {
        fn family(&self) -> OpFamily {
            OpFamily::Movement
        }
        fn flops(&self, _: &[TensorType], _: &[TensorType]) -> Option<u64> {
            Some(0)
        }
    };
}

fn one(cx: &dyn EvalCx, ins: &[&Value], n: usize) -> Res<()> {
    crate::eval::arity(cx.site(), ins, &[n])
}

impl OpDef for Reshape {
    movement_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        let to = Shape(self.shape.clone());
        if !same_element_count(&x.shape, &to) {
            return Err(format!("cannot reshape {x} to {to}: element counts differ"));
        }
        Ok(vec![TensorType::new(x.dtype, to)])
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        Ok(vec![Some(e.reshape(a.g, &e.value_type(a.inputs[0]).shape)?)])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        one(cx, ins, 1)?;
        Ok(vec![reshape(cx.site(), ins[0], &cx.resolve(&self.shape)?)?])
    }
}

impl OpDef for Permute {
    movement_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        check_perm(&self.perm, x.rank())
            .map_err(|_| format!("{:?} is not a permutation of the axes of {x}", self.perm))?;
        let s = self.perm.iter().map(|&p| x.shape.0[p].clone()).collect::<Vec<_>>();
        Ok(vec![TensorType::new(x.dtype, s)])
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let mut inv = vec![0; self.perm.len()];
        for (i, &p) in self.perm.iter().enumerate() {
            inv[p] = i;
        }
        Ok(vec![Some(e.permute(a.g, inv)?)])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        one(cx, ins, 1)?;
        let x = ins[0];
        check_perm(&self.perm, x.shape().len()).map_err(|_| {
            cx.site().err(format!(
                "{:?} is not a permutation of {} axes",
                self.perm,
                x.shape().len()
            ))
        })?;
        let data = map_data!(&x.data, a => a.view().permuted_axes(IxDyn(&self.perm)).as_standard_layout().into_owned());
        Ok(vec![x.with(data)])
    }
}

fn check_perm(perm: &[usize], rank: usize) -> Result<(), ()> {
    let mut seen = vec![false; rank];
    if perm.len() != rank || perm.iter().any(|&p| p >= rank || std::mem::replace(&mut seen[p], true)) {
        return Err(());
    }
    Ok(())
}

impl OpDef for Broadcast {
    movement_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        let to = Shape(self.shape.clone());
        if !broadcasts_to(&x.shape, &to) {
            return Err(format!("{x} does not broadcast to {to}"));
        }
        Ok(vec![TensorType::new(x.dtype, to)])
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        Ok(vec![Some(e.sum_to(a.g, &e.value_type(a.inputs[0]).shape)?)])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        one(cx, ins, 1)?;
        let shape = cx.resolve(&self.shape)?;
        let site = cx.site();
        let data = map_data!(&ins[0].data, a => view_as(site, a, &shape)?.to_owned());
        Ok(vec![ins[0].with(data)])
    }
}

impl OpDef for Slice {
    movement_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        if self.ranges.len() != x.rank() {
            return Err(format!("{} slice ranges for {x}", self.ranges.len()));
        }
        let mut out = Vec::with_capacity(x.rank());
        for (axis, (r, d)) in self.ranges.iter().zip(&x.shape.0).enumerate() {
            if r.step < 1 {
                return Err(format!("slice step {} on axis {axis} must be ≥ 1", r.step));
            }
            out.push(match d {
                Dim::Static(n) => Dim::Static(r.resolve(*n).1),
                _ => symbolic_slice_len(r, d).ok_or_else(|| {
                    format!(
                        "slice {}:{}:{} on symbolic axis {axis} of {x}: only a start ≥ 0 with an end at or before the end (negative) is allowed",
                        r.start, r.end, r.step
                    )
                })?,
            });
        }
        Ok(vec![TensorType::new(x.dtype, out)])
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        Ok(vec![Some(slice_grad(e, &self.ranges, a.inputs[0], a.g)?)])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        one(cx, ins, 1)?;
        Ok(vec![slice(cx.site(), ins[0], &self.ranges)?])
    }
}

impl OpDef for Pad {
    movement_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        if self.before.len() != x.rank() || self.after.len() != x.rank() {
            return Err(format!("pad needs {} before/after values for {x}", x.rank()));
        }
        let mut out = Vec::with_capacity(x.rank());
        for (axis, d) in x.shape.0.iter().enumerate() {
            let extra = self.before[axis]
                .checked_add(self.after[axis])
                .ok_or("padding overflows")?;
            out.push(match d {
                Dim::Static(n) => Dim::Static(n.checked_add(extra).ok_or("padding overflows")?),
                _ => d.add(&Dim::Static(extra))?,
            });
        }
        Ok(vec![TensorType::new(x.dtype, out)])
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let shape = e.value_type(a.inputs[0]).shape;
        let ranges = shape
            .0
            .iter()
            .zip(&self.before)
            .zip(&self.after)
            .map(|((d, &b), &af)| match d {
                Dim::Static(n) => SliceRange::new(b as i64, (b + n) as i64),
                _ if af == 0 => SliceRange::new(b as i64, i64::MAX),
                _ => SliceRange::new(b as i64, -(af as i64)),
            })
            .collect();
        Ok(vec![Some(e.add_op1(Op::Slice(Slice { ranges }), &[a.g])?)])
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        one(cx, ins, 1)?;
        Ok(vec![pad(cx.site(), ins[0], &self.before, &self.after, self.value.0)?])
    }
}

impl OpDef for Concat {
    movement_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        let axis = self.axis;
        let first = inputs.first().ok_or("concat needs at least one input")?;
        check_axes(&[axis], first.rank())?;
        let mut total = Dim::Static(0);
        for t in inputs {
            same_dtype(first, t)?;
            let ok = t.rank() == first.rank() && (0..t.rank()).all(|i| i == axis || t.shape.0[i] == first.shape.0[i]);
            if !ok {
                return Err(format!("cannot concat {first} and {t} along axis {axis}"));
            }
            total = total.add(&t.shape.0[axis]).map_err(|e| format!("concat size: {e}"))?;
        }
        let mut s = first.shape.0.clone();
        s[axis] = total;
        Ok(vec![TensorType::new(first.dtype, s)])
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        // Each part is sliced out from the front when the parts before it are static, else
        // from the back when the parts after it are.
        let lens: Vec<Option<i64>> = a
            .inputs
            .iter()
            .map(|&x| e.value_type(x).shape.0[self.axis].as_static().map(|l| l as i64))
            .collect();
        let sum = |ls: &[Option<i64>]| ls.iter().try_fold(0i64, |acc, l| Some(acc.saturating_add((*l)?)));
        let mut out = Vec::with_capacity(a.inputs.len());
        for (i, &x) in a.inputs.iter().enumerate() {
            if !a.want(i) {
                out.push(None);
                continue;
            }
            let (before, after) = (sum(&lens[..i]), sum(&lens[i + 1..]));
            let to_end = |after: i64| if after == 0 { i64::MAX } else { -after };
            let range = match (before, lens[i], after) {
                (Some(b), Some(l), _) => SliceRange::new(b, b.saturating_add(l)),
                (Some(b), None, Some(af)) => SliceRange::new(b, to_end(af)),
                (None, Some(l), Some(af)) => SliceRange::new(-(af.saturating_add(l)), to_end(af)),
                _ => {
                    return Err(vjp_error(
                        "concat",
                        format!("along axis {}: input {i} has symbolic sizes on both sides", self.axis),
                    ));
                }
            };
            let t = e.value_type(x);
            let mut ranges = vec![SliceRange::FULL; t.rank()];
            ranges[self.axis] = range;
            out.push(Some(e.add_op1(Op::Slice(Slice { ranges }), &[a.g])?));
        }
        Ok(out)
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        Ok(vec![concat(cx.site(), ins, self.axis)?])
    }
}

/// An error of a gradient rule.
fn vjp_error<Er: From<crate::IrError>>(op: &str, detail: String) -> Er {
    crate::IrError::Type {
        op: op.into(),
        value: "<vjp>".into(),
        detail,
    }
    .into()
}

/// Gradient of a strided slice: place `g` back into zeros of the input's shape.
fn slice_grad<E: Emitter>(e: &mut E, ranges: &[SliceRange], x: E::Value, g: E::Value) -> Result<E::Value, E::Error> {
    let xt = e.value_type(x);
    let mut cur = g;
    for (axis, (r, d)) in ranges.iter().zip(&xt.shape.0).enumerate() {
        let size = match d {
            Dim::Static(n) => *n,
            _ if r.is_full() => continue,
            _ if r.step == 1 => {
                // A start ≥ 0 to the end, or to `end < 0` before it: pad back what was cut.
                let after = if r.end < 0 { r.end.unsigned_abs() as usize } else { 0 };
                let mut before = vec![0; xt.rank()];
                let mut aft = vec![0; xt.rank()];
                before[axis] = r.start.max(0) as usize;
                aft[axis] = after;
                cur = e.add_op1(
                    Op::Pad(Pad {
                        before,
                        after: aft,
                        value: Float(0.0),
                    }),
                    &[cur],
                )?;
                continue;
            }
            _ => return Err(vjp_error("slice", format!("a strided slice on symbolic axis {axis}"))),
        };
        let (start, count) = r.resolve(size);
        let step = r.step.max(1) as usize;
        let ct = e.value_type(cur);
        if step > 1 && count > 0 {
            // Interleave zeros: [.., n, ..] → [.., n, step, ..] padded → [.., n·step, ..].
            let mut dims = ct.shape.0.clone();
            dims.insert(axis + 1, Dim::Static(1));
            let r1 = e.reshape(cur, &Shape(dims))?;
            let before = vec![0; ct.rank() + 1];
            let mut after = vec![0; ct.rank() + 1];
            after[axis + 1] = step - 1;
            let p = e.add_op1(
                Op::Pad(Pad {
                    before,
                    after,
                    value: Float(0.0),
                }),
                &[r1],
            )?;
            let mut flat = ct.shape.0.clone();
            flat[axis] = Dim::Static(count * step);
            cur = e.reshape(p, &Shape(flat))?;
        }
        let ct = e.value_type(cur);
        let len = ct.shape.0[axis].as_static().unwrap_or(0);
        let mut before = vec![0; ct.rank()];
        let mut after = vec![0; ct.rank()];
        before[axis] = start;
        if start + len <= size {
            after[axis] = size - start - len;
        } else {
            // The interleaved tail ran past the end: trim it first.
            let mut ranges = vec![SliceRange::FULL; ct.rank()];
            ranges[axis] = SliceRange::new(0, (size - start) as i64);
            cur = e.add_op1(Op::Slice(Slice { ranges }), &[cur])?;
        }
        if before[axis] + after[axis] > 0 {
            cur = e.add_op1(
                Op::Pad(Pad {
                    before,
                    after,
                    value: Float(0.0),
                }),
                &[cur],
            )?;
        }
    }
    Ok(cur)
}

/// Same elements in row-major order, new shape (also used by composites' evaluations).
pub(crate) fn reshape(site: &Site, x: &Value, shape: &[usize]) -> Res<Value> {
    let n: usize = shape.iter().product();
    if n != x.shape().iter().product::<usize>() {
        return Err(site.err(format!("cannot reshape {:?} to {shape:?}", x.shape())));
    }
    let data = map_data!(&x.data, a => {
        let flat: Vec<_> = a.iter().cloned().collect();
        ArrayD::from_shape_vec(IxDyn(shape), flat).map_err(|e| site.err(e.to_string()))?
    });
    Ok(x.with(data))
}

/// Strided slice with Python semantics.
pub(crate) fn slice(site: &Site, x: &Value, ranges: &[SliceRange]) -> Res<Value> {
    let shape = x.shape().to_vec();
    if ranges.len() != shape.len() {
        return Err(site.err(format!("{} slice ranges for shape {shape:?}", ranges.len())));
    }
    let slices: Vec<ndarray::Slice> = ranges
        .iter()
        .zip(&shape)
        .map(|(r, &size)| {
            let (s, n) = r.resolve(size);
            let step = r.step.max(1) as usize;
            // End just past the last taken element keeps ndarray within bounds.
            let end = if n == 0 { s } else { s + (n - 1) * step + 1 };
            ndarray::Slice::new(s as isize, Some(end as isize), step as isize)
        })
        .collect();
    let data = map_data!(&x.data, a => a.slice_each_axis(|ax| slices[ax.axis.index()]).to_owned());
    Ok(x.with(data))
}

/// Constant padding; the fill value converts like a cast (saturating for ints).
pub(crate) fn pad(site: &Site, x: &Value, before: &[usize], after: &[usize], value: f64) -> Res<Value> {
    let shape = x.shape().to_vec();
    if before.len() != shape.len() || after.len() != shape.len() {
        return Err(site.err(format!("pad widths do not match shape {shape:?}")));
    }
    let mut out_shape = Vec::with_capacity(shape.len());
    for i in 0..shape.len() {
        let n = shape[i].checked_add(before[i]).and_then(|n| n.checked_add(after[i]));
        out_shape.push(n.ok_or_else(|| site.err("padded size overflows"))?);
    }
    site.check_size(x.dtype, &out_shape, "padded tensor")?;
    let inner = |ax: ndarray::AxisDescription| {
        ndarray::Slice::from(before[ax.axis.index()]..before[ax.axis.index()] + shape[ax.axis.index()])
    };
    fn fill<T: Clone>(
        a: &ArrayD<T>,
        shape: &[usize],
        v: T,
        inner: impl Fn(ndarray::AxisDescription) -> ndarray::Slice,
    ) -> ArrayD<T> {
        let mut out = ArrayD::from_elem(IxDyn(shape), v);
        out.slice_each_axis_mut(inner).assign(a);
        out
    }
    let data = match &x.data {
        Data::F(a) => Data::F(fill(a, &out_shape, value, inner)),
        Data::I(a) => Data::I(fill(a, &out_shape, float_to_int(x.dtype, value), inner)),
        Data::B(a) => Data::B(fill(a, &out_shape, value != 0.0, inner)),
    };
    Ok(x.with(data))
}

/// Concatenate along `axis`.
pub(crate) fn concat(site: &Site, xs: &[&Value], axis: usize) -> Res<Value> {
    let first = xs.first().ok_or_else(|| site.err("concat needs at least one input"))?;
    if axis >= first.shape().len() {
        return Err(site.err(format!("axis {axis} out of range for {:?}", first.shape())));
    }
    let fail = |e: ndarray::ShapeError| site.err(format!("cannot concat along axis {axis}: {e}"));
    let mismatch = || site.err("concat operands have different dtypes");
    macro_rules! cat {
        ($variant:ident) => {{
            let v: Option<Vec<_>> = xs
                .iter()
                .map(|x| {
                    if let Data::$variant(a) = &x.data {
                        Some(a.view())
                    } else {
                        None
                    }
                })
                .collect();
            Data::$variant(ndarray::concatenate(Axis(axis), &v.ok_or_else(mismatch)?).map_err(fail)?)
        }};
    }
    let data = match &first.data {
        Data::F(_) => cat!(F),
        Data::I(_) => cat!(I),
        Data::B(_) => cat!(B),
    };
    Ok(first.with(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_resolve_follows_python() {
        // list(range(10))[2:8:3] == [2, 5]
        assert_eq!(
            SliceRange {
                start: 2,
                end: 8,
                step: 3
            }
            .resolve(10),
            (2, 2)
        );
        // [-3:] of 10 → 7,8,9
        assert_eq!(
            SliceRange {
                start: -3,
                end: i64::MAX,
                step: 1
            }
            .resolve(10),
            (7, 3)
        );
        // [5:2] is empty; [-20:3] clamps; i64::MIN does not overflow
        assert_eq!(SliceRange::new(5, 2).resolve(10).1, 0);
        assert_eq!(SliceRange::new(-20, 3).resolve(10), (0, 3));
        assert_eq!(SliceRange::new(i64::MIN, 2).resolve(10), (0, 2));
        assert_eq!(SliceRange::FULL.resolve(4), (0, 4));
        assert_eq!(
            SliceRange {
                start: 0,
                end: i64::MAX,
                step: i64::MAX
            }
            .resolve(4),
            (0, 1)
        );
    }
}
