//! One rank's share of the model and the optimizer state that goes with it, and the choice,
//! made once when the rank is built, of the step that updates them: a rank alone takes the
//! one-rank step, a rank of pure data parallelism over a dense model the same step averaged over
//! its group (`crate::step::replicas`), every other rank the per-chunk step
//! (`crate::step::per_chunk`), which owns its optimizers and is lent the chunks each step. The
//! rank keeps only what every step form and the checkpoints share (chunks, roles, groups).
//!
//! Why a rank alone does not take the per-chunk step with nothing to exchange: the flat
//! gradient buffers would only copy, and on a GPU the one-rank step already keeps the loss and
//! the norm on the device (no host read per step). Its numbers are the ones every N-rank layout
//! is tested against.
//!
//! Every decision that ends the run (a non-finite loss or norm, a stop) is taken where the loop
//! reads the queued steps, from values all ranks share after their device reductions, so all
//! ranks stop at the same iteration instead of leaving peers waiting in a collective.

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor, TensorData};
use ferrotron_model::{ChunkSpec, GptModel, ModelConfig, RecomputePolicy};
use ferrotron_parallel::{ParallelContext, ParamRole, ReduceOp, prefetch};
use ferrotron_plan::Plan;

use super::pipeline::{evaluate_stage, valid_chunks};
use super::schedule::StagePosition;
use crate::checkpoint::{CheckpointInfo, CheckpointStore, SaveInFlight};
use crate::error::comm_error;
use crate::optim::adamw::no_decay;
use crate::optim::flat_adamw::{Shard, Sharding};
use crate::rank::init::seeded_model;
use crate::run::host_read::read_to_host;
use crate::run::pending::DeviceValues;
use crate::run::training_loop::RankStep;
use crate::step::per_chunk::{PerChunkSettings, PerChunkStep, RankChunks};
use crate::step::replicas::{
    GRAD_BUCKET_ELEMENTS, Replicas, TensorReplicas, layer_buckets, summed_over,
};
use crate::step::{StatsRead, train_step_deferred, whole_model_step};
use crate::{AdamW, AdamWConfig, Microbatch, PendingStats, StepContext, TrainError};

/// This rank's chunks (virtual stages) from the plan's stage table.
pub(crate) fn chunk_specs(plan: &Plan, pp_rank: usize) -> Result<Vec<ChunkSpec>, TrainError> {
    let stage = plan
        .stages
        .get(pp_rank)
        .ok_or_else(|| TrainError::Config(format!("the plan has no pipeline stage {pp_rank}")))?;
    let pp = plan.degrees.pp as usize;
    let vpp = stage.chunks.len();
    let mut chunks = stage.chunks.clone();
    chunks.sort_by_key(|c| c.virtual_stage);
    Ok(chunks
        .iter()
        .enumerate()
        .map(|(v, chunk)| {
            let first = chunk.first_layer as usize;
            ChunkSpec {
                layers: first..first + chunk.num_layers as usize,
                pre_process: v == 0 && pp_rank == 0,
                post_process: v + 1 == vpp && pp_rank + 1 == pp,
            }
        })
        .collect())
}

/// The optimizer state a rank keeps.
pub(crate) enum RankOptimizer<B: AutodiffBackend> {
    /// The whole model on a rank alone: one AdamW, the one-rank step. A distributed optimizer
    /// over one rank is this one (its shard is everything).
    Whole(AdamW<B::InnerBackend>),
    /// The whole model on every rank of a data-parallel group, nothing else split: the
    /// one-rank device step with its flat gradient buffers averaged over the group on the
    /// device (`crate::step::replicas`).
    Replicated(AdamW<B::InnerBackend>, Replicas),
    /// One AdamW per chunk (with ZeRO-1: over this rank's parts of its flat groups), the
    /// gradients exchanged on the device (`crate::step::per_chunk`).
    PerChunk(PerChunkStep<B>),
}

impl<B: crate::TrainBackend> RankOptimizer<B> {
    /// The AdamW of each chunk.
    pub(crate) fn per_chunk(&self) -> &[AdamW<B::InnerBackend>] {
        match self {
            RankOptimizer::Whole(optimizer) | RankOptimizer::Replicated(optimizer, _) => {
                std::slice::from_ref(optimizer)
            }
            RankOptimizer::PerChunk(step) => step.optimizers(),
        }
    }

