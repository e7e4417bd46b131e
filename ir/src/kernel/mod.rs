//! The kernel description: what fusion produces and every code generator consumes.
//!
//! A [`KernelProgram`] is a list of buffers (graph inputs, params, constants, temporaries,
//! outputs) and an ordered list of [`Kernel`]s, each reading buffers and writing one (or, for
//! opaque kernels, several). Kernels come in three kinds:
//!
//! - [`LoopKernel`]: a loop nest over an output shape, inputs read through affine
//!   [`IndexMap`]s, a scalar SSA body ([`Inst`]), and optional reduction stages computed per
//!   point of the leading (outer) output loops, whose results the body reads as
//!   [`ScalarOp::Acc`] (so the body is then the epilogue). A backend without stage support
//!   runs [`LoopKernel::split_stages`]' plain pieces.
//! - [`ContractionKernel`]: an anchor (matmul or conv) whose operands are read through index
//!   maps, with a fused elementwise epilogue in the same scalar language.
//! - [`OpaqueKernel`]: one IR op that does not fit the loop form (gather, pad, concat, iota, ...).
//!
//! The full contract (loop numbering, index maps, views, numerics) is in `docs/KERNELS.md`.

mod plan;
mod print;
mod stages;

pub use plan::MemoryPlan;
pub use stages::Piece;

use crate::ops::{BinaryOp, Float, Op, ReduceOp, UnaryOp};
use crate::{DType, Dim, TensorData, TensorType};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A buffer's index in [`KernelProgram::buffers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferId(pub u32);

impl BufferId {
    /// The index as `usize`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// Where a buffer's contents come from and how long it lives.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BufferKind {
    /// A graph input, fed by the caller by name.
    Input {
        /// The input's name.
        name: String,
    },
    /// A parameter, read from the weights by name.
    Param {
        /// The weight's name.
        name: String,
    },
    /// A constant tensor stored in the program.
    Constant(TensorData),
    /// Written by one kernel, read by later kernels, dead at the end: what memory planning packs.
    Temp,
    /// Written by one kernel and returned to the caller (see [`KernelProgram::outputs`]).
    Output,
}

impl BufferKind {
    /// A parameter or a constant: what no kernel writes, the same on every run of a model.
    pub fn is_weight(&self) -> bool {
        matches!(self, BufferKind::Param { .. } | BufferKind::Constant(_))
    }
}

/// One buffer: a dense row-major tensor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Buffer {
    /// Its role.
    pub kind: BufferKind,
    /// dtype and shape (symbolic dims allowed; bound when the program runs).
    pub ty: TensorType,
    /// The IR value it holds (`%12`), for reading printed programs next to the graph.
    pub value: String,
}

/// An affine function of the loop indices: `offset + Σ coef · i[loop]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AffineExpr {
    /// `(loop index, coefficient)` pairs, loops unique, coefficients nonzero.
    pub terms: Vec<(usize, i64)>,
    /// Constant term.
    pub offset: i64,
}

impl AffineExpr {
    /// The constant `c`.
    pub fn constant(c: i64) -> AffineExpr {
        AffineExpr {
            terms: Vec::new(),
            offset: c,
        }
    }

    /// Loop index `i[l]`.
    pub fn loop_index(l: usize) -> AffineExpr {
        AffineExpr {
            terms: vec![(l, 1)],
            offset: 0,
        }
    }

    /// `offset + step · self`.
    pub fn scaled(&self, step: i64, offset: i64) -> AffineExpr {
        AffineExpr {
            terms: if step == 0 {
                Vec::new()
            } else {
                self.terms.iter().map(|&(l, c)| (l, c * step)).collect()
            },
            offset: self.offset * step + offset,
        }
    }

    /// True if this is exactly `i[l]`.
    pub fn is_loop(&self, l: usize) -> bool {
        self.offset == 0 && self.terms == [(l, 1)]
    }

    /// The value at concrete loop indices (`None` if a term names a loop past `idx`).
    pub fn eval(&self, idx: &[usize]) -> Option<i64> {
        self.terms
            .iter()
            .try_fold(self.offset, |acc, &(l, c)| Some(acc + c * *idx.get(l)? as i64))
    }
}

/// How a kernel reads a buffer: the buffer is viewed as a row-major tensor of shape `view`
/// (same element count as the buffer: a reshape of contiguous data costs nothing), and view
/// axis `a` is indexed by `axes[a]`, an affine function of the kernel's loop indices.
/// Broadcast is an axis with no loop term (stride 0), transpose a permutation of loops, a slice
/// an offset and a step.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IndexMap {
    /// The shape the buffer is viewed as.
    pub view: Vec<Dim>,
    /// One index expression per view axis.
    pub axes: Vec<AffineExpr>,
}

