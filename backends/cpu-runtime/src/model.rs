//! Running a [`CpuProgram`]: buffers, the arena, steps, threads.

use crate::contraction;
use crate::par::par_units;
use crate::program::{CpuProgram, KernelFn, LoopCall, RowPiece, Step, const_name, static_shape};
use oar_ir::kernel::{Buffer, BufferId, BufferKind, Kernel, KernelBody, KernelProgram};
use oar_ir::runner::{self, Host, Launched, Launcher};
use oar_ir::{BackendError, DType, Op, TensorData, TensorType, Weights};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI32, Ordering};

/// Work (outer extent × cost) below which a loop runs on the calling thread. [`split`] never
/// waits for a pool thread to wake, so this only has to cover the cost of offering the work
/// (a queue push, at worst a futex wake by the caller): a 64K-element add (work ~2^17) splits.
const PARALLEL_MIN_WORK: u64 = 1 << 17;
/// Operations per block of rows of a [`Step::Rows`] kernel (a block's rows stay in cache
/// between its pieces).
const ROW_BLOCK_WORK: u64 = 1 << 14;

/// A compiled model, ready to run: program, kernel functions and weights.
pub struct Model {
    prog: CpuProgram,
    funcs: Vec<KernelFn>,
    /// Params by name (constants moved out of the program under [`const_name`]), checked
    /// against the program's types when the model is made.
    weights: Weights,
    /// Weights the regions of interpreted `cond`/`while` kernels read by name (empty when the
    /// program has no such kernel).
    region_weights: Weights,
    /// Arenas of finished runs, reused so a run does not fault in fresh pages (one per
    /// concurrent run at most).
    arenas: std::sync::Mutex<Vec<Vec<u128>>>,
    threads: usize,
    /// The compiled regions of control-flow kernels, as models of their own.
    regions: Vec<Model>,
    /// Bytes one run allocates (its arena and outputs), checked against the memory budget.
    run_bytes: u64,
    /// Per step: what its kernel derived from constant operands on the first run.
    derived: Vec<contraction::WeightCache>,
    /// Per step: the convolution epilogue the runtime applies with its own vector code
    /// ([`crate::epilogue`]), recognized once.
    chains: Vec<Option<crate::epilogue::ConvEpilogue>>,
    /// Per step: computed once by [`Model::hoist`], skipped by every run.
    hoisted: Vec<bool>,
    /// Per step: the blocked-layout convolution it runs instead ([`crate::blocked`]).
    blocked: Vec<Option<crate::blocked::BlockedConv>>,
    /// The outputs handed over by recent runs, per output buffer: a run writes an output into
    /// the allocation of one its caller has since dropped, instead of faulting in fresh pages
    /// (a training step's new parameters and optimizer moments replace the previous ones on
    /// every call). At most [`KEPT_OUTPUTS`] per buffer.
    handed: std::sync::Mutex<BTreeMap<BufferId, Vec<TensorData>>>,
}

/// Outputs remembered per output buffer for reuse: the caller's current one and one spare.
const KEPT_OUTPUTS: usize = 2;

// Safety: kernel functions are plain machine code that only touch the buffers passed to them;
// everything else is owned data.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

/// Per step: the convolution epilogue chain the runtime applies itself, if any.
pub(crate) fn chains(prog: &CpuProgram) -> Vec<Option<crate::epilogue::ConvEpilogue>> {
    prog.steps
        .iter()
        .map(|step| match step {
            Step::Contraction {
                kernel,
                epilogue: Some(_),
                ..
            } => {
                let k = prog.program.kernels.get(*kernel as usize)?;
                let KernelBody::Contraction(c) = &k.body else {
                    return None;
                };
                crate::epilogue::ConvEpilogue::of(c, *k.outputs.first()?, &prog.program)
            }
            _ => None,
        })
        .collect()
}

fn weight_err(name: &str, detail: String) -> BackendError {
    BackendError::Weight {
        name: name.to_string(),
        detail,
    }
}

