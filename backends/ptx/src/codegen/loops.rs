//! Loop kernels: elementwise (one thread per output element, grid-stride) and reductions
//! (one block per output element, grid-stride over rows; threads stride the reduction, then a
//! warp `shfl.sync.bfly` tree and a second tree over the per-warp results in shared memory).

use super::emit::{self, BodyEnv, Class, Emitter, GenResult, LoadSrc, class_of, static_dims};
use super::{Entry, Launch, params_of};
use oar_ir::DType;
use oar_ir::kernel::{Buffer, BufferId, LoopKernel};
use oar_ir::ops::ReduceOp;

/// Threads per block for elementwise kernels.
pub const ELEMENTWISE_BLOCK: u32 = 256;
/// Most threads per block for reductions (8 warps); short rows get fewer (down to one warp).
pub const REDUCE_BLOCK: u32 = 256;

/// Threads per block for a reduction of `n` elements per row: a power of two in 32..=256.
pub fn reduce_block(n: u64) -> u32 {
    n.next_power_of_two().clamp(32, u64::from(REDUCE_BLOCK)) as u32
}
/// Most blocks launched (grid-stride loops cover the rest).
pub const MAX_GRID: u64 = 65535;

/// Generate a loop kernel writing `out`.
pub fn loop_kernel(name: &str, k: &LoopKernel, out: BufferId, buffers: &[Buffer]) -> GenResult<Entry> {
    let shape = static_dims(&k.shape)?;
    let total: u64 = shape.iter().map(|&d| d as u64).product();
    let out_dt = buffers[out.index()].ty.dtype;
    let params = params_of(out, k.loads.iter().map(|l| l.buffer));
    let mut e = Emitter::default();
    let bases: Vec<String> = (0..params.len()).map(|i| e.param_ptr(name, i)).collect();
    let base_of = |b: BufferId| bases[params.iter().position(|&p| p == b).unwrap_or(0)].clone();
    let loads = k
        .loads
        .iter()
        .map(|l| LoadSrc::new(base_of(l.buffer), buffers[l.buffer.index()].ty.dtype, &l.map))
        .collect::<GenResult<Vec<_>>>()?;
    let out_base = base_of(out);
    let error_word = emit::may_fail(&k.body) || k.reduce.iter().any(|r| emit::may_fail(&r.body));
    if error_word {
        e.err = Some(e.param_ptr(name, params.len()));
    }
    let n_params = params.len() + usize::from(error_word);
    if !k.is_plain() {
        return Err(format!(
            "{} reduction stages per {} outer loops: split them first (KernelProgram::split_stages)",
            k.reduce.len(),
            k.outer
        ));
    }
    let (text, launch) = match k.reduce.first() {
        None => {
            elementwise(&mut e, k, &shape, total, &loads, &out_base, out_dt)?;
            let blocks = total.div_ceil(u64::from(ELEMENTWISE_BLOCK)).clamp(1, MAX_GRID) as u32;
            (
                e.finish(name, n_params),
                Launch {
                    grid: (blocks, 1, 1),
                    block: (ELEMENTWISE_BLOCK, 1, 1),
                },
            )
        }
        Some(_) => {
            reduction(&mut e, k, &shape, total, &loads, &out_base, out_dt)?;
            (
                e.finish(name, n_params),
                Launch {
                    grid: (total.clamp(1, MAX_GRID) as u32, 1, 1),
                    block: (reduce_block(reduce_len(k)?), 1, 1),
                },
            )
        }
    };
    Ok(Entry {
        name: name.to_string(),
        text,
        params,
        launch,
        error_word,
    })
}

fn elementwise(
    e: &mut Emitter,
    k: &LoopKernel,
    shape: &[usize],
    total: u64,
    loads: &[LoadSrc],
    out_base: &str,
    out_dt: DType,
) -> GenResult<()> {
    let (ctaid, ntid, tid, nctaid) = (
        e.special64("%ctaid.x"),
        e.special64("%ntid.x"),
        e.special64("%tid.x"),
        e.special64("%nctaid.x"),
    );
    let (n, stride) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("mad.lo.u64 {n}, {ctaid}, {ntid}, {tid}"));
    e.ins(format!("mul.lo.u64 {stride}, {ntid}, {nctaid}"));
    let (top, end) = (e.label("elem"), e.label("elem_end"));
    let done = e.reg(Class::Pred);
    e.put_label(&top);
    e.ins(format!("setp.ge.u64 {done}, {n}, {total}"));
    e.ins(format!("@{done} bra {end}"));
    let loops = e.decompose(&n, shape);
    let env = BodyEnv {
        loads,
        loops: &loops,
        acc: None,
    };
    let v = emit::body(e, &k.body, &env)?;
    let v = convert_to(e, k.body.last().map_or(out_dt, |i| i.dtype), out_dt, &v)?;
    let a = e.reg(Class::R64);
    e.ins(format!("mad.lo.u64 {a}, {n}, {}, {out_base}", out_dt.size_bytes()));
    e.store_value(out_dt, &a, &v, "global");
    e.ins(format!("add.u64 {n}, {n}, {stride}"));
    e.ins(format!("bra {top}"));
    e.put_label(&end);
    Ok(())
}

