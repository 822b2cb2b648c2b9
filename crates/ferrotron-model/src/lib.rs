//! GPT, LLaMA-style and Mixture-of-Experts language models in burn 0.21, built from a recipe's
//! model section (through a plan). One generic model covers every combination the recipe allows
//! (learned/rotary/no positions, LayerNorm/RMSNorm, GELU/SwiGLU, grouped-query attention, tied or
//! untied output, biases or none, dense or MoE layers), because Megatron treats these as
//! independent switches and recipes mix them freely.
//!
//! Everything is generic over `burn::tensor::backend::Backend` (forward passes over
//! `ferrotron_parallel::ParallelOps`, the backends that can run collectives), so the same code
//! runs on the CPU backend in tests and on a custom CUDA backend later, on one rank or as one
//! rank's part of a tensor/sequence/context/pipeline-parallel model.

mod attention;
mod block;
mod config;
mod error;
mod expert_loads;
mod fp8;
mod generate;
mod init;
mod mla;
mod mlp;
mod model;
pub mod moe;
mod norm;
mod parallel;
mod recompute;
mod rope;

pub use config::{Capacity, GroupLimit, MlaConfig, ModelConfig, MoeConfig, RopeScaling};
pub use error::ModelError;
pub use expert_loads::{ExpertLoads, LayerLoads};
pub use generate::generate;
pub use model::{GptModel, LossOutput, ModelOutput};
pub use parallel::{
    ChunkData, ChunkInput, ChunkOutput, ChunkSpec, TensorParallel, TokensAndLabels,
    context_parallel_positions, context_parallel_slice, split_for_context_parallel,
};
pub use recompute::RecomputePolicy;

#[cfg(test)]
mod tests;
