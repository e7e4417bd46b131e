//! How a loop kernel becomes a loop nest: validation, one affine element offset per access,
//! loop collapsing, the outer (parallel) loop, vectorization and hoisting levels.
//!
//! Everything here is decided from the kernel alone, so [`super::analyze`] and
//! [`super::define_function`] always agree.

use oar_ir::DType;
use oar_ir::kernel::{Buffer, BufferId, Inst, LoopKernel, ScalarOp};
use oar_ir::ops::{BinaryOp, ReduceOp, UnaryOp};

/// Outer extents below this get the vector loop split into blocks (so the runtime can share
/// the work across threads).
const MIN_OUTER: u64 = 64;
/// Least work (scalar operations) of one block.
const MIN_BLOCK_WORK: u64 = 8192;

/// One buffer access: a load of the kernel or the output store.
#[derive(Clone, Debug)]
pub(super) struct Access {
    /// The buffer.
    pub buffer: BufferId,
    /// The type of the values the body reads or writes through it.
    pub dtype: DType,
    /// Its element type in memory: `dtype`, or bf16 for an f32 value stored as bf16 (loads
    /// widen exactly; stores keep the high half of the value's bits, which `widen_half` has
    /// already rounded to a bf16 value).
    pub storage: DType,
    /// Constant part of the element offset.
    pub c0: i64,
}

/// One loop of the nest: its extent and, per access (loads then the output), the element
/// stride along it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Lp {
    pub n: u64,
    pub coef: Vec<i64>,
}

/// The loop structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// No reduction: outer loops, then the (vector) loop over the last output axis.
    Elementwise,
    /// Reduction, one output element per outer iteration: the reduction loops nest inside,
    /// the innermost one vectorized when its loads are contiguous.
    ReduceInner,
    /// Reduction vectorized across the last output axis: outer loops, the vector loop over the
    /// last output axis, then the reduction loops inside it, one accumulator per lane.
    ReduceOuter,
}

/// What the reduction computes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Red {
    pub op: ReduceOp,
    /// The reduction body's result (and the reduction's) dtype.
    pub dtype: DType,
    /// Number of elements reduced per output element.
    pub count: u64,
    /// No element at all (an empty reduction axis): the result is the identity (mean: NaN).
    pub empty: bool,
}

/// A kernel's loop nest, ready to emit.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    /// Loads (in kernel order) then the output.
    pub acc: Vec<Access>,
    /// Loops flattened into the outer index, outermost first (in the reduction modes, the
    /// output loops; otherwise all output loops but the last).
    pub outer: Vec<Lp>,
    /// The last output loop (elementwise and [`Mode::ReduceOuter`]).
    pub vloop: Option<Lp>,
    /// Block size of `vloop` (its extent when not split); the block index is the last
    /// (innermost) component of the outer index.
    pub block: u64,
    /// Number of blocks of `vloop`.
    pub nblocks: u64,
    /// Reduction loops, outermost first (empty without reduction).
    pub red: Vec<Lp>,
    pub mode: Mode,
    /// Lanes of the vector loop (1: scalar code only).
    pub lanes: u8,
    /// Vectors per iteration of the main vector loop.
    pub unroll: u8,
    pub reduce: Option<Red>,
    /// Outer extent (what the runtime splits) and scalar operations per outer iteration.
    pub extent: u64,
    pub cost: u64,
    /// Hoisting level of every instruction of the epilogue / body and of the reduction body
    /// (0: function entry, 1: outer iteration, 2..: inner loops in nesting order).
    pub lvl_body: Vec<usize>,
    pub lvl_red: Vec<usize>,
    /// Level of the vector loop.
    pub vlevel: usize,
}

impl Plan {
    /// Index of the output access.
    pub fn out(&self) -> usize {
        self.acc.len() - 1
    }

    /// Inner loops in nesting order (level `2 + i`).
    pub fn inner(&self) -> Vec<&Lp> {
        match self.mode {
            Mode::Elementwise => self.vloop.iter().collect(),
            Mode::ReduceInner => self.red.iter().collect(),
            Mode::ReduceOuter => self.vloop.iter().chain(self.red.iter()).collect(),
        }
    }

    /// Lanes of values computed at `level` (1 below the vector loop).
    pub fn lanes_at(&self, level: usize) -> u8 {
        let vec = match self.mode {
            Mode::ReduceInner => level == self.vlevel,
            _ => level >= self.vlevel,
        };
        if vec { self.lanes } else { 1 }
    }

