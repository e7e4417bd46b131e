//! oar → ONNX (opset 18): one or a few ONNX nodes per oar op; params become initializers.
//!
//! Composites map back onto their ONNX ops (linear → MatMul+Add, conv2d → Conv, batch_norm →
//! BatchNormalization, ...); primitives onto their ONNX equivalents. Ops ONNX has no match for
//! (random, scatter, control flow, training-mode composites) are an [`OnnxError::Export`].

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
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, ArgReduce, AvgPool2d, BatchNorm, Broadcast, Cast, Concat, Conv, Conv2d,
    Dropout, Gather, Gelu, Input, LayerNorm, LogSoftmax, MaxPool2d, Pad, Param, Permute, Reduce, Reshape, Slice,
    Softmax,
};
use oar_ir::ops::{ArgReduceOp, BinaryOp, ReduceOp, UnaryOp};
use oar_ir::ops::{BorderPad, CumSum, Einsum, InstanceNorm, OneHot, PadMode, Resize, Sort, TopK};
use oar_ir::{Composite, Dim, Graph, Op, TensorData, TensorType, ValueId};
use prost::Message;
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

/// True for the composites ONNX (opset 18) has no op for: they are exported as their
/// decompositions.
fn exported_decomposed(c: &Composite) -> bool {
    matches!(
        c,
        Composite::GroupNorm(_)
            | Composite::MaskedFill(_)
            | Composite::ArgSort(_)
            | Composite::BorderPad(BorderPad {
                mode: PadMode::Circular,
                ..
            })
    )
}

/// `graph` with every composite ONNX has no op for replaced by its decomposition.
fn lower_for_onnx(graph: &Graph) -> Result<Graph, OnnxError> {
    let mut g = graph.clone();
    let ir = |e: oar_ir::IrError| OnnxError::Export(e.to_string());
    for node in g.topo_order() {
        let (c, inputs) = match &g.node(node).op {
            Op::Composite(c) if exported_decomposed(c) => (c.clone(), g.node(node).inputs().to_vec()),
            _ => continue,
        };
        let outs = oar_ir::decompose::decompose(&c, &mut g, &inputs).map_err(ir)?;
        for (i, v) in outs.into_iter().enumerate() {
            g.replace_all_uses(ValueId { node, output: i as u32 }, v).map_err(ir)?;
        }
        g.remove_node(node).map_err(ir)?;
    }
    Ok(g)
}

/// Encode `model` as ONNX protobuf bytes.
pub fn to_bytes(model: &Model) -> Result<Vec<u8>, OnnxError> {
    let lowered = lower_for_onnx(&model.graph)?;
    let mut ex = Exporter {
        g: &lowered,
        nodes: Vec::new(),
        inits: Vec::new(),
        fresh: 0,
    };
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

struct Exporter<'a> {
    g: &'a Graph,
    nodes: Vec<NodeProto>,
    inits: Vec<crate::proto::TensorProto>,
    fresh: usize,
}

fn name_of(v: ValueId) -> String {
    format!("v{}_{}", v.node.index(), v.output)
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

fn ints(name: &str, v: &[usize]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.iter().map(|&x| x as i64).collect(),
        ..Default::default()
    }
}
fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}
fn float(name: &str, v: f64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(v as f32),
        ..Default::default()
    }
}

fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(v.as_bytes().to_vec()),
        ..Default::default()
    }
}

