//! The CUDA runtime of the PTX backend, on the driver API through `cudarc` (loaded
//! dynamically, so nothing here needs CUDA to build).
//!
//! A [`GpuProgram`] is a loaded module plus the program it came from, with its parameters and
//! constants uploaded once. Each run takes a device buffer per other program buffer (from a
//! caching allocator: freed blocks are kept by size and reused, see [`crate::pool`]), uploads
//! the inputs (or takes device-resident ones: [`GpuProgram::run_resident`]), launches the
//! kernels in order on the default stream, checks the error words, and hands over or
//! downloads the outputs. The loop itself is oar's host runner ([`oar_ir::runner`]; host
//! steps synchronize, download their operands, run the reference interpreter and upload the
//! results): this file supplies device memory and launches ([`Launcher`]). Simple on purpose:
//! no arena, no streams, no graph capture yet.

use crate::codegen::{Arch, PtxModule, Step};
use crate::pool::SizePool;
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use oar_ir::kernel::{Buffer, BufferId, BufferKind, Kernel, KernelBody, KernelProgram};
use oar_ir::runner::{self, Host, Launched, Launcher};
use oar_ir::{BackendError, DType, TensorData, Weights};
use std::collections::BTreeMap;
use std::ffi::{CString, c_void};
use std::sync::{Mutex, OnceLock};

/// The process's GPU: device 0 and its primary context.
pub struct Gpu {
    /// The device.
    pub device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// The architecture generated code targets on it.
    pub arch: Arch,
    /// Device name.
    pub name: String,
}

// SAFETY: a primary context handle may be made current on any thread (the driver API is
// thread-safe); the handle itself is never mutated.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

fn unavailable(reason: impl Into<String>) -> BackendError {
    BackendError::Unavailable {
        backend: "ptx".into(),
        reason: reason.into(),
    }
}

/// Whether the CUDA driver library can be loaded (never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// The GPU, initialized once per process; a typed error when there is no driver or device.
pub fn gpu() -> Result<&'static Gpu, BackendError> {
    static GPU: OnceLock<Result<Gpu, BackendError>> = OnceLock::new();
    GPU.get_or_init(init).as_ref().map_err(Clone::clone)
}

fn init() -> Result<Gpu, BackendError> {
    // cudarc panics on the first driver call when libcuda is missing: check first.
    if !driver_present() {
        return Err(unavailable("ptx backend: no CUDA driver (libcuda.so not found)"));
    }
    cu::init().map_err(|e| unavailable(format!("ptx backend: CUDA driver init failed: {e}")))?;
    let n = cu::device::get_count().map_err(|e| unavailable(format!("ptx backend: {e}")))?;
    if n < 1 {
        return Err(unavailable("ptx backend: no CUDA device"));
    }
    let device = cu::device::get(0).map_err(|e| unavailable(format!("ptx backend: device 0: {e}")))?;
    let attr = |a| unsafe { cu::device::get_attribute(device, a) };
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .map_err(|e| unavailable(format!("ptx backend: {e}")))?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        .map_err(|e| unavailable(format!("ptx backend: {e}")))?;
    let arch = Arch::for_capability(major, minor).ok_or_else(|| {
        unavailable(format!(
            "ptx backend: device has compute capability {major}.{minor}, needs 8.0+"
        ))
    })?;
    // SAFETY: `device` came from `device::get`.
    let ctx = unsafe { cu::primary_ctx::retain(device) }.map_err(|e| unavailable(format!("ptx backend: {e}")))?;
    let name = cu::device::get_name(device).unwrap_or_else(|_| "?".into());
    Ok(Gpu {
        device,
        ctx,
        arch,
        name,
    })
}

impl Gpu {
    /// Make the context current on this thread.
    fn bind(&self) -> Result<(), BackendError> {
        // SAFETY: the context was retained in `init` and is never released.
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(|e| drv("context", "set current", e))
    }
}

fn drv(value: &str, what: &str, e: cu::DriverError) -> BackendError {
    BackendError::Runtime {
        op: "ptx".into(),
        value: value.into(),
        detail: format!("{what}: {e}"),
    }
}

/// A program loaded on the GPU.
pub struct GpuProgram {
    program: KernelProgram,
    module: PtxModule,
    cu_module: sys::CUmodule,
    funcs: Vec<sys::CUfunction>,
    weights: Weights,
    /// Parameters and constants, uploaded once at load (`ptrs` by buffer, 0 for the others).
    resident: DeviceBuffers,
}

