//! QK-norm on the packed QKV projection: Megatron's `--qk-layernorm` (Qwen3, OLMo2-style per-head
//! norms), each query head and each key head normalised over its `head_dim` channels and scaled
//! by the query's or the key's own `[head_dim]` weight; the value slot passes through.
//!
//! Megatron-Core builds `q_layernorm` and `k_layernorm` with the layer's normalisation
//! (`TENorm`): RMSNorm has a weight only, LayerNorm Transformer Engine's weight and bias, so the
//! bias here comes with [`NormKind::Layer`] and not with RMSNorm. Both norms run before RoPE.
//!
//! Composed, the two norms are the query and key slots sliced out of the projection, a norm of
//! each (eight to ten element-wise nodes apiece under autodiff) and a concatenation with the
//! value slot: a dozen passes over the projection forward and more backward. A kernel pair
//! normalises every head row of the packed tensor in one pass, keeps two f32 numbers per row,
//! and writes one packed gradient with both weights' (and biases') gradients in its backward.
//!
//! The composed default is exactly the arithmetic of burn's norms on the sliced heads
//! ([`composed_norm`]), so CPU numbers are the model's; the `*_reference` pair defines what a
//! kernel computes (statistics in f32).
//!
//! [`NormKind::Layer`]: crate::NormKind::Layer

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};

use crate::FusedOps;
use crate::op::norm::{NormKind, NormSpec, NormStats, composed_norm};
use crate::primitive::{unwrap, wrap};

/// The query and key norms' parameters, `[query, key]`, each `[head_dim]`: weights, and biases
/// for a LayerNorm (none for RMSNorm).
#[derive(Debug, Clone)]
pub struct QkNormParams<B: Backend> {
    pub weight: [FloatTensor<B>; 2],
    pub bias: Option<[FloatTensor<B>; 2]>,
}

/// What a QK-norm kernel's forward keeps for its backward, besides the projection and weights.
#[derive(Debug, Clone)]
pub struct QkNormSaved<B: Backend> {
    /// The packed projection with its query and key heads normalised, in its dtype.
    pub output: FloatTensor<B>,
    /// Per normalised head row (`[b, s, g, slots − 1, 1]`, f32): LayerNorm's mean, and `1/σ`.
    pub stats: NormStats<B>,
}

/// Gradients of a QK-norm: the packed projection's, and `[query, key]` weights' (and biases')
/// in the parameters' dtype.
#[derive(Debug, Clone)]
pub struct QkNormGrads<B: Backend> {
    pub qkv: FloatTensor<B>,
    pub weight: [FloatTensor<B>; 2],
    pub bias: Option<[FloatTensor<B>; 2]>,
}

/// `qkv [b, s, g, slots, d]` → its query slots `[b, s, g, slots − 2, d]`, key and value slots.
fn slots<B: Backend>(qkv: Tensor<B, 5>) -> [Tensor<B, 5>; 3] {
    let slots = qkv.dims()[3];
    assert!(
        slots >= 3,
        "packed qkv: {slots} slots per group leave no query head"
    );
    [
        qkv.clone().slice_dim(3, 0..slots - 2),
        qkv.clone().slice_dim(3, slots - 2..slots - 1),
        qkv.slice_dim(3, slots - 1..slots),
    ]
}

fn check_params<B: Backend>(params: &QkNormParams<B>, spec: &NormSpec) {
    assert_eq!(
        params.bias.is_some(),
        spec.kind == NormKind::Layer,
        "qk-norm: a LayerNorm has biases and an RMSNorm none (Megatron's TENorm)"
    );
}

/// The model's QK-norm in burn ops: [`composed_norm`] of the query heads and of the key head,
/// the value slot passed through.
pub fn composed_qk_norm<B: Backend>(
    qkv: FloatTensor<B>,
    params: QkNormParams<B>,
    spec: NormSpec,
) -> FloatTensor<B> {
    check_params(&params, &spec);
    let [query, key, value] = slots(wrap::<B, 5>(qkv));
    let [q_weight, k_weight] = params.weight.map(wrap::<B, 1>);
    let (q_bias, k_bias) = match params.bias {
        Some([q, k]) => (Some(wrap::<B, 1>(q)), Some(wrap::<B, 1>(k))),
        None => (None, None),
    };
    let query = composed_norm(query, q_weight, q_bias, spec);
    let key = composed_norm(key, k_weight, k_bias, spec);
    unwrap(Tensor::cat(vec![query, key, value], 3))
}

