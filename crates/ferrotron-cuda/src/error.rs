//! One error type for the whole engine. Every failure carries the op, the shapes and the dtype
//! involved, because a bare `CUDA_ERROR_ILLEGAL_ADDRESS` from a training step of thousands of
//! kernels is useless without knowing which op raised it.

use crate::engine::dtype::DType;

/// Result alias used across the crate.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// What the failing call was doing: op name, operand shapes, dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpContext {
    pub op: String,
    pub shapes: Vec<Vec<usize>>,
    pub dtype: Option<DType>,
}

impl OpContext {
    pub fn new(op: impl Into<String>) -> Self {
        Self {
            op: op.into(),
            shapes: Vec::new(),
            dtype: None,
        }
    }

    pub fn shape(mut self, shape: &[usize]) -> Self {
        self.shapes.push(shape.to_vec());
        self
    }

    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }
}

impl std::fmt::Display for OpContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.op)?;
        if !self.shapes.is_empty() {
            let shapes: Vec<String> = self.shapes.iter().map(|s| format!("{s:?}")).collect();
            write!(f, " on shapes {}", shapes.join(", "))?;
        }
        if let Some(dtype) = self.dtype {
            write!(f, " ({dtype})")?;
        }
        Ok(())
    }
}

/// Every error the engine reports.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA shared library (driver, NVRTC, cuBLASLt) could not be loaded on this machine.
    #[error("{library} could not be loaded: {hint}")]
    LibraryMissing {
        library: &'static str,
        hint: &'static str,
    },
    /// The CUDA driver API returned an error.
    #[error("{context}: CUDA driver error {code}")]
    Driver { context: OpContext, code: String },
    /// NVRTC could not compile a generated kernel.
    #[error("{context}: NVRTC failed to compile kernel `{kernel}`: {log}")]
    Compile {
        context: OpContext,
        kernel: String,
        log: String,
    },
    /// cuBLASLt returned an error.
    #[error("{context}: cuBLASLt error {code}")]
    Blas { context: OpContext, code: String },
    /// Bad input: mismatched shapes, an axis out of range, and the like.
    #[error("{context}: {reason}")]
    Invalid { context: OpContext, reason: String },
    /// The op exists but not for this dtype (or at all on this engine).
    #[error("{context}: not supported: {reason}")]
    Unsupported { context: OpContext, reason: String },
    /// Host bytes do not match the tensor they should describe.
    #[error("{context}: expected {expected} bytes, got {actual}")]
    ByteLength {
        context: OpContext,
        expected: usize,
        actual: usize,
    },
}

impl CudaError {
    pub fn invalid(context: OpContext, reason: impl Into<String>) -> Self {
        CudaError::Invalid {
            context,
            reason: reason.into(),
        }
    }

    pub fn unsupported(context: OpContext, reason: impl Into<String>) -> Self {
        CudaError::Unsupported {
            context,
            reason: reason.into(),
        }
    }

    pub(crate) fn driver(context: OpContext, err: cudarc::driver::DriverError) -> Self {
        let name = err
            .error_name()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", err.0));
        let text = err
            .error_string()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        CudaError::Driver {
            context,
            code: if text.is_empty() {
                name
            } else {
                format!("{name} ({text})")
            },
        }
    }

    pub(crate) fn blas(context: OpContext, err: cudarc::cublaslt::result::CublasError) -> Self {
        CudaError::Blas {
            context,
            code: format!("{:?}", err.0),
        }
    }
}

/// Shorthand: map a driver result into a [`CudaError`] with context built lazily.
pub(crate) trait DriverResultExt<T> {
    fn ctx(self, context: impl FnOnce() -> OpContext) -> Result<T>;
}

impl<T> DriverResultExt<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn ctx(self, context: impl FnOnce() -> OpContext) -> Result<T> {
        self.map_err(|e| CudaError::driver(context(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_op_shapes_and_dtype() {
        let err = CudaError::invalid(
            OpContext::new("matmul")
                .shape(&[2, 3])
                .shape(&[4, 5])
                .dtype(DType::BF16),
            "inner dimensions differ: 3 vs 4",
        );
        assert_eq!(
            err.to_string(),
            "matmul on shapes [2, 3], [4, 5] (bf16): inner dimensions differ: 3 vs 4"
        );
    }
}
