//! The opaque ops that are plain functions of the output index — iota, constant pad, concat,
//! gather, random (the reference's counter-based SplitMix64 stream), and argmax/argmin (each
//! thread scans its row sequentially) — as generated kernels (one thread per output element,
//! grid-stride, like elementwise loops). Every other opaque op runs on the host.

use super::emit::{self, Class, Emitter, GenResult, LoadSrc, static_dims};
use super::loops::{ELEMENTWISE_BLOCK, MAX_GRID};
use super::{Entry, Launch, params_of};
use oar_ir::DType;
use oar_ir::kernel::{Buffer, BufferId, IndexMap, Inst, OpaqueKernel, ScalarOp};
use oar_ir::ops::{ArgReduce, Concat, Gather, Iota, Pad, Random};
use oar_ir::ops::{ArgReduceOp, BinaryOp, Op, RandomDist, UnaryOp};

/// Generate `k` writing `out`, if its op is one of those above.
pub fn opaque_kernel(name: &str, k: &OpaqueKernel, out: BufferId, buffers: &[Buffer]) -> GenResult<Entry> {
    if !matches!(
        k.op,
        Op::Iota(_) | Op::Pad(_) | Op::Concat(_) | Op::ArgReduce(_) | Op::Gather(_) | Op::Random(_)
    ) {
        return Err(format!("opaque op `{}` (runs on the host)", k.op.name()));
    }
    let shape = static_dims(buffers[out.index()].ty.shape.dims())?;
    let out_dt = buffers[out.index()].ty.dtype;
    let total: u64 = shape.iter().map(|&d| d as u64).product();
    let params = params_of(out, k.inputs.iter().copied());
    let mut e = Emitter::default();
    let bases: Vec<String> = (0..params.len()).map(|i| e.param_ptr(name, i)).collect();
    let base_of = |b: BufferId| bases[params.iter().position(|&p| p == b).unwrap_or(0)].clone();
    let error_word = matches!(k.op, Op::Gather(_));
    let err = error_word.then(|| e.param_ptr(name, params.len()));
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
    let idx = e.decompose(&n, &shape);
    let v = match &k.op {
        Op::Iota(Iota { axis, .. }) => {
            let i = idx.get(*axis).ok_or("iota axis out of range")?;
            emit::cast(&mut e, DType::I64, out_dt, i)?
        }
        Op::Pad(Pad { before, value, .. }) => {
            let &[x] = k.inputs.as_slice() else {
                return Err("pad takes one operand".into());
            };
            let xs = static_dims(buffers[x.index()].ty.shape.dims())?;
            if before.len() != xs.len() || xs.len() != shape.len() {
                return Err("pad rank mismatch".into());
            }
            let v = e.constant(out_dt, value.0);
            let inb = e.reg(Class::Pred);
            e.ins(format!("setp.eq.u64 {inb}, {n}, {n}"));
            let mut src_idx = Vec::new();
            for (d, o) in idx.iter().enumerate() {
                let s = e.reg(Class::R64);
                e.ins(format!("sub.s64 {s}, {o}, {}", before[d]));
                e.ins(format!("setp.ge.and.s64 {inb}, {s}, 0, {inb}"));
                e.ins(format!("setp.lt.and.s64 {inb}, {s}, {}, {inb}", xs[d]));
                src_idx.push(s);
            }
            let src = LoadSrc::new(
                base_of(x),
                out_dt,
                &IndexMap::identity(buffers[x.index()].ty.shape.dims()),
            )?;
            guarded_copy(&mut e, &src, &src_idx, &inb, out_dt, &v)?;
            v
        }
        Op::Concat(Concat { axis }) => {
            let v = e.constant(out_dt, 0.0);
            let mut off = 0usize;
            for &x in &k.inputs {
                let xs = static_dims(buffers[x.index()].ty.shape.dims())?;
                let nx = *xs.get(*axis).ok_or("concat axis out of range")?;
                let o = &idx[*axis];
                let inb = e.reg(Class::Pred);
                e.ins(format!("setp.ge.u64 {inb}, {o}, {off}"));
                e.ins(format!("setp.lt.and.u64 {inb}, {o}, {}, {inb}", off + nx));
                let s = e.reg(Class::R64);
                e.ins(format!("sub.u64 {s}, {o}, {off}"));
                let mut src_idx = idx.clone();
                src_idx[*axis] = s;
                let src = LoadSrc::new(
                    base_of(x),
                    out_dt,
                    &IndexMap::identity(buffers[x.index()].ty.shape.dims()),
                )?;
                guarded_copy(&mut e, &src, &src_idx, &inb, out_dt, &v)?;
                off += nx;
            }
            v
        }
        Op::ArgReduce(ArgReduce { op, axis, keepdim }) => {
            let &[x] = k.inputs.as_slice() else {
                return Err("argmax/argmin take one operand".into());
            };
            let x_dt = buffers[x.index()].ty.dtype;
            let xs = static_dims(buffers[x.index()].ty.shape.dims())?;
            arg_reduce(
                &mut e,
                &base_of(x),
                x_dt,
                &xs,
                &idx,
                *axis,
                *keepdim,
                *op == ArgReduceOp::ArgMax,
            )?
        }
        Op::Gather(Gather { axis }) => {
            let &[data, indices] = k.inputs.as_slice() else {
                return Err("gather takes two operands".into());
            };
            let err = err.as_deref().ok_or("gather without an error word")?;
            gather(
                &mut e,
                buffers,
                (&base_of(data), data),
                (&base_of(indices), indices),
                &idx,
                *axis,
                err,
            )?
        }
        Op::Random(Random { dist, seed, .. }) => {
            if !out_dt.is_float() {
                return Err(format!("random of {out_dt}"));
            }
            let v = random(&mut e, dist, *seed, &n)?;
            emit::cast(&mut e, DType::F64, out_dt, &v)?
        }
        _ => unreachable!("checked above"),
    };
    let a = e.reg(Class::R64);
    e.ins(format!(
        "mad.lo.u64 {a}, {n}, {}, {}",
        out_dt.size_bytes(),
        base_of(out)
    ));
    e.store_value(out_dt, &a, &v, "global");
    e.ins(format!("add.u64 {n}, {n}, {stride}"));
    e.ins(format!("bra {top}"));
    e.put_label(&end);
    let blocks = total.div_ceil(u64::from(ELEMENTWISE_BLOCK)).clamp(1, MAX_GRID) as u32;
    Ok(Entry {
        name: name.to_string(),
        text: e.finish(name, params.len() + usize::from(error_word)),
        params,
        launch: Launch {
            grid: (blocks, 1, 1),
            block: (ELEMENTWISE_BLOCK, 1, 1),
        },
        error_word,
    })
}

