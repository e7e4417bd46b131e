//! Contraction kernels (any dtype but bool; floats accumulate with `fma.rn`, integers with
//! wrapping `mad.lo`) as tiled GEMMs: a 16×16 thread block computes a 16×16 output tile,
//! staging 16×16 tiles of both operands in shared memory per step of the K loop; the fused
//! epilogue runs on each thread's result before the store.
//!
//! - matmul `[.., M, K] × [.., K, N]`: rows are M, columns N, `blockIdx.z` the batch index
//!   (operand batch dims of size 1 broadcast).
//! - conv as an implicit GEMM per group (`blockIdx.z`): rows are the group's output channels,
//!   columns `batch × output positions`, K `channels per group × kernel positions`; the input
//!   tile is gathered on the fly (im2col without the buffer), zero outside the padding.

use super::emit::{self, BodyEnv, Class, Emitter, GenResult, LoadSrc, class_of, static_dims};
use super::loops::convert_to;
use super::{Entry, Launch, params_of};
use oar_ir::DType;
use oar_ir::kernel::{Buffer, BufferId, Contraction, ContractionKernel};
use oar_ir::ops::Conv;

/// Tile edge (threads per block edge, elements per shared tile edge).
pub const TILE: u32 = 16;

/// The GEMM a contraction is: `rows × cols` outputs over `k`, `batch` times.
struct Geometry {
    rows: u64,
    cols: u64,
    k: u64,
    batch: u64,
}

