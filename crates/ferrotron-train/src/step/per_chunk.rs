//! The step of a rank whose layout the replicated step does not cover (pipeline stages, context or
//! expert parallelism, MoE with data parallelism), its gradients exchanged on the device: each
//! backward's gradients are summed into the chunk optimizer's flat fp32 buffers
//! (`crate::optim::flat_adamw`), and the exchange is collectives over those buffers in Megatron's
//! order of concerns — the sequence-parallel partial gradients summed over tp, the tied embedding
//! between first and last stage, then each flat group averaged over the ranks holding the same
//! parameters (dense over dp×cp, experts over expert-dp): all-reduced, or with the distributed
//! optimizer (ZeRO-1) reduce-scattered to this rank's part, updated there and all-gathered whole.
//! On a GPU with NCCL no gradient or parameter crosses to the host, and neither does a statistic:
//! the clipping coefficient is computed on the device from the all-reduced norm, and the losses and
//! the norm are read with the queued steps when the loop logs (`crate::run::pending`), where every
//! rank takes the finiteness decision alike.
//!
//! The flat groups are cut into buckets of layers (`parallel.ddp_bucket_size`, as the
//! replicated step's), and a chunk's last microbatch runs its backward layer by layer: with
//! `parallel.overlap_grad_reduce` each bucket's reductions start as soon as its gradients are
//! final, under the rest of that backward and of the schedule (`crate::step::replicas`'s
//! `BucketReduction`, shared with the replicated step); without, they start after the chunk's
//! last backward — the same collectives, so the same numbers. The tied embedding's group is
//! held until the schedule is over: a stage may block on the other end of the pipeline only
//! once its own part of the schedule is done, while tp and data-parallel peers run the same
//! schedule and reach their collectives at the same point. With `overlap_param_gather` the next
//! forward waits for a bucket's ZeRO-1 all-gather only at the first layer reading it.
//!
//! Every trainable parameter is laid out, with or without a gradient this step, so the buffers
//! of peers always match; an expert no token reached then takes its AdamW step with a zero
//! gradient, as under Megatron's contiguous gradient buffers (the expert-parallel dispatch
//! already gave it a zero gradient on N ranks).

use std::cell::RefCell;
use std::collections::HashMap;

use burn::module::ParamId;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use ferrotron_model::{ExpertLoads, GptModel};
use ferrotron_parallel::{
    Comm, InFlight, ParallelContext, ParallelOps, ParamRole, ReduceOp, prefetch,
};

use crate::optim::adamw::{Laid, no_decay};
use crate::optim::flat_adamw::{
    Family, FlatGrads, Group, Layout, Shard, Sharding, Sum, take_grads,
};
use crate::rank::pipeline;
use crate::rank::schedule::StagePosition;
use crate::rng::with_process_rng;
use crate::run::pending::DeviceValues;
use crate::step::check_finite;
use crate::step::clip::exact_device_clip_coefficient;
use crate::step::replicas::{
    BucketReduction, GroupReduction, Launched, TensorReplicas, divided, gathered_whole,
    layer_buckets, sum_loads, summed_over,
};
use crate::{
    AdamW, AdamWConfig, Microbatch, PendingStats, StepContext, StepStats, TrainError,
    clip_coefficient,
};

/// The per-chunk step's own state: one AdamW per chunk (with ZeRO-1 over this rank's parts of
/// its flat groups) and how its exchange overlaps. The rank keeps the chunks and their roles and
/// lends them to [`PerChunkStep::step`]; this keeps what only the exchange reads.
pub(crate) struct PerChunkStep<B: AutodiffBackend> {
    optimizers: Vec<AdamW<B::InnerBackend>>,
    /// Start a chunk's bucket reductions during its last backward
    /// (`parallel.overlap_grad_reduce`).
    overlap_grad_reduce: bool,
    /// Per chunk and bucket, the first (global) layer reading the bucket's parameters, where the
    /// next forward waits for its ZeRO-1 all-gather (`parallel.overlap_param_gather`; none:
    /// every gather is waited for at once).
    gather_before: Option<Vec<Vec<Option<usize>>>>,
}

/// What a per-chunk step runs over: the rank's chunks (replaced by their updates), their
/// parameter roles, the stage they make up and the rank's groups.
pub(crate) struct RankChunks<'a, B: AutodiffBackend> {
    pub(crate) chunks: &'a mut Vec<GptModel<B>>,
    pub(crate) roles: &'a [Vec<ParamRole>],
    pub(crate) position: StagePosition,
    pub(crate) ctx: &'a ParallelContext,
    pub(crate) device: &'a B::Device,
}

