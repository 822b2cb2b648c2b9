//! `IntTensorOps` for [`Cuda`]. Ints default to i64 (token ids, indices); i32 and u8 are kept
//! when asked for by dtype.

use std::ops::Range;

use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor, IntTensorOps};
use burn::tensor::{
    BoolDType, Distribution, FloatDType, IntDType, Scalar, Shape, Slice, TensorData,
};

use super::convert::{self, ok, scalar};
use super::{Cuda, GpuDevice, shared};
use crate::engine::tensor::CudaTensor;
use crate::kernels::prim::elementwise::{self as ew, BinaryOp, CompareOp, UnaryOp};
use crate::kernels::prim::index::{self, ScatterReduce};
use crate::kernels::prim::reduce::{self, ArgOp, ReduceOp};
use crate::kernels::prim::scan::{self, ScanOp};
use crate::kernels::prim::sort;

fn binary(a: CudaTensor, b: CudaTensor, op: BinaryOp) -> CudaTensor {
    ok(ew::binary(&a, &b, op))
}

fn binary_scalar(a: CudaTensor, s: Scalar, op: BinaryOp) -> CudaTensor {
    ok(ew::binary_scalar(&a, scalar(s), op))
}

fn compare(a: CudaTensor, b: CudaTensor, op: CompareOp) -> CudaTensor {
    ok(ew::compare(&a, &b, op))
}

fn compare_scalar(a: CudaTensor, s: Scalar, op: CompareOp) -> CudaTensor {
    ok(ew::compare_scalar(&a, scalar(s), op))
}

impl IntTensorOps<Cuda> for Cuda {
    fn int_empty(shape: Shape, device: &GpuDevice, dtype: IntDType) -> IntTensor<Cuda> {
        shared::empty(shape, convert::int_dtype(dtype), device)
    }

    async fn int_into_data(tensor: IntTensor<Cuda>) -> Result<TensorData, ExecutionError> {
        shared::into_data(tensor).map_err(|err| ExecutionError::WithContext {
            reason: err.to_string(),
        })
    }

    fn int_from_data(data: TensorData, device: &GpuDevice) -> IntTensor<Cuda> {
        shared::from_data(data, device)
    }

    fn int_device(tensor: &IntTensor<Cuda>) -> GpuDevice {
        shared::device(tensor)
    }

    fn int_to_device(tensor: IntTensor<Cuda>, device: &GpuDevice) -> IntTensor<Cuda> {
        shared::to_device(tensor, device)
    }

    fn int_reshape(tensor: IntTensor<Cuda>, shape: Shape) -> IntTensor<Cuda> {
        shared::reshape(tensor, shape)
    }

    fn int_slice(tensor: IntTensor<Cuda>, slices: &[Slice]) -> IntTensor<Cuda> {
        shared::slice(tensor, slices)
    }

    fn int_slice_assign(
        tensor: IntTensor<Cuda>,
        slices: &[Slice],
        value: IntTensor<Cuda>,
    ) -> IntTensor<Cuda> {
        shared::slice_assign(tensor, slices, value)
    }

    fn int_into_float(tensor: IntTensor<Cuda>, out_dtype: FloatDType) -> FloatTensor<Cuda> {
        shared::cast(tensor, convert::float_dtype(out_dtype))
    }

    fn int_mask_where(
        tensor: IntTensor<Cuda>,
        mask: BoolTensor<Cuda>,
        value: IntTensor<Cuda>,
    ) -> IntTensor<Cuda> {
        shared::mask_where(tensor, mask, value)
    }

    fn int_mask_fill(
        tensor: IntTensor<Cuda>,
        mask: BoolTensor<Cuda>,
        value: Scalar,
    ) -> IntTensor<Cuda> {
        shared::mask_fill(tensor, mask, scalar(value))
    }

    fn int_gather(
        dim: usize,
        tensor: IntTensor<Cuda>,
        indices: IntTensor<Cuda>,
    ) -> IntTensor<Cuda> {
        ok(index::gather(&tensor, dim, &indices))
    }

    fn int_scatter_add(
        dim: usize,
        tensor: IntTensor<Cuda>,
        indices: IntTensor<Cuda>,
        value: IntTensor<Cuda>,
    ) -> IntTensor<Cuda> {
        ok(index::scatter(
            &tensor,
            dim,
            &indices,
            &value,
            ScatterReduce::Add,
        ))
    }

    fn int_select(
        tensor: IntTensor<Cuda>,
        dim: usize,
        indices: IntTensor<Cuda>,
    ) -> IntTensor<Cuda> {
        ok(index::select(&tensor, dim, &indices))
    }

    fn int_select_add(
        tensor: IntTensor<Cuda>,
        dim: usize,
        indices: IntTensor<Cuda>,
        value: IntTensor<Cuda>,
    ) -> IntTensor<Cuda> {
        ok(index::select_assign(
            &tensor,
            dim,
            &indices,
            &value,
            ScatterReduce::Add,
        ))
    }

