//! [`FusedOps`] for `Autodiff<B>`: when the inner backend has a kernel for the inputs, one
//! tracked node whose backward is the kernel's backward; otherwise the composed default on the
//! autodiff backend itself, which records exactly the graph the model recorded before.
//!
//! The node keeps q, k, v, the output and the f32 softmax statistics (`[b, h, s, 1]`): never
//! the `[b, h, s, s]` scores or probabilities, which is the memory the fused op saves.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::FloatTensor;

use crate::fused::{AttentionSaved, AttentionSpec, FusedOps, composed_attention};

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
            // No gradient wanted: dropout is off outside training, as in the composed path.
            let spec = AttentionSpec {
                dropout: 0.0,
                ..spec
            };
            let saved =
                B::attention_kernel_forward(query.primitive, key.primitive, value.primitive, spec);
            prep.finish(saved.output)
        }
    }
}

impl<B: FusedOps, C: CheckpointStrategy> FusedOps for Autodiff<B, C> {
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
}
