//! GELU on burn-flex: chunks of the tensor in parallel, `erf` by a rational approximation the
//! compiler vectorises.
//!
//! burn-flex's `gelu` and `gelu_backward` call libm's `erff` (and `expf`) one element at a time
//! on one thread. `erf` here is the rational approximation Eigen and XLA use for `f32` (odd
//! degree-13 numerator over even degree-8 denominator on `x` clamped to ±4; evaluated in f32,
//! within 5e-7 of the true value), branch-free like `exp.rs`'s exponential, so each chunk's
//! loop runs on the widest vectors the CPU has and every vector width gives the same bits.
//! Element-wise, so the numbers do not depend on the number of threads.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, TensorMetadata};
use rayon::prelude::*;

use super::exp::{self, widest};

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// Whether the kernels take `x`: f32.
pub(super) fn supports(x: &FlexTensor) -> bool {
    x.dtype() == DType::F32
}

/// `0.5 · x · (1 + erf(x / √2))`.
pub(super) fn forward(x: FlexTensor) -> FlexTensor {
    let shape = x.shape();
    let x = contiguous(x);
    let input = x.as_slice::<f32>().expect("contiguous f32 (checked above)");
    let mut out = vec![0.0f32; input.len()];
    out.par_chunks_mut(CHUNK)
        .zip(input.par_chunks(CHUNK))
        .for_each(|(out, x)| gelu_chunk(out, x));
    FlexTensor::new(
        Bytes::from_elems(out),
        Layout::contiguous(shape),
        DType::F32,
    )
}

/// `dy · (Φ(x) + x · φ(x))`, `Φ(x) = 0.5 · (1 + erf(x / √2))`, `φ(x) = e^(−x²/2) / √(2π)`.
pub(super) fn backward(x: FlexTensor, grad: FlexTensor) -> FlexTensor {
    let shape = x.shape();
    let (x, grad) = (contiguous(x), contiguous(grad));
    let input = x.as_slice::<f32>().expect("contiguous f32 (checked above)");
    let dy = grad.as_slice::<f32>().expect("an f32 gradient");
    assert_eq!(
        dy.len(),
        input.len(),
        "gelu backward: x and dy differ in size"
    );
    let mut out = vec![0.0f32; input.len()];
    out.par_chunks_mut(CHUNK)
        .zip(input.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(out, (x, dy))| gelu_grad_chunk(out, x, dy));
    FlexTensor::new(
        Bytes::from_elems(out),
        Layout::contiguous(shape),
        DType::F32,
    )
}

fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

/// `erf(x)`, within 5e-7 (absolute, the worst near ±3.9) for every `x`; ±1 beyond ±4.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = if x > 4.0 { 4.0 } else { x };
    let x = if x < -4.0 { -4.0 } else { x };
    let x2 = x * x;
    let p = -2.726_142_3e-10_f32;
    let p = p * x2 + 2.770_681_4e-8;
    let p = p * x2 - 2.101_024e-6;
    let p = p * x2 - 5.692_506_4e-5;
    let p = p * x2 - 7.349_906_3e-4;
    let p = p * x2 - 2.954_6e-3;
    let p = p * x2 - 1.609_603_3e-2;
    let q = -1.456_607_2e-5_f32;
    let q = q * x2 - 2.133_740_6e-4;
    let q = q * x2 - 1.682_827e-3;
    let q = q * x2 - 7.373_329_2e-3;
    let q = q * x2 - 1.426_473_9e-2;
    x * p / q
}

#[inline(always)]
fn cdf(x: f32) -> f32 {
    0.5 * (1.0 + erf(x / std::f32::consts::SQRT_2))
}

widest! {
    /// GELU of `x` into `out`.
    fn gelu_chunk(out: &mut [f32], x: &[f32]) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o = x * cdf(x);
        }
    }
}

widest! {
    /// GELU's input gradient from `x` and the output gradient `dy`, into `out`.
    fn gelu_grad_chunk(out: &mut [f32], x: &[f32], dy: &[f32]) {
        let inv_sqrt_2pi = 1.0 / (2.0 * std::f32::consts::PI).sqrt();
        for ((o, &x), &g) in out.iter_mut().zip(x).zip(dy) {
            let pdf = inv_sqrt_2pi * exp::exp(-0.5 * x * x);
            *o = g * (cdf(x) + x * pdf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_is_within_5e7_of_libm() {
        let mut x = -6.0f32;
        while x < 6.0 {
            let (ours, libm) = (f64::from(erf(x)), libm_erf(f64::from(x)));
            assert!((ours - libm).abs() < 5e-7, "erf({x}) = {ours}, libm {libm}");
            x += 0.000_73;
        }
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(9.0), erf(4.0));
        assert!(erf(f32::NAN).is_nan());
    }

    /// burn-flex's `erf_f64` is libm's (the reference the composed GELU uses).
    fn libm_erf(x: f64) -> f64 {
        burn::backend::flex::ops::unary::erf_f64(x)
    }
}
