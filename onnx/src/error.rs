//! Why an ONNX model could not be imported or exported.

/// One ONNX node whose op type this importer does not map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedNode {
    /// The node's op type (with its domain when not the default one).
    pub op_type: String,
    /// The node's name (or `#index` when unnamed).
    pub node: String,
    /// The opset version the model imports for the node's domain.
    pub opset: i64,
}

/// An import or export error; every variant says where (file, node, tensor).
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid ONNX protobuf.
    #[error("not a valid ONNX model: {0}")]
    Decode(String),
    /// The model is well-formed protobuf but breaks an ONNX rule (missing graph, bad reference, ...).
    #[error("invalid ONNX model: {0}")]
    Invalid(String),
    /// A tensor (initializer, constant or test data) is malformed or of an unsupported type.
    #[error("tensor `{name}`: {detail}")]
    Tensor {
        /// Tensor name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The model uses op types this importer does not map (all of them listed).
    #[error("unsupported ONNX ops: {}", list_unsupported(.0))]
    Unsupported(Vec<UnsupportedNode>),
    /// A node could not be converted (bad or unsupported attributes, types that do not fit).
    #[error("node `{node}` ({op_type}, opset {opset}): {detail}")]
    Node {
        /// Node name.
        node: String,
        /// Op type.
        op_type: String,
        /// Opset version in effect.
        opset: i64,
        /// What is wrong.
        detail: String,
    },
    /// A node needs an input's value at import time (a shape, axes, pads) but it is computed at run time.
    #[error("node `{node}` ({op_type}): input `{input}` must be a constant (an initializer or Constant) here")]
    NonConstant {
        /// Node name.
        node: String,
        /// Op type.
        op_type: String,
        /// The ONNX value name.
        input: String,
    },
    /// The graph built from the model failed verification.
    #[error("imported graph is invalid: {0}")]
    Graph(#[from] oar_ir::IrError),
    /// A model could not be exported to ONNX.
    #[error("cannot export to ONNX: {0}")]
    Export(String),
}

fn list_unsupported(nodes: &[UnsupportedNode]) -> String {
    let mut by_op: std::collections::BTreeMap<(&str, i64), Vec<&str>> = Default::default();
    for n in nodes {
        by_op.entry((&n.op_type, n.opset)).or_default().push(&n.node);
    }
    by_op
        .iter()
        .map(|((op, opset), names)| {
            let shown: Vec<&str> = names.iter().take(5).copied().collect();
            let more = if names.len() > 5 {
                format!(", … {} more", names.len() - 5)
            } else {
                String::new()
            };
            format!("{op} (opset {opset}; nodes {}{more})", shown.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}
