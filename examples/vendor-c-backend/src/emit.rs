//! C code generation: one function `int oar_k<N>(void **b)` per loop or contraction kernel
//! (`b[i]` = buffer `i`, dense row-major; returns 1 after an integer division by zero). Each
//! instruction is computed by the op table in `prelude.c` and rounded or wrapped to its dtype,
//! as the reference interpreter does. Declined kernels (opaque, f16/bf16) come back with a reason.

use oar::ir::kernel::{Contraction, ContractionKernel, IndexMap, Inst, KernelBody, KernelProgram, Load, ScalarOp};
use oar::ir::ops::Conv;
use oar::ir::ops::ReduceOp;
use oar::ir::{DType, Dim};
use std::fmt::Write;

/// Helpers every generated file starts with.
const PRELUDE: &str = include_str!("prelude.c");

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
    let dim = |d: &Dim| d.as_static().map(|n| n as i64).ok_or(format!("symbolic dim {d}"));
    dims.iter().map(dim).collect()
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

/// A call of the prelude's helper for `op` on operands of dtype `d`, if the table has one.
fn helper(table: &str, op: &str, d: DType, args: &str) -> R<String> {
    let kind = match d {
        DType::Bool => "b",
        _ if d.is_float() => "f",
        _ => "i",
    };
    if !PRELUDE.contains(&format!("{table}_{kind}({op},")) {
        return Err(format!("no C helper for `{op}` on {d}"));
    }
    Ok(format!("{op}_{kind}({args})"))
}

/// A cast is C's conversion (float → int operands are in range: `legalize` saturates first).
fn cast(to: DType, x: &str) -> String {
    match to {
        DType::Bool => format!("({x} != 0)"),
        _ => x.to_string(),
    }
}

/// The same bits as another type (f32 ↔ i32, f64 ↔ i64), through the prelude's `memcpy`s.
fn bitcast(from: DType, to: DType, x: &str) -> R<String> {
    Ok(match (from, to) {
        (DType::F32, DType::I32) => format!("bits_of_f32({x})"),
        (DType::I32, DType::F32) => format!("f32_of_bits({x})"),
        (DType::F64, DType::I64) => format!("bits_of_f64({x})"),
        (DType::I64, DType::F64) => format!("f64_of_bits({x})"),
        _ => return Err(format!("bitcast {from} -> {to}")),
    })
}

/// `x << n` (wrapping, through the unsigned type) or the arithmetic `x >> n`.
fn shift(d: DType, x: &str, n: u32, left: bool) -> R<String> {
    let u = if d == DType::I64 { "uint64_t" } else { "uint32_t" };
    Ok(if left {
        format!("({u}){x} << {n}")
    } else {
        format!("{x} >> {n}")
    })
}

/// Emit `insts` as C statements defining `{pre}0`, `{pre}1`, ...; returns the last name.
fn body(out: &mut String, p: &KernelProgram, insts: &[Inst], loads: &[Load], vars: &[String], pre: &str) -> R<String> {
    let v = |n: usize| format!("{pre}{n}");
    for (n, inst) in insts.iter().enumerate() {
        let dt = |a: usize| insts.get(a).map(|i| i.dtype).ok_or("operand out of range");
        let expr = match &inst.op {
            ScalarOp::Load(l) => load(p, loads.get(*l).ok_or("load out of range")?, vars)?,
            ScalarOp::Const(c) => const_literal(inst.dtype, c.0),
            ScalarOp::Acc(_) => "acc".into(), // plain kernels: one reduction
            ScalarOp::Unary(op, a) => helper("U", op.name(), dt(*a)?, &v(*a))?,
            ScalarOp::Binary(op, a, b) => helper("B", op.name(), dt(*a)?, &format!("{}, {}, &e", v(*a), v(*b)))?,
            ScalarOp::Where(c, a, b) => format!("({} ? {} : {})", v(*c), v(*a), v(*b)),
            ScalarOp::Cast(a) => cast(inst.dtype, &v(*a)),
            ScalarOp::Bitcast(a) => bitcast(dt(*a)?, inst.dtype, &v(*a))?,
            ScalarOp::MulAdd(a, b, c) => {
                let f = if inst.dtype == DType::F32 { "fmaf" } else { "fma" };
                format!("{f}({}, {}, {})", v(*a), v(*b), v(*c))
            }
            ScalarOp::ShiftLeft(a, n) => shift(inst.dtype, &v(*a), *n, true)?,
            ScalarOp::ShiftRight(a, n) => shift(inst.dtype, &v(*a), *n, false)?,
        };
        let ty = c_type(inst.dtype)?;
        let _ = writeln!(out, "    {ty} {pre}{n} = ({ty}) ({expr});");
    }
    Ok(v(insts.len().checked_sub(1).ok_or("empty body")?))
}