/// Elements reduced per output element.
fn reduce_len(k: &LoopKernel) -> GenResult<u64> {
    let r = k.reduce.first().ok_or("reduction kernel without a reduction")?;
    Ok(static_dims(&r.dims)?.iter().map(|&d| d as u64).product())
}

/// The body's value, converted when the buffer's dtype differs (fusion keeps them equal).
pub fn convert_to(e: &mut Emitter, from: DType, to: DType, v: &str) -> GenResult<String> {
    if from == to {
        Ok(v.to_string())
    } else {
        emit::cast(e, from, to, v)
    }
}

/// The identity of `op` as an immediate for the accumulator dtype.
fn identity(op: ReduceOp, dt: DType) -> String {
    let v = op.identity(dt);
    match dt {
        // Accumulated in f32 (rounded to the dtype at the end).
        DType::F16 | DType::BF16 => emit::f32_imm(v as f32),
        // ±2^63 as f64 saturate to the i64 bounds.
        DType::I64 => (v as i64).to_string(),
        _ => emit::const_imm(dt, v),
    }
}

/// `acc = acc op v` in the accumulator's register class (unwrapped for i8/u8: the final
/// wrap gives the same result modulo 2^8).
fn combine(e: &mut Emitter, op: ReduceOp, dt: DType, acc: &str, v: &str) -> GenResult<()> {
    let cls = class_of(dt);
    let t = emit::arith(dt);
    match (op, cls) {
        (ReduceOp::Sum | ReduceOp::Mean, Class::F32 | Class::F64) => e.ins(format!("add.rn.{t} {acc}, {acc}, {v}")),
        (ReduceOp::Sum | ReduceOp::Mean, _) => e.ins(format!("add.{t} {acc}, {acc}, {v}")),
        (ReduceOp::Prod, Class::F32 | Class::F64) => e.ins(format!("mul.rn.{t} {acc}, {acc}, {v}")),
        (ReduceOp::Prod, _) => e.ins(format!("mul.lo.{t} {acc}, {acc}, {v}")),
        (ReduceOp::Max | ReduceOp::Min, Class::F32) => {
            let m = if op == ReduceOp::Max { "max" } else { "min" };
            e.ins(format!("{m}.NaN.f32 {acc}, {acc}, {v}"));
        }
        (ReduceOp::Max | ReduceOp::Min, Class::F64) => {
            let m = if op == ReduceOp::Max { "max" } else { "min" };
            let (p, s) = (e.reg(Class::Pred), e.reg(Class::F64));
            e.ins(format!("setp.nan.f64 {p}, {acc}, {v}"));
            e.ins(format!("add.rn.f64 {s}, {acc}, {v}"));
            e.ins(format!("{m}.f64 {acc}, {acc}, {v}"));
            e.ins(format!("selp.f64 {acc}, {s}, {acc}, {p}"));
        }
        (ReduceOp::Max, _) => e.ins(format!("max.{t} {acc}, {acc}, {v}")),
        (ReduceOp::Min, _) => e.ins(format!("min.{t} {acc}, {acc}, {v}")),
    }
    Ok(())
}

/// Exchange `v` with the lane `off` away (butterfly), into a new register of `cls`.
fn shuffle(e: &mut Emitter, cls: Class, v: &str, off: u32) -> String {
    let o = e.reg(cls);
    match cls {
        Class::R64 | Class::F64 => {
            let (lo, hi, b) = (e.reg(Class::R32), e.reg(Class::R32), e.reg(Class::R64));
            e.ins(format!("mov.b64 {b}, {v}"));
            e.ins(format!("mov.b64 {{{lo}, {hi}}}, {b}"));
            e.ins(format!("shfl.sync.bfly.b32 {lo}, {lo}, {off}, 31, -1"));
            e.ins(format!("shfl.sync.bfly.b32 {hi}, {hi}, {off}, 31, -1"));
            e.ins(format!("mov.b64 {b}, {{{lo}, {hi}}}"));
            e.ins(format!("mov.b64 {o}, {b}"));
        }
        _ => e.ins(format!("shfl.sync.bfly.b32 {o}, {v}, {off}, 31, -1")),
    }
    o
}

fn warp_reduce(e: &mut Emitter, op: ReduceOp, dt: DType, acc: &str) -> GenResult<()> {
    for off in [16, 8, 4, 2, 1] {
        let o = shuffle(e, class_of(dt), acc, off);
        combine(e, op, dt, acc, &o)?;
    }
    Ok(())
}