impl Model {
    /// A model from a program, its function table (`prog.n_funcs` entries) and weights
    /// (parameters by name, constants under [`const_name`]).
    pub fn new(prog: CpuProgram, funcs: Vec<KernelFn>, weights: &Weights) -> Result<Model, BackendError> {
        if funcs.len() != prog.n_funcs as usize {
            return Err(BackendError::Runtime {
                op: "load".into(),
                value: prog.program.name.clone(),
                detail: format!(
                    "{} kernel functions given, the program has {}",
                    funcs.len(),
                    prog.n_funcs
                ),
            });
        }
        let mut kept = Weights::new();
        for (i, b) in prog.program.buffers.iter().enumerate() {
            let name = match &b.kind {
                BufferKind::Param { name } => name.clone(),
                // A constant left in the program may be overridden by a weight of its name.
                BufferKind::Constant(_) => const_name(BufferId(i as u32)),
                _ => continue,
            };
            let Some(t) = weights.get(&name) else {
                if matches!(b.kind, BufferKind::Constant(_)) {
                    continue;
                }
                return Err(weight_err(&name, format!("no weight given (expected {})", b.ty)));
            };
            if t.tensor_type() != b.ty {
                return Err(weight_err(&name, format!("expected {}, got {}", b.ty, t.tensor_type())));
            }
            kept.insert(name, t.clone());
        }
        // Constants overridden by name become params.
        let mut prog = prog;
        for (i, b) in prog.program.buffers.iter_mut().enumerate() {
            let name = const_name(BufferId(i as u32));
            if matches!(b.kind, BufferKind::Constant(_)) && kept.contains_key(&name) {
                b.kind = BufferKind::Param { name };
            }
        }
        let has_regions = prog
            .program
            .kernels
            .iter()
            .any(|k| matches!(&k.body, KernelBody::Opaque(o) if !o.regions.is_empty()));
        let mut region_weights = Weights::new();
        if has_regions {
            for (name, t) in weights {
                if !name.starts_with("@const/") {
                    region_weights.insert(name.clone(), t.clone());
                }
            }
        }
        let regions = prog
            .regions
            .iter()
            .map(|r| Model::new(r.program.clone(), funcs.clone(), weights))
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = prog
            .program
            .buffers
            .iter()
            .filter(|b| b.kind == BufferKind::Output)
            .map(|b| byte_len(b) as u64)
            .fold(0, u64::saturating_add);
        let run_bytes = (prog.plan.arena_bytes as u64).saturating_add(outputs);
        let derived = (0..prog.steps.len()).map(|_| Default::default()).collect();
        let chains = chains(&prog);
        let mut model = Model {
            chains,
            hoisted: vec![false; prog.steps.len()],
            blocked: Vec::new(),
            handed: std::sync::Mutex::new(BTreeMap::new()),
            derived,
            prog,
            funcs,
            regions,
            run_bytes,
            weights: kept,
            region_weights,
            arenas: std::sync::Mutex::new(Vec::new()),
            threads: rayon::current_num_threads().max(1),
        };
        model.hoist()?;
        model.blocked = crate::blocked::plan(&model.prog.program, &model.prog.steps, &model.chains, &model.hoisted);
        let before = model.prog.plan.arena_bytes;
        crate::blocked::place_padded(&model.prog.program, &mut model.prog.plan, &model.blocked);
        model.run_bytes = model
            .run_bytes
            .saturating_add((model.prog.plan.arena_bytes - before) as u64);
        Ok(model)
    }

