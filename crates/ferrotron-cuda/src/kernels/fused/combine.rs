//! The MoE combine (`ferrotron_ops::FusedOps::fused_combine_rows`) in one kernel each way: the
//! forward one block per token, summing its `k` slots' rows in f32 in slot order; the backward
//! one block per slot, writing its row's gradient and reducing its weight's. Composed, the same
//! took a gather, a multiply and a sum forward and five passes backward over `tokens · k ·
//! hidden` values (`op/combine.rs` in the ops crate says which).

use crate::engine::dtype::DType;
use crate::engine::launch::{KernelSpec, Params};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::template::{Hole, template};

use super::{BLOCK_SUM, WARP_SUM, launch_per_row};
use crate::kernels::fused::moe::MAX_TOPK;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum CombineKernel {
    Forward { dtype: DType, k: usize },
    Backward { dtype: DType, k: usize },
}

impl KernelSpec for CombineKernel {
    fn source(&self) -> String {
        let (CombineKernel::Forward { dtype, k } | CombineKernel::Backward { dtype, k }) = *self;
        let mut holes = vec![
            ("DTYPE_NAME", Hole::Name(dtype)),
            ("K", Hole::Int(k as i64)),
            ("HALF", Hole::Flag(dtype.needs_half_headers())),
            ("T", Hole::Storage(dtype)),
        ];
        match self {
            CombineKernel::Forward { .. } => {
                holes.extend([
                    ("LOAD_WEIGHT", Hole::code(dtype.load_expr("weights[s]"))),
                    ("LOAD_ROW", Hole::code(dtype.load_expr("from[s][h]"))),
                    ("STORE_OUT", Hole::code(dtype.store_expr("acc"))),
                ]);
                template!("combine_forward.cu").fill(&holes)
            }
            CombineKernel::Backward { .. } => {
                holes.extend([
                    ("WARP_SUM", Hole::code(WARP_SUM)),
                    ("BLOCK_SUM", Hole::code(BLOCK_SUM)),
                    ("LOAD_WEIGHT", Hole::code(dtype.load_expr("weights[slot]"))),
                    ("LOAD_GRAD", Hole::code(dtype.load_expr("grad[h]"))),
                    ("LOAD_ROW", Hole::code(dtype.load_expr("x[h]"))),
                    ("STORE_D_ROW", Hole::code(dtype.store_expr("w * g"))),
                    ("STORE_D_WEIGHT", Hole::code(dtype.store_expr("dot"))),
                ]);
                template!("combine_backward.cu").fill(&holes)
            }
        }
    }
}

/// Whether the kernels take these operands: `rows [r, h]` and `weights` of one float dtype,
/// `k` within [`MAX_TOPK`].
pub fn supports(rows: &CudaTensor, weights: &CudaTensor, k: usize) -> bool {
    rows.rank() == 2
        && rows.dtype().is_float()
        && weights.dtype() == rows.dtype()
        && (1..=MAX_TOPK).contains(&k)
}

/// Checks the operands: `(slots, hidden)`.
fn check(
    rows: &CudaTensor,
    index: &CudaTensor,
    weights: &CudaTensor,
    k: usize,
    op: &dyn Fn() -> OpContext,
) -> Result<(usize, usize)> {
    if !supports(rows, weights, k) {
        return Err(CudaError::unsupported(
            op(),
            format!("float rows [r, h], weights of their dtype, 1 ≤ k ≤ {MAX_TOPK}"),
        ));
    }
    let slots = index.numel();
    if index.dtype() != DType::I64 || weights.numel() != slots || !slots.is_multiple_of(k) {
        return Err(CudaError::invalid(
            op(),
            format!("an i64 index and weights of tokens · {k} slots each"),
        ));
    }
    Ok((slots, rows.shape()[1]))
}

