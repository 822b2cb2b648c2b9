//! Column sums of per-block partial sums, `Σ_bands partial [bands, cols]` → `[cols]`: the last
//! step of reductions whose blocks each write one row of partial sums instead of adding into
//! the output with atomics (the fp8 casts' bias gradients, the one-pass norm backward's γ and β
//! gradients). The bands are added in a fixed order, so the result is the same on every run.

use crate::engine::dtype::DType;
use crate::engine::launch::{KernelSpec, Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::template::{Hole, template};

/// A block of 32 columns × [`SUM_GROUPS`] groups of bands, each thread adding every
/// `SUM_GROUPS`-th band of its column, then the groups added in order; stored as `output`. One
/// thread a column walking all of a gpt-1.3b step's 384 tile rows took 48 µs a call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ColumnSum {
    output: DType,
}

/// Groups of bands a [`ColumnSum`] block splits a column's bands into (its threads: 32 × this).
const SUM_GROUPS: u32 = 8;

impl KernelSpec for ColumnSum {
    fn source(&self) -> String {
        let out = self.output;
        template!("column_sum.cu").fill(&[
            ("OUT_NAME", Hole::Name(out)),
            ("HALF", Hole::Flag(out.needs_half_headers())),
            ("GROUPS", Hole::Int(SUM_GROUPS.into())),
            ("OUT", Hole::Storage(out)),
            ("STORE_TOTAL", Hole::code(out.store_expr("total"))),
        ])
    }
}

/// `Σ_bands partial [bands, cols]` (f32, contiguous) as `[cols]` in `dtype`.
pub(crate) fn column_sum(
    partial: &CudaTensor,
    dtype: DType,
    ctx: &dyn Fn() -> OpContext,
) -> Result<CudaTensor> {
    let [bands, cols] = [partial.shape()[0], partial.shape()[1]];
    let out = CudaTensor::empty(partial.device(), &[cols], dtype)?;
    let mut params = Params::new();
    params
        .int(bands as i64)
        .int(cols as i64)
        .ptr(partial.data_ptr())
        .ptr(out.data_ptr());
    let spec = ColumnSum { output: dtype };
    let grid = u32::try_from(cols.div_ceil(32))
        .map_err(|_| CudaError::unsupported(ctx(), "more than 2^37 columns"))?;
    launch(partial.device(), &spec, grid, 32 * SUM_GROUPS, &params, ctx)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_sum_sources_are_unchanged() {
        let sources =
            [DType::F32, DType::BF16, DType::F16].map(|output| ColumnSum { output }.source());
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    /// The sources compile for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn column_sum_sources_compile() {
        for output in [DType::F32, DType::BF16, DType::F16] {
            let source = ColumnSum { output }.source();
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