/// `v = src[idx]` when `inb`.
fn guarded_copy(e: &mut Emitter, src: &LoadSrc, idx: &[String], inb: &str, dt: DType, v: &str) -> GenResult<()> {
    let skip = e.label("skip");
    e.ins(format!("@!{inb} bra {skip}"));
    let a = e.address(src, idx)?;
    let x = e.load_value(dt, &a, "global");
    let ty = match emit::class_of(dt) {
        Class::F32 => "f32",
        Class::F64 => "f64",
        Class::R64 => "b64",
        _ => "b32",
    };
    e.ins(format!("mov.{ty} {v}, {x}"));
    e.put_label(&skip);
    Ok(())
}

/// The first index along `axis` of the largest (`max`) or smallest element of the row at
/// output index `out_idx`, as i64. Floats: NaN beats everything except an earlier NaN; bool:
/// true beats false (as the reference).
#[allow(clippy::too_many_arguments)]
fn arg_reduce(
    e: &mut Emitter,
    base: &str,
    dt: DType,
    xs: &[usize],
    out_idx: &[String],
    axis: usize,
    keepdim: bool,
    max: bool,
) -> GenResult<String> {
    let n = *xs.get(axis).ok_or("axis out of range")?;
    if n == 0 {
        return Err("argmax/argmin over an empty axis (an error, reported by the host)".into());
    }
    let mut strides = vec![1u64; xs.len()];
    for d in (0..xs.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * xs[d + 1] as u64;
    }
    // Flat index of the row's first element.
    let row = e.reg(Class::R64);
    e.ins(format!("mov.u64 {row}, 0"));
    for (d, stride) in strides.iter().enumerate() {
        if d == axis {
            continue;
        }
        let o = if keepdim || d < axis { d } else { d - 1 };
        let i = out_idx.get(o).ok_or("argmax output rank mismatch")?;
        e.ins(format!("mad.lo.u64 {row}, {i}, {stride}, {row}"));
    }
    let size = dt.size_bytes();
    let a = e.reg(Class::R64);
    e.ins(format!("mad.lo.u64 {a}, {row}, {size}, {base}"));
    let best = e.load_value(dt, &a, "global");
    let (bi, j) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("mov.u64 {bi}, 0"));
    e.ins(format!("mov.u64 {j}, 1"));
    let (top, end) = (e.label("arg"), e.label("arg_end"));
    let done = e.reg(Class::Pred);
    e.put_label(&top);
    e.ins(format!("setp.ge.u64 {done}, {j}, {n}"));
    e.ins(format!("@{done} bra {end}"));
    e.ins(format!("add.u64 {a}, {a}, {}", strides[axis] * size as u64));
    let v = e.load_value(dt, &a, "global");
    let cmp = if max { "gt" } else { "lt" };
    let better = e.reg(Class::Pred);
    let cls = emit::class_of(dt);
    let mov = match cls {
        Class::F32 => "f32",
        Class::F64 => "f64",
        Class::R64 => "b64",
        _ => "b32",
    };
    if dt.is_float() {
        let t = if cls == Class::F64 { "f64" } else { "f32" };
        let (vn, bn) = (e.reg(Class::Pred), e.reg(Class::Pred));
        e.ins(format!("setp.{cmp}.{t} {better}, {v}, {best}"));
        e.ins(format!("setp.nan.{t} {vn}, {v}, {v}"));
        e.ins(format!("or.pred {better}, {better}, {vn}"));
        e.ins(format!("setp.nan.{t} {bn}, {best}, {best}"));
        e.ins(format!("not.pred {bn}, {bn}"));
        e.ins(format!("and.pred {better}, {better}, {bn}"));
    } else {
        let t = match dt {
            DType::Bool => "u32",
            DType::I64 => "s64",
            _ => "s32",
        };
        e.ins(format!("setp.{cmp}.{t} {better}, {v}, {best}"));
    }
    e.ins(format!("@{better} mov.{mov} {best}, {v}"));
    e.ins(format!("@{better} mov.u64 {bi}, {j}"));
    e.ins(format!("add.u64 {j}, {j}, 1"));
    e.ins(format!("bra {top}"));
    e.put_label(&end);
    emit::cast(e, DType::I64, DType::I64, &bi)
}

