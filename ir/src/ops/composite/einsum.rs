//! `einsum`: Einstein summation by an equation (`"bij,bjk->bik"`), as numpy, PyTorch and ONNX
//! define it: one letter per axis, repeated letters within an operand take the diagonal, letters
//! missing from the output are summed, `...` stands for broadcast axes, and without `->` the
//! output is `...` then the letters used once, in alphabetical order.
//!
//! Decomposition: diagonals by an identity mask, letters no one needs summed early, then
//! operands combined left to right — as a batched `matmul` when every size is static (batch,
//! free and contracted letters grouped by reshapes), otherwise by broadcasting and
//! `reduce_sum` — and a final permutation into the output's order.

use super::super::rules::{R, out_elements};
use super::super::sample::{Domain, Sample, input, input_in};
use super::{V, composite_def, one, reshape};
use crate::eval::{Data, EvalCx, Res, Value, array};
use crate::ops::{BinaryOp, Composite, OpDef, ReduceOp, op_struct};
use crate::{DType, Dim, Emitter, Graph, Op, Shape, TensorType};

op_struct! {
    /// `einsum(x0, x1, ...)` by `equation`.
    Einsum "einsum" {
        /// The equation, e.g. `"ij,jk->ik"`, `"ii->i"`, `"...ij->...ji"`.
        equation: String,
    }
}

/// An equation with `...` expanded to one placeholder letter per broadcast axis.
#[derive(Clone, Debug, PartialEq)]
struct Spec {
    /// Each operand's letters, one per axis.
    inputs: Vec<Vec<char>>,
    /// The output's letters.
    output: Vec<char>,
}

/// The placeholder for broadcast axis `k` of `...` (outside ASCII, so it never clashes).
fn placeholder(k: usize) -> char {
    char::from_u32(0x2460 + k as u32).expect("a valid char")
}

fn is_placeholder(c: char) -> bool {
    ('\u{2460}'..='\u{24ff}').contains(&c)
}

/// Letters of one term; `...` becomes the last `ell` of `total` placeholders.
fn term(t: &str, rank: Option<usize>, total: Option<usize>) -> Result<(Vec<char>, Option<usize>), String> {
    let parts: Vec<&str> = t.split("...").collect();
    if parts.len() > 2 {
        return Err(format!("term `{t}` has more than one `...`"));
    }
    let letters: Vec<char> = parts.concat().chars().collect();
    if let Some(c) = letters.iter().find(|c| !c.is_ascii_alphabetic()) {
        return Err(format!("term `{t}` has `{c}`, not a letter"));
    }
    if parts.len() == 1 {
        if rank.is_some_and(|r| r != letters.len()) {
            return Err(format!(
                "term `{t}` has {} letters for a rank-{} operand",
                letters.len(),
                rank.unwrap_or(0)
            ));
        }
        return Ok((letters, None));
    }
    let ell = match (rank, total) {
        (Some(r), _) => r
            .checked_sub(letters.len())
            .ok_or_else(|| format!("term `{t}` has more letters than the operand's {r} axes"))?,
        (None, Some(e)) => e,
        (None, None) => 0,
    };
    let e = total.unwrap_or(ell);
    let mut out: Vec<char> = parts[0].chars().collect();
    out.extend((e - ell..e).map(placeholder));
    out.extend(parts[1].chars());
    Ok((out, Some(ell)))
}

