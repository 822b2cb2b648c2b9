//! The CPU worker pools: where burn-flex's GEMMs and reductions and our CPU kernels
//! (`ferrotron-parallel`'s `flex` module) run. They all run on "the current rayon pool", so
//! sizing that pool is what `runtime.threads` means.
//!
//! A process running one rank uses rayon's global pool, sized by `runtime.threads` or by default
//! to the cores the process may use. Thread ranks of one process each get a pool of their own,
//! `runtime.threads` or an equal share of the cores: with one shared pool every rank's kernels
//! would queue behind the others' and a rank's work would run on whichever cores happened to be
//! free, and a pool per rank of every core would run `world × cores` threads.

use std::num::NonZeroUsize;

use ferrotron_plan::Plan;
use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::TrainError;

/// Size the process-wide pool to `runtime.threads`, once per process. The pool can be sized only
/// before its first use; a later request is reported and ignored.
pub(crate) fn use_cpu_threads(plan: &Plan) {
    let Some(threads) = plan.recipe.runtime.threads else {
        return;
    };
    if let Err(e) = ThreadPoolBuilder::new()
        .num_threads(threads as usize)
        .build_global()
    {
        tracing::warn!("runtime.threads = {threads} not applied: {e}");
    }
}

/// Workers per thread rank: `runtime.threads`, else the process's cores shared out evenly (at
/// least one each).
pub(crate) fn threads_per_rank(plan: &Plan, ranks: u32) -> usize {
    match plan.recipe.runtime.threads {
        Some(threads) => threads as usize,
        None => {
            let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
            (cores / ranks.max(1) as usize).max(1)
        }
    }
}

/// A pool of `threads` workers for thread rank `rank`; the rank's loop runs inside it
/// (`ThreadPool::install`), so every kernel it calls stays on its own workers.
pub(crate) fn rank_pool(rank: u32, threads: usize) -> Result<ThreadPool, TrainError> {
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("rank-{rank}-cpu-{i}"))
        .build()
        .map_err(|e| {
            TrainError::Config(format!(
                "rank {rank}: cannot start {threads} CPU workers: {e}"
            ))
        })
}
