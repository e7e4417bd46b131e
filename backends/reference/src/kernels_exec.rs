//! An interpreter of [`KernelProgram`]s: plain loops over index maps, the reference's own op
//! semantics for every scalar instruction, so a fused program can be checked against the
//! reference backend on the original graph.
//!
//! Each body is evaluated a whole iteration space at a time: every load is gathered through its
//! index map into an array of the iteration shape, and every instruction is the reference's
//! elementwise op on those arrays (rounded to the instruction's dtype). Reductions and
//! contractions call the reference's `reduce`, `matmul` and `conv`; opaque kernels run their op
//! through the graph interpreter. With a [`MemoryPlan`], temporaries live in one byte arena at
//! the planned offsets, so a plan that overlaps two live buffers corrupts the results.

use crate::interp::{Bindings, Interp, bind_shape, resolve};
use ndarray::{ArrayD, IxDyn, Zip};
use oar_ir::eval::{Data, Res, Site, Value, broadcast_dims, eval_one, view_as};
use oar_ir::kernel::{
    Buffer, BufferId, BufferKind, Contraction, IndexMap, Inst, Kernel, KernelBody, KernelProgram, Load, MemoryPlan,
    ScalarOp,
};
use oar_ir::ops::{Broadcast, Cast, MatMul, Reduce, Reshape, Where};
use oar_ir::{BackendError, DType, Dim, Graph, TensorData, Weights};
use std::collections::BTreeMap;

/// Run a kernel program (every buffer in its own allocation). Outputs in program order.
pub fn run_kernel_program(
    program: &KernelProgram,
    weights: &Weights,
    inputs: &BTreeMap<String, TensorData>,
) -> Result<Vec<(String, TensorData)>, BackendError> {
    Exec::new(program, weights, inputs, None)?.run()
}

/// Run a kernel program with its temporaries placed in one arena by `plan` (which must have
/// been made for the same symbol bindings as the inputs give).
pub fn run_kernel_program_planned(
    program: &KernelProgram,
    plan: &MemoryPlan,
    weights: &Weights,
    inputs: &BTreeMap<String, TensorData>,
) -> Result<Vec<(String, TensorData)>, BackendError> {
    Exec::new(program, weights, inputs, Some(plan))?.run()
}

struct Exec<'p> {
    program: &'p KernelProgram,
    weights: &'p Weights,
    binds: Bindings,
    values: BTreeMap<BufferId, Value>,
    arena: Option<(Vec<u8>, &'p MemoryPlan)>,
}

fn site(kernel: &str, what: impl Into<String>) -> Site {
    Site {
        op: kernel.to_string(),
        value: what.into(),
    }
}

impl<'p> Exec<'p> {
    fn new(
        program: &'p KernelProgram,
        weights: &'p Weights,
        inputs: &BTreeMap<String, TensorData>,
        plan: Option<&'p MemoryPlan>,
    ) -> Res<Self> {
        let mut binds = Bindings::new();
        let mut values = BTreeMap::new();
        for (i, b) in program.buffers.iter().enumerate() {
            let (t, missing) = match &b.kind {
                BufferKind::Input { name } => (
                    inputs.get(name),
                    BackendError::MissingInput {
                        name: name.clone(),
                        expected: b.ty.to_string(),
                    },
                ),
                BufferKind::Param { name } => (
                    weights.get(name),
                    BackendError::Weight {
                        name: name.clone(),
                        detail: format!("no weight given (expected {})", b.ty),
                    },
                ),
                BufferKind::Constant(t) => (
                    Some(t),
                    BackendError::Runtime {
                        op: "constant".into(),
                        value: b.value.clone(),
                        detail: "missing".into(),
                    },
                ),
                _ => continue,
            };
            let t = t.ok_or(missing)?;
            if t.dtype() != b.ty.dtype || !bind_shape(&b.ty, t.shape(), &mut binds) {
                return Err(BackendError::InputMismatch {
                    name: format!("b{i} ({})", b.value),
                    expected: b.ty.to_string(),
                    got: t.tensor_type().to_string(),
                });
            }
            let v = Value::from_tensor(t).map_err(|detail| site("input", format!("b{i}")).err(detail))?;
            values.insert(BufferId(i as u32), v);
        }
        let arena = match plan {
            Some(p) => {
                for (s, n) in &p.bindings {
                    if binds.get(s).is_some_and(|b| b != n) {
                        return Err(site("plan", s.clone()).err(format!(
                            "the plan was made for {s} = {n}, the inputs bind {s} = {}",
                            binds[s]
                        )));
                    }
                }
                Some((vec![0u8; p.arena_bytes], p))
            }
            None => None,
        };
        Ok(Exec {
            program,
            weights,
            binds,
            values,
            arena,
        })
    }

