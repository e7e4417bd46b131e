//! MLIR text generation: one `func.func @oar_k<N>` per loop or contraction kernel of a
//! [`KernelProgram`], all in one `module`.
//!
//! Each function takes the buffers the kernel touches as flat, static, row-major
//! `memref<NxT>` arguments (bool as `i8`), in ascending buffer order, and returns an `i32` error
//! word ([`ERR_DIV_ZERO`], [`ERR_NEG_POW`], [`ERR_EMPTY`]; 0 = ok). Loops are `scf.for`
//! nests; reductions and contractions carry their accumulator in `iter_args`; scalar bodies
//! use `arith` and `math`. Float instructions are computed in `f64` and rounded
//! (`arith.truncf`) to the instruction's dtype, integers in their own width (wrapping), as the
//! reference interpreter does; reductions and contractions accumulate in `f64` / `i64`.
//! Opaque iota, pad, concat, gather and argmax/argmin are generated too ([`opaque`]); other
//! opaque kernels get no function: the runtime delegates them to the reference interpreter.

mod opaque;
mod scalar;

use oar_ir::kernel::{
    BufferId, Contraction, ContractionKernel, IndexMap, KernelBody, KernelProgram, LoopKernel, Reduction,
};
use oar_ir::ops::ReduceOp;
use oar_ir::{DType, Dim};
use std::fmt::Write;

use oar_ir::ops::Conv;
pub use scalar::{mlir_type, storage_type};

/// Error bit: integer division or remainder by zero.
pub const ERR_DIV_ZERO: i32 = 1;
/// Error bit: integer `pow` with a negative exponent.
pub const ERR_NEG_POW: i32 = 2;
/// Error bit: `reduce_max` / `reduce_min` / `argmax` / `argmin` over an empty axis.
pub const ERR_EMPTY: i32 = 4;
/// Error bit: a `gather` index out of range.
pub const ERR_INDEX: i32 = 8;

/// Why a kernel has no generated function.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    /// An opaque kernel: delegated to the reference interpreter at run time.
    #[error("opaque op `{0}` (run on the reference interpreter)")]
    Opaque(String),
    /// Something this generator does not express (a symbolic dim, an op on a dtype).
    #[error("{0}")]
    Unsupported(String),
}

type R<T> = Result<T, CodegenError>;

pub(crate) fn unsupported<T>(msg: impl Into<String>) -> R<T> {
    Err(CodegenError::Unsupported(msg.into()))
}

/// One generated function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFn {
    /// The `func.func` symbol (`oar_k3`).
    pub symbol: String,
    /// Its memref arguments, in order.
    pub params: Vec<BufferId>,
}

/// The MLIR module of a program and, per kernel, its function or why it has none.
#[derive(Clone, Debug)]
pub struct MlirModule {
    /// The whole module, MLIR text (before any lowering).
    pub text: String,
    /// One entry per kernel of the program.
    pub kernels: Vec<Result<KernelFn, CodegenError>>,
}

/// Where the generated functions run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Host functions (`scf.for` nests), JIT-compiled for the CPU.
    Cpu,
    /// Each function wraps its kernel in one `gpu.launch`: one GPU thread per point of the
    /// parallel loops (every output loop; the outer loops of a reduction kernel), the rest of
    /// the kernel (reduction and contraction loops) serial in the thread. The error word is
    /// an extra `memref<1xi32>` argument, OR-ed atomically.
    Gpu,
}

/// Threads per block of the GPU target.
pub const GPU_BLOCK: i64 = 256;

/// Generate the MLIR module for `p` (shapes must be static) for the host.
pub fn generate(p: &KernelProgram) -> MlirModule {
    generate_for(p, Target::Cpu)
}

