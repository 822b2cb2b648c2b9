//! The two ops that let the optimizer keep its state in flat fp32 buffers: gathering a step's
//! per-parameter gradients into one flat buffer (summing microbatches there), and `Σ x²` over
//! segments of flat buffers.
//!
//! Autodiff hands out one gradient tensor per parameter. A GPU copies them into a flat buffer
//! with a few multi-tensor launches instead of one cast and one add per parameter, and then the
//! AdamW update, the norm and (data-parallel) the collectives each run over a handful of large
//! buffers. The composed defaults are exactly the arithmetic of the per-parameter path (the same
//! f32 widening, the same microbatch sums, the norm summed per parameter in the caller's order),
//! so CPU numbers do not move.
//!
//! A step of one microbatch has nothing to sum, so its buffer may keep the gradients' own dtype:
//! widened on the way in or read as bf16 by the norm and the update, the values are the same,
//! and a bf16 buffer is half the bytes to write and to read twice (about 2 ms of a gpt-1.3b step).
//!
//! [`FusedOps`]: crate::FusedOps

use crate::primitive::{unwrap, wrap};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};

/// One parameter's share of a flat buffer: its gradient (any float dtype, any shape with
/// `len` elements), or `None` where the parameter received none (its share is zero).
#[derive(Debug, Clone)]
pub struct FlatPiece<B: Backend> {
    pub len: usize,
    pub grad: Option<FloatTensor<B>>,
}

/// A segment of one of several flat buffers: `(buffer, offset, len)`.
pub type FlatSegment = (usize, usize, usize);

/// `into + cat(pieces)` as a flat `dtype` buffer (`cat(pieces)` without `into`), each piece cast
/// to `dtype` first (f32: widened) and a missing one read as zeros, in burn ops.
pub fn composed_gather_flat<B: Backend>(
    pieces: Vec<FlatPiece<B>>,
    into: Option<FloatTensor<B>>,
    dtype: DType,
) -> FloatTensor<B> {
    let device = pieces
        .iter()
        .find_map(|p| p.grad.as_ref().map(B::float_device))
        .or_else(|| into.as_ref().map(B::float_device))
        .unwrap_or_default();
    let parts: Vec<Tensor<B, 1>> = pieces
        .into_iter()
        .map(|piece| match piece.grad {
            Some(grad) => {
                let grad = wrap::<B, 1>(B::float_reshape(grad, [piece.len].into()));
                grad.cast(dtype)
            }
            None => Tensor::zeros([piece.len], (&device, dtype)),
        })
        .collect();
    let flat = Tensor::cat(parts, 0);
    unwrap(match into {
        Some(into) => wrap::<B, 1>(into) + flat,
        None => flat,
    })
}

/// `Σ x²` over `segments` of `buffers` as `[1]` f32: each segment's sum, added in the order
/// given (the per-parameter order of the norm without flat buffers).
pub fn composed_segment_sum_of_squares<B: crate::FusedOps>(
    buffers: &[FloatTensor<B>],
    segments: &[FlatSegment],
) -> Option<FloatTensor<B>> {
    let mut total: Option<Tensor<B, 1>> = None;
    for &(buffer, offset, len) in segments {
        let piece = wrap::<B, 1>(buffers[buffer].clone()).slice(offset..offset + len);
        let squares = wrap::<B, 1>(B::sum_of_squares(unwrap(piece)));
        total = Some(match total {
            Some(total) => total + squares,
            None => squares,
        });
    }
    total.map(unwrap)
}
