//! SwiGLU from the packed `[gate; up]` projection: `silu(gate) · up`.
//!
//! Composed, the two halves are slices of the projection (whose backward is two zero-padded
//! gradients of the whole projection, added), then a sigmoid and two multiplies forward and
//! about five element-wise passes backward, with the sigmoid kept alive. A kernel reads the
//! packed projection once forward and writes its packed gradient in one go backward, keeping
//! only the projection (which the composed graph keeps too).
//!
//! The composed default is exactly the model's arithmetic before the op, so burn-flex keeps
//! its numbers bit for bit; the reference backward (burn ops) is the contract a kernel meets.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::activation::{sigmoid, silu};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};

use crate::FusedOps;
use crate::primitive::{unwrap, wrap};

/// `[rows, 2f]` → the gate `[rows, f]` and the up projection `[rows, f]`.
fn halves<B: Backend>(x: Tensor<B, 2>) -> [Tensor<B, 2>; 2] {
    let width = x.dims()[1];
    assert!(
        width.is_multiple_of(2),
        "swiglu: the packed projection's width {width} is odd"
    );
    let half = width / 2;
    [x.clone().slice_dim(1, 0..half), x.slice_dim(1, half..width)]
}

/// `silu(gate) · up` of `x [rows, 2f]` (gate first), burn's ops: the model's arithmetic.
pub fn composed_swiglu<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let [gate, up] = halves(wrap::<B, 2>(x));
    unwrap(silu(gate) * up)
}

/// Reference of `FusedOps::swiglu_kernel_backward`: the packed gradient `[rows, 2f]`,
/// `[g·u·σ(a)(1 + a(1 − σ(a))); g·silu(a)]` for gate `a`, up `u` and output gradient `g`,
/// computed in f32 and returned in `x`'s dtype.
pub(crate) fn swiglu_backward_reference<B: Backend>(
    x: FloatTensor<B>,
    grad_output: FloatTensor<B>,
) -> FloatTensor<B> {
    let x = wrap::<B, 2>(x);
    let dtype = x.dtype();
    let [gate, up] = halves(x.cast(DType::F32));
    let grad = wrap::<B, 2>(grad_output).cast(DType::F32);
    let s = sigmoid(gate.clone());
    let d_gate = grad.clone() * up * s.clone() * ((gate.clone() * (s.clone().neg() + 1.0)) + 1.0);
    let d_up = grad * gate * s;
    unwrap(Tensor::cat(vec![d_gate, d_up], 1).cast(dtype))
}

#[derive(Debug)]
struct SwigluOp;

impl<B: FusedOps> Backward<B, 1> for SwigluOp {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::swiglu_kernel_backward(ops.state, grad));
        }
    }
}

/// Records SwiGLU of the packed projection as one node whose forward and backward are `B`'s
/// kernels; it keeps the projection. Public so tests can drive the node with a CPU backend's
/// reference kernels.
pub fn swiglu_node<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let prepared = SwigluOp
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful();
    match prepared {
        OpsKind::Tracked(prep) => {
            let output = B::swiglu_kernel_forward(x.primitive.clone());
            prep.finish(x.primitive, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::swiglu_kernel_forward(x.primitive)),
    }
}
