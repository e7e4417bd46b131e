//! Scans, ordering and masking as tensor methods: `cumsum`, `sort`, `argsort`, `topk`, `flip`,
//! `masked_fill`, `triu`/`tril`.

use super::{Tensor, apply, apply1, norm_axis};
use crate::error::Error;
use crate::error::Result;
use oar_ir::ops::{ArgSort, CumSum, Flip, MaskedFill, Sort, TopK, Trilu};
use oar_ir::{Composite, Float, Op};

impl Tensor {
    /// Running sums along `axis` (negative counts from the end); the dtype is kept.
    pub fn cumsum(&self, axis: i64) -> Result<Tensor> {
        let axis = norm_axis("cumsum", axis, self.ndim())?;
        let c = Composite::CumSum(CumSum {
            axis,
            exclusive: false,
            reverse: false,
        });
        apply1(Op::Composite(c), &[self])
    }

    /// The lanes along `axis` sorted (stable; NaN last ascending, first descending), and the
    /// i64 indices they came from.
    pub fn sort(&self, axis: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        let axis = norm_axis("sort", axis, self.ndim())?;
        let mut outs = apply(Op::Sort(Sort { axis, descending }), &[self])?;
        let indices = outs.remove(1);
        Ok((outs.remove(0), indices))
    }

    /// The i64 indices that sort the lanes along `axis` (stable).
    pub fn argsort(&self, axis: i64, descending: bool) -> Result<Tensor> {
        let axis = norm_axis("argsort", axis, self.ndim())?;
        apply1(Op::Composite(Composite::ArgSort(ArgSort { axis, descending })), &[self])
    }

    /// The `k` largest (or smallest) elements along `axis`, in order, and their i64 indices.
    pub fn topk(&self, k: usize, axis: i64, largest: bool) -> Result<(Tensor, Tensor)> {
        let axis = norm_axis("topk", axis, self.ndim())?;
        let mut outs = apply(Op::Composite(Composite::TopK(TopK { k, axis, largest })), &[self])?;
        let indices = outs.remove(1);
        Ok((outs.remove(0), indices))
    }

    /// `value` where the bool `mask` (broadcast to this tensor's shape) is true.
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        let c = Composite::MaskedFill(MaskedFill { value: Float(value) });
        apply1(Op::Composite(c), &[self, mask])
    }

    /// The elements in reverse order along each of `dims` (negative counts from the end), as
    /// PyTorch's `flip`; a repeated dim is an error.
    pub fn flip(&self, dims: &[i64]) -> Result<Tensor> {
        let mut axes = dims
            .iter()
            .map(|&d| norm_axis("flip", d, self.ndim()))
            .collect::<Result<Vec<_>>>()?;
        axes.sort_unstable();
        if axes.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::invalid("flip", format!("dims {dims:?} name an axis twice")));
        }
        apply1(Op::Composite(Composite::Flip(Flip { axes })), &[self])
    }

    /// The upper triangle of the matrices in the last two axes (`j - i ≥ diagonal`), the rest
    /// zero, as PyTorch's `triu`.
    pub fn triu(&self, diagonal: i64) -> Result<Tensor> {
        apply1(
            Op::Composite(Composite::Trilu(Trilu { diagonal, upper: true })),
            &[self],
        )
    }

    /// The lower triangle of the matrices in the last two axes (`j - i ≤ diagonal`), the rest
    /// zero, as PyTorch's `tril`.
    pub fn tril(&self, diagonal: i64) -> Result<Tensor> {
        apply1(
            Op::Composite(Composite::Trilu(Trilu { diagonal, upper: false })),
            &[self],
        )
    }
}