impl IndexMap {
    /// The identity map over a buffer of shape `shape`, read at loops `0..rank`.
    pub fn identity(shape: &[Dim]) -> IndexMap {
        IndexMap {
            view: shape.to_vec(),
            axes: (0..shape.len()).map(AffineExpr::loop_index).collect(),
        }
    }

    /// True if view axis `a` is indexed by loop `a` for every axis (an in-place candidate).
    pub fn is_identity(&self) -> bool {
        self.axes.iter().enumerate().all(|(a, e)| e.is_loop(a))
    }
}

/// A buffer read through an index map.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Load {
    /// The buffer read.
    pub buffer: BufferId,
    /// How loop indices select its element.
    pub map: IndexMap,
}

/// A scalar operation of a kernel body. Operands are indices of earlier instructions of the
/// same body (SSA: every instruction defines one value, used any number of times).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScalarOp {
    /// The element of load `n` (an index into the kernel's `loads`) at the current loop point.
    Load(usize),
    /// A constant, converted to the instruction's dtype.
    Const(Float),
    /// The result of reduction stage `n` of a loop kernel (at the current outer point), or
    /// with `n == 0` the contraction result of a contraction kernel (at the output point).
    Acc(usize),
    /// Elementwise unary op.
    Unary(UnaryOp, usize),
    /// Elementwise binary op (operands of the same dtype).
    Binary(BinaryOp, usize, usize),
    /// `where(cond, a, b)`.
    Where(usize, usize, usize),
    /// Convert to the instruction's dtype.
    Cast(usize),
    /// The same bits read as the instruction's dtype (f32 ↔ i32, f64 ↔ i64). Only `legalize`
    /// emits it, in its math expansions.
    Bitcast(usize),
    /// Shift an integer left by a constant (zeros enter). Emitted by `legalize`.
    ShiftLeft(usize, u32),
    /// Shift a signed integer right by a constant (the sign bit enters). Emitted by `legalize`.
    ShiftRight(usize, u32),
    /// Fused multiply-add `a·b + c` of f32 or f64, rounded once (IEEE `fma`). Emitted by
    /// `legalize` for its polynomials.
    MulAdd(usize, usize, usize),
}

impl ScalarOp {
    /// The instructions this one reads, in operand order.
    pub fn operands(&self) -> Vec<usize> {
        match *self {
            ScalarOp::Load(_) | ScalarOp::Const(_) | ScalarOp::Acc(_) => Vec::new(),
            ScalarOp::Unary(_, a)
            | ScalarOp::Cast(a)
            | ScalarOp::Bitcast(a)
            | ScalarOp::ShiftLeft(a, _)
            | ScalarOp::ShiftRight(a, _) => vec![a],
            ScalarOp::Binary(_, a, b) => vec![a, b],
            ScalarOp::Where(c, a, b) | ScalarOp::MulAdd(c, a, b) => vec![c, a, b],
        }
    }

    /// The same op reading `f(operand)` instead of each operand.
    pub fn map_operands(&self, f: impl Fn(usize) -> usize) -> ScalarOp {
        match *self {
            ScalarOp::Load(_) | ScalarOp::Const(_) | ScalarOp::Acc(_) => self.clone(),
            ScalarOp::Unary(u, a) => ScalarOp::Unary(u, f(a)),
            ScalarOp::Cast(a) => ScalarOp::Cast(f(a)),
            ScalarOp::Bitcast(a) => ScalarOp::Bitcast(f(a)),
            ScalarOp::ShiftLeft(a, n) => ScalarOp::ShiftLeft(f(a), n),
            ScalarOp::ShiftRight(a, n) => ScalarOp::ShiftRight(f(a), n),
            ScalarOp::Binary(b, x, y) => ScalarOp::Binary(b, f(x), f(y)),
            ScalarOp::Where(c, a, b) => ScalarOp::Where(f(c), f(a), f(b)),
            ScalarOp::MulAdd(a, b, c) => ScalarOp::MulAdd(f(a), f(b), f(c)),
        }
    }
}

/// One SSA instruction: an op and the dtype of its result. Every result is rounded (floats) or
/// wrapped (ints) to its dtype, exactly as the graph op it came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Inst {
    /// What it computes.
    pub op: ScalarOp,
    /// The result dtype.
    pub dtype: DType,
}

