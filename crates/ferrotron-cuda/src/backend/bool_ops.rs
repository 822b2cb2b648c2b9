//! `BoolTensorOps` for [`Cuda`]: bools are one byte holding 0 or 1 (burn's `Bool(U8)` store),
//! so every shape op is the shared one and only logic and "or"-scatters are bool-specific.

use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::{BoolTensor, BoolTensorOps, FloatTensor, IntTensor};
use burn::tensor::{BoolDType, FloatDType, IntDType, Scalar, Shape, Slice, TensorData};

use super::convert::{self, ok, scalar};
use super::{Cuda, GpuDevice, shared};
use crate::engine::dtype::{DType, Scalar as EScalar};
use crate::engine::tensor::CudaTensor;
use crate::kernels::prim::elementwise::{self as ew, BinaryOp, CompareOp, UnaryOp};
use crate::kernels::prim::index::{self, ScatterReduce};
use crate::kernels::prim::reduce::{self, ReduceOp};

fn bool_binary(a: CudaTensor, b: CudaTensor, op: BinaryOp) -> CudaTensor {
    ok(ew::binary(&a, &b, op))
}

impl BoolTensorOps<Cuda> for Cuda {
    fn bool_empty(shape: Shape, device: &GpuDevice, _dtype: BoolDType) -> BoolTensor<Cuda> {
        shared::empty(shape, DType::Bool, device)
    }

    fn bool_zeros(shape: Shape, device: &GpuDevice, _dtype: BoolDType) -> BoolTensor<Cuda> {
        shared::full(shape, EScalar::Bool(false), DType::Bool, device)
    }

    fn bool_ones(shape: Shape, device: &GpuDevice, _dtype: BoolDType) -> BoolTensor<Cuda> {
        shared::full(shape, EScalar::Bool(true), DType::Bool, device)
    }

    async fn bool_into_data(tensor: BoolTensor<Cuda>) -> Result<TensorData, ExecutionError> {
        shared::into_data(tensor).map_err(|err| ExecutionError::WithContext {
            reason: err.to_string(),
        })
    }

    fn bool_from_data(data: TensorData, device: &GpuDevice) -> BoolTensor<Cuda> {
        // Bool data may arrive as bools or as 0/1 bytes; either way it is stored as Bool.
        let tensor = shared::from_data(data, device);
        if tensor.dtype() == DType::Bool {
            tensor
        } else {
            ok(ew::compare_scalar(&tensor, EScalar::Int(0), CompareOp::Ne))
        }
    }

    fn bool_into_int(tensor: BoolTensor<Cuda>, out_dtype: IntDType) -> IntTensor<Cuda> {
        shared::cast(tensor, convert::int_dtype(out_dtype))
    }

    fn bool_into_float(tensor: BoolTensor<Cuda>, out_dtype: FloatDType) -> FloatTensor<Cuda> {
        shared::cast(tensor, convert::float_dtype(out_dtype))
    }

    fn bool_device(tensor: &BoolTensor<Cuda>) -> GpuDevice {
        shared::device(tensor)
    }

    fn bool_to_device(tensor: BoolTensor<Cuda>, device: &GpuDevice) -> BoolTensor<Cuda> {
        shared::to_device(tensor, device)
    }

    fn bool_reshape(tensor: BoolTensor<Cuda>, shape: Shape) -> BoolTensor<Cuda> {
        shared::reshape(tensor, shape)
    }

    fn bool_slice(tensor: BoolTensor<Cuda>, slices: &[Slice]) -> BoolTensor<Cuda> {
        shared::slice(tensor, slices)
    }

    fn bool_slice_assign(
        tensor: BoolTensor<Cuda>,
        slices: &[Slice],
        value: BoolTensor<Cuda>,
    ) -> BoolTensor<Cuda> {
        shared::slice_assign(tensor, slices, value)
    }

    fn bool_mask_where(
        tensor: BoolTensor<Cuda>,
        mask: BoolTensor<Cuda>,
        value: BoolTensor<Cuda>,
    ) -> BoolTensor<Cuda> {
        shared::mask_where(tensor, mask, value)
    }

    fn bool_mask_fill(
        tensor: BoolTensor<Cuda>,
        mask: BoolTensor<Cuda>,
        value: Scalar,
    ) -> BoolTensor<Cuda> {
        shared::mask_fill(tensor, mask, scalar(value))
    }

    fn bool_gather(
        dim: usize,
        tensor: BoolTensor<Cuda>,
        indices: IntTensor<Cuda>,
    ) -> BoolTensor<Cuda> {
        ok(index::gather(&tensor, dim, &indices))
    }

