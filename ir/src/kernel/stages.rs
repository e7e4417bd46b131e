//! Splitting a loop kernel with reduction stages into plain kernels that pass the stage
//! results through small scratch buffers (one element per outer point).
//!
//! A code generator that handles only plain loop kernels (at most one reduction, over loops
//! after every output loop) runs a multi-stage kernel as these pieces, in order: each stage as
//! a reduction kernel over the outer shape writing its scratch buffer, then the epilogue as an
//! elementwise kernel reading the scratch buffers where the stages' results were read. The
//! pieces compute exactly what the fused kernel computes (same instructions, same dtypes).
//! A backend that can keep a row in cache runs the pieces row block by row block (the CPU
//! backend does); [`KernelProgram::split_stages`] is the plain sequential form.

use super::*;

/// A plain loop kernel and the buffer it writes.
pub type Piece = (LoopKernel, BufferId);

impl LoopKernel {
    /// True if this kernel has no stages beyond one plain reduction over loops after every
    /// output loop (what code generators without stage support handle).
    pub fn is_plain(&self) -> bool {
        self.reduce.is_empty() || (self.reduce.len() == 1 && self.outer == self.shape.len())
    }

    /// The type of each stage's result: the stage's dtype over the outer shape.
    pub fn stage_types(&self) -> Vec<TensorType> {
        let outer = self.shape[..self.outer.min(self.shape.len())].to_vec();
        self.reduce
            .iter()
            .map(|r| {
                let dtype = r.body.last().map_or(DType::F32, |i| i.dtype);
                TensorType::new(dtype, outer.clone())
            })
            .collect()
    }

    /// The plain pieces of this kernel writing `out`: one reduction kernel per stage writing
    /// `scratch[s]` (of [`LoopKernel::stage_types`]), then the epilogue writing `out`. A plain
    /// kernel is returned as is.
    pub fn split_stages(&self, out: BufferId, scratch: &[BufferId]) -> Result<Vec<Piece>, String> {
        if self.is_plain() {
            return Ok(vec![(self.clone(), out)]);
        }
        let outer = self.outer;
        if outer > self.shape.len() || scratch.len() != self.reduce.len() {
            return Err(format!(
                "{} outer loops of {}, {} scratch buffers for {} stages",
                outer,
                self.shape.len(),
                scratch.len(),
                self.reduce.len()
            ));
        }
        let outer_shape = self.shape[..outer].to_vec();
        let scratch_load = |s: usize| Load {
            buffer: scratch[s],
            map: IndexMap::identity(&outer_shape),
        };
        let mut pieces = Vec::with_capacity(self.reduce.len() + 1);
        for (s, r) in self.reduce.iter().enumerate() {
            let (loads, body) = rebase(&self.loads, &r.body, &scratch_load)?;
            let dtype = r.body.last().ok_or("empty stage body")?.dtype;
            let kernel = LoopKernel {
                shape: outer_shape.clone(),
                loads,
                outer,
                reduce: vec![Reduction {
                    op: r.op,
                    dims: r.dims.clone(),
                    body,
                }],
                body: vec![Inst {
                    op: ScalarOp::Acc(0),
                    dtype,
                }],
            };
            pieces.push((kernel, scratch[s]));
        }
        let (loads, body) = rebase(&self.loads, &self.body, &scratch_load)?;
        let epilogue = LoopKernel {
            shape: self.shape.clone(),
            loads,
            outer: self.shape.len(),
            reduce: Vec::new(),
            body,
        };
        pieces.push((epilogue, out));
        Ok(pieces)
    }
}

/// `body` with its own loads only (renumbered) and every `Acc(s)` a load of scratch `s`.
fn rebase(all: &[Load], body: &[Inst], scratch: &dyn Fn(usize) -> Load) -> Result<(Vec<Load>, Vec<Inst>), String> {
    let mut loads: Vec<Load> = Vec::new();
    let mut index = |l: Load| match loads.iter().position(|x| *x == l) {
        Some(i) => i,
        None => {
            loads.push(l);
            loads.len() - 1
        }
    };
    let mut out = Vec::with_capacity(body.len());
    for inst in body {
        let op = match &inst.op {
            ScalarOp::Load(l) => ScalarOp::Load(index(all.get(*l).ok_or_else(|| format!("no load l{l}"))?.clone())),
            ScalarOp::Acc(s) => ScalarOp::Load(index(scratch(*s))),
            op => op.clone(),
        };
        out.push(Inst { op, dtype: inst.dtype });
    }
    Ok((loads, out))
}

impl KernelProgram {
    /// New temporary buffers for the stage results of `l` (a loop kernel named `name`), of
    /// [`LoopKernel::stage_types`], named `{name}.acc{s}`.
    pub fn add_stage_buffers(&mut self, name: &str, l: &LoopKernel) -> Vec<BufferId> {
        l.stage_types()
            .into_iter()
            .enumerate()
            .map(|(s, ty)| {
                self.buffers.push(Buffer {
                    kind: BufferKind::Temp,
                    ty,
                    value: format!("{name}.acc{s}"),
                });
                BufferId(self.buffers.len() as u32 - 1)
            })
            .collect()
    }

    /// This program with every multi-stage loop kernel split into plain pieces (see the module
    /// docs), stage results in new temporary buffers. Plain programs come back unchanged.
    pub fn split_stages(&self) -> Result<KernelProgram, String> {
        let mut p = KernelProgram {
            name: self.name.clone(),
            buffers: self.buffers.clone(),
            kernels: Vec::with_capacity(self.kernels.len()),
            outputs: self.outputs.clone(),
        };
        for k in &self.kernels {
            let KernelBody::Loop(l) = &k.body else {
                p.kernels.push(k.clone());
                continue;
            };
            if l.is_plain() {
                p.kernels.push(k.clone());
                continue;
            }
            let out = *k
                .outputs
                .first()
                .ok_or_else(|| format!("{} writes no buffer", k.name))?;
            let scratch = p.add_stage_buffers(&k.name, l);
            let pieces = l.split_stages(out, &scratch).map_err(|e| format!("{}: {e}", k.name))?;
            let n = pieces.len();
            for (i, (kernel, written)) in pieces.into_iter().enumerate() {
                let name = if i + 1 == n {
                    format!("{}_epilogue", k.name)
                } else {
                    format!("{}_stage{i}", k.name)
                };
                p.kernels.push(Kernel {
                    name,
                    body: KernelBody::Loop(kernel),
                    outputs: vec![written],
                });
            }
        }
        Ok(p)
    }
}
