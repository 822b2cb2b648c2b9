//! `Σ x²` of one gradient on burn-flex (its share of the global gradient norm): fixed chunks in
//! parallel, each summed into fixed lanes, the chunks' sums added in chunk order.
//!
//! Composed, it is a squared copy and a sum, two single-threaded passes over every gradient,
//! the tied embedding's 3.2 M elements among them, on the one thread that runs the step. The
//! chunking depends only on the length, so the sum does not depend on the number of threads.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use rayon::prelude::*;

use super::exp::{LANES, tree_sum, widest};

/// Elements per parallel task.
const CHUNK: usize = 1 << 15;

/// Whether the kernel takes `x`: f32.
pub(super) fn supports(x: &FlexTensor) -> bool {
    x.dtype() == DType::F32
}

/// `[1]` f32: the sum of the squares of `x`'s elements.
pub(super) fn sum_of_squares(x: FlexTensor) -> FlexTensor {
    let x = if x.as_slice::<f32>().is_some() {
        x
    } else {
        x.to_contiguous()
    };
    let values = x.as_slice::<f32>().expect("contiguous f32 (checked above)");
    let chunks: Vec<f32> = values.par_chunks(CHUNK).map(squares).collect();
    let total = chunks.into_iter().fold(0.0f32, |sum, chunk| sum + chunk);
    FlexTensor::new(
        Bytes::from_elems(vec![total]),
        Layout::contiguous(Shape::new([1])),
        DType::F32,
    )
}

widest! {
    /// `Σ x²` over `values`, in a fixed order.
    fn squares(values: &[f32]) -> f32 {
        let mut acc = [0.0f32; LANES];
        let mut chunks = values.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (a, &x) in acc.iter_mut().zip(chunk) {
                *a += x * x;
            }
        }
        for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
            *a += x * x;
        }
        tree_sum(acc)
    }
}
