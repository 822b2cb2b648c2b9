//! [`FusedOps`]: fused operators as a backend extension, the same mechanism as [`ParallelOps`].
//!
//! Each op has a *composed* default written with burn ops — exactly the arithmetic the model
//! used before the op existed, so `burn-flex` and stock burn-cuda keep their numbers bit for
//! bit — and a *kernel* pair (forward that saves what its backward needs, and that backward)
//! which a GPU backend overrides. `Autodiff<B>` (see `fused_autodiff.rs`) records one graph node
//! whose backward is the kernel's backward when `B` says it has a kernel for the inputs, and
//! otherwise runs the composed default on itself (so autodiff records today's graph).
//!
//! The kernel pair also has a composed reference implementation (`*_reference`): it is what the
//! CPU tests drive through the autodiff node to check the node's gradients against the composed
//! graph's, and it documents the contract a kernel must meet.
//!
//! The ops: causal (or unmasked) scaled-dot-product attention with grouped-query K/V, also
//! straight from the packed QKV projection (`fused_qkv.rs`), the residual add with hidden dropout
//! (`fused_dropout.rs`), SwiGLU from the packed projection (`fused_swiglu.rs`), GELU
//! (`fused_gelu.rs`), the token embedding's lookup (`fused_embedding.rs`), rotary
//! embeddings on the packed projection (`fused_rope.rs`) and its per-head QK-norm
//! (`fused_qk_norm.rs`), LayerNorm/RMSNorm (`fused_norm.rs`), the MoE experts' grouped matmul
//! (`fused_grouped.rs`), its routing decisions (`fused_moe.rs`, no gradient) and row gathers
//! differentiated by gathers (`fused_gather.rs`), the softmax
//! cross-entropy (`fused_loss.rs`), alone or with the tied output layer (`fused_tied_loss.rs`),
//! the AdamW update (`fused_adamw.rs`) with its flat gradient buffers (`fused_flat.rs`) and the
//! fp8 linear layer (`fused_fp8.rs`, on three primitives instead of a kernel pair).
//!
//! [`ParallelOps`]: crate::ParallelOps

use burn::nn::DropoutConfig;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention as burn_attention;
use burn::tensor::ops::{AttentionModuleOptions, FloatTensor, IntTensor};
use burn::tensor::{Bool, DType, Tensor, TensorData, TensorMetadata, TensorPrimitive};

use crate::fp8_scaling::{Fp8Role, Fp8Settings};
use crate::fused_adamw::{
    AdamWStep, AdamWTensors, DeviceScale, composed_adamw, composed_sum_of_squares,
};
use crate::fused_dropout::{
    DropoutMask, DropoutSaved, composed_dropout_add, dropout_add_backward_reference,
    dropout_add_forward_reference,
};
use crate::fused_embedding::{composed_embedding, embedding_backward_reference};
use crate::fused_flat::{
    FlatPiece, FlatSegment, composed_gather_flat, composed_segment_sum_of_squares,
};
use crate::fused_fp8::{
    Fp8Linear, Fp8Operand, Fp8State, Fp8Tensor, fp8_linear_inference, fp8_matmul_reference,
    fp8_quantize_reference, fp8_update_reference,
};
use crate::fused_fp8_mlp::{Fp8Mlp, fp8_mlp_inference};
use crate::fused_fp8_norm::{Fp8InputNorm, fp8_quantize_norm_composed};
use crate::fused_fp8_residual::Fp8Residual;
use crate::fused_fp8_rope::{Fp8Rope, rotate_output};
use crate::fused_fp8_source::{Fp8Source, fp8_quantize_source_composed};
use crate::fused_gelu::{composed_gelu, gelu_backward_reference};
use crate::fused_grouped::{
    GroupedMatmulGrads, composed_grouped_matmul, grouped_matmul_backward_reference,
};
use crate::fused_host_pass::{HostPass, composed_host_pass};
use crate::fused_logits::{composed_tied_logits, tied_logits_backward_reference};
use crate::fused_loss::{
    CrossEntropySaved, cross_entropy_backward_reference, cross_entropy_forward_reference,
};
use crate::fused_moe::{GroupLimit, MoePermutation, moe_permutation_reference, moe_topk_reference};
use crate::fused_norm::{
    NormGrads, NormSaved, NormSpec, NormStats, fold_rows, norm_backward_reference,
    norm_forward_reference,
};
use crate::fused_qk_norm::{
    QkNormGrads, QkNormParams, QkNormSaved, composed_qk_norm, qk_norm_backward_reference,
    qk_norm_forward_reference,
};
use crate::fused_qkv::{
    composed_qkv_attention, qkv_attention_backward_reference, qkv_attention_forward_reference,
};
use crate::fused_rope::{composed_rope_qkv, rope_qkv_backward_reference};
use crate::fused_swiglu::{composed_swiglu, swiglu_backward_reference};
use crate::fused_tied_loss::{
    TiedCrossEntropySaved, TiedState, tied_cross_entropy_backward_reference,
    tied_cross_entropy_forward_reference,
};
use crate::primitive::{unwrap, wrap};