    fn buffer_shape(&self, s: &Site, b: BufferId) -> Res<(DType, Vec<usize>)> {
        let buf = self
            .program
            .buffers
            .get(b.index())
            .ok_or_else(|| s.err(format!("{b} is not a buffer of the program")))?;
        Ok((buf.ty.dtype, resolve(s, buf.ty.shape.dims(), &self.binds)?))
    }

    fn in_arena(&self, b: BufferId) -> Option<(usize, usize)> {
        let (_, plan) = self.arena.as_ref()?;
        Some((*plan.offsets.get(&b)?, *plan.sizes.get(&b)?))
    }

    fn read(&self, s: &Site, b: BufferId) -> Res<Value> {
        if let (Some((off, size)), Some((arena, _))) = (self.in_arena(b), &self.arena) {
            let (dtype, shape) = self.buffer_shape(s, b)?;
            let bytes = arena
                .get(off..off + size)
                .ok_or_else(|| s.err(format!("{b} at {off}+{size} lies outside the arena")))?;
            let t = TensorData::from_bytes(dtype, shape, bytes.to_vec()).map_err(|e| s.err(e.to_string()))?;
            return Value::from_tensor(&t).map_err(|e| s.err(e));
        }
        self.values
            .get(&b)
            .cloned()
            .ok_or_else(|| s.err(format!("{b} is read before it is written")))
    }

    fn write(&mut self, s: &Site, b: BufferId, mut v: Value) -> Res<()> {
        let (dtype, shape) = self.buffer_shape(s, b)?;
        if v.dtype == DType::F32 && dtype.is_half() {
            // f32 values stored in a half buffer, rounded (`legalize::widen_half` has rounded
            // them already, so this is exact there).
            v = eval_one(s, &Cast { to: dtype }, &[&v])?;
        }
        v.normalize();
        if v.dtype != dtype || v.shape() != shape.as_slice() {
            return Err(s.err(format!(
                "computed {}{:?} for {b} of {dtype}{shape:?}",
                v.dtype,
                v.shape()
            )));
        }
        if let Some((off, size)) = self.in_arena(b) {
            let t = v.to_tensor().map_err(|e| s.err(e))?;
            let arena = &mut self.arena.as_mut().expect("in_arena checked").0;
            let dst = arena
                .get_mut(off..off + size)
                .filter(|d| d.len() == t.bytes().len())
                .ok_or_else(|| s.err(format!("{b} does not fit its arena slot {off}+{size}")))?;
            dst.copy_from_slice(t.bytes());
            return Ok(());
        }
        self.values.insert(b, v);
        Ok(())
    }

    fn run(mut self) -> Res<Vec<(String, TensorData)>> {
        for k in &self.program.kernels {
            self.kernel(k)?;
        }
        let s = site("output", "");
        self.program
            .outputs
            .iter()
            .map(|(name, b)| {
                let t = self.read(&s, *b)?.to_tensor().map_err(|e| s.err(e))?;
                Ok((name.clone(), t))
            })
            .collect()
    }