    fn bool_scatter_or(
        dim: usize,
        tensor: BoolTensor<Cuda>,
        indices: IntTensor<Cuda>,
        value: BoolTensor<Cuda>,
    ) -> BoolTensor<Cuda> {
        ok(index::scatter(
            &tensor,
            dim,
            &indices,
            &value,
            ScatterReduce::Or,
        ))
    }

    fn bool_select(
        tensor: BoolTensor<Cuda>,
        dim: usize,
        indices: IntTensor<Cuda>,
    ) -> BoolTensor<Cuda> {
        ok(index::select(&tensor, dim, &indices))
    }

    fn bool_select_or(
        tensor: BoolTensor<Cuda>,
        dim: usize,
        indices: IntTensor<Cuda>,
        value: BoolTensor<Cuda>,
    ) -> BoolTensor<Cuda> {
        ok(index::select_assign(
            &tensor,
            dim,
            &indices,
            &value,
            ScatterReduce::Or,
        ))
    }

    fn bool_repeat_dim(tensor: BoolTensor<Cuda>, dim: usize, times: usize) -> BoolTensor<Cuda> {
        shared::repeat_dim(tensor, dim, times)
    }

    fn bool_cat(tensors: Vec<BoolTensor<Cuda>>, dim: usize) -> BoolTensor<Cuda> {
        shared::cat(tensors, dim)
    }

    fn bool_equal(lhs: BoolTensor<Cuda>, rhs: BoolTensor<Cuda>) -> BoolTensor<Cuda> {
        ok(ew::compare(&lhs, &rhs, CompareOp::Eq))
    }

    fn bool_not_equal(lhs: BoolTensor<Cuda>, rhs: BoolTensor<Cuda>) -> BoolTensor<Cuda> {
        ok(ew::compare(&lhs, &rhs, CompareOp::Ne))
    }

    fn bool_equal_elem(lhs: BoolTensor<Cuda>, rhs: Scalar) -> BoolTensor<Cuda> {
        ok(ew::compare_scalar(&lhs, scalar(rhs), CompareOp::Eq))
    }

    fn bool_not_equal_elem(lhs: BoolTensor<Cuda>, rhs: Scalar) -> BoolTensor<Cuda> {
        ok(ew::compare_scalar(&lhs, scalar(rhs), CompareOp::Ne))
    }

    fn bool_not(tensor: BoolTensor<Cuda>) -> BoolTensor<Cuda> {
        ok(ew::unary(&tensor, UnaryOp::Not))
    }

    fn bool_and(lhs: BoolTensor<Cuda>, rhs: BoolTensor<Cuda>) -> BoolTensor<Cuda> {
        bool_binary(lhs, rhs, BinaryOp::And)
    }

    fn bool_or(lhs: BoolTensor<Cuda>, rhs: BoolTensor<Cuda>) -> BoolTensor<Cuda> {
        bool_binary(lhs, rhs, BinaryOp::Or)
    }

    fn bool_xor(lhs: BoolTensor<Cuda>, rhs: BoolTensor<Cuda>) -> BoolTensor<Cuda> {
        bool_binary(lhs, rhs, BinaryOp::Xor)
    }

    fn bool_swap_dims(tensor: BoolTensor<Cuda>, dim1: usize, dim2: usize) -> BoolTensor<Cuda> {
        shared::swap_dims(tensor, dim1, dim2)
    }

    fn bool_permute(tensor: BoolTensor<Cuda>, axes: &[usize]) -> BoolTensor<Cuda> {
        shared::permute(tensor, axes)
    }

    fn bool_flip(tensor: BoolTensor<Cuda>, axes: &[usize]) -> BoolTensor<Cuda> {
        shared::flip(tensor, axes)
    }

    fn bool_any(tensor: BoolTensor<Cuda>) -> BoolTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::Any))
    }

    fn bool_any_dim(tensor: BoolTensor<Cuda>, dim: usize) -> BoolTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::Any))
    }

    fn bool_all(tensor: BoolTensor<Cuda>) -> BoolTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::All))
    }

    fn bool_all_dim(tensor: BoolTensor<Cuda>, dim: usize) -> BoolTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::All))
    }

    fn bool_expand(tensor: BoolTensor<Cuda>, shape: Shape) -> BoolTensor<Cuda> {
        shared::expand(tensor, shape)
    }

    fn bool_unfold(
        tensor: BoolTensor<Cuda>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> BoolTensor<Cuda> {
        shared::unfold(tensor, dim, size, step)
    }
}
