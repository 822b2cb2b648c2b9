//! Matrix products on NVIDIA's libraries: cuBLASLt GEMMs with bias epilogues (`gemm.rs`) and
//! their optional autotuning (`tune.rs`), the fp8 GEMM (`fp8_gemm.rs`), the MoE experts' grouped
//! GEMM on cuBLAS (`grouped.rs`) and the linear layer's forward and backward on them
//! (`linear.rs`). Kept apart from the generated kernels because these are library calls with
//! their own handles, plans and workspaces, not sources we write.

pub mod fp8_gemm;
pub mod gemm;
pub mod grouped;
pub mod linear;
pub(crate) mod tune;

pub use gemm::{matmul, matmul_bias};
