//! PTX text for one kernel entry: virtual registers by class, loads and stores of every dtype,
//! and the scalar language of kernel bodies ([`Inst`]) instruction by instruction.
//!
//! Value representation: f32, f16 and bf16 values live in `.f32` registers (f16/bf16 rounded
//! to their dtype after every instruction, as the graph op would); f64 in `.f64`; i8, u8, i32
//! and bool in `.b32` (i8/u8 kept wrapped, bool as 0/1); i64 in `.b64`.

use oar_ir::DType;
use oar_ir::kernel::{IndexMap, Inst, ScalarOp};
use oar_ir::ops::{BinaryOp, UnaryOp};
use std::fmt::Write;

/// Why a kernel cannot be generated (it then runs on the host).
pub type GenResult<T> = Result<T, String>;

/// A register class (one `.reg` declaration each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// `.pred %p`
    Pred,
    /// `.b16 %h` (f16/bf16 bits in transit)
    B16,
    /// `.b32 %r`
    R32,
    /// `.b64 %rd`
    R64,
    /// `.f32 %f`
    F32,
    /// `.f64 %fd`
    F64,
}

const CLASSES: [(Class, &str, &str); 6] = [
    (Class::Pred, ".pred", "%p"),
    (Class::B16, ".b16", "%h"),
    (Class::R32, ".b32", "%r"),
    (Class::R64, ".b64", "%rd"),
    (Class::F32, ".f32", "%f"),
    (Class::F64, ".f64", "%fd"),
];

/// The register class holding values of `dt`.
pub fn class_of(dt: DType) -> Class {
    match dt {
        DType::F32 | DType::F16 | DType::BF16 => Class::F32,
        DType::F64 => Class::F64,
        DType::I64 => Class::R64,
        DType::I8 | DType::U8 | DType::I32 | DType::Bool => Class::R32,
    }
}

/// The PTX arithmetic type suffix for values of `dt` in their register class.
pub fn arith(dt: DType) -> &'static str {
    match class_of(dt) {
        Class::F32 => "f32",
        Class::F64 => "f64",
        Class::R64 => "s64",
        _ => "s32",
    }
}

/// Where a load reads: a buffer base register and the flat element index as an affine function
/// of loop registers (`offset + Σ coef · loop[l]`).
#[derive(Clone, Debug)]
pub struct LoadSrc {
    /// Global base address register of the buffer.
    pub base: String,
    /// Element dtype of the buffer.
    pub dtype: DType,
    /// Constant part of the flat index.
    pub offset: i64,
    /// `(loop, coefficient)` terms of the flat index.
    pub terms: Vec<(usize, i64)>,
}

impl LoadSrc {
    /// Flatten an index map over a buffer with static `view` dims.
    pub fn new(base: String, dtype: DType, map: &IndexMap) -> GenResult<LoadSrc> {
        let view = static_dims(&map.view)?;
        let mut stride = 1i64;
        let mut strides = vec![0i64; view.len()];
        for a in (0..view.len()).rev() {
            strides[a] = stride;
            stride *= view[a] as i64;
        }
        let mut offset = 0;
        let mut terms: Vec<(usize, i64)> = Vec::new();
        for (a, e) in map.axes.iter().enumerate() {
            offset += strides[a] * e.offset;
            for &(l, c) in &e.terms {
                match terms.iter_mut().find(|t| t.0 == l) {
                    Some(t) => t.1 += c * strides[a],
                    None => terms.push((l, c * strides[a])),
                }
            }
        }
        terms.retain(|t| t.1 != 0);
        Ok(LoadSrc {
            base,
            dtype,
            offset,
            terms,
        })
    }
}

/// Every dim as a number (the backend specializes shapes before fusing).
pub fn static_dims(dims: &[oar_ir::Dim]) -> GenResult<Vec<usize>> {
    dims.iter()
        .map(|d| match d {
            oar_ir::Dim::Static(n) => Ok(*n),
            d => Err(format!("symbolic dim `{d}`")),
        })
        .collect()
}