/// The per-slot parameter `[1, 1, 1, slots − 1, d]` in f32: the query's for each query slot,
/// then the key's.
fn per_slot<B: Backend>(query: FloatTensor<B>, key: FloatTensor<B>, heads: usize) -> Tensor<B, 5> {
    let query = wrap::<B, 1>(query).cast(DType::F32);
    let dim = query.dims()[0];
    let query = query.unsqueeze::<2>().expand([heads, dim]);
    let key = wrap::<B, 1>(key).cast(DType::F32).unsqueeze::<2>();
    Tensor::cat(vec![query, key], 0).reshape([1, 1, 1, heads + 1, dim])
}

/// Reference of `FusedOps::qk_norm_kernel_forward`: statistics and arithmetic in f32.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn qk_norm_forward_reference<B: Backend>(
    qkv: FloatTensor<B>,
    params: QkNormParams<B>,
    spec: NormSpec,
) -> QkNormSaved<B> {
    check_params(&params, &spec);
    let qkv: Tensor<B, 5> = wrap(qkv);
    let dtype = qkv.dtype();
    let heads = qkv.dims()[3] - 2;
    let [query, key, value] = slots(qkv);
    let x = Tensor::cat(vec![query, key], 3).cast(DType::F32);
    let (centered, mean) = match spec.kind {
        NormKind::Layer => {
            let mean = x.clone().mean_dim(4);
            (x - mean.clone(), Some(mean))
        }
        NormKind::Rms => (x, None),
    };
    let rstd = (centered.clone().square().mean_dim(4) + spec.epsilon)
        .sqrt()
        .recip();
    let [q_weight, k_weight] = params.weight;
    let mut y = centered * rstd.clone() * per_slot::<B>(q_weight, k_weight, heads);
    if let Some([q_bias, k_bias]) = params.bias {
        y = y + per_slot::<B>(q_bias, k_bias, heads);
    }
    QkNormSaved {
        output: unwrap(Tensor::cat(vec![y.cast(dtype), value], 3)),
        stats: NormStats {
            mean: mean.map(unwrap),
            rstd: unwrap(rstd),
        },
    }
}

/// `[1, 1, 1, heads + 1, d]`-summed per-slot gradient `Σ_{b,s,g} x` → `[query, key]` `[d]`.
fn split_per_slot<B: Backend>(x: Tensor<B, 5>, dtype: DType) -> [FloatTensor<B>; 2] {
    let [_, _, _, slots, dim] = x.dims();
    let x = x.sum_dim(0).sum_dim(1).sum_dim(2).reshape([slots, dim]);
    let query = x
        .clone()
        .slice_dim(0, 0..slots - 1)
        .sum_dim(0)
        .reshape([dim]);
    let key = x.slice_dim(0, slots - 1..slots).reshape([dim]);
    [unwrap(query.cast(dtype)), unwrap(key.cast(dtype))]
}

/// Reference of `FusedOps::qk_norm_kernel_backward`: per head row, with `x̂ = (x − mean)·r` and
/// `g = dy·γ`, `dx = r·(g − mean(g) − x̂·mean(g·x̂))` (RMSNorm: no `mean(g)` term); the value
/// slot's gradient passed through; `dγ = Σ dy·x̂`, `dβ = Σ dy` over the query heads for the
/// query's parameters and over the key heads for the key's.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn qk_norm_backward_reference<B: Backend>(
    qkv: FloatTensor<B>,
    weight: [FloatTensor<B>; 2],
    has_bias: bool,
    stats: NormStats<B>,
    grad_output: FloatTensor<B>,
) -> QkNormGrads<B> {
    let qkv: Tensor<B, 5> = wrap(qkv);
    let dtype = qkv.dtype();
    let heads = qkv.dims()[3] - 2;
    let param_dtype = wrap::<B, 1>(weight[0].clone()).dtype();
    let [query, key, _] = slots(qkv);
    let x = Tensor::cat(vec![query, key], 3).cast(DType::F32);
    let layer = stats.mean.is_some();
    let centered = match stats.mean {
        Some(mean) => x - wrap::<B, 5>(mean),
        None => x,
    };
    let rstd: Tensor<B, 5> = wrap(stats.rstd);
    let x_hat = centered * rstd.clone();
    let [d_query, d_key, d_value] = slots(wrap::<B, 5>(grad_output));
    let dy = Tensor::cat(vec![d_query, d_key], 3).cast(DType::F32);
    let [q_weight, k_weight] = weight;
    let g = dy.clone() * per_slot::<B>(q_weight, k_weight, heads);
    let projection = x_hat.clone() * (g.clone() * x_hat.clone()).mean_dim(4);
    let g = if layer { g.clone() - g.mean_dim(4) } else { g };
    let dx = (g - projection) * rstd;
    let bias = has_bias.then(|| split_per_slot(dy.clone(), param_dtype));
    QkNormGrads {
        qkv: unwrap(Tensor::cat(vec![dx.cast(dtype), d_value.cast(dtype)], 3)),
        weight: split_per_slot(dy * x_hat, param_dtype),
        bias,
    }
}

