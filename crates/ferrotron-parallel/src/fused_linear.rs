//! A linear layer with a bias as one node whose backward takes the weight and bias gradients
//! together ([`FusedOps::linear_weight_bias_backward`]).
//!
//! burn's linear node asks its backend for the weight gradient (`xᵀ·dy`) and then, separately,
//! for the bias gradient (`Σ_tokens dy`), so a GPU reads `dy` twice: at gpt-1.3b's 12 × 2048
//! tokens the second read was four GEMVs a layer, 242 µs, 1.5 % of a step (one H200,
//! 2026-12-05). A backend that can produce both from the weight-gradient GEMM (cuBLASLt's
//! bias-gradient epilogue) says so with [`FusedOps::has_linear_bias_grad_kernel`]; the node
//! then calls it once. Without one the model keeps burn's own linear, bit for bit.
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

use crate::fused::FusedOps;

/// `x · weight (+ bias)` over the last dim (`weight` `[d_input, d_output]`), through the
/// backend's fused node where there is a bias and the backend has the kernel.
pub fn linear<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    match bias {
        Some(bias) => Tensor::from_primitive(TensorPrimitive::Float(B::fused_linear(
            x.into_primitive().tensor(),
            weight.into_primitive().tensor(),
            bias.into_primitive().tensor(),
        ))),
        None => burn::tensor::module::linear(x, weight, None),
    }
}

/// burn's linear: the model's arithmetic before the op.
pub fn composed_linear<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: FloatTensor<B>,
) -> FloatTensor<B> {
    B::linear(x, weight, Some(bias))
}

/// Reference of [`FusedOps::linear_weight_bias_backward`]: the backend's two gradients.
pub fn linear_weight_bias_backward_reference<B: Backend>(
    x: FloatTensor<B>,
    grad_output: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    (
        B::linear_weight_backward(x, grad_output.clone()),
        B::linear_bias_backward(grad_output),
    )
}

#[derive(Debug)]
struct LinearOp;

impl<B: FusedOps> Backward<B, 3> for LinearOp {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [node_x, node_weight, node_bias] = ops.parents;
        let (x, weight) = ops.state;
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::linear_x_backward(weight, grad.clone()));
        }
        match (node_weight, node_bias) {
            (Some(weight), Some(bias)) => {
                let (dw, db) = B::linear_weight_bias_backward(x, grad);
                grads.register::<B>(weight.id, dw);
                grads.register::<B>(bias.id, db);
            }
            (Some(weight), None) => {
                grads.register::<B>(weight.id, B::linear_weight_backward(x, grad));
            }
            (None, Some(bias)) => grads.register::<B>(bias.id, B::linear_bias_backward(grad)),
            (None, None) => {}
        }
    }
}

/// Records a biased linear as one node whose backward is `B`'s fused weight and bias
/// gradient; it keeps the input and the weight, as burn's does. Public so tests can drive the
/// node with a CPU backend.
pub fn linear_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = LinearOp
        .prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let output = B::linear(
                x.primitive.clone(),
                weight.primitive.clone(),
                Some(bias.primitive),
            );
            prep.finish((x.primitive, weight.primitive), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::linear(
            x.primitive,
            weight.primitive,
            Some(bias.primitive),
        )),
    }
}
