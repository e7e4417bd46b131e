//! CPU kernels for eager mode. Hot ops (matmul, conv) run through `gemm`; every other op runs as
//! a one-op graph compiled by the `cpu` backend (fused, legalized, Cranelift machine code),
//! cached per op and operand types — the same code a `to_static` graph runs, so eager and static
//! results agree by construction. The reference interpreter is only the evaluator of last
//! resort: for what the cpu backend leaves to it (inside the compiled program) and for ops
//! whose attributes change on every call (`random`'s seed) or that carry data or regions.

mod conv;
mod matmul;

use crate::error::Result;
use oar_ir::backend::BoundedCache;
use oar_ir::{Backend, Executable, Graph, Op, TensorData, TensorType, Weights};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// Compiled one-op executables kept (op, attributes and operand types each).
const CACHE_CAPACITY: usize = 4096;

type Key = (Op, Vec<TensorType>);

fn cache() -> &'static BoundedCache<Key, Arc<dyn Executable>> {
    static CACHE: OnceLock<BoundedCache<Key, Arc<dyn Executable>>> = OnceLock::new();
    CACHE.get_or_init(|| BoundedCache::new(CACHE_CAPACITY))
}

/// Compiled one-op executables cached now.
pub(crate) fn cached() -> usize {
    cache().len()
}

/// Run one op on concrete inputs.
pub(crate) fn run(op: &Op, inputs: &[TensorData]) -> Result<Vec<TensorData>> {
    if let Op::MatMul = op
        && let Some(out) = matmul::matmul(&inputs[0], &inputs[1])?
    {
        return Ok(vec![out]);
    }
    if let Op::Conv(_) = op
        && let Some(out) = conv::conv(op, &inputs[0], &inputs[1])?
    {
        return Ok(vec![out]);
    }
    if !compiles(op) {
        return Ok(oar_backend_reference::run_op(op, inputs)?);
    }
    let types: Vec<TensorType> = inputs.iter().map(|d| d.tensor_type()).collect();
    let key = (op.clone(), types);
    let exe = cache().get_or_try_insert_with(&key, || compile(op, &key.1))?;
    let feeds: BTreeMap<String, TensorData> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("x{i}"), t.clone()))
        .collect();
    Ok(exe.run(&feeds)?.into_iter().map(|(_, t)| t).collect())
}

/// Whether an op is worth compiling once and reusing: not when its attributes change per call
/// (a random seed), nor when it carries data (constants) or regions (control flow).
fn compiles(op: &Op) -> bool {
    !matches!(
        op,
        Op::Random(_) | Op::Constant(_) | Op::Cond | Op::While | Op::Input(_) | Op::Param(_)
    )
}

/// The `cpu` backend's executable for `op` on operands of `types` (inputs `x0`, `x1`, ...).
fn compile(op: &Op, types: &[TensorType]) -> Result<Arc<dyn Executable>> {
    let mut g = Graph::new(op.name());
    let mut args = Vec::with_capacity(types.len());
    for (i, t) in types.iter().enumerate() {
        args.push(g.add_input(&format!("x{i}"), t.clone())?);
    }
    for (i, v) in g.add_op(op.clone(), &args)?.into_iter().enumerate() {
        g.add_output(&format!("y{i}"), v)?;
    }
    Ok(Arc::from(oar_backend_cpu::CpuBackend.compile(&g, &Weights::new())?))
}
