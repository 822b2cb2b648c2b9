//! Fused softmax cross-entropy over the vocabulary for [`FusedOps`].
//!
//! Composed, the loss casts the logits to f32 and makes six passes over them, and autodiff keeps
//! the f32 exponentials for the backward: at gpt-350m micro batch 16 each f32 copy is 6.6 GB, and
//! the op table put those passes at about a tenth of the step's GPU time. A kernel pair reads the
//! 16-bit logits once per row in the forward and keeps one f32 log-sum-exp per row; the backward
//! writes the logits' gradient `(softmax − one_hot) · dloss` in one pass. Only the logits (which
//! the output layer produced anyway) stay alive.
//!
//! [`cross_entropy`] is what the model calls for a whole vocabulary on one rank; the
//! vocabulary-parallel loss (tp > 1) and backends without a kernel keep the composed loss, so
//! CPU numbers do not move.
//!
//! [`FusedOps`]: crate::FusedOps

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, IndexingUpdateOp, Int, Tensor};

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// What a cross-entropy kernel's forward returns: per-row losses and what its backward needs.
#[derive(Debug, Clone)]
pub struct CrossEntropySaved<B: Backend> {
    /// `−log softmax(logits)[label]` per row, `[rows]` in f32.
    pub losses: FloatTensor<B>,
    /// `log Σ exp(logits)` per row, `[rows]` in f32.
    pub log_sum_exp: FloatTensor<B>,
}

/// Per-row losses `[rows]` (f32) of `logits [rows, vocab]` against `labels [rows]`, through the
/// backend's fused kernel; `None` where it has none for these logits (the caller keeps its
/// composed loss).
pub fn cross_entropy<B: FusedOps>(
    logits: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
) -> Option<Tensor<B, 1>> {
    let logits = unwrap(logits);
    if !B::has_cross_entropy_kernel(&logits) {
        return None;
    }
    Some(wrap(B::fused_cross_entropy(
        logits,
        labels.into_primitive(),
    )))
}

/// Reference of [`FusedOps::cross_entropy_kernel_forward`] in burn ops (f32 arithmetic).
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn cross_entropy_forward_reference<B: Backend>(
    logits: FloatTensor<B>,
    labels: IntTensor<B>,
) -> CrossEntropySaved<B> {
    let logits: Tensor<B, 2> = wrap::<B, 2>(logits).cast(DType::F32);
    let [rows, _] = logits.dims();
    let labels: Tensor<B, 2, Int> = Tensor::<B, 1, Int>::from_primitive(labels).reshape([rows, 1]);
    let max = logits.clone().max_dim(1);
    let log_sum_exp = max.clone() + (logits.clone() - max).exp().sum_dim(1).log();
    let target = logits.gather(1, labels);
    CrossEntropySaved {
        losses: unwrap((log_sum_exp.clone() - target).reshape([rows])),
        log_sum_exp: unwrap(log_sum_exp.reshape([rows])),
    }
}

/// Reference of [`FusedOps::cross_entropy_kernel_backward`]: `(exp(l − lse) − one_hot) · g` per
/// row, in the logits' dtype.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn cross_entropy_backward_reference<B: Backend>(
    logits: FloatTensor<B>,
    labels: IntTensor<B>,
    log_sum_exp: FloatTensor<B>,
    grad_losses: FloatTensor<B>,
) -> FloatTensor<B> {
    let logits: Tensor<B, 2> = wrap(logits);
    let dtype = logits.dtype();
    let [rows, vocab] = logits.dims();
    let device = logits.device();
    let labels: Tensor<B, 2, Int> = Tensor::<B, 1, Int>::from_primitive(labels).reshape([rows, 1]);
    let log_sum_exp: Tensor<B, 2> = wrap::<B, 1>(log_sum_exp).reshape([rows, 1]);
    let grad: Tensor<B, 2> = wrap::<B, 1>(grad_losses)
        .cast(DType::F32)
        .reshape([rows, 1]);
    let one_hot = Tensor::<B, 2>::zeros([rows, vocab], &device).scatter(
        1,
        labels,
        Tensor::ones([rows, 1], &device),
        IndexingUpdateOp::Add,
    );
    let softmax = (logits.cast(DType::F32) - log_sum_exp).exp();
    unwrap(((softmax - one_hot) * grad).cast(dtype))
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
