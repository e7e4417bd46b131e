//! Scalar bodies: one `arith` / `math` sequence per [`Inst`], with the reference
//! interpreter's semantics (docs/BACKENDS.md, section 3): floats computed in `f64` and rounded
//! to the instruction's dtype; integers wrap in their width (`u8` uses the unsigned
//! predicates, division and extensions); integer division by zero and negative integer powers
//! set the kernel's error word instead of trapping.

use super::{CodegenError, ERR_DIV_ZERO, ERR_NEG_POW, Func, R, Scope, unsupported};
use oar_ir::DType;
use oar_ir::kernel::{Inst, ScalarOp};
use oar_ir::ops::{BinaryOp, ReduceOp, UnaryOp};

/// The MLIR scalar type of a dtype in generated code (`bool` is `i1`; `u8` is `i8` with
/// unsigned ops).
pub fn mlir_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I8 | DType::U8 => "i8",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::Bool => "i1",
    }
}

/// The element type of a buffer of dtype `d` (`bool` is one byte).
pub fn storage_type(d: DType) -> &'static str {
    match d {
        DType::Bool => "i8",
        _ => mlir_type(d),
    }
}

/// An integer literal of dtype `d` holding `v` wrapped to its width, as MLIR prints it (signed).
pub(crate) fn int_literal(d: DType, v: i64) -> String {
    match d {
        DType::I8 | DType::U8 => (v as i8).to_string(),
        DType::I32 => (v as i32).to_string(),
        _ => v.to_string(),
    }
}

fn bits(d: DType) -> u32 {
    match d {
        DType::I8 | DType::U8 => 8,
        DType::I32 => 32,
        DType::Bool => 1,
        _ => 64,
    }
}

/// A float constant of dtype `d` as its exact bit pattern (`0x3F800000 : f32`).
pub(crate) fn float_literal(d: DType, c: f64) -> String {
    match d {
        DType::F32 => format!("{:#010X}", (c as f32).to_bits()),
        DType::F16 => format!("{:#06X}", half::f16::from_f64(c).to_bits()),
        DType::BF16 => format!("{:#06X}", half::bf16::from_f64(c).to_bits()),
        _ => format!("{:#018X}", c.to_bits()),
    }
}

/// `v : d` widened to `f64`.
pub(crate) fn to_f64(f: &mut Func, v: &str, d: DType) -> String {
    match d {
        DType::F64 => v.to_string(),
        // bf16 → f64 goes through f32 (exact), which LLVM's bf16 legalization handles.
        DType::BF16 => {
            let x = f.def(&format!("arith.extf {v} : bf16 to f32"));
            f.def(&format!("arith.extf {x} : f32 to f64"))
        }
        _ => f.def(&format!("arith.extf {v} : {} to f64", mlir_type(d))),
    }
}

/// `v : f64` rounded to the float dtype `d`.
pub(crate) fn from_f64(f: &mut Func, v: &str, d: DType) -> String {
    match d {
        DType::F64 => v.to_string(),
        DType::BF16 => {
            let x = f.def(&format!("arith.truncf {v} : f64 to f32"));
            f.def(&format!("arith.truncf {x} : f32 to bf16"))
        }
        _ => f.def(&format!("arith.truncf {v} : f64 to {}", mlir_type(d))),
    }
}

fn fconst(f: &mut Func, c: f64) -> String {
    f.def(&format!("arith.constant {} : f64", float_literal(DType::F64, c)))
}

fn iconst(f: &mut Func, d: DType, c: i64) -> String {
    if d == DType::Bool {
        return f.def(&format!("arith.constant {}", c != 0));
    }
    f.def(&format!("arith.constant {} : {}", int_literal(d, c), mlir_type(d)))
}

/// NaN-propagating max / min of two `f64` values (the reference's `max` / `min`).
fn fminmax(f: &mut Func, max: bool, a: &str, b: &str) -> String {
    let nan = f.def(&format!("arith.cmpf uno, {a}, {b} : f64"));
    let pred = if max { "ogt" } else { "olt" };
    let c = f.def(&format!("arith.cmpf {pred}, {a}, {b} : f64"));
    let pick = f.def(&format!("arith.select {c}, {a}, {b} : f64"));
    let n = fconst(f, f64::NAN);
    f.def(&format!("arith.select {nan}, {n}, {pick} : f64"))
}

