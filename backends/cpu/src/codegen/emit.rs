//! Building a kernel's Cranelift function from its [`Plan`]: the outer loop over `lo..hi`,
//! inner loops, hoisted instructions, vector main loops with scalar remainders, loads, stores
//! and reduction accumulators.

use super::ops::{scalar_ty, ty_of};
use super::plan::{Mode, Plan, Red};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Type, Value, types};
use cranelift_frontend::{FunctionBuilder, Variable};
use oar_ir::DType;
use oar_ir::kernel::{Inst, LoopKernel, ScalarOp};
use oar_ir::ops::ReduceOp;
use std::collections::HashMap;

/// Elements per f32 block of a vectorized f32 sum along the reduction
/// ([`Em::blocked_inner`]): each f32 lane adds at most `F32_BLOCK / (lanes × unroll)` elements
/// before its partial joins the f64 total, so the error stays that of a short f32 sum.
const F32_BLOCK: i64 = 1024;
/// Shorter reduction loops add every element in f64 (they are cheap either way, and a short
/// sum of large, nearly equal values — a layer norm's mean — keeps its last bits).
const F32_BLOCK_MIN: i64 = 256;
/// Reduction iterations per f32 block when the sum is vectorized across outputs
/// ([`Em::blocked_outer`]; one element per lane per iteration).
const F32_BLOCK_ROWS: i64 = 64;

/// A computed instruction: one value (scalar, or the same for every unrolled vector) or one
/// per unrolled vector, at `lanes` lanes.
#[derive(Clone, Debug)]
pub(super) struct Val {
    pub lanes: u8,
    pub v: Vec<Value>,
}

/// Which body an instruction belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Body {
    Red,
    Epi,
}

/// The emitter: the function builder and everything known while building one kernel.
pub(super) struct Em<'a, 'f> {
    pub b: &'a mut FunctionBuilder<'f>,
    pub plan: &'a Plan,
    kernel: &'a LoopKernel,
    /// Base address per access.
    bases: Vec<Value>,
    /// Element offset per access at the current outer iteration.
    off1: Vec<Value>,
    /// Current index of each inner loop (by nesting position).
    idx: Vec<Option<Value>>,
    /// Computed values of the reduction body and the epilogue.
    env_red: Vec<Option<Val>>,
    env_epi: Vec<Option<Val>>,
    /// Constant value of each instruction that is a `Const`.
    const_red: Vec<Option<f64>>,
    const_epi: Vec<Option<f64>>,
    /// The function's status word (`KERNEL_DIV_BY_ZERO` when a divisor was zero).
    pub status: Variable,
}

fn consts(body: &[Inst]) -> Vec<Option<f64>> {
    body.iter()
        .map(|i| match i.op {
            ScalarOp::Const(c) => Some(c.0),
            _ => None,
        })
        .collect()
}

impl<'a, 'f> Em<'a, 'f> {
    pub(super) fn new(
        b: &'a mut FunctionBuilder<'f>,
        plan: &'a Plan,
        kernel: &'a LoopKernel,
        status: Variable,
    ) -> Self {
        let nred = kernel.reduce.first().map_or(0, |r| r.body.len());
        Em {
            b,
            plan,
            kernel,
            bases: Vec::new(),
            off1: Vec::new(),
            idx: vec![None; plan.inner().len()],
            env_red: vec![None; nred],
            env_epi: vec![None; kernel.body.len()],
            const_red: kernel.reduce.first().map_or(Vec::new(), |r| consts(&r.body)),
            const_epi: consts(&kernel.body),
            status,
        }
    }

