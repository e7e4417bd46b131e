//! From a graph to a [`CpuProgram`]: specialize symbolic dims, run the standard passes, fuse
//! into kernels, plan memory, and decide for each kernel how it runs (a generated function, a
//! gemm contraction with a generated epilogue, or the reference interpreter).

use crate::CpuError;
use crate::codegen;
use oar_cpu_runtime::program::Region;
use oar_cpu_runtime::program::const_name;
use oar_cpu_runtime::{CpuProgram, LoopCall, NativeEpilogue, RowPiece, Step};
use oar_ir::kernel::{
    Buffer, BufferId, BufferKind, Contraction, ContractionKernel, IndexMap, Inst, KernelBody, KernelProgram, Load,
    LoopKernel, MemoryPlan, ScalarOp,
};
use oar_ir::ops::ReduceOp;
use oar_ir::{DType, Graph, Weights};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One function the code generator must emit: a loop kernel writing buffer `out`.
#[derive(Clone, Debug)]
pub struct FuncSpec {
    /// Symbol name (unique within the program).
    pub name: String,
    /// The loop nest.
    pub kernel: LoopKernel,
    /// The buffer it writes.
    pub out: BufferId,
    /// The buffers of the program it belongs to (a control-flow region's own, for region
    /// functions); what `codegen::define_function` takes.
    pub buffers: Arc<Vec<Buffer>>,
    /// How its outer index is laid out beyond what the kernel implies.
    pub hints: codegen::Hints,
}

/// A lowered program: what the runtime runs, what the code generator emits, and the
/// program's constants (as weights under `@const/N`).
#[derive(Clone, Debug)]
pub struct Lowered {
    /// The runtime's program (function indices refer to `funcs`).
    pub cpu: CpuProgram,
    /// Functions to generate, by index.
    pub funcs: Vec<FuncSpec>,
    /// Constants moved out of the program.
    pub consts: Weights,
}

/// The composites this backend runs whole, as native kernels of the runtime
/// (`oar_cpu_runtime::native`): the row ops a row at a time take two or three passes over
/// cached memory, where their decompositions take a reduction kernel per statistic and an
/// epilogue that recomputes `exp`; `lstm_seq` and `gru_seq` run their recurrence as one loop (a
/// product and a fused cell per step) where their decompositions unroll every step into kernels;
/// `conv_transpose` (also every convolution's input gradient) scatters `wᵀ · x` with col2im
/// where its decomposition convolves a dilated, zero-padded input; `conv_weight_grad` (every
/// convolution's weight gradient) runs the runtime's direct or im2col + GEMM kernel where its
/// decomposition convolves the input with the cotangent as the kernel (a patch matrix of
/// the cotangent's size per weight element); `max_pool2d` replays each window's max tree on
/// rows of outputs without the `-inf`-padded copy of the input its decomposition pads and
/// slices; `max_pool2d_grad` replays each window's max
/// tree in one pass where its decomposition takes a slice, comparisons and a select per
/// kernel position; `sdpa` (scaled dot-product attention) runs per block of query rows without
/// materializing the scores, skipping causal attention's masked keys, where its decomposition
/// computes and masks every score; `adam_update` (a static training step's Adam / AdamW
/// update of one parameter) is one pass over the parameter, gradient and moments where its
/// decomposition is a chain of elementwise kernels; `matmul_integer` multiplies the 8-bit
/// operands as i16 pairs into exact i32 sums where its decomposition widens both to i32 first,
/// and `conv_integer` gathers patches of the 8-bit input into the same kernel where its
/// decomposition runs an f64 convolution; `gelu` (f32) is one pass at the host's vector width
/// with its own `erfc` formula (`ewise`), where its decomposition's `erf` expands to two
/// polynomials on Cranelift's 4-lane vectors — also when the graph spells it out (PyTorch's
/// ONNX export: `oar_passes::Recompose`) — where the runtime has them ([`keeps`]).
pub const KEPT_COMPOSITES: &[&str] = &[
    "softmax",
    "log_softmax",
    "layer_norm",
    "lstm_seq",
    "gru_seq",
    "conv_transpose",
    "conv_weight_grad",
    "max_pool2d",
    "max_pool2d_grad",
    "sdpa",
    "adam_update",
    "matmul_integer",
    "conv_integer",
    "gelu",
];

