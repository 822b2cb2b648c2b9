//! Runs a stage's schedule for one step on burn tensors: forwards through the local chunks,
//! activations and gradients over the pipeline group, and each chunk's backward through the
//! surrogate `(output · grad_output.detach()).sum() + aux_loss / microbatches`, whose gradient
//! with respect to the chunk's parameters and input is exactly the gradient the one-rank graph
//! would propagate through that chunk. The received activation is a fresh leaf that requires a
//! gradient, so each chunk's graph stops at its input and the input's gradient is what goes
//! upstream. The last chunk differentiates `loss / microbatches`, as the one-rank step does.
//!
//! Each forward runs on the chunk with *private* parameter leaves (same values, fresh autodiff
//! nodes), so every microbatch in flight has a graph of its own. With the shared leaves, burn
//! 0.21 merges all in-flight forwards of a chunk into one graph through them, and its pruning of
//! that merged graph at the end of each backward walks hash sets keyed by node ids. Those ids
//! come from one process-wide counter, so under thread ranks their values — and so the walk —
//! depend on thread timing; about one pp4 × vpp2 run in 30 lost the pending forward of some
//! microbatch and its backward then yielded no gradient at all (no error, a wrong norm).

use std::collections::HashMap;

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::cast::ToElement;
use burn::tensor::{Int, Tensor, TensorPrimitive};
use ferrotron_model::{
    ChunkData, ChunkInput, ChunkOutput, ExpertLoads, GptModel, split_for_context_parallel,
};
use ferrotron_parallel::recompute::{self, Tape};
use ferrotron_parallel::{ParallelContext, ParallelOps};

use super::host::private_leaves;
use super::schedule::{self, Op, StagePosition};
use crate::error::comm_error;
use crate::run::host_read::read_to_host;
use crate::step::backward::{backward_by_range, fence_peers};
use crate::{Microbatch, TrainError};

/// What a stage's step produced besides the gradients (which went to `absorb`).
pub(crate) struct PipelineOutcome<B: AutodiffBackend> {
    /// Each microbatch's objective and LM loss in the order of their forwards, left on the
    /// device (last stage only; empty elsewhere).
    pub losses: Vec<Tensor<B::InnerBackend, 1>>,
    pub lm_losses: Vec<Tensor<B::InnerBackend, 1>>,
    /// Per microbatch, the MoE auxiliary losses of this stage's chunks that hand on hidden
    /// states (their layers' part of the objective, which the last chunk's loss lacks); `None`
    /// where no such chunk runs here.
    pub aux_losses: Vec<Option<Tensor<B::InnerBackend, 1>>>,
    /// Per local chunk: tokens per expert, summed over microbatches.
    pub loads: Vec<ExpertLoads>,
}

enum Forwarded<B: AutodiffBackend> {
    Hidden {
        hidden: Tensor<B, 3>,
        aux_loss: Tensor<B, 1>,
    },
    Loss(Tensor<B, 1>),
}

struct InFlight<B: AutodiffBackend> {
    /// The chunk this forward ran on, with its private parameter leaves.
    chunk: GptModel<B>,
    input: Option<Tensor<B, 3>>,
    output: Forwarded<B>,
    /// Its recomputed ranges, for its backward.
    tape: Tape<B>,
}

/// `[batch, seq]` token ids and their next-token labels.
type TokensAndLabels<B> = (Tensor<B, 2, Int>, Tensor<B, 2, Int>);

/// A microbatch's tokens and labels as this rank sees them (its context-parallel part).
pub(crate) fn rank_tensors<B: burn::tensor::backend::Backend>(
    microbatch: &Microbatch,
    ctx: &ParallelContext,
    device: &B::Device,
) -> Result<TokensAndLabels<B>, TrainError> {
    let (tokens, labels) = microbatch.tensors::<B>(device);
    Ok(split_for_context_parallel(
        tokens,
        labels,
        ctx.cp_rank(),
        ctx.cp_size(),
    )?)
}

/// An activation or gradient from `peer` over the pipeline group (on a GPU with NCCL: device to
/// device, in the run's float dtype; elsewhere through the host as f32).
fn recv<B: ParallelOps>(
    ctx: &ParallelContext,
    shape: [usize; 3],
    peer: usize,
    device: &B::Device,
) -> Result<Tensor<B, 3>, TrainError> {
    let received = B::recv_from(&shape, peer, &ctx.pp, device)
        .map_err(|e| comm_error("pipeline receive", e))?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(received)))
}

fn send<B: ParallelOps>(
    ctx: &ParallelContext,
    values: Tensor<B, 3>,
    peer: usize,
) -> Result<(), TrainError> {
    B::send_to(values.into_primitive().tensor(), peer, &ctx.pp)
        .map_err(|e| comm_error("pipeline send", e))
}