#[derive(Debug)]
struct QkNormOp;

/// State of one QK-norm node: the projection, the `[query, key]` weights, the head rows'
/// statistics.
type QkNormState<B> = (FloatTensor<B>, [FloatTensor<B>; 2], NormStats<B>);

/// Parents are the projection, the query and key weights and, for a LayerNorm, the query and
/// key biases (`N` = 5).
impl<B: FusedOps, const N: usize> Backward<B, N> for QkNormOp {
    type State = QkNormState<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (qkv, weight, stats) = ops.state;
        let out = B::qk_norm_kernel_backward(qkv, weight, N == 5, stats, grad);
        let [q_weight, k_weight] = out.weight;
        let mut computed = vec![out.qkv, q_weight, k_weight];
        computed.extend(out.bias.into_iter().flatten());
        for (parent, grad) in ops.parents.iter().zip(computed) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

fn finish_qk_norm<B: FusedOps, C: CheckpointStrategy, const N: usize>(
    prepared: OpsKind<QkNormOp, B, QkNormState<B>, C, N>,
    qkv: FloatTensor<B>,
    params: QkNormParams<B>,
    spec: NormSpec,
) -> FloatTensor<Autodiff<B, C>> {
    match prepared {
        OpsKind::Tracked(prep) => {
            let weight = params.weight.clone();
            let saved = B::qk_norm_kernel_forward(qkv.clone(), params, spec);
            prep.finish((qkv, weight, saved.stats), saved.output)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(B::qk_norm_kernel_forward(qkv, params, spec).output)
        }
    }
}

/// Records QK-norm on the packed projection as one node whose forward and backward are `B`'s
/// kernels (see `op/qk_norm.rs`); it keeps the projection, the weights and two f32 numbers
/// per head row. Public so tests can drive the node with a CPU backend's reference kernels.
pub fn qk_norm_node<B: FusedOps, C: CheckpointStrategy>(
    qkv: FloatTensor<Autodiff<B, C>>,
    params: QkNormParams<Autodiff<B, C>>,
    spec: NormSpec,
) -> FloatTensor<Autodiff<B, C>> {
    let [q_weight, k_weight] = params.weight;
    let inner_weight = [q_weight.primitive.clone(), k_weight.primitive.clone()];
    match params.bias {
        Some([q_bias, k_bias]) => {
            let prepared = QkNormOp
                .prepare::<C>([
                    qkv.node.clone(),
                    q_weight.node.clone(),
                    k_weight.node.clone(),
                    q_bias.node.clone(),
                    k_bias.node.clone(),
                ])
                .compute_bound()
                .stateful();
            let inner = QkNormParams {
                weight: inner_weight,
                bias: Some([q_bias.primitive, k_bias.primitive]),
            };
            finish_qk_norm(prepared, qkv.primitive, inner, spec)
        }
        None => {
            let prepared = QkNormOp
                .prepare::<C>([
                    qkv.node.clone(),
                    q_weight.node.clone(),
                    k_weight.node.clone(),
                ])
                .compute_bound()
                .stateful();
            let inner = QkNormParams {
                weight: inner_weight,
                bias: None,
            };
            finish_qk_norm(prepared, qkv.primitive, inner, spec)
        }
    }
}
