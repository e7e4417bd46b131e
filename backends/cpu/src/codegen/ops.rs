//! Scalar and 128-bit vector code for the kernel language's scalar ops, with the reference
//! backend's semantics (see `backends/reference/src/elementwise.rs`).
//!
//! Representation: a value of dtype `d` is one Cranelift value, a scalar of [`scalar_ty`] or a
//! vector of `lanes` lanes. Bools are bytes holding 0/1 as scalars and full-width lane masks
//! (all ones / zero, of the kernel's lane width) as vectors.

use super::emit::Em;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::Ieee32;
use cranelift_codegen::ir::{ConstantData, Endianness, InstBuilder, MemFlagsData, Type, Value, types};
use oar_ir::DType;
use oar_ir::ops::{BinaryOp, UnaryOp};

/// The Cranelift type of a scalar of `dt`.
pub(super) fn scalar_ty(dt: DType) -> Type {
    match dt {
        DType::F32 => types::F32,
        DType::F64 => types::F64,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        // i8, u8, bool (f16/bf16 never reach code generation).
        _ => types::I8,
    }
}

/// The Cranelift type of `dt` at `lanes` lanes (bools: the lane mask type; i8/u8 values in
/// 4-lane code: their exact values in 32-bit lanes, see `plan::vectorizable`).
pub(super) fn ty_of(dt: DType, lanes: u8) -> Type {
    if lanes == 1 {
        return scalar_ty(dt);
    }
    let t = match dt {
        DType::Bool => {
            if lanes == 4 {
                types::I32
            } else {
                types::I64
            }
        }
        DType::I8 | DType::U8 if lanes == 4 => types::I32,
        d => scalar_ty(d),
    };
    t.by(lanes as u32).expect("a 128-bit vector type")
}

/// Little-endian flags for bitcasts between vector shapes.
pub(super) fn le() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

impl Em<'_, '_> {
    /// A float constant of type `t` (scalar or splat).
    pub(super) fn fconst(&mut self, t: Type, v: f64) -> Value {
        let s = if t.lane_type() == types::F32 {
            self.b.ins().f32const(Ieee32::with_float(v as f32))
        } else {
            self.b.ins().f64const(v)
        };
        if t.is_vector() { self.b.ins().splat(t, s) } else { s }
    }

    /// An integer constant of type `t` (scalar or splat), wrapped to its width.
    pub(super) fn iconst(&mut self, t: Type, v: i64) -> Value {
        let lane = t.lane_type();
        let bits = lane.bits();
        let masked = if bits >= 64 { v } else { v & ((1i64 << bits) - 1) };
        let s = self.b.ins().iconst(lane, masked);
        if t.is_vector() { self.b.ins().splat(t, s) } else { s }
    }

    /// `Const(c)` as dtype `dt` at `lanes` lanes (the reference's conversion: ints truncate and
    /// saturate, bools are `c != 0`).
    pub(super) fn constant(&mut self, dt: DType, c: f64, lanes: u8) -> Value {
        let t = ty_of(dt, lanes);
        match dt {
            DType::F32 | DType::F64 => self.fconst(t, c),
            DType::Bool => {
                let on = c != 0.0;
                self.iconst(t, if lanes == 1 { on as i64 } else { -(on as i64) })
            }
            _ => self.iconst(t, wrap_int(dt, c as i64)),
        }
    }

    /// A value computed at `from` lanes (1 or `to`) as `to` lanes.
    pub(super) fn widen(&mut self, x: Value, dt: DType, from: u8, to: u8) -> Value {
        if from == to {
            return x;
        }
        debug_assert_eq!(from, 1);
        let t = ty_of(dt, to);
        if super::plan::is_narrow(dt) && t.lane_type() == types::I32 {
            let w = if dt == DType::U8 {
                self.b.ins().uextend(types::I32, x)
            } else {
                self.b.ins().sextend(types::I32, x)
            };
            return self.b.ins().splat(t, w);
        }
        if dt == DType::Bool {
            // 0/1 byte -> 0/-1 lane mask.
            let lane = t.lane_type();
            let w = self.b.ins().uextend(lane, x);
            let m = self.b.ins().ineg(w);
            return self.b.ins().splat(t, m);
        }
        self.b.ins().splat(t, x)
    }