/// The reduction's combining step on the accumulator (`f64` for floats, the dtype for ints).
pub(crate) fn combine(f: &mut Func, op: ReduceOp, d: DType, acc: &str, v: &str) -> R<String> {
    if d.is_float() {
        return Ok(match op {
            ReduceOp::Sum | ReduceOp::Mean => f.def(&format!("arith.addf {acc}, {v} : f64")),
            ReduceOp::Prod => f.def(&format!("arith.mulf {acc}, {v} : f64")),
            ReduceOp::Max => fminmax(f, true, acc, v),
            ReduceOp::Min => fminmax(f, false, acc, v),
        });
    }
    let (t, u) = (mlir_type(d), d == DType::U8);
    let op = match op {
        ReduceOp::Sum => "addi",
        ReduceOp::Prod => "muli",
        ReduceOp::Max if u => "maxui",
        ReduceOp::Max => "maxsi",
        ReduceOp::Min if u => "minui",
        ReduceOp::Min => "minsi",
        ReduceOp::Mean => return unsupported(format!("reduce_mean on {d}")),
    };
    Ok(f.def(&format!("arith.{op} {acc}, {v} : {t}")))
}

/// Emit `insts` at the current loop point; returns the last value (in its dtype, bool as `i1`).
pub(crate) fn body(f: &mut Func, insts: &[Inst], s: &Scope) -> R<String> {
    let mut vals: Vec<String> = Vec::with_capacity(insts.len());
    for (n, inst) in insts.iter().enumerate() {
        let arg = |a: usize| -> R<(String, DType)> {
            match (vals.get(a), insts.get(a)) {
                (Some(v), Some(i)) => Ok((v.clone(), i.dtype)),
                _ => unsupported(format!("operand %{a} is not defined before %{n}")),
            }
        };
        let d = inst.dtype;
        let v = match &inst.op {
            ScalarOp::Load(l) => {
                let load = s
                    .loads
                    .get(*l)
                    .ok_or_else(|| CodegenError::Unsupported(format!("no load l{l}")))?;
                if f.p.buffer(load.buffer).ty.dtype != d {
                    return unsupported(format!("load l{l} of {} read as {d}", f.p.buffer(load.buffer).ty.dtype));
                }
                let idx = f.flat_index(&load.map, s.vars)?;
                f.load_at(load.buffer, &idx)?
            }
            ScalarOp::Const(c) if d.is_float() => {
                f.def(&format!("arith.constant {} : {}", float_literal(d, c.0), mlir_type(d)))
            }
            ScalarOp::Const(c) => iconst(f, d, c.0 as i64),
            ScalarOp::Acc(t) => match s.accs.get(*t) {
                Some((v, ad)) if *ad == d => v.clone(),
                Some((_, ad)) => return unsupported(format!("acc of {ad} read as {d}")),
                None => return unsupported(format!("acc({t}) read before that stage")),
            },
            ScalarOp::Unary(op, a) => {
                let (x, xd) = arg(*a)?;
                unary(f, *op, &x, xd, d)?
            }
            ScalarOp::Binary(op, a, b) => {
                let ((x, xd), (y, _)) = (arg(*a)?, arg(*b)?);
                binary(f, *op, &x, &y, xd, d)?
            }
            ScalarOp::Where(c, a, b) => {
                let ((c, _), (x, _), (y, _)) = (arg(*c)?, arg(*a)?, arg(*b)?);
                f.def(&format!("arith.select {c}, {x}, {y} : {}", mlir_type(d)))
            }
            ScalarOp::Cast(a) => {
                let (x, xd) = arg(*a)?;
                cast(f, &x, xd, d)?
            }
            ScalarOp::MulAdd(a, b, c) => {
                let ((x, _), (y, _), (z, _)) = (arg(*a)?, arg(*b)?, arg(*c)?);
                let t = mlir_type(d);
                // In the dtype itself (not through f64): one rounding.
                f.def(&format!("llvm.intr.fma({x}, {y}, {z}) : ({t}, {t}, {t}) -> {t}"))
            }
            ScalarOp::Bitcast(a) => {
                let (x, xd) = arg(*a)?;
                f.def(&format!("arith.bitcast {x} : {} to {}", mlir_type(xd), mlir_type(d)))
            }
            ScalarOp::ShiftLeft(a, n) | ScalarOp::ShiftRight(a, n) => {
                let (x, _) = arg(*a)?;
                let c = iconst(f, d, *n as i64);
                let op = if matches!(inst.op, ScalarOp::ShiftLeft(..)) {
                    "shli"
                } else {
                    "shrsi"
                };
                f.def(&format!("arith.{op} {x}, {c} : {}", mlir_type(d)))
            }
        };
        vals.push(v);
    }
    vals.pop().ok_or_else(|| CodegenError::Unsupported("empty body".into()))
}

