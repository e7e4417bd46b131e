//! Appending instructions to a kernel body: each method adds one SSA instruction and returns
//! its index. Arithmetic results take their first operand's dtype; comparisons are bool.

use oar_ir::kernel::{Inst, ScalarOp};
use oar_ir::ops::{BinaryOp, UnaryOp};
use oar_ir::{DType, Float};

/// A body under construction.
pub(crate) struct B<'a> {
    pub out: &'a mut Vec<Inst>,
    /// The backend's max/min propagate NaN (`Expand::NanMinMax` is native): a clamp keeps a
    /// NaN, so expansions can skip their NaN fix-up.
    pub nan_minmax: bool,
}

impl B<'_> {
    /// Append `op` with result `dtype`.
    pub fn push(&mut self, op: ScalarOp, dtype: DType) -> usize {
        self.out.push(Inst { op, dtype });
        self.out.len() - 1
    }

    /// The dtype of instruction `a`.
    pub fn dt(&self, a: usize) -> DType {
        self.out[a].dtype
    }

    /// A constant of `dtype`.
    pub fn c(&mut self, dtype: DType, v: f64) -> usize {
        self.push(ScalarOp::Const(Float(v)), dtype)
    }

    /// A constant of `a`'s dtype.
    pub fn like(&mut self, a: usize, v: f64) -> usize {
        let d = self.dt(a);
        self.c(d, v)
    }

    fn bin(&mut self, op: BinaryOp, a: usize, b: usize) -> usize {
        let d = if op.is_comparison() { DType::Bool } else { self.dt(a) };
        self.push(ScalarOp::Binary(op, a, b), d)
    }

    pub fn add(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Add, a, b)
    }
    pub fn sub(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Sub, a, b)
    }
    pub fn mul(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Mul, a, b)
    }
    pub fn div(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Div, a, b)
    }
    pub fn and(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::And, a, b)
    }
    pub fn or(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Or, a, b)
    }
    pub fn xor(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Xor, a, b)
    }
    /// The core (NaN-unspecified) max / min.
    pub fn max(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Max, a, b)
    }
    pub fn min(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Min, a, b)
    }
    pub fn lt(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Lt, a, b)
    }
    pub fn le(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Le, a, b)
    }
    pub fn gt(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Gt, a, b)
    }
    pub fn ge(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Ge, a, b)
    }
    pub fn eq(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Eq, a, b)
    }
    pub fn ne(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Ne, a, b)
    }

    /// `a op c` with `c` a constant of a's dtype.
    pub fn add_c(&mut self, a: usize, c: f64) -> usize {
        let k = self.like(a, c);
        self.add(a, k)
    }
    pub fn mul_c(&mut self, a: usize, c: f64) -> usize {
        let k = self.like(a, c);
        self.mul(a, k)
    }
    pub fn lt_c(&mut self, a: usize, c: f64) -> usize {
        let k = self.like(a, c);
        self.lt(a, k)
    }
    pub fn gt_c(&mut self, a: usize, c: f64) -> usize {
        let k = self.like(a, c);
        self.gt(a, k)
    }
    pub fn eq_c(&mut self, a: usize, c: f64) -> usize {
        let k = self.like(a, c);
        self.eq(a, k)
    }
    pub fn and_c(&mut self, a: usize, c: f64) -> usize {
        let k = self.like(a, c);
        self.and(a, k)
    }
    pub fn or_c(&mut self, a: usize, c: f64) -> usize {
        let k = self.like(a, c);
        self.or(a, k)
    }

    pub fn un(&mut self, op: UnaryOp, a: usize) -> usize {
        let d = self.dt(a);
        self.push(ScalarOp::Unary(op, a), d)
    }
    pub fn neg(&mut self, a: usize) -> usize {
        self.un(UnaryOp::Neg, a)
    }
    pub fn abs(&mut self, a: usize) -> usize {
        self.un(UnaryOp::Abs, a)
    }
    pub fn floor(&mut self, a: usize) -> usize {
        self.un(UnaryOp::Floor, a)
    }

    /// `where(c, a, b)`.
    pub fn sel(&mut self, c: usize, a: usize, b: usize) -> usize {
        let d = self.dt(a);
        self.push(ScalarOp::Where(c, a, b), d)
    }
    /// `a` unless `c`, then the constant `v`.
    pub fn sel_c(&mut self, c: usize, v: f64, a: usize) -> usize {
        let k = self.like(a, v);
        self.sel(c, k, a)
    }
    /// True where `a` is NaN.
    pub fn is_nan(&mut self, a: usize) -> usize {
        self.ne(a, a)
    }

    pub fn cast(&mut self, a: usize, to: DType) -> usize {
        if self.dt(a) == to {
            return a;
        }
        self.push(ScalarOp::Cast(a), to)
    }
    pub fn bitcast(&mut self, a: usize, to: DType) -> usize {
        self.push(ScalarOp::Bitcast(a), to)
    }
    pub fn shl(&mut self, a: usize, n: u32) -> usize {
        let d = self.dt(a);
        self.push(ScalarOp::ShiftLeft(a, n), d)
    }
    pub fn shr(&mut self, a: usize, n: u32) -> usize {
        let d = self.dt(a);
        self.push(ScalarOp::ShiftRight(a, n), d)
    }

    /// `a·b + c` rounded once (f32 / f64).
    pub fn fma(&mut self, a: usize, b: usize, c: usize) -> usize {
        let d = self.dt(a);
        self.push(ScalarOp::MulAdd(a, b, c), d)
    }

    /// `c[0]·x^(n-1) + ... + c[n-1]` by Horner's rule (highest degree first), one fused
    /// multiply-add per step.
    pub fn horner(&mut self, x: usize, coefs: &[f64]) -> usize {
        let mut p = self.like(x, coefs[0]);
        for &c in &coefs[1..] {
            let c = self.like(x, c);
            p = self.fma(p, x, c);
        }
        p
    }

    /// `x` with `|x|`'s sign replaced by `neg`'s truth (`-x` where `neg`).
    pub fn negate_if(&mut self, neg: usize, x: usize) -> usize {
        let n = self.neg(x);
        self.sel(neg, n, x)
    }
}
