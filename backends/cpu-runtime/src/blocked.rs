//! The blocked channel layout NCHW`L`c across a network: which convolution steps run on it
//! and which buffers are stored in it.

use crate::contraction::{WeightCache, operand_view};
use crate::conv::ConvSpec;
use crate::epilogue::ConvEpilogue;
use crate::program::Step;
use crate::simd::Simd;
use crate::{conv_depthwise_blocked as depthwise, conv_first_blocked as first, conv_pointwise_blocked as pointwise};
use oar_ir::DType;
use oar_ir::kernel::{BufferId, BufferKind, Contraction, KernelBody, KernelProgram, MemoryPlan};

/// A blocked convolution's operand layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layouts {
    /// The input is stored blocked (its channels padded to whole blocks).
    pub(crate) input: bool,
    /// The output (and the chain's residual) is stored blocked.
    pub(crate) output: bool,
}

/// Output channel blocks a blocked kernel's register tile holds at most: 4 on AVX-512 (32
/// vector registers), 2 on AVX2 (16; the pointwise kernel also takes 3 in shorter tiles, for
/// an odd count of blocks).
pub(crate) fn max_output_blocks(simd: Simd) -> usize {
    match simd {
        Simd::Avx512 => 4,
        _ => 2,
    }
}

/// Weights `w[O, K]` (row-major; `K` taps or input channels per output channel) packed for a
/// blocked kernel as `[O/l][kp][l]`: per block of `l` output channels one vector per `k < K`,
/// zero past the last output channel and for `K ≤ k < kp`.
pub(crate) fn pack_output_blocks(w: &[f32], o: usize, k: usize, kp: usize, l: usize) -> Vec<f32> {
    let mut out = vec![0f32; o.div_ceil(l) * kp * l];
    for oc in 0..o {
        let base = (oc / l) * kp * l + oc % l;
        for (t, &v) in w[oc * k..][..k].iter().enumerate() {
            out[base + t * l] = v;
        }
    }
    out
}

/// `x[N, C, P]` (NCHW, `P` positions per channel) in NCHW`l`c, the last block's lanes past
/// `C` NaN (the kernels never read them into a channel's result).
#[cfg(test)]
pub(crate) fn to_blocked(x: &[f32], n: usize, c: usize, p: usize, l: usize) -> Vec<f32> {
    let cb = c.div_ceil(l);
    let mut out = vec![f32::NAN; n * cb * l * p];
    for b in 0..n {
        for ch in 0..c {
            for q in 0..p {
                out[((b * cb + ch / l) * p + q) * l + ch % l] = x[(b * c + ch) * p + q];
            }
        }
    }
    out
}

/// The inverse of [`to_blocked`] (the padded lanes dropped).
#[cfg(test)]
pub(crate) fn from_blocked(x: &[f32], n: usize, c: usize, p: usize, l: usize) -> Vec<f32> {
    let cb = c.div_ceil(l);
    let mut out = vec![0.0; n * c * p];
    for b in 0..n {
        for ch in 0..c {
            for q in 0..p {
                out[(b * c + ch) * p + q] = x[((b * cb + ch / l) * p + q) * l + ch % l];
            }
        }
    }
    out
}

/// The kernel a blocked step runs.
#[derive(Debug)]
enum Kind {
    Pointwise(pointwise::Plan),
    Depthwise(depthwise::Plan),
    First(first::Plan),
    /// A max pool reading a blocked input into an NCHW output.
    MaxPool(crate::pool_blocked::Plan),
}

/// A convolution (or max-pool) step run by a blocked kernel: its operands and their layouts.
#[derive(Debug)]
pub(crate) struct BlockedConv {
    kind: Kind,
    x: BufferId,
    /// The weights (none for a pool).
    w: Option<BufferId>,
    out: BufferId,
    /// Whether the weights are a param or a constant (packed once, kept in the step's cache).
    w_is_weight: bool,
    layouts: Layouts,
}

