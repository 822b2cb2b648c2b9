//! The linear cross-entropy op on burn-flex: chunk by chunk (an uneven last chunk included) and
//! in one chunk, tied and untied, its losses and both gradients are the composed graph's:
//! the output layer's product, then the cross-entropy, with every logit kept.

use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

use super::{B, assert_close, flat, fresh, tensor};
use crate::{LinearLossSpec, OutputWeight, cross_entropy_forward_reference, linear_cross_entropy};

const ROWS: usize = 13;
const HIDDEN: usize = 8;
const VOCAB: usize = 11;

fn labels() -> Tensor<B, 1, Int> {
    let labels: Vec<i64> = (0..ROWS).map(|r| ((r * 7 + 3) % VOCAB) as i64).collect();
    Tensor::from_data(TensorData::new(labels, [ROWS]), &Default::default())
}

/// Per-row losses of `rows · weight` (untied) or `rows · weightᵀ` (tied) by the composed graph.
fn composed(rows: Tensor<B, 2>, weight: Tensor<B, 2>, layout: OutputWeight) -> Tensor<B, 1> {
    let logits = match layout {
        OutputWeight::Untied => rows.matmul(weight),
        OutputWeight::Tied => rows.matmul(weight.transpose()),
    };
    Tensor::from_primitive(TensorPrimitive::Float(
        cross_entropy_forward_reference::<B>(
            logits.into_primitive().tensor(),
            labels().into_primitive(),
        )
        .losses,
    ))
}

fn check(layout: OutputWeight, chunk_rows: usize) {
    let shape = match layout {
        OutputWeight::Untied => [HIDDEN, VOCAB],
        OutputWeight::Tied => [VOCAB, HIDDEN],
    };
    let row_weights = tensor([ROWS], 1.7);
    let rows = (tensor([ROWS, HIDDEN], 0.3) * 3.0).require_grad();
    let weight = tensor(shape, 0.9).require_grad();
    let want = composed(rows.clone(), weight.clone(), layout);
    let g_want = (want.clone() * row_weights.clone()).sum().backward();

    let (rows2, weight2) = (fresh(&rows).require_grad(), fresh(&weight).require_grad());
    let spec = LinearLossSpec {
        weight: layout,
        chunk_rows,
    };
    let got = linear_cross_entropy(rows2.clone(), weight2.clone(), labels(), spec);
    let g_got = (got.clone() * row_weights).sum().backward();
    let what = format!("{layout:?}, {chunk_rows} rows a chunk");
    assert_close(&flat(got), &flat(want), &format!("losses, {what}"));
    assert_close(
        &flat(rows2.grad(&g_got).expect("d rows")),
        &flat(rows.grad(&g_want).expect("d rows")),
        &format!("d rows, {what}"),
    );
    assert_close(
        &flat(weight2.grad(&g_got).expect("d weight")),
        &flat(weight.grad(&g_want).expect("d weight")),
        &format!("d weight, {what}"),
    );
}

#[test]
fn linear_cross_entropy_equals_the_output_layer_then_the_loss_in_any_chunking() {
    for layout in [OutputWeight::Untied, OutputWeight::Tied] {
        for chunk_rows in [1, 4, ROWS, 2 * ROWS] {
            check(layout, chunk_rows);
        }
    }
}