/// Generate a contraction kernel writing `out`.
pub fn contraction_kernel(name: &str, c: &ContractionKernel, out: BufferId, buffers: &[Buffer]) -> GenResult<Entry> {
    let acc_dt = c.acc_dtype;
    if acc_dt == DType::Bool {
        return Err(format!("contraction in {acc_dt}"));
    }
    if let Some(d) = c.lhs.round.or(c.rhs.round) {
        return Err(format!(
            "operands rounded to {d} as they are read (a cpu lowering's form)"
        ));
    }
    let out_dt = buffers[out.index()].ty.dtype;
    let shape = static_dims(&c.shape)?;
    let lshape = static_dims(&c.lhs.shape)?;
    let rshape = static_dims(&c.rhs.shape)?;
    let reads = [c.lhs.load.buffer, c.rhs.load.buffer]
        .into_iter()
        .chain(c.loads.iter().map(|l| l.buffer));
    let params = params_of(out, reads);
    let mut e = Emitter::default();
    let bases: Vec<String> = (0..params.len()).map(|i| e.param_ptr(name, i)).collect();
    let base_of = |b: BufferId| bases[params.iter().position(|&p| p == b).unwrap_or(0)].clone();
    let src = |l: &oar_ir::kernel::Load| LoadSrc::new(base_of(l.buffer), buffers[l.buffer.index()].ty.dtype, &l.map);
    let (lsrc, rsrc) = (src(&c.lhs.load)?, src(&c.rhs.load)?);
    let loads = c.loads.iter().map(src).collect::<GenResult<Vec<_>>>()?;
    let error_word = emit::may_fail(&c.epilogue);
    if error_word {
        e.err = Some(e.param_ptr(name, params.len()));
    }
    let cls = class_of(acc_dt);
    // f16 × f16 or bf16 × bf16 (accumulated in f32 registers): tensor cores.
    let half_in = |b: BufferId| buffers[b.index()].ty.dtype;
    let tensor = match (half_in(c.lhs.load.buffer), half_in(c.rhs.load.buffer)) {
        (DType::F16, DType::F16) => Some("f16"),
        (DType::BF16, DType::BF16) => Some("bf16"),
        _ => None,
    }
    .filter(|_| cls == Class::F32);
    // Shared-memory element type and the multiply-add (integers wrap, like the reference).
    let (fty, esize, madd) = match (tensor, cls) {
        (Some(_), _) => ("b16", 2, ""),
        (_, Class::F64) => ("f64", 8, "fma.rn.f64"),
        (_, Class::R64) => ("b64", 8, "mad.lo.s64"),
        (_, Class::R32) => ("b32", 4, "mad.lo.s32"),
        _ => ("f32", 4, "fma.rn.f32"),
    };
    let tile_bytes = TILE * TILE * esize;
    e.raw(format!("\t.shared .align 8 .b8 tile_a[{tile_bytes}];"));
    e.raw(format!("\t.shared .align 8 .b8 tile_b[{tile_bytes}];"));
    if tensor.is_some() {
        e.raw(format!("\t.shared .align 8 .b8 tile_c[{}];", TILE * TILE * 4));
    }
    let tx = e.special64("%tid.x");
    let ty = e.special64("%tid.y");
    let bx = e.special64("%ctaid.x");
    let by = e.special64("%ctaid.y");
    let bz = e.special64("%ctaid.z");
    let (row, col) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("mad.lo.u64 {row}, {by}, {TILE}, {ty}"));
    e.ins(format!("mad.lo.u64 {col}, {bx}, {TILE}, {tx}"));
    let (kind, launch) = geometry(c, &shape, &lshape, &rshape)?;
    let g = match &kind {
        Kind::MatMul(m) => &m.g,
        Kind::Conv(v) => &v.g,
    };
    let (rows, cols, kk) = (g.rows, g.cols, g.k);
    let acc = e.reg(cls);
    let zero = match cls {
        Class::F64 => "0d0000000000000000",
        Class::F32 => "0f00000000",
        _ => "0",
    };
    let mov = if tensor.is_some() { "f32" } else { fty };
    e.ins(format!("mov.{mov} {acc}, {zero}"));
    let (sa, sb) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("mov.u64 {sa}, tile_a"));
    e.ins(format!("mov.u64 {sb}, tile_b"));
    // This thread's slot in both tiles: A at [ty][tx] (row, k); B at [ty][tx] (k, column),
    // or for tensor cores at [tx][ty] (column-major: a column's consecutive k in one word).
    let (slot_a, slot_b, lin) = (e.reg(Class::R64), e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("mad.lo.u64 {lin}, {ty}, {TILE}, {tx}"));
    e.ins(format!("mad.lo.u64 {slot_a}, {lin}, {esize}, {sa}"));
    if tensor.is_some() {
        let t = e.reg(Class::R64);
        e.ins(format!("mad.lo.u64 {t}, {tx}, {TILE}, {ty}"));
        e.ins(format!("mad.lo.u64 {slot_b}, {t}, {esize}, {sb}"));
    } else {
        e.ins(format!("mad.lo.u64 {slot_b}, {lin}, {esize}, {sb}"));
    }
    let mma = tensor.map(|_| Mma::new(&mut e, &lin, &sa, &sb));
    // Row/column parts that do not change along K.
    let prep = match &kind {
        Kind::MatMul(m) => Prep::MatMul(matmul_prep(&mut e, m, &bz)),
        Kind::Conv(v) => Prep::Conv(Box::new(conv_prep(&mut e, v, &bz, &col))),
    };
    let kt = e.reg(Class::R64);
    e.ins(format!("mov.u64 {kt}, 0"));
    let (top, end) = (e.label("ktile"), e.label("ktile_end"));
    let kdone = e.reg(Class::Pred);
    e.put_label(&top);
    e.ins(format!("setp.ge.u64 {kdone}, {kt}, {kk}"));
    e.ins(format!("@{kdone} bra {end}"));
    // A tile: element (row, kt + tx); B tile: element (kt + ty, col).
    let (ka, kb) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("add.u64 {ka}, {kt}, {tx}"));
    e.ins(format!("add.u64 {kb}, {kt}, {ty}"));
    let va = match &prep {
        Prep::MatMul(p) => fetch_matmul(&mut e, &lsrc, p, true, &row, &ka, rows, kk, acc_dt)?,
        Prep::Conv(p) => fetch_conv_w(&mut e, &lsrc, &rsrc, p, &row, &ka, rows, kk, acc_dt)?,
    };
    store_tile(&mut e, tensor, fty, &slot_a, &va);
    let vb = match &prep {
        Prep::MatMul(p) => fetch_matmul(&mut e, &rsrc, p, false, &kb, &col, kk, cols, acc_dt)?,
        Prep::Conv(p) => fetch_conv_x(&mut e, &lsrc, p, &kb, kk, acc_dt)?,
    };
    store_tile(&mut e, tensor, fty, &slot_b, &vb);
    e.ins("bar.sync 0");
    if let (Some(ht), Some(mma)) = (tensor, &mma) {
        mma.step(&mut e, ht);
    } else {
        let (pa, pb) = (e.reg(Class::R64), e.reg(Class::R64));
        e.ins(format!("mad.lo.u64 {pa}, {ty}, {}, {sa}", TILE * esize));
        e.ins(format!("mad.lo.u64 {pb}, {tx}, {esize}, {sb}"));
        let (a, b) = (e.reg(cls), e.reg(cls));
        for i in 0..TILE {
            e.ins(format!("ld.shared.{fty} {a}, [{pa}+{}]", i * esize));
            e.ins(format!("ld.shared.{fty} {b}, [{pb}+{}]", i * TILE * esize));
            e.ins(format!("{madd} {acc}, {a}, {b}, {acc}"));
        }
    }
    e.ins("bar.sync 0");
    e.ins(format!("add.u64 {kt}, {kt}, {TILE}"));
    e.ins(format!("bra {top}"));
    e.put_label(&end);
    if let Some(mma) = &mma {
        // Warp 0's fragments to the shared C tile, then every thread takes its (ty, tx).
        mma.results(&mut e);
        e.ins("bar.sync 0");
        let pc = e.reg(Class::R64);
        e.ins(format!("mov.u64 {pc}, tile_c"));
        e.ins(format!("mad.lo.u64 {pc}, {lin}, 4, {pc}"));
        e.ins(format!("ld.shared.f32 {acc}, [{pc}]"));
    }
    // Epilogue at this thread's output point, if it has one.
    let skip = e.label("no_output");
    let (pr, pc) = (e.reg(Class::Pred), e.reg(Class::Pred));
    e.ins(format!("setp.ge.u64 {pr}, {row}, {rows}"));
    e.ins(format!("setp.ge.u64 {pc}, {col}, {cols}"));
    e.ins(format!("or.pred {pr}, {pr}, {pc}"));
    e.ins(format!("@{pr} bra {skip}"));
    e.normalize(acc_dt, &acc);
    let (loops, flat) = match &prep {
        Prep::MatMul(p) => {
            let mut l = p.out_batch.clone();
            l.push(row.clone());
            l.push(col.clone());
            let flat = e.reg(Class::R64);
            e.ins(format!("mad.lo.u64 {flat}, {bz}, {rows}, {row}"));
            e.ins(format!("mad.lo.u64 {flat}, {flat}, {cols}, {col}"));
            (l, flat)
        }
        Prep::Conv(p) => conv_out_point(&mut e, p, &row),
    };
    let env = BodyEnv {
        loads: &loads,
        loops: &loops,
        acc: Some((&acc, acc_dt)),
    };
    let v = emit::body(&mut e, &c.epilogue, &env)?;
    let v = convert_to(&mut e, c.epilogue.last().map_or(out_dt, |i| i.dtype), out_dt, &v)?;
    let base = base_of(out);
    let addr = e.reg(Class::R64);
    e.ins(format!("mad.lo.u64 {addr}, {flat}, {}, {base}", out_dt.size_bytes()));
    e.store_value(out_dt, &addr, &v, "global");
    e.put_label(&skip);
    Ok(Entry {
        name: name.to_string(),
        text: e.finish(name, params.len() + usize::from(error_word)),
        params,
        launch,
        error_word,
    })
}

