//! The tied output layer's logits, `rows · embeddingᵀ`, for [`FusedOps`].
//!
//! Composed, the product is burn's `linear` against a transposed view of the embedding. On the
//! CPU backend that allocates the `[rows, vocab]` result zeroed and then copies it into an
//! aligned buffer before the GEMM writes it (at the quick start's 512 × 50,304 that was two
//! single-threaded passes over 103 MB of fresh pages, more than the GEMM itself), and hands the
//! embedding its gradient as a transposed view, so adding the lookup's gradient to it walked
//! 3.2 M elements by strides. A kernel pair writes the logits once and the embedding's gradient
//! in the embedding's own layout.
//!
//! [`FusedOps`]: crate::FusedOps

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;
use burn::tensor::ops::FloatTensor;

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// `rows [n, hidden] · embeddingᵀ` for `embedding [vocab, hidden]`: `[n, vocab]` logits.
pub fn tied_logits<B: FusedOps>(rows: Tensor<B, 2>, embedding: Tensor<B, 2>) -> Tensor<B, 2> {
    wrap(B::fused_tied_logits(unwrap(rows), unwrap(embedding)))
}

/// The composed product, the graph the model recorded before the kernel: burn's `linear`
/// against the embedding's transposed view.
pub fn composed_tied_logits<B: Backend>(
    rows: FloatTensor<B>,
    embedding: FloatTensor<B>,
) -> FloatTensor<B> {
    let embedding: Tensor<B, 2> = wrap(embedding);
    unwrap(linear(wrap::<B, 2>(rows), embedding.transpose(), None))
}

/// Reference of [`FusedOps::tied_logits_kernel_backward`]: `(d rows, d embedding)` =
/// `(grad · embedding, gradᵀ · rows)`.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn tied_logits_backward_reference<B: Backend>(
    rows: FloatTensor<B>,
    embedding: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let grad: Tensor<B, 2> = wrap(grad);
    let d_rows = grad.clone().matmul(wrap(embedding));
    let d_embedding = grad.transpose().matmul(wrap(rows));
    (unwrap(d_rows), unwrap(d_embedding))
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
