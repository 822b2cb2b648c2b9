//! Ferrotron's CUDA engine: device buffers, strided tensors, NVRTC-generated kernels and
//! cuBLASLt matmul, on `cudarc` with dynamic loading (so it builds where there is no GPU and
//! no toolkit). The burn `Backend` built on top lives in `backend`.
//!
//! Why our own engine instead of burn-cuda: cuBLASLt bf16 GEMMs reach about 800 TFLOP/s on an
//! H200 from Rust, stock burn-cuda 0.21 about 94 (see `/work/shared/design.md`). The engine is
//! deliberately small: one stream per device, one generic generator per kernel family, views
//! instead of copies. Every tensor-level function below is re-exported here so the backend maps
//! burn's ops onto it one to one.

pub mod alloc;
pub mod backend;
pub mod blas;
mod blas_tune;
pub mod cudnn;
pub mod device;
mod download;
pub mod dtype;
pub mod error;
pub mod fp8;
mod fused_ops;
pub mod grouped_blas;
mod host_pass;
pub mod kernels;
pub mod layout;
pub mod linear;
pub mod nccl;
mod parallel_ops;
pub mod random;
mod read_later;
mod staging;
pub mod switches;
pub mod tensor;
pub mod timing;

pub use alloc::MemorySnapshot;
pub use backend::{Cuda, GpuDevice};
pub use blas::{matmul, matmul_bias};
pub use device::{CudaDevice, device_count, driver_available};
pub use dtype::{DType, Scalar};
pub use error::{CudaError, OpContext, Result};
pub use kernels::elementwise::{
    BinaryOp, CompareOp, UnaryOp, arange, binary, binary_scalar, cast, clamp, compare,
    compare_scalar, copy, full, mask_fill, ones, scalar_binary, unary, where_, zeros,
};
pub use kernels::index::{
    ScatterReduce, cat, gather, repeat_dim, scatter, select, select_assign, slice_assign,
};
pub use kernels::reduce::{ArgOp, ReduceOp, arg_reduce_dim, reduce_all, reduce_dim};
pub use kernels::scan::{ScanOp, cumulative};
pub use kernels::sort::{argsort, sort, sort_with_indices};
pub use layout::{Layout, MAX_RANK, SliceArg};
pub use random::{Distribution, random};
pub use tensor::CudaTensor;