/// Store a fetched operand value in its shared tile: as is, or for tensor cores its f16/bf16
/// bits (exact: the value is one of the half dtype).
fn store_tile(e: &mut Emitter, tensor: Option<&str>, fty: &str, slot: &str, v: &str) {
    match tensor {
        Some(ht) => {
            let h = e.reg(Class::B16);
            e.ins(format!("cvt.rn.{ht}.f32 {h}, {v}"));
            e.ins(format!("st.shared.b16 [{slot}], {h}"));
        }
        None => e.ins(format!("st.shared.{fty} [{slot}], {v}")),
    }
}

/// Warp 0's tensor-core state for one 16 × 16 output tile: two `mma.sync.m16n8k16.row.col`
/// per K step (columns 0–7 and 8–15), accumulating in f32 fragments. Fragment layouts (PTX ISA,
/// "Matrix fragments for mma.m16n8k16"): lane `l`, group `g = l / 4`, `t = l % 4`; A registers
/// hold (row g or g + 8, k 2t + {0,1} or 2t + 8 + {0,1}); B registers (k 2t + {0,1} or
/// 2t + 8 + {0,1}, column g); C (row g or g + 8, column 2t + {0,1}).
struct Mma {
    /// Whether this thread is in warp 0.
    warp0: String,
    /// This lane's first A word (row g, k 2t of the row-major A tile), first B word (column g,
    /// k 2t of the column-major B tile) — both at byte 32g + 4t — and first C element (g, 2t
    /// of the row-major f32 C tile, byte 64g + 8t).
    a: String,
    b: String,
    c: String,
    /// The two accumulators, four registers each.
    frags: Vec<String>,
}