    /// The elements of `load` at every point of an iteration space of `dims`.
    fn gather(&self, s: &Site, load: &Load, dims: &[usize]) -> Res<Value> {
        let src = self.read(s, load.buffer)?;
        let IndexMap { view, axes } = &load.map;
        let view = resolve(s, view, &self.binds)?;
        let n: usize = view.iter().product();
        if n != src.shape().iter().product::<usize>() || axes.len() != view.len() {
            return Err(s.err(format!(
                "{} of shape {:?} cannot be viewed as {view:?} with {} index expressions",
                load.buffer,
                src.shape(),
                axes.len()
            )));
        }
        s.check_size(src.dtype, dims, "iteration space")?;
        let mut strides = vec![1usize; view.len()];
        for a in (0..view.len().saturating_sub(1)).rev() {
            strides[a] = strides[a + 1] * view[a + 1];
        }
        let total: usize = dims.iter().product();
        let mut index = Vec::with_capacity(total);
        let mut point = vec![0usize; dims.len()];
        for _ in 0..total {
            let mut lin = 0;
            for (a, e) in axes.iter().enumerate() {
                let i = e
                    .eval(&point)
                    .filter(|&i| i >= 0 && (i as usize) < view[a])
                    .ok_or_else(|| {
                        s.err(format!(
                            "{} index `{e}` at {point:?} is outside axis {a} of {view:?}",
                            load.buffer
                        ))
                    })?;
                lin += i as usize * strides[a];
            }
            index.push(lin);
            for a in (0..dims.len()).rev() {
                point[a] += 1;
                if point[a] < dims[a] {
                    break;
                }
                point[a] = 0;
            }
        }
        fn pick<T: Clone>(a: &ArrayD<T>, index: &[usize], dims: &[usize]) -> ArrayD<T> {
            let flat: Vec<T> = a.iter().cloned().collect();
            let v = index.iter().map(|&i| flat[i].clone()).collect();
            ArrayD::from_shape_vec(IxDyn(dims), v).expect("one element per point")
        }
        let data = match &src.data {
            Data::F(a) => Data::F(pick(a, &index, dims)),
            Data::I(a) => Data::I(pick(a, &index, dims)),
            Data::B(a) => Data::B(pick(a, &index, dims)),
        };
        Ok(src.with(data))
    }

    /// Evaluate an SSA body over an iteration space; the result has that shape.
    fn body(&self, s: &Site, body: &[Inst], loads: &[Load], dims: &[usize], accs: &[Value]) -> Res<Value> {
        let mut vals: Vec<Value> = Vec::with_capacity(body.len());
        let mut gathered: BTreeMap<usize, Value> = BTreeMap::new();
        for (i, inst) in body.iter().enumerate() {
            let s = site(&s.op, format!("%{i}"));
            let arg = |a: usize| {
                vals.get(a)
                    .ok_or_else(|| s.err(format!("operand %{a} is not defined before %{i}")))
            };
            let mut v = match &inst.op {
                ScalarOp::Load(l) => {
                    if !gathered.contains_key(l) {
                        let load = loads.get(*l).ok_or_else(|| s.err(format!("no load l{l}")))?;
                        gathered.insert(*l, self.gather(&s, load, dims)?);
                    }
                    let v = gathered[l].clone();
                    if v.dtype != inst.dtype && v.dtype.is_half() && inst.dtype == DType::F32 {
                        // A half buffer read as f32 values (exactly; `legalize::widen_half`).
                        eval_one(&s, &Cast { to: DType::F32 }, &[&v])?
                    } else {
                        v
                    }
                }
                ScalarOp::Const(c) => constant(inst.dtype, c.0),
                ScalarOp::Acc(n) => accs
                    .get(*n)
                    .cloned()
                    .ok_or_else(|| s.err(format!("acc{n} is not computed before this body")))?,
                ScalarOp::Unary(u, a) => eval_one(&s, u, &[arg(*a)?])?,
                ScalarOp::Binary(b, x, y) => eval_one(&s, b, &[arg(*x)?, arg(*y)?])?,
                ScalarOp::Where(c, a, b) => eval_one(&s, &Where, &[arg(*c)?, arg(*a)?, arg(*b)?])?,
                ScalarOp::Cast(a) => eval_one(&s, &Cast { to: inst.dtype }, &[arg(*a)?])?,
                ScalarOp::Bitcast(a) => bitcast(&s, arg(*a)?, inst.dtype)?,
                ScalarOp::ShiftLeft(a, n) => shift(&s, arg(*a)?, *n, true)?,
                ScalarOp::ShiftRight(a, n) => shift(&s, arg(*a)?, *n, false)?,
                ScalarOp::MulAdd(a, b, c) => mul_add(&s, [arg(*a)?, arg(*b)?, arg(*c)?], inst.dtype)?,
            };
            if v.dtype != inst.dtype {
                return Err(s.err(format!("computed {} but the instruction says {}", v.dtype, inst.dtype)));
            }
            v.normalize();
            vals.push(v);
        }
        let last = vals.pop().ok_or_else(|| s.err("empty body"))?;
        let to = Broadcast {
            shape: dims.iter().map(|&d| Dim::Static(d)).collect(),
        };
        eval_one(s, &to, &[&last])
    }