    /// The stride of access `a` along the vector loop.
    pub fn vcoef(&self, a: usize) -> i64 {
        match self.mode {
            Mode::ReduceInner => self.red.last().map_or(0, |l| l.coef[a]),
            _ => self.vloop.as_ref().map_or(0, |l| l.coef[a]),
        }
    }
}

fn static_dims(dims: &[oar_ir::Dim], what: &str) -> Result<Vec<u64>, String> {
    dims.iter()
        .map(|d| {
            d.as_static()
                .map(|n| n as u64)
                .ok_or_else(|| format!("{what} has the symbolic dim {d}"))
        })
        .collect()
}

fn supported(dt: DType) -> Result<(), String> {
    match dt {
        DType::F16 | DType::BF16 => Err(format!("{dt} arithmetic is not compiled")),
        _ => Ok(()),
    }
}

/// The value type of a buffer of `dt` elements: bf16 buffers hold f32 values (see
/// [`Access::storage`]); f16 ones are not compiled.
fn value_type(dt: DType) -> Result<DType, String> {
    match dt {
        DType::BF16 => Ok(DType::F32),
        dt => supported(dt).map(|()| dt),
    }
}

/// Check an SSA body: operands defined before use, dtypes as the reference expects, no op the
/// code generator leaves to the interpreter.
fn check_body(body: &[Inst], loads: &[Access], acc: Option<DType>, what: &str) -> Result<(), String> {
    if body.is_empty() {
        return Err(format!("empty {what}"));
    }
    for (i, inst) in body.iter().enumerate() {
        let dt = inst.dtype;
        supported(dt)?;
        let arg = |a: usize| -> Result<DType, String> {
            if a < i {
                Ok(body[a].dtype)
            } else {
                Err(format!("{what} %{i} uses %{a} before it is defined"))
            }
        };
        let bad = |d: &str| Err(format!("{what} %{i}: {d}"));
        match &inst.op {
            ScalarOp::Load(l) => match loads.get(*l) {
                Some(a) if a.dtype == dt => {}
                Some(a) => return bad(&format!("load of a {} buffer as {dt}", a.dtype)),
                None => return bad(&format!("no load l{l}")),
            },
            ScalarOp::Const(_) => {}
            ScalarOp::Acc(n) if *n > 0 => return bad(&format!("acc{n} (reduction stages are split first)")),
            ScalarOp::Acc(_) => match acc {
                Some(a) if a == dt => {}
                Some(a) => return bad(&format!("acc is {a}, not {dt}")),
                None => return bad("acc outside an epilogue"),
            },
            ScalarOp::Unary(op, a) => {
                let at = arg(*a)?;
                if at != dt {
                    return bad("unary op changes the dtype");
                }
                if dt.is_float() && op.is_transcendental() {
                    return bad(&format!(
                        "{} reaches code generation unexpanded (legalize expands it)",
                        op.name()
                    ));
                }
                let ok = if dt.is_float() {
                    *op != UnaryOp::Not
                } else if dt.is_int() {
                    !op.float_only()
                } else {
                    *op == UnaryOp::Not
                };
                if !ok {
                    return bad(&format!("{} is not defined for {dt}", op.name()));
                }
            }
            ScalarOp::Binary(op, a, b) => {
                let (at, bt) = (arg(*a)?, arg(*b)?);
                if at != bt {
                    return bad("operand dtypes differ");
                }
                if op.is_comparison() {
                    if dt != DType::Bool {
                        return bad("a comparison must give bool");
                    }
                } else {
                    if at != dt {
                        return bad("binary op changes the dtype");
                    }
                    if dt.is_float() && matches!(op, BinaryOp::Pow | BinaryOp::Rem) {
                        return bad(&format!(
                            "{} on {dt} reaches code generation unexpanded (legalize expands it)",
                            op.name()
                        ));
                    }
                    let ok = if dt.is_float() {
                        !op.is_logical()
                    } else if dt.is_int() {
                        // Division and power report a zero divisor / negative exponent through
                        // the status word; rem is expanded into division by legalize.
                        *op != BinaryOp::Rem
                    } else {
                        op.is_logical()
                    };
                    if !ok {
                        return bad(&format!("{} on {dt} is left to the interpreter", op.name()));
                    }
                }
            }
            ScalarOp::Where(c, a, b) => {
                if arg(*c)? != DType::Bool || arg(*a)? != dt || arg(*b)? != dt {
                    return bad("where needs a bool condition and operands of its dtype");
                }
            }
            ScalarOp::Cast(a) => {
                arg(*a)?;
            }
            ScalarOp::MulAdd(a, b, c) => {
                if [arg(*a)?, arg(*b)?, arg(*c)?].iter().any(|&t| t != dt) || !matches!(dt, DType::F32 | DType::F64) {
                    return bad("muladd needs three operands of its f32/f64 dtype");
                }
            }
            ScalarOp::Bitcast(a) => {
                let at = arg(*a)?;
                if at.size_bytes() != dt.size_bytes() || at == DType::Bool || dt == DType::Bool {
                    return bad(&format!("bitcast from {at} to {dt}"));
                }
            }
            ScalarOp::ShiftLeft(a, n) | ScalarOp::ShiftRight(a, n) => {
                if arg(*a)? != dt || !dt.is_int() || *n as usize >= 8 * dt.size_bytes() {
                    return bad(&format!("shift of {dt} by {n}"));
                }
            }
        }
    }
    Ok(())
}