fn unary(f: &mut Func, op: UnaryOp, x: &str, xd: DType, d: DType) -> R<String> {
    use UnaryOp::*;
    if xd != d {
        return unsupported(format!("{} of {xd} giving {d}", op.name()));
    }
    if d.is_float() {
        let x = to_f64(f, x, d);
        let one = || "arith.constant 1.0 : f64";
        let r = match op {
            Neg => f.def(&format!("arith.negf {x} : f64")),
            Abs => f.def(&format!("math.absf {x} : f64")),
            Sqrt => f.def(&format!("math.sqrt {x} : f64")),
            Recip => {
                let o = f.def(one());
                f.def(&format!("arith.divf {o}, {x} : f64"))
            }
            Floor => f.def(&format!("math.floor {x} : f64")),
            Ceil => f.def(&format!("math.ceil {x} : f64")),
            Round => f.def(&format!("math.roundeven {x} : f64")),
            Sign => {
                // x > 0 → 1, x < 0 → -1, ±0 and NaN stay.
                let z = fconst(f, 0.0);
                let (p, m) = (fconst(f, 1.0), fconst(f, -1.0));
                let gt = f.def(&format!("arith.cmpf ogt, {x}, {z} : f64"));
                let lt = f.def(&format!("arith.cmpf olt, {x}, {z} : f64"));
                let r = f.def(&format!("arith.select {lt}, {m}, {x} : f64"));
                f.def(&format!("arith.select {gt}, {p}, {r} : f64"))
            }
            Not => return unsupported(format!("not on {d}")),
            Exp | Log | Sin | Cos | Tanh | Erf | Rsqrt => return unexpanded(op.name()),
        };
        return Ok(from_f64(f, &r, d));
    }
    let t = mlir_type(d);
    if d == DType::Bool {
        return match op {
            Not => {
                let one = iconst(f, d, 1);
                Ok(f.def(&format!("arith.xori {x}, {one} : i1")))
            }
            _ => unsupported(format!("{} on bool", op.name())),
        };
    }
    let u = d == DType::U8;
    Ok(match op {
        Neg => {
            let z = iconst(f, d, 0);
            f.def(&format!("arith.subi {z}, {x} : {t}"))
        }
        Abs if u => x.to_string(),
        Abs => {
            let z = iconst(f, d, 0);
            let n = f.def(&format!("arith.subi {z}, {x} : {t}"));
            let lt = f.def(&format!("arith.cmpi slt, {x}, {z} : {t}"));
            f.def(&format!("arith.select {lt}, {n}, {x} : {t}"))
        }
        Sign => {
            let (z, p, m) = (iconst(f, d, 0), iconst(f, d, 1), iconst(f, d, -1));
            let gt = f.def(&format!("arith.cmpi {}, {x}, {z} : {t}", if u { "ugt" } else { "sgt" }));
            let r = if u {
                z.clone()
            } else {
                let lt = f.def(&format!("arith.cmpi slt, {x}, {z} : {t}"));
                f.def(&format!("arith.select {lt}, {m}, {z} : {t}"))
            };
            f.def(&format!("arith.select {gt}, {p}, {r} : {t}"))
        }
        Not => {
            let m = iconst(f, d, -1);
            f.def(&format!("arith.xori {x}, {m} : {t}"))
        }
        _ => return unsupported(format!("{} on {d}", op.name())),
    })
}

fn cmp_pred(op: BinaryOp, float: bool, unsigned: bool) -> &'static str {
    use BinaryOp::*;
    match (op, float, unsigned) {
        (Eq, true, _) => "oeq",
        (Ne, true, _) => "une",
        (Lt, true, _) => "olt",
        (Le, true, _) => "ole",
        (Gt, true, _) => "ogt",
        (Ge, true, _) => "oge",
        (Eq, false, _) => "eq",
        (Ne, false, _) => "ne",
        (Lt, false, true) => "ult",
        (Le, false, true) => "ule",
        (Gt, false, true) => "ugt",
        (Ge, false, true) => "uge",
        (Lt, _, _) => "slt",
        (Le, _, _) => "sle",
        (Gt, _, _) => "sgt",
        _ => "sge",
    }
}

