//! `oar import MODEL.onnx -o MODEL.oar`: convert an ONNX model into an oar model file.

use crate::CliResult;
use std::path::Path;

/// Import `input` (ONNX) and save it as `.oar` at `output`.
pub(crate) fn import(input: &Path, output: &Path) -> CliResult<()> {
    let model = oar_onnx::load(input).map_err(|e| format!("{}: {e}", input.display()))?;
    model.save(output).map_err(|e| e.to_string())?;
    println!(
        "{} -> {}: {} nodes, {} params",
        input.display(),
        output.display(),
        model.graph.node_count(),
        model.weights.len()
    );
    Ok(())
}