    /// Run, once, every kernel that reads only weights (params, constants, and what such
    /// kernels wrote) — an imported RNN's gate reordering of its weight matrices, transposes,
    /// scalings folded into weights — and keep the results later kernels read as weights
    /// (`@hoisted/N`); runs skip those kernels. A model's weights never change, so neither do
    /// these results; and a kernel that reads them sees a weight, which it may prepare once
    /// (`contraction::WeightCache`). Kernels writing a program output, control flow and
    /// host-interpreted kernels are not hoisted.
    fn hoist(&mut self) -> Result<(), BackendError> {
        let p = &self.prog.program;
        let mut fixed: Vec<bool> = p.buffers.iter().map(|b| b.kind.is_weight()).collect();
        let mut hoisted = vec![false; p.kernels.len()];
        for (i, k) in p.kernels.iter().enumerate() {
            let runs_here = matches!(
                self.prog.steps.get(i),
                Some(Step::Loop { .. } | Step::Rows { .. } | Step::Contraction { .. } | Step::Native { .. })
            );
            if runs_here
                && k.reads().iter().all(|b| fixed[b.index()])
                && k.outputs.iter().all(|&o| p.buffer(o).kind == BufferKind::Temp)
            {
                hoisted[i] = true;
                for &o in &k.outputs {
                    fixed[o.index()] = true;
                }
            }
        }
        if !hoisted.contains(&true) {
            return Ok(());
        }
        // What the kept kernels read of the hoisted ones' results.
        let mut kept_reads: Vec<BufferId> = p
            .kernels
            .iter()
            .zip(&hoisted)
            .filter(|(_, h)| !**h)
            .flat_map(|(k, _)| k.reads())
            .filter(|b| fixed[b.index()] && p.buffer(*b).kind == BufferKind::Temp)
            .collect();
        kept_reads.sort();
        kept_reads.dedup();
        let mut frame = self.frame(p)?;
        for (i, b) in p.buffers.iter().enumerate() {
            let leaf = match &b.kind {
                BufferKind::Param { name } => self.weights.get(name),
                BufferKind::Constant(t) => Some(t),
                // Never read by a hoisted kernel.
                BufferKind::Input { .. } => {
                    frame.bufs.push(std::ptr::null_mut());
                    continue;
                }
                _ => None,
            };
            self.bind(&mut frame, BufferId(i as u32), b, leaf)?;
        }
        // Each result is taken as soon as it is written: the memory plan lets a later kernel
        // reuse its place once the (kept) kernels reading it have run, and those do not run here.
        let mut results = Vec::with_capacity(kept_reads.len());
        for (i, _) in hoisted.iter().enumerate().filter(|(_, h)| **h) {
            self.launch_step(&mut frame, i)?;
            for &id in &p.kernels[i].outputs {
                if kept_reads.binary_search(&id).is_ok() {
                    results.push((id, self.read(&frame, id, p.buffer(id))?));
                }
            }
        }
        self.finish(frame);
        for (id, t) in results {
            let name = format!("@hoisted/{}", id.index());
            self.prog.program.buffers[id.index()].kind = BufferKind::Param { name: name.clone() };
            self.weights.insert(name, t);
        }
        self.hoisted = hoisted;
        Ok(())
    }

    /// The kernels [`Model::hoist`] ran once when the model was made (they read only weights);
    /// runs skip them.
    pub fn hoisted_kernels(&self) -> Vec<&str> {
        self.prog
            .program
            .kernels
            .iter()
            .zip(&self.hoisted)
            .filter(|(_, h)| **h)
            .map(|(k, _)| k.name.as_str())
            .collect()
    }

    /// The program this model runs (hoisted kernels' results read as `@hoisted/N` params).
    pub fn program(&self) -> &CpuProgram {
        &self.prog
    }

    /// Limit the threads kernels are split across (1: run everything on the calling thread).
    pub fn set_threads(&mut self, n: usize) {
        self.threads = n.max(1);
        for r in &mut self.regions {
            r.set_threads(n);
        }
    }

    /// Graph inputs `(name, type)`, in buffer order.
    pub fn inputs(&self) -> Vec<(String, TensorType)> {
        self.prog
            .program
            .buffers
            .iter()
            .filter_map(|b| match &b.kind {
                BufferKind::Input { name } => Some((name.clone(), b.ty.clone())),
                _ => None,
            })
            .collect()
    }

    /// Graph outputs `(name, type)`, in order.
    pub fn outputs(&self) -> Vec<(String, TensorType)> {
        let p = &self.prog.program;
        p.outputs
            .iter()
            .map(|(n, b)| (n.clone(), p.buffer(*b).ty.clone()))
            .collect()
    }

    /// Check inputs by name against the program (names, dtypes, shapes).
    fn check_inputs(&self, inputs: &BTreeMap<String, TensorData>) -> Result<(), BackendError> {
        let specs = self.inputs();
        let known = || {
            specs
                .iter()
                .map(|(n, t)| format!("{n}: {t}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for name in inputs.keys() {
            if !specs.iter().any(|(n, _)| n == name) {
                return Err(BackendError::UnknownInput {
                    name: name.clone(),
                    known: known(),
                });
            }
        }
        for (name, ty) in &specs {
            let t = inputs.get(name).ok_or_else(|| BackendError::MissingInput {
                name: name.clone(),
                expected: ty.to_string(),
            })?;
            if &t.tensor_type() != ty {
                return Err(BackendError::InputMismatch {
                    name: name.clone(),
                    expected: ty.to_string(),
                    got: t.tensor_type().to_string(),
                });
            }
        }
        Ok(())
    }

    /// Run with inputs by name; outputs by name in graph order (oar's host runner,
    /// [`oar_ir::runner::run`], with this model as launcher).
    pub fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        self.check_inputs(inputs)?;
        runner::run(self, &self.prog.program, &self.weights, inputs, self.host())
    }

    /// The host fallback: the reference interpreter, with the weights regions read.
    fn host(&self) -> Host<'_> {
        Host {
            kernel: oar_backend_reference::run_kernel,
            weights: &self.region_weights,
        }
    }

