//! Attention straight from the packed QKV projection.
//!
//! The model's QKV linear writes `[b, s, groups, per_group + 2, d]` (each group's query heads,
//! then its key, then its value: Megatron's layout). Splitting that into q, k and v with slices
//! costs nothing forward, but autodiff's backward of each slice is a fresh zero tensor of the
//! whole projection with the slice's gradient assigned into it, and the three are then added:
//! three fills, three copies and two adds over the full projection per layer, about 8 % of a
//! gpt-1.3b step on an H200. A kernel that takes the packed tensor instead writes dq, dk and dv
//! straight into one packed gradient, and its output is already in the `[b, s, heads, d]`
//! layout the output projection reads.
//!
//! The composed default is exactly the model's split followed by [`FusedOps::fused_attention`]
//! (so burn-flex and stock burn-cuda keep their numbers bit for bit); the `*_reference` kernels
//! define the contract a packed kernel meets and drive the CPU test of the autodiff node.
//!
//! [`FusedOps::fused_attention`]: crate::FusedOps::fused_attention

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::primitive::{unwrap, wrap};
use crate::{
    AttentionSaved, AttentionSpec, FusedOps, attention_backward_reference,
    attention_forward_reference,
};

/// `qkv [b, s, groups, per_group + 2, d]` → query `[b, groups·per_group, s, d]`, key and value
/// `[b, groups, s, d]`, as views (swapped dims, no copy where the backend has views).
pub fn split_qkv<B: Backend>(qkv: Tensor<B, 5>) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
    let [batch, seq, groups, slots, head_dim] = qkv.dims();
    assert!(
        slots >= 3,
        "packed qkv: {slots} slots per group leave no query head"
    );
    let per_group = slots - 2;
    let query = qkv
        .clone()
        .slice_dim(3, 0..per_group)
        .reshape([batch, seq, groups * per_group, head_dim])
        .swap_dims(1, 2);
    let key = qkv
        .clone()
        .slice_dim(3, per_group..per_group + 1)
        .reshape([batch, seq, groups, head_dim])
        .swap_dims(1, 2);
    let value = qkv
        .slice_dim(3, per_group + 1..per_group + 2)
        .reshape([batch, seq, groups, head_dim])
        .swap_dims(1, 2);
    (query, key, value)
}

/// The composed packed attention: [`split_qkv`], the backend's `fused_attention`, and the
/// context as `[b, s, heads, d]`.
pub fn composed_qkv_attention<B: FusedOps>(
    qkv: FloatTensor<B>,
    spec: AttentionSpec,
) -> FloatTensor<B> {
    let (query, key, value) = split_qkv::<B>(wrap(qkv));
    let context: Tensor<B, 4> = wrap(B::fused_attention(
        unwrap(query),
        unwrap(key),
        unwrap(value),
        spec,
    ));
    unwrap(context.swap_dims(1, 2))
}

/// Reference of [`FusedOps::qkv_attention_kernel_forward`]: the output `[b, s, heads, d]` and
/// the f32 statistics `[b, heads, s, 1]` (no dropout).
pub(crate) fn qkv_attention_forward_reference<B: Backend>(
    qkv: FloatTensor<B>,
    spec: AttentionSpec,
) -> AttentionSaved<B> {
    let (query, key, value) = split_qkv::<B>(wrap(qkv));
    let saved = attention_forward_reference::<B>(unwrap(query), unwrap(key), unwrap(value), spec);
    let output: Tensor<B, 4> = wrap(saved.output);
    AttentionSaved {
        output: unwrap(output.swap_dims(1, 2)),
        ..saved
    }
}

/// Reference of [`FusedOps::qkv_attention_kernel_backward`]: the packed gradient
/// `[b, s, groups, per_group + 2, d]` from the `[b, s, heads, d]` output gradient.
pub(crate) fn qkv_attention_backward_reference<B: Backend>(
    qkv: FloatTensor<B>,
    saved: AttentionSaved<B>,
    grad_output: FloatTensor<B>,
    spec: AttentionSpec,
) -> FloatTensor<B> {
    let qkv: Tensor<B, 5> = wrap(qkv);
    let [batch, seq, groups, slots, head_dim] = qkv.dims();
    let (query, key, value) = split_qkv(qkv);
    let swap = |x: FloatTensor<B>| unwrap(wrap::<B, 4>(x).swap_dims(1, 2));
    let saved = AttentionSaved {
        output: swap(saved.output),
        ..saved
    };
    let grads = attention_backward_reference::<B>(
        unwrap(query),
        unwrap(key),
        unwrap(value),
        saved,
        swap(grad_output),
        spec,
    );
    let pack = |x: FloatTensor<B>, slots: usize| -> Tensor<B, 5> {
        wrap::<B, 4>(x)
            .swap_dims(1, 2)
            .reshape([batch, seq, groups, slots, head_dim])
    };
    unwrap(Tensor::cat(
        vec![
            pack(grads.query, slots - 2),
            pack(grads.key, 1),
            pack(grads.value, 1),
        ],
        3,
    ))
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
