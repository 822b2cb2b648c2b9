//! Linear layers as single GEMMs: the batch dims fold into M (a view for the activations
//! models produce), the bias rides cuBLASLt's epilogue, the weight gradient is one
//! `xᵀ·dy` GEMM over all tokens and the bias gradient comes out of that GEMM's epilogue (or,
//! alone, one `1ᵀ·dy` GEMV). burn's defaults use a batched GEMM with a stride-0 weight and a
//! weight gradient of per-batch GEMMs plus a sum.
//!
//! The GEMV read all of `dy` again for one vector: at gpt-1.3b's 12 × 2048 tokens four of them a
//! layer took 242 µs, 1.5 % of a step (one H200, 2026-12-05), where the weight-gradient GEMM
//! reads `dy` anyway. `FERROTRON_BIAS_GRAD_EPILOGUE=off` keeps the GEMV, to compare.

use std::sync::OnceLock;

use crate::blas::{matmul, matmul_bias, matmul_column_sums};
use crate::error::{CudaError, Result};
use crate::kernels::elementwise::ones;
use crate::tensor::CudaTensor;

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

/// Whether the bias gradient rides the weight-gradient GEMM (read once per process).
fn epilogue_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    crate::switches::enabled(&ON, "FERROTRON_BIAS_GRAD_EPILOGUE")
}

/// [`linear_weight_backward`] and [`linear_bias_backward`] of the same `dy` from one GEMM whose
/// epilogue sums `dy` over the tokens; where cuBLASLt offers no algorithm for that epilogue,
/// the GEMM and the GEMV.
pub fn linear_weight_bias_backward(
    x: &CudaTensor,
    grad: &CudaTensor,
) -> Result<(CudaTensor, CudaTensor)> {
    if epilogue_on()
        && let Some(both) = matmul_column_sums(&fold(x)?.swap_dims(0, 1)?, &fold(grad)?)?
    {
        return Ok(both);
    }
    Ok((
        linear_weight_backward(x, grad)?,
        linear_bias_backward(grad)?,
    ))
}
