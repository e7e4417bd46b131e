//! Shape tensors with symbolic entries. A model with a dynamic batch computes its reshape
//! targets at run time — `Reshape(x, Concat(Gather(Shape(x), 0), [-1]))` — so those targets
//! are not constants. The importer follows such small integer tensors symbolically: each one
//! it can express gets its entries as [`SymExpr`]s (`N`, `N*C`, `-1`), and converters that
//! take a shape (Reshape, Expand, ConstantOfShape) read them as if they were constants. The
//! graph still computes the tensors (`shape_of` and friends), for any other consumer.

use crate::proto::NodeProto;
use oar_ir::{Graph, Op, SymExpr, ValueId};
use std::collections::HashMap;

/// Symbolic values of 0-D/1-D integer tensors, by graph value.
pub(crate) type ShapeValues = HashMap<ValueId, Vec<SymExpr>>;

/// Longest shape tensor followed (a rank; anything longer is data, not a shape).
const MAX_LEN: usize = 64;

/// The entries of `v`: from the table, or from an integer constant.
pub(crate) fn entries(g: &Graph, table: &ShapeValues, v: ValueId) -> Option<Vec<SymExpr>> {
    if let Some(e) = table.get(&v) {
        return Some(e.clone());
    }
    match &g.node(v.node).op {
        Op::Constant(t) if t.dtype().is_int() && t.shape().len() <= 1 && t.len() <= MAX_LEN => Some(
            t.to_f64_vec()
                .into_iter()
                .map(|x| SymExpr::constant(x as i64))
                .collect(),
        ),
        _ => None,
    }
}

fn ints_attr(node: &NodeProto, name: &str) -> Option<Vec<i64>> {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
        .map(|a| a.ints.clone())
}

fn int_attr(node: &NodeProto, name: &str) -> Option<i64> {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
        .and_then(|a| a.i)
}

/// Python-style index into `n` entries.
fn index(i: i64, n: usize) -> Option<usize> {
    let j = if i < 0 { i + n as i64 } else { i };
    usize::try_from(j).ok().filter(|&j| j < n)
}

/// The symbolic value of the node's first output, when its inputs have one and the op is one
/// a shape computation uses. `None` when it cannot be followed (then nothing is recorded).
pub(crate) fn propagate(
    g: &Graph,
    table: &ShapeValues,
    node: &NodeProto,
    ins: &[Option<ValueId>],
) -> Option<Vec<SymExpr>> {
    let input = |i: usize| -> Option<Vec<SymExpr>> { entries(g, table, (*ins.get(i)?)?) };
    // Only worth it when some input is symbolic (constants fold on their own).
    if !ins.iter().flatten().any(|v| table.contains_key(v)) && node.op_type() != "Shape" {
        return None;
    }
    match node.op_type() {
        "Shape" => {
            let dims = g.value_type((*ins.first()?)?).shape.0.clone();
            let r = dims.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let (s, e) = (
                clamp(int_attr(node, "start").unwrap_or(0)),
                clamp(int_attr(node, "end").unwrap_or(r)),
            );
            if dims.iter().all(|d| !d.is_symbolic()) {
                return None; // a constant
            }
            Some(dims[s..e.max(s)].iter().map(|d| d.to_expr()).collect())
        }
        "Identity" | "Cast" | "Squeeze" | "Unsqueeze" | "Reshape" | "Flatten" => input(0),
        "Gather" => {
            if int_attr(node, "axis").unwrap_or(0) != 0 {
                return None;
            }
            let data = input(0)?;
            let idx = input(1)?;
            idx.iter()
                .map(|i| Some(data[index(i.as_constant()?, data.len())?].clone()))
                .collect()
        }
        "Concat" => {
            let mut out = Vec::new();
            for i in 0..ins.len() {
                out.extend(input(i)?);
            }
            (out.len() <= MAX_LEN).then_some(out)
        }
        "Slice" => {
            let data = input(0)?;
            let konst = |i: usize| -> Option<Option<i64>> {
                match ins.get(i).copied().flatten() {
                    None => Some(None),
                    Some(_) => Some(Some(input(i)?.first()?.as_constant()?)),
                }
            };
            let (starts, ends, steps) = match ints_attr(node, "starts") {
                Some(s) => (s.first().copied()?, ints_attr(node, "ends")?.first().copied()?, 1),
                None => (konst(1)??, konst(2)??, konst(4)?.unwrap_or(1)),
            };
            let n = data.len() as i64;
            let clamp = |v: i64, lo: i64, hi: i64| (if v < 0 { v + n } else { v }).clamp(lo, hi);
            let mut out = Vec::new();
            if steps > 0 {
                let (mut i, e) = (clamp(starts, 0, n), clamp(ends, 0, n));
                while i < e {
                    out.push(data[i as usize].clone());
                    i += steps;
                }
            } else if steps < 0 {
                let (mut i, e) = (clamp(starts, -1, n - 1), clamp(ends, -1, n - 1));
                while i > e {
                    out.push(data[i as usize].clone());
                    i += steps;
                }
            }
            Some(out)
        }
        op @ ("Add" | "Sub" | "Mul" | "Div") => {
            let (a, b) = (input(0)?, input(1)?);
            let n = a.len().max(b.len());
            if !(a.len() == n || a.len() == 1) || !(b.len() == n || b.len() == 1) {
                return None;
            }
            (0..n)
                .map(|i| {
                    let (x, y) = (&a[i.min(a.len() - 1)], &b[i.min(b.len() - 1)]);
                    match op {
                        "Add" => x.add(y).ok(),
                        "Sub" => x.sub(y).ok(),
                        "Mul" => x.mul(y).ok(),
                        // Sizes are ≥ 0, where ONNX's truncating division is a floor.
                        _ => x.div_exact(y).or_else(|| x.floor_div(y.as_constant()?).ok()),
                    }
                })
                .collect()
        }
        _ => None,
    }
}
