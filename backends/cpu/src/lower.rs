//! From a graph to a [`CpuProgram`]: specialize symbolic dims, run the standard passes, fuse
//! into kernels, plan memory, and decide for each kernel how it runs (a generated function, a
//! gemm contraction with a generated epilogue, or the reference interpreter).

use crate::CpuError;
use crate::codegen;
use oar_cpu_runtime::program::const_name;
use oar_cpu_runtime::{CpuProgram, LoopCall, RowPiece, Step};
use oar_ir::kernel::{
    Buffer, BufferId, BufferKind, ContractionKernel, IndexMap, Inst, KernelBody, KernelProgram, Load, LoopKernel,
    ScalarOp,
};
use oar_ir::{DType, Graph, Weights};
use std::collections::BTreeMap;

/// One function the code generator must emit: a loop kernel writing buffer `out`.
#[derive(Clone, Debug)]
pub struct FuncSpec {
    /// Symbol name (unique within the program).
    pub name: String,
    /// The loop nest.
    pub kernel: LoopKernel,
    /// The buffer it writes.
    pub out: BufferId,
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

/// Bind `bindings` in `graph`, optimize, fuse, plan and choose a step per kernel.
pub fn lower(graph: &Graph, bindings: &BTreeMap<String, usize>) -> Result<Lowered, CpuError> {
    lower_program(oar_passes::fuse::lower_to_kernels(graph, bindings)?)
}

/// Choose steps for an already fused program (every dim must be static).
pub fn lower_program(mut program: KernelProgram) -> Result<Lowered, CpuError> {
    let symbolic = program.symbolic_dims();
    if !symbolic.is_empty() {
        return Err(CpuError::Symbolic(symbolic));
    }
    oar_passes::legalize::legalize(&mut program, &crate::natives());
    let mut consts = Weights::new();
    for (i, b) in program.buffers.iter_mut().enumerate() {
        if let BufferKind::Constant(t) = &b.kind {
            let name = const_name(BufferId(i as u32));
            consts.insert(name.clone(), t.clone());
            b.kind = BufferKind::Param { name };
        }
    }
    let mut plan = oar_passes::memory_plan(&program, &BTreeMap::new())?;
    let mut funcs = Vec::new();
    let mut steps = Vec::new();
    for ki in 0..program.kernels.len() {
        let k = program.kernels[ki].clone();
        let kernel = ki as u32;
        let step = match &k.body {
            KernelBody::Loop(l) if !l.is_plain() => {
                // Stage results go to scratch buffers after the arena's temporaries (live only
                // while the kernel runs, so they never overlap a planned slot).
                let scratch = program.add_stage_buffers(&k.name, l);
                for &id in &scratch {
                    let b = program.buffer(id);
                    let size = b.ty.dtype.size_bytes() * b.ty.shape.as_static().map_or(0, |d| d.iter().product());
                    let off = plan.arena_bytes.div_ceil(plan.alignment.max(1)) * plan.alignment.max(1);
                    plan.offsets.insert(id, off);
                    plan.sizes.insert(id, size);
                    plan.arena_bytes = off + size;
                }
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
                        Step::Contraction { kernel, epilogue: None }
                    } else {
                        let l = epilogue_kernel(c, k.outputs[0], &program.buffers);
                        match codegen::analyze(&l, k.outputs[0], &program.buffers) {
                            Ok((extent, cost)) => {
                                let func = funcs.len() as u32;
                                funcs.push(FuncSpec {
                                    name: format!("oar_k{ki}_{}_epilogue", sanitize(&k.name)),
                                    kernel: l,
                                    out: k.outputs[0],
                                });
                                Step::Contraction {
                                    kernel,
                                    epilogue: Some(LoopCall { func, extent, cost }),
                                }
                            }
                            Err(reason) => Step::Interpret { kernel, reason },
                        }
                    }
                }
            },
            KernelBody::Opaque(o) if oar_cpu_runtime::native::supports(o, &program) => Step::Native { kernel },
            KernelBody::Opaque(o) => Step::Interpret {
                kernel,
                reason: format!("opaque op `{}`", o.op.name()),
            },
        };
        steps.push(step);
    }
    Ok(Lowered {
        cpu: CpuProgram {
            program,
            plan,
            steps,
            n_funcs: funcs.len() as u32,
        },
        funcs,
        consts,
    })
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

/// Whether the runtime's gemm path computes this contraction: f32/f64 throughout, and the
/// contraction result stored in the output buffer's dtype (the epilogue then runs in place).
fn contraction_support(c: &ContractionKernel, out: BufferId, buffers: &[Buffer]) -> Result<(), String> {
    let dt = |b: BufferId| buffers[b.index()].ty.dtype;
    let (l, r, o) = (dt(c.lhs.load.buffer), dt(c.rhs.load.buffer), dt(out));
    if !matches!(c.acc_dtype, DType::F32 | DType::F64) {
        return Err(format!("contraction in {}", c.acc_dtype));
    }
    if l != c.acc_dtype || r != c.acc_dtype || o != c.acc_dtype {
        return Err(format!("mixed dtypes: {l} x {r} -> {} -> {o}", c.acc_dtype));
    }
    Ok(())
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