    fn bitcast(&mut self, t: Type, x: Value) -> Value {
        if self.b.func.dfg.value_type(x) == t {
            return x;
        }
        self.b.ins().bitcast(t, le(), x)
    }

    /// `c ? a : b` for a comparison result `c` of float/int operands (a mask for vectors).
    pub(super) fn choose(&mut self, c: Value, a: Value, b: Value) -> Value {
        let t = self.b.func.dfg.value_type(a);
        if t.is_vector() {
            let c = self.bitcast(t, c);
            self.b.ins().bitselect(c, a, b)
        } else {
            self.b.ins().select(c, a, b)
        }
    }

    /// `x < c ? c : x` (max with a non-NaN `c`; NaN x stays NaN): one `maxps` on vectors.
    pub(super) fn max_keep_nan(&mut self, x: Value, c: Value) -> Value {
        let lt = self.b.ins().fcmp(FloatCC::LessThan, x, c);
        self.choose(lt, c, x)
    }

    /// `c < x ? c : x` (min with a non-NaN `c`; NaN x stays NaN): one `minps` on vectors.
    pub(super) fn min_keep_nan(&mut self, x: Value, c: Value) -> Value {
        let lt = self.b.ins().fcmp(FloatCC::LessThan, c, x);
        self.choose(lt, c, x)
    }

    /// Lanes 2, 3 of an f32x4 moved to lanes 0, 1.
    pub(super) fn high_half(&mut self, x: Value) -> Value {
        let b = self.bitcast(types::I8X16, x);
        let mask: Vec<u8> = (8..16).chain(8..16).collect();
        let imm = self.b.func.dfg.immediates.push(ConstantData::from(mask));
        let s = self.b.ins().shuffle(b, b, imm);
        self.bitcast(types::F32X4, s)
    }

    /// `[a0, a1, b0, b1]` of two f32x4.
    pub(super) fn join_low(&mut self, a: Value, b: Value) -> Value {
        let (ab, bb) = (self.bitcast(types::I8X16, a), self.bitcast(types::I8X16, b));
        let mask: Vec<u8> = (0..8).chain(16..24).collect();
        let imm = self.b.func.dfg.immediates.push(ConstantData::from(mask));
        let s = self.b.ins().shuffle(ab, bb, imm);
        self.bitcast(types::F32X4, s)
    }

    /// Lanes `0, 2` of `a` then `1, 3` of `b` (4 lanes), or lane 0 of `a` then lane 1 of `b`
    /// (2 lanes): the even elements of a stride-2 run loaded as `a` at its start and `b`
    /// `lanes - 1` elements later.
    pub(super) fn even_lanes(&mut self, a: Value, b: Value, t: Type) -> Value {
        let (ab, bb) = (self.bitcast(types::I8X16, a), self.bitcast(types::I8X16, b));
        let mask: Vec<u8> = if t.lane_count() == 4 {
            (0..4).chain(8..12).chain(20..24).chain(28..32).collect()
        } else {
            (0..8).chain(24..32).collect()
        };
        let imm = self.b.func.dfg.immediates.push(ConstantData::from(mask));
        let s = self.b.ins().shuffle(ab, bb, imm);
        self.bitcast(t, s)
    }

    /// An f32 (scalar or f32x4) as f64 (scalar, or the two f64x2 halves).
    pub(super) fn promote(&mut self, x: Value) -> (Value, Option<Value>) {
        let t = self.b.func.dfg.value_type(x);
        if !t.is_vector() {
            return (self.b.ins().fpromote(types::F64, x), None);
        }
        let lo = self.b.ins().fvpromote_low(x);
        let h = self.high_half(x);
        let hi = self.b.ins().fvpromote_low(h);
        (lo, Some(hi))
    }

