//! The fp8 experts' grouped GEMMs for [`Cuda`] (`FusedOps::fp8_grouped_rows`,
//! `fp8_grouped_inner`): the device-count TMA kernels (`kernels/fused/grouped_gemm/fp8.rs`), the
//! routing's counts never read to the host. fp8 runs are refused below Hopper
//! (`FusedOps::fp8_support`), so these have no fallback: a shape the kernels do not take fails
//! with the reason.

use burn::tensor::DType as BurnDType;
use ferrotron_ops::{Fp8Operand, GroupRows};

use crate::backend::Cuda;
use crate::backend::convert::{engine_dtype, ok};
use crate::backend::fused_ops::fp8::operand;
use crate::engine::dtype::DType;
use crate::engine::fp8_operand::Operand;
use crate::engine::layout::SliceArg;
use crate::engine::tensor::CudaTensor;
use crate::kernels::fused::grouped_gemm::{self, Kernel};
use crate::kernels::prim::elementwise::{copy_into, zeros};
use crate::kernels::prim::index::cat;

fn counts(group_rows: &GroupRows<Cuda>, on: &CudaTensor) -> CudaTensor {
    group_rows.device(&crate::backend::shared::device(on))
}

/// `FusedOps::fp8_grouped_rows`: each group's weight with its own inverse scale (the scales
/// joined into one `[groups]` tensor, one small copy).
pub(crate) fn fp8_grouped_rows_op(
    a: Fp8Operand<Cuda>,
    b: &[Fp8Operand<Cuda>],
    group_rows: &GroupRows<Cuda>,
    dtype: BurnDType,
    fast_accumulation: bool,
) -> CudaTensor {
    let format = b.first().map(|b| b.format).expect("at least one group");
    let scales: Vec<CudaTensor> = b.iter().map(|b| b.scale_inv.clone()).collect();
    let scales = ok(cat(&scales, 0));
    let weights: Vec<CudaTensor> = b.iter().map(|b| b.data.clone()).collect();
    let counts = counts(group_rows, &a.data);
    ok(grouped_gemm::fp8_rows(
        Kernel::chosen_fp8(),
        operand(&a),
        &weights,
        format,
        &scales,
        &counts,
        ok(engine_dtype(dtype)),
        fast_accumulation,
    ))
}

/// `FusedOps::fp8_grouped_inner`: the transposed casts' rows padded to 16 bytes first where
/// the routed rows are not a multiple of 16 (the TMA's stride rule), as a view of a padded copy.
pub(crate) fn fp8_grouped_inner_op(
    a_t: Fp8Operand<Cuda>,
    b_t: Fp8Operand<Cuda>,
    group_rows: &GroupRows<Cuda>,
    dtype: BurnDType,
) -> CudaTensor {
    let groups = group_rows.groups();
    let counts = counts(group_rows, &a_t.data);
    let (a, b) = (padded(&a_t.data), padded(&b_t.data));
    ok(grouped_gemm::fp8_inner(
        Kernel::chosen_fp8(),
        Operand {
            data: &a,
            ..operand(&a_t)
        },
        Operand {
            data: &b,
            ..operand(&b_t)
        },
        &counts,
        groups,
        ok(engine_dtype(dtype)),
    ))
}

/// `t [rows, cols]` of bytes with each row 16-byte aligned: itself where it is, else a view of
/// a copy whose rows are padded with zeros.
fn padded(t: &CudaTensor) -> CudaTensor {
    let &[rows, cols] = t.shape() else {
        return t.clone();
    };
    let aligned = matches!(t.strides(), &[stride, 1] if (stride as usize).is_multiple_of(16));
    if aligned && t.data_ptr().is_multiple_of(16) {
        return t.clone();
    }
    let wide = ok(zeros(
        t.device(),
        &[rows, cols.div_ceil(16) * 16],
        DType::U8,
    ));
    let view = ok(wide.slice(&[SliceArg::full(rows), SliceArg::range(0, cols)]));
    ok(copy_into(&view, t));
    view
}
