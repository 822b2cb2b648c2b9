//! The element types a collective moves, and how they combine.
//!
//! The set is what the runtime exchanges: `f32`/`bf16` activations and gradients, `f64` for
//! loss and norm sums, `i64`/`u32`/`i32` for token ids and routing counts. Each maps to one NCCL
//! data type (`ferrotron_cuda::nccl`'s `wire_type`), so the NCCL communicator serves the same
//! generic calls. Integer sums wrap, as
//! NCCL's do, so a reduction never panics.

use std::fmt;

use half::bf16;

/// The wire type of a buffer; a collective whose ranks disagree on it is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    Bf16,
    I32,
    I64,
    U32,
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::Bf16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
        })
    }
}

/// How an all-reduce or reduce-scatter combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        })
    }
}

/// A value a communicator can move and reduce.
pub trait Element: Copy + Default + Send + Sync + fmt::Debug + 'static {
    const DTYPE: DType;

    fn sum(self, other: Self) -> Self;

    /// For floats, a NaN loses to a number (IEEE `maxNum`, like CUDA's `fmaxf`).
    fn max(self, other: Self) -> Self;

    fn combine(self, other: Self, op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum => self.sum(other),
            ReduceOp::Max => self.max(other),
        }
    }
}

macro_rules! float_element {
    ($ty:ty, $dtype:expr) => {
        impl Element for $ty {
            const DTYPE: DType = $dtype;
            fn sum(self, other: Self) -> Self {
                self + other
            }
            fn max(self, other: Self) -> Self {
                <$ty>::max(self, other)
            }
        }
    };
}

macro_rules! int_element {
    ($ty:ty, $dtype:expr) => {
        impl Element for $ty {
            const DTYPE: DType = $dtype;
            fn sum(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            fn max(self, other: Self) -> Self {
                Ord::max(self, other)
            }
        }
    };
}

float_element!(f32, DType::F32);
float_element!(f64, DType::F64);
float_element!(bf16, DType::Bf16);
int_element!(i32, DType::I32);
int_element!(i64, DType::I64);
int_element!(u32, DType::U32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_sums_wrap_instead_of_panicking() {
        assert_eq!(u32::MAX.combine(2, ReduceOp::Sum), 1);
        assert_eq!(i64::MIN.combine(-3, ReduceOp::Max), -3);
    }

    #[test]
    fn float_max_prefers_the_number_over_nan() {
        assert_eq!(f32::NAN.combine(1.5, ReduceOp::Max), 1.5);
        let b = bf16::from_f32(2.0).combine(bf16::from_f32(3.0), ReduceOp::Sum);
        assert_eq!(b.to_f32(), 5.0);
    }
}