    pub(crate) fn per_chunk_mut(&mut self) -> &mut [AdamW<B::InnerBackend>] {
        match self {
            RankOptimizer::Whole(optimizer) | RankOptimizer::Replicated(optimizer, _) => {
                std::slice::from_mut(optimizer)
            }
            RankOptimizer::PerChunk(step) => step.optimizers_mut(),
        }
    }
}

/// A rank's model chunks, their parameter layout and optimizer.
pub(crate) struct RankModel<B: AutodiffBackend> {
    pub ctx: ParallelContext,
    pub position: StagePosition,
    pub chunks: Vec<GptModel<B>>,
    pub roles: Vec<Vec<ParamRole>>,
    pub(crate) optimizer: RankOptimizer<B>,
    pub(crate) device: B::Device,
    /// A checkpoint its writer thread is still writing (`checkpoint.async_save`).
    pub(crate) save_in_flight: Option<SaveInFlight>,
}

impl<B> RankModel<B>
where
    B: crate::TrainBackend,
{
    /// Build this rank's chunks as cuts of the seeded one-rank model (the plan's model with its
    /// real and padded vocabulary; the model itself on a rank alone), and its optimizer, both
    /// as the plan's recipe sets them.
    pub(crate) fn new(
        plan: &Plan,
        ctx: ParallelContext,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        let recipe = &plan.recipe;
        let config = ModelConfig::from_model_with_vocab(
            &recipe.model,
            plan.vocab_size,
            plan.padded_vocab_size,
        )?;
        let specs = chunk_specs(plan, ctx.pp_rank())?;
        // every rank draws the same full model from the seed, then keeps its cut
        let full: GptModel<B> = seeded_model(
            &config,
            recipe.training.seed,
            recipe.runtime.use_cpu_initialization,
            device,
        )?;
        let whole = is_alone(&ctx) && specs.len() == 1;
        if recipe.precision.fp8_experts && !whole {
            tracing::warn!(
                "precision.fp8_experts is ignored: the model is cut over ranks or chunks, and its \
                 MoE layers' tokens reach the experts through the token dispatcher, which keeps \
                 them in the model's dtype"
            );
        }
        let chunks = if whole {
            vec![full]
        } else {
            specs
                .iter()
                .map(|spec| GptModel::shard(&full, &ctx, spec))
                .collect::<Result<Vec<_>, _>>()?
        };
        // Megatron's recompute ranges count per chunk, as the planner's memory terms do.
        let policy = RecomputePolicy::from_recipe(&recipe.recompute)?;
        let chunks = chunks
            .into_iter()
            .map(|chunk| {
                chunk
                    .with_recompute(policy)
                    .with_cross_entropy_fusion(recipe.runtime.cross_entropy_fusion_impl)
            })
            .collect();
        let chunks = crate::rank::fp8::with_fp8::<B>(chunks, &recipe.precision, device)?;
        let position = StagePosition {
            stage: ctx.pp_rank(),
            stages: ctx.pp_size(),
            chunks: chunks.len(),
        };
        let roles: Vec<Vec<ParamRole>> = chunks.iter().map(GptModel::param_roles).collect();
        // The replicated step lays its flat buffers out from the first microbatch's gradients,
        // which an expert no token reached lacks on one data rank but not another: it takes
        // dense models only, and MoE the per-chunk exchange (`crate::step::per_chunk`).
        let replicated =
            !whole && one_stage_dense(&ctx) && chunks.len() == 1 && config.moe.is_none();
        let parallel = &recipe.parallel;
        let bucket_elements = parallel.ddp_bucket_size.map_or(GRAD_BUCKET_ELEMENTS, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        });
        let adamw = AdamWConfig::from_recipe(&recipe.training.optimizer);
        let distributed_optimizer = parallel.distributed_optimizer;
        let optimizer = if whole {
            RankOptimizer::Whole(AdamW::new(adamw, no_decay(&roles[0])))
        } else if replicated {
            let replicas = Replicas {
                comm: ctx.dp_cp.clone(),
                overlap: parallel.overlap_grad_reduce,
                shard: distributed_optimizer,
                gather_before: None,
                tensor: TensorReplicas::new(&ctx.tp, &roles[0]),
            };
            replicated_optimizer(
                &chunks[0],
                AdamW::new(adamw, no_decay(&roles[0])),
                replicas,
                parallel.overlap_param_gather,
                bucket_elements,
            )
        } else {
            let settings = PerChunkSettings {
                adamw,
                distributed_optimizer,
                bucket_elements,
                overlap_grad_reduce: parallel.overlap_grad_reduce,
                overlap_param_gather: parallel.overlap_param_gather,
            };
            let first_layers = specs.iter().map(|spec| spec.layers.start);
            RankOptimizer::PerChunk(PerChunkStep::new(
                &chunks,
                &roles,
                first_layers,
                &ctx,
                &settings,
            ))
        };
        Ok(RankModel {
            ctx,
            position,
            chunks,
            roles,
            optimizer,
            device: device.clone(),
            save_in_flight: None,
        })
    }
}

