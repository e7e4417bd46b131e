//! Passes by name, for pipelines given as text (`oar opt --passes dce,decompose`).

use crate::{Canonicalize, Cse, Dce, Decompose, Fold, Fuse, Pass, Simplify, SpecializeShapes};

/// Every registered pass, as a constructor of its default configuration.
const PASSES: &[fn() -> Box<dyn Pass>] = &[
    || Box::new(Dce),
    || Box::new(Decompose::all()),
    || Box::new(Canonicalize),
    || Box::new(Fold::new()),
    || Box::new(Cse),
    || Box::new(SpecializeShapes::default()),
    || Box::new(Simplify::new()),
    || Box::new(Fuse::default()),
];

/// The pass registered under `name`, in its default configuration.
pub fn pass_by_name(name: &str) -> Option<Box<dyn Pass>> {
    PASSES.iter().map(|make| make()).find(|p| p.name() == name)
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