/// Which loads an SSA body reads.
fn loads_used(body: &[Inst], n: usize) -> Vec<bool> {
    let mut used = vec![false; n];
    for i in body {
        if let ScalarOp::Load(l) = i.op {
            used[l] = true;
        }
    }
    used
}

/// Which instructions of a body are loop-invariant everywhere: constants, loads of a single
/// element (`uniform_load`), and what is computed from them only. They are hoisted out of every
/// loop and computed once as scalars, so they need not fit the vector lane width.
fn uniform(body: &[Inst], uniform_load: &[bool]) -> Vec<bool> {
    let mut u: Vec<bool> = Vec::with_capacity(body.len());
    for inst in body {
        let v = match &inst.op {
            ScalarOp::Load(l) => uniform_load[*l],
            ScalarOp::Const(_) => true,
            ScalarOp::Acc(_) => false,
            ScalarOp::Unary(_, a)
            | ScalarOp::Cast(a)
            | ScalarOp::Bitcast(a)
            | ScalarOp::ShiftLeft(a, _)
            | ScalarOp::ShiftRight(a, _) => u[*a],
            ScalarOp::Binary(_, a, b) => u[*a] && u[*b],
            ScalarOp::Where(c, a, b) | ScalarOp::MulAdd(c, a, b) => u[*c] && u[*a] && u[*b],
        };
        u.push(v);
    }
    u
}

/// Loads read by the varying (non-[`uniform`]) instructions of a body.
fn varying_loads(body: &[Inst], uni: &[bool], n: usize) -> Vec<bool> {
    let mut used = vec![false; n];
    for (i, inst) in body.iter().enumerate() {
        if let ScalarOp::Load(l) = inst.op
            && !uni[i]
        {
            used[l] = true;
        }
    }
    used
}

/// Whether `dt` is an 8-bit integer: in 4-lane vector code such values are held exactly in
/// 32-bit lanes (see [`vectorizable`]).
pub(super) fn is_narrow(dt: DType) -> bool {
    matches!(dt, DType::I8 | DType::U8)
}

/// Whether the body's varying instructions can run on vectors of `w`-byte lanes (bools as lane
/// masks); `uni` marks the loop-invariant ones, which run once as scalars and are splatted.
///
/// With `narrow` (4-byte lanes, no reduction), i8/u8 values ride in 32-bit lanes holding their
/// exact value: loads widen, stores narrow, and only the operations that are exact on the
/// widened values — loads, constants, casts, `where`, max/min and comparisons — may touch them
/// (8-bit arithmetic wraps, which 32-bit lanes would not). This keeps (de)quantization loops
/// (u8 → f32 → … → u8) vectorized.
fn vectorizable(body: &[Inst], w: usize, uni: &[bool], narrow: bool) -> bool {
    let narrow = narrow && w == 4;
    let width_ok = |dt: DType| dt == DType::Bool || dt.size_bytes() == w || (narrow && is_narrow(dt));
    body.iter().zip(uni).all(|(inst, &u)| {
        if u {
            return true;
        }
        let dt = inst.dtype;
        if !width_ok(dt) {
            return false;
        }
        if is_narrow(dt)
            && !matches!(
                inst.op,
                ScalarOp::Load(_)
                    | ScalarOp::Const(_)
                    | ScalarOp::Cast(_)
                    | ScalarOp::Where(..)
                    | ScalarOp::Binary(BinaryOp::Max | BinaryOp::Min, ..)
            )
        {
            return false;
        }
        match &inst.op {
            ScalarOp::Load(_) => true,
            ScalarOp::Cast(a) => {
                let from = body[*a].dtype;
                // f64 -> i64 has no vector conversion on x64; narrow/wide changes lane counts.
                !(from.is_float() && dt == DType::I64) && width_ok(from)
            }
            // Integer division: no vector instruction on x64, and the zero check is per lane.
            ScalarOp::Binary(BinaryOp::Div | BinaryOp::Pow, a, _) if body[*a].dtype.is_int() => false,
            ScalarOp::Binary(op, a, _) if body[*a].dtype == DType::I64 => {
                // i64x2 multiply/min/max lower to long sequences without AVX-512; keep them scalar.
                !matches!(op, BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min)
            }
            ScalarOp::Unary(UnaryOp::Abs | UnaryOp::Sign, a) => body[*a].dtype != DType::I64,
            ScalarOp::Unary(..)
            | ScalarOp::Bitcast(_)
            | ScalarOp::ShiftLeft(..)
            | ScalarOp::ShiftRight(..)
            | ScalarOp::Binary(..)
            | ScalarOp::Const(_)
            | ScalarOp::Acc(_)
            | ScalarOp::Where(..)
            | ScalarOp::MulAdd(..) => true,
        }
    })
}

