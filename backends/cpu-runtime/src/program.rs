//! What the CPU backend's compiler hands its runtime: a fully static kernel program, its
//! memory plan, and one [`Step`] per kernel saying how it runs (a generated function, a gemm
//! contraction with a generated epilogue, or the reference interpreter).
//!
//! The same [`CpuProgram`] drives the in-process JIT and AOT binaries: an AOT object embeds it
//! as a blob ([`encode_blob`]) next to a table of kernel function pointers.

use oar_ir::Weights;
use oar_ir::kernel::{BufferId, KernelProgram, MemoryPlan};
use serde::{Deserialize, Serialize};

/// A generated kernel function: `f(bufs, lo, hi)` runs outer iterations `lo..hi` of its loop
/// nest. `bufs[b]` is the base address of buffer `b` (a [`BufferId`] of the program). It
/// returns 0, or status bits — [`KERNEL_DIV_BY_ZERO`] when an integer division (or remainder)
/// had a zero divisor, [`KERNEL_NEGATIVE_POW`] when an integer power had a negative exponent:
/// errors the caller reports, as the reference does (the results are then junk).
pub type KernelFn = unsafe extern "C" fn(bufs: *const *mut u8, lo: i64, hi: i64) -> i32;

/// A generated function's status bit: an integer division or remainder by zero.
pub const KERNEL_DIV_BY_ZERO: i32 = 1;

/// A generated function's status bit: an integer power with a negative exponent.
pub const KERNEL_NEGATIVE_POW: i32 = 2;

/// One call of a generated function over an outer range `0..extent`, which the runtime may
/// split across threads (the function is correct for any sub-range).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopCall {
    /// Index into the kernel function table.
    pub func: u32,
    /// Number of outer iterations.
    pub extent: u64,
    /// Scalar operations per outer iteration (an estimate; decides splitting across threads).
    pub cost: u64,
}

/// One plain piece of a [`Step::Rows`] kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowPiece {
    /// The generated function.
    pub call: LoopCall,
    /// Outer iterations per row (`rows · per_row = extent`, rows in order), or 0 when its
    /// outer index does not follow rows.
    pub per_row: u64,
}

/// The epilogue of a [`Step::Native`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeEpilogue {
    /// The fused loop kernel (index into `program.kernels`; its step is [`Step::Fused`]).
    pub kernel: u32,
    /// Its generated function.
    pub call: LoopCall,
    /// Its outer iterations per output plane (image, channel) of a convolution when they run
    /// plane after plane in order, else 0 (then it runs after the kernel, over its extent).
    pub plane_iters: u64,
    /// Elements of a plane per outer iteration (the last of a plane may have fewer).
    #[serde(default)]
    pub block: u64,
}

/// How one kernel of the program runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// A loop kernel compiled to a function.
    Loop {
        /// Index into `program.kernels`.
        kernel: u32,
        /// The generated function.
        call: LoopCall,
    },
    /// matmul / conv computed by the runtime (gemm) into the output buffer, then the epilogue
    /// (if not the identity) applied in place by a generated function that reads the
    /// contraction result from the output buffer.
    Contraction {
        /// Index into `program.kernels`.
        kernel: u32,
        /// The generated epilogue.
        epilogue: Option<LoopCall>,
        /// For a convolution: the epilogue's outer iterations per output plane (image,
        /// channel) when they run plane after plane in order, else 0. Then a convolution path
        /// that completes whole planes applies the epilogue to them itself, while they are in
        /// cache, instead of in a pass of its own over the output.
        #[serde(default)]
        plane_iters: u64,
    },
    /// A loop kernel with reduction stages (layer_norm, softmax), run as generated plain
    /// pieces ([`oar_ir::kernel::LoopKernel::split_stages`]): each stage writes its scratch
    /// buffer (placed after the arena's temporaries), then the epilogue. With every piece
    /// aligned to rows, they run a block of rows at a time, so a row is still in cache when the
    /// next piece reads it; otherwise one after another over their whole extents.
    Rows {
        /// Index into `program.kernels`.
        kernel: u32,
        /// Outer points (rows) of the kernel.
        rows: u64,
        /// The pieces in order: stages, then the epilogue.
        pieces: Vec<RowPiece>,
    },
    /// A composite or data-movement op the runtime computes natively (`pad`, `gather`, the row
    /// ops, recurrences, integer products, …).
    Native {
        /// Index into `program.kernels`.
        kernel: u32,
        /// The next kernel, an elementwise loop over this one's result (an integer product's
        /// requantization, bias and activation), run as this step's epilogue: plane by plane
        /// as the kernel completes them where its path does, else after it. That kernel's own
        /// step is [`Step::Fused`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epilogue: Option<NativeEpilogue>,
    },
    /// A kernel run as the epilogue of an earlier [`Step::Native`]: nothing to do here.
    Fused {
        /// Index into `program.kernels`.
        kernel: u32,
        /// The kernel whose step runs it.
        into: u32,
    },
    /// `cond` / `while`: each region compiled as its own program ([`CpuProgram::regions`]);
    /// the runtime picks the branch, or loops, on the host and runs the regions' programs.
    Control {
        /// Index into `program.kernels`.
        kernel: u32,
        /// The regions' programs (`then`/`else`, or `cond`/`body`), indices into `regions`.
        regions: Vec<u32>,
    },
    /// A kernel that can only fail when it runs (a max/min over an empty axis, which has no
    /// identity): the runtime reports `detail`, as the reference would, when the step is reached.
    Fail {
        /// Index into `program.kernels`.
        kernel: u32,
        /// What is wrong.
        detail: String,
    },
    /// Run by the reference interpreter (opaque ops, dtypes the code generator does not handle).
    Interpret {
        /// Index into `program.kernels`.
        kernel: u32,
        /// Why it was not compiled (for `oar compile --emit clif` listings and reports).
        reason: String,
    },
}

