//! C code generation: one C function per loop or contraction kernel of a [`KernelProgram`].
//!
//! Every function has the signature `int oar_k<N>(void **b)`: `b[i]` is buffer `i` of the
//! program, dense and row-major; it returns 0, or 1 after an integer division by zero or an
//! integer power with a negative exponent. Floats are computed in `double` and rounded to the
//! instruction's dtype, integers in `int64_t` (wrapping, `-fwrapv`) and wrapped to theirs,
//! exactly as the reference interpreter does, so fused kernels match it bit for bit (up to
//! libm). Kernels this generator declines (opaque ops, f16/bf16) come back with a reason.

use oar::ir::kernel::{Contraction, IndexMap, Inst, KernelBody, KernelProgram, Load, ScalarOp};
use oar::ir::ops::{BinaryOp, ReduceOp, UnaryOp};
use oar::ir::{DType, Dim};
use std::fmt::Write;

/// Helpers every generated file starts with.
const PRELUDE: &str = r#"#include <math.h>
#include <stdint.h>
static inline double fmaxn(double a, double b) { return isnan(a) || isnan(b) ? NAN : (a > b ? a : b); }
static inline double fminn(double a, double b) { return isnan(a) || isnan(b) ? NAN : (a < b ? a : b); }
static inline double frem(double a, double b) { double r = fmod(a, b);
  return r != 0.0 && ((r < 0.0) != (b < 0.0)) ? r + b : (r == 0.0 ? copysign(0.0, b) : r); }
static inline double fsign(double v) { return v > 0.0 ? 1.0 : (v < 0.0 ? -1.0 : v); }
static inline int64_t isign(int64_t v) { return (v > 0) - (v < 0); }
static inline int64_t idiv(int64_t a, int64_t b, int *e) { if (!b) { *e = 1; return 0; }
  return b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b; }
static inline int64_t irem(int64_t a, int64_t b, int *e) { if (!b) { *e = 1; return 0; }
  if (b == -1) return 0; int64_t r = a % b; return r != 0 && ((r < 0) != (b < 0)) ? r + b : r; }
static inline int64_t ipow(int64_t a, int64_t x, int *e) { if (x < 0) { *e = 1; return 0; }
  int64_t r = 1; while (x > 0) { if (x & 1) r *= a; a *= a; x >>= 1; } return r; }
static inline int64_t f2i(double v, double lo, double hi, int64_t ilo, int64_t ihi) {
  return isnan(v) ? 0 : (v >= hi ? ihi : (v <= lo ? ilo : (int64_t)v)); }
"#;

type R<T> = Result<T, String>;

/// The C type holding `d` (f16/bf16 have none here: those kernels are interpreted).
pub fn c_type(d: DType) -> R<&'static str> {
    Ok(match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I8 => "int8_t",
        DType::U8 | DType::Bool => "uint8_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        other => return Err(format!("no C type for {other}")),
    })
}

fn static_dims(dims: &[Dim]) -> R<Vec<i64>> {
    dims.iter()
        .map(|d| {
            d.as_static()
                .map(|n| n as i64)
                .ok_or_else(|| format!("symbolic dim {d}"))
        })
        .collect()
}

/// The flat element index of `map` when loop `l` has the value of the C expression `vars[l]`.
fn flat_index(map: &IndexMap, vars: &[String]) -> R<String> {
    let view = static_dims(&map.view)?;
    let (mut stride, mut offset, mut coef) = (1i64, 0i64, vec![0i64; vars.len()]);
    for (a, e) in map.axes.iter().enumerate().rev() {
        offset += stride * e.offset;
        for &(l, c) in &e.terms {
            *coef.get_mut(l).ok_or_else(|| format!("index map names loop {l}"))? += stride * c;
        }
        stride *= view[a];
    }
    let mut s = offset.to_string();
    for (v, c) in vars.iter().zip(coef).filter(|(_, c)| *c != 0) {
        let _ = write!(s, " + {c}LL * ({v})");
    }
    Ok(s)
}

fn load(p: &KernelProgram, l: &Load, vars: &[String]) -> R<String> {
    let ty = c_type(p.buffer(l.buffer).ty.dtype)?;
    Ok(format!("(({ty} *)b[{}])[{}]", l.buffer.0, flat_index(&l.map, vars)?))
}

