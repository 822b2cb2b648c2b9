//! Equivalence of parallel layouts with one rank, on thread ranks and a tiny GPT (hidden 32,
//! seq 16, 2–8 layers, 4 steps of 4 microbatches, lr 1e-2, clipping at 1.0).
//!
//! Tolerances, and why they are not zero: a layout changes only the order of floating-point
//! additions — gradients summed over microbatches on one rank are summed per rank and then
//! across ranks, tensor-parallel matmuls split their inner sums, the global norm is accumulated
//! in f64 from per-rank pieces rather than in f32 per tensor — so each step's gradients differ
//! from the one-rank ones by a few f32 ulps. Adam divides by √v, which amplifies such
//! differences for elements with tiny second moments, and they compound over steps. Measured
//! over 4 steps: losses agree to ≤ 6e-8 relative and weights to ≤ 6e-6 absolute (weights are
//! O(0.1)); the tolerances below leave a ~10× margin. A real bug (a missing all-reduce, a
//! gradient counted twice, a wrong shard or microbatch) moves the loss by > 1e-4 already at the
//! first or second step and the weights by ~lr = 1e-2.

mod alone;
mod call_order;
mod deepseek_moe;
mod deferred_lines;
mod dense_families;
mod equivalence;
mod evaluation;
mod exchanged;
mod fixture;
mod host_reads;
mod loss_fusion;
mod mla;
mod offload;
mod optimizer_states;
mod plan_groups;
mod recompute;
mod replicated;
mod resume;
mod step_times;
mod stops;

/// Relative difference allowed between one-rank and parallel losses, per step.
pub(super) const LOSS_TOLERANCE: f64 = 1e-6;
/// Absolute difference allowed between one-rank and parallel final weights.
pub(super) const WEIGHT_TOLERANCE: f32 = 5e-5;
