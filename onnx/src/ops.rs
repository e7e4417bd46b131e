//! ONNX node → oar ops: the conversion context, attribute access, and the op table.
//!
//! Elementwise, reduction and movement ops live here; NN ops (conv, pooling, norms, gemm,
//! softmax) in `ops_nn.rs`. Each converter handles the opset differences of its op
//! (attributes that became inputs, changed defaults).

use crate::error::OnnxError;
use crate::proto::attribute_proto::AttributeType;
use crate::proto::{AttributeProto, NodeProto};
use crate::tensor::tensor_from_proto;
use oar_ir::ops::{ArgReduce, Cast, Reduce, Reshape, Slice};
use oar_ir::ops::{ArgReduceOp, BinaryOp, ReduceOp, SliceRange, UnaryOp};
use oar_ir::{DType, Dim, Graph, Op, TensorData, TensorType, ValueId};
use std::collections::HashMap;

/// True if the importer maps this node's op type.
pub fn is_supported(node: &NodeProto) -> bool {
    node_key(node).is_some_and(|k| crate::table::converter(&k).is_some())
}

/// The import table's key of a node: its op type in the default domain, `com.microsoft.T` for
/// ONNX Runtime's contrib op `T` (which its quantization tools write), `None` elsewhere.
pub(crate) fn node_key(node: &NodeProto) -> Option<String> {
    match node.domain.as_deref() {
        None | Some("") | Some("ai.onnx") => Some(node.op_type().to_string()),
        Some("com.microsoft") => Some(format!("com.microsoft.{}", node.op_type())),
        Some(_) => None,
    }
}

/// One node being converted: the graph, the node, its inputs and the opset in effect.
pub struct NodeCx<'a> {
    /// The graph ops are added to.
    pub g: &'a mut Graph,
    node: &'a NodeProto,
    label: &'a str,
    /// Default-domain opset version.
    pub opset: i64,
    ins: Vec<Option<ValueId>>,
    param_values: &'a HashMap<ValueId, TensorData>,
    shape_values: &'a crate::shape_values::ShapeValues,
    /// An attribute read as a type it does not have (reported after the converter ran).
    bad_attr: std::cell::RefCell<Option<String>>,
}

pub(crate) type R<T> = Result<T, OnnxError>;

impl<'a> NodeCx<'a> {
    /// A context for `node` with its resolved inputs (`None` for omitted optional inputs).
    pub fn new(
        g: &'a mut Graph,
        node: &'a NodeProto,
        label: &'a str,
        opset: i64,
        ins: Vec<Option<ValueId>>,
        param_values: &'a HashMap<ValueId, TensorData>,
        shape_values: &'a crate::shape_values::ShapeValues,
    ) -> Self {
        NodeCx {
            g,
            node,
            label,
            opset,
            ins,
            param_values,
            shape_values,
            bad_attr: std::cell::RefCell::new(None),
        }
    }

    /// An error about this node.
    pub fn err(&self, detail: impl Into<String>) -> OnnxError {
        OnnxError::Node {
            node: self.label.to_string(),
            op_type: self.node.op_type().to_string(),
            opset: self.opset,
            detail: detail.into(),
        }
    }

    /// The node's ONNX op type.
    pub fn op_type(&self) -> &str {
        self.node.op_type()
    }