/// `data[o[..axis], indices[o[axis..axis+r]], o[axis+r..]]`; a negative index counts from the
/// end; an index out of range sets the error word (and reads element 0 of the row instead).
fn gather(
    e: &mut Emitter,
    buffers: &[Buffer],
    (dbase, data): (&str, BufferId),
    (ibase, indices): (&str, BufferId),
    o: &[String],
    axis: usize,
    err: &str,
) -> GenResult<String> {
    let ds = static_dims(buffers[data.index()].ty.shape.dims())?;
    let is = static_dims(buffers[indices.index()].ty.shape.dims())?;
    let (ddt, idt) = (buffers[data.index()].ty.dtype, buffers[indices.index()].ty.dtype);
    if !idt.is_int() || axis >= ds.len() || o.len() != ds.len() - 1 + is.len() {
        return Err("gather shapes or index dtype".into());
    }
    let isrc = LoadSrc::new(
        ibase.to_string(),
        idt,
        &IndexMap::identity(buffers[indices.index()].ty.shape.dims()),
    )?;
    let ia = e.address(&isrc, &o[axis..axis + is.len()])?;
    let kv = e.load_value(idt, &ia, "global");
    let k = emit::cast(e, idt, DType::I64, &kv)?;
    let n = ds[axis];
    let (neg, bad) = (e.reg(Class::Pred), e.reg(Class::Pred));
    let kn = e.reg(Class::R64);
    e.ins(format!("setp.lt.s64 {neg}, {k}, 0"));
    e.ins(format!("add.s64 {kn}, {k}, {n}"));
    e.ins(format!("selp.b64 {k}, {kn}, {k}, {neg}"));
    e.ins(format!("setp.lt.s64 {bad}, {k}, 0"));
    e.ins(format!("setp.ge.or.s64 {bad}, {k}, {n}, {bad}"));
    let one = e.reg(Class::R32);
    e.ins(format!("mov.b32 {one}, 1"));
    e.ins(format!("@{bad} st.global.b32 [{err}], {one}"));
    e.ins(format!("@{bad} mov.b64 {k}, 0"));
    let mut di: Vec<String> = o[..axis].to_vec();
    di.push(k);
    di.extend(o[axis + is.len()..].iter().cloned());
    let dsrc = LoadSrc::new(
        dbase.to_string(),
        ddt,
        &IndexMap::identity(buffers[data.index()].ty.shape.dims()),
    )?;
    let a = e.address(&dsrc, &di)?;
    Ok(e.load_value(ddt, &a, "global"))
}

