//! A memory plan: where each temporary buffer of a [`super::KernelProgram`] lives in one arena.

use super::BufferId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Offsets of temporaries in a shared arena, for one binding of the symbolic dims.
/// Graph inputs, params, constants and outputs are not in the arena (the caller owns them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// The symbol bindings the sizes were computed for.
    pub bindings: BTreeMap<String, usize>,
    /// Alignment of every offset, in bytes.
    pub alignment: usize,
    /// Byte offset of every temporary buffer in the arena.
    pub offsets: BTreeMap<BufferId, usize>,
    /// Byte size of every temporary buffer.
    pub sizes: BTreeMap<BufferId, usize>,
    /// Arena size: the peak bytes with reuse.
    pub arena_bytes: usize,
    /// Bytes without reuse: every temporary in its own allocation.
    pub peak_naive_bytes: usize,
    /// The most bytes of temporaries live at once (a lower bound for `arena_bytes`).
    pub peak_live_bytes: usize,
    /// `(output, input)`: a kernel writes `output` in place over `input`, which dies there.
    pub in_place: Vec<(BufferId, BufferId)>,
}
