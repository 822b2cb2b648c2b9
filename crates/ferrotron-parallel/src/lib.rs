//! Parallelism written once, on burn tensors, against communicators.
//!
//! Every layout (tensor, sequence, context, expert, pipeline and data parallelism) is the
//! single-rank arithmetic split over ranks. This crate holds the pieces every layer of that
//! split shares, so the model and the runtime never see a concrete communicator or a backend's
//! internals:
//!
//! - [`DynComm`]/[`Comm`]: an object-safe communicator, so one `ParallelContext` type serves
//!   thread ranks, TCP processes and NCCL alike without generics leaking into every model type;
//! - [`ParallelContext`]: a rank's groups (tp, cp, ep, etp, dp, dp_cp, edp, pp, embedding);
//! - [`ShardSpec`]/[`ParamRole`]: where a local tensor sits in the global one-rank tensor and how
//!   its gradient is reduced, the contract between model, optimizer and checkpoints;
//! - [`ParallelOps`] and [`collectives`]: Megatron's conjugate region operators as autodiff
//!   ops with their own backward;
//! - [`recompute`]: activation recomputation as graph cuts the trainer's backward re-runs;
//! - [`FusedOps`]: fused operators (attention first) by the same mechanism: composed defaults,
//!   kernels a GPU backend overrides, one autodiff node each (attention, norms, the AdamW update),
//!   and the fp8 linear layer with its scaling state ([`fp8_scaling`], [`Fp8State`]).

mod autodiff;
#[cfg(feature = "burn-cuda")]
mod burn_cuda;
mod comm;
mod context;
mod flex;
pub mod fp8_scaling;
mod fused;
mod fused_adamw;
mod fused_autodiff;
mod fused_dropout;
mod fused_embedding;
mod fused_flat;
mod fused_fp8;
mod fused_fp8_mlp;
mod fused_fp8_node;
mod fused_fp8_norm;
mod fused_fp8_residual;
mod fused_fp8_rope;
mod fused_fp8_source;
mod fused_gather;
mod fused_gelu;
mod fused_grouped;
mod fused_host_pass;
mod fused_logits;
mod fused_loss;
mod fused_moe;
mod fused_norm;
mod fused_qk_norm;
mod fused_qkv;
mod fused_rope;
mod fused_swiglu;
mod fused_tied_loss;
pub mod host;
mod ops;
pub mod prefetch;
mod primitive;
mod process_rng;
pub mod recompute;
mod recompute_autodiff;
mod shard;
mod solo;

pub mod collectives;

#[cfg(test)]
mod tests;

pub use comm::{Comm, DynComm};
pub use context::ParallelContext;
pub use ferrotron_dist::{CommError, GroupLabel, ReduceOp};
pub use flex::{HostAdamW, HostMoment, HostOldValues, HostRounded, HostValues};
pub use fused::{
    AttentionGrads, AttentionSaved, AttentionSpec, FusedOps, ReadLater,
    attention_backward_reference, attention_forward_reference, composed_attention, repeat_groups,
};
pub use fused_adamw::{
    AdamWStep, AdamWTensors, DeviceScale, F32_MOMENTS, composed_adamw, composed_sum_of_squares,
};
pub use fused_autodiff::{
    attention_node, cross_entropy_node, dropout_add_node, grouped_matmul_node, norm_node,
    qk_norm_node, qkv_attention_node, rope_qkv_node, swiglu_node, tied_logits_node,
};
pub use fused_dropout::{DropoutMask, DropoutSaved, composed_dropout_add};
pub use fused_embedding::{composed_embedding, embedding_backward_reference, embedding_node};
pub use fused_flat::{
    FlatPiece, FlatSegment, OrderedSum, composed_gather_flat, composed_segment_sum_of_squares,
};
pub use fused_fp8::{
    Fp8Linear, Fp8Operand, Fp8State, Fp8Tensor, end_fp8_step, fp8_linear_inference,
    fp8_matmul_reference, fp8_quantize_reference, fp8_update_reference,
};
pub use fused_fp8_mlp::{Fp8Mlp, fp8_mlp_inference, fp8_mlp_node};
pub use fused_fp8_node::fp8_linear_node;
pub use fused_fp8_norm::{Fp8InputNorm, fp8_quantize_norm_composed};
pub use fused_fp8_residual::Fp8Residual;
pub use fused_fp8_rope::Fp8Rope;
pub use fused_fp8_source::{Fp8Activation, Fp8Source, fp8_quantize_source_composed};
pub use fused_gelu::{composed_gelu, gelu, gelu_backward_reference, gelu_node};
pub use fused_grouped::{GroupedMatmulGrads, composed_grouped_matmul};
pub use fused_host_pass::{HostPass, HostPiece, HostValuesMut, composed_host_pass};
pub use fused_logits::{composed_tied_logits, tied_logits, tied_logits_backward_reference};
pub use fused_loss::{
    CrossEntropySaved, cross_entropy, cross_entropy_backward_reference,
    cross_entropy_forward_reference,
};
pub use fused_moe::{
    GroupLimit, MoePermutation, moe_permutation_reference, moe_topk_reference, select_topk,
};
pub use fused_norm::{
    NormGrads, NormKind, NormSaved, NormSpec, NormStats, composed_norm, norm,
    norm_backward_reference, norm_forward_reference,
};
pub use fused_qk_norm::{
    QkNormGrads, QkNormParams, QkNormSaved, composed_qk_norm, qk_norm_backward_reference,
    qk_norm_forward_reference,
};
pub use fused_qkv::{composed_qkv_attention, split_qkv};
pub use fused_rope::composed_rope_qkv;
pub use fused_swiglu::composed_swiglu;
pub use fused_tied_loss::{
    TiedCrossEntropySaved, TiedState, tied_cross_entropy, tied_cross_entropy_backward_reference,
    tied_cross_entropy_forward_reference, tied_cross_entropy_node,
};
pub use ops::{InFlight, ParallelOps, Wait};
pub use process_rng::with_process_rng;
pub use shard::{ParamRole, ShardError, ShardSpec, Split};
pub use solo::solo;