/// The text of one entry being generated.
#[derive(Default)]
pub struct Emitter {
    counts: [u32; 6],
    text: String,
    labels: u32,
    /// The register holding this entry's error word address, when it has one: integer
    /// division by zero and negative integer powers set it (the reference reports both).
    pub err: Option<String>,
}

impl Emitter {
    /// A fresh register of `class`.
    pub fn reg(&mut self, class: Class) -> String {
        let i = CLASSES.iter().position(|c| c.0 == class).unwrap_or(0);
        self.counts[i] += 1;
        format!("{}{}", CLASSES[i].2, self.counts[i])
    }

    /// A fresh label.
    pub fn label(&mut self, hint: &str) -> String {
        self.labels += 1;
        format!("$L_{hint}_{}", self.labels)
    }

    /// One instruction (`;` and indentation added).
    pub fn ins(&mut self, s: impl AsRef<str>) {
        let _ = writeln!(self.text, "\t{};", s.as_ref());
    }

    /// A label line.
    pub fn put_label(&mut self, l: &str) {
        let _ = writeln!(self.text, "{l}:");
    }

    /// Raw text (declarations of shared memory, comments).
    pub fn raw(&mut self, s: impl AsRef<str>) {
        let _ = writeln!(self.text, "{}", s.as_ref());
    }

    /// The entry: signature with `n_params` `.u64` pointers, register declarations, body.
    pub fn finish(self, name: &str, n_params: usize) -> String {
        let mut out = String::new();
        let params: Vec<String> = (0..n_params).map(|i| format!("\t.param .u64 {name}_p{i}")).collect();
        let _ = writeln!(out, ".visible .entry {name}(\n{}\n)\n{{", params.join(",\n"));
        for (i, (_, ty, prefix)) in CLASSES.iter().enumerate() {
            if self.counts[i] > 0 {
                let _ = writeln!(out, "\t.reg {ty} {prefix}<{}>;", self.counts[i] + 1);
            }
        }
        out.push_str(&self.text);
        out.push_str("\tret;\n}\n");
        out
    }

    /// Load kernel parameter `i` as a global address.
    pub fn param_ptr(&mut self, name: &str, i: usize) -> String {
        let r = self.reg(Class::R64);
        self.ins(format!("ld.param.u64 {r}, [{name}_p{i}]"));
        self.ins(format!("cvta.to.global.u64 {r}, {r}"));
        r
    }

    /// A u64 register holding `v`.
    pub fn imm64(&mut self, v: i64) -> String {
        let r = self.reg(Class::R64);
        self.ins(format!("mov.b64 {r}, {v}"));
        r
    }

    /// A special register (`%tid.x`, ...) widened to u64.
    pub fn special64(&mut self, sreg: &str) -> String {
        let r = self.reg(Class::R32);
        self.ins(format!("mov.u32 {r}, {sreg}"));
        let d = self.reg(Class::R64);
        self.ins(format!("cvt.u64.u32 {d}, {r}"));
        d
    }

    /// Split the row-major linear index `x` over `dims` into one u64 register per dim.
    pub fn decompose(&mut self, x: &str, dims: &[usize]) -> Vec<String> {
        let mut out = vec![String::new(); dims.len()];
        let mut rest = x.to_string();
        let last_nonunit = dims.iter().position(|&d| d != 1);
        for a in (0..dims.len()).rev() {
            let r = self.reg(Class::R64);
            if dims[a] == 1 {
                self.ins(format!("mov.b64 {r}, 0"));
            } else if Some(a) == last_nonunit {
                // The outermost non-unit dim takes what is left (index < total).
                self.ins(format!("mov.b64 {r}, {rest}"));
            } else {
                self.ins(format!("rem.u64 {r}, {rest}, {}", dims[a]));
                let q = self.reg(Class::R64);
                self.ins(format!("div.u64 {q}, {rest}, {}", dims[a]));
                rest = q;
            }
            out[a] = r;
        }
        out
    }