impl Mma {
    /// The lane's addresses (made once, before the K loop) and zeroed accumulators.
    fn new(e: &mut Emitter, lin: &str, sa: &str, sb: &str) -> Mma {
        let warp0 = e.reg(Class::Pred);
        e.ins(format!("setp.lt.u64 {warp0}, {lin}, 32"));
        let (g, t, off) = (e.reg(Class::R64), e.reg(Class::R64), e.reg(Class::R64));
        e.ins(format!("shr.u64 {g}, {lin}, 2"));
        e.ins(format!("and.b64 {t}, {lin}, 3"));
        e.ins(format!("shl.b64 {g}, {g}, 5"));
        e.ins(format!("shl.b64 {t}, {t}, 2"));
        e.ins(format!("add.u64 {off}, {g}, {t}"));
        let (a, b, c) = (e.reg(Class::R64), e.reg(Class::R64), e.reg(Class::R64));
        e.ins(format!("add.u64 {a}, {sa}, {off}"));
        e.ins(format!("add.u64 {b}, {sb}, {off}"));
        e.ins(format!("mov.u64 {c}, tile_c"));
        e.ins(format!("mad.lo.u64 {c}, {off}, 2, {c}"));
        let frags = (0..8)
            .map(|_| {
                let f = e.reg(Class::F32);
                e.ins(format!("mov.f32 {f}, 0f00000000"));
                f
            })
            .collect();
        Mma { warp0, a, b, c, frags }
    }

    /// Warp 0 multiplies the shared half tiles (`ht`: f16 or bf16) into the accumulators.
    fn step(&self, e: &mut Emitter, ht: &str) {
        let skip = e.label("no_mma");
        e.ins(format!("@!{} bra {skip}", self.warp0));
        // A words at (g, 2t) + {(0,0), (8,0), (0,8), (8,8)}: bytes 2·(row·16 + k) apart.
        let a: Vec<String> = (0..4).map(|_| e.reg(Class::R32)).collect();
        for (i, off) in [0u32, 8 * 32, 16, 8 * 32 + 16].iter().enumerate() {
            e.ins(format!("ld.shared.b32 {}, [{}+{off}]", a[i], self.a));
        }
        // B words at column g (+ 8 for the second half), k 2t (+ 8).
        for half in 0..2u32 {
            let b: Vec<String> = (0..2).map(|_| e.reg(Class::R32)).collect();
            for (i, off) in [0u32, 16].iter().enumerate() {
                e.ins(format!("ld.shared.b32 {}, [{}+{}]", b[i], self.b, off + half * 8 * 32));
            }
            let d = &self.frags[4 * half as usize..4 * half as usize + 4];
            e.ins(format!(
                "mma.sync.aligned.m16n8k16.row.col.f32.{ht}.{ht}.f32 {{{}}}, {{{}}}, {{{}}}, {{{}}}",
                d.join(", "),
                a.join(", "),
                b.join(", "),
                d.join(", ")
            ));
        }
        e.put_label(&skip);
    }

    /// Warp 0 writes its accumulators to the shared f32 C tile (row-major 16 × 16).
    fn results(&self, e: &mut Emitter) {
        let skip = e.label("no_mma_out");
        e.ins(format!("@!{} bra {skip}", self.warp0));
        for half in 0..2u32 {
            // c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1), columns + 8·half.
            for (i, off) in [0u32, 4, 8 * 64, 8 * 64 + 4].iter().enumerate() {
                e.ins(format!(
                    "st.shared.f32 [{}+{}], {}",
                    self.c,
                    off + half * 32,
                    self.frags[4 * half as usize + i]
                ));
            }
        }
        e.put_label(&skip);
    }
}