/// `values` (this rank's per-microbatch means) as every rank reports them: the last stage's,
/// averaged over the data- and context-parallel ranks.
pub(crate) fn reported_mean<const N: usize>(
    ctx: &ParallelContext,
    mut values: [f64; N],
) -> Result<[f64; N], TrainError> {
    if !ctx.is_last_stage() {
        values = [0.0; N];
    }
    if ctx.pp.size() > 1 {
        read_to_host(|| ctx.pp.all_reduce_f64(&mut values, ReduceOp::Sum))
            .map_err(|e| comm_error("loss broadcast over the pipeline", e))?;
    }
    let dp_cp = ctx.dp_cp.size();
    if dp_cp > 1 {
        read_to_host(|| ctx.dp_cp.all_reduce_f64(&mut values, ReduceOp::Sum))
            .map_err(|e| comm_error("loss average over data-parallel ranks", e))?;
        values.iter_mut().for_each(|v| *v /= dp_cp as f64);
    }
    Ok(values)
}

/// Gathers still in flight are waited for before their buffers can go.
impl<B: AutodiffBackend> Drop for RankModel<B> {
    fn drop(&mut self) {
        prefetch::settle();
    }
}

/// The loop drives a rank through [`RankStep`]: the step, evaluation and checkpoints above, and
/// the agreement on stopping.
impl<B> RankStep for RankModel<B>
where
    B: crate::TrainBackend,
{
    /// Queue one optimizer step over this rank's `microbatches` (its data-parallel share).
    fn step(
        &mut self,
        microbatches: &[Microbatch],
        context: StepContext,
    ) -> Result<PendingStats, TrainError> {
        let (optimizer, replicas) = match &mut self.optimizer {
            RankOptimizer::Whole(optimizer) => (optimizer, None),
            RankOptimizer::Replicated(optimizer, replicas) => (optimizer, Some(&*replicas)),
            RankOptimizer::PerChunk(step) => {
                let chunks = RankChunks {
                    chunks: &mut self.chunks,
                    roles: &self.roles,
                    position: self.position,
                    ctx: &self.ctx,
                    device: &self.device,
                };
                let stats = step.step(chunks, microbatches, context)?;
                crate::rank::fp8::end_step(&self.chunks, &self.ctx);
                return Ok(stats);
            }
        };
        let model = self.chunks.pop().ok_or_else(|| {
            TrainError::Config("the model was lost in an earlier failed step".into())
        })?;
        let (model, stats) = match replicas {
            None => train_step_deferred(model, optimizer, microbatches, context, &self.device)?,
            Some(replicas) => whole_model_step(
                model,
                optimizer,
                microbatches,
                context,
                &self.device,
                Some(replicas),
                StatsRead::Later,
            )?,
        };
        self.chunks.push(model);
        crate::rank::fp8::end_step(&self.chunks, &self.ctx);
        Ok(stats)
    }

    /// Mean LM loss over this rank's share of the validation batches, averaged like the
    /// training loss; every rank returns the same value.
    fn evaluate(&mut self, microbatches: &[Microbatch]) -> Result<f64, TrainError> {
        if microbatches.is_empty() {
            return Ok(f64::NAN);
        }
        // parameters still being gathered (ZeRO-1 with `overlap_param_gather`) are read now
        prefetch::settle();
        let chunks = valid_chunks(&self.chunks);
        let sum = evaluate_stage::<B::InnerBackend>(
            &chunks,
            self.position,
            &self.ctx,
            microbatches,
            &self.device,
        )?;
        let [mean] = reported_mean(&self.ctx, [sum / microbatches.len() as f64])?;
        Ok(mean)
    }

    fn save(
        &mut self,
        store: &CheckpointStore,
        info: &CheckpointInfo<'_>,
    ) -> Result<Option<PathBuf>, TrainError> {
        // at most one save in flight: its snapshot is the only one held in host memory
        self.settle_save()?;
        prefetch::settle();
        // a checkpoint holds whole moments and masters, whatever the layout that reads it
        match &mut self.optimizer {
            RankOptimizer::Whole(_) => {}
            RankOptimizer::Replicated(optimizer, replicas) => {
                optimizer.join_shards(|_| &replicas.comm);
            }
            RankOptimizer::PerChunk(step) => step.join_shards(&self.ctx),
        }
        self.save_checkpoint(store, info)
    }

    fn first_step_queued(&mut self) {
        <B::InnerBackend as ferrotron_ops::FusedOps>::first_step_queued(&self.device);
    }

    fn reserve_snapshot(&mut self) {
        let optimizers = self.optimizer.per_chunk();
        let bytes: usize = optimizers.iter().map(|o| o.device_state_bytes()).sum();
        let start = std::time::Instant::now();
        let reserved =
            <B::InnerBackend as ferrotron_ops::FusedOps>::reserve_reads_later(&self.device, bytes);
        if reserved > 0 {
            tracing::info!(
                "page-locked {:.2} GB for the asynchronous checkpoints' snapshot in {:.2} s",
                reserved as f64 / 1e9,
                start.elapsed().as_secs_f64()
            );
        }
    }

    fn settle_save(&mut self) -> Result<Option<(u64, PathBuf)>, TrainError> {
        let Some(save) = self.save_in_flight.take() else {
            return Ok(None);
        };
        let iteration = save.iteration();
        save.settle(&self.ctx).map(|path| Some((iteration, path)))
    }

    fn has_peers(&self) -> bool {
        !is_alone(&self.ctx)
    }

    /// The number of ranks whose `local` holds, summed over tp, dp×cp and pp (together the
    /// world) by device collectives: nothing waits for it until the loop reads it.
    fn agree_stop(&self, local: bool) -> DeviceValues {
        let ctx = &self.ctx;
        let flag = Tensor::<B::InnerBackend, 1>::from_data(
            TensorData::new(vec![if local { 1.0f32 } else { 0.0 }], [1]),
            (&self.device, DType::F32),
        );
        let world = [&ctx.tp, &ctx.dp_cp, &ctx.pp];
        DeviceValues::new(vec![summed_over(Some(flag), world, &self.device)])
    }

    fn agree_on_order(&self) -> Result<(), TrainError> {
        self.ctx
            .agree_on_order()
            .map_err(|e| comm_error("agreeing on the collective order", e))
    }
}

