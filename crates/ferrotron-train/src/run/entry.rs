//! `train_rank`: the one entry of a training run on this process, whatever the layout: a rank
//! alone (`ParallelContext::single()`, one CPU or one GPU), one rank of a process world (TCP,
//! later NCCL) or, through `train_threads`, every rank as a thread. Each builds its
//! [`RankModel`] (the whole model when alone), resumes it, and runs the shared loop; only global
//! rank 0 writes metrics, JSONL, the progress display and the run folder.

use ferrotron_data::Tokenizer;
use ferrotron_parallel::{ParallelContext, ShardSpec};
use ferrotron_plan::Plan;

use crate::rank::RankModel;
use crate::rank::host::param_values;
use crate::run::cpu_threads::{process_threads, rank_pool, use_cpu_threads};
use crate::run::host_read::host_reads;
use crate::run::resume::{ResumeState, resume_source};
use crate::run::setup::RunSetup;
use crate::run::training_loop::{Lead, training_loop};
use crate::{RunOptions, RunSummary, TrainError};

/// Train `plan` as the rank `ctx` describes (its groups from the plan's rank grid;
/// `ParallelContext::single()` for a one-rank plan), reading data with `tokenizer` (the one the
/// plan's `data.tokenizer` names).
pub fn train_rank<B>(
    plan: &Plan,
    ctx: ParallelContext,
    tokenizer: &Tokenizer,
    options: &RunOptions,
    device: &B::Device,
) -> Result<RunSummary, TrainError>
where
    B: crate::TrainBackend,
{
    let rank = ctx.global_rank();
    let train = || {
        let setup = RunSetup::new(plan, tokenizer)?;
        train_prepared_rank::<B>(plan, ctx, options, &setup, device).map(|outcome| outcome.summary)
    };
    if B::device_resident_step() {
        // A device rank keeps its loop on this thread (see `cpu_threads.rs`).
        use_cpu_threads(plan);
        return train();
    }
    rank_pool(rank, process_threads(plan))?.install(train)
}

/// What a rank ends with: its summary and its final parameters under their global names.
#[derive(Debug, Clone)]
pub(crate) struct RankOutcome {
    #[cfg_attr(not(test), expect(dead_code, reason = "the equivalence tests read it"))]
    pub(crate) rank: u32,
    pub(crate) summary: RunSummary,
    /// Every local parameter with where it sits in the one-rank model.
    #[cfg_attr(not(test), expect(dead_code, reason = "the equivalence tests read it"))]
    pub(crate) params: Vec<(ShardSpec, Vec<f32>)>,
    /// The host reads of its loop (`crate::run::host_read`): steps, evaluations and saves.
    #[cfg_attr(not(test), expect(dead_code, reason = "the host-read tests read it"))]
    pub(crate) host_reads: u64,
}

/// The rank loop on an already prepared setup (shared by thread ranks of one process).
pub(crate) fn train_prepared_rank<B>(
    plan: &Plan,
    ctx: ParallelContext,
    options: &RunOptions,
    setup: &RunSetup,
    device: &B::Device,
) -> Result<RankOutcome, TrainError>
where
    B: crate::TrainBackend,
{
    check_context(plan, &ctx)?;
    let recipe = &setup.recipe;
    let parallel = &recipe.parallel;
    if parallel.distributed_optimizer && parallel.distributed_optimizer_instances > 1 {
        return Err(TrainError::Config(format!(
            "parallel.distributed_optimizer_instances = {} is not supported by this runtime yet; \
             use 1 (shard the optimizer over all data × context ranks)",
            parallel.distributed_optimizer_instances
        )));
    }
    let mut model = RankModel::<B>::new(plan, ctx.clone(), device)?;
    let mut state = ResumeState::fresh();
    let resumed = resume_source(&recipe.checkpoint, setup.store.as_ref())?;
    if let Some(checkpoint) = &resumed {
        checkpoint.check_compatible(&setup.shape, recipe.training.seed)?;
        model.load(checkpoint)?;
        state = checkpoint.resume_state();
    }
    let resumed_from = resumed.as_ref().map(|c| c.dir().to_path_buf());
    let rank = ctx.global_rank();
    let lead = if rank == 0 { Lead::Yes } else { Lead::No };
    let dp = (ctx.dp_rank() as u32, ctx.dp_size() as u32);
    let reads_before = host_reads();
    let summary = training_loop(
        plan,
        setup,
        options,
        state,
        resumed_from.as_deref(),
        lead,
        dp,
        &mut model,
    )?;
    let host_reads = host_reads() - reads_before;
    let mut params = Vec::new();
    for (chunk, roles) in model.chunks.iter().zip(&model.roles) {
        let mut values = param_values::<B, _>(chunk);
        for role in roles {
            if let Some(values) = values.remove(&role.id) {
                params.push((role.shard.clone(), values));
            }
        }
    }
    Ok(RankOutcome {
        rank,
        summary,
        params,
        host_reads,
    })
}

/// The groups must tile the plan's world: tp × dp·cp × pp ranks.
fn check_context(plan: &Plan, ctx: &ParallelContext) -> Result<(), TrainError> {
    let degrees = &plan.degrees;
    let expected = [
        ("tp", degrees.tp as usize, ctx.tp_size()),
        ("pp", degrees.pp as usize, ctx.pp_size()),
        ("cp", degrees.cp as usize, ctx.cp_size()),
        ("dp", degrees.dp as usize, ctx.dp_size()),
    ];
    let wrong: Vec<String> = expected
        .iter()
        .filter(|(_, plan, ctx)| plan != ctx)
        .map(|(name, plan, ctx)| format!("{name}: plan {plan}, groups {ctx}"))
        .collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(TrainError::Config(format!(
            "this rank's process groups do not match the plan ({})",
            wrong.join(", ")
        )))
    }
}