/// Scalar-operation cost of one evaluation of a body.
fn body_cost(body: &[Inst]) -> u64 {
    body.iter()
        .map(|i| match &i.op {
            ScalarOp::Const(_) | ScalarOp::Acc(_) => 0,
            ScalarOp::Unary(UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip, _) => 4,
            ScalarOp::Binary(BinaryOp::Div, ..) => 4,
            _ => 1,
        })
        .sum()
}

/// Bodies longer than this run one vector per iteration.
const HEAVY_BODY: usize = 24;

/// How a function's outer index is to be laid out, beyond what the kernel implies (a native
/// kernel's epilogue, applied to the parts of its result it completes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    /// Leading dims that are never merged with the dims after them (0: no such boundary), so
    /// that the outer index runs over whole planes of the trailing dims in order.
    pub planes: usize,
    /// Elements per block of the vector loop at most (0: no limit), rounded down to whole
    /// vector steps.
    pub max_block: u64,
}

/// Plan `k` writing `out`.
pub(super) fn plan(k: &LoopKernel, out: BufferId, buffers: &[Buffer]) -> Result<Plan, String> {
    plan_with(k, out, buffers, Hints::default())
}

/// [`plan`] with `hints`.
pub(super) fn plan_with(k: &LoopKernel, out: BufferId, buffers: &[Buffer], hints: Hints) -> Result<Plan, String> {
    let ob = buffers
        .get(out.index())
        .ok_or_else(|| format!("output {out} is not a buffer of the program"))?;
    let out_value = value_type(ob.ty.dtype)?;
    let shape = static_dims(&k.shape, "the kernel shape")?;
    let oshape = static_dims(ob.ty.shape.dims(), "the output")?;
    if shape != oshape {
        return Err(format!("kernel shape {shape:?} differs from the output's {oshape:?}"));
    }
    if !k.is_plain() {
        return Err(format!(
            "{} reduction stages per {} outer loops (split them with LoopKernel::split_stages)",
            k.reduce.len(),
            k.outer
        ));
    }
    let rank = shape.len();
    let (rdims, red) = reduction(k)?;
    let extents: Vec<u64> = shape.iter().chain(&rdims).copied().collect();
    let (acc, coefs) = accesses(k, out, ob.ty.dtype, buffers, &extents, rank)?;
    let used_body = check_bodies(k, &acc, &coefs, red, out_value, rank)?;
    let numel: u64 = shape.iter().product();
    if numel == 0 {
        return Ok(empty_plan(k, acc, red));
    }
    let (mut outl, redl) = loop_nests(&extents, &coefs, rank, red, hints.planes);
    let (mode, lanes, unroll) = vectorize(k, &acc, &outl, &redl, red, &used_body);
    let (outer, vloop, red_loops) = match mode {
        Mode::ReduceInner => (outl, None, redl),
        _ => {
            let v = outl.pop().expect("at least one output loop");
            (outl, Some(v), redl)
        }
    };
    // Work per element of the vector loop, per reduction point and per output element.
    let cost_red = k.reduce.first().map_or(0, |r| body_cost(&r.body));
    let cost_body = body_cost(&k.body) + 1;
    let red_points: u64 = red_loops
        .iter()
        .map(|l| l.n)
        .product::<u64>()
        .max(red.map_or(0, |r| r.count).min(1));
    let per_elem = match mode {
        Mode::Elementwise => cost_body,
        Mode::ReduceInner => 0,
        Mode::ReduceOuter => red_points * (cost_red + 1) + cost_body,
    };
    let outer_n: u64 = outer.iter().map(|l| l.n).product();
    let step = lanes as u64 * unroll as u64;
    let (mut block, mut nblocks) = blocks(vloop.as_ref(), outer_n, step, per_elem);
    if let Some(v) = vloop.as_ref()
        && hints.max_block > 0
        && block > hints.max_block
    {
        block = (hints.max_block / step).max(1) * step;
        nblocks = v.n.div_ceil(block);
    }
    let cost = match mode {
        Mode::Elementwise => block * cost_body,
        Mode::ReduceInner => red_points * (cost_red + 1) + cost_body,
        Mode::ReduceOuter => block * (red_points * (cost_red + 1) + cost_body),
    }
    .max(1);
    let (lvl_body, lvl_red, vlevel) = hoisting(k, mode, &outer, vloop.as_ref(), &red_loops);
    Ok(Plan {
        acc,
        outer,
        vloop,
        block,
        nblocks,
        red: red_loops,
        mode,
        lanes,
        unroll,
        reduce: red,
        extent: outer_n * nblocks,
        cost,
        lvl_body,
        lvl_red,
        vlevel,
    })
}