fn const_literal(d: DType, c: f64) -> String {
    match d {
        _ if d.is_float() && c.is_nan() => "NAN".into(),
        _ if d.is_float() && c.is_infinite() => format!("{}INFINITY", if c < 0.0 { "-" } else { "" }),
        _ if d.is_float() => format!("{c:e}"),
        DType::Bool => u8::from(c != 0.0).to_string(),
        _ => format!("(int64_t){}ULL", c as i64 as u64),
    }
}

fn unary(op: UnaryOp, d: DType, x: &str) -> R<String> {
    use UnaryOp::*;
    Ok(match (op, d) {
        (Not, DType::Bool) => format!("!{x}"),
        (Neg, _) if d.is_int() => format!("-(int64_t){x}"),
        (Abs, _) if d.is_int() => format!("({x} < 0 ? -(int64_t){x} : (int64_t){x})"),
        (Sign, _) if d.is_int() => format!("isign({x})"),
        (Not, _) if d.is_int() => format!("~(int64_t){x}"),
        (Not, _) => return Err(format!("not on {d}")),
        (_, _) if !d.is_float() => return Err(format!("{} on {d}", op.name())),
        (Neg, _) => format!("-(double){x}"),
        (Rsqrt, _) => format!("1.0 / sqrt((double){x})"),
        (Recip, _) => format!("1.0 / (double){x}"),
        (Sign, _) => format!("fsign({x})"),
        (Abs, _) => format!("fabs({x})"),
        (Round, _) => format!("nearbyint({x})"),
        (Exp | Log | Sqrt | Sin | Cos | Tanh | Erf | Floor | Ceil, _) => format!("{}((double){x})", op.name()),
    })
}

fn infix(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "+",
        BinaryOp::Sub => "-",
        BinaryOp::Mul => "*",
        BinaryOp::Div => "/",
        BinaryOp::And => "&",
        BinaryOp::Or => "|",
        _ => "^",
    }
}

fn binary(op: BinaryOp, d: DType, x: &str, y: &str) -> R<String> {
    use BinaryOp::*;
    let c = |s: &str| format!("({x} {s} {y})");
    let i = |s: &str| format!("((int64_t){x} {s} (int64_t){y})");
    let f = |s: &str| format!("((double){x} {s} (double){y})");
    Ok(match op {
        Eq => c("=="),
        Ne => c("!="),
        Lt => c("<"),
        Le => c("<="),
        Gt => c(">"),
        Ge => c(">="),
        And | Or | Xor if !d.is_float() => c(infix(op)),
        _ if d == DType::Bool => return Err(format!("{} on bool", op.name())),
        Add | Sub | Mul if d.is_int() => i(infix(op)),
        Div if d.is_int() => format!("idiv({x}, {y}, &e)"),
        Rem if d.is_int() => format!("irem({x}, {y}, &e)"),
        Pow if d.is_int() => format!("ipow({x}, {y}, &e)"),
        Max | Min if d.is_int() => format!("({x} {} {y} ? {x} : {y})", if op == Max { ">" } else { "<" }),
        Add | Sub | Mul | Div => f(infix(op)),
        Pow => format!("pow({x}, {y})"),
        Max => format!("fmaxn({x}, {y})"),
        Min => format!("fminn({x}, {y})"),
        Rem => format!("frem({x}, {y})"),
        And | Or | Xor => return Err(format!("{} on {d}", op.name())),
    })
}

fn cast(from: DType, to: DType, x: &str) -> String {
    let (lo, hi, ilo, ihi) = match to {
        DType::I8 => ("-128.0", "127.0", "-128", "127"),
        DType::U8 => ("0.0", "255.0", "0", "255"),
        DType::I32 => ("-2147483648.0", "2147483647.0", "-2147483647LL - 1", "2147483647LL"),
        _ => (
            "-9223372036854775808.0",
            "9223372036854775807.0",
            "INT64_MIN",
            "INT64_MAX",
        ),
    };
    match to {
        DType::Bool => format!("({x} != 0)"),
        _ if from.is_float() && !to.is_float() => format!("f2i({x}, {lo}, {hi}, {ilo}, {ihi})"),
        _ => x.to_string(),
    }
}

