//! The one host runner of a [`KernelProgram`]: bind every buffer (inputs, weights and
//! constants with their contents, the rest fresh), run the kernels in order — each on the
//! backend's device, or on the host when the device leaves it there —, then read the outputs.
//!
//! A backend supplies memory and launches through [`Launcher`]; everything else (the leaf
//! checks and their errors, the fallback of a kernel to the host, the synchronization before a
//! host kernel reads device memory, the outputs) is here, once. The host fallback is a
//! [`HostKernel`] function: in-process backends pass `oar_backend_reference::run_kernel` (the
//! oracle, as evaluator of last resort), ahead-of-time binaries a function that refuses.
//! Backends whose memory is plain host memory implement [`HostLauncher`] instead and get the
//! buffers ([`HostBuffers`]) too.

use crate::backend::{BackendError, BoundedCache, Executable, check_inputs};
use crate::kernel::{Buffer, BufferId, BufferKind, KernelProgram};
use crate::{Graph, TensorData, Weights};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where a kernel ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launched {
    /// On the device (maybe still running: [`Launcher::sync`] waits).
    Device,
    /// Not at all: the runner runs it on the host.
    Host,
    /// Not this run: its results were computed once, when the program was loaded (a kernel
    /// that reads only weights, whose results later kernels read as weights too).
    Hoisted,
}

/// What a backend supplies to the runner: one run's memory and the launches.
pub trait Launcher {
    /// One run's memory: host buffers, device pointers, an arena.
    type Frame;

    /// Fresh memory for one run of `program` (no buffer bound yet).
    fn frame(&self, program: &KernelProgram) -> Result<Self::Frame, BackendError>;

    /// Provide buffer `id` (called once per buffer, in order). `leaf` holds the contents of
    /// inputs, params and constants, already checked against the buffer's type; other
    /// buffers start with any contents.
    fn bind(
        &self,
        frame: &mut Self::Frame,
        id: BufferId,
        buffer: &Buffer,
        leaf: Option<&TensorData>,
    ) -> Result<(), BackendError>;

    /// Run kernel `index` of the program, or leave it to the host.
    fn launch(&self, frame: &mut Self::Frame, index: usize) -> Result<Launched, BackendError>;

    /// Wait for launched work and report errors it recorded (error words). Called before a
    /// host kernel reads device memory and once at the end.
    fn sync(&self, _frame: &mut Self::Frame) -> Result<(), BackendError> {
        Ok(())
    }

    /// The contents of buffer `id`.
    fn read(&self, frame: &Self::Frame, id: BufferId, buffer: &Buffer) -> Result<TensorData, BackendError>;

    /// Overwrite buffer `id` with `t` (a host kernel's result, of the buffer's type).
    fn write(&self, frame: &mut Self::Frame, id: BufferId, buffer: &Buffer, t: &TensorData)
    -> Result<(), BackendError>;

    /// Output buffer `id`'s contents, at the end of the run; `last` when no later output reads
    /// the same buffer (its memory may be handed over instead of copied).
    fn output(
        &self,
        frame: &mut Self::Frame,
        id: BufferId,
        buffer: &Buffer,
        last: bool,
    ) -> Result<TensorData, BackendError> {
        let _ = last;
        self.read(frame, id, buffer)
    }

    /// The run is over (recycle its memory).
    fn finish(&self, _frame: Self::Frame) {}
}

/// A kernel run on the host: its operands are read through `read`, its results returned in
/// the kernel's output order (`oar_backend_reference::run_kernel` has this signature).
pub type HostKernel = fn(
    &KernelProgram,
    usize,
    &Weights,
    &mut dyn FnMut(BufferId) -> Result<TensorData, BackendError>,
) -> Result<Vec<TensorData>, BackendError>;

/// The host fallback: the function and the weights its regions read by name.
#[derive(Clone, Copy)]
pub struct Host<'a> {
    /// Runs one kernel.
    pub kernel: HostKernel,
    /// Weights by name (what `cond`/`while` regions read).
    pub weights: &'a Weights,
}

/// Run `program`: bind its buffers (inputs from `inputs`, params from `weights`, constants
/// from the program), run every kernel, read the outputs by name in program order.
pub fn run<L: Launcher>(
    launcher: &L,
    program: &KernelProgram,
    weights: &Weights,
    inputs: &BTreeMap<String, TensorData>,
    host: Host,
) -> Result<Vec<(String, TensorData)>, BackendError> {
    let outs = run_bound(launcher, program, host, |b| leaf(b, weights, inputs))?;
    Ok(program.outputs.iter().map(|(n, _)| n.clone()).zip(outs).collect())
}