fn reduction(
    e: &mut Emitter,
    k: &LoopKernel,
    shape: &[usize],
    total: u64,
    loads: &[LoadSrc],
    out_base: &str,
    out_dt: DType,
) -> GenResult<()> {
    let red = k.reduce.first().ok_or("reduction kernel without a reduction")?;
    let rdims = static_dims(&red.dims)?;
    let rtotal: u64 = rdims.iter().map(|&d| d as u64).product();
    let acc_dt = red.body.last().ok_or("empty reduction body")?.dtype;
    if acc_dt == DType::Bool {
        return Err("reduction over bool".into());
    }
    let cls = class_of(acc_dt);
    let warps = reduce_block(rtotal) / 32;
    e.raw(format!("\t.shared .align 8 .b8 red_smem[{}];", warps * 8));
    let (row, rstride) = (e.special64("%ctaid.x"), e.special64("%nctaid.x"));
    let (tid, ntid) = (e.special64("%tid.x"), e.special64("%ntid.x"));
    let (lane, warp) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("and.b64 {lane}, {tid}, 31"));
    e.ins(format!("shr.u64 {warp}, {tid}, 5"));
    let smem = e.reg(Class::R64);
    e.ins(format!("mov.u64 {smem}, red_smem"));
    let (slot, lslot) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("mad.lo.u64 {slot}, {warp}, 8, {smem}"));
    e.ins(format!("mad.lo.u64 {lslot}, {lane}, 8, {smem}"));
    let (p_lane0, p_warp0, p_have) = (e.reg(Class::Pred), e.reg(Class::Pred), e.reg(Class::Pred));
    e.ins(format!("setp.eq.u64 {p_lane0}, {lane}, 0"));
    e.ins(format!("setp.eq.u64 {p_warp0}, {warp}, 0"));
    e.ins(format!("setp.lt.u64 {p_have}, {lane}, {warps}"));
    let (rows_top, rows_end) = (e.label("rows"), e.label("rows_end"));
    let done = e.reg(Class::Pred);
    e.put_label(&rows_top);
    e.ins(format!("setp.ge.u64 {done}, {row}, {total}"));
    e.ins(format!("@{done} bra {rows_end}"));
    let out_loops = e.decompose(&row, shape);
    let acc = e.reg(cls);
    let id = identity(red.op, acc_dt);
    let mov = match cls {
        Class::F32 => "f32",
        Class::F64 => "f64",
        Class::R64 => "b64",
        _ => "b32",
    };
    e.ins(format!("mov.{mov} {acc}, {id}"));
    let j = e.reg(Class::R64);
    e.ins(format!("mov.u64 {j}, {tid}"));
    let (red_top, red_end) = (e.label("red"), e.label("red_end"));
    let rdone = e.reg(Class::Pred);
    e.put_label(&red_top);
    e.ins(format!("setp.ge.u64 {rdone}, {j}, {rtotal}"));
    e.ins(format!("@{rdone} bra {red_end}"));
    let mut loops = out_loops.clone();
    loops.extend(e.decompose(&j, &rdims));
    let env = BodyEnv {
        loads,
        loops: &loops,
        acc: None,
    };
    let v = emit::body(e, &red.body, &env)?;
    combine(e, red.op, acc_dt, &acc, &v)?;
    e.ins(format!("add.u64 {j}, {j}, {ntid}"));
    e.ins(format!("bra {red_top}"));
    e.put_label(&red_end);
    warp_reduce(e, red.op, acc_dt, &acc)?;
    let st = match cls {
        Class::F32 => "f32",
        Class::F64 => "f64",
        Class::R64 => "b64",
        _ => "b32",
    };
    e.ins(format!("@{p_lane0} st.shared.{st} [{slot}], {acc}"));
    e.ins("bar.sync 0");
    let skip = e.label("not_warp0");
    e.ins(format!("@!{p_warp0} bra {skip}"));
    let part = e.reg(cls);
    e.ins(format!("mov.{mov} {part}, {id}"));
    e.ins(format!("@{p_have} ld.shared.{st} {part}, [{lslot}]"));
    warp_reduce(e, red.op, acc_dt, &part)?;
    e.ins(format!("@!{p_lane0} bra {skip}"));
    if red.op == ReduceOp::Mean {
        match cls {
            Class::F32 => e.ins(format!("div.rn.f32 {part}, {part}, {}", emit::f32_imm(rtotal as f32))),
            Class::F64 => e.ins(format!(
                "div.rn.f64 {part}, {part}, 0d{:016X}",
                (rtotal as f64).to_bits()
            )),
            _ => return Err(format!("mean over {acc_dt}")),
        }
    }
    e.normalize(acc_dt, &part);
    let env = BodyEnv {
        loads,
        loops: &out_loops,
        acc: Some((&part, acc_dt)),
    };
    let v = emit::body(e, &k.body, &env)?;
    let v = convert_to(e, k.body.last().map_or(out_dt, |i| i.dtype), out_dt, &v)?;
    let a = e.reg(Class::R64);
    e.ins(format!("mad.lo.u64 {a}, {row}, {}, {out_base}", out_dt.size_bytes()));
    e.store_value(out_dt, &a, &v, "global");
    e.put_label(&skip);
    // The shared slots are reused by the next row.
    e.ins("bar.sync 0");
    e.ins(format!("add.u64 {row}, {row}, {rstride}"));
    e.ins(format!("bra {rows_top}"));
    e.put_label(&rows_end);
    Ok(())
}