/// A compiled model without its machine code: a program with every dim static, where
/// constants live in the weights under [`const_name`] names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuProgram {
    /// The static kernel program.
    pub program: KernelProgram,
    /// Where temporaries live in the arena.
    pub plan: MemoryPlan,
    /// One step per kernel, in order.
    pub steps: Vec<Step>,
    /// Number of generated functions (the function table's length, shared with the regions).
    pub n_funcs: u32,
    /// The compiled regions of control-flow kernels ([`Step::Control`]).
    #[serde(default)]
    pub regions: Vec<Region>,
}

/// A control-flow region compiled on its own: its program (function indices into the same
/// table as the enclosing program's) and its graph's input names in operand order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Region {
    /// The region's program.
    pub program: CpuProgram,
    /// The region graph's inputs, in operand order.
    pub inputs: Vec<String>,
}

/// The weight name a program constant is stored under.
pub fn const_name(b: BufferId) -> String {
    format!("@const/{}", b.0)
}

impl CpuProgram {
    /// The model's parameter buffers (not its constants), regions included, by name.
    pub fn params(&self) -> std::collections::BTreeMap<String, &oar_ir::kernel::Buffer> {
        let mut out = std::collections::BTreeMap::new();
        let mut stack = vec![self];
        while let Some(p) = stack.pop() {
            for b in &p.program.buffers {
                if let oar_ir::kernel::BufferKind::Param { name } = &b.kind
                    && !name.starts_with("@const/")
                {
                    out.insert(name.clone(), b);
                }
            }
            stack.extend(p.regions.iter().map(|r| &r.program));
        }
        out
    }
}

const MAGIC: &[u8; 8] = b"OARCPU01";

/// Serialize a program and its weights into one blob (`OARCPU01`, program JSON length, JSON,
/// safetensors weights). `weights` may be empty (weights shipped beside the binary).
pub fn encode_blob(program: &CpuProgram, weights: &Weights) -> Result<Vec<u8>, String> {
    let json = serde_json::to_vec(program).map_err(|e| format!("encoding the program: {e}"))?;
    let w = oar_ir::file::encode_weights(weights)?;
    let mut out = Vec::with_capacity(16 + json.len() + w.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&w);
    Ok(out)
}

/// Read a blob written by [`encode_blob`].
pub fn decode_blob(blob: &[u8]) -> Result<(CpuProgram, Weights), String> {
    if blob.len() < 16 || &blob[..8] != MAGIC {
        return Err("not an oar CPU program blob (bad magic)".into());
    }
    let n = u64::from_le_bytes(blob[8..16].try_into().expect("8 bytes")) as usize;
    let json = blob
        .get(16..16usize.saturating_add(n))
        .ok_or_else(|| format!("program blob truncated: {} bytes, header says {n} of JSON", blob.len()))?;
    let program: CpuProgram = serde_json::from_slice(json).map_err(|e| format!("decoding the program: {e}"))?;
    let rest = &blob[16 + n..];
    let weights = if rest.is_empty() {
        Weights::new()
    } else {
        oar_ir::file::decode_weights(rest)?
    };
    Ok((program, weights))
}

/// A tensor's static shape (every buffer of a [`CpuProgram`] is static).
pub fn static_shape(t: &oar_ir::TensorType) -> Vec<usize> {
    t.shape
        .as_static()
        .expect("CpuProgram buffers have static shapes (checked when lowering)")
}