/// [`run`] with the inputs by position — `inputs[k]` binds the program's `k`-th input buffer
/// (buffer order, as [`KernelProgram::inputs`] lists them) — and the outputs in program
/// order without names: the path of callers that run one program many times (eager ops) and
/// have matched the inputs once. Each input is still checked against its buffer's type.
pub fn run_positional<L: Launcher>(
    launcher: &L,
    program: &KernelProgram,
    weights: &Weights,
    inputs: &[&TensorData],
    host: Host,
) -> Result<Vec<TensorData>, BackendError> {
    let no_inputs = BTreeMap::new();
    let mut next = inputs.iter();
    run_bound(launcher, program, host, |b| match &b.kind {
        BufferKind::Input { name } => {
            let t = *next.next().ok_or_else(|| BackendError::MissingInput {
                name: name.clone(),
                expected: b.ty.to_string(),
            })?;
            checked_input(name, b, t).map(Some)
        }
        _ => leaf(b, weights, &no_inputs),
    })
}

/// Bind every buffer (`leaf` gives the contents of inputs, params and constants), run, and take
/// the outputs in program order.
fn run_bound<'a, L: Launcher>(
    launcher: &L,
    program: &'a KernelProgram,
    host: Host,
    mut leaf: impl FnMut(&'a Buffer) -> Result<Option<&'a TensorData>, BackendError>,
) -> Result<Vec<TensorData>, BackendError> {
    let mut frame = launcher.frame(program)?;
    for (i, b) in program.buffers.iter().enumerate() {
        launcher.bind(&mut frame, BufferId(i as u32), b, leaf(b)?)?;
    }
    execute(launcher, &mut frame, program, host)?;
    let mut out = Vec::with_capacity(program.outputs.len());
    for (i, (_, id)) in program.outputs.iter().enumerate() {
        let last = !program.outputs[i + 1..].iter().any(|(_, o)| o == id);
        out.push(launcher.output(&mut frame, *id, program.buffer(*id), last)?);
    }
    launcher.finish(frame);
    Ok(out)
}

/// Run every kernel of `program` in order on buffers already bound in `frame` (the part of
/// [`run`] a backend with its own binding — device-resident inputs — reuses), then sync.
pub fn execute<L: Launcher>(
    launcher: &L,
    frame: &mut L::Frame,
    program: &KernelProgram,
    host: Host,
) -> Result<(), BackendError> {
    let check = crate::numerics::enabled();
    for (index, k) in program.kernels.iter().enumerate() {
        let launched = launcher.launch(frame, index)?;
        if launched == Launched::Hoisted {
            continue;
        }
        if launched == Launched::Device {
            if check {
                launcher.sync(frame)?;
                check_results(launcher, frame, program, k)?;
            }
            continue;
        }
        launcher.sync(frame)?;
        let results = {
            let frame = &*frame;
            (host.kernel)(program, index, host.weights, &mut |id| {
                launcher.read(frame, id, program.buffer(id))
            })?
        };
        if results.len() != k.outputs.len() {
            return Err(wrong_result(k, "a different number of results than outputs"));
        }
        for (&id, t) in k.outputs.iter().zip(&results) {
            let b = program.buffer(id);
            if t.tensor_type() != b.ty {
                return Err(wrong_result(k, &format!("{} for a {} buffer", t.tensor_type(), b.ty)));
            }
            launcher.write(frame, id, b, t)?;
        }
        if check {
            check_results(launcher, frame, program, k)?;
        }
    }
    launcher.sync(frame)
}