/// The reduction loops' extents and what the first (only) stage reduces.
fn reduction(k: &LoopKernel) -> Result<(Vec<u64>, Option<Red>), String> {
    let Some(r) = k.reduce.first() else {
        return Ok((Vec::new(), None));
    };
    let d = static_dims(&r.dims, "the reduction")?;
    let dt = r.body.last().map(|i| i.dtype).ok_or("empty reduction body")?;
    let count: u64 = d.iter().product();
    if matches!(r.op, ReduceOp::Max | ReduceOp::Min) && count == 0 {
        return Err(format!(
            "{} over an empty axis (an error the interpreter reports)",
            r.op.name()
        ));
    }
    if r.op == ReduceOp::Mean && !dt.is_float() {
        return Err(format!("reduce_mean of {dt}"));
    }
    if dt == DType::Bool {
        return Err("reduction of bool".into());
    }
    let red = Red {
        op: r.op,
        dtype: dt,
        count,
        empty: count == 0,
    };
    Ok((d, Some(red)))
}

/// Every load's view and affine axes composed into one element offset `c0 + Σ coef·i`
/// (checked to stay inside its buffer), then the output's row-major offset.
fn accesses(
    k: &LoopKernel,
    out: BufferId,
    out_dt: DType,
    buffers: &[Buffer],
    extents: &[u64],
    rank: usize,
) -> Result<(Vec<Access>, Vec<Vec<i64>>), String> {
    let nloops = extents.len();
    let mut acc = Vec::new();
    let mut coefs: Vec<Vec<i64>> = Vec::new();
    let nonempty = extents.iter().all(|&n| n > 0);
    for (li, ld) in k.loads.iter().enumerate() {
        let b = buffers
            .get(ld.buffer.index())
            .ok_or_else(|| format!("load l{li} reads {}, not a buffer of the program", ld.buffer))?;
        let value = value_type(b.ty.dtype)?;
        let bdims = static_dims(b.ty.shape.dims(), "a loaded buffer")?;
        let view = static_dims(&ld.map.view, "a load's view")?;
        if view.iter().product::<u64>() != bdims.iter().product::<u64>() || view.len() != ld.map.axes.len() {
            return Err(format!("load l{li}: {} cannot be viewed as {view:?}", ld.buffer));
        }
        let mut strides = vec![1i64; view.len()];
        for a in (0..view.len().saturating_sub(1)).rev() {
            strides[a] = strides[a + 1] * view[a + 1] as i64;
        }
        let mut c0 = 0i64;
        let mut coef = vec![0i64; nloops];
        for (a, e) in ld.map.axes.iter().enumerate() {
            let (mut lo, mut hi) = (e.offset, e.offset);
            c0 += strides[a] * e.offset;
            for &(l, c) in &e.terms {
                if l >= nloops {
                    return Err(format!("load l{li} names loop i{l} of {nloops}"));
                }
                coef[l] += strides[a] * c;
                let span = c * (extents[l] as i64 - 1).max(0);
                if span < 0 {
                    lo += span;
                } else {
                    hi += span;
                }
            }
            if nonempty && (lo < 0 || hi >= view[a] as i64) {
                return Err(format!("load l{li}: index `{e}` leaves axis {a} of {view:?}"));
            }
        }
        acc.push(Access {
            buffer: ld.buffer,
            dtype: value,
            storage: b.ty.dtype,
            c0,
        });
        coefs.push(coef);
    }
    let mut coef = vec![0i64; nloops];
    let mut s = 1i64;
    for l in (0..rank).rev() {
        coef[l] = s;
        s *= extents[l] as i64;
    }
    acc.push(Access {
        buffer: out,
        dtype: value_type(out_dt)?,
        storage: out_dt,
        c0: 0,
    });
    coefs.push(coef);
    Ok((acc, coefs))
}