/// What sees a chunk's last backward's gradients after each of its ranges: the chunk's index,
/// the chunk as that forward ran (its private leaves) and the gradients so far.
pub(crate) type ChunkRangeDone<'a, B> =
    dyn FnMut(usize, &GptModel<B>, &mut <B as AutodiffBackend>::Gradients) + 'a;

/// Forward and backward of `microbatches` through `chunks` by the stage's schedule; each
/// backward's parameter gradients (of the loss divided by the microbatch count) go to
/// `absorb` with the index of their chunk, which sums them. With `by_range`, each chunk's last
/// microbatch runs with its layers cut and its backward goes layer by layer
/// (`crate::step::backward::backward_by_range`), `by_range` seeing the gradients after each layer
/// (it may take the final ones out; `absorb` gets the rest).
pub(crate) fn run_step<B>(
    chunks: &[GptModel<B>],
    position: StagePosition,
    ctx: &ParallelContext,
    microbatches: &[Microbatch],
    device: &B::Device,
    mut by_range: Option<&mut ChunkRangeDone<'_, B>>,
    mut absorb: impl FnMut(usize, &GptModel<B>, GradientsParams) -> Result<(), TrainError>,
) -> Result<PipelineOutcome<B>, TrainError>
where
    B: crate::TrainBackend,
{
    let ops = schedule::build(position, microbatches.len())?;
    let scale = 1.0 / microbatches.len() as f64;
    let mut loads = vec![ExpertLoads::default(); chunks.len()];
    let mut received: HashMap<(usize, usize), Tensor<B, 3>> = HashMap::new();
    let mut grads_in: HashMap<(usize, usize), Tensor<B, 3>> = HashMap::new();
    let mut grads_out: HashMap<(usize, usize), Tensor<B, 3>> = HashMap::new();
    let mut in_flight: HashMap<(usize, usize), InFlight<B>> = HashMap::new();
    let (mut losses, mut lm_losses) = (Vec::new(), Vec::new());
    let mut aux_losses: Vec<Option<Tensor<B::InnerBackend, 1>>> = vec![None; microbatches.len()];
    for op in ops {
        match op {
            Op::RecvActivation { chunk, microbatch } => {
                let shape = chunks[chunk].boundary_shape(microbatches[microbatch].batch);
                let input = recv::<B>(ctx, shape, position.previous_stage(), device)?;
                received.insert((chunk, microbatch), input.require_grad());
            }
            Op::RecvGrad { chunk, microbatch } => {
                let shape = chunks[chunk].boundary_shape(microbatches[microbatch].batch);
                let grad = recv::<B>(ctx, shape, position.next_stage(), device)?;
                grads_in.insert((chunk, microbatch), grad);
            }
            Op::SendActivation { chunk, microbatch } => {
                let Some(InFlight {
                    output: Forwarded::Hidden { hidden, .. },
                    ..
                }) = in_flight.get(&(chunk, microbatch))
                else {
                    return Err(schedule_bug("send an activation", chunk, microbatch));
                };
                send(ctx, hidden.clone(), position.next_stage())?;
            }
            Op::SendGrad { chunk, microbatch } => {
                let grad = grads_out
                    .remove(&(chunk, microbatch))
                    .ok_or_else(|| schedule_bug("send a gradient", chunk, microbatch))?;
                send(ctx, grad, position.previous_stage())?;
            }
            Op::Compute(compute) if compute.forward => {
                let key = (compute.chunk, compute.microbatch);
                let microbatch = &microbatches[compute.microbatch];
                let (tokens, labels) = rank_tensors::<B>(microbatch, ctx, device)?;
                let (data, input) = if position.is_first_piece(compute.chunk) {
                    (ChunkData::Tokens(tokens), None)
                } else {
                    let hidden = received
                        .remove(&key)
                        .ok_or_else(|| schedule_bug("forward", key.0, key.1))?;
                    (ChunkData::Hidden(hidden.clone()), Some(hidden))
                };
                let mut chunk_input = ChunkInput {
                    data,
                    labels: None,
                    loss_mask: None,
                };
                if position.is_last_piece(compute.chunk) {
                    chunk_input = chunk_input.with_labels(labels, None);
                }
                let last = compute.microbatch + 1 == microbatches.len();
                let chunk = private_leaves(&chunks[compute.chunk])
                    .with_layer_cuts(last && by_range.is_some());
                let forwarded = chunk.forward_chunk(chunk_input)?;
                let tape = recompute::take::<B>();
                let output = match forwarded {
                    ChunkOutput::Hidden {
                        hidden,
                        aux_loss,
                        expert_loads,
                    } => {
                        loads[compute.chunk].accumulate(&expert_loads);
                        let slot = &mut aux_losses[compute.microbatch];
                        let detached = aux_loss.clone().inner();
                        *slot = Some(match slot.take() {
                            Some(sum) => sum + detached,
                            None => detached,
                        });
                        Forwarded::Hidden { hidden, aux_loss }
                    }
                    ChunkOutput::Loss(loss) => {
                        losses.push(loss.loss.clone().inner());
                        lm_losses.push(loss.lm_loss.inner());
                        loads[compute.chunk].accumulate(&loss.expert_loads);
                        Forwarded::Loss(loss.loss)
                    }
                };
                in_flight.insert(
                    key,
                    InFlight {
                        chunk,
                        input,
                        output,
                        tape,
                    },
                );
            }
            Op::Compute(compute) => {
                let key = (compute.chunk, compute.microbatch);
                let InFlight {
                    chunk,
                    input,
                    output,
                    tape,
                } = in_flight
                    .remove(&key)
                    .ok_or_else(|| schedule_bug("backward", key.0, key.1))?;
                let surrogate = match output {
                    Forwarded::Loss(loss) => loss.mul_scalar(scale),
                    Forwarded::Hidden { hidden, aux_loss } => {
                        let grad = grads_in
                            .remove(&key)
                            .ok_or_else(|| schedule_bug("backward", key.0, key.1))?;
                        (hidden * grad).sum() + aux_loss.mul_scalar(scale)
                    }
                };
                let last = compute.microbatch + 1 == microbatches.len();
                let gradients = backward_by_range(
                    surrogate,
                    tape,
                    &chunk,
                    input.as_slice(),
                    chunk.has_dropout(),
                    &mut || fence_peers(&[&ctx.tp, &ctx.cp, &ctx.ep, &ctx.etp]),
                    &mut |grads| {
                        if last && let Some(by_range) = by_range.as_mut() {
                            by_range(compute.chunk, &chunk, grads);
                        }
                        Ok(())
                    },
                )?;
                if let Some(input) = input {
                    let grad = match input.grad(&gradients) {
                        Some(grad) => Tensor::from_inner(grad),
                        None => Tensor::zeros(input.dims(), &input.device()),
                    };
                    grads_out.insert(key, grad);
                }
                let grads = GradientsParams::from_grads(gradients, &chunk);
                absorb(compute.chunk, &chunk, grads)?;
            }
        }
    }
    Ok(PipelineOutcome {
        losses,
        lm_losses,
        aux_losses,
        loads,
    })
}