    /// Run with the inputs by position (`inputs[k]` for the `k`-th of [`Model::inputs`]); the
    /// outputs in order — what a caller that runs one model many times uses once it has matched
    /// the inputs (each is still checked against its buffer's type).
    pub fn run_positional(&self, inputs: &[&TensorData]) -> Result<Vec<TensorData>, BackendError> {
        runner::run_positional(self, &self.prog.program, &self.weights, inputs, self.host())
    }

    /// Call a generated function over `0..extent`, split across threads when it is worth it;
    /// the status bits its calls returned (see [`KernelFn`]).
    fn call(&self, call: &LoopCall, bufs: &[*mut u8]) -> i32 {
        let f = self.funcs[call.func as usize];
        let n = call.extent;
        if n == 0 {
            return 0;
        }
        let work = n.saturating_mul(call.cost.max(1));
        let threads = self.threads as u64;
        if threads <= 1 || n == 1 || work < PARALLEL_MIN_WORK {
            return unsafe { f(bufs.as_ptr(), 0, n as i64) };
        }
        let chunks = threads.min(n).min(work / (PARALLEL_MIN_WORK / 2)).max(1);
        let base = bufs.as_ptr() as usize;
        split(chunks, threads, |c| {
            let (lo, hi) = (n * c / chunks, n * (c + 1) / chunks);
            // Safety: the functions are correct for any sub-range of their extent.
            unsafe { f(base as *const *mut u8, lo as i64, hi as i64) }
        })
    }
}

/// The error for a generated function's nonzero status.
fn kernel_status(k: &Kernel, status: i32) -> Result<(), BackendError> {
    let detail = if status & crate::program::KERNEL_DIV_BY_ZERO != 0 {
        "integer division (or remainder) by zero"
    } else if status & crate::program::KERNEL_NEGATIVE_POW != 0 {
        "integer power with a negative exponent"
    } else {
        return Ok(());
    };
    Err(BackendError::Runtime {
        op: k.name.clone(),
        value: String::new(),
        detail: detail.into(),
    })
}

impl Model {
    /// Run the pieces of a [`Step::Rows`] kernel: a block of rows through every piece, block
    /// after block (blocks split across threads when it is worth it).
    fn rows(&self, rows: u64, pieces: &[RowPiece], bufs: &[*mut u8]) -> i32 {
        if rows == 0 || pieces.iter().any(|p| p.per_row == 0) {
            return pieces.iter().fold(0, |s, p| s | self.call(&p.call, bufs));
        }
        let row_cost: u64 = pieces
            .iter()
            .map(|p| p.per_row.saturating_mul(p.call.cost.max(1)))
            .sum::<u64>()
            .max(1);
        // Rows per block: about ROW_BLOCK_WORK operations, so the block stays in L1/L2.
        let block = (ROW_BLOCK_WORK / row_cost).clamp(1, rows);
        let funcs: Vec<(KernelFn, i64)> = pieces
            .iter()
            .map(|p| (self.funcs[p.call.func as usize], p.per_row as i64))
            .collect();
        let run = |base: usize, lo: u64, hi: u64| {
            let mut r = lo;
            let mut status = 0;
            while r < hi {
                let end = (r + block).min(hi);
                for &(f, per) in &funcs {
                    // Safety: the functions are correct for any sub-range of their extent.
                    status |= unsafe { f(base as *const *mut u8, r as i64 * per, end as i64 * per) };
                }
                r = end;
            }
            status
        };
        let base = bufs.as_ptr() as usize;
        let work = rows.saturating_mul(row_cost);
        let threads = self.threads as u64;
        if threads <= 1 || rows == 1 || work < PARALLEL_MIN_WORK {
            return run(base, 0, rows);
        }
        let chunks = threads.min(rows).min(work / (PARALLEL_MIN_WORK / 2)).max(1);
        split(chunks, threads, |c| {
            run(base, rows * c / chunks, rows * (c + 1) / chunks)
        })
    }
}

