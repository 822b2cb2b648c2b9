//! The step of a rank holding the whole model: forward and backward over the rank's
//! microbatches with each microbatch's gradients gathered into the optimizer's flat buffers
//! (each loss divided by their count, so the sum is the mean over the global batch), then the
//! global gradient norm over those buffers, the finiteness guard, clipping, AdamW and, for MoE
//! with expert bias, the load-balancing bias update.
//!
//! One step serves a rank alone and a rank of pure data parallelism (`replicas`: the buffers,
//! losses and expert loads averaged over the group on the device); what differs by backend is
//! only when the statistics are read ([`StatsRead`]). The host step that kept per-parameter
//! gradients (burn's `GradientsAccumulator`, a per-tensor norm, the per-parameter AdamW) gave
//! the same bits as this one with the host's clipping coefficient — loss, norm, coefficient and
//! weights, fp32 and bf16 on burn-flex, every world of the equivalence tests — so it is gone;
//! its arithmetic is kept as the tests' references (`clip::per_tensor`, [`AdamW::step`]).

use std::cell::RefCell;

use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::cast::ToElement;
use burn::tensor::{DType, Int, Tensor, TensorData};
use ferrotron_model::{ExpertLoads, GptModel};
use ferrotron_parallel::{Comm, ParallelOps, prefetch, recompute};

use crate::optim::adamw::Laid;
use crate::optim::flat_adamw::{FlatGrads, Sum, take_grads};
use crate::run::host_read::read_to_host;
use crate::run::pending::{DeviceValues, PendingStats};
use crate::step::backward::fence_peers;
use crate::step::clip::device_clip_coefficient;
use crate::step::replicas::{BucketReduction, Replicas};
use crate::{AdamW, TrainError, clip_coefficient};

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
pub fn train_step<B>(
    model: GptModel<B>,
    optimizer: &mut AdamW<B::InnerBackend>,
    microbatches: &[Microbatch],
    context: StepContext,
    device: &B::Device,
) -> Result<(GptModel<B>, StepStats), TrainError>
where
    B: crate::TrainBackend,
{
    let (model, stats) = train_step_deferred(model, optimizer, microbatches, context, device)?;
    Ok((model, stats.read()?))
}

/// [`train_step`] whose statistics may be read later. On a backend with a device-resident step
/// ([`FusedOps::device_resident_step`]) the loss, the gradient norm and the clipping
/// coefficient stay on the device and the update is queued without a host read; a non-finite
/// value then surfaces when the statistics are read, after the update was applied, and the
/// caller must stop without saving. Elsewhere they are read before the update
/// ([`StatsRead::BeforeUpdate`]).
///
/// [`FusedOps::device_resident_step`]: ferrotron_ops::FusedOps::device_resident_step
pub(crate) fn train_step_deferred<B>(
    model: GptModel<B>,
    optimizer: &mut AdamW<B::InnerBackend>,
    microbatches: &[Microbatch],
    context: StepContext,
    device: &B::Device,
) -> Result<(GptModel<B>, PendingStats), TrainError>
where
    B: crate::TrainBackend,
{
    if microbatches.is_empty() {
        return Err(TrainError::Config(
            "a step needs at least one microbatch".into(),
        ));
    }
    let read = if B::device_resident_step() {
        StatsRead::Later
    } else {
        StatsRead::BeforeUpdate
    };
    whole_model_step(model, optimizer, microbatches, context, device, None, read)
}

/// When a step's loss and gradient norm are read, which decides how its clipping coefficient
/// is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatsRead {
    /// On the host, before the update (a rank alone on a backend without a device-resident
    /// step): a non-finite loss or norm stops the step before it reaches the optimizer (the
    /// contract of [`train_step`]), and the coefficient is the host's f64 [`clip_coefficient`],
    /// rounded to f32 as the update applies it — the arithmetic of the CPU's golden curves.
    BeforeUpdate,
    /// When the loop reads the queued steps: the coefficient is computed on the device in f32
    /// ([`device_clip_coefficient`]) and nothing waits for the norm.
    Later,
}