// SAFETY: module and function handles are plain driver handles, valid in the (shared) primary
// context from any thread; runs set the context current first.
unsafe impl Send for GpuProgram {}
unsafe impl Sync for GpuProgram {}

impl Drop for GpuProgram {
    fn drop(&mut self) {
        if let Ok(g) = gpu()
            && g.bind().is_ok()
        {
            // SAFETY: loaded in `load`, unloaded once here.
            let _ = unsafe { cu::module::unload(self.cu_module) };
        }
    }
}

fn byte_len(b: &Buffer) -> usize {
    b.ty.shape.as_static().map_or(0, |s| s.iter().product::<usize>()) * b.ty.dtype.size_bytes()
}

impl GpuProgram {
    /// Load `module` (generated from `program`) into the GPU's context; `weights` feed params.
    pub fn load(program: KernelProgram, module: PtxModule, weights: &Weights) -> Result<GpuProgram, BackendError> {
        let g = gpu()?;
        g.bind()?;
        // Every param has its weight, of its type (the runner's leaf check, inputs aside).
        let no_inputs = std::collections::BTreeMap::new();
        for b in program
            .buffers
            .iter()
            .filter(|b| matches!(b.kind, BufferKind::Param { .. }))
        {
            oar_ir::runner::leaf(b, weights, &no_inputs)?;
        }
        let text = CString::new(module.text())
            .map_err(|_| drv("module", "load", cu::DriverError(sys::CUresult::CUDA_ERROR_INVALID_PTX)))?;
        // SAFETY: a NUL-terminated PTX string.
        let cu_module = unsafe { cu::module::load_data(text.as_ptr() as *const c_void) }
            .map_err(|e| drv("module", "load PTX", e))?;
        let mut funcs = Vec::with_capacity(module.entries.len());
        for e in &module.entries {
            let name = CString::new(e.name.clone()).map_err(|_| {
                drv(
                    &e.name,
                    "entry name",
                    cu::DriverError(sys::CUresult::CUDA_ERROR_NOT_FOUND),
                )
            })?;
            // SAFETY: `cu_module` is loaded.
            funcs.push(
                unsafe { cu::module::get_function(cu_module, name) }
                    .map_err(|err| drv(&e.name, "get function", err))?,
            );
        }
        let mut resident = DeviceBuffers::default();
        for b in &program.buffers {
            let t = match &b.kind {
                BufferKind::Param { name } => weights.get(name),
                BufferKind::Constant(t) => Some(t),
                _ => None,
            };
            let ptr = match t {
                Some(t) => {
                    let ptr = dev_alloc(byte_len(b), &b.value)?;
                    resident.free.push((ptr, byte_len(b)));
                    upload(ptr, t.bytes(), &b.value)?;
                    ptr
                }
                None => 0,
            };
            resident.ptrs.push(ptr);
        }
        Ok(GpuProgram {
            program,
            module,
            cu_module,
            funcs,
            weights: weights.clone(),
            resident,
        })
    }

    /// The kernel program it runs.
    pub fn program(&self) -> &KernelProgram {
        &self.program
    }

    /// The generated module.
    pub fn module(&self) -> &PtxModule {
        &self.module
    }

