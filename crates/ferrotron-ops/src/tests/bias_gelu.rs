//! GELU of a linear's output plus its bias on burn-flex: the composed default is bit for bit the
//! model's `gelu(linear(x, w, b))`; the autodiff node (reference backward) gives the composed
//! graph's input and bias gradients, for inputs of rank 2 and 3.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::module::linear;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::{FusedOps, bias_gelu, bias_gelu_node, gelu};

fn bits(x: Vec<f32>) -> Vec<u32> {
    x.into_iter().map(f32::to_bits).collect()
}

/// Output and the gradients of `x`, `w` and `b` of `Σ v ∘ f(x, w, b)` for `x [2, 7, 6]`,
/// `w [6, 5]`, `b [5]`.
fn run(f: impl Fn(Tensor<B, 3>, Tensor<B, 2>, Tensor<B, 1>) -> Tensor<B, 3>) -> [Vec<f32>; 4] {
    let x = tensor([2, 7, 6], 0.6).require_grad();
    let w = tensor([6, 5], 1.1).require_grad();
    let b = (tensor([5], 0.4) * 2.0).require_grad();
    let out = f(x.clone(), w.clone(), b.clone());
    let grads = (out.clone() * tensor([2, 7, 5], 1.7)).sum().backward();
    let grad = |t: &Tensor<B, 3>| flat(t.grad(&grads).expect("a gradient"));
    [
        flat(out),
        grad(&x),
        flat(w.grad(&grads).expect("a gradient")),
        flat(b.grad(&grads).expect("a gradient")),
    ]
}

#[test]
fn composed_bias_gelu_is_the_linear_with_bias_then_gelu_bit_for_bit() {
    let old = run(|x, w, b| gelu(linear(x, w, Some(b))));
    let new = run(|x, w, b| bias_gelu(linear(x, w, None), b));
    assert_eq!(new.map(bits), old.map(bits));
    assert!(!Flex::fuses_bias_gelu());
    assert!(!B::fuses_bias_gelu());
}

#[test]
fn bias_gelu_node_gradients_equal_the_composed_graph() {
    let composed = run(|x, w, b| bias_gelu(linear(x, w, None), b));
    let node = run(|x, w, b| {
        let h = linear(x, w, None);
        Tensor::from_primitive(TensorPrimitive::Float(bias_gelu_node::<
            Flex,
            NoCheckpointing,
        >(
            h.into_primitive().tensor(),
            b.into_primitive().tensor(),
        )))
    });
    for (what, (got, want)) in ["output", "dx", "dw", "db"]
        .iter()
        .zip(node.iter().zip(&composed))
    {
        assert_close(got, want, what);
    }
    assert!(
        node[3].iter().all(|g| g.abs() > 1e-3),
        "every bias column has a gradient"
    );
}
