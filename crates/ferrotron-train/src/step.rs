//! One optimizer step on one rank: forward and backward over the rank's microbatches with the
//! gradients accumulated (each microbatch's loss divided by their count, so the sum is the mean
//! over the global batch), then the global gradient norm, the finiteness guard, clipping, AdamW
//! and, for MoE with expert bias, the load-balancing bias update.
//!
//! Everything it touches is rank-local; the parallel layouts add their collectives (gradient
//! all-reduce, pipeline send/receive) around these same calls.

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::cast::ToElement;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_model::{ExpertLoads, GptModel};
use ferrotron_parallel::ParallelOps;

use crate::{AdamW, TrainError, clip_coefficient, global_grad_norm};

/// Token ids of one microbatch: `batch` samples of `seq_length + 1` tokens, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Microbatch {
    pub batch: usize,
    pub seq_length: usize,
    samples: Vec<u32>,
}

impl Microbatch {
    /// Build from samples of `seq_length + 1` tokens each (the label shift's extra token).
    pub fn from_samples(samples: &[Vec<u32>], seq_length: usize) -> Result<Self, TrainError> {
        let mut flat = Vec::with_capacity(samples.len() * (seq_length + 1));
        for (i, sample) in samples.iter().enumerate() {
            if sample.len() != seq_length + 1 {
                return Err(TrainError::Config(format!(
                    "sample {i} has {} tokens; expected seq_length + 1 = {}",
                    sample.len(),
                    seq_length + 1
                )));
            }
            flat.extend_from_slice(sample);
        }
        Ok(Microbatch {
            batch: samples.len(),
            seq_length,
            samples: flat,
        })
    }

    /// `[batch, seq]` inputs and `[batch, seq]` next-token labels.
    pub fn tensors<B: Backend>(
        &self,
        device: &B::Device,
    ) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
        let width = self.seq_length + 1;
        let mut inputs = Vec::with_capacity(self.batch * self.seq_length);
        let mut labels = Vec::with_capacity(self.batch * self.seq_length);
        for row in self.samples.chunks_exact(width) {
            inputs.extend(row[..self.seq_length].iter().map(|&t| i64::from(t)));
            labels.extend(row[1..].iter().map(|&t| i64::from(t)));
        }
        let shape = [self.batch, self.seq_length];
        (
            Tensor::from_data(TensorData::new(inputs, shape), device),
            Tensor::from_data(TensorData::new(labels, shape), device),
        )
    }

    pub fn tokens(&self) -> usize {
        self.batch * self.seq_length
    }
}

/// What one step measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Mean over microbatches of the objective (language-model loss + MoE auxiliary losses).
    pub loss: f64,
    /// Mean over microbatches of the language-model cross-entropy alone.
    pub lm_loss: f64,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// Factor the gradients were scaled by (1 when not clipped).
    pub clip_coefficient: f64,
    pub lr: f64,
}

/// The rank-local inputs of a step besides model and optimizer.
#[derive(Debug, Clone, Copy)]
pub struct StepContext {
    /// 1-based iteration being computed (for the RNG seed and error messages).
    pub iteration: u64,
    pub seed: u64,
    pub lr: f64,
    /// Global-norm clip; 0 disables clipping.
    pub clip_grad: f64,
}

/// Run one optimizer step. On a non-finite loss or gradient norm nothing is applied: the error
/// names the iteration and the value, and the caller stops without saving.
pub fn train_step<B: AutodiffBackend + ParallelOps>(
    model: GptModel<B>,
    optimizer: &mut AdamW<B::InnerBackend>,
    microbatches: &[Microbatch],
    context: StepContext,
    device: &B::Device,
) -> Result<(GptModel<B>, StepStats), TrainError> {
    if microbatches.is_empty() {
        return Err(TrainError::Config(
            "a step needs at least one microbatch".into(),
        ));
    }
    // Dropout (the only randomness in a step) depends on nothing but seed and iteration.
    crate::rng::with_process_rng(|| B::seed(device, context.seed ^ context.iteration));
    let scale = 1.0 / microbatches.len() as f64;
    let mut accumulator = GradientsAccumulator::<GptModel<B>>::new();
    let mut loads = ExpertLoads::default();
    let mut loss_sum = 0.0;
    let mut lm_loss_sum = 0.0;
    for microbatch in microbatches {
        let (inputs, labels) = microbatch.tensors::<B>(device);
        let output = model.loss(inputs, labels);
        loss_sum += output.loss.clone().into_scalar().to_f64();
        lm_loss_sum += output.lm_loss.into_scalar().to_f64();
        loads.accumulate(&output.expert_loads);
        let gradients = output.loss.mul_scalar(scale).backward();
        // 16-bit parameters' gradients are summed over microbatches in fp32 (mixed precision).
        let gradients =
            crate::precision::grads_to_fp32(&model, GradientsParams::from_grads(gradients, &model));
        accumulator.accumulate(&model, gradients);
    }
    let loss = loss_sum * scale;
    let lm_loss = lm_loss_sum * scale;
    if !loss.is_finite() {
        return Err(TrainError::NonFinite {
            iteration: context.iteration,
            what: "the loss",
            value: loss,
        });
    }
    let grads = accumulator.grads();
    let grad_norm = global_grad_norm::<B, _>(&model, &grads);
    if !grad_norm.is_finite() {
        return Err(TrainError::NonFinite {
            iteration: context.iteration,
            what: "the gradient norm",
            value: grad_norm,
        });
    }
    let clip = clip_coefficient(grad_norm, context.clip_grad);
    let mut model = optimizer.step(model, grads, context.lr, clip);
    if !model.expert_biases().is_empty() {
        model = model.update_expert_bias(&loads)?;
    }
    Ok((
        model,
        StepStats {
            loss,
            lm_loss,
            grad_norm,
            clip_coefficient: clip,
            lr: context.lr,
        },
    ))
}

/// Mean language-model loss of `model` (without autodiff: no dropout, no graph) over batches.
pub fn evaluate<B: Backend + ParallelOps>(
    model: &GptModel<B>,
    microbatches: &[Microbatch],
    device: &B::Device,
) -> f64 {
    if microbatches.is_empty() {
        return f64::NAN;
    }
    let total: f64 = microbatches
        .iter()
        .map(|microbatch| {
            let (inputs, labels) = microbatch.tensors::<B>(device);
            model.loss(inputs, labels).lm_loss.into_scalar().to_f64()
        })
        .sum();
    total / microbatches.len() as f64
}