impl Exporter<'_> {
    fn emit(&mut self, op: &str, ins: Vec<String>, attrs: Vec<AttributeProto>) -> String {
        self.fresh += 1;
        let out = format!("t{}", self.fresh);
        self.emit_to(op, ins, attrs, out.clone());
        out
    }
    /// A node with `n` outputs; their names.
    fn emit_n(&mut self, op: &str, ins: Vec<String>, attrs: Vec<AttributeProto>, n: usize) -> Vec<String> {
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
    /// Name the outputs of node `id` after the oar values they are.
    fn outputs_to(&mut self, id: oar_ir::NodeId, outs: Vec<String>) {
        for (i, out) in outs.into_iter().enumerate() {
            let v = ValueId {
                node: id,
                output: i as u32,
            };
            self.emit_to("Identity", vec![out], vec![], name_of(v));
        }
    }
    fn constant(&mut self, t: TensorData) -> String {
        self.fresh += 1;
        let name = format!("c{}", self.fresh);
        self.inits.push(tensor_to_proto(&name, &t));
        name
    }
    fn i64s(&mut self, v: &[i64]) -> String {
        self.constant(TensorData::from_vec(vec![v.len()], v.to_vec()).expect("1-D"))
    }
    fn static_dims(&self, dims: &[Dim], what: &str) -> Result<Vec<i64>, OnnxError> {
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
        let mut inputs = Vec::new();
        for id in g.topo_order() {
            let node = g.node(id);
            let v = ValueId::first(id);
            let ins: Vec<String> = node.inputs().iter().map(|&v| name_of(v)).collect();
            match &node.op {
                Op::Input(Input { name, ty }) => {
                    inputs.push(value_info(name, ty));
                    self.emit_to("Identity", vec![name.clone()], vec![], name_of(v));
                }
                Op::Param(Param { name, .. }) => {
                    let w = model
                        .weights
                        .get(name)
                        .ok_or_else(|| OnnxError::Export(format!("param `{name}` has no weight")))?;
                    self.inits.push(tensor_to_proto(name, w));
                    self.emit_to("Identity", vec![name.clone()], vec![], name_of(v));
                }
                Op::Sort(Sort { axis, descending }) => {
                    // TopK over the whole axis sorts it (ties keep the earlier element first).
                    let n = g.value_type(node.inputs()[0]).shape.0[*axis]
                        .as_static()
                        .ok_or_else(|| OnnxError::Export("sort of a symbolic axis".into()))?;
                    let k = self.i64s(&[n as i64]);
                    let attrs = vec![
                        int("axis", *axis as i64),
                        int("largest", *descending as i64),
                        int("sorted", 1),
                    ];
                    let outs = self.emit_n("TopK", vec![ins[0].clone(), k], attrs, 2);
                    self.outputs_to(id, outs);
                }
                Op::Composite(Composite::TopK(TopK { k, axis, largest })) => {
                    let kk = self.i64s(&[*k as i64]);
                    let attrs = vec![
                        int("axis", *axis as i64),
                        int("largest", *largest as i64),
                        int("sorted", 1),
                    ];
                    let outs = self.emit_n("TopK", vec![ins[0].clone(), kk], attrs, 2);
                    self.outputs_to(id, outs);
                }
                op => {
                    let out = self.op(op, ins, g, node.inputs())?;
                    self.emit_to("Identity", vec![out], vec![], name_of(v));
                }
            }
        }
        let mut outputs = Vec::new();
        for o in g.outputs() {
            self.emit_to("Identity", vec![name_of(o.value)], vec![], o.name.clone());
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
            Op::Constant(t) => {
                let c = self.constant(t.clone());
                self.emit("Identity", vec![c], vec![])
            }
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
            Op::Composite(c) => self.composite(c, ins, &ty(0))?,
            other => {
                return Err(OnnxError::Export(format!(
                    "op `{}` has no ONNX equivalent here",
                    other.name()
                )));
            }
        })
    }

    /// `Resize(X, roi = "", scales | sizes)` over every axis (the leading ones unchanged).
    fn resize(&mut self, r: &Resize, ins: Vec<String>, x: &TensorType) -> Result<String, OnnxError> {
        let shape = self.static_dims(&x.shape.0, "resize input")?;
        let lead = shape.len() - r.sizes.len();
        let mut inputs = vec![ins[0].clone(), String::new()];
        if r.scales.is_empty() {
            inputs.push(String::new());
            let sizes: Vec<i64> = shape[..lead]
                .iter()
                .copied()
                .chain(r.sizes.iter().map(|&s| s as i64))
                .collect();
            inputs.push(self.i64s(&sizes));
        } else {
            let scales: Vec<f32> = std::iter::repeat_n(1.0, lead)
                .chain(r.scales.iter().map(|s| s.0 as f32))
                .collect();
            inputs.push(self.constant(TensorData::from_vec(vec![scales.len()], scales).expect("1-D")));
        }
        let attrs = vec![
            string("mode", r.mode.name()),
            string("coordinate_transformation_mode", r.coordinate.name()),
            string("nearest_mode", r.nearest.name()),
            float("cubic_coeff_a", r.cubic_a.0),
            int("exclude_outside", r.exclude_outside as i64),
        ];
        Ok(self.emit("Resize", inputs, attrs))
    }

    fn composite(&mut self, c: &Composite, ins: Vec<String>, x: &TensorType) -> Result<String, OnnxError> {
        Ok(match c {
            Composite::Linear => {
                let y = self.emit("MatMul", ins[..2].to_vec(), vec![]);
                match ins.get(2) {
                    Some(b) => self.emit("Add", vec![y, b.clone()], vec![]),
                    None => y,
                }
            }
            Composite::Conv2d(Conv2d {
                stride,
                padding,
                dilation,
                groups,
            }) => {
                let pads = [padding[0], padding[1], padding[2], padding[3]];
                let attrs = vec![
                    ints("strides", stride),
                    ints("pads", &pads),
                    ints("dilations", dilation),
                    int("group", *groups as i64),
                ];
                self.emit("Conv", ins, attrs)
            }
            Composite::MaxPool2d(MaxPool2d {
                kernel,
                stride,
                padding,
                ceil_mode,
            }) => {
                let attrs = vec![
                    ints("kernel_shape", kernel),
                    ints("strides", stride),
                    ints("pads", padding),
                    int("ceil_mode", *ceil_mode as i64),
                ];
                self.emit("MaxPool", ins, attrs)
            }
            Composite::AvgPool2d(AvgPool2d {
                kernel,
                stride,
                padding,
                ceil_mode,
                count_include_pad,
            }) => {
                let attrs = vec![
                    ints("kernel_shape", kernel),
                    ints("strides", stride),
                    ints("pads", padding),
                    int("ceil_mode", *ceil_mode as i64),
                    int("count_include_pad", *count_include_pad as i64),
                ];
                self.emit("AveragePool", ins, attrs)
            }
            Composite::AdaptiveAvgPool2d(AdaptiveAvgPool2d { output_size: [1, 1] }) => {
                self.emit("GlobalAveragePool", ins, vec![])
            }
            Composite::AdaptiveMaxPool2d(AdaptiveMaxPool2d { output_size: [1, 1] }) => {
                self.emit("GlobalMaxPool", ins, vec![])
            }
            Composite::BatchNorm(BatchNorm {
                epsilon,
                training: false,
                ..
            }) => self.emit("BatchNormalization", ins, vec![float("epsilon", epsilon.0)]),
            Composite::LayerNorm(LayerNorm {
                normalized_ndim,
                epsilon,
            }) => {
                let mut ins = ins;
                let axis = (x.rank() - normalized_ndim) as i64;
                if ins.len() == 1 {
                    let tail: Vec<usize> = x.shape.0[x.rank() - normalized_ndim..]
                        .iter()
                        .map(|d| d.as_static().unwrap_or(1))
                        .collect();
                    ins.push(
                        self.constant(
                            TensorData::full(x.dtype, tail, 1.0).map_err(|e| OnnxError::Export(e.to_string()))?,
                        ),
                    );
                }
                self.emit(
                    "LayerNormalization",
                    ins,
                    vec![int("axis", axis), float("epsilon", epsilon.0)],
                )
            }
            Composite::Softmax(Softmax { axis }) => self.emit("Softmax", ins, vec![int("axis", *axis as i64)]),
            Composite::LogSoftmax(LogSoftmax { axis }) => self.emit("LogSoftmax", ins, vec![int("axis", *axis as i64)]),
            Composite::Relu => self.emit("Relu", ins, vec![]),
            Composite::ShapeOf => self.emit("Shape", ins, vec![]),
            Composite::Sigmoid => self.emit("Sigmoid", ins, vec![]),
            Composite::Silu => {
                let s = self.emit("Sigmoid", ins.clone(), vec![]);
                self.emit("Mul", vec![ins[0].clone(), s], vec![])
            }
            Composite::Gelu(Gelu { approximate: false }) => {
                // 0.5 * x * (1 + erf(x / sqrt(2))); Gelu itself needs opset 20.
                let c = |v: f64, ex: &mut Self| {
                    ex.constant(TensorData::from_f64_slice(x.dtype, vec![], &[v]).expect("scalar"))
                };
                let r2 = c(std::f64::consts::SQRT_2, self);
                let d = self.emit("Div", vec![ins[0].clone(), r2], vec![]);
                let e = self.emit("Erf", vec![d], vec![]);
                let one = c(1.0, self);
                let a = self.emit("Add", vec![e, one], vec![]);
                let m = self.emit("Mul", vec![ins[0].clone(), a], vec![]);
                let half = c(0.5, self);
                self.emit("Mul", vec![m, half], vec![])
            }
            Composite::Gelu(Gelu { approximate: true }) => {
                // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))); Gelu itself needs opset 20.
                let c = |v: f64, ex: &mut Self| {
                    ex.constant(TensorData::from_f64_slice(x.dtype, vec![], &[v]).expect("scalar"))
                };
                let x0 = ins[0].clone();
                let x2 = self.emit("Mul", vec![x0.clone(), x0.clone()], vec![]);
                let x3 = self.emit("Mul", vec![x2, x0.clone()], vec![]);
                let k = c(0.044715, self);
                let x3k = self.emit("Mul", vec![x3, k], vec![]);
                let s = self.emit("Add", vec![x0.clone(), x3k], vec![]);
                let r = c((2.0 / std::f64::consts::PI).sqrt(), self);
                let a = self.emit("Mul", vec![s, r], vec![]);
                let t = self.emit("Tanh", vec![a], vec![]);
                let one = c(1.0, self);
                let t1 = self.emit("Add", vec![t, one], vec![]);
                let half = c(0.5, self);
                let hx = self.emit("Mul", vec![x0, half], vec![]);
                self.emit("Mul", vec![hx, t1], vec![])
            }
            Composite::Dropout(Dropout { training: false, .. }) => self.emit("Identity", ins, vec![]),
            Composite::ConvTranspose(ct) => {
                let pads: Vec<usize> = ct.pad_before.iter().chain(&ct.pad_after).copied().collect();
                let attrs = vec![
                    ints("strides", &ct.stride),
                    ints("pads", &pads),
                    ints("output_padding", &ct.output_padding),
                    ints("dilations", &ct.dilation),
                    int("group", ct.groups as i64),
                ];
                self.emit("ConvTranspose", ins, attrs)
            }
            Composite::Resize(r) => self.resize(r, ins, x)?,
            Composite::InstanceNorm(InstanceNorm { epsilon }) => {
                let mut ins = ins;
                if ins.len() == 1 {
                    let c = x.shape.0[1]
                        .as_static()
                        .ok_or_else(|| OnnxError::Export("instance_norm of symbolic channels".into()))?;
                    let ones = self.constant(TensorData::full(x.dtype, vec![c], 1.0).expect("ones"));
                    let zeros = self.constant(TensorData::full(x.dtype, vec![c], 0.0).expect("zeros"));
                    ins.extend([ones, zeros]);
                }
                self.emit("InstanceNormalization", ins, vec![float("epsilon", epsilon.0)])
            }
            Composite::BorderPad(BorderPad { before, after, mode }) => {
                let pads: Vec<i64> = before.iter().chain(after).map(|&p| p as i64).collect();
                let p = self.i64s(&pads);
                let mode = match mode {
                    PadMode::Reflect => "reflect",
                    PadMode::Replicate => "edge",
                    PadMode::Circular => unreachable!("lowered before export (wrap needs opset 19)"),
                };
                self.emit("Pad", vec![ins[0].clone(), p], vec![string("mode", mode)])
            }
            Composite::CumSum(CumSum {
                axis,
                exclusive,
                reverse,
            }) => {
                let a = self.i64s(&[*axis as i64]);
                let attrs = vec![int("exclusive", *exclusive as i64), int("reverse", *reverse as i64)];
                self.emit("CumSum", vec![ins[0].clone(), a], attrs)
            }
            Composite::OneHot(OneHot { depth, dtype }) => {
                let d = self.i64s(&[*depth as i64]);
                let v = self.constant(TensorData::from_f64_slice(*dtype, vec![2], &[0.0, 1.0]).expect("values"));
                self.emit("OneHot", vec![ins[0].clone(), d, v], vec![int("axis", -1)])
            }
            Composite::Einsum(Einsum { equation }) => self.emit("Einsum", ins, vec![string("equation", equation)]),
            Composite::Embedding => self.emit("Gather", vec![ins[1].clone(), ins[0].clone()], vec![int("axis", 0)]),
            other => {
                return Err(OnnxError::Export(format!(
                    "composite `{}` has no ONNX mapping",
                    other.name()
                )));
            }
        })
    }
}
