//! `Σ x²` of one gradient on burn-flex (its share of the global gradient norm): fixed chunks in
//! parallel, each summed into fixed lanes, the chunks' sums added in chunk order.
//!
//! Composed, it is a squared copy and a sum, two single-threaded passes over every gradient,
//! the tied embedding's 3.2 M elements among them, on the one thread that runs the step. The
//! chunking depends only on the length, so the sum does not depend on the number of threads.
//!
//! The norm decides clipping, so it is accumulated in f64 and rounded to f32 once: summed in
//! f32 (2,048 squares a lane, then the chunks one after another), a gradient whose elements
//! span orders of magnitude (an embedding's rows of rare and frequent tokens) lost the small
//! squares under the large partial sums and came out 6.5e-6 low (the unit test's gradient; the
//! reported norm was up to 5e-6 low). A square of an f32 is exact in f64; [`WIDE`] lanes keep
//! enough independent additions in flight that the f64 loop runs at the f32 one's pace: on
//! 3 M elements (memory-bound) the same time within noise, in cache 5 % faster with AVX-512
//! and 8 % slower with AVX2.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use rayon::prelude::*;

use super::exp::widest;

/// Elements per parallel task.
const CHUNK: usize = 1 << 15;

/// f64 partial sums per chunk: eight AVX-512 vectors, so eight additions (of four-cycle
/// latency) overlap.
const WIDE: usize = 64;

/// Whether the kernel takes `x`: f32.
pub(super) fn supports(x: &FlexTensor) -> bool {
    x.dtype() == DType::F32
}

/// `[1]` f32: the sum of the squares of `x`'s elements, accumulated in f64.
pub(super) fn sum_of_squares(x: FlexTensor) -> FlexTensor {
    let x = if x.as_slice::<f32>().is_some() {
        x
    } else {
        x.to_contiguous()
    };
    let values = x.as_slice::<f32>().expect("contiguous f32 (checked above)");
    let chunks: Vec<f64> = values.par_chunks(CHUNK).map(squares).collect();
    let total = chunks.into_iter().fold(0.0f64, |sum, chunk| sum + chunk);
    FlexTensor::new(
        Bytes::from_elems(vec![total as f32]),
        Layout::contiguous(Shape::new([1])),
        DType::F32,
    )
}

widest! {
    /// `Σ x²` over `values` in f64, in a fixed order.
    fn squares(values: &[f32]) -> f64 {
        let mut acc = [0.0f64; WIDE];
        let mut chunks = values.chunks_exact(WIDE);
        for chunk in &mut chunks {
            for (a, &x) in acc.iter_mut().zip(chunk) {
                let x = f64::from(x);
                *a += x * x;
            }
        }
        for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
            let x = f64::from(x);
            *a += x * x;
        }
        let mut width = WIDE;
        while width > 1 {
            width /= 2;
            for i in 0..width {
                acc[i] += acc[i + width];
            }
        }
        acc[0]
    }
}
