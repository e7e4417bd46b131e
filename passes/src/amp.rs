//! Automatic mixed precision: which ops run in f16/bf16, which stay in f32, and the `amp` pass
//! that rewrites an f32 graph into a mixed one.
//!
//! One table ([`default_class`]) decides for eager `auto_cast` scopes (`oar::amp`) and for the
//! pass alike, through the same function ([`AmpConfig::plan`]), so tracing an `auto_cast`
//! scope and running the pass on the f32 trace give the same graph:
//!
//! | class | ops | inputs become |
//! |---|---|---|
//! | [`AmpClass::Low`] (allow list) | `matmul conv linear conv2d conv_transpose einsum sdpa lstm_seq gru_seq` | the low dtype |
//! | [`AmpClass::F32`] (deny list) | `exp log rsqrt recip pow reduce_sum reduce_mean reduce_prod softmax log_softmax cross_entropy batch_norm layer_norm group_norm instance_norm cumsum quantize_linear dequantize_linear fake_quant requantize` | f32 |
//! | [`AmpClass::Promote`] (the rest) | every other op on floats | the widest float operand's dtype (O1) or the low dtype (O2) |
//!
//! Not subject to AMP: graph boundaries (inputs, params, constants), `cast` itself, generators
//! (`iota`, `random`), control flow (its regions are rewritten on their own), optimizer
//! updates and the integer contractions (`matmul_integer`, `conv_integer`). An op with an f64
//! operand is left alone. In the promote rule a rank-0 operand does not widen the others (as
//! PyTorch's type promotion treats 0-d tensors): it is cast to their dtype.
//!
//! Levels (Paddle 2's `auto_cast(level=...)`): **O1** casts at the allow and deny lists and
//! lets the rest follow their inputs; **O2** ("pure" low precision, parameters stored in the
//! low dtype by `oar::amp::decorate`) runs everything but the deny list in the low dtype.
//! Custom allow and deny lists ([`AmpConfig::allow`], [`AmpConfig::deny`]) name ops by their
//! mnemonic and override the table.

use crate::{Pass, PassError};
use oar_ir::ops::{BinaryOp, ReduceOp, UnaryOp};
use oar_ir::{Composite, DType, Graph, IrError, NodeId, Op, ValueId};
use std::collections::{BTreeSet, HashMap};

/// How AMP treats an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AmpClass {
    /// Allow list: runs in the low dtype (f16/bf16); its float operands are cast to it.
    Low,
    /// Deny list: numerically sensitive, runs in f32; half operands are cast up.
    F32,
    /// Runs in its operands' widest float dtype (O1), or in the low dtype (O2).
    Promote,
}

/// An AMP level (Paddle's `O1` / `O2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AmpLevel {
    /// Allow-listed ops in low precision, deny-listed in f32, the rest follow their inputs.
    #[default]
    O1,
    /// Everything but the deny list in low precision (parameters kept in the low dtype, f32
    /// master weights in the optimizer).
    O2,
}

impl std::str::FromStr for AmpLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<AmpLevel, String> {
        match s.to_ascii_uppercase().as_str() {
            "O1" => Ok(AmpLevel::O1),
            "O2" => Ok(AmpLevel::O2),
            _ => Err(format!("unknown AMP level `{s}` (expected O1 or O2)")),
        }
    }
}

