//! CPU kernels for eager mode. Every op runs as a one-op graph compiled by the `cpu` backend
//! (fused, legalized, Cranelift machine code; matmul and conv through the runtime's gemm and
//! convolution kernels), cached per op and operand types and called with its operands in place
//! (no names, no copies) — the same code a `to_static` graph runs, so eager and static results
//! agree by construction. `random`, whose seed changes on every call, is filled by the runtime's
//! generator instead of compiled. The reference interpreter is not on this path: it is the
//! oracle the tests compare against (and would run a part of a program the cpu backend left to
//! it, which [`interpreted`] reports; none does).

pub(crate) mod accumulate;

use crate::error::Result;
use oar_cpu_runtime::Model;
use oar_ir::backend::BoundedCache;
use oar_ir::{DType, Graph, Op, TensorData, TensorType, ValueId};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

/// Compiled one-op programs kept (op, attributes and operand types each).
const CACHE_CAPACITY: usize = 4096;

/// One op (or, with `wants`, a composite's gradient) compiled for one list of operand types,
/// ready to run on positional inputs.
struct EagerKernel {
    op: Op,
    types: Vec<(DType, Vec<usize>)>,
    /// Empty for the op itself; for a composite's VJP, which operands get a gradient.
    wants: Vec<bool>,
    model: Model,
    /// For each input of the model (its buffer order), which operand feeds it.
    order: Vec<usize>,
    /// For each output of the model, the number in its name (`y3`, `d1`: 3, 1).
    outputs: Vec<usize>,
    /// The machine code `model` calls into.
    _code: Arc<oar_backend_cpu::Compiled>,
}

impl EagerKernel {
    fn matches(&self, op: &Op, inputs: &[TensorData], wants: &[bool]) -> bool {
        self.op == *op
            && self.wants == wants
            && self.types.len() == inputs.len()
            && self
                .types
                .iter()
                .zip(inputs)
                .all(|((d, s), t)| *d == t.dtype() && s.as_slice() == t.shape())
    }
}

/// The cache, keyed by a hash of (op, dtypes, shapes) computed without allocating; an entry is
/// used only when it [`EagerKernel::matches`] (a colliding key compiles and replaces it).
fn cache() -> &'static BoundedCache<u64, Arc<EagerKernel>> {
    static CACHE: OnceLock<BoundedCache<u64, Arc<EagerKernel>>> = OnceLock::new();
    CACHE.get_or_init(|| BoundedCache::new(CACHE_CAPACITY))
}

fn key(op: &Op, inputs: &[TensorData], wants: &[bool]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    op.hash(&mut h);
    wants.hash(&mut h);
    for t in inputs {
        t.dtype().hash(&mut h);
        t.shape().hash(&mut h);
    }
    h.finish()
}

/// Compiled one-op programs cached now.
pub(crate) fn cached() -> usize {
    cache().len()
}

/// Every eager kernel compiled so far that leaves part of its program to the reference
/// interpreter: `op: kernel k: reason` (none is the goal — see `interpreted_eager_kernels`).
fn interpreted_log() -> &'static std::sync::Mutex<Vec<String>> {
    static LOG: OnceLock<std::sync::Mutex<Vec<String>>> = OnceLock::new();
    LOG.get_or_init(Default::default)
}