/// The optimizer of a rank of pure data parallelism: its flat layout cut into buckets where the
/// reduction overlaps the backward or the parameter gather the forward, and with ZeRO-1 only
/// this rank's part of the state.
fn replicated_optimizer<B: AutodiffBackend>(
    model: &GptModel<B>,
    mut optimizer: AdamW<B::InnerBackend>,
    mut replicas: Replicas,
    overlap_param_gather: bool,
    bucket_elements: usize,
) -> RankOptimizer<B> {
    let gather_overlap = replicas.shard && overlap_param_gather;
    // ZeRO-1 cuts every bucket into parts (as Megatron's distributed optimizer does), so its
    // numbers depend on the bucket size, never on whether the collectives overlap.
    if replicas.overlap || replicas.shard {
        let buckets = layer_buckets::<B, _>(model, bucket_elements);
        optimizer.set_buckets(buckets.of_param.into_iter().collect());
        replicas.gather_before = gather_overlap.then_some(buckets.first_layer);
    }
    if replicas.shard {
        optimizer.set_sharding(Sharding {
            shard: Shard {
                part: replicas.comm.rank(),
                parts: replicas.comm.size(),
            },
            expert: None,
        });
    }
    RankOptimizer::Replicated(optimizer, replicas)
}

/// Whether every group of `ctx` is this rank alone (then it holds the whole model).
fn is_alone(ctx: &ParallelContext) -> bool {
    one_stage_dense(ctx) && [ctx.tp_size(), ctx.dp_size()] == [1, 1]
}

/// Whether the layout has one pipeline stage, whole sequences and no expert parallelism (the
/// expert tensor-parallel size, tp's by default, does not matter to a dense model): every
/// rank then holds all layers (split over tp) and the microbatches' whole sequences, and its
/// gradients need sums over tp and dp only, which the replicated device step does
/// (`crate::step::replicas`).
fn one_stage_dense(ctx: &ParallelContext) -> bool {
    [ctx.cp_size(), ctx.ep_size(), ctx.pp_size()] == [1, 1, 1]
}