/// The NaN/Inf debug mode: an error naming the kernel and the graph value it wrote when one of
/// its float results holds a NaN or an infinity.
fn check_results<L: Launcher>(
    launcher: &L,
    frame: &L::Frame,
    program: &KernelProgram,
    k: &crate::kernel::Kernel,
) -> Result<(), BackendError> {
    for &id in &k.outputs {
        let b = program.buffer(id);
        if !b.ty.dtype.is_float() {
            continue;
        }
        let t = launcher.read(frame, id, b)?;
        if let Some((i, v)) = crate::numerics::first_non_finite(&t) {
            let mut reads = Vec::new();
            for r in k.reads() {
                if !reads.contains(&r) {
                    reads.push(r);
                }
            }
            let operands: Vec<String> = reads
                .iter()
                .map(|&r| {
                    let rb = program.buffer(r);
                    format!("{} {}", rb.value, rb.ty)
                })
                .collect();
            return Err(BackendError::Runtime {
                op: k.name.clone(),
                value: b.value.clone(),
                detail: format!(
                    "kernel reading [{}] and writing {} {}{}",
                    operands.join(", "),
                    b.ty,
                    crate::numerics::describe(i, v),
                    crate::numerics::caller_location().map_or(String::new(), |l| format!(", called from {l}"))
                ),
            });
        }
    }
    Ok(())
}

fn wrong_result(k: &crate::kernel::Kernel, detail: &str) -> BackendError {
    BackendError::Runtime {
        op: k.name.clone(),
        value: k.outputs.first().map(|b| b.to_string()).unwrap_or_default(),
        detail: format!("the host run of the kernel gave {detail}"),
    }
}

/// The contents buffer `b` starts with, checked against its type: an input, a param or a
/// constant; `None` for temporaries and outputs.
pub fn leaf<'a>(
    b: &'a Buffer,
    weights: &'a Weights,
    inputs: &'a BTreeMap<String, TensorData>,
) -> Result<Option<&'a TensorData>, BackendError> {
    Ok(Some(match &b.kind {
        BufferKind::Input { name } => {
            let t = inputs.get(name).ok_or_else(|| BackendError::MissingInput {
                name: name.clone(),
                expected: b.ty.to_string(),
            })?;
            checked_input(name, b, t)?
        }
        BufferKind::Param { name } => {
            let t = weights.get(name).ok_or_else(|| BackendError::Weight {
                name: name.clone(),
                detail: format!("no weight given (expected {})", b.ty),
            })?;
            if t.tensor_type() != b.ty {
                return Err(BackendError::Weight {
                    name: name.clone(),
                    detail: format!("expected {}, got {}", b.ty, t.tensor_type()),
                });
            }
            t
        }
        BufferKind::Constant(t) => t,
        BufferKind::Temp | BufferKind::Output => return Ok(None),
    }))
}

/// Input `t` for buffer `b` (named `name`), if its dtype and shape are the buffer's (compared
/// without building a type: eager ops run this per call).
fn checked_input<'a>(name: &str, b: &Buffer, t: &'a TensorData) -> Result<&'a TensorData, BackendError> {
    let fits = t.dtype() == b.ty.dtype
        && t.shape().len() == b.ty.rank()
        && t.shape()
            .iter()
            .zip(b.ty.shape.dims())
            .all(|(&n, d)| d.as_static() == Some(n));
    if !fits {
        return Err(BackendError::InputMismatch {
            name: name.to_string(),
            expected: b.ty.to_string(),
            got: t.tensor_type().to_string(),
        });
    }
    Ok(t)
}

/// Bytes of a buffer with a static shape (0 for a symbolic one, which never reaches a run).
pub fn byte_len(b: &Buffer) -> usize {
    static_dims(b).iter().product::<usize>() * b.ty.dtype.size_bytes()
}

/// The static dims of a buffer (0 for a symbolic dim).
pub fn static_dims(b: &Buffer) -> Vec<usize> {
    b.ty.shape.dims().iter().map(|d| d.as_static().unwrap_or(0)).collect()
}

/// One run's memory of a [`HostLauncher`]: an 8-byte-aligned host allocation per buffer.
pub struct HostBuffers {
    bufs: Vec<Vec<u64>>,
}

impl HostBuffers {
    /// Each buffer's base address, by buffer id (what generated kernels take).
    pub fn pointers(&mut self) -> Vec<*mut u8> {
        self.bufs.iter_mut().map(|v| v.as_mut_ptr().cast()).collect()
    }

    /// Buffer `id`'s base address.
    pub fn pointer(&mut self, id: BufferId) -> *mut u8 {
        self.bufs[id.index()].as_mut_ptr().cast()
    }

    fn copy_in(&mut self, id: BufferId, src: &[u8]) {
        let dst = &mut self.bufs[id.index()];
        let n = src.len().min(dst.len() * 8);
        // Safety: both ranges hold `n` bytes and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), n) }
    }
}