/// Run `chunk(c)` for every `c` in `0..chunks` on up to `threads` threads ([`par_units`]:
/// never waiting for a pool thread to wake); the status bits of all, or-ed.
fn split(chunks: u64, threads: u64, chunk: impl Fn(u64) -> i32 + Sync) -> i32 {
    let status = AtomicI32::new(0);
    par_units(
        chunks as usize,
        threads as usize,
        || (),
        |_, c| {
            status.fetch_or(chunk(c as u64), Ordering::Relaxed);
        },
    );
    status.into_inner()
}

fn bad_step(k: &Kernel, detail: &str) -> BackendError {
    BackendError::Runtime {
        op: k.name.clone(),
        value: String::new(),
        detail: detail.to_string(),
    }
}

/// Bytes of a static buffer.
pub(crate) fn byte_len(b: &Buffer) -> usize {
    static_shape(&b.ty)
        .iter()
        .fold(b.ty.dtype.size_bytes(), |acc, &d| acc.saturating_mul(d))
}

/// Iterations after which a `while` loop is an error (as the reference interpreter's).
const MAX_WHILE_ITERATIONS: u64 = 1_000_000;

impl Model {
    /// Run compiled region `r` on `args` (in the region graph's input order); its outputs in
    /// order.
    fn region(&self, r: u32, args: &[TensorData]) -> Result<Vec<TensorData>, BackendError> {
        let m = &self.regions[r as usize];
        let names = &self.prog.regions[r as usize].inputs;
        let used: Vec<String> = m.inputs().into_iter().map(|(n, _)| n).collect();
        let feeds: BTreeMap<String, TensorData> = names
            .iter()
            .zip(args)
            .filter(|(n, _)| used.contains(n))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        Ok(m.run(&feeds)?.into_iter().map(|(_, t)| t).collect())
    }

    /// A `cond` or `while` kernel: the branch or the loop on the host, the regions compiled.
    fn control(&self, f: &mut CpuFrame, index: usize, regions: &[u32]) -> Result<(), BackendError> {
        let p = &self.prog.program;
        let k = &p.kernels[index];
        let KernelBody::Opaque(o) = &k.body else {
            return Err(bad_step(k, "control step on a kernel that is not cond/while"));
        };
        let args = o
            .inputs
            .iter()
            .map(|id| self.read(f, *id, p.buffer(*id)))
            .collect::<Result<Vec<_>, _>>()?;
        let truth = |t: &TensorData, what: &str| -> Result<bool, BackendError> {
            match (t.dtype(), t.bytes()) {
                (DType::Bool, [b]) => Ok(*b != 0),
                _ => Err(bad_step(
                    k,
                    &format!("{what} must be a bool scalar, got {}", t.tensor_type()),
                )),
            }
        };
        let results = match (&o.op, regions) {
            (Op::Cond, &[then_r, else_r]) => {
                let (pred, rest) = args
                    .split_first()
                    .ok_or_else(|| bad_step(k, "cond needs a predicate"))?;
                self.region(if truth(pred, "the predicate")? { then_r } else { else_r }, rest)?
            }
            (Op::While, &[cond_r, body_r]) => {
                let mut carried = args;
                let mut n = 0u64;
                loop {
                    let c = self.region(cond_r, &carried)?;
                    if !truth(
                        c.first().ok_or_else(|| bad_step(k, "while condition gave nothing"))?,
                        "the while condition",
                    )? {
                        break carried;
                    }
                    if n >= MAX_WHILE_ITERATIONS {
                        return Err(bad_step(
                            k,
                            &format!("while loop exceeded {MAX_WHILE_ITERATIONS} iterations"),
                        ));
                    }
                    n += 1;
                    carried = self.region(body_r, &carried)?;
                }
            }
            _ => return Err(bad_step(k, "control step with the wrong regions")),
        };
        if results.len() != k.outputs.len() {
            return Err(bad_step(k, "a region gave a different number of results than outputs"));
        }
        for (&id, t) in k.outputs.iter().zip(&results) {
            let b = p.buffer(id);
            if t.tensor_type() != b.ty {
                return Err(bad_step(
                    k,
                    &format!("a region gave {} for a {} buffer", t.tensor_type(), b.ty),
                ));
            }
            self.write(f, id, b, t)?;
        }
        Ok(())
    }
}

