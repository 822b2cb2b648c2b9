//! The tied output layer's three GEMMs on burn-flex, each writing its result once.
//!
//! burn-flex's matmul zero-fills its output and copies it into an aligned buffer before the
//! GEMM overwrites it; for the `[rows, vocab]` logits (103 MB at the quick start) those two
//! single-threaded passes over freshly faulted pages cost more than the threaded GEMM. Here the
//! forward GEMM writes straight into an uninitialised buffer.
//!
//! The backward's two products both read the `[rows, vocab]` logits' gradient, and one of them
//! (`d rows = grad · embedding`) reduces over the whole vocabulary into a `[rows, hidden]` result
//! too small to split: the GEMM crate parallelises over the output only, so it ran the 50,304-long
//! reduction as a hundred threaded regions of a few microseconds each, every thread packing the
//! same panels. Here the vocabulary is cut into fixed chunks of [`VOCAB_CHUNK`] words, one task
//! each: a task writes its chunk's rows of `d embedding` (in the embedding's own layout, so adding
//! the lookup's gradient to it is a contiguous pass) and its partial `d rows`, both from the
//! gradient's chunk while it sits in cache; the partials are added in chunk order. The chunks
//! depend only on the vocabulary, so the numbers do not depend on the number of threads.
//!
//! The GEMM crate's interface is raw pointers and strides, hence the module's `unsafe`.
#![allow(unsafe_code)]

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use gemm::Parallelism;
use rayon::prelude::*;

use super::exp;

/// Products of at least this many multiply-adds run on the rayon pool: burn-flex's threshold,
/// so the split (and with it nothing of the numbers) matches its matmul.
const PARALLEL_THRESHOLD: usize = 192 * 192 * 192;

/// Words of the vocabulary per backward task: the task's `[rows, VOCAB_CHUNK]` slice of the
/// logits' gradient (1 MB at the quick start's 512 rows) stays in a core's L2 cache for both
/// products, and a hundred tasks keep 16 threads evenly busy.
const VOCAB_CHUNK: usize = 512;

/// Elements of `d rows` per task of the partials' sum.
const SUM_CHUNK: usize = 1 << 12;

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
    matrix(rows)
        && matrix(embedding)
        && rows.layout().shape()[1] == embedding.layout().shape()[1]
        && rows.layout().shape()[1] > 0
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

/// `(grad · embedding, gradᵀ · rows)`: `d rows [n, hidden]`, `d embedding [vocab, hidden]`.
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
    assert_eq!(
        (g.rows, g.cols),
        (x.rows, w.rows),
        "tied logits backward: a [rows, vocab] gradient"
    );
    chunked_backward(&x, &w, Gradient::Whole(g.data))
}

/// The same products with the gradient of the cross-entropy `(softmax − one_hot) · dloss`
/// computed a chunk at a time from the logits, the per-row log-sum-exps and loss gradients (the
/// cross-entropy backward's arithmetic, element for element): the whole gradient never exists.
pub(super) fn backward_from_loss(
    rows: &FlexTensor,
    embedding: &FlexTensor,
    logits: &FlexTensor,
    loss: &RowLoss,
) -> (FlexTensor, FlexTensor) {
    let (x, w, l) = (Matrix::of(rows), Matrix::of(embedding), Matrix::of(logits));
    assert_eq!(
        (l.rows, l.cols),
        (x.rows, w.rows),
        "tied cross-entropy backward: [rows, vocab] logits"
    );
    assert!(
        loss.labels.len() == l.rows
            && loss.log_sum_exp.len() == l.rows
            && loss.grad.len() == l.rows,
        "tied cross-entropy backward: one label, log-sum-exp and loss gradient per row"
    );
    chunked_backward(&x, &w, Gradient::FromLoss(l.data, loss))
}

/// Where [`chunked_backward`] finds the logits' gradient.
#[derive(Clone, Copy)]
enum Gradient<'a> {
    /// The whole `[n, vocab]` gradient, row-major.
    Whole(&'a [f32]),
    /// The cross-entropy's, from these `[n, vocab]` logits.
    FromLoss(&'a [f32], &'a RowLoss),
}

impl Gradient<'_> {
    /// Words `start..start + words` of every row, as a slice and its row stride, passed to
    /// `use_chunk`; the cross-entropy's are computed into this thread's scratch buffer, rows
    /// [`SCRATCH_PAD`] floats longer than the chunk (a power-of-two stride would map a column's
    /// elements to a few cache sets).
    fn with_chunk<R>(
        &self,
        [n, vocab]: [usize; 2],
        start: usize,
        words: usize,
        use_chunk: impl FnOnce(&[f32], usize) -> R,
    ) -> R {
        match *self {
            Gradient::Whole(g) => use_chunk(&g[start..], vocab),
            Gradient::FromLoss(logits, loss) => SCRATCH.with_borrow_mut(|scratch| {
                let stride = words + SCRATCH_PAD;
                if scratch.len() < n * stride {
                    scratch.resize(n * stride, 0.0);
                }
                for (r, out) in scratch.chunks_mut(stride).take(n).enumerate() {
                    let (out, row) = (
                        &mut out[..words],
                        &logits[r * vocab + start..r * vocab + start + words],
                    );
                    let (lse, g) = (loss.log_sum_exp[r], loss.grad[r]);
                    exp::softmax_grad_into(out, row, lse, g);
                    if let Some(at) = loss.labels[r].checked_sub(start).filter(|&at| at < words) {
                        out[at] = (exp::exp(row[at] - lse) - 1.0) * g;
                    }
                }
                use_chunk(&scratch[..], stride)
            }),
        }
    }
}

