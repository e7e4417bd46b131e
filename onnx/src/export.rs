//! oar → ONNX (opset 18): one or a few ONNX nodes per oar op; params become initializers.
//! An oar value is named by the ONNX value that computes it (no `Identity` per value); a graph
//! output gets one `Identity` to carry its name. `min(max(x, lo), hi)` with scalar constant
//! bounds is written as `Clip` and `max(x, 0)` as `Relu` (how PyTorch writes relu6 and relu),
//! which onnxruntime fuses into the convolution before them.
//!
//! An op with an export entry in its family's mapping table (`table.rs`: the writer sits next to
//! the op's importer, e.g. `cumsum` beside `CumSum` in `ops_vision.rs`) is written by it;
//! primitives without one map onto their ONNX equivalents here; every other composite — or one
//! whose writer declines its attributes (training-mode batch_norm, circular padding) — is
//! exported as its decomposition. Primitives ONNX has no match for (random, scatter, control
//! flow) are an [`OnnxError::Export`].

use crate::error::OnnxError;
use crate::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
    attribute_proto::AttributeType,
    tensor_shape_proto::{Dimension, dimension},
    type_proto,
};
use crate::tensor::{dtype_to_onnx, tensor_to_proto};
use oar_ir::file::Model;
use oar_ir::ops::{
    ArgReduce, Broadcast, Cast, Concat, Conv, Gather, Input, Iota, Pad, Param, Permute, Reduce, Reshape, Slice,
};
use oar_ir::ops::{ArgReduceOp, BinaryOp, ReduceOp, UnaryOp};
use oar_ir::{Dim, Graph, Op, TensorData, TensorType, ValueId};
use prost::Message;
use std::collections::HashMap;
use std::path::Path;

/// The opset exported models import.
pub const EXPORT_OPSET: i64 = 18;

/// Write `model` as an `.onnx` file.
pub fn save(model: &Model, path: &Path) -> Result<(), OnnxError> {
    let bytes = to_bytes(model)?;
    oar_ir::file::write_atomically(path, &bytes).map_err(|source| OnnxError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// What an export writer gives: the names of the op's outputs, or `None` when these attributes
/// or types have no ONNX form (a composite is then exported as its decomposition).
pub(crate) type Written = Result<Option<Vec<String>>, OnnxError>;

/// One output, written.
pub(crate) fn written(out: String) -> Written {
    Ok(Some(vec![out]))
}

/// True if `op` on operands of `types` has a writer that accepts it (tried on a scratch exporter).
fn writes_natively(g: &Graph, op: &Op, types: &[TensorType]) -> bool {
    let Some(write) = crate::table::exporter(op.name()) else {
        return false;
    };
    let mut scratch = Exporter::new(g);
    let ins: Vec<String> = (0..types.len()).map(|i| format!("x{i}")).collect();
    matches!(write(&mut scratch, op, &ins, types), Ok(Some(_)))
}

/// `graph` with every composite that has no ONNX writer (for its attributes) replaced by its
/// decomposition, repeatedly (a decomposition may hold composites of its own).
fn lower_for_onnx(graph: &Graph) -> Result<Graph, OnnxError> {
    let mut g = graph.clone();
    let ir = |e: oar_ir::IrError| OnnxError::Export(e.to_string());
    // Each round removes one level of composites; decompositions nest only a few deep. A node
    // found to have a writer is not tried again in later rounds.
    let mut native = std::collections::HashSet::new();
    for _ in 0..16 {
        let mut changed = false;
        for node in g.topo_order() {
            let n = g.node(node);
            let Op::Composite(c) = &n.op else { continue };
            if native.contains(&node) {
                continue;
            }
            let inputs = n.inputs().to_vec();
            let types: Vec<TensorType> = inputs.iter().map(|&v| g.value_type(v).clone()).collect();
            if writes_natively(&g, &n.op, &types) {
                native.insert(node);
                continue;
            }
            let c = c.clone();
            let outs = oar_ir::decompose::decompose(&c, &mut g, &inputs).map_err(ir)?;
            for (i, v) in outs.into_iter().enumerate() {
                g.replace_all_uses(ValueId { node, output: i as u32 }, v).map_err(ir)?;
            }
            g.remove_node(node).map_err(ir)?;
            changed = true;
        }
        if !changed {
            return Ok(g);
        }
    }
    Err(OnnxError::Export("composites nest too deeply to decompose".into()))
}

/// Encode `model` as ONNX protobuf bytes.
pub fn to_bytes(model: &Model) -> Result<Vec<u8>, OnnxError> {
    let lowered = lower_for_onnx(&model.graph)?;
    let mut ex = Exporter::new(&lowered);
    let graph = ex.graph(model)?;
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(EXPORT_OPSET),
        }],
        producer_name: Some("oar".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        graph: Some(graph),
        ..Default::default()
    };
    Ok(m.encode_to_vec())
}