/// See [`interpreted_log`].
pub(crate) fn interpreted() -> Vec<String> {
    interpreted_log().lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Run one op on concrete inputs; `check` type-checks the op on them (called only when the op
/// has not run on these types before: a cached kernel was checked when it was compiled).
pub(crate) fn run(op: &Op, inputs: &[TensorData], check: impl FnOnce() -> Result<()>) -> Result<Vec<TensorData>> {
    match op {
        // A new seed every call: filled by the runtime's generator, not compiled.
        Op::Random(r) => {
            check()?;
            let out = oar_cpu_runtime::native::random(r, rayon::current_num_threads())
                .map_err(|d| crate::Error::invalid(op.name(), d))?;
            return Ok(vec![out]);
        }
        Op::Constant(t) => {
            check()?;
            return Ok(vec![t.clone()]);
        }
        // Through the group's registered transport (`oar::distributed`), not compiled.
        Op::Collective(c) => {
            check()?;
            let [x] = inputs else {
                return Err(crate::Error::invalid(op.name(), "takes one operand"));
            };
            let out = oar_ir::ops::collective::run(c, x).map_err(|d| crate::Error::invalid(op.name(), d))?;
            return Ok(vec![out]);
        }
        Op::Cond | Op::While | Op::Input(_) | Op::Param(_) => {
            return Err(crate::Error::invalid(
                op.name(),
                "control-flow and graph-input ops run only inside a graph (jit), not as one eager op",
            ));
        }
        _ => {}
    }
    if let Some(out) = host_width(op, inputs) {
        return Ok(vec![out?]);
    }
    if let Some(rows) = whole_reduction_rows(op, inputs) {
        check()?;
        return reduce_in_two(op, &inputs[0], rows);
    }
    run_compiled(op, inputs, check)
}

/// Elementwise ops and reductions on the runtime's kernels at the host's vector width
/// (`oar_cpu_runtime::ewise`: AVX-512 or AVX2 chosen at run time; Cranelift emits 128-bit
/// vectors only): on f32, the unary functions (`neg abs sqrt exp log tanh sin cos erf relu
/// sigmoid silu gelu`), `add sub mul div max min` and the comparisons with equal shapes, a
/// one-element operand, a row or a column broadcast, and sums, means, maxima and minima over
/// the last axis or every axis; on f64 the IEEE-exact ones (`neg abs sqrt relu`, the binary
/// ops, the comparisons); on f16/bf16 the unary functions and binary ops, widened to f32 a
/// chunk at a time and rounded back (as the compiled kernels compute them). `None`: not one
/// of them, and the compiled kernel runs. Every case here is well typed by construction
/// (operand dtypes and shapes checked), so the type check is skipped.
fn host_width(op: &Op, inputs: &[TensorData]) -> Option<Result<TensorData>> {
    use oar_cpu_runtime::ewise::{self, Binary, Compare, Half, Reduce, Unary};
    use oar_ir::Composite;
    use oar_ir::ops::{BinaryOp, ReduceOp, UnaryOp};
    let threads = rayon::current_num_threads();
    let half = |d: DType| match d {
        DType::F16 => Some(Half::F16),
        DType::BF16 => Some(Half::Bf16),
        _ => None,
    };
    let unary = match (op, inputs) {
        (Op::Unary(u), [_]) => match u {
            UnaryOp::Neg => Some(Unary::Neg),
            UnaryOp::Abs => Some(Unary::Abs),
            UnaryOp::Sqrt => Some(Unary::Sqrt),
            UnaryOp::Exp => Some(Unary::Exp),
            UnaryOp::Log => Some(Unary::Log),
            UnaryOp::Tanh => Some(Unary::Tanh),
            UnaryOp::Sin => Some(Unary::Sin),
            UnaryOp::Cos => Some(Unary::Cos),
            UnaryOp::Erf => Some(Unary::Erf),
            _ => return None,
        },
        (Op::Composite(Composite::Relu), [_]) => Some(Unary::Relu),
        (Op::Composite(Composite::Sigmoid), [_]) => Some(Unary::Sigmoid),
        (Op::Composite(Composite::Silu), [_]) => Some(Unary::Silu),
        (Op::Composite(Composite::Gelu(g)), [_]) => Some(if g.approximate { Unary::GeluTanh } else { Unary::Gelu }),
        _ => None,
    };
    if let (Some(u), [x]) = (unary, inputs) {
        let shape = x.shape().to_vec();
        return match x.dtype() {
            DType::F32 => {
                let xs = elems::<f32>(x)?;
                with_output(DType::F32, shape, |o| ewise::unary(u, xs, o, threads))
            }
            DType::F64 if ewise::unary_f64_supported(u) => {
                let xs = elems::<f64>(x)?;
                with_output(DType::F64, shape, |o| ewise::unary_f64(u, xs, o, threads))
            }
            d => {
                let h = half(d)?;
                let xs = elems::<u16>(x)?;
                with_output(d, shape, |o| ewise::unary_half(u, h, xs, o, threads))
            }
        };
    }
    match (op, inputs) {
        (Op::Binary(b), [a, c]) => {
            let arith = match b {
                BinaryOp::Add => Ok(Binary::Add),
                BinaryOp::Sub => Ok(Binary::Sub),
                BinaryOp::Mul => Ok(Binary::Mul),
                BinaryOp::Div => Ok(Binary::Div),
                BinaryOp::Max => Ok(Binary::Max),
                BinaryOp::Min => Ok(Binary::Min),
                BinaryOp::Eq => Err(Compare::Eq),
                BinaryOp::Ne => Err(Compare::Ne),
                BinaryOp::Lt => Err(Compare::Lt),
                BinaryOp::Le => Err(Compare::Le),
                BinaryOp::Gt => Err(Compare::Gt),
                BinaryOp::Ge => Err(Compare::Ge),
                _ => return None,
            };
            let dtype = a.dtype();
            if c.dtype() != dtype {
                return None;
            }
            /// A comparison's 0/1 bytes as a bool tensor.
            fn bools(shape: Vec<usize>, fill: impl FnOnce(&mut [u8])) -> Option<Result<TensorData>> {
                let mut out = vec![0u8; shape.iter().product()];
                fill(&mut out);
                Some(TensorData::from_bytes(DType::Bool, shape, out).map_err(Into::into))
            }
            match (dtype, arith) {
                (DType::F32, arith) => {
                    let (sa, sc, shape) = broadcast_sides(a, elems::<f32>(a)?, c, elems::<f32>(c)?)?;
                    match arith {
                        Ok(b) => with_output(dtype, shape, |o| ewise::binary(b, sa, sc, o, threads)),
                        Err(cmp) => bools(shape, |o| ewise::compare(cmp, sa, sc, o, threads)),
                    }
                }
                (DType::F64, arith) => {
                    let (sa, sc, shape) = broadcast_sides(a, elems::<f64>(a)?, c, elems::<f64>(c)?)?;
                    match arith {
                        Ok(b) => with_output(dtype, shape, |o| ewise::binary_f64(b, sa, sc, o, threads)),
                        Err(cmp) => bools(shape, |o| ewise::compare_f64(cmp, sa, sc, o, threads)),
                    }
                }
                (d, Ok(b)) => {
                    let h = half(d)?;
                    let (sa, sc, shape) = broadcast_sides(a, elems::<u16>(a)?, c, elems::<u16>(c)?)?;
                    with_output(d, shape, |o| ewise::binary_half(b, h, sa, sc, o, threads))
                }
                _ => None,
            }
        }
        (Op::Reduce(r), [x])
            if matches!(r.op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min) && !x.is_empty() =>
        {
            let red = match r.op {
                ReduceOp::Sum => Reduce::Sum,
                ReduceOp::Mean => Reduce::Mean,
                ReduceOp::Max => Reduce::Max,
                _ => Reduce::Min,
            };
            let xs = f32s(x)?;
            let rank = x.shape().len();
            let mut axes = r.axes.clone();
            axes.sort_unstable();
            axes.dedup();
            if rank > 0 && axes.len() == rank && axes.iter().enumerate().all(|(i, &a)| i == a) {
                let shape = if r.keepdim { vec![1; rank] } else { vec![] };
                let v = ewise::reduce_all(red, xs, threads);
                return Some(TensorData::from_vec(shape, vec![v]).map_err(Into::into));
            }
            if rank == 0 || axes != [rank - 1] {
                return None;
            }
            let n = x.shape()[rank - 1];
            let mut shape = x.shape()[..rank - 1].to_vec();
            if r.keepdim {
                shape.push(1);
            }
            with_output(DType::F32, shape, |o| ewise::reduce_rows(red, xs, n, o, threads))
        }
        _ => None,
    }
}

/// The elements of an f32 tensor (`None` for another dtype, or bytes not aligned for f32 —
/// never seen: host buffers come from the allocator).
fn f32s(t: &TensorData) -> Option<&[f32]> {
    if t.dtype() != DType::F32 {
        return None;
    }
    elems(t)
}

/// A tensor's elements as `T` (the caller matched the dtype to `T`'s size); `None` if the bytes
/// are not aligned for `T` (never seen: host buffers come from the allocator).
fn elems<T: bytemuck::Pod>(t: &TensorData) -> Option<&[T]> {
    bytemuck::try_cast_slice(t.bytes()).ok()
}

/// How the two operands of a binary op index the result, and the result's shape: equal
/// shapes, or one side broadcast over the other's shape as a scalar, a row (its axes the
/// other's last ones) or a column (its axes a run of the other's, ones after them). `None` for
/// other broadcasts (the compiled kernel does them) and empty results.
fn broadcast_sides<'a, T: Copy>(
    a: &TensorData,
    xa: &'a [T],
    c: &TensorData,
    xc: &'a [T],
) -> Option<(
    oar_cpu_runtime::ewise::Side<'a, T>,
    oar_cpu_runtime::ewise::Side<'a, T>,
    Vec<usize>,
)> {
    use oar_cpu_runtime::ewise::Side;
    let (sa, sc) = (a.shape(), c.shape());
    if xa.is_empty() || xc.is_empty() {
        return None;
    }
    if sa == sc {
        return Some((Side::Full(xa), Side::Full(xc), sa.to_vec()));
    }
    if let Some(side) = broadcast_side(sc, xc, sa) {
        return Some((Side::Full(xa), side, sa.to_vec()));
    }
    let side = broadcast_side(sa, xa, sc)?;
    Some((side, Side::Full(xc), sc.to_vec()))
}

/// `small` (elements `x`) broadcast over `big` as a scalar, a row or a column, if it is one.
fn broadcast_side<'a, T: Copy>(
    small: &[usize],
    x: &'a [T],
    big: &[usize],
) -> Option<oar_cpu_runtime::ewise::Side<'a, T>> {
    use oar_cpu_runtime::ewise::Side;
    if small.len() > big.len() {
        return None;
    }
    // Right-aligned: the axes of `big` where `small` is not 1 must form one run `lo..hi`
    // on which the two agree.
    let big_tail = &big[big.len() - small.len()..];
    let shift = big.len() - small.len();
    let kept: Vec<usize> = (0..small.len()).filter(|&i| small[i] != 1).collect();
    let (Some(&lo), Some(&hi)) = (kept.first(), kept.last()) else {
        return Some(Side::Scalar(x[0]));
    };
    if (lo..=hi).any(|i| small[i] != big_tail[i]) {
        return None;
    }
    let inner: usize = big[shift + hi + 1..].iter().product();
    Some(if inner == 1 {
        Side::Row(x)
    } else {
        Side::Column {
            col: x,
            inner,
            first: 0,
        }
    })
}