fn binary(f: &mut Func, op: BinaryOp, x: &str, y: &str, xd: DType, d: DType) -> R<String> {
    use BinaryOp::*;
    let xt = mlir_type(xd);
    if op.is_comparison() {
        if d != DType::Bool {
            return unsupported(format!("{} giving {d}", op.name()));
        }
        let (float, unsigned) = (xd.is_float(), matches!(xd, DType::U8 | DType::Bool));
        let kind = if float { "cmpf" } else { "cmpi" };
        return Ok(f.def(&format!(
            "arith.{kind} {}, {x}, {y} : {xt}",
            cmp_pred(op, float, unsigned)
        )));
    }
    if xd != d {
        return unsupported(format!("{} of {xd} giving {d}", op.name()));
    }
    if d.is_float() {
        let (a, b) = (to_f64(f, x, d), to_f64(f, y, d));
        let r = match op {
            Add => f.def(&format!("arith.addf {a}, {b} : f64")),
            Sub => f.def(&format!("arith.subf {a}, {b} : f64")),
            Mul => f.def(&format!("arith.mulf {a}, {b} : f64")),
            Div => f.def(&format!("arith.divf {a}, {b} : f64")),
            // The core max/min (NaN handling is legalize's). For bf16 a compare and select:
            // LLVM narrows `maximum(ext a, ext b)` to a bf16 maximum, which x86 without
            // AVX512-BF16 lowers through a `__truncsfbf2` call the JIT cannot resolve; a
            // select of the operands themselves needs no conversion at all.
            Max | Min if d == DType::BF16 => {
                let pred = if op == Max { "ogt" } else { "olt" };
                let c = f.def(&format!("arith.cmpf {pred}, {a}, {b} : f64"));
                f.def(&format!("arith.select {c}, {a}, {b} : f64"))
            }
            Max => f.def(&format!("arith.maximumf {a}, {b} : f64")),
            Min => f.def(&format!("arith.minimumf {a}, {b} : f64")),
            Pow | Rem => return unexpanded(op.name()),
            _ => return unsupported(format!("{} on {d}", op.name())),
        };
        return Ok(from_f64(f, &r, d));
    }
    let t = mlir_type(d);
    if d == DType::Bool {
        return match op {
            And | Or | Xor => Ok(f.def(&format!("arith.{}i {x}, {y} : i1", op.name()))),
            _ => unsupported(format!("{} on bool", op.name())),
        };
    }
    let u = d == DType::U8;
    Ok(match op {
        Add | Sub | Mul | And | Or | Xor => f.def(&format!("arith.{}i {x}, {y} : {t}", op.name())),
        Max => f.def(&format!("arith.max{}i {x}, {y} : {t}", if u { "u" } else { "s" })),
        Min => f.def(&format!("arith.min{}i {x}, {y} : {t}", if u { "u" } else { "s" })),
        Div => int_div(f, x, y, d)?,
        Rem => return unexpanded("rem"),
        Pow => int_pow(f, x, y, d)?,
        _ => return unsupported(format!("{} on {d}", op.name())),
    })
}

/// Truncating division that never traps: a zero divisor raises [`ERR_DIV_ZERO`]; `MIN / -1`
/// wraps.
fn int_div(f: &mut Func, x: &str, y: &str, d: DType) -> R<String> {
    let (t, u) = (mlir_type(d), d == DType::U8);
    let (z, one) = (iconst(f, d, 0), iconst(f, d, 1));
    let is0 = f.def(&format!("arith.cmpi eq, {y}, {z} : {t}"));
    f.raise_if(&is0, ERR_DIV_ZERO);
    if u {
        let safe = f.def(&format!("arith.select {is0}, {one}, {y} : {t}"));
        return Ok(f.def(&format!("arith.divui {x}, {safe} : {t}")));
    }
    let m1c = iconst(f, d, -1);
    let m1 = f.def(&format!("arith.cmpi eq, {y}, {m1c} : {t}"));
    let bad = f.def(&format!("arith.ori {is0}, {m1} : i1"));
    let safe = f.def(&format!("arith.select {bad}, {one}, {y} : {t}"));
    let q = f.def(&format!("arith.divsi {x}, {safe} : {t}"));
    let n = f.def(&format!("arith.subi {z}, {x} : {t}"));
    Ok(f.def(&format!("arith.select {m1}, {n}, {q} : {t}")))
}

