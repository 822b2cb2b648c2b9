//! `ActivationOps` for [`Cuda`]: the activations a transformer calls every step run as one
//! fused element-wise kernel each (forward and backward) instead of burn's default chain of
//! three to six kernels; the rest (softmax, log-sigmoid, ...) keep burn's compositions.

use burn::tensor::ops::{ActivationOps, FloatTensor};

use super::Cuda;
use super::convert::ok;
use crate::kernels::prim::elementwise::{self as ew, BinaryOp, UnaryOp};

impl ActivationOps<Cuda> for Cuda {
    fn relu(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(ew::unary(&tensor, UnaryOp::Relu))
    }

    fn relu_backward(output: FloatTensor<Cuda>, grad: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        // relu(x) > 0 exactly where x > 0, so the output serves as the kernel's `x`.
        ok(ew::binary(&output, &grad, BinaryOp::ReluBackward))
    }

    fn gelu(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(ew::unary(&tensor, UnaryOp::Gelu))
    }

    fn gelu_backward(x: FloatTensor<Cuda>, grad: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(ew::binary(&x, &grad, BinaryOp::GeluBackward))
    }

    fn sigmoid(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(ew::unary(&tensor, UnaryOp::Sigmoid))
    }

    fn sigmoid_backward(output: FloatTensor<Cuda>, grad: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(ew::binary(&output, &grad, BinaryOp::SigmoidBackward))
    }
}