/// The table: how AMP treats `op` by default (`None`: not subject to AMP).
pub fn default_class(op: &Op) -> Option<AmpClass> {
    use AmpClass::*;
    use Composite as C;
    Some(match op {
        Op::Input(_) | Op::Param(_) | Op::Constant(_) | Op::Cast(_) | Op::Iota(_) | Op::Random(_) => return None,
        Op::Cond | Op::While => return None,
        Op::MatMul | Op::Conv(_) => Low,
        // Collectives move f32 (sums of half values would lose the low bits anyway).
        Op::Collective(_) => F32,
        Op::Unary(u) => match u {
            UnaryOp::Exp | UnaryOp::Log | UnaryOp::Rsqrt | UnaryOp::Recip => F32,
            _ => Promote,
        },
        Op::Binary(b) => match b {
            BinaryOp::Pow => F32,
            _ => Promote,
        },
        Op::Reduce(r) => match r.op {
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod => F32,
            _ => Promote,
        },
        Op::Where
        | Op::ArgReduce(_)
        | Op::Reshape(_)
        | Op::Permute(_)
        | Op::Broadcast(_)
        | Op::Slice(_)
        | Op::Pad(_)
        | Op::Concat(_)
        | Op::Gather(_)
        | Op::Scatter(_)
        | Op::Sort(_) => Promote,
        Op::Composite(c) => match c {
            C::Linear
            | C::Conv2d(_)
            | C::ConvTranspose(_)
            | C::Einsum(_)
            | C::ScaledDotProductAttention(_)
            | C::LstmSeq(_)
            | C::GruSeq(_) => Low,
            C::Softmax(_)
            | C::LogSoftmax(_)
            | C::CrossEntropy(_)
            | C::BatchNorm(_)
            | C::LayerNorm(_)
            | C::GroupNorm(_)
            | C::InstanceNorm(_)
            | C::CumSum(_)
            | C::QuantizeLinear(_)
            | C::DequantizeLinear(_)
            | C::FakeQuant(_)
            | C::Requantize(_) => F32,
            C::AdamUpdate(_) | C::ShapeOf | C::MatMulInteger | C::ConvInteger(_) => return None,
            C::ConvWeightGrad(_)
            | C::MaxPool2d(_)
            | C::MaxPool2dGrad(_)
            | C::AvgPool2d(_)
            | C::AdaptiveAvgPool2d(_)
            | C::AdaptiveMaxPool2d(_)
            | C::Resize(_)
            | C::Relu
            | C::Gelu(_)
            | C::Silu
            | C::Sigmoid
            | C::Dropout(_)
            | C::Embedding
            | C::LstmCell
            | C::GruCell
            | C::BorderPad(_)
            | C::TopK(_)
            | C::ArgSort(_)
            | C::Flip(_)
            | C::MaskedFill(_)
            | C::OneHot(_)
            | C::Trilu(_) => Promote,
        },
    })
}

/// What an AMP scope or the `amp` pass does: level, low dtype and custom lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AmpConfig {
    level: AmpLevel,
    dtype: DType,
    allow: BTreeSet<&'static str>,
    deny: BTreeSet<&'static str>,
}

impl AmpConfig {
    /// `level` with low dtype `dtype` (f16 or bf16) and the default lists.
    pub fn new(level: AmpLevel, dtype: DType) -> Result<AmpConfig, String> {
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Err(format!("the AMP dtype must be f16 or bf16, got {dtype}"));
        }
        Ok(AmpConfig {
            level,
            dtype,
            allow: BTreeSet::new(),
            deny: BTreeSet::new(),
        })
    }

    /// The level.
    pub fn level(&self) -> AmpLevel {
        self.level
    }

    /// The low dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Add ops (by mnemonic: `matmul`, `layer_norm`, `reduce_sum`) to the allow list: they
    /// run in the low dtype. An op named in both custom lists is an error.
    pub fn allow<S: AsRef<str>>(mut self, ops: impl IntoIterator<Item = S>) -> Result<AmpConfig, String> {
        for op in ops {
            let name = subject_mnemonic(op.as_ref())?;
            if self.deny.contains(name) {
                return Err(format!("op `{name}` is in both the custom allow and deny lists"));
            }
            self.allow.insert(name);
        }
        Ok(self)
    }

    /// Add ops (by mnemonic) to the deny list: they run in f32.
    pub fn deny<S: AsRef<str>>(mut self, ops: impl IntoIterator<Item = S>) -> Result<AmpConfig, String> {
        for op in ops {
            let name = subject_mnemonic(op.as_ref())?;
            if self.allow.contains(name) {
                return Err(format!("op `{name}` is in both the custom allow and deny lists"));
            }
            self.deny.insert(name);
        }
        Ok(self)
    }

    /// How this configuration treats `op` (custom lists first, then [`default_class`]).
    pub fn class(&self, op: &Op) -> Option<AmpClass> {
        let class = default_class(op)?;
        let name = op.name();
        Some(if self.allow.contains(name) {
            AmpClass::Low
        } else if self.deny.contains(name) {
            AmpClass::F32
        } else {
            class
        })
    }

    /// The dtype each operand of `op` is cast to before it runs (`None`: used as it is), from
    /// the operands' dtypes and ranks. Applying the plan and asking again gives no casts.
    pub fn plan(&self, op: &Op, operands: &[(DType, usize)]) -> Vec<Option<DType>> {
        let keep = vec![None; operands.len()];
        let Some(class) = self.class(op) else { return keep };
        let floats = || operands.iter().filter(|(d, _)| d.is_float());
        if floats().next().is_none() || floats().any(|(d, _)| *d == DType::F64) {
            return keep;
        }
        let target = match (class, self.level) {
            (AmpClass::Low, _) | (AmpClass::Promote, AmpLevel::O2) => self.dtype,
            (AmpClass::F32, _) => DType::F32,
            (AmpClass::Promote, AmpLevel::O1) => {
                // The widest dtype among operands with dimensions (rank-0 ones follow them,
                // unless every float operand is rank 0).
                let ranked: Vec<DType> = floats().filter(|(_, r)| *r > 0).map(|(d, _)| *d).collect();
                let pool: Vec<DType> = if ranked.is_empty() {
                    floats().map(|(d, _)| *d).collect()
                } else {
                    ranked
                };
                let first = pool[0];
                if pool.iter().all(|d| *d == first) {
                    first
                } else {
                    DType::F32
                }
            }
        };
        operands
            .iter()
            .map(|(d, _)| (d.is_float() && *d != target).then_some(target))
            .collect()
    }
}