/// The contraction's geometry and its grid: one 16×16 block per output tile, batches on z.
fn geometry(c: &ContractionKernel, shape: &[usize], lshape: &[usize], rshape: &[usize]) -> GenResult<(Kind, Launch)> {
    let kind = match &c.op {
        Contraction::MatMul => Kind::MatMul(matmul_geometry(shape, lshape, rshape)?),
        Contraction::Conv(Conv {
            stride,
            pad_before,
            dilation,
            groups,
            ..
        }) => Kind::Conv(conv_geometry(
            shape, lshape, rshape, stride, pad_before, dilation, *groups,
        )?),
    };
    let g = match &kind {
        Kind::MatMul(m) => &m.g,
        Kind::Conv(v) => &v.g,
    };
    if g.batch > 65535 {
        return Err(format!("{} batches (more than gridDim.z allows)", g.batch));
    }
    let launch = Launch {
        grid: (
            g.cols.div_ceil(u64::from(TILE)).max(1) as u32,
            g.rows.div_ceil(u64::from(TILE)).max(1) as u32,
            g.batch.max(1) as u32,
        ),
        block: (TILE, TILE, 1),
    };
    if launch.grid.0 as u64 != g.cols.div_ceil(u64::from(TILE)).max(1) || g.rows.div_ceil(u64::from(TILE)) > 65535 {
        return Err("output too large for one grid".into());
    }
    Ok((kind, launch))
}

enum Kind {
    MatMul(MatMulGeo),
    Conv(ConvGeo),
}

enum Prep {
    MatMul(MatMulPrep),
    Conv(Box<ConvPrep>),
}

struct MatMulGeo {
    g: Geometry,
    out_batch: Vec<usize>,
    lhs_batch: Vec<usize>,
    rhs_batch: Vec<usize>,
}

fn matmul_geometry(out: &[usize], l: &[usize], r: &[usize]) -> GenResult<MatMulGeo> {
    if out.len() < 2 || l.len() < 2 || r.len() < 2 {
        return Err("matmul of vectors".into());
    }
    let (m, kk, n) = (l[l.len() - 2], l[l.len() - 1], r[r.len() - 1]);
    if r[r.len() - 2] != kk || out[out.len() - 2] != m || out[out.len() - 1] != n {
        return Err(format!("matmul shapes {l:?} x {r:?} -> {out:?}"));
    }
    let out_batch = out[..out.len() - 2].to_vec();
    Ok(MatMulGeo {
        g: Geometry {
            rows: m as u64,
            cols: n as u64,
            k: kk as u64,
            batch: out_batch.iter().map(|&d| d as u64).product(),
        },
        lhs_batch: l[..l.len() - 2].to_vec(),
        rhs_batch: r[..r.len() - 2].to_vec(),
        out_batch,
    })
}

struct MatMulPrep {
    out_batch: Vec<String>,
    lhs_idx: Vec<String>,
    rhs_idx: Vec<String>,
}

/// Operand batch indices from the output batch index (numpy broadcast, right-aligned).
fn matmul_prep(e: &mut Emitter, m: &MatMulGeo, bz: &str) -> MatMulPrep {
    let out_batch = e.decompose(bz, &m.out_batch);
    let pick = |e: &mut Emitter, dims: &[usize]| -> Vec<String> {
        let skip = out_batch.len() - dims.len().min(out_batch.len());
        dims.iter()
            .enumerate()
            .map(|(i, &d)| {
                if d == 1 {
                    let z = e.reg(Class::R64);
                    e.ins(format!("mov.u64 {z}, 0"));
                    z
                } else {
                    out_batch[skip + i].clone()
                }
            })
            .collect()
    };
    let lhs_idx = pick(e, &m.lhs_batch);
    let rhs_idx = pick(e, &m.rhs_batch);
    MatMulPrep {
        out_batch,
        lhs_idx,
        rhs_idx,
    }
}

/// Operand element `(i, j)` (lhs: row, k; rhs: k, col), or zero out of bounds, in the
/// accumulator's dtype.
#[allow(clippy::too_many_arguments)]
fn fetch_matmul(
    e: &mut Emitter,
    src: &LoadSrc,
    p: &MatMulPrep,
    lhs: bool,
    i: &str,
    j: &str,
    ni: u64,
    nj: u64,
    acc_dt: DType,
) -> GenResult<String> {
    let mut idx = if lhs { p.lhs_idx.clone() } else { p.rhs_idx.clone() };
    idx.push(i.to_string());
    idx.push(j.to_string());
    let inb = e.reg(Class::Pred);
    e.ins(format!("setp.lt.u64 {inb}, {i}, {ni}"));
    e.ins(format!("setp.lt.and.u64 {inb}, {j}, {nj}, {inb}"));
    guarded_load(e, src, &idx, &inb, acc_dt)
}

