//! GELU (the erf form, GPT-2's MLP activation) for [`FusedOps`].
//!
//! Composed, GELU is the backend's `gelu` and autodiff's node calling its `gelu_backward`: on
//! burn-flex both run one element at a time on one thread through libm's `erff` (with an `expf`
//! backward), at the quick start's 512 × 256 per layer about a fifth of the work left on one
//! thread once the GEMMs ran on every core. A backend kernel pair replaces them; the node keeps
//! the input, as burn's does.
//!
//! The composed default is exactly the model's arithmetic before the op (burn's `gelu`), so
//! backends without a kernel keep their numbers bit for bit; the reference backward is the
//! backend's own `gelu_backward`.
//!
//! [`FusedOps`]: crate::FusedOps

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::FusedOps;

/// `x · Φ(x)` element-wise, through the backend's kernel where it has one.
pub fn gelu<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(B::fused_gelu(
        x.into_primitive().tensor(),
    )))
}

/// burn's `gelu`: the model's arithmetic before the op.
pub fn composed_gelu<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    B::gelu(x)
}

/// Reference of [`FusedOps::gelu_kernel_backward`]: the backend's `gelu_backward`.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn gelu_backward_reference<B: Backend>(
    x: FloatTensor<B>,
    grad_output: FloatTensor<B>,
) -> FloatTensor<B> {
    B::gelu_backward(x, grad_output)
}

#[derive(Debug)]
struct GeluOp;

impl<B: FusedOps> Backward<B, 1> for GeluOp {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::gelu_kernel_backward(ops.state, grad));
        }
    }
}

/// Records GELU as one node whose forward and backward are `B`'s kernels; it keeps the input.
/// Public so tests can drive the node with a CPU backend's kernels.
pub fn gelu_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = GeluOp
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let output = B::gelu_kernel_forward(x.primitive.clone());
            prep.finish(x.primitive, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::gelu_kernel_forward(x.primitive)),
    }
}
