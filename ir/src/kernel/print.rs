//! The text form of a kernel program (for `oar` output, tests and docs), parsed back by
//! `oar_ir::text::parse_kernel_program` (kernel file tests start from it); the serde form is
//! the interchange format.

use super::*;
use crate::ops::Conv;
use std::fmt::{self, Display, Formatter, Write};

fn dims(d: &[Dim]) -> String {
    let parts: Vec<String> = d.iter().map(Dim::to_string).collect();
    format!("[{}]", parts.join(","))
}

impl Display for AffineExpr {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        for &(l, c) in &self.terms {
            match (s.is_empty(), c < 0) {
                (true, true) => s.push('-'),
                (false, true) => s.push_str(" - "),
                (false, false) => s.push_str(" + "),
                (true, false) => {}
            }
            match c.unsigned_abs() {
                1 => write!(s, "i{l}")?,
                m => write!(s, "{m}*i{l}")?,
            }
        }
        match (s.is_empty(), self.offset) {
            (true, o) => write!(f, "{o}"),
            (false, 0) => f.write_str(&s),
            (false, o) if o < 0 => write!(f, "{s} - {}", o.unsigned_abs()),
            (false, o) => write!(f, "{s} + {o}"),
        }
    }
}

impl Display for Load {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self.map.axes.iter().map(AffineExpr::to_string).collect();
        write!(f, "{} as {}[{}]", self.buffer, dims(&self.map.view), axes.join(", "))
    }
}

impl Display for ScalarOp {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            ScalarOp::Load(l) => write!(f, "load l{l}"),
            ScalarOp::Const(c) => write!(f, "const {c}"),
            ScalarOp::Acc(0) => f.write_str("acc"),
            ScalarOp::Acc(n) => write!(f, "acc{n}"),
            ScalarOp::Unary(u, a) => write!(f, "{} %{a}", u.name()),
            ScalarOp::Binary(b, x, y) => write!(f, "{} %{x}, %{y}", b.name()),
            ScalarOp::Where(c, a, b) => write!(f, "where %{c}, %{a}, %{b}"),
            ScalarOp::Cast(a) => write!(f, "cast %{a}"),
            ScalarOp::Bitcast(a) => write!(f, "bitcast %{a}"),
            ScalarOp::MulAdd(a, b, c) => write!(f, "muladd %{a}, %{b}, %{c}"),
            ScalarOp::ShiftLeft(a, n) => write!(f, "shl %{a}, {n}"),
            ScalarOp::ShiftRight(a, n) => write!(f, "shr %{a}, {n}"),
        }
    }
}

fn insts(f: &mut Formatter<'_>, indent: &str, body: &[Inst]) -> fmt::Result {
    for (i, inst) in body.iter().enumerate() {
        writeln!(f, "{indent}%{i} = {} : {}", inst.op, inst.dtype)?;
    }
    Ok(())
}

fn loads(f: &mut Formatter<'_>, ls: &[Load]) -> fmt::Result {
    for (i, l) in ls.iter().enumerate() {
        writeln!(f, "    l{i} = {l}")?;
    }
    Ok(())
}

impl Display for Contraction {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Contraction::MatMul => f.write_str("matmul"),
            Contraction::Conv(Conv {
                stride,
                pad_before,
                pad_after,
                dilation,
                groups,
            }) => write!(
                f,
                "conv(stride={stride:?}, pad_before={pad_before:?}, pad_after={pad_after:?}, dilation={dilation:?}, groups={groups})"
            ),
        }
    }
}

impl Display for Kernel {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let outs: Vec<String> = self.outputs.iter().map(BufferId::to_string).collect();
        let outs = outs.join(", ");
        match &self.body {
            KernelBody::Loop(k) => {
                write!(f, "  {}: loop {}", self.name, dims(&k.shape))?;
                if k.outer != k.shape.len() {
                    write!(f, " rows {}", dims(&k.shape[..k.outer.min(k.shape.len())]))?;
                }
                for r in &k.reduce {
                    write!(f, " {} over {}", r.op.name(), dims(&r.dims))?;
                }
                writeln!(f, " -> {outs}")?;
                loads(f, &k.loads)?;
                if k.reduce.is_empty() {
                    return insts(f, "    ", &k.body);
                }
                for (s, r) in k.reduce.iter().enumerate() {
                    match s {
                        0 => writeln!(f, "    reduce:")?,
                        _ => writeln!(f, "    reduce acc{s}:")?,
                    }
                    insts(f, "      ", &r.body)?;
                }
                writeln!(f, "    epilogue:")?;
                insts(f, "      ", &k.body)
            }
            KernelBody::Contraction(k) => {
                writeln!(
                    f,
                    "  {}: {} lhs {}{} : {} rhs {}{} : {} -> {outs} : {} acc {}",
                    self.name,
                    k.op,
                    k.lhs.load,
                    rounding(&k.lhs),
                    dims(&k.lhs.shape),
                    k.rhs.load,
                    rounding(&k.rhs),
                    dims(&k.rhs.shape),
                    dims(&k.shape),
                    k.acc_dtype
                )?;
                loads(f, &k.loads)?;
                insts(f, "    ", &k.epilogue)
            }
            KernelBody::Opaque(k) => {
                let ins: Vec<String> = k.inputs.iter().map(BufferId::to_string).collect();
                write!(f, "  {}: opaque {}({})", self.name, k.op.name(), ins.join(", "))?;
                let attrs = crate::ops::OpText::print_attrs(&k.op);
                if !attrs.is_empty() {
                    let kv: Vec<String> = attrs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                    write!(f, " {{{}}}", kv.join(", "))?;
                }
                if !k.regions.is_empty() {
                    write!(f, " regions {}", k.regions.len())?;
                }
                writeln!(f, " -> {outs}")
            }
        }
    }
}

impl Display for KernelProgram {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(f, "program {} {{", self.name)?;
        for (i, b) in self.buffers.iter().enumerate() {
            let kind = match &b.kind {
                BufferKind::Input { name } => format!("input {name:?}"),
                BufferKind::Param { name } => format!("param {name:?}"),
                BufferKind::Constant(t) => {
                    writeln!(
                        f,
                        "  b{i} = constant dense<{}> : {}  ; {}",
                        crate::text::fmt_dense(t),
                        b.ty,
                        b.value
                    )?;
                    continue;
                }
                BufferKind::Temp => "temp".into(),
                BufferKind::Output => "output".into(),
            };
            writeln!(f, "  b{i} = {kind} : {}  ; {}", b.ty, b.value)?;
        }
        for k in &self.kernels {
            write!(f, "{k}")?;
        }
        for (name, b) in &self.outputs {
            writeln!(f, "  return {name} = {b}")?;
        }
        f.write_str("}")
    }
}

/// ` round <dtype>` for an operand rounded as it is read.
fn rounding(o: &crate::kernel::Operand) -> String {
    o.round.map(|d| format!(" round {d}")).unwrap_or_default()
}
