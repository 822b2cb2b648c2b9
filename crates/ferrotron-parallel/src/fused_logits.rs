//! The tied output layer's logits, `rows · embeddingᵀ`, for [`FusedOps`].
//!
//! Composed, the product is burn's `linear` against a transposed view of the embedding. On the
//! CPU backend that allocates the `[rows, vocab]` result zeroed and then copies it into an
//! aligned buffer before the GEMM writes it (at the quick start's 512 × 50,304 that was two
//! single-threaded passes over 103 MB of fresh pages, more than the GEMM itself), and hands the
//! embedding its gradient as a transposed view, so adding the lookup's gradient to it walked
//! 3.2 M elements by strides. A kernel pair writes the logits once and the embedding's gradient
//! in the embedding's own layout.
//!
//! [`FusedOps`]: crate::FusedOps

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;
use burn::tensor::ops::FloatTensor;

use crate::fused::FusedOps;
use crate::primitive::{unwrap, wrap};

/// `rows [n, hidden] · embeddingᵀ` for `embedding [vocab, hidden]`: `[n, vocab]` logits.
pub fn tied_logits<B: FusedOps>(rows: Tensor<B, 2>, embedding: Tensor<B, 2>) -> Tensor<B, 2> {
    wrap(B::fused_tied_logits(unwrap(rows), unwrap(embedding)))
}

/// The composed product, the graph the model recorded before the kernel: burn's `linear`
/// against the embedding's transposed view.
pub fn composed_tied_logits<B: Backend>(
    rows: FloatTensor<B>,
    embedding: FloatTensor<B>,
) -> FloatTensor<B> {
    let embedding: Tensor<B, 2> = wrap(embedding);
    unwrap(linear(wrap::<B, 2>(rows), embedding.transpose(), None))
}

/// Reference of [`FusedOps::tied_logits_kernel_backward`]: `(d rows, d embedding)` =
/// `(grad · embedding, gradᵀ · rows)`.
pub fn tied_logits_backward_reference<B: Backend>(
    rows: FloatTensor<B>,
    embedding: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let grad: Tensor<B, 2> = wrap(grad);
    let d_rows = grad.clone().matmul(wrap(embedding));
    let d_embedding = grad.transpose().matmul(wrap(rows));
    (unwrap(d_rows), unwrap(d_embedding))
}