    /// `for var in (current var)..end step step { f(index) }`; `var` holds the index after.
    fn for_loop(&mut self, var: Variable, end: Value, step: i64, f: impl FnOnce(&mut Self, Value)) {
        let header = self.b.create_block();
        let body = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let i = self.b.use_var(var);
        let next = self.b.ins().iadd_imm_s(i, step);
        let go = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, next, end);
        self.b.ins().brif(go, body, &[], exit, &[]);
        self.b.switch_to_block(body);
        f(self, i);
        let next = self.b.ins().iadd_imm_s(i, step);
        self.b.def_var(var, next);
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(exit);
    }

    /// The whole function body (the entry block is current, `bufs`, `lo`, `hi` given).
    pub(super) fn build(&mut self, bufs: Value, lo: Value, hi: Value) {
        let plan = self.plan;
        // Base addresses, one load per distinct buffer.
        let mut seen: HashMap<u32, Value> = HashMap::new();
        for a in &plan.acc {
            let v = *seen.entry(a.buffer.0).or_insert_with(|| {
                let flags = MemFlagsData::trusted().with_readonly();
                self.b.ins().load(types::I64, flags, bufs, (a.buffer.0 as i32) * 8)
            });
            self.bases.push(v);
        }
        if plan.extent == 0 {
            return;
        }
        self.emit_level(Body::Red, 0, 1, 1, None);
        self.emit_level(Body::Epi, 0, 1, 1, None);
        let o = self.b.declare_var(types::I64);
        self.b.def_var(o, lo);
        self.for_loop(o, hi, 1, |s, o| s.outer_iteration(o));
    }

    fn outer_iteration(&mut self, o: Value) {
        let plan = self.plan;
        // Decompose the outer index (row-major over the outer loops, then the block).
        let mut dims: Vec<u64> = plan.outer.iter().map(|l| l.n).collect();
        let blocked = plan.vloop.is_some() && plan.nblocks > 1;
        if blocked {
            dims.push(plan.nblocks);
        }
        let mut idx = vec![o; dims.len()];
        let mut rem = o;
        for d in (0..dims.len()).rev() {
            if d == 0 {
                idx[d] = rem;
            } else {
                idx[d] = self.b.ins().urem_imm_u(rem, dims[d] as i64);
                rem = self.b.ins().udiv_imm_u(rem, dims[d] as i64);
            }
        }
        self.off1 = (0..plan.acc.len())
            .map(|a| {
                let mut off = None;
                for (d, l) in plan.outer.iter().enumerate() {
                    off = self.axpy(off, idx[d], l.coef[a]);
                }
                let c0 = plan.acc[a].c0;
                match off {
                    None => self.b.ins().iconst(types::I64, c0),
                    Some(o) if c0 == 0 => o,
                    Some(o) => self.b.ins().iadd_imm_s(o, c0),
                }
            })
            .collect();
        let jrange = plan.vloop.as_ref().map(|v| {
            if blocked {
                let blk = idx[dims.len() - 1];
                let j0 = self.b.ins().imul_imm_s(blk, plan.block as i64);
                let j1 = self.b.ins().iadd_imm_s(j0, plan.block as i64);
                let n = self.b.ins().iconst(types::I64, v.n as i64);
                let j1 = self.b.ins().smin(j1, n);
                (j0, j1)
            } else {
                let j0 = self.b.ins().iconst(types::I64, 0);
                let j1 = self.b.ins().iconst(types::I64, v.n as i64);
                (j0, j1)
            }
        });
        match plan.mode {
            Mode::Elementwise => {
                self.emit_level(Body::Epi, 1, 1, 1, None);
                let (j0, j1) = jrange.expect("an elementwise plan has a vector loop");
                self.vector_loop(j0, j1, 0, |s, lanes, unroll| {
                    s.emit_level(Body::Epi, 2, lanes, unroll, None);
                    let v = s.result(Body::Epi);
                    s.store(&v, 2, lanes, unroll);
                });
            }
            Mode::ReduceInner => self.reduce_inner(),
            Mode::ReduceOuter => {
                self.emit_level(Body::Red, 1, 1, 1, None);
                self.emit_level(Body::Epi, 1, 1, 1, None);
                let (j0, j1) = jrange.expect("a reduce-outer plan has a vector loop");
                self.vector_loop(j0, j1, 0, |s, lanes, unroll| {
                    s.emit_level(Body::Red, 2, lanes, unroll, None);
                    let slots = s.acc_vars(lanes, unroll);
                    if !s.plan.red.is_empty() {
                        s.red_nest(0, 1, lanes, unroll, &slots, &[]);
                    }
                    let red = s.plan.reduce.expect("a reduction");
                    let vals: Vec<Value> = slots
                        .iter()
                        .map(|vars| {
                            let comps: Vec<Value> = vars.iter().map(|v| s.b.use_var(*v)).collect();
                            s.acc_finalize(&red, comps)
                        })
                        .collect();
                    let acc = Val { lanes, v: vals };
                    s.emit_level(Body::Epi, 2, lanes, unroll, Some(&acc));
                    let v = s.result(Body::Epi);
                    s.store(&v, 2, lanes, unroll);
                });
            }
        }
    }

    /// Mode [`Mode::ReduceInner`]: the reduction loops, the epilogue, one store.
    fn reduce_inner(&mut self) {
        let plan = self.plan;
        let red = plan.reduce.expect("a reduction");
        self.emit_level(Body::Red, 1, 1, 1, None);
        let scalar = self.acc_vars(1, 1);
        let vector = if plan.lanes > 1 {
            self.acc_vars(plan.lanes, plan.unroll)
        } else {
            Vec::new()
        };
        if !plan.red.is_empty() {
            self.red_nest(0, 0, plan.lanes, plan.unroll, &vector, &scalar);
        }
        // Combine: vector partials pairwise, their lanes in order, then the scalar partial.
        let mut total: Vec<Value> = scalar[0].iter().map(|v| self.b.use_var(*v)).collect();
        if !vector.is_empty() {
            let mut comb: Vec<Value> = vector[0].iter().map(|v| self.b.use_var(*v)).collect();
            for slot in &vector[1..] {
                let c: Vec<Value> = slot.iter().map(|v| self.b.use_var(*v)).collect();
                comb = self.acc_merge(&red, comb, c);
            }
            let h = self.acc_horizontal(&red, comb);
            total = self.acc_merge(&red, h, total);
        }
        let acc = self.acc_finalize(&red, total);
        let acc = Val { lanes: 1, v: vec![acc] };
        self.emit_level(Body::Epi, 1, 1, 1, Some(&acc));
        let v = self.result(Body::Epi);
        self.store(&v, 1, 1, 1);
    }

    /// Reduction loops from `d` inward (inner-loop position `d + first`), accumulating into
    /// `vector` slots in the vector configuration and `scalar` otherwise. In
    /// [`Mode::ReduceOuter`] every level runs at `lanes` × `unroll` (`vector` holds the
    /// slots, `scalar` is empty).
    fn red_nest(
        &mut self,
        d: usize,
        first: usize,
        lanes: u8,
        unroll: u8,
        vector: &[Vec<Variable>],
        scalar: &[Vec<Variable>],
    ) {
        let plan = self.plan;
        let pos = d + first;
        let level = 2 + pos;
        let n = plan.red[d].n as i64;
        let last = d + 1 == plan.red.len();
        let start = self.b.ins().iconst(types::I64, 0);
        let end = self.b.ins().iconst(types::I64, n);
        let red = plan.reduce.expect("a reduction");
        if plan.mode == Mode::ReduceInner && last && Self::blocked(&red) && n >= F32_BLOCK_MIN && plan.lanes > 1 {
            self.blocked_inner(n, pos, level, vector, scalar);
            return;
        }
        if plan.mode == Mode::ReduceInner && last {
            // Vector configurations, then scalars.
            self.vector_loop(start, end, pos, |s, l, u| {
                s.emit_level(Body::Red, level, l, u, None);
                let slots = if l > 1 { vector } else { scalar };
                s.accumulate(slots, l, u);
            });
            return;
        }
        let (l, u) = if plan.mode == Mode::ReduceOuter {
            (lanes, unroll)
        } else {
            (1, 1)
        };
        let var = self.b.declare_var(types::I64);
        self.b.def_var(var, start);
        if last && plan.mode == Mode::ReduceOuter && Self::blocked(&red) && n >= F32_BLOCK_MIN && l > 1 {
            self.blocked_outer(n, var, pos, level, l, u, vector);
            return;
        }
        self.for_loop(var, end, 1, |s, i| {
            s.idx[pos] = Some(i);
            s.emit_level(Body::Red, level, l, u, None);
            if last {
                s.accumulate(
                    if l > 1 || plan.mode == Mode::ReduceOuter {
                        vector
                    } else {
                        scalar
                    },
                    l,
                    u,
                );
            } else {
                s.red_nest(d + 1, first, lanes, unroll, vector, scalar);
            }
        });
    }

    /// [`Mode::ReduceInner`]'s innermost reduction loop (`0..n` at inner position `pos`) for a
    /// blocked f32 sum: blocks of [`F32_BLOCK`] elements are summed in f32 vector slots at
    /// full width, each block's partial sums then added into the f64 `vector` slots; the
    /// scalar remainder accumulates in f64 directly.
    fn blocked_inner(&mut self, n: i64, pos: usize, level: usize, vector: &[Vec<Variable>], scalar: &[Vec<Variable>]) {
        let plan = self.plan;
        let (lanes, unroll) = (plan.lanes, plan.unroll);
        let step = lanes as i64 * unroll as i64;
        let block = (F32_BLOCK / step).max(1) * step;
        let nvec = n - n % lanes as i64;
        let fast = self.f32_slots(lanes, unroll);
        let j = self.b.declare_var(types::I64);
        let mut configs = vec![(lanes, unroll)];
        if unroll > 1 {
            configs.push((lanes, 1));
        }
        self.f32_blocks(nvec, block, &fast, lanes, vector, |s, j0, j1| {
            s.b.def_var(j, j0);
            for &(l, u) in &configs {
                s.for_loop(j, j1, l as i64 * u as i64, |s, jv| {
                    s.idx[pos] = Some(jv);
                    s.emit_level(Body::Red, level, l, u, None);
                    s.accumulate_f32(&fast, l, u);
                });
            }
        });
        let j0 = self.b.ins().iconst(types::I64, nvec);
        self.b.def_var(j, j0);
        let end = self.b.ins().iconst(types::I64, n);
        self.for_loop(j, end, 1, |s, jv| {
            s.idx[pos] = Some(jv);
            s.emit_level(Body::Red, level, 1, 1, None);
            s.accumulate(scalar, 1, 1);
        });
    }

    /// [`Mode::ReduceOuter`]'s innermost reduction loop (`0..n`, index variable `var` at 0) for
    /// a blocked f32 sum at `lanes` × `unroll`: [`F32_BLOCK_ROWS`] iterations at a time summed
    /// in f32 slots, then added into the f64 `vector` slots.
    #[allow(clippy::too_many_arguments)]
    fn blocked_outer(
        &mut self,
        n: i64,
        var: Variable,
        pos: usize,
        level: usize,
        lanes: u8,
        unroll: u8,
        vector: &[Vec<Variable>],
    ) {
        let fast = self.f32_slots(lanes, unroll);
        self.f32_blocks(n, F32_BLOCK_ROWS, &fast, lanes, vector, |s, i0, i1| {
            s.b.def_var(var, i0);
            s.for_loop(var, i1, 1, |s, i| {
                s.idx[pos] = Some(i);
                s.emit_level(Body::Red, level, lanes, unroll, None);
                s.accumulate_f32(&fast, lanes, unroll);
            });
        });
    }

    /// `0..n` in blocks of `block` (the last one partial): for each, the f32 slots `fast` are
    /// zeroed, `body(i0, i1)` adds the block into them, and they are flushed into `wide`.
    fn f32_blocks(
        &mut self,
        n: i64,
        block: i64,
        fast: &[Variable],
        lanes: u8,
        wide: &[Vec<Variable>],
        mut body: impl FnMut(&mut Self, Value, Value),
    ) {
        let mut one = |s: &mut Self, i0: Value, i1: Value| {
            s.zero_f32_slots(fast, lanes);
            body(s, i0, i1);
            s.flush_f32_slots(fast, wide);
        };
        let nfull = n / block * block;
        if nfull > 0 {
            let ib = self.b.declare_var(types::I64);
            let zero = self.b.ins().iconst(types::I64, 0);
            self.b.def_var(ib, zero);
            let end = self.b.ins().iconst(types::I64, nfull);
            self.for_loop(ib, end, block, |s, i0| {
                let i1 = s.b.ins().iadd_imm_s(i0, block);
                one(s, i0, i1);
            });
        }
        if n > nfull {
            let i0 = self.b.ins().iconst(types::I64, nfull);
            let i1 = self.b.ins().iconst(types::I64, n);
            one(self, i0, i1);
        }
    }

    /// `unroll` f32 vector slots at `lanes` (zeroed here, so defined on every path).
    fn f32_slots(&mut self, lanes: u8, unroll: u8) -> Vec<Variable> {
        (0..unroll)
            .map(|_| {
                let t = ty_of(DType::F32, lanes);
                let var = self.b.declare_var(t);
                let z = self.fconst(t, 0.0);
                self.b.def_var(var, z);
                var
            })
            .collect()
    }

    fn zero_f32_slots(&mut self, slots: &[Variable], lanes: u8) {
        for &var in slots {
            let z = self.fconst(ty_of(DType::F32, lanes), 0.0);
            self.b.def_var(var, z);
        }
    }

    /// Add the reduction body's current value (f32) into the f32 slots.
    fn accumulate_f32(&mut self, slots: &[Variable], lanes: u8, unroll: u8) {
        let v = self.result(Body::Red);
        for (u, &var) in slots.iter().enumerate().take(unroll as usize) {
            let x = v.v[u.min(v.v.len() - 1)];
            let x = self.widen(x, DType::F32, v.lanes, lanes);
            let a = self.b.use_var(var);
            let s = self.b.ins().fadd(a, x);
            self.b.def_var(var, s);
        }
    }

    /// Add each f32 slot, promoted, into the matching f64 slot pair.
    fn flush_f32_slots(&mut self, slots: &[Variable], wide: &[Vec<Variable>]) {
        for (&var, vars) in slots.iter().zip(wide) {
            let x = self.b.use_var(var);
            let (lo, hi) = self.promote(x);
            for (w, p) in vars.iter().zip(std::iter::once(lo).chain(hi)) {
                let a = self.b.use_var(*w);
                let s = self.b.ins().fadd(a, p);
                self.b.def_var(*w, s);
            }
        }
    }

    /// Add the reduction body's current value into the accumulator slots.
    fn accumulate(&mut self, slots: &[Vec<Variable>], lanes: u8, unroll: u8) {
        let red = self.plan.reduce.expect("a reduction");
        let v = self.result(Body::Red);
        for (u, vars) in slots.iter().enumerate().take(unroll as usize) {
            let x = v.v[u.min(v.v.len() - 1)];
            let x = self.widen(x, red.dtype, v.lanes, lanes);
            let comps: Vec<Value> = vars.iter().map(|v| self.b.use_var(*v)).collect();
            let new = self.acc_update(&red, comps, x);
            for (var, val) in vars.iter().zip(new) {
                self.b.def_var(*var, val);
            }
        }
    }

    /// The vector loop over `j0..j1` at inner position `pos`: `lanes × unroll` per iteration,
    /// then single vectors, then scalars; `f(lanes, unroll)` emits one iteration's work.
    fn vector_loop(&mut self, j0: Value, j1: Value, pos: usize, mut f: impl FnMut(&mut Self, u8, u8)) {
        let plan = self.plan;
        let mut configs = Vec::new();
        if plan.lanes > 1 {
            configs.push((plan.lanes, plan.unroll));
            if plan.unroll > 1 {
                configs.push((plan.lanes, 1));
            }
        }
        configs.push((1, 1));
        let j = self.b.declare_var(types::I64);
        self.b.def_var(j, j0);
        for (lanes, unroll) in configs {
            let step = lanes as i64 * unroll as i64;
            self.for_loop(j, j1, step, |s, jv| {
                s.idx[pos] = Some(jv);
                f(s, lanes, unroll);
            });
        }
    }

    fn body(&self, which: Body) -> &'a [Inst] {
        match which {
            Body::Red => &self.kernel.reduce.first().expect("a reduction").body,
            Body::Epi => &self.kernel.body,
        }
    }

    /// The last instruction's value.
    fn result(&self, which: Body) -> Val {
        let env = match which {
            Body::Red => &self.env_red,
            Body::Epi => &self.env_epi,
        };
        env.last().cloned().flatten().expect("the body's result was emitted")
    }

    /// Emit the instructions of `which` at `level`, `lanes` wide and `unroll` times.
    fn emit_level(&mut self, which: Body, level: usize, lanes: u8, unroll: u8, acc: Option<&Val>) {
        // An empty reduction evaluates nothing (its loads may point at empty buffers).
        if which == Body::Red && self.plan.reduce.is_none_or(|r| r.empty) {
            return;
        }
        let body = self.body(which);
        let plan = self.plan;
        let lv = match which {
            Body::Red => &plan.lvl_red,
            Body::Epi => &plan.lvl_body,
        };
        for (i, inst) in body.iter().enumerate() {
            if lv[i] != level {
                continue;
            }
            let val = match &inst.op {
                ScalarOp::Load(l) => self.load(*l, level, lanes, unroll),
                ScalarOp::Const(c) => Val {
                    lanes: 1,
                    v: vec![self.constant(inst.dtype, c.0, 1)],
                },
                ScalarOp::Acc(_) => acc.cloned().expect("acc is given to the epilogue"),
                op => self.compute(which, op, inst.dtype),
            };
            let env = match which {
                Body::Red => &mut self.env_red,
                Body::Epi => &mut self.env_epi,
            };
            env[i] = Some(val);
        }
    }

    /// An arithmetic instruction from its operands' values.
    fn compute(&mut self, which: Body, op: &ScalarOp, dt: DType) -> Val {
        let body = self.body(which);
        let (env, cst) = match which {
            Body::Red => (&self.env_red, &self.const_red),
            Body::Epi => (&self.env_epi, &self.const_epi),
        };
        let get = |a: usize| env[a].clone().expect("operand emitted before use");
        let args = op.operands();
        debug_assert!(!args.is_empty(), "loads, constants and acc are handled by the caller");
        let vals: Vec<Val> = args.iter().map(|&a| get(a)).collect();
        let dts: Vec<DType> = args.iter().map(|&a| body[a].dtype).collect();
        let consts: Vec<Option<f64>> = args.iter().map(|&a| cst[a]).collect();
        let lanes = vals.iter().map(|v| v.lanes).max().unwrap_or(1);
        let n = vals.iter().map(|v| v.v.len()).max().unwrap_or(1);
        let mut out = Vec::with_capacity(n);
        for u in 0..n {
            let xs: Vec<Value> = vals
                .iter()
                .zip(&dts)
                .map(|(v, &d)| {
                    let x = v.v[u.min(v.v.len() - 1)];
                    self.widen(x, d, v.lanes, lanes)
                })
                .collect();
            let r = match op {
                ScalarOp::Unary(o, _) => self.unary(*o, dt, xs[0]),
                ScalarOp::Binary(o, _, _) => self.binary(*o, dts[0], xs[0], xs[1], consts[0], consts[1]),
                ScalarOp::Where(..) => self.select(xs[0], xs[1], xs[2]),
                ScalarOp::Cast(_) => self.cast(xs[0], dts[0], dt),
                ScalarOp::Bitcast(_) => self.reinterpret(xs[0], dt),
                ScalarOp::ShiftLeft(_, n) => self.shift(xs[0], *n, true),
                ScalarOp::ShiftRight(_, n) => self.shift(xs[0], *n, false),
                ScalarOp::MulAdd(..) => self.b.ins().fma(xs[0], xs[1], xs[2]),
                _ => unreachable!(),
            };
            out.push(r);
        }
        Val { lanes, v: out }
    }

    /// Element offset of access `a` at the current point of loops up to `level`.
    fn offset(&mut self, a: usize, level: usize) -> Value {
        let plan = self.plan;
        let inner = plan.inner();
        let mut off = Some(self.off1[a]);
        for (d, l) in inner.iter().enumerate().take(level.saturating_sub(1)) {
            let i = self.idx[d].expect("loop index set");
            off = self.axpy(off, i, l.coef[a]);
        }
        off.expect("the outer offset")
    }

    /// `acc + c·x` (skipping zero terms and unit factors; `None` is 0).
    fn axpy(&mut self, acc: Option<Value>, x: Value, c: i64) -> Option<Value> {
        if c == 0 {
            return acc;
        }
        let t = if c == 1 { x } else { self.b.ins().imul_imm_s(x, c) };
        Some(match acc {
            None => t,
            Some(a) => self.b.ins().iadd(a, t),
        })
    }

    /// Address of access `a` at element offset `off` (+ `extra` elements).
    fn addr(&mut self, a: usize, off: Value) -> Value {
        let size = self.plan.acc[a].storage.size_bytes() as i64;
        let bytes = if size == 1 {
            off
        } else {
            self.b.ins().ishl_imm_s(off, size.trailing_zeros() as i64)
        };
        self.b.ins().iadd(self.bases[a], bytes)
    }

    fn mem_flags(&self, a: usize) -> MemFlagsData {
        let f = MemFlagsData::new().with_notrap();
        if a != self.plan.out() && self.plan.acc[a].buffer != self.plan.acc[self.plan.out()].buffer {
            f.with_readonly()
        } else {
            f
        }
    }

    /// Load `l` at `level`.
    fn load(&mut self, l: usize, level: usize, lanes: u8, unroll: u8) -> Val {
        let plan = self.plan;
        let dt = plan.acc[l].dtype;
        let size = dt.size_bytes() as i64;
        let st = scalar_ty(dt);
        let flags = self.mem_flags(l);
        let off = if level == 0 {
            self.b.ins().iconst(types::I64, plan.acc[l].c0)
        } else {
            self.offset(l, level)
        };
        let base = self.addr(l, off);
        let vc = plan.vcoef(l);
        let vector_level = level >= 2 && plan.lanes_at(level) > 1;
        let bf16 = plan.acc[l].storage == DType::BF16;
        if lanes == 1 || !vector_level || vc == 0 {
            let v = if bf16 {
                self.load_bf16(base, flags)
            } else {
                self.b.ins().load(st, flags, base, 0)
            };
            return Val { lanes: 1, v: vec![v] };
        }
        let vt = ty_of(dt, lanes);
        let mut out = Vec::new();
        for u in 0..unroll as i64 {
            if bf16 {
                // f32 lanes from bf16 elements: 16-bit loads widened, shifted into the high
                // half.
                let v = if vc == 1 && lanes == 4 {
                    let p = self.offset_addr(base, u * 4 * 2);
                    let w = self.b.ins().uload16x4(flags, p, 0);
                    let w = self.b.ins().ishl_imm_s(w, 16);
                    self.b.ins().bitcast(vt, super::ops::le(), w)
                } else {
                    self.gather_lanes(vt, lanes, |em, lane| {
                        let p = em.offset_addr(base, (u * lanes as i64 + lane) * vc * 2);
                        em.load_bf16(p, flags)
                    })
                };
                out.push(v);
                continue;
            }
            if super::plan::is_narrow(dt) {
                // 8-bit elements as their values in 32-bit lanes.
                let v = if vc == 1 {
                    let p = self.offset_addr(base, u * lanes as i64);
                    let x = self.b.ins().load(types::I32, flags, p, 0);
                    let v = self.b.ins().scalar_to_vector(types::I32X4, x);
                    let mut v = self.b.ins().bitcast(types::I8X16, super::ops::le(), v);
                    for _ in 0..2 {
                        v = if dt == DType::U8 {
                            self.b.ins().uwiden_low(v)
                        } else {
                            self.b.ins().swiden_low(v)
                        };
                    }
                    v
                } else {
                    self.gather_lanes(vt, lanes, |em, lane| {
                        let p = em.offset_addr(base, (u * lanes as i64 + lane) * vc);
                        if dt == DType::U8 {
                            em.b.ins().uload8(types::I32, flags, p, 0)
                        } else {
                            em.b.ins().sload8(types::I32, flags, p, 0)
                        }
                    })
                };
                out.push(v);
                continue;
            }
            if dt == DType::Bool {
                // Bytes to lane masks.
                let v = if vc == 1 {
                    let p = self.offset_addr(base, u * lanes as i64);
                    self.load_bool_vector(p, lanes, flags)
                } else {
                    let lane_ty = vt.lane_type();
                    self.gather_lanes(vt, lanes, |em, lane| {
                        let p = em.offset_addr(base, (u * lanes as i64 + lane) * vc);
                        let x = em.b.ins().load(types::I8, flags, p, 0);
                        let w = em.b.ins().uextend(lane_ty, x);
                        em.b.ins().ineg(w)
                    })
                };
                out.push(v);
                continue;
            }
            if vc == 1 {
                let p = self.offset_addr(base, u * lanes as i64 * size);
                out.push(self.b.ins().load(vt, flags, p, 0));
            } else if vc == 2 {
                // Every other element: two overlapping vector loads that stay within the
                // elements read (the last is at 2·(lanes-1)), then one shuffle.
                let first = u * lanes as i64 * 2;
                let p0 = self.offset_addr(base, first * size);
                let p1 = self.offset_addr(base, (first + lanes as i64 - 1) * size);
                let v0 = self.b.ins().load(vt, flags, p0, 0);
                let v1 = self.b.ins().load(vt, flags, p1, 0);
                out.push(self.even_lanes(v0, v1, vt));
            } else {
                let v = self.gather_lanes(vt, lanes, |em, lane| {
                    let p = em.offset_addr(base, (u * lanes as i64 + lane) * vc * size);
                    em.b.ins().load(st, flags, p, 0)
                });
                out.push(v);
            }
        }
        Val { lanes, v: out }
    }

    /// A `vt` vector whose lane `i` is `lane(self, i)` (a gather of scalar loads).
    fn gather_lanes(&mut self, vt: Type, lanes: u8, mut lane: impl FnMut(&mut Self, i64) -> Value) -> Value {
        let first = lane(self, 0);
        let mut v = self.b.ins().splat(vt, first);
        for i in 1..lanes {
            let x = lane(self, i as i64);
            v = self.b.ins().insertlane(v, x, i);
        }
        v
    }

    fn offset_addr(&mut self, base: Value, bytes: i64) -> Value {
        if bytes == 0 {
            base
        } else {
            self.b.ins().iadd_imm_s(base, bytes)
        }
    }

    /// One bf16 element at `p` as an f32 value.
    fn load_bf16(&mut self, p: Value, flags: MemFlagsData) -> Value {
        let x = self.b.ins().uload16(types::I32, flags, p, 0);
        let x = self.b.ins().ishl_imm_s(x, 16);
        self.b.ins().bitcast(types::F32, super::ops::le(), x)
    }

    /// The f32 value (or lanes) `x`, already a bf16 value, stored as bf16 at `p`: the high
    /// half of its bits.
    fn store_bf16(&mut self, x: Value, p: Value, flags: MemFlagsData) {
        let t = self.b.func.dfg.value_type(x);
        if t.lane_count() == 1 {
            let bits = self.b.ins().bitcast(types::I32, super::ops::le(), x);
            let hi = self.b.ins().ushr_imm_s(bits, 16);
            self.b.ins().istore16(flags, hi, p, 0);
            return;
        }
        let bits = self.b.ins().bitcast(types::I32X4, super::ops::le(), x);
        let hi = self.b.ins().ushr_imm_s(bits, 16);
        // Lanes below 2^16: the unsigned saturating narrowing keeps them.
        let h = self.b.ins().unarrow(hi, hi);
        let q = self.b.ins().bitcast(types::I64X2, super::ops::le(), h);
        let w = self.b.ins().extractlane(q, 0);
        self.b.ins().store(flags, w, p, 0);
    }

    /// Store the output value at `level`.
    fn store(&mut self, v: &Val, level: usize, lanes: u8, unroll: u8) {
        let plan = self.plan;
        let o = plan.out();
        let dt = plan.acc[o].dtype;
        let size = plan.acc[o].storage.size_bytes() as i64;
        let flags = self.mem_flags(o);
        let off = self.offset(o, level);
        let base = self.addr(o, off);
        for u in 0..unroll as usize {
            let x = v.v[u.min(v.v.len() - 1)];
            let x = self.widen(x, dt, v.lanes, lanes);
            let p = self.offset_addr(base, u as i64 * lanes as i64 * size);
            if plan.acc[o].storage == DType::BF16 {
                self.store_bf16(x, p, flags);
            } else if super::plan::is_narrow(dt) && lanes > 1 {
                self.store_narrow_vector(x, dt, p, flags);
            } else if dt == DType::Bool && lanes > 1 {
                self.store_bool_vector(x, p, flags);
            } else {
                self.b.ins().store(flags, x, p, 0);
            }
        }
    }

    /// Four i8/u8 values held in 32-bit lanes (in range: see `plan::vectorizable`) stored as
    /// four bytes at `p`.
    fn store_narrow_vector(&mut self, x: Value, dt: DType, p: Value, flags: MemFlagsData) {
        let h = self.b.ins().snarrow(x, x);
        let b = if dt == DType::U8 {
            self.b.ins().unarrow(h, h)
        } else {
            self.b.ins().snarrow(h, h)
        };
        let w = self.b.ins().bitcast(types::I32X4, super::ops::le(), b);
        let w = self.b.ins().extractlane(w, 0);
        self.b.ins().store(flags, w, p, 0);
    }

    /// `lanes` bool bytes at `p` as a lane mask.
    fn load_bool_vector(&mut self, p: Value, lanes: u8, flags: MemFlagsData) -> Value {
        let mt = ty_of(DType::Bool, lanes);
        // 4 bytes (i32x4 masks) or 2 bytes (i64x2), zero-extended lane by lane.
        let (bytes_ty, widenings) = if lanes == 4 { (types::I32, 2) } else { (types::I16, 3) };
        let x = self.b.ins().load(bytes_ty, flags, p, 0);
        let wide = if bytes_ty == types::I32 {
            x
        } else {
            self.b.ins().uextend(types::I32, x)
        };
        let v = self.b.ins().scalar_to_vector(types::I32X4, wide);
        let mut v = self.b.ins().bitcast(types::I8X16, super::ops::le(), v);
        for _ in 0..widenings {
            v = self.b.ins().uwiden_low(v);
        }
        let zero = self.iconst(mt, 0);
        self.b.ins().icmp(IntCC::NotEqual, v, zero)
    }

    /// A lane mask stored as bool bytes at `p`.
    fn store_bool_vector(&mut self, m: Value, p: Value, flags: MemFlagsData) {
        let t = self.b.func.dfg.value_type(m);
        let one = self.iconst(t, 1);
        let bits = self.b.ins().band(m, one);
        if t.lane_count() == 4 {
            let h = self.b.ins().snarrow(bits, bits);
            let b = self.b.ins().snarrow(h, h);
            let w = self.b.ins().bitcast(types::I32X4, super::ops::le(), b);
            let x = self.b.ins().extractlane(w, 0);
            self.b.ins().store(flags, x, p, 0);
        } else {
            for lane in 0..t.lane_count() as u8 {
                let x = self.b.ins().extractlane(bits, lane);
                let x = self.b.ins().ireduce(types::I8, x);
                self.b.ins().store(flags, x, p, lane as i32);
            }
        }
    }

    // ---- reduction accumulators ----

    /// Whether an f32 sum accumulates blocks in f32 lanes before adding them up in f64
    /// ([`Em::blocked_inner`], [`Em::blocked_outer`]); products stay in f64 throughout.
    fn blocked(red: &Red) -> bool {
        red.dtype == DType::F32 && matches!(red.op, ReduceOp::Sum | ReduceOp::Mean)
    }

    /// Whether float sums/products accumulate in f64 (f32 data).
    fn widened(red: &Red) -> bool {
        red.dtype == DType::F32 && matches!(red.op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod)
    }

    /// Component types of one accumulator slot at `lanes`.
    fn acc_types(red: &Red, lanes: u8) -> Vec<Type> {
        let float_minmax = red.dtype.is_float() && matches!(red.op, ReduceOp::Max | ReduceOp::Min);
        if Self::widened(red) {
            if lanes == 1 {
                vec![types::F64]
            } else {
                vec![types::F64X2, types::F64X2]
            }
        } else if float_minmax && lanes > 1 {
            vec![ty_of(red.dtype, lanes), ty_of(DType::Bool, lanes)]
        } else {
            vec![ty_of(red.dtype, lanes)]
        }
    }

    /// `unroll` accumulator slots at `lanes`, initialized to the identity.
    fn acc_vars(&mut self, lanes: u8, unroll: u8) -> Vec<Vec<Variable>> {
        let red = self.plan.reduce.expect("a reduction");
        (0..unroll)
            .map(|_| {
                let init = self.acc_init(&red, lanes);
                init.into_iter()
                    .map(|v| {
                        let t = self.b.func.dfg.value_type(v);
                        let var = self.b.declare_var(t);
                        self.b.def_var(var, v);
                        var
                    })
                    .collect()
            })
            .collect()
    }

    fn acc_init(&mut self, red: &Red, lanes: u8) -> Vec<Value> {
        let ts = Self::acc_types(red, lanes);
        let dt = red.dtype;
        ts.iter()
            .enumerate()
            .map(|(c, &t)| {
                if c == 1 && !Self::widened(red) {
                    // NaN mask of a vector float max/min.
                    return self.iconst(t, 0);
                }
                let v = red.op.identity(dt);
                if t.lane_type().is_float() {
                    self.fconst(t, v)
                } else {
                    // ±2^63 as f64 saturate to the i64 bounds.
                    self.iconst(t, v as i64)
                }
            })
            .collect()
    }

    fn acc_update(&mut self, red: &Red, comps: Vec<Value>, x: Value) -> Vec<Value> {
        let dt = red.dtype;
        if Self::widened(red) {
            let (lo, hi) = self.promote(x);
            let parts: Vec<Value> = std::iter::once(lo).chain(hi).collect();
            return comps
                .into_iter()
                .zip(parts)
                .map(|(a, p)| {
                    if red.op == ReduceOp::Prod {
                        self.b.ins().fmul(a, p)
                    } else {
                        self.b.ins().fadd(a, p)
                    }
                })
                .collect();
        }
        let a = comps[0];
        let vector = self.b.func.dfg.value_type(x).is_vector();
        if dt.is_float() {
            return match red.op {
                ReduceOp::Sum | ReduceOp::Mean => vec![self.b.ins().fadd(a, x)],
                ReduceOp::Prod => vec![self.b.ins().fmul(a, x)],
                ReduceOp::Max | ReduceOp::Min if vector => {
                    // One max/min instruction plus a sticky NaN mask.
                    let m = if red.op == ReduceOp::Max {
                        self.max_keep_nan(x, a)
                    } else {
                        self.min_keep_nan(x, a)
                    };
                    let un = self.b.ins().fcmp(FloatCC::Unordered, x, x);
                    let nan = self.b.ins().bor(comps[1], un);
                    vec![m, nan]
                }
                ReduceOp::Max => vec![self.b.ins().fmax(a, x)],
                ReduceOp::Min => vec![self.b.ins().fmin(a, x)],
            };
        }
        vec![self.int_combine(red, dt, a, x)]
    }

    fn int_combine(&mut self, red: &Red, dt: DType, a: Value, x: Value) -> Value {
        let unsigned = dt == DType::U8;
        match red.op {
            ReduceOp::Sum | ReduceOp::Mean => self.b.ins().iadd(a, x),
            ReduceOp::Prod => self.b.ins().imul(a, x),
            ReduceOp::Max if unsigned => self.b.ins().umax(a, x),
            ReduceOp::Max => self.b.ins().smax(a, x),
            ReduceOp::Min if unsigned => self.b.ins().umin(a, x),
            ReduceOp::Min => self.b.ins().smin(a, x),
        }
    }

    /// Combine two slots of the same shape.
    fn acc_merge(&mut self, red: &Red, a: Vec<Value>, b: Vec<Value>) -> Vec<Value> {
        let dt = red.dtype;
        let float = dt.is_float();
        a.into_iter()
            .zip(b)
            .enumerate()
            .map(|(c, (x, y))| {
                let t = self.b.func.dfg.value_type(x);
                if c == 1 && !Self::widened(red) {
                    return self.b.ins().bor(x, y);
                }
                if float || t.lane_type().is_float() {
                    match red.op {
                        ReduceOp::Sum | ReduceOp::Mean => self.b.ins().fadd(x, y),
                        ReduceOp::Prod => self.b.ins().fmul(x, y),
                        ReduceOp::Max => self.b.ins().fmax(x, y),
                        ReduceOp::Min => self.b.ins().fmin(x, y),
                    }
                } else {
                    self.int_combine(red, dt, x, y)
                }
            })
            .collect()
    }

    /// A vector slot reduced to a scalar slot (lanes in order).
    fn acc_horizontal(&mut self, red: &Red, comps: Vec<Value>) -> Vec<Value> {
        let mut comps = comps;
        if Self::widened(red) {
            let s = if red.op == ReduceOp::Prod {
                self.b.ins().fmul(comps[0], comps[1])
            } else {
                self.b.ins().fadd(comps[0], comps[1])
            };
            comps = vec![s];
        } else if comps.len() == 2 {
            // Float max/min: NaN lanes become NaN before the lanes are combined.
            let t = self.b.func.dfg.value_type(comps[0]);
            let nan = self.fconst(t, f64::NAN);
            comps = vec![self.choose(comps[1], nan, comps[0])];
        }
        let v = comps[0];
        let t = self.b.func.dfg.value_type(v);
        let mut acc = self.b.ins().extractlane(v, 0);
        for lane in 1..t.lane_count() as u8 {
            let x = self.b.ins().extractlane(v, lane);
            acc = self.acc_merge(red, vec![acc], vec![x])[0];
        }
        vec![acc]
    }

    /// The reduction result in its dtype (mean divides, f64 partials round to f32).
    fn acc_finalize(&mut self, red: &Red, comps: Vec<Value>) -> Value {
        if Self::widened(red) || (red.dtype == DType::F64 && red.op == ReduceOp::Mean) {
            let mut comps = comps;
            if red.op == ReduceOp::Mean {
                for c in comps.iter_mut() {
                    let t = self.b.func.dfg.value_type(*c);
                    let n = self.fconst(t, red.count as f64);
                    *c = self.b.ins().fdiv(*c, n);
                }
            }
            return if red.dtype == DType::F32 {
                self.demote(comps[0], comps.get(1).copied())
            } else {
                comps[0]
            };
        }
        if comps.len() == 2 {
            let t = self.b.func.dfg.value_type(comps[0]);
            let nan = self.fconst(t, f64::NAN);
            return self.choose(comps[1], nan, comps[0]);
        }
        comps[0]
    }
}