    /// The inverse of [`Em::promote`] (rounding once).
    pub(super) fn demote(&mut self, lo: Value, hi: Option<Value>) -> Value {
        match hi {
            None => self.b.ins().fdemote(types::F32, lo),
            Some(hi) => {
                let a = self.b.ins().fvdemote(lo);
                let b = self.b.ins().fvdemote(hi);
                self.join_low(a, b)
            }
        }
    }

    /// Apply `f` in f64 to an f32 value (scalar or vector) and round once.
    fn via_f64(&mut self, x: Value, mut f: impl FnMut(&mut Self, Value) -> Value) -> Value {
        let (lo, hi) = self.promote(x);
        let lo = f(self, lo);
        let hi = hi.map(|h| f(self, h));
        self.demote(lo, hi)
    }

    /// A unary op on `x` of dtype `dt`.
    pub(super) fn unary(&mut self, op: UnaryOp, dt: DType, x: Value) -> Value {
        use UnaryOp::*;
        let t = self.b.func.dfg.value_type(x);
        if dt == DType::Bool {
            // Only `not` (checked when planning).
            return if t.is_vector() {
                self.b.ins().bnot(x)
            } else {
                self.b.ins().bxor_imm_s(x, 1)
            };
        }
        if dt.is_float() {
            return match op {
                Neg => self.b.ins().fneg(x),
                Abs => self.b.ins().fabs(x),
                Sqrt => self.b.ins().sqrt(x),
                Recip => {
                    let one = self.fconst(t, 1.0);
                    self.b.ins().fdiv(one, x)
                }
                Rsqrt => {
                    let rs = |e: &mut Self, v: Value| {
                        let tv = e.b.func.dfg.value_type(v);
                        let one = e.fconst(tv, 1.0);
                        let s = e.b.ins().sqrt(v);
                        e.b.ins().fdiv(one, s)
                    };
                    if dt == DType::F32 {
                        // In f64 and rounded once, bit-identical to the reference.
                        self.via_f64(x, rs)
                    } else {
                        rs(self, x)
                    }
                }
                Floor => self.b.ins().floor(x),
                Ceil => self.b.ins().ceil(x),
                Round => self.b.ins().nearest(x),
                Sign => {
                    let zero = self.fconst(t, 0.0);
                    let one = self.fconst(t, 1.0);
                    let m_one = self.fconst(t, -1.0);
                    let lt = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
                    let neg = self.choose(lt, m_one, x);
                    let gt = self.b.ins().fcmp(FloatCC::GreaterThan, x, zero);
                    self.choose(gt, one, neg)
                }
                Not | Exp | Log | Sin | Cos | Tanh | Erf => unreachable!("rejected when planning"),
            };
        }
        // Integers (u8 is unsigned: abs is the identity, sign is 0/1).
        let unsigned = dt == DType::U8;
        match op {
            Neg => self.b.ins().ineg(x),
            Abs if unsigned => x,
            Abs => self.b.ins().iabs(x),
            Sign => {
                let one = self.iconst(t, 1);
                if unsigned {
                    self.b.ins().umin(x, one)
                } else {
                    let m_one = self.iconst(t, -1);
                    let c = self.b.ins().smin(x, one);
                    self.b.ins().smax(c, m_one)
                }
            }
            Not => self.b.ins().bnot(x),
            _ => unreachable!("float-only op on integers is rejected when planning"),
        }
    }