    fn kernel(&mut self, k: &Kernel) -> Res<()> {
        let s = site(
            &k.name,
            k.outputs.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(","),
        );
        let out = match &k.body {
            KernelBody::Loop(l) => {
                let dims = resolve(&s, &l.shape, &self.binds)?;
                let outer = dims
                    .get(..l.outer)
                    .ok_or_else(|| s.err(format!("{} outer loops in a rank-{} kernel", l.outer, dims.len())))?;
                // Stage results have the outer shape; bodies see them with unit reduction axes.
                let mut accs: Vec<Value> = Vec::with_capacity(l.reduce.len());
                for r in &l.reduce {
                    let red = resolve(&s, &r.dims, &self.binds)?;
                    let all: Vec<usize> = outer.iter().chain(&red).copied().collect();
                    let seen = accs
                        .iter()
                        .map(|a| unit_axes(&s, a, red.len()))
                        .collect::<Res<Vec<_>>>()?;
                    let v = self.body(&s, &r.body, &l.loads, &all, &seen)?;
                    let axes: Vec<usize> = (outer.len()..all.len()).collect();
                    let reduce = Reduce {
                        op: r.op,
                        axes,
                        keepdim: false,
                    };
                    let mut acc = eval_one(&s, &reduce, &[&v])?;
                    acc.normalize();
                    accs.push(acc);
                }
                let seen = accs
                    .iter()
                    .map(|a| unit_axes(&s, a, dims.len() - outer.len()))
                    .collect::<Res<Vec<_>>>()?;
                self.body(&s, &l.body, &l.loads, &dims, &seen)?
            }
            KernelBody::Contraction(c) => {
                let mut lhs = self.gather(&s, &c.lhs.load, &resolve(&s, &c.lhs.shape, &self.binds)?)?;
                let mut rhs = self.gather(&s, &c.rhs.load, &resolve(&s, &c.rhs.shape, &self.binds)?)?;
                // Operands rounded as they are read (`legalize::fold_operand_casts`): the cast's
                // rounding.
                for (v, o) in [(&mut lhs, &c.lhs), (&mut rhs, &c.rhs)] {
                    if let Some(d) = o.round.filter(|&d| d != v.dtype) {
                        *v = eval_one(&s, &Cast { to: d }, &[&*v])?;
                        // (Values hold wider numbers until normalized to their dtype.)
                        v.normalize();
                    }
                }
                // Half operands of an f32 accumulator (`legalize::widen_half` keeps bf16 product
                // operands for runtimes that multiply bf16): the product of their f32 values.
                for v in [&mut lhs, &mut rhs] {
                    if v.dtype.is_half() && c.acc_dtype == DType::F32 {
                        *v = eval_one(&s, &Cast { to: DType::F32 }, &[&*v])?;
                    }
                }
                let mut acc = match &c.op {
                    Contraction::MatMul => eval_one(&s, &MatMul, &[&lhs, &rhs])?,
                    Contraction::Conv(conv) => eval_one(&s, conv, &[&lhs, &rhs])?,
                };
                acc.normalize();
                let dims = resolve(&s, &c.shape, &self.binds)?;
                self.body(&s, &c.epilogue, &c.loads, &dims, std::slice::from_ref(&acc))?
            }
            KernelBody::Opaque(o) => {
                let mut g = Graph::new(&k.name);
                let mut args = Vec::new();
                let mut ins = Vec::new();
                for (i, b) in o.inputs.iter().enumerate() {
                    let ty = self
                        .program
                        .buffers
                        .get(b.index())
                        .ok_or_else(|| s.err(format!("{b} is not a buffer")))?
                        .ty
                        .clone();
                    ins.push(g.add_input(&format!("in{i}"), ty).map_err(|e| s.err(e.to_string()))?);
                    args.push(self.read(&s, *b)?);
                }
                let regions = o
                    .regions
                    .iter()
                    .map(|t| oar_ir::text::parse_graph(t).map_err(|e| s.err(format!("region: {e}"))))
                    .collect::<Res<Vec<_>>>()?;
                let outs = g
                    .add_region_op(o.op.clone(), &ins, regions)
                    .map_err(|e| s.err(e.to_string()))?;
                for (i, v) in outs.iter().enumerate() {
                    g.add_output(&format!("out{i}"), *v).map_err(|e| s.err(e.to_string()))?;
                }
                let interp = Interp {
                    weights: self.weights,
                    max_while_iterations: crate::DEFAULT_MAX_WHILE_ITERATIONS,
                };
                let results = interp.eval(&g, &args, self.binds.clone())?;
                if results.len() != k.outputs.len() {
                    return Err(s.err(format!("{} results for {} outputs", results.len(), k.outputs.len())));
                }
                for (b, v) in k.outputs.iter().zip(results) {
                    self.write(&s, *b, v)?;
                }
                return Ok(());
            }
        };
        match k.outputs.as_slice() {
            [b] => self.write(&s, *b, out),
            _ => Err(s.err("a loop or contraction kernel writes exactly one buffer")),
        }
    }
}