    /// Run with inputs by name (already checked against the graph): upload them, run, download
    /// the outputs — oar's host runner ([`oar_ir::runner::run`]) with this GPU as launcher.
    pub fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        runner::run(self, &self.program, &self.weights, inputs, self.host())
    }

    /// The host fallback of the runner: the reference interpreter, one kernel at a time.
    fn host(&self) -> Host<'_> {
        Host {
            kernel: oar_backend_reference::run_kernel,
            weights: &self.weights,
        }
    }

    /// Run with device-resident inputs (by input name, each holding the input's bytes); the
    /// outputs are new allocations, in the program's output order. Nothing is copied to or from
    /// the host except for host steps and the error words.
    pub fn run_resident(
        &self,
        inputs: &BTreeMap<String, sys::CUdeviceptr>,
    ) -> Result<Vec<(String, GpuMemory)>, BackendError> {
        let p = &self.program;
        let mut frame = self.frame(p)?;
        for (i, b) in p.buffers.iter().enumerate() {
            match &b.kind {
                BufferKind::Input { name } if self.resident.ptrs[i] == 0 => {
                    let ptr = inputs.get(name).ok_or_else(|| BackendError::MissingInput {
                        name: name.clone(),
                        expected: b.ty.to_string(),
                    })?;
                    frame.mem.ptrs.push(*ptr);
                }
                _ => self.bind(&mut frame, BufferId(i as u32), b, None)?,
            }
        }
        runner::execute(self, &mut frame, p, self.host())?;
        // Hand each output's allocation to the caller; an output that is an input, a weight or
        // an output already handed over is copied instead.
        let mem = &mut frame.mem;
        let mut out = Vec::with_capacity(p.outputs.len());
        for (name, id) in &p.outputs {
            let b = p.buffer(*id);
            let ptr = mem.ptrs[id.index()];
            let memory = match mem.free.iter().position(|&(f, _)| f == ptr) {
                Some(i) => GpuMemory {
                    ptr: mem.free.swap_remove(i).0,
                    bytes: byte_len(b),
                },
                None => {
                    let m = GpuMemory::alloc(byte_len(b), &b.value)?;
                    if byte_len(b) > 0 {
                        // SAFETY: both hold the buffer's bytes.
                        unsafe { cu::memcpy_dtod_sync(m.ptr, ptr, byte_len(b)) }
                            .map_err(|e| drv(&b.value, "copy", e))?;
                    }
                    m
                }
            };
            out.push((name.clone(), memory));
        }
        Ok(out)
    }

    /// The error word set by entry `i`, as the runtime error naming its kernel.
    fn entry_error(&self, i: usize, word: u32) -> BackendError {
        let p = &self.program;
        let k = self.module.steps.iter().find_map(|s| match s {
            Step::Launch { kernel, entry } if *entry == i => Some(&p.kernels[*kernel]),
            _ => None,
        });
        let (op, value) = match k {
            Some(Kernel {
                body: KernelBody::Opaque(o),
                name,
                ..
            }) => (o.op.name().to_string(), name.clone()),
            Some(k) => ("kernel".to_string(), k.name.clone()),
            None => ("ptx".to_string(), self.module.entries[i].name.clone()),
        };
        let opaque = matches!(
            k,
            Some(Kernel {
                body: KernelBody::Opaque(_),
                ..
            })
        );
        BackendError::Runtime {
            op,
            value,
            detail: error_word_detail(word, opaque),
        }
    }
}

impl runner::Compiled for GpuProgram {
    fn program(&self) -> &KernelProgram {
        &self.program
    }
}

/// One run's device memory: a pointer per program buffer, the allocations it frees, and the
/// error words (one per entry, zeroed) when an entry can fail.
pub struct PtxFrame {
    mem: DeviceBuffers,
    errors: Option<sys::CUdeviceptr>,
}

impl Launcher for GpuProgram {
    type Frame = PtxFrame;

    fn frame(&self, _: &KernelProgram) -> Result<PtxFrame, BackendError> {
        gpu()?.bind()?;
        let mut mem = DeviceBuffers::default();
        // Gather indices, integer division by zero and negative integer powers set them.
        let n = self.module.entries.len();
        let errors = if self.module.entries.iter().any(|e| e.error_word) {
            let ptr = dev_alloc(4 * n, "error words")?;
            mem.free.push((ptr, 4 * n));
            upload(ptr, &vec![0u8; 4 * n], "error words")?;
            Some(ptr)
        } else {
            None
        };
        Ok(PtxFrame { mem, errors })
    }

    fn bind(&self, f: &mut PtxFrame, id: BufferId, b: &Buffer, leaf: Option<&TensorData>) -> Result<(), BackendError> {
        // Parameters and constants stay on the device from `load`.
        let resident = self.resident.ptrs[id.index()];
        if resident != 0 {
            f.mem.ptrs.push(resident);
            return Ok(());
        }
        let ptr = dev_alloc(byte_len(b), &b.value)?;
        f.mem.ptrs.push(ptr);
        f.mem.free.push((ptr, byte_len(b)));
        if let Some(t) = leaf {
            upload(ptr, t.bytes(), &b.value)?;
        }
        Ok(())
    }