/// Check the bodies against the loads and the output; returns which loads the epilogue reads.
fn check_bodies(
    k: &LoopKernel,
    acc: &[Access],
    coefs: &[Vec<i64>],
    red: Option<Red>,
    out_dt: DType,
    rank: usize,
) -> Result<Vec<bool>, String> {
    let loads = &acc[..k.loads.len()];
    check_body(&k.body, loads, red.map(|r| r.dtype), "body")?;
    if let Some(r) = k.reduce.first() {
        check_body(&r.body, loads, None, "reduction body")?;
    }
    let body_dt = k.body.last().map(|i| i.dtype).ok_or("empty body")?;
    if body_dt != out_dt {
        return Err(format!("the body computes {body_dt}, the output is {out_dt}"));
    }
    let used_body = loads_used(&k.body, k.loads.len());
    for (l, u) in used_body.iter().enumerate() {
        if *u && coefs[l][rank..].iter().any(|&c| c != 0) {
            return Err(format!("the epilogue's load l{l} depends on a reduction loop"));
        }
    }
    Ok(used_body)
}

/// The plan of a kernel with no output element.
fn empty_plan(k: &LoopKernel, acc: Vec<Access>, red: Option<Red>) -> Plan {
    Plan {
        acc,
        outer: Vec::new(),
        vloop: None,
        block: 0,
        nblocks: 0,
        red: Vec::new(),
        mode: if red.is_some() {
            Mode::ReduceInner
        } else {
            Mode::Elementwise
        },
        lanes: 1,
        unroll: 1,
        reduce: red,
        extent: 0,
        cost: 0,
        lvl_body: vec![0; k.body.len()],
        lvl_red: vec![0; k.reduce.first().map_or(0, |r| r.body.len())],
        vlevel: 2,
    }
}

/// The output loops and the reduction loops, unit loops dropped and adjacent loops merged
/// where every access is contiguous across them (at least one loop each, when present).
fn loop_nests(extents: &[u64], coefs: &[Vec<i64>], rank: usize, red: Option<Red>, planes: usize) -> (Vec<Lp>, Vec<Lp>) {
    let n_acc = coefs.len();
    let mk = |idx: std::ops::Range<usize>| -> Vec<Lp> {
        idx.map(|l| Lp {
            n: extents[l],
            coef: coefs.iter().map(|c| c[l]).collect(),
        })
        .collect()
    };
    let collapse = |loops: Vec<Lp>| -> Vec<Lp> {
        let mut out: Vec<Lp> = Vec::new();
        for l in loops.into_iter().filter(|l| l.n != 1) {
            if let Some(prev) = out.last_mut()
                && prev.coef.iter().zip(&l.coef).all(|(&p, &c)| p == c * l.n as i64)
            {
                prev.n *= l.n;
                prev.coef = l.coef;
                continue;
            }
            out.push(l);
        }
        out
    };
    let unit = || Lp {
        n: 1,
        coef: vec![0; n_acc],
    };
    let mut outl = if (1..rank).contains(&planes) {
        let mut o = collapse(mk(0..planes));
        o.extend(collapse(mk(planes..rank)));
        o
    } else {
        collapse(mk(0..rank))
    };
    if outl.is_empty() {
        outl.push(unit());
    }
    let mut redl = Vec::new();
    if red.is_some_and(|r| !r.empty) {
        redl = collapse(mk(rank..extents.len()));
        if redl.is_empty() {
            redl.push(unit());
        }
    }
    (outl, redl)
}