/// `src` at operand index `idx` when `inb`, else zero, converted to `acc_dt`.
fn guarded_load(e: &mut Emitter, src: &LoadSrc, idx: &[String], inb: &str, acc_dt: DType) -> GenResult<String> {
    let v = e.constant(acc_dt, 0.0);
    let skip = e.label("oob");
    e.ins(format!("@!{inb} bra {skip}"));
    let a = e.address(src, idx)?;
    let x = e.load_value(src.dtype, &a, "global");
    let x = convert_to(e, src.dtype, acc_dt, &x)?;
    let mov = match class_of(acc_dt) {
        Class::F64 => "f64",
        Class::R64 => "b64",
        Class::R32 => "b32",
        _ => "f32",
    };
    e.ins(format!("mov.{mov} {v}, {x}"));
    e.put_label(&skip);
    Ok(v)
}

struct ConvGeo {
    g: Geometry,
    /// Output channels per group.
    og: u64,
    /// Input channels per group.
    cg: u64,
    in_spatial: Vec<usize>,
    kernel: Vec<usize>,
    out_spatial: Vec<usize>,
    stride: Vec<usize>,
    pad: Vec<usize>,
    dilation: Vec<usize>,
}

fn conv_geometry(
    out: &[usize],
    x: &[usize],
    w: &[usize],
    stride: &[usize],
    pad: &[usize],
    dilation: &[usize],
    groups: usize,
) -> GenResult<ConvGeo> {
    let sd = x.len().saturating_sub(2);
    if x.len() < 3 || w.len() != x.len() || out.len() != x.len() || groups == 0 {
        return Err(format!("conv shapes {x:?} * {w:?} -> {out:?}"));
    }
    if stride.len() != sd || pad.len() != sd || dilation.len() != sd {
        return Err("conv attributes do not match the spatial rank".into());
    }
    let (n, o) = (x[0], w[0]);
    let (og, cg) = (o / groups, x[1] / groups);
    if w[1] != cg || out[1] != o || out[0] != n {
        return Err(format!("conv shapes {x:?} * {w:?} -> {out:?} (groups {groups})"));
    }
    let kernel = w[2..].to_vec();
    let out_spatial = out[2..].to_vec();
    let ktot: usize = kernel.iter().product();
    let ptot: usize = out_spatial.iter().product();
    Ok(ConvGeo {
        g: Geometry {
            rows: og as u64,
            cols: (n * ptot) as u64,
            k: (cg * ktot) as u64,
            batch: groups as u64,
        },
        og: og as u64,
        cg: cg as u64,
        in_spatial: x[2..].to_vec(),
        kernel,
        out_spatial,
        stride: stride.to_vec(),
        pad: pad.to_vec(),
        dilation: dilation.to_vec(),
    })
}

struct ConvPrep {
    geo: ConvGeoRef,
    /// Batch index of this thread's column.
    n: String,
    /// Output position of this thread's column, per spatial axis.
    p: Vec<String>,
    /// The same, flattened.
    pflat: String,
    /// Whether the column is in range.
    col_ok: String,
    /// First input channel of the group.
    c0: String,
    /// First output channel of the group.
    o0: String,
}

/// The parts of the geometry the fetchers need after `conv_prep`.
struct ConvGeoRef {
    in_spatial: Vec<usize>,
    kernel: Vec<usize>,
    stride: Vec<usize>,
    pad: Vec<usize>,
    dilation: Vec<usize>,
    /// Output channels (all groups).
    o_total: u64,
    /// Output positions per image.
    ptot: u64,
}

fn conv_prep(e: &mut Emitter, v: &ConvGeo, bz: &str, col: &str) -> ConvPrep {
    let ptot: u64 = v.out_spatial.iter().map(|&d| d as u64).product();
    let col_ok = e.reg(Class::Pred);
    e.ins(format!("setp.lt.u64 {col_ok}, {col}, {}", v.g.cols));
    let (n, pflat) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("div.u64 {n}, {col}, {ptot}"));
    e.ins(format!("rem.u64 {pflat}, {col}, {ptot}"));
    let p = e.decompose(&pflat, &v.out_spatial);
    let (c0, o0) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("mul.lo.u64 {c0}, {bz}, {}", v.cg));
    e.ins(format!("mul.lo.u64 {o0}, {bz}, {}", v.og));
    ConvPrep {
        geo: ConvGeoRef {
            in_spatial: v.in_spatial.clone(),
            kernel: v.kernel.clone(),
            stride: v.stride.clone(),
            pad: v.pad.clone(),
            dilation: v.dilation.clone(),
            o_total: v.og * v.g.batch,
            ptot,
        },
        n,
        p,
        pflat,
        col_ok,
        c0,
        o0,
    }
}