/// A backend running kernels on host memory: it only launches.
pub trait HostLauncher {
    /// Run kernel `index` on `bufs`, or leave it to the host.
    fn launch(&self, index: usize, bufs: &mut HostBuffers) -> Result<Launched, BackendError>;
}

impl<T: HostLauncher> Launcher for T {
    type Frame = HostBuffers;

    fn frame(&self, program: &KernelProgram) -> Result<HostBuffers, BackendError> {
        let bufs = program
            .buffers
            .iter()
            .map(|b| vec![0u64; byte_len(b).div_ceil(8).max(1)])
            .collect();
        Ok(HostBuffers { bufs })
    }

    fn bind(
        &self,
        frame: &mut HostBuffers,
        id: BufferId,
        _: &Buffer,
        leaf: Option<&TensorData>,
    ) -> Result<(), BackendError> {
        if let Some(t) = leaf {
            frame.copy_in(id, t.bytes());
        }
        Ok(())
    }

    fn launch(&self, frame: &mut HostBuffers, index: usize) -> Result<Launched, BackendError> {
        HostLauncher::launch(self, index, frame)
    }

    fn read(&self, frame: &HostBuffers, id: BufferId, b: &Buffer) -> Result<TensorData, BackendError> {
        let v = &frame.bufs[id.index()];
        // Safety: u64 has no padding and u8 alignment 1; the allocation holds ≥ byte_len bytes.
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), byte_len(b)) };
        TensorData::from_bytes(b.ty.dtype, static_dims(b), bytes.to_vec()).map_err(|e| BackendError::Runtime {
            op: "read".into(),
            value: b.value.clone(),
            detail: e.to_string(),
        })
    }

    fn write(&self, frame: &mut HostBuffers, id: BufferId, _: &Buffer, t: &TensorData) -> Result<(), BackendError> {
        frame.copy_in(id, t.bytes());
        Ok(())
    }
}

/// A backend's compiled form of one specialized program, runnable by [`run`].
pub trait Compiled: Launcher + Send + Sync {
    /// The program it runs.
    fn program(&self) -> &KernelProgram;
}

/// Compiles a graph specialized to bindings of its symbolic dims.
pub type CompileFn<C> = dyn Fn(&Graph, &BTreeMap<String, usize>) -> Result<C, BackendError> + Send + Sync;

/// How many specializations (bindings of symbolic dims) an executable keeps compiled.
const SPECIALIZATIONS: usize = 16;

/// The executable of a backend built on the runner: the graph is specialized per binding of
/// its symbolic dims (compiled once each, cached), and every run goes through [`run`] with the
/// host fallback `host`.
pub struct Specializing<C> {
    graph: Graph,
    weights: Weights,
    host: HostKernel,
    compile: Box<CompileFn<C>>,
    programs: BoundedCache<BTreeMap<String, usize>, Arc<C>>,
}

impl<C: Compiled> Specializing<C> {
    /// An executable for `graph` (verified here); a graph with static inputs is compiled now,
    /// so its compile errors surface at compile time.
    pub fn new(
        graph: &Graph,
        weights: &Weights,
        host: HostKernel,
        compile: impl Fn(&Graph, &BTreeMap<String, usize>) -> Result<C, BackendError> + Send + Sync + 'static,
    ) -> Result<Specializing<C>, BackendError> {
        crate::verify(graph)?;
        let exe = Specializing {
            graph: graph.clone(),
            weights: weights.clone(),
            host,
            compile: Box::new(compile),
            programs: BoundedCache::new(SPECIALIZATIONS),
        };
        if exe.graph.input_specs().iter().all(|(_, t)| t.shape.is_static()) {
            exe.compiled(&BTreeMap::new())?;
        }
        Ok(exe)
    }

    /// The compiled program for `bindings`.
    pub fn compiled(&self, bindings: &BTreeMap<String, usize>) -> Result<Arc<C>, BackendError> {
        self.programs
            .get_or_try_insert_with(bindings, || (self.compile)(&self.graph, bindings).map(Arc::new))
    }
}

impl<C: Compiled> Executable for Specializing<C> {
    fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        let c = self.compiled(&check_inputs(&self.graph, inputs)?)?;
        let host = Host {
            kernel: self.host,
            weights: &self.weights,
        };
        run(&*c, c.program(), &self.weights, inputs, host)
    }
}