/// The loop mode, lane count (1: scalar code) and vectors per iteration: one lane width for
/// every value (bools become lane masks), along the reduction when its innermost loop is
/// contiguous, else across outputs when the output loop is.
fn vectorize(
    k: &LoopKernel,
    acc: &[Access],
    outl: &[Lp],
    redl: &[Lp],
    red: Option<Red>,
    used_body: &[bool],
) -> (Mode, u8, u8) {
    let n_acc = acc.len();
    let out_dt = acc[n_acc - 1].dtype;
    let used_red = k
        .reduce
        .first()
        .map_or(vec![false; k.loads.len()], |r| loads_used(&r.body, k.loads.len()));
    let any_used: Vec<bool> = used_red.iter().zip(used_body).map(|(a, b)| *a || *b).collect();
    // Loads of one element for every iteration (all coefficients 0) are loop-invariant.
    let uniform_load: Vec<bool> = (0..k.loads.len())
        .map(|a| outl.iter().chain(redl).all(|l| l.coef[a] == 0))
        .collect();
    let uni_body = uniform(&k.body, &uniform_load);
    let uni_red = k.reduce.first().map_or(Vec::new(), |r| uniform(&r.body, &uniform_load));
    let varying_red = k.reduce.first().map_or(vec![false; k.loads.len()], |r| {
        varying_loads(&r.body, &uni_red, k.loads.len())
    });
    let varying_any: Vec<bool> = varying_loads(&k.body, &uni_body, k.loads.len())
        .iter()
        .zip(&varying_red)
        .map(|(a, b)| *a || *b)
        .collect();
    let lane_dtype = |dt: DType| matches!(dt, DType::F32 | DType::F64 | DType::I32 | DType::I64);
    // 8-bit values ride in 32-bit lanes in elementwise kernels (see `vectorizable`).
    let narrow = k.reduce.is_empty();
    let loads_ok = |used: &[bool], w: usize| {
        used.iter().zip(acc).all(|(u, a)| {
            !*u || a.dtype.size_bytes() == w || a.dtype == DType::Bool || (narrow && w == 4 && is_narrow(a.dtype))
        })
    };
    let lanes_of = |w: usize| -> u8 { if w == 4 { 4 } else { 2 } };
    // Elementwise / across outputs: the output's lane width everywhere (a bool or 8-bit output
    // takes the width of the values it is computed from; bools are lane masks of that width).
    let w_out = if out_dt == DType::Bool || is_narrow(out_dt) {
        k.body
            .iter()
            .chain(k.reduce.iter().flat_map(|r| &r.body))
            .map(|i| i.dtype)
            .chain(acc.iter().zip(&any_used).filter(|(_, u)| **u).map(|(a, _)| a.dtype))
            .filter(|d| *d != DType::Bool && (out_dt == DType::Bool || !is_narrow(*d)))
            .map(|d| d.size_bytes())
            .max()
            .unwrap_or(if out_dt == DType::Bool { 4 } else { 1 })
    } else {
        out_dt.size_bytes()
    };
    let outer_ok = matches!(w_out, 4 | 8)
        && (lane_dtype(out_dt) || out_dt == DType::Bool || (narrow && w_out == 4 && is_narrow(out_dt)))
        && loads_ok(&varying_any, w_out)
        && vectorizable(&k.body, w_out, &uni_body, narrow)
        && k.reduce
            .first()
            .is_none_or(|r| vectorizable(&r.body, w_out, &uni_red, false));
    // Along the reduction: the reduction body only (the epilogue runs once per output).
    let (inner_ok, w_red) = match (k.reduce.first(), red) {
        (Some(r), Some(rd)) => {
            let w = rd.dtype.size_bytes();
            (
                lane_dtype(rd.dtype) && loads_ok(&varying_red, w) && vectorizable(&r.body, w, &uni_red, false),
                w,
            )
        }
        _ => (false, 4),
    };
    let contiguous = |l: &Lp, used: &[bool], with_out: bool| {
        used.iter()
            .enumerate()
            .filter(|(_, u)| **u)
            .all(|(a, _)| matches!(l.coef[a], 0 | 1))
            && (!with_out || l.coef[n_acc - 1] == 1)
    };
    let (mode, vec, lanes) = match red {
        None => {
            let l = lanes_of(w_out);
            (
                Mode::Elementwise,
                outer_ok && outl.last().is_some_and(|v| v.n >= l as u64),
                l,
            )
        }
        Some(_) => {
            let vo = outl.last().expect("at least one output loop");
            let (li, lo) = (lanes_of(w_red), lanes_of(w_out));
            if inner_ok
                && redl
                    .last()
                    .is_some_and(|l| l.n >= li as u64 && contiguous(l, &used_red, false))
            {
                (Mode::ReduceInner, true, li)
            } else if outer_ok && vo.n >= lo as u64 && contiguous(vo, &any_used, true) {
                (Mode::ReduceOuter, true, lo)
            } else {
                (Mode::ReduceInner, false, 1)
            }
        }
    };
    // Several vectors per iteration hide latency in cheap bodies; long bodies (expanded math)
    // already have independent work and would only spill. Across outputs, four vectors
    // cover a 64-byte line of f32 outputs per reduction step.
    let heavy = |body: &[Inst]| body.len() > HEAVY_BODY;
    let is_heavy = heavy(&k.body) || k.reduce.first().is_some_and(|r| heavy(&r.body));
    let unroll: u8 = match (vec, is_heavy, mode) {
        (false, ..) => 1,
        (true, true, _) => 1,
        (true, false, Mode::ReduceOuter) => 4,
        // An f32 sum along the reduction adds in f32 lanes (blocked): four chains hide the
        // add latency.
        (true, false, Mode::ReduceInner)
            if red.is_some_and(|r| r.dtype == DType::F32 && matches!(r.op, ReduceOp::Sum | ReduceOp::Mean)) =>
        {
            4
        }
        // Elementwise: short bodies run eight vectors per iteration (one loop test, address
        // update and branch pair per 32 f32 instead of per 8: 2.5x on a 64K-element relu),
        // longer ones fewer so their values stay in the sixteen vector registers.
        (true, false, Mode::Elementwise) => match k.body.len() {
            0..=8 => 8,
            9..=16 => 4,
            _ => 2,
        },
        (true, false, _) => 2,
    };
    (mode, if vec { lanes } else { 1 }, unroll)
}

