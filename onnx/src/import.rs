//! ONNX → oar: decode the protobuf, build a [`Graph`] node by node, fold constants.
//!
//! Initializers of float type become params (the model's weights); integer and bool initializers
//! (shapes, axes, indices) become constants. A node whose inputs are all constants is evaluated at
//! import time on the reference backend, which is what turns `Shape → Gather → Concat → Reshape`
//! chains into a constant shape when the input shape is static.

use crate::error::{OnnxError, UnsupportedNode};
use crate::ops::{self, NodeCx};
use crate::proto::{ModelProto, NodeProto, TypeProto, ValueInfoProto, tensor_shape_proto::dimension, type_proto};
use crate::tensor::{dtype_from_onnx, onnx_type_name, tensor_from_proto};
use oar_ir::file::Model;
use oar_ir::{Dim, Graph, Op, Shape, TensorData, TensorType, ValueId, Weights};
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Newest default-domain opset this importer knows (the one `onnx` 1.23.2 ships).
pub const MAX_OPSET: i64 = 28;

/// Options for [`from_bytes_with`].
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Graph inputs to bind to fixed values: they become constants (and fold), not inputs.
    pub constant_inputs: BTreeMap<String, TensorData>,
}

/// Load an `.onnx` file; external data files are resolved next to it.
pub fn load(path: &Path) -> Result<Model, OnnxError> {
    let bytes = std::fs::read(path).map_err(|source| OnnxError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let dir = path
        .parent()
        .map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    from_bytes_with(&bytes, dir, &ImportOptions::default())
}

/// Import a model from bytes (external data is an error: there is no directory to resolve it in).
pub fn from_bytes(bytes: &[u8]) -> Result<Model, OnnxError> {
    from_bytes_with(bytes, None, &ImportOptions::default())
}

/// Import a model from bytes, resolving external data in `model_dir`.
pub fn from_bytes_with(bytes: &[u8], model_dir: Option<&Path>, options: &ImportOptions) -> Result<Model, OnnxError> {
    let model = ModelProto::decode(bytes).map_err(|e| OnnxError::Decode(e.to_string()))?;
    import_model(&model, model_dir, options)
}

/// The default-domain opset a model imports.
pub fn model_opset(model: &ModelProto) -> Result<i64, OnnxError> {
    let v = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
        .ok_or_else(|| OnnxError::Invalid("the model imports no default-domain (ai.onnx) opset".into()))?;
    if !(1..=MAX_OPSET).contains(&v) {
        return Err(OnnxError::Invalid(format!(
            "opset {v} is not supported (this importer reads 1..={MAX_OPSET})"
        )));
    }
    Ok(v)
}

/// A node's name for messages: its name, or `#index` when it has none.
pub(crate) fn node_label(node: &NodeProto, index: usize) -> String {
    match node.name.as_deref() {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => format!("#{index}"),
    }
}

fn import_model(model: &ModelProto, model_dir: Option<&Path>, options: &ImportOptions) -> Result<Model, OnnxError> {
    let opset = model_opset(model)?;
    let gp = model
        .graph
        .as_ref()
        .ok_or_else(|| OnnxError::Invalid("the model has no graph".into()))?;
    crate::check::check_model(model, gp)?;
    let unsupported: Vec<UnsupportedNode> = gp
        .node
        .iter()
        .enumerate()
        .filter(|(_, n)| !ops::is_supported(n))
        .map(|(i, n)| UnsupportedNode {
            op_type: match n.domain.as_deref() {
                None | Some("") | Some("ai.onnx") => n.op_type().to_string(),
                Some(d) => format!("{d}.{}", n.op_type()),
            },
            node: node_label(n, i),
            opset,
        })
        .collect();
    if !unsupported.is_empty() {
        return Err(OnnxError::Unsupported(unsupported));
    }

    let mut g = Graph::new(gp.name.as_deref().filter(|n| !n.is_empty()).unwrap_or("onnx"));
    let mut values: HashMap<String, ValueId> = HashMap::new();
    let mut weights = Weights::new();
    let mut param_values: HashMap<ValueId, TensorData> = HashMap::new();
    for init in &gp.initializer {
        let name = init.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(OnnxError::Invalid("an initializer has no name".into()));
        }
        let t = tensor_from_proto(init, model_dir)?;
        let v = if t.dtype().is_float() {
            let v = g.add_param(&name, t.tensor_type())?;
            param_values.insert(v, t.clone());
            weights.insert(name.clone(), t);
            v
        } else {
            g.add_constant(t)
        };
        values.insert(name, v);
    }
    if !gp.sparse_initializer.is_empty() {
        return Err(OnnxError::Invalid("sparse initializers are not supported".into()));
    }
    for vi in &gp.input {
        let name = vi.name.clone().unwrap_or_default();
        if values.contains_key(&name) {
            continue; // an initializer listed as an input (IR < 4): the initializer is its default
        }
        let v = match options.constant_inputs.get(&name) {
            Some(t) => g.add_constant(t.clone()),
            None => g.add_input(&name, value_type(vi)?)?,
        };
        values.insert(name, v);
    }

    let mut shape_values = crate::shape_values::ShapeValues::new();
    for (index, node) in gp.node.iter().enumerate() {
        let label = node_label(node, index);
        let mut ins = Vec::with_capacity(node.input.len());
        for name in &node.input {
            if name.is_empty() {
                ins.push(None);
                continue;
            }
            let v = values.get(name).copied().ok_or_else(|| {
                OnnxError::Invalid(format!(
                    "node `{label}` ({}) reads `{name}`, which nothing defines before it",
                    node.op_type()
                ))
            })?;
            ins.push(Some(v));
        }
        let followed = crate::shape_values::propagate(&g, &shape_values, node, &ins);
        let outs = convert_or_fold(&mut g, node, &label, opset, ins, &param_values, &shape_values)?;
        if let (Some(e), Some(&v)) = (followed, outs.first())
            && !matches!(g.node(v.node).op, Op::Constant(_))
        {
            shape_values.insert(v, e);
        }
        for (i, name) in node.output.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            let v = outs.get(i).copied().ok_or_else(|| OnnxError::Node {
                node: label.clone(),
                op_type: node.op_type().to_string(),
                opset,
                detail: format!("output {i} (`{name}`) is not supported"),
            })?;
            values.insert(name.clone(), v);
        }
    }

    for vi in &gp.output {
        let name = vi.name.clone().unwrap_or_default();
        let v = *values
            .get(&name)
            .ok_or_else(|| OnnxError::Invalid(format!("graph output `{name}` is not produced by any node")))?;
        if let Some(declared) = declared_dtype(vi)? {
            let got = g.value_type(v).dtype;
            if got != declared {
                return Err(OnnxError::Invalid(format!(
                    "graph output `{name}` is declared {declared} but computes {got}"
                )));
            }
        }
        g.add_output(&name, v)?;
    }
    g.remove_dead_nodes();
    let live: std::collections::BTreeSet<String> = g.params().into_iter().map(|(n, _)| n).collect();
    weights.retain(|n, _| live.contains(n));
    oar_ir::verify(&g)?;
    Ok(Model { graph: g, weights })
}

