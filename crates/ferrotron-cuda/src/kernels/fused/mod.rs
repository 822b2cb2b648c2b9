//! The hand-written kernels behind `FusedOps`, one module per op: the norms (`norm.rs`, with the
//! warp-per-row `norm_rows.rs` and the one-pass backward `norm_grad_rows.rs`), the AdamW update,
//! the softmax cross-entropy (`loss.rs`), QK-norm, RoPE and SwiGLU of the packed projection, GELU
//! with its linear's bias (`bias_gelu.rs`), MoE routing (its decisions, `moe.rs`; the router with
//! its weights, `moe_router.rs`, and its losses' terms, `moe_router_aux.rs`), the experts'
//! grouped matmul over counts left on the device (`grouped_gemm.rs`), and the gathering of
//! gradients into the optimizer's flat buffers (`flat.rs`).
//!
//! Why by hand: each composed version is a chain of generic map and reduce kernels, each a full
//! pass over memory with its own output buffer; these read their inputs once, accumulate in
//! f32 and keep only what the backward needs. The choice between them and the composition is
//! the backend's (`backend/fused_ops/`), not made here.

pub mod adamw;
pub mod bias_gelu;
pub mod combine;
pub mod flat;
pub mod gather_sum;
pub mod grouped_gemm;
pub mod loss;
pub mod moe;
pub mod moe_router;
pub mod moe_router_aux;
pub mod norm;
mod norm_grad_rows;
mod norm_rows;
pub mod qk_norm;
pub mod rope;
pub mod swiglu;

pub use adamw::{AdamWOutput, adamw};
pub use norm::{NormForwardOut, norm_backward, norm_forward, norm_stats};

use crate::engine::dtype::DType;
use crate::error::{CudaError, OpContext, Result};

/// Warp-shuffle sum over a warp; every lane gets the total.
const WARP_SUM: &str = include_str!("warp_sum.cu");
/// Then shared-memory sum over a block (after [`WARP_SUM`]); every thread gets the total.
const BLOCK_SUM: &str = include_str!("block_sum.cu");

/// Whether a kernel over these dtypes needs the half-precision headers.
fn uses_half(dtypes: &[DType]) -> bool {
    dtypes.iter().copied().any(DType::needs_half_headers)
}

/// Launches `spec` with one block per row of `rows`, each walking a row of `width` elements
/// with the width's threads rounded up to warps, at most
/// [`BLOCK`](crate::engine::launch::BLOCK).
fn launch_per_row<S: crate::engine::launch::KernelSpec>(
    device: &crate::engine::device::CudaDevice,
    spec: &S,
    rows: usize,
    width: usize,
    params: &crate::engine::launch::Params,
    op: &dyn Fn() -> OpContext,
) -> Result<()> {
    let threads = (width.div_ceil(32) * 32).clamp(32, crate::engine::launch::BLOCK as usize);
    crate::engine::launch::launch(
        device,
        spec,
        block_rows(rows, op)?,
        threads as u32,
        params,
        op,
    )
}

/// A grid of one block per row.
fn block_rows(rows: usize, op: &dyn Fn() -> OpContext) -> Result<u32> {
    u32::try_from(rows.max(1))
        .map_err(|_| CudaError::unsupported(op(), format!("{rows} rows exceed one grid")))
}