/// The bits of `v` read as `to` (f32 ↔ i32, f64 ↔ i64).
fn bitcast(s: &Site, v: &Value, to: DType) -> Res<Value> {
    let data = match (&v.data, v.dtype, to) {
        (Data::F(a), DType::F32, DType::I32) => Data::I(a.mapv(|x| (x as f32).to_bits() as i32 as i64)),
        (Data::I(a), DType::I32, DType::F32) => Data::F(a.mapv(|x| f32::from_bits(x as i32 as u32) as f64)),
        (Data::F(a), DType::F64, DType::I64) => Data::I(a.mapv(|x| x.to_bits() as i64)),
        (Data::I(a), DType::I64, DType::F64) => Data::F(a.mapv(|x| f64::from_bits(x as u64))),
        _ => return Err(s.err(format!("bitcast from {} to {to}", v.dtype))),
    };
    Ok(Value { dtype: to, data })
}

/// `a·b + c` rounded once in `dtype` (f32: `f32::mul_add`, the correctly rounded `fmaf`).
fn mul_add(s: &Site, [a, b, c]: [&Value; 3], dtype: DType) -> Res<Value> {
    if [a, b, c].iter().any(|v| v.dtype != dtype) || !matches!(dtype, DType::F32 | DType::F64) {
        return Err(s.err(format!(
            "muladd of {}, {}, {} giving {dtype}",
            a.dtype, b.dtype, c.dtype
        )));
    }
    let (x, y, z) = (a.as_f(s, "muladd")?, b.as_f(s, "muladd")?, c.as_f(s, "muladd")?);
    let shape = broadcast_dims(s, &broadcast_dims(s, x.shape(), y.shape())?, z.shape())?;
    let (x, y, z) = (view_as(s, x, &shape)?, view_as(s, y, &shape)?, view_as(s, z, &shape)?);
    let out = Zip::from(&x).and(&y).and(&z).map_collect(|&p, &q, &r| {
        if dtype == DType::F32 {
            (p as f32).mul_add(q as f32, r as f32) as f64
        } else {
            p.mul_add(q, r)
        }
    });
    Ok(Value::float(dtype, out))
}

