//! Elementwise binary ops with numpy broadcasting (`add` … `xor`): one op type, one mnemonic
//! per variant.
//!
//! Reference semantics beyond the docs follow numpy: integer arithmetic wraps; integer `div`
//! truncates and `rem` takes the sign of the divisor; integer division by zero and integer
//! powers with negative exponents are runtime errors; float `max`/`min` propagate NaN;
//! comparisons with NaN are false (except `ne`).

use super::rules::{R, arity, out_elements, same_dtype};
use super::{Grads, Op, OpDef, OpFamily, OpText, UnaryOp, VjpArgs, named_enum};
use crate::eval::{Data, EvalCx, Res, Site, Value, broadcast_dims, view_as, zip2};
use crate::shape::broadcast_shapes;
use crate::text::{Attrs, ParseError};
use crate::{DType, Emitter, Graph, TensorType};

named_enum!(
    /// Elementwise binary ops (numpy broadcasting).
    BinaryOp {
        /// `a + b`
        Add => "add",
        /// `a - b`
        Sub => "sub",
        /// `a * b`
        Mul => "mul",
        /// `a / b` (ints: truncating; division by zero is a runtime error)
        Div => "div",
        /// `a ^ b`
        Pow => "pow",
        /// elementwise max (NaN propagates)
        Max => "max",
        /// elementwise min (NaN propagates)
        Min => "min",
        /// remainder with the sign of the divisor (numpy `mod`)
        Rem => "rem",
        /// `a == b` → bool
        Eq => "eq",
        /// `a != b` → bool
        Ne => "ne",
        /// `a < b` → bool
        Lt => "lt",
        /// `a <= b` → bool
        Le => "le",
        /// `a > b` → bool
        Gt => "gt",
        /// `a >= b` → bool
        Ge => "ge",
        /// logical (bool) or bitwise (ints) and
        And => "and",
        /// logical (bool) or bitwise (ints) or
        Or => "or",
        /// logical (bool) or bitwise (ints) xor
        Xor => "xor",
    }
);

impl BinaryOp {
    /// True for comparisons, whose result is bool.
    pub fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge)
    }

    /// True for logical/bitwise ops (bool or ints only).
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }

    /// True if `a op b == b op a`.
    pub fn is_commutative(self) -> bool {
        use BinaryOp::*;
        matches!(self, Add | Mul | Max | Min | Eq | Ne | And | Or | Xor)
    }

    /// The op on two f64 (the reference's float semantics; comparisons give 1.0 or 0.0).
    pub fn eval_f64(self, p: f64, q: f64) -> f64 {
        use BinaryOp::*;
        match self {
            Add => p + q,
            Sub => p - q,
            Mul => p * q,
            Div => p / q,
            Pow => p.powf(q),
            Max if p.is_nan() || q.is_nan() => f64::NAN,
            Max => p.max(q),
            Min if p.is_nan() || q.is_nan() => f64::NAN,
            Min => p.min(q),
            Rem => float_rem(p, q),
            _ if self.is_comparison() => f64::from(u8::from(compare(self, p, q))),
            // Logical ops are rejected for floats by the type rule.
            _ => f64::NAN,
        }
    }
}

impl OpText for BinaryOp {
    fn mnemonics() -> &'static [&'static str] {
        BinaryOp::NAMES
    }
    fn name(&self) -> &'static str {
        BinaryOp::name(*self)
    }
    fn print_attrs(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    fn parse(name: &str, attrs: &mut Attrs, _: &[TensorType]) -> Result<Self, ParseError> {
        BinaryOp::from_name(name).ok_or_else(|| attrs.here(crate::text::unknown_op(name)))
    }
}

impl OpDef for BinaryOp {
    fn family(&self) -> OpFamily {
        OpFamily::Elementwise
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 2)?;
        let (x, y) = (&inputs[0], &inputs[1]);
        same_dtype(x, y)?;
        let ok = if self.is_logical() {
            !x.dtype.is_float()
        } else if self.is_comparison() {
            true
        } else {
            x.dtype.is_numeric()
        };
        if !ok {
            return Err(format!("{} is not defined for {x}", self.name()));
        }
        let s = broadcast_shapes(&x.shape, &y.shape)?;
        let dtype = if self.is_comparison() { DType::Bool } else { x.dtype };
        Ok(vec![TensorType::new(dtype, s)])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        out_elements(outputs)
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        vjp(e, *self, a)
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[2])?;
        Ok(vec![eval(cx.site(), *self, ins[0], ins[1])?])
    }
}

/// numpy `mod` for floats: the remainder has the sign of the divisor.
fn float_rem(a: f64, b: f64) -> f64 {
    let r = a % b;
    if r != 0.0 && (r < 0.0) != (b < 0.0) {
        r + b
    } else if r == 0.0 {
        0.0f64.copysign(b)
    } else {
        r
    }
}

/// Integer power by squaring, wrapping (exponent ≥ 0).
fn int_pow(mut base: i64, mut exp: i64) -> i64 {
    let mut acc = 1i64;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    acc
}

fn compare<T: PartialOrd>(op: BinaryOp, x: T, y: T) -> bool {
    match op {
        BinaryOp::Eq => x == y,
        BinaryOp::Ne => x != y,
        BinaryOp::Lt => x < y,
        BinaryOp::Le => x <= y,
        BinaryOp::Gt => x > y,
        _ => x >= y,
    }
}