/// Emit `insts` as C statements defining `{pre}0`, `{pre}1`, ...; returns the last name.
fn body(out: &mut String, p: &KernelProgram, insts: &[Inst], loads: &[Load], vars: &[String], pre: &str) -> R<String> {
    let v = |n: usize| format!("{pre}{n}");
    for (n, inst) in insts.iter().enumerate() {
        let dt = |a: usize| {
            insts
                .get(a)
                .map(|i| i.dtype)
                .ok_or_else(|| format!("operand %{a} out of range"))
        };
        let expr = match &inst.op {
            ScalarOp::Load(l) => load(p, loads.get(*l).ok_or("load out of range")?, vars)?,
            ScalarOp::Const(c) => const_literal(inst.dtype, c.0),
            ScalarOp::Acc => "acc".into(),
            ScalarOp::Unary(op, a) => unary(*op, dt(*a)?, &v(*a))?,
            ScalarOp::Binary(op, a, b) => binary(*op, dt(*a)?, &v(*a), &v(*b))?,
            ScalarOp::Where(c, a, b) => format!("({} ? {} : {})", v(*c), v(*a), v(*b)),
            ScalarOp::Cast(a) => cast(dt(*a)?, inst.dtype, &v(*a)),
        };
        let _ = writeln!(
            out,
            "    {} {} = ({}) ({expr});",
            c_type(inst.dtype)?,
            v(n),
            c_type(inst.dtype)?
        );
    }
    Ok(v(insts.len().checked_sub(1).ok_or("empty body")?))
}

/// Open `for` loops over `extents` named `{name}{first + k}`.
fn open_loops(out: &mut String, name: &str, first: usize, extents: &[i64]) {
    for (k, n) in extents.iter().enumerate() {
        let _ = writeln!(
            out,
            "  for (int64_t {name}{0} = 0; {name}{0} < {n}; {name}{0}++) {{",
            first + k
        );
    }
}

/// The C function for kernel `ki`, or why it is left to the interpreter.
fn emit_kernel(p: &KernelProgram, ki: usize) -> R<String> {
    let k = &p.kernels[ki];
    let out_buf = *k.outputs.first().ok_or("no output")?;
    let out_dt = p.buffer(out_buf).ty.dtype;
    let out_ty = c_type(out_dt)?;
    let mut s = format!("int oar_k{ki}(void **b) {{\n  int e = 0; (void)e;\n");
    let (shape, loads, epilogue) = match &k.body {
        KernelBody::Loop(l) => (&l.shape, &l.loads, &l.body),
        KernelBody::Contraction(c) => (&c.shape, &c.loads, &c.epilogue),
        KernelBody::Opaque(o) => return Err(format!("opaque op `{}`", o.op.name())),
    };
    let shape = static_dims(shape)?;
    let rank = shape.len();
    let ivars: Vec<String> = (0..rank).map(|l| format!("i{l}")).collect();
    open_loops(&mut s, "i", 0, &shape);
    match &k.body {
        KernelBody::Loop(l) if l.reduce.is_some() => {
            let red = l.reduce.as_ref().ok_or("no reduction")?;
            let dims = static_dims(&red.dims)?;
            let rdt = red.body.last().ok_or("empty reduction")?.dtype;
            let float = rdt.is_float();
            let (init, comb) = match red.op {
                ReduceOp::Sum => ("0", "a + v"),
                ReduceOp::Mean if float => ("0", "a + v"),
                ReduceOp::Prod => ("1", "a * v"),
                ReduceOp::Max if float => ("-INFINITY", "fmaxn(a, v)"),
                ReduceOp::Min if float => ("INFINITY", "fminn(a, v)"),
                ReduceOp::Max => ("INT64_MIN", "(v > a ? v : a)"),
                ReduceOp::Min => ("INT64_MAX", "(v < a ? v : a)"),
                ReduceOp::Mean => return Err(format!("mean of {rdt}")),
            };
            let count: i64 = dims.iter().product();
            if rdt == DType::Bool || (count == 0 && matches!(red.op, ReduceOp::Max | ReduceOp::Min)) {
                return Err(format!("{} over {count} elements of {rdt}", red.op.name()));
            }
            let acc_c = if float { "double" } else { "int64_t" };
            let _ = writeln!(s, "  {acc_c} a = {init};");
            open_loops(&mut s, "i", rank, &dims);
            let all: Vec<String> = (0..rank + dims.len()).map(|l| format!("i{l}")).collect();
            let v = body(&mut s, p, &red.body, &l.loads, &all, "r")?;
            let _ = writeln!(
                s,
                "  {{ {acc_c} v = {v}; a = {comb}; }}\n{}",
                "  }\n".repeat(dims.len())
            );
            let mean = if red.op == ReduceOp::Mean {
                format!(" / {count}.0")
            } else {
                String::new()
            };
            let _ = writeln!(s, "  {0} acc = ({0}) (a{mean});", c_type(rdt)?);
        }
        KernelBody::Contraction(c) => {
            let (ls, rs) = (static_dims(&c.lhs.shape)?, static_dims(&c.rhs.shape)?);
            let (acc_ty, float) = (c_type(c.acc_dtype)?, c.acc_dtype.is_float());
            let _ = writeln!(s, "  {} a = 0;", if float { "double" } else { "int64_t" });
            let (lv, rv) = contraction_loops(&mut s, &c.op, &ls, &rs, rank)?;
            let (x, w) = (load(p, &c.lhs.load, &lv)?, load(p, &c.rhs.load, &rv)?);
            let prod = if float { "(double)" } else { "(int64_t)" };
            let depth = if matches!(c.op, Contraction::MatMul) {
                1
            } else {
                rs.len() - 1
            };
            let _ = writeln!(s, "  a += {prod}{x} * {prod}{w};\n{}", "  }\n".repeat(depth));
            let _ = writeln!(s, "  {acc_ty} acc = ({acc_ty}) a;");
        }
        _ => {}
    }
    let v = body(&mut s, p, epilogue, loads, &ivars, "v")?;
    let out_map = IndexMap::identity(p.buffer(out_buf).ty.shape.dims());
    let _ = writeln!(
        s,
        "  (({out_ty} *)b[{}])[{}] = {v};",
        out_buf.0,
        flat_index(&out_map, &ivars)?
    );
    let _ = writeln!(s, "{}  return e;\n}}", "  }\n".repeat(rank));
    Ok(s)
}