/// f64 immediate.
fn f64_imm(v: f64) -> String {
    format!("0d{:016X}", v.to_bits())
}

/// The `i`-th uniform f64 in [0, 1) of stream `seed`, exactly as the reference computes it
/// (`oar_backend_reference` `random.rs`: SplitMix64 bits, top 53 bits scaled by 2^-53).
fn uniform(e: &mut Emitter, seed: u64, i: &str) -> String {
    let (z, t) = (e.reg(Class::R64), e.reg(Class::R64));
    e.ins(format!("add.u64 {z}, {i}, 1"));
    e.ins(format!("mul.lo.u64 {z}, {z}, 0x{:016X}", 0x9E37_79B9_7F4A_7C15u64));
    e.ins(format!("add.u64 {z}, {z}, 0x{seed:016X}"));
    for (shift, mul) in [
        (30, Some(0xBF58_476D_1CE4_E5B9u64)),
        (27, Some(0x94D0_49BB_1331_11EB)),
        (31, None),
    ] {
        e.ins(format!("shr.u64 {t}, {z}, {shift}"));
        e.ins(format!("xor.b64 {z}, {z}, {t}"));
        if let Some(m) = mul {
            e.ins(format!("mul.lo.u64 {z}, {z}, 0x{m:016X}"));
        }
    }
    e.ins(format!("shr.u64 {z}, {z}, 11"));
    let f = e.reg(Class::F64);
    e.ins(format!("cvt.rn.f64.u64 {f}, {z}"));
    e.ins(format!("mul.rn.f64 {f}, {f}, {}", f64_imm(1.0 / (1u64 << 53) as f64)));
    f
}

/// Element `n` of `dist` with `seed`, in f64 (uniform: bit-exact with the reference; normal:
/// Box–Muller with the legalized f64 `log`/`cos`, within a few ulp).
fn random(e: &mut Emitter, dist: &RandomDist, seed: u64, n: &str) -> GenResult<String> {
    let v = e.reg(Class::F64);
    match *dist {
        RandomDist::Uniform { low, high } => {
            let u = uniform(e, seed, n);
            e.ins(format!("mul.rn.f64 {v}, {u}, {}", f64_imm(high.0 - low.0)));
            e.ins(format!("add.rn.f64 {v}, {v}, {}", f64_imm(low.0)));
        }
        RandomDist::Normal { mean, std } => {
            let (i1, i2) = (e.reg(Class::R64), e.reg(Class::R64));
            e.ins(format!("shl.b64 {i1}, {n}, 1"));
            e.ins(format!("add.u64 {i2}, {i1}, 1"));
            let (u1, u2) = (uniform(e, seed, &i1), uniform(e, seed, &i2));
            e.ins(format!("sub.rn.f64 {u1}, 0d3FF0000000000000, {u1}"));
            e.ins(format!(
                "mul.rn.f64 {u2}, {u2}, {}",
                f64_imm(2.0 * std::f64::consts::PI)
            ));
            let body = oar_passes::legalize::legalize_body(&box_muller(), &crate::natives()).unwrap_or_else(box_muller);
            let l = emit::body_of_registers(e, &body, &[u1, u2])?;
            e.ins(format!("mul.rn.f64 {v}, {l}, {}", f64_imm(std.0)));
            e.ins(format!("add.rn.f64 {v}, {v}, {}", f64_imm(mean.0)));
        }
    }
    Ok(v)
}

/// `sqrt(-2·ln(a))·cos(b)` of two f64 loads, as the reference computes the standard normal
/// (legalized with the kernels' math).
fn box_muller() -> Vec<Inst> {
    let f = DType::F64;
    let i = |op, dtype| Inst { op, dtype };
    vec![
        i(ScalarOp::Load(0), f),
        i(ScalarOp::Load(1), f),
        i(ScalarOp::Unary(UnaryOp::Log, 0), f),
        i(ScalarOp::Const(oar_ir::Float(-2.0)), f),
        i(ScalarOp::Binary(BinaryOp::Mul, 3, 2), f),
        i(ScalarOp::Unary(UnaryOp::Sqrt, 4), f),
        i(ScalarOp::Unary(UnaryOp::Cos, 1), f),
        i(ScalarOp::Binary(BinaryOp::Mul, 5, 6), f),
    ]
}
