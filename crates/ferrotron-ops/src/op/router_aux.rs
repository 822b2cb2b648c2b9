//! What the router's balancing and z-losses need from its logits, as one op
//! ([`FusedOps::fused_moe_router_aux`]; Transformer Engine's
//! `fused_compute_score_for_moe_aux_loss`): the balancing probabilities' mass per expert over
//! each group of `tokens_per_group` consecutive tokens (the `P_i` of the Switch loss, per
//! sequence for DeepSeek's), each group's plain top-k counts (the `f_i`: no bias, no group
//! limit) and each token's log-sum-exp (the z-loss's).
//!
//! Composed, these are a softmax (or sigmoid and a normalisation) over `[tokens, experts]`, a
//! sum over the tokens, another top-k with a scatter of its counts, and the z-loss's max,
//! subtraction, exponential, sum and logarithm: each a pass with its own buffer, and as many
//! backward. A kernel computes them from one read of each token's logits, and its backward
//! writes the logits' gradient from one more. Sums over tokens run in a fixed order (per block
//! of rows, then the blocks in order), never by float atomics, so a training run's numbers
//! repeat bit for bit.
//!
//! The composed default is exactly the model's arithmetic before the op (in the logits'
//! dtype), so burn-flex keeps its numbers bit for bit; the reference kernels (burn ops, f32)
//! are the contract a kernel meets.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::activation::{sigmoid, softmax};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, IndexingUpdateOp, Int, Tensor, TensorMetadata, TensorPrimitive};

use crate::primitive::{unwrap, wrap};
use crate::{FusedOps, RouterScore};

/// The balancing losses' terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalancingSpec {
    /// Softmax over all experts, or sigmoids normalised per token (pre-softmax or not).
    pub score: RouterScore,
    /// Tokens per group: a sequence's for the sequence-level loss, all of them for the Switch
    /// loss. It divides the tokens.
    pub tokens_per_group: usize,
    /// Each group's plain top-`k` counts as well, where the caller has none.
    pub count_topk: Option<usize>,
}

/// Which terms [`FusedOps::fused_moe_router_aux`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterAuxSpec {
    pub balancing: Option<BalancingSpec>,
    /// Each token's log-sum-exp (the z-loss).
    pub log_sum_exp: bool,
}

/// [`FusedOps::fused_moe_router_aux`]'s terms, each in the logits' dtype; `None` where the spec
/// did not ask.
#[derive(Debug, Clone)]
pub struct RouterAux<B: Backend> {
    /// `[groups, experts]`: each group's sum of the balancing probabilities, differentiable.
    pub probability_mass: Option<FloatTensor<B>>,
    /// `[groups, experts]`: how many of each group's top-k slots went to each expert.
    pub topk_counts: Option<FloatTensor<B>>,
    /// `[tokens]`: each token's log-sum-exp, differentiable.
    pub log_sum_exp: Option<FloatTensor<B>>,
}

impl RouterAuxSpec {
    /// `tokens / tokens_per_group`.
    ///
    /// # Panics
    /// If the groups do not divide the tokens.
    fn groups(&self, tokens: usize) -> usize {
        self.balancing.map_or(0, |balancing| {
            let per_group = balancing.tokens_per_group;
            assert!(
                per_group > 0 && tokens.is_multiple_of(per_group),
                "moe router aux: groups of {per_group} tokens do not divide {tokens}"
            );
            tokens / per_group
        })
    }
}

/// The router's probabilities over all experts that the balancing losses use: softmax, or
/// sigmoid scores normalised per token. `[tokens, experts]`.
pub fn balancing_probabilities<B: Backend>(
    logits: Tensor<B, 2>,
    score: RouterScore,
) -> Tensor<B, 2> {
    match score {
        RouterScore::Softmax => softmax(logits, 1),
        RouterScore::Sigmoid => {
            let scores = sigmoid(logits);
            let total = scores.clone().sum_dim(1) + 1e-20;
            scores / total
        }
    }
}

/// `[tokens, experts]` → `[groups, experts]`: the sums over each group's tokens.
fn group_sums<B: Backend>(x: Tensor<B, 2>, groups: usize) -> Tensor<B, 2> {
    let [tokens, experts] = x.dims();
    x.reshape([groups, tokens / groups, experts])
        .sum_dim(1)
        .reshape([groups, experts])
}

/// Each group's plain top-`k` counts of `logits`, `[groups, experts]` in the logits' dtype
/// (counted in f32: a bf16 sum stops at 256).
fn topk_counts<B: FusedOps>(logits: Tensor<B, 2>, k: usize, groups: usize) -> Tensor<B, 2> {
    let [tokens, experts] = logits.dims();
    let dtype = logits.dtype();
    let device = logits.device();
    let chosen = Tensor::<B, 2, Int>::from_primitive(B::moe_topk(unwrap(logits.detach()), k, None));
    let group_base = Tensor::<B, 1, Int>::arange(0..tokens as i64, &device)
        .div_scalar((tokens / groups) as i64)
        .mul_scalar(experts as i64)
        .unsqueeze_dim::<2>(1)
        .expand([tokens, k]);
    let index = (chosen + group_base).reshape([tokens * k]);
    Tensor::<B, 1>::zeros([groups * experts], (&device, DType::F32))
        .scatter(
            0,
            index,
            Tensor::ones([tokens * k], (&device, DType::F32)),
            IndexingUpdateOp::Add,
        )
        .cast(dtype)
        .reshape([groups, experts])
}