/// What the forward and backward passes over a step's microbatches leave besides the
/// gradients: the MoE expert loads and each microbatch's losses, still on the device.
struct Pass<B: AutodiffBackend> {
    loads: ExpertLoads,
    losses: Vec<Tensor<B::InnerBackend, 1>>,
    lm_losses: Vec<Tensor<B::InnerBackend, 1>>,
}

/// What sees a backward's gradients after each of its ranges (`backward::backward_by_range`).
type RangeDone<'a, B> = dyn FnMut(&mut <B as AutodiffBackend>::Gradients) + 'a;

/// Each microbatch's loss divided by their count, so the summed gradient is the mean's; each
/// microbatch's gradients go to `absorb`, which sums them. With `by_range`, the last
/// microbatch's backward is taken layer by layer and `by_range` sees the gradients after each
/// layer (it may take the final ones out; `absorb` gets the rest).
fn forward_backward<B>(
    model: &GptModel<B>,
    microbatches: &[Microbatch],
    context: StepContext,
    device: &B::Device,
    mut by_range: Option<&mut RangeDone<'_, B>>,
    peers: &[&Comm],
    mut absorb: impl FnMut(GradientsParams) -> Result<(), TrainError>,
) -> Result<Pass<B>, TrainError>
where
    B: crate::TrainBackend,
{
    // Dropout (the only randomness in a step) depends on nothing but seed and iteration.
    crate::rng::with_process_rng(|| B::seed(device, context.seed ^ context.iteration));
    let scale = 1.0 / microbatches.len() as f64;
    let mut loads = ExpertLoads::default();
    let mut losses = Vec::with_capacity(microbatches.len());
    let mut lm_losses = Vec::with_capacity(microbatches.len());
    for (index, microbatch) in microbatches.iter().enumerate() {
        let last = index + 1 == microbatches.len();
        let (inputs, labels) = microbatch.tensors::<B>(device);
        let output = match by_range {
            Some(_) if last => model.clone().with_layer_cuts(true).loss(inputs, labels),
            _ => model.loss(inputs, labels),
        };
        let tape = recompute::take::<B>();
        losses.push(output.loss.clone().inner());
        lm_losses.push(output.lm_loss.inner());
        loads.accumulate(&output.expert_loads);
        let mut no_ranges = |_: &mut B::Gradients| {};
        let done: &mut dyn FnMut(&mut B::Gradients) = match by_range.as_mut() {
            Some(by_range) if last => *by_range,
            _ => &mut no_ranges,
        };
        let gradients = crate::step::backward::backward_by_range(
            output.loss.mul_scalar(scale),
            tape,
            model,
            &[],
            model.has_dropout(),
            &mut || fence_peers(peers),
            &mut |grads| {
                done(grads);
                Ok(())
            },
        )?;
        absorb(GradientsParams::from_grads(gradients, model))?;
    }
    Ok(Pass {
        loads,
        losses,
        lm_losses,
    })
}

pub(crate) fn check_finite(
    value: f64,
    iteration: u64,
    what: &'static str,
) -> Result<(), TrainError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(TrainError::NonFinite {
            iteration,
            what,
            value,
        })
    }
}