/// `v << n` (`left`) or `v >> n` (arithmetic), in its integer dtype.
fn shift(s: &Site, v: &Value, n: u32, left: bool) -> Res<Value> {
    let a = v.as_i(s, "shift operand")?;
    let bits = match v.dtype {
        DType::I32 => 32,
        DType::I64 => 64,
        d => return Err(s.err(format!("shift of {d}"))),
    };
    if n >= bits {
        return Err(s.err(format!("shift by {n} of a {bits}-bit integer")));
    }
    let out = a.mapv(|x| match (bits, left) {
        (32, true) => ((x as i32) << n) as i64,
        (32, false) => ((x as i32) >> n) as i64,
        (_, true) => x << n,
        _ => x >> n,
    });
    Ok(v.with(Data::I(out)))
}

/// `v` with `n` trailing axes of size 1 (a stage result seen from inner loops).
fn unit_axes(s: &Site, v: &Value, n: usize) -> Res<Value> {
    let shape: Vec<usize> = v.shape().iter().copied().chain(std::iter::repeat_n(1, n)).collect();
    let to = Reshape {
        shape: shape.iter().map(|&d| Dim::Static(d)).collect(),
    };
    eval_one(s, &to, &[v])
}

/// A 0-d value of `dtype` holding `c`.
fn constant(dtype: DType, c: f64) -> Value {
    let d = IxDyn(&[]);
    let data = if dtype.is_float() {
        Data::F(ArrayD::from_elem(d, c))
    } else if dtype == DType::Bool {
        Data::B(ArrayD::from_elem(d, c != 0.0))
    } else {
        Data::I(ArrayD::from_elem(d, c as i64))
    };
    Value { dtype, data }
}

/// Run kernel `index` of `program` alone, for a compiled backend that delegates the kernels it
/// does not generate code for (opaque ops, unusual dtypes): `read(b)` gives the current
/// contents of each buffer the kernel reads; the results come back one per `kernel.outputs`.
/// `weights` are what `cond`/`while` regions read by name.
pub fn run_kernel(
    program: &KernelProgram,
    index: usize,
    weights: &Weights,
    read: &mut dyn FnMut(BufferId) -> Result<TensorData, BackendError>,
) -> Result<Vec<TensorData>, BackendError> {
    let k = program.kernels.get(index).ok_or_else(|| {
        site("run_kernel", &program.name).err(format!("no kernel {index} ({} kernels)", program.kernels.len()))
    })?;
    let (reads, mut feeds) = (k.reads(), BTreeMap::new());
    let mut buffers = Vec::with_capacity(program.buffers.len());
    for (i, b) in program.buffers.iter().enumerate() {
        let id = BufferId(i as u32);
        let kind = if reads.contains(&id) {
            feeds.insert(id.to_string(), read(id)?);
            BufferKind::Input { name: id.to_string() }
        } else if k.outputs.contains(&id) {
            BufferKind::Output
        } else {
            BufferKind::Temp // neither read nor written: never touched
        };
        buffers.push(Buffer {
            kind,
            ty: b.ty.clone(),
            value: b.value.clone(),
        });
    }
    let one = KernelProgram {
        name: k.name.clone(),
        buffers,
        kernels: vec![k.clone()],
        outputs: k.outputs.iter().map(|id| (id.to_string(), *id)).collect(),
    };
    Ok(run_kernel_program(&one, weights, &feeds)?
        .into_iter()
        .map(|(_, t)| t)
        .collect())
}