    /// A binary op on `x`, `y` of dtype `dt` (the operands'); `cx`, `cy` are the operands'
    /// values when they are constants.
    pub(super) fn binary(
        &mut self,
        op: BinaryOp,
        dt: DType,
        x: Value,
        y: Value,
        cx: Option<f64>,
        cy: Option<f64>,
    ) -> Value {
        use BinaryOp::*;
        if op.is_comparison() {
            return self.compare(op, dt, x, y);
        }
        if dt == DType::Bool {
            return match op {
                And => self.b.ins().band(x, y),
                Or => self.b.ins().bor(x, y),
                _ => self.b.ins().bxor(x, y),
            };
        }
        if dt.is_float() {
            return match op {
                Add => self.b.ins().fadd(x, y),
                Sub => self.b.ins().fsub(x, y),
                Mul => self.b.ins().fmul(x, y),
                Div => self.b.ins().fdiv(x, y),
                Max | Min => {
                    // With a non-NaN constant operand, one max/min instruction keeps the
                    // reference's NaN propagation.
                    let (v, c) = match (cx, cy) {
                        (_, Some(c)) if !c.is_nan() => (x, y),
                        (Some(c), _) if !c.is_nan() => (y, x),
                        _ => {
                            return if op == Max {
                                self.b.ins().fmax(x, y)
                            } else {
                                self.b.ins().fmin(x, y)
                            };
                        }
                    };
                    if op == Max {
                        self.max_keep_nan(v, c)
                    } else {
                        self.min_keep_nan(v, c)
                    }
                }
                _ => unreachable!("logical ops, pow and rem on floats are rejected when planning"),
            };
        }
        let unsigned = dt == DType::U8;
        match op {
            Add => self.b.ins().iadd(x, y),
            Sub => self.b.ins().isub(x, y),
            Mul => self.b.ins().imul(x, y),
            Max if unsigned => self.b.ins().umax(x, y),
            Max => self.b.ins().smax(x, y),
            Min if unsigned => self.b.ins().umin(x, y),
            Min => self.b.ins().smin(x, y),
            And => self.b.ins().band(x, y),
            Or => self.b.ins().bor(x, y),
            Xor => self.b.ins().bxor(x, y),
            Div => self.int_div(x, y, unsigned),
            Pow => self.int_pow(x, y, unsigned),
            _ => unreachable!("integer rem is expanded by legalize"),
        }
    }

    fn compare(&mut self, op: BinaryOp, dt: DType, x: Value, y: Value) -> Value {
        use BinaryOp::*;
        let t = self.b.func.dfg.value_type(x);
        if dt.is_float() {
            let cc = match op {
                Eq => FloatCC::Equal,
                // Unordered or not equal: NaN != anything.
                Ne => FloatCC::NotEqual,
                Lt => FloatCC::LessThan,
                Le => FloatCC::LessThanOrEqual,
                Gt => FloatCC::GreaterThan,
                _ => FloatCC::GreaterThanOrEqual,
            };
            return self.b.ins().fcmp(cc, x, y);
        }
        if dt == DType::Bool && t.is_vector() {
            // Lane masks: false < true.
            return match op {
                Eq => self.b.ins().icmp(IntCC::Equal, x, y),
                Ne => self.b.ins().icmp(IntCC::NotEqual, x, y),
                Lt => self.b.ins().band_not(y, x),
                Le => self.b.ins().bor_not(y, x),
                Gt => self.b.ins().band_not(x, y),
                _ => self.b.ins().bor_not(x, y),
            };
        }
        let unsigned = matches!(dt, DType::U8 | DType::Bool);
        let cc = match (op, unsigned) {
            (Eq, _) => IntCC::Equal,
            (Ne, _) => IntCC::NotEqual,
            (Lt, false) => IntCC::SignedLessThan,
            (Le, false) => IntCC::SignedLessThanOrEqual,
            (Gt, false) => IntCC::SignedGreaterThan,
            (_, false) => IntCC::SignedGreaterThanOrEqual,
            (Lt, true) => IntCC::UnsignedLessThan,
            (Le, true) => IntCC::UnsignedLessThanOrEqual,
            (Gt, true) => IntCC::UnsignedGreaterThan,
            (_, true) => IntCC::UnsignedGreaterThanOrEqual,
        };
        self.b.ins().icmp(cc, x, y)
    }