/// One run's memory: the arena (temporaries, 64-byte aligned), the outputs, and a pointer per
/// buffer (inputs and weights are read where they are).
pub struct CpuFrame {
    arena: Vec<u128>,
    base: *mut u8,
    outs: BTreeMap<BufferId, Vec<u8>>,
    bufs: Vec<*mut u8>,
}

impl Launcher for Model {
    type Frame = CpuFrame;

    fn frame(&self, p: &KernelProgram) -> Result<CpuFrame, BackendError> {
        // The plan was checked against the budget where it was made (maybe another machine,
        // for an AOT binary): check this process's budget before allocating.
        let need = self.run_bytes;
        let limit = oar_ir::memory::limit();
        if need > limit {
            return Err(BackendError::Runtime {
                op: "run".into(),
                value: p.name.clone(),
                detail: format!(
                    "needs {need} bytes of temporaries and outputs; the memory limit is {limit} bytes ({})",
                    oar_ir::memory::limit_source()
                ),
            });
        }
        let arena_len = self.prog.plan.arena_bytes.div_ceil(16) + 4;
        let mut arena = self
            .arenas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .filter(|a| a.len() == arena_len)
            .unwrap_or_else(|| vec![0u128; arena_len]);
        let base = {
            let ptr = arena.as_mut_ptr() as *mut u8;
            // Safety: the arena has 64 spare bytes for the alignment.
            unsafe { ptr.add(ptr.align_offset(64)) }
        };
        Ok(CpuFrame {
            arena,
            base,
            outs: BTreeMap::new(),
            bufs: Vec::with_capacity(p.buffers.len()),
        })
    }

    fn bind(&self, f: &mut CpuFrame, id: BufferId, b: &Buffer, leaf: Option<&TensorData>) -> Result<(), BackendError> {
        let ptr = match (&b.kind, leaf) {
            // Read in place: kernels never write their inputs or weights.
            (_, Some(t)) => t.bytes().as_ptr() as *mut u8,
            (BufferKind::Output, None) => {
                // Uninitialized, as PyTorch's outputs (zeroing first would cost a pass over
                // memory): the kernels that write an output write every byte of it, and the
                // length is set only when the run hands the buffer over ([`Model::output`]).
                let n = byte_len(b);
                f.outs
                    .entry(id)
                    .or_insert_with(|| {
                        self.reusable_output(id, n)
                            .unwrap_or_else(|| Vec::with_capacity(n.max(1)))
                    })
                    .as_mut_ptr()
            }
            _ => {
                let off = *self.prog.plan.offsets.get(&id).ok_or_else(|| BackendError::Runtime {
                    op: "arena".into(),
                    value: b.value.clone(),
                    detail: format!("temporary {id} has no place in the memory plan"),
                })?;
                // Safety: the plan keeps every temporary inside the arena.
                unsafe { f.base.add(off) }
            }
        };
        f.bufs.push(ptr);
        Ok(())
    }

    fn launch(&self, f: &mut CpuFrame, index: usize) -> Result<Launched, BackendError> {
        if self.hoisted.get(index) == Some(&true) {
            return Ok(Launched::Hoisted);
        }
        if let Some(Step::Fused { .. }) = self.prog.steps.get(index) {
            // Its results were written by the step it is fused into.
            return Ok(Launched::Device);
        }
        if crate::profile::enabled() {
            let start = std::time::Instant::now();
            let launched = self.launch_step(f, index)?;
            if let (Some(step), Some(k)) = (self.prog.steps.get(index), self.prog.program.kernels.get(index)) {
                crate::profile::record(&self.prog.program, k, step, start.elapsed());
            }
            return Ok(launched);
        }
        self.launch_step(f, index)
    }

    fn read(&self, f: &CpuFrame, id: BufferId, b: &Buffer) -> Result<TensorData, BackendError> {
        // Safety: the buffer's pointer is live and holds its static type's bytes.
        let bytes = unsafe { std::slice::from_raw_parts(f.bufs[id.index()], byte_len(b)) }.to_vec();
        TensorData::from_bytes(b.ty.dtype, static_shape(&b.ty), bytes).map_err(|e| BackendError::Runtime {
            op: "read".into(),
            value: b.value.clone(),
            detail: e.to_string(),
        })
    }

    fn write(&self, f: &mut CpuFrame, id: BufferId, b: &Buffer, t: &TensorData) -> Result<(), BackendError> {
        let n = byte_len(b).min(t.bytes().len());
        // Safety: the destination holds the buffer's bytes; the runner checked `t`'s type.
        unsafe { std::ptr::copy_nonoverlapping(t.bytes().as_ptr(), f.bufs[id.index()], n) };
        Ok(())
    }

