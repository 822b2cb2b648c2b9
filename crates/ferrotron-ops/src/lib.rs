//! Fused operators as a burn backend extension: the [`FusedOps`] trait, one module per op, the
//! fp8 linear layers and the CPU (burn-flex) kernels.
//!
//! Each op has a *composed* default written with burn ops — exactly the arithmetic the model
//! used before the op existed, so `burn-flex` and stock burn-cuda keep their numbers bit for
//! bit — and a *kernel* pair (forward that saves what its backward needs, and that backward)
//! which a GPU backend overrides. `Autodiff<B>` (`autodiff.rs`) records one graph node whose
//! backward is the kernel's backward when `B` says it has a kernel for the inputs, and
//! otherwise runs the composed default on itself (so autodiff records today's graph); the choice
//! is [`kernel_or_composed!`], written once.
//!
//! The kernel pair also has a composed reference implementation (`*_reference`): it is what the
//! CPU tests drive through the autodiff node to check the node's gradients against the composed
//! graph's, and it documents the contract a kernel must meet.
//!
//! Each op's module (`op/<name>.rs`) holds its spec, composed default, reference and autodiff
//! node; it needs from the rest of the crate only the trait (and, for a few, the op it is built
//! on: QK-norm on the norm, packed attention on attention). The ops: causal (or unmasked)
//! scaled-dot-product attention with grouped-query K/V (`op/attention.rs`), also straight from
//! the packed QKV projection (`op/qkv.rs`), the residual add with hidden dropout
//! (`op/dropout.rs`), SwiGLU from the packed projection (`op/swiglu.rs`), GELU (`op/gelu.rs`),
//! the token embedding's lookup (`op/embedding.rs`), rotary embeddings on the packed projection
//! (`op/rope.rs`) and its per-head QK-norm (`op/qk_norm.rs`), LayerNorm/RMSNorm
//! (`op/norm.rs`), the MoE experts' grouped matmul (`op/grouped.rs`), its routing decisions
//! (`op/moe.rs`, no gradient), its router with the combine weights (`op/router.rs`) and the
//! balancing and z-losses' terms (`op/router_aux.rs`), row gathers differentiated by gathers
//! (`op/gather.rs`), the
//! softmax cross-entropy (`op/loss.rs`), alone or with the tied output layer
//! (`op/tied_loss.rs`), the tied logits (`op/logits.rs`), the AdamW update (`op/adamw.rs`)
//! with its flat gradient buffers (`op/flat.rs`), the host pass over device buffers
//! (`op/host_pass.rs`) and the fp8 linear layer (`fp8/`, on primitives instead of a kernel
//! pair). `cpu/` holds burn-flex's kernels for these ops.
//!
//! `ferrotron_parallel::ParallelOps` (the collectives) has `FusedOps` as a supertrait, so code
//! generic over it can call every fused op.

mod autodiff;
#[cfg(feature = "burn-cuda")]
mod burn_cuda;
mod cpu;
mod dispatch;
pub mod fp8;
mod op;
mod primitive;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

pub use cpu::{HostAdamW, HostMoment, HostOldValues, HostRounded};
pub use fp8::experts::{Fp8Experts, fp8_experts_inference, fp8_experts_node};
pub use fp8::linear::{
    Fp8Linear, Fp8Operand, Fp8State, Fp8Tensor, end_local_fp8_step, fp8_linear_inference,
};
pub use fp8::mlp::{Fp8Mlp, fp8_mlp_inference, fp8_mlp_node};
pub use fp8::node::fp8_linear_node;
pub use fp8::norm::{Fp8InputNorm, fp8_quantize_norm_composed};
pub use fp8::residual::Fp8Residual;
pub use fp8::rope::Fp8Rope;
pub use fp8::source::{Fp8Activation, Fp8Source, fp8_quantize_source_composed};
pub use op::adamw::{
    AdamWStep, AdamWTensors, DeviceScale, F32_MOMENTS, composed_adamw, composed_sum_of_squares,
};
pub use op::attention::{
    AttentionGrads, AttentionSaved, AttentionSpec, attention_node, composed_attention,
    repeat_groups,
};
pub use op::bias_gelu::{bias_gelu, bias_gelu_node, composed_bias_gelu};
pub use op::combine::{
    CombineIndex, CombineSpec, combine_rows, combine_rows_node, composed_combine_rows,
};
pub use op::dropout::{DropoutMask, DropoutSaved, composed_dropout_add, dropout_add_node};
pub use op::embedding::{composed_embedding, embedding_node};
pub use op::flat::{
    FlatPiece, FlatSegment, OrderedSum, composed_gather_flat, composed_segment_sum_of_squares,
};
pub use op::gather::gather_rows_backward_reference;
pub use op::gelu::{composed_gelu, gelu, gelu_node};
pub use op::group_rows::GroupRows;
pub use op::grouped::{
    GroupedMatmulGrads, GroupedMatmulPartsGrads, composed_grouped_matmul, grouped_matmul_node,
    grouped_matmul_parts_node, parts_are_leaves,
};
pub use op::host_pass::{HostPass, HostPiece, HostValues, HostValuesMut, composed_host_pass};
pub use op::linear_loss::{
    LinearLossSaved, LinearLossSpec, LinearLossState, OutputWeight, linear_cross_entropy,
    linear_cross_entropy_backward, linear_cross_entropy_forward, linear_cross_entropy_node,
};
pub use op::logits::{composed_tied_logits, tied_logits, tied_logits_node};
pub use op::loss::{CrossEntropySaved, cross_entropy, cross_entropy_node};
pub use op::moe::{
    GroupLimit, MoePermutation, moe_permutation_reference, moe_topk_reference, select_topk,
};
pub use op::norm::{
    NormGrads, NormKind, NormSaved, NormSpec, NormStats, composed_norm, norm, norm_node,
};
pub use op::qk_norm::{QkNormGrads, QkNormParams, QkNormSaved, composed_qk_norm, qk_norm_node};
pub use op::qkv::{composed_qkv_attention, qkv_attention_node, split_qkv};
pub use op::rope::{composed_rope_qkv, rope_qkv_node};
pub use op::router::{
    MoeRouting, RouterScore, RouterSpec, composed_moe_router, moe_router, moe_router_node,
    router_weights,
};
pub use op::router_aux::{
    BalancingSpec, RouterAux, RouterAuxSpec, RouterAuxTerms, balancing_probabilities,
    composed_moe_router_aux, moe_router_aux, moe_router_aux_node,
};
pub use op::swiglu::{composed_swiglu, swiglu_node};
pub use op::tied_loss::{
    TiedCrossEntropySaved, TiedState, tied_cross_entropy, tied_cross_entropy_node,
};