/// How the per-chunk optimizers are laid out and their exchange overlaps (from the recipe's
/// `parallel` section).
pub(crate) struct PerChunkSettings {
    pub(crate) adamw: AdamWConfig,
    pub(crate) distributed_optimizer: bool,
    pub(crate) bucket_elements: usize,
    pub(crate) overlap_grad_reduce: bool,
    pub(crate) overlap_param_gather: bool,
}

impl<B: crate::TrainBackend> PerChunkStep<B> {
    /// One optimizer per chunk of `chunks` (whose layers begin at `first_layers`).
    pub(crate) fn new(
        chunks: &[GptModel<B>],
        roles: &[Vec<ParamRole>],
        first_layers: impl IntoIterator<Item = usize>,
        ctx: &ParallelContext,
        settings: &PerChunkSettings,
    ) -> Self {
        let (optimizers, first_layers) = chunks
            .iter()
            .zip(roles)
            .zip(first_layers)
            .map(|((chunk, roles), first_layer)| {
                let optimizer = AdamW::new(settings.adamw, no_decay(roles));
                chunk_optimizer(
                    chunk,
                    optimizer,
                    roles,
                    ctx,
                    settings.distributed_optimizer,
                    settings.bucket_elements,
                    first_layer,
                )
            })
            .unzip();
        let gather_before = (settings.distributed_optimizer && settings.overlap_param_gather)
            .then_some(first_layers);
        PerChunkStep {
            optimizers,
            overlap_grad_reduce: settings.overlap_grad_reduce,
            gather_before,
        }
    }

    /// The AdamW of each chunk.
    pub(crate) fn optimizers(&self) -> &[AdamW<B::InnerBackend>] {
        &self.optimizers
    }

    pub(crate) fn optimizers_mut(&mut self) -> &mut [AdamW<B::InnerBackend>] {
        &mut self.optimizers
    }

    /// Whole moments and masters in every optimizer (a checkpoint holds them whole, whatever
    /// the layout that reads it): ZeRO-1 parts gathered over their data-parallel groups.
    pub(crate) fn join_shards(&mut self, ctx: &ParallelContext) {
        for optimizer in &mut self.optimizers {
            optimizer.join_shards(|group| data_group(ctx, group));
        }
    }
}

/// A chunk's optimizer: its parameters in buckets of layers, its expert parameters and its tied
/// embedding in flat groups of their own, and with the distributed optimizer each group cut over
/// its data-parallel group. Also the first global layer of each bucket (the chunk's layers
/// begin at `first_layer`).
fn chunk_optimizer<B: AutodiffBackend>(
    chunk: &GptModel<B>,
    mut optimizer: AdamW<B::InnerBackend>,
    roles: &[ParamRole],
    ctx: &ParallelContext,
    distributed: bool,
    bucket_elements: usize,
    first_layer: usize,
) -> (AdamW<B::InnerBackend>, Vec<Option<usize>>) {
    let buckets = layer_buckets::<B, _>(chunk, bucket_elements);
    optimizer.set_buckets(buckets.of_param.into_iter().collect());
    let families = roles
        .iter()
        .filter_map(|role| match role {
            _ if role.expert => Some((role.id, Family::Expert)),
            _ if role.tied_embedding => Some((role.id, Family::TiedEmbedding)),
            _ => None,
        })
        .collect();
    optimizer.set_families(families);
    if distributed {
        optimizer.set_sharding(Sharding {
            shard: Shard {
                part: ctx.dp_cp_rank(),
                parts: ctx.dp_cp_size(),
            },
            expert: Some(Shard {
                part: ctx.edp_rank(),
                parts: ctx.edp_size(),
            }),
        });
    }
    let first = buckets
        .first_layer
        .into_iter()
        .map(|layer| layer.map(|layer| first_layer + layer))
        .collect();
    (optimizer, first)
}

/// The ranks holding the same parameters as a flat group's: dense ones over dp×cp, experts over
/// expert-dp.
fn data_group<'a>(ctx: &'a ParallelContext, group: &Group) -> &'a Comm {
    if group.family == Family::Expert {
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

/// One chunk's reductions: partial gradients over tp, each group over its data-parallel ranks,
/// the tied embedding's first between first and last stage (held until [`Launched::finish`],
/// after the schedule).
struct ChunkExchange<'a> {
    ctx: &'a ParallelContext,
    tensor: TensorReplicas,
}