    fn output(&self, f: &mut CpuFrame, id: BufferId, b: &Buffer, last: bool) -> Result<TensorData, BackendError> {
        if !matches!(b.kind, BufferKind::Output) {
            return self.read(f, id, b);
        }
        let n = byte_len(b);
        if let Some(v) = f.outs.get_mut(&id)
            && v.len() < n
        {
            assert!(v.capacity() >= n, "output buffer smaller than its type");
            // Safety: the program's kernels have run and written all `n` bytes of the output
            // (see `bind`); the capacity was reserved for them.
            unsafe { v.set_len(n) };
        }
        // Hand the buffer over unless a later output reads the same one.
        let mut v = if last {
            f.outs.remove(&id).unwrap_or_default()
        } else {
            f.outs.get(&id).cloned().unwrap_or_default()
        };
        v.truncate(n);
        let t = TensorData::from_bytes(b.ty.dtype, static_shape(&b.ty), v).map_err(|e| BackendError::Runtime {
            op: "output".into(),
            value: b.value.clone(),
            detail: e.to_string(),
        })?;
        if last {
            let mut handed = self.handed.lock().unwrap_or_else(|e| e.into_inner());
            let kept = handed.entry(id).or_default();
            kept.push(t.clone());
            if kept.len() > KEPT_OUTPUTS {
                kept.remove(0);
            }
        }
        Ok(t)
    }

    fn finish(&self, f: CpuFrame) {
        self.arenas.lock().unwrap_or_else(|e| e.into_inner()).push(f.arena);
    }
}

impl Model {
    /// The allocation of an output of buffer `id` that an earlier run handed over and its
    /// caller no longer holds, with room for `n` bytes (its contents are stale: the kernels
    /// write every byte of an output).
    fn reusable_output(&self, id: BufferId, n: usize) -> Option<Vec<u8>> {
        let mut handed = self.handed.lock().unwrap_or_else(|e| e.into_inner());
        let kept = handed.get_mut(&id)?;
        for i in 0..kept.len() {
            if kept[i].bytes().len() != n {
                continue;
            }
            match kept.remove(i).try_into_bytes() {
                Ok(v) => return Some(v),
                // The caller still holds it: keep it listed.
                Err(t) => kept.insert(i, t),
            }
        }
        None
    }

