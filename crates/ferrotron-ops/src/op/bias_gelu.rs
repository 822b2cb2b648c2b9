//! GELU of a linear's output plus its bias (GPT's `fc1` → GELU) as one op, for [`FusedOps`].
//!
//! Why: the bias gradient is the column sum of GELU's input gradient. Composed, the linear's
//! backward reads that gradient again to sum it (on gpt-1.3b a `[24576, 8192]` bf16 read a
//! layer, 2.6 ms of a 0.39 s step, `tools/README.md`), right after the GELU backward wrote it.
//! Here the backward kernel adds the columns up in the pass that writes the gradient (per band
//! of rows, then the bands in a fixed order), and the forward adds the bias on its way into
//! GELU, so the linear runs without one. Megatron's `bias_gelu_fusion` does the same with the
//! tanh approximation; this keeps the exact (erf) GELU.
//!
//! The composed default is the arithmetic of `linear(x, w, b)` then `gelu`: the same broadcast
//! add, then the backend's GELU, so backends without a kernel keep their numbers bit for bit.
//!
//! [`FusedOps`]: crate::FusedOps

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, Tensor, TensorMetadata, TensorPrimitive};

use crate::FusedOps;

/// `gelu(x + bias)` element-wise, `bias` over the last dimension, through the backend's kernel
/// where it has one.
pub fn bias_gelu<B: FusedOps, const D: usize>(x: Tensor<B, D>, bias: Tensor<B, 1>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(B::fused_bias_gelu(
        x.into_primitive().tensor(),
        bias.into_primitive().tensor(),
    )))
}

/// `bias` as `[1, …, 1, n]`, of `x`'s rank: the shape burn's linear adds it in.
fn broadcast_bias<B: Backend>(x: &FloatTensor<B>, bias: FloatTensor<B>) -> FloatTensor<B> {
    let rank = x.shape().num_dims();
    let n = bias.shape().num_elements();
    let mut dims = vec![1; rank];
    dims[rank - 1] = n;
    B::float_reshape(bias, Shape::from(dims))
}

/// The linear's bias add, then the backend's GELU: the model's arithmetic before the op.
pub fn composed_bias_gelu<B: FusedOps>(x: FloatTensor<B>, bias: FloatTensor<B>) -> FloatTensor<B> {
    let bias = broadcast_bias::<B>(&x, bias);
    B::fused_gelu(B::float_add(x, bias))
}

/// Reference of [`FusedOps::bias_gelu_kernel_backward`]: the backend's `gelu_backward` at
/// `x + bias`, and its sum over every dimension but the last.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn bias_gelu_backward_reference<B: Backend>(
    x: FloatTensor<B>,
    bias: FloatTensor<B>,
    grad_output: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let n = bias.shape().num_elements();
    let pre = B::float_add(x, broadcast_bias::<B>(&grad_output, bias));
    let dx = B::gelu_backward(pre, grad_output);
    let rows = dx.shape().num_elements() / n.max(1);
    let columns = B::float_reshape(dx.clone(), Shape::from([rows, n]));
    let dbias = B::float_reshape(B::float_sum_dim(columns, 0), Shape::from([n]));
    (dx, dbias)
}

#[derive(Debug)]
struct BiasGeluOp;

impl<B: FusedOps> Backward<B, 2> for BiasGeluOp {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, bias) = ops.state;
        let (dx, dbias) = B::bias_gelu_kernel_backward(x, bias, grad);
        let [x_node, bias_node] = ops.parents;
        if let Some(node) = x_node {
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = bias_node {
            grads.register::<B>(node.id, dbias);
        }
    }
}

/// Records `gelu(x + bias)` as one node whose forward and backward are `B`'s kernels; it keeps
/// `x` and the bias (what GELU alone kept: its input). Public so tests can drive the node with a
/// CPU backend's kernels.
pub fn bias_gelu_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = BiasGeluOp
        .prepare::<C>([x.node.clone(), bias.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let output = B::bias_gelu_kernel_forward(x.primitive.clone(), bias.primitive.clone());
            prep.finish((x.primitive, bias.primitive), output)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(B::bias_gelu_kernel_forward(x.primitive, bias.primitive))
        }
    }
}
