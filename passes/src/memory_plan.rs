//! Memory planning: pack the temporaries of a [`KernelProgram`] into one arena.
//!
//! Each temporary lives from the kernel that writes it to the last kernel that reads it.
//! An elementwise loop kernel (no reduction, or reduction stages per row that read only
//! their own row) may write its output over an input temporary
//! that dies at that kernel, when the input is read with the identity map and has the same
//! dtype and shape (every element is read before it is overwritten, at the same index); such
//! pairs share one slot. Slots are then placed greedily, largest first, at the lowest aligned
//! offset that no slot with an overlapping lifetime uses (the offset-based arena of TFLite and
//! XLA's heap simulator, without their refinements).

use crate::PassError;
use oar_ir::IrError;
use oar_ir::kernel::{BufferId, BufferKind, KernelBody, KernelProgram, MemoryPlan};
use oar_ir::tensor_data::checked_byte_len;
use std::collections::BTreeMap;

/// Alignment of every arena offset, in bytes (a cache line; enough for any vector load).
pub const ARENA_ALIGNMENT: usize = 64;

fn err(program: &KernelProgram, detail: String) -> PassError {
    PassError::ir(
        "memory_plan",
        IrError::Structure {
            graph: program.name.clone(),
            detail,
        },
    )
}

fn align(n: usize) -> usize {
    n.div_ceil(ARENA_ALIGNMENT) * ARENA_ALIGNMENT
}

/// One slot: buffers sharing storage (an in-place chain), with their joint lifetime.
struct Slot {
    members: Vec<BufferId>,
    first: usize,
    last: usize,
    size: usize,
}

/// Plan the temporaries of `program` for the symbol values in `bindings` (every symbol in a
/// temporary's shape must be bound).
pub fn memory_plan(program: &KernelProgram, bindings: &BTreeMap<String, usize>) -> Result<MemoryPlan, PassError> {
    memory_plan_joined(program, bindings, &[])
}

