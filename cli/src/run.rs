//! `oar run`: run a model on .npy inputs.

use crate::{CliResult, load};
use std::collections::BTreeMap;
use std::path::Path;

pub(crate) fn run_model(file: &Path, inputs: &[String], output: Option<&Path>, backend: &str) -> CliResult<()> {
    let model = load(file)?;
    let mut feeds = BTreeMap::new();
    for spec in inputs {
        let (name, path) = spec
            .split_once('=')
            .ok_or_else(|| format!("--input `{spec}`: expected NAME=FILE.npy"))?;
        let t = oar_ir::npy::read_npy(Path::new(path)).map_err(|e| format!("--input {name}: {e}"))?;
        if feeds.insert(name.to_string(), t).is_some() {
            return Err(format!("--input `{name}` is given twice"));
        }
    }
    let backend = oar::backend::get(backend).map_err(|e| match backend {
        "mlir" | "mlir-gpu" if !cfg!(feature = "mlir") => {
            format!("{e}; `{backend}` needs an oar built with `--features mlir` (LLVM/MLIR 19)")
        }
        _ => e.to_string(),
    })?;
    let exe = backend
        .compile(&model.graph, &model.weights)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let outs = exe.run(&feeds).map_err(|e| e.to_string())?;
    if let Some(dir) = output {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    if outs.is_empty() {
        println!("(no outputs: the graph returns nothing)");
    }
    for (name, t) in &outs {
        println!("{name}: {}", oar_ir::npy::preview(t));
        if let Some(dir) = output {
            let path = dir.join(format!("{}.npy", oar_ir::npy::output_file_stem(name)));
            oar_ir::npy::write_npy(&path, t).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}
