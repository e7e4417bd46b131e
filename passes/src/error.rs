//! Errors of passes and of the pass manager.

use oar_ir::{Float, IrError};

/// Why a pass or a pipeline failed. Every variant names the pass (or the name asked for).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PassError {
    /// A pass failed while rewriting the graph.
    #[error("pass `{pass}` failed: {source}")]
    Ir {
        /// The pass.
        pass: String,
        /// The graph error it hit.
        #[source]
        source: IrError,
    },
    /// The graph did not verify after a pass (or, with pass `<input>`, before the first one).
    #[error("graph does not verify after pass `{pass}`: {source}")]
    Verify {
        /// The pass that ran last.
        pass: String,
        /// The verifier's error.
        #[source]
        source: IrError,
    },
    /// No pass has this name.
    #[error("unknown pass `{name}` (known passes: {known})")]
    UnknownPass {
        /// The name asked for.
        name: String,
        /// The registered names.
        known: String,
    },
    /// A keep-list names a composite that does not exist.
    #[error("unknown composite op `{name}` in keep-list (known: {known})")]
    UnknownComposite {
        /// The name given.
        name: String,
        /// The composite mnemonics.
        known: String,
    },
    /// A pass changed what the graph computes (found by the numerics check).
    #[error(
        "pass `{pass}` (#{index} in the pipeline){} changed the numerics: output `{output}` {detail}",
        step.map(|s| format!(" at step {s}")).unwrap_or_default()
    )]
    Numerics {
        /// The guilty pass.
        pass: String,
        /// Its 1-based position in the pipeline.
        index: usize,
        /// The smallest step count of the pass that breaks the numerics, for passes that count
        /// their rewrites.
        step: Option<usize>,
        /// The first output that differs (or `<graph>` if the graph no longer runs).
        output: String,
        /// The largest absolute difference found (NaN if the outputs could not be compared).
        max_abs_err: Float,
        /// What differs, with the tolerance used.
        detail: String,
    },
    /// The numerics check could not run the graph (before the pipeline, or on inputs that no
    /// longer fit after a pass).
    #[error("numerics check: {detail}")]
    NumericsSetup {
        /// Why.
        detail: String,
    },
    /// A pass was configured with an option it cannot take (`amp=f64`, an unknown op in a list).
    #[error("pass `{pass}`: {detail}")]
    Config {
        /// The pass.
        pass: String,
        /// What is wrong with the option.
        detail: String,
    },
    /// Writing the IR to a dump file failed.
    #[error("cannot write IR dump `{path}`: {detail}")]
    Dump {
        /// The file.
        path: String,
        /// The I/O error.
        detail: String,
    },
}

impl PassError {
    /// Wrap a graph error raised inside `pass`.
    pub fn ir(pass: &str, source: IrError) -> PassError {
        PassError::Ir {
            pass: pass.to_string(),
            source,
        }
    }
}