/// `name` if it is an op AMP can be told about (as the static string of the op table).
fn subject_mnemonic(name: &str) -> Result<&'static str, String> {
    let known = Op::all_mnemonics();
    let Some(&m) = known.iter().find(|m| **m == name) else {
        return Err(format!("unknown op `{name}` in an AMP list"));
    };
    const NOT_SUBJECT: &[&str] = &[
        "input",
        "param",
        "constant",
        "cast",
        "iota",
        "random",
        "cond",
        "while",
        "adam_update",
        "shape_of",
    ];
    if NOT_SUBJECT.contains(&m) {
        return Err(format!("op `{m}` is not subject to AMP and cannot be listed"));
    }
    Ok(m)
}

/// The `amp` pass: rewrite a graph by an [`AmpConfig`] — casts inserted where the table says,
/// cast chains that round-trip exactly removed (`cast(cast(x: bf16 → f32) → bf16)` is `x`),
/// casts of one value to one dtype shared, and the graph's outputs cast back to their dtypes
/// (the signature does not change). Regions are rewritten the same way, each keeping its own
/// signature. Running it on its own output changes nothing; on a traced `auto_cast` scope it
/// gives what it gives on the f32 trace of the same code.
#[derive(Clone, Debug)]
pub struct Amp {
    config: AmpConfig,
}

impl Amp {
    /// The pass for `config`.
    pub fn new(config: AmpConfig) -> Amp {
        Amp { config }
    }

    /// The pass by its registry argument: `bf16`, `f16`, `bf16:O2`.
    pub fn parse(arg: &str) -> Result<Amp, PassError> {
        let bad = |detail: String| PassError::Config {
            pass: "amp".into(),
            detail,
        };
        let (dtype, level) = arg.split_once(':').unwrap_or((arg, "O1"));
        let dtype = match dtype {
            "bf16" => DType::BF16,
            "f16" => DType::F16,
            other => return Err(bad(format!("unknown precision `{other}` (expected bf16 or f16)"))),
        };
        let level = level.parse().map_err(bad)?;
        Ok(Amp::new(AmpConfig::new(level, dtype).map_err(bad)?))
    }

    /// The configuration.
    pub fn config(&self) -> &AmpConfig {
        &self.config
    }
}

impl Default for Amp {
    /// O1 with bf16.
    fn default() -> Amp {
        Amp::new(AmpConfig::new(AmpLevel::O1, DType::BF16).expect("bf16 is a low dtype"))
    }
}

impl Pass for Amp {
    fn name(&self) -> &'static str {
        "amp"
    }

    fn description(&self) -> &'static str {
        "mixed precision (amp=bf16|f16[:O2]): allow-listed ops in f16/bf16, deny-listed in f32, casts at the boundaries"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let before = oar_ir::text::print_graph(graph);
        let out = rebuild(&self.config, graph).map_err(|e| PassError::ir(self.name(), e))?;
        let changed = oar_ir::text::print_graph(&out) != before;
        if changed {
            *graph = out;
        }
        Ok(changed)
    }
}

/// The new graph under construction, with its casts shared.
struct Builder {
    out: Graph,
    /// `(value, dtype)` → the cast of `value` to `dtype` already made.
    casts: HashMap<(ValueId, DType), ValueId>,
}

/// True if every `narrow` value survives a trip through `wide` unchanged.
fn exact_through(narrow: DType, wide: DType) -> bool {
    match narrow {
        DType::F16 | DType::BF16 => matches!(wide, DType::F32 | DType::F64),
        DType::F32 => wide == DType::F64,
        _ => false,
    }
}

/// An old value in the new graph: a value there (never a cast), to be cast through `casts` in
/// order when an op uses it. The old graph's casts and the ones the table asks for become such
/// pending casts, made only when an op uses the value — each just before its first user,
/// whatever order the old graph had them in (a traced scope creates them as ops run, the pass
/// as it meets their users): both give one graph.
#[derive(Clone)]
struct Pending {
    value: ValueId,
    casts: Vec<DType>,
}