    /// The address of element `offset + Σ coef·loops[l]` of a buffer of `dtype` at `base`.
    pub fn address(&mut self, src: &LoadSrc, loops: &[String]) -> GenResult<String> {
        let idx = self.reg(Class::R64);
        self.ins(format!("mov.b64 {idx}, {}", src.offset));
        for &(l, c) in &src.terms {
            let lr = loops
                .get(l)
                .ok_or_else(|| format!("load names loop i{l} outside the kernel"))?;
            self.ins(format!("mad.lo.s64 {idx}, {lr}, {c}, {idx}"));
        }
        let a = self.reg(Class::R64);
        self.ins(format!(
            "mad.lo.s64 {a}, {idx}, {}, {}",
            src.dtype.size_bytes(),
            src.base
        ));
        Ok(a)
    }

    /// Load one element of `dt` at address `a` into its value register.
    pub fn load_value(&mut self, dt: DType, a: &str, space: &str) -> String {
        let v = self.reg(class_of(dt));
        match dt {
            DType::F32 => self.ins(format!("ld.{space}.f32 {v}, [{a}]")),
            DType::F64 => self.ins(format!("ld.{space}.f64 {v}, [{a}]")),
            DType::F16 | DType::BF16 => {
                let h = self.reg(Class::B16);
                self.ins(format!("ld.{space}.b16 {h}, [{a}]"));
                self.widen_half(dt, &v, &h);
            }
            DType::I8 => self.ins(format!("ld.{space}.s8 {v}, [{a}]")),
            DType::U8 | DType::Bool => self.ins(format!("ld.{space}.u8 {v}, [{a}]")),
            DType::I32 => self.ins(format!("ld.{space}.b32 {v}, [{a}]")),
            DType::I64 => self.ins(format!("ld.{space}.b64 {v}, [{a}]")),
        }
        v
    }

    /// Store value register `v` of `dt` at address `a`.
    pub fn store_value(&mut self, dt: DType, a: &str, v: &str, space: &str) {
        match dt {
            DType::F32 => self.ins(format!("st.{space}.f32 [{a}], {v}")),
            DType::F64 => self.ins(format!("st.{space}.f64 [{a}], {v}")),
            DType::F16 | DType::BF16 => {
                let h = self.reg(Class::B16);
                let ty = if dt == DType::F16 { "f16" } else { "bf16" };
                self.ins(format!("cvt.rn.{ty}.f32 {h}, {v}"));
                self.ins(format!("st.{space}.b16 [{a}], {h}"));
            }
            DType::I8 | DType::U8 | DType::Bool => self.ins(format!("st.{space}.u8 [{a}], {v}")),
            DType::I32 => self.ins(format!("st.{space}.b32 [{a}], {v}")),
            DType::I64 => self.ins(format!("st.{space}.b64 [{a}], {v}")),
        }
    }

    /// f16/bf16 bits `h` → f32 register `f`. (bf16 by shifting: `cvt.f32.bf16` needs sm_90.)
    fn widen_half(&mut self, dt: DType, f: &str, h: &str) {
        if dt == DType::F16 {
            self.ins(format!("cvt.f32.f16 {f}, {h}"));
        } else {
            let r = self.reg(Class::R32);
            self.ins(format!("cvt.u32.u16 {r}, {h}"));
            self.ins(format!("shl.b32 {r}, {r}, 16"));
            self.ins(format!("mov.b32 {f}, {r}"));
        }
    }

    /// Round/wrap register `v` (in place) to the dtype `dt` it represents.
    pub fn normalize(&mut self, dt: DType, v: &str) {
        match dt {
            DType::F16 | DType::BF16 => {
                let h = self.reg(Class::B16);
                let ty = if dt == DType::F16 { "f16" } else { "bf16" };
                self.ins(format!("cvt.rn.{ty}.f32 {h}, {v}"));
                self.widen_half(dt, v, &h);
            }
            DType::I8 => {
                self.ins(format!("shl.b32 {v}, {v}, 24"));
                self.ins(format!("shr.s32 {v}, {v}, 24"));
            }
            DType::U8 => self.ins(format!("and.b32 {v}, {v}, 255")),
            DType::Bool => self.ins(format!("and.b32 {v}, {v}, 1")),
            _ => {}
        }
    }

