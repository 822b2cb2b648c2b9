//! A branch-free `f32` exponential and the row reductions the softmax kernels share.
//!
//! The cross-entropy over a 50,304-word vocabulary takes two exponentials per logit (forward
//! and backward); `f32::exp` calls libm one element at a time, which alone cost more than the
//! output layer's GEMM. This is Cephes' `expf` (range reduction by `ln 2` in two parts, a
//! degree-5 polynomial, the exponent put into the bits; within 2 ulp), written without branches
//! or float-to-int casts so the compiler vectorises the loops that call it: Rust's `as i32`
//! saturates, which LLVM compiled to scalar compares and moves, and the two softmax loops ran
//! one element at a time (5 ns each, a third of a one-thread quick-start step; with the
//! exponent taken from the rounded float's bits, 2 % of it and the same bits).
//!
//! Reductions accumulate into [`LANES`] fixed partial sums combined in a fixed order: the result
//! depends only on the row, never on the thread count or the vector width of the machine.
//!
//! The build targets baseline x86-64, whose vectors are SSE2's four floats (and the perf profile
//! of a quick-start step put these loops at 30 % of it), so each row kernel is compiled three
//! times (AVX-512, AVX2, baseline) and picks the widest the CPU has at run time. Every step is
//! element-wise IEEE arithmetic without fused multiply-adds (Rust never contracts `a * b + c`),
//! so all three give the same bits; calling a `#[target_feature]` function is the module's
//! `unsafe`.
#![allow(unsafe_code)]

/// Partial sums per row reduction (a multiple of every x86 vector width for `f32`).
const LANES: usize = 16;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 · 2²³`: adding and subtracting it rounds a float below 2²² to the nearest integer.
const ROUNDER: f32 = 12_582_912.0;
/// `ROUNDER`'s bits less the exponent bias: a float `ROUNDER + n` (n an integer, |n| < 2²²) has
/// the bits `ROUNDER_BITS + n`, so `bits − ROUNDER_BITS + 127` is `2ⁿ`'s biased exponent, found
/// with integer arithmetic the compiler vectorises (a float-to-int cast saturates, which it
/// does not: the loops ran one element at a time at 5 ns each).
const ROUNDER_BITS: u32 = 0x4B40_0000;
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
    let rounded = x * LOG2_E + ROUNDER;
    let n = rounded - ROUNDER;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    let biased = rounded
        .to_bits()
        .wrapping_sub(ROUNDER_BITS)
        .wrapping_add(127);
    y * f32::from_bits(biased << 23)
}

/// Defines `$name` as `$body` compiled for the widest vector unit the CPU has (see the module
/// doc); `$body` must be pure element-wise arithmetic so every version gives the same bits. The
/// other kernels of the module (`attention.rs`, `gelu.rs`, `squares.rs`) use it too; its
/// `unsafe`, calling a `#[target_feature]` function on a CPU that has the feature, is allowed
/// where it expands.
macro_rules! widest {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$doc])*
        #[allow(unsafe_code)]
        pub(super) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F, the one feature `avx512` was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, the one feature `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

pub(super) use widest;

widest! {
    /// The largest element of `row` (NaN elements are skipped; `−∞` for an empty row).
    fn max(row: &[f32]) -> f32 {
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
}

widest! {
    /// `Σ exp(x − shift)` over `row`, in a fixed order.
    fn sum_exp(row: &[f32], shift: f32) -> f32 {
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
}

widest! {
    /// One row of the cross-entropy's logit gradient in place: `(exp(x − lse) − [label]) · g`.
    fn softmax_grad(row: &mut [f32], label: usize, lse: f32, g: f32) {
        let target = row[label];
        for x in row.iter_mut() {
            *x = exp(*x - lse) * g;
        }
        row[label] = (exp(target - lse) - 1.0) * g;
    }
}

widest! {
    /// `exp(x − lse) · g` of a stretch of a row into `out` (the label's element is the
    /// caller's): the same arithmetic as [`softmax_grad`], element for element.
    fn softmax_grad_into(out: &mut [f32], x: &[f32], lse: f32, g: f32) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o = exp(x - lse) * g;
        }
    }
}

/// The lanes summed pairwise (fixed order).
#[inline(always)]
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

    /// The exponent from the rounded float's bits is the integer cast's, bit for bit.
    #[test]
    fn exp_takes_the_exponent_from_the_bits_as_the_cast_would() {
        let mut x = -88.0f32;
        while x < 89.0 {
            let clamped = x.clamp(MIN_INPUT, MAX_INPUT);
            let rounded = clamped * LOG2_E + ROUNDER;
            let n = rounded - ROUNDER;
            let from_bits = rounded
                .to_bits()
                .wrapping_sub(ROUNDER_BITS)
                .wrapping_add(127);
            assert_eq!(from_bits, (n as i32 + 127) as u32, "x = {x}");
            x += 0.001;
        }
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

    /// The dispatched kernels (AVX-512 or AVX2 on most machines) against the same arithmetic
    /// written out one element at a time, bit for bit.
    #[test]
    fn wide_kernels_give_the_bits_of_one_element_at_a_time() {
        let row: Vec<f32> = (0..50_021)
            .map(|i| ((i * 7919 % 10_007) as f32 - 5_000.0) / 311.0)
            .collect();
        let m = max(&row);
        let mut lanes = [0.0f32; LANES];
        for (i, &x) in row.iter().enumerate() {
            lanes[i % LANES] += exp(x - m);
        }
        assert_eq!(sum_exp(&row, m).to_bits(), tree_sum(lanes).to_bits());
        let (label, lse, g) = (4_321, m + sum_exp(&row, m).ln(), 0.37);
        let mut grad = row.clone();
        softmax_grad(&mut grad, label, lse, g);
        for (i, (&got, &x)) in grad.iter().zip(&row).enumerate() {
            let want = if i == label {
                (exp(x - lse) - 1.0) * g
            } else {
                exp(x - lse) * g
            };
            assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
        }
    }
}