/// A device read to finish later ([`FusedOps::read_later`]).
pub type ReadLater = Box<dyn FnOnce() -> TensorData + Send>;

/// One attention call: `softmax(scale · q·kᵀ + mask) · v`, with dropout on the probabilities.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionSpec {
    /// Each query sees the keys at or before its position (top-left aligned, as burn's
    /// `is_causal` and `tril_mask`).
    pub causal: bool,
    /// Factor on the scores; `None` is `1/sqrt(head_dim)` (burn's convention).
    pub scale: Option<f64>,
    /// Dropout probability on the attention probabilities (applied only while autodiff is
    /// enabled, as `burn::nn::Dropout` does).
    pub dropout: f64,
    /// Sliding-window attention's left window (Megatron's `--window-size (left, 0)`, Transformer
    /// Engine's `window_size`): query `i` also sees no key before `i − left`, so with `causal`
    /// it attends `i − left ≤ j ≤ i` (`left + 1` keys). `None`: no left bound. (Hugging Face's
    /// `sliding_window = w` keeps `w` keys: `left = w − 1`.)
    pub window: Option<usize>,
}

impl AttentionSpec {
    pub fn causal() -> Self {
        Self {
            causal: true,
            scale: None,
            dropout: 0.0,
            window: None,
        }
    }

    /// The left window where it hides a key of `keys` (a window of `keys − 1` or more leaves
    /// every key in reach, so it is no mask at all).
    pub fn effective_window(&self, keys: usize) -> Option<usize> {
        self.window.filter(|&left| left + 1 < keys)
    }

    /// The mask of hidden keys `[seq, keys]` (true: hidden), `None` where every key is seen.
    pub fn hidden_keys<B: Backend>(
        &self,
        seq: usize,
        keys: usize,
        device: &B::Device,
    ) -> Option<Tensor<B, 2, Bool>> {
        // burn's `tril_mask` is true outside the lower triangle: exactly the future keys;
        // `triu_mask` with offset `−left` is true where `j < i − left`: the keys left behind.
        let future = self
            .causal
            .then(|| Tensor::<B, 2, Bool>::tril_mask([seq, keys], 0, device));
        let behind = self
            .effective_window(keys)
            .map(|left| Tensor::<B, 2, Bool>::triu_mask([seq, keys], -(left as i64), device));
        match (future, behind) {
            (Some(future), Some(behind)) => Some(future.bool_or(behind)),
            (future, behind) => future.or(behind),
        }
    }

    /// The scale for a head dimension.
    pub fn scale_for(&self, head_dim: usize) -> f64 {
        self.scale.unwrap_or(1.0 / (head_dim as f64).sqrt())
    }
}

/// What a fused attention forward keeps for its backward, besides q, k, v.
#[derive(Debug, Clone)]
pub struct AttentionSaved<B: Backend> {
    /// `[batch, heads, seq, d_v]` (the value's head dim).
    pub output: FloatTensor<B>,
    /// Per query row `max + ln Σ exp` of the scaled, masked scores: `[batch, heads, seq, 1]`, f32.
    pub stats: FloatTensor<B>,
    /// Dropout generator state (seed, counter offset) so the backward regenerates the mask.
    pub rng: [u64; 2],
}

