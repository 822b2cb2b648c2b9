//! SwiGLU from the packed projection on burn-flex: the composed default is bit for bit the
//! model's old `silu(gate) · up` of two slices; the autodiff node (reference backward) gives
//! the composed graph's packed gradient.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::activation::silu;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::{FusedOps, swiglu_node};

fn bits(x: Vec<f32>) -> Vec<u32> {
    x.into_iter().map(f32::to_bits).collect()
}

/// Output and packed gradient of `Σ w ∘ f(x)` for `x [6, 2·5]`.
fn run(f: impl Fn(Tensor<B, 2>) -> Tensor<B, 2>) -> (Vec<f32>, Vec<f32>) {
    let x = tensor([6, 10], 0.6).require_grad();
    let out = f(x.clone());
    let grads = (out.clone() * tensor([6, 5], 1.7)).sum().backward();
    (flat(out), flat(x.grad(&grads).expect("a gradient")))
}

fn fused(x: Tensor<B, 2>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(B::fused_swiglu(
        x.into_primitive().tensor(),
    )))
}

#[test]
fn composed_swiglu_is_the_old_sliced_arithmetic_bit_for_bit() {
    let old = run(|x| silu(x.clone().slice_dim(1, 0..5)) * x.slice_dim(1, 5..10));
    let new = run(fused);
    assert_eq!((bits(new.0), bits(new.1)), (bits(old.0), bits(old.1)));
    assert!(!Flex::has_swiglu_kernel(
        &tensor([6, 10], 0.6).inner().into_primitive().tensor()
    ));
}

#[test]
fn swiglu_node_gradient_equals_the_composed_graph() {
    let composed = run(fused);
    let node = run(|x| {
        Tensor::from_primitive(TensorPrimitive::Float(
            swiglu_node::<Flex, NoCheckpointing>(x.into_primitive().tensor()),
        ))
    });
    assert_close(&node.0, &composed.0, "output");
    assert_close(&node.1, &composed.1, "packed gradient");
    assert!(node.1[..5].iter().any(|g| g.abs() > 1e-3), "gate gradient");
    assert!(node.1[5..10].iter().any(|g| g.abs() > 1e-3), "up gradient");
}