/// An elementwise binary op with numpy broadcasting (also used by composites' evaluations).
pub(crate) fn eval(site: &Site, op: BinaryOp, a: &Value, b: &Value) -> Res<Value> {
    use BinaryOp::*;
    if a.dtype != b.dtype {
        return Err(site.err(format!("dtypes differ: {} vs {}", a.dtype, b.dtype)));
    }
    let undefined = || site.err(format!("{} is not defined for {}", op.name(), a.dtype));
    if op.is_comparison() {
        let out = match (&a.data, &b.data) {
            (Data::F(x), Data::F(y)) => zip2(site, x, y, |p, q| compare(op, p, q))?,
            (Data::I(x), Data::I(y)) => zip2(site, x, y, |p, q| compare(op, p, q))?,
            (Data::B(x), Data::B(y)) => zip2(site, x, y, |p, q| compare(op, p, q))?,
            _ => return Err(undefined()),
        };
        return Ok(Value::boolean(out));
    }
    let data = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => {
            if op.is_logical() {
                return Err(undefined());
            }
            Data::F(zip2(site, x, y, |p, q| op.eval_f64(p, q))?)
        }
        (Data::I(x), Data::I(y)) => {
            let shape = broadcast_dims(site, x.shape(), y.shape())?;
            let vy = view_as(site, y, &shape)?;
            if matches!(op, Div | Rem) && vy.iter().any(|&q| q == 0) {
                return Err(site.err(format!("integer {} by zero", op.name())));
            }
            if op == Pow && vy.iter().any(|&q| q < 0) {
                return Err(site.err("integer power with a negative exponent"));
            }
            Data::I(zip2(site, x, y, |p, q| match op {
                Add => p.wrapping_add(q),
                Sub => p.wrapping_sub(q),
                Mul => p.wrapping_mul(q),
                Div => p.wrapping_div(q),
                Pow => int_pow(p, q),
                Max => p.max(q),
                Min => p.min(q),
                Rem => {
                    let r = p.wrapping_rem(q);
                    if r != 0 && (r < 0) != (q < 0) { r + q } else { r }
                }
                And => p & q,
                Or => p | q,
                _ => p ^ q,
            })?)
        }
        (Data::B(x), Data::B(y)) if op.is_logical() => Data::B(zip2(site, x, y, |p, q| match op {
            And => p & q,
            Or => p | q,
            _ => p ^ q,
        })?),
        _ => return Err(undefined()),
    };
    Ok(a.with(data))
}

fn vjp<E: Emitter>(e: &mut E, b: BinaryOp, a: &VjpArgs<E::Value>) -> Grads<E> {
    use BinaryOp::*;
    let (x, y, out, g) = (a.inputs[0], a.inputs[1], a.outputs[0], a.g);
    let (want_x, want_y) = (a.want(0), a.want(1));
    let (sx, sy) = (e.value_type(x).shape, e.value_type(y).shape);
    let dtype = e.value_type(g).dtype;
    if b.is_comparison() || b.is_logical() || !dtype.is_float() {
        return Ok(vec![None, None]);
    }
    // Each side's raw (broadcast-shaped) gradient, then summed back to its operand's shape.
    let (gx, gy) = match b {
        Add => (Some(g), Some(g)),
        Sub => (Some(g), if want_y { Some(e.unary(UnaryOp::Neg, g)?) } else { None }),
        Mul => (
            if want_x { Some(e.binary(Mul, g, y)?) } else { None },
            if want_y { Some(e.binary(Mul, g, x)?) } else { None },
        ),
        Div => {
            let gx = e.binary(Div, g, y)?;
            let gy = if want_y {
                let t = e.binary(Mul, gx, out)?;
                Some(e.unary(UnaryOp::Neg, t)?)
            } else {
                None
            };
            (Some(gx), gy)
        }
        Pow => {
            let gx = if want_x {
                let ym1 = e.binary_scalar(Sub, y, 1.0)?;
                let p = e.binary(Pow, x, ym1)?;
                let t = e.binary(Mul, y, p)?;
                Some(e.binary(Mul, g, t)?)
            } else {
                None
            };
            let gy = if want_y {
                let l = e.unary(UnaryOp::Log, x)?;
                let t = e.binary(Mul, out, l)?;
                Some(e.binary(Mul, g, t)?)
            } else {
                None
            };
            (gx, gy)
        }
        Max | Min => {
            // The larger (smaller) side takes the gradient; ties split it evenly (as PyTorch).
            let (wins_x, wins_y) = if b == Max { (Gt, Lt) } else { (Lt, Gt) };
            let zero = e.add_scalar(dtype, 0.0)?;
            let half = e.binary_scalar(Mul, g, 0.5)?;
            let tie = e.binary(Eq, x, y)?;
            let tied = e.add_op1(Op::Where, &[tie, half, zero])?;
            let side = |e: &mut E, cmp: BinaryOp| -> Result<E::Value, E::Error> {
                let c = e.binary(cmp, x, y)?;
                e.add_op1(Op::Where, &[c, g, tied])
            };
            (
                if want_x { Some(side(e, wins_x)?) } else { None },
                if want_y { Some(side(e, wins_y)?) } else { None },
            )
        }
        Rem => {
            // a mod b = a - floor(a/b)·b
            let gy = if want_y {
                let q = e.binary(Div, x, y)?;
                let f = e.unary(UnaryOp::Floor, q)?;
                let t = e.binary(Mul, g, f)?;
                Some(e.unary(UnaryOp::Neg, t)?)
            } else {
                None
            };
            (Some(g), gy)
        }
        Eq | Ne | Lt | Le | Gt | Ge | And | Or | Xor => (None, None),
    };
    let gx = match gx.filter(|_| want_x) {
        Some(v) => Some(e.sum_to(v, &sx)?),
        None => None,
    };
    let gy = match gy.filter(|_| want_y) {
        Some(v) => Some(e.sum_to(v, &sy)?),
        None => None,
    };
    Ok(vec![gx, gy])
}
