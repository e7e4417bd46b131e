//! The kernel program's text form, parsed back (what `KernelProgram`'s `Display` prints), so
//! kernel-level file tests can start from text. The form is line-oriented:
//!
//! ```text
//! program mlp {
//!   b0 = input "x" : f32[N,8]  ; %0
//!   b1 = constant dense<[1.0, 2.0]> : f32[2]
//!   b2 = output : f32[N,2]
//!   k0_add: loop [N,2] -> b2
//!     l0 = b0 as [N,8][i0, 2*i1 + 1]
//!     l1 = b1 as [2][i1]
//!     %0 = load l0 : f32
//!     %1 = load l1 : f32
//!     %2 = add %0, %1 : f32
//!   return y = b2
//! }
//! ```
//!
//! A buffer line's `; ...` tail is the IR value it held (kept for error messages). Loop
//! kernels may have `rows [..]` and `<reduce op> over [..]` stages, whose bodies follow
//! `reduce:` / `reduce accN:` and the stored value `epilogue:`; contractions are
//! `matmul|conv(..) lhs <load> [round <dtype>] : [dims] rhs <load> [round <dtype>] : [dims] -> bN : [dims]
//! [acc <dtype>]`;
//! opaque kernels `opaque <op>(bA, ..) {attrs} -> bN`. Opaque kernels with regions
//! (cond/while) have no text form here.

use super::ParseError;
use super::parse::Parser;
use crate::kernel::{
    AffineExpr, Buffer, BufferId, BufferKind, Contraction, ContractionKernel, IndexMap, Inst, Kernel, KernelBody,
    KernelProgram, Load, LoopKernel, OpaqueKernel, Operand, Reduction, ScalarOp,
};
use crate::ops::{BinaryOp, Conv, ReduceOp, UnaryOp};
use crate::{DType, Dim, Float, TensorType};

type R<T> = Result<T, ParseError>;

/// One line of the text: 1-based number and content without its trailing comment.
struct Line<'a> {
    no: usize,
    text: &'a str,
}

impl Line<'_> {
    fn err(&self, msg: impl Into<String>) -> ParseError {
        ParseError {
            line: self.no,
            col: 1,
            msg: msg.into(),
        }
    }
}

/// Parse a kernel program.
pub(super) fn parse(text: &str) -> R<KernelProgram> {
    let lines: Vec<Line> = text
        .lines()
        .enumerate()
        .map(|(i, l)| Line {
            no: i + 1,
            text: strip_comment(l).trim(),
        })
        .filter(|l| !l.text.is_empty())
        .collect();
    let Some(first) = lines.first() else {
        return Err(ParseError {
            line: 1,
            col: 1,
            msg: "expected 'program <name> {', found nothing".into(),
        });
    };
    let name = first
        .text
        .strip_prefix("program ")
        .and_then(|r| r.strip_suffix('{'))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| first.err("expected 'program <name> {'"))?;
    let mut p = KernelProgram {
        name: name.to_string(),
        buffers: Vec::new(),
        kernels: Vec::new(),
        outputs: Vec::new(),
    };
    let mut i = 1;
    let mut closed = false;
    while i < lines.len() {
        let l = &lines[i];
        if l.text == "}" {
            closed = true;
            i += 1;
            break;
        }
        if let Some(rest) = l.text.strip_prefix("return ") {
            let (n, b) = rest
                .split_once('=')
                .ok_or_else(|| l.err("expected 'return <name> = bN'"))?;
            p.outputs
                .push((n.trim().to_string(), buffer_id(l, b.trim(), p.buffers.len())?));
            i += 1;
        } else if is_buffer_line(l.text) {
            p.buffers.push(buffer(l, p.buffers.len(), raw_value(text, l.no))?);
            i += 1;
        } else {
            let (k, next) = kernel(&lines, i, &p)?;
            p.kernels.push(k);
            i = next;
        }
    }
    if !closed {
        let last = lines.last().map_or(1, |l| l.no);
        return Err(ParseError {
            line: last,
            col: 1,
            msg: "expected '}' closing the program".into(),
        });
    }
    if let Some(l) = lines.get(i) {
        return Err(l.err("expected end of input after the program"));
    }
    Ok(p)
}

