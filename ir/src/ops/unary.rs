//! Elementwise unary ops (`neg` … `not`): one op type, one mnemonic per variant.
//!
//! Reference semantics: floats in f64 (`round` is half-to-even, `sign` keeps ±0 and NaN);
//! integer `neg`/`abs` wrap; `not` is logical on bool and bitwise on ints.

use super::rules::{R, arity, out_elements};
use super::{BinaryOp, Grads, OpDef, OpFamily, OpText, VjpArgs, named_enum};
use crate::eval::{Data, EvalCx, Res, Value};
use crate::text::{Attrs, ParseError};
use crate::{Emitter, Graph, TensorType};

named_enum!(
    /// Elementwise unary ops.
    UnaryOp {
        /// `-x`
        Neg => "neg",
        /// `|x|`
        Abs => "abs",
        /// `e^x`
        Exp => "exp",
        /// natural log
        Log => "log",
        /// square root
        Sqrt => "sqrt",
        /// `1/sqrt(x)`
        Rsqrt => "rsqrt",
        /// `1/x`
        Recip => "recip",
        /// sine
        Sin => "sin",
        /// cosine
        Cos => "cos",
        /// hyperbolic tangent
        Tanh => "tanh",
        /// error function
        Erf => "erf",
        /// round toward -inf
        Floor => "floor",
        /// round toward +inf
        Ceil => "ceil",
        /// round half to even
        Round => "round",
        /// -1, 0 or 1 (0 for NaN → NaN for floats)
        Sign => "sign",
        /// logical not (bool) or bitwise not (ints)
        Not => "not",
    }
);

impl UnaryOp {
    /// True for ops defined only on floats.
    pub fn float_only(self) -> bool {
        use UnaryOp::*;
        matches!(
            self,
            Exp | Log | Sqrt | Rsqrt | Recip | Sin | Cos | Tanh | Erf | Floor | Ceil | Round
        )
    }

    /// True for the transcendental functions (`exp log sin cos tanh erf`), which code
    /// generators get expanded into the core set (`oar_passes::legalize`).
    pub fn is_transcendental(self) -> bool {
        use UnaryOp::*;
        matches!(self, Exp | Log | Sin | Cos | Tanh | Erf)
    }

    /// The op on one f64 (the reference's float semantics).
    pub fn eval_f64(self, v: f64) -> f64 {
        use UnaryOp::*;
        match self {
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
            // `not` is rejected for floats by the type rule; NaN marks the impossible case.
            Not => f64::NAN,
        }
    }
}

impl OpText for UnaryOp {
    fn mnemonics() -> &'static [&'static str] {
        UnaryOp::NAMES
    }
    fn name(&self) -> &'static str {
        UnaryOp::name(*self)
    }
    fn print_attrs(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    fn parse(name: &str, attrs: &mut Attrs, _: &[TensorType]) -> Result<Self, ParseError> {
        UnaryOp::from_name(name).ok_or_else(|| attrs.here(crate::text::unknown_op(name)))
    }
}

impl OpDef for UnaryOp {
    fn family(&self) -> OpFamily {
        OpFamily::Elementwise
    }

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        arity(inputs, 1)?;
        let x = &inputs[0];
        let ok = match self {
            _ if self.float_only() => x.dtype.is_float(),
            UnaryOp::Not => !x.dtype.is_float(),
            _ => x.dtype.is_numeric(),
        };
        if !ok {
            return Err(format!("{} is not defined for {x}", self.name()));
        }
        Ok(vec![x.clone()])
    }

    fn flops(&self, _: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        out_elements(outputs)
    }

    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E> {
        let mut grads = a.none();
        grads[0] = vjp(e, *self, a.inputs[0], a.outputs[0], a.g)?;
        Ok(grads)
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        crate::eval::arity(cx.site(), ins, &[1])?;
        let (op, x) = (*self, ins[0]);
        let data = match &x.data {
            Data::F(a) => Data::F(a.mapv(|v| op.eval_f64(v))),
            Data::I(a) if !op.float_only() => Data::I(a.mapv(|v| match op {
                UnaryOp::Neg => v.wrapping_neg(),
                UnaryOp::Abs => v.wrapping_abs(),
                UnaryOp::Sign => v.signum(),
                _ => !v,
            })),
            Data::B(a) if op == UnaryOp::Not => Data::B(a.mapv(|v| !v)),
            _ => return Err(cx.site().err(format!("{} is not defined for {}", op.name(), x.dtype))),
        };
        Ok(vec![x.with(data)])
    }
}

/// The gradient of `y = u(x)` given `g = dL/dy`; `None` for piecewise-constant ops.
fn vjp<E: Emitter>(e: &mut E, u: UnaryOp, x: E::Value, y: E::Value, g: E::Value) -> Result<Option<E::Value>, E::Error> {
    use BinaryOp::{Div, Mul, Sub};
    let dtype = e.value_type(x).dtype;
    Ok(Some(match u {
        UnaryOp::Neg => e.unary(UnaryOp::Neg, g)?,
        UnaryOp::Abs => {
            let s = e.unary(UnaryOp::Sign, x)?;
            e.binary(Mul, g, s)?
        }
        UnaryOp::Exp => e.binary(Mul, g, y)?,
        UnaryOp::Log => e.binary(Div, g, x)?,
        UnaryOp::Sqrt => {
            let two_y = e.binary_scalar(Mul, y, 2.0)?;
            e.binary(Div, g, two_y)?
        }
        UnaryOp::Rsqrt => {
            // d/dx x^-1/2 = -1/2 · x^-1/2 / x
            let t = e.binary(Div, y, x)?;
            let t = e.binary_scalar(Mul, t, -0.5)?;
            e.binary(Mul, g, t)?
        }
        UnaryOp::Recip => {
            let yy = e.binary(Mul, y, y)?;
            let t = e.binary(Mul, g, yy)?;
            e.unary(UnaryOp::Neg, t)?
        }
        UnaryOp::Sin => {
            let c = e.unary(UnaryOp::Cos, x)?;
            e.binary(Mul, g, c)?
        }
        UnaryOp::Cos => {
            let s = e.unary(UnaryOp::Sin, x)?;
            let t = e.binary(Mul, g, s)?;
            e.unary(UnaryOp::Neg, t)?
        }
        UnaryOp::Tanh => {
            let yy = e.binary(Mul, y, y)?;
            let one = e.add_scalar(dtype, 1.0)?;
            let d = e.binary(Sub, one, yy)?;
            e.binary(Mul, g, d)?
        }
        UnaryOp::Erf => {
            // d/dx erf(x) = 2/√π · exp(-x²)
            let xx = e.binary(Mul, x, x)?;
            let nxx = e.unary(UnaryOp::Neg, xx)?;
            let ex = e.unary(UnaryOp::Exp, nxx)?;
            let d = e.binary_scalar(Mul, ex, std::f64::consts::FRAC_2_SQRT_PI)?;
            e.binary(Mul, g, d)?
        }
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign | UnaryOp::Not => return Ok(None),
    }))
}
