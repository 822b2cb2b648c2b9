//! The residual connection with hidden dropout, `residual + dropout(x)`, as one op.
//!
//! Composed (burn's `Dropout`), a training step draws a Bernoulli tensor, multiplies twice and
//! adds: four passes over the activation forward, and the mask tensor stays alive for the
//! backward's two more. A kernel draws each element's keep bit from a counter-based generator
//! inside the add and draws it again in the backward from the same (seed, offset): one pass
//! each way, and nothing kept. Off the training path (no autodiff, or probability 0) it is the
//! plain add, as burn's `Dropout` is then the identity.
//!
//! The composed default is exactly `residual + Dropout::forward(x)`, so burn-flex keeps its
//! numbers bit for bit. The reference kernels keep the mask itself (a CPU backend has no
//! regenerable generator), which is what the CPU test of the autodiff node drives.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::nn::DropoutConfig;
use burn::tensor::Distribution;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// A dropout-add forward's output and the keep mask's description.
#[derive(Debug, Clone)]
pub struct DropoutSaved<B: Backend> {
    pub output: FloatTensor<B>,
    pub mask: DropoutMask<B>,
}

/// What the backward needs to know the keep mask: (seed, counter offset) a kernel regenerates
/// it from, or the mask itself (0/1, `x`'s shape), kept only by the reference kernels.
#[derive(Debug, Clone)]
pub struct DropoutMask<B: Backend> {
    pub rng: [u64; 2],
    pub kept: Option<FloatTensor<B>>,
}

/// `residual + Dropout(prob).forward(x)`, burn's arithmetic (any rank: the tensors are seen
/// flat, which element-wise ops do not notice).
pub fn composed_dropout_add<B: Backend>(
    x: FloatTensor<B>,
    residual: FloatTensor<B>,
    prob: f64,
) -> FloatTensor<B> {
    let dropped = DropoutConfig::new(prob).init().forward(wrap::<B, 1>(x));
    unwrap(wrap::<B, 1>(residual) + dropped)
}

/// Reference of `FusedOps::dropout_add_kernel_forward`: a Bernoulli(1 − prob) mask, the
/// output and the mask kept.
pub(crate) fn dropout_add_forward_reference<B: Backend>(
    x: FloatTensor<B>,
    residual: FloatTensor<B>,
    prob: f64,
) -> DropoutSaved<B> {
    let x = wrap::<B, 1>(x);
    let keep = 1.0 - prob;
    let mask = x.random_like(Distribution::Bernoulli(keep));
    let output = wrap::<B, 1>(residual) + x * mask.clone() * (1.0 / keep);
    DropoutSaved {
        output: unwrap(output),
        mask: DropoutMask {
            rng: [0, 0],
            kept: Some(unwrap(mask)),
        },
    }
}

/// Reference of `FusedOps::dropout_add_kernel_backward`: `x`'s gradient `mask · g / (1 − p)`.
pub(crate) fn dropout_add_backward_reference<B: Backend>(
    grad: FloatTensor<B>,
    prob: f64,
    mask: DropoutMask<B>,
) -> FloatTensor<B> {
    let mask = mask
        .kept
        .expect("the reference dropout-add keeps its mask for the backward");
    unwrap(wrap::<B, 1>(grad) * wrap::<B, 1>(mask) * (1.0 / (1.0 - prob)))
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