    /// The attribute `name`, if present.
    pub fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.node.attribute.iter().find(|a| a.name.as_deref() == Some(name))
    }
    /// The attribute `name` when it is of type `ty`; one of another type is recorded as the
    /// node's error (a model onnx.checker refuses), never read as the default.
    fn typed(&self, name: &str, ty: AttributeType) -> Option<&AttributeProto> {
        let a = self.attr(name)?;
        if a.r#type.is_some_and(|t| t != ty as i32) {
            let got = a
                .r#type
                .and_then(|t| AttributeType::try_from(t).ok())
                .map_or("an unknown type", |t| t.as_str_name());
            self.bad_attr
                .borrow_mut()
                .get_or_insert_with(|| format!("attribute `{name}` must be {}, got {got}", ty.as_str_name()));
            return None;
        }
        Some(a)
    }
    /// Integer attribute.
    pub fn attr_i(&self, name: &str, default: i64) -> i64 {
        self.typed(name, AttributeType::Int)
            .and_then(|a| a.i)
            .unwrap_or(default)
    }
    /// Float attribute.
    pub fn attr_f(&self, name: &str, default: f32) -> f32 {
        self.attr_f_opt(name).unwrap_or(default)
    }
    /// Float attribute, when present.
    pub fn attr_f_opt(&self, name: &str) -> Option<f32> {
        self.typed(name, AttributeType::Float).and_then(|a| a.f)
    }
    /// Float-list attribute.
    pub fn attr_floats(&self, name: &str) -> Option<Vec<f32>> {
        self.typed(name, AttributeType::Floats).map(|a| a.floats.clone())
    }
    /// String-list attribute.
    pub fn attr_strings(&self, name: &str) -> Option<Vec<String>> {
        self.typed(name, AttributeType::Strings).map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
    }
    /// Integer-list attribute.
    pub fn attr_ints(&self, name: &str) -> Option<Vec<i64>> {
        self.typed(name, AttributeType::Ints).map(|a| a.ints.clone())
    }
    /// String attribute.
    pub fn attr_s(&self, name: &str) -> Option<String> {
        self.typed(name, AttributeType::String)
            .and_then(|a| a.s.as_ref())
            .map(|s| String::from_utf8_lossy(s).into_owned())
    }

    /// An error unless the node has `min..=max` inputs (omitted optional ones counted).
    pub fn arity(&self, min: usize, max: usize) -> R<()> {
        let n = self.n_inputs();
        if n < min || n > max {
            let want = if min == max {
                format!("{min}")
            } else {
                format!("{min} to {max}")
            };
            return Err(self.err(format!("takes {want} inputs, got {n}")));
        }
        Ok(())
    }

    /// Number of inputs (including omitted ones).
    pub fn n_inputs(&self) -> usize {
        self.ins.len()
    }
    /// Input `i`, which must be present.
    pub fn input(&self, i: usize) -> R<ValueId> {
        self.opt_input(i)
            .ok_or_else(|| self.err(format!("input {i} is required")))
    }
    /// Input `i` if present.
    pub fn opt_input(&self, i: usize) -> Option<ValueId> {
        self.ins.get(i).copied().flatten()
    }
    /// The value of input `i` when known at import time (a constant or an initializer).
    pub fn const_input(&self, i: usize) -> R<Option<TensorData>> {
        let Some(v) = self.opt_input(i) else { return Ok(None) };
        match &self.g.node(v.node).op {
            Op::Constant(t) => Ok(Some(t.clone())),
            _ => match self.param_values.get(&v) {
                Some(t) => Ok(Some(t.clone())),
                None => Err(OnnxError::NonConstant {
                    node: self.label.to_string(),
                    op_type: self.node.op_type().to_string(),
                    input: self.node.input.get(i).cloned().unwrap_or_default(),
                }),
            },
        }
    }
    /// Input `i` as a list of integers, when present (must be constant).
    pub fn const_ints(&self, i: usize) -> R<Option<Vec<i64>>> {
        Ok(self
            .const_input(i)?
            .map(|t| t.to_f64_vec().into_iter().map(|v| v as i64).collect()))
    }
    /// Input `i` as a shape: integer entries known at import time, symbolic ones (`N`, `N*C`)
    /// included when the importer followed a shape computation (`Shape` → `Gather` → `Concat`).
    pub(crate) fn shape_ints(&self, i: usize) -> R<Option<Vec<oar_ir::SymExpr>>> {
        let Some(v) = self.opt_input(i) else { return Ok(None) };
        if let Some(e) = crate::shape_values::entries(self.g, self.shape_values, v) {
            return Ok(Some(e));
        }
        Ok(self
            .const_ints(i)?
            .map(|v| v.into_iter().map(oar_ir::SymExpr::constant).collect()))
    }

    /// A shape input as dims (entries must be sizes ≥ 0).
    pub(crate) fn shape_dims(&self, i: usize) -> R<Option<Vec<Dim>>> {
        let Some(e) = self.shape_ints(i)? else { return Ok(None) };
        e.into_iter()
            .map(|e| Dim::from_expr(e).map_err(|m| self.err(format!("shape input {i}: {m}"))))
            .collect::<R<Vec<_>>>()
            .map(Some)
    }

    /// Input `i` as one float scalar, when present (must be constant).
    pub fn const_scalar(&self, i: usize) -> R<Option<f64>> {
        match self.const_input(i)? {
            None => Ok(None),
            Some(t) if t.len() == 1 => Ok(Some(t.to_f64_vec()[0])),
            Some(t) => Err(self.err(format!("input {i} must be a scalar, got shape {:?}", t.shape()))),
        }
    }

    /// Type of a value.
    pub fn ty(&self, v: ValueId) -> TensorType {
        self.g.value_type(v).clone()
    }
    /// Static shape of a value, or an error naming it.
    pub fn static_shape(&self, v: ValueId) -> R<Vec<usize>> {
        let t = self.ty(v);
        t.shape
            .as_static()
            .ok_or_else(|| self.err(format!("needs a static shape here, got {t}")))
    }
    /// Normalize a possibly negative axis for rank `rank`.
    pub fn axis(&self, a: i64, rank: usize) -> R<usize> {
        let r = rank as i64;
        let n = if a < 0 { a + r } else { a };
        if (0..r.max(1)).contains(&n) && (n < r || (r == 0 && n == 0)) {
            Ok(n as usize)
        } else {
            Err(self.err(format!("axis {a} is out of range for rank {rank}")))
        }
    }
    /// Add one op.
    pub fn op(&mut self, op: Op, inputs: &[ValueId]) -> R<ValueId> {
        let name = op.name();
        self.g.add_op1(op, inputs).map_err(|e| self.err(format!("{name}: {e}")))
    }
    /// A scalar constant of `dtype`.
    pub fn scalar(&mut self, dtype: DType, v: f64) -> ValueId {
        self.g.add_scalar(dtype, v)
    }
    /// `a op b`.
    pub fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> R<ValueId> {
        self.op(Op::Binary(op), &[a, b])
    }
    /// `op(x)`.
    pub fn un(&mut self, op: UnaryOp, x: ValueId) -> R<ValueId> {
        self.op(Op::Unary(op), &[x])
    }
    /// `x op c` for a scalar constant `c` of x's dtype.
    pub fn bin_c(&mut self, op: BinaryOp, x: ValueId, c: f64) -> R<ValueId> {
        let s = self.scalar(self.ty(x).dtype, c);
        self.bin(op, x, s)
    }
    /// Reshape to `dims`.
    pub fn reshape(&mut self, x: ValueId, dims: Vec<Dim>) -> R<ValueId> {
        if self.ty(x).shape.0 == dims {
            return Ok(x);
        }
        self.op(Op::Reshape(Reshape { shape: dims }), &[x])
    }

    /// Convert the node into oar ops through the import table; one value per ONNX output.
    pub fn convert(mut self) -> R<Vec<ValueId>> {
        let op_type = node_key(self.node).unwrap_or_else(|| self.node.op_type().to_string());
        let convert =
            crate::table::converter(&op_type).ok_or_else(|| self.err(format!("no converter for `{op_type}`")))?;
        let out = convert(&mut self);
        if let Some(bad) = self.bad_attr.borrow_mut().take() {
            return Err(self.err(bad));
        }
        out
    }

    /// `op(input 0)` for a unary op (exactly one input).
    pub fn unary(&mut self, op: UnaryOp) -> R<ValueId> {
        self.arity(1, 1)?;
        let x = self.input(0)?;
        self.un(op, x)
    }

    /// `input 0 op input 1` for a broadcasting binary op (opset ≥ 7 broadcasting).
    pub fn binary(&mut self, op: BinaryOp) -> R<ValueId> {
        let (a, c) = (self.input(0)?, self.input(1)?);
        if self.opset < 7 && self.attr_i("broadcast", 0) != 0 && self.attr("axis").is_some() {
            return Err(self.err("legacy broadcast with `axis` (opset < 7) is not supported"));
        }
        self.bin(op, a, c)
    }

    /// Cast unless already `to`.
    pub fn cast(&mut self, x: ValueId, to: DType) -> R<ValueId> {
        if self.ty(x).dtype == to {
            Ok(x)
        } else {
            self.op(Op::Cast(Cast { to }), &[x])
        }
    }

    /// Non-negative integers as sizes.
    pub fn usizes(&self, v: &[i64]) -> R<Vec<usize>> {
        v.iter()
            .map(|&d| usize::try_from(d).map_err(|_| self.err(format!("negative size {d} in {v:?}"))))
            .collect()
    }

    /// `Constant`: the tensor (or scalar/list) of its one attribute.
    pub fn constant(&mut self) -> R<ValueId> {
        let a = self
            .node
            .attribute
            .first()
            .ok_or_else(|| self.err("Constant needs a value attribute"))?;
        let t = match a.name.as_deref().unwrap_or("") {
            "value" => tensor_from_proto(a.t.as_ref().ok_or_else(|| self.err("`value` has no tensor"))?, None)?,
            "value_float" => TensorData::scalar(a.f.unwrap_or(0.0)),
            "value_int" => TensorData::scalar(a.i.unwrap_or(0)),
            "value_floats" => {
                TensorData::from_vec(vec![a.floats.len()], a.floats.clone()).map_err(|e| self.err(e.to_string()))?
            }
            "value_ints" => {
                TensorData::from_vec(vec![a.ints.len()], a.ints.clone()).map_err(|e| self.err(e.to_string()))?
            }
            other => return Err(self.err(format!("Constant attribute `{other}` is not supported"))),
        };
        Ok(self.g.add_constant(t))
    }

    /// Reduction axes from the attribute (old opsets) or the second input (new ones).
    pub fn reduce_axes(&self, rank: usize, axes_input_from: i64) -> R<Vec<usize>> {
        let axes = if self.opset >= axes_input_from {
            self.const_ints(1)?
        } else {
            self.attr_ints("axes")
        };
        let axes = axes.unwrap_or_default();
        if axes.is_empty() {
            if self.opset >= axes_input_from && self.attr_i("noop_with_empty_axes", 0) != 0 {
                return Ok(vec![]);
            }
            return Ok((0..rank).collect());
        }
        let mut out = axes.iter().map(|&a| self.axis(a, rank)).collect::<R<Vec<_>>>()?;
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// A reduction, with ONNX's `keepdims` (default 1).
    pub fn reduce(&mut self, op: ReduceOp, x: ValueId, axes: Vec<usize>) -> R<ValueId> {
        if axes.is_empty() {
            return Ok(x);
        }
        let keepdim = self.attr_i("keepdims", 1) != 0;
        self.op(Op::Reduce(Reduce { op, axes, keepdim }), &[x])
    }

    /// ArgMax / ArgMin.
    pub fn arg_reduce(&mut self, op: ArgReduceOp) -> R<ValueId> {
        if self.attr_i("select_last_index", 0) != 0 {
            return Err(self.err("select_last_index=1 is not supported"));
        }
        let x = self.input(0)?;
        let axis = self.axis(self.attr_i("axis", 0), self.ty(x).rank())?;
        let keepdim = self.attr_i("keepdims", 1) != 0;
        self.op(Op::ArgReduce(ArgReduce { op, axis, keepdim }), &[x])
    }

    /// Slice `x` on one axis.
    pub fn slice_axis(&mut self, x: ValueId, axis: usize, start: i64, end: i64) -> R<ValueId> {
        let mut ranges = vec![SliceRange::FULL; self.ty(x).rank()];
        ranges[axis] = SliceRange::new(start, end);
        self.op(Op::Slice(Slice { ranges }), &[x])
    }
}

impl NodeCx<'_> {
    /// Number of outputs the node declares.
    pub fn node_outputs(&self) -> usize {
        self.node.output.len()
    }
}
