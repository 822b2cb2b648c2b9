//! The step of a rank whose layout the replicated step does not cover (pipeline stages,
//! context or expert parallelism, MoE with data parallelism), its gradients exchanged on the
//! device: each backward's gradients are summed into the chunk optimizer's flat fp32 buffers
//! (`crate::flat_adamw`), and the exchange is collectives over those buffers in Megatron's order
//! of concerns — the sequence-parallel partial gradients summed over tp, the tied embedding
//! between first and last stage, then each flat group averaged over the ranks holding the same
//! parameters (dense over dp×cp, experts over expert-dp): all-reduced, or with the distributed
//! optimizer (ZeRO-1) reduce-scattered to this rank's part, updated there and all-gathered
//! whole. On a GPU with NCCL no gradient or parameter crosses to the host; the norm's one scalar
//! is read to decide clipping and finiteness before the update, as every rank must decide alike.
//!
//! Every trainable parameter is laid out, with or without a gradient this step, so the buffers
//! of peers always match; an expert no token reached then takes its AdamW step with a zero
//! gradient, as under Megatron's contiguous gradient buffers (the expert-parallel dispatch
//! already gave it a zero gradient on N ranks).

use std::collections::HashMap;

use burn::module::ParamId;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::cast::ToElement;
use burn::tensor::{DType, Tensor};
use ferrotron_parallel::{Comm, ParallelContext, ParallelOps, ParamRole, ReduceOp};

use super::pipeline;
use super::rank_model::{RankModel, RankOptimizer};
use crate::flat_adamw::{
    FlatGrads, Group, Layout, Shard, Sharding, from_primitive, primitive, sum_params_over,
};
use crate::rng::with_process_rng;
use crate::step::check_finite;
use crate::{AdamW, Microbatch, StepContext, StepStats, TrainError, clip_coefficient};

/// The flat-layout bucket of expert parameters: their groups are averaged over expert-dp.
const EXPERT_BUCKET: usize = 1;

/// A chunk's optimizer: its expert parameters in flat groups of their own, apart from the dense
/// ones, and with the distributed optimizer each group cut over its data-parallel group.
pub(super) fn per_chunk_optimizer<I: burn::tensor::backend::Backend>(
    mut optimizer: AdamW<I>,
    roles: &[ParamRole],
    ctx: &ParallelContext,
    distributed: bool,
) -> AdamW<I> {
    let buckets = roles
        .iter()
        .filter(|role| role.expert)
        .map(|role| (role.id, EXPERT_BUCKET))
        .collect();
    optimizer.set_buckets(buckets);
    if distributed {
        optimizer.set_sharding(Sharding {
            shard: Shard {
                part: ctx.dp_cp_rank(),
                parts: ctx.dp_cp_size(),
            },
            other: Some((
                EXPERT_BUCKET,
                Shard {
                    part: ctx.edp_rank(),
                    parts: ctx.edp_size(),
                },
            )),
        });
    }
    optimizer
}

/// The ranks holding the same parameters as a flat group's: dense ones over dp×cp, experts over
/// expert-dp.
pub(super) fn data_group<'a>(ctx: &'a ParallelContext, group: &Group) -> &'a Comm {
    if group.bucket == EXPERT_BUCKET {
        &ctx.edp
    } else {
        &ctx.dp_cp
    }
}

/// Whether this rank counts `role`'s elements in the global norm, each unique gradient element
/// once over the world: a tp-replicated parameter on tp rank 0 only, the tied embedding on the
/// first stage only, a replicated gradient on the first rank of its data-parallel group (with
/// ZeRO-1, each rank's disjoint part).
fn counts_here(role: &ParamRole, ctx: &ParallelContext, sharded: bool) -> bool {
    if role.tp_duplicate && ctx.tp_rank() != 0 {
        return false;
    }
    if role.tied_embedding && !ctx.is_first_stage() {
        return false;
    }
    if sharded {
        return true;
    }
    if role.expert {
        ctx.edp_rank() == 0
    } else {
        ctx.dp_cp_rank() == 0
    }
}