/// `k` → (channel within the group, kernel position per axis).
fn split_k(e: &mut Emitter, g: &ConvGeoRef, k: &str) -> (String, Vec<String>) {
    let ktot: u64 = g.kernel.iter().map(|&d| d as u64).product();
    let (c, kf) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("div.u64 {c}, {k}, {ktot}"));
    e.ins(format!("rem.u64 {kf}, {k}, {ktot}"));
    let kpos = e.decompose(&kf, &g.kernel);
    (c, kpos)
}

/// Weight element `(group's output channel row, k)`: `w[o0 + row, c, kpos..]`.
#[allow(clippy::too_many_arguments)]
fn fetch_conv_w(
    e: &mut Emitter,
    _x: &LoadSrc,
    w: &LoadSrc,
    p: &ConvPrep,
    row: &str,
    k: &str,
    rows: u64,
    kk: u64,
    acc_dt: DType,
) -> GenResult<String> {
    let inb = e.reg(Class::Pred);
    e.ins(format!("setp.lt.u64 {inb}, {row}, {rows}"));
    e.ins(format!("setp.lt.and.u64 {inb}, {k}, {kk}, {inb}"));
    let (c, kpos) = split_k(e, &p.geo, k);
    let o = e.reg(Class::R64);
    e.ins(format!("add.u64 {o}, {}, {row}", p.o0));
    let mut idx = vec![o, c];
    idx.extend(kpos);
    guarded_load(e, w, &idx, &inb, acc_dt)
}

/// Input element `(k, this thread's column)`: `x[n, c0 + c, p·stride − pad + kpos·dilation]`,
/// zero in the padding.
fn fetch_conv_x(e: &mut Emitter, x: &LoadSrc, p: &ConvPrep, k: &str, kk: u64, acc_dt: DType) -> GenResult<String> {
    let g = &p.geo;
    let inb = e.reg(Class::Pred);
    e.ins(format!("setp.lt.u64 {inb}, {k}, {kk}"));
    e.ins(format!("and.pred {inb}, {inb}, {}", p.col_ok));
    let (c, kpos) = split_k(e, g, k);
    let ch = e.reg(Class::R64);
    e.ins(format!("add.u64 {ch}, {}, {c}", p.c0));
    let mut idx = vec![p.n.clone(), ch];
    for (d, kp) in kpos.iter().enumerate() {
        let s = e.reg(Class::R64);
        e.ins(format!("mul.lo.s64 {s}, {}, {}", p.p[d], g.stride[d]));
        e.ins(format!("mad.lo.s64 {s}, {kp}, {}, {s}", g.dilation[d]));
        e.ins(format!("sub.s64 {s}, {s}, {}", g.pad[d]));
        e.ins(format!("setp.ge.and.s64 {inb}, {s}, 0, {inb}"));
        e.ins(format!("setp.lt.and.s64 {inb}, {s}, {}, {inb}", g.in_spatial[d]));
        idx.push(s);
    }
    guarded_load(e, x, &idx, &inb, acc_dt)
}

/// Output loop indices `(n, o0 + row, p..)` and the flat output index `(n·O + o)·P + p`.
fn conv_out_point(e: &mut Emitter, p: &ConvPrep, row: &str) -> (Vec<String>, String) {
    let o = e.reg(Class::R64);
    e.ins(format!("add.u64 {o}, {}, {row}", p.o0));
    let mut loops = vec![p.n.clone(), o.clone()];
    loops.extend(p.p.iter().cloned());
    let flat = e.reg(Class::R64);
    e.ins(format!("mad.lo.u64 {flat}, {}, {}, {o}", p.n, p.geo.o_total));
    e.ins(format!("mad.lo.u64 {flat}, {flat}, {}, {}", p.geo.ptot, p.pflat));
    (loops, flat)
}
