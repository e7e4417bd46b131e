//! Op coverage: which ops (and modes) the suite's graphs exercise, and what it must exercise.

use oar_ir::ops::{ArgReduceOp, BinaryOp, RandomDist, ReduceOp, ScatterReduce, UnaryOp};
use oar_ir::{Composite, Graph, Op};
use std::collections::BTreeSet;

/// The coverage keys of one op: its mnemonic (`exp`, `reduce_sum`, `conv`, `batch_norm`, ...),
/// plus a mode key where one op has behaviours worth covering separately
/// (`scatter/add`, `random/normal`, `batch_norm/train`, `dropout/eval`, `gelu/tanh`,
/// `sdpa/causal`, `avg_pool2d/exclusive`).
///
/// The match is exhaustive on purpose: a new `Op` variant does not compile until it is given
/// keys here, and [`required_op_keys`] then asks the suite for a case.
pub fn op_keys(op: &Op) -> Vec<String> {
    let base = op.name().to_string();
    let mode: Option<String> = match op {
        Op::Input { .. }
        | Op::Param { .. }
        | Op::Constant(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Where
        | Op::Reduce { .. }
        | Op::ArgReduce { .. }
        | Op::Reshape { .. }
        | Op::Permute { .. }
        | Op::Broadcast { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concat { .. }
        | Op::Gather { .. }
        | Op::Cast { .. }
        | Op::Iota { .. }
        | Op::MatMul
        | Op::Conv { .. }
        | Op::Cond
        | Op::While => None,
        Op::Scatter { reduce, .. } => Some(format!("scatter/{}", reduce.name())),
        Op::Random { dist, .. } => Some(
            match dist {
                RandomDist::Uniform { .. } => "random/uniform",
                RandomDist::Normal { .. } => "random/normal",
            }
            .into(),
        ),
        Op::Composite(c) => composite_mode(c),
    };
    let mut keys = vec![base];
    keys.extend(mode);
    keys
}

fn composite_mode(c: &Composite) -> Option<String> {
    use Composite::*;
    let mode = match c {
        BatchNorm { training, .. } => format!("batch_norm/{}", if *training { "train" } else { "eval" }),
        Dropout { training, .. } => format!("dropout/{}", if *training { "train" } else { "eval" }),
        Gelu { approximate } => format!("gelu/{}", if *approximate { "tanh" } else { "erf" }),
        ScaledDotProductAttention { causal, .. } => format!("sdpa/{}", if *causal { "causal" } else { "full" }),
        AvgPool2d { count_include_pad, .. } => format!(
            "avg_pool2d/{}",
            if *count_include_pad { "inclusive" } else { "exclusive" }
        ),
        Linear
        | Conv2d { .. }
        | MaxPool2d { .. }
        | AdaptiveAvgPool2d { .. }
        | AdaptiveMaxPool2d { .. }
        | LayerNorm { .. }
        | Softmax { .. }
        | LogSoftmax { .. }
        | CrossEntropy { .. }
        | Relu
        | Silu
        | Sigmoid
        | Embedding => return None,
    };
    Some(mode)
}

/// Mnemonics of the ops that are neither a family (unary, binary, reduce, arg-reduce) nor a
/// composite.
const PLAIN_OPS: &[&str] = &[
    "input",
    "param",
    "constant",
    "where",
    "reshape",
    "permute",
    "broadcast",
    "slice",
    "pad",
    "concat",
    "gather",
    "scatter",
    "cast",
    "iota",
    "random",
    "matmul",
    "conv",
    "cond",
    "while",
];

/// Every key the ops section must cover: each plain op, each unary, binary, reduce and
/// arg-reduce op, each composite, and each mode listed in [`op_keys`].
pub fn required_op_keys() -> Vec<String> {
    let mut keys: Vec<String> = PLAIN_OPS.iter().map(|s| s.to_string()).collect();
    keys.extend(UnaryOp::ALL.iter().map(|u| u.name().to_string()));
    keys.extend(BinaryOp::ALL.iter().map(|b| b.name().to_string()));
    keys.extend(ReduceOp::ALL.iter().map(|r| r.name().to_string()));
    keys.extend(ArgReduceOp::ALL.iter().map(|r| r.name().to_string()));
    keys.extend(ScatterReduce::ALL.iter().map(|r| format!("scatter/{}", r.name())));
    keys.extend(["random/uniform", "random/normal"].map(String::from));
    keys.extend(Composite::NAMES.iter().map(|s| s.to_string()));
    keys.extend(
        [
            "batch_norm/train",
            "batch_norm/eval",
            "dropout/train",
            "dropout/eval",
            "gelu/erf",
            "gelu/tanh",
            "sdpa/causal",
            "sdpa/full",
            "avg_pool2d/inclusive",
            "avg_pool2d/exclusive",
        ]
        .map(String::from),
    );
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
