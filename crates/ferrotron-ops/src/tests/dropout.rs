//! The residual add with hidden dropout on burn-flex: the composed default is bit for bit the
//! model's old `residual + Dropout::forward(x)`, and the autodiff node (reference kernels, same
//! seed, so the same mask) gives the same output and both gradients.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::nn::DropoutConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, flat, tensor};
use crate::{FusedOps, dropout_add_node};

fn bits(x: Vec<f32>) -> Vec<u32> {
    x.into_iter().map(f32::to_bits).collect()
}

fn float<Bk: Backend>(t: Tensor<Bk, 3>) -> burn::tensor::ops::FloatTensor<Bk> {
    t.into_primitive().tensor()
}

fn fused<Bk: FusedOps>(x: Tensor<Bk, 3>, residual: Tensor<Bk, 3>, prob: f64) -> Tensor<Bk, 3> {
    Tensor::from_primitive(TensorPrimitive::Float(Bk::fused_dropout_add(
        float(x),
        float(residual),
        prob,
    )))
}

/// Output, dx and d residual of `Σ w ∘ f(x, residual)`.
fn run(f: impl Fn(Tensor<B, 3>, Tensor<B, 3>) -> Tensor<B, 3>) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let device = Default::default();
    B::seed(&device, 9);
    let x = tensor([2, 5, 16], 0.3).require_grad();
    let residual = tensor([2, 5, 16], 1.1).require_grad();
    let out = f(x.clone(), residual.clone());
    let grads = (out.clone() * tensor([2, 5, 16], 2.7)).sum().backward();
    let grad = |t: &Tensor<B, 3>| bits(flat(t.grad(&grads).expect("a gradient")));
    (bits(flat(out)), grad(&x), grad(&residual))
}

#[test]
fn composed_dropout_add_is_the_old_residual_connection_bit_for_bit() {
    for prob in [0.0, 0.1, 0.5] {
        let old = run(|x, r| r + DropoutConfig::new(prob).init().forward(x));
        let new = run(|x, r| fused(x, r, prob));
        assert_eq!(new, old, "p {prob}");
        if prob > 0.0 {
            let plain = run(|x, r| r + x);
            assert_ne!(new.0, plain.0, "p {prob}: dropout must be live in training");
        }
    }
    // Inference (no autodiff): the plain add.
    let (x, r) = (
        tensor([2, 5, 16], 0.3).inner(),
        tensor([2, 5, 16], 1.1).inner(),
    );
    assert_eq!(
        bits(flat(fused::<Flex>(x.clone(), r.clone(), 0.5))),
        bits(flat(r + x))
    );
}

#[test]
fn dropout_add_node_equals_the_composed_graph_under_the_same_seed() {
    for prob in [0.1, 0.5] {
        let composed = run(|x, r| fused(x, r, prob));
        let node = run(|x, r| {
            Tensor::from_primitive(TensorPrimitive::Float(dropout_add_node::<
                Flex,
                NoCheckpointing,
            >(
                float(x), float(r), prob
            )))
        });
        assert_eq!(node, composed, "p {prob}");
    }
    assert!(!Flex::has_dropout_add_kernel(
        &float(tensor([2, 5, 16], 0.3).inner()),
        0.1
    ));
}
