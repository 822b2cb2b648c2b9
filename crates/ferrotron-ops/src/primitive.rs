//! Between burn's float primitives (what backend and fused-op methods take and return) and
//! tensors (what the composed defaults compute with): the two moves every fused op makes.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

pub(crate) fn wrap<B: Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

pub(crate) fn unwrap<B: Backend, const D: usize>(x: Tensor<B, D>) -> FloatTensor<B> {
    x.into_primitive().tensor()
}
