//! One parameter's AdamW update as a [`FusedOps`] op.
//!
//! Written with burn ops, an update is about fifteen element-wise passes over fp32 buffers the
//! size of the parameter, each allocating its output: on the GPU the optimizer step of a 1.3B
//! model then costs as much as a layer's forward. A kernel reads the parameter, its gradient
//! and both moments once and writes the three results once. The composed default is the
//! arithmetic the optimizer had before the op existed, so CPU numbers do not move.
//!
//! [`FusedOps`]: crate::FusedOps

use crate::primitive::{unwrap, wrap};
use burn::tensor::DType;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// The scalars of one update of one parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// The decoupled weight-decay factor `1 − lr·wd`, `None` for a parameter that does not decay.
    pub decay: Option<f64>,
    /// `1 − β₁ᵗ` and `1 − β₂ᵗ`.
    pub bias_correction1: f64,
    pub bias_correction2: f64,
    /// Factor on the gradient first (the clipping coefficient); exactly 1 skips it.
    pub grad_scale: f64,
    /// The parameter's own 16-bit dtype, whose rounded copy of the new value the update also
    /// writes (the model's weight after the step); `None` for an fp32 parameter.
    pub rounded: Option<DType>,
    /// How the two moments are stored (Megatron's `--exp-avg-dtype`, `--exp-avg-sq-dtype`):
    /// the update reads them widened to f32, computes in f32 (the new value from the unrounded
    /// moments, as TransformerEngine's `FusedAdam` does) and writes them back in these dtypes.
    pub moment_dtypes: [DType; 2],
}

/// Moments kept in f32, what every optimizer had before the precision-aware one.
pub const F32_MOMENTS: [DType; 2] = [DType::F32, DType::F32];

/// A gradient factor that lives on the device (`[1]`, f32): the clipping coefficient of a step
/// whose host never read the gradient norm. Applied after [`AdamWStep::grad_scale`].
pub type DeviceScale<B> = Option<FloatTensor<B>>;

/// A parameter's fp32 value (flat) and its two moments, before or after an update.
#[derive(Debug, Clone)]
pub struct AdamWTensors<B: Backend> {
    pub value: FloatTensor<B>,
    pub exp_avg: FloatTensor<B>,
    pub exp_avg_sq: FloatTensor<B>,
    /// The new value in [`AdamWStep::rounded`]'s dtype, when asked for.
    pub rounded: Option<FloatTensor<B>>,
}

/// `g ← g·s`; `m ← β₁m + (1−β₁)g`; `v ← β₂v + (1−β₂)g²` (from zero on the first step);
/// `p ← p·(1 − lr·wd)`; `p ← p − lr·(m/(1−β₁ᵗ)) / (sqrt(v/(1−β₂ᵗ)) + ε)`, in burn ops.
pub fn composed_adamw<B: Backend>(
    value: FloatTensor<B>,
    grad: FloatTensor<B>,
    moments: Option<(FloatTensor<B>, FloatTensor<B>)>,
    step: AdamWStep,
    device_scale: DeviceScale<B>,
) -> AdamWTensors<B> {
    let mut value = wrap::<B, 1>(value);
    let mut grad = wrap::<B, 1>(grad).cast(DType::F32);
    if step.grad_scale != 1.0 {
        grad = grad.mul_scalar(step.grad_scale);
    }
    if let Some(scale) = device_scale {
        grad = grad * wrap::<B, 1>(scale);
    }
    // a cast to the dtype a tensor has is the tensor itself (burn's `cast`), so f32 moments
    // go through the arithmetic they always had
    let widened = |moment: FloatTensor<B>| wrap::<B, 1>(moment).cast(DType::F32);
    let (exp_avg, exp_avg_sq) = match moments {
        Some((exp_avg, exp_avg_sq)) => (
            widened(exp_avg).mul_scalar(step.beta1) + grad.clone().mul_scalar(1.0 - step.beta1),
            widened(exp_avg_sq).mul_scalar(step.beta2) + grad.square().mul_scalar(1.0 - step.beta2),
        ),
        None => (
            grad.clone().mul_scalar(1.0 - step.beta1),
            grad.square().mul_scalar(1.0 - step.beta2),
        ),
    };
    if let Some(decay) = step.decay {
        value = value.mul_scalar(decay);
    }
    let m_hat = exp_avg.clone().div_scalar(step.bias_correction1);
    let v_hat = exp_avg_sq.clone().div_scalar(step.bias_correction2);
    let update = m_hat.div(v_hat.sqrt().add_scalar(step.eps));
    value = value - update.mul_scalar(step.lr);
    let [exp_avg_dtype, exp_avg_sq_dtype] = step.moment_dtypes;
    AdamWTensors {
        rounded: step.rounded.map(|dtype| unwrap(value.clone().cast(dtype))),
        value: unwrap(value),
        exp_avg: unwrap(exp_avg.cast(exp_avg_dtype)),
        exp_avg_sq: unwrap(exp_avg_sq.cast(exp_avg_sq_dtype)),
    }
}

/// `Σ x²` of a gradient as `[1]` f32, the global norm's share of one parameter: widened to
/// f32 first, so a 16-bit gradient is summed as exactly as an fp32 one (and an fp32 one goes
/// through the arithmetic the norm always had).
pub fn composed_sum_of_squares<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    unwrap(wrap::<B, 1>(x).cast(DType::F32).square().sum())
}