    /// A register holding the constant `c` converted to `dt` (as the reference does).
    pub fn constant(&mut self, dt: DType, c: f64) -> String {
        let v = self.reg(class_of(dt));
        let imm = const_imm(dt, c);
        let ty = match class_of(dt) {
            Class::F32 => "f32",
            Class::F64 => "f64",
            Class::R64 => "b64",
            _ => "b32",
        };
        self.ins(format!("mov.{ty} {v}, {imm}"));
        v
    }

    /// A predicate from a bool (0/1) register.
    pub fn pred_of(&mut self, b: &str) -> String {
        let p = self.reg(Class::Pred);
        self.ins(format!("setp.ne.b32 {p}, {b}, 0"));
        p
    }

    /// A bool register (0/1) from a predicate.
    pub fn bool_of(&mut self, p: &str) -> String {
        let r = self.reg(Class::R32);
        self.ins(format!("selp.b32 {r}, 1, 0, {p}"));
        r
    }
}

/// The PTX immediate for constant `c` of `dt` (floats as exact hex bits).
pub fn const_imm(dt: DType, c: f64) -> String {
    match dt {
        DType::F32 => f32_imm(c as f32),
        DType::F16 => f32_imm(half::f16::from_f64(c).to_f32()),
        DType::BF16 => f32_imm(half::bf16::from_f64(c).to_f32()),
        DType::F64 => format!("0d{:016X}", c.to_bits()),
        DType::Bool => u32::from(c != 0.0).to_string(),
        DType::I8 => ((c as i64) as i8).to_string(),
        DType::U8 => ((c as i64) as u8).to_string(),
        DType::I32 => ((c as i64) as i32).to_string(),
        DType::I64 => (c as i64).to_string(),
    }
}

/// An f32 immediate (`0f3F800000`).
pub fn f32_imm(v: f32) -> String {
    format!("0f{:08X}", v.to_bits())
}

/// How a body reads its loads and the accumulator.
pub struct BodyEnv<'a> {
    /// Sources of the kernel's loads (by load index).
    pub loads: &'a [LoadSrc],
    /// Loop index registers (u64), by loop number.
    pub loops: &'a [String],
    /// The accumulator register and its dtype, when the body may read `Acc`.
    pub acc: Option<(&'a str, DType)>,
}

/// Emit a scalar body; returns the register of its last instruction.
pub fn body(e: &mut Emitter, insts: &[Inst], env: &BodyEnv) -> GenResult<String> {
    body_from(e, insts, env, vec![None; env.loads.len()])
}

/// Emit a scalar body whose load `l` is register `args[l]` (already of the load's dtype);
/// returns the register of its last instruction.
pub fn body_of_registers(e: &mut Emitter, insts: &[Inst], args: &[String]) -> GenResult<String> {
    let env = BodyEnv {
        loads: &[],
        loops: &[],
        acc: None,
    };
    body_from(e, insts, &env, args.iter().cloned().map(Some).collect())
}