/// Generate the MLIR module for `p` for `target`.
/// Kernel bodies are legalized first (`oar_passes::legalize`, nothing native: the module
/// uses only `arith` and the rounding ops of `math`, so it needs no math library).
pub fn generate_for(p: &KernelProgram, target: Target) -> MlirModule {
    let mut legal = p.clone();
    oar_passes::legalize::legalize(&mut legal, &oar_passes::legalize::Natives::none());
    let p = &legal;
    let attrs = if target == Target::Gpu {
        " attributes {gpu.container_module}"
    } else {
        ""
    };
    let mut text = format!("// oar program `{}`\nmodule{attrs} {{\n", p.name);
    let mut kernels = Vec::new();
    for ki in 0..p.kernels.len() {
        match emit_kernel(p, ki, target) {
            Ok((src, f)) => {
                text.push_str(&src);
                kernels.push(Ok(f));
            }
            Err(e) => {
                let _ = writeln!(text, "  // kernel {ki} `{}`: {e}", p.kernels[ki].name);
                kernels.push(Err(e));
            }
        }
    }
    text.push_str("}\n");
    MlirModule { text, kernels }
}

pub(crate) fn static_dims(dims: &[Dim]) -> R<Vec<i64>> {
    dims.iter()
        .map(|d| {
            d.as_static()
                .map(|n| n as i64)
                .ok_or_else(|| CodegenError::Unsupported(format!("symbolic dim {d}")))
        })
        .collect()
}

/// The memref type of buffer `id`: flat, static.
pub fn memref_type(p: &KernelProgram, id: BufferId) -> R<String> {
    let b = p.buffer(id);
    let n: i64 = static_dims(b.ty.shape.dims())?.iter().product();
    Ok(format!("memref<{n}x{}>", storage_type(b.ty.dtype)))
}

/// Function-body builder: fresh SSA names, indentation, the error word.
pub(crate) struct Func<'p> {
    pub p: &'p KernelProgram,
    pub out: String,
    next: usize,
    depth: usize,
    /// The `memref<i32>` holding the error word.
    pub err: String,
    target: Target,
}

impl<'p> Func<'p> {
    fn new(p: &'p KernelProgram, target: Target) -> Self {
        Func {
            p,
            out: String::new(),
            next: 0,
            depth: 2,
            err: "%err".into(),
            target,
        }
    }

    /// Declare the error word (a zero `memref<i32>` on the stack / in the thread).
    fn declare_err(&mut self) {
        let z = self.def("arith.constant 0 : i32");
        let err = self.err.clone();
        self.line(&format!("{err} = memref.alloca() : memref<i32>"));
        self.line(&format!("memref.store {z}, {err}[] : memref<i32>"));
    }

    /// Open the parallel loops over `extents`: `scf.for` on the CPU; on the GPU a
    /// `gpu.launch` with one thread per point (guarded), the point delinearized row-major.
    pub fn open_parallel(&mut self, extents: &[i64]) -> Vec<String> {
        if self.target == Target::Cpu {
            return self.open_loops(extents);
        }
        let total: i64 = extents.iter().product();
        let (one, bs) = (self.index(1), self.index(GPU_BLOCK));
        let grid = self.index(((total + GPU_BLOCK - 1) / GPU_BLOCK).max(1));
        let [bx, by, bz, gx, gy, gz, tx, ty, tz, sx, sy, sz] = std::array::from_fn(|_| self.fresh());
        self.line(&format!(
            "gpu.launch blocks({bx}, {by}, {bz}) in ({gx} = {grid}, {gy} = {one}, {gz} = {one}) \
             threads({tx}, {ty}, {tz}) in ({sx} = {bs}, {sy} = {one}, {sz} = {one}) {{"
        ));
        self.depth += 1;
        // The block size through the region's `{sx}` (not the constant `bs` defined outside):
        // a value from above would be captured as an extra, non-pointer kernel parameter.
        let base = self.def(&format!("arith.muli {bx}, {sx} : index"));
        let id = self.def(&format!("arith.addi {base}, {tx} : index"));
        let n = self.index(total);
        let ok = self.def(&format!("arith.cmpi ult, {id}, {n} : index"));
        self.line(&format!("scf.if {ok} {{"));
        self.depth += 1;
        self.declare_err();
        let mut vars = vec![String::new(); extents.len()];
        let mut rest = id;
        for (a, &e) in extents.iter().enumerate().rev() {
            let ec = self.index(e);
            vars[a] = self.def(&format!("arith.remui {rest}, {ec} : index"));
            rest = self.def(&format!("arith.divui {rest}, {ec} : index"));
        }
        vars
    }

