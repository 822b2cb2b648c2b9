//! The token embedding's lookup for [`FusedOps`], whose backward adds into the gradient the
//! embedding already has.
//!
//! Composed (burn's `embedding`), the backward is a zeroed `[vocab, hidden]` buffer with the
//! rows' gradients scatter-added into it, which autodiff then adds to the gradient the tied
//! output layer registered for the same weight moments before: at the quick start's 50,304 × 64
//! that is a 13 MB fill and a 13 MB add on one thread for 512 rows of updates. The node here
//! takes the weight's gradient out of the container when one is there and adds the rows into it;
//! only an embedding that has no gradient yet gets a fresh zeroed one. A kernel sums each
//! index's rows apart first and adds the sum: floating-point addition commutes, so `into + Σ
//! rows` is autodiff's `Σ rows + into` bit for bit, whichever gradient arrived first.
//!
//! [`FusedOps`]: crate::FusedOps

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Shape, TensorMetadata};

use crate::FusedOps;

/// burn's `embedding`: rows of `weight [vocab, hidden]` for `indices [batch, seq]` →
/// `[batch, seq, hidden]`.
pub fn composed_embedding<B: Backend>(
    weight: FloatTensor<B>,
    indices: IntTensor<B>,
) -> FloatTensor<B> {
    B::embedding(weight, indices)
}

/// Reference of [`FusedOps::embedding_kernel_backward`]: `into` (zeros without it) plus burn's
/// `embedding_backward` of `grad [batch, seq, hidden]` (the rows of each index summed from zero
/// in index order).
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn embedding_backward_reference<B: Backend>(
    indices: IntTensor<B>,
    grad: FloatTensor<B>,
    vocab: usize,
    into: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let [batch, seq, hidden] = grad.shape().dims();
    let dtype = grad.dtype();
    let indices = B::int_reshape(indices, Shape::new([batch * seq]));
    let grad = B::float_reshape(grad, Shape::new([batch * seq, hidden]));
    let zeros = B::float_zeros(
        Shape::new([vocab, hidden]),
        &B::float_device(&grad),
        dtype.into(),
    );
    let rows = B::float_select_add(zeros, 0, indices, grad);
    match into {
        Some(into) => B::float_add(into, rows),
        None => rows,
    }
}

#[derive(Debug)]
struct EmbeddingOp;

impl<B: FusedOps> Backward<B, 1> for EmbeddingOp {
    /// The indices and the weight (its node finds its gradient in the container).
    type State = (IntTensor<B>, FloatTensor<Autodiff<B>>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (indices, weight) = ops.state;
        if let [Some(node)] = ops.parents {
            let vocab = weight.primitive.shape().dims::<2>()[0];
            let into = grads.remove::<B>(&weight);
            let sum = B::embedding_kernel_backward(indices, grad, vocab, into);
            grads.register::<B>(node.id, sum);
        }
    }
}

/// Records the lookup as one node whose backward adds into the weight's gradient (see the
/// module docs). Public so tests can drive the node with a CPU backend's kernels.
pub fn embedding_node<B: FusedOps, C: CheckpointStrategy>(
    weight: FloatTensor<Autodiff<B, C>>,
    indices: IntTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = EmbeddingOp
        .prepare::<C>([weight.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let rows = B::embedding_kernel_forward(weight.primitive.clone(), indices.clone());
            prep.finish((indices, weight), rows)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(B::embedding_kernel_forward(weight.primitive, indices))
        }
    }
}
