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
//! node its two operands, as burn's matmul does.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::TensorMetadata;
use burn::tensor::ops::{FloatTensor, IntTensor};

use crate::fp8_scaling::Fp8Settings;
use crate::fused::{AttentionSaved, AttentionSpec, FusedOps, composed_attention};
use crate::fused_dropout::{DropoutMask, composed_dropout_add};
use crate::fused_embedding::{composed_embedding, embedding_node};
use crate::fused_fp8::{Fp8Linear, Fp8State};
use crate::fused_fp8_mlp::{Fp8Mlp, fp8_mlp_node};
use crate::fused_fp8_node::fp8_linear_node;
use crate::fused_fp8_norm::Fp8InputNorm;
use crate::fused_fp8_residual::Fp8Residual;
use crate::fused_fp8_rope::Fp8Rope;
use crate::fused_gather::gather_rows_node;
use crate::fused_gelu::{composed_gelu, gelu_node};
use crate::fused_grouped::composed_grouped_matmul;
use crate::fused_logits::composed_tied_logits;
use crate::fused_moe::{GroupLimit, MoePermutation};
use crate::fused_norm::{NormSpec, NormStats, fold_rows};
use crate::fused_qk_norm::{QkNormParams, composed_qk_norm};
use crate::fused_qkv::composed_qkv_attention;
use crate::fused_rope::composed_rope_qkv;
use crate::fused_swiglu::composed_swiglu;
use crate::fused_tied_loss::tied_cross_entropy_node;

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

#[derive(Debug)]
struct QkvAttentionOp;

/// State of one packed attention node: the packed projection, what the forward saved, the spec.
type QkvAttentionState<B> = (FloatTensor<B>, AttentionSaved<B>, AttentionSpec);

impl<B: FusedOps> Backward<B, 1> for QkvAttentionOp {
    type State = QkvAttentionState<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (qkv, saved, spec) = ops.state;
        if let [Some(node)] = ops.parents {
            grads.register::<B>(
                node.id,
                B::qkv_attention_kernel_backward(qkv, saved, grad, spec),
            );
        }
    }
}

/// Records attention from the packed projection as one node whose forward and backward are
/// `B`'s packed kernels; it keeps the projection, the output and the f32 statistics. Public so
/// tests can drive the node with a CPU backend's reference kernels.
pub fn qkv_attention_node<B: FusedOps, C: CheckpointStrategy>(
    qkv: FloatTensor<Autodiff<B, C>>,
    spec: AttentionSpec,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = QkvAttentionOp
        .prepare::<C>([qkv.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let saved = B::qkv_attention_kernel_forward(qkv.primitive.clone(), spec);
            let output = saved.output.clone();
            prep.finish((qkv.primitive, saved, spec), output)
        }
        OpsKind::UnTracked(prep) => {
            // Dropout live, as in `attention_node`.
            prep.finish(B::qkv_attention_kernel_forward(qkv.primitive, spec).output)
        }
    }
}

#[derive(Debug)]
struct DropoutAddOp;

/// State of one dropout-add node: what regenerates the mask, and the probability.
type DropoutAddState<B> = (DropoutMask<B>, f64);

/// Parents are `x` (dropped) and the residual.
impl<B: FusedOps> Backward<B, 2> for DropoutAddOp {
    type State = DropoutAddState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (mask, prob) = ops.state;
        let [node_x, node_residual] = ops.parents;
        if let Some(node) = node_residual {
            grads.register::<B>(node.id, grad.clone());
        }
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::dropout_add_kernel_backward(grad, prob, mask));
        }
    }
}

/// Records `residual + dropout(x)` (dropout live) as one node whose forward and backward are
/// `B`'s dropout-add kernels; it keeps no activation. Public so tests can drive the node with a
/// CPU backend's reference kernels.
pub fn dropout_add_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    residual: FloatTensor<Autodiff<B, C>>,
    prob: f64,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = DropoutAddOp
        .prepare::<C>([x.node.clone(), residual.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let saved = B::dropout_add_kernel_forward(x.primitive, residual.primitive, prob);
            prep.finish((saved.mask, prob), saved.output)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(B::dropout_add_kernel_forward(x.primitive, residual.primitive, prob).output)
        }
    }
}

