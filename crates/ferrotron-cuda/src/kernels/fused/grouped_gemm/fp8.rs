//! The experts' grouped matmul on fp8 operands, the row counts read on the device: the TMA
//! kernels of `grouped_gemm_sm90_tma.cu` with Hopper's fp8 `wgmma`.
//!
//! Why two products, not three: Hopper's fp8 MMAs read both operands with the reduction
//! contiguous ("TN", as cuBLASLt's fp8 GEMMs in `blas/fp8_gemm.rs`), so the three products of a
//! linear are two kernels over the right casts, as Transformer Engine's are: the forward
//! `x · W_g` is rows of `x` against `W_gᵀ [n, k]`, the input gradient `dy · W_gᵀ` rows of `dy`
//! against `W_g [k, n]` ([`fp8_rows`] both); the weight gradient `x_gᵀ · dy_g` reduces over the
//! group's rows of `xᵀ [k, rows]` and `dyᵀ [n, rows]` ([`fp8_inner`]), whose groups start
//! anywhere: the TMA box starts at the group's first column and the kernel zeroes the last
//! step's columns past the group, so no group is padded. Each expert's weight may carry its own
//! inverse scale.

use ferrotron_ops::fp8::scaling::Fp8Format;

use super::tma::{self, Scales};
use super::{Fp8Mma, GroupedGemm, Kernel, Product, TILE, device_counts};
use crate::engine::dtype::DType;
use crate::engine::fp8_operand::Operand;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};

/// What the fp8 kernels take: fp8 bytes (`u8`), 16-byte-aligned rows, formats Hopper pairs
/// (not e5m2 × e5m2), a 16-bit output, one of the TMA kernels, at most `tma::MAX_GROUPS` groups.
fn check(
    kernel: Kernel,
    a: Fp8Format,
    b: Fp8Format,
    out: DType,
    groups: usize,
    op: &OpContext,
) -> Result<()> {
    if !matches!(kernel, Kernel::HopperTma | Kernel::HopperTmaCluster) {
        return Err(CudaError::unsupported(
            op.clone(),
            "fp8 grouped GEMMs run on the TMA kernels only",
        ));
    }
    if a == Fp8Format::E5m2 && b == Fp8Format::E5m2 {
        return Err(CudaError::unsupported(
            op.clone(),
            "e5m2 × e5m2 has no Hopper MMA",
        ));
    }
    if !matches!(out, DType::BF16 | DType::F16) {
        return Err(CudaError::unsupported(
            op.clone(),
            "fp8 grouped GEMMs write bf16 or f16",
        ));
    }
    if !(1..=super::tma::MAX_GROUPS).contains(&groups) {
        return Err(CudaError::unsupported(
            op.clone(),
            format!("1 to {} groups", super::tma::MAX_GROUPS),
        ));
    }
    Ok(())
}

/// An fp8 matrix the TMA reads: `u8`, its columns contiguous, its rows 16-byte aligned, its
/// `[1]` (or, for `per_group`, `[groups]`) f32 inverse scale.
fn operand_ok(t: &CudaTensor, scale: &CudaTensor, scales: usize, op: &OpContext) -> Result<()> {
    let rows_aligned =
        matches!(t.strides(), &[stride, 1] if stride > 0 && (stride as usize).is_multiple_of(16));
    if t.dtype() != DType::U8 || t.rank() != 2 || !rows_aligned || !t.data_ptr().is_multiple_of(16)
    {
        return Err(CudaError::invalid(
            op.clone(),
            "an fp8 operand is a u8 matrix with contiguous columns and rows 16-byte aligned",
        ));
    }
    if scale.dtype() != DType::F32 || scale.shape() != [scales] || !scale.is_contiguous() {
        return Err(CudaError::invalid(
            op.clone(),
            format!("an inverse scale is [{scales}] f32"),
        ));
    }
    Ok(())
}

