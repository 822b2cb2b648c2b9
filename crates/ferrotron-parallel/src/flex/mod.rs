//! [`FusedOps`] for burn-flex, the CPU backend: kernels where the composed ops cost most.
//!
//! burn-flex runs element-wise ops one thread at a time and allocates every result, so on the
//! quick-start model the softmax cross-entropy over the 50,304-word vocabulary, the AdamW
//! update of the tied embedding and the allocation of the output layer's logits took most of a
//! step however many threads the run had. The
//! kernels here run on the rayon pool the run sizes (`runtime.threads`), split work so results
//! do not depend on the thread count, and fall back to the composed defaults for inputs they do
//! not take (16-bit dtypes, odd layouts).
//!
//! [`FusedOps`]: crate::FusedOps

mod adamw;
mod exp;
mod logits;
mod loss;

use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, IntTensor};

use crate::fused::FusedOps;
use crate::fused_adamw::{AdamWStep, AdamWTensors, DeviceScale, composed_adamw};
use crate::fused_loss::CrossEntropySaved;

impl FusedOps for Flex {
    fn has_cross_entropy_kernel(logits: &FloatTensor<Self>) -> bool {
        loss::supports(logits)
    }

    fn cross_entropy_kernel_forward(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> CrossEntropySaved<Self> {
        let (losses, log_sum_exp) = loss::forward(&logits, labels);
        CrossEntropySaved {
            losses,
            log_sum_exp,
        }
    }

    fn cross_entropy_kernel_backward(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
        log_sum_exp: FloatTensor<Self>,
        grad_losses: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        loss::backward(logits, labels, log_sum_exp, grad_losses)
    }

    fn has_tied_logits_kernel(rows: &FloatTensor<Self>, embedding: &FloatTensor<Self>) -> bool {
        logits::supports(rows, embedding)
    }

    fn tied_logits_kernel_forward(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        logits::forward(&rows, &embedding)
    }

    fn tied_logits_kernel_backward(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        logits::backward(&rows, &embedding, grad)
    }

    fn adamw_step(
        value: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        step: AdamWStep,
        device_scale: DeviceScale<Self>,
    ) -> AdamWTensors<Self> {
        if step.rounded.is_none()
            && adamw::supports(&value, &grad, moments.as_ref(), device_scale.as_ref())
        {
            adamw::step(value, grad, moments, step, device_scale)
        } else {
            composed_adamw::<Self>(value, grad, moments, step, device_scale)
        }
    }
}