/// The line without a `// ...` comment (outside strings).
fn strip_comment(l: &str) -> &str {
    let mut in_str = false;
    let b = l.as_bytes();
    for i in 0..b.len() {
        match b[i] {
            b'"' => in_str = !in_str,
            b'/' if !in_str && b.get(i + 1) == Some(&b'/') => return &l[..i],
            _ => {}
        }
    }
    l
}

/// The `; value` tail of buffer line `no` of `text`.
fn raw_value(text: &str, no: usize) -> String {
    let l = text.lines().nth(no - 1).unwrap_or("");
    l.rsplit_once("  ; ")
        .map_or(String::new(), |(_, v)| v.trim().to_string())
}

fn is_buffer_line(t: &str) -> bool {
    t.strip_prefix('b')
        .and_then(|r| r.split_once('='))
        .is_some_and(|(n, _)| !n.trim().is_empty() && n.trim().bytes().all(|c| c.is_ascii_digit()))
}

/// `bN` with `N < n`.
fn buffer_id(l: &Line, s: &str, n: usize) -> R<BufferId> {
    let i: usize = s
        .strip_prefix('b')
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| l.err(format!("expected a buffer 'bN', found '{s}'")))?;
    if i >= n {
        return Err(l.err(format!("buffer b{i} is not defined (the program has {n})")));
    }
    Ok(BufferId(i as u32))
}

/// Run `f` on a parser over `s` (a piece of line `l`), requiring it to consume everything;
/// errors point at the line.
fn sub<T>(l: &Line, s: &str, f: impl FnOnce(&mut Parser) -> R<T>) -> R<T> {
    let at = |mut e: ParseError| {
        e.line = l.no;
        e
    };
    let mut p = Parser::new(s).map_err(at)?;
    let v = f(&mut p).map_err(at)?;
    if !p.at_end() {
        return Err(l.err(format!("unexpected text after '{}'", s.trim())));
    }
    Ok(v)
}

/// `bN = input "x" : f32[N,3]`, `param`, `constant dense<..> : ty`, `temp : ty`, `output : ty`.
fn buffer(l: &Line, n: usize, value: String) -> R<Buffer> {
    let body = l.text.split_once("  ; ").map_or(l.text, |(b, _)| b);
    let (id, rest) = body.split_once('=').ok_or_else(|| l.err("expected 'bN = ...'"))?;
    if buffer_id(l, id.trim(), n + 1)?.index() != n {
        return Err(l.err(format!("expected buffer b{n} next, found {}", id.trim())));
    }
    let rest = rest.trim();
    let (kind, ty) = if let Some(r) = rest.strip_prefix("constant") {
        let t = sub(l, r, |p| p.constant())?;
        let ty = t.tensor_type();
        (BufferKind::Constant(t), ty)
    } else {
        let (head, ty) = rest.rsplit_once(':').ok_or_else(|| l.err("expected ': <type>'"))?;
        let ty = sub(l, ty, |p| p.ty())?;
        let head = head.trim();
        let named = |kw: &str| -> R<Option<String>> {
            let Some(r) = head.strip_prefix(kw) else {
                return Ok(None);
            };
            let r = r.trim();
            r.strip_prefix('"')
                .and_then(|r| r.strip_suffix('"'))
                .map(|s| Some(s.replace("\\\"", "\"")))
                .ok_or_else(|| l.err(format!("expected {kw} \"name\"")))
        };
        let kind = if let Some(name) = named("input")? {
            BufferKind::Input { name }
        } else if let Some(name) = named("param")? {
            BufferKind::Param { name }
        } else if head == "temp" {
            BufferKind::Temp
        } else if head == "output" {
            BufferKind::Output
        } else {
            return Err(l.err(format!(
                "expected input, param, constant, temp or output, found '{head}'"
            )));
        };
        (kind, ty)
    };
    Ok(Buffer { kind, ty, value })
}

/// `[64,N]`.
fn dims(l: &Line, s: &str) -> R<Vec<Dim>> {
    let inner = s
        .trim()
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or_else(|| l.err(format!("expected dims like [N,3], found '{s}'")))?;
    if inner.trim().is_empty() {
        return Ok(Vec::new());
    }
    inner
        .split(',')
        .map(|d| {
            let d = d.trim();
            d.parse::<Dim>().map_err(|m| {
                l.err(format!(
                    "expected a dim (a number, a name or a size expression), found '{d}': {m}"
                ))
            })
        })
        .collect()
}

