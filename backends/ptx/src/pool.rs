//! A caching allocator's bookkeeping (as in PyTorch's CUDA allocator, much simplified): freed
//! device allocations are kept by rounded size and handed out again instead of calling
//! `cuMemAlloc`/`cuMemFree` per tensor and per run, up to a cap on the bytes kept. Pure
//! bookkeeping over opaque addresses, so it is tested without a GPU; the runtime does the
//! driver calls.

use std::collections::HashMap;

/// Allocation granularity: sizes are rounded up to a multiple of this.
pub const GRANULE: usize = 512;

/// `bytes` rounded up to the allocation granularity (at least one granule).
pub fn round(bytes: usize) -> usize {
    bytes.max(1).div_ceil(GRANULE).saturating_mul(GRANULE)
}

/// Free blocks by rounded size, with the total they hold bounded by `limit`.
#[derive(Debug)]
pub struct SizePool {
    free: HashMap<usize, Vec<u64>>,
    cached: usize,
    limit: usize,
}

impl SizePool {
    /// An empty pool keeping at most `limit` bytes.
    pub fn new(limit: usize) -> SizePool {
        SizePool {
            free: HashMap::new(),
            cached: 0,
            limit,
        }
    }

    /// A kept block of rounded size `size`, if any.
    pub fn take(&mut self, size: usize) -> Option<u64> {
        let list = self.free.get_mut(&size)?;
        let ptr = list.pop()?;
        if list.is_empty() {
            self.free.remove(&size);
        }
        self.cached -= size;
        Some(ptr)
    }

    /// Keep block `ptr` of rounded size `size`; returns it back when keeping it would pass
    /// the limit (the caller frees it).
    pub fn give(&mut self, size: usize, ptr: u64) -> Option<u64> {
        if self.cached + size > self.limit {
            return Some(ptr);
        }
        self.free.entry(size).or_default().push(ptr);
        self.cached += size;
        None
    }

    /// Every kept block (the caller frees them), leaving the pool empty.
    pub fn drain(&mut self) -> Vec<u64> {
        self.cached = 0;
        self.free.drain().flat_map(|(_, v)| v).collect()
    }

    /// Bytes kept.
    pub fn cached(&self) -> usize {
        self.cached
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_granules() {
        assert_eq!(round(0), 512);
        assert_eq!(round(1), 512);
        assert_eq!(round(512), 512);
        assert_eq!(round(513), 1024);
        // Too large to round: saturates (the allocation then fails with a typed error).
        assert_eq!(round(usize::MAX), usize::MAX);
    }

    #[test]
    fn blocks_are_reused_by_size_and_bounded() {
        let mut p = SizePool::new(2048);
        assert_eq!(p.take(512), None);
        assert_eq!(p.give(512, 0x1000), None);
        assert_eq!(p.give(1024, 0x2000), None);
        assert_eq!(p.cached(), 1536);
        // Over the limit: handed back to be freed.
        assert_eq!(p.give(1024, 0x3000), Some(0x3000));
        assert_eq!(p.take(1024), Some(0x2000));
        assert_eq!(p.take(1024), None, "a block is handed out once");
        assert_eq!(p.take(2048), None, "no block of another size");
        assert_eq!(p.give(512, 0x4000), None);
        let mut left = p.drain();
        left.sort();
        assert_eq!(left, vec![0x1000, 0x4000]);
        assert_eq!((p.cached(), p.take(512)), (0, None));
    }
}