    /// Close what [`Func::open_parallel`] opened over `n` loops.
    pub fn close_parallel(&mut self, n: usize) {
        if self.target == Target::Cpu {
            return self.close_loops(n);
        }
        let err = self.err.clone();
        let e = self.def(&format!("memref.load {err}[] : memref<i32>"));
        let z = self.index(0);
        self.def(&format!(
            "memref.atomic_rmw ori {e}, %errw[{z}] : (i32, memref<1xi32>) -> i32"
        ));
        self.depth -= 1;
        self.line("}");
        self.line("gpu.terminator");
        self.depth -= 1;
        self.line("}");
    }

    /// A fresh SSA name.
    pub fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%v{}", self.next)
    }

    /// Emit one line at the current depth.
    pub fn line(&mut self, s: &str) {
        let _ = writeln!(self.out, "{}{s}", "  ".repeat(self.depth));
    }

    /// `%x = <rhs>`; returns `%x`.
    pub fn def(&mut self, rhs: &str) -> String {
        let v = self.fresh();
        self.line(&format!("{v} = {rhs}"));
        v
    }

    /// An `index` constant.
    pub fn index(&mut self, c: i64) -> String {
        self.def(&format!("arith.constant {c} : index"))
    }

    /// OR `bits` (an `i1`) into the error word as `code`.
    pub fn raise_if(&mut self, bit: &str, code: i32) {
        let (c, z) = (
            self.def(&format!("arith.constant {code} : i32")),
            self.def("arith.constant 0 : i32"),
        );
        let e = self.def(&format!("arith.select {bit}, {c}, {z} : i32"));
        let old = self.def(&format!("memref.load {}[] : memref<i32>", self.err));
        let new = self.def(&format!("arith.ori {old}, {e} : i32"));
        let err = self.err.clone();
        self.line(&format!("memref.store {new}, {err}[] : memref<i32>"));
    }

    /// Open `scf.for` loops over `extents` (no iter_args); returns the induction variables.
    pub fn open_loops(&mut self, extents: &[i64]) -> Vec<String> {
        let mut vars = Vec::new();
        for &n in extents {
            let (lo, hi, one) = (self.index(0), self.index(n), self.index(1));
            let i = self.fresh();
            self.line(&format!("scf.for {i} = {lo} to {hi} step {one} {{"));
            self.depth += 1;
            vars.push(i);
        }
        vars
    }

    /// Close `n` loops opened by [`Func::open_loops`].
    pub fn close_loops(&mut self, n: usize) {
        for _ in 0..n {
            self.depth -= 1;
            self.line("}");
        }
    }

    /// Open a loop carrying one value `init : ty`; returns (induction var, carried value).
    pub fn open_carry(&mut self, n: i64, init: &str, ty: &str) -> (String, String, String) {
        let (lo, hi, one) = (self.index(0), self.index(n), self.index(1));
        let (res, i, a) = (self.fresh(), self.fresh(), self.fresh());
        self.line(&format!(
            "{res} = scf.for {i} = {lo} to {hi} step {one} iter_args({a} = {init}) -> ({ty}) {{"
        ));
        self.depth += 1;
        (res, i, a)
    }

    /// Yield `v : ty` and close a carrying loop.
    pub fn close_carry(&mut self, v: &str, ty: &str) {
        self.line(&format!("scf.yield {v} : {ty}"));
        self.depth -= 1;
        self.line("}");
    }

    /// The flat element index (an `index` value) of `map` at loop values `vars`.
    pub fn flat_index(&mut self, map: &IndexMap, vars: &[String]) -> R<String> {
        let view = static_dims(&map.view)?;
        let (mut stride, mut offset, mut coef) = (1i64, 0i64, vec![0i64; vars.len()]);
        for (a, e) in map.axes.iter().enumerate().rev() {
            offset += stride * e.offset;
            for &(l, c) in &e.terms {
                *coef
                    .get_mut(l)
                    .ok_or_else(|| CodegenError::Unsupported(format!("index map names loop {l}")))? += stride * c;
            }
            stride *= view.get(a).copied().unwrap_or(1);
        }
        let mut acc = self.index(offset);
        for (v, c) in vars.iter().zip(coef) {
            if c == 0 {
                continue;
            }
            let term = if c == 1 {
                v.clone()
            } else {
                let c = self.index(c);
                self.def(&format!("arith.muli {v}, {c} : index"))
            };
            acc = self.def(&format!("arith.addi {acc}, {term} : index"));
        }
        Ok(acc)
    }

    /// Load element `idx` of buffer `b` as a scalar of its dtype (bool as `i1`).
    pub fn load_at(&mut self, b: BufferId, idx: &str) -> R<String> {
        let (dt, mty) = (self.p.buffer(b).ty.dtype, memref_type(self.p, b)?);
        let v = self.def(&format!("memref.load %b{}[{idx}] : {mty}", b.0));
        if dt == DType::Bool {
            let z = self.def("arith.constant 0 : i8");
            return Ok(self.def(&format!("arith.cmpi ne, {v}, {z} : i8")));
        }
        Ok(v)
    }

    /// Store scalar `v` (of the buffer's dtype; bool as `i1`) at element `idx` of `b`.
    pub fn store_at(&mut self, b: BufferId, idx: &str, v: &str) -> R<()> {
        let (dt, mty) = (self.p.buffer(b).ty.dtype, memref_type(self.p, b)?);
        let v = if dt == DType::Bool {
            self.def(&format!("arith.extui {v} : i1 to i8"))
        } else {
            v.to_string()
        };
        self.line(&format!("memref.store {v}, %b{}[{idx}] : {mty}", b.0));
        Ok(())
    }
}