/// Floats each scratch row has beyond its chunk.
const SCRATCH_PAD: usize = 16;

thread_local! {
    /// A worker's buffer for its chunks of the cross-entropy's gradient, kept between tasks
    /// (written before every read, so never cleared).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What the cross-entropy's backward reads per row: labels, log-sum-exps, loss gradients.
pub(super) struct RowLoss {
    pub(super) labels: Vec<usize>,
    pub(super) log_sum_exp: Vec<f32>,
    pub(super) grad: Vec<f32>,
}

/// `d rows` and `d embedding` chunk by chunk of the vocabulary (see the module docs).
fn chunked_backward(
    x: &Matrix<'_>,
    w: &Matrix<'_>,
    gradient: Gradient<'_>,
) -> (FlexTensor, FlexTensor) {
    let (n, vocab, hidden) = (x.rows, w.rows, x.cols);
    let mut d_embedding: Vec<f32> = Vec::with_capacity(vocab * hidden);
    let partials: Vec<Vec<f32>> = d_embedding.spare_capacity_mut()[..vocab * hidden]
        .par_chunks_mut(VOCAB_CHUNK * hidden)
        .enumerate()
        .map(|(index, d_embedding)| {
            let start = index * VOCAB_CHUNK;
            let words = d_embedding.len() / hidden;
            gradient.with_chunk([n, vocab], start, words, |g, stride| {
                assert!(
                    n == 0 || g.len() >= (n - 1) * stride + words,
                    "a [rows, words] gradient chunk"
                );
                let mut partial: Vec<f32> = Vec::with_capacity(n * hidden);
                // SAFETY: `g` holds the chunk's `[n, words]` gradient with row stride `stride`
                // (asserted), `x` is `[n, hidden]` and `w` `[vocab, hidden]`, row-major, and
                // `start + words <= vocab`. `d embedding`'s rows `start..start + words` are
                // `gᵀ [words, n] · x [n, hidden]` (`gᵀ` is `g` read with row stride 1 and column
                // stride `stride`), into this task's `words · hidden` slots; the partial is
                // `g [n, words] · w[start..] [words, hidden]` into its own buffer. `write` sets
                // every slot it is given.
                unsafe {
                    write(
                        d_embedding.as_mut_ptr().cast::<f32>(),
                        [words, hidden, n],
                        [1, hidden as isize],
                        (g.as_ptr(), [stride as isize, 1]),
                        (x.data.as_ptr(), [1, hidden as isize]),
                        Parallelism::None,
                    );
                    write(
                        partial.as_mut_ptr(),
                        [n, hidden, words],
                        [1, hidden as isize],
                        (g.as_ptr(), [1, stride as isize]),
                        (w.data.as_ptr().add(start * hidden), [1, hidden as isize]),
                        Parallelism::None,
                    );
                    partial.set_len(n * hidden);
                }
                partial
            })
        })
        .collect();
    // SAFETY: the chunks above cover all `vocab · hidden` slots and each task's GEMM set its own.
    unsafe { d_embedding.set_len(vocab * hidden) };
    let mut d_rows = vec![0.0f32; n * hidden];
    d_rows
        .par_chunks_mut(SUM_CHUNK)
        .enumerate()
        .for_each(|(i, out)| {
            for partial in &partials {
                let part = &partial[i * SUM_CHUNK..i * SUM_CHUNK + out.len()];
                out.iter_mut().zip(part).for_each(|(o, p)| *o += p);
            }
        });
    (
        matrix(d_rows, [n, hidden]),
        matrix(d_embedding, [vocab, hidden]),
    )
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
    // SAFETY: the caller's bounds; `write` sets all `len` results, so all are set by `set_len`.
    unsafe {
        write(values.as_mut_ptr(), [m, n, k], out, lhs, rhs, parallelism);
        values.set_len(len);
    }
    matrix(values, [m, n])
}

/// `dst ← lhs [m, k] · rhs [k, n]`, `dst` laid out by `out` strides `[column, row]`, operands as
/// `(pointer, [column stride, row stride])`.
///
/// # Safety
/// Every element the strides reach for `[m, k]`, `[k, n]` and `[m, n]` must be in bounds, and
/// `out` must place the `m · n` results at distinct offsets. `dst` may be uninitialised:
/// `read_dst = false` with α = 0 has the GEMM write every result without reading it.
unsafe fn write(
    dst: *mut f32,
    [m, n, k]: [usize; 3],
    out: [isize; 2],
    lhs: (*const f32, [isize; 2]),
    rhs: (*const f32, [isize; 2]),
    parallelism: Parallelism,
) {
    // SAFETY: the caller's.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
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
    }
}

fn matrix(values: Vec<f32>, shape: [usize; 2]) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(values),
        Layout::contiguous(Shape::new(shape)),
        DType::F32,
    )
}
