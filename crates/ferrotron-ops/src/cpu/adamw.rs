//! One parameter's AdamW update on burn-flex in a single pass: the tensors' buffers handed to
//! [`HostAdamW`], the offloaded optimizer's update of host slices.
//!
//! Composed, an update is about fifteen single-threaded passes over parameter-sized buffers,
//! each allocating its result; for the quick start's tied 50,304 × 64 embedding that is a
//! quarter of a gigabyte of memory traffic a step. Here each chunk of the parameter, its
//! gradient and its moments is read once and written once, chunks in parallel, in place where
//! nothing else holds the buffers.
//!
//! The arithmetic is the composed update's, operation for operation, with every scalar rounded
//! to f32 first as burn-flex rounds a scalar operand: the results are bit-identical to
//! [`composed_adamw`] and do not depend on the thread count.
//!
//! It also takes what a mixed-precision step hands it (a 16-bit gradient, bf16 moments under the
//! precision-aware optimizer, the 16-bit copy of the new value): the CPU rarely trains in those,
//! but the offloaded optimizer (`optimizer_cpu_offload`) runs every update of a GPU run here,
//! where the composed update's single-threaded passes would cost an 8B model minutes a step.
//!
//! [`composed_adamw`]: crate::composed_adamw

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape, TensorMetadata, bf16, f16};

use super::host_adamw::{HostAdamW, HostMoment, HostOldValues, HostRounded};
use crate::op::adamw::{AdamWStep, AdamWTensors};
use crate::op::host_pass::HostValues;

/// Whether the kernel takes these tensors: an f32 value and device factor, a gradient of any
/// float dtype the model trains in, moments stored as the step says (f32 or bf16), and a
/// 16-bit rounded copy or none.
pub(super) fn supports(
    value: &FlexTensor,
    grad: &FlexTensor,
    moments: Option<&(FlexTensor, FlexTensor)>,
    step: &AdamWStep,
    device_scale: Option<&FlexTensor>,
) -> bool {
    let f32s = |t: &FlexTensor| t.dtype() == DType::F32;
    let [m_dtype, v_dtype] = step.moment_dtypes;
    let stored = |dtype: DType| matches!(dtype, DType::F32 | DType::BF16);
    f32s(value)
        && matches!(grad.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && stored(m_dtype)
        && stored(v_dtype)
        && moments.is_none_or(|(m, v)| m.dtype() == m_dtype && v.dtype() == v_dtype)
        && matches!(step.rounded, None | Some(DType::BF16 | DType::F16))
        && device_scale.is_none_or(f32s)
}

/// The update (see [`supports`] for what it takes) of the tensors' buffers by
/// [`HostAdamW::update`]: in place where nothing else holds a buffer, else out of place from it.
pub(super) fn step(
    value: FlexTensor,
    grad: FlexTensor,
    moments: Option<(FlexTensor, FlexTensor)>,
    step: AdamWStep,
    device_scale: Option<FlexTensor>,
) -> AdamWTensors<burn::backend::Flex> {
    let len = value.shape().num_elements();
    let device_scale = device_scale.map(|s| {
        s.into_data()
            .to_vec::<f32>()
            .expect("the device gradient factor is f32")[0]
    });
    let grad = grad.to_contiguous();
    assert_eq!(
        grad.shape().num_elements(),
        len,
        "AdamW: gradient and parameter differ in size"
    );
    let (mut value, value_from) = writable(value);
    let first = moments.is_none();
    let [m_dtype, v_dtype] = step.moment_dtypes;
    let ((mut exp_avg, m_from), (mut exp_avg_sq, v_from)) = match moments {
        Some((m, v)) => (writable(m), writable(v)),
        None => ((zeros(len, m_dtype), None), (zeros(len, v_dtype), None)),
    };
    let mut rounded = step.rounded.map(|dtype| zeros(len, dtype));
    let old = HostOldValues {
        master: value_from.as_ref().map(FlexTensor::storage::<f32>),
        exp_avg: m_from.as_ref().map(values),
        exp_avg_sq: v_from.as_ref().map(values),
    };
    HostAdamW::new(&step, device_scale, first).update(
        value.storage_mut::<f32>(),
        moment(&mut exp_avg),
        moment(&mut exp_avg_sq),
        values(&grad),
        old,
        rounded.as_mut().map(|r| match r.dtype() {
            DType::BF16 => HostRounded::Bf16(r.storage_mut::<bf16>()),
            DType::F16 => HostRounded::F16(r.storage_mut::<f16>()),
            dtype => unreachable!("a rounded copy in {dtype:?} is not supported"),
        }),
    );
    AdamWTensors {
        value,
        exp_avg,
        exp_avg_sq,
        rounded,
    }
}

fn values(tensor: &FlexTensor) -> HostValues<'_> {
    match tensor.dtype() {
        DType::F32 => HostValues::F32(tensor.storage::<f32>()),
        DType::BF16 => HostValues::Bf16(tensor.storage::<bf16>()),
        DType::F16 => HostValues::F16(tensor.storage::<f16>()),
        dtype => unreachable!("values of {dtype:?} are not supported"),
    }
}

fn moment(tensor: &mut FlexTensor) -> HostMoment<'_> {
    match tensor.dtype() {
        DType::F32 => HostMoment::F32(tensor.storage_mut::<f32>()),
        DType::BF16 => HostMoment::Bf16(tensor.storage_mut::<bf16>()),
        dtype => unreachable!("moments stored as {dtype:?} are not supported"),
    }
}

/// A flat buffer this call may write, and the buffer to read the old values from when that is
/// another: the tensor itself when it is whole, contiguous and held nowhere else; a new buffer
/// read from the tensor chunk by chunk when it is shared (a checkpoint's snapshot holds it:
/// copying it first, as copy-on-write would, is one more pass over the state on the update's
/// thread); else a contiguous copy.
fn writable(tensor: FlexTensor) -> (FlexTensor, Option<FlexTensor>) {
    let len = tensor.shape().num_elements();
    let whole = tensor.layout().contiguous_offsets() == Some((0, len))
        && tensor.bytes().len() == len * tensor.dtype().size();
    if !whole {
        (tensor.to_contiguous(), None)
    } else if tensor.is_unique() {
        (tensor, None)
    } else {
        (zeros(len, tensor.dtype()), Some(tensor))
    }
}

fn zeros(len: usize, dtype: DType) -> FlexTensor {
    FlexTensor::zeros(Shape::new([len]), dtype)
}
