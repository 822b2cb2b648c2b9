//! How close is close enough: per-dtype tolerances and the error measures of one table row.
//!
//! A value passes when `|got - want| <= atol + rtol * |want|`, with `atol` and `rtol` set from the
//! storage dtype's precision (both sides round to it) and scaled per case for ops that
//! accumulate. NaN where the reference has none fails: that is how a poisoned, never-written
//! output element shows up. Int and bool outputs must match exactly.

use burn::tensor::{DType, TensorData};

/// Absolute and relative tolerance for one dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

/// The tolerance of a dtype before any per-case scaling.
pub(crate) fn tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance {
            atol: 1e-5,
            rtol: 1e-4,
        },
        // bf16 keeps 8 bits of mantissa: one rounding step is 2^-8 = 0.4 %.
        DType::BF16 => Tolerance {
            atol: 1e-2,
            rtol: 1.6e-2,
        },
        // f16 keeps 11 bits: 2^-11 = 0.05 %.
        DType::F16 => Tolerance {
            atol: 2e-3,
            rtol: 2e-3,
        },
        _ => Tolerance {
            atol: 0.0,
            rtol: 0.0,
        },
    }
}

/// The measured errors of one comparison.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Errors {
    pub max_abs: f64,
    pub max_rel: f64,
    /// Elements outside tolerance (NaN mismatches included).
    pub bad: usize,
    /// Why the comparison failed before looking at values (shape or dtype mismatch), if it did.
    pub mismatch: Option<String>,
}

impl Errors {
    pub(crate) fn pass(&self) -> bool {
        self.mismatch.is_none() && self.bad == 0
    }
}

/// Compares `got` against the reference `want`, scaling the dtype tolerance by `scale`.
pub(crate) fn compare(got: &TensorData, want: &TensorData, scale: f64) -> Errors {
    if got.shape != want.shape {
        return mismatch(format!("shape {:?} != {:?}", got.shape, want.shape));
    }
    // Floats must stay floats; ints and bools are compared exactly as integers (burn-flex
    // returns some bool results, e.g. of gather, as plain u8).
    if got.dtype.is_float() != want.dtype.is_float() {
        return mismatch(format!("dtype {:?} vs {:?}", got.dtype, want.dtype));
    }
    let tol = tolerance(want.dtype);
    let (atol, rtol) = (tol.atol * scale, tol.rtol * scale);
    let got: Vec<f64> = got.iter::<f64>().collect();
    let want: Vec<f64> = want.iter::<f64>().collect();
    let mut errors = Errors {
        max_abs: 0.0,
        max_rel: 0.0,
        bad: 0,
        mismatch: None,
    };
    for (&g, &w) in got.iter().zip(&want) {
        if w.is_nan() || g.is_nan() {
            if !(w.is_nan() && g.is_nan()) {
                errors.bad += 1;
                errors.max_abs = f64::NAN;
            }
            continue;
        }
        if w.is_infinite() || g.is_infinite() {
            if g != w {
                errors.bad += 1;
                errors.max_abs = f64::INFINITY;
            }
            continue;
        }
        let abs = (g - w).abs();
        if !errors.max_abs.is_nan() {
            errors.max_abs = errors.max_abs.max(abs);
        }
        // Relative error only means something away from zero.
        if w.abs() > atol.max(f64::MIN_POSITIVE) {
            errors.max_rel = errors.max_rel.max(abs / w.abs());
        }
        if abs > atol + rtol * w.abs() {
            errors.bad += 1;
        }
    }
    errors
}

fn mismatch(reason: String) -> Errors {
    Errors {
        max_abs: f64::NAN,
        max_rel: f64::NAN,
        bad: 0,
        mismatch: Some(reason),
    }
}

/// Sample mean and (population) variance of a tensor's values.
pub(crate) fn moments(data: &TensorData) -> (f64, f64) {
    let values: Vec<f64> = data.iter::<f64>().collect();
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_data_passes_with_zero_error() {
        let a = TensorData::new(vec![1.0f32, -2.0, 3.5], [3]);
        let e = compare(&a, &a.clone(), 1.0);
        assert!(e.pass());
        assert_eq!((e.max_abs, e.max_rel), (0.0, 0.0));
    }

    #[test]
    fn a_poisoned_element_fails() {
        let want = TensorData::new(vec![1.0f32, 2.0, 3.0], [3]);
        let got = TensorData::new(vec![1.0f32, f32::NAN, 3.0], [3]);
        let e = compare(&got, &want, 1.0);
        assert!(!e.pass());
        assert_eq!(e.bad, 1);
    }

    #[test]
    fn bf16_rounding_is_within_tolerance_but_f32_is_strict() {
        let want = TensorData::new(vec![1.0f32, 100.0], [2]);
        let near = TensorData::new(vec![1.004f32, 100.4], [2]);
        assert!(!compare(&near, &want, 1.0).pass());
        let want16 = want.clone().convert::<burn::tensor::bf16>();
        let near16 = near.convert::<burn::tensor::bf16>();
        assert!(compare(&near16, &want16, 1.0).pass());
    }

    #[test]
    fn ints_must_match_exactly_and_shapes_must_agree() {
        let want = TensorData::new(vec![1i64, 2, 3], [3]);
        let got = TensorData::new(vec![1i64, 2, 4], [3]);
        assert_eq!(compare(&got, &want, 100.0).bad, 1);
        let reshaped = TensorData::new(vec![1i64, 2, 3], [3, 1]);
        assert!(compare(&reshaped, &want, 1.0).mismatch.is_some());
    }

    #[test]
    fn moments_of_a_known_sample() {
        let d = TensorData::new(vec![0.0f32, 2.0, 4.0, 6.0], [4]);
        assert_eq!(moments(&d), (3.0, 5.0));
    }
}