/// The ONNX graph being written: nodes, initializers and fresh names. Export writers
/// (`table.rs`) add nodes through [`Exporter::emit`] and friends.
pub(crate) struct Exporter<'a> {
    g: &'a Graph,
    nodes: Vec<NodeProto>,
    inits: Vec<crate::proto::TensorProto>,
    fresh: usize,
    /// The ONNX name of each oar value written so far.
    names: HashMap<ValueId, String>,
}

/// The value of `v` when it is a rank-0 constant.
fn scalar_constant(g: &Graph, v: ValueId) -> Option<f64> {
    match &g.node(v.node).op {
        Op::Constant(t) if t.shape().is_empty() => t.to_f64_vec().first().copied(),
        _ => None,
    }
}

/// `(x, bound)` when `node` is `max` or `min` (`op`) of `x` and a rank-0 constant `bound`, and
/// the result has `x`'s type (the constant does not broadcast `x`).
fn with_scalar_bound(g: &Graph, node: oar_ir::NodeId, op: BinaryOp) -> Option<(ValueId, ValueId)> {
    let n = g.node(node);
    if n.op != Op::Binary(op) {
        return None;
    }
    let &[a, b] = n.inputs() else { return None };
    let (x, c) = match (scalar_constant(g, a), scalar_constant(g, b)) {
        (_, Some(_)) => (a, b),
        (Some(_), None) => (b, a),
        (None, None) => return None,
    };
    (g.value_type(x) == g.value_type(ValueId::first(node))).then_some((x, c))
}

/// How a `max`/`min` node is written when it is not a plain ONNX `Max`/`Min`.
enum Bound {
    /// `Clip(x, lo, hi)`: the `min` of `min(max(x, lo), hi)`.
    Clip { x: ValueId, lo: ValueId, hi: ValueId },
    /// `Relu(x)`: `max(x, 0)`.
    Relu(ValueId),
    /// The `max` inside a `Clip`: written by it, not on its own.
    InClip,
}

/// The `max`/`min` nodes of `g` written as `Clip` or `Relu`. A `max` joins a `Clip` only when
/// the `min` is its one reader and it is not a graph output.
fn bounds(g: &Graph) -> HashMap<oar_ir::NodeId, Bound> {
    let mut out = HashMap::new();
    let is_output = |v: ValueId| g.outputs().iter().any(|o| o.value == v);
    for node in g.topo_order() {
        if let Some((inner, hi)) = with_scalar_bound(g, node, BinaryOp::Min)
            && let Some((x, lo)) = with_scalar_bound(g, inner.node, BinaryOp::Max)
            && inner.output == 0
            && g.users(inner).len() == 1
            && !is_output(inner)
        {
            out.insert(inner.node, Bound::InClip);
            out.insert(node, Bound::Clip { x, lo, hi });
            continue;
        }
        if let Some((x, c)) = with_scalar_bound(g, node, BinaryOp::Max)
            && g.value_type(x).dtype.is_float()
            && scalar_constant(g, c) == Some(0.0)
        {
            out.insert(node, Bound::Relu(x));
        }
    }
    out
}

fn value_info(name: &str, t: &TensorType) -> ValueInfoProto {
    let dim = t
        .shape
        .0
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Static(n) => dimension::Value::DimValue(*n as i64),
                Dim::Sym(s) => dimension::Value::DimParam(s.clone()),
                Dim::Expr(e) => dimension::Value::DimParam(e.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(dtype_to_onnx(t.dtype)),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn ints(name: &str, v: &[usize]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.iter().map(|&x| x as i64).collect(),
        ..Default::default()
    }
}
pub(crate) fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}
pub(crate) fn float(name: &str, v: f64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(v as f32),
        ..Default::default()
    }
}

pub(crate) fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(v.as_bytes().to_vec()),
        ..Default::default()
    }
}