/// A new tensor of `dtype` (elements `T`) and `shape` filled by `fill`, which writes every
/// element (the memory is not zeroed first: at 1M elements zeroing costs as much as an add,
/// and fresh pages fault). `None` if the allocator's block is not aligned for `T` (never seen).
fn with_output<T: bytemuck::Pod>(
    dtype: DType,
    shape: Vec<usize>,
    fill: impl FnOnce(&mut [T]),
) -> Option<Result<TensorData>> {
    debug_assert_eq!(dtype.size_bytes(), size_of::<T>());
    let n: usize = shape.iter().product();
    let bytes_len = n * size_of::<T>();
    let mut bytes: Vec<u8> = Vec::with_capacity(bytes_len);
    if !(bytes.as_ptr() as usize).is_multiple_of(align_of::<T>()) {
        return None;
    }
    // Safety: the block holds `n` aligned `T`s; `fill` (an `ewise` kernel) writes all of them
    // before anything reads them, and every bit pattern is a `T` (`Pod`).
    let values = unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), n) };
    fill(values);
    // Safety: the `n · size_of::<T>()` bytes were written just now.
    unsafe { bytes.set_len(bytes_len) };
    Some(TensorData::from_bytes(dtype, shape, bytes).map_err(Into::into))
}

/// Elements from which a reduction of a whole f32/f64 tensor runs in two steps.
const SPLIT_REDUCTION_MIN: usize = 1 << 18;

/// For a sum, mean, max or min over every axis of a large f32/f64 tensor, how many rows to cut
/// it into. Such a reduction compiles to one loop with one outer iteration, which one thread
/// runs; over rows first, the outer loop is the rows, which threads share (PyTorch's
/// reductions split the same way), then the few row results are reduced.
fn whole_reduction_rows(op: &Op, inputs: &[TensorData]) -> Option<usize> {
    use oar_ir::ops::ReduceOp;
    let (Op::Reduce(r), [x]) = (op, inputs) else {
        return None;
    };
    let n = x.len();
    let whole = r.axes.len() == x.shape().len() && !x.shape().is_empty();
    let splits = matches!(r.op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min);
    if !whole || !splits || !matches!(x.dtype(), DType::F32 | DType::F64) || n < SPLIT_REDUCTION_MIN {
        return None;
    }
    if rayon::current_num_threads() < 2 {
        return None;
    }
    // Equal rows (a mean of row means is the mean), each at least 4K elements.
    [64, 48, 32, 24, 16, 8].into_iter().find(|&p| n % p == 0)
}