fn schedule_bug(what: &str, chunk: usize, microbatch: usize) -> TrainError {
    TrainError::Config(format!(
        "pipeline schedule out of order: nothing to {what} for chunk {chunk}, microbatch {microbatch}"
    ))
}

/// Forward-only pass for evaluation: microbatch by microbatch through every chunk in pipeline
/// order (a chain, so blocking sends cannot deadlock). Returns the sum of the LM losses on the
/// last stage (0 elsewhere).
pub(crate) fn evaluate_stage<B>(
    chunks: &[GptModel<B>],
    position: StagePosition,
    ctx: &ParallelContext,
    microbatches: &[Microbatch],
    device: &B::Device,
) -> Result<f64, TrainError>
where
    B: burn::tensor::backend::Backend + ParallelOps,
{
    let mut lm_loss_sum = 0.0;
    for microbatch in microbatches {
        for (index, chunk) in chunks.iter().enumerate() {
            let (tokens, labels) = rank_tensors::<B>(microbatch, ctx, device)?;
            let data = if position.is_first_piece(index) {
                ChunkData::Tokens(tokens)
            } else {
                let shape = chunk.boundary_shape(microbatch.batch);
                ChunkData::Hidden(recv::<B>(ctx, shape, position.previous_stage(), device)?)
            };
            let mut input = ChunkInput {
                data,
                labels: None,
                loss_mask: None,
            };
            if position.is_last_piece(index) {
                input = input.with_labels(labels, None);
            }
            match chunk.forward_chunk(input)? {
                ChunkOutput::Hidden { hidden, .. } => {
                    send(ctx, hidden, position.next_stage())?;
                }
                ChunkOutput::Loss(loss) => {
                    lm_loss_sum += read_to_host(|| loss.lm_loss.into_scalar().to_f64());
                }
            }
        }
    }
    Ok(lm_loss_sum)
}

/// Evaluation models: the chunks without autodiff.
pub(crate) fn valid_chunks<B: AutodiffBackend>(
    chunks: &[GptModel<B>],
) -> Vec<GptModel<B::InnerBackend>> {
    chunks.iter().map(AutodiffModule::valid).collect()
}