impl Pending {
    /// The dtype the value has once cast.
    fn dtype(&self, g: &Graph) -> DType {
        self.casts.last().copied().unwrap_or(g.value_type(self.value).dtype)
    }

    fn then(mut self, dtype: DType) -> Pending {
        self.casts.push(dtype);
        self
    }
}

impl Builder {
    /// `p` made: its casts with no-op steps and exact round trips (`bf16 → f32 → bf16`) left
    /// out, each remaining cast shared with every other use of it.
    fn resolve(&mut self, p: &Pending) -> Result<ValueId, IrError> {
        let mut path = vec![self.out.value_type(p.value).dtype];
        for &d in &p.casts {
            let top = path[path.len() - 1];
            if d == top {
                continue;
            }
            if path.len() >= 2 && path[path.len() - 2] == d && exact_through(d, top) {
                path.pop();
            } else {
                path.push(d);
            }
        }
        let mut v = p.value;
        for &d in &path[1..] {
            v = match self.casts.get(&(v, d)) {
                Some(&c) => c,
                None => {
                    let c = self.out.add_op1(Op::Cast(oar_ir::ops::Cast { to: d }), &[v])?;
                    self.casts.insert((v, d), c);
                    c
                }
            };
        }
        Ok(v)
    }
}

/// The nodes of `graph` in a canonical order: inputs, then a depth-first post-order from the
/// outputs (operands in order), then whatever no output reaches, in topological order.
fn canonical_order(graph: &Graph) -> Vec<NodeId> {
    let mut order: Vec<NodeId> = graph.inputs().to_vec();
    let mut seen: std::collections::HashSet<NodeId> = order.iter().copied().collect();
    let roots: Vec<NodeId> = graph
        .outputs()
        .iter()
        .map(|o| o.value.node)
        .chain(graph.topo_order())
        .collect();
    for root in roots {
        if seen.contains(&root) {
            continue;
        }
        // Iterative post-order: (node, next operand to visit).
        let mut stack = vec![(root, 0usize)];
        seen.insert(root);
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            let inputs = graph.node(node).inputs();
            if let Some(v) = inputs.get(*next) {
                *next += 1;
                if seen.insert(v.node) {
                    stack.push((v.node, 0));
                }
            } else {
                order.push(node);
                stack.pop();
            }
        }
    }
    order
}

/// `graph` rewritten by `config` (see [`Amp`]), its nodes in [`canonical_order`].
fn rebuild(config: &AmpConfig, graph: &Graph) -> Result<Graph, IrError> {
    let mut b = Builder {
        out: Graph::new(graph.name()),
        casts: HashMap::new(),
    };
    let mut map: HashMap<NodeId, Vec<Pending>> = HashMap::new();
    let plain = |value| Pending {
        value,
        casts: Vec::new(),
    };
    for &id in graph.inputs() {
        if let Op::Input(i) = &graph.node(id).op {
            map.insert(id, vec![plain(b.out.add_input(&i.name, i.ty.clone())?)]);
        }
    }
    for id in canonical_order(graph) {
        if map.contains_key(&id) {
            continue;
        }
        let n = graph.node(id);
        let pending: Vec<Pending> = n
            .inputs()
            .iter()
            .map(|v| map[&v.node][v.output as usize].clone())
            .collect();
        let values = match &n.op {
            Op::Constant(t) => vec![plain(b.out.add_constant(t.clone()))],
            Op::Cast(c) => vec![pending[0].clone().then(c.to)],
            op => {
                let types: Vec<(DType, usize)> = pending
                    .iter()
                    .map(|p| (p.dtype(&b.out), b.out.value_type(p.value).shape.rank()))
                    .collect();
                let operands = pending
                    .into_iter()
                    .zip(config.plan(op, &types))
                    .map(|(p, to)| {
                        b.resolve(&match to {
                            Some(d) => p.then(d),
                            None => p,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let regions = n
                    .regions
                    .iter()
                    .map(|r| rebuild(config, r))
                    .collect::<Result<Vec<_>, _>>()?;
                let outs = b.out.add_region_op(op.clone(), &operands, regions)?;
                outs.into_iter().map(plain).collect()
            }
        };
        map.insert(id, values);
    }
    for o in graph.outputs() {
        let p = map[&o.value.node][o.value.output as usize].clone();
        let v = b.resolve(&p.then(graph.value_type(o.value).dtype))?;
        b.out.add_output(&o.name, v)?;
    }
    Ok(b.out)
}