/// The text up to the `]` closing the `[` at the start of `s`, and the rest.
fn bracketed(l: &Line, s: &str) -> R<(String, String)> {
    let s = s.trim_start();
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return Ok((s[..=i].to_string(), s[i + 1..].to_string()));
                }
            }
            _ => {}
        }
    }
    Err(l.err(format!("expected '[...]', found '{s}'")))
}

/// `i0`, `2*i1 - 3`, `-i0 + 5`, `7`.
fn affine(l: &Line, s: &str) -> R<AffineExpr> {
    let mut e = AffineExpr::default();
    let s = s.replace(' ', "");
    if s.is_empty() {
        return Err(l.err("empty index expression"));
    }
    let mut terms: Vec<(i64, &str)> = Vec::new();
    let mut start = 0;
    let mut sign = 1;
    let b = s.as_bytes();
    for i in 0..=b.len() {
        if i == b.len() || ((b[i] == b'+' || b[i] == b'-') && i > 0) {
            terms.push((sign, &s[start..i]));
            if i < b.len() {
                sign = if b[i] == b'-' { -1 } else { 1 };
                start = i + 1;
            }
        } else if i == 0 && b[0] == b'-' {
            sign = -1;
            start = 1;
        }
    }
    for (sign, t) in terms {
        let bad = || l.err(format!("bad index term '{t}' in '{s}'"));
        let (coef, var) = match t.split_once('*') {
            Some((c, v)) => (c.parse::<i64>().map_err(|_| bad())?, Some(v)),
            None if t.starts_with('i') => (1, Some(t)),
            None => (t.parse::<i64>().map_err(|_| bad())?, None),
        };
        match var {
            Some(v) => {
                let loop_: usize = v.strip_prefix('i').and_then(|n| n.parse().ok()).ok_or_else(bad)?;
                if e.terms.iter().any(|t| t.0 == loop_) {
                    return Err(l.err(format!("loop i{loop_} appears twice in '{s}'")));
                }
                if coef != 0 {
                    e.terms.push((loop_, sign * coef));
                }
            }
            None => e.offset += sign * coef,
        }
    }
    Ok(e)
}

/// `b0 as [64,768][i0, i1]`.
fn load(l: &Line, s: &str, n: usize) -> R<Load> {
    let (b, rest) = s
        .trim()
        .split_once(" as ")
        .ok_or_else(|| l.err(format!("expected '<buffer> as [view][index, ...]', found '{s}'")))?;
    let buffer = buffer_id(l, b.trim(), n)?;
    let (view, rest) = bracketed(l, rest)?;
    let (axes, _) = bracketed(l, &rest)?;
    let inner = &axes[1..axes.len() - 1];
    let axes = if inner.trim().is_empty() {
        Vec::new()
    } else {
        inner.split(',').map(|a| affine(l, a)).collect::<R<_>>()?
    };
    let view = dims(l, &view)?;
    if axes.len() != view.len() {
        return Err(l.err(format!(
            "{} index expressions for a rank-{} view",
            axes.len(),
            view.len()
        )));
    }
    Ok(Load {
        buffer,
        map: IndexMap { view, axes },
    })
}