impl<'a> Exporter<'a> {
    fn new(g: &'a Graph) -> Self {
        Exporter {
            g,
            nodes: Vec::new(),
            inits: Vec::new(),
            fresh: 0,
            names: HashMap::new(),
        }
    }
    /// A node of type `op`; the name of its output.
    pub(crate) fn emit(&mut self, op: &str, ins: Vec<String>, attrs: Vec<AttributeProto>) -> String {
        self.fresh += 1;
        let out = format!("t{}", self.fresh);
        self.emit_to(op, ins, attrs, out.clone());
        out
    }
    /// A node with `n` outputs; their names.
    pub(crate) fn emit_n(&mut self, op: &str, ins: Vec<String>, attrs: Vec<AttributeProto>, n: usize) -> Vec<String> {
        let outs: Vec<String> = (0..n)
            .map(|_| {
                self.fresh += 1;
                format!("t{}", self.fresh)
            })
            .collect();
        self.nodes.push(NodeProto {
            input: ins,
            output: outs.clone(),
            name: Some(format!("n{}", self.nodes.len())),
            op_type: Some(op.into()),
            attribute: attrs,
            ..Default::default()
        });
        outs
    }
    fn emit_to(&mut self, op: &str, ins: Vec<String>, attrs: Vec<AttributeProto>, out: String) {
        self.nodes.push(NodeProto {
            input: ins,
            output: vec![out],
            name: Some(format!("n{}", self.nodes.len())),
            op_type: Some(op.into()),
            attribute: attrs,
            ..Default::default()
        });
    }
    /// Record `outs` as the ONNX names of node `id`'s outputs.
    fn outputs_to(&mut self, id: oar_ir::NodeId, outs: Vec<String>) {
        for (i, out) in outs.into_iter().enumerate() {
            let v = ValueId {
                node: id,
                output: i as u32,
            };
            self.names.insert(v, out);
        }
    }
    /// The ONNX name of the oar value `v` (written before its readers, in topological order).
    fn name_of(&self, v: ValueId) -> Result<String, OnnxError> {
        self.names
            .get(&v)
            .cloned()
            .ok_or_else(|| OnnxError::Export(format!("value {v:?} is read before it is written")))
    }
    /// An initializer holding `t`; its name.
    pub(crate) fn constant(&mut self, t: TensorData) -> String {
        self.fresh += 1;
        let name = format!("c{}", self.fresh);
        self.inits.push(tensor_to_proto(&name, &t));
        name
    }
    /// A 1-D i64 initializer; its name.
    pub(crate) fn i64s(&mut self, v: &[i64]) -> String {
        self.constant(TensorData::from_vec(vec![v.len()], v.to_vec()).expect("1-D"))
    }
    /// `dims` as ONNX shape values (one symbolic dim becomes -1).
    pub(crate) fn static_dims(&self, dims: &[Dim], what: &str) -> Result<Vec<i64>, OnnxError> {
        let sym = dims.iter().filter(|d| d.as_static().is_none()).count();
        if sym > 1 {
            return Err(OnnxError::Export(format!(
                "{what} with more than one symbolic dim: {dims:?}"
            )));
        }
        Ok(dims.iter().map(|d| d.as_static().map_or(-1, |n| n as i64)).collect())
    }

    fn graph(&mut self, model: &Model) -> Result<GraphProto, OnnxError> {
        let g = self.g;
        let bounds = bounds(g);
        let mut inputs = Vec::new();
        for id in g.topo_order() {
            let node = g.node(id);
            match (&node.op, bounds.get(&id)) {
                (Op::Input(Input { name, ty }), _) => {
                    inputs.push(value_info(name, ty));
                    self.outputs_to(id, vec![name.clone()]);
                }
                (Op::Param(Param { name, .. }), _) => {
                    let w = model
                        .weights
                        .get(name)
                        .ok_or_else(|| OnnxError::Export(format!("param `{name}` has no weight")))?;
                    self.inits.push(tensor_to_proto(name, w));
                    self.outputs_to(id, vec![name.clone()]);
                }
                (_, Some(Bound::InClip)) => {}
                (_, Some(Bound::Clip { x, lo, hi })) => {
                    let ins = vec![self.name_of(*x)?, self.name_of(*lo)?, self.name_of(*hi)?];
                    let y = self.emit("Clip", ins, vec![]);
                    self.outputs_to(id, vec![y]);
                }
                (_, Some(Bound::Relu(x))) => {
                    let y = self.emit("Relu", vec![self.name_of(*x)?], vec![]);
                    self.outputs_to(id, vec![y]);
                }
                (op, None) => {
                    let ins = node
                        .inputs()
                        .iter()
                        .map(|&v| self.name_of(v))
                        .collect::<Result<Vec<_>, _>>()?;
                    let types: Vec<TensorType> = node.inputs().iter().map(|&v| g.value_type(v).clone()).collect();
                    let outs = match crate::table::exporter(op.name()) {
                        Some(write) => write(self, op, &ins, &types)?.ok_or_else(|| {
                            OnnxError::Export(format!("`{}` with these attributes has no ONNX form", op.name()))
                        })?,
                        None => vec![self.op(op, ins, g, node.inputs())?],
                    };
                    self.outputs_to(id, outs);
                }
            }
        }
        let mut outputs = Vec::new();
        for o in g.outputs() {
            let v = self.name_of(o.value)?;
            self.emit_to("Identity", vec![v], vec![], o.name.clone());
            outputs.push(value_info(&o.name, g.value_type(o.value)));
        }
        Ok(GraphProto {
            node: std::mem::take(&mut self.nodes),
            name: Some(g.name().to_string()),
            initializer: std::mem::take(&mut self.inits),
            input: inputs,
            output: outputs,
            ..Default::default()
        })
    }

