//! The rate of the routed experts' GEMMs, as the CUDA backend picks their path
//! (`ferrotron-cuda` `blas/grouped.rs`): one cuBLASLt GEMM per expert where the mean expert's
//! output covers the chip's multiprocessors with 128 × 128 tiles, else cuBLAS's one grouped call,
//! which runs far below the dense rate. Each projection decides alone (the first writes the
//! expert's FFN width, SwiGLU's two halves together; the second the hidden size), so a
//! fine-grained model can run its first projection per expert and its second grouped.

use ferrotron_recipe::Activation;

use crate::setup::Setup;

/// Output elements one 128 × 128 tile holds.
const TILE: f64 = 128.0 * 128.0;

/// The routed GEMMs' fraction of peak for `tokens` tokens of one micro batch on this GPU: the
/// two projections' rates weighted by their FLOPs (time adds, so the harmonic mean).
pub(crate) fn routed_gemm_efficiency(setup: &Setup<'_>, tokens: f64) -> f64 {
    let spec = &setup.spec;
    let model = &setup.recipe.model;
    let Some(moe) = &model.moe else {
        return spec.grouped_gemm_efficiency;
    };
    if !setup.recipe.runtime.grouped_gemm_per_expert || moe.num_experts == 0 {
        return spec.grouped_gemm_efficiency;
    }
    let d = setup.layout.degrees;
    // Each rank's experts receive the routed rows of the ep ranks that share them.
    let rows = tokens * f64::from(moe.router_topk) * f64::from(d.ep) / f64::from(moe.num_experts);
    let width = f64::from(moe.expert_ffn_hidden_size(model)) / f64::from(d.etp);
    let first_halves = if model.activation == Activation::Swiglu {
        2.0
    } else {
        1.0
    };
    let rate = |n: f64| {
        if rows * n >= f64::from(spec.multiprocessors) * TILE {
            spec.per_expert_gemm_efficiency
        } else {
            spec.grouped_gemm_efficiency
        }
    };
    // FLOPs in proportion to the output widths (same rows, same inner size up to the halves).
    let (first, second) = (first_halves, 1.0);
    (first + second)
        / (first / rate(first_halves * width) + second / rate(f64::from(model.hidden_size)))
}