#[derive(Debug)]
struct SwigluOp;

impl<B: FusedOps> Backward<B, 1> for SwigluOp {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::swiglu_kernel_backward(ops.state, grad));
        }
    }
}

/// Records SwiGLU of the packed projection as one node whose forward and backward are `B`'s
/// kernels; it keeps the projection. Public so tests can drive the node with a CPU backend's
/// reference kernels.
pub fn swiglu_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = SwigluOp
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let output = B::swiglu_kernel_forward(x.primitive.clone());
            prep.finish(x.primitive, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::swiglu_kernel_forward(x.primitive)),
    }
}

#[derive(Debug)]
struct GroupedMatmulOp;

/// State of one grouped-matmul node: `x`, `weight` and the group sizes.
type GroupedMatmulState<B> = (FloatTensor<B>, FloatTensor<B>, Vec<usize>);

/// Parents are `x` and `weight`.
impl<B: FusedOps> Backward<B, 2> for GroupedMatmulOp {
    type State = GroupedMatmulState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, weight, group_rows) = ops.state;
        let out = B::grouped_matmul_kernel_backward(x, weight, grad, &group_rows);
        let [node_x, node_weight] = ops.parents;
        if let Some(node) = node_x {
            grads.register::<B>(node.id, out.x);
        }
        if let Some(node) = node_weight {
            grads.register::<B>(node.id, out.weight);
        }
    }
}

/// Records a grouped matmul as one node whose forward and backward are `B`'s kernels; it keeps
/// `x` and `weight` (as the composed matmuls do). Public so tests can drive the node with a CPU
/// backend's reference kernels.
pub fn grouped_matmul_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    group_rows: &[usize],
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = GroupedMatmulOp
        .prepare::<C>([x.node.clone(), weight.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let output = B::grouped_matmul_kernel_forward(
                x.primitive.clone(),
                weight.primitive.clone(),
                group_rows,
            );
            prep.finish((x.primitive, weight.primitive, group_rows.to_vec()), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::grouped_matmul_kernel_forward(
            x.primitive,
            weight.primitive,
            group_rows,
        )),
    }
}

#[derive(Debug)]
struct RopeQkvOp;

impl<B: FusedOps> Backward<B, 1> for RopeQkvOp {
    /// The tables `cos`, `sin`.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            let (cos, sin) = ops.state;
            grads.register::<B>(node.id, B::rope_qkv_kernel_backward(grad, cos, sin));
        }
    }
}

/// Records RoPE on the packed projection as one node whose forward and backward are `B`'s
/// kernels; it keeps only the tables (the rotation is linear). The tables are constants, not
/// parents. Public so tests can drive the node with a CPU backend's reference kernels.
pub fn rope_qkv_node<B: FusedOps, C: CheckpointStrategy>(
    qkv: FloatTensor<Autodiff<B, C>>,
    cos: FloatTensor<Autodiff<B, C>>,
    sin: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = RopeQkvOp
        .prepare::<C>([qkv.node.clone()])
        .compute_bound()
        .stateful();
    let output =
        B::rope_qkv_kernel_forward(qkv.primitive, cos.primitive.clone(), sin.primitive.clone());
    match prepared {
        OpsKind::Tracked(prep) => prep.finish((cos.primitive, sin.primitive), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

#[derive(Debug)]
struct NormOp;

/// State of one norm node: x (the caller's tensor, whose node may already hold a gradient from
/// the residual branch when the backward runs), γ and the row statistics.
type NormState<B> = (FloatTensor<Autodiff<B>>, FloatTensor<B>, NormStats<B>);

/// Parents are x, γ and, for a LayerNorm with a bias, β (`N` = 3).
impl<B: FusedOps, const N: usize> Backward<B, N> for NormOp {
    type State = NormState<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, gamma, stats) = ops.state;
        let shape = x.primitive.shape();
        // The residual branch's share of x's gradient, added by the kernel (fused_norm.rs).
        let into = ops.parents[0]
            .as_ref()
            .and_then(|_| grads.remove::<B>(&x))
            .map(fold_rows::<B>);
        let out = B::norm_kernel_backward(
            fold_rows::<B>(x.primitive),
            gamma,
            N == 3,
            stats,
            fold_rows::<B>(grad),
            into,
        );
        let [node_x, node_gamma] = [&ops.parents[0], &ops.parents[1]];
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::float_reshape(out.input, shape));
        }
        if let Some(node) = node_gamma {
            grads.register::<B>(node.id, out.gamma);
        }
        if let (Some(Some(node)), Some(beta)) = (ops.parents.get(2), out.beta) {
            grads.register::<B>(node.id, beta);
        }
    }
}

