//! Errors of passes and of the pass manager.

use oar_ir::IrError;

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
