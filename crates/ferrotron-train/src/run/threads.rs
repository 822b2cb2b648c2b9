//! `train_threads`: every rank of the plan as a thread of this process
//! (`ferrotron_dist::World::run`), each running [`train_rank`](super::train_rank)'s loop inside a
//! tracing span that names its rank, so interleaved log lines say who wrote them. Data is opened
//! once and shared: thread ranks would otherwise race to build the same index caches.

use std::time::Duration;

use ferrotron_data::Tokenizer;
use ferrotron_dist::{CallLogs, ProcessGroups, World, WorldError};
use ferrotron_parallel::ParallelContext;
use ferrotron_plan::Plan;

use crate::error::comm_error;
use crate::rank::group_members;
use crate::run::cpu_threads::{rank_pool, threads_per_rank};
use crate::run::entry::{RankOutcome, train_prepared_rank};
use crate::run::setup::RunSetup;
use crate::{RunOptions, RunSummary, TrainError};

/// How long a thread rank waits in a collective or a pipeline receive. A peer legitimately
/// computes that long between two meetings (a pipeline stage waits for its neighbour's forwards,
/// everybody waits for rank 0's evaluation and checkpoint bookkeeping), so this is minutes, as
/// the process world's, not the seconds a stuck thread would deserve.
const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(300);

/// Train `plan` on `plan.world_size` thread ranks; returns rank 0's summary.
pub fn train_threads<B>(
    plan: &Plan,
    tokenizer: &Tokenizer,
    options: &RunOptions,
    device: &B::Device,
) -> Result<RunSummary, TrainError>
where
    B: crate::TrainBackend,
{
    let mut outcomes = train_threads_detailed::<B>(plan, tokenizer, options, device, None)?;
    if outcomes.is_empty() {
        return Err(TrainError::Config("the world has no ranks".into()));
    }
    Ok(outcomes.swap_remove(0).summary)
}

/// [`train_threads`], returning every rank's outcome (summary and final parameters with their
/// shard specs) in rank order: what equivalence tests compare with a one-rank run. With `logs`,
/// each rank's communicators record every call into its log (`ferrotron_dist::Recording`),
/// which the tests replay under NCCL's ordering rules.
pub(crate) fn train_threads_detailed<B>(
    plan: &Plan,
    tokenizer: &Tokenizer,
    options: &RunOptions,
    device: &B::Device,
    logs: Option<&CallLogs>,
) -> Result<Vec<RankOutcome>, TrainError>
where
    B: crate::TrainBackend,
{
    let setup = RunSetup::new(plan, tokenizer)?;
    let sequence_parallel = plan.recipe.parallel.sequence_parallel;
    let threads = threads_per_rank(plan, plan.world_size);
    World::new(plan.world_size)
        .with_timeout(COLLECTIVE_TIMEOUT)
        .run(|rank| {
            let span = tracing::info_span!("rank", rank = rank.rank());
            let members = group_members(plan, rank.rank(), rank.world_size() as usize)?;
            let failed = |e| comm_error("building this rank's process groups", e);
            let ctx = match logs {
                Some(logs) => {
                    let world = rank.recorded_world(logs);
                    let groups = ProcessGroups::new(&members, &world).map_err(failed)?;
                    ParallelContext::from_groups(groups, sequence_parallel)
                }
                None => {
                    let groups = rank.groups(&members).map_err(failed)?;
                    ParallelContext::from_groups(groups, sequence_parallel)
                }
            };
            rank_pool(rank.rank(), threads)?.install(|| {
                let _entered = span.enter();
                train_prepared_rank::<B>(plan, ctx, options, &setup, device)
            })
        })
        .map_err(world_error)
}

/// The failing rank's own error when it is one every rank raises alike (a non-finite loss or
/// norm: the CLI gives it its own exit), otherwise the world's message, which names the rank.
fn world_error(err: WorldError) -> TrainError {
    match err {
        WorldError::RankFailed { rank, source } => match source.downcast::<TrainError>() {
            Ok(train) if matches!(*train, TrainError::NonFinite { .. }) => *train,
            Ok(train) => TrainError::Config(format!("thread world: rank {rank} failed: {train}")),
            Err(other) => TrainError::Config(format!("thread world: rank {rank} failed: {other}")),
        },
        other => TrainError::Config(format!("thread world: {other}")),
    }
}