/// [`memory_plan`] where each pair `(a, b)` of kernel indices (`a < b`) runs as one step: a
/// backend interleaves them (kernel `b` as an epilogue of `a`, applied to `a`'s results as they
/// are done). Every buffer either kernel touches is live from `a` through `b`, so no result of
/// `b` shares storage with what `a` reads or writes.
pub fn memory_plan_joined(
    program: &KernelProgram,
    bindings: &BTreeMap<String, usize>,
    joined: &[(usize, usize)],
) -> Result<MemoryPlan, PassError> {
    let mut sizes = BTreeMap::new();
    let mut outputs_bytes = 0u64;
    for (i, b) in program.buffers.iter().enumerate() {
        if !matches!(b.kind, BufferKind::Temp | BufferKind::Output) {
            continue;
        }
        let dims =
            b.ty.shape
                .dims()
                .iter()
                .map(|d| {
                    d.eval(&|s| bindings.get(s).copied())
                        .ok_or_else(|| err(program, format!("b{i} ({}): size `{d}` is not bound", b.ty)))
                })
                .collect::<Result<Vec<_>, _>>()?;
        let bytes = checked_byte_len(b.ty.dtype, &dims).map_err(|e| err(program, format!("b{i}: {e}")))?;
        if b.kind == BufferKind::Output {
            // Outputs are allocated by the caller, but they count against the budget too.
            outputs_bytes = outputs_bytes.saturating_add(bytes as u64);
            continue;
        }
        sizes.insert(BufferId(i as u32), bytes);
    }
    // Lifetimes in kernel steps.
    let mut first = BTreeMap::new();
    let mut last: BTreeMap<BufferId, usize> = BTreeMap::new();
    for (k, kernel) in program.kernels.iter().enumerate() {
        for &b in &kernel.outputs {
            first.entry(b).or_insert(k);
            last.entry(b).or_insert(k);
        }
        for b in kernel.reads() {
            if sizes.contains_key(&b) && !first.contains_key(&b) {
                return Err(err(
                    program,
                    format!("{b} is read by `{}` before it is written", kernel.name),
                ));
            }
            last.insert(b, k);
        }
    }
    for &(a, b) in joined {
        let touched = |k: usize| {
            let kernel = &program.kernels[k];
            kernel.reads().into_iter().chain(kernel.outputs.iter().copied())
        };
        for buf in touched(a).chain(touched(b)) {
            if let Some(f) = first.get_mut(&buf) {
                *f = (*f).min(a);
            }
            if let Some(l) = last.get_mut(&buf) {
                *l = (*l).max(b);
            }
        }
    }
    // In-place pairs: slot of each buffer.
    let mut slot_of: BTreeMap<BufferId, usize> = BTreeMap::new();
    let mut slots: Vec<Slot> = Vec::new();
    let mut in_place = Vec::new();
    for (k, kernel) in program.kernels.iter().enumerate() {
        for &b in &kernel.outputs {
            let Some(&size) = sizes.get(&b) else { continue };
            let reuse = match &kernel.body {
                // Row stages read only their own row, before the epilogue writes it.
                KernelBody::Loop(l) if l.reduce.is_empty() || (1..l.shape.len()).contains(&l.outer) => {
                    l.loads.iter().map(|ld| ld.buffer).find(|&i| {
                        let (bi, bo) = (program.buffer(i), program.buffer(b));
                        sizes.contains_key(&i)
                            && last.get(&i) == Some(&k)
                            // A joined kernel still reads its operands while this one writes.
                            && !joined
                                .iter()
                                .any(|&(a, b)| b == k && program.kernels[a].reads().contains(&i))
                            && bi.ty == bo.ty
                            && slot_of
                                .get(&i)
                                .is_some_and(|&s| slots[s].last == k && !in_place.iter().any(|&(_, x)| x == i))
                            && l.loads
                                .iter()
                                .filter(|ld| ld.buffer == i)
                                .all(|ld| ld.map.is_identity() && ld.map.view == bi.ty.shape.0)
                    })
                }
                _ => None,
            };
            match reuse {
                Some(i) => {
                    let s = slot_of[&i];
                    slots[s].members.push(b);
                    slots[s].last = last[&b];
                    slot_of.insert(b, s);
                    in_place.push((b, i));
                }
                None => {
                    slot_of.insert(b, slots.len());
                    slots.push(Slot {
                        members: vec![b],
                        first: first[&b],
                        last: last[&b],
                        size,
                    });
                }
            }
        }
    }
    // Greedy placement, largest first.
    let mut by_size: Vec<usize> = (0..slots.len()).collect();
    by_size.sort_by_key(|&s| (std::cmp::Reverse(slots[s].size), slots[s].first));
    let mut placed: Vec<(usize, usize)> = Vec::new(); // (slot, offset)
    let mut offsets = BTreeMap::new();
    let mut arena_bytes = 0;
    for s in by_size {
        let slot = &slots[s];
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&(o, _)| slots[o].first <= slot.last && slot.first <= slots[o].last)
            .map(|&(o, off)| (off, off + align(slots[o].size)))
            .collect();
        busy.sort();
        let mut offset = 0;
        for (start, end) in busy {
            if offset + slot.size <= start {
                break;
            }
            offset = offset.max(end);
        }
        placed.push((s, offset));
        arena_bytes = arena_bytes.max(offset + slot.size);
        for &m in &slot.members {
            offsets.insert(m, offset);
        }
    }
    let limit = oar_ir::memory::limit();
    let total = (arena_bytes as u64).saturating_add(outputs_bytes);
    if total > limit {
        return Err(err(
            program,
            format!(
                "needs {total} bytes ({arena_bytes} of temporaries, {outputs_bytes} of outputs); the memory limit is {limit} bytes ({})",
                oar_ir::memory::limit_source()
            ),
        ));
    }
    let steps = program.kernels.len();
    let peak_live_bytes = (0..steps)
        .map(|t| {
            slots
                .iter()
                .filter(|s| s.first <= t && t <= s.last)
                .map(|s| s.size)
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0);
    Ok(MemoryPlan {
        bindings: bindings.clone(),
        alignment: ARENA_ALIGNMENT,
        peak_naive_bytes: sizes.values().sum(),
        offsets,
        sizes,
        arena_bytes,
        peak_live_bytes,
        in_place,
    })
}
