//! Scaled-dot-product attention with grouped-query K/V ([`FusedOps::fused_attention`]): the
//! call's spec, what a kernel saves and hands back, the composed default (the model's arithmetic
//! before the op) and the reference kernels in burn ops. The autodiff node is [`attention_node`].

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::nn::DropoutConfig;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention as burn_attention;
use burn::tensor::ops::{AttentionModuleOptions, FloatTensor};
use burn::tensor::{Bool, DType, Tensor};

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

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
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
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
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
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

#[derive(Debug)]
struct AttentionOp;

/// State of one attention node: q, k, v, what the forward saved, the spec.
type AttentionState<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    AttentionSaved<B>,
    AttentionSpec,
);

impl<B: FusedOps> Backward<B, 3> for AttentionOp {
    type State = AttentionState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (query, key, value, saved, spec) = ops.state;
        let out = B::attention_kernel_backward(query, key, value, saved, grad, spec);
        if let Some(node) = node_q {
            grads.register::<B>(node.id, out.query);
        }
        if let Some(node) = node_k {
            grads.register::<B>(node.id, out.key);
        }
        if let Some(node) = node_v {
            grads.register::<B>(node.id, out.value);
        }
    }
}

/// Records attention as one node whose forward and backward are `B`'s attention kernels
/// (whatever [`FusedOps::has_attention_kernel`] says). Public so tests can drive the node with
/// the reference kernels of a CPU backend.
pub fn attention_node<B: FusedOps, C: CheckpointStrategy>(
    query: FloatTensor<Autodiff<B, C>>,
    key: FloatTensor<Autodiff<B, C>>,
    value: FloatTensor<Autodiff<B, C>>,
    spec: AttentionSpec,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = AttentionOp
        .prepare::<C>([query.node.clone(), key.node.clone(), value.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let saved = B::attention_kernel_forward(
                query.primitive.clone(),
                key.primitive.clone(),
                value.primitive.clone(),
                spec,
            );
            let output = saved.output.clone();
            let state = (query.primitive, key.primitive, value.primitive, saved, spec);
            prep.finish(state, output)
        }
        OpsKind::UnTracked(prep) => {
            // Dropout stays live, as in the composed path (burn's `Dropout` asks `ad_enabled`,
            // not whether a gradient is wanted): a recomputed range's untracked forward must
            // draw what its tracked re-run draws.
            let saved =
                B::attention_kernel_forward(query.primitive, key.primitive, value.primitive, spec);
            prep.finish(saved.output)
        }
    }
}