/// Largest node result (in elements, all outputs together) folded into a constant at import
/// time; bigger results are computed when the model runs, under its memory budget, instead of
/// being materialized (and stored in the model) here.
pub(crate) const FOLD_LIMIT_ELEMENTS: usize = 1 << 20;

/// Convert a node; when every input is a constant (and the result is small), evaluate it now
/// and return constants.
fn convert_or_fold(
    g: &mut Graph,
    node: &NodeProto,
    label: &str,
    opset: i64,
    ins: Vec<Option<ValueId>>,
    param_values: &HashMap<ValueId, TensorData>,
    shape_values: &crate::shape_values::ShapeValues,
) -> Result<Vec<ValueId>, OnnxError> {
    let consts: Option<Vec<Option<TensorData>>> = ins
        .iter()
        .map(|v| match v {
            None => Some(None),
            Some(v) => match &g.node(v.node).op {
                Op::Constant(t) => Some(Some(t.clone())),
                _ => None,
            },
        })
        .collect();
    if let Some(consts) = consts.filter(|c| c.iter().any(Option::is_some)) {
        let mut scratch = Graph::new("fold");
        let sins: Vec<Option<ValueId>> = consts.into_iter().map(|t| t.map(|t| scratch.add_constant(t))).collect();
        let none = HashMap::new();
        let outs = NodeCx::new(&mut scratch, node, label, opset, sins, &none, &Default::default()).convert()?;
        let elements = outs.iter().try_fold(0usize, |acc, v| {
            acc.checked_add(scratch.value_type(*v).shape.num_elements()?)
        });
        if elements.is_none_or(|n| n > FOLD_LIMIT_ELEMENTS) {
            return NodeCx::new(g, node, label, opset, ins, param_values, shape_values).convert();
        }
        for (i, v) in outs.iter().enumerate() {
            scratch.add_output(&format!("o{i}"), *v)?;
        }
        let results = oar_backend_reference::run_graph(&scratch, &Weights::new(), &BTreeMap::new()).map_err(|e| {
            OnnxError::Node {
                node: label.to_string(),
                op_type: node.op_type().to_string(),
                opset,
                detail: format!("constant folding failed: {e}"),
            }
        })?;
        return Ok(results.into_iter().map(|(_, t)| g.add_constant(t)).collect());
    }
    NodeCx::new(g, node, label, opset, ins, param_values, shape_values).convert()
}