    fn int_repeat_dim(tensor: IntTensor<Cuda>, dim: usize, times: usize) -> IntTensor<Cuda> {
        shared::repeat_dim(tensor, dim, times)
    }

    fn int_cat(tensors: Vec<IntTensor<Cuda>>, dim: usize) -> IntTensor<Cuda> {
        shared::cat(tensors, dim)
    }

    fn int_equal(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>, _out: BoolDType) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Eq)
    }

    fn int_not_equal(
        lhs: IntTensor<Cuda>,
        rhs: IntTensor<Cuda>,
        _out: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Ne)
    }

    fn int_equal_elem(lhs: IntTensor<Cuda>, rhs: Scalar, _out: BoolDType) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Eq)
    }

    fn int_not_equal_elem(lhs: IntTensor<Cuda>, rhs: Scalar, _out: BoolDType) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Ne)
    }

    fn int_greater(
        lhs: IntTensor<Cuda>,
        rhs: IntTensor<Cuda>,
        _out: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Gt)
    }

    fn int_greater_elem(lhs: IntTensor<Cuda>, rhs: Scalar, _out: BoolDType) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Gt)
    }

    fn int_greater_equal(
        lhs: IntTensor<Cuda>,
        rhs: IntTensor<Cuda>,
        _out: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Ge)
    }

    fn int_greater_equal_elem(
        lhs: IntTensor<Cuda>,
        rhs: Scalar,
        _out: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Ge)
    }

    fn int_lower(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>, _out: BoolDType) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Lt)
    }

    fn int_lower_elem(lhs: IntTensor<Cuda>, rhs: Scalar, _out: BoolDType) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Lt)
    }

    fn int_lower_equal(
        lhs: IntTensor<Cuda>,
        rhs: IntTensor<Cuda>,
        _out: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Le)
    }

    fn int_lower_equal_elem(
        lhs: IntTensor<Cuda>,
        rhs: Scalar,
        _out: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Le)
    }

    fn int_add(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Add)
    }

    fn int_add_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Add)
    }

    fn int_powi(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Pow)
    }

    fn int_powi_scalar_impl(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Pow)
    }

    fn int_clamp_min(tensor: IntTensor<Cuda>, min: Scalar) -> IntTensor<Cuda> {
        ok(ew::clamp(&tensor, Some(scalar(min)), None))
    }

    fn int_clamp_max(tensor: IntTensor<Cuda>, max: Scalar) -> IntTensor<Cuda> {
        ok(ew::clamp(&tensor, None, Some(scalar(max))))
    }

    fn int_clamp(tensor: IntTensor<Cuda>, min: Scalar, max: Scalar) -> IntTensor<Cuda> {
        ok(ew::clamp(&tensor, Some(scalar(min)), Some(scalar(max))))
    }

    fn int_sub(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Sub)
    }

    fn int_sub_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Sub)
    }

    fn int_mul(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Mul)
    }

    fn int_mul_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Mul)
    }

    fn int_div(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Div)
    }

    fn int_div_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Div)
    }

    fn int_remainder(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Rem)
    }

    fn int_remainder_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Rem)
    }

    fn int_matmul(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        super::matmul::int_matmul(lhs, rhs)
    }

    fn int_neg(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(ew::unary(&tensor, UnaryOp::Neg))
    }

    fn int_zeros(shape: Shape, device: &GpuDevice, dtype: IntDType) -> IntTensor<Cuda> {
        shared::full(shape, 0i64.into(), convert::int_dtype(dtype), device)
    }

    fn int_ones(shape: Shape, device: &GpuDevice, dtype: IntDType) -> IntTensor<Cuda> {
        shared::full(shape, 1i64.into(), convert::int_dtype(dtype), device)
    }

    fn int_full(
        shape: Shape,
        fill_value: Scalar,
        device: &GpuDevice,
        dtype: IntDType,
    ) -> IntTensor<Cuda> {
        shared::full(shape, scalar(fill_value), convert::int_dtype(dtype), device)
    }

    fn int_sum(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::Sum))
    }

    fn int_sum_dim(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::Sum))
    }

    fn int_prod(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::Prod))
    }

    fn int_prod_dim(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::Prod))
    }

    fn int_mean(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::Mean))
    }

    fn int_mean_dim(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::Mean))
    }

    fn int_max(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::Max))
    }

    fn int_max_dim(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::Max))
    }

    fn int_min(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::Min))
    }

    fn int_min_dim(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::Min))
    }

    fn int_max_abs(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::MaxAbs))
    }

    fn int_max_abs_dim(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::MaxAbs))
    }

    fn int_any(tensor: IntTensor<Cuda>, _out: BoolDType) -> BoolTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::Any))
    }

    fn int_any_dim(tensor: IntTensor<Cuda>, dim: usize, _out: BoolDType) -> BoolTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::Any))
    }

    fn int_all(tensor: IntTensor<Cuda>, _out: BoolDType) -> BoolTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, ReduceOp::All))
    }

    fn int_all_dim(tensor: IntTensor<Cuda>, dim: usize, _out: BoolDType) -> BoolTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, ReduceOp::All))
    }

    fn int_cumsum(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(scan::cumulative(&tensor, dim, ScanOp::Sum))
    }

    fn int_cumprod(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(scan::cumulative(&tensor, dim, ScanOp::Prod))
    }

    fn int_cummin(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(scan::cumulative(&tensor, dim, ScanOp::Min))
    }

    fn int_cummax(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(scan::cumulative(&tensor, dim, ScanOp::Max))
    }

    fn int_argmax(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(reduce::arg_reduce_dim(&tensor, dim, ArgOp::ArgMax))
    }

    fn int_argmin(tensor: IntTensor<Cuda>, dim: usize) -> IntTensor<Cuda> {
        ok(reduce::arg_reduce_dim(&tensor, dim, ArgOp::ArgMin))
    }

    fn int_argtopk(tensor: IntTensor<Cuda>, dim: usize, k: usize) -> IntTensor<Cuda> {
        shared::first_k(ok(sort::argsort(&tensor, dim, true)), dim, k)
    }

    fn int_sort(tensor: IntTensor<Cuda>, dim: usize, descending: bool) -> IntTensor<Cuda> {
        ok(sort::sort(&tensor, dim, descending))
    }

    fn int_sort_with_indices(
        tensor: IntTensor<Cuda>,
        dim: usize,
        descending: bool,
    ) -> (IntTensor<Cuda>, IntTensor<Cuda>) {
        ok(sort::sort_with_indices(&tensor, dim, descending))
    }

    fn int_argsort(tensor: IntTensor<Cuda>, dim: usize, descending: bool) -> IntTensor<Cuda> {
        ok(sort::argsort(&tensor, dim, descending))
    }

    fn int_abs(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(ew::unary(&tensor, UnaryOp::Abs))
    }

    fn int_sign(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(ew::unary(&tensor, UnaryOp::Sign))
    }

    fn int_swap_dims(tensor: IntTensor<Cuda>, dim1: usize, dim2: usize) -> IntTensor<Cuda> {
        shared::swap_dims(tensor, dim1, dim2)
    }

    fn int_permute(tensor: IntTensor<Cuda>, axes: &[usize]) -> IntTensor<Cuda> {
        shared::permute(tensor, axes)
    }

    fn int_flip(tensor: IntTensor<Cuda>, axes: &[usize]) -> IntTensor<Cuda> {
        shared::flip(tensor, axes)
    }

    fn int_random(
        shape: Shape,
        distribution: Distribution,
        device: &GpuDevice,
        dtype: IntDType,
    ) -> IntTensor<Cuda> {
        ok(crate::kernels::prim::random::random(
            &device.engine(),
            &shape,
            convert::distribution(distribution),
            convert::int_dtype(dtype),
        ))
    }

    fn int_arange_step(
        range: Range<i64>,
        step: usize,
        device: &GpuDevice,
        dtype: IntDType,
    ) -> IntTensor<Cuda> {
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        ok(ew::arange(
            &device.engine(),
            range.start,
            range.end,
            step,
            convert::int_dtype(dtype),
        ))
    }

    fn int_arange(range: Range<i64>, device: &GpuDevice, dtype: IntDType) -> IntTensor<Cuda> {
        Self::int_arange_step(range, 1, device, dtype)
    }

    fn int_expand(tensor: IntTensor<Cuda>, shape: Shape) -> IntTensor<Cuda> {
        shared::expand(tensor, shape)
    }

    fn bitwise_and(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::BitAnd)
    }

    fn bitwise_and_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::BitAnd)
    }

    fn bitwise_or(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::BitOr)
    }

    fn bitwise_or_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::BitOr)
    }

    fn bitwise_xor(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::BitXor)
    }

    fn bitwise_xor_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::BitXor)
    }

    fn bitwise_not(tensor: IntTensor<Cuda>) -> IntTensor<Cuda> {
        ok(ew::unary(&tensor, UnaryOp::BitNot))
    }

    fn bitwise_left_shift(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Shl)
    }

    fn bitwise_left_shift_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Shl)
    }

    fn bitwise_right_shift(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Shr)
    }

    fn bitwise_right_shift_scalar(lhs: IntTensor<Cuda>, rhs: Scalar) -> IntTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Shr)
    }

    fn int_cast(tensor: IntTensor<Cuda>, dtype: IntDType) -> IntTensor<Cuda> {
        shared::cast(tensor, convert::int_dtype(dtype))
    }

    fn int_unfold(
        tensor: IntTensor<Cuda>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> IntTensor<Cuda> {
        shared::unfold(tensor, dim, size, step)
    }
}
