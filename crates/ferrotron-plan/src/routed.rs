//! The rate of the routed experts' GEMMs, as the CUDA backend picks their path
//! (`ferrotron-cuda` `blas/grouped.rs` and `backend/fused_ops`): one cuBLASLt GEMM per expert
//! where the mean expert's output covers the chip's multiprocessors with 128 × 128 tiles; below
//! that, Ferrotron's device-count kernel where it takes the shapes (16-bit, widths a multiple of
//! 128), else cuBLAS's one grouped call, which runs far below the dense rate. Each projection
//! decides alone (the first writes the expert's FFN width, SwiGLU's two halves together; the
//! second the hidden size), so a fine-grained model can run its first projection per expert and
//! its second on the kernel.

use ferrotron_recipe::{Activation, Dtype};

use crate::setup::Setup;

/// Output elements one 128 × 128 tile holds.
const TILE: f64 = 128.0 * 128.0;

/// The device-count kernel's tile edge: both of a projection's dimensions must be multiples.
const KERNEL_TILE: u32 = 128;

/// The routed GEMMs' fraction of peak for `tokens` tokens of one micro batch on this GPU: the
/// two projections' rates weighted by their FLOPs (time adds, so the harmonic mean).
pub(crate) fn routed_gemm_efficiency(setup: &Setup<'_>, tokens: f64) -> f64 {
    let spec = &setup.spec;
    let model = &setup.recipe.model;
    let runtime = &setup.recipe.runtime;
    let Some(moe) = &model.moe else {
        return spec.grouped_gemm_efficiency;
    };
    let d = setup.layout.degrees;
    let width = moe.expert_ffn_hidden_size(model) / d.etp;
    let kernel_takes = runtime.grouped_gemm_device_counts
        && setup.recipe.precision.dtype != Dtype::Fp32
        && width.is_multiple_of(KERNEL_TILE)
        && model.hidden_size.is_multiple_of(KERNEL_TILE);
    let below_a_wave = if kernel_takes {
        spec.device_counts_gemm_efficiency
    } else {
        spec.grouped_gemm_efficiency
    };
    if !runtime.grouped_gemm_per_expert || moe.num_experts == 0 {
        return below_a_wave;
    }
    // Each rank's experts receive the routed rows of the ep ranks that share them.
    let rows = tokens * f64::from(moe.router_topk) * f64::from(d.ep) / f64::from(moe.num_experts);
    let first_halves = if model.activation == Activation::Swiglu {
        2.0
    } else {
        1.0
    };
    let rate = |n: f64| {
        if rows * n >= f64::from(spec.multiprocessors) * TILE {
            spec.per_expert_gemm_efficiency
        } else {
            below_a_wave
        }
    };
    // FLOPs in proportion to the output widths (same rows, same inner size up to the halves).
    let (first, second) = (first_halves, 1.0);
    (first + second)
        / (first / rate(first_halves * f64::from(width))
            + second / rate(f64::from(model.hidden_size)))
}
