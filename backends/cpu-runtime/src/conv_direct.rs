//! Direct convolution of one input plane into one output plane: the path for convolutions whose
//! output channels each read a single input channel (`C/groups == 1`: depthwise convolutions as
//! in MobileNet, or a single input channel), where im2col would only copy.
//!
//! The input plane is zero-padded and split into stride phases (a polyphase decomposition:
//! sub-plane `p` holds the padded elements whose coordinates are `≡ p` modulo the stride, per
//! axis). In that layout every kernel tap reads one contiguous run for the whole output plane
//! (computed with the sub-plane's row pitch; the few extra columns are dropped at the end), so
//! the work is a handful of long multiply-add loops, several taps per pass, that vectorize
//! (compiled for AVX-512 or AVX2+FMA when the host has them).

use crate::contraction::Elem;
use crate::simd::Simd;

/// Output elements per pass over the taps (the accumulator block stays in L1).
const BLOCK: usize = 2048;
/// Taps added per pass.
const TAPS_PER_PASS: usize = 8;

/// The geometry of a direct convolution (per plane; the same for every plane of a call).
pub(crate) struct Direct {
    /// Input and output spatial shapes, strides.
    sin: Vec<usize>,
    sout: Vec<usize>,
    stride: Vec<usize>,
    /// Elements of a sub-plane (`ceil(ext / stride)` per axis, `ext` the padded extent the
    /// taps read: `(O-1)·stride + (K-1)·dilation + 1`).
    qn: usize,
    /// Number of sub-planes (`Π stride`).
    nphase: usize,
    /// Per kernel position (row-major over the kernel): where its run starts.
    taps: Vec<usize>,
    /// Length of every run: the output plane in sub-plane pitch.
    len: usize,
    /// Per input row (row-major over every axis but the last): where its phases start in the
    /// padded buffer, `None` for rows no tap reads.
    in_rows: Vec<Option<usize>>,
    /// Per column phase of an input row: first input column, offset added to the row's start,
    /// number of elements.
    col_runs: Vec<(usize, usize, usize)>,
    /// Per output row: where it starts in the accumulator.
    out_rows: Vec<usize>,
    simd: Simd,
}

/// Per-thread scratch of [`Direct::plane`], for one [`Direct`] (its padded plane's border is
/// zeroed once and never written).
pub(crate) struct Scratch<T> {
    padded: Vec<T>,
    acc: Vec<T>,
}

impl<T> Default for Scratch<T> {
    fn default() -> Self {
        Scratch {
            padded: Vec::new(),
            acc: Vec::new(),
        }
    }
}

impl Direct {
    /// Scratch elements [`Direct::plane`] needs (padded plane and accumulator), `None` on
    /// overflow: the caller takes another path when this is far beyond the planes' own sizes
    /// (huge padding or strides).
    pub fn scratch_elems(kd: &[usize], sout: &[usize], stride: &[usize], dil: &[usize]) -> Option<usize> {
        let (mut padded, mut acc) = (1usize, 0usize);
        for i in (0..sout.len()).rev() {
            let ext = (sout[i] - 1)
                .checked_mul(stride[i])?
                .checked_add((kd[i] - 1).checked_mul(dil[i])?)?
                .checked_add(1)?;
            let q = ext.div_ceil(stride[i]);
            acc = acc.checked_add((sout[i] - 1).checked_mul(padded)?)?;
            padded = padded.checked_mul(q)?;
        }
        let phases = stride.iter().try_fold(1usize, |a, &s| a.checked_mul(s))?;
        padded.checked_mul(phases)?.checked_add(acc + 1)
    }

