//! What NCCL is told about a buffer: its data type and reduction, from either side's element
//! types (the host-slice [`ferrotron_dist::Element`] set and the engine's tensor [`DType`]).
//!
//! Pure mappings, tested without a GPU. Bool tensors move as bytes but cannot be reduced (a sum
//! of 0/1 bytes is not a bool); every other pairing NCCL supports natively.

use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t};
use ferrotron_dist::{DType as WireType, ReduceOp};

use crate::engine::dtype::DType;

/// NCCL's data type for a host-slice element type, with its size in bytes.
pub fn wire_type(dtype: WireType) -> (ncclDataType_t, usize) {
    match dtype {
        WireType::F32 => (ncclDataType_t::ncclFloat32, 4),
        WireType::F64 => (ncclDataType_t::ncclFloat64, 8),
        WireType::Bf16 => (ncclDataType_t::ncclBfloat16, 2),
        WireType::I32 => (ncclDataType_t::ncclInt32, 4),
        WireType::I64 => (ncclDataType_t::ncclInt64, 8),
        WireType::U32 => (ncclDataType_t::ncclUint32, 4),
    }
}

/// NCCL's data type for moving (not reducing) elements of a tensor.
pub fn tensor_type(dtype: DType) -> ncclDataType_t {
    match dtype {
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::F16 => ncclDataType_t::ncclFloat16,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
        DType::I64 => ncclDataType_t::ncclInt64,
        DType::I32 => ncclDataType_t::ncclInt32,
        DType::U8 | DType::Bool => ncclDataType_t::ncclUint8,
    }
}

/// NCCL's data type for reducing a tensor, or why it cannot be reduced.
pub fn reducible_type(dtype: DType) -> Result<ncclDataType_t, String> {
    match dtype {
        DType::Bool => Err("bool tensors can be moved but not reduced".to_owned()),
        other => Ok(tensor_type(other)),
    }
}

pub fn reduce_op(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wire_type_maps_to_an_nccl_type_of_its_own_size() {
        let cases = [
            (WireType::F32, ncclDataType_t::ncclFloat32, size_of::<f32>()),
            (WireType::F64, ncclDataType_t::ncclFloat64, size_of::<f64>()),
            (
                WireType::Bf16,
                ncclDataType_t::ncclBfloat16,
                size_of::<half::bf16>(),
            ),
            (WireType::I32, ncclDataType_t::ncclInt32, size_of::<i32>()),
            (WireType::I64, ncclDataType_t::ncclInt64, size_of::<i64>()),
            (WireType::U32, ncclDataType_t::ncclUint32, size_of::<u32>()),
        ];
        for (wire, nccl, size) in cases {
            assert_eq!(wire_type(wire), (nccl, size), "{wire}");
        }
    }

    #[test]
    fn tensor_types_keep_their_width_and_bool_is_not_reducible() {
        for dtype in DType::ALL {
            let nccl = tensor_type(dtype);
            let width = match nccl {
                ncclDataType_t::ncclFloat32 | ncclDataType_t::ncclInt32 => 4,
                ncclDataType_t::ncclFloat16 | ncclDataType_t::ncclBfloat16 => 2,
                ncclDataType_t::ncclInt64 => 8,
                ncclDataType_t::ncclUint8 => 1,
                other => panic!("{dtype} mapped to {other:?}"),
            };
            assert_eq!(width, dtype.size_in_bytes(), "{dtype}");
        }
        assert_eq!(
            reducible_type(DType::Bool).unwrap_err(),
            "bool tensors can be moved but not reduced"
        );
        assert_eq!(
            reducible_type(DType::BF16),
            Ok(ncclDataType_t::ncclBfloat16)
        );
        assert_eq!(reduce_op(ReduceOp::Max), ncclRedOp_t::ncclMax);
        assert_eq!(reduce_op(ReduceOp::Sum), ncclRedOp_t::ncclSum);
    }
}