/// Row block `g` of `a [rows, k]` (`counts[g]` rows, on the device) times group `g`'s
/// `b[g] [n, k]` transposed, each product dequantised by `a`'s inverse scale and `b_scale_inv`'s
/// `[groups]` entry `g` (or its one `[1]` value) → `[rows, n]` in `out`. `fast_accumulation`
/// chains the fp8 MMAs over the whole reduction (the forward's); otherwise each 128-element
/// step is promoted into an f32 total (the gradients').
#[allow(clippy::too_many_arguments)]
pub fn fp8_rows(
    kernel: Kernel,
    a: Operand<'_>,
    b: &[CudaTensor],
    b_format: Fp8Format,
    b_scale_inv: &CudaTensor,
    counts: &CudaTensor,
    out: DType,
    fast_accumulation: bool,
) -> Result<CudaTensor> {
    let op = OpContext::new(format!(
        "fp8 grouped gemm {}·{}ᵀ",
        a.format.name(),
        b_format.name()
    ))
    .shape(a.data.shape())
    .shape(b.first().map_or(&[][..], CudaTensor::shape));
    let groups = b.len();
    check(kernel, a.format, b_format, out, groups, &op)?;
    let per_group = b_scale_inv.numel() == groups && groups > 1;
    operand_ok(a.data, a.scale_inv, 1, &op)?;
    let &[rows, k] = a.data.shape() else {
        return Err(CudaError::invalid(op, "a is [rows, k]"));
    };
    let n = b[0].shape().first().copied().unwrap_or(0);
    for weight in b {
        operand_ok(weight, b_scale_inv, if per_group { groups } else { 1 }, &op)?;
        if weight.shape() != [n, k] {
            return Err(CudaError::invalid(
                op,
                format!("every group's b is [{n}, {k}]"),
            ));
        }
    }
    if !k.is_multiple_of(128) || !n.is_multiple_of(128) {
        return Err(CudaError::unsupported(op, "k and n multiples of 128"));
    }
    let counts = device_counts(counts, groups, &op)?;
    let output = CudaTensor::empty(a.data.device(), &[rows, n], out)?;
    if rows == 0 {
        return Ok(output);
    }
    let spec = GroupedGemm {
        dtype: out,
        groups,
        product: Product::Forward,
        kernel,
        tile_cols: if fast_accumulation {
            kernel.tile_cols(n)
        } else {
            TILE
        },
        fp8: Some(Fp8Mma {
            a: a.format,
            b: b_format,
            split: !fast_accumulation,
        }),
    };
    let scales = Scales {
        a: a.scale_inv.data_ptr(),
        b: b_scale_inv.data_ptr(),
        b_step: i64::from(per_group),
    };
    tma::rows_product(&spec, a.data, b, &counts, &output, Some(scales), &op)?;
    Ok(output)
}

/// For each group `g`, the sum over its rows (`counts[g]`, on the device) of `a_t [m, rows]`'s
/// and `b_t [n, rows]`'s columns: `a_t[:, rows_g] · b_t[:, rows_g]ᵀ`, dequantised by both inverse
/// scales → `[groups, m, n]` in `out` (zeros for a group without rows), each 128-element step
/// promoted into an f32 total (a reduction over thousands of rows).
pub fn fp8_inner(
    kernel: Kernel,
    a_t: Operand<'_>,
    b_t: Operand<'_>,
    counts: &CudaTensor,
    groups: usize,
    out: DType,
) -> Result<CudaTensor> {
    let op = OpContext::new(format!(
        "fp8 grouped gemm {}ᵀ·{} over groups' rows",
        a_t.format.name(),
        b_t.format.name()
    ))
    .shape(a_t.data.shape())
    .shape(b_t.data.shape());
    check(kernel, a_t.format, b_t.format, out, groups, &op)?;
    operand_ok(a_t.data, a_t.scale_inv, 1, &op)?;
    operand_ok(b_t.data, b_t.scale_inv, 1, &op)?;
    let (&[m, rows], &[n, rows2]) = (a_t.data.shape(), b_t.data.shape()) else {
        return Err(CudaError::invalid(op, "aᵀ is [m, rows], bᵀ [n, rows]"));
    };
    if rows != rows2 {
        return Err(CudaError::invalid(op, "aᵀ and bᵀ have the same rows"));
    }
    if !m.is_multiple_of(128) || !n.is_multiple_of(128) {
        return Err(CudaError::unsupported(op, "m and n multiples of 128"));
    }
    let counts = device_counts(counts, groups, &op)?;
    if rows == 0 {
        return crate::kernels::prim::elementwise::zeros(a_t.data.device(), &[groups, m, n], out);
    }
    let output = CudaTensor::empty(a_t.data.device(), &[groups, m, n], out)?;
    let spec = GroupedGemm {
        dtype: out,
        groups,
        product: Product::WeightGrad,
        kernel,
        tile_cols: TILE,
        fp8: Some(Fp8Mma {
            a: a_t.format,
            b: b_t.format,
            split: true,
        }),
    };
    let scales = Scales {
        a: a_t.scale_inv.data_ptr(),
        b: b_t.scale_inv.data_ptr(),
        b_step: 0,
    };
    tma::weight_grad(
        &spec,
        a_t.data,
        b_t.data,
        &counts,
        &output,
        Some(scales),
        &op,
    )?;
    Ok(output)
}
