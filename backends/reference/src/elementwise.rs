//! Elementwise ops: unary, binary (numpy broadcasting), where, cast.
//!
//! Semantics beyond the op docs follow numpy: integer arithmetic wraps; integer `div`
//! truncates and `rem` takes the sign of the divisor; integer division by zero and integer
//! powers with negative exponents are runtime errors; float `max`/`min` propagate NaN;
//! comparisons with NaN are false (except `ne`).

use crate::value::{Data, Res, Site, Value, float_to_int};
use ndarray::{ArrayD, ArrayViewD, IxDyn, Zip};
use oar_ir::DType;
use oar_ir::ops::{BinaryOp, UnaryOp};

/// numpy's broadcast of two concrete shapes.
pub(crate) fn broadcast_dims(site: &Site, a: &[usize], b: &[usize]) -> Res<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = (i + a.len()).checked_sub(rank).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(rank).map_or(1, |j| b[j]);
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(site.err(format!("shapes {a:?} and {b:?} do not broadcast"))),
        });
    }
    Ok(out)
}

/// A view of `a` broadcast to `shape`, or an error.
pub(crate) fn view_as<'a, T>(site: &Site, a: &'a ArrayD<T>, shape: &[usize]) -> Res<ArrayViewD<'a, T>> {
    a.broadcast(IxDyn(shape))
        .ok_or_else(|| site.err(format!("shape {:?} does not broadcast to {shape:?}", a.shape())))
}

/// Apply `f` to pairs of broadcast elements.
fn zip2<A: Copy, B: Copy, C>(site: &Site, a: &ArrayD<A>, b: &ArrayD<B>, f: impl Fn(A, B) -> C) -> Res<ArrayD<C>> {
    let shape = broadcast_dims(site, a.shape(), b.shape())?;
    let (va, vb) = (view_as(site, a, &shape)?, view_as(site, b, &shape)?);
    Ok(Zip::from(&va).and(&vb).map_collect(|&x, &y| f(x, y)))
}

/// An elementwise unary op.
pub(crate) fn unary(site: &Site, op: UnaryOp, x: &Value) -> Res<Value> {
    use UnaryOp::*;
    let data = match &x.data {
        Data::F(a) => Data::F(a.mapv(|v| match op {
            Neg => -v,
            Abs => v.abs(),
            Exp => v.exp(),
            Log => v.ln(),
            Sqrt => v.sqrt(),
            Rsqrt => 1.0 / v.sqrt(),
            Recip => 1.0 / v,
            Sin => v.sin(),
            Cos => v.cos(),
            Tanh => v.tanh(),
            Erf => libm::erf(v),
            Floor => v.floor(),
            Ceil => v.ceil(),
            Round => v.round_ties_even(),
            Sign if v > 0.0 => 1.0,
            Sign if v < 0.0 => -1.0,
            // ±0 and NaN map to themselves.
            Sign => v,
            // `not` is rejected for floats by the verifier; NaN marks the impossible case.
            Not => f64::NAN,
        })),
        Data::I(a) if !op.float_only() => Data::I(a.mapv(|v| match op {
            Neg => v.wrapping_neg(),
            Abs => v.wrapping_abs(),
            Sign => v.signum(),
            _ => !v,
        })),
        Data::B(a) if op == Not => Data::B(a.mapv(|v| !v)),
        _ => return Err(site.err(format!("{} is not defined for {}", op.name(), x.dtype))),
    };
    Ok(x.with(data))
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

/// An elementwise binary op with numpy broadcasting.
pub(crate) fn binary(site: &Site, op: BinaryOp, a: &Value, b: &Value) -> Res<Value> {
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
            Data::F(zip2(site, x, y, |p, q| match op {
                Add => p + q,
                Sub => p - q,
                Mul => p * q,
                Div => p / q,
                Pow => p.powf(q),
                Max if p.is_nan() || q.is_nan() => f64::NAN,
                Max => p.max(q),
                Min if p.is_nan() || q.is_nan() => f64::NAN,
                Min => p.min(q),
                _ => float_rem(p, q),
            })?)
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

/// `where(cond, a, b)` with three-way broadcasting.
pub(crate) fn select(site: &Site, c: &Value, a: &Value, b: &Value) -> Res<Value> {
    let cond = c.as_b(site, "condition")?;
    if a.dtype != b.dtype {
        return Err(site.err(format!("dtypes differ: {} vs {}", a.dtype, b.dtype)));
    }
    let shape = broadcast_dims(site, &broadcast_dims(site, cond.shape(), a.shape())?, b.shape())?;
    let vc = view_as(site, cond, &shape)?;
    fn pick<T: Copy>(site: &Site, c: &ArrayViewD<bool>, x: &ArrayD<T>, y: &ArrayD<T>) -> Res<ArrayD<T>> {
        let (vx, vy) = (view_as(site, x, c.shape())?, view_as(site, y, c.shape())?);
        Ok(Zip::from(c)
            .and(&vx)
            .and(&vy)
            .map_collect(|&k, &p, &q| if k { p } else { q }))
    }
    let data = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => Data::F(pick(site, &vc, x, y)?),
        (Data::I(x), Data::I(y)) => Data::I(pick(site, &vc, x, y)?),
        (Data::B(x), Data::B(y)) => Data::B(pick(site, &vc, x, y)?),
        _ => return Err(site.err("where operands have different storage")),
    };
    Ok(a.with(data))
}

/// Convert to another dtype: float→int truncates toward zero and saturates (NaN → 0);
/// int→int wraps; anything→bool is `!= 0` (NaN → true); bool→number is 0/1.
pub(crate) fn cast(x: &Value, to: DType) -> Value {
    let data = match (&x.data, to) {
        (Data::F(a), t) if t.is_float() => Data::F(a.clone()),
        (Data::F(a), DType::Bool) => Data::B(a.mapv(|v| v != 0.0)),
        (Data::F(a), t) => Data::I(a.mapv(|v| float_to_int(t, v))),
        // i64 → f32 in one rounding step (through f64 would round twice above 2^53).
        (Data::I(a), DType::F32) => Data::F(a.mapv(|v| v as f32 as f64)),
        (Data::I(a), t) if t.is_float() => Data::F(a.mapv(|v| v as f64)),
        (Data::I(a), DType::Bool) => Data::B(a.mapv(|v| v != 0)),
        (Data::I(a), _) => Data::I(a.clone()),
        (Data::B(a), t) if t.is_float() => Data::F(a.mapv(|v| v as u8 as f64)),
        (Data::B(a), DType::Bool) => Data::B(a.clone()),
        (Data::B(a), _) => Data::I(a.mapv(|v| v as i64)),
    };
    Value { dtype: to, data }
}
