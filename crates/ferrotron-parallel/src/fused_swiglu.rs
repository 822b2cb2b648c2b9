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

use crate::primitive::{unwrap, wrap};
use burn::tensor::activation::{sigmoid, silu};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};

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
