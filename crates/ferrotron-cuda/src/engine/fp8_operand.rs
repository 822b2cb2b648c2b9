//! An fp8 operand of a GEMM, in the engine because two layers side by side take it: cuBLASLt's
//! fp8 GEMMs (`blas/fp8_gemm.rs`) and the grouped kernels (`kernels/fused/grouped_gemm`).

use ferrotron_ops::fp8::scaling::Fp8Format;

use crate::engine::tensor::CudaTensor;

/// `[rows, k]` fp8 bytes, their format, their `[1]` f32 inverse scale.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    pub data: &'a CudaTensor,
    pub format: Fp8Format,
    pub scale_inv: &'a CudaTensor,
}