/// Gradients of a fused attention: dq `[b, h, s, d]`, dk `[b, groups, s_kv, d]`, dv
/// `[b, groups, s_kv, d_v]`.
#[derive(Debug, Clone)]
pub struct AttentionGrads<B: Backend> {
    pub query: FloatTensor<B>,
    pub key: FloatTensor<B>,
    pub value: FloatTensor<B>,
}

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
    /// `fused_qkv.rs`) → the context `[b, s, groups·per_group, d]`.
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
    /// autodiff, as burn's `Dropout`; see `fused_dropout.rs`).
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
    /// (see `fused_swiglu.rs`).
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

    /// GELU (erf form) element-wise, any shape (see `fused_gelu.rs`).
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

    /// Rows of `weight [vocab, hidden]` for `indices [batch, seq]` → `[batch, seq, hidden]`:
    /// the token embedding's lookup (see `fused_embedding.rs`).
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
    /// `fused_grouped.rs`).
    fn fused_grouped_matmul(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        group_rows: &[usize],
    ) -> FloatTensor<Self> {
        composed_grouped_matmul::<Self>(x, weight, group_rows)
    }

    /// Whether [`FusedOps::grouped_matmul_kernel_forward`] is a real kernel for these inputs.
    /// Default: no.
    fn has_grouped_matmul_kernel(x: &FloatTensor<Self>, weight: &FloatTensor<Self>) -> bool {
        let _ = (x, weight);
        false
    }

    /// Grouped matmul with the kernel. Default: the composed arithmetic.
    fn grouped_matmul_kernel_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        group_rows: &[usize],
    ) -> FloatTensor<Self> {
        composed_grouped_matmul::<Self>(x, weight, group_rows)
    }

    /// The gradients of `x` and `weight` from the output gradient.
    fn grouped_matmul_kernel_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        group_rows: &[usize],
    ) -> GroupedMatmulGrads<Self> {
        grouped_matmul_backward_reference::<Self>(x, weight, grad_output, group_rows)
    }

    /// `x [m, h]`'s rows at `index [p]` → `[p, h]`, where input row `i` is read by exactly the
    /// output rows `back[i·group .. (i+1)·group]` (each in `0..p`). Autodiff
    /// differentiates it by gathering those rows and summing each group (`fused_gather.rs`)
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

    /// `scores [rows, experts]` → `[rows, k]` int: each row's `k` best experts, best first, a
    /// tie to the lower index, within the `group_limit`'s best groups (see `fused_moe.rs`).
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

    /// Rotary embeddings on the query and key slots of the packed projection
    /// `qkv [b, s, g, slots, d]` with per-row tables `cos`, `sin` `[s, d]` (see
    /// `fused_rope.rs`); the value slot passes through.
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
    /// weight (plus bias, LayerNorm only); the value slot passes through (see `fused_qk_norm.rs`).
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
    /// hidden]` (see `fused_logits.rs`).
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
    /// operands (see `fused_tied_loss.rs`). Default: no.
    fn has_tied_cross_entropy_kernel(
        rows: &FloatTensor<Self>,
        embedding: &FloatTensor<Self>,
    ) -> bool {
        let _ = (rows, embedding);
        false
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
    /// reads run beside the next step). Default: the read itself, deferred (behind everything
    /// queued by the time it runs).
    fn read_later(x: FloatTensor<Self>) -> ReadLater {
        Box::new(move || Tensor::<Self, 1>::from_primitive(TensorPrimitive::Float(x)).into_data())
    }

    /// Streams each of `inputs` (flat buffers on the device) through the host and returns one
    /// new buffer of the dtype paired with it: `pass` is called on consecutive pieces, input by
    /// input in order, and fills each piece's output (`fused_host_pass.rs`). Called on the
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

    /// `into + cat(pieces)` as a flat `dtype` buffer (see `fused_flat.rs`): a step's gradients
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
    /// `fused_fp8.rs`): [`FusedOps::fp8_fused_linear`] with nothing fused around it.
    fn fp8_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        fp8: &Fp8Linear,
    ) -> FloatTensor<Self> {
        Self::fp8_fused_linear(x, None, weight, bias, None, None, fp8)
    }

    /// [`FusedOps::fp8_linear`] of `norm(x)` (`x [.., in]`; `fused_fp8_norm.rs`: Transformer
    /// Engine's `LayerNormLinear`) where `norm` is given, its output rotated by `rope` (a packed
    /// QKV projection, `fused_fp8_rope.rs`) or added to `residual` after dropout
    /// (`fused_fp8_residual.rs`) where one is. Default: the inference forward on
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
    /// gradient, `fused_fp8_source.rs`), with the cast tensor's column sums (a bias gradient)
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

    /// An MLP's `fc2(act(fc1(x)))` with fp8 GEMMs, `x [rows, in]` (see `fused_fp8_mlp.rs`).
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