    /// The geometry for input `sin`, kernel `kd`, output `sout` (every output dim ≥ 1, already
    /// checked to be the convolution's).
    pub fn new(sin: &[usize], kd: &[usize], sout: &[usize], stride: &[usize], pad: &[usize], dil: &[usize]) -> Direct {
        let sp = sin.len();
        let ext: Vec<usize> = (0..sp)
            .map(|i| (sout[i] - 1) * stride[i] + (kd[i] - 1) * dil[i] + 1)
            .collect();
        let q: Vec<usize> = (0..sp).map(|i| ext[i].div_ceil(stride[i])).collect();
        let mut qstr = vec![1usize; sp];
        for i in (0..sp - 1).rev() {
            qstr[i] = qstr[i + 1] * q[i + 1];
        }
        let qn = qstr[0] * q[0];
        let nphase = stride.iter().product();
        let ks: usize = kd.iter().product();
        let taps = (0..ks)
            .map(|mut k| {
                let (mut phase, mut off, mut scale) = (0, 0, 1);
                for i in (0..sp).rev() {
                    let at = (k % kd[i]) * dil[i];
                    k /= kd[i];
                    phase += (at % stride[i]) * scale;
                    scale *= stride[i];
                    off += (at / stride[i]) * qstr[i];
                }
                phase * qn + off
            })
            .collect();
        let len = (0..sp).map(|i| (sout[i] - 1) * qstr[i]).sum::<usize>() + 1;
        // The index arithmetic of the padded split and of the output rows, once per geometry
        // instead of once per plane.
        let l = sp - 1;
        let in_rows = (0..sin[..l].iter().product::<usize>())
            .map(|mut r| {
                let (mut phase, mut off, mut scale) = (0, 0, 1);
                for i in (0..l).rev() {
                    let ip = r % sin[i] + pad[i];
                    r /= sin[i];
                    if ip >= ext[i] {
                        return None;
                    }
                    phase += (ip % stride[i]) * scale;
                    scale *= stride[i];
                    off += ip / stride[i] * qstr[i];
                }
                Some(phase * stride[l] * qn + off)
            })
            .collect();
        let (sl, pl) = (stride[l], pad[l]);
        let lim = sin[l].min(ext[l].saturating_sub(pl));
        let col_runs = (0..sl)
            .filter_map(|c| {
                // Columns of phase `c`: `(iw + pl) % sl == c`.
                let iw0 = (c + sl - pl % sl) % sl;
                (iw0 < lim).then(|| (iw0, c * qn + (iw0 + pl) / sl, (lim - iw0).div_ceil(sl)))
            })
            .collect();
        let out_rows = (0..sout[..l].iter().product::<usize>())
            .map(|mut r| {
                let mut at = 0;
                for i in (0..l).rev() {
                    at += (r % sout[i]) * qstr[i];
                    r /= sout[i];
                }
                at
            })
            .collect();
        Direct {
            in_rows,
            col_runs,
            out_rows,
            sin: sin.to_vec(),
            sout: sout.to_vec(),
            stride: stride.to_vec(),
            qn,
            nphase,
            taps,
            len,
            simd: Simd::detect(),
        }
    }