/// The step of a rank holding the whole model: the gradients are gathered into the optimizer's
/// flat buffers as backward produces them (summed there over microbatches), and norm and update
/// run over those buffers, the clipping coefficient handed to the optimizer as a tensor. With
/// `replicas` (data parallelism with the whole model on every rank, `replicas.rs`) the buffers,
/// the losses and the expert loads are averaged over the group first, on the device. `read`
/// says when the statistics are read ([`StatsRead`]).
pub(crate) fn whole_model_step<B>(
    model: GptModel<B>,
    optimizer: &mut AdamW<B::InnerBackend>,
    microbatches: &[Microbatch],
    context: StepContext,
    device: &B::Device,
    replicas: Option<&Replicas>,
    read: StatsRead,
) -> Result<(GptModel<B>, PendingStats), TrainError>
where
    B: crate::TrainBackend,
{
    let scale = 1.0 / microbatches.len() as f64;
    let overlap = replicas.filter(|r| r.overlap && r.comm.size() > 1);
    let (
        Pass {
            mut loads,
            losses,
            lm_losses,
        },
        flat,
    ) = match overlap {
        None => {
            let mut flat = None;
            let peers: Vec<&Comm> = replicas.iter().map(|r| &r.tensor.comm).collect();
            // One microbatch and no replicas to average with: nothing is added to the buffers.
            let sum = if microbatches.len() == 1 && replicas.is_none() {
                Sum::Alone
            } else {
                Sum::Summed
            };
            let pass = forward_backward(
                &model,
                microbatches,
                context,
                device,
                None,
                &peers,
                |grads| {
                    let into = flat.take();
                    flat = Some(optimizer.gather_flat(
                        &model,
                        grads,
                        into,
                        (Laid::FirstMicrobatch, sum),
                        |grads| {
                            if let Some(replicas) = replicas {
                                replicas.tensor.complete(grads);
                            }
                        },
                    )?);
                    Ok(())
                },
            )?;
            let mut flat = flat.expect("a step has at least one microbatch");
            if let Some(replicas) = replicas {
                flat.buffers = flat
                    .buffers
                    .into_iter()
                    .map(|buffer| replicas.average(replicas.start::<B::InnerBackend>(buffer)))
                    .collect();
            }
            (pass, flat)
        }
        Some(replicas) => overlapped(&model, optimizer, microbatches, context, device, replicas)?,
    };
    let count = losses.len();
    let f32 = |t: Tensor<B::InnerBackend, 1>| t.cast(DType::F32);
    let mut losses = Tensor::cat(losses.into_iter().chain(lm_losses).map(f32).collect(), 0);
    if let Some(replicas) = replicas {
        losses = replicas.mean_tensor(losses);
        replicas.sum_loads(&mut loads)?;
    }
    // the next forward's waits, if one did not reach them all, before the parameters change
    prefetch::settle();
    let mut squares = optimizer.flat_sum_of_squares(&flat, |id| {
        replicas.is_none_or(|replicas| replicas.tensor.counts(id))
    });
    if let Some(replicas) = replicas {
        // every rank's part of Σg², also from a rank that counts none
        squares = replicas.total_squares(squares, &losses.device());
    }
    let mut read_first = None;
    let clip = match read {
        StatsRead::Later => squares
            .as_ref()
            .and_then(|s| device_clip_coefficient(s, context.clip_grad)),
        StatsRead::BeforeUpdate => {
            let stats = read_before_update(&losses, squares.as_ref(), count, context)?;
            let coefficient = (context.clip_grad > 0.0).then(|| {
                Tensor::from_data(
                    TensorData::new(vec![stats.clip_coefficient as f32], [1]),
                    (&losses.device(), DType::F32),
                )
            });
            read_first = Some(stats);
            coefficient
        }
    };
    let mut model =
        optimizer.step_flat(
            model,
            flat,
            context.lr,
            clip.clone(),
            |group, part| match replicas {
                Some(replicas) => replicas.expand(group, part),
                None => part,
            },
        );
    if !model.expert_biases().is_empty() {
        model = model.update_expert_bias(&mut loads)?;
    }
    if let Some(stats) = read_first {
        return Ok((model, PendingStats::ready(stats)));
    }
    let iteration = context.iteration;
    let lr = context.lr;
    let inner_device = losses.device();
    let zero = || Tensor::<B::InnerBackend, 1>::zeros([1], (&inner_device, DType::F32));
    let parts = vec![
        losses,
        squares.map_or_else(zero, |s| s.cast(DType::F32)),
        clip.unwrap_or_else(|| zero().add_scalar(1.0)),
    ];
    let decode = move |values: &[f32]| {
        let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() * scale;
        let loss = mean(&values[..count]);
        let lm_loss = mean(&values[count..2 * count]);
        check_finite(loss, iteration, "the loss")?;
        let grad_norm = f64::from(values[2 * count]).sqrt();
        check_finite(grad_norm, iteration, "the gradient norm")?;
        Ok(StepStats {
            loss,
            lm_loss,
            grad_norm,
            clip_coefficient: f64::from(values[2 * count + 1]),
            lr,
        })
    };
    let values = DeviceValues::new(parts);
    // An offloaded update has waited for the step's device work already (`updates_on_host`).
    let waits = B::device_resident_step() && !optimizer.updates_on_host();
    Ok((model, PendingStats::later(Some(values), decode, waits)))
}

