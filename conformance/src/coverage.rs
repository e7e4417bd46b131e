//! Op coverage: which ops (and modes) the suite's graphs exercise, and what it must exercise.
//! Both come from the op definitions (`oar_ir::ops`): every mnemonic of the op set, plus each
//! op's coverage modes (`OpDef::modes`), so a new op asks the suite for a case by existing.

use oar_ir::ops::OpDef;
use oar_ir::{Graph, Op};
use std::collections::BTreeSet;

/// The coverage keys of one op: its mnemonic (`exp`, `reduce_sum`, `conv`, `batch_norm`, ...),
/// plus its mode key where one op has behaviours worth covering separately
/// (`scatter/add`, `random/normal`, `batch_norm/train`, `dropout/eval`, `gelu/tanh`,
/// `sdpa/causal`, `avg_pool2d/exclusive`).
pub fn op_keys(op: &Op) -> Vec<String> {
    let mut keys = vec![op.name().to_string()];
    keys.extend(op.mode());
    keys
}

/// Every key the ops section must cover: each mnemonic of the op set and each mode of each op
/// type, as the definitions declare them.
pub fn required_op_keys() -> Vec<String> {
    let mut keys: Vec<String> = Op::all_mnemonics().iter().map(|s| s.to_string()).collect();
    keys.extend(Op::all_modes());
    keys
}

/// Add the keys of every op in `g` (and its regions) to `out`.
pub(crate) fn collect(g: &Graph, out: &mut BTreeSet<String>) {
    for id in g.node_ids() {
        let n = g.node(id);
        out.extend(op_keys(&n.op));
        for r in &n.regions {
            collect(r, out);
        }
    }
}