/// One reduction stage of a [`LoopKernel`]: a reduction over the loops
/// `outer..outer + dims.len()`, which follow the kernel's `outer` leading output loops.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reduction {
    /// sum, max, min, prod or mean.
    pub op: ReduceOp,
    /// Extents of the reduction loops.
    pub dims: Vec<Dim>,
    /// The value reduced, evaluated at every (outer, reduction) loop point; it may read the
    /// results of earlier stages as [`ScalarOp::Acc`]. The last instruction is the value; its
    /// dtype is the accumulator's (the stage result's) dtype.
    pub body: Vec<Inst>,
}

/// A loop nest over `shape` writing one output buffer of that shape (row-major), element by
/// element: `out[i] = body(i)`.
///
/// With reduction stages, for every point `o` of the first `outer` output loops the stages run
/// in order, `acc[s](o) = reduce_j reduce[s].body(o, j, acc[..s](o))`, and then
/// `out[o, i] = body(o, i, acc(o))` for every point `i` of the remaining output loops. One
/// stage with `outer == rank` is a plain reduction (`sum(x, axis=1)`); several stages over the
/// rows of the output make a normalization one kernel (layer_norm: mean, variance, then the
/// normalized row).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LoopKernel {
    /// The output (iteration) shape; loop `l < rank` runs over `shape[l]`.
    pub shape: Vec<Dim>,
    /// Buffers read. Loads used by `body` only name output loops; loads used by a stage name
    /// the outer loops and that stage's reduction loops.
    pub loads: Vec<Load>,
    /// How many leading output loops the reduction stages are computed per (`<= rank`; equal
    /// to `rank` when there are none).
    pub outer: usize,
    /// Reduction stages, in order; the body reads stage `s`'s result as `Acc(s)`.
    pub reduce: Vec<Reduction>,
    /// The value stored at each output point (the epilogue when there is a reduction); the
    /// last instruction is the value.
    pub body: Vec<Inst>,
}

/// The anchor op of a [`ContractionKernel`] (attributes as in the IR).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Contraction {
    /// `[.., M, K] x [.., K, N] -> [.., M, N]`, batch dims broadcast.
    MatMul,
    /// N-d convolution `x[N, C, *S]`, `w[O, C/groups, *K]`, as [`Op::Conv`].
    Conv(crate::ops::Conv),
}

/// An operand of a contraction: a logical tensor of `shape` whose element at index `i` is
/// `load` at loop point `i` (so the map's loops are the operand's own axes).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Operand {
    /// The logical operand shape the contraction sees.
    pub shape: Vec<Dim>,
    /// Where its elements come from.
    pub load: Load,
    /// Elements are rounded to this dtype as they are read (`None`: taken as stored). Lets a
    /// product multiply bf16 values read straight from an f32 buffer, with no bf16 copy of it
    /// (`oar_passes::legalize::fold_operand_casts`); the rounding is the cast's, to nearest,
    /// ties to even.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<DType>,
}

impl Operand {
    /// An operand read as stored.
    pub fn new(shape: Vec<Dim>, load: Load) -> Operand {
        Operand {
            shape,
            load,
            round: None,
        }
    }

    /// The dtype the product multiplies: the rounding's, else the buffer's (`stored`).
    pub fn element_dtype(&self, stored: DType) -> DType {
        self.round.unwrap_or(stored)
    }
}

/// matmul or conv, then an elementwise epilogue over the output shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ContractionKernel {
    /// The anchor op.
    pub op: Contraction,
    /// Left operand (matmul `a`, conv `x`).
    pub lhs: Operand,
    /// Right operand (matmul `b`, conv `w`).
    pub rhs: Operand,
    /// The dtype of the contraction result (what `Acc` reads).
    pub acc_dtype: DType,
    /// The output shape.
    pub shape: Vec<Dim>,
    /// Buffers the epilogue reads (output loops only).
    pub loads: Vec<Load>,
    /// The epilogue; `Acc` is the contraction result; the last instruction is stored.
    pub epilogue: Vec<Inst>,
}

/// One IR op run as is (no fusion): its operands and results are whole buffers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpaqueKernel {
    /// The op: a primitive that does not fit the loop form, or a composite the backend asked
    /// to keep (`oar_passes::fuse::fuse_keeping`).
    pub op: Op,
    /// Operand buffers, in operand order.
    pub inputs: Vec<BufferId>,
    /// The op's regions (cond/while) in the IR text format.
    pub regions: Vec<String>,
}

/// What a kernel computes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KernelBody {
    /// Elementwise / reduction loop nest.
    Loop(LoopKernel),
    /// matmul / conv with epilogue.
    Contraction(ContractionKernel),
    /// A single IR op.
    Opaque(OpaqueKernel),
}