impl Einsum {
    /// The equation for operands of these ranks.
    fn spec(&self, ranks: &[usize]) -> Result<Spec, String> {
        let eq: String = self.equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        if terms.len() != ranks.len() {
            return Err(format!(
                "equation `{}` has {} operands, got {}",
                self.equation,
                terms.len(),
                ranks.len()
            ));
        }
        // The widest `...` sets how many placeholders there are.
        let mut e = 0;
        for (t, &r) in terms.iter().zip(ranks) {
            if let (_, Some(ell)) = term(t, Some(r), None)? {
                e = e.max(ell);
            }
        }
        let inputs = terms
            .iter()
            .zip(ranks)
            .map(|(t, &r)| term(t, Some(r), Some(e)).map(|(l, _)| l))
            .collect::<Result<Vec<_>, _>>()?;
        let output = match rhs {
            Some(r) => term(r, None, Some(e))?.0,
            None => {
                let mut once: Vec<char> = inputs
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|c| !is_placeholder(*c))
                    .filter(|c| inputs.iter().flatten().filter(|d| *d == c).count() == 1)
                    .collect();
                once.sort_unstable();
                (0..e).map(placeholder).chain(once).collect()
            }
        };
        for (i, c) in output.iter().enumerate() {
            if output[..i].contains(c) {
                return Err(format!("output letter `{c}` appears twice in `{}`", self.equation));
            }
            if !inputs.iter().flatten().any(|d| d == c) {
                return Err(format!("output letter `{c}` of `{}` is in no operand", self.equation));
            }
        }
        Ok(Spec { inputs, output })
    }
}

/// Each letter's size, checked across operands (`...` axes broadcast, others must agree).
fn letter_sizes(spec: &Spec, shapes: &[Vec<Dim>]) -> Result<Vec<(char, Dim)>, String> {
    let mut sizes: Vec<(char, Dim)> = Vec::new();
    for (letters, shape) in spec.inputs.iter().zip(shapes) {
        for (&c, d) in letters.iter().zip(shape) {
            match sizes.iter_mut().find(|(l, _)| *l == c) {
                None => sizes.push((c, d.clone())),
                Some((_, have)) if have == d => {}
                Some((_, have)) if is_placeholder(c) && *have == Dim::Static(1) => *have = d.clone(),
                Some(_) if is_placeholder(c) && *d == Dim::Static(1) => {}
                Some((_, have)) => return Err(format!("letter `{c}` has sizes {have} and {d}")),
            }
        }
    }
    Ok(sizes)
}

fn size_of(sizes: &[(char, Dim)], c: char) -> Dim {
    sizes
        .iter()
        .find(|(l, _)| *l == c)
        .map(|(_, d)| d.clone())
        .unwrap_or(Dim::Static(1))
}

impl OpDef for Einsum {
    composite_def!();

    fn infer(&self, inputs: &[TensorType], _: &[Graph]) -> R {
        let first = inputs.first().ok_or("einsum needs at least one operand")?;
        if !first.dtype.is_numeric() || inputs.iter().any(|t| t.dtype != first.dtype) {
            return Err(format!(
                "einsum needs numeric operands of one dtype, got {}",
                super::super::rules::list(inputs)
            ));
        }
        let ranks: Vec<usize> = inputs.iter().map(TensorType::rank).collect();
        let spec = self.spec(&ranks)?;
        let shapes: Vec<Vec<Dim>> = inputs.iter().map(|t| t.shape.0.clone()).collect();
        let sizes = letter_sizes(&spec, &shapes)?;
        let shape: Vec<Dim> = spec.output.iter().map(|&c| size_of(&sizes, c)).collect();
        Ok(vec![TensorType::new(first.dtype, shape)])
    }

    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64> {
        // Upper bound: one multiply-add per point of the joint index space.
        let ranks: Vec<usize> = inputs.iter().map(TensorType::rank).collect();
        let spec = self.spec(&ranks).ok()?;
        let shapes: Vec<Vec<Dim>> = inputs.iter().map(|t| t.shape.0.clone()).collect();
        let sizes = letter_sizes(&spec, &shapes).ok()?;
        let joint: Option<u64> = sizes.iter().map(|(_, d)| d.as_static().map(|n| n as u64)).product();
        Some(2 * joint?.max(out_elements(outputs)?))
    }