    /// An epilogue function `call` as a closure over ranges of its outer iterations, for a
    /// kernel to apply to the parts of its result it completes while they are in cache;
    /// status bits gather in `status`.
    fn epilogue_fn<'a>(
        &self,
        call: Option<&LoopCall>,
        bufs: &[*mut u8],
        status: &'a AtomicI32,
    ) -> Option<impl Fn(usize, usize) + Sync + 'a> {
        let base = bufs.as_ptr() as usize;
        call.map(|call| {
            let f = self.funcs[call.func as usize];
            move |lo: usize, hi: usize| {
                // Safety: the functions are correct for any sub-range of their extent; the
                // buffers are live while the step runs.
                let s = unsafe { f(base as *const *mut u8, lo as i64, hi as i64) };
                status.fetch_or(s, Ordering::Relaxed);
            }
        })
    }

    /// Run step `index` (the launcher's `launch`, profiled or not).
    fn launch_step(&self, f: &mut CpuFrame, index: usize) -> Result<Launched, BackendError> {
        let p = &self.prog.program;
        let bufs = &f.bufs;
        match self.prog.steps.get(index) {
            Some(Step::Loop { kernel, call }) => {
                kernel_status(&p.kernels[*kernel as usize], self.call(call, bufs))?;
            }
            Some(Step::Rows { kernel, rows, pieces }) => {
                kernel_status(&p.kernels[*kernel as usize], self.rows(*rows, pieces, bufs))?;
            }
            Some(Step::Contraction {
                kernel,
                epilogue,
                plane_iters,
            }) => {
                let k = &p.kernels[*kernel as usize];
                let KernelBody::Contraction(c) = &k.body else {
                    return Err(bad_step(k, "contraction step on a non-contraction kernel"));
                };
                let native = self.chains.get(index).and_then(Option::as_ref);
                if let Some(blocked) = self.blocked.get(index).and_then(Option::as_ref) {
                    // Safety: every buffer pointer is live and as long as its static type; the
                    // plan's blocked buffers are written and read by blocked steps only.
                    unsafe { blocked.run(bufs, self.threads, self.derived.get(index), native) };
                    return Ok(Launched::Device);
                }
                let status = AtomicI32::new(0);
                // The generated epilogue over outer iterations, or the recognized chain at full
                // vector width; either on the planes the kernel completes where it can.
                let generated = epilogue.as_ref().filter(|_| *plane_iters > 0 && native.is_none());
                let iters = self.epilogue_fn(generated, bufs, &status);
                let per = *plane_iters as usize;
                let by_plane = iters
                    .as_ref()
                    .map(|f| move |first: usize, n: usize| f(first * per, (first + n) * per));
                let (base, n) = (bufs.as_ptr() as usize, bufs.len());
                let chain = native.map(|chain| {
                    move |first: usize, count: usize| {
                        // Safety: the step's live buffers, the contraction's planes done.
                        unsafe { chain.apply(std::slice::from_raw_parts(base as *const *mut u8, n), first, count) }
                    }
                });
                let epi = match (&chain, &by_plane) {
                    (Some(f), _) => Some(f as contraction::PlaneEpilogue),
                    (None, Some(f)) => Some(f as contraction::PlaneEpilogue),
                    (None, None) => None,
                };
                // Safety: every buffer pointer is live and as long as its static type.
                let applied =
                    unsafe { contraction::run(c, k.outputs[0], p, bufs, self.threads, self.derived.get(index), epi)? };
                match (epilogue, native.zip(chain.as_ref())) {
                    (_, Some((native, apply))) if !applied => {
                        let planes = native.planes();
                        let per = (planes / (4 * self.threads).max(1)).max(1);
                        par_units(planes.div_ceil(per), self.threads, || (), |_, u| apply(u * per, per));
                    }
                    (_, Some(_)) => {}
                    (Some(_), None) if applied => kernel_status(k, status.load(Ordering::Relaxed))?,
                    (Some(call), None) => kernel_status(k, self.call(call, bufs))?,
                    (None, None) => {}
                }
            }
            Some(Step::Native { kernel, epilogue }) => {
                let k = &p.kernels[*kernel as usize];
                if let Some(blocked) = self.blocked.get(index).and_then(Option::as_ref) {
                    // Safety: as for the blocked convolutions above (a max pool from a blocked
                    // input; such steps have no epilogue).
                    unsafe { blocked.run(bufs, self.threads, None, None) };
                    return Ok(Launched::Device);
                }
                let status = AtomicI32::new(0);
                let e = epilogue.as_ref().filter(|e| e.plane_iters > 0);
                let iters = self.epilogue_fn(e.map(|e| &e.call), bufs, &status);
                let epi = iters.as_ref().zip(e).map(|(f, e)| contraction::IterEpilogue {
                    f,
                    per_plane: e.plane_iters as usize,
                    block: e.block as usize,
                });
                // Safety: as above.
                let applied = unsafe { crate::native::run(p, k, bufs, self.threads, self.derived.get(index), epi)? };
                if let Some(e) = epilogue {
                    // The fused kernel reports its own errors (an integer division by zero).
                    let fused = &p.kernels[e.kernel as usize];
                    if applied {
                        kernel_status(fused, status.load(Ordering::Relaxed))?;
                    } else {
                        kernel_status(fused, self.call(&e.call, bufs))?;
                    }
                }
            }
            Some(Step::Fused { .. }) => {}
            Some(Step::Control { kernel, regions }) => self.control(f, *kernel as usize, regions)?,
            Some(Step::Fail { kernel, detail }) => {
                let k = &p.kernels[*kernel as usize];
                return Err(BackendError::Runtime {
                    op: k.name.clone(),
                    value: k
                        .outputs
                        .first()
                        .map(|&b| p.buffer(b).value.clone())
                        .unwrap_or_default(),
                    detail: detail.clone(),
                });
            }
            Some(Step::Interpret { .. }) => return Ok(Launched::Host),
            None => return Err(bad_step(&p.kernels[index], "no step for the kernel")),
        }
        Ok(Launched::Device)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn split_ors_the_status_of_every_chunk() {
        for threads in [1, 2, 4] {
            for chunks in [0u64, 1, 2, 3, 7] {
                assert_eq!(super::split(chunks, threads, |c| 1 << c), (1 << chunks) - 1);
            }
        }
    }
}