/// A body being evaluated: its loads and loop variables, and the accumulators it may read.
pub(crate) struct Scope<'a> {
    pub loads: &'a [oar_ir::kernel::Load],
    pub vars: &'a [String],
    /// `(value, dtype)` of each reduction stage / the contraction result.
    pub accs: &'a [(String, DType)],
}

fn emit_kernel(p: &KernelProgram, ki: usize, target: Target) -> R<(String, KernelFn)> {
    let k = &p.kernels[ki];
    if let KernelBody::Opaque(o) = &k.body
        && !opaque::generated(&o.op)
    {
        return Err(CodegenError::Opaque(o.op.name().to_string()));
    }
    let out = match k.outputs.as_slice() {
        [b] => *b,
        _ => return unsupported("a loop or contraction kernel writes exactly one buffer"),
    };
    let mut params: Vec<BufferId> = k.reads();
    params.push(out);
    params.sort();
    params.dedup();
    let symbol = format!("oar_k{ki}");
    let mut f = Func::new(p, target);
    if target == Target::Cpu {
        f.declare_err();
    }
    match &k.body {
        KernelBody::Loop(l) => emit_loop(&mut f, l, out)?,
        KernelBody::Contraction(c) => emit_contraction(&mut f, c, out)?,
        KernelBody::Opaque(o) => opaque::emit(&mut f, o, out)?,
    }
    let mut args = params
        .iter()
        .map(|b| Ok(format!("%b{}: {}", b.0, memref_type(p, *b)?)))
        .collect::<R<Vec<_>>>()?;
    let sig = if target == Target::Cpu {
        let err = f.err.clone();
        let e = f.def(&format!("memref.load {err}[] : memref<i32>"));
        f.line(&format!("func.return {e} : i32"));
        "-> i32 attributes {llvm.emit_c_interface}"
    } else {
        f.line("func.return");
        args.push("%errw: memref<1xi32>".into());
        ""
    };
    let src = format!(
        "  // kernel {ki} `{}`\n  func.func @{symbol}({}) {sig} {{\n{}  }}\n",
        k.name,
        args.join(", "),
        f.out
    );
    Ok((src, KernelFn { symbol, params }))
}