/// `[batch, groups, seq, d]` → `[batch, groups·per_group, seq, d]`, each group's key/value
/// shared by its `per_group` consecutive query heads.
pub fn repeat_groups<B: Backend>(x: Tensor<B, 4>, per_group: usize) -> Tensor<B, 4> {
    if per_group == 1 {
        return x;
    }
    let [batch, groups, seq, dim] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .expand([batch, groups, per_group, seq, dim])
        .reshape([batch, groups * per_group, seq, dim])
}

fn per_group(heads: usize, groups: usize) -> usize {
    assert!(
        groups > 0 && heads.is_multiple_of(groups),
        "attention: {heads} query heads are not a multiple of {groups} key/value groups"
    );
    heads / groups
}

/// The composed attention: the model's arithmetic before fused attention existed (repeated
/// K/V, then burn's `attention` op, or matmul–softmax–dropout–matmul while dropout is live).
pub fn composed_attention<B: Backend>(
    query: FloatTensor<B>,
    key: FloatTensor<B>,
    value: FloatTensor<B>,
    spec: AttentionSpec,
) -> FloatTensor<B> {
    let query: Tensor<B, 4> = wrap(query);
    let [batch, heads, seq, head_dim] = query.dims();
    let key: Tensor<B, 4> = wrap(key);
    let value: Tensor<B, 4> = wrap(value);
    let per = per_group(heads, key.dims()[1]);
    let key = repeat_groups(key, per);
    let value = repeat_groups(value, per);
    let [_, _, keys, _] = key.dims();
    let device = query.device();
    let hidden = |mask: Tensor<B, 2, Bool>| mask.unsqueeze::<4>().expand([batch, heads, seq, keys]);
    let context = if spec.dropout > 0.0 && B::ad_enabled(&device) {
        let scores = query.matmul(key.swap_dims(2, 3)) * spec.scale_for(head_dim);
        let scores = match spec.hidden_keys::<B>(seq, keys, &device) {
            Some(mask) => scores.mask_fill(hidden(mask), f32::NEG_INFINITY),
            None => scores,
        };
        let probabilities = burn::tensor::activation::softmax(scores, 3);
        DropoutConfig::new(spec.dropout)
            .init()
            .forward(probabilities)
            .matmul(value)
    } else if spec.effective_window(keys).is_some() {
        // The band as an explicit mask (burn's attention has only the causal one built in).
        let options = AttentionModuleOptions {
            scale: spec.scale,
            ..Default::default()
        };
        let mask = spec.hidden_keys::<B>(seq, keys, &device).map(hidden);
        burn_attention(query, key, value, mask, None, options)
    } else {
        let options = AttentionModuleOptions {
            is_causal: spec.causal,
            scale: spec.scale,
            ..Default::default()
        };
        burn_attention(query, key, value, None, None, options)
    };
    unwrap(context)
}

/// Scaled, masked scores in f32 (the kernels' accumulator type).
fn scores_f32<B: Backend>(
    query: &Tensor<B, 4>,
    key: &Tensor<B, 4>,
    spec: &AttentionSpec,
) -> Tensor<B, 4> {
    let [batch, heads, seq, head_dim] = query.dims();
    let [_, groups, keys, _] = key.dims();
    let key = repeat_groups(key.clone(), per_group(heads, groups));
    let scores = query
        .clone()
        .cast(DType::F32)
        .matmul(key.cast(DType::F32).swap_dims(2, 3))
        * spec.scale_for(head_dim);
    match spec.hidden_keys::<B>(seq, keys, &query.device()) {
        Some(hidden) => {
            let hidden = hidden.unsqueeze::<4>().expand([batch, heads, seq, keys]);
            scores.mask_fill(hidden, f32::NEG_INFINITY)
        }
        None => scores,
    }
}