fn body_from(e: &mut Emitter, insts: &[Inst], env: &BodyEnv, mut loaded: Vec<Option<String>>) -> GenResult<String> {
    let mut regs: Vec<String> = Vec::with_capacity(insts.len());
    for inst in insts {
        let dt = inst.dtype;
        let get = |i: usize| -> GenResult<&String> {
            regs.get(i)
                .ok_or_else(|| format!("operand %{i} is not defined before use"))
        };
        let r = match &inst.op {
            ScalarOp::Load(l) => {
                if let Some(Some(r)) = loaded.get(*l) {
                    r.clone()
                } else {
                    let src = env.loads.get(*l).ok_or_else(|| format!("load l{l} out of range"))?;
                    let a = e.address(src, env.loops)?;
                    let v = e.load_value(src.dtype, &a, "global");
                    let v = if src.dtype != dt {
                        cast(e, src.dtype, dt, &v)?
                    } else {
                        v
                    };
                    loaded[*l] = Some(v.clone());
                    v
                }
            }
            ScalarOp::Const(c) => e.constant(dt, c.0),
            ScalarOp::Acc(n) if *n > 0 => return Err(format!("acc{n}: reduction stages are split first")),
            ScalarOp::Acc(_) => {
                let (a, adt) = env.acc.ok_or("`acc` in a body without an accumulator")?;
                if adt == dt { a.to_string() } else { cast(e, adt, dt, a)? }
            }
            ScalarOp::Unary(op, x) => {
                let x = get(*x)?.clone();
                unary(e, *op, dt, &x)?
            }
            ScalarOp::Binary(op, ia, ib) => {
                let src = if op.is_comparison() { insts[*ia].dtype } else { dt };
                let (a, b) = (get(*ia)?.clone(), get(*ib)?.clone());
                binary(e, *op, src, &a, &b)?
            }
            ScalarOp::Where(c, a, b) => {
                let (c, a, b) = (get(*c)?.clone(), get(*a)?.clone(), get(*b)?.clone());
                let p = e.pred_of(&c);
                let r = e.reg(class_of(dt));
                let ty = match class_of(dt) {
                    Class::F32 => "f32",
                    Class::F64 => "f64",
                    Class::R64 => "b64",
                    _ => "b32",
                };
                e.ins(format!("selp.{ty} {r}, {a}, {b}, {p}"));
                r
            }
            ScalarOp::Cast(x) => {
                let src = insts.get(*x).ok_or("cast of an undefined operand")?.dtype;
                let x = get(*x)?.clone();
                cast(e, src, dt, &x)?
            }
            ScalarOp::MulAdd(a, b, c) => {
                let (a, b, c) = (get(*a)?.clone(), get(*b)?.clone(), get(*c)?.clone());
                let r = e.reg(class_of(dt));
                e.ins(format!("fma.rn.{} {r}, {a}, {b}, {c}", arith(dt)));
                r
            }
            ScalarOp::Bitcast(x) => {
                let x = get(*x)?.clone();
                let r = e.reg(class_of(dt));
                let w = if dt.size_bytes() == 8 { 64 } else { 32 };
                e.ins(format!("mov.b{w} {r}, {x}"));
                r
            }
            ScalarOp::ShiftLeft(x, n) | ScalarOp::ShiftRight(x, n) => {
                let x = get(*x)?.clone();
                let r = e.reg(class_of(dt));
                let w = if class_of(dt) == Class::R64 { 64 } else { 32 };
                if matches!(inst.op, ScalarOp::ShiftLeft(..)) {
                    e.ins(format!("shl.b{w} {r}, {x}, {n}"));
                } else {
                    e.ins(format!("shr.s{w} {r}, {x}, {n}"));
                }
                e.normalize(dt, &r);
                r
            }
        };
        regs.push(r);
    }
    regs.pop().ok_or_else(|| "empty body".to_string())
}