    fn decompose<E: Emitter>(
        &self,
        g: &mut E,
        x: &[E::Value],
        types: &[TensorType],
        _: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        let ranks: Vec<usize> = types.iter().map(TensorType::rank).collect();
        let spec = match self.spec(&ranks) {
            Ok(s) => s,
            Err(e) => return Some(Err(super::unsupported("einsum", e).into())),
        };
        one::<E>(contract(g, x, &spec))
    }

    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>> {
        let site = cx.site();
        let ranks: Vec<usize> = ins.iter().map(|v| v.shape().len()).collect();
        let spec = self.spec(&ranks).map_err(|e| site.err(e))?;
        let shapes: Vec<Vec<Dim>> = ins
            .iter()
            .map(|v| v.shape().iter().map(|&n| Dim::Static(n)).collect())
            .collect();
        let sizes = letter_sizes(&spec, &shapes).map_err(|e| site.err(e))?;
        let letters: Vec<char> = sizes.iter().map(|(c, _)| *c).collect();
        let dims: Vec<usize> = sizes.iter().map(|(_, d)| d.as_static().unwrap_or(1)).collect();
        let joint: usize = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| site.err("index space overflows"))?;
        site.check_size(DType::F64, &[joint], "einsum index space")?;
        let out_dims: Vec<usize> = spec
            .output
            .iter()
            .map(|c| dims[letters.iter().position(|l| l == c).expect("letter")])
            .collect();
        let pos = |c: char| letters.iter().position(|l| *l == c).expect("letter");
        // For every operand and output: per letter position, its stride in that tensor (0 if
        // absent or broadcast, summed when a letter repeats: the diagonal).
        let strides = |ls: &[char], shape: &[usize]| -> Vec<usize> {
            let mut st = vec![0usize; letters.len()];
            let mut s = 1;
            for (k, &c) in ls.iter().enumerate().rev() {
                if shape[k] != 1 {
                    st[pos(c)] += s;
                }
                s *= shape[k];
            }
            st
        };
        let in_strides: Vec<Vec<usize>> = spec
            .inputs
            .iter()
            .zip(ins)
            .map(|(l, v)| strides(l, v.shape()))
            .collect();
        let out_strides = strides(&spec.output, &out_dims);
        let n_out: usize = out_dims.iter().product();
        let float = ins.iter().all(|v| matches!(v.data, Data::F(_)));
        let flat: Vec<Vec<f64>> = ins
            .iter()
            .map(|v| match &v.data {
                Data::F(a) => Ok(a.iter().copied().collect()),
                Data::I(a) => Ok(a.iter().map(|&i| i as f64).collect()),
                Data::B(_) => Err(site.err("einsum is not defined for bool")),
            })
            .collect::<Res<_>>()?;
        let ints: Vec<Vec<i64>> = ins
            .iter()
            .map(|v| match &v.data {
                Data::I(a) => a.iter().copied().collect(),
                _ => Vec::new(),
            })
            .collect();
        let mut out_f = vec![0.0f64; n_out];
        let mut out_i = vec![0i64; n_out];
        let mut idx = vec![0usize; letters.len()];
        for _ in 0..joint {
            let at = |st: &[usize]| idx.iter().zip(st).map(|(i, s)| i * s).sum::<usize>();
            let o = at(&out_strides);
            if float {
                out_f[o] += flat.iter().zip(&in_strides).map(|(v, st)| v[at(st)]).product::<f64>();
            } else {
                let p = ints
                    .iter()
                    .zip(&in_strides)
                    .fold(1i64, |acc, (v, st)| acc.wrapping_mul(v[at(st)]));
                out_i[o] = out_i[o].wrapping_add(p);
            }
            for k in (0..idx.len()).rev() {
                idx[k] += 1;
                if idx[k] < dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        let data = if float {
            Data::F(array(site, &out_dims, out_f)?)
        } else {
            Data::I(array(site, &out_dims, out_i)?)
        };
        Ok(vec![ins[0].with(data)])
    }

    fn samples() -> Vec<Sample> {
        let op = |eq: &str| Op::Composite(Composite::Einsum(Einsum { equation: eq.into() }));
        let f = DType::F32;
        vec![
            Sample::new(
                "einsum/matmul",
                op("ij,jk->ik"),
                vec![input(f, &[3, 4]), input(f, &[4, 5])],
            ),
            Sample::new(
                "einsum/batched_transposed",
                op("bij,bkj->bki"),
                vec![input(f, &[2, 3, 4]), input(f, &[2, 5, 4])],
            ),
            Sample::new("einsum/trace_diag", op("ii->i"), vec![input(DType::F64, &[4, 4])]),
            Sample::new("einsum/implicit_outer", op("i,j"), vec![input(f, &[3]), input(f, &[4])]),
            Sample::new(
                "einsum/ellipsis_three",
                op("...ij,jk,k->...i"),
                vec![input(f, &[2, 3, 4]), input(f, &[4, 5]), input(f, &[5])],
            ),
            Sample::new(
                "einsum/i32_sum",
                op("ij->"),
                vec![input_in(DType::I32, &[3, 4], Domain::Ints(-9, 9))],
            )
            .no_grad(),
        ]
    }
}

/// The decomposition: diagonals, early sums, pairwise products, final order.
fn contract<E: Emitter>(g: &mut E, x: &[E::Value], spec: &Spec) -> V<E> {
    let mut ops: Vec<(E::Value, Vec<char>)> = Vec::new();
    for (&v, letters) in x.iter().zip(&spec.inputs) {
        ops.push(diagonals(g, v, letters.clone())?);
    }
    let needed = |ops: &[(E::Value, Vec<char>)], from: usize| -> Vec<char> {
        let mut n = spec.output.clone();
        for (_, l) in &ops[from..] {
            n.extend(l.iter().copied());
        }
        n
    };
    // Sum letters nobody else needs, then combine left to right.
    let (v, l) = ops[0].clone();
    let mut acc = sum_out(g, v, l, &needed(&ops, 1))?;
    for k in 1..ops.len() {
        let later = needed(&ops, k + 1);
        let (v, l) = ops[k].clone();
        let mut also = later.clone();
        also.extend(acc.1.iter().copied());
        let rhs = sum_out(g, v, l, &also)?;
        acc = pair(g, acc, rhs, &later)?;
    }
    let (v, letters) = sum_out(g, acc.0, acc.1, &spec.output)?;
    let perm: Vec<usize> = spec
        .output
        .iter()
        .map(|c| letters.iter().position(|l| l == c).expect("output letter present"))
        .collect();
    g.permute(v, perm)
}

/// Take the diagonal of every repeated letter: `x · [i_p == i_q]` summed over axis q.
fn diagonals<E: Emitter>(g: &mut E, x: E::Value, mut letters: Vec<char>) -> Result<(E::Value, Vec<char>), E::Error> {
    let mut v = x;
    while let Some((p, q)) =
        (0..letters.len()).find_map(|q| letters[..q].iter().position(|c| *c == letters[q]).map(|p| (p, q)))
    {
        let t = g.value_type(v);
        let ip = super::iota(g, t.shape.0.clone(), p, DType::I64)?;
        let iq = super::iota(g, t.shape.0.clone(), q, DType::I64)?;
        let eq = g.binary(BinaryOp::Eq, ip, iq)?;
        let mask = g.cast(eq, t.dtype)?;
        let masked = g.binary(BinaryOp::Mul, v, mask)?;
        v = g.reduce(ReduceOp::Sum, masked, vec![q], false)?;
        letters.remove(q);
    }
    Ok((v, letters))
}

/// Sum the axes whose letters are not in `keep`.
fn sum_out<E: Emitter>(
    g: &mut E,
    v: E::Value,
    letters: Vec<char>,
    keep: &[char],
) -> Result<(E::Value, Vec<char>), E::Error> {
    let axes: Vec<usize> = (0..letters.len()).filter(|&i| !keep.contains(&letters[i])).collect();
    if axes.is_empty() {
        return Ok((v, letters));
    }
    let r = g.reduce(ReduceOp::Sum, v, axes.clone(), false)?;
    let rest = letters
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, c)| *c)
        .collect();
    Ok((r, rest))
}