/// `%k = <op> : <dtype>`.
fn inst(l: &Line, k: usize) -> R<Inst> {
    let (lhs, rhs) = l
        .text
        .split_once('=')
        .ok_or_else(|| l.err("expected '%N = <op> : <dtype>'"))?;
    if lhs.trim() != format!("%{k}") {
        return Err(l.err(format!("expected instruction %{k} next, found {}", lhs.trim())));
    }
    let (op, dt) = rhs.rsplit_once(':').ok_or_else(|| l.err("expected ': <dtype>'"))?;
    let dtype: DType = dt
        .trim()
        .parse()
        .map_err(|_| l.err(format!("unknown dtype '{}'", dt.trim())))?;
    let op = op.trim();
    let (name, args) = op.split_once(' ').unwrap_or((op, ""));
    let operand = |a: &str| -> R<usize> {
        let i: usize = a
            .trim()
            .strip_prefix('%')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| l.err(format!("expected an operand '%N', found '{}'", a.trim())))?;
        if i >= k {
            return Err(l.err(format!("%{k} uses %{i} before it is defined")));
        }
        Ok(i)
    };
    let list: Vec<&str> = if args.trim().is_empty() {
        Vec::new()
    } else {
        args.split(',').map(str::trim).collect()
    };
    let arity = |n: usize| -> R<()> {
        if list.len() == n {
            Ok(())
        } else {
            Err(l.err(format!("'{name}' takes {n} operand(s), found {}", list.len())))
        }
    };
    let op = match name {
        "load" => {
            arity(1)?;
            let n = list[0].strip_prefix('l').and_then(|n| n.parse().ok());
            ScalarOp::Load(n.ok_or_else(|| l.err(format!("expected 'lN', found '{}'", list[0])))?)
        }
        "const" => {
            let v: f64 = args
                .trim()
                .parse()
                .map_err(|_| l.err(format!("expected a number, found '{}'", args.trim())))?;
            ScalarOp::Const(Float(v))
        }
        "acc" if list.is_empty() => ScalarOp::Acc(0),
        a if a.starts_with("acc") && list.is_empty() => {
            ScalarOp::Acc(a[3..].parse().map_err(|_| l.err(format!("unknown op '{a}'")))?)
        }
        "where" => {
            arity(3)?;
            ScalarOp::Where(operand(list[0])?, operand(list[1])?, operand(list[2])?)
        }
        "muladd" => {
            arity(3)?;
            ScalarOp::MulAdd(operand(list[0])?, operand(list[1])?, operand(list[2])?)
        }
        "cast" => {
            arity(1)?;
            ScalarOp::Cast(operand(list[0])?)
        }
        "bitcast" => {
            arity(1)?;
            ScalarOp::Bitcast(operand(list[0])?)
        }
        "shl" | "shr" => {
            arity(2)?;
            let by: u32 = list[1]
                .parse()
                .map_err(|_| l.err(format!("expected a shift amount, found '{}'", list[1])))?;
            if name == "shl" {
                ScalarOp::ShiftLeft(operand(list[0])?, by)
            } else {
                ScalarOp::ShiftRight(operand(list[0])?, by)
            }
        }
        n => {
            if let Some(u) = UnaryOp::from_name(n) {
                arity(1)?;
                ScalarOp::Unary(u, operand(list[0])?)
            } else if let Some(b) = BinaryOp::from_name(n) {
                arity(2)?;
                ScalarOp::Binary(b, operand(list[0])?, operand(list[1])?)
            } else {
                return Err(l.err(format!("unknown scalar op '{n}'")));
            }
        }
    };
    Ok(Inst { op, dtype })
}

/// Instructions from line `i` on while they are `%N = ...`; returns the next line.
fn insts(lines: &[Line], mut i: usize) -> R<(Vec<Inst>, usize)> {
    let mut out = Vec::new();
    while let Some(l) = lines.get(i).filter(|l| l.text.starts_with('%')) {
        out.push(inst(l, out.len())?);
        i += 1;
    }
    Ok((out, i))
}

/// Load lines `lN = ...` from line `i` on; returns the next line.
fn loads(lines: &[Line], mut i: usize, n: usize) -> R<(Vec<Load>, usize)> {
    let mut out = Vec::new();
    while let Some(l) = lines.get(i).filter(|l| is_load_line(l.text)) {
        let (id, rest) = l.text.split_once('=').ok_or_else(|| l.err("expected 'lN = ...'"))?;
        if id.trim() != format!("l{}", out.len()) {
            return Err(l.err(format!("expected load l{} next, found {}", out.len(), id.trim())));
        }
        out.push(load(l, rest, n)?);
        i += 1;
    }
    Ok((out, i))
}

fn is_load_line(t: &str) -> bool {
    t.strip_prefix('l')
        .and_then(|r| r.split_once('='))
        .is_some_and(|(n, _)| !n.trim().is_empty() && n.trim().bytes().all(|c| c.is_ascii_digit()))
}

/// `-> b1, b2` at the end of a header: the outputs and the header before them.
fn outputs<'a>(l: &Line, s: &'a str, n: usize) -> R<(&'a str, Vec<BufferId>)> {
    let (head, outs) = s.rsplit_once("->").ok_or_else(|| l.err("expected '-> bN'"))?;
    let outs = outs
        .split(',')
        .map(|b| buffer_id(l, b.trim(), n))
        .collect::<R<Vec<_>>>()?;
    Ok((head.trim(), outs))
}

