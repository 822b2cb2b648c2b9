//! The gradient of the MoE dispatch's row gather (`ferrotron_ops::FusedOps::gather_rows_backward`)
//! in one kernel: each token's `group` rows of the gradient summed in f32, in group order, and
//! written once. Composed, a select wrote all `tokens · group` rows and a sum read them back:
//! at top-8 with a hidden of 2,048, half a gigabyte a layer and microbatch went through memory
//! twice for nothing. For groups of one and two the sums are the composed ones bit for bit
//! (the sum kernel accumulates in f32 as well).

use crate::engine::dtype::DType;
use crate::engine::launch::{KernelSpec, Params};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::template::{Hole, template};

use super::launch_per_row;

/// Rows a group sums at most (their pointers are kept in registers).
pub const MAX_GROUP: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GatherSum {
    dtype: DType,
    group: usize,
}

impl KernelSpec for GatherSum {
    fn source(&self) -> String {
        let dtype = self.dtype;
        template!("gather_sum.cu").fill(&[
            ("DTYPE_NAME", Hole::Name(dtype)),
            ("GROUP", Hole::Int(self.group as i64)),
            ("HALF", Hole::Flag(dtype.needs_half_headers())),
            ("T", Hole::Storage(dtype)),
            ("LOAD", Hole::code(dtype.load_expr("from[j][h]"))),
            ("STORE", Hole::code(dtype.store_expr("acc"))),
        ])
    }
}

/// Whether the kernel takes `grad [p, h]` (a float dtype) in groups of `group`.
pub fn supports(grad: &CudaTensor, group: usize) -> bool {
    grad.rank() == 2 && grad.dtype().is_float() && (1..=MAX_GROUP).contains(&group)
}

/// The rows of `grad [p, h]` at `back [m · group]` (i64, each in `0..p`), summed over each
/// group → `[m, h]`.
pub fn gather_sum(grad: &CudaTensor, back: &CudaTensor, group: usize) -> Result<CudaTensor> {
    let op = || {
        OpContext::new("gather_rows backward")
            .shape(grad.shape())
            .shape(back.shape())
            .dtype(grad.dtype())
    };
    if !supports(grad, group) {
        return Err(CudaError::unsupported(
            op(),
            format!("a float [rows, hidden] gradient, groups of 1 to {MAX_GROUP}"),
        ));
    }
    let reads = back.numel();
    if back.dtype() != DType::I64 || !reads.is_multiple_of(group) {
        return Err(CudaError::invalid(
            op(),
            format!("an i64 back index of rows · {group} entries"),
        ));
    }
    let (grad, back) = (grad.contiguous()?, back.contiguous()?);
    let (rows, hidden) = (reads / group, grad.shape()[1]);
    let out = CudaTensor::empty(grad.device(), &[rows, hidden], grad.dtype())?;
    if rows == 0 || hidden == 0 {
        return Ok(out);
    }
    let mut params = Params::new();
    params
        .ptr(grad.data_ptr())
        .ptr(back.data_ptr())
        .ptr(out.data_ptr())
        .int(hidden as i64);
    let spec = GatherSum {
        dtype: grad.dtype(),
        group,
    };
    launch_per_row(grad.device(), &spec, rows, hidden, &params, &op)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources() -> Vec<String> {
        [DType::F32, DType::BF16, DType::F16]
            .into_iter()
            .flat_map(|dtype| [1, 2, 8].map(|group| GatherSum { dtype, group }.source()))
            .collect()
    }

    #[test]
    fn gather_sum_sources_are_unchanged() {
        insta::assert_snapshot!(crate::kernels::digests(&sources()));
    }

    #[test]
    fn kernels_are_named_after_their_group() {
        let spec = GatherSum {
            dtype: DType::BF16,
            group: 8,
        };
        assert_eq!(
            crate::engine::kernel_cache::kernel_name(&spec.source()),
            "gather_sum_bf16_group_8"
        );
    }

    /// Every generated source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn gather_sum_sources_compile() {
        for source in sources() {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
