//! QK-norm on the packed QKV projection `[b, s, g, slots, d]` (see
//! `ferrotron_ops::FusedOps::fused_qk_norm`): every head row of `d` channels is one warp's,
//! held in registers (`d ≤ 256`, compiled in), normalised over its channels with warp shuffles
//! and scaled by the query's or the key's weight by its slot; the value slot is copied. The
//! forward keeps `1/σ` (and LayerNorm's mean) per normalised row in f32.
//!
//! The backward computes `dx` the same way, one warp a row, and sums each weight's (and bias's)
//! gradient in the warp's registers over the rows it visits, then over the block's warps in
//! shared memory, into one row of f32 partial sums per block: `[blocks, 2d]` (the query's
//! columns, then the key's), added in a fixed order by `column_sum`. The grid is a function of
//! the shape alone, so the sums do not change from run to run. Math in f32.

use crate::engine::dtype::DType;
use crate::engine::launch::{KernelSpec, Params, launch};
use crate::engine::layout::SliceArg;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::fused::{WARP_SUM, uses_half};
use crate::kernels::prim::column_sum::column_sum;
use crate::kernels::template::{Hole, template};

/// Warps (rows in flight) per block.
const WARPS: u32 = 8;
/// Most blocks of the backward (the rows of partial sums `column_sum` adds).
const BACKWARD_BLOCKS: usize = 1024;
/// Widest head row the kernels hold in registers.
pub const MAX_HEAD_DIM: usize = 256;

/// QK-norm forward.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct QkNormForward {
    x: DType,
    weight: DType,
    layer: bool,
    dim: usize,
}

impl QkNormForward {
    fn per_lane(&self) -> usize {
        self.dim.div_ceil(32)
    }
}

impl KernelSpec for QkNormForward {
    fn source(&self) -> String {
        let (x, w, dim) = (self.x, self.weight, self.dim);
        template!("qk_norm_forward.cu").fill(&[
            ("KIND", Hole::code(if self.layer { "layer" } else { "rms" })),
            ("X_NAME", Hole::Name(x)),
            ("WEIGHT_NAME", Hole::Name(w)),
            ("DIM", Hole::Int(dim as i64)),
            ("HALF", Hole::Flag(uses_half(&[x, w]))),
            ("WARP_SUM", Hole::code(WARP_SUM)),
            ("X", Hole::Storage(x)),
            ("WEIGHT", Hole::Storage(w)),
            ("PER_LANE", Hole::Int(self.per_lane() as i64)),
            ("LAYER", Hole::Flag(self.layer)),
            ("LOAD_X", Hole::code(x.load_expr("x[c]"))),
            ("LOAD_W", Hole::code(w.load_expr("w[c]"))),
            ("LOAD_B", Hole::code(w.load_expr("b[c]"))),
            ("STORE_OUT", Hole::code(x.store_expr("out"))),
        ])
    }
}

/// QK-norm backward: `dx`, and one row of the weights' (and biases') partial sums per block.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct QkNormBackward {
    x: DType,
    weight: DType,
    grad: DType,
    layer: bool,
    dim: usize,
}

impl KernelSpec for QkNormBackward {
    fn source(&self) -> String {
        let (x, w, dy, dim) = (self.x, self.weight, self.grad, self.dim);
        template!("qk_norm_backward.cu").fill(&[
            ("KIND", Hole::code(if self.layer { "layer" } else { "rms" })),
            ("X_NAME", Hole::Name(x)),
            ("WEIGHT_NAME", Hole::Name(w)),
            ("GRAD_NAME", Hole::Name(dy)),
            ("DIM", Hole::Int(dim as i64)),
            ("TWO_DIM", Hole::Int(2 * dim as i64)),
            ("HALF", Hole::Flag(uses_half(&[x, w, dy]))),
            ("WARP_SUM", Hole::code(WARP_SUM)),
            ("THREADS", Hole::Int((WARPS * 32).into())),
            ("WARPS", Hole::Int(WARPS.into())),
            ("SUMS", Hole::Int(if self.layer { 4 } else { 2 })),
            ("X", Hole::Storage(x)),
            ("WEIGHT", Hole::Storage(w)),
            ("GRAD", Hole::Storage(dy)),
            ("PER_LANE", Hole::Int(dim.div_ceil(32) as i64)),
            ("LAYER", Hole::Flag(self.layer)),
            ("COPY_DY", Hole::code(x.store_expr(&dy.load_expr("dy[c]")))),
            ("LOAD_X", Hole::code(x.load_expr("x[c]"))),
            ("LOAD_DY", Hole::code(dy.load_expr("dy[c]"))),
            ("LOAD_W", Hole::code(w.load_expr("w[c]"))),
            (
                "STORE_DX",
                Hole::code(x.store_expr("rstd * (gw[i] - mean_g - xh[i] * mean_gx)")),
            ),
        ])
    }
}

