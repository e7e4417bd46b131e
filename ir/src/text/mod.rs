//! The text format: an MLIR-like, human-readable form of a graph; print → parse → print is
//! the identity.
//!
//! ```text
//! graph @mlp {
//!   %x = input "x" : f32[N,784]
//!   %fc1.weight = param "fc1.weight" : f32[784,128]
//!   %0 = constant dense<[1.0, 2.5, -3.0]> : f32[3]
//!   %1 = matmul(%x, %fc1.weight) : f32[N,128]
//!   %2 = reduce_sum(%1) {axes = [1], keepdim = false} : f32[N]
//!   %3:3 = batch_norm(%a, %s, %b, %rm, %rv) {epsilon = 1e-5, momentum = 0.9, training = true} : f32[8,3], f32[3], f32[3]
//!   %4 = cond(%p, %2) : f32[N] {
//!     then @then {
//!       %a = input "a" : f32[N]
//!       output "r" = %a
//!     }
//!     else @else { ... }
//!   }
//!   output "y" = %4
//! }
//! ```
//!
//! - Values are `%name`: inputs and params whose names are identifiers keep them (inputs win
//!   a clash), everything else is numbered `%0, %1, ...` in print order; `%4#1` is result 1
//!   of a multi-result op.
//! - Nodes print inputs first (in call order), then in `Graph::topo_order`; a parsed graph's
//!   node ids follow the text, so printing it again gives the same text.
//! - Shapes and dtypes that the result type states (reshape, broadcast, cast, iota, random)
//!   are not repeated as attributes.
//! - Floats print as the shortest exact decimal, `inf`, `nan` (the canonical quiet NaN), or
//!   raw bits `0x7FF0000000000001` (any other NaN). Constants with at most 64 elements print
//!   as nested lists, larger ones as little-endian hex bytes `dense<"0x0000803F...">`.
//! - Regions are full graphs labelled by role: `then`/`else` for `cond`, `cond`/`body` for
//!   `while`; each has its own numbering and sees only its own inputs.
//! - `// comments` run to the end of the line.

mod attrs;
mod dense;
mod kernel;
mod lexer;
mod literal;
mod parse;
mod print;

pub(crate) use attrs::word_attr;
pub use attrs::{AttrCx, AttrVal, AttrValue, Attrs, Spanned, single_result, unknown_op};
pub(crate) use literal::fmt_dense;

/// A parse error with its line and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {msg}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// What is wrong.
    pub msg: String,
}

/// Print a graph as text.
pub fn print_graph(graph: &crate::Graph) -> String {
    let mut out = String::new();
    print::print_block(graph, "graph", 0, &mut out);
    out
}

/// Parse a kernel program in the form `KernelProgram`'s `Display` prints (see
/// `docs/KERNELS.md`): buffers with their types (constants with their data), kernels, outputs.
pub fn parse_kernel_program(text: &str) -> Result<crate::kernel::KernelProgram, ParseError> {
    kernel::parse(text)
}

/// Parse a graph from text.
pub fn parse_graph(text: &str) -> Result<crate::Graph, ParseError> {
    parse::parse(text)
}

impl std::fmt::Display for crate::Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print_graph(self))
    }
}
