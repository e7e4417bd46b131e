//! Passes by name, for pipelines given as text (`oar opt --passes dce,decompose`).

use crate::{
    Amp, Canonicalize, Cse, Dce, Decompose, FakeQuantToQdq, Fold, FoldBatchNorm, Fuse, Pass, Quantize, Recompose,
    Simplify, SpecializeShapes,
};

/// Every registered pass, as a constructor of its default configuration.
const PASSES: &[fn() -> Box<dyn Pass>] = &[
    || Box::new(Dce),
    || Box::new(Decompose::all()),
    || Box::new(Canonicalize),
    || Box::new(Fold::new()),
    || Box::new(FoldBatchNorm),
    || Box::new(Recompose::default()),
    || Box::new(Cse),
    || Box::new(SpecializeShapes::default()),
    || Box::new(Simplify::new()),
    || Box::new(Fuse::default()),
    || Box::new(Amp::default()),
    || Box::new(FakeQuantToQdq),
    || Box::new(Quantize),
];

/// The pass registered under `name`, in its default configuration.
pub fn pass_by_name(name: &str) -> Option<Box<dyn Pass>> {
    PASSES.iter().map(|make| make()).find(|p| p.name() == name)
}

/// A pass from a pipeline entry: `name` in its default configuration, or `name=arg` for a pass
/// that takes an argument (`amp=bf16`, `amp=f16:O2`). `Ok(None)`: no pass has that name.
pub fn pass_from_spec(spec: &str) -> Result<Option<Box<dyn Pass>>, crate::PassError> {
    let Some((name, arg)) = spec.split_once('=') else {
        return Ok(pass_by_name(spec));
    };
    match name {
        "amp" => Ok(Some(Box::new(Amp::parse(arg)?))),
        _ if pass_by_name(name).is_some() => Err(crate::PassError::Config {
            pass: name.to_string(),
            detail: format!("takes no argument (got `{arg}`)"),
        }),
        _ => Ok(None),
    }
}

/// Names and one-line descriptions of every registered pass.
pub fn list_passes() -> Vec<(&'static str, &'static str)> {
    PASSES
        .iter()
        .map(|make| {
            let p = make();
            (p.name(), p.description())
        })
        .collect()
}