/// `op x` for values of `dt`.
fn unary(e: &mut Emitter, op: UnaryOp, dt: DType, x: &str) -> GenResult<String> {
    use UnaryOp::*;
    let cls = class_of(dt);
    let r = e.reg(cls);
    if dt == DType::Bool {
        if op != Not {
            return Err(format!("{} on bool", op.name()));
        }
        e.ins(format!("xor.b32 {r}, {x}, 1"));
        return Ok(r);
    }
    if !dt.is_float() {
        let t = arith(dt);
        match op {
            Neg => e.ins(format!("neg.{t} {r}, {x}")),
            Abs => e.ins(format!("abs.{t} {r}, {x}")),
            Not => e.ins(format!("not.b{} {r}, {x}", if cls == Class::R64 { 64 } else { 32 })),
            Sign => {
                let (pg, pl) = (e.reg(Class::Pred), e.reg(Class::Pred));
                e.ins(format!("setp.gt.{t} {pg}, {x}, 0"));
                e.ins(format!("setp.lt.{t} {pl}, {x}, 0"));
                let w = if cls == Class::R64 { "b64" } else { "b32" };
                e.ins(format!("selp.{w} {r}, 1, 0, {pg}"));
                e.ins(format!("selp.{w} {r}, -1, {r}, {pl}"));
            }
            _ => return Err(format!("{} on {dt}", op.name())),
        }
        e.normalize(dt, &r);
        return Ok(r);
    }
    let t = arith(dt);
    match op {
        Neg => e.ins(format!("neg.{t} {r}, {x}")),
        Abs => e.ins(format!("abs.{t} {r}, {x}")),
        Sqrt => e.ins(format!("sqrt.rn.{t} {r}, {x}")),
        Rsqrt => return Err(unexpanded("rsqrt")),
        Recip => e.ins(format!("rcp.rn.{t} {r}, {x}")),
        Floor => e.ins(format!("cvt.rmi.{t}.{t} {r}, {x}")),
        Ceil => e.ins(format!("cvt.rpi.{t}.{t} {r}, {x}")),
        Round => e.ins(format!("cvt.rni.{t}.{t} {r}, {x}")),
        Sign => {
            let (pg, pl) = (e.reg(Class::Pred), e.reg(Class::Pred));
            let (one, m1) = if cls == Class::F64 {
                ("0d3FF0000000000000", "0dBFF0000000000000")
            } else {
                ("0f3F800000", "0fBF800000")
            };
            e.ins(format!("setp.gt.{t} {pg}, {x}, 0.0"));
            e.ins(format!("setp.lt.{t} {pl}, {x}, 0.0"));
            e.ins(format!("selp.{t} {r}, {one}, {x}, {pg}"));
            e.ins(format!("selp.{t} {r}, {m1}, {r}, {pl}"));
        }
        Not => return Err(format!("not on {dt}")),
        Exp | Log | Sin | Cos | Tanh | Erf => return Err(unexpanded(op.name())),
    }
    e.normalize(dt, &r);
    Ok(r)
}