/// Store the epilogue value at output point `vars` of `out`.
fn store_output(f: &mut Func, out: BufferId, vars: &[String], v: &str) -> R<()> {
    let map = IndexMap::identity(f.p.buffer(out).ty.shape.dims());
    let idx = f.flat_index(&map, vars)?;
    f.store_at(out, &idx, v)
}

/// A loop kernel ("row kernel"): loops `0..outer` enclose every stage; each reduction stage
/// runs its own loops (numbered `outer..outer+dims.len()`, reading earlier stages as
/// `Acc(t)`), then the epilogue runs over loops `outer..rank` and may read every stage.
fn emit_loop(f: &mut Func, l: &LoopKernel, out: BufferId) -> R<()> {
    let shape = static_dims(&l.shape)?;
    let stages: Vec<&Reduction> = l.reduce.iter().collect();
    // Without stages every loop is parallel (on the GPU: one thread per output point).
    let outer = if stages.is_empty() { shape.len() } else { l.outer };
    if outer > shape.len() {
        return unsupported(format!("outer {outer} > rank {}", shape.len()));
    }
    let outer_vars = f.open_parallel(&shape[..outer]);
    let mut accs: Vec<(String, DType)> = Vec::new();
    for red in &stages {
        let acc = emit_reduction(f, red, l, &outer_vars, &accs)?;
        accs.push(acc);
    }
    let inner_vars = f.open_loops(&shape[outer..]);
    let vars: Vec<String> = outer_vars.iter().chain(&inner_vars).cloned().collect();
    let scope = Scope {
        loads: &l.loads,
        vars: &vars,
        accs: &accs,
    };
    let v = scalar::body(f, &l.body, &scope)?;
    store_output(f, out, &vars, &v)?;
    f.close_loops(shape.len() - outer);
    f.close_parallel(outer);
    Ok(())
}

/// The `f64` / integer accumulator type and initial value of a reduction in dtype `d`.
fn reduce_init(f: &mut Func, op: ReduceOp, d: DType) -> R<(String, String)> {
    let c = op.identity(d);
    if d.is_float() {
        return Ok((
            f.def(&format!("arith.constant {:#018X} : f64", c.to_bits())),
            "f64".into(),
        ));
    }
    if op == ReduceOp::Mean || d == DType::Bool {
        return unsupported(format!("reduce_{} on {d}", op.name()));
    }
    let ty = mlir_type(d);
    let c = scalar::int_literal(d, c as i64);
    Ok((f.def(&format!("arith.constant {c} : {ty}")), ty.to_string()))
}

/// One reduction stage at the current outer point; returns its result in the stage dtype.
fn emit_reduction(
    f: &mut Func,
    red: &Reduction,
    l: &LoopKernel,
    outer_vars: &[String],
    accs: &[(String, DType)],
) -> R<(String, DType)> {
    let dims = static_dims(&red.dims)?;
    let d = red
        .body
        .last()
        .ok_or_else(|| CodegenError::Unsupported("empty reduction body".into()))?
        .dtype;
    if d == DType::Bool {
        return unsupported(format!("{} on bool", red.op.name()));
    }
    let count: i64 = dims.iter().product();
    if count == 0 && matches!(red.op, ReduceOp::Max | ReduceOp::Min) {
        // No identity: the reference reports an error; so does the generated code.
        let t = f.def("arith.constant true");
        f.raise_if(&t, ERR_EMPTY);
    }
    let (init, aty) = reduce_init(f, red.op, d)?;
    let mut results = Vec::new();
    let mut vars = outer_vars.to_vec();
    let mut carried = init;
    for &n in &dims {
        let (res, i, a) = f.open_carry(n, &carried, &aty);
        results.push(res);
        vars.push(i);
        carried = a;
    }
    let scope = Scope {
        loads: &l.loads,
        vars: &vars,
        accs,
    };
    let v = scalar::body(f, &red.body, &scope)?;
    let v = if d.is_float() { scalar::to_f64(f, &v, d) } else { v };
    let next = scalar::combine(f, red.op, d, &carried, &v)?;
    let mut inner = next;
    for res in results.iter().rev() {
        f.close_carry(&inner, &aty);
        inner = res.clone();
    }
    let total = inner; // the outermost loop's result, or the one combined value without loops
    let total = if red.op == ReduceOp::Mean {
        let n = f.def(&format!("arith.constant {:#018X} : f64", (count as f64).to_bits()));
        f.def(&format!("arith.divf {total}, {n} : f64"))
    } else {
        total
    };
    let total = if d.is_float() {
        scalar::from_f64(f, &total, d)
    } else {
        total
    };
    Ok((total, d))
}