    fn launch(&self, f: &mut PtxFrame, index: usize) -> Result<Launched, BackendError> {
        let entry = self.module.steps.iter().find_map(|s| match s {
            Step::Launch { kernel, entry } if *kernel == index => Some(*entry),
            _ => None,
        });
        let Some(entry) = entry else {
            return Ok(Launched::Host);
        };
        let e = &self.module.entries[entry];
        let mut args: Vec<u64> = e.params.iter().map(|b| f.mem.ptrs[b.index()]).collect();
        if let (true, Some(base)) = (e.error_word, f.errors) {
            args.push(base + 4 * entry as u64);
        }
        let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| a as *mut u64 as *mut c_void).collect();
        let name = &self.program.kernels[index].name;
        let profiling = profile::enabled();
        if profiling {
            cu::ctx::synchronize().map_err(|e| drv(name, "synchronize (profile)", e))?;
        }
        let started = std::time::Instant::now();
        // SAFETY: the entry takes exactly `params.len()` u64 pointers, each a live allocation
        // of the buffer's size; the launch copies the parameter values before returning.
        unsafe {
            cu::launch_kernel(
                self.funcs[entry],
                e.launch.grid,
                e.launch.block,
                0,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(|err| drv(name, "launch", err))?;
        if profiling {
            cu::ctx::synchronize().map_err(|e| drv(name, "synchronize (profile)", e))?;
            profile::record(
                &self.program.kernels[index],
                e.launch.grid,
                e.launch.block,
                started.elapsed(),
            );
        }
        Ok(Launched::Device)
    }

    fn sync(&self, f: &mut PtxFrame) -> Result<(), BackendError> {
        cu::ctx::synchronize().map_err(|e| drv(&self.program.name, "synchronize", e))?;
        if let Some(base) = f.errors {
            let mut words = vec![0u32; self.module.entries.len()];
            // SAFETY: `base` holds one u32 word per entry.
            unsafe { cu::memcpy_dtoh_sync(&mut words, base) }.map_err(|e| drv("error words", "download", e))?;
            if let Some(i) = words.iter().position(|&w| w != 0) {
                return Err(self.entry_error(i, words[i]));
            }
        }
        Ok(())
    }

    fn read(&self, f: &PtxFrame, id: BufferId, b: &Buffer) -> Result<TensorData, BackendError> {
        download(b, f.mem.ptrs[id.index()])
    }

    fn write(&self, f: &mut PtxFrame, id: BufferId, b: &Buffer, t: &TensorData) -> Result<(), BackendError> {
        upload(f.mem.ptrs[id.index()], t.bytes(), &b.value)
    }
}

/// What a nonzero error word means. Kernels generated here write 1 (gather: an index out of
/// range; loops: integer division by zero or a negative integer power); MLIR-made kernels
/// (`oar-backend-mlir`) OR bits: 1 division by zero, 2 negative power, 4 reduction over an
/// empty axis, 8 index out of range.
fn error_word_detail(word: u32, opaque: bool) -> String {
    if word == 1 {
        return if opaque {
            "index out of range"
        } else {
            "integer division by zero or integer power with a negative exponent"
        }
        .to_string();
    }
    let bits = [
        (1, "integer division by zero"),
        (2, "integer power with a negative exponent"),
        (4, "max/min/argmax over an empty axis"),
        (8, "index out of range"),
    ];
    let named: Vec<&str> = bits.iter().filter(|(b, _)| word & b != 0).map(|(_, s)| *s).collect();
    if named.is_empty() {
        format!("error word {word:#x} set")
    } else {
        named.join("; ")
    }
}

/// Device buffers by program buffer (`ptrs`), and the allocations this value owns and frees on
/// drop (`free`; also on errors).
#[derive(Default)]
struct DeviceBuffers {
    ptrs: Vec<sys::CUdeviceptr>,
    free: Vec<(sys::CUdeviceptr, usize)>,
}

impl Drop for DeviceBuffers {
    fn drop(&mut self) {
        if self.free.is_empty() {
            return;
        }
        let _ = cu::ctx::synchronize();
        for &(p, bytes) in &self.free {
            dev_free(p, bytes);
        }
    }
}

/// One allocation on the GPU, freed when dropped.
pub struct GpuMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

// SAFETY: a device address in the shared primary context; freeing binds the context first.
unsafe impl Send for GpuMemory {}
unsafe impl Sync for GpuMemory {}

impl GpuMemory {
    /// `bytes` of uninitialized device memory (`what` names it in errors).
    pub fn alloc(bytes: usize, what: &str) -> Result<GpuMemory, BackendError> {
        gpu()?.bind()?;
        let ptr = dev_alloc(bytes, what)?;
        Ok(GpuMemory { ptr, bytes })
    }

