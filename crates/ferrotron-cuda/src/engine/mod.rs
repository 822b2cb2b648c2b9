//! The device core every other layer stands on: a device with its one stream, memory pool,
//! kernel cache and staging buffers; the strided tensor and its layouts; launching a compiled
//! kernel; timing. It imports nothing from the layers above (kernels, BLAS, cuDNN, NCCL, the
//! burn backend), so each of those can be read, tested and changed against this floor alone;
//! a per-device resource of a library above (cuBLASLt's handle, cuDNN's plans) lives with that
//! library, keyed by device ordinal.

pub mod alloc;
pub mod device;
pub(crate) mod download;
pub mod dtype;
pub mod experts;
pub mod fp8_operand;
pub(crate) mod host_pass;
pub mod kernel_cache;
pub mod launch;
pub mod layout;
pub(crate) mod read_later;
pub(crate) mod staging;
pub mod tensor;
pub mod timing;