/// `a · b` over their joint letters, summing the shared letters not in `keep`.
fn pair<E: Emitter>(
    g: &mut E,
    (a, la): (E::Value, Vec<char>),
    (b, lb): (E::Value, Vec<char>),
    keep: &[char],
) -> Result<(E::Value, Vec<char>), E::Error> {
    let (ta, tb) = (g.value_type(a), g.value_type(b));
    let size = |t: &TensorType, l: &[char], c: char| l.iter().position(|d| *d == c).map(|i| t.shape.0[i].clone());
    let shared: Vec<char> = la.iter().copied().filter(|c| lb.contains(c)).collect();
    let batch: Vec<char> = shared.iter().copied().filter(|c| keep.contains(c)).collect();
    let contracted: Vec<char> = shared.iter().copied().filter(|c| !keep.contains(c)).collect();
    let left: Vec<char> = la.iter().copied().filter(|c| !lb.contains(c)).collect();
    let right: Vec<char> = lb.iter().copied().filter(|c| !la.contains(c)).collect();
    let all_static = ta.shape.is_static() && tb.shape.is_static();
    let same_shared = shared.iter().all(|&c| size(&ta, &la, c) == size(&tb, &lb, c));
    if all_static && same_shared && !contracted.is_empty() {
        // [batch, left, contracted] x [batch, contracted, right] as a matmul.
        let prod = |t: &TensorType, l: &[char], cs: &[char]| -> usize {
            cs.iter().filter_map(|&c| size(t, l, c)?.as_static()).product()
        };
        let order = |l: &[char], parts: [&[char]; 3]| -> Vec<usize> {
            parts
                .iter()
                .flat_map(|p| p.iter())
                .map(|c| l.iter().position(|d| d == c).expect("letter"))
                .collect()
        };
        let pa = g.permute(a, order(&la, [&batch, &left, &contracted]))?;
        let pb = g.permute(b, order(&lb, [&batch, &contracted, &right]))?;
        let (nb, nl, nk, nr) = (
            prod(&ta, &la, &batch),
            prod(&ta, &la, &left),
            prod(&ta, &la, &contracted),
            prod(&tb, &lb, &right),
        );
        let ra = reshape(g, pa, vec![Dim::Static(nb), Dim::Static(nl), Dim::Static(nk)])?;
        let rb = reshape(g, pb, vec![Dim::Static(nb), Dim::Static(nk), Dim::Static(nr)])?;
        let m = g.add_op1(Op::MatMul, &[ra, rb])?;
        let mut letters = batch.clone();
        letters.extend(&left);
        letters.extend(&right);
        let dims: Vec<Dim> = batch
            .iter()
            .chain(&left)
            .map(|&c| size(&ta, &la, c).expect("in a"))
            .chain(right.iter().map(|&c| size(&tb, &lb, c).expect("in b")))
            .collect();
        let v = reshape(g, m, dims)?;
        return Ok((v, letters));
    }
    // Broadcast both over the joint letters (a's first, then b's new ones), multiply, sum.
    let mut joint = la.clone();
    joint.extend(right.iter().copied());
    let align = |g: &mut E, v: E::Value, t: &TensorType, l: &[char]| -> V<E> {
        let present: Vec<char> = joint.iter().copied().filter(|c| l.contains(c)).collect();
        let perm: Vec<usize> = present
            .iter()
            .map(|c| l.iter().position(|d| d == c).expect("letter"))
            .collect();
        let p = g.permute(v, perm)?;
        let dims: Vec<Dim> = joint.iter().map(|c| size(t, l, *c).unwrap_or(Dim::Static(1))).collect();
        g.reshape(p, &Shape(dims))
    };
    let a2 = align(g, a, &ta, &la)?;
    let b2 = align(g, b, &tb, &lb)?;
    let prod = g.binary(BinaryOp::Mul, a2, b2)?;
    sum_out(g, prod, joint, keep)
}
