//! The softmax cross-entropy over a whole vocabulary on burn-flex, one row per task.
//!
//! Composed, the loss is a dozen single-threaded passes over `[rows, vocab]` f32 buffers, each
//! allocating its result, and autodiff keeps several of them for the backward: at the quick
//! start's shape (512 rows × 50,304 words, 103 MB a buffer) that was most of a CPU step. Here the
//! forward reads each row twice while it sits in cache (maximum, then `Σ exp`) and keeps one
//! log-sum-exp per row; the backward writes `(softmax − one_hot) · dloss` in one pass, into the
//! logits' own buffer when nothing else holds it, so no second logits-sized buffer exists.
//!
//! Rows are independent and each is reduced in a fixed order (`exp.rs`), so the numbers do not
//! depend on the number of threads.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape, TensorMetadata};
use rayon::prelude::*;

use super::exp;

/// Rows of at least this many logits in total make one parallel task (small test vocabularies
/// would otherwise spend more on scheduling than on arithmetic).
const MIN_TASK_ELEMENTS: usize = 1 << 15;

/// Whether the kernels take these logits: f32 `[rows, vocab]` laid out row after row.
pub(super) fn supports(logits: &FlexTensor) -> bool {
    logits.dtype() == DType::F32
        && logits.layout().shape().num_dims() == 2
        && logits.as_slice::<f32>().is_some()
}

/// Per-row `(loss, log-sum-exp)`, each `[rows]` f32.
pub(super) fn forward(logits: &FlexTensor, labels: FlexTensor) -> (FlexTensor, FlexTensor) {
    let [rows, vocab] = dims(logits);
    let data = rows_of(logits);
    let labels = label_indices(labels, rows, vocab);
    let (losses, log_sum_exp): (Vec<f32>, Vec<f32>) = data
        .par_chunks(vocab.max(1))
        .zip(labels.par_iter())
        .with_min_len(min_rows(vocab))
        .map(|(row, &label)| {
            let max = exp::max(row);
            let lse = max + exp::sum_exp(row, max).ln();
            (lse - row[label], lse)
        })
        .unzip();
    (vector(losses), vector(log_sum_exp))
}

/// `(exp(l − lse) − one_hot) · dloss` per row, `[rows, vocab]` f32.
pub(super) fn backward(
    logits: FlexTensor,
    labels: FlexTensor,
    log_sum_exp: FlexTensor,
    grad_losses: FlexTensor,
) -> FlexTensor {
    let [rows, vocab] = dims(&logits);
    let labels = label_indices(labels, rows, vocab);
    let lse = floats(log_sum_exp);
    let grad = floats(grad_losses);
    assert_eq!(
        lse.len(),
        rows,
        "cross-entropy backward: one log-sum-exp per row"
    );
    assert_eq!(
        grad.len(),
        rows,
        "cross-entropy backward: one loss gradient per row"
    );
    let mut out = owned_rows(logits);
    out.storage_mut::<f32>()
        .par_chunks_mut(vocab.max(1))
        .zip(labels.par_iter().zip(lse.par_iter().zip(grad.par_iter())))
        .with_min_len(min_rows(vocab))
        .for_each(|(row, (&label, (&lse, &g)))| exp::softmax_grad(row, label, lse, g));
    out
}

fn dims(logits: &FlexTensor) -> [usize; 2] {
    let shape = logits.layout().shape();
    [shape[0], shape[1]]
}

fn min_rows(vocab: usize) -> usize {
    MIN_TASK_ELEMENTS.div_ceil(vocab.max(1))
}

fn rows_of(logits: &FlexTensor) -> &[f32] {
    logits
        .as_slice::<f32>()
        .expect("cross-entropy kernel: contiguous f32 logits (checked by `supports`)")
}

/// The logits as a tensor this call owns outright, row-major from offset 0, to write into.
fn owned_rows(logits: FlexTensor) -> FlexTensor {
    let whole = logits.layout().contiguous_offsets() == Some((0, logits.shape().num_elements()))
        && logits.bytes().len() == logits.shape().num_elements() * 4;
    if whole {
        logits
    } else {
        logits.to_contiguous()
    }
}

/// Labels as row-checked indices.
pub(super) fn label_indices(labels: FlexTensor, rows: usize, vocab: usize) -> Vec<usize> {
    let data = labels.into_data();
    let values: Vec<i64> = data
        .convert::<i64>()
        .into_vec()
        .expect("cross-entropy labels convert to i64");
    assert_eq!(values.len(), rows, "cross-entropy: one label per row");
    values
        .into_iter()
        .map(|label| match usize::try_from(label) {
            Ok(index) if index < vocab => index,
            _ => panic!("cross-entropy: label {label} outside the vocabulary of {vocab}"),
        })
        .collect()
}

pub(super) fn floats(tensor: FlexTensor) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec()
        .expect("a float tensor converts to f32")
}

fn vector(values: Vec<f32>) -> FlexTensor {
    let len = values.len();
    FlexTensor::new(
        Bytes::from_elems(values),
        Layout::contiguous(Shape::new([len])),
        DType::F32,
    )
}