/// `[tokens]`: each row's log-sum-exp, shifted by its (constant) maximum.
fn log_sum_exp<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 1> {
    let tokens = logits.dims()[0];
    let max = logits.clone().detach().max_dim(1);
    ((logits - max.clone()).exp().sum_dim(1).log() + max).reshape([tokens])
}

/// The terms as the model composed them, in the logits' dtype.
pub fn composed_moe_router_aux<B: FusedOps>(
    logits: FloatTensor<B>,
    spec: RouterAuxSpec,
) -> RouterAux<B> {
    let logits = wrap::<B, 2>(logits);
    let groups = spec.groups(logits.dims()[0]);
    let balancing = spec.balancing;
    RouterAux {
        probability_mass: balancing.map(|balancing| {
            unwrap(group_sums(
                balancing_probabilities(logits.clone(), balancing.score),
                groups,
            ))
        }),
        topk_counts: balancing
            .and_then(|balancing| balancing.count_topk)
            .map(|k| unwrap(topk_counts(logits.clone(), k, groups))),
        log_sum_exp: spec.log_sum_exp.then(|| unwrap(log_sum_exp(logits))),
    }
}

/// Reference of `FusedOps::moe_router_aux_kernel_forward`: the terms computed in f32 and
/// returned in the logits' dtype (the counts as composed: they are exact).
pub(crate) fn moe_router_aux_forward_reference<B: FusedOps>(
    logits: FloatTensor<B>,
    spec: RouterAuxSpec,
) -> RouterAux<B> {
    let logits = wrap::<B, 2>(logits);
    let dtype = logits.dtype();
    let wide = logits.clone().cast(DType::F32);
    let groups = spec.groups(logits.dims()[0]);
    let balancing = spec.balancing;
    RouterAux {
        probability_mass: balancing.map(|balancing| {
            let probabilities = balancing_probabilities(wide.clone(), balancing.score);
            unwrap(group_sums(probabilities, groups).cast(dtype))
        }),
        topk_counts: balancing
            .and_then(|balancing| balancing.count_topk)
            .map(|k| unwrap(topk_counts(logits, k, groups))),
        log_sum_exp: spec
            .log_sum_exp
            .then(|| unwrap(log_sum_exp(wide).cast(dtype))),
    }
}

/// Reference of `FusedOps::moe_router_aux_kernel_backward`: the logits' gradient from the
/// mass's (`[groups, experts]`, each token taking its group's row `m`) and the log-sum-exps'
/// (`[tokens]`), in f32, returned in the logits' dtype. Softmax: `p (m − Σ p m)`; normalised
/// sigmoids `q = σ / S`, `S = Σ σ + 1e-20`: `σ (1 − σ) (m − Σ q m) / S`; the log-sum-exp:
/// its gradient times the softmax.
pub(crate) fn moe_router_aux_backward_reference<B: Backend>(
    logits: FloatTensor<B>,
    spec: RouterAuxSpec,
    grad_mass: Option<FloatTensor<B>>,
    grad_log_sum_exp: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let logits = wrap::<B, 2>(logits);
    let dtype = logits.dtype();
    let logits = logits.cast(DType::F32);
    let [tokens, experts] = logits.dims();
    let groups = spec.groups(tokens);
    let mut d_logits = logits.zeros_like();
    if let (Some(balancing), Some(grad)) = (spec.balancing, grad_mass) {
        let m = wrap::<B, 2>(grad)
            .cast(DType::F32)
            .reshape([groups, 1, experts])
            .expand([groups, tokens / groups, experts])
            .reshape([tokens, experts]);
        d_logits = d_logits
            + match balancing.score {
                RouterScore::Softmax => {
                    let p = softmax(logits.clone(), 1);
                    let dot = (p.clone() * m.clone()).sum_dim(1);
                    p * (m - dot)
                }
                RouterScore::Sigmoid => {
                    let s = sigmoid(logits.clone());
                    let total = s.clone().sum_dim(1) + 1e-20;
                    let q = s.clone() / total.clone();
                    let dot = (q * m.clone()).sum_dim(1);
                    s.clone() * (s.neg() + 1.0) * (m - dot) / total
                }
            };
    }
    if let Some(grad) = grad_log_sum_exp {
        let g = wrap::<B, 1>(grad).cast(DType::F32).reshape([tokens, 1]);
        d_logits = d_logits + softmax(logits, 1) * g;
    }
    unwrap(d_logits.cast(dtype))
}