/// One kernel: a body and the buffers it writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Kernel {
    /// A readable name (`k3_matmul_add_max`).
    pub name: String,
    /// What it computes.
    pub body: KernelBody,
    /// Buffers written (exactly one except for multi-result opaque ops).
    pub outputs: Vec<BufferId>,
}

impl Kernel {
    /// Every buffer the kernel reads (operands and loads), in order, with repeats.
    pub fn reads(&self) -> Vec<BufferId> {
        match &self.body {
            KernelBody::Loop(k) => k.loads.iter().map(|l| l.buffer).collect(),
            KernelBody::Contraction(k) => [k.lhs.load.buffer, k.rhs.load.buffer]
                .into_iter()
                .chain(k.loads.iter().map(|l| l.buffer))
                .collect(),
            KernelBody::Opaque(k) => k.inputs.clone(),
        }
    }
}

/// A whole model as kernels over buffers; the unit every code generator translates.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelProgram {
    /// The graph's name.
    pub name: String,
    /// Every buffer; [`BufferId`] indexes this.
    pub buffers: Vec<Buffer>,
    /// Kernels in execution order; a kernel only reads buffers that are leaves or were
    /// written by an earlier kernel.
    pub kernels: Vec<Kernel>,
    /// Named results, in graph output order (a buffer may be returned under several names).
    pub outputs: Vec<(String, BufferId)>,
}

impl KernelProgram {
    /// The buffer with this id (ids come from this program).
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id.index()]
    }

    /// Graph inputs as `(name, buffer)`, in buffer order.
    pub fn inputs(&self) -> Vec<(&str, BufferId)> {
        self.buffers
            .iter()
            .enumerate()
            .filter_map(|(i, b)| match &b.kind {
                BufferKind::Input { name } => Some((name.as_str(), BufferId(i as u32))),
                _ => None,
            })
            .collect()
    }

    /// Drop the temporaries no kernel reads or writes any more (after a rewrite removed their
    /// kernels), renumbering the buffers after them; returns how many went.
    pub fn drop_unused_temps(&mut self) -> usize {
        let mut used = vec![false; self.buffers.len()];
        for k in &self.kernels {
            for b in k.reads().into_iter().chain(k.outputs.iter().copied()) {
                used[b.index()] = true;
            }
        }
        for (_, b) in &self.outputs {
            used[b.index()] = true;
        }
        let mut map = Vec::with_capacity(self.buffers.len());
        let mut next = 0u32;
        for (b, &u) in self.buffers.iter().zip(&used) {
            let keep = u || b.kind != BufferKind::Temp;
            map.push(keep.then_some(BufferId(next)));
            next += u32::from(keep);
        }
        let dropped = self.buffers.len() - next as usize;
        if dropped == 0 {
            return 0;
        }
        let mut i = 0;
        self.buffers.retain(|_| {
            i += 1;
            map[i - 1].is_some()
        });
        // Every id still referenced is kept, so it maps to `Some`.
        let id = |b: &mut BufferId| *b = map[b.index()].unwrap_or(*b);
        for k in &mut self.kernels {
            match &mut k.body {
                KernelBody::Loop(l) => l.loads.iter_mut().for_each(|ld| id(&mut ld.buffer)),
                KernelBody::Contraction(c) => {
                    id(&mut c.lhs.load.buffer);
                    id(&mut c.rhs.load.buffer);
                    c.loads.iter_mut().for_each(|ld| id(&mut ld.buffer));
                }
                KernelBody::Opaque(o) => o.inputs.iter_mut().for_each(id),
            }
            k.outputs.iter_mut().for_each(id);
        }
        self.outputs.iter_mut().for_each(|(_, b)| id(b));
        dropped
    }

    /// The symbolic dims left in any buffer's shape, in first-seen order (empty once every
    /// dim is bound — what code generators that need static sizes check first).
    pub fn symbolic_dims(&self) -> Vec<String> {
        let mut symbolic: Vec<String> = Vec::new();
        for b in &self.buffers {
            for s in b.ty.shape.dims().iter().flat_map(Dim::symbols) {
                if !symbolic.contains(&s) {
                    symbolic.push(s);
                }
            }
        }
        symbolic
    }

    /// Number of kernels by kind: `(loop, contraction, opaque)`.
    pub fn kernel_counts(&self) -> (usize, usize, usize) {
        self.kernels.iter().fold((0, 0, 0), |(l, c, o), k| match k.body {
            KernelBody::Loop(_) => (l + 1, c, o),
            KernelBody::Contraction(_) => (l, c + 1, o),
            KernelBody::Opaque(_) => (l, c, o + 1),
        })
    }
}
