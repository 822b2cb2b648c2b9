//! The cross-entropy op on burn-flex: its kernel takes f32 logits (so `cross_entropy` answers)
//! and declines 16-bit ones (the model keeps its composed loss); the node gives the composed
//! graph's losses and logits gradient, which is `softmax − one_hot` scaled per row.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

use super::{B, assert_close, flat, fresh, tensor};
use crate::{FusedOps, cross_entropy, cross_entropy_forward_reference, cross_entropy_node};

const ROWS: usize = 6;
const VOCAB: usize = 11;

fn labels() -> Tensor<B, 1, Int> {
    Tensor::from_data(
        TensorData::new(vec![0i64, 10, 3, 3, 7, 5], [ROWS]),
        &Default::default(),
    )
}

fn logits() -> Tensor<B, 2> {
    (tensor([ROWS, VOCAB], 0.4) * 5.0).require_grad()
}

#[test]
fn flex_has_an_f32_cross_entropy_kernel_and_declines_16_bit_logits() {
    let x = logits();
    assert!(Flex::has_cross_entropy_kernel(
        &x.clone().inner().into_primitive().tensor()
    ));
    assert!(cross_entropy(x.clone(), labels()).is_some());
    assert!(cross_entropy(x.cast(burn::tensor::DType::BF16), labels()).is_none());
}

#[test]
fn cross_entropy_node_equals_the_composed_graph() {
    let weights = tensor([ROWS], 1.3);
    let x = logits();
    let composed: Tensor<B, 1> = Tensor::from_primitive(TensorPrimitive::Float(
        cross_entropy_forward_reference::<B>(
            x.clone().into_primitive().tensor(),
            labels().into_primitive(),
        )
        .losses,
    ));
    let g_composed = (composed.clone() * weights.clone()).sum().backward();
    let x2 = fresh(&x).require_grad();
    let node: Tensor<B, 1> = Tensor::from_primitive(TensorPrimitive::Float(cross_entropy_node::<
        Flex,
        NoCheckpointing,
    >(
        x2.clone().into_primitive().tensor(),
        labels().inner().into_primitive(),
    )));
    let g_node = (node.clone() * weights.clone()).sum().backward();
    assert_close(&flat(node.clone()), &flat(composed), "losses");
    let dx = flat(x2.grad(&g_node).expect("d logits"));
    assert_close(
        &dx,
        &flat(x.grad(&g_composed).expect("d logits")),
        "d logits",
    );

    // By hand: each row's gradient is w_r · (softmax − one_hot), and the loss is −log softmax.
    let values = flat(x.inner());
    let w = flat(weights.inner());
    let losses = flat(node);
    for (r, label) in [0usize, 10, 3, 3, 7, 5].into_iter().enumerate() {
        let row = &values[r * VOCAB..(r + 1) * VOCAB];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
        assert!(
            (losses[r] - (max + sum.ln() - row[label])).abs() < 1e-4,
            "row {r} loss"
        );
        for (j, v) in row.iter().enumerate() {
            let want = w[r] * ((v - max).exp() / sum - f32::from(j == label));
            assert!(
                (dx[r * VOCAB + j] - want).abs() < 1e-5,
                "row {r} column {j}"
            );
        }
    }
}