/// `rows [r, h]` → `[slots / k, h]`: each token's slots' rows (`index`, `r` for a dropped slot)
/// times their weights, summed.
pub fn forward(
    rows: &CudaTensor,
    index: &CudaTensor,
    weights: &CudaTensor,
    k: usize,
) -> Result<CudaTensor> {
    let op = || {
        OpContext::new("moe_combine")
            .shape(rows.shape())
            .shape(index.shape())
            .dtype(rows.dtype())
    };
    let (slots, hidden) = check(rows, index, weights, k, &op)?;
    let (rows, index, weights) = (
        rows.contiguous()?,
        index.contiguous()?,
        weights.contiguous()?,
    );
    let tokens = slots / k;
    let out = CudaTensor::empty(rows.device(), &[tokens, hidden], rows.dtype())?;
    if tokens == 0 || hidden == 0 {
        return Ok(out);
    }
    let mut params = Params::new();
    params
        .ptr(rows.data_ptr())
        .ptr(index.data_ptr())
        .ptr(weights.data_ptr())
        .ptr(out.data_ptr())
        .int(hidden as i64)
        .int(rows.shape()[0] as i64);
    let spec = CombineKernel::Forward {
        dtype: rows.dtype(),
        k,
    };
    launch_per_row(rows.device(), &spec, tokens, hidden, &params, &op)?;
    Ok(out)
}

/// The rows' gradient `[r, h]` and the weights' `[slots]` from the output gradient `[slots / k,
/// h]`. Every row must be read by exactly one slot (the routing's permutation): each is
/// written by that slot's block.
pub fn backward(
    rows: &CudaTensor,
    index: &CudaTensor,
    weights: &CudaTensor,
    grad: &CudaTensor,
    k: usize,
) -> Result<(CudaTensor, CudaTensor)> {
    let op = || {
        OpContext::new("moe_combine backward")
            .shape(rows.shape())
            .shape(grad.shape())
            .dtype(rows.dtype())
    };
    let (slots, hidden) = check(rows, index, weights, k, &op)?;
    if grad.shape() != [slots / k, hidden] {
        return Err(CudaError::invalid(
            op(),
            format!("the output gradient must be [{}, {hidden}]", slots / k),
        ));
    }
    let grad = grad.cast(rows.dtype())?.contiguous()?;
    let (rows, index, weights) = (
        rows.contiguous()?,
        index.contiguous()?,
        weights.contiguous()?,
    );
    let device = rows.device();
    let d_rows = CudaTensor::empty(device, rows.shape(), rows.dtype())?;
    let d_weights = CudaTensor::empty(device, &[slots], rows.dtype())?;
    if slots == 0 {
        return Ok((d_rows, d_weights));
    }
    let mut params = Params::new();
    params
        .ptr(rows.data_ptr())
        .ptr(index.data_ptr())
        .ptr(weights.data_ptr())
        .ptr(grad.data_ptr())
        .ptr(d_rows.data_ptr())
        .ptr(d_weights.data_ptr())
        .int(hidden as i64)
        .int(rows.shape()[0] as i64);
    let spec = CombineKernel::Backward {
        dtype: rows.dtype(),
        k,
    };
    launch_per_row(device, &spec, slots, hidden, &params, &op)?;
    Ok((d_rows, d_weights))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for k in [1, 2, 8] {
                sources.push(CombineKernel::Forward { dtype, k }.source());
                sources.push(CombineKernel::Backward { dtype, k }.source());
            }
        }
        sources
    }

    #[test]
    fn combine_sources_are_unchanged() {
        insta::assert_snapshot!(crate::kernels::digests(&sources()));
    }

    #[test]
    fn kernels_are_named_after_their_pass() {
        let names: Vec<String> = [
            CombineKernel::Forward {
                dtype: DType::BF16,
                k: 2,
            },
            CombineKernel::Backward {
                dtype: DType::F32,
                k: 8,
            },
        ]
        .iter()
        .map(|spec| crate::engine::kernel_cache::kernel_name(&spec.source()))
        .collect();
        assert_eq!(
            names,
            [
                "moe_combine_forward_bf16_k_2",
                "moe_combine_backward_f32_k_8"
            ]
        );
    }

    /// Every generated source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn combine_sources_compile() {
        for source in sources() {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