/// The kernel starting at line `i`; returns it and the next line.
fn kernel(lines: &[Line], i: usize, p: &KernelProgram) -> R<(Kernel, usize)> {
    let l = &lines[i];
    let n = p.buffers.len();
    let (name, rest) = l
        .text
        .split_once(": ")
        .ok_or_else(|| l.err("expected a buffer, a kernel '<name>: loop|matmul|conv|opaque ...', 'return' or '}'"))?;
    let name = name.trim().to_string();
    let rest = rest.trim();
    if let Some(r) = rest.strip_prefix("loop ") {
        let (head, outs) = outputs(l, r, n)?;
        let (shape_s, mut tail) = bracketed(l, head)?;
        let shape = dims(l, &shape_s)?;
        let mut outer = shape.len();
        let mut stages: Vec<(ReduceOp, Vec<Dim>)> = Vec::new();
        loop {
            let t = tail.trim().to_string();
            if t.is_empty() {
                break;
            }
            if let Some(r) = t.strip_prefix("rows ") {
                let (d, rest) = bracketed(l, r)?;
                outer = dims(l, &d)?.len();
                tail = rest;
            } else {
                let (op, rest) = t
                    .split_once(" over ")
                    .ok_or_else(|| l.err(format!("expected '<reduce op> over [dims]', found '{t}'")))?;
                let op = ReduceOp::from_name(op.trim())
                    .ok_or_else(|| l.err(format!("unknown reduction '{}'", op.trim())))?;
                let (d, rest) = bracketed(l, rest)?;
                stages.push((op, dims(l, &d)?));
                tail = rest;
            }
        }
        let (loads, mut j) = loads(lines, i + 1, n)?;
        let mut reduce = Vec::new();
        let body = if stages.is_empty() {
            let (b, next) = insts(lines, j)?;
            j = next;
            b
        } else {
            for (s, (op, d)) in stages.into_iter().enumerate() {
                let want = if s == 0 {
                    "reduce:".to_string()
                } else {
                    format!("reduce acc{s}:")
                };
                let h = lines
                    .get(j)
                    .filter(|h| h.text == want)
                    .ok_or_else(|| lines.get(j).unwrap_or(l).err(format!("expected '{want}'")))?;
                let (b, next) = insts(lines, j + 1)?;
                if b.is_empty() {
                    return Err(h.err("a reduction stage needs a body"));
                }
                reduce.push(Reduction { op, dims: d, body: b });
                j = next;
            }
            let h = lines
                .get(j)
                .filter(|h| h.text == "epilogue:")
                .ok_or_else(|| lines.get(j).unwrap_or(l).err("expected 'epilogue:'"))?;
            let (b, next) = insts(lines, j + 1)?;
            if b.is_empty() {
                return Err(h.err("the epilogue needs a body"));
            }
            j = next;
            b
        };
        if body.is_empty() {
            return Err(l.err("a loop kernel needs a body"));
        }
        let k = LoopKernel {
            shape,
            loads,
            outer,
            reduce,
            body,
        };
        let kernel = Kernel {
            name,
            body: KernelBody::Loop(k),
            outputs: outs,
        };
        return Ok((kernel, j));
    }
    if let Some(r) = rest.strip_prefix("opaque ") {
        let (head, outs) = outputs(l, r, n)?;
        let open = head.find('(').ok_or_else(|| l.err("expected 'opaque <op>(bA, ...)'"))?;
        let close = head
            .rfind(')')
            .filter(|&c| c > open)
            .ok_or_else(|| l.err("expected ')'"))?;
        let inputs = head[open + 1..close]
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|b| buffer_id(l, b.trim(), n))
            .collect::<R<Vec<_>>>()?;
        let types: Vec<TensorType> = outs.iter().map(|b| p.buffer(*b).ty.clone()).collect();
        let text = format!("{} {}", &head[..open], &head[close + 1..]);
        let op = sub(l, &text, |ps| ps.op_with_attrs(&types))?;
        if op.num_regions() > 0 {
            return Err(l.err(format!(
                "opaque '{}' has regions, which the kernel text form does not carry",
                op.name()
            )));
        }
        let k = OpaqueKernel {
            op,
            inputs,
            regions: Vec::new(),
        };
        let kernel = Kernel {
            name,
            body: KernelBody::Opaque(k),
            outputs: outs,
        };
        return Ok((kernel, i + 1));
    }
    contraction(lines, i, name, rest, n, p)
}

