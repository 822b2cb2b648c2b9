//! `FloatTensorOps` for [`Cuda`]: each method is one engine call (or a short composition of
//! them, named where it happens).

use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::{BoolTensor, FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{
    BoolDType, Distribution, FloatDType, IntDType, Scalar, Shape, Slice, TensorData,
};

use super::convert::{self, ok, scalar};
use super::{Cuda, GpuDevice, shared};
use crate::engine::tensor::CudaTensor;
use crate::kernels::prim::elementwise::{self as ew, BinaryOp, CompareOp, UnaryOp};
use crate::kernels::prim::index::{self, ScatterReduce};
use crate::kernels::prim::scan::{self, ScanOp};
use crate::kernels::prim::{reduce, sort};

fn unary(t: CudaTensor, op: UnaryOp) -> CudaTensor {
    ok(ew::unary(&t, op))
}

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

impl FloatTensorOps<Cuda> for Cuda {
    fn float_from_data(data: TensorData, device: &GpuDevice) -> FloatTensor<Cuda> {
        shared::from_data(data, device)
    }

    fn float_random(
        shape: Shape,
        distribution: Distribution,
        device: &GpuDevice,
        dtype: FloatDType,
    ) -> FloatTensor<Cuda> {
        ok(crate::kernels::prim::random::random(
            &device.engine(),
            &shape,
            convert::distribution(distribution),
            convert::float_dtype(dtype),
        ))
    }

    fn float_zeros(shape: Shape, device: &GpuDevice, dtype: FloatDType) -> FloatTensor<Cuda> {
        shared::full(shape, 0.0.into(), convert::float_dtype(dtype), device)
    }

    fn float_ones(shape: Shape, device: &GpuDevice, dtype: FloatDType) -> FloatTensor<Cuda> {
        shared::full(shape, 1.0.into(), convert::float_dtype(dtype), device)
    }

    fn float_full(
        shape: Shape,
        fill_value: Scalar,
        device: &GpuDevice,
        dtype: FloatDType,
    ) -> FloatTensor<Cuda> {
        shared::full(
            shape,
            scalar(fill_value),
            convert::float_dtype(dtype),
            device,
        )
    }

    async fn float_into_data(tensor: FloatTensor<Cuda>) -> Result<TensorData, ExecutionError> {
        shared::into_data(tensor).map_err(|err| ExecutionError::WithContext {
            reason: err.to_string(),
        })
    }

    fn float_device(tensor: &FloatTensor<Cuda>) -> GpuDevice {
        shared::device(tensor)
    }

    fn float_to_device(tensor: FloatTensor<Cuda>, device: &GpuDevice) -> FloatTensor<Cuda> {
        shared::to_device(tensor, device)
    }

    fn float_into_int(tensor: FloatTensor<Cuda>, out_dtype: IntDType) -> IntTensor<Cuda> {
        shared::cast(tensor, convert::int_dtype(out_dtype))
    }

    fn float_empty(shape: Shape, device: &GpuDevice, dtype: FloatDType) -> FloatTensor<Cuda> {
        shared::empty(shape, convert::float_dtype(dtype), device)
    }

    fn float_repeat_dim(tensor: FloatTensor<Cuda>, dim: usize, times: usize) -> FloatTensor<Cuda> {
        shared::repeat_dim(tensor, dim, times)
    }

    fn float_add(lhs: FloatTensor<Cuda>, rhs: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Add)
    }

    fn float_add_scalar(lhs: FloatTensor<Cuda>, rhs: Scalar) -> FloatTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Add)
    }

    fn float_clamp_min(tensor: FloatTensor<Cuda>, min: Scalar) -> FloatTensor<Cuda> {
        ok(ew::clamp(&tensor, Some(scalar(min)), None))
    }

    fn float_clamp_max(tensor: FloatTensor<Cuda>, max: Scalar) -> FloatTensor<Cuda> {
        ok(ew::clamp(&tensor, None, Some(scalar(max))))
    }

    fn float_clamp(tensor: FloatTensor<Cuda>, min: Scalar, max: Scalar) -> FloatTensor<Cuda> {
        ok(ew::clamp(&tensor, Some(scalar(min)), Some(scalar(max))))
    }

    fn float_sub(lhs: FloatTensor<Cuda>, rhs: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Sub)
    }

    fn float_sub_scalar(lhs: FloatTensor<Cuda>, rhs: Scalar) -> FloatTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Sub)
    }

    fn float_mul(lhs: FloatTensor<Cuda>, rhs: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Mul)
    }

    fn float_mul_scalar(lhs: FloatTensor<Cuda>, rhs: Scalar) -> FloatTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Mul)
    }

    fn float_div(lhs: FloatTensor<Cuda>, rhs: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Div)
    }

    fn float_div_scalar(lhs: FloatTensor<Cuda>, rhs: Scalar) -> FloatTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Div)
    }

    fn float_remainder(lhs: FloatTensor<Cuda>, rhs: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Rem)
    }

    fn float_remainder_scalar(lhs: FloatTensor<Cuda>, rhs: Scalar) -> FloatTensor<Cuda> {
        binary_scalar(lhs, rhs, BinaryOp::Rem)
    }

    fn float_matmul(lhs: FloatTensor<Cuda>, rhs: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(crate::blas::gemm::matmul(&lhs, &rhs))
    }

    fn float_cross(
        lhs: FloatTensor<Cuda>,
        rhs: FloatTensor<Cuda>,
        dim: usize,
    ) -> FloatTensor<Cuda> {
        // a × b = (a1 b2 - a2 b1, a2 b0 - a0 b2, a0 b1 - a1 b0), from rotated views of the
        // size-3 dim: three slices and two products per component, no custom kernel.
        let rotate = |t: &CudaTensor, by: usize| {
            let parts: Vec<CudaTensor> = (0..3)
                .map(|k| {
                    let i = ((k + by) % 3) as isize;
                    shared::slice(t.clone(), &cross_slice(t.rank(), dim, i))
                })
                .collect();
            shared::cat(parts, dim)
        };
        let a1 = rotate(&lhs, 1);
        let a2 = rotate(&lhs, 2);
        let b1 = rotate(&rhs, 1);
        let b2 = rotate(&rhs, 2);
        let left = binary(a1, b2, BinaryOp::Mul);
        let right = binary(a2, b1, BinaryOp::Mul);
        binary(left, right, BinaryOp::Sub)
    }

    fn float_neg(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Neg)
    }

    fn float_recip(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Recip)
    }

    fn float_swap_dims(tensor: FloatTensor<Cuda>, dim1: usize, dim2: usize) -> FloatTensor<Cuda> {
        shared::swap_dims(tensor, dim1, dim2)
    }

    fn float_permute(tensor: FloatTensor<Cuda>, axes: &[usize]) -> FloatTensor<Cuda> {
        shared::permute(tensor, axes)
    }

    fn float_flip(tensor: FloatTensor<Cuda>, axes: &[usize]) -> FloatTensor<Cuda> {
        shared::flip(tensor, axes)
    }

    fn float_reshape(tensor: FloatTensor<Cuda>, shape: Shape) -> FloatTensor<Cuda> {
        shared::reshape(tensor, shape)
    }

    fn float_gather(
        dim: usize,
        tensor: FloatTensor<Cuda>,
        indices: IntTensor<Cuda>,
    ) -> FloatTensor<Cuda> {
        ok(index::gather(&tensor, dim, &indices))
    }

    fn float_scatter_add(
        dim: usize,
        tensor: FloatTensor<Cuda>,
        indices: IntTensor<Cuda>,
        value: FloatTensor<Cuda>,
    ) -> FloatTensor<Cuda> {
        ok(index::scatter(
            &tensor,
            dim,
            &indices,
            &value,
            ScatterReduce::Add,
        ))
    }

    fn float_select(
        tensor: FloatTensor<Cuda>,
        dim: usize,
        indices: IntTensor<Cuda>,
    ) -> FloatTensor<Cuda> {
        ok(index::select(&tensor, dim, &indices))
    }

    fn float_select_add(
        tensor: FloatTensor<Cuda>,
        dim: usize,
        indices: IntTensor<Cuda>,
        value: FloatTensor<Cuda>,
    ) -> FloatTensor<Cuda> {
        ok(index::select_assign(
            &tensor,
            dim,
            &indices,
            &value,
            ScatterReduce::Add,
        ))
    }

    fn float_slice(tensor: FloatTensor<Cuda>, slices: &[Slice]) -> FloatTensor<Cuda> {
        shared::slice(tensor, slices)
    }

    fn float_slice_assign(
        tensor: FloatTensor<Cuda>,
        slices: &[Slice],
        value: FloatTensor<Cuda>,
    ) -> FloatTensor<Cuda> {
        shared::slice_assign(tensor, slices, value)
    }

    fn float_mask_where(
        tensor: FloatTensor<Cuda>,
        mask: BoolTensor<Cuda>,
        value: FloatTensor<Cuda>,
    ) -> FloatTensor<Cuda> {
        shared::mask_where(tensor, mask, value)
    }

    fn float_mask_fill(
        tensor: FloatTensor<Cuda>,
        mask: BoolTensor<Cuda>,
        value: Scalar,
    ) -> FloatTensor<Cuda> {
        shared::mask_fill(tensor, mask, scalar(value))
    }

    fn float_equal(
        lhs: FloatTensor<Cuda>,
        rhs: FloatTensor<Cuda>,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Eq)
    }

    fn float_not_equal(
        lhs: FloatTensor<Cuda>,
        rhs: FloatTensor<Cuda>,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Ne)
    }

    fn float_equal_elem(
        lhs: FloatTensor<Cuda>,
        rhs: Scalar,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Eq)
    }

    fn float_not_equal_elem(
        lhs: FloatTensor<Cuda>,
        rhs: Scalar,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Ne)
    }

    fn float_greater(
        lhs: FloatTensor<Cuda>,
        rhs: FloatTensor<Cuda>,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Gt)
    }

    fn float_greater_elem(
        lhs: FloatTensor<Cuda>,
        rhs: Scalar,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Gt)
    }

    fn float_greater_equal(
        lhs: FloatTensor<Cuda>,
        rhs: FloatTensor<Cuda>,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Ge)
    }

    fn float_greater_equal_elem(
        lhs: FloatTensor<Cuda>,
        rhs: Scalar,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Ge)
    }

    fn float_lower(
        lhs: FloatTensor<Cuda>,
        rhs: FloatTensor<Cuda>,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Lt)
    }

    fn float_lower_elem(
        lhs: FloatTensor<Cuda>,
        rhs: Scalar,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Lt)
    }

    fn float_lower_equal(
        lhs: FloatTensor<Cuda>,
        rhs: FloatTensor<Cuda>,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare(lhs, rhs, CompareOp::Le)
    }

    fn float_lower_equal_elem(
        lhs: FloatTensor<Cuda>,
        rhs: Scalar,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        compare_scalar(lhs, rhs, CompareOp::Le)
    }

    fn float_sum(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, reduce::ReduceOp::Sum))
    }

    fn float_sum_dim(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, reduce::ReduceOp::Sum))
    }

    fn float_prod(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, reduce::ReduceOp::Prod))
    }

    fn float_prod_dim(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, reduce::ReduceOp::Prod))
    }

    fn float_mean(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, reduce::ReduceOp::Mean))
    }

    fn float_mean_dim(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, reduce::ReduceOp::Mean))
    }

    fn float_max(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, reduce::ReduceOp::Max))
    }

    fn float_max_dim(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, reduce::ReduceOp::Max))
    }

    fn float_min(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, reduce::ReduceOp::Min))
    }

    fn float_min_dim(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, reduce::ReduceOp::Min))
    }

    fn float_max_abs(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, reduce::ReduceOp::MaxAbs))
    }

    fn float_max_abs_dim(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, reduce::ReduceOp::MaxAbs))
    }

    fn float_any(tensor: FloatTensor<Cuda>, _out_dtype: BoolDType) -> BoolTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, reduce::ReduceOp::Any))
    }

    fn float_any_dim(
        tensor: FloatTensor<Cuda>,
        dim: usize,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, reduce::ReduceOp::Any))
    }

    fn float_all(tensor: FloatTensor<Cuda>, _out_dtype: BoolDType) -> BoolTensor<Cuda> {
        ok(reduce::reduce_all(&tensor, reduce::ReduceOp::All))
    }

    fn float_all_dim(
        tensor: FloatTensor<Cuda>,
        dim: usize,
        _out_dtype: BoolDType,
    ) -> BoolTensor<Cuda> {
        ok(reduce::reduce_dim(&tensor, dim, reduce::ReduceOp::All))
    }

    fn float_cumsum(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(scan::cumulative(&tensor, dim, ScanOp::Sum))
    }

    fn float_cumprod(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(scan::cumulative(&tensor, dim, ScanOp::Prod))
    }

    fn float_cummin(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(scan::cumulative(&tensor, dim, ScanOp::Min))
    }

    fn float_cummax(tensor: FloatTensor<Cuda>, dim: usize) -> FloatTensor<Cuda> {
        ok(scan::cumulative(&tensor, dim, ScanOp::Max))
    }

    fn float_cast(tensor: FloatTensor<Cuda>, dtype: FloatDType) -> FloatTensor<Cuda> {
        shared::cast(tensor, convert::float_dtype(dtype))
    }

    fn float_exp(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Exp)
    }

    fn float_log(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Log)
    }

    fn float_log1p(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Log1p)
    }

    fn float_powf(lhs: FloatTensor<Cuda>, rhs: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Pow)
    }

    fn float_powf_scalar_impl(tensor: FloatTensor<Cuda>, value: Scalar) -> FloatTensor<Cuda> {
        binary_scalar(tensor, value, BinaryOp::Pow)
    }

    fn float_sqrt(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Sqrt)
    }

    fn float_abs(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Abs)
    }

    fn float_cos(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Cos)
    }

    fn float_sin(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Sin)
    }

    fn float_tan(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Tan)
    }

    fn float_cosh(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Cosh)
    }

    fn float_sinh(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Sinh)
    }

    fn float_tanh(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Tanh)
    }

    fn float_acos(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Acos)
    }

    fn float_acosh(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Acosh)
    }

    fn float_asin(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Asin)
    }

    fn float_asinh(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Asinh)
    }

    fn float_atan(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Atan)
    }

    fn float_atanh(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Atanh)
    }

    fn float_atan2(lhs: FloatTensor<Cuda>, rhs: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        binary(lhs, rhs, BinaryOp::Atan2)
    }

    fn float_round(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Round)
    }

    fn float_floor(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Floor)
    }

    fn float_ceil(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Ceil)
    }

    fn float_trunc(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Trunc)
    }

    fn float_erf(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Erf)
    }

    fn float_sign(tensor: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        unary(tensor, UnaryOp::Sign)
    }

    fn float_is_nan(tensor: FloatTensor<Cuda>, _out_dtype: BoolDType) -> BoolTensor<Cuda> {
        unary(tensor, UnaryOp::IsNan)
    }

    fn float_is_inf(tensor: FloatTensor<Cuda>, _out_dtype: BoolDType) -> BoolTensor<Cuda> {
        unary(tensor, UnaryOp::IsInf)
    }

    fn float_cat(tensors: Vec<FloatTensor<Cuda>>, dim: usize) -> FloatTensor<Cuda> {
        shared::cat(tensors, dim)
    }

    fn float_argmax(tensor: FloatTensor<Cuda>, dim: usize, out_dtype: IntDType) -> IntTensor<Cuda> {
        let indices = ok(reduce::arg_reduce_dim(&tensor, dim, reduce::ArgOp::ArgMax));
        shared::cast(indices, convert::int_dtype(out_dtype))
    }

    fn float_argmin(tensor: FloatTensor<Cuda>, dim: usize, out_dtype: IntDType) -> IntTensor<Cuda> {
        let indices = ok(reduce::arg_reduce_dim(&tensor, dim, reduce::ArgOp::ArgMin));
        shared::cast(indices, convert::int_dtype(out_dtype))
    }

    fn float_argtopk(
        tensor: FloatTensor<Cuda>,
        dim: usize,
        k: usize,
        out_dtype: IntDType,
    ) -> IntTensor<Cuda> {
        let indices = ok(sort::argsort(&tensor, dim, true));
        shared::cast(
            shared::first_k(indices, dim, k),
            convert::int_dtype(out_dtype),
        )
    }

    fn float_sort(tensor: FloatTensor<Cuda>, dim: usize, descending: bool) -> FloatTensor<Cuda> {
        ok(sort::sort(&tensor, dim, descending))
    }

    fn float_sort_with_indices(
        tensor: FloatTensor<Cuda>,
        dim: usize,
        descending: bool,
        indices_dtype: IntDType,
    ) -> (FloatTensor<Cuda>, IntTensor<Cuda>) {
        let (values, indices) = ok(sort::sort_with_indices(&tensor, dim, descending));
        (
            values,
            shared::cast(indices, convert::int_dtype(indices_dtype)),
        )
    }

    fn float_argsort(
        tensor: FloatTensor<Cuda>,
        dim: usize,
        descending: bool,
        out_dtype: IntDType,
    ) -> IntTensor<Cuda> {
        let indices = ok(sort::argsort(&tensor, dim, descending));
        shared::cast(indices, convert::int_dtype(out_dtype))
    }

    fn float_expand(tensor: FloatTensor<Cuda>, shape: Shape) -> FloatTensor<Cuda> {
        shared::expand(tensor, shape)
    }

    fn float_unfold(
        tensor: FloatTensor<Cuda>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> FloatTensor<Cuda> {
        shared::unfold(tensor, dim, size, step)
    }
}

/// Slices selecting component `i` of the size-3 dim `dim` (keeping the dim).
fn cross_slice(rank: usize, dim: usize, i: isize) -> Vec<Slice> {
    (0..rank)
        .map(|d| {
            if d == dim {
                Slice::new(i, Some(i + 1), 1)
            } else {
                Slice::full()
            }
        })
        .collect()
}
