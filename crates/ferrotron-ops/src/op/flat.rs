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
/// given (the per-parameter order of the norm without flat buffers) by [`OrderedSum`].
pub fn composed_segment_sum_of_squares<B: crate::FusedOps>(
    buffers: &[FloatTensor<B>],
    segments: &[FlatSegment],
) -> Option<FloatTensor<B>> {
    let mut total: Option<OrderedSum<B>> = None;
    for &(buffer, offset, len) in segments {
        let piece = wrap::<B, 1>(buffers[buffer].clone()).slice(offset..offset + len);
        let squares = wrap::<B, 1>(B::sum_of_squares(unwrap(piece)));
        total = Some(OrderedSum::add(total, squares));
    }
    total.map(|total| unwrap(total.total()))
}

/// `[1]` f32 values (the parameters' `Σ x²`) added on the device in the order given, each
/// addition's rounding error kept (Knuth's two-sum, exact in f32) and added back once at the
/// end: the sum as exactly as f64 would give it, on any backend (ours on CUDA has no f64) and
/// without a host read. The norm decides clipping; added in plain f32, each of a model's
/// hundreds of parameters could move the sum by half an ulp of the running total.
#[derive(Debug, Clone)]
pub struct OrderedSum<B: Backend> {
    sum: Tensor<B, 1>,
    error: Tensor<B, 1>,
}

impl<B: Backend> OrderedSum<B> {
    /// `x` added to `sum` (or the first value).
    pub fn add(sum: Option<Self>, x: Tensor<B, 1>) -> Self {
        let Some(Self { sum, error }) = sum else {
            return Self {
                error: x.zeros_like(),
                sum: x,
            };
        };
        let total = sum.clone() + x.clone();
        let from_x = total.clone() - sum.clone();
        let lost = (sum - (total.clone() - from_x.clone())) + (x - from_x);
        Self {
            sum: total,
            error: error + lost,
        }
    }

    /// The sum, rounded once. An infinite sum stays infinite (its two-sum error is NaN).
    pub fn total(self) -> Tensor<B, 1> {
        let nan = self.error.clone().is_nan();
        self.sum + self.error.mask_fill(nan, 0.0)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::Tensor;

    use super::OrderedSum;

    fn sum(parts: &[f32]) -> f32 {
        let device = Default::default();
        parts
            .iter()
            .fold(None, |sum, &x| {
                Some(OrderedSum::add(
                    sum,
                    Tensor::<Flex, 1>::from_floats([x], &device),
                ))
            })
            .expect("parts")
            .total()
            .into_scalar()
    }

    /// Parts that plain f32 additions drop (each below half an ulp of the running sum) count:
    /// the total is the f64 sum rounded once; an infinite part keeps the total infinite.
    #[test]
    fn ordered_sum_is_the_f64_sum_rounded_once() {
        let parts: Vec<f32> = [1.0, 3e-3]
            .into_iter()
            .chain(std::iter::repeat_n(1e-8, 1000))
            .chain([7.7e-9, 2.5])
            .collect();
        let want = parts.iter().map(|&x| f64::from(x)).sum::<f64>() as f32;
        let plain = parts.iter().fold(0.0f32, |sum, &x| sum + x);
        assert_ne!(plain, want, "the parts must lose bits in f32");
        assert_eq!(sum(&parts), want);
        assert_eq!(sum(&[2.0, f32::INFINITY, 1.0]), f32::INFINITY);
    }
}