/// `op` (a whole-tensor reduction, see [`whole_reduction_rows`]) as the same reduction over
/// each of `rows` rows, then over the row results.
fn reduce_in_two(op: &Op, x: &TensorData, rows: usize) -> Result<Vec<TensorData>> {
    let Op::Reduce(r) = op else {
        return Err(crate::Error::invalid(op.name(), "internal: not a reduction"));
    };
    let step = |axis: usize| {
        Op::Reduce(oar_ir::ops::Reduce {
            op: r.op,
            axes: vec![axis],
            keepdim: false,
        })
    };
    let x2 = x.reshaped(vec![rows, x.len() / rows])?;
    let per_row = run_compiled(&step(1), &[x2], || Ok(()))?;
    let mut out = run_compiled(&step(0), &per_row, || Ok(()))?;
    if r.keepdim {
        let y = out
            .pop()
            .ok_or_else(|| crate::Error::invalid(op.name(), "internal: no result"))?;
        out.push(y.reshaped(vec![1; x.shape().len()])?);
    }
    Ok(out)
}

/// [`run`] on the cpu backend's code for `op` and these operand types (compiled on first use).
fn run_compiled(op: &Op, inputs: &[TensorData], check: impl FnOnce() -> Result<()>) -> Result<Vec<TensorData>> {
    let outs = cached_run(op, inputs, &[], || {
        check()?;
        one_op_graph(op, inputs)
    })?;
    Ok(outs.into_iter().map(|(_, t)| t).collect())
}

/// The cached kernel for (`op`, `inputs`' types, `wants`) — compiled from `graph()` on a miss —
/// run on `inputs` (graph inputs `x0`, `x1`, ... in operand order); each output with the number
/// in its name.
fn cached_run(
    op: &Op,
    inputs: &[TensorData],
    wants: &[bool],
    graph: impl FnOnce() -> Result<Graph>,
) -> Result<Vec<(usize, TensorData)>> {
    let k = key(op, inputs, wants);
    let kernel = match cache().get(&k) {
        Some(kernel) if kernel.matches(op, inputs, wants) => kernel,
        _ => {
            let kernel = Arc::new(compile(op, inputs, wants, &graph()?)?);
            cache().insert(k, kernel.clone());
            kernel
        }
    };
    let ordered: Vec<&TensorData> = kernel.order.iter().map(|&i| &inputs[i]).collect();
    let outs = kernel.model.run_positional(&ordered)?;
    Ok(kernel.outputs.iter().copied().zip(outs).collect())
}

/// Whether a composite runs eagerly as one compiled program (forward, and its gradient as
/// another): all but training-mode dropout, whose seed changes on every call.
pub(crate) fn fuses(c: &oar_ir::Composite) -> bool {
    !matches!(c, oar_ir::Composite::Dropout(d) if d.training)
}

/// Gradients of composite `op`'s operands that `wants` marks, given its `results` and their
/// cotangents `cts` (`None`: that result is unused): the runtime's native backward kernel where
/// there is one ([`native_composite_vjp`]), else [`compiled_composite_vjp`].
pub(crate) fn composite_vjp(
    op: &Op,
    inputs: &[TensorData],
    results: &[TensorData],
    cts: &[Option<TensorData>],
    wants: &[bool],
) -> Result<Vec<Option<TensorData>>> {
    match native_composite_vjp(op, inputs, results, cts, wants)? {
        Some(grads) => Ok(grads),
        None => compiled_composite_vjp(op, inputs, cts, wants),
    }
}

/// The native backward kernels of the cpu runtime, for f32/f64 operands: `lstm_seq` and
/// `gru_seq`, ungrouped `conv2d` (im2col/col2im products), `max_pool2d` (each window's max
/// tree replayed, ties split as the decomposition's gradient splits them) and `sdpa` (each
/// block's probabilities recomputed, five products per block). `None`: no native
/// kernel for this op or these operands. Each computes what [`compiled_composite_vjp`] does
/// (tests/framework compare them).
pub(crate) fn native_composite_vjp(
    op: &Op,
    inputs: &[TensorData],
    results: &[TensorData],
    cts: &[Option<TensorData>],
    wants: &[bool],
) -> Result<Option<Vec<Option<TensorData>>>> {
    let Op::Composite(c) = op else {
        return Err(crate::Error::invalid(
            op.name(),
            "internal: composite_vjp of a primitive",
        ));
    };
    let threads = rayon::current_num_threads();
    let fail = |d: String| crate::Error::invalid(op.name(), d);
    if let (Some((rec, reverse)), Some(y)) = (oar_cpu_runtime::rnn::Recurrence::of(c), results.first())
        && oar_cpu_runtime::rnn::seq_dtype(y.dtype())
    {
        return oar_cpu_runtime::rnn::seq_vjp(rec, reverse, inputs, y, cts, wants, threads)
            .map(Some)
            .map_err(fail);
    }
    match (c, inputs, cts) {
        (oar_ir::Composite::Conv2d(conv), [x, w, ..], [Some(dy)]) => {
            let want = |i: usize| wants.get(i) == Some(&true);
            let native =
                oar_cpu_runtime::conv_grad::conv_vjp(x, w, dy, &conv.conv(), [want(0), want(1), want(2)], threads)
                    .map_err(fail)?;
            Ok(native.map(|[dx, dw, db]| {
                let mut grads = vec![dx, dw];
                if inputs.len() > 2 {
                    grads.push(db);
                }
                grads
            }))
        }
        (oar_ir::Composite::ScaledDotProductAttention(a), _, [Some(dy)]) => {
            oar_cpu_runtime::attention::vjp(a, inputs, dy, wants, threads).map_err(fail)
        }
        (oar_ir::Composite::MaxPool2d(m), [x], [Some(dy)]) if wants == [true] => {
            let native = oar_cpu_runtime::pool_grad::max_pool2d_vjp(x, dy, m.kernel, m.stride, m.padding, threads)
                .map_err(fail)?;
            Ok(native.map(|dx| vec![Some(dx)]))
        }
        _ => Ok(None),
    }
}

