//! The tied output layer's three GEMMs on burn-flex, each writing its result once.
//!
//! burn-flex's matmul zero-fills its output and copies it into an aligned buffer before the
//! GEMM overwrites it; for the `[rows, vocab]` logits (103 MB at the quick start) those two
//! single-threaded passes over freshly faulted pages cost more than the threaded GEMM. Here the
//! GEMM writes straight into an uninitialised buffer. The embedding's gradient is written in
//! the embedding's own `[vocab, hidden]` layout, so adding the lookup's gradient to it is a
//! contiguous pass rather than a strided walk of a transposed view.
//!
//! Each call is the `gemm::gemm` call burn-flex makes for the same product (operands, strides,
//! threading), so the logits and both gradients are the composed op's numbers. The GEMM crate's
//! interface is raw pointers and strides, hence the module's `unsafe`.
#![allow(unsafe_code)]

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use gemm::Parallelism;

/// Products of at least this many multiply-adds run on the rayon pool: burn-flex's threshold,
/// so the split (and with it nothing of the numbers) matches its matmul.
const PARALLEL_THRESHOLD: usize = 192 * 192 * 192;

/// A row-major f32 matrix: its elements from the first, the row stride, `[rows, cols]`.
struct Matrix<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
}

impl<'a> Matrix<'a> {
    fn of(tensor: &'a FlexTensor) -> Self {
        let shape = tensor.layout().shape();
        Self {
            data: tensor
                .as_slice::<f32>()
                .expect("tied logits: contiguous f32 operands (checked by `supports`)"),
            rows: shape[0],
            cols: shape[1],
        }
    }
}

/// Whether the kernels take these operands: contiguous f32 `[n, hidden]` rows and `[vocab,
/// hidden]` embedding.
pub(super) fn supports(rows: &FlexTensor, embedding: &FlexTensor) -> bool {
    let matrix = |t: &FlexTensor| {
        t.dtype() == DType::F32
            && t.layout().shape().num_dims() == 2
            && t.as_slice::<f32>().is_some()
    };
    matrix(rows) && matrix(embedding) && rows.layout().shape()[1] == embedding.layout().shape()[1]
}

/// `rows · embeddingᵀ`: `[n, vocab]`.
pub(super) fn forward(rows: &FlexTensor, embedding: &FlexTensor) -> FlexTensor {
    let (x, w) = (Matrix::of(rows), Matrix::of(embedding));
    let (n, vocab, hidden) = (x.rows, w.rows, x.cols);
    // SAFETY: `x` is `[n, hidden]` and `w` `[vocab, hidden]`, both row-major and in bounds;
    // `embeddingᵀ` is `w` read with row stride 1 and column stride `hidden`.
    unsafe {
        product(
            [n, vocab, hidden],
            [1, vocab as isize],
            (x.data.as_ptr(), [1, hidden as isize]),
            (w.data.as_ptr(), [hidden as isize, 1]),
        )
    }
}

/// `(grad · embedding, (rowsᵀ · grad)ᵀ)`: `d rows [n, hidden]`, `d embedding [vocab, hidden]`.
pub(super) fn backward(
    rows: &FlexTensor,
    embedding: &FlexTensor,
    grad: FlexTensor,
) -> (FlexTensor, FlexTensor) {
    let grad = if grad.as_slice::<f32>().is_some() {
        grad
    } else {
        grad.to_contiguous()
    };
    let (x, w, g) = (Matrix::of(rows), Matrix::of(embedding), Matrix::of(&grad));
    let (n, vocab, hidden) = (x.rows, w.rows, x.cols);
    assert_eq!(
        (g.rows, g.cols),
        (n, vocab),
        "tied logits backward: a [rows, vocab] gradient"
    );
    // SAFETY: the operands are row-major, in bounds, and of the shapes asserted above. `d rows`
    // is `grad [n, vocab] · w [vocab, hidden]`; `d embedding` is burn's `xᵀ [hidden, n] · grad`
    // (`xᵀ` is `x` with row stride 1, column stride `hidden`) written transposed, element
    // `(i, j)` at `j · hidden + i`.
    unsafe {
        let d_rows = product(
            [n, hidden, vocab],
            [1, hidden as isize],
            (g.data.as_ptr(), [1, vocab as isize]),
            (w.data.as_ptr(), [1, hidden as isize]),
        );
        let d_embedding = product(
            [hidden, vocab, n],
            [hidden as isize, 1],
            (x.data.as_ptr(), [hidden as isize, 1]),
            (g.data.as_ptr(), [1, vocab as isize]),
        );
        (
            d_rows,
            d_embedding.with_layout(Layout::contiguous(Shape::new([vocab, hidden]))),
        )
    }
}

/// `lhs [m, k] · rhs [k, n]` into a new `m · n` buffer laid out by `out` strides `[column,
/// row]`; operands as `(pointer, [column stride, row stride])`. Shaped `[m, n]` (the caller
/// relabels a transposed layout).
///
/// # Safety
/// Every element the strides reach for `[m, k]` and `[k, n]` must be in bounds, and `out` must
/// place the `m · n` results at distinct offsets below `m · n`.
unsafe fn product(
    [m, n, k]: [usize; 3],
    out: [isize; 2],
    lhs: (*const f32, [isize; 2]),
    rhs: (*const f32, [isize; 2]),
) -> FlexTensor {
    let len = m * n;
    let mut values: Vec<f32> = Vec::with_capacity(len);
    let parallelism = if m * n * k >= PARALLEL_THRESHOLD {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    // SAFETY: the caller's bounds; `read_dst = false` with α = 0 has the GEMM write every one of
    // the `len` results without reading the uninitialised buffer, so all are set by `set_len`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            values.as_mut_ptr(),
            out[0],
            out[1],
            false,
            lhs.0,
            lhs.1[0],
            lhs.1[1],
            rhs.0,
            rhs.1[0],
            rhs.1[1],
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
        values.set_len(len);
    }
    FlexTensor::new(
        Bytes::from_elems(values),
        Layout::contiguous(Shape::new([m, n])),
        DType::F32,
    )
}