/// Output positions per image up to which a convolution runs blocked (`OAR_CPU_BLOCKED`:
/// a number, or `off`; by default every plane: measured on MobileNetV2, keeping its
/// 112 × 112 and 56 × 56 stages blocked too saves the depthwise layers' transposes, more
/// than the 1 × 1 layers there lose to the NCHW GEMM).
fn max_positions() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| match std::env::var("OAR_CPU_BLOCKED") {
        Ok(v) if v.eq_ignore_ascii_case("off") => 0,
        Ok(v) => v.parse().unwrap_or(DEFAULT_MAX_POSITIONS),
        Err(_) => DEFAULT_MAX_POSITIONS,
    })
}

const DEFAULT_MAX_POSITIONS: usize = usize::MAX;

/// The blocked steps of a program (per step; `None` runs as before) and, implicitly, the
/// buffers stored blocked: a temporary f32 buffer is blocked when the step writing it and
/// every step reading it run blocked — as a convolution's input, or
/// as the residual of its epilogue chain whose output is blocked too. Every other buffer,
/// the program's inputs and outputs among them, stays NCHW: the blocked kernels reorder at
/// those boundaries.
pub(crate) fn plan(
    p: &KernelProgram,
    steps: &[Step],
    chains: &[Option<ConvEpilogue>],
    hoisted: &[bool],
) -> Vec<Option<BlockedConv>> {
    let simd = Simd::detect();
    let limit = max_positions();
    let mut out: Vec<Option<BlockedConv>> = (0..steps.len())
        .map(|i| {
            if simd == Simd::Baseline || limit == 0 || hoisted.get(i).copied().unwrap_or(true) {
                return None;
            }
            candidate(p, steps.get(i)?, chains.get(i).and_then(Option::as_ref), limit)
        })
        .collect();
    let lanes = simd.lanes();
    // Blocked buffers: temporaries written by a candidate. One whose channels are not whole
    // blocks is stored padded to whole blocks (see [`place_padded`]) where only the kernels
    // that keep to the padding touch it: pointwise and first-layer writers write the padded
    // lanes (zero weights, zero bias), pointwise readers skip them.
    let mut blocked = vec![false; p.buffers.len()];
    for c in out.iter().flatten().filter(|c| !matches!(c.kind, Kind::MaxPool(_))) {
        let b = p.buffer(c.out);
        let channels = b.ty.shape.as_static().is_some_and(|s| s.len() > 1);
        blocked[c.out.index()] = b.kind == BufferKind::Temp
            && channels
            && (whole_blocks(p, c.out, lanes) || !matches!(c.kind, Kind::Depthwise(_)));
    }
    // Every reader of a blocked buffer reads it as a candidate's input (a pointwise or
    // depthwise one; padded: a pointwise one) or residual.
    for (i, k) in p.kernels.iter().enumerate() {
        let step = out.get(i).and_then(Option::as_ref);
        let residual = chains.get(i).and_then(Option::as_ref).and_then(ConvEpilogue::residual);
        for r in k.reads() {
            let whole = whole_blocks(p, r, lanes);
            let fine = step.is_some_and(|s| {
                let input = r == s.x
                    && match s.kind {
                        Kind::Pointwise(_) | Kind::MaxPool(_) => true,
                        Kind::Depthwise(_) => whole,
                        Kind::First(_) => false,
                    };
                Some(r) != s.w && (input || Some(r) == residual)
            });
            if !fine {
                blocked[r.index()] = false;
            }
        }
    }
    // A chain's residual is read at the output's offsets: the same layout.
    loop {
        let mut changed = false;
        for (i, c) in out.iter().enumerate() {
            let Some(c) = c else { continue };
            if let Some(r) = chains.get(i).and_then(Option::as_ref).and_then(ConvEpilogue::residual)
                && blocked[r.index()] != blocked[c.out.index()]
            {
                blocked[r.index()] = false;
                blocked[c.out.index()] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    for c in out.iter_mut().flatten() {
        c.layouts = Layouts {
            input: blocked[c.x.index()],
            output: blocked[c.out.index()],
        };
    }
    // A step with both sides NCHW runs as before (its own paths are as fast there: on
    // ResNet-18's 7 × 7 first layer on AVX-512, the register-tiled direct convolution, 1.23
    // against 1.26 ms) — but for a first layer on AVX2, where this kernel's strided reads
    // beat the tiled path's phase-split copy (the same layer 3.54 → 3.30 ms, Zen 3).
    let keep_nchw = |c: &BlockedConv| simd == Simd::Avx2Fma && matches!(c.kind, Kind::First(_));
    for c in &mut out {
        if c.as_ref()
            .is_some_and(|c| !c.layouts.input && !c.layouts.output && !keep_nchw(c))
        {
            *c = None;
        }
    }
    out
}

/// Whether buffer `b`'s channels (dimension 1) are whole blocks of `lanes`.
fn whole_blocks(p: &KernelProgram, b: BufferId, lanes: usize) -> bool {
    p.buffer(b)
        .ty
        .shape
        .as_static()
        .and_then(|s| s.get(1).copied())
        .is_some_and(|c| c % lanes == 0)
}

/// Give the blocked buffers whose channels are not whole blocks (24 channels in blocks of
/// 16) their padded size: each gets its own place after the arena's temporaries.
pub(crate) fn place_padded(p: &KernelProgram, plan: &mut MemoryPlan, steps: &[Option<BlockedConv>]) {
    let lanes = Simd::detect().lanes();
    for c in steps.iter().flatten().filter(|c| c.layouts.output) {
        let b = p.buffer(c.out);
        let Some(s) = b.ty.shape.as_static() else { continue };
        if s.len() < 2 || s[1] % lanes == 0 || !plan.sizes.contains_key(&c.out) {
            continue;
        }
        let padded = s[1].next_multiple_of(lanes);
        let bytes = s.iter().product::<usize>() / s[1] * padded * b.ty.dtype.size_bytes();
        let align = plan.alignment.max(64);
        let off = plan.arena_bytes.next_multiple_of(align);
        plan.offsets.insert(c.out, off);
        plan.sizes.insert(c.out, bytes);
        plan.arena_bytes = off + bytes;
    }
}

/// The blocked kernel for step `step`, if it is an f32 2-d convolution one serves, whose
/// operands are whole dense buffers and whose epilogue is none or a recognized chain.
fn candidate(p: &KernelProgram, step: &Step, chain: Option<&ConvEpilogue>, limit: usize) -> Option<BlockedConv> {
    if let Step::Native { kernel, epilogue: None } = step {
        return max_pool(p, p.kernels.get(*kernel as usize)?);
    }
    let Step::Contraction { kernel, epilogue, .. } = step else {
        return None;
    };
    if epilogue.is_some() && chain.is_none() {
        return None;
    }
    let k = p.kernels.get(*kernel as usize)?;
    let KernelBody::Contraction(c) = &k.body else {
        return None;
    };
    let Contraction::Conv(conv) = &c.op else {
        return None;
    };
    let out = *k.outputs.first()?;
    if c.acc_dtype != DType::F32 || c.lhs.round.is_some() || c.rhs.round.is_some() {
        return None;
    }
    let (xv, x) = operand_view(&c.lhs, p, "lhs").ok()?;
    let (wv, w) = operand_view(&c.rhs, p, "rhs").ok()?;
    let whole = |v: &crate::contraction::View, b: BufferId| {
        let buf = p.buffer(b);
        v.is_dense()
            && v.offset == 0
            && buf.ty.dtype == DType::F32
            && buf
                .ty
                .shape
                .as_static()
                .is_some_and(|s| s.iter().product::<usize>() == v.len())
    };
    if !whole(&xv, x) || !whole(&wv, w) || p.buffer(out).ty.dtype != DType::F32 || x == out || w == out {
        return None;
    }
    let shape: Vec<usize> = c.shape.iter().map(|d| d.as_static()).collect::<Option<_>>()?;
    if shape.len() != 4 || shape[2] * shape[3] > limit {
        return None;
    }
    let spec = ConvSpec::of(conv);
    // A malformed convolution is left to the step's own path, which reports it.
    crate::conv::geometry_to(&xv.shape, &wv.shape, &shape, &spec).ok()?;
    let (xs, ws, sout) = (&xv.shape, &wv.shape, &shape[2..]);
    let kind = if let Some(plan) = pointwise::Plan::new(xs, ws, &spec, sout) {
        Kind::Pointwise(plan)
    } else if let Some(plan) = depthwise::Plan::new(xs, ws, &spec, sout) {
        Kind::Depthwise(plan)
    } else {
        Kind::First(first::Plan::new(xs, ws, &spec, sout)?)
    };
    Some(BlockedConv {
        kind,
        x,
        w: Some(w),
        out,
        w_is_weight: p.buffer(w).kind.is_weight(),
        layouts: Layouts {
            input: false,
            output: false,
        },
    })
}

/// A blocked max pool for native kernel `k`, if it is an f32 3 × 3 stride-2 `max_pool2d` of
/// a whole dense buffer into another ([`crate::pool_blocked`]).
fn max_pool(p: &KernelProgram, k: &oar_ir::kernel::Kernel) -> Option<BlockedConv> {
    let KernelBody::Opaque(o) = &k.body else {
        return None;
    };
    let oar_ir::Op::Composite(oar_ir::ops::Composite::MaxPool2d(m)) = &o.op else {
        return None;
    };
    let (&[x], &[out]) = (o.inputs.as_slice(), k.outputs.as_slice()) else {
        return None;
    };
    let (xb, ob) = (p.buffer(x), p.buffer(out));
    if xb.ty.dtype != DType::F32 || ob.ty.dtype != DType::F32 || x == out {
        return None;
    }
    let plan = crate::pool_blocked::Plan::new(&xb.ty.shape.as_static()?, m, &ob.ty.shape.as_static()?)?;
    Some(BlockedConv {
        kind: Kind::MaxPool(plan),
        x,
        w: None,
        out,
        w_is_weight: false,
        layouts: Layouts {
            input: false,
            output: false,
        },
    })
}

impl BlockedConv {
    /// Whether the input and the output are stored blocked.
    pub(crate) fn layouts(&self) -> (bool, bool) {
        (self.layouts.input, self.layouts.output)
    }

    /// Run the convolution and its chain.
    ///
    /// # Safety
    /// `bufs` holds live base pointers for every buffer of the program the step was planned
    /// for, sized as their types say, the blocked ones stored blocked.
    pub(crate) unsafe fn run(
        &self,
        bufs: &[*mut u8],
        threads: usize,
        cache: Option<&WeightCache>,
        chain: Option<&ConvEpilogue>,
    ) {
        let (x, out) = (bufs[self.x.index()] as *const f32, bufs[self.out.index()] as *mut f32);
        let w = self.w.map_or(std::ptr::null(), |w| bufs[w.index()] as *const f32);
        let vectors = chain.map(|c| c.vectors(bufs));
        let cache = cache.filter(|_| self.w_is_weight);
        // An NCHW depthwise output takes the chain plane by plane as its blocks complete.
        let (base, nb) = (bufs.as_ptr() as usize, bufs.len());
        let planes = move |first: usize, n: usize| {
            if let Some(c) = chain {
                // Safety: the step's live buffers; the planes are done.
                unsafe { c.apply(std::slice::from_raw_parts(base as *const *mut u8, nb), first, n) }
            }
        };
        let epi = (chain.is_some() && !self.layouts.output).then_some(&planes as crate::contraction::PlaneEpilogue);
        // Safety: the caller's contract; the plans were made for these buffers' shapes.
        unsafe {
            match &self.kind {
                Kind::Pointwise(plan) => {
                    pointwise::conv(x, w, out, plan, self.layouts, threads, cache, vectors.as_ref())
                }
                Kind::Depthwise(plan) => {
                    depthwise::conv_in(x, w, out, plan, self.layouts, threads, epi, vectors.as_ref())
                }
                Kind::First(plan) => {
                    first::conv(x, w, out, plan, self.layouts.output, threads, cache, vectors.as_ref())
                }
                Kind::MaxPool(plan) => crate::pool_blocked::pool(x, out, plan, threads),
            }
        }
    }
}