/// Open the inner loops of a contraction; returns the C index expressions of each operand axis.
fn contraction_loops(
    s: &mut String,
    op: &Contraction,
    ls: &[i64],
    rs: &[i64],
    rank: usize,
) -> R<(Vec<String>, Vec<String>)> {
    let batch = |sh: &[i64]| -> Vec<String> {
        let skip = rank - sh.len();
        (0..sh.len() - 2)
            .map(|j| {
                if sh[j] == 1 {
                    "0".into()
                } else {
                    format!("i{}", skip + j)
                }
            })
            .collect()
    };
    match op {
        Contraction::MatMul => {
            let _ = writeln!(s, "  for (int64_t kk = 0; kk < {}; kk++) {{", ls[ls.len() - 1]);
            let mut lv = batch(ls);
            lv.extend([format!("i{}", rank - 2), "kk".into()]);
            let mut rv = batch(rs);
            rv.extend(["kk".into(), format!("i{}", rank - 1)]);
            Ok((lv, rv))
        }
        Contraction::Conv {
            stride,
            pad_before,
            dilation,
            groups,
            ..
        } => {
            let (cg, og) = (rs[1], rs[0] / *groups as i64);
            let _ = writeln!(s, "  int64_t g = i1 / {og};\n  for (int64_t c = 0; c < {cg}; c++) {{");
            let (mut lv, mut rv) = (
                vec!["i0".into(), format!("g * {cg} + c")],
                vec!["i1".into(), "c".into()],
            );
            for d in 0..rs.len() - 2 {
                let _ = writeln!(s, "  for (int64_t k{d} = 0; k{d} < {}; k{d}++) {{", rs[d + 2]);
                let _ = writeln!(
                    s,
                    "  int64_t s{d} = i{} * {} - {} + k{d} * {};\n  if (s{d} < 0 || s{d} >= {}) continue;",
                    d + 2,
                    stride[d],
                    pad_before[d],
                    dilation[d],
                    ls[d + 2]
                );
                lv.push(format!("s{d}"));
                rv.push(format!("k{d}"));
            }
            Ok((lv, rv))
        }
    }
}

/// The C file for `p` and, per kernel, `Ok(symbol)` or why it is interpreted instead.
pub fn emit_program(p: &KernelProgram) -> (String, Vec<Result<String, String>>) {
    let mut src = PRELUDE.to_string();
    let syms = (0..p.kernels.len())
        .map(|ki| {
            let f = emit_kernel(p, ki)?;
            src.push_str(&f);
            Ok(format!("oar_k{ki}"))
        })
        .collect();
    (src, syms)
}