/// The error for an op `oar_passes::legalize` expands before code generation.
fn unexpanded<T>(op: &str) -> R<T> {
    unsupported(format!(
        "`{op}` reaches code generation unexpanded (oar_passes::legalize expands it)"
    ))
}

/// Integer power by squaring over the exponent's bits (wrapping); a negative exponent raises
/// [`ERR_NEG_POW`].
fn int_pow(f: &mut Func, x: &str, y: &str, d: DType) -> R<String> {
    let t = mlir_type(d);
    let (z, one) = (iconst(f, d, 0), iconst(f, d, 1));
    let e = if d == DType::U8 {
        y.to_string()
    } else {
        let neg = f.def(&format!("arith.cmpi slt, {y}, {z} : {t}"));
        f.raise_if(&neg, ERR_NEG_POW);
        f.def(&format!("arith.select {neg}, {z}, {y} : {t}"))
    };
    let (lo, hi, st) = (f.index(0), f.index(bits(d) as i64), f.index(1));
    let (res, r, b, e2) = (f.fresh(), f.fresh(), f.fresh(), f.fresh());
    let i = f.fresh();
    f.line(&format!(
        "{res}:3 = scf.for {i} = {lo} to {hi} step {st} iter_args({r} = {one}, {b} = {x}, {e2} = {e}) -> ({t}, {t}, {t}) {{"
    ));
    let bit = f.def(&format!("arith.andi {e2}, {one} : {t}"));
    let odd = f.def(&format!("arith.cmpi ne, {bit}, {z} : {t}"));
    let rb = f.def(&format!("arith.muli {r}, {b} : {t}"));
    let r2 = f.def(&format!("arith.select {odd}, {rb}, {r} : {t}"));
    let b2 = f.def(&format!("arith.muli {b}, {b} : {t}"));
    let e3 = f.def(&format!("arith.shrui {e2}, {one} : {t}"));
    f.line(&format!("  scf.yield {r2}, {b2}, {e3} : {t}, {t}, {t}"));
    f.line("}");
    Ok(format!("{res}#0"))
}

pub(crate) fn cast(f: &mut Func, x: &str, from: DType, to: DType) -> R<String> {
    let (ft, tt) = (mlir_type(from), mlir_type(to));
    if from == to || (bits(from) == bits(to) && !from.is_float() && !to.is_float() && from != DType::Bool) {
        return Ok(x.to_string()); // i8 ↔ u8: the same bits
    }
    if to == DType::Bool {
        if from.is_float() {
            let z = f.def(&format!("arith.constant 0.0 : {ft}"));
            return Ok(f.def(&format!("arith.cmpf une, {x}, {z} : {ft}")));
        }
        let z = iconst(f, from, 0);
        return Ok(f.def(&format!("arith.cmpi ne, {x}, {z} : {ft}")));
    }
    if from.is_float() && to.is_float() {
        let v = to_f64(f, x, from);
        return Ok(from_f64(f, &v, to));
    }
    if to.is_float() {
        // bool and u8 are unsigned; int → f32 in one rounding step, others through f64.
        let op = if matches!(from, DType::Bool | DType::U8) {
            "uitofp"
        } else {
            "sitofp"
        };
        if matches!(to, DType::F32 | DType::F64) {
            return Ok(f.def(&format!("arith.{op} {x} : {ft} to {tt}")));
        }
        let v = f.def(&format!("arith.{op} {x} : {ft} to f64"));
        return Ok(from_f64(f, &v, to));
    }
    if from.is_float() {
        // In range (legalize made the cast saturating): through i64, exact for every
        // in-range value, then truncated.
        let v = to_f64(f, x, from);
        let i = f.def(&format!("arith.fptosi {v} : f64 to i64"));
        return Ok(if to == DType::I64 {
            i
        } else {
            f.def(&format!("arith.trunci {i} : i64 to {tt}"))
        });
    }
    // int → int (bool counts as unsigned).
    let (fb, tb) = (bits(from), bits(to));
    Ok(if tb > fb {
        let op = if matches!(from, DType::Bool | DType::U8) {
            "extui"
        } else {
            "extsi"
        };
        f.def(&format!("arith.{op} {x} : {ft} to {tt}"))
    } else {
        f.def(&format!("arith.trunci {x} : {ft} to {tt}"))
    })
}