fn declared_dtype(vi: &ValueInfoProto) -> Result<Option<oar_ir::DType>, OnnxError> {
    match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => {
            let code = t.elem_type.unwrap_or(0);
            dtype_from_onnx(code).map(Some).ok_or_else(|| OnnxError::Tensor {
                name: vi.name.clone().unwrap_or_default(),
                detail: format!("element type {} is not supported", onnx_type_name(code)),
            })
        }
        _ => Ok(None),
    }
}

/// The oar type of a graph input: dims with `dim_param` stay symbolic; unnamed unknown dims get
/// a fresh symbol `<input>_d<axis>`.
fn value_type(vi: &ValueInfoProto) -> Result<TensorType, OnnxError> {
    let name = vi.name.clone().unwrap_or_default();
    let bad = |detail: String| OnnxError::Tensor {
        name: name.clone(),
        detail,
    };
    let t = match vi.r#type.as_ref().and_then(|t: &TypeProto| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => t,
        _ => {
            return Err(bad(
                "only tensor inputs are supported (not sequences, maps or optionals)".into(),
            ));
        }
    };
    let dtype = declared_dtype(vi)?.ok_or_else(|| bad("no element type".into()))?;
    let shape = t
        .shape
        .as_ref()
        .ok_or_else(|| bad("the input has no shape (its rank must be known)".into()))?;
    let mut dims = Vec::with_capacity(shape.dim.len().min(64));
    for (i, d) in shape.dim.iter().enumerate() {
        dims.push(match &d.value {
            Some(dimension::Value::DimValue(n)) => {
                Dim::Static(usize::try_from(*n).map_err(|_| bad(format!("negative dim {n} on axis {i}")))?)
            }
            // A size expression written by `save` (`N*C`) reads back as one.
            Some(dimension::Value::DimParam(p)) if p.contains(['*', '+', '/', '(']) => {
                p.parse::<Dim>().unwrap_or_else(|_| Dim::Sym(p.clone()))
            }
            Some(dimension::Value::DimParam(p)) if !p.is_empty() => Dim::Sym(p.clone()),
            _ => Dim::Sym(format!("{name}_d{i}")),
        });
    }
    Ok(TensorType::new(dtype, Shape(dims)))
}