enum Pending<I: Backend> {
    Started(InFlight<I>),
    Held(FloatTensor<I>),
}

impl<I: ParallelOps> GroupReduction<I> for ChunkExchange<'_> {
    type Pending = Pending<I>;

    fn complete(&self, grads: &mut HashMap<ParamId, Tensor<I, 1>>) {
        self.tensor.complete(grads);
    }

    fn begin(&self, group: &Group, sum: FloatTensor<I>) -> Pending<I> {
        if group.family == Family::TiedEmbedding && self.ctx.embedding.is_some() {
            Pending::Held(sum)
        } else {
            Pending::Started(start(self.ctx, group, sum))
        }
    }

    /// Experts are divided by the data × context size too: reduced over the smaller expert-dp
    /// group, they already saw their expert-parallel peers' tokens through the all-to-all
    /// (Megatron's `expert_gradient_scaling_factor`).
    fn end(&self, group: &Group, pending: Pending<I>) -> FloatTensor<I> {
        let started = match pending {
            Pending::Started(started) => started,
            Pending::Held(sum) => {
                // the group holds the tied embedding only (and zero padding)
                let embedding = self.ctx.embedding.as_ref().expect("held for the embedding");
                start(
                    self.ctx,
                    group,
                    I::all_reduce_detached(sum, ReduceOp::Sum, embedding),
                )
            }
        };
        divided::<I>(started.finish(), self.ctx.dp_cp_size())
    }
}

/// A group's sum over its data-parallel ranks, started: all-reduced, or reduce-scattered to this
/// rank's part under ZeRO-1.
fn start<I: ParallelOps>(ctx: &ParallelContext, group: &Group, sum: FloatTensor<I>) -> InFlight<I> {
    let comm = data_group(ctx, group);
    match group.shard {
        Some(_) => I::reduce_scatter_started(sum, comm),
        None => I::all_reduce_started(sum, comm),
    }
}

/// A group's new values whole: its parts all-gathered over its data-parallel group under
/// ZeRO-1, waited for at once or, with `before`, when the next forward reaches that layer.
fn gathered<I: ParallelOps>(
    ctx: &ParallelContext,
    group: &Group,
    part: Tensor<I, 1>,
    before: Option<usize>,
) -> Tensor<I, 1> {
    let comm = data_group(ctx, group);
    if group.shard.is_none() || comm.size() == 1 {
        return part;
    }
    gathered_whole(part, comm, before)
}

