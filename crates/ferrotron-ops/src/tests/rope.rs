//! RoPE on the packed projection on burn-flex: the composed default is bit for bit the model's
//! old rotation of the split query and key; the autodiff node (reference backward) gives the
//! composed graph's gradient, for tables whose halves differ (so the transpose is exact, not
//! an accident of RoPE's repeated frequencies).

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::{FusedOps, rope_qkv_node, split_qkv};

fn bits(x: Vec<f32>) -> Vec<u32> {
    x.into_iter().map(f32::to_bits).collect()
}

const SHAPE: [usize; 5] = [2, 5, 2, 4, 6]; // batch, seq, groups, 2 queries + key + value, dim

/// The old model arithmetic on an unpacked `[b, heads, s, d]` tensor.
fn old_rope(x: Tensor<B, 4>, cos: Tensor<B, 2>, sin: Tensor<B, 2>) -> Tensor<B, 4> {
    let half = x.dims()[3] / 2;
    let first = x.clone().slice_dim(3, 0..half);
    let second = x.clone().slice_dim(3, half..2 * half);
    let rotated = Tensor::cat(vec![second.neg(), first], 3);
    x * cos.unsqueeze::<4>() + rotated * sin.unsqueeze::<4>()
}

/// q, k, v after `rope` and the packed gradient of a weighted sum of all three.
fn run(
    rope: impl Fn(
        Tensor<B, 5>,
        Tensor<B, 2>,
        Tensor<B, 2>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>),
) -> (Vec<f32>, Vec<f32>) {
    let qkv = tensor(SHAPE, 0.4).require_grad();
    let (cos, sin) = (tensor([5, 6], 1.3), tensor([5, 6], 2.1));
    let (q, k, v) = rope(qkv.clone(), cos, sin);
    let loss = (q.clone() * tensor(q.dims(), 0.7)).sum()
        + (k.clone() * tensor(k.dims(), 1.1)).sum()
        + (v.clone() * tensor(v.dims(), 1.9)).sum();
    let grads = loss.backward();
    let out = Tensor::cat(vec![q.reshape([-1]), k.reshape([-1]), v.reshape([-1])], 0);
    (flat(out), flat(qkv.grad(&grads).expect("a gradient")))
}

fn packed(
    qkv: Tensor<B, 5>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    op: impl Fn(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) -> FloatTensor<B>,
) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
    let roped = op(
        qkv.into_primitive().tensor(),
        cos.into_primitive().tensor(),
        sin.into_primitive().tensor(),
    );
    split_qkv(Tensor::from_primitive(TensorPrimitive::Float(roped)))
}

#[test]
fn composed_rope_qkv_is_the_old_split_arithmetic_bit_for_bit() {
    let old = run(|qkv, cos, sin| {
        let (q, k, v) = split_qkv(qkv);
        (
            old_rope(q, cos.clone(), sin.clone()),
            old_rope(k, cos, sin),
            v,
        )
    });
    let new = run(|qkv, cos, sin| packed(qkv, cos, sin, B::fused_rope_qkv));
    assert_eq!((bits(new.0), bits(new.1)), (bits(old.0), bits(old.1)));
    assert!(!Flex::has_rope_qkv_kernel(
        &tensor(SHAPE, 0.4).inner().into_primitive().tensor(),
        &tensor([5, 6], 1.3).inner().into_primitive().tensor(),
    ));
}

#[test]
fn rope_qkv_node_gradient_equals_the_composed_graph() {
    let composed = run(|qkv, cos, sin| packed(qkv, cos, sin, B::fused_rope_qkv));
    let node = run(|qkv, cos, sin| packed(qkv, cos, sin, rope_qkv_node::<Flex, NoCheckpointing>));
    assert_close(&node.0, &composed.0, "rotated q, k and v");
    assert_close(&node.1, &composed.1, "packed gradient");
    // The value slot's gradient is the weight 1.9's tensor, passed through untouched.
    assert!(node.1.iter().any(|g| g.abs() > 1e-3));
}