fn finish_norm<B: FusedOps, C: CheckpointStrategy, const N: usize>(
    prepared: OpsKind<NormOp, B, NormState<B>, C, N>,
    x: FloatTensor<Autodiff<B>>,
    gamma: FloatTensor<B>,
    beta: Option<FloatTensor<B>>,
    spec: NormSpec,
) -> FloatTensor<Autodiff<B, C>> {
    let shape = x.primitive.shape();
    let rows = fold_rows::<B>(x.primitive.clone());
    match prepared {
        OpsKind::Tracked(prep) => {
            let saved = B::norm_kernel_forward(rows, gamma.clone(), beta, spec);
            let output = B::float_reshape(saved.output.clone(), shape);
            prep.finish((x, gamma, saved.into_stats()), output)
        }
        OpsKind::UnTracked(prep) => {
            let output = B::norm_kernel_forward(rows, gamma, beta, spec).output;
            prep.finish(B::float_reshape(output, shape))
        }
    }
}

/// Records a norm of `x [.., hidden]` as one node whose forward and backward are `B`'s norm
/// kernels on the rows, and whose backward adds the gradient x already has (see
/// `fused_norm.rs`). Public so tests can drive the node with a CPU backend's reference kernels.
pub fn norm_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    gamma: FloatTensor<Autodiff<B, C>>,
    beta: Option<FloatTensor<Autodiff<B, C>>>,
    spec: NormSpec,
) -> FloatTensor<Autodiff<B, C>> {
    match beta {
        Some(beta) => {
            let prepared = NormOp
                .prepare::<C>([x.node.clone(), gamma.node.clone(), beta.node.clone()])
                .compute_bound()
                .stateful();
            finish_norm(prepared, x, gamma.primitive, Some(beta.primitive), spec)
        }
        None => {
            let prepared = NormOp
                .prepare::<C>([x.node.clone(), gamma.node.clone()])
                .compute_bound()
                .stateful();
            finish_norm(prepared, x, gamma.primitive, None, spec)
        }
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
/// kernels (see `fused_qk_norm.rs`); it keeps the projection, the weights and two f32 numbers
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

#[derive(Debug)]
struct CrossEntropyOp;

/// State of one cross-entropy node: the logits, the labels and the per-row log-sum-exp.
type CrossEntropyState<B> = (FloatTensor<B>, IntTensor<B>, FloatTensor<B>);

impl<B: FusedOps> Backward<B, 1> for CrossEntropyOp {
    type State = CrossEntropyState<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (logits, labels, log_sum_exp) = ops.state;
        if let [Some(node)] = ops.parents {
            let grad_logits = B::cross_entropy_kernel_backward(logits, labels, log_sum_exp, grad);
            grads.register::<B>(node.id, grad_logits);
        }
    }
}

/// Records the per-row cross-entropy of `logits [rows, vocab]` as one node whose forward and
/// backward are `B`'s kernels. Public so tests can drive the node with a CPU backend's
/// reference kernels.
pub fn cross_entropy_node<B: FusedOps, C: CheckpointStrategy>(
    logits: FloatTensor<Autodiff<B, C>>,
    labels: IntTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = CrossEntropyOp
        .prepare::<C>([logits.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let saved = B::cross_entropy_kernel_forward(logits.primitive.clone(), labels.clone());
            prep.finish((logits.primitive, labels, saved.log_sum_exp), saved.losses)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(B::cross_entropy_kernel_forward(logits.primitive, labels).losses)
        }
    }
}

#[derive(Debug)]
struct TiedLogitsOp;

/// Parents are the rows and the embedding; the state is both operands.
impl<B: FusedOps> Backward<B, 2> for TiedLogitsOp {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (rows, embedding) = ops.state;
        let [node_rows, node_embedding] = ops.parents;
        let (d_rows, d_embedding) = B::tied_logits_kernel_backward(rows, embedding, grad);
        if let Some(node) = node_rows {
            grads.register::<B>(node.id, d_rows);
        }
        if let Some(node) = node_embedding {
            grads.register::<B>(node.id, d_embedding);
        }
    }
}