    /// Emit the ONNX nodes of one oar op; returns the name of its (first) output.
    fn op(&mut self, op: &Op, ins: Vec<String>, g: &Graph, vins: &[ValueId]) -> Result<String, OnnxError> {
        let ty = |i: usize| g.value_type(vins[i]).clone();
        Ok(match op {
            Op::Constant(t) => self.constant(t.clone()),
            Op::Unary(u) => {
                let name = match u {
                    UnaryOp::Neg => "Neg",
                    UnaryOp::Abs => "Abs",
                    UnaryOp::Exp => "Exp",
                    UnaryOp::Log => "Log",
                    UnaryOp::Sqrt | UnaryOp::Rsqrt => "Sqrt",
                    UnaryOp::Recip => "Reciprocal",
                    UnaryOp::Sin => "Sin",
                    UnaryOp::Cos => "Cos",
                    UnaryOp::Tanh => "Tanh",
                    UnaryOp::Erf => "Erf",
                    UnaryOp::Floor => "Floor",
                    UnaryOp::Ceil => "Ceil",
                    UnaryOp::Round => "Round",
                    UnaryOp::Sign => "Sign",
                    UnaryOp::Not => "Not",
                };
                let y = self.emit(name, ins, vec![]);
                if *u == UnaryOp::Rsqrt {
                    self.emit("Reciprocal", vec![y], vec![])
                } else {
                    y
                }
            }
            Op::Binary(b) => {
                let name = match b {
                    BinaryOp::Add => "Add",
                    BinaryOp::Sub => "Sub",
                    BinaryOp::Mul => "Mul",
                    BinaryOp::Div => "Div",
                    BinaryOp::Pow => "Pow",
                    BinaryOp::Max => "Max",
                    BinaryOp::Min => "Min",
                    BinaryOp::Rem if !ty(0).dtype.is_float() => "Mod",
                    BinaryOp::Rem => {
                        // a - floor(a / b) * b: the remainder with the divisor's sign.
                        let q = self.emit("Div", ins.clone(), vec![]);
                        let f = self.emit("Floor", vec![q], vec![]);
                        let m = self.emit("Mul", vec![f, ins[1].clone()], vec![]);
                        return Ok(self.emit("Sub", vec![ins[0].clone(), m], vec![]));
                    }
                    BinaryOp::Eq | BinaryOp::Ne => "Equal",
                    BinaryOp::Lt => "Less",
                    BinaryOp::Le => "LessOrEqual",
                    BinaryOp::Gt => "Greater",
                    BinaryOp::Ge => "GreaterOrEqual",
                    BinaryOp::And | BinaryOp::Or | BinaryOp::Xor if ty(0).dtype != oar_ir::DType::Bool => {
                        return Err(OnnxError::Export(format!("bitwise {} on integers", b.name())));
                    }
                    BinaryOp::And => "And",
                    BinaryOp::Or => "Or",
                    BinaryOp::Xor => "Xor",
                };
                let y = self.emit(name, ins, vec![]);
                if *b == BinaryOp::Ne {
                    self.emit("Not", vec![y], vec![])
                } else {
                    y
                }
            }
            Op::Where => self.emit("Where", ins, vec![]),
            Op::Cast(Cast { to }) => self.emit("Cast", ins, vec![int("to", dtype_to_onnx(*to) as i64)]),
            Op::Reduce(Reduce { op, axes, keepdim }) => {
                let name = match op {
                    ReduceOp::Sum => "ReduceSum",
                    ReduceOp::Max => "ReduceMax",
                    ReduceOp::Min => "ReduceMin",
                    ReduceOp::Prod => "ReduceProd",
                    ReduceOp::Mean => "ReduceMean",
                };
                let a = self.i64s(&axes.iter().map(|&a| a as i64).collect::<Vec<_>>());
                self.emit(name, vec![ins[0].clone(), a], vec![int("keepdims", *keepdim as i64)])
            }
            Op::ArgReduce(ArgReduce { op, axis, keepdim }) => {
                let name = if *op == ArgReduceOp::ArgMax { "ArgMax" } else { "ArgMin" };
                self.emit(
                    name,
                    ins,
                    vec![int("axis", *axis as i64), int("keepdims", *keepdim as i64)],
                )
            }
            Op::Reshape(Reshape { shape }) => {
                let s = self.static_dims(shape, "reshape")?;
                let s = self.i64s(&s);
                self.emit("Reshape", vec![ins[0].clone(), s], vec![])
            }
            Op::Permute(Permute { perm }) => self.emit("Transpose", ins, vec![ints("perm", perm)]),
            Op::Broadcast(Broadcast { shape }) => {
                let s: Vec<i64> = self
                    .static_dims(shape, "broadcast")?
                    .iter()
                    .map(|&d| d.max(1))
                    .collect();
                let s = self.i64s(&s);
                self.emit("Expand", vec![ins[0].clone(), s], vec![])
            }
            Op::Slice(Slice { ranges }) => {
                let starts: Vec<i64> = ranges.iter().map(|r| r.start).collect();
                let ends: Vec<i64> = ranges.iter().map(|r| r.end).collect();
                let steps: Vec<i64> = ranges.iter().map(|r| r.step).collect();
                let axes: Vec<i64> = (0..ranges.len() as i64).collect();
                let v = [&starts, &ends, &axes, &steps].map(|v| self.i64s(v));
                let [s, e, a, st] = v;
                self.emit("Slice", vec![ins[0].clone(), s, e, a, st], vec![])
            }
            Op::Pad(Pad { before, after, value }) => {
                let pads: Vec<i64> = before.iter().chain(after).map(|&p| p as i64).collect();
                let p = self.i64s(&pads);
                let c = self.constant(TensorData::from_f64_slice(ty(0).dtype, vec![], &[value.0]).expect("scalar"));
                self.emit("Pad", vec![ins[0].clone(), p, c], vec![])
            }
            Op::Concat(Concat { axis }) => self.emit("Concat", ins, vec![int("axis", *axis as i64)]),
            Op::Gather(Gather { axis }) => self.emit("Gather", ins, vec![int("axis", *axis as i64)]),
            Op::MatMul => self.emit("MatMul", ins, vec![]),
            Op::Iota(Iota { shape, axis, dtype }) => {
                // Range(0, n) along the axis, reshaped to broadcast there, expanded.
                let dims = shape
                    .iter()
                    .map(|d| d.as_static().map(|n| n as i64))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| OnnxError::Export(format!("iota of the symbolic shape {shape:?}")))?;
                let scalar = |ex: &mut Self, v: i64| ex.constant(TensorData::scalar(v));
                let (zero, n, one) = (scalar(self, 0), scalar(self, dims[*axis]), scalar(self, 1));
                let mut r = self.emit("Range", vec![zero, n, one], vec![]);
                if *dtype != oar_ir::DType::I64 {
                    r = self.emit("Cast", vec![r], vec![int("to", dtype_to_onnx(*dtype) as i64)]);
                }
                let line: Vec<i64> = (0..dims.len()).map(|a| if a == *axis { dims[a] } else { 1 }).collect();
                let line = self.i64s(&line);
                let r = self.emit("Reshape", vec![r, line], vec![]);
                let full = self.i64s(&dims);
                self.emit("Expand", vec![r, full], vec![])
            }
            Op::Conv(Conv {
                stride,
                pad_before,
                pad_after,
                dilation,
                groups,
            }) => {
                let pads: Vec<usize> = pad_before.iter().chain(pad_after).copied().collect();
                let attrs = vec![
                    ints("strides", stride),
                    ints("pads", &pads),
                    ints("dilations", dilation),
                    int("group", *groups as i64),
                ];
                self.emit("Conv", ins, attrs)
            }
            // Over a group of one a collective is the identity; ONNX has no collectives for
            // more ranks (export each rank's graph after the split instead).
            Op::Collective(c) if c.nranks == 1 => self.emit("Identity", ins, vec![]),
            Op::Collective(c) => {
                return Err(OnnxError::Export(format!(
                    "op `{}` communicates between {} processes (group {}), which ONNX cannot express",
                    c.kind.name(),
                    c.nranks,
                    c.group
                )));
            }
            other => {
                return Err(OnnxError::Export(format!(
                    "op `{}` has no ONNX equivalent here",
                    other.name()
                )));
            }
        })
    }
}
