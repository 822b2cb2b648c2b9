//! [`FusedOps`] for `Autodiff<B>`: when the inner backend has a kernel for the inputs, one
//! tracked node whose backward is the kernel's backward; otherwise the composed default on the
//! autodiff backend itself, which records exactly the graph the model recorded before.
//!
//! The attention node keeps q, k, v, the output and the f32 softmax statistics (`[b, h, s, 1]`):
//! never the `[b, h, s, s]` scores or probabilities, which is the memory the fused op saves. The
//! packed attention node keeps the packed projection instead of three views of it, and hands
//! back one packed gradient.
//! The norm node keeps x, γ and two f32 numbers per row instead of every intermediate (the
//! QK-norm node likewise, per head row of the packed projection); the
//! cross-entropy node the logits, the labels and one f32 log-sum-exp per row; the tied-logits
//! node its two operands, as burn's matmul does; the linear cross-entropy node its two operands,
//! the labels and the log-sum-exps, no logits.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::ops::{FloatTensor, IntTensor};

use crate::fp8::experts::{Fp8Experts, fp8_experts_node};
use crate::fp8::mlp::fp8_mlp_node;
use crate::fp8::node::fp8_linear_node;
use crate::fp8::scaling::Fp8Settings;
use crate::kernel_or_composed;
use crate::op::gather::gather_rows_node;
use crate::op::grouped::stack_parts;
use crate::{
    AttentionSpec, CombineIndex, CombineSpec, Fp8InputNorm, Fp8Linear, Fp8Mlp, Fp8Residual,
    Fp8Rope, Fp8State, FusedOps, GroupLimit, GroupRows, LinearLossSpec, MoePermutation, MoeRouting,
    NormSpec, QkNormParams, RouterAux, RouterAuxSpec, RouterSpec, attention_node, bias_gelu_node,
    combine_rows_node, composed_attention, composed_bias_gelu, composed_combine_rows,
    composed_dropout_add, composed_embedding, composed_gelu, composed_grouped_matmul,
    composed_moe_router, composed_moe_router_aux, composed_qk_norm, composed_qkv_attention,
    composed_rope_qkv, composed_swiglu, composed_tied_logits, cross_entropy_node, dropout_add_node,
    embedding_node, gelu_node, grouped_matmul_node, grouped_matmul_parts_node,
    linear_cross_entropy_node, moe_router_aux_node, moe_router_node, norm_node, parts_are_leaves,
    qk_norm_node, qkv_attention_node, rope_qkv_node, swiglu_node, tied_cross_entropy_node,
    tied_logits_node,
};

impl<B: FusedOps, C: CheckpointStrategy> FusedOps for Autodiff<B, C> {
    fn fp8_fused_linear(
        x: FloatTensor<Self>,
        norm: Option<Fp8InputNorm<Self>>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        rope: Option<Fp8Rope<Self>>,
        residual: Option<Fp8Residual<Self>>,
        fp8: &Fp8Linear,
    ) -> FloatTensor<Self> {
        fp8_linear_node::<B, C>(x, norm, weight, bias, rope, residual, fp8)
    }

    fn fp8_mlp(mlp: Fp8Mlp<Self>) -> FloatTensor<Self> {
        fp8_mlp_node::<B, C>(mlp)
    }

    fn fp8_experts(
        x: FloatTensor<Self>,
        parts: Vec<FloatTensor<Self>>,
        group_rows: &GroupRows<Self>,
        experts: &Fp8Experts,
    ) -> FloatTensor<Self> {
        fp8_experts_node::<B, C>(x, parts, group_rows, experts)
    }

    fn fp8_support(device: &Self::Device, settings: &Fp8Settings) -> Result<(), String> {
        B::fp8_support(device, settings)
    }

    fn fp8_update_scaling(state: &Fp8State) {
        B::fp8_update_scaling(state);
    }

