//! The opaque ops that are plain functions of the output index — iota, constant pad, concat,
//! gather and argmax/argmin (each point scans its row) — as generated functions, like the
//! `ptx` backend. Every other opaque op (scatter, random, cond/while, ...) is left to the
//! reference interpreter.

use super::scalar::{self, float_literal, int_literal, mlir_type};
use super::{CodegenError, ERR_EMPTY, ERR_INDEX, Func, R, static_dims, unsupported};
use oar_ir::DType;
use oar_ir::kernel::{BufferId, OpaqueKernel};
use oar_ir::ops::{ArgReduce, Concat, Gather, Iota, Pad};
use oar_ir::ops::{ArgReduceOp, Op};

/// Whether [`emit`] generates code for this op.
pub fn generated(op: &Op) -> bool {
    matches!(
        op,
        Op::Iota(_) | Op::Pad(_) | Op::Concat(_) | Op::Gather(_) | Op::ArgReduce(_)
    )
}

/// The flat index of `idx` (index values) in a row-major buffer of shape `dims`.
fn flat(f: &mut Func, dims: &[i64], idx: &[String]) -> String {
    let mut acc = f.index(0);
    let mut stride = 1i64;
    for (d, i) in dims.iter().zip(idx).rev() {
        let s = f.index(stride);
        let t = f.def(&format!("arith.muli {i}, {s} : index"));
        acc = f.def(&format!("arith.addi {acc}, {t} : index"));
        stride *= d;
    }
    acc
}

fn dims_of(f: &Func, b: BufferId) -> R<Vec<i64>> {
    static_dims(f.p.buffer(b).ty.shape.dims())
}

fn constant(f: &mut Func, d: DType, c: f64) -> String {
    match d {
        DType::Bool => f.def(&format!("arith.constant {}", c != 0.0)),
        _ if d.is_float() => f.def(&format!("arith.constant {} : {}", float_literal(d, c), mlir_type(d))),
        _ => f.def(&format!(
            "arith.constant {} : {}",
            int_literal(d, c as i64),
            mlir_type(d)
        )),
    }
}

/// `scf.if cond -> (T) { then() } else { other }`.
fn guarded(
    f: &mut Func,
    cond: &str,
    ty: &str,
    then: &mut dyn FnMut(&mut Func) -> R<String>,
    other: &mut dyn FnMut(&mut Func) -> R<String>,
) -> R<String> {
    let r = f.def(&format!("scf.if {cond} -> ({ty}) {{"));
    f.depth += 1;
    let v = then(f)?;
    f.line(&format!("scf.yield {v} : {ty}"));
    f.depth -= 1;
    f.line("} else {");
    f.depth += 1;
    let v = other(f)?;
    f.line(&format!("scf.yield {v} : {ty}"));
    f.depth -= 1;
    f.line("}");
    Ok(r)
}