    /// A copy of `bytes` on the device.
    pub fn upload(bytes: &[u8], what: &str) -> Result<GpuMemory, BackendError> {
        let m = GpuMemory::alloc(bytes.len(), what)?;
        upload(m.ptr, bytes, what)?;
        Ok(m)
    }

    /// The device address.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True for a zero-byte allocation.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Copy `src`'s bytes (the same size) into this allocation, on the device.
    pub fn copy_from(&mut self, src: &GpuMemory, what: &str) -> Result<(), BackendError> {
        if src.bytes != self.bytes {
            return Err(BackendError::Runtime {
                op: "copy".into(),
                value: what.into(),
                detail: format!("source holds {} bytes, destination {}", src.bytes, self.bytes),
            });
        }
        gpu()?.bind()?;
        if self.bytes > 0 {
            // SAFETY: both allocations hold `bytes` bytes.
            unsafe { cu::memcpy_dtod_sync(self.ptr, src.ptr, self.bytes) }.map_err(|e| drv(what, "copy", e))?;
        }
        Ok(())
    }

    /// The bytes as a host tensor of `dtype` and `shape` (which must fill the allocation
    /// exactly; `what` names it in errors).
    pub fn to_tensor(&self, dtype: DType, shape: &[usize], what: &str) -> Result<TensorData, BackendError> {
        let want = shape.iter().product::<usize>() * dtype.size_bytes();
        if want != self.bytes {
            return Err(BackendError::Runtime {
                op: "download".into(),
                value: what.into(),
                detail: format!("the allocation holds {} bytes, the tensor {want}", self.bytes),
            });
        }
        gpu()?.bind()?;
        download_as(self.ptr, dtype, shape, what)
    }
}

impl Drop for GpuMemory {
    fn drop(&mut self) {
        if let Ok(g) = gpu()
            && g.bind().is_ok()
        {
            dev_free(self.ptr, self.bytes);
        }
    }
}

/// Per-kernel wall time, for finding where a program's time goes without a profiler: with
/// `OAR_GPU_PROFILE=1` every launch is synchronized before and after and its time added to
/// its kernel's row (slower runs; off by default).
pub mod profile {
    use oar_ir::kernel::{Kernel, KernelBody};
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    /// One kernel's launches: what it computes, its launch shape, calls and total time.
    #[derive(Clone, Debug)]
    pub struct Row {
        /// The kernel's name and, for an opaque kernel, its op (`conv2d`, `matmul`, ...).
        pub kernel: String,
        /// Grid × block of its last launch.
        pub launch: ([u32; 3], [u32; 3]),
        /// Launches.
        pub calls: u64,
        /// Total wall time.
        pub total: Duration,
    }

    /// Whether `OAR_GPU_PROFILE=1` (read once).
    pub fn enabled() -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| std::env::var("OAR_GPU_PROFILE").is_ok_and(|v| v == "1"))
    }

    fn table() -> &'static Mutex<BTreeMap<String, Row>> {
        static T: OnceLock<Mutex<BTreeMap<String, Row>>> = OnceLock::new();
        T.get_or_init(Default::default)
    }

    pub(crate) fn record(k: &Kernel, grid: (u32, u32, u32), block: (u32, u32, u32), t: Duration) {
        let kernel = match &k.body {
            KernelBody::Opaque(o) => format!("{} ({})", k.name, o.op.name()),
            _ => format!("{} (loops)", k.name),
        };
        let mut table = table().lock().unwrap_or_else(|e| e.into_inner());
        let row = table.entry(kernel.clone()).or_insert(Row {
            kernel,
            launch: ([0; 3], [0; 3]),
            calls: 0,
            total: Duration::ZERO,
        });
        row.launch = ([grid.0, grid.1, grid.2], [block.0, block.1, block.2]);
        row.calls += 1;
        row.total += t;
    }

    /// The rows recorded so far, most time first, and clears them.
    pub fn take() -> Vec<Row> {
        let mut rows: Vec<Row> = std::mem::take(&mut *table().lock().unwrap_or_else(|e| e.into_inner()))
            .into_values()
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.total));
        rows
    }
}