/// Reference of [`FusedOps::attention_kernel_forward`] in burn ops (f32 softmax statistics;
/// no dropout).
pub fn attention_forward_reference<B: Backend>(
    query: FloatTensor<B>,
    key: FloatTensor<B>,
    value: FloatTensor<B>,
    spec: AttentionSpec,
) -> AttentionSaved<B> {
    assert!(
        spec.dropout == 0.0,
        "the reference attention kernel has no dropout"
    );
    let query: Tensor<B, 4> = wrap(query);
    let key: Tensor<B, 4> = wrap(key);
    let value: Tensor<B, 4> = wrap(value);
    let dtype = query.dtype();
    let per = per_group(query.dims()[1], key.dims()[1]);
    let scores = scores_f32(&query, &key, &spec);
    let max = scores.clone().max_dim(3);
    let stats = max.clone() + (scores.clone() - max).exp().sum_dim(3).log();
    let probabilities = (scores - stats.clone()).exp();
    let value = repeat_groups(value, per).cast(DType::F32);
    let output = probabilities.matmul(value).cast(dtype);
    AttentionSaved {
        output: unwrap(output),
        stats: unwrap(stats),
        rng: [0, 0],
    }
}

/// Reference of [`FusedOps::attention_kernel_backward`]: probabilities recomputed from the
/// statistics, `dS = P ∘ (dP − rowsum(dO ∘ O))`, group gradients summed over their heads.
pub fn attention_backward_reference<B: Backend>(
    query: FloatTensor<B>,
    key: FloatTensor<B>,
    value: FloatTensor<B>,
    saved: AttentionSaved<B>,
    grad_output: FloatTensor<B>,
    spec: AttentionSpec,
) -> AttentionGrads<B> {
    let query: Tensor<B, 4> = wrap(query);
    let key: Tensor<B, 4> = wrap(key);
    let value: Tensor<B, 4> = wrap(value);
    let output: Tensor<B, 4> = wrap(saved.output);
    let stats: Tensor<B, 4> = wrap(saved.stats);
    let grad: Tensor<B, 4> = wrap::<B, 4>(grad_output).cast(DType::F32);
    let dtype = query.dtype();
    let [batch, heads, seq, head_dim] = query.dims();
    let [_, groups, keys, _] = key.dims();
    let per = per_group(heads, groups);
    let scale = spec.scale_for(head_dim);

    let probabilities = (scores_f32(&query, &key, &spec) - stats).exp();
    let key_rep = repeat_groups(key, per).cast(DType::F32);
    let value_rep = repeat_groups(value, per).cast(DType::F32);
    let grad_value = probabilities.clone().swap_dims(2, 3).matmul(grad.clone());
    let grad_prob = grad.clone().matmul(value_rep.swap_dims(2, 3));
    let row = (grad * output.cast(DType::F32)).sum_dim(3);
    let grad_scores = probabilities * (grad_prob - row);
    let grad_query = grad_scores.clone().matmul(key_rep) * scale;
    let grad_key = grad_scores.swap_dims(2, 3).matmul(query.cast(DType::F32)) * scale;
    // Keys and values may differ in head dim (multi-latent attention): fold each by its own.
    let fold = |x: Tensor<B, 4>| -> Tensor<B, 4> {
        if per == 1 {
            return x;
        }
        let dim = x.dims()[3];
        x.reshape([batch, groups, per, keys, dim])
            .sum_dim(2)
            .reshape([batch, groups, keys, dim])
    };
    let _ = seq;
    AttentionGrads {
        query: unwrap(grad_query.cast(dtype)),
        key: unwrap(fold(grad_key).cast(dtype)),
        value: unwrap(fold(grad_value).cast(dtype)),
    }
}