impl<B: crate::TrainBackend> PerChunkStep<B> {
    /// One optimizer step of a rank with peers and one AdamW per chunk: the schedule with the
    /// reductions started as the chunks' gradients become final, the agreed norm and the
    /// update, then the MoE expert-bias update, all queued without a host read; the statistics
    /// stay on the device until read.
    pub(crate) fn step(
        &mut self,
        rank: RankChunks<'_, B>,
        microbatches: &[Microbatch],
        context: StepContext,
    ) -> Result<PendingStats, TrainError> {
        let RankChunks {
            chunks: rank_chunks,
            roles,
            position,
            ctx,
            device,
        } = rank;
        let optimizers = &mut self.optimizers;
        // every chunk's flat state laid out before its gradients are gathered into it
        let layouts: Vec<Layout> = optimizers
            .iter_mut()
            .zip(rank_chunks.iter())
            .map(|(optimizer, chunk)| optimizer.flat_layout_of(chunk).clone())
            .collect();
        let exchanges: Vec<ChunkExchange<'_>> = roles
            .iter()
            .map(|roles| ChunkExchange {
                ctx,
                tensor: TensorReplicas::new(&ctx.tp, roles),
            })
            .collect();
        let count = rank_chunks.len();
        let earlier: RefCell<Vec<Option<FlatGrads<B::InnerBackend>>>> =
            RefCell::new((0..count).map(|_| None).collect());
        let reductions: RefCell<Vec<Option<BucketReduction<'_, B, ChunkExchange<'_>>>>> =
            RefCell::new((0..count).map(|_| None).collect());
        let reduction = |index: usize, chunk: &GptModel<B>| {
            let earlier = earlier.borrow_mut()[index].take();
            BucketReduction::new(&exchanges[index], &layouts[index], chunk, earlier)
        };
        let mut by_range = |index: usize, chunk: &GptModel<B>, grads: &mut B::Gradients| {
            reductions.borrow_mut()[index]
                .get_or_insert_with(|| reduction(index, chunk))
                .range_done(grads);
        };
        let mut launched: Vec<Option<Launched<'_, B::InnerBackend, ChunkExchange<'_>>>> =
            (0..count).map(|_| None).collect();
        let mut absorbed = vec![0; count];
        // dropout's stream, seeded as the one-rank step seeds it
        with_process_rng(|| B::seed(device, context.seed ^ context.iteration));
        let outcome = pipeline::run_step(
            rank_chunks,
            position,
            ctx,
            microbatches,
            device,
            self.overlap_grad_reduce
                .then_some(&mut by_range as &mut pipeline::ChunkRangeDone<'_, B>),
            |index, chunk, grads| {
                absorbed[index] += 1;
                if absorbed[index] < microbatches.len() {
                    let sum = earlier.borrow_mut()[index].take();
                    // partial gradients summed over tp per microbatch, as the last one's are
                    let complete = |grads: &mut _| exchanges[index].tensor.complete(grads);
                    let sum = optimizers[index].gather_flat(
                        chunk,
                        grads,
                        sum,
                        (Laid::Every, Sum::Summed),
                        complete,
                    )?;
                    earlier.borrow_mut()[index] = Some(sum);
                } else {
                    let taken = reductions.borrow_mut()[index].take();
                    let reduction = taken.unwrap_or_else(|| reduction(index, chunk));
                    let rest = take_grads::<B, _>(chunk, grads).grads;
                    launched[index] = Some(reduction.launch(rest));
                }
                Ok(())
            },
        )?;
        let losses = stage_losses::<B::InnerBackend>(
            ctx,
            outcome.losses,
            outcome.lm_losses,
            outcome.aux_losses,
            microbatches.len(),
            device,
        )?;
        let mut reduced = Vec::with_capacity(count);
        for launched in launched {
            let launched = launched.ok_or_else(|| {
                TrainError::Config("a pipeline chunk ran no backward this step".into())
            })?;
            reduced.push(launched.finish());
        }
        let mut squares: Option<Tensor<B::InnerBackend, 1>> = None;
        for ((optimizer, flat), (roles, layout)) in optimizers
            .iter()
            .zip(&reduced)
            .zip(roles.iter().zip(&layouts))
        {
            let sharded = layout.groups.iter().any(|group| group.shard.is_some());
            let by_id: HashMap<ParamId, &ParamRole> = roles.iter().map(|r| (r.id, r)).collect();
            let part = optimizer.flat_sum_of_squares(flat, |id| {
                by_id
                    .get(&id)
                    .is_some_and(|role| counts_here(role, ctx, sharded))
            });
            squares = match (squares, part) {
                (Some(sum), Some(part)) => Some(sum + part),
                (sum, part) => sum.or(part),
            };
        }
        // the world's Σg² (tp, dp×cp and pp together are every rank) and the clipping it asks
        let world = [&ctx.tp, &ctx.dp_cp, &ctx.pp];
        let squares = summed_over(squares, world, device);
        let device_clip = exact_device_clip_coefficient(&squares, context.clip_grad);
        // the next forward's waits, if one did not reach them all, before the parameters change
        prefetch::settle();
        let chunks = std::mem::take(rank_chunks);
        let gather_before = self.gather_before.as_ref();
        *rank_chunks = chunks
            .into_iter()
            .zip(optimizers.iter_mut().zip(reduced))
            .enumerate()
            .map(|(index, (chunk, (optimizer, flat)))| {
                let before = |group: &Group| {
                    gather_before
                        .and_then(|chunks| chunks[index].get(group.bucket).copied().flatten())
                };
                optimizer.step_flat(
                    chunk,
                    flat,
                    context.lr,
                    Some(device_clip.clone()),
                    |group, part| gathered(ctx, group, part, before(group)),
                )
            })
            .collect();
        let decode = reported_stats(ctx.dp_cp_size(), microbatches.len(), context);
        update_expert_bias(rank_chunks, ctx, outcome.loads)?;
        let values = DeviceValues::new(vec![losses, squares]);
        // An offloaded update has waited for the step's device work already
        // (`AdamW::updates_on_host`).
        let on_host = self.optimizers.iter().any(AdamW::updates_on_host);
        let waits = B::device_resident_step() && !on_host;
        Ok(PendingStats::later(Some(values), decode, waits))
    }
}

/// DeepSeek-V3's bias update from the loads of every data-parallel rank's tokens.
fn update_expert_bias<B: AutodiffBackend>(
    chunks: &mut Vec<GptModel<B>>,
    ctx: &ParallelContext,
    loads: Vec<ExpertLoads>,
) -> Result<(), TrainError> {
    if chunks.iter().all(|c| c.expert_biases().is_empty()) {
        return Ok(());
    }
    let taken = std::mem::take(chunks);
    let mut updated = Vec::with_capacity(taken.len());
    for (chunk, mut loads) in taken.into_iter().zip(loads) {
        if !chunk.expert_biases().is_empty() {
            sum_loads(&ctx.dp_cp, &mut loads)?;
            updated.push(chunk.update_expert_bias(&mut loads)?);
        } else {
            updated.push(chunk);
        }
    }
    *chunks = updated;
    Ok(())
}

/// Every microbatch's objective and LM loss, as every rank reads them: the last stage's
/// `[losses…, lm losses…]` (f32) summed over the pipeline with every stage's MoE auxiliary
/// losses of the chunks before the last (which the one-rank objective holds too), gathered over
/// the data- and context-parallel ranks in rank order. Device collectives; the arithmetic that
/// makes one loss of them waits for the read ([`reported_stats`]), so it stays the host's f64.
fn stage_losses<I: ParallelOps>(
    ctx: &ParallelContext,
    losses: Vec<Tensor<I, 1>>,
    lm_losses: Vec<Tensor<I, 1>>,
    aux_losses: Vec<Option<Tensor<I, 1>>>,
    microbatches: usize,
    device: &I::Device,
) -> Result<Tensor<I, 1>, TrainError> {
    let f32 = |t: Tensor<I, 1>| t.cast(DType::F32);
    let (losses, lm_losses) = if ctx.is_last_stage() {
        if losses.len() != microbatches || lm_losses.len() != microbatches {
            return Err(TrainError::Config(format!(
                "the last pipeline stage computed {} losses for {microbatches} microbatches",
                losses.len()
            )));
        }
        (losses, lm_losses)
    } else {
        // the other stages add nothing to the last one's values (x + 0 is x, exactly) but
        // their auxiliary losses
        let zero = || Tensor::zeros([1], (device, DType::F32));
        (
            (0..microbatches).map(|_| zero()).collect(),
            (0..microbatches).map(|_| zero()).collect(),
        )
    };
    let objectives = losses
        .into_iter()
        .zip(aux_losses)
        .map(|(loss, aux)| match aux {
            Some(aux) => f32(loss) + f32(aux),
            None => f32(loss),
        });
    let mine = Tensor::cat(
        objectives.chain(lm_losses.into_iter().map(f32)).collect(),
        0,
    );
    let over_stages = summed_over(Some(mine), [&ctx.pp], device);
    if ctx.dp_cp.size() == 1 {
        return Ok(over_stages);
    }
    let gathered = I::all_gather_started(over_stages.into_primitive().tensor(), &ctx.dp_cp);
    Ok(Tensor::from_primitive(TensorPrimitive::Float(
        gathered.finish(),
    )))
}

/// What makes a step's statistics of its values as read (`[losses of every data × context rank
/// (see [`stage_losses`]), Σg²]`): each rank's mean over its microbatches in f64, their sum in
/// rank order divided by their count (the host reduction's arithmetic, which the thread and TCP
/// transports do in rank order), the norm, and the clipping coefficient the device computed
/// from it (the same f64 arithmetic, before its rounding to f32).
fn reported_stats(
    ranks: usize,
    microbatches: usize,
    context: StepContext,
) -> impl FnOnce(&[f32]) -> Result<StepStats, TrainError> {
    move |values| {
        let scale = 1.0 / microbatches as f64;
        let sum = |values: &[f32]| values.iter().fold(0.0, |sum, &v| sum + f64::from(v)) * scale;
        let per_rank = values[..2 * microbatches * ranks].chunks_exact(2 * microbatches);
        let mut means = per_rank.map(|rank| {
            let (losses, lm_losses) = rank.split_at(microbatches);
            [sum(losses), sum(lm_losses)]
        });
        let first = means.next().unwrap_or([f64::NAN; 2]);
        let [mut loss, mut lm_loss] = means.fold(first, |[a, b], [c, d]| [a + c, b + d]);
        if ranks > 1 {
            loss /= ranks as f64;
            lm_loss /= ranks as f64;
        }
        check_finite(loss, context.iteration, "the loss")?;
        let grad_norm = f64::from(values[2 * microbatches * ranks]).sqrt();
        check_finite(grad_norm, context.iteration, "the gradient norm")?;
        Ok(StepStats {
            loss,
            lm_loss,
            grad_norm,
            clip_coefficient: clip_coefficient(grad_norm, context.clip_grad),
            lr: context.lr,
        })
    }
}