/// Which instances of [`KEPT_COMPOSITES`] stay whole: those the runtime's native kernels
/// compute (others are decomposed and compiled).
pub fn keeps(c: &oar_ir::Composite, inputs: &[oar_ir::TensorType]) -> bool {
    oar_cpu_runtime::native::whole_supported(c, inputs).unwrap_or(true)
}

/// Bind `bindings` in `graph`, optimize, fuse (keeping [`KEPT_COMPOSITES`] where [`keeps`]
/// holds), plan and choose a step per kernel.
pub fn lower(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<Lowered, CpuError> {
    // The model runs weight-only kernels once when it is made: inference batch norms fold into
    // the convolutions before them, whose epilogues become bias / residual / clamp chains (full
    // vector width, the blocked layout), as for a model exported with its batch norms folded.
    lower_program(oar_passes::fuse::lower_to_kernels_hoisting_weights(
        graph,
        bindings,
        KEPT_COMPOSITES,
        keeps,
    )?)
}

/// Choose steps for an already fused program (every dim must be static).
pub fn lower_program(mut program: KernelProgram) -> Result<Lowered, CpuError> {
    let symbolic = program.symbolic_dims();
    if !symbolic.is_empty() {
        return Err(CpuError::Symbolic(symbolic));
    }
    oar_passes::legalize::legalize(&mut program, &crate::natives());
    // Cranelift computes no f16/bf16: such loop kernels compute in f32 and round (same bits),
    // reading and writing bf16 buffers directly (f16 ones through f32 copies); bf16 matmuls and
    // convolutions read their bf16 operands where the host multiplies bf16.
    let support = oar_passes::legalize::HalfSupport {
        bf16_memory: true,
        bf16_products: oar_cpu_runtime::bf16::native(),
    };
    oar_passes::legalize::widen_half(&mut program, support);
    if support.bf16_products {
        oar_passes::legalize::fold_operand_casts(&mut program);
    }
    let mut consts = Weights::new();
    for (i, b) in program.buffers.iter_mut().enumerate() {
        if let BufferKind::Constant(t) = &b.kind {
            let name = const_name(BufferId(i as u32));
            consts.insert(name.clone(), t.clone());
            b.kind = BufferKind::Param { name };
        }
    }
    let joined = native_epilogues(&program);
    let pairs: Vec<(usize, usize)> = joined.iter().map(|(&a, j)| (a, j.epilogue)).collect();
    let mut plan = oar_passes::memory_plan_joined(&program, &BTreeMap::new(), &pairs)?;
    let mut funcs = Vec::new();
    let mut steps = Vec::new();
    let mut regions = Vec::new();
    for ki in 0..program.kernels.len() {
        let k = program.kernels[ki].clone();
        let kernel = ki as u32;
        if let Some(&(into, _)) = pairs.iter().find(|&&(_, b)| b == ki) {
            steps.push(Step::Fused {
                kernel,
                into: into as u32,
            });
            continue;
        }
        if let Some(j) = joined.get(&ki) {
            let b = j.epilogue;
            let e = &program.kernels[b];
            let KernelBody::Loop(l) = &e.body else {
                unreachable!("native_epilogues joins loop kernels")
            };
            let (out, hints) = (e.outputs[0], epilogue_hints(l));
            let (extent, cost, plane_iters, block) = j.plan;
            let func = funcs.len() as u32;
            funcs.push(FuncSpec {
                name: format!("oar_k{b}_{}", sanitize(&e.name)),
                kernel: l.clone(),
                out,
                buffers: Arc::default(),
                hints,
            });
            steps.push(Step::Native {
                kernel,
                epilogue: Some(NativeEpilogue {
                    kernel: b as u32,
                    call: LoopCall { func, extent, cost },
                    plane_iters,
                    block,
                }),
            });
            continue;
        }
        if let KernelBody::Loop(l) = &k.body
            && let Some(detail) = empty_extremum(l)
        {
            steps.push(Step::Fail { kernel, detail });
            continue;
        }
        let step = match &k.body {
            KernelBody::Loop(l) if !l.is_plain() => {
                // Stage results go to scratch buffers after the arena's temporaries (live only
                // while the kernel runs, so they never overlap a planned slot).
                let scratch = program.add_stage_buffers(&k.name, l);
                place_after_arena(&mut plan, &program, &scratch);
                match rows_step(l, k.outputs[0], &scratch, &program.buffers) {
                    Ok((rows, pieces)) => {
                        let n = pieces.len();
                        let pieces = pieces
                            .into_iter()
                            .enumerate()
                            .map(|(i, (piece, written, (extent, cost, per_row)))| {
                                let func = funcs.len() as u32;
                                let part = if i + 1 == n {
                                    "epilogue".to_string()
                                } else {
                                    format!("stage{i}")
                                };
                                funcs.push(FuncSpec {
                                    name: format!("oar_k{ki}_{}_{part}", sanitize(&k.name)),
                                    kernel: piece,
                                    out: written,
                                    buffers: Arc::default(),
                                    hints: Default::default(),
                                });
                                RowPiece {
                                    call: LoopCall { func, extent, cost },
                                    per_row,
                                }
                            })
                            .collect();
                        Step::Rows { kernel, rows, pieces }
                    }
                    Err(reason) => Step::Interpret { kernel, reason },
                }
            }
            KernelBody::Loop(l) => match codegen::analyze(l, k.outputs[0], &program.buffers) {
                Ok((extent, cost)) => {
                    let func = funcs.len() as u32;
                    funcs.push(FuncSpec {
                        name: format!("oar_k{ki}_{}", sanitize(&k.name)),
                        kernel: l.clone(),
                        out: k.outputs[0],
                        buffers: Arc::default(),
                        hints: Default::default(),
                    });
                    Step::Loop {
                        kernel,
                        call: LoopCall { func, extent, cost },
                    }
                }
                Err(reason) => Step::Interpret { kernel, reason },
            },
            KernelBody::Contraction(c) => match contraction_support(c, k.outputs[0], &program.buffers) {
                Err(reason) => Step::Interpret { kernel, reason },
                Ok(()) => {
                    if is_identity_epilogue(c) {
                        Step::Contraction {
                            kernel,
                            epilogue: None,
                            plane_iters: 0,
                        }
                    } else {
                        let l = epilogue_kernel(c, k.outputs[0], &program.buffers);
                        match codegen::analyze(&l, k.outputs[0], &program.buffers) {
                            Ok((extent, cost)) => {
                                let plane_iters = plane_iters(c, &l, k.outputs[0], &program.buffers);
                                let func = funcs.len() as u32;
                                funcs.push(FuncSpec {
                                    name: format!("oar_k{ki}_{}_epilogue", sanitize(&k.name)),
                                    kernel: l,
                                    out: k.outputs[0],
                                    buffers: Arc::default(),
                                    hints: Default::default(),
                                });
                                Step::Contraction {
                                    kernel,
                                    epilogue: Some(LoopCall { func, extent, cost }),
                                    plane_iters,
                                }
                            }
                            Err(reason) => Step::Interpret { kernel, reason },
                        }
                    }
                }
            },
            KernelBody::Opaque(o) if oar_cpu_runtime::native::supports(o, &program) => {
                Step::Native { kernel, epilogue: None }
            }
            KernelBody::Opaque(o) if !o.regions.is_empty() => {
                match lower_regions(&o.regions, ki, &mut funcs, &mut consts) {
                    Ok(compiled) => {
                        let first = regions.len() as u32;
                        let n = compiled.len() as u32;
                        regions.extend(compiled);
                        Step::Control {
                            kernel,
                            regions: (first..first + n).collect(),
                        }
                    }
                    Err(reason) => Step::Interpret { kernel, reason },
                }
            }
            KernelBody::Opaque(o) => Step::Interpret {
                kernel,
                reason: format!("opaque op `{}`", o.op.name()),
            },
        };
        steps.push(step);
    }
    // This program's functions read its final buffers (stage scratch buffers included);
    // region functions already have their region's.
    let bufs = Arc::new(program.buffers.clone());
    for f in funcs.iter_mut().filter(|f| f.buffers.is_empty()) {
        f.buffers = bufs.clone();
    }
    let mut cpu = CpuProgram {
        program,
        plan,
        steps,
        n_funcs: 0,
        regions,
    };
    set_table_len(&mut cpu, funcs.len() as u32);
    Ok(Lowered { cpu, funcs, consts })
}

/// By kernel `a`, the pairs `(a, a + 1)` of a native integer convolution and the elementwise
/// loop kernel after it that alone reads its i32 sums (their requantization: scale, bias, activation,
/// rounding and saturation to 8 bits), which run as one step: the loop as the convolution's
/// epilogue, applied to its output planes while they are in cache ([`Step::Native`]). Not
/// joined: convolutions of weights only (run once, when the model is made), sums a program
/// output or a second kernel reads, loops that reduce or read the sums other than
/// elementwise, or that the code generator does not take; none with
/// `OAR_CPU_NATIVE_EPILOGUE=0` (for comparisons).
fn native_epilogues(program: &KernelProgram) -> BTreeMap<usize, Joined> {
    let mut joined = BTreeMap::new();
    if std::env::var("OAR_CPU_NATIVE_EPILOGUE").is_ok_and(|v| v == "0") {
        return joined;
    }
    let mut readers: BTreeMap<BufferId, usize> = BTreeMap::new();
    for k in &program.kernels {
        let mut reads = k.reads();
        reads.sort();
        reads.dedup();
        for b in reads {
            *readers.entry(b).or_default() += 1;
        }
    }
    for (a, ka) in program.kernels.iter().enumerate() {
        let Some(kb) = program.kernels.get(a + 1) else { break };
        let (KernelBody::Opaque(o), KernelBody::Loop(l)) = (&ka.body, &kb.body) else {
            continue;
        };
        let [r] = ka.outputs.as_slice() else { continue };
        let rb = program.buffer(*r);
        let joins = matches!(o.op, oar_ir::Op::Composite(oar_ir::Composite::ConvInteger(_)))
            && oar_cpu_runtime::native::supports(o, program)
            && rb.kind == BufferKind::Temp
            && !ka.reads().iter().all(|&b| program.buffer(b).kind.is_weight())
            && readers.get(r) == Some(&1)
            && kb.outputs.len() == 1
            && l.reduce.is_empty()
            && l.shape == rb.ty.shape.dims()
            && l.loads.iter().any(|ld| ld.buffer == *r)
            && l.loads
                .iter()
                .filter(|ld| ld.buffer == *r)
                .all(|ld| ld.map.is_identity() && ld.map.view == rb.ty.shape.0);
        if let Some(plan) = joins
            .then(|| codegen::analyze_planes(l, kb.outputs[0], &program.buffers, epilogue_hints(l)))
            .flatten()
        {
            joined.insert(a, Joined { epilogue: a + 1, plan });
        }
    }
    joined
}

/// A native kernel's epilogue ([`native_epilogues`]): the loop kernel, and its function's
/// plan `(extent, cost, outer iterations per plane, elements per iteration)`.
struct Joined {
    epilogue: usize,
    plan: (u64, u64, u64, u64),
}

/// Elements of a native convolution's output per call of its epilogue's function at most: a
/// thread applies it to the columns of a block of planes it has just finished.
const EPILOGUE_BLOCK: u64 = 64;

/// A native convolution's epilogue runs over its planes (image, channel), each plane's pixels
/// in blocks of [`EPILOGUE_BLOCK`].
fn epilogue_hints(l: &LoopKernel) -> codegen::Hints {
    codegen::Hints {
        planes: l.shape.len().saturating_sub(2),
        max_block: EPILOGUE_BLOCK,
    }
}

/// Give `buffers` places after the arena's temporaries (scratch live only while one kernel runs).
fn place_after_arena(plan: &mut MemoryPlan, program: &KernelProgram, buffers: &[BufferId]) {
    for &id in buffers {
        let b = program.buffer(id);
        let size = b.ty.dtype.size_bytes() * b.ty.shape.as_static().map_or(0, |d| d.iter().product());
        let off = plan.arena_bytes.div_ceil(plan.alignment.max(1)) * plan.alignment.max(1);
        plan.offsets.insert(id, off);
        plan.sizes.insert(id, size);
        plan.arena_bytes = off + size;
    }
}

/// The error a loop kernel always reports: a max/min stage over an empty reduction for a
/// nonempty output (the reference's "has no identity").
fn empty_extremum(l: &LoopKernel) -> Option<String> {
    let size = |d: &[oar_ir::Dim]| d.iter().map(|d| d.as_static().unwrap_or(1)).product::<usize>();
    if size(&l.shape) == 0 {
        return None;
    }
    l.reduce
        .iter()
        .find(|r| matches!(r.op, ReduceOp::Max | ReduceOp::Min) && size(&r.dims) == 0)
        .map(|r| format!("{} over an empty axis has no identity", r.op.name()))
}

/// Every (nested) program shares one function table of `n` entries.
fn set_table_len(p: &mut CpuProgram, n: u32) {
    p.n_funcs = n;
    for r in &mut p.regions {
        set_table_len(&mut r.program, n);
    }
}

/// Lower each region of control-flow kernel `ki` (IR text) as a program of its own: its
/// functions join `funcs` (renamed, their indices shifted), its constants join `consts` under
/// names of their own.
fn lower_regions(
    texts: &[String],
    ki: usize,
    funcs: &mut Vec<FuncSpec>,
    consts: &mut Weights,
) -> Result<Vec<Region>, String> {
    let mut out = Vec::with_capacity(texts.len());
    for (ri, text) in texts.iter().enumerate() {
        let g = oar_ir::text::parse_graph(text).map_err(|e| format!("region {ri}: {e}"))?;
        let inputs = g.input_specs().into_iter().map(|(n, _)| n).collect();
        let mut l = lower(&g, &BTreeMap::new()).map_err(|e| format!("region {ri}: {e}"))?;
        let prefix = format!("r{ki}_{ri}_");
        rename_consts(&mut l.cpu, &mut l.consts, &format!("@k{ki}r{ri}"));
        shift_funcs(&mut l.cpu, funcs.len() as u32);
        for mut f in l.funcs {
            f.name = format!("{prefix}{}", f.name);
            funcs.push(f);
        }
        consts.extend(l.consts);
        out.push(Region { program: l.cpu, inputs });
    }
    Ok(out)
}

/// Constants of a region program (and its own regions) renamed `<tag>/<name>`, so they do not
/// collide with the enclosing program's in the shared weights.
fn rename_consts(p: &mut CpuProgram, consts: &mut Weights, tag: &str) {
    let mut renamed = Weights::new();
    let mut fix = |p: &mut CpuProgram| {
        for b in &mut p.program.buffers {
            if let BufferKind::Param { name } = &mut b.kind
                && let Some(t) = consts.remove(name.as_str())
            {
                *name = format!("{tag}/{name}");
                renamed.insert(name.clone(), t);
            }
        }
    };
    fn walk(p: &mut CpuProgram, f: &mut dyn FnMut(&mut CpuProgram)) {
        f(p);
        for r in &mut p.regions {
            walk(&mut r.program, f);
        }
    }
    walk(p, &mut fix);
    consts.extend(renamed);
}

/// Shift every function index of `p` (and its regions) by `by`.
fn shift_funcs(p: &mut CpuProgram, by: u32) {
    for s in &mut p.steps {
        match s {
            Step::Loop { call, .. } => call.func += by,
            Step::Contraction {
                epilogue: Some(call), ..
            } => call.func += by,
            Step::Rows { pieces, .. } => pieces.iter_mut().for_each(|p| p.call.func += by),
            _ => {}
        }
    }
    for r in &mut p.regions {
        shift_funcs(&mut r.program, by);
    }
}

type AnalyzedPiece = (LoopKernel, BufferId, (u64, u64, u64));

/// The outer points (rows) of a kernel with reduction stages and its plain pieces, each
/// analyzed for row-block execution.
fn rows_step(
    l: &LoopKernel,
    out: BufferId,
    scratch: &[BufferId],
    buffers: &[Buffer],
) -> Result<(u64, Vec<AnalyzedPiece>), String> {
    let rows: u64 = l.shape[..l.outer]
        .iter()
        .map(|d| d.as_static().map(|n| n as u64).ok_or("a symbolic row dim"))
        .product::<Result<u64, _>>()?;
    let pieces = l
        .split_stages(out, scratch)?
        .into_iter()
        .map(|(piece, written)| {
            let a = codegen::analyze_rows(&piece, written, buffers, rows)?;
            Ok((piece, written, a))
        })
        .collect::<Result<_, String>>()?;
    Ok((rows, pieces))
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Whether the runtime computes this contraction: operands, result and output buffer of one
/// dtype the runtime handles (f32/f64 through gemm; integer matmul wrapping like the reference),
/// so the epilogue can run in place.
fn contraction_support(c: &ContractionKernel, out: BufferId, buffers: &[Buffer]) -> Result<(), String> {
    let dt = |b: BufferId| buffers[b.index()].ty.dtype;
    let (l, r, o) = (
        c.lhs.element_dtype(dt(c.lhs.load.buffer)),
        c.rhs.element_dtype(dt(c.rhs.load.buffer)),
        dt(out),
    );
    if !oar_cpu_runtime::contraction_supported(c.acc_dtype, &c.op) {
        return Err(format!("contraction in {}", c.acc_dtype));
    }
    // bf16 operands accumulated in f32 (left in bf16 by `widen_half` on hosts with native
    // bf16 products, or f32 ones rounded as they are read after `fold_operand_casts`; the
    // runtime widens them itself on others).
    let bf16_in_f32 = l == DType::BF16 && r == DType::BF16 && c.acc_dtype == DType::F32 && o == DType::F32;
    if !bf16_in_f32 && (l != c.acc_dtype || r != c.acc_dtype || o != c.acc_dtype) {
        return Err(format!("mixed dtypes: {l} x {r} -> {} -> {o}", c.acc_dtype));
    }
    Ok(())
}

/// For a convolution, the outer iterations of its epilogue function `l` per output plane
/// (image, channel) when they run plane after plane in order, else 0 (see
/// [`Step::Contraction`]).
fn plane_iters(c: &ContractionKernel, l: &LoopKernel, out: BufferId, buffers: &[Buffer]) -> u64 {
    if !matches!(c.op, Contraction::Conv(_)) {
        return 0;
    }
    let dims: Option<Vec<u64>> = c.shape.iter().map(|d| d.as_static().map(|v| v as u64)).collect();
    match dims.as_deref() {
        Some([n, o, _, ..]) => codegen::analyze_rows(l, out, buffers, n * o).map_or(0, |(_, _, per)| per),
        _ => 0,
    }
}

fn is_identity_epilogue(c: &ContractionKernel) -> bool {
    matches!(
        c.epilogue.as_slice(),
        [Inst {
            op: ScalarOp::Acc(0),
            ..
        }]
    )
}

/// A contraction's epilogue as a loop kernel that reads the contraction result from the
/// output buffer (an extra load, identity map) and writes the output buffer in place.
pub fn epilogue_kernel(c: &ContractionKernel, out: BufferId, buffers: &[Buffer]) -> LoopKernel {
    let mut loads = c.loads.clone();
    let acc = loads.len();
    loads.push(Load {
        buffer: out,
        map: IndexMap::identity(buffers[out.index()].ty.shape.dims()),
    });
    let body = c
        .epilogue
        .iter()
        .map(|i| match i.op {
            ScalarOp::Acc(_) => Inst {
                op: ScalarOp::Load(acc),
                dtype: i.dtype,
            },
            _ => i.clone(),
        })
        .collect();
    LoopKernel {
        shape: c.shape.clone(),
        loads,
        outer: c.shape.len(),
        reduce: Vec::new(),
        body,
    }
}
