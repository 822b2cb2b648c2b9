//! The token embedding's lookup on burn-flex. The backward adds the rows' gradients into the
//! weight's existing gradient in place (`op/embedding.rs` says why): each index's rows are
//! summed from zero in index order first, then added, so the result is burn's whichever of the
//! two gradients autodiff ran first (a recomputed or range-by-range backward may reorder them),
//! and it does not depend on the number of threads.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape, TensorMetadata};
use rayon::prelude::*;

/// Rows per parallel task of the lookup.
const ROWS_PER_TASK: usize = 256;

/// Whether the kernels take this weight: f32 `[vocab, hidden]`.
pub(super) fn supports(weight: &FlexTensor) -> bool {
    weight.dtype() == DType::F32 && weight.layout().shape().num_dims() == 2
}

/// `[batch, seq, hidden]`: row `indices[i]` of `weight` for each index.
pub(super) fn forward(weight: FlexTensor, indices: FlexTensor) -> FlexTensor {
    let [batch, seq] = indices.shape().dims();
    let weight = contiguous(weight);
    let [vocab, hidden] = weight.shape().dims();
    let table = weight
        .as_slice::<f32>()
        .expect("contiguous f32 (checked above)");
    let tokens = token_indices(indices, vocab);
    let mut out = vec![0.0f32; tokens.len() * hidden];
    out.par_chunks_mut(ROWS_PER_TASK * hidden.max(1))
        .zip(tokens.par_chunks(ROWS_PER_TASK))
        .for_each(|(out, tokens)| {
            for (row, &t) in out.chunks_mut(hidden).zip(tokens) {
                row.copy_from_slice(&table[t * hidden..(t + 1) * hidden]);
            }
        });
    FlexTensor::new(
        Bytes::from_elems(out),
        Layout::contiguous(Shape::new([batch, seq, hidden])),
        DType::F32,
    )
}

/// `into` (zeros without it) plus, for each index, the sum of its rows of `grad` (summed from
/// zero in index order, then added): `into + Σ rows` is what autodiff's `Σ rows + into` gave,
/// whichever of the two gradients arrived first.
pub(super) fn backward(
    indices: FlexTensor,
    grad: FlexTensor,
    vocab: usize,
    into: Option<FlexTensor>,
) -> FlexTensor {
    let grad = contiguous(grad);
    let [_, _, hidden] = grad.shape().dims();
    let rows = grad.as_slice::<f32>().expect("an f32 gradient");
    let tokens = token_indices(indices, vocab);
    assert_eq!(
        rows.len(),
        tokens.len() * hidden,
        "embedding backward: one gradient row per index"
    );
    // Each distinct index's rows summed apart, in index order.
    let mut slot_of = std::collections::HashMap::with_capacity(tokens.len());
    let mut sums: Vec<(usize, Vec<f32>)> = Vec::new();
    for (row, &t) in rows.chunks(hidden).zip(&tokens) {
        let slot = *slot_of.entry(t).or_insert_with(|| {
            sums.push((t, vec![0.0f32; hidden]));
            sums.len() - 1
        });
        sums[slot].1.iter_mut().zip(row).for_each(|(s, &g)| *s += g);
    }
    let mut sum = match into {
        Some(into) => owned(into),
        None => FlexTensor::zeros(Shape::new([vocab, hidden]), DType::F32),
    };
    let table = sum.storage_mut::<f32>();
    assert_eq!(
        table.len(),
        vocab * hidden,
        "embedding backward: a [vocab, hidden] gradient"
    );
    for (t, rows) in &sums {
        for (into, &g) in table[t * hidden..(t + 1) * hidden].iter_mut().zip(rows) {
            *into += g;
        }
    }
    sum
}

/// A whole contiguous f32 tensor to write into: itself when nothing else holds it (else
/// burn-flex copies on write), or a contiguous f32 copy.
fn owned(t: FlexTensor) -> FlexTensor {
    let len = t.shape().num_elements();
    let whole = t.dtype() == DType::F32
        && t.layout().contiguous_offsets() == Some((0, len))
        && t.bytes().len() == len * size_of::<f32>();
    if whole {
        t
    } else {
        let data = t.into_data().convert::<f32>();
        FlexTensor::from_data(data)
    }
}

fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

/// Indices as row-checked `usize`s.
fn token_indices(indices: FlexTensor, vocab: usize) -> Vec<usize> {
    let values: Vec<i64> = indices
        .into_data()
        .convert::<i64>()
        .into_vec()
        .expect("embedding indices convert to i64");
    values
        .into_iter()
        .map(|t| match usize::try_from(t) {
            Ok(index) if index < vocab => index,
            _ => panic!("embedding: index {t} outside the vocabulary of {vocab}"),
        })
        .collect()
}
