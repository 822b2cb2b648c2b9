//! GELU of a linear's output plus its bias (see `ferrotron_ops::FusedOps::fused_bias_gelu`):
//! the forward one map adding the bias on the way into GELU; the backward one pass writing
//! GELU's input gradient and, per band of rows, its f32 column sums, which `column_sum` adds in
//! a fixed order into the bias gradient. The linear's backward would otherwise read the
//! `[tokens, ffn]` gradient a second time for those sums. Math in f32, stored in the input's
//! dtype; the exact (erf) GELU of `elementwise::GELU`.

use crate::engine::dtype::DType;
use crate::engine::launch::{KernelSpec, Params, launch};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::prim::column_sum::column_sum;
use crate::kernels::prim::elementwise::{FAST_MATH, GELU, GELU_BACKWARD, MapScalars, run_map};
use crate::kernels::template::{Hole, template};

/// Threads of a backward block, each taking 8 columns.
const THREADS: u32 = 128;
/// Rows of a backward block's band: gpt-1.3b's `[24576, 8192]` makes 8 × 384 blocks and a
/// 12.6 MB partial, against the 403 MB gradient the pass writes.
const BAND_ROWS: usize = 64;

/// The backward pass over one dtype.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BiasGeluBackward {
    x: DType,
}

impl KernelSpec for BiasGeluBackward {
    fn source(&self) -> String {
        let x = self.x;
        let (pair, to_pair) = match x {
            DType::F16 => ("__half2", "__floats2half2_rn"),
            _ => ("__nv_bfloat162", "__floats2bfloat162_rn"),
        };
        template!("bias_gelu_backward.cu").fill(&[
            ("X_NAME", Hole::Name(x)),
            ("PAIR", Hole::code(pair)),
            ("TO_PAIR", Hole::code(to_pair)),
            ("HALF", Hole::Flag(x.needs_half_headers())),
            ("FAST_MATH", Hole::code(FAST_MATH.trim_end())),
            ("PACK_BYTES", Hole::Int(8 * x.size_in_bytes() as i64)),
            ("X", Hole::Storage(x)),
            ("GELU_BACKWARD", Hole::code(GELU_BACKWARD)),
            ("THREADS", Hole::Int(THREADS.into())),
            ("BAND_ROWS", Hole::Int(BAND_ROWS as i64)),
            ("LOAD_BIAS", Hole::code(x.load_expr("bias.v[j]"))),
            ("LOAD_X", Hole::code(x.load_expr("x.v[j]"))),
            ("LOAD_G", Hole::code(x.load_expr("g.v[j]"))),
        ])
    }
}

/// Whether the kernels take `x [.., n]` and `bias [n]`: one float dtype, `x` contiguous, both
/// aligned to 32 bytes (eight f32), `n` a multiple of 8 (the backward's vector of a thread).
pub fn supports(x: &CudaTensor, bias: &CudaTensor) -> bool {
    let (Some(&n), [len]) = (x.shape().last(), bias.shape()) else {
        return false;
    };
    matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && bias.dtype() == x.dtype()
        && n == *len
        && n.is_multiple_of(8)
        && x.numel() > 0
        && x.is_contiguous()
        && bias.is_contiguous()
        && [x.data_ptr(), bias.data_ptr()].iter().all(|p| p % 32 == 0)
}

/// `gelu(x + bias)`, `bias` broadcast over the rows.
pub fn bias_gelu_forward(x: &CudaTensor, bias: &CudaTensor) -> Result<CudaTensor> {
    let out = CudaTensor::empty(x.device(), x.shape(), x.dtype())?;
    run_map(
        "bias_gelu",
        &out,
        &[x, bias],
        FORWARD.into(),
        MapScalars::default(),
        &forward_helpers(),
    )?;
    Ok(out)
}

/// The forward map's expression: GELU at the input plus the bias.
const FORWARD: &str = "gelu_at(a + b)";

/// [`FAST_MATH`] and `gelu_at`, the exact GELU as a function of its input.
fn forward_helpers() -> String {
    format!(
        "{FAST_MATH}__device__ __forceinline__ float gelu_at(const float a) {{ return {GELU}; }}\n"
    )
}

/// `(dx, dbias)` from the output gradient `dy` (of `x`'s shape; cast to `x`'s dtype).
pub fn bias_gelu_backward(
    x: &CudaTensor,
    bias: &CudaTensor,
    dy: &CudaTensor,
) -> Result<(CudaTensor, CudaTensor)> {
    let ctx = || {
        OpContext::new("bias_gelu backward")
            .shape(x.shape())
            .shape(dy.shape())
            .dtype(x.dtype())
    };
    if !supports(x, bias) || dy.shape() != x.shape() {
        return Err(CudaError::invalid(
            ctx(),
            "expected x [.., n] contiguous, bias [n], dy like x, n a multiple of 8",
        ));
    }
    let dy = if dy.dtype() == x.dtype() {
        dy.contiguous()?
    } else {
        dy.cast(x.dtype())?.contiguous()?
    };
    let cols = bias.shape()[0];
    let rows = x.numel() / cols;
    let device = x.device();
    let dx = CudaTensor::empty(device, x.shape(), x.dtype())?;
    let bands = rows.div_ceil(BAND_ROWS);
    let partial = CudaTensor::empty(device, &[bands, cols], DType::F32)?;
    let column_blocks = cols.div_ceil(8 * THREADS as usize);
    let grid = u32::try_from(bands * column_blocks)
        .map_err(|_| CudaError::unsupported(ctx(), "more than 2^32 blocks"))?;
    let mut params = Params::new();
    params
        .int(rows as i64)
        .int(cols as i64)
        .int(column_blocks as i64)
        .ptr(x.data_ptr())
        .ptr(bias.data_ptr())
        .ptr(dy.data_ptr())
        .ptr(dx.data_ptr())
        .ptr(partial.data_ptr());
    launch(
        device,
        &BiasGeluBackward { x: x.dtype() },
        grid,
        THREADS,
        &params,
        &ctx,
    )?;
    let dbias = column_sum(&partial, x.dtype(), &ctx)?;
    Ok((dx, dbias))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_gelu_backward_sources_are_unchanged() {
        let sources =
            [DType::F32, DType::BF16, DType::F16].map(|x| BiasGeluBackward { x }.source());
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    /// The sources compile for sm_90 (NVRTC, no GPU needed): the backward pass and the
    /// forward map (bf16, the bias broadcast over rows, vectorised or not).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn bias_gelu_sources_compile() {
        let mut sources: Vec<String> = [DType::F32, DType::BF16, DType::F16]
            .map(|x| BiasGeluBackward { x }.source())
            .into();
        for vector in [false, true] {
            let spec = crate::kernels::prim::elementwise::MapSpec {
                name: "bias_gelu".into(),
                out: DType::BF16,
                inputs: vec![DType::BF16; 2],
                expr: FORWARD.into(),
                rank: 2,
                contiguous: vec![true, true, false],
                helpers: forward_helpers(),
                vector,
            };
            sources.push(spec.source());
        }
        for source in sources {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