    fn fused_tied_logits(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_tied_logits_kernel(&rows.primitive, &embedding.primitive),
            tied_logits_node::<B, C>,
            composed_tied_logits::<Self>,
            (rows, embedding)
        )
    }

    fn has_tied_cross_entropy_kernel(
        rows: &FloatTensor<Self>,
        embedding: &FloatTensor<Self>,
    ) -> bool {
        B::has_tied_cross_entropy_kernel(&rows.primitive, &embedding.primitive)
    }

    fn fused_tied_cross_entropy(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        tied_cross_entropy_node::<B, C>(rows, embedding, labels)
    }

    fn fused_linear_cross_entropy(
        rows: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        labels: IntTensor<Self>,
        spec: LinearLossSpec,
    ) -> FloatTensor<Self> {
        linear_cross_entropy_node::<B, C>(rows, weight, labels, spec)
    }

    fn device_resident_step() -> bool {
        B::device_resident_step()
    }

    fn gather_rows(
        x: FloatTensor<Self>,
        index: IntTensor<Self>,
        back: IntTensor<Self>,
        group: usize,
    ) -> FloatTensor<Self> {
        gather_rows_node::<B, C>(x, index, back, group)
    }

    fn fused_combine_rows(
        rows: FloatTensor<Self>,
        index: CombineIndex<Self>,
        weights: FloatTensor<Self>,
        spec: CombineSpec,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_combine_rows_kernel(&rows.primitive, &weights.primitive, &spec),
            combine_rows_node::<B, C>,
            composed_combine_rows::<Self>,
            (rows, index, weights, spec)
        )
    }

    fn reserve_reads_later(device: &Self::Device, bytes: usize) -> usize {
        B::reserve_reads_later(device, bytes)
    }

    fn moe_topk(
        scores: FloatTensor<Self>,
        k: usize,
        group_limit: Option<GroupLimit>,
    ) -> IntTensor<Self> {
        B::moe_topk(scores.primitive, k, group_limit)
    }

    fn fused_moe_router(
        logits: FloatTensor<Self>,
        expert_bias: Option<FloatTensor<Self>>,
        spec: RouterSpec,
    ) -> MoeRouting<Self> {
        kernel_or_composed!(
            B::has_moe_router_kernel(&logits.primitive, &spec),
            moe_router_node::<B, C>,
            composed_moe_router::<Self>,
            (logits, expert_bias, spec)
        )
    }

    fn fused_moe_router_aux(logits: FloatTensor<Self>, spec: RouterAuxSpec) -> RouterAux<Self> {
        kernel_or_composed!(
            B::has_moe_router_aux_kernel(&logits.primitive, &spec),
            moe_router_aux_node::<B, C>,
            composed_moe_router_aux::<Self>,
            (logits, spec)
        )
    }

    fn moe_permutation(experts: IntTensor<Self>, num_experts: usize) -> MoePermutation<Self> {
        let permutation = B::moe_permutation(experts, num_experts);
        MoePermutation {
            order: permutation.order,
            rows: permutation.rows,
            counts: permutation.counts,
        }
    }

    fn has_norm_kernel(x: &FloatTensor<Self>, gamma: &FloatTensor<Self>, spec: &NormSpec) -> bool {
        B::has_norm_kernel(&x.primitive, &gamma.primitive, spec)
    }

    fn fused_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        spec: NormSpec,
    ) -> FloatTensor<Self> {
        norm_node::<B, C>(x, gamma, beta, spec)
    }

    fn has_cross_entropy_kernel(logits: &FloatTensor<Self>) -> bool {
        B::has_cross_entropy_kernel(&logits.primitive)
    }

    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        cross_entropy_node::<B, C>(logits, labels)
    }

    fn fused_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_attention_kernel(&query.primitive, &key.primitive, &value.primitive, &spec),
            attention_node::<B, C>,
            composed_attention::<Self>,
            (query, key, value, spec)
        )
    }

    fn fused_dropout_add(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        prob: f64,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            prob > 0.0 && B::has_dropout_add_kernel(&x.primitive, prob),
            dropout_add_node::<B, C>,
            composed_dropout_add::<Self>,
            (x, residual, prob)
        )
    }

    fn fused_swiglu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_swiglu_kernel(&x.primitive),
            swiglu_node::<B, C>,
            composed_swiglu::<Self>,
            (x)
        )
    }

    fn fused_embedding(weight: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_embedding_kernel(&weight.primitive),
            embedding_node::<B, C>,
            composed_embedding::<Self>,
            (weight, indices)
        )
    }

    fn fuses_bias_gelu() -> bool {
        B::fuses_bias_gelu()
    }

    fn fused_bias_gelu(x: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_bias_gelu_kernel(&x.primitive, &bias.primitive),
            bias_gelu_node::<B, C>,
            composed_bias_gelu::<Self>,
            (x, bias)
        )
    }

    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_gelu_kernel(&x.primitive),
            gelu_node::<B, C>,
            composed_gelu::<Self>,
            (x)
        )
    }

    fn fused_grouped_matmul(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        group_rows: &GroupRows<Self>,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_grouped_matmul_kernel(&x.primitive, &weight.primitive),
            grouped_matmul_node::<B, C>,
            composed_grouped_matmul::<Self>,
            (x, weight, group_rows)
        )
    }

    fn fused_grouped_matmul_parts(
        x: FloatTensor<Self>,
        parts: Vec<FloatTensor<Self>>,
        group_rows: &GroupRows<Self>,
    ) -> FloatTensor<Self> {
        let kernel = parts
            .first()
            .is_some_and(|part| B::has_grouped_matmul_parts_kernel(&x.primitive, &part.primitive));
        if kernel && parts_are_leaves::<B, C>(&parts) {
            return grouped_matmul_parts_node::<B, C>(x, parts, group_rows);
        }
        // Parts computed by other ops reach the node through the stack's own backward; the node
        // then keeps the stacked copy until its backward (model parameters are always leaves).
        let weight = stack_parts::<Self>(parts);
        Self::fused_grouped_matmul(x, weight, group_rows)
    }

    fn fused_rope_qkv(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_rope_qkv_kernel(&qkv.primitive, &cos.primitive),
            rope_qkv_node::<B, C>,
            composed_rope_qkv::<Self>,
            (qkv, cos, sin)
        )
    }

    fn fused_qk_norm(
        qkv: FloatTensor<Self>,
        params: QkNormParams<Self>,
        spec: NormSpec,
    ) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_qk_norm_kernel(&qkv.primitive, &params.weight[0].primitive, &spec),
            qk_norm_node::<B, C>,
            composed_qk_norm::<Self>,
            (qkv, params, spec)
        )
    }

    fn fused_qkv_attention(qkv: FloatTensor<Self>, spec: AttentionSpec) -> FloatTensor<Self> {
        kernel_or_composed!(
            B::has_qkv_attention_kernel(&qkv.primitive, &spec),
            qkv_attention_node::<B, C>,
            composed_qkv_attention::<Self>,
            (qkv, spec)
        )
    }
}