/// The element of the op's result at output point `o` (bool as `i1`).
fn value(f: &mut Func, k: &OpaqueKernel, out_dt: DType, o: &[String]) -> R<String> {
    let ty = mlir_type(out_dt);
    match &k.op {
        Op::Iota(Iota { axis, .. }) => {
            let i = o
                .get(*axis)
                .ok_or_else(|| CodegenError::Unsupported("iota axis out of range".into()))?;
            let i = f.def(&format!("arith.index_cast {i} : index to i64"));
            scalar::cast(f, &i, DType::I64, out_dt)
        }
        Op::Pad(Pad { before, value, .. }) => {
            let &[x] = k.inputs.as_slice() else {
                return unsupported("pad takes one operand");
            };
            let xs = dims_of(f, x)?;
            if before.len() != xs.len() || xs.len() != o.len() {
                return unsupported("pad rank mismatch");
            }
            let mut inb = f.def("arith.constant true");
            let mut src = Vec::new();
            for (d, od) in o.iter().enumerate() {
                let (b, n, z) = (f.index(before[d] as i64), f.index(xs[d]), f.index(0));
                let s = f.def(&format!("arith.subi {od}, {b} : index"));
                let ge = f.def(&format!("arith.cmpi sge, {s}, {z} : index"));
                let lt = f.def(&format!("arith.cmpi slt, {s}, {n} : index"));
                inb = f.def(&format!("arith.andi {inb}, {ge} : i1"));
                inb = f.def(&format!("arith.andi {inb}, {lt} : i1"));
                src.push(s);
            }
            let c = value.0;
            guarded(
                f,
                &inb,
                ty,
                &mut |f| {
                    let i = flat(f, &xs, &src);
                    f.load_at(x, &i)
                },
                &mut |f| Ok(constant(f, out_dt, c)),
            )
        }
        Op::Concat(Concat { axis }) => concat(f, &k.inputs, *axis, out_dt, o, 0),
        Op::Gather(Gather { axis }) => {
            let &[data, indices] = k.inputs.as_slice() else {
                return unsupported("gather takes two operands");
            };
            let (ds, is) = (dims_of(f, data)?, dims_of(f, indices)?);
            let idt = f.p.buffer(indices).ty.dtype;
            let axis = *axis;
            if !idt.is_int() || axis >= ds.len() || o.len() != ds.len() - 1 + is.len() {
                return unsupported("gather shapes or index dtype");
            }
            let ii = flat(f, &is, &o[axis..axis + is.len()]);
            let kv = f.load_at(indices, &ii)?;
            let k = scalar::cast(f, &kv, idt, DType::I64)?;
            let (n, z) = (
                f.def(&format!("arith.constant {} : i64", ds[axis])),
                f.def("arith.constant 0 : i64"),
            );
            let neg = f.def(&format!("arith.cmpi slt, {k}, {z} : i64"));
            let kn = f.def(&format!("arith.addi {k}, {n} : i64"));
            let k = f.def(&format!("arith.select {neg}, {kn}, {k} : i64"));
            let lo = f.def(&format!("arith.cmpi slt, {k}, {z} : i64"));
            let hi = f.def(&format!("arith.cmpi sge, {k}, {n} : i64"));
            let bad = f.def(&format!("arith.ori {lo}, {hi} : i1"));
            f.raise_if(&bad, ERR_INDEX);
            let k = f.def(&format!("arith.select {bad}, {z}, {k} : i64"));
            let k = f.def(&format!("arith.index_cast {k} : i64 to index"));
            let mut di: Vec<String> = o[..axis].to_vec();
            di.push(k);
            di.extend(o[axis + is.len()..].iter().cloned());
            let i = flat(f, &ds, &di);
            f.load_at(data, &i)
        }
        Op::ArgReduce(ArgReduce { op, axis, keepdim }) => {
            let &[x] = k.inputs.as_slice() else {
                return unsupported("argmax/argmin take one operand");
            };
            let (xs, xdt) = (dims_of(f, x)?, f.p.buffer(x).ty.dtype);
            let (axis, max) = (*axis, *op == ArgReduceOp::ArgMax);
            let n = *xs
                .get(axis)
                .ok_or_else(|| CodegenError::Unsupported("axis out of range".into()))?;
            if n == 0 {
                let t = f.def("arith.constant true");
                f.raise_if(&t, ERR_EMPTY);
                return Ok(constant(f, out_dt, 0.0));
            }
            let mut idx: Vec<String> = Vec::new();
            for d in 0..xs.len() {
                if d == axis {
                    idx.push(f.index(0));
                    continue;
                }
                let od = if *keepdim || d < axis { d } else { d - 1 };
                idx.push(
                    o.get(od)
                        .cloned()
                        .ok_or_else(|| CodegenError::Unsupported("argmax rank".into()))?,
                );
            }
            let i0 = flat(f, &xs, &idx);
            let first = f.load_at(x, &i0)?;
            let xty = mlir_type(xdt);
            let (lo, hi, one) = (f.index(1), f.index(n), f.index(1));
            let (res, j, best, bi) = (f.fresh(), f.fresh(), f.fresh(), f.fresh());
            let zero = f.index(0);
            f.line(&format!(
                "{res}:2 = scf.for {j} = {lo} to {hi} step {one} iter_args({best} = {first}, {bi} = {zero}) -> ({xty}, index) {{"
            ));
            f.depth += 1;
            idx[axis] = j.clone();
            let ij = flat(f, &xs, &idx);
            let v = f.load_at(x, &ij)?;
            let better = if xdt.is_float() {
                // NaN beats everything except an earlier NaN.
                let c = f.def(&format!(
                    "arith.cmpf {}, {v}, {best} : {xty}",
                    if max { "ogt" } else { "olt" }
                ));
                let vn = f.def(&format!("arith.cmpf uno, {v}, {v} : {xty}"));
                let bn = f.def(&format!("arith.cmpf ord, {best}, {best} : {xty}"));
                let c = f.def(&format!("arith.ori {c}, {vn} : i1"));
                f.def(&format!("arith.andi {c}, {bn} : i1"))
            } else {
                let u = matches!(xdt, DType::U8 | DType::Bool);
                let p = match (max, u) {
                    (true, true) => "ugt",
                    (true, false) => "sgt",
                    (false, true) => "ult",
                    (false, false) => "slt",
                };
                f.def(&format!("arith.cmpi {p}, {v}, {best} : {xty}"))
            };
            let nb = f.def(&format!("arith.select {better}, {v}, {best} : {xty}"));
            let ni = f.def(&format!("arith.select {better}, {j}, {bi} : index"));
            f.line(&format!("scf.yield {nb}, {ni} : {xty}, index"));
            f.depth -= 1;
            f.line("}");
            let i = f.def(&format!("arith.index_cast {res}#1 : index to i64"));
            scalar::cast(f, &i, DType::I64, out_dt)
        }
        other => Err(CodegenError::Opaque(other.name().to_string())),
    }
}