fn loop_vars(n: usize) -> Vec<String> {
    (0..n).map(|l| format!("i{l}")).collect()
}

/// Open `for` loops over `extents` named `{name}{first + k}`.
fn open_loops(out: &mut String, name: &str, first: usize, extents: &[i64]) {
    for (k, n) in extents.iter().enumerate() {
        let i = format!("{name}{}", first + k);
        let _ = writeln!(out, "  for (int64_t {i} = 0; {i} < {n}; {i}++) {{");
    }
}

/// Append the C function for kernel `ki` to `out` and return its name, or say why it is left
/// to the interpreter.
fn emit_kernel(p: &KernelProgram, ki: usize, out: &mut String) -> R<String> {
    let k = &p.kernels[ki];
    let out_buf = *k.outputs.first().ok_or("no output")?;
    let out_ty = c_type(p.buffer(out_buf).ty.dtype)?;
    let mut s = format!("int oar_k{ki}(void **b) {{\n  int e = 0; (void)e;\n");
    let (shape, loads, epilogue) = match &k.body {
        KernelBody::Loop(l) if !l.is_plain() => return Err("reduction stages (split them first)".into()),
        KernelBody::Loop(l) => (&l.shape, &l.loads, &l.body),
        KernelBody::Contraction(c) => (&c.shape, &c.loads, &c.epilogue),
        KernelBody::Opaque(o) => return Err(format!("opaque op `{}`", o.op.name())),
    };
    let shape = static_dims(shape)?;
    let rank = shape.len();
    let ivars = loop_vars(rank);
    open_loops(&mut s, "i", 0, &shape);
    match &k.body {
        KernelBody::Loop(l) if !l.reduce.is_empty() => {
            let red = l.reduce.first().ok_or("no reduction")?;
            let dims = static_dims(&red.dims)?;
            let rdt = red.body.last().ok_or("empty reduction")?.dtype;
            let (float, count) = (rdt.is_float(), dims.iter().product::<i64>());
            // Accumulate in double / int64_t (as the reference does), in loop order.
            let (init, comb) = match red.op {
                ReduceOp::Sum | ReduceOp::Mean => ("0", "add"),
                ReduceOp::Prod => ("1", "mul"),
                _ if count == 0 => return Err(format!("{} of nothing", red.op.name())), // an error
                ReduceOp::Max => (if float { "-INFINITY" } else { "INT64_MIN" }, "max"),
                ReduceOp::Min => (if float { "INFINITY" } else { "INT64_MAX" }, "min"),
            };
            let comb = helper("B", comb, rdt, "a, v, &e")?;
            let acc_c = if float { "double" } else { "int64_t" };
            let _ = writeln!(s, "  {acc_c} a = {init};");
            open_loops(&mut s, "i", rank, &dims);
            let v = body(&mut s, p, &red.body, &l.loads, &loop_vars(rank + dims.len()), "r")?;
            let _ = writeln!(s, "  {{ {acc_c} v = {v}; a = {comb}; }}");
            s.push_str(&"  }\n".repeat(dims.len()));
            let n = if red.op == ReduceOp::Mean { count } else { 1 };
            let _ = writeln!(s, "  {0} acc = ({0}) (a / {n});", c_type(rdt)?);
        }
        KernelBody::Contraction(c) => {
            let (acc_ty, float) = (c_type(c.acc_dtype)?, c.acc_dtype.is_float());
            let _ = writeln!(s, "  {} a = 0;", if float { "double" } else { "int64_t" });
            let (lv, rv, depth) = contraction_loops(&mut s, c, rank)?;
            let (x, w) = (load(p, &c.lhs.load, &lv)?, load(p, &c.rhs.load, &rv)?);
            let prod = if float { "(double)" } else { "(int64_t)" };
            let _ = writeln!(s, "  a += {prod}{x} * {prod}{w};\n{}", "  }\n".repeat(depth));
            let _ = writeln!(s, "  {acc_ty} acc = ({acc_ty}) a;");
        }
        _ => {}
    }
    let v = body(&mut s, p, epilogue, loads, &ivars, "v")?;
    let out_map = IndexMap::identity(p.buffer(out_buf).ty.shape.dims());
    let at = flat_index(&out_map, &ivars)?;
    let _ = writeln!(s, "  (({out_ty} *)b[{}])[{at}] = {v};", out_buf.0);
    let _ = writeln!(s, "{}  return e;\n}}", "  }\n".repeat(rank));
    out.push_str(&s);
    Ok(format!("oar_k{ki}"))
}