/// Composite `op`'s gradients by its definition: its own gradient rule where it has one, else
/// its decomposition and the backward of that, compiled as one cpu program (recomputing the forward inside, fused) and cached per op,
/// operand types, `wants` and which results have a cotangent.
pub(crate) fn compiled_composite_vjp(
    op: &Op,
    inputs: &[TensorData],
    cts: &[Option<TensorData>],
    wants: &[bool],
) -> Result<Vec<Option<TensorData>>> {
    let Op::Composite(c) = op else {
        return Err(crate::Error::invalid(
            op.name(),
            "internal: composite_vjp of a primitive",
        ));
    };
    let mut all = inputs.to_vec();
    all.extend(cts.iter().flatten().cloned());
    // The cache key: the operands that get a gradient, then the results that have a cotangent.
    let key: Vec<bool> = wants.iter().copied().chain(cts.iter().map(Option::is_some)).collect();
    let outs = cached_run(op, &all, &key, || {
        let (mut gr, mut xs) = graph_with_inputs(&format!("{}_vjp", op.name()), &all)?;
        let gs = xs.split_off(inputs.len());
        // A composite with a gradient rule of its own (fake_quant's straight-through
        // estimator) stays one node for `append_backward` to apply that rule; the rest are
        // differentiated through their decompositions.
        let ys = if oar_ir::ops::OpDef::has_vjp(c) {
            gr.add_op(op.clone(), &xs)?
        } else {
            oar_ir::decompose::decompose(c, &mut gr, &xs)?
        };
        let with_ct: Vec<(oar_ir::ValueId, oar_ir::ValueId)> = ys
            .iter()
            .zip(cts)
            .filter(|(_, ct)| ct.is_some())
            .map(|(&y, _)| y)
            .zip(gs)
            .collect();
        // One result: `y · g` (its gradient is `g`-weighted); several: `Σ sum(yₖ · gₖ)`.
        let loss = match with_ct.as_slice() {
            [(y, g)] => gr.binary(oar_ir::ops::BinaryOp::Mul, *y, *g)?,
            _ => {
                let mut loss = None;
                for &(y, g) in &with_ct {
                    let p = gr.binary(oar_ir::ops::BinaryOp::Mul, y, g)?;
                    let rank = gr.value_type(p).rank();
                    let reduce = oar_ir::ops::Reduce {
                        op: oar_ir::ops::ReduceOp::Sum,
                        axes: (0..rank).collect(),
                        keepdim: false,
                    };
                    let s = gr.add_op1(Op::Reduce(reduce), &[p])?;
                    loss = Some(match loss {
                        Some(l) => gr.binary(oar_ir::ops::BinaryOp::Add, l, s)?,
                        None => s,
                    });
                }
                loss.ok_or_else(|| crate::Error::invalid(op.name(), "internal: no cotangent"))?
            }
        };
        let wanted: Vec<usize> = (0..xs.len()).filter(|&i| wants.get(i) == Some(&true)).collect();
        let wrt: Vec<_> = wanted.iter().map(|&i| xs[i]).collect();
        let grads = oar_ir::autodiff::append_backward(&mut gr, loss, &wrt)?;
        for (&i, d) in wanted.iter().zip(grads) {
            if let Some(d) = d {
                gr.add_output(&format!("d{i}"), d)?;
            }
        }
        Ok(gr)
    })?;
    let mut grads = vec![None; inputs.len()];
    for (i, t) in outs {
        grads[i] = Some(t);
    }
    Ok(grads)
}

/// A graph named `name` with inputs `x0`, `x1`, ... of `inputs`' types, and their values.
fn graph_with_inputs(name: &str, inputs: &[TensorData]) -> Result<(Graph, Vec<ValueId>)> {
    let mut g = Graph::new(name);
    let mut args = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        args.push(g.add_input(&format!("x{i}"), TensorType::of(t.dtype(), t.shape()))?);
    }
    Ok((g, args))
}

/// The graph applying `op` once to inputs `x0`, `x1`, ... of `inputs`' types.
fn one_op_graph(op: &Op, inputs: &[TensorData]) -> Result<Graph> {
    let (mut g, args) = graph_with_inputs(op.name(), inputs)?;
    for (i, v) in g.add_op(op.clone(), &args)?.into_iter().enumerate() {
        g.add_output(&format!("y{i}"), v)?;
    }
    Ok(g)
}

/// The `cpu` backend's code for `g`, whose inputs `x0`, `x1`, ... take `inputs`.
fn compile(op: &Op, inputs: &[TensorData], wants: &[bool], g: &Graph) -> Result<EagerKernel> {
    oar_ir::verify(g)?;
    let code = oar_backend_cpu::compile_cached(g, &BTreeMap::new()).map_err(oar_ir::BackendError::from)?;
    let model = Model::new(code.lowered.cpu.clone(), code.code.funcs.clone(), &code.lowered.consts)?;
    for step in &code.lowered.cpu.steps {
        if let oar_cpu_runtime::Step::Interpret { kernel, reason } = step {
            let what = if wants.is_empty() { "" } else { " (gradient)" };
            let mut log = interpreted_log().lock().unwrap_or_else(|e| e.into_inner());
            if log.len() < 1024 {
                log.push(format!("{}{what}: kernel {kernel}: {reason}", op.name()));
            }
        }
    }
    // Names are a letter and a number: `x3` is operand 3, `y1` result 1, `d2` operand 2's gradient.
    let number = |name: &str, bound: usize| {
        name.get(1..)
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|&i| i < bound)
            .ok_or_else(|| crate::Error::invalid(op.name(), format!("internal: unexpected program value `{name}`")))
    };
    let order = model
        .inputs()
        .iter()
        .map(|(name, _)| number(name, inputs.len()))
        .collect::<Result<_>>()?;
    let outputs = model
        .outputs()
        .iter()
        .map(|(name, _)| number(name, usize::MAX))
        .collect::<Result<_>>()?;
    Ok(EagerKernel {
        op: op.clone(),
        types: inputs.iter().map(|t| (t.dtype(), t.shape().to_vec())).collect(),
        wants: wants.to_vec(),
        model,
        order,
        outputs,
        _code: code,
    })
}

#[cfg(test)]
mod tests {
    use super::{compiled_composite_vjp, native_composite_vjp};
    use oar_ir::ops::{Composite, Conv2d, MaxPool2d};
    use oar_ir::{DType, Op, TensorData};

