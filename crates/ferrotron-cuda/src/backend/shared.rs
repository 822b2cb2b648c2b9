//! Ops that are the same for float, int and bool tensors (all are `CudaTensor`): transfers,
//! views, copies into views (cat, slice-assign, repeat), selection by mask.
//!
//! Views never launch a kernel. Writers (cat, slice-assign) allocate a fresh output and copy
//! into strided views of it, so no input buffer another tensor can see is ever written: an
//! autodiff graph may still hold any input. The one exception is slice-assign into a tensor
//! whose buffer nothing else holds (autodiff's slice backward assigns into fresh zeros): it
//! writes in place, since copying a buffer no one else can read is a wasted pass.

use burn::tensor::{Shape, Slice, TensorData};

use super::convert::{self, ok};
use crate::engine::dtype::{DType, Scalar};
use crate::engine::layout::{Layout, SliceArg};
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::prim::{elementwise, index};

use super::GpuDevice;

pub(crate) fn from_data(data: TensorData, device: &GpuDevice) -> CudaTensor {
    ok(convert::upload(data, &device.engine()))
}

pub(crate) fn into_data(tensor: CudaTensor) -> Result<TensorData> {
    convert::download(&tensor)
}

pub(crate) fn device(tensor: &CudaTensor) -> GpuDevice {
    GpuDevice::new(tensor.device().ordinal())
}

/// Moves a tensor to another GPU through the host (rare: parameters between ranks go through
/// NCCL, not here).
pub(crate) fn to_device(tensor: CudaTensor, target: &GpuDevice) -> CudaTensor {
    if tensor.device().ordinal() == target.ordinal {
        return tensor;
    }
    let data = ok(convert::download(&tensor));
    from_data(data, target)
}

pub(crate) fn empty(shape: Shape, dtype: DType, device: &GpuDevice) -> CudaTensor {
    ok(CudaTensor::empty(&device.engine(), &shape, dtype))
}

pub(crate) fn full(shape: Shape, value: Scalar, dtype: DType, device: &GpuDevice) -> CudaTensor {
    ok(elementwise::full(&device.engine(), &shape, value, dtype))
}

pub(crate) fn reshape(tensor: CudaTensor, shape: Shape) -> CudaTensor {
    ok(tensor.reshape(&shape))
}

pub(crate) fn permute(tensor: CudaTensor, axes: &[usize]) -> CudaTensor {
    ok(tensor.permute(axes))
}

pub(crate) fn swap_dims(tensor: CudaTensor, a: usize, b: usize) -> CudaTensor {
    ok(tensor.swap_dims(a, b))
}

pub(crate) fn flip(tensor: CudaTensor, axes: &[usize]) -> CudaTensor {
    ok(tensor.flip(axes))
}

pub(crate) fn expand(tensor: CudaTensor, shape: Shape) -> CudaTensor {
    ok(tensor.expand(&shape))
}

pub(crate) fn slice(tensor: CudaTensor, slices: &[Slice]) -> CudaTensor {
    let args = ok(convert::slice_args(slices, tensor.shape()));
    ok(tensor.slice(&args))
}

/// `tensor` with `value` written over the sliced region: in place when no other tensor shares
/// `tensor`'s buffer (the slice backward's fresh zeros), else into a fresh copy.
pub(crate) fn slice_assign(tensor: CudaTensor, slices: &[Slice], value: CudaTensor) -> CudaTensor {
    let args = ok(convert::slice_args(slices, tensor.shape()));
    if tensor.is_exclusive() && tensor.is_contiguous() && tensor.dtype() == value.dtype() {
        ok(elementwise::copy_into(&ok(tensor.slice(&args)), &value));
        return tensor;
    }
    ok(index::slice_assign(&tensor, &args, &value))
}

pub(crate) fn cat(tensors: Vec<CudaTensor>, dim: usize) -> CudaTensor {
    ok(index::cat(&tensors, dim))
}

pub(crate) fn repeat_dim(tensor: CudaTensor, dim: usize, times: usize) -> CudaTensor {
    ok(index::repeat_dim(&tensor, dim, times))
}

/// The first `k` entries along `dim` (a view), e.g. of a descending argsort for top-k.
pub(crate) fn first_k(tensor: CudaTensor, dim: usize, k: usize) -> CudaTensor {
    let mut ranges: Vec<SliceArg> = tensor.shape().iter().map(|&s| SliceArg::full(s)).collect();
    if let Some(range) = ranges.get_mut(dim) {
        range.end = k.min(range.end);
    }
    ok(tensor.slice(&ranges))
}

/// Sliding windows along `dim` as a view: shape `[pre.., windows, post.., size]` (the layout
/// burn-flex and PyTorch return).
pub(crate) fn unfold(tensor: CudaTensor, dim: usize, size: usize, step: usize) -> CudaTensor {
    ok(unfold_layout(tensor.layout(), dim, size, step).map(|l| tensor.with_layout(l)))
}

pub(crate) fn unfold_layout(
    layout: &Layout,
    dim: usize,
    size: usize,
    step: usize,
) -> Result<Layout> {
    let ctx = || OpContext::new("unfold").shape(&layout.shape);
    if dim >= layout.rank() || size == 0 || step == 0 || layout.shape[dim] < size {
        return Err(CudaError::invalid(
            ctx(),
            format!("window {size} step {step} on dim {dim} does not fit"),
        ));
    }
    let windows = (layout.shape[dim] - size) / step + 1;
    let mut shape = layout.shape.clone();
    let mut strides = layout.strides.clone();
    shape[dim] = windows;
    strides[dim] = layout.strides[dim] * step as isize;
    shape.push(size);
    strides.push(layout.strides[dim]);
    Ok(Layout {
        shape,
        strides,
        offset: layout.offset,
    })
}

/// `value` where `mask`, else `tensor` (burn's mask_where).
pub(crate) fn mask_where(tensor: CudaTensor, mask: CudaTensor, value: CudaTensor) -> CudaTensor {
    ok(elementwise::where_(&mask, &value, &tensor))
}

pub(crate) fn mask_fill(tensor: CudaTensor, mask: CudaTensor, value: Scalar) -> CudaTensor {
    ok(elementwise::mask_fill(&tensor, &mask, value))
}

pub(crate) fn cast(tensor: CudaTensor, dtype: DType) -> CudaTensor {
    ok(tensor.cast(dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfold_is_a_strided_view_with_the_window_last() {
        let l = Layout::contiguous(&[2, 10, 3]);
        let u = unfold_layout(&l, 1, 4, 3).unwrap();
        assert_eq!(u.shape, vec![2, 3, 3, 4]);
        assert_eq!(u.strides, vec![30, 9, 1, 3]);
        assert!(unfold_layout(&l, 1, 11, 1).is_err());
        assert!(unfold_layout(&l, 3, 1, 1).is_err());
    }
}
