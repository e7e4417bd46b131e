//! The error type of the `oar` crate.

use oar_ir::tensor_data::TensorDataError;
use oar_ir::{BackendError, IrError};

/// Everything that can go wrong in eager code, tracing, saving and loading.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A type/shape rule rejected an op's operands, or a graph is malformed.
    #[error(transparent)]
    Ir(#[from] IrError),
    /// A kernel or backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Bytes and shape do not make a tensor.
    #[error(transparent)]
    Data(#[from] TensorDataError),
    /// Bad arguments to a tensor function, named by the function.
    #[error("{op}: {detail}")]
    Invalid {
        /// The function (`reshape`, `arange`, `backward`, ...).
        op: String,
        /// What is wrong, with the offending values and shapes.
        detail: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {detail}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        detail: String,
    },
}

impl Error {
    /// An [`Error::Invalid`] for `op`.
    pub fn invalid(op: &str, detail: impl Into<String>) -> Error {
        Error::Invalid {
            op: op.to_string(),
            detail: detail.into(),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