/// Split the vector loop into blocks when the outer loops alone are too few to share across
/// threads, keeping each block worth at least `MIN_BLOCK_WORK`: `(block, blocks)`.
fn blocks(vloop: Option<&Lp>, outer_n: u64, step: u64, per_elem: u64) -> (u64, u64) {
    match vloop {
        Some(v) if outer_n < MIN_OUTER && v.n > step => {
            let want = MIN_OUTER.div_ceil(outer_n.max(1));
            let by_count = v.n.div_ceil(want);
            let by_work = MIN_BLOCK_WORK.div_ceil(per_elem.max(1));
            let b = by_count.max(by_work).div_ceil(step) * step;
            if b < v.n { (b, v.n.div_ceil(b)) } else { (v.n, 1) }
        }
        Some(v) => (v.n, 1),
        None => (0, 1),
    }
}

/// The hoisting level of every instruction of the epilogue and of the reduction body, and
/// the vector loop's level: each instruction goes to the outermost loop it depends on.
fn hoisting(
    k: &LoopKernel,
    mode: Mode,
    outer: &[Lp],
    vloop: Option<&Lp>,
    red_loops: &[Lp],
) -> (Vec<usize>, Vec<usize>, usize) {
    let inner: Vec<&Lp> = match mode {
        Mode::Elementwise => vloop.into_iter().collect(),
        Mode::ReduceInner => red_loops.iter().collect(),
        Mode::ReduceOuter => vloop.into_iter().chain(red_loops.iter()).collect(),
    };
    let vlevel = match mode {
        Mode::ReduceInner => 1 + inner.len(),
        _ => 2,
    };
    let load_level: Vec<usize> = (0..k.loads.len())
        .map(|a| {
            if let Some(d) = inner.iter().rposition(|l| l.coef[a] != 0) {
                2 + d
            } else if outer.iter().any(|l| l.coef[a] != 0) {
                1
            } else {
                0
            }
        })
        .collect();
    let levels = |body: &[Inst], acc_level: usize| -> Vec<usize> {
        let mut lv: Vec<usize> = Vec::with_capacity(body.len());
        for inst in body {
            let l = match &inst.op {
                ScalarOp::Load(l) => load_level[*l],
                ScalarOp::Const(_) => 0,
                ScalarOp::Acc(_) => acc_level,
                op => op.operands().iter().map(|&a| lv[a]).max().unwrap_or(0),
            };
            lv.push(l);
        }
        lv
    };
    let acc_level = match mode {
        Mode::ReduceOuter => 2,
        _ => 1,
    };
    let lvl_body = levels(&k.body, acc_level);
    let lvl_red = k.reduce.first().map_or(Vec::new(), |r| levels(&r.body, 0));
    (lvl_body, lvl_red, vlevel)
}