/// `matmul|conv(...) lhs <load> [round <dtype>] : [dims] rhs <load> [round <dtype>] : [dims] -> bN :
/// [dims] [acc <dtype>]`.
fn contraction(lines: &[Line], i: usize, name: String, rest: &str, n: usize, p: &KernelProgram) -> R<(Kernel, usize)> {
    let l = &lines[i];
    let (op_s, r) = rest
        .split_once(" lhs ")
        .ok_or_else(|| l.err(format!("expected 'loop', 'opaque', 'matmul' or 'conv', found '{rest}'")))?;
    let op = match op_s.trim() {
        "matmul" => Contraction::MatMul,
        c if c.starts_with("conv(") && c.ends_with(')') => Contraction::Conv(conv_attrs(l, &c[5..c.len() - 1])?),
        c => return Err(l.err(format!("unknown contraction '{c}'"))),
    };
    let (lhs_s, r) = r.split_once(" rhs ").ok_or_else(|| l.err("expected 'rhs'"))?;
    let (rhs_s, r) = r.split_once("->").ok_or_else(|| l.err("expected '-> bN : [dims]'"))?;
    let operand = |s: &str| -> R<Operand> {
        let (ld, sh) = s
            .rsplit_once(" : ")
            .ok_or_else(|| l.err("expected '<load> [round <dtype>] : [dims]'"))?;
        let (ld, round) = match ld.rsplit_once(" round ") {
            Some((ld, d)) => (
                ld,
                Some(
                    d.trim()
                        .parse()
                        .map_err(|_| l.err(format!("unknown dtype '{}'", d.trim())))?,
                ),
            ),
            None => (ld, None),
        };
        Ok(Operand {
            load: load(l, ld, n)?,
            shape: dims(l, sh)?,
            round,
        })
    };
    let (lhs, rhs) = (operand(lhs_s)?, operand(rhs_s)?);
    let (out, r) = r.split_once(" : ").ok_or_else(|| l.err("expected '-> bN : [dims]'"))?;
    let out = buffer_id(l, out.trim(), n)?;
    let (shape_s, tail) = bracketed(l, r)?;
    let acc_dtype = match tail.trim().strip_prefix("acc ") {
        Some(d) => d
            .trim()
            .parse()
            .map_err(|_| l.err(format!("unknown dtype '{}'", d.trim())))?,
        None if tail.trim().is_empty() => p.buffer(out).ty.dtype,
        None => return Err(l.err(format!("unexpected '{}'", tail.trim()))),
    };
    let (loads, j) = loads(lines, i + 1, n)?;
    let (epilogue, j) = insts(lines, j)?;
    if epilogue.is_empty() {
        return Err(l.err("a contraction needs an epilogue (at least '%0 = acc : <dtype>')"));
    }
    let k = ContractionKernel {
        op,
        lhs,
        rhs,
        acc_dtype,
        shape: dims(l, &shape_s)?,
        loads,
        epilogue,
    };
    let kernel = Kernel {
        name,
        body: KernelBody::Contraction(k),
        outputs: vec![out],
    };
    Ok((kernel, j))
}

/// `stride=[1, 1], pad_before=[0, 0], pad_after=[0, 0], dilation=[1, 1], groups=1`.
fn conv_attrs(l: &Line, s: &str) -> R<Conv> {
    let list = |key: &str| -> R<Vec<usize>> {
        let at = s
            .find(&format!("{key}=["))
            .ok_or_else(|| l.err(format!("conv needs {key}=[..]")))?;
        let r = &s[at + key.len() + 2..];
        let end = r.find(']').ok_or_else(|| l.err(format!("unclosed {key}")))?;
        r[..end]
            .split(',')
            .filter(|v| !v.trim().is_empty())
            .map(|v| {
                v.trim()
                    .parse()
                    .map_err(|_| l.err(format!("bad {key} value '{}'", v.trim())))
            })
            .collect()
    };
    let groups = s
        .split_once("groups=")
        .and_then(|(_, g)| g.trim().parse().ok())
        .ok_or_else(|| l.err("conv needs groups=N"))?;
    Ok(Conv {
        stride: list("stride")?,
        pad_before: list("pad_before")?,
        pad_after: list("pad_after")?,
        dilation: list("dilation")?,
        groups,
    })
}