/// The concat element: the input whose slab along `axis` holds `o[axis]` (nested `scf.if`).
fn concat(f: &mut Func, inputs: &[BufferId], axis: usize, out_dt: DType, o: &[String], off: i64) -> R<String> {
    let Some((&x, rest)) = inputs.split_first() else {
        return Ok(constant(f, out_dt, 0.0));
    };
    let xs = dims_of(f, x)?;
    let nx = *xs
        .get(axis)
        .ok_or_else(|| CodegenError::Unsupported("concat axis out of range".into()))?;
    let oa = o
        .get(axis)
        .ok_or_else(|| CodegenError::Unsupported("concat rank".into()))?
        .clone();
    let end = f.index(off + nx);
    let inb = f.def(&format!("arith.cmpi ult, {oa}, {end} : index"));
    let mut src = o.to_vec();
    guarded(
        f,
        &inb,
        mlir_type(out_dt),
        &mut |f| {
            let offc = f.index(off);
            src[axis] = f.def(&format!("arith.subi {oa}, {offc} : index"));
            let i = flat(f, &xs, &src);
            f.load_at(x, &i)
        },
        &mut |f| concat(f, rest, axis, out_dt, o, off + nx),
    )
}

/// An opaque kernel writing `out`: one point of its result per (parallel) loop point.
pub(crate) fn emit(f: &mut Func, k: &OpaqueKernel, out: BufferId) -> R<()> {
    if !generated(&k.op) {
        return Err(CodegenError::Opaque(k.op.name().to_string()));
    }
    let shape = dims_of(f, out)?;
    let out_dt = f.p.buffer(out).ty.dtype;
    let vars = f.open_parallel(&shape);
    let v = value(f, k, out_dt, &vars)?;
    let i = flat(f, &shape, &vars);
    f.store_at(out, &i, &v)?;
    f.close_parallel(shape.len());
    Ok(())
}
