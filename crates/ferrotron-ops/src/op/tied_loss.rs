//! The tied output layer and its cross-entropy as one op for [`FusedOps`]: per-row losses from
//! the final hidden rows, the tied embedding and the labels.
//!
//! As two ops (`tied_logits`, then `cross_entropy`) the backward writes the logits' gradient
//! `(softmax − one_hot) · dloss` whole (the `[rows, vocab]` buffer, 103 MB at the quick start)
//! and then reads it twice for the output layer's two gradient products: on the CPU, once the
//! products ran on every core, those passes over memory were what grew with threads the least.
//! One op lets a kernel compute the gradient a slice of the vocabulary at a time and use it for
//! both products while it sits in cache; only the logits (which the forward made anyway) and one
//! log-sum-exp per row are kept.
//!
//! [`tied_cross_entropy`] is what the model calls for a tied, whole vocabulary; `None` where the
//! backend has no kernel, and the model keeps the two ops. The reference is the two ops'
//! kernels in sequence, so a kernel computes exactly that.
//!
//! [`FusedOps`]: crate::FusedOps

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor};

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// What the forward returns: the per-row losses and what the backward needs.
#[derive(Debug, Clone)]
pub struct TiedCrossEntropySaved<B: Backend> {
    /// `[rows]` f32.
    pub losses: FloatTensor<B>,
    /// `rows · embeddingᵀ`, `[rows, vocab]`.
    pub logits: FloatTensor<B>,
    /// `log Σ exp(logits)` per row, `[rows]` f32.
    pub log_sum_exp: FloatTensor<B>,
}

/// Per-row losses `[rows]` (f32) of `rows [n, hidden] · embeddingᵀ` against `labels [n]`, through
/// the backend's kernel; `None` where it has none for these operands.
pub fn tied_cross_entropy<B: FusedOps>(
    rows: Tensor<B, 2>,
    embedding: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
) -> Option<Tensor<B, 1>> {
    let (rows, embedding) = (unwrap(rows), unwrap(embedding));
    if !B::has_tied_cross_entropy_kernel(&rows, &embedding) {
        return None;
    }
    Some(wrap(B::fused_tied_cross_entropy(
        rows,
        embedding,
        labels.into_primitive(),
    )))
}

/// Reference of [`FusedOps::tied_cross_entropy_kernel_forward`]: the backend's tied-logits and
/// cross-entropy kernels in turn.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn tied_cross_entropy_forward_reference<B: FusedOps>(
    rows: FloatTensor<B>,
    embedding: FloatTensor<B>,
    labels: IntTensor<B>,
) -> TiedCrossEntropySaved<B> {
    let logits = B::tied_logits_kernel_forward(rows, embedding);
    let saved = B::cross_entropy_kernel_forward(logits.clone(), labels);
    TiedCrossEntropySaved {
        losses: saved.losses,
        logits,
        log_sum_exp: saved.log_sum_exp,
    }
}

/// Reference of [`FusedOps::tied_cross_entropy_kernel_backward`]: the cross-entropy kernel's
/// backward, then the tied-logits kernel's: `(d rows, d embedding)`.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn tied_cross_entropy_backward_reference<B: FusedOps>(
    rows: FloatTensor<B>,
    embedding: FloatTensor<B>,
    saved: TiedState<B>,
    grad_losses: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let grad = B::cross_entropy_kernel_backward(
        saved.logits,
        saved.labels,
        saved.log_sum_exp,
        grad_losses,
    );
    B::tied_logits_kernel_backward(rows, embedding, grad)
}

/// What the backward reads besides the operands: the logits, the labels, the log-sum-exps.
#[derive(Debug, Clone)]
pub struct TiedState<B: Backend> {
    pub logits: FloatTensor<B>,
    pub labels: IntTensor<B>,
    pub log_sum_exp: FloatTensor<B>,
}

#[derive(Debug)]
struct TiedCrossEntropyOp;

impl<B: FusedOps> Backward<B, 2> for TiedCrossEntropyOp {
    type State = (FloatTensor<B>, FloatTensor<B>, TiedState<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_rows, node_embedding] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (rows, embedding, state) = ops.state;
        let (d_rows, d_embedding) =
            B::tied_cross_entropy_kernel_backward(rows, embedding, state, grad);
        if let Some(node) = node_rows {
            grads.register::<B>(node.id, d_rows);
        }
        if let Some(node) = node_embedding {
            grads.register::<B>(node.id, d_embedding);
        }
    }
}

/// Records the tied output layer and its cross-entropy as one node keeping the operands, the
/// logits, the labels and the log-sum-exps. Public so tests can drive the node on the CPU.
pub fn tied_cross_entropy_node<B: FusedOps, C: CheckpointStrategy>(
    rows: FloatTensor<Autodiff<B, C>>,
    embedding: FloatTensor<Autodiff<B, C>>,
    labels: IntTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = TiedCrossEntropyOp
        .prepare::<C>([rows.node.clone(), embedding.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let saved = B::tied_cross_entropy_kernel_forward(
                rows.primitive.clone(),
                embedding.primitive.clone(),
                labels.clone(),
            );
            let state = TiedState {
                logits: saved.logits,
                labels,
                log_sum_exp: saved.log_sum_exp,
            };
            prep.finish((rows.primitive, embedding.primitive, state), saved.losses)
        }
        OpsKind::UnTracked(prep) => prep.finish(
            B::tied_cross_entropy_kernel_forward(rows.primitive, embedding.primitive, labels)
                .losses,
        ),
    }
}
