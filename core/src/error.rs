//! The one error type of Calico. Every fallible public function returns [`Result`].

use crate::DType;

/// Everything that can go wrong in Calico, from bad user input to a missing GPU runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit together (wrong rank, mismatched lengths, empty where not allowed).
    #[error("shape error: {0}")]
    Shape(String),
    /// Strides the op cannot handle (non-contiguous inner dimension, uncollapsible rows, ...).
    #[error("stride error: {0}")]
    Stride(String),
    /// A dtype the op does not support, or two tensors whose dtypes must agree but do not.
    #[error("dtype error: expected {expected}, got {got}")]
    DType { expected: String, got: DType },
    /// Tensors that live on different devices, or on a device other than the one called.
    #[error("device mismatch: {0}")]
    DeviceMismatch(String),
    /// A pointer or size that does not meet an alignment requirement.
    #[error("alignment error: {0}")]
    Alignment(String),
    /// An output that overlaps one of the inputs or another output.
    #[error("aliasing error: {0}")]
    Aliasing(String),
    /// A legal request that this build or device does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A backend whose runtime library or device could not be found.
    #[error("{backend} backend unavailable: {reason}")]
    BackendUnavailable {
        backend: &'static str,
        reason: String,
    },
    /// A kernel that failed to compile; carries the compiler's log.
    #[error("compiling `{entry}` for {target} failed:\n{log}")]
    Compile {
        entry: String,
        target: String,
        log: String,
    },
    /// An error reported by the device runtime (CUDA driver, HIP runtime).
    #[error("{backend} runtime error in {call}: {message}")]
    Runtime {
        backend: &'static str,
        call: String,
        message: String,
    },
    /// An index or range outside a tensor or buffer.
    #[error("out of bounds: {0}")]
    OutOfBounds(String),
    /// Input/output failure (the compile cache, report files).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// `Result` with Calico's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A shape error with a formatted message.
    pub fn shape(msg: impl Into<String>) -> Self {
        Error::Shape(msg.into())
    }
    /// A stride error with a formatted message.
    pub fn stride(msg: impl Into<String>) -> Self {
        Error::Stride(msg.into())
    }
    /// An unsupported-request error with a formatted message.
    pub fn unsupported(msg: impl Into<String>) -> Self {
        Error::Unsupported(msg.into())
    }
}