    /// The reference's integer division (scalars; the plan keeps it off vectors): truncating,
    /// wrapping (`MIN / -1 == MIN`), and a zero divisor sets `KERNEL_DIV_BY_ZERO` in the
    /// function's status (the quotient is then junk, and the caller reports the error) instead
    /// of trapping.
    fn int_div(&mut self, x: Value, y: Value, unsigned: bool) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let is_zero = self.b.ins().icmp_imm_s(IntCC::Equal, y, 0);
        let one = self.b.ins().iconst(t, 1);
        let safe = self.b.ins().select(is_zero, one, y);
        self.flag_status(is_zero, oar_cpu_runtime::program::KERNEL_DIV_BY_ZERO as i64);
        if unsigned {
            return self.b.ins().udiv(x, safe);
        }
        // sdiv traps on MIN / -1: divide by 1 there and negate (wrapping) instead.
        let minus_one = self.b.ins().icmp_imm_s(IntCC::Equal, safe, -1);
        let d = self.b.ins().select(minus_one, one, safe);
        let q = self.b.ins().sdiv(x, d);
        let neg = self.b.ins().ineg(x);
        self.b.ins().select(minus_one, neg, q)
    }

    /// Set `bit` of the function's status where `flag` (an i8 0/1) is set.
    fn flag_status(&mut self, flag: Value, bit: i64) {
        let f = self.b.ins().uextend(types::I32, flag);
        let f = self.b.ins().imul_imm_s(f, bit);
        let s = self.b.use_var(self.status);
        let s = self.b.ins().bor(s, f);
        self.b.def_var(self.status, s);
    }

    /// The reference's integer power (scalars): square-and-multiply over the exponent's bits
    /// with wrapping products (the same residue as the reference's i64 product); a negative
    /// exponent sets `KERNEL_NEGATIVE_POW` in the function's status.
    fn int_pow(&mut self, x: Value, y: Value, unsigned: bool) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let bits = t.bits() as i64 - if unsigned { 0 } else { 1 };
        if !unsigned {
            let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, y, 0);
            self.flag_status(neg, oar_cpu_runtime::program::KERNEL_NEGATIVE_POW as i64);
        }
        let mut acc = self.b.ins().iconst(t, 1);
        let mut base = x;
        for bit in 0..bits {
            let shifted = self.b.ins().ushr_imm_s(y, bit);
            let b = self.b.ins().band_imm_s(shifted, 1);
            let set = self.b.ins().icmp_imm_s(IntCC::NotEqual, b, 0);
            let m = self.b.ins().imul(acc, base);
            acc = self.b.ins().select(set, m, acc);
            if bit + 1 < bits {
                base = self.b.ins().imul(base, base);
            }
        }
        acc
    }

    /// The bits of `x` read as `to` (same size; scalar or vector).
    pub(super) fn reinterpret(&mut self, x: Value, to: DType) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let tt = ty_of(to, if t.is_vector() { t.lane_count() as u8 } else { 1 });
        if t.is_vector() {
            self.bitcast(tt, x)
        } else {
            self.b.ins().bitcast(tt, MemFlagsData::new(), x)
        }
    }

    /// `x << n` (`left`) or the arithmetic `x >> n` of an integer (scalar or vector).
    pub(super) fn shift(&mut self, x: Value, n: u32, left: bool) -> Value {
        if left {
            self.b.ins().ishl_imm_s(x, n as i64)
        } else {
            self.b.ins().sshr_imm_s(x, n as i64)
        }
    }

    /// `where(c, a, b)` (c a bool of the same lanes).
    pub(super) fn select(&mut self, c: Value, a: Value, b: Value) -> Value {
        self.choose(c, a, b)
    }

    /// Convert `x` from `from` to `to` (the reference's `cast`).
    pub(super) fn cast(&mut self, x: Value, from: DType, to: DType) -> Value {
        if from == to {
            return x;
        }
        let xt = self.b.func.dfg.value_type(x);
        let lanes = if xt.is_vector() { xt.lane_count() as u8 } else { 1 };
        let tt = ty_of(to, lanes);
        if lanes > 1 {
            return self.cast_vector(x, from, to, tt);
        }
        match (from, to) {
            (f, t) if f.is_float() && t.is_float() => {
                if t == DType::F64 {
                    self.b.ins().fpromote(types::F64, x)
                } else {
                    self.b.ins().fdemote(types::F32, x)
                }
            }
            (f, DType::Bool) if f.is_float() => {
                let z = self.fconst(xt, 0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, x, z)
            }
            (f, DType::I32 | DType::I64) if f.is_float() => self.b.ins().fcvt_to_sint_sat(tt, x),
            (f, t) if f.is_float() => {
                // i8 / u8: saturate through i32.
                let (lo, hi) = if t == DType::U8 { (0, 255) } else { (-128, 127) };
                let s = self.b.ins().fcvt_to_sint_sat(types::I32, x);
                let lo = self.iconst(types::I32, lo);
                let hi = self.iconst(types::I32, hi);
                let s = self.b.ins().smax(s, lo);
                let s = self.b.ins().smin(s, hi);
                self.b.ins().ireduce(types::I8, s)
            }
            (DType::Bool, t) if t.is_float() => {
                let w = self.b.ins().uextend(types::I32, x);
                self.b.ins().fcvt_from_sint(tt, w)
            }
            (DType::Bool, DType::I8 | DType::U8) => x,
            (DType::Bool, _) => self.b.ins().uextend(tt, x),
            (f, t) if t.is_float() => {
                let x = if f == DType::U8 {
                    self.b.ins().uextend(types::I32, x)
                } else {
                    x
                };
                self.b.ins().fcvt_from_sint(tt, x)
            }
            (_, DType::Bool) => self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0),
            (f, _) => {
                let (fb, tb) = (xt.bits(), tt.bits());
                if fb == tb {
                    x
                } else if fb > tb {
                    self.b.ins().ireduce(tt, x)
                } else if f == DType::U8 {
                    self.b.ins().uextend(tt, x)
                } else {
                    self.b.ins().sextend(tt, x)
                }
            }
        }
    }

    /// Vector casts (same lane width, to/from bool masks, or to/from i8/u8 values held in
    /// 32-bit lanes; see `plan::vectorizable`).
    fn cast_vector(&mut self, x: Value, from: DType, to: DType, tt: Type) -> Value {
        let xt = self.b.func.dfg.value_type(x);
        match (from, to) {
            // Saturate through i32, as the scalar cast does.
            (f, DType::I8 | DType::U8) if f.is_float() => {
                let (lo, hi) = if to == DType::U8 { (0, 255) } else { (-128, 127) };
                let s = self.b.ins().fcvt_to_sint_sat(tt, x);
                let lo = self.iconst(tt, lo);
                let hi = self.iconst(tt, hi);
                let s = self.b.ins().smax(s, lo);
                self.b.ins().smin(s, hi)
            }
            // Two's complement wrap of 32-bit lanes (i32, or a widened 8-bit value).
            (DType::I32 | DType::I8 | DType::U8, DType::U8) => {
                let m = self.iconst(tt, 0xff);
                self.b.ins().band(x, m)
            }
            (DType::I32 | DType::I8 | DType::U8, DType::I8) => {
                let l = self.b.ins().ishl_imm_s(x, 24);
                self.b.ins().sshr_imm_s(l, 24)
            }
            // A widened 8-bit value is its i32 value already.
            (DType::I8 | DType::U8, DType::I32) => x,
            (DType::Bool, t) if t.is_float() => {
                let m = self.bitcast(tt, x);
                let one = self.fconst(tt, 1.0);
                self.b.ins().band(m, one)
            }
            (DType::Bool, _) => {
                let m = self.bitcast(tt, x);
                let one = self.iconst(tt, 1);
                self.b.ins().band(m, one)
            }
            (f, DType::Bool) if f.is_float() => {
                let z = self.fconst(xt, 0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, x, z)
            }
            (_, DType::Bool) => {
                let z = self.iconst(xt, 0);
                self.b.ins().icmp(IntCC::NotEqual, x, z)
            }
            (f, _) if f.is_float() => self.b.ins().fcvt_to_sint_sat(tt, x),
            _ => self.b.ins().fcvt_from_sint(tt, x),
        }
    }
}

/// Wrap an i64 to an integer dtype (two's complement).
pub(super) fn wrap_int(dt: DType, v: i64) -> i64 {
    match dt {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I32 => v as i32 as i64,
        _ => v,
    }
}