fn emit_contraction(f: &mut Func, c: &ContractionKernel, out: BufferId) -> R<()> {
    let shape = static_dims(&c.shape)?;
    let rank = shape.len();
    let (ls, rs) = (static_dims(&c.lhs.shape)?, static_dims(&c.rhs.shape)?);
    let (ld, rd, acc_d) = (
        f.p.buffer(c.lhs.load.buffer).ty.dtype,
        f.p.buffer(c.rhs.load.buffer).ty.dtype,
        c.acc_dtype,
    );
    if acc_d == DType::Bool || ld == DType::Bool || rd == DType::Bool {
        return unsupported("a contraction of bools");
    }
    if c.lhs.round.is_some() || c.rhs.round.is_some() {
        return unsupported("contraction operands rounded as they are read");
    }
    let float = acc_d.is_float();
    let aty = if float { "f64" } else { "i64" };
    let vars = f.open_parallel(&shape);
    let init = f.def(&format!("arith.constant {} : {aty}", if float { "0.0" } else { "0" }));
    // Each operand element widened to the accumulator type.
    let widen = |f: &mut Func, v: &str, d: DType| -> String {
        if float {
            scalar::to_f64(f, v, d)
        } else if d == DType::I64 {
            v.to_string()
        } else {
            let ext = if d == DType::U8 { "arith.extui" } else { "arith.extsi" };
            f.def(&format!("{ext} {v} : {} to i64", mlir_type(d)))
        }
    };
    let (mul, add) = if float {
        ("arith.mulf", "arith.addf")
    } else {
        ("arith.muli", "arith.addi")
    };
    let total = match &c.op {
        Contraction::MatMul => {
            if ls.len() < 2 || rs.len() < 2 || rank < 2 {
                return unsupported("matmul operands of rank < 2");
            }
            let kk = ls[ls.len() - 1];
            let (res, k, a) = f.open_carry(kk, &init, aty);
            let zero = f.index(0);
            let batch = |sh: &[i64]| -> Vec<String> {
                (0..sh.len() - 2)
                    .map(|j| {
                        if sh[j] == 1 {
                            zero.clone()
                        } else {
                            vars[rank - sh.len() + j].clone()
                        }
                    })
                    .collect()
            };
            let mut lv = batch(&ls);
            lv.extend([vars[rank - 2].clone(), k.clone()]);
            let mut rv = batch(&rs);
            rv.extend([k.clone(), vars[rank - 1].clone()]);
            let (li, ri) = (f.flat_index(&c.lhs.load.map, &lv)?, f.flat_index(&c.rhs.load.map, &rv)?);
            let (x, w) = (f.load_at(c.lhs.load.buffer, &li)?, f.load_at(c.rhs.load.buffer, &ri)?);
            let (x, w) = (widen(f, &x, ld), widen(f, &w, rd));
            let m = f.def(&format!("{mul} {x}, {w} : {aty}"));
            let s = f.def(&format!("{add} {a}, {m} : {aty}"));
            f.close_carry(&s, aty);
            res
        }
        Contraction::Conv(Conv {
            stride,
            pad_before,
            dilation,
            groups,
            ..
        }) => {
            let sp = rs.len().saturating_sub(2);
            if ls.len() != rs.len() || rank != rs.len() || rs.len() < 2 || *groups == 0 {
                return unsupported("conv operand ranks");
            }
            let (cg, og) = (rs[1], rs[0] / *groups as i64);
            let ogc = f.index(og.max(1));
            let g = f.def(&format!("arith.divui {}, {ogc} : index", vars[1]));
            let cgc = f.index(cg);
            let gbase = f.def(&format!("arith.muli {g}, {cgc} : index"));
            let (res, ci, a0) = f.open_carry(cg, &init, aty);
            let chan = f.def(&format!("arith.addi {gbase}, {ci} : index"));
            let mut lv = vec![vars[0].clone(), chan];
            let mut rv = vec![vars[1].clone(), ci.clone()];
            let mut ress = vec![res.clone()];
            let mut carried = a0;
            let mut inb: Option<String> = None;
            for d in 0..sp {
                let (r, kd, a) = f.open_carry(rs[d + 2], &carried, aty);
                ress.push(r);
                carried = a;
                let (st, pb, dl) = (
                    f.index(stride[d] as i64),
                    f.index(pad_before[d] as i64),
                    f.index(dilation[d] as i64),
                );
                let t = f.def(&format!("arith.muli {}, {st} : index", vars[d + 2]));
                let t = f.def(&format!("arith.subi {t}, {pb} : index"));
                let kdl = f.def(&format!("arith.muli {kd}, {dl} : index"));
                let s = f.def(&format!("arith.addi {t}, {kdl} : index"));
                let (zero, n) = (f.index(0), f.index(ls[d + 2]));
                let ge = f.def(&format!("arith.cmpi sge, {s}, {zero} : index"));
                let lt = f.def(&format!("arith.cmpi slt, {s}, {n} : index"));
                let ok = f.def(&format!("arith.andi {ge}, {lt} : i1"));
                inb = Some(match inb {
                    Some(prev) => f.def(&format!("arith.andi {prev}, {ok} : i1")),
                    None => ok,
                });
                lv.push(s);
                rv.push(kd);
            }
            let a = carried.clone();
            let step = match &inb {
                Some(cond) => {
                    let r = f.def(&format!("scf.if {cond} -> ({aty}) {{"));
                    f.depth += 1;
                    let s = conv_step(f, c, &lv, &rv, &a, (ld, rd), &widen, (mul, add, aty))?;
                    f.line(&format!("scf.yield {s} : {aty}"));
                    f.depth -= 1;
                    f.line("} else {");
                    f.depth += 1;
                    f.line(&format!("scf.yield {a} : {aty}"));
                    f.depth -= 1;
                    f.line("}");
                    r
                }
                None => conv_step(f, c, &lv, &rv, &a, (ld, rd), &widen, (mul, add, aty))?,
            };
            let mut inner = step;
            for r in ress.iter().rev() {
                f.close_carry(&inner, aty);
                inner = r.clone();
            }
            inner
        }
    };
    let acc = if float {
        scalar::from_f64(f, &total, acc_d)
    } else if acc_d == DType::I64 {
        total
    } else {
        f.def(&format!("arith.trunci {total} : i64 to {}", mlir_type(acc_d)))
    };
    let accs = [(acc, acc_d)];
    let scope = Scope {
        loads: &c.loads,
        vars: &vars,
        accs: &accs,
    };
    let v = scalar::body(f, &c.epilogue, &scope)?;
    store_output(f, out, &vars, &v)?;
    f.close_parallel(rank);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn conv_step(
    f: &mut Func,
    c: &ContractionKernel,
    lv: &[String],
    rv: &[String],
    a: &str,
    (ld, rd): (DType, DType),
    widen: &dyn Fn(&mut Func, &str, DType) -> String,
    (mul, add, aty): (&str, &str, &str),
) -> R<String> {
    let (li, ri) = (f.flat_index(&c.lhs.load.map, lv)?, f.flat_index(&c.rhs.load.map, rv)?);
    let (x, w) = (f.load_at(c.lhs.load.buffer, &li)?, f.load_at(c.rhs.load.buffer, &ri)?);
    let (x, w) = (widen(f, &x, ld), widen(f, &w, rd));
    let m = f.def(&format!("{mul} {x}, {w} : {aty}"));
    Ok(f.def(&format!("{add} {a}, {m} : {aty}")))
}
