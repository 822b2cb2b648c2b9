//! One parameter's AdamW update on burn-flex in a single pass.
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
//! [`composed_adamw`]: crate::composed_adamw

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, TensorMetadata};
use rayon::prelude::*;

use crate::fused_adamw::{AdamWStep, AdamWTensors};

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// Whether the kernel takes these tensors: f32 value, gradient, moments (stored in f32) and
/// device factor.
pub(super) fn supports(
    value: &FlexTensor,
    grad: &FlexTensor,
    moments: Option<&(FlexTensor, FlexTensor)>,
    step: &AdamWStep,
    device_scale: Option<&FlexTensor>,
) -> bool {
    let f32s = |t: &FlexTensor| t.dtype() == DType::F32;
    step.moment_dtypes == crate::fused_adamw::F32_MOMENTS
        && f32s(value)
        && f32s(grad)
        && moments.is_none_or(|(m, v)| f32s(m) && f32s(v))
        && device_scale.is_none_or(f32s)
}

/// The update (see [`supports`] for what it takes; a parameter that also wants a 16-bit
/// copy, which the CPU never computes in, takes the composed update).
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
    let k = Constants::new(&step, device_scale);
    let grad = grad.to_contiguous();
    let grad = grad.as_slice::<f32>().expect("a contiguous gradient");
    assert_eq!(
        grad.len(),
        len,
        "AdamW: gradient and parameter differ in size"
    );
    let mut value = owned(value);
    let first = moments.is_none();
    let (mut exp_avg, mut exp_avg_sq) = match moments {
        Some((m, v)) => (owned(m), owned(v)),
        None => (zeros(len), zeros(len)),
    };
    value
        .storage_mut::<f32>()
        .par_chunks_mut(CHUNK)
        .zip(exp_avg.storage_mut::<f32>().par_chunks_mut(CHUNK))
        .zip(exp_avg_sq.storage_mut::<f32>().par_chunks_mut(CHUNK))
        .zip(grad.par_chunks(CHUNK))
        .for_each(|(((p, m), v), g)| update(p, m, v, g, &k, first));
    AdamWTensors {
        value,
        exp_avg,
        exp_avg_sq,
        rounded: None,
    }
}

/// The composed update's arithmetic on one chunk.
fn update(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &Constants, first: bool) {
    for (((p, m), v), &g) in p.iter_mut().zip(m).zip(v).zip(g) {
        let mut g = g;
        if let Some(s) = k.grad_scale {
            g *= s;
        }
        if let Some(s) = k.device_scale {
            g *= s;
        }
        if first {
            *m = g * k.one_minus_beta1;
            *v = (g * g) * k.one_minus_beta2;
        } else {
            *m = *m * k.beta1 + g * k.one_minus_beta1;
            *v = *v * k.beta2 + (g * g) * k.one_minus_beta2;
        }
        if let Some(decay) = k.decay {
            *p *= decay;
        }
        let m_hat = *m / k.bias_correction1;
        let v_hat = *v / k.bias_correction2;
        *p -= (m_hat / (v_hat.sqrt() + k.eps)) * k.lr;
    }
}

/// The scalars of one update, rounded to f32.
struct Constants {
    grad_scale: Option<f32>,
    device_scale: Option<f32>,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    decay: Option<f32>,
    bias_correction1: f32,
    bias_correction2: f32,
    eps: f32,
    lr: f32,
}

impl Constants {
    fn new(step: &AdamWStep, device_scale: Option<f32>) -> Self {
        Self {
            grad_scale: (step.grad_scale != 1.0).then_some(step.grad_scale as f32),
            device_scale,
            beta1: step.beta1 as f32,
            one_minus_beta1: (1.0 - step.beta1) as f32,
            beta2: step.beta2 as f32,
            one_minus_beta2: (1.0 - step.beta2) as f32,
            decay: step.decay.map(|d| d as f32),
            bias_correction1: step.bias_correction1 as f32,
            bias_correction2: step.bias_correction2 as f32,
            eps: step.eps as f32,
            lr: step.lr as f32,
        }
    }
}

/// A flat f32 buffer this call may write: the tensor itself when it is whole and contiguous
/// (copied on write if shared), else a contiguous copy.
fn owned(tensor: FlexTensor) -> FlexTensor {
    let len = tensor.shape().num_elements();
    let whole = tensor.layout().contiguous_offsets() == Some((0, len))
        && tensor.bytes().len() == len * size_of::<f32>();
    if whole {
        tensor
    } else {
        tensor.to_contiguous()
    }
}

fn zeros(len: usize) -> FlexTensor {
    FlexTensor::zeros(burn::tensor::Shape::new([len]), DType::F32)
}