/// The reference kernels as public functions (feature `reference`): what each kernel pair must
/// compute, in burn ops, for the tests and `gpu_check` that check a backend against them. Inside
/// the crate they are the trait's default kernel methods. (The MoE routing's host references,
/// the defaults a backend falls back to, are exported at the root.)
#[cfg(feature = "reference")]
pub mod reference {
    pub use crate::fp8::experts::{fp8_grouped_inner_reference, fp8_grouped_rows_reference};
    pub use crate::fp8::linear::{
        fp8_matmul_reference, fp8_quantize_reference, fp8_update_reference,
    };
    pub use crate::op::attention::{attention_backward_reference, attention_forward_reference};
    pub use crate::op::bias_gelu::bias_gelu_backward_reference;
    pub use crate::op::embedding::embedding_backward_reference;
    pub use crate::op::gelu::gelu_backward_reference;
    pub use crate::op::logits::tied_logits_backward_reference;
    pub use crate::op::loss::{cross_entropy_backward_reference, cross_entropy_forward_reference};
    pub use crate::op::norm::{norm_backward_reference, norm_forward_reference};
    pub use crate::op::qk_norm::{qk_norm_backward_reference, qk_norm_forward_reference};
    pub use crate::op::tied_loss::{
        tied_cross_entropy_backward_reference, tied_cross_entropy_forward_reference,
    };
}

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Tensor, TensorData, TensorMetadata, TensorPrimitive};

use crate::fp8::experts::{fp8_grouped_inner_reference, fp8_grouped_rows_reference};
use crate::fp8::linear::{fp8_matmul_reference, fp8_quantize_reference, fp8_update_reference};
use crate::fp8::rope::rotate_output;
use crate::fp8::scaling::{Fp8Role, Fp8Settings};
use crate::op::attention::{attention_backward_reference, attention_forward_reference};
use crate::op::combine::{combine_rows_backward_reference, combine_rows_forward_reference};
use crate::op::dropout::{dropout_add_backward_reference, dropout_add_forward_reference};
use crate::op::embedding::embedding_backward_reference;

use crate::op::bias_gelu::bias_gelu_backward_reference;
use crate::op::gelu::gelu_backward_reference;
use crate::op::grouped::{grouped_matmul_backward_reference, stack_parts, unstack_parts};
use crate::op::logits::tied_logits_backward_reference;
use crate::op::loss::{cross_entropy_backward_reference, cross_entropy_forward_reference};
use crate::op::norm::fold_rows;
use crate::op::norm::{norm_backward_reference, norm_forward_reference};
use crate::op::qk_norm::{qk_norm_backward_reference, qk_norm_forward_reference};
use crate::op::qkv::{qkv_attention_backward_reference, qkv_attention_forward_reference};
use crate::op::rope::rope_qkv_backward_reference;
use crate::op::router::moe_router_backward_reference;
use crate::op::router_aux::{moe_router_aux_backward_reference, moe_router_aux_forward_reference};
use crate::op::swiglu::swiglu_backward_reference;
use crate::op::tied_loss::{
    tied_cross_entropy_backward_reference, tied_cross_entropy_forward_reference,
};

/// A device read to finish later ([`FusedOps::read_later`]): called, it copies the values off
/// the device and returns once the device is no longer read; what it returns makes them host
/// data (from a device backend's page-locked copy, on the caller's thread, later).
pub type ReadLater = Box<dyn FnOnce() -> HostCopy + Send>;

/// Values already copied off the device, made host data when called.
pub type HostCopy = Box<dyn FnOnce() -> TensorData + Send>;

pub trait FusedOps: Backend {
    /// `query [b, heads, s_q, d]`, `key [b, groups, s_kv, d]`, `value [b, groups, s_kv, d_v]`
    /// with `heads` a multiple of `groups` (grouped-query attention: each group's key/value
    /// serves `heads / groups` consecutive query heads, never repeated in memory by a fused
    /// kernel) → `[b, heads, s_q, d_v]`. `d_v` may differ from `d` (multi-latent attention:
    /// `d = qk_head_dim + qk_pos_emb_head_dim`, `d_v = v_head_dim`); `spec.scale` then says the
    /// softmax scale, as the default `1/sqrt(d)` is not MLA's.
    fn fused_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> FloatTensor<Self> {
        composed_attention::<Self>(query, key, value, spec)
    }

    /// Whether [`FusedOps::attention_kernel_forward`] is a real fused kernel for these inputs
    /// (the autodiff impl then records one node). Default: no kernel.
    fn has_attention_kernel(
        query: &FloatTensor<Self>,
        key: &FloatTensor<Self>,
        value: &FloatTensor<Self>,
        spec: &AttentionSpec,
    ) -> bool {
        let _ = (query, key, value, spec);
        false
    }

    /// Fused forward: the output and what the backward needs. Default: the composed reference
    /// (no dropout).
    fn attention_kernel_forward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> AttentionSaved<Self> {
        attention_forward_reference::<Self>(query, key, value, spec)
    }

    /// Fused backward from the forward's saved state and the output gradient.
    fn attention_kernel_backward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        saved: AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> AttentionGrads<Self> {
        attention_backward_reference::<Self>(query, key, value, saved, grad_output, spec)
    }