/// A step's statistics read before its update (`[losses…, lm losses…]` of its `count`
/// microbatches, and Σg²), checked: a non-finite loss or norm is the step's error.
fn read_before_update<I: Backend>(
    losses: &Tensor<I, 1>,
    squares: Option<&Tensor<I, 1>>,
    count: usize,
    context: StepContext,
) -> Result<StepStats, TrainError> {
    let mut parts = vec![losses.clone()];
    parts.extend(squares.map(|s| s.clone().cast(DType::F32)));
    let values = read_to_host(|| Tensor::cat(parts, 0).into_data())
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| TrainError::Config(format!("reading the step's statistics: {e:?}")))?;
    let scale = 1.0 / count as f64;
    let mean = |v: &[f32]| v.iter().fold(0.0, |sum, &x| sum + f64::from(x)) * scale;
    let loss = mean(&values[..count]);
    check_finite(loss, context.iteration, "the loss")?;
    let grad_norm = values.get(2 * count).map_or(0.0, |&s| f64::from(s).sqrt());
    check_finite(grad_norm, context.iteration, "the gradient norm")?;
    Ok(StepStats {
        loss,
        lm_loss: mean(&values[count..2 * count]),
        grad_norm,
        clip_coefficient: clip_coefficient(grad_norm, context.clip_grad),
        lr: context.lr,
    })
}

