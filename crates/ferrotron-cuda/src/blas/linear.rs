//! Linear layers as single GEMMs: the batch dims fold into M (a view for the activations
//! models produce), the bias rides cuBLASLt's epilogue, the weight gradient is one
//! `xᵀ·dy` GEMM over all tokens and the bias gradient one `1ᵀ·dy` GEMV. burn's defaults use a
//! batched GEMM with a stride-0 weight and a weight gradient of per-batch GEMMs plus a sum.
//!
//! The GEMV reads all of `dy` again for one vector. cuBLASLt's bias-gradient epilogue (`BGRADA`,
//! its A being our `dy`) on the weight-gradient GEMM would spare that read, but on one H200
//! (gpt-1.3b at 12 × 2048; tools/README.md) it slowed the four weight-gradient GEMMs of a layer by
//! 359 µs where the four GEMVs take 242: the pair stays.

use crate::blas::{matmul, matmul_bias};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, Result};
use crate::kernels::prim::elementwise::ones;

/// `[.., k]` → `[M, k]` (a view when the leading dims are contiguous).
fn fold(x: &CudaTensor) -> Result<CudaTensor> {
    let k = *x.shape().last().unwrap_or(&1);
    let m = x.numel().checked_div(k).unwrap_or(0);
    x.reshape(&[m, k])
}

fn unfold(y: CudaTensor, like: &[usize], last: usize) -> Result<CudaTensor> {
    let mut shape = like.to_vec();
    if let Some(l) = shape.last_mut() {
        *l = last;
    }
    y.reshape(&shape)
}

fn check_weight(weight: &CudaTensor, op: &str) -> Result<()> {
    if weight.rank() != 2 {
        return Err(CudaError::invalid(
            weight.op(op),
            "linear weight must be [d_input, d_output]",
        ));
    }
    Ok(())
}

/// `x [.., in] · weight [in, out] (+ bias [out])`.
pub fn linear(
    x: &CudaTensor,
    weight: &CudaTensor,
    bias: Option<&CudaTensor>,
) -> Result<CudaTensor> {
    check_weight(weight, "linear")?;
    let out = weight.shape()[1];
    let y = matmul_bias(&fold(x)?, weight, bias)?;
    unfold(y, x.shape(), out)
}

/// `dy [.., out] · weightᵀ`.
pub fn linear_x_backward(weight: &CudaTensor, grad: &CudaTensor) -> Result<CudaTensor> {
    check_weight(weight, "linear_x_backward")?;
    let input = weight.shape()[0];
    let dx = matmul(&fold(grad)?, &weight.swap_dims(0, 1)?)?;
    unfold(dx, grad.shape(), input)
}

/// `xᵀ · dy` over every token: `[in, out]`.
pub fn linear_weight_backward(x: &CudaTensor, grad: &CudaTensor) -> Result<CudaTensor> {
    matmul(&fold(x)?.swap_dims(0, 1)?, &fold(grad)?)
}

/// `Σ_tokens dy`: `[out]`, as one GEMV with a ones row (f32 accumulation).
pub fn linear_bias_backward(grad: &CudaTensor) -> Result<CudaTensor> {
    let g = fold(grad)?;
    let [m, n] = [g.shape()[0], g.shape()[1]];
    let one = ones(g.device(), &[1, m], g.dtype())?;
    matmul(&one, &g)?.reshape(&[n])
}