/// `(rows, slots, dim)` of a packed projection, checked against the weights.
fn check(qkv: &CudaTensor, weights: &[&CudaTensor], op: &str) -> Result<(usize, usize, usize)> {
    let ctx = || OpContext::new(op).shape(qkv.shape());
    let &[b, s, g, slots, d] = qkv.shape() else {
        return Err(CudaError::invalid(
            ctx(),
            "expected a packed projection [b, s, g, slots, d]",
        ));
    };
    if slots < 3 || d == 0 || d > MAX_HEAD_DIM {
        return Err(CudaError::invalid(
            ctx(),
            format!("expected slots >= 3 and a head dim of 1..={MAX_HEAD_DIM}"),
        ));
    }
    if weights
        .iter()
        .any(|w| w.shape() != [d] || w.dtype() != weights[0].dtype())
    {
        return Err(CudaError::invalid(
            ctx(),
            format!("the query and key parameters must be [{d}] of one dtype"),
        ));
    }
    Ok((b * s * g * slots, slots, d))
}

/// The normalised projection and the head rows' f32 statistics `[b, s, g, slots − 1, 1]`
/// (LayerNorm's mean where `bias` is given, and `1/σ`).
pub struct QkNormForwardOut {
    pub output: CudaTensor,
    pub mean: Option<CudaTensor>,
    pub rstd: CudaTensor,
}

/// QK-norm forward: `weight` `[query, key]`, `bias` likewise for a LayerNorm (RMSNorm without).
pub fn qk_norm_forward(
    qkv: &CudaTensor,
    weight: [&CudaTensor; 2],
    bias: Option<[&CudaTensor; 2]>,
    epsilon: f64,
) -> Result<QkNormForwardOut> {
    let params: Vec<&CudaTensor> = weight
        .iter()
        .copied()
        .chain(bias.into_iter().flatten())
        .collect();
    let (rows, slots, dim) = check(qkv, &params, "qk_norm_forward")?;
    let x = qkv.contiguous()?;
    let params: Vec<CudaTensor> = params
        .iter()
        .map(|p| p.contiguous())
        .collect::<Result<_>>()?;
    let device = x.device();
    let output = CudaTensor::empty(device, x.shape(), x.dtype())?;
    let mut stats_shape = x.shape().to_vec();
    stats_shape[3] = slots - 1;
    stats_shape[4] = 1;
    let layer = bias.is_some();
    let mean = layer
        .then(|| CudaTensor::empty(device, &stats_shape, DType::F32))
        .transpose()?;
    let rstd = CudaTensor::empty(device, &stats_shape, DType::F32)?;
    if rows == 0 {
        return Ok(QkNormForwardOut { output, mean, rstd });
    }
    let spec = QkNormForward {
        x: x.dtype(),
        weight: params[0].dtype(),
        layer,
        dim,
    };
    let bias_ptr = |i: usize| params.get(2 + i).map_or(0, CudaTensor::data_ptr);
    let mut p = Params::new();
    p.int(rows as i64)
        .int(slots as i64)
        .ptr(x.data_ptr())
        .ptr(params[0].data_ptr())
        .ptr(params[1].data_ptr())
        .ptr(bias_ptr(0))
        .ptr(bias_ptr(1))
        .ptr(output.data_ptr())
        .ptr(mean.as_ref().map_or(0, CudaTensor::data_ptr))
        .ptr(rstd.data_ptr())
        .float(epsilon);
    let op = || x.op("qk_norm_forward");
    launch(device, &spec, grid(rows), WARPS * 32, &p, &op)?;
    Ok(QkNormForwardOut { output, mean, rstd })
}