/// The forward and backward passes of a replicated rank whose last microbatch's gradients are
/// reduced bucket by bucket during its backward (`replicas.rs`); the step's averaged buffers.
fn overlapped<B>(
    model: &GptModel<B>,
    optimizer: &mut AdamW<B::InnerBackend>,
    microbatches: &[Microbatch],
    context: StepContext,
    device: &B::Device,
    replicas: &Replicas,
) -> Result<(Pass<B>, FlatGrads<B::InnerBackend>), TrainError>
where
    B: crate::TrainBackend,
{
    let layout = optimizer.flat_layout_of(model).clone();
    let earlier = RefCell::new(None);
    let reduction = RefCell::new(None);
    let start = || BucketReduction::new(replicas, &layout, model, earlier.borrow_mut().take());
    let mut by_range = |grads: &mut B::Gradients| {
        reduction
            .borrow_mut()
            .get_or_insert_with(start)
            .range_done(grads);
    };
    let mut reduced = None;
    let mut seen = 0;
    let pass = forward_backward(
        model,
        microbatches,
        context,
        device,
        Some(&mut by_range),
        &[&replicas.tensor.comm],
        |grads| {
            seen += 1;
            if seen < microbatches.len() {
                let sum = earlier.borrow_mut().take();
                let gathered = optimizer.gather_flat(
                    model,
                    grads,
                    sum,
                    (Laid::FirstMicrobatch, Sum::Summed),
                    |grads| {
                        replicas.tensor.complete(grads);
                    },
                )?;
                *earlier.borrow_mut() = Some(gathered);
            } else {
                let reduction = reduction.borrow_mut().take().unwrap_or_else(start);
                // `finish` sums the partial ones over the tensor-parallel group, bucket by bucket
                let rest = take_grads::<B, _>(model, grads).grads;
                reduced = Some(reduction.finish(rest));
            }
            Ok(())
        },
    )?;
    let reduced = reduced.expect("a step has at least one microbatch");
    Ok((pass, reduced))
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
            read_to_host(|| model.loss(inputs, labels).lm_loss.into_scalar().to_f64())
        })
        .sum();
    total / microbatches.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AdamWConfig, CpuBackend, CpuTrainBackend};
    use ferrotron_model::ModelConfig;

    type B = CpuTrainBackend;
    const SEQ: usize = 8;

    fn model() -> (GptModel<B>, AdamW<CpuBackend>) {
        let device = Default::default();
        <B as Backend>::seed(&device, 3);
        let section: ferrotron_recipe::Model = serde_json::from_value(serde_json::json!({
            "num_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "seq_length": SEQ,
            "vocab_size": 64, "hidden_dropout": 0.1, "attention_dropout": 0.1
        }))
        .expect("model section parses");
        let model: GptModel<B> = ModelConfig::from_model(&section, 128)
            .expect("valid tiny model")
            .init(&device);
        let config = AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            moment_dtypes: ferrotron_ops::F32_MOMENTS,
            main_grads_dtype: burn::tensor::DType::F32,
            offload_fraction: None,
        };
        let optimizer = AdamW::new(config, model.no_weight_decay_params());
        (model, optimizer)
    }

    fn batches(iteration: u64) -> Vec<Microbatch> {
        (0..2u64)
            .map(|m| {
                let samples: Vec<Vec<u32>> = (0..2u64)
                    .map(|s| {
                        (0..=SEQ as u64)
                            .map(|t| ((iteration * 31 + m * 17 + s * 7 + t * 3) % 64) as u32)
                            .collect()
                    })
                    .collect();
                Microbatch::from_samples(&samples, SEQ).expect("well-formed samples")
            })
            .collect()
    }

    fn context(iteration: u64, clip_grad: f64) -> StepContext {
        StepContext {
            iteration,
            seed: 11,
            lr: if clip_grad.is_nan() { f64::NAN } else { 3e-3 },
            clip_grad: if clip_grad.is_nan() { 1.0 } else { clip_grad },
        }
    }

    /// Four steps each way; the statistics of every step, read only after the last one.
    fn curves(device_resident: bool, clip_grad: f64) -> Vec<StepStats> {
        let device = Default::default();
        let (mut model, mut optimizer) = model();
        let mut pending = Vec::new();
        for iteration in 1..=4 {
            let (next, stats) = if device_resident {
                whole_model_step(
                    model,
                    &mut optimizer,
                    &batches(iteration),
                    context(iteration, clip_grad),
                    &device,
                    None,
                    StatsRead::Later,
                )
            } else {
                train_step_deferred(
                    model,
                    &mut optimizer,
                    &batches(iteration),
                    context(iteration, clip_grad),
                    &device,
                )
            }
            .expect("step");
            model = next;
            pending.push(stats);
        }
        pending
            .into_iter()
            .map(|p| p.read().expect("finite"))
            .collect()
    }

    #[test]
    fn device_resident_step_gives_the_host_steps_numbers() {
        // Without clipping (coefficient exactly 1 either way) the two paths are bit-identical.
        let host = curves(false, 1e6);
        let device = curves(true, 1e6);
        assert_eq!(host, device);
        // Clipping on: the f32 coefficient on the device is the f64 one to rounding.
        let host = curves(false, 0.05);
        let device = curves(true, 0.05);
        assert!(host[0].clip_coefficient < 1.0, "the test must clip");
        for (h, d) in host.iter().zip(&device) {
            assert!((h.loss - d.loss).abs() < 1e-5, "{h:?} vs {d:?}");
            assert!((h.clip_coefficient - d.clip_coefficient).abs() < 1e-6);
        }
    }

    #[test]
    fn a_non_finite_device_resident_step_is_reported_when_read() {
        let device = Default::default();
        let (model, mut optimizer) = model();
        let (model, first) = whole_model_step(
            model,
            &mut optimizer,
            &batches(1),
            context(1, 1.0),
            &device,
            None,
            StatsRead::Later,
        )
        .expect("queued");
        // A NaN learning rate poisons every weight: step 2's loss is NaN.
        let (model, _) = whole_model_step(
            model,
            &mut optimizer,
            &batches(2),
            context(2, f64::NAN),
            &device,
            None,
            StatsRead::Later,
        )
        .expect("queued");
        let (_, third) = whole_model_step(
            model,
            &mut optimizer,
            &batches(3),
            context(3, 1.0),
            &device,
            None,
            StatsRead::Later,
        )
        .expect("queued: the host has not looked");
        assert!(first.read().is_ok());
        match third.read() {
            Err(TrainError::NonFinite { iteration, .. }) => assert_eq!(iteration, 3),
            other => panic!("expected a non-finite error, got {other:?}"),
        }
    }
}
