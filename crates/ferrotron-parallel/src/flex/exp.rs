//! A branch-free `f32` exponential and the row reductions the softmax kernels share.
//!
//! The cross-entropy over a 50,304-word vocabulary takes two exponentials per logit (forward
//! and backward); `f32::exp` calls libm one element at a time, which alone cost more than the
//! output layer's GEMM. This is Cephes' `expf` (range reduction by `ln 2` in two parts, a
//! degree-5 polynomial, the exponent put into the bits; within 2 ulp), written without branches
//! so the compiler vectorises the loops that call it.
//!
//! Reductions accumulate into [`LANES`] fixed partial sums combined in a fixed order: the result
//! depends only on the row, never on the thread count or the vector width of the machine.

/// Partial sums per row reduction (a multiple of every x86 vector width for `f32`).
pub(super) const LANES: usize = 16;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 · 2²³`: adding and subtracting it rounds a float below 2²² to the nearest integer.
const ROUNDER: f32 = 12_582_912.0;
/// Inputs are clamped to these (NaN passes), so `2ⁿ` stays a normal float; a softmax only
/// ever takes `exp` of values at or below zero.
const MAX_INPUT: f32 = 88.0;
const MIN_INPUT: f32 = -87.336_55;

/// `eˣ` for `x` in [−87.3, 88] (NaN gives NaN); below, the smallest normal float instead of
/// zero (a softmax weight of 1e-38 is as good as none), above, `e⁸⁸`.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    let x = if x > MAX_INPUT { MAX_INPUT } else { x };
    let x = if x < MIN_INPUT { MIN_INPUT } else { x };
    let n = (x * LOG2_E + ROUNDER) - ROUNDER;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    y * scale
}

/// The largest element of `row` (NaN elements are skipped; `−∞` for an empty row).
pub(super) fn max(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a = a.max(x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = a.max(x);
    }
    acc.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

/// `Σ exp(x − shift)` over `row`, in a fixed order.
pub(super) fn sum_exp(row: &[f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a += exp(x - shift);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a += exp(x - shift);
    }
    tree_sum(acc)
}

/// The lanes summed pairwise (fixed order).
fn tree_sum(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (ours, libm) = (exp(x), x.exp());
            let ulp = (ours.to_bits() as i64 - libm.to_bits() as i64).abs();
            assert!(ulp <= 2, "exp({x}) = {ours}, libm {libm}: {ulp} ulp");
            x += 0.013;
        }
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-1e4) < 1.2e-38 && exp(-1e4) > 0.0);
        assert_eq!(exp(1e4), exp(MAX_INPUT));
    }

    #[test]
    fn reductions_match_plain_loops() {
        let row: Vec<f32> = (0..1003)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        assert_eq!(
            max(&row),
            row.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        );
        let m = max(&row);
        let plain: f64 = row.iter().map(|&x| f64::from(x - m).exp()).sum();
        assert!((f64::from(sum_exp(&row, m)) - plain).abs() < 1e-5 * plain);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        assert_eq!(sum_exp(&[], 0.0), 0.0);
    }
}