/// Blocks for `rows` rows: one row per warp up to the grid's bound (rows beyond it loop).
fn grid(rows: usize) -> u32 {
    rows.div_ceil(WARPS as usize).clamp(1, BACKWARD_BLOCKS) as u32
}

/// The gradients of a QK-norm: the packed projection's, and the `[query, key]` weights' and
/// (LayerNorm, `mean` given) biases' in the weights' dtype.
pub type QkNormBackwardOut = (CudaTensor, [CudaTensor; 2], Option<[CudaTensor; 2]>);

/// QK-norm backward from the forward's statistics and the output gradient.
pub fn qk_norm_backward(
    qkv: &CudaTensor,
    weight: [&CudaTensor; 2],
    mean: Option<&CudaTensor>,
    rstd: &CudaTensor,
    grad: &CudaTensor,
) -> Result<QkNormBackwardOut> {
    let (rows, slots, dim) = check(qkv, &weight, "qk_norm_backward")?;
    let op = || qkv.op("qk_norm_backward");
    if grad.shape() != qkv.shape() {
        return Err(CudaError::invalid(
            op().shape(grad.shape()),
            "the output gradient must have the projection's shape",
        ));
    }
    let x = qkv.contiguous()?;
    let grad = grad.contiguous()?;
    let [q_weight, k_weight] = [weight[0].contiguous()?, weight[1].contiguous()?];
    let device = x.device();
    let dx = CudaTensor::empty(device, x.shape(), x.dtype())?;
    let blocks = grid(rows) as usize;
    let layer = mean.is_some();
    let partial = || CudaTensor::empty(device, &[blocks, 2 * dim], DType::F32);
    let (pg, pb) = (partial()?, layer.then(partial).transpose()?);
    let spec = QkNormBackward {
        x: x.dtype(),
        weight: q_weight.dtype(),
        grad: grad.dtype(),
        layer,
        dim,
    };
    let mut p = Params::new();
    p.int(rows as i64)
        .int(slots as i64)
        .ptr(x.data_ptr())
        .ptr(q_weight.data_ptr())
        .ptr(k_weight.data_ptr())
        .ptr(grad.data_ptr())
        .ptr(mean.map_or(0, CudaTensor::data_ptr))
        .ptr(rstd.data_ptr())
        .ptr(dx.data_ptr())
        .ptr(pg.data_ptr())
        .ptr(pb.as_ref().map_or(0, CudaTensor::data_ptr));
    // With no rows the block still writes its (zero) partial sums.
    launch(device, &spec, blocks as u32, WARPS * 32, &p, &op)?;
    let split = |partial: &CudaTensor| -> Result<[CudaTensor; 2]> {
        let sums = column_sum(partial, q_weight.dtype(), &op)?;
        Ok([
            sums.slice(&[SliceArg::range(0, dim)])?,
            sums.slice(&[SliceArg::range(dim, 2 * dim)])?,
        ])
    };
    let weight_grads = split(&pg)?;
    let bias_grads = pb.as_ref().map(split).transpose()?;
    Ok((dx, weight_grads, bias_grads))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forward and backward of RMSNorm and LayerNorm, bf16 and f32 projections, head dims 64,
    /// 128 and one not a multiple of 32.
    fn sources() -> Vec<String> {
        let mut sources = Vec::new();
        for (x, weight, grad) in [
            (DType::BF16, DType::BF16, DType::BF16),
            (DType::BF16, DType::F32, DType::F32),
            (DType::F32, DType::F32, DType::F32),
        ] {
            for layer in [false, true] {
                for dim in [64, 128, 80] {
                    sources.push(
                        QkNormForward {
                            x,
                            weight,
                            layer,
                            dim,
                        }
                        .source(),
                    );
                    sources.push(
                        QkNormBackward {
                            x,
                            weight,
                            grad,
                            layer,
                            dim,
                        }
                        .source(),
                    );
                }
            }
        }
        sources
    }

    #[test]
    fn qk_norm_sources_are_unchanged() {
        insta::assert_snapshot!(crate::kernels::digests(&sources()));
    }

    /// Every source compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn qk_norm_sources_compile() {
        for source in sources() {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{e}\n{source}"));
        }
    }
}