impl<B> RankModel<B>
where
    B: AutodiffBackend + ParallelOps,
    B::InnerBackend: ParallelOps,
{
    /// One optimizer step of a rank with peers and one AdamW per chunk: the schedule, the
    /// exchange on the flat buffers, the agreed norm and the update.
    pub(super) fn device_exchanged_step(
        &mut self,
        microbatches: &[Microbatch],
        context: StepContext,
    ) -> Result<StepStats, TrainError> {
        let RankOptimizer::PerChunk(optimizers) = &mut self.optimizer else {
            return Err(TrainError::Config(
                "the device exchange needs one optimizer per chunk".into(),
            ));
        };
        // dropout's stream, seeded as the one-rank step seeds it
        with_process_rng(|| B::seed(&self.device, context.seed ^ context.iteration));
        let mut flats: Vec<Option<FlatGrads<B::InnerBackend>>> =
            (0..self.chunks.len()).map(|_| None).collect();
        let outcome = pipeline::run_step(
            &self.chunks,
            self.position,
            &self.ctx,
            microbatches,
            &self.device,
            |index, chunk, grads| {
                let sum = flats[index].take();
                flats[index] = Some(optimizers[index].gather_flat_whole(chunk, grads, sum)?);
                Ok(())
            },
        )?;
        let scale = 1.0 / microbatches.len() as f64;
        let [loss, lm_loss] =
            self.reported_mean([outcome.loss_sum * scale, outcome.lm_loss_sum * scale])?;
        check_finite(loss, context.iteration, "the loss")?;
        let RankOptimizer::PerChunk(optimizers) = &mut self.optimizer else {
            unreachable!("matched above");
        };
        let mut squares: Option<Tensor<B::InnerBackend, 1>> = None;
        let mut reduced = Vec::with_capacity(self.chunks.len());
        for ((chunk, roles), (optimizer, flat)) in self
            .chunks
            .iter()
            .zip(&self.roles)
            .zip(optimizers.iter_mut().zip(flats))
        {
            let mut flat = flat.ok_or_else(|| {
                TrainError::Config("a pipeline chunk ran no backward this step".into())
            })?;
            let layout = optimizer.flat_layout_of(chunk);
            let sharded = exchange(&self.ctx, layout, roles, &mut flat);
            let by_id: HashMap<ParamId, &ParamRole> = roles.iter().map(|r| (r.id, r)).collect();
            let part = optimizer.flat_sum_of_squares(&flat, |id| {
                by_id
                    .get(&id)
                    .is_some_and(|role| counts_here(role, &self.ctx, sharded))
            });
            squares = match (squares, part) {
                (Some(sum), Some(part)) => Some(sum + part),
                (sum, part) => sum.or(part),
            };
            reduced.push(flat);
        }
        let grad_norm = self.world_norm(squares);
        check_finite(grad_norm, context.iteration, "the gradient norm")?;
        let clip = clip_coefficient(grad_norm, context.clip_grad);
        let chunks = std::mem::take(&mut self.chunks);
        let RankOptimizer::PerChunk(optimizers) = &mut self.optimizer else {
            unreachable!("matched above");
        };
        let device_clip =
            Tensor::<B::InnerBackend, 1>::from_data([clip as f32], &self.device).cast(DType::F32);
        self.chunks = chunks
            .into_iter()
            .zip(optimizers.iter_mut().zip(reduced))
            .map(|(chunk, (optimizer, flat))| {
                optimizer.step_flat(
                    chunk,
                    flat,
                    context.lr,
                    Some(device_clip.clone()),
                    |group, part| gathered(&self.ctx, group, part),
                )
            })
            .collect();
        self.update_expert_bias(outcome.loads)?;
        Ok(StepStats {
            loss,
            lm_loss,
            grad_norm,
            clip_coefficient: clip,
            lr: context.lr,
        })
    }

    /// The L2 norm of the world's gradients from this rank's counted `Σg²`, summed over tp,
    /// dp×cp and pp (the whole world) on the device and read once.
    fn world_norm(&self, squares: Option<Tensor<B::InnerBackend, 1>>) -> f64 {
        let mut sum = squares.unwrap_or_else(|| {
            Tensor::<B::InnerBackend, 1>::zeros([1], (&self.device, DType::F32))
        });
        for comm in [&self.ctx.tp, &self.ctx.dp_cp, &self.ctx.pp] {
            if comm.size() > 1 {
                sum = from_primitive(B::InnerBackend::all_reduce_detached(
                    primitive(sum),
                    ReduceOp::Sum,
                    comm,
                ));
            }
        }
        sum.into_scalar().to_f64().sqrt()
    }
}

/// The exchange on one chunk's flat gradients: partial ones summed over tp, the tied embedding
/// over the embedding group, then every group averaged over its data-parallel ranks (into this
/// rank's part of it, under ZeRO-1). Experts are divided by the data × context size too:
/// reduced over the smaller expert-dp group, they already saw their expert-parallel peers'
/// tokens through the all-to-all (Megatron's `expert_gradient_scaling_factor`). Returns whether
/// the buffers are now parts.
fn exchange<I: ParallelOps>(
    ctx: &ParallelContext,
    layout: &Layout,
    roles: &[ParamRole],
    flat: &mut FlatGrads<I>,
) -> bool {
    let ids = |pick: fn(&ParamRole) -> bool| {
        roles
            .iter()
            .filter(move |role| pick(role))
            .map(|role| role.id)
    };
    sum_params_over(layout, flat, ids(|role| role.tp_partial), &ctx.tp);
    if let Some(embedding) = ctx.embedding.as_ref() {
        sum_params_over(layout, flat, ids(|role| role.tied_embedding), embedding);
    }
    let data_ranks = ctx.dp_cp_size();
    let buffers = std::mem::take(&mut flat.buffers);
    flat.buffers = buffers
        .into_iter()
        .zip(&layout.groups)
        .map(|(buffer, group)| {
            let comm = data_group(ctx, group);
            let sum = match group.shard {
                _ if comm.size() == 1 => buffer,
                Some(_) => I::reduce_scatter_started(buffer, comm).finish(),
                None => I::all_reduce_detached(buffer, ReduceOp::Sum, comm),
            };
            if data_ranks > 1 {
                primitive(from_primitive::<I>(sum).mul_scalar(1.0 / data_ranks as f32))
            } else {
                sum
            }
        })
        .collect();
    layout.groups.iter().any(|group| group.shard.is_some())
}

/// A group's new values whole: its parts all-gathered over its data-parallel group under ZeRO-1.
fn gathered<I: ParallelOps>(
    ctx: &ParallelContext,
    group: &Group,
    part: Tensor<I, 1>,
) -> Tensor<I, 1> {
    let comm = data_group(ctx, group);
    if group.shard.is_none() || comm.size() == 1 {
        return part;
    }
    from_primitive(I::all_gather_started(primitive(part), comm).finish())
}