/// `a op b` for operands of `dt` (comparisons give bool).
fn binary(e: &mut Emitter, op: BinaryOp, dt: DType, a: &str, b: &str) -> GenResult<String> {
    use BinaryOp::*;
    let cls = class_of(dt);
    if op.is_comparison() {
        let t = if dt == DType::Bool { "u32" } else { arith(dt) };
        let cmp = match op {
            Eq => "eq",
            Ne if dt.is_float() => "neu",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            _ => "ge",
        };
        let p = e.reg(Class::Pred);
        e.ins(format!("setp.{cmp}.{t} {p}, {a}, {b}"));
        return Ok(e.bool_of(&p));
    }
    let r = e.reg(cls);
    let bits = if cls == Class::R64 || cls == Class::F64 { 64 } else { 32 };
    if op.is_logical() {
        if dt.is_float() {
            return Err(format!("{} on {dt}", op.name()));
        }
        let o = match op {
            And => "and",
            Or => "or",
            _ => "xor",
        };
        e.ins(format!("{o}.b{bits} {r}, {a}, {b}"));
        return Ok(r);
    }
    if dt == DType::Bool {
        return Err(format!("{} on bool", op.name()));
    }
    let t = arith(dt);
    if dt.is_float() {
        match op {
            Add => e.ins(format!("add.rn.{t} {r}, {a}, {b}")),
            Sub => e.ins(format!("sub.rn.{t} {r}, {a}, {b}")),
            Mul => e.ins(format!("mul.rn.{t} {r}, {a}, {b}")),
            Div => e.ins(format!("div.rn.{t} {r}, {a}, {b}")),
            Max | Min => {
                let m = if op == Max { "max" } else { "min" };
                if cls == Class::F32 {
                    e.ins(format!("{m}.NaN.f32 {r}, {a}, {b}"));
                } else {
                    // No `.NaN` form for f64: propagate NaN by hand.
                    let p = e.reg(Class::Pred);
                    e.ins(format!("{m}.f64 {r}, {a}, {b}"));
                    e.ins(format!("setp.nan.f64 {p}, {a}, {b}"));
                    let s = e.reg(cls);
                    e.ins(format!("add.rn.f64 {s}, {a}, {b}"));
                    e.ins(format!("selp.f64 {r}, {s}, {r}, {p}"));
                }
            }
            Rem | Pow => return Err(unexpanded(op.name())),
            _ => unreachable!("logical and comparison ops handled above"),
        }
        e.normalize(dt, &r);
        return Ok(r);
    }
    if let (Div | Rem | Pow, Some(err)) = (op, e.err.clone()) {
        let (p, one) = (e.reg(Class::Pred), e.reg(Class::R32));
        let c = if op == Pow { "lt" } else { "eq" };
        e.ins(format!("setp.{c}.{t} {p}, {b}, 0"));
        e.ins(format!("mov.b32 {one}, 1"));
        e.ins(format!("@{p} st.global.b32 [{err}], {one}"));
    }
    match op {
        Add => e.ins(format!("add.{t} {r}, {a}, {b}")),
        Sub => e.ins(format!("sub.{t} {r}, {a}, {b}")),
        Mul => e.ins(format!("mul.lo.{t} {r}, {a}, {b}")),
        Div => e.ins(format!("div.{t} {r}, {a}, {b}")),
        Max => e.ins(format!("max.{t} {r}, {a}, {b}")),
        Min => e.ins(format!("min.{t} {r}, {a}, {b}")),
        Rem => {
            // numpy: the remainder takes the divisor's sign.
            e.ins(format!("rem.{t} {r}, {a}, {b}"));
            let (p, q, s) = (e.reg(Class::Pred), e.reg(Class::Pred), e.reg(cls));
            e.ins(format!("setp.lt.{t} {p}, {r}, 0"));
            e.ins(format!("setp.lt.{t} {q}, {b}, 0"));
            e.ins(format!("xor.pred {p}, {p}, {q}"));
            e.ins(format!("setp.ne.and.{t} {p}, {r}, 0, {p}"));
            e.ins(format!("add.{t} {s}, {r}, {b}"));
            e.ins(format!("selp.b{bits} {r}, {s}, {r}, {p}"));
        }
        Pow => int_pow(e, cls, &r, a, b),
        _ => unreachable!("logical and comparison ops handled above"),
    }
    e.normalize(dt, &r);
    Ok(r)
}

/// The error for an op `oar_passes::legalize` expands before code generation.
fn unexpanded(op: &str) -> String {
    format!("`{op}` reaches code generation unexpanded (oar_passes::legalize expands it)")
}

/// Integer power by squaring (wrapping; the exponent is ≥ 0 as the graph requires).
fn int_pow(e: &mut Emitter, cls: Class, r: &str, a: &str, b: &str) {
    let t = if cls == Class::R64 { "s64" } else { "s32" };
    let w = if cls == Class::R64 { "b64" } else { "b32" };
    let (base, exp, bit) = (e.reg(cls), e.reg(cls), e.reg(cls));
    let (p, done) = (e.reg(Class::Pred), e.reg(Class::Pred));
    let (top, end) = (e.label("pow"), e.label("pow_end"));
    e.ins(format!("mov.{w} {r}, 1"));
    e.ins(format!("mov.{w} {base}, {a}"));
    e.ins(format!("mov.{w} {exp}, {b}"));
    e.put_label(&top);
    e.ins(format!("setp.le.{t} {done}, {exp}, 0"));
    e.ins(format!("@{done} bra {end}"));
    e.ins(format!("and.{w} {bit}, {exp}, 1"));
    e.ins(format!("setp.ne.{t} {p}, {bit}, 0"));
    e.ins(format!("mul.lo.{t} {bit}, {r}, {base}"));
    e.ins(format!("selp.{w} {r}, {bit}, {r}, {p}"));
    e.ins(format!("mul.lo.{t} {base}, {base}, {base}"));
    e.ins(format!("shr.{t} {exp}, {exp}, 1"));
    e.ins(format!("bra {top}"));
    e.put_label(&end);
}

