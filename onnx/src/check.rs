//! Checker-level validation before conversion, as `onnx.checker` and onnxruntime do at load:
//! a model they refuse is refused here too, with the node and the rule it breaks, instead of
//! being imported with a guess (an attribute of the wrong type read as its default, a value
//! defined twice, an extra input ignored).

use crate::error::OnnxError;
use crate::proto::attribute_proto::AttributeType;
use crate::proto::{AttributeProto, GraphProto, ModelProto, NodeProto};
use std::collections::HashSet;

/// Newest IR version the importer reads (that of the committed `onnx.proto`, onnx 1.23.2).
pub const MAX_IR_VERSION: i64 = 14;

fn invalid(detail: String) -> OnnxError {
    OnnxError::Invalid(detail)
}

/// Check `model`'s IR version and its main graph's structure.
pub(crate) fn check_model(model: &ModelProto, gp: &GraphProto) -> Result<(), OnnxError> {
    if let Some(v) = model.ir_version
        && !(1..=MAX_IR_VERSION).contains(&v)
    {
        return Err(invalid(format!(
            "ir_version {v} is not supported (this importer reads 1..={MAX_IR_VERSION})"
        )));
    }
    check_graph(gp)
}

/// Static single assignment (every name defined once: graph inputs, initializers, node
/// outputs), unique node names, and well-formed attributes.
fn check_graph(gp: &GraphProto) -> Result<(), OnnxError> {
    let initializers: HashSet<&str> = gp.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    let mut defined: HashSet<&str> = HashSet::new();
    for vi in &gp.input {
        let name = vi.name.as_deref().unwrap_or("");
        if !defined.insert(name) {
            return Err(invalid(format!("graph input `{name}` is declared twice")));
        }
    }
    for name in &initializers {
        // An initializer may also be listed as an input (IR < 4: its default value).
        defined.insert(name);
    }
    if initializers.len() != gp.initializer.len() {
        return Err(invalid("two initializers have the same name".into()));
    }
    let mut node_names: HashSet<&str> = HashSet::new();
    for (i, node) in gp.node.iter().enumerate() {
        let label = crate::import::node_label(node, i);
        if let Some(n) = node.name.as_deref().filter(|n| !n.is_empty())
            && !node_names.insert(n)
        {
            return Err(invalid(format!("node name `{n}` is used by two nodes")));
        }
        for out in node.output.iter().filter(|o| !o.is_empty()) {
            if !defined.insert(out) {
                return Err(invalid(format!(
                    "node `{label}` ({}) defines `{out}`, which is already defined (the graph must be in SSA form)",
                    node.op_type()
                )));
            }
        }
        check_attributes(node, &label)?;
    }
    Ok(())
}

/// Each attribute once, with a declared type whose value field is the one set.
fn check_attributes(node: &NodeProto, label: &str) -> Result<(), OnnxError> {
    let mut seen: HashSet<&str> = HashSet::new();
    for a in &node.attribute {
        let name = a.name.as_deref().unwrap_or("");
        let at = |detail: String| {
            invalid(format!(
                "node `{label}` ({}): attribute `{name}` {detail}",
                node.op_type()
            ))
        };
        if !seen.insert(name) {
            return Err(at("appears twice".into()));
        }
        let ty = a
            .r#type
            .and_then(|t| AttributeType::try_from(t).ok())
            .filter(|t| *t != AttributeType::Undefined)
            .ok_or_else(|| at("has no type".into()))?;
        if let Some(set) = set_field(a)
            && set != ty
        {
            return Err(at(format!(
                "is declared {} but holds a {} value",
                ty.as_str_name(),
                set.as_str_name()
            )));
        }
    }
    Ok(())
}

/// The type of the (single-valued) field an attribute sets, when one is set.
fn set_field(a: &AttributeProto) -> Option<AttributeType> {
    if a.i.is_some() {
        Some(AttributeType::Int)
    } else if a.f.is_some() {
        Some(AttributeType::Float)
    } else if a.s.is_some() {
        Some(AttributeType::String)
    } else if a.t.is_some() {
        Some(AttributeType::Tensor)
    } else if a.g.is_some() {
        Some(AttributeType::Graph)
    } else {
        None
    }
}
