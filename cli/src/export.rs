//! `oar export MODEL.oar -o MODEL.onnx`: write an oar model as ONNX (opset 18).

use crate::CliResult;
use std::path::Path;

/// Load `input` (`.oar` or `.oir`) and save it as ONNX at `output`.
pub(crate) fn export(input: &Path, output: &Path) -> CliResult<()> {
    let model = crate::load(input)?;
    oar_onnx::save(&model, output).map_err(|e| format!("{}: {e}", input.display()))?;
    println!("{} -> {}", input.display(), output.display());
    Ok(())
}