/// Convert value register `x` of `from` into a new register of `to` (reference semantics:
/// float → int truncates and saturates, NaN → 0; anything → bool is `!= 0`).
pub fn cast(e: &mut Emitter, from: DType, to: DType, x: &str) -> GenResult<String> {
    let (fc, tc) = (class_of(from), class_of(to));
    let r = e.reg(tc);
    if to == DType::Bool {
        let p = e.reg(Class::Pred);
        match fc {
            Class::F32 => e.ins(format!("setp.neu.f32 {p}, {x}, 0.0")),
            Class::F64 => e.ins(format!("setp.neu.f64 {p}, {x}, 0.0")),
            Class::R64 => e.ins(format!("setp.ne.b64 {p}, {x}, 0")),
            _ => e.ins(format!("setp.ne.b32 {p}, {x}, 0")),
        }
        e.ins(format!("selp.b32 {r}, 1, 0, {p}"));
        return Ok(r);
    }
    let src_ty = match (fc, from) {
        (_, DType::Bool) => "u32",
        (Class::F32, _) => "f32",
        (Class::F64, _) => "f64",
        (Class::R64, _) => "s64",
        _ => "s32",
    };
    match (fc, tc) {
        (Class::F32, Class::F32) => e.ins(format!("mov.f32 {r}, {x}")),
        (Class::F64, Class::F64) => e.ins(format!("mov.f64 {r}, {x}")),
        (Class::R32, Class::R32) => e.ins(format!("mov.b32 {r}, {x}")),
        (Class::R64, Class::R64) => e.ins(format!("mov.b64 {r}, {x}")),
        (Class::F32, Class::F64) => e.ins(format!("cvt.f64.f32 {r}, {x}")),
        (Class::F64, Class::F32) => e.ins(format!("cvt.rn.f32.f64 {r}, {x}")),
        (Class::R32 | Class::R64, Class::F32 | Class::F64) => {
            let d = if tc == Class::F32 { "f32" } else { "f64" };
            e.ins(format!("cvt.rn.{d}.{src_ty} {r}, {x}"));
        }
        (Class::F32 | Class::F64, Class::R32) => {
            e.ins(format!("cvt.rzi.s32.{src_ty} {r}, {x}"));
            let (lo, hi) = match to {
                DType::I8 => (Some(-128), Some(127)),
                DType::U8 => (Some(0), Some(255)),
                _ => (None, None),
            };
            if let (Some(lo), Some(hi)) = (lo, hi) {
                e.ins(format!("max.s32 {r}, {r}, {lo}"));
                e.ins(format!("min.s32 {r}, {r}, {hi}"));
            }
        }
        (Class::F32 | Class::F64, Class::R64) => e.ins(format!("cvt.rzi.s64.{src_ty} {r}, {x}")),
        (Class::R32, Class::R64) => e.ins(format!("cvt.s64.{src_ty} {r}, {x}")),
        (Class::R64, Class::R32) => e.ins(format!("cvt.u32.u64 {r}, {x}")),
        _ => return Err(format!("cast {from} -> {to}")),
    }
    e.normalize(to, &r);
    Ok(r)
}

/// Whether a body has an integer op that can fail (`div`/`rem` by zero, `pow` with a negative
/// exponent), so its entry needs an error word.
pub fn may_fail(body: &[Inst]) -> bool {
    body.iter().any(|i| match i.op {
        ScalarOp::Binary(BinaryOp::Div | BinaryOp::Rem | BinaryOp::Pow, a, _) => {
            body.get(a).is_some_and(|x| x.dtype.is_int())
        }
        _ => false,
    })
}