/// Records `rows · embeddingᵀ` as one node whose forward and backward are `B`'s tied-logits
/// kernels. Public so tests can drive the node with a CPU backend's reference kernels.
pub fn tied_logits_node<B: FusedOps, C: CheckpointStrategy>(
    rows: FloatTensor<Autodiff<B, C>>,
    embedding: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = TiedLogitsOp
        .prepare::<C>([rows.node.clone(), embedding.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let logits =
                B::tied_logits_kernel_forward(rows.primitive.clone(), embedding.primitive.clone());
            prep.finish((rows.primitive, embedding.primitive), logits)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::tied_logits_kernel_forward(
            rows.primitive,
            embedding.primitive,
        )),
    }
}

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
        if B::has_tied_logits_kernel(&rows.primitive, &embedding.primitive) {
            tied_logits_node::<B, C>(rows, embedding)
        } else {
            composed_tied_logits::<Self>(rows, embedding)
        }
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

    fn moe_topk(
        scores: FloatTensor<Self>,
        k: usize,
        group_limit: Option<GroupLimit>,
    ) -> IntTensor<Self> {
        B::moe_topk(scores.primitive, k, group_limit)
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
        if B::has_attention_kernel(&query.primitive, &key.primitive, &value.primitive, &spec) {
            attention_node::<B, C>(query, key, value, spec)
        } else {
            composed_attention::<Self>(query, key, value, spec)
        }
    }

    fn fused_dropout_add(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        prob: f64,
    ) -> FloatTensor<Self> {
        if prob > 0.0 && B::has_dropout_add_kernel(&x.primitive, prob) {
            dropout_add_node::<B, C>(x, residual, prob)
        } else {
            composed_dropout_add::<Self>(x, residual, prob)
        }
    }

    fn fused_swiglu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        if B::has_swiglu_kernel(&x.primitive) {
            swiglu_node::<B, C>(x)
        } else {
            composed_swiglu::<Self>(x)
        }
    }

    fn fused_embedding(weight: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        if B::has_embedding_kernel(&weight.primitive) {
            embedding_node::<B, C>(weight, indices)
        } else {
            composed_embedding::<Self>(weight, indices)
        }
    }

    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        if B::has_gelu_kernel(&x.primitive) {
            gelu_node::<B, C>(x)
        } else {
            composed_gelu::<Self>(x)
        }
    }

    fn fused_grouped_matmul(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        group_rows: &[usize],
    ) -> FloatTensor<Self> {
        if B::has_grouped_matmul_kernel(&x.primitive, &weight.primitive) {
            grouped_matmul_node::<B, C>(x, weight, group_rows)
        } else {
            composed_grouped_matmul::<Self>(x, weight, group_rows)
        }
    }

    fn fused_rope_qkv(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        if B::has_rope_qkv_kernel(&qkv.primitive, &cos.primitive) {
            rope_qkv_node::<B, C>(qkv, cos, sin)
        } else {
            composed_rope_qkv::<Self>(qkv, cos, sin)
        }
    }

    fn fused_qk_norm(
        qkv: FloatTensor<Self>,
        params: QkNormParams<Self>,
        spec: NormSpec,
    ) -> FloatTensor<Self> {
        if B::has_qk_norm_kernel(&qkv.primitive, &params.weight[0].primitive, &spec) {
            qk_norm_node::<B, C>(qkv, params, spec)
        } else {
            composed_qk_norm::<Self>(qkv, params, spec)
        }
    }

    fn fused_qkv_attention(qkv: FloatTensor<Self>, spec: AttentionSpec) -> FloatTensor<Self> {
        if B::has_qkv_attention_kernel(&qkv.primitive, &spec) {
            qkv_attention_node::<B, C>(qkv, spec)
        } else {
            composed_qkv_attention::<Self>(qkv, spec)
        }
    }
}
