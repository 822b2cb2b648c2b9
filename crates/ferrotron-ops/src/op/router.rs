//! MoE routing as one op ([`FusedOps::fused_moe_router`]): from the router's logits, each
//! token's experts and their differentiable combine weights (Megatron-Core's
//! `topk_routing_with_score_function`; Transformer Engine's `fused_topk_with_score_function`,
//! what `--moe-router-fusion` runs).
//!
//! Composed, a layer's routing is about a dozen burn ops over `[tokens, experts]` (a cast, the
//! scores, the bias, the top-k, then the weights recomputed from the logits: another cast, a
//! gather, a softmax or normalisation, the scaling, a cast back) and as many again backward,
//! each a pass over memory with its own buffer. A kernel reads a token's logits once forward,
//! deciding and weighting in registers, and once backward, recomputing what it needs from them;
//! the node keeps only the logits and the decisions.
//!
//! The composed default is exactly the model's arithmetic before the op (selection in f32 on
//! [`FusedOps::moe_topk`], weights in f32 cast back to the logits' dtype), so burn-flex keeps
//! its numbers bit for bit; the reference backward (burn ops, f32) is the contract a kernel
//! meets, and a kernel's decisions are [`select_topk`]'s on the same scores.
//!
//! [`select_topk`]: crate::select_topk

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::activation::{sigmoid, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, FloatDType, IndexingUpdateOp, Int, Tensor, TensorPrimitive};

use crate::primitive::{unwrap, wrap};
use crate::{FusedOps, GroupLimit};

/// Megatron's `--moe-router-score-function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouterScore {
    Softmax,
    Sigmoid,
}

/// How a router decides and weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterSpec {
    /// Experts per token.
    pub topk: usize,
    pub score: RouterScore,
    /// Softmax over all experts before the top-k (`--moe-router-pre-softmax`), instead of over
    /// the chosen logits after it. Sigmoid scores ignore it, as Megatron does.
    pub pre_softmax: bool,
    pub group_limit: Option<GroupLimit>,
    /// `--moe-router-topk-scaling-factor`: the weights are multiplied by it after their
    /// normalisation (1: left alone).
    pub scaling_factor: f64,
}

impl RouterSpec {
    /// `topk` experts by `score`, no group limit, the weights unscaled: the plain routings
    /// Mixtral and Qwen3 use, which the checks start from.
    pub fn plain(topk: usize, score: RouterScore, pre_softmax: bool) -> Self {
        RouterSpec {
            topk,
            score,
            pre_softmax,
            group_limit: None,
            scaling_factor: 1.0,
        }
    }
}

/// [`FusedOps::fused_moe_router`]'s result.
#[derive(Debug, Clone)]
pub struct MoeRouting<B: Backend> {
    /// `[tokens, topk]` int: each token's experts, best first.
    pub chosen: IntTensor<B>,
    /// `[tokens · topk]` in the logits' dtype: each (token, slot)'s combine weight.
    pub weights: FloatTensor<B>,
}

/// The selection scores of `logits` in f32: the score function's values (pre-softmax: the
/// probabilities; softmax after the top-k: the logits), plus the expert bias.
fn selection_scores<B: Backend>(
    logits: Tensor<B, 2>,
    expert_bias: Option<Tensor<B, 1>>,
    spec: &RouterSpec,
) -> Tensor<B, 2> {
    // f32, as the host router computed them from the read logits: a 16-bit softmax or sigmoid
    // would tie experts that the logits tell apart.
    let logits = logits.detach().cast(DType::F32);
    let scores = match spec.score {
        RouterScore::Softmax if spec.pre_softmax => softmax(logits, 1),
        RouterScore::Softmax => logits,
        RouterScore::Sigmoid => sigmoid(logits),
    };
    match expert_bias {
        Some(bias) => scores + bias.detach().cast(DType::F32).unsqueeze_dim::<2>(0),
        None => scores,
    }
}

/// Differentiable `[tokens · topk]` combine weights of the `chosen [tokens, topk]` experts
/// (Megatron's `topk_routing_with_score_function`): softmax over the chosen logits, or the
/// chosen probabilities of a softmax over all, or the chosen sigmoids normalised to sum to 1
/// when `topk > 1`; then scaled. Computed in f32 whatever the logits' dtype, the result cast to
/// it, as Megatron does. Also the host-routed layers' weights.
pub fn router_weights<B: Backend>(
    logits: Tensor<B, 2>,
    chosen: Tensor<B, 2, Int>,
    spec: &RouterSpec,
) -> Tensor<B, 1> {
    let [tokens, topk] = chosen.dims();
    let dtype = logits.dtype();
    let logits = logits.cast(FloatDType::F32);
    let weights = match spec.score {
        RouterScore::Softmax if spec.pre_softmax => softmax(logits, 1).gather(1, chosen),
        RouterScore::Softmax => softmax(logits.gather(1, chosen), 1),
        RouterScore::Sigmoid => {
            let picked = sigmoid(logits).gather(1, chosen);
            if topk > 1 {
                let total = picked.clone().sum_dim(1) + 1e-20;
                picked / total
            } else {
                picked
            }
        }
    };
    let weights = weights.reshape([tokens * topk]);
    let weights = match spec.scaling_factor {
        1.0 => weights,
        factor => weights * factor,
    };
    weights.cast(dtype)
}