/// Wait for everything enqueued on the GPU (reports asynchronous faults).
pub fn synchronize() -> Result<(), BackendError> {
    gpu()?.bind()?;
    cu::ctx::synchronize().map_err(|e| drv("context", "synchronize", e))
}

/// Most bytes the caching allocator keeps for reuse (`OAR_GPU_CACHE_BYTES`, default 4 GiB).
fn cache_limit() -> usize {
    std::env::var("OAR_GPU_CACHE_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4 << 30)
}

fn pool() -> &'static Mutex<SizePool> {
    static POOL: OnceLock<Mutex<SizePool>> = OnceLock::new();
    POOL.get_or_init(|| Mutex::new(SizePool::new(cache_limit())))
}

/// Device memory of at least `bytes` bytes (the context is current): a cached block of the
/// rounded size, else `cuMemAlloc`; when that fails, the cache is released and it is tried
/// once more.
fn dev_alloc(bytes: usize, what: &str) -> Result<sys::CUdeviceptr, BackendError> {
    let size = crate::pool::round(bytes);
    if let Some(p) = pool().lock().unwrap_or_else(|e| e.into_inner()).take(size) {
        return Ok(p);
    }
    // SAFETY: plain allocations in the current context.
    match unsafe { cu::malloc_sync(size) } {
        Ok(p) => Ok(p),
        Err(_) => {
            release_cache();
            unsafe { cu::malloc_sync(size) }.map_err(|e| drv(what, &format!("alloc {bytes} bytes"), e))
        }
    }
}

/// Return `ptr` (from [`dev_alloc`] with `bytes`) to the cache, or free it when the cache is full.
fn dev_free(ptr: sys::CUdeviceptr, bytes: usize) {
    let extra = pool()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .give(crate::pool::round(bytes), ptr);
    if let Some(p) = extra {
        // SAFETY: allocated by `cuMemAlloc`, no longer referenced.
        let _ = unsafe { cu::free_sync(p) };
    }
}

/// Free every cached block (PyTorch's `empty_cache`).
pub fn release_cache() {
    let Ok(g) = gpu() else { return };
    if g.bind().is_err() {
        return;
    }
    let blocks = pool().lock().unwrap_or_else(|e| e.into_inner()).drain();
    if !blocks.is_empty() {
        let _ = cu::ctx::synchronize();
    }
    for p in blocks {
        // SAFETY: cached blocks are allocated and referenced by nothing.
        let _ = unsafe { cu::free_sync(p) };
    }
}

fn upload(dst: sys::CUdeviceptr, bytes: &[u8], what: &str) -> Result<(), BackendError> {
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: `dst` holds at least `bytes.len()` bytes (allocated for the buffer's type).
    unsafe { cu::memcpy_htod_sync(dst, bytes) }.map_err(|e| drv(what, "upload", e))
}

fn download(b: &Buffer, src: sys::CUdeviceptr) -> Result<TensorData, BackendError> {
    download_as(src, b.ty.dtype, &b.ty.shape.as_static().unwrap_or_default(), &b.value)
}

/// Copy `src` (holding a `dtype` tensor of `shape`) to the host; the context is current.
fn download_as(src: sys::CUdeviceptr, dtype: DType, shape: &[usize], what: &str) -> Result<TensorData, BackendError> {
    let mut bytes = vec![0u8; shape.iter().product::<usize>() * dtype.size_bytes()];
    if !bytes.is_empty() {
        // SAFETY: `src` holds the tensor's bytes.
        unsafe { cu::memcpy_dtoh_sync(&mut bytes, src) }.map_err(|e| drv(what, "download", e))?;
    }
    TensorData::from_bytes(dtype, shape.to_vec(), bytes).map_err(|e| BackendError::Runtime {
        op: "ptx".into(),
        value: what.into(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::error_word_detail;

    #[test]
    fn error_words_are_named() {
        assert_eq!(error_word_detail(1, true), "index out of range");
        assert!(error_word_detail(1, false).starts_with("integer division by zero or"));
        assert_eq!(error_word_detail(4, false), "max/min/argmax over an empty axis");
        assert_eq!(error_word_detail(8, true), "index out of range");
        assert_eq!(
            error_word_detail(3, false),
            "integer division by zero; integer power with a negative exponent"
        );
        assert_eq!(error_word_detail(0x40, false), "error word 0x40 set");
    }
}
