//! [`FusedOps`] for burn-flex, the CPU backend: kernels where the composed ops cost most.
//!
//! burn-flex runs element-wise ops one thread at a time and allocates every result, so on the
//! quick-start model the softmax cross-entropy over the 50,304-word vocabulary, the AdamW
//! update of the tied embedding and the allocation of the output layer's logits took most of a
//! step however many threads the run had; once those ran on every core, what stayed on one
//! thread was the layers' composed LayerNorm, attention and GELU (dozens of small passes each),
//! the embedding's dense gradient and the gradient norm. The kernels here (`loss.rs`,
//! `logits.rs`, `adamw.rs`, `norm.rs`, `attention.rs`, `gelu.rs`, `embedding.rs`, `squares.rs`)
//! run on the rayon pool the run sizes (`runtime.threads`), split work into pieces fixed by the
//! shapes alone and reduce them in a fixed order, so results do not depend on the thread count,
//! and fall back to the composed defaults for inputs they do not take (16-bit dtypes, dropout
//! inside attention).
//!
//! [`FusedOps`]: crate::FusedOps

mod adamw;
mod attention;
pub(crate) mod bf16_bits;
mod embedding;
mod exp;
mod gelu;
mod host_adamw;
mod logits;
mod loss;
mod norm;
mod squares;

pub use host_adamw::{HostAdamW, HostMoment, HostOldValues, HostRounded};

use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, IntTensor};

use crate::kernel_or_composed;
use crate::op::adamw::{
    AdamWStep, AdamWTensors, DeviceScale, composed_adamw, composed_sum_of_squares,
};
use crate::op::embedding::composed_embedding;
use crate::op::gelu::composed_gelu;
use crate::op::loss::CrossEntropySaved;
use crate::op::norm::{NormGrads, NormSaved, NormSpec, NormStats};
use crate::op::qkv::composed_qkv_attention;
use crate::op::tied_loss::{TiedCrossEntropySaved, TiedState};
use crate::{AttentionSaved, AttentionSpec, FusedOps};

impl FusedOps for Flex {
    fn fused_qkv_attention(qkv: FloatTensor<Self>, spec: AttentionSpec) -> FloatTensor<Self> {
        // Without autodiff nothing draws dropout, so the kernel serves every spec here.
        let forward_only = AttentionSpec {
            dropout: 0.0,
            ..spec
        };
        if attention::supports(&qkv, &forward_only) {
            attention::forward(qkv, &forward_only).output
        } else {
            composed_qkv_attention::<Self>(qkv, spec)
        }
    }

    fn has_qkv_attention_kernel(qkv: &FloatTensor<Self>, spec: &AttentionSpec) -> bool {
        attention::supports(qkv, spec)
    }

    fn qkv_attention_kernel_forward(
        qkv: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> AttentionSaved<Self> {
        attention::forward(qkv, &spec)
    }

    fn qkv_attention_kernel_backward(
        qkv: FloatTensor<Self>,
        saved: AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> FloatTensor<Self> {
        attention::backward(qkv, saved, grad_output, &spec)
    }

    fn has_norm_kernel(x: &FloatTensor<Self>, gamma: &FloatTensor<Self>, _: &NormSpec) -> bool {
        norm::supports(x, gamma)
    }

    fn norm_kernel_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        spec: NormSpec,
    ) -> NormSaved<Self> {
        norm::forward(x, gamma, beta, spec)
    }

    fn norm_kernel_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        has_beta: bool,
        stats: NormStats<Self>,
        grad_output: FloatTensor<Self>,
        into: Option<FloatTensor<Self>>,
    ) -> NormGrads<Self> {
        norm::backward(x, gamma, has_beta, stats, grad_output, into)
    }

    fn fused_embedding(weight: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        kernel_or_composed!(
            embedding::supports(&weight),
            embedding::forward,
            composed_embedding::<Self>,
            (weight, indices)
        )
    }

    fn has_embedding_kernel(weight: &FloatTensor<Self>) -> bool {
        embedding::supports(weight)
    }

    fn embedding_kernel_forward(
        weight: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        embedding::forward(weight, indices)
    }

    fn embedding_kernel_backward(
        indices: IntTensor<Self>,
        grad: FloatTensor<Self>,
        vocab: usize,
        into: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        embedding::backward(indices, grad, vocab, into)
    }

    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        kernel_or_composed!(
            gelu::supports(&x),
            gelu::forward,
            composed_gelu::<Self>,
            (x)
        )
    }

    fn has_gelu_kernel(x: &FloatTensor<Self>) -> bool {
        gelu::supports(x)
    }

    fn gelu_kernel_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        gelu::forward(x)
    }

    fn gelu_kernel_backward(
        x: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        gelu::backward(x, grad_output)
    }

    fn sum_of_squares(x: FloatTensor<Self>) -> FloatTensor<Self> {
        kernel_or_composed!(
            squares::supports(&x),
            squares::sum_of_squares,
            composed_sum_of_squares::<Self>,
            (x)
        )
    }

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

    fn has_tied_cross_entropy_kernel(
        rows: &FloatTensor<Self>,
        embedding: &FloatTensor<Self>,
    ) -> bool {
        logits::supports(rows, embedding)
    }

    fn tied_cross_entropy_kernel_forward(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> TiedCrossEntropySaved<Self> {
        let logits = logits::forward(&rows, &embedding);
        let (losses, log_sum_exp) = loss::forward(&logits, labels);
        TiedCrossEntropySaved {
            losses,
            logits,
            log_sum_exp,
        }
    }

    fn tied_cross_entropy_kernel_backward(
        rows: FloatTensor<Self>,
        embedding: FloatTensor<Self>,
        saved: TiedState<Self>,
        grad_losses: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [n, vocab] = saved.logits.layout().shape().dims();
        let row_loss = logits::RowLoss {
            labels: loss::label_indices(saved.labels, n, vocab),
            log_sum_exp: loss::floats(saved.log_sum_exp),
            grad: loss::floats(grad_losses),
        };
        logits::backward_from_loss(&rows, &embedding, &saved.logits, &row_loss)
    }

    fn adamw_step(
        value: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        step: AdamWStep,
        device_scale: DeviceScale<Self>,
    ) -> AdamWTensors<Self> {
        kernel_or_composed!(
            adamw::supports(
                &value,
                &grad,
                moments.as_ref(),
                &step,
                device_scale.as_ref(),
            ),
            adamw::step,
            composed_adamw::<Self>,
            (value, grad, moments, step, device_scale)
        )
    }
}