    /// Attention from the packed projection `qkv [b, s, groups, per_group + 2, d]` (see
    /// `op/qkv.rs`) → the context `[b, s, groups·per_group, d]`.
    fn fused_qkv_attention(qkv: FloatTensor<Self>, spec: AttentionSpec) -> FloatTensor<Self> {
        composed_qkv_attention::<Self>(qkv, spec)
    }

    /// Whether [`FusedOps::qkv_attention_kernel_forward`] is a real kernel for this packed
    /// projection (the autodiff impl then records one node). Default: no kernel.
    fn has_qkv_attention_kernel(qkv: &FloatTensor<Self>, spec: &AttentionSpec) -> bool {
        let _ = (qkv, spec);
        false
    }

    /// Packed forward: the `[b, s, heads, d]` output and what the backward needs. Default: the
    /// reference (no dropout).
    fn qkv_attention_kernel_forward(
        qkv: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> AttentionSaved<Self> {
        qkv_attention_forward_reference::<Self>(qkv, spec)
    }

    /// Packed backward: the gradient of the whole packed projection from the `[b, s, heads, d]`
    /// output gradient.
    fn qkv_attention_kernel_backward(
        qkv: FloatTensor<Self>,
        saved: AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> FloatTensor<Self> {
        qkv_attention_backward_reference::<Self>(qkv, saved, grad_output, spec)
    }

    /// `residual + dropout(x)`: the residual connection with hidden dropout (live only under
    /// autodiff, as burn's `Dropout`; see `op/dropout.rs`).
    fn fused_dropout_add(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        prob: f64,
    ) -> FloatTensor<Self> {
        composed_dropout_add::<Self>(x, residual, prob)
    }

    /// Whether [`FusedOps::dropout_add_kernel_forward`] is a real kernel for `x`. Default: no.
    fn has_dropout_add_kernel(x: &FloatTensor<Self>, prob: f64) -> bool {
        let _ = (x, prob);
        false
    }

    /// Dropout-add forward (dropout live): the output and what regenerates the keep mask.
    /// Default: the reference, which keeps the mask.
    fn dropout_add_kernel_forward(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        prob: f64,
    ) -> DropoutSaved<Self> {
        dropout_add_forward_reference::<Self>(x, residual, prob)
    }

    /// The gradient of `x` from the output gradient (the residual's is the output gradient).
    fn dropout_add_kernel_backward(
        grad_output: FloatTensor<Self>,
        prob: f64,
        mask: DropoutMask<Self>,
    ) -> FloatTensor<Self> {
        dropout_add_backward_reference::<Self>(grad_output, prob, mask)
    }

    /// `silu(gate) · up` of the packed projection `x [rows, 2f]` (gate first) → `[rows, f]`
    /// (see `op/swiglu.rs`).
    fn fused_swiglu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        composed_swiglu::<Self>(x)
    }

    /// Whether [`FusedOps::swiglu_kernel_forward`] is a real kernel for `x`. Default: no.
    fn has_swiglu_kernel(x: &FloatTensor<Self>) -> bool {
        let _ = x;
        false
    }

    /// SwiGLU forward with the kernel. Default: the composed arithmetic.
    fn swiglu_kernel_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        composed_swiglu::<Self>(x)
    }

    /// The packed gradient `[rows, 2f]` from the output gradient.
    fn swiglu_kernel_backward(
        x: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        swiglu_backward_reference::<Self>(x, grad_output)
    }