/// The differentiable terms of `aux` packed into one `[groups · experts + tokens]` tensor (the
/// parts the spec asked for, in that order): a node has one output.
///
/// # Panics
/// If the spec asked for neither.
fn pack<B: Backend>(aux: &RouterAux<B>) -> FloatTensor<B> {
    let mut parts: Vec<Tensor<B, 1>> = Vec::new();
    if let Some(mass) = &aux.probability_mass {
        parts.push(wrap::<B, 2>(mass.clone()).reshape([-1]));
    }
    if let Some(log_sum_exp) = &aux.log_sum_exp {
        parts.push(wrap::<B, 1>(log_sum_exp.clone()));
    }
    assert!(
        !parts.is_empty(),
        "moe router aux: the spec asks for no differentiable term"
    );
    unwrap(Tensor::cat(parts, 0))
}

/// The packed tensor's parts: the mass `[groups, experts]` and the log-sum-exps `[tokens]`.
fn unpack<B: Backend>(
    packed: Tensor<B, 1>,
    spec: &RouterAuxSpec,
    [tokens, experts]: [usize; 2],
) -> (Option<Tensor<B, 2>>, Option<Tensor<B, 1>>) {
    let groups = spec.groups(tokens);
    let mass_len = if spec.balancing.is_some() {
        groups * experts
    } else {
        0
    };
    let mass = spec.balancing.map(|_| {
        packed
            .clone()
            .slice_dim(0, 0..mass_len)
            .reshape([groups, experts])
    });
    let log_sum_exp = spec
        .log_sum_exp
        .then(|| packed.slice_dim(0, mass_len..mass_len + tokens));
    (mass, log_sum_exp)
}

#[derive(Debug)]
struct MoeRouterAuxOp;

impl<B: FusedOps> Backward<B, 1> for MoeRouterAuxOp {
    /// The logits and the spec.
    type State = (FloatTensor<B>, RouterAuxSpec);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (logits, spec) = ops.state;
        if let [Some(node)] = ops.parents {
            let dims = logits.shape().dims::<2>();
            let (d_mass, d_lse) = unpack(wrap::<B, 1>(grad), &spec, dims);
            let d_logits = B::moe_router_aux_kernel_backward(
                logits,
                spec,
                d_mass.map(unwrap),
                d_lse.map(unwrap),
            );
            grads.register::<B>(node.id, d_logits);
        }
    }
}

/// Records the terms as one node whose forward and backward are `B`'s kernels, keeping the
/// logits; its output packs the differentiable terms, which tracked slices hand out (the counts
/// carry no gradient). Public so tests can drive the node with a CPU backend's reference
/// kernels.
pub fn moe_router_aux_node<B: FusedOps, C: CheckpointStrategy>(
    logits: FloatTensor<Autodiff<B, C>>,
    spec: RouterAuxSpec,
) -> RouterAux<Autodiff<B, C>> {
    let dims = logits.primitive.shape().dims::<2>();
    let aux = B::moe_router_aux_kernel_forward(logits.primitive.clone(), spec);
    let packed = pack(&aux);
    let prepared = MoeRouterAuxOp
        .prepare::<C>([logits.node.clone()])
        .compute_bound()
        .stateful();
    let packed = match prepared {
        OpsKind::Tracked(prep) => prep.finish((logits.primitive, spec), packed),
        OpsKind::UnTracked(prep) => prep.finish(packed),
    };
    let (mass, log_sum_exp) = unpack(wrap::<Autodiff<B, C>, 1>(packed), &spec, dims);
    RouterAux {
        probability_mass: mass.map(unwrap),
        topk_counts: aux.topk_counts.map(Autodiff::<B, C>::from_inner),
        log_sum_exp: log_sum_exp.map(unwrap),
    }
}

/// [`FusedOps::fused_moe_router_aux`]'s terms as tensors.
#[derive(Debug, Clone)]
pub struct RouterAuxTerms<B: Backend> {
    /// `[groups, experts]`.
    pub probability_mass: Option<Tensor<B, 2>>,
    /// `[groups, experts]`.
    pub topk_counts: Option<Tensor<B, 2>>,
    /// `[tokens]`.
    pub log_sum_exp: Option<Tensor<B, 1>>,
}

/// The terms of `logits [tokens, experts]` as tensors (the model's call).
pub fn moe_router_aux<B: FusedOps>(logits: Tensor<B, 2>, spec: RouterAuxSpec) -> RouterAuxTerms<B> {
    let aux = B::fused_moe_router_aux(unwrap(logits), spec);
    let float = |x: FloatTensor<B>| TensorPrimitive::Float(x);
    RouterAuxTerms {
        probability_mass: aux
            .probability_mass
            .map(|x| Tensor::from_primitive(float(x))),
        topk_counts: aux.topk_counts.map(|x| Tensor::from_primitive(float(x))),
        log_sum_exp: aux.log_sum_exp.map(|x| Tensor::from_primitive(float(x))),
    }
}