    /// Deterministic values: uniform in [-1, 1), or (with `levels`) one of that many values,
    /// so pooling windows tie often.
    fn values(n: usize, seed: u64, levels: Option<u64>) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match levels {
                    Some(l) => (s % l) as f64 - 1.0,
                    None => (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0,
                }
            })
            .collect()
    }

    fn data(dtype: DType, shape: &[usize], v: &[f64]) -> TensorData {
        TensorData::from_f64_slice(dtype, shape.to_vec(), v).unwrap()
    }

    /// The native gradient (which must exist) and the compiled one, element by element.
    fn compare(op: &Op, inputs: &[TensorData], dy: TensorData, wants: &[bool], tol: f64) {
        let cts = [Some(dy)];
        let native = native_composite_vjp(op, inputs, &[], &cts, wants)
            .unwrap()
            .unwrap_or_else(|| panic!("{op:?}: no native gradient"));
        let compiled = compiled_composite_vjp(op, inputs, &cts, wants).unwrap();
        assert_eq!(native.len(), compiled.len());
        for (i, (n, c)) in native.iter().zip(&compiled).enumerate() {
            assert_eq!(n.is_some(), c.is_some(), "{op:?}: operand {i}");
            let (Some(n), Some(c)) = (n, c) else { continue };
            assert_eq!(n.shape(), c.shape());
            let (n, c) = (n.to_f64_vec(), c.to_f64_vec());
            let scale = c.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            let err = n.iter().zip(&c).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(err <= tol * scale, "{op:?}: operand {i} off by {err} (scale {scale})");
        }
    }

    /// Attention's native gradients (blocks of query rows, recomputed probabilities) against
    /// the compiled gradient of its decomposition: several blocks, causal, bool and float
    /// masks, some operands not wanted.
    #[test]
    fn native_sdpa_gradient_matches_the_compiled_definition() {
        use oar_ir::ops::{Float, ScaledDotProductAttention};
        // q, k, v shapes, mask (shape, bool?), causal, wants.
        type Case = (
            [usize; 4],
            usize,
            usize,
            Option<(&'static [usize], bool)>,
            bool,
            &'static [bool],
        );
        let cases: [Case; 4] = [
            ([2, 3, 40, 8], 12, 6, None, true, &[true, true, true]),
            ([1, 2, 7, 4], 50, 5, None, false, &[false, true, true]),
            (
                [2, 2, 33, 4],
                9,
                4,
                Some((&[2, 1, 33, 9], true)),
                false,
                &[true, false, true],
            ),
            (
                [2, 2, 10, 4],
                10,
                4,
                Some((&[10, 10], false)),
                true,
                &[true, true, false, false],
            ),
        ];
        for (i, (qs, s, ev, mask, causal, wants)) in cases.into_iter().enumerate() {
            let op = Op::Composite(Composite::ScaledDotProductAttention(ScaledDotProductAttention {
                causal,
                scale: (i == 1).then_some(Float(0.4)),
            }));
            let (ks, vs) = ([qs[0], qs[1], s, qs[3]], [qs[0], qs[1], s, ev]);
            for dtype in [DType::F64, DType::F32] {
                let seed = 20 * i as u64;
                let mut inputs = vec![
                    data(dtype, &qs, &values(qs.iter().product(), seed, None)),
                    data(dtype, &ks, &values(ks.iter().product(), seed + 1, None)),
                    data(dtype, &vs, &values(vs.iter().product(), seed + 2, None)),
                ];
                if let Some((m, bool_mask)) = mask {
                    let v = values(m.iter().product(), seed + 3, None);
                    inputs.push(if bool_mask {
                        // Keep ~70% and always the first key.
                        let keep: Vec<f64> = v
                            .iter()
                            .enumerate()
                            .map(|(j, &x)| f64::from(x > -0.4 || j % m[m.len() - 1] == 0))
                            .collect();
                        data(DType::Bool, m, &keep)
                    } else {
                        data(dtype, m, &v)
                    });
                }
                let ys = [qs[0], qs[1], qs[2], ev];
                let dy = data(dtype, &ys, &values(ys.iter().product(), seed + 4, None));
                let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
                compare(&op, &inputs, dy, wants, tol);
            }
        }
    }

    /// x, w, stride, padding, dilation, bias, wants.
    type ConvCase = (
        [usize; 4],
        [usize; 4],
        [usize; 2],
        [usize; 4],
        [usize; 2],
        bool,
        &'static [bool],
    );

    #[test]
    fn native_conv2d_gradient_matches_the_compiled_definition() {
        let cases: [ConvCase; 7] = [
            // A large plane: tiles of positions within one image.
            (
                [2, 16, 40, 40],
                [4, 16, 3, 3],
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                false,
                &[true, true],
            ),
            // 1 × 1 planes (a deep CNN stage): many images per product.
            (
                [5, 8, 1, 1],
                [6, 8, 3, 3],
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                true,
                &[true, true, true],
            ),
            (
                [2, 3, 8, 9],
                [4, 3, 3, 3],
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                true,
                &[true, true, true],
            ),
            (
                [3, 2, 11, 10],
                [5, 2, 3, 2],
                [2, 3],
                [2, 0, 1, 2],
                [1, 1],
                false,
                &[true, true],
            ),
            (
                [2, 2, 12, 12],
                [3, 2, 3, 3],
                [1, 2],
                [0, 3, 2, 0],
                [2, 3],
                true,
                &[false, true, true],
            ),
            (
                [4, 1, 10, 10],
                [6, 1, 5, 5],
                [1, 1],
                [2, 2, 2, 2],
                [1, 1],
                true,
                &[false, true, true],
            ),
            (
                [2, 6, 7, 7],
                [4, 6, 5, 5],
                [1, 1],
                [0, 0, 0, 0],
                [1, 1],
                false,
                &[true, false],
            ),
        ];
        for (i, (xs, ws, stride, padding, dilation, bias, wants)) in cases.into_iter().enumerate() {
            let c = Conv2d {
                stride,
                padding,
                dilation,
                groups: 1,
            };
            let out = |a: usize| {
                let span = dilation[a] * (ws[2 + a] - 1) + 1;
                (xs[2 + a] + padding[a] + padding[a + 2] - span) / stride[a] + 1
            };
            let ys = [xs[0], ws[0], out(0), out(1)];
            for dtype in [DType::F64, DType::F32] {
                let seed = 10 * i as u64;
                let mut inputs = vec![
                    data(dtype, &xs, &values(xs.iter().product(), seed, None)),
                    data(dtype, &ws, &values(ws.iter().product(), seed + 1, None)),
                ];
                if bias {
                    inputs.push(data(dtype, &[ws[0]], &values(ws[0], seed + 2, None)));
                }
                let dy = data(dtype, &ys, &values(ys.iter().product(), seed + 3, None));
                let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
                compare(&Op::Composite(Composite::Conv2d(c.clone())), &inputs, dy, wants, tol);
            }
        }
    }

    /// Binary ops with one side broadcast as a scalar, a row or a column (and shapes that are
    /// none of them, left to the compiled kernel), on f32, f64, f16 and bf16: the reference's
    /// bits (16-bit floats computed in f32 and rounded once more round as the reference's f64
    /// does: 24 bits ≥ 2 · 11 + 2), the result's shape, and which ones the host-width kernels
    /// take.
    #[test]
    fn broadcast_binary_ops_are_the_reference_bit_for_bit() {
        use oar_ir::ops::BinaryOp;
        let cases: [(&[usize], &[usize], bool); 10] = [
            (&[6, 70, 5], &[6, 70, 5], true),
            (&[6, 70, 5], &[1], true),
            (&[6, 70, 5], &[70, 5], true),
            (&[6, 70, 5], &[1, 1, 5], true),
            (&[6, 70, 5], &[6, 1, 1], true),
            (&[6, 70, 5], &[70, 1], true),
            (&[1, 70, 1], &[6, 70, 5], true),
            (&[4, 3, 7, 9], &[3, 1, 1], true),
            (&[6, 70, 5], &[6, 1, 5], false),
            (&[6, 1], &[1, 5], false),
        ];
        // Specials among the values: NaN, ±inf, -0, a value below f16's normal range and one
        // past bf16's precision.
        let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 3e-6, 1.0 + 1e-5];
        for ((sa, sb, host), dtype) in cases
            .into_iter()
            .flat_map(|c| [DType::F32, DType::F64, DType::F16, DType::BF16].map(|d| (c, d)))
        {
            let na: usize = sa.iter().product();
            let nb: usize = sb.iter().product();
            let mut va = values(na, na as u64, None);
            for (v, &x) in va.iter_mut().step_by(7).zip(&specials) {
                *v = x;
            }
            let a = data(dtype, sa, &va);
            let b = data(dtype, sb, &values(nb, 7 + nb as u64, None));
            for (x, y) in [(&a, &b), (&b, &a)] {
                for op in [
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Mul,
                    BinaryOp::Div,
                    BinaryOp::Max,
                    BinaryOp::Min,
                    BinaryOp::Lt,
                ] {
                    let op = Op::Binary(op);
                    let ins = [x.clone(), y.clone()];
                    // Comparisons of 16-bit floats are left to the compiled kernel.
                    let host = host && !(op == Op::Binary(BinaryOp::Lt) && matches!(dtype, DType::F16 | DType::BF16));
                    assert_eq!(
                        super::host_width(&op, &ins).is_some(),
                        host,
                        "{op:?} {sa:?} {sb:?} {dtype}"
                    );
                    let got = super::run(&op, &ins, || Ok(())).unwrap();
                    let want = oar_backend_reference::run_op(&op, &ins).unwrap();
                    assert_eq!(got[0].shape(), want[0].shape(), "{op:?} {sa:?} {sb:?}");
                    assert_eq!(got[0].dtype(), want[0].dtype());
                    // The same bits, any NaN for a NaN (payloads are not part of the contract).
                    for (i, (g, w)) in got[0].to_f64_vec().iter().zip(want[0].to_f64_vec()).enumerate() {
                        let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
                        assert!(
                            same,
                            "{op:?} {:?} {:?} {dtype} element {i}: {g} vs {w}",
                            x.shape(),
                            y.shape()
                        );
                    }
                }
            }
        }
    }

    /// Unary ops on f64 (the exact ones) and on 16-bit floats (every one, widened to f32) on
    /// the host-width kernels: exact ones bit for bit, the others within one ulp of the format
    /// of the reference (the f32 kernel's few-ulp error, then one more rounding).
    #[test]
    fn f64_and_half_unary_ops_match_the_reference() {
        use oar_ir::ops::UnaryOp;
        let mut v = values(3000, 5, None).iter().map(|x| 6.0 * x).collect::<Vec<f64>>();
        v.extend([
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            3e-6,
            1e-3,
            70000.0,
        ]);
        let ops = [
            (Op::Unary(UnaryOp::Neg), true),
            (Op::Unary(UnaryOp::Abs), true),
            (Op::Unary(UnaryOp::Sqrt), true),
            (Op::Composite(Composite::Relu), true),
            (Op::Unary(UnaryOp::Exp), false),
            (Op::Unary(UnaryOp::Tanh), false),
            (Op::Unary(UnaryOp::Sin), false),
            (Op::Composite(Composite::Sigmoid), false),
            (
                Op::Composite(Composite::Gelu(oar_ir::ops::Gelu { approximate: false })),
                false,
            ),
        ];
        for dtype in [DType::F64, DType::F16, DType::BF16] {
            let ulp = match dtype {
                DType::F16 => 2f64.powi(-10),
                DType::BF16 => 2f64.powi(-7),
                _ => 0.0,
            };
            let x = data(dtype, &[v.len()], &v);
            for (op, exact) in &ops {
                let ins = [x.clone()];
                let host = super::host_width(op, &ins);
                assert_eq!(host.is_some(), *exact || dtype != DType::F64, "{op:?} {dtype}");
                let Some(got) = host else { continue };
                let got = got.unwrap();
                let want = oar_backend_reference::run_op(op, &ins).unwrap();
                assert_eq!(got.dtype(), dtype);
                if *exact {
                    for (g, w) in got.to_f64_vec().iter().zip(want[0].to_f64_vec()) {
                        assert!(
                            (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits(),
                            "{op:?} {dtype}: {g} vs {w}"
                        );
                    }
                    continue;
                }
                for (i, (g, w)) in got.to_f64_vec().iter().zip(want[0].to_f64_vec()).enumerate() {
                    let ok = if w.is_nan() {
                        g.is_nan()
                    } else if *g == w {
                        true
                    } else {
                        // One ulp of the format at w (absolute below the normal range).
                        (g - w).abs() <= ulp * w.abs().max(6.1e-5)
                    };
                    assert!(ok, "{op:?} {dtype} at {}: {g} vs {w}", v[i]);
                }
            }
        }
    }

    #[test]
    fn whole_tensor_reductions_in_two_steps_match_the_reference() {
        use oar_ir::ops::{Reduce, ReduceOp};
        for (shape, rows) in [
            (vec![512, 1024], Some(64)),
            (vec![3, 87384], Some(24)),
            (vec![262147], None),
        ] {
            let n: usize = shape.iter().product();
            let vals: Vec<f64> = values(n, n as u64, None).iter().map(|v| v + 0.25).collect();
            for dtype in [DType::F32, DType::F64] {
                let x = data(dtype, &shape, &vals);
                for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
                    for keepdim in [false, true] {
                        let op = Op::Reduce(Reduce {
                            op,
                            axes: (0..shape.len()).collect(),
                            keepdim,
                        });
                        let xs = [x.clone()];
                        if rayon::current_num_threads() > 1 {
                            assert_eq!(super::whole_reduction_rows(&op, &xs), rows, "{shape:?}");
                        }
                        let got = super::run(&op, &xs, || Ok(())).unwrap();
                        let want = oar_backend_reference::run_op(&op, &xs).unwrap();
                        assert_eq!(got[0].shape(), want[0].shape(), "{op:?}");
                        let (g, w) = (got[0].to_f64_vec()[0], want[0].to_f64_vec()[0]);
                        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
                        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{op:?} {dtype}: {g} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn eager_random_is_the_reference_bit_for_bit_and_rejects_bad_attributes() {
        use oar_ir::ops::{Random, RandomDist};
        use oar_ir::{Dim, Float};
        let dists = [
            RandomDist::Uniform {
                low: Float(-2.0),
                high: Float(3.0),
            },
            RandomDist::Normal {
                mean: Float(1.0),
                std: Float(0.5),
            },
        ];
        // 300 000 elements fill in parallel chunks on two threads; 7 in one.
        for shape in [vec![7], vec![3, 100_000]] {
            for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
                for dist in dists {
                    let op = Op::Random(Random {
                        dist,
                        shape: shape.iter().map(|&n| Dim::Static(n)).collect(),
                        dtype,
                        seed: 0xD1CE,
                    });
                    let got = super::run(&op, &[], || Ok(())).unwrap();
                    let want = oar_backend_reference::run_op(&op, &[]).unwrap();
                    assert_eq!(got[0].shape(), shape.as_slice());
                    assert!(got[0].bytes() == want[0].bytes(), "{dtype} {dist:?}");
                }
            }
        }
        let int = Op::Random(Random {
            dist: dists[0],
            shape: vec![Dim::Static(4)],
            dtype: DType::I32,
            seed: 1,
        });
        let e = super::run(&int, &[], || Ok(())).unwrap_err().to_string();
        assert!(e.contains("random") && e.contains("float dtype"), "{e}");
        let huge = Op::Random(Random {
            dist: dists[1],
            shape: vec![Dim::Static(1 << 40), Dim::Static(1 << 30)],
            dtype: DType::F32,
            seed: 1,
        });
        let e = super::run(&huge, &[], || Ok(())).unwrap_err().to_string();
        assert!(e.contains("too large"), "{e}");
    }

    #[test]
    fn native_max_pool2d_gradient_matches_the_compiled_definition_ties_included() {
        // (x, kernel, stride, padding, ceil_mode)
        let cases = [
            ([2, 3, 8, 8], [2, 2], [2, 2], [0, 0, 0, 0], false),
            ([1, 2, 9, 7], [3, 3], [2, 2], [1, 1, 1, 1], false),
            ([1, 2, 6, 6], [3, 3], [1, 1], [0, 0, 0, 0], false),
            ([1, 1, 7, 7], [2, 2], [2, 2], [0, 0, 0, 0], true),
            ([2, 1, 5, 6], [3, 2], [2, 1], [1, 0, 1, 1], true),
        ];
        for (i, (xs, kernel, stride, padding, ceil_mode)) in cases.into_iter().enumerate() {
            let m = MaxPool2d {
                kernel,
                stride,
                padding,
                ceil_mode,
            };
            let out = |a: usize| {
                let span = xs[2 + a] + padding[a] + padding[a + 2] - kernel[a];
                (if ceil_mode {
                    span.div_ceil(stride[a])
                } else {
                    span / stride[a]
                }) + 1
            };
            let ys = [xs[0], xs[1], out(0), out(1)];
            // Three levels (ties everywhere) and distinct values.
            for levels in [Some(3), None] {
                for dtype in [DType::F64, DType::F32] {
                    let x = data(dtype, &xs, &values(xs.iter().product(), 7 * i as u64, levels));
                    let dy = data(dtype, &ys, &values(ys.iter().product(), 7 * i as u64 + 1, None));
                    let tol = if dtype == DType::F64 { 1e-12 } else { 1e-6 };
                    compare(&Op::Composite(Composite::MaxPool2d(m.clone())), &[x], dy, &[true], tol);
                }
            }
        }
    }
}