    /// `out = x ⋆ w` for one plane: `x` of the input spatial shape, `w` of the kernel's,
    /// `out` of the output's.
    pub fn plane<T: Elem>(&self, x: &[T], w: &[T], out: &mut [T], s: &mut Scratch<T>) {
        #[cfg(target_arch = "x86_64")]
        {
            // Safety: the features were detected on this host.
            match self.simd {
                Simd::Avx512 => return unsafe { self.plane_avx512(x, w, out, s) },
                Simd::Avx2Fma => return unsafe { self.plane_avx2(x, w, out, s) },
                Simd::Baseline => {}
            }
        }
        self.plane_impl::<T, false>(x, w, out, s)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn plane_avx512<T: Elem>(&self, x: &[T], w: &[T], out: &mut [T], s: &mut Scratch<T>) {
        self.plane_impl::<T, true>(x, w, out, s)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn plane_avx2<T: Elem>(&self, x: &[T], w: &[T], out: &mut [T], s: &mut Scratch<T>) {
        self.plane_impl::<T, true>(x, w, out, s)
    }

    #[inline(always)]
    fn plane_impl<T: Elem, const FMA: bool>(&self, x: &[T], w: &[T], out: &mut [T], s: &mut Scratch<T>) {
        self.pad_and_split(x, &mut s.padded);
        if s.acc.len() == self.len {
            s.acc.fill(T::ZERO);
        } else {
            s.acc.clear();
            s.acc.resize(self.len, T::ZERO);
        }
        add_taps::<T, FMA>(&self.taps, &s.padded, w, &mut s.acc);
        // Keep the real output columns.
        let ow = self.sout[self.sout.len() - 1];
        for (orow, &at) in out.chunks_exact_mut(ow).zip(&self.out_rows) {
            copy_run(orow, &s.acc[at..at + ow]);
        }
    }

    /// The zero-padded input plane, split into stride phases.
    #[inline(always)]
    fn pad_and_split<T: Elem>(&self, x: &[T], buf: &mut Vec<T>) {
        // The padding stays zero from the first plane on: every plane writes the same
        // positions (a scratch serves one geometry).
        if buf.len() != self.nphase * self.qn {
            buf.clear();
            buf.resize(self.nphase * self.qn, T::ZERO);
        }
        let (w, sl) = (self.sin[self.sin.len() - 1], self.stride[self.stride.len() - 1]);
        for (xr, row) in x.chunks_exact(w).zip(&self.in_rows) {
            let Some(row) = *row else { continue };
            for &(iw0, add, n) in &self.col_runs {
                let at = row + add;
                gather_step(&mut buf[at..at + n], &xr[iw0..], sl);
            }
        }
    }
}

/// A 2-d plane's stride phases, the decomposition [`Direct`] computes in: phase `(r, s)`, of
/// `rows × pitch` elements, holds at `(i, j)` the padded element `(i·sh + r, j·sw + s)` of an
/// `h × w` input padded by `top` rows and `left` columns before.
#[derive(Clone, Debug)]
pub(crate) struct Phases {
    pub h: usize,
    pub w: usize,
    pub top: usize,
    pub left: usize,
    pub sh: usize,
    pub sw: usize,
    pub rows: usize,
    pub pitch: usize,
}

impl Phases {
    /// `src` (the `h × w` plane) split into `dst` (`sh · sw` phases, one after another), `pad`
    /// outside the input; the phases `skip` names are left as they are.
    #[inline(always)]
    pub(crate) fn split<T: Copy>(&self, src: &[T], pad: T, dst: &mut [T], skip: impl Fn(usize) -> bool) {
        let (sh, sw, pitch) = (self.sh, self.sw, self.pitch);
        let len = self.rows * pitch;
        for r in 0..sh {
            for s in 0..sw {
                if skip(r * sw + s) {
                    continue;
                }
                let ph = &mut dst[(r * sw + s) * len..][..len];
                let (lo, hi) = self.columns(s);
                for (i, prow) in ph.chunks_exact_mut(pitch).enumerate() {
                    let Some(y) = (i * sh + r).checked_sub(self.top).filter(|&y| y < self.h) else {
                        prow.fill(pad);
                        continue;
                    };
                    prow[..lo].fill(pad);
                    prow[hi..].fill(pad);
                    if lo < hi {
                        let first = lo * sw + s - self.left;
                        gather_step(&mut prow[lo..hi], &src[y * self.w + first..][..self.w - first], sw);
                    }
                }
            }
        }
    }

    /// The runs [`Phases::split`] copies from the input into the phases `keep` names, as
    /// `(to, from, n)`: `n` elements from `from` on, every `sw`-th, to `to` on (every other
    /// element of those phases is padding).
    pub(crate) fn runs(&self, keep: impl Fn(usize) -> bool) -> Vec<(usize, usize, usize)> {
        let (sh, sw, pitch) = (self.sh, self.sw, self.pitch);
        let mut runs = Vec::new();
        for r in 0..sh {
            for s in 0..sw {
                if !keep(r * sw + s) {
                    continue;
                }
                let base = (r * sw + s) * self.rows * pitch;
                let (lo, hi) = self.columns(s);
                for i in 0..self.rows {
                    if let Some(y) = (i * sh + r).checked_sub(self.top).filter(|&y| y < self.h)
                        && lo < hi
                    {
                        runs.push((base + i * pitch + lo, y * self.w + lo * sw + s - self.left, hi - lo));
                    }
                }
            }
        }
        runs
    }

    /// The columns `lo..hi` of phase column `s` that read the input: `left ≤ j·sw + s < left + w`.
    fn columns(&self, s: usize) -> (usize, usize) {
        let (sw, pitch) = (self.sw, self.pitch);
        let lo = self.left.saturating_sub(s).div_ceil(sw).min(pitch);
        let hi = (self.left + self.w)
            .checked_sub(s)
            .map_or(0, |e| e.div_ceil(sw))
            .clamp(lo, pitch);
        (lo, hi)
    }
}

/// Where a 2-d convolution's kernel taps read in its input's stride phases: each phase has
/// `rows × pitch` elements (the padded extent the outputs' windows read, divided by the
/// stride), phase `(r, s)` at `(r · sw + s) · rows · pitch`; tap `(a, b)` (row-major) starts
/// at `taps[a · kw + b]`, and `phases` says which phases a tap reads.
pub(crate) struct TapPhases {
    pub rows: usize,
    pub pitch: usize,
    /// Elements of all the phases.
    pub plane: usize,
    pub taps: Vec<usize>,
    pub phases: Vec<bool>,
}

impl TapPhases {
    /// For kernel `k`, strides `s`, dilations `d` and output `o` (rows, columns; every one
    /// at least 1), `None` on overflow.
    pub(crate) fn new(k: [usize; 2], s: [usize; 2], d: [usize; 2], o: [usize; 2]) -> Option<TapPhases> {
        let ext = |i: usize| {
            (o[i] - 1)
                .checked_mul(s[i])?
                .checked_add((k[i] - 1).checked_mul(d[i])?)?
                .checked_add(1)
        };
        let rows = ext(0)?.div_ceil(s[0]);
        let pitch = ext(1)?.div_ceil(s[1]);
        let plane = s[0].checked_mul(s[1])?.checked_mul(rows)?.checked_mul(pitch)?;
        let mut taps = Vec::with_capacity(k[0] * k[1]);
        let mut phases = vec![false; s[0] * s[1]];
        for a in 0..k[0] {
            for b in 0..k[1] {
                let (r, c) = (a * d[0], b * d[1]);
                let phase = (r % s[0]) * s[1] + c % s[1];
                phases[phase] = true;
                taps.push(phase * rows * pitch + (r / s[0]) * pitch + c / s[1]);
            }
        }
        Some(TapPhases {
            rows,
            pitch,
            plane,
            taps,
            phases,
        })
    }
}

/// `dst[j] = src[j · step]` for every `j` of `dst` (`src` holds them all).
#[inline(always)]
pub(crate) fn gather_step<T: Copy>(dst: &mut [T], src: &[T], step: usize) {
    match step {
        1 => copy_run(dst, &src[..dst.len()]),
        2 => {
            // Pairs: a constant step without bounds checks, which vectorizes.
            let n = dst.len();
            if n == 0 {
                return;
            }
            let pairs = src[..(2 * n - 1).min(src.len())].chunks_exact(2);
            if let Some(&v) = pairs.remainder().first() {
                dst[n - 1] = v;
            }
            for (d, pair) in dst.iter_mut().zip(pairs) {
                *d = pair[0];
            }
        }
        _ => {
            for (d, &v) in dst.iter_mut().zip(src.iter().step_by(step)) {
                *d = v;
            }
        }
    }
}

/// `dst = src` (equal lengths). Short runs (im2col rows of small planes, a padded copy's
/// elements and rows) go by fixed-size moves of 8 elements, the last one overlapping the one
/// before, since a `memmove` call costs more than such a copy.
#[inline(always)]
pub(crate) fn copy_run<T: Copy>(dst: &mut [T], src: &[T]) {
    const B: usize = 8;
    let n = dst.len();
    if !(B..256).contains(&n) {
        dst.copy_from_slice(src);
        return;
    }
    let mut i = 0;
    while i + B <= n {
        dst[i..i + B].copy_from_slice(&src[i..i + B]);
        i += B;
    }
    if i < n {
        dst[n - B..].copy_from_slice(&src[n - B..]);
    }
}

/// `acc[j] = Σ_t w[t] · src[taps[t] + j]`, block by block, up to [`TAPS_PER_PASS`] taps per
/// pass over a block.
#[inline(always)]
fn add_taps<T: Elem, const FMA: bool>(taps: &[usize], src: &[T], w: &[T], acc: &mut [T]) {
    for (b, blk) in acc.chunks_mut(BLOCK).enumerate() {
        let j0 = b * BLOCK;
        for (ts, ws) in taps.chunks(TAPS_PER_PASS).zip(w.chunks(TAPS_PER_PASS)) {
            macro_rules! pass {
                ($n:literal) => {
                    fused::<T, $n, FMA>(
                        blk,
                        std::array::from_fn(|t| &src[ts[t] + j0..]),
                        std::array::from_fn(|t| ws[t]),
                    )
                };
            }
            match ts.len() {
                1 => pass!(1),
                2 => pass!(2),
                3 => pass!(3),
                4 => pass!(4),
                5 => pass!(5),
                6 => pass!(6),
                7 => pass!(7),
                _ => pass!(8),
            }
        }
    }
}

/// `dst[i] += Σ_t ws[t] · srcs[t][i]` (each source at least as long as `dst`).
#[inline(always)]
fn fused<T: Elem, const N: usize, const FMA: bool>(dst: &mut [T], srcs: [&[T]; N], ws: [T; N]) {
    let n = dst.len();
    let srcs = srcs.map(|s| &s[..n]);
    for i in 0..n {
        let mut a = dst[i];
        for t in 0..N {
            a = if FMA {
                ws[t].fused(srcs[t][i], a)
            } else {
                a + ws[t] * srcs[t][i]
            };
        }
        dst[i] = a;
    }
}