/// A matmul operand's batch axes: broadcast (numpy, right-aligned), so index modulo its size.
fn batch(sh: &[i64], rank: usize) -> impl Iterator<Item = String> + '_ {
    (0..sh.len() - 2).map(move |j| format!("(i{} % {})", rank - sh.len() + j, sh[j]))
}

/// Open the inner loops of a contraction; returns the C index expression of each operand axis
/// and the number of loops opened.
fn contraction_loops(s: &mut String, c: &ContractionKernel, rank: usize) -> R<(Vec<String>, Vec<String>, usize)> {
    if let Some(d) = c.lhs.round.or(c.rhs.round) {
        return Err(format!("operands rounded to {d} as they are read"));
    }
    let (ls, rs) = (static_dims(&c.lhs.shape)?, static_dims(&c.rhs.shape)?);
    match &c.op {
        Contraction::MatMul => {
            let _ = writeln!(s, "  for (int64_t kk = 0; kk < {}; kk++) {{", ls[ls.len() - 1]);
            let lv = batch(&ls, rank).chain([format!("i{}", rank - 2), "kk".into()]);
            let rv = batch(&rs, rank).chain(["kk".into(), format!("i{}", rank - 1)]);
            Ok((lv.collect(), rv.collect(), 1))
        }
        Contraction::Conv(Conv {
            stride,
            pad_before,
            dilation,
            groups,
            ..
        }) => {
            let (cg, og) = (rs[1], rs[0] / *groups as i64);
            let _ = writeln!(s, "  int64_t g = i1 / {og};\n  for (int64_t c = 0; c < {cg}; c++) {{");
            let mut lv: Vec<String> = vec!["i0".into(), format!("g * {cg} + c")];
            let mut rv: Vec<String> = vec!["i1".into(), "c".into()];
            for d in 0..rs.len() - 2 {
                let (st, pb, dl, n) = (stride[d], pad_before[d], dilation[d], ls[d + 2]);
                let _ = writeln!(s, "  for (int64_t k{d} = 0; k{d} < {}; k{d}++) {{", rs[d + 2]);
                let _ = writeln!(s, "  int64_t s{d} = i{} * {st} - {pb} + k{d} * {dl};", d + 2);
                let _ = writeln!(s, "  if (s{d} < 0 || s{d} >= {n}) continue;");
                lv.push(format!("s{d}"));
                rv.push(format!("k{d}"));
            }
            Ok((lv, rv, rs.len() - 1))
        }
    }
}

/// The C file for `p` and, per kernel, `Ok(symbol)` or why it is interpreted instead.
pub fn emit_program(p: &KernelProgram) -> (String, Vec<R<String>>) {
    let mut src = PRELUDE.to_string();
    let symbols = (0..p.kernels.len()).map(|ki| emit_kernel(p, ki, &mut src)).collect();
    (src, symbols)
}