    /// GELU (erf form) element-wise, any shape (see `op/gelu.rs`).
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        composed_gelu::<Self>(x)
    }

    /// Whether [`FusedOps::gelu_kernel_forward`] is a real kernel for `x`. Default: no.
    fn has_gelu_kernel(x: &FloatTensor<Self>) -> bool {
        let _ = x;
        false
    }

    /// GELU forward with the kernel. Default: the composed arithmetic.
    fn gelu_kernel_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        composed_gelu::<Self>(x)
    }

    /// The input's gradient from the output's. Default: the backend's `gelu_backward`.
    fn gelu_kernel_backward(
        x: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        gelu_backward_reference::<Self>(x, grad_output)
    }

    /// Whether the model hands a GELU MLP's `fc1` bias to [`FusedOps::fused_bias_gelu`] rather
    /// than to the linear (on CUDA: `runtime.bias_gelu_fusion`). Default: no.
    fn fuses_bias_gelu() -> bool {
        false
    }

    /// `gelu(x + bias)`, `bias` over the last dimension (see `op/bias_gelu.rs`).
    fn fused_bias_gelu(x: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        composed_bias_gelu::<Self>(x, bias)
    }

    /// Whether [`FusedOps::bias_gelu_kernel_forward`] is a real kernel for these inputs.
    /// Default: no.
    fn has_bias_gelu_kernel(x: &FloatTensor<Self>, bias: &FloatTensor<Self>) -> bool {
        let _ = (x, bias);
        false
    }

    /// `gelu(x + bias)` with the kernel. Default: the composed arithmetic.
    fn bias_gelu_kernel_forward(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        composed_bias_gelu::<Self>(x, bias)
    }

    /// `(dx, dbias)` from the output's gradient. Default: the backend's `gelu_backward` and a
    /// sum over the rows.
    fn bias_gelu_kernel_backward(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        bias_gelu_backward_reference::<Self>(x, bias, grad_output)
    }

    /// Rows of `weight [vocab, hidden]` for `indices [batch, seq]` → `[batch, seq, hidden]`:
    /// the token embedding's lookup (see `op/embedding.rs`).
    fn fused_embedding(weight: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        composed_embedding::<Self>(weight, indices)
    }

    /// Whether [`FusedOps::embedding_kernel_backward`] is a real kernel for this weight (the
    /// autodiff impl then records the node that adds into the weight's gradient). Default: no.
    fn has_embedding_kernel(weight: &FloatTensor<Self>) -> bool {
        let _ = weight;
        false
    }

    /// The lookup with the kernel. Default: burn's `embedding`.
    fn embedding_kernel_forward(
        weight: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        composed_embedding::<Self>(weight, indices)
    }

    /// `into` (`[vocab, hidden]` zeros when `None`; given up, so a kernel may add in place) plus
    /// burn's embedding gradient of `grad [batch, seq, hidden]` (each index's rows summed from
    /// zero in index order, then added). Default: the reference.
    fn embedding_kernel_backward(
        indices: IntTensor<Self>,
        grad: FloatTensor<Self>,
        vocab: usize,
        into: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        embedding_backward_reference::<Self>(indices, grad, vocab, into)
    }

    /// Row block `g` of `x [rows, k]` (`group_rows[g]` consecutive rows) times `weight[g]` of
    /// `weight [groups, k, n]` → `[rows, n]`: one MoE projection for all local experts (see
    /// `op/grouped.rs`).
    fn fused_grouped_matmul(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        group_rows: &GroupRows<Self>,
    ) -> FloatTensor<Self> {
        composed_grouped_matmul::<Self>(x, weight, group_rows)
    }

    /// [`FusedOps::fused_grouped_matmul`] over the groups' own weights `parts` (each `[k, n]`):
    /// with a kernel and parameters for parts, autodiff never stacks them
    /// ([`grouped_matmul_parts_node`]).
    fn fused_grouped_matmul_parts(
        x: FloatTensor<Self>,
        parts: Vec<FloatTensor<Self>>,
        group_rows: &GroupRows<Self>,
    ) -> FloatTensor<Self> {
        Self::fused_grouped_matmul(x, stack_parts::<Self>(parts), group_rows)
    }

    /// Whether [`FusedOps::grouped_matmul_kernel_forward`] is a real kernel for these inputs.
    /// Default: no.
    fn has_grouped_matmul_kernel(x: &FloatTensor<Self>, weight: &FloatTensor<Self>) -> bool {
        let _ = (x, weight);
        false
    }

    /// Whether [`FusedOps::grouped_matmul_parts_kernel_forward`] is a real kernel for `x` and
    /// parts like `part`. Default: no.
    fn has_grouped_matmul_parts_kernel(x: &FloatTensor<Self>, part: &FloatTensor<Self>) -> bool {
        let _ = (x, part);
        false
    }

    /// Grouped matmul with the kernel. Default: the composed arithmetic.
    fn grouped_matmul_kernel_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        group_rows: &GroupRows<Self>,
    ) -> FloatTensor<Self> {
        composed_grouped_matmul::<Self>(x, weight, group_rows)
    }

    /// The gradients of `x` and `weight` from the output gradient.
    fn grouped_matmul_kernel_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        group_rows: &GroupRows<Self>,
    ) -> GroupedMatmulGrads<Self> {
        grouped_matmul_backward_reference::<Self>(x, weight, grad_output, group_rows)
    }

    /// [`FusedOps::grouped_matmul_kernel_forward`] over the groups' own weights `parts` (each
    /// `[k, n]`). Default: over the parts stacked.
    fn grouped_matmul_parts_kernel_forward(
        x: FloatTensor<Self>,
        parts: &[FloatTensor<Self>],
        group_rows: &GroupRows<Self>,
    ) -> FloatTensor<Self> {
        Self::grouped_matmul_kernel_forward(x, stack_parts::<Self>(parts.to_vec()), group_rows)
    }

    /// The gradients of `x` and of each part from the output gradient. Default: the stacked
    /// weight's, cut into the parts'.
    fn grouped_matmul_parts_kernel_backward(
        x: FloatTensor<Self>,
        parts: &[FloatTensor<Self>],
        grad_output: FloatTensor<Self>,
        group_rows: &GroupRows<Self>,
    ) -> GroupedMatmulPartsGrads<Self> {
        let weight = stack_parts::<Self>(parts.to_vec());
        let grads = Self::grouped_matmul_kernel_backward(x, weight, grad_output, group_rows);
        GroupedMatmulPartsGrads {
            x: grads.x,
            parts: unstack_parts::<Self>(grads.weight),
        }
    }

    /// `x [m, h]`'s rows at `index [p]` → `[p, h]`, where input row `i` is read by exactly the
    /// output rows `back[i·group .. (i+1)·group]` (each in `0..p`). Autodiff
    /// differentiates it by gathering those rows and summing each group (`op/gather.rs`)
    /// instead of a scatter-add. Default: `select`.
    fn gather_rows(
        x: FloatTensor<Self>,
        index: IntTensor<Self>,
        back: IntTensor<Self>,
        group: usize,
    ) -> FloatTensor<Self> {
        let _ = (back, group);
        Self::float_select(x, 0, index)
    }

    /// The MoE combine: `rows [r, h]` (the experts' outputs, sorted by expert) → `[tokens, h]`,
    /// each token's `spec.topk` slots' rows (`index`) times their `weights [tokens · k]`,
    /// summed (see `op/combine.rs`). Default: the composed gather, multiply and sum.
    fn fused_combine_rows(
        rows: FloatTensor<Self>,
        index: CombineIndex<Self>,
        weights: FloatTensor<Self>,
        spec: CombineSpec,
    ) -> FloatTensor<Self> {
        composed_combine_rows::<Self>(rows, index, weights, spec)
    }

    /// Whether [`FusedOps::combine_rows_kernel_forward`] is a real kernel for these rows,
    /// weights and slots per token. Default: no.
    fn has_combine_rows_kernel(
        rows: &FloatTensor<Self>,
        weights: &FloatTensor<Self>,
        spec: &CombineSpec,
    ) -> bool {
        let _ = (rows, weights, spec);
        false
    }

    /// The combine with the kernel. Default: the reference (f32 sums, one rounding).
    fn combine_rows_kernel_forward(
        rows: FloatTensor<Self>,
        index: &CombineIndex<Self>,
        weights: FloatTensor<Self>,
        spec: CombineSpec,
    ) -> FloatTensor<Self> {
        combine_rows_forward_reference::<Self>(rows, index, weights, spec)
    }

    /// The rows' and the weights' gradients from the output gradient. Default: the reference.
    fn combine_rows_kernel_backward(
        rows: FloatTensor<Self>,
        index: &CombineIndex<Self>,
        weights: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        spec: CombineSpec,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        combine_rows_backward_reference::<Self>(rows, index, weights, grad_output, spec)
    }

    /// The gradient of [`FusedOps::gather_rows`]: the rows of `grad [p, h]` at `back [m ·
    /// group]`, summed over each group in order → `[m, h]` (the MoE dispatch's: each token's
    /// `k` rows). Default: a select and a sum over the group.
    fn gather_rows_backward(
        grad: FloatTensor<Self>,
        back: IntTensor<Self>,
        group: usize,
    ) -> FloatTensor<Self> {
        gather_rows_backward_reference::<Self>(grad, back, group)
    }

    /// `scores [rows, experts]` → `[rows, k]` int: each row's `k` best experts, best first, a
    /// tie to the lower index, within the `group_limit`'s best groups (see `op/moe.rs`).
    /// Routing's selection: no gradient. Default: the host reference.
    fn moe_topk(
        scores: FloatTensor<Self>,
        k: usize,
        group_limit: Option<GroupLimit>,
    ) -> IntTensor<Self> {
        moe_topk_reference::<Self>(scores, k, group_limit)
    }

    /// `experts [n]` (each in `0..num_experts`) → the positions sorted stably by expert, where
    /// each position went, and each expert's count. Default: the host reference.
    fn moe_permutation(experts: IntTensor<Self>, num_experts: usize) -> MoePermutation<Self> {
        moe_permutation_reference::<Self>(experts, num_experts)
    }

    /// MoE routing of `logits [tokens, experts]`: each token's experts (selected on the f32
    /// scores plus the optional f32 `expert_bias [experts]`, as [`FusedOps::moe_topk`] selects)
    /// and their combine weights, differentiable in the logits (see `op/router.rs`).
    /// Default: the composed scores, [`FusedOps::moe_topk`] and [`router_weights`].
    fn fused_moe_router(
        logits: FloatTensor<Self>,
        expert_bias: Option<FloatTensor<Self>>,
        spec: RouterSpec,
    ) -> MoeRouting<Self> {
        composed_moe_router::<Self>(logits, expert_bias, spec)
    }

    /// Whether [`FusedOps::moe_router_kernel_forward`] is a real kernel for these logits.
    /// Default: no.
    fn has_moe_router_kernel(logits: &FloatTensor<Self>, spec: &RouterSpec) -> bool {
        let _ = (logits, spec);
        false
    }

    /// The routing with the kernel. Default: the composed routing.
    fn moe_router_kernel_forward(
        logits: FloatTensor<Self>,
        expert_bias: Option<FloatTensor<Self>>,
        spec: RouterSpec,
    ) -> MoeRouting<Self> {
        composed_moe_router::<Self>(logits, expert_bias, spec)
    }

    /// The logits' gradient from the weights'. Default: the reference.
    fn moe_router_kernel_backward(
        logits: FloatTensor<Self>,
        chosen: IntTensor<Self>,
        grad_weights: FloatTensor<Self>,
        spec: RouterSpec,
    ) -> FloatTensor<Self> {
        moe_router_backward_reference::<Self>(logits, chosen, grad_weights, spec)
    }

    /// What the router's balancing and z-losses need from `logits [tokens, experts]` (at least
    /// one differentiable term asked for): the probabilities' mass per group of tokens, the
    /// plain top-k counts, the log-sum-exps (see `op/router_aux.rs`). Default: composed.
    fn fused_moe_router_aux(logits: FloatTensor<Self>, spec: RouterAuxSpec) -> RouterAux<Self> {
        composed_moe_router_aux::<Self>(logits, spec)
    }

    /// Whether [`FusedOps::moe_router_aux_kernel_forward`] is a real kernel for these logits.
    /// Default: no.
    fn has_moe_router_aux_kernel(logits: &FloatTensor<Self>, spec: &RouterAuxSpec) -> bool {
        let _ = (logits, spec);
        false
    }

    /// The terms with the kernel. Default: the reference (f32, rounded once).
    fn moe_router_aux_kernel_forward(
        logits: FloatTensor<Self>,
        spec: RouterAuxSpec,
    ) -> RouterAux<Self> {
        moe_router_aux_forward_reference::<Self>(logits, spec)
    }

    /// The logits' gradient from the mass's and the log-sum-exps' (each where the spec asked
    /// for it). Default: the reference.
    fn moe_router_aux_kernel_backward(
        logits: FloatTensor<Self>,
        spec: RouterAuxSpec,
        grad_mass: Option<FloatTensor<Self>>,
        grad_log_sum_exp: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        moe_router_aux_backward_reference::<Self>(logits, spec, grad_mass, grad_log_sum_exp)
    }

    /// Rotary embeddings on the query and key slots of the packed projection
    /// `qkv [b, s, g, slots, d]` with per-row tables `cos`, `sin` `[s, d]` (see
    /// `op/rope.rs`); the value slot passes through.
    fn fused_rope_qkv(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        composed_rope_qkv::<Self>(qkv, cos, sin)
    }

    /// Whether [`FusedOps::rope_qkv_kernel_forward`] is a real kernel for these inputs.
    /// Default: no.
    fn has_rope_qkv_kernel(qkv: &FloatTensor<Self>, cos: &FloatTensor<Self>) -> bool {
        let _ = (qkv, cos);
        false
    }

    /// The rotated projection with the kernel. Default: the composed arithmetic.
    fn rope_qkv_kernel_forward(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        composed_rope_qkv::<Self>(qkv, cos, sin)
    }

    /// The projection's gradient from the rotated projection's (the transposed rotation).
    fn rope_qkv_kernel_backward(
        grad: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        rope_qkv_backward_reference::<Self>(grad, cos, sin)
    }

    /// QK-norm (Megatron's `--qk-layernorm`) on the packed projection `qkv [b, s, g, slots, d]`:
    /// each query head and the key head normalised over `d` and scaled by `params`' query or key
    /// weight (plus bias, LayerNorm only); the value slot passes through (see `op/qk_norm.rs`).
    fn fused_qk_norm(
        qkv: FloatTensor<Self>,
        params: QkNormParams<Self>,
        spec: NormSpec,
    ) -> FloatTensor<Self> {
        composed_qk_norm::<Self>(qkv, params, spec)
    }

    /// Whether [`FusedOps::qk_norm_kernel_forward`] is a real kernel for this projection and
    /// weight. Default: no.
    fn has_qk_norm_kernel(
        qkv: &FloatTensor<Self>,
        weight: &FloatTensor<Self>,
        spec: &NormSpec,
    ) -> bool {
        let _ = (qkv, weight, spec);
        false
    }

    /// QK-norm forward: the normalised projection and the head rows' f32 statistics. Default:
    /// the reference.
    fn qk_norm_kernel_forward(
        qkv: FloatTensor<Self>,
        params: QkNormParams<Self>,
        spec: NormSpec,
    ) -> QkNormSaved<Self> {
        qk_norm_forward_reference::<Self>(qkv, params, spec)
    }

    /// QK-norm backward: the packed gradient and the `[query, key]` parameters' gradients from
    /// the forward's statistics. Default: the reference.
    fn qk_norm_kernel_backward(
        qkv: FloatTensor<Self>,
        weight: [FloatTensor<Self>; 2],
        has_bias: bool,
        stats: NormStats<Self>,
        grad_output: FloatTensor<Self>,
    ) -> QkNormGrads<Self> {
        qk_norm_backward_reference::<Self>(qkv, weight, has_bias, stats, grad_output)
    }

    /// Whether [`FusedOps::norm_kernel_forward`] is a real kernel for these inputs. Default: no.
    fn has_norm_kernel(x: &FloatTensor<Self>, gamma: &FloatTensor<Self>, spec: &NormSpec) -> bool {
        let _ = (x, gamma, spec);
        false
    }

    /// Normalises `x [.., hidden]` with the kernel (called only where
    /// [`FusedOps::has_norm_kernel`] says yes; see [`crate::norm`]).
    fn fused_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        spec: NormSpec,
    ) -> FloatTensor<Self> {
        let shape = x.shape();
        let out = Self::norm_kernel_forward(fold_rows::<Self>(x), gamma, beta, spec).output;
        Self::float_reshape(out, shape)
    }

    /// Norm forward on `[rows, hidden]`: the output and the row statistics. Default: the
    /// reference.
    fn norm_kernel_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        spec: NormSpec,
    ) -> NormSaved<Self> {
        norm_forward_reference::<Self>(x, gamma, beta, spec)
    }

    /// Norm backward from the forward's statistics and the output gradient; the input gradient
    /// has `into` (`[rows, hidden]`, x's dtype: the input's gradient from elsewhere) added.
    fn norm_kernel_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        has_beta: bool,
        stats: NormStats<Self>,
        grad_output: FloatTensor<Self>,
        into: Option<FloatTensor<Self>>,
    ) -> NormGrads<Self> {
        norm_backward_reference::<Self>(x, gamma, has_beta, stats, grad_output, into)
    }

    /// Whether [`FusedOps::cross_entropy_kernel_forward`] is a real kernel for these logits
    /// (`[rows, vocab]`). Default: no.
    fn has_cross_entropy_kernel(logits: &FloatTensor<Self>) -> bool {
        let _ = logits;
        false
    }

    /// Per-row losses of `logits [rows, vocab]` against `labels [rows]` with the kernel
    /// (called only where [`FusedOps::has_cross_entropy_kernel`] says yes; see
    /// [`crate::cross_entropy`]).
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::cross_entropy_kernel_forward(logits, labels).losses
    }

    /// Cross-entropy forward: per-row losses and log-sum-exps in f32. Default: the reference.
    fn cross_entropy_kernel_forward(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> CrossEntropySaved<Self> {
        cross_entropy_forward_reference::<Self>(logits, labels)
    }

    /// Cross-entropy backward: the logits' gradient from the per-row loss gradients.
    fn cross_entropy_kernel_backward(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
        log_sum_exp: FloatTensor<Self>,
        grad_losses: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        cross_entropy_backward_reference::<Self>(logits, labels, log_sum_exp, grad_losses)
    }

    /// The tied output layer's logits `rows [n, hidden] · embeddingᵀ` for `embedding [vocab,
    /// hidden]` (see `op/logits.rs`).
    fn fused_tied_logits(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        composed_tied_logits::<Self>(rows, embedding)
    }

    /// Whether [`FusedOps::tied_logits_kernel_forward`] is a real kernel for these operands.
    /// Default: no.
    fn has_tied_logits_kernel(rows: &FloatTensor<Self>, embedding: &FloatTensor<Self>) -> bool {
        let _ = (rows, embedding);
        false
    }

    /// Tied logits with the kernel. Default: the composed product.
    fn tied_logits_kernel_forward(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        composed_tied_logits::<Self>(rows, embedding)
    }

    /// `(d rows, d embedding)` from the logits' gradient, `d embedding` laid out as the
    /// embedding. Default: the reference.
    fn tied_logits_kernel_backward(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        tied_logits_backward_reference::<Self>(rows, embedding, grad)
    }

    /// Whether [`FusedOps::tied_cross_entropy_kernel_forward`] is a real kernel for these
    /// operands (see `op/tied_loss.rs`). Default: no.
    fn has_tied_cross_entropy_kernel(
        rows: &FloatTensor<Self>,
        embedding: &FloatTensor<Self>,
    ) -> bool {
        let _ = (rows, embedding);
        false
    }

    /// Per-row losses of the output layer and cross-entropy a chunk of rows at a time (see
    /// [`crate::linear_cross_entropy`]). Default: the chunked forward alone (a backend without
    /// autodiff); autodiff records a node whose backward recomputes each chunk's logits.
    fn fused_linear_cross_entropy(
        rows: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        labels: IntTensor<Self>,
        spec: LinearLossSpec,
    ) -> FloatTensor<Self> {
        linear_cross_entropy_forward::<Self>(rows, weight, labels, spec).losses
    }

    /// Per-row losses of the tied output layer with the kernel (called only where
    /// [`FusedOps::has_tied_cross_entropy_kernel`] says yes; see [`crate::tied_cross_entropy`]).
    fn fused_tied_cross_entropy(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::tied_cross_entropy_kernel_forward(rows, embedding, labels).losses
    }

    /// Losses, logits and log-sum-exps of `rows · embeddingᵀ` against `labels`. Default: the
    /// reference (the two ops' kernels).
    fn tied_cross_entropy_kernel_forward(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> TiedCrossEntropySaved<Self> {
        tied_cross_entropy_forward_reference::<Self>(rows, embedding, labels)
    }

    /// `(d rows, d embedding)` from the losses' gradient, `d embedding` laid out as the
    /// embedding. Default: the reference.
    fn tied_cross_entropy_kernel_backward(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
        saved: TiedState<Self>,
        grad_losses: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        tied_cross_entropy_backward_reference::<Self>(rows, embedding, saved, grad_losses)
    }

    /// One AdamW update of a flat fp32 parameter from its gradient (any float dtype) and
    /// moments (`None` before the first step). Called on the inner backend, outside autodiff.
    fn adamw_step(
        value: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        step: AdamWStep,
        device_scale: DeviceScale<Self>,
    ) -> AdamWTensors<Self> {
        composed_adamw::<Self>(value, grad, moments, step, device_scale)
    }

    /// A read of `x` to finish later, on any thread: it sees what the work queued before this
    /// call leaves in `x` and need not wait for work queued after it (a checkpoint snapshot's
    /// reads run beside the next step), and it lets go of the device before the host copy is
    /// made host data ([`HostCopy`]): a snapshot's reads hold the next update back only for the
    /// copies off the device. Default: the read itself, deferred (behind everything queued by
    /// the time it runs).
    fn read_later(x: FloatTensor<Self>) -> ReadLater {
        Box::new(move || {
            let data = Tensor::<Self, 1>::from_primitive(TensorPrimitive::Float(x)).into_data();
            Box::new(move || data)
        })
    }

    /// Readies what [`FusedOps::read_later`] reads of `bytes` in all will land in (a device
    /// backend's page-locked host memory), so that the first checkpoint snapshot does not pay
    /// for it while the next update waits; returns the bytes newly set aside. Default: nothing
    /// (a host backend's reads need no staging).
    fn reserve_reads_later(device: &Self::Device, bytes: usize) -> usize {
        let _ = (device, bytes);
        0
    }

    /// The run's first step is queued: what a backend measures per op from here on is the
    /// steady state, without the first step's one-time costs (kernel compiles, GEMM and
    /// attention tuning, pool growth). Default: nothing is measured.
    fn first_step_queued(device: &Self::Device) {
        let _ = device;
    }

    /// Streams each of `inputs` (flat buffers on the device) through the host and returns one
    /// new buffer of the dtype paired with it: `pass` is called on consecutive pieces, input by
    /// input in order, and fills each piece's output (`op/host_pass.rs`). Called on the
    /// inner backend. Default: each buffer downloaded whole and its output uploaded whole; a
    /// device backend overlaps the copies of neighbouring pieces with `pass`.
    fn host_pass(
        inputs: Vec<(FloatTensor<Self>, DType)>,
        pass: &mut HostPass<'_>,
    ) -> Vec<FloatTensor<Self>> {
        composed_host_pass::<Self>(inputs, pass)
    }

    /// `Σ x²` of a flat gradient (any float dtype) as `[1]` f32, accumulated in f32: one
    /// parameter's share of the global gradient norm. Called on the inner backend.
    fn sum_of_squares(x: FloatTensor<Self>) -> FloatTensor<Self> {
        composed_sum_of_squares::<Self>(x)
    }

    /// `into + cat(pieces)` as a flat `dtype` buffer (see `op/flat.rs`): a step's gradients
    /// gathered into the optimizer's flat buffer, summed over microbatches there (f32), or one
    /// microbatch's gradients kept in their own dtype. `into` (of `dtype`) is given up (a GPU
    /// adds in place when nothing else holds it).
    fn gather_flat(
        pieces: Vec<FlatPiece<Self>>,
        into: Option<FloatTensor<Self>>,
        dtype: DType,
    ) -> FloatTensor<Self> {
        composed_gather_flat::<Self>(pieces, into, dtype)
    }

    /// `Σ x²` over segments of flat f32 buffers as `[1]` f32 (`None`: no segments). The default
    /// sums segment by segment in the order given; a backend whose numbers no test pins may sum
    /// each buffer whole, so what the segments leave out must be zero.
    fn segment_sum_of_squares(
        buffers: &[FloatTensor<Self>],
        segments: &[FlatSegment],
    ) -> Option<FloatTensor<Self>> {
        composed_segment_sum_of_squares::<Self>(buffers, segments)
    }

    /// `x [.., in] · weight [in, out] + bias` with fp8 GEMMs and `fp8`'s scales (see
    /// `fp8/linear.rs`): [`FusedOps::fp8_fused_linear`] with nothing fused around it.
    fn fp8_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        fp8: &Fp8Linear,
    ) -> FloatTensor<Self> {
        Self::fp8_fused_linear(x, None, weight, bias, None, None, fp8)
    }

    /// [`FusedOps::fp8_linear`] of `norm(x)` (`x [.., in]`; `fp8/norm.rs`: Transformer
    /// Engine's `LayerNormLinear`) where `norm` is given, its output rotated by `rope` (a packed
    /// QKV projection, `fp8/rope.rs`) or added to `residual` after dropout
    /// (`fp8/residual.rs`) where one is. Default: the inference forward on
    /// [`FusedOps::fp8_quantize`] and [`FusedOps::fp8_matmul`], where dropout is off; autodiff
    /// records one node.
    fn fp8_fused_linear(
        x: FloatTensor<Self>,
        norm: Option<Fp8InputNorm<Self>>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        rope: Option<Fp8Rope<Self>>,
        residual: Option<Fp8Residual<Self>>,
        fp8: &Fp8Linear,
    ) -> FloatTensor<Self> {
        let output = fp8_linear_inference::<Self>(x, norm, weight, bias, fp8);
        let output = match rope {
            Some(rope) => rotate_output::<Self>(output, &rope),
            None => output,
        };
        match residual {
            Some(r) => Self::float_add(r.residual, output),
            None => output,
        }
    }

    /// `norm(x)` of `x [rows, in]` cast for an fp8 GEMM's input (with its amax recorded when
    /// `record`), and the norm's row statistics for its backward. Default: the norm kernel's
    /// 16-bit output, then [`FusedOps::fp8_quantize`].
    fn fp8_quantize_norm(
        x: FloatTensor<Self>,
        norm: Fp8InputNorm<Self>,
        fp8: &Fp8Linear,
        record: bool,
    ) -> (Fp8Tensor<Self>, NormStats<Self>) {
        fp8_quantize_norm_composed::<Self>(x, norm, fp8, record)
    }

    /// Whether this backend trains fp8 recipes on `device` (a run is refused with the reason
    /// otherwise). Default: no; the reference primitives are for tests.
    fn fp8_support(device: &Self::Device, settings: &Fp8Settings) -> Result<(), String> {
        let _ = settings;
        Err(format!(
            "the {} backend has no fp8 GEMMs (fp8 training needs --backend cuda on a GPU of \
             compute capability 9.0 or newer)",
            Self::name(device)
        ))
    }

    /// `x [rows, cols]` cast to `role`'s fp8 format with `fp8`'s scale, and its transpose; the
    /// amax recorded into the layer's state when `record` (delayed scaling). Default: the
    /// host reference.
    fn fp8_quantize(
        x: FloatTensor<Self>,
        fp8: &Fp8Linear,
        role: Fp8Role,
        record: bool,
    ) -> Fp8Tensor<Self> {
        fp8_quantize_reference::<Self>(x, fp8, role, record)
    }

    /// [`FusedOps::fp8_quantize`] of a tensor computed on the way in (an activation or its
    /// gradient, `fp8/source.rs`), with the cast tensor's column sums (a bias gradient)
    /// when `bias_grad`. Default: the source materialised, then cast and summed.
    fn fp8_quantize_source(
        source: Fp8Source<Self>,
        fp8: &Fp8Linear,
        role: Fp8Role,
        record: bool,
        bias_grad: bool,
    ) -> (Fp8Tensor<Self>, Option<FloatTensor<Self>>) {
        fp8_quantize_source_composed::<Self>(source, fp8, role, record, bias_grad)
    }

    /// An MLP's `fc2(act(fc1(x)))` with fp8 GEMMs, `x [rows, in]` (see `fp8/mlp.rs`).
    /// Default: the inference forward; autodiff records one node.
    fn fp8_mlp(mlp: Fp8Mlp<Self>) -> FloatTensor<Self> {
        fp8_mlp_inference::<Self>(mlp)
    }

    /// `a [m, k] · b [n, k]ᵀ` dequantised, `+ bias [n]`, in `dtype`; `fast_accumulation` for
    /// the forward. Default: the reference in f32.
    fn fp8_matmul(
        a: Fp8Operand<Self>,
        b: Fp8Operand<Self>,
        bias: Option<FloatTensor<Self>>,
        dtype: DType,
        fast_accumulation: bool,
    ) -> FloatTensor<Self> {
        let _ = fast_accumulation;
        fp8_matmul_reference::<Self>(a, b, bias, dtype)
    }

    /// Row block `g` of `a [rows, k]` (`group_rows` rows each) times group `g`'s `b[g] [n, k]`
    /// transposed, each dequantised by both inverse scales, in `dtype`; `fast_accumulation` for
    /// the forward. Default: the reference, group by group on the host's counts.
    fn fp8_grouped_rows(
        a: Fp8Operand<Self>,
        b: &[Fp8Operand<Self>],
        group_rows: &GroupRows<Self>,
        dtype: DType,
        fast_accumulation: bool,
    ) -> FloatTensor<Self> {
        fp8_grouped_rows_reference::<Self>(a, b, group_rows, dtype, fast_accumulation)
    }

    /// For each group `g`, `a_t [m, rows]`'s and `b_t [n, rows]`'s columns of the group's rows
    /// reduced: `[groups, m, n]` dequantised, in `dtype` (an MoE linear's weight gradients from
    /// `xᵀ` and `dyᵀ`). Default: the reference, group by group on the host's counts.
    fn fp8_grouped_inner(
        a_t: Fp8Operand<Self>,
        b_t: Fp8Operand<Self>,
        group_rows: &GroupRows<Self>,
        dtype: DType,
    ) -> FloatTensor<Self> {
        fp8_grouped_inner_reference::<Self>(a_t, b_t, group_rows, dtype)
    }

    /// An MoE linear's experts in fp8: `x [rows, k]`, sorted by expert, through each expert's
    /// own weight `parts[g] [k, n]` (see `fp8/experts.rs`). Default: the inference forward;
    /// autodiff records one node.
    fn fp8_experts(
        x: FloatTensor<Self>,
        parts: Vec<FloatTensor<Self>>,
        group_rows: &GroupRows<Self>,
        experts: &Fp8Experts,
    ) -> FloatTensor<Self> {
        fp8_experts_inference::<Self>(x, &parts, group_rows, experts)
    }

    /// The step-end update of every layer's delayed scales in `state`. Default: the host
    /// reference.
    fn fp8_update_scaling(state: &Fp8State) {
        fp8_update_reference::<Self>(state);
    }

    /// Whether a training step should keep its loss, gradient norm and clipping on the device
    /// and let the host read them only when it logs: true where a read stalls a queue of
    /// device work (a GPU); false keeps the host-side step, whose numbers CPU tests pin.
    fn device_resident_step() -> bool {
        false
    }
}
