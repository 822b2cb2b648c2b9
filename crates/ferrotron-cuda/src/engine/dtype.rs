//! Element types the engine stores, and how each one is spelled in generated CUDA C++.
//!
//! The kernels load every element into a *compute* type (half floats widen to `float`, small
//! integers to their natural C type) and narrow on store, so one expression template serves all
//! storage types. Bool is its own type (stored as one byte holding 0 or 1) rather than an alias of
//! `U8`, because comparisons, masks and `any`/`all` must keep 0/1 semantics.

use std::fmt;

use burn::tensor::{BoolStore, DType as BurnDType};

use crate::error::{CudaError, OpContext, Result};

/// An element type of a [`crate::CudaTensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    I32,
    U8,
    Bool,
}

/// The error for a dtype the engine does not store.
pub(crate) fn unsupported(what: String) -> CudaError {
    CudaError::unsupported(
        OpContext::new("dtype"),
        format!("{what}; ferrotron-cuda stores f32, bf16, f16, i64, i32, u8 and bool"),
    )
}

/// The engine dtype for a burn dtype.
pub(crate) fn engine_dtype(dtype: BurnDType) -> Result<DType> {
    Ok(match dtype {
        BurnDType::F32 | BurnDType::Flex32 => DType::F32,
        BurnDType::F16 => DType::F16,
        BurnDType::BF16 => DType::BF16,
        BurnDType::I64 => DType::I64,
        BurnDType::I32 => DType::I32,
        BurnDType::U8 => DType::U8,
        BurnDType::Bool(_) => DType::Bool,
        other => return Err(unsupported(format!("{other:?}"))),
    })
}

/// The burn dtype of an engine dtype (bools are one byte each: `Bool(U8)`).
pub(crate) fn burn_dtype(dtype: DType) -> BurnDType {
    match dtype {
        DType::F32 => BurnDType::F32,
        DType::F16 => BurnDType::F16,
        DType::BF16 => BurnDType::BF16,
        DType::I64 => BurnDType::I64,
        DType::I32 => BurnDType::I32,
        DType::U8 => BurnDType::U8,
        DType::Bool => BurnDType::Bool(BoolStore::U8),
    }
}

impl DType {
    /// Every supported type, in a fixed order (used by tests and the op table).
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ];

    /// Size of one element in bytes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::U8)
    }

    pub fn is_bool(self) -> bool {
        self == DType::Bool
    }

    /// The C++ type elements are stored as in device memory.
    pub fn storage_c(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F16 => "__half",
            DType::BF16 => "__nv_bfloat16",
            DType::I64 => "long long",
            DType::I32 => "int",
            DType::U8 | DType::Bool => "unsigned char",
        }
    }

    /// The C++ type arithmetic happens in.
    pub fn compute_c(self) -> &'static str {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => "float",
            DType::I64 => "long long",
            DType::I32 => "int",
            DType::U8 => "unsigned int",
            DType::Bool => "bool",
        }
    }

    /// The C++ type sums and products accumulate in (wider than the storage type).
    pub fn accumulate_c(self) -> &'static str {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => "float",
            DType::I64 | DType::I32 | DType::U8 | DType::Bool => "long long",
        }
    }

    /// Expression that widens the stored value `x` to the compute type.
    pub fn load_expr(self, x: &str) -> String {
        match self {
            DType::F32 | DType::I64 | DType::I32 => x.to_string(),
            DType::F16 => format!("__half2float({x})"),
            DType::BF16 => format!("__bfloat162float({x})"),
            DType::U8 => format!("((unsigned int)({x}))"),
            DType::Bool => format!("(({x}) != 0)"),
        }
    }

    /// Expression that converts a value `v` of any C arithmetic type to this storage type.
    pub fn store_expr(self, v: &str) -> String {
        match self {
            DType::F32 => format!("((float)({v}))"),
            DType::F16 => format!("__float2half((float)({v}))"),
            DType::BF16 => format!("__float2bfloat16((float)({v}))"),
            DType::I64 => format!("((long long)({v}))"),
            DType::I32 => format!("((int)({v}))"),
            DType::U8 => format!("((unsigned char)({v}))"),
            DType::Bool => format!("((unsigned char)(({v}) != 0))"),
        }
    }

    /// Whether kernels touching this type need the half-precision headers.
    pub fn needs_half_headers(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// Largest value of the compute type, as C source (identity of `min`, padding of sorts).
    pub fn max_value_c(self) -> &'static str {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => "__int_as_float(0x7f800000)",
            DType::I64 => "9223372036854775807LL",
            DType::I32 => "2147483647",
            DType::U8 => "255u",
            DType::Bool => "true",
        }
    }

    /// Smallest value of the compute type, as C source (identity of `max`).
    pub fn min_value_c(self) -> &'static str {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => "__int_as_float(0xff800000)",
            DType::I64 => "(-9223372036854775807LL - 1)",
            DType::I32 => "(-2147483647 - 1)",
            DType::U8 => "0u",
            DType::Bool => "false",
        }
    }

    /// Short lowercase name used in kernel names, errors and tables.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A host-side scalar operand of an element-wise op, converted to the kernel's compute type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Float(f64),
    Int(i64),
    Bool(bool),
}

impl Scalar {
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Float(v) => v,
            Scalar::Int(v) => v as f64,
            Scalar::Bool(v) => f64::from(u8::from(v)),
        }
    }

    pub fn as_i64(self) -> i64 {
        match self {
            Scalar::Float(v) => v as i64,
            Scalar::Int(v) => v,
            Scalar::Bool(v) => i64::from(v),
        }
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}

impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::Float(f64::from(v))
    }
}

impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}

impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::Int(i64::from(v))
    }
}

impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_storage_types() {
        let sizes: Vec<usize> = DType::ALL.iter().map(|d| d.size_in_bytes()).collect();
        assert_eq!(sizes, vec![4, 2, 2, 8, 4, 1, 1]);
    }

    #[test]
    fn half_types_widen_to_float() {
        assert_eq!(DType::BF16.load_expr("p[i]"), "__bfloat162float(p[i])");
        assert_eq!(
            DType::F16.store_expr("v"),
            "__float2half((float)(v))".to_string()
        );
        assert_eq!(DType::Bool.store_expr("x"), "((unsigned char)((x) != 0))");
    }

    #[test]
    fn scalars_convert_both_ways() {
        assert_eq!(Scalar::from(2.75f64).as_i64(), 2);
        assert_eq!(Scalar::from(3i32).as_f64(), 3.0);
        assert_eq!(Scalar::from(true).as_i64(), 1);
    }
}