/// The routing as the model composed it: [`FusedOps::moe_topk`] of the f32 selection scores,
/// then [`router_weights`].
pub fn composed_moe_router<B: FusedOps>(
    logits: FloatTensor<B>,
    expert_bias: Option<FloatTensor<B>>,
    spec: RouterSpec,
) -> MoeRouting<B> {
    let logits = wrap::<B, 2>(logits);
    let scores = selection_scores(logits.clone(), expert_bias.map(wrap::<B, 1>), &spec);
    let chosen = Tensor::<B, 2, Int>::from_primitive(B::moe_topk(
        unwrap(scores),
        spec.topk,
        spec.group_limit,
    ));
    let weights = router_weights(logits, chosen.clone(), &spec);
    MoeRouting {
        chosen: chosen.into_primitive(),
        weights: unwrap(weights),
    }
}

/// Reference of `FusedOps::moe_router_kernel_backward`: the logits' gradient `[tokens,
/// experts]` from the weights' `[tokens · topk]`, in f32, returned in the logits' dtype. With
/// `g` the weights' gradient times the scaling factor and `w` the unscaled weights:
/// softmax after the top-k, `w_j (g_j − Σ w g)` at each chosen expert; pre-softmax, `p_e (g_e −
/// Σ_chosen p g)` at every expert (`g_e` zero where not chosen); sigmoid, `σ'(l_j) (g_j / S −
/// Σ g σ / S²)` at each chosen expert, `S = Σ σ + 1e-20` (`g_j σ'(l_j)` for one expert).
pub(crate) fn moe_router_backward_reference<B: Backend>(
    logits: FloatTensor<B>,
    chosen: IntTensor<B>,
    grad_weights: FloatTensor<B>,
    spec: RouterSpec,
) -> FloatTensor<B> {
    let logits = wrap::<B, 2>(logits);
    let dtype = logits.dtype();
    let logits = logits.cast(DType::F32);
    let chosen = Tensor::<B, 2, Int>::from_primitive(chosen);
    let [tokens, topk] = chosen.dims();
    let g = wrap::<B, 1>(grad_weights)
        .cast(DType::F32)
        .reshape([tokens, topk])
        * spec.scaling_factor;
    let dense = |picked: Tensor<B, 2>| {
        logits
            .zeros_like()
            .scatter(1, chosen.clone(), picked, IndexingUpdateOp::Add)
    };
    let d_logits = match spec.score {
        RouterScore::Softmax if spec.pre_softmax => {
            let p = softmax(logits.clone(), 1);
            let g = dense(g);
            let dot = (p.clone() * g.clone()).sum_dim(1);
            p * (g - dot)
        }
        RouterScore::Softmax => {
            let w = softmax(logits.clone().gather(1, chosen.clone()), 1);
            let dot = (w.clone() * g.clone()).sum_dim(1);
            dense(w * (g - dot))
        }
        RouterScore::Sigmoid => {
            let s = sigmoid(logits.clone().gather(1, chosen.clone()));
            let d_s = if topk > 1 {
                let total = s.clone().sum_dim(1) + 1e-20;
                let dot = (g.clone() * s.clone()).sum_dim(1);
                g / total.clone() - dot / total.square()
            } else {
                g
            };
            dense(d_s * s.clone() * (s.neg() + 1.0))
        }
    };
    unwrap(d_logits.cast(dtype))
}

#[derive(Debug)]
struct MoeRouterOp;

impl<B: FusedOps> Backward<B, 1> for MoeRouterOp {
    /// The logits, the decisions and the spec.
    type State = (FloatTensor<B>, IntTensor<B>, RouterSpec);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (logits, chosen, spec) = ops.state;
        if let [Some(node)] = ops.parents {
            let d_logits = B::moe_router_kernel_backward(logits, chosen, grad, spec);
            grads.register::<B>(node.id, d_logits);
        }
    }
}

/// Records the routing as one node whose forward and backward are `B`'s kernels; it keeps the
/// logits and the decisions. The expert bias steers the selection only and gets no gradient.
/// Public so tests can drive the node with a CPU backend's reference kernels.
pub fn moe_router_node<B: FusedOps, C: CheckpointStrategy>(
    logits: FloatTensor<Autodiff<B, C>>,
    expert_bias: Option<FloatTensor<Autodiff<B, C>>>,
    spec: RouterSpec,
) -> MoeRouting<Autodiff<B, C>> {
    let routing = B::moe_router_kernel_forward(
        logits.primitive.clone(),
        expert_bias.map(|bias| bias.primitive),
        spec,
    );
    let prepared = MoeRouterOp
        .prepare::<C>([logits.node.clone()])
        .compute_bound()
        .stateful();
    let weights = match prepared {
        OpsKind::Tracked(prep) => prep.finish(
            (logits.primitive, routing.chosen.clone(), spec),
            routing.weights,
        ),
        OpsKind::UnTracked(prep) => prep.finish(routing.weights),
    };
    MoeRouting {
        chosen: routing.chosen,
        weights,
    }
}

/// The routing of `logits [tokens, experts]` as tensors (the model's call): `(chosen [tokens,
/// topk], weights [tokens · topk])`.
pub fn moe_router<B: FusedOps>(
    logits: Tensor<B, 2>,
    expert_bias: Option<Tensor<B, 1>>,
    spec: RouterSpec,
) -> (Tensor<B, 2, Int>, Tensor<B, 1>) {
    let routing = B::fused_moe_router(
        unwrap(logits),
        expert_bias.map(|bias| bias.into_primitive().tensor()),
        spec,
    );
    (
        Tensor::from_primitive(routing.chosen),
        Tensor::from_primitive(TensorPrimitive::Float(routing.weights)),
    )
}
