//! The biased linear's node against burn's linear: without a backend kernel the model's op is
//! burn's own node, and the fused node (driven with burn-flex's default, the reference's two
//! gradients) gives the same output and the same gradients of the input, weight and bias.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::module::linear as burn_linear;
use burn::tensor::{Tensor, TensorPrimitive};

use super::flex::floats;
use super::{B, flat, tensor};
use crate::{FusedOps, linear, linear_node};

/// Output and gradients of x, weight and bias through `f`, on a 3-D input.
fn linear_of(
    f: impl Fn(Tensor<B, 3>, Tensor<B, 2>, Tensor<B, 1>) -> Tensor<B, 3>,
) -> [Vec<f32>; 4] {
    let x = tensor([3, 5, 8], 0.4).require_grad();
    let weight = tensor([8, 6], 1.1).require_grad();
    let bias = tensor([6], 2.3).require_grad();
    let out = f(x.clone(), weight.clone(), bias.clone());
    let grads = (out.clone() * tensor([3, 5, 6], 0.9)).sum().backward();
    [
        flat(out),
        flat(x.grad(&grads).expect("dx")),
        flat(weight.grad(&grads).expect("dW")),
        flat(bias.grad(&grads).expect("db")),
    ]
}

#[test]
fn the_linear_node_gives_burns_output_and_gradients() {
    let burn = linear_of(|x, w, b| burn_linear(x, w, Some(b)));
    assert!(!Flex::has_linear_bias_grad_kernel(&floats(
        [2, 2],
        0.1,
        1.0
    )));
    assert_eq!(
        linear_of(|x, w, b| linear(x, w, Some(b))),
        burn,
        "without a kernel the model's op is burn's linear"
    );
    let node = linear_of(|x, w, b| {
        Tensor::from_primitive(TensorPrimitive::Float(
            linear_node::<Flex, NoCheckpointing>(
                x.into_primitive().tensor(),
                w.into_primitive().tensor(),
                b.into_primitive().tensor(),
            ),
        ))
    });
    assert_eq!(node, burn, "the node's output and its three gradients");
}

#[test]
fn the_node_leaves_out_gradients_nothing_asks_for() {
    let x = tensor([4, 8], 0.4);
    let weight = tensor([8, 6], 1.1).require_grad();
    let bias = tensor([6], 2.3);
    let out = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(linear_node::<
        Flex,
        NoCheckpointing,
    >(
        x.clone().into_primitive().tensor(),
        weight.clone().into_primitive().tensor(),
        bias.clone().into_primitive().tensor(),
    )));
    let grads = out.sum().backward();
    assert!(weight.grad(&grads).is_some());
    assert!(x.grad(&grads).is_none() && bias.grad(&grads).is_none());
    let want = burn_linear(x, weight.clone(), Some(bias)).sum().backward();
    assert_eq!(
        flat(weight.grad(&grads).expect("dW")),
        flat(weight.grad(&want).expect("dW")),
    );
}
