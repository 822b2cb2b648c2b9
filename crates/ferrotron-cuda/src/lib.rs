//! Ferrotron's CUDA engine: device buffers, strided tensors, NVRTC-generated kernels and
//! cuBLASLt matmul, on `cudarc` with dynamic loading (so it builds where there is no GPU and
//! no toolkit), and the burn `Backend` built on top.
//!
//! Why our own engine instead of burn-cuda: cuBLASLt bf16 GEMMs reach about 800 TFLOP/s on an
//! H200 from Rust, stock burn-cuda 0.21 about 94 (see `/work/shared/design.md`). The engine is
//! deliberately small: one stream per device, one generic generator per kernel family, views
//! instead of copies.
//!
//! The crate is built in layers, each importing only the ones below it (`layering.rs` checks):
//! `engine` (device, memory, tensor, launch), `kernels` (the sources we generate: `prim`, then
//! `fused` and `fp8` on top), `blas` (cuBLASLt/cuBLAS GEMMs), `cudnn` (fused attention) and
//! `backend` (burn's op traits and Ferrotron's `FusedOps`/`ParallelOps` over all of them);
//! `nccl` stands on the engine alone. A layer can so be read and changed against the floors
//! below it, and a new kernel family or library lands in one room. Every tensor-level function
//! is re-exported here so the backend maps burn's ops onto it one to one.

pub mod backend;
pub mod blas;
pub mod cudnn;
pub mod engine;
pub mod error;
pub mod kernels;
#[cfg(test)]
mod layering;
pub mod nccl;
pub mod switches;

pub use backend::{Cuda, GpuDevice};
pub use blas::{matmul, matmul_bias};
pub use engine::alloc::MemorySnapshot;
pub use engine::device::{CudaDevice, device_count, driver_available};
pub use engine::dtype::{DType, Scalar};
pub use engine::layout::{Layout, MAX_RANK, SliceArg};
pub use engine::tensor::CudaTensor;
pub use engine::timing;
pub use error::{CudaError, OpContext, Result};
pub use kernels::prim::elementwise::{
    BinaryOp, CompareOp, UnaryOp, arange, binary, binary_scalar, cast, clamp, compare,
    compare_scalar, copy, full, mask_fill, ones, scalar_binary, unary, where_, zeros,
};
pub use kernels::prim::index::{
    ScatterReduce, cat, gather, repeat_dim, scatter, select, select_assign, slice_assign,
};
pub use kernels::prim::random::{Distribution, random};
pub use kernels::prim::reduce::{ArgOp, ReduceOp, arg_reduce_dim, reduce_all, reduce_dim};
pub use kernels::prim::scan::{ScanOp, cumulative};
pub use kernels::prim::sort::{argsort, sort, sort_with_indices};

/// fp8 training's surface for callers (`ferrotron-gpu-check`): the casts and scale update
/// (`kernels/fp8`) and the fp8 GEMM (`blas/fp8_gemm.rs`) under one name.
pub mod fp8 {
    pub use crate::blas::fp8_gemm::{Operand, fp8_matmul};
    pub use crate::kernels::fp8::*;
}
