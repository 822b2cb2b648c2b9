//! The CPU worker pools: where burn-flex's GEMMs and reductions and our CPU kernels
//! (`ferrotron-parallel`'s `flex` module) run. They all run on "the current rayon pool", so
//! sizing that pool is what `runtime.threads` means.
//!
//! A process running one rank uses rayon's global pool, sized by `runtime.threads` or by default
//! to the cores the process may use, shared out among the processes of its machine when a
//! launcher says how many there are (`LOCAL_WORLD_SIZE`: `recipe run --nproc-per-node`,
//! torchrun). Thread ranks of one process each get a pool of their own,
//! `runtime.threads` or an equal share of the cores: with one shared pool every rank's kernels
//! would queue behind the others' and a rank's work would run on whichever cores happened to be
//! free, and a pool per rank of every core would run `world × cores` threads.

use std::num::NonZeroUsize;

use ferrotron_plan::Plan;
use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::TrainError;

/// Size the process-wide pool, once per process: `runtime.threads`, else (unless
/// `RAYON_NUM_THREADS` says otherwise) this process's share of the cores when a launcher
/// started several on this machine. The pool can be sized only before its first use; a later
/// request is reported and ignored.
pub(crate) fn use_cpu_threads(plan: &Plan) {
    let threads = match plan.recipe.runtime.threads {
        Some(threads) => threads as usize,
        None => {
            let local = std::env::var("LOCAL_WORLD_SIZE").ok();
            let local = local.and_then(|n| n.parse::<u32>().ok()).unwrap_or(1);
            if local <= 1 || std::env::var_os("RAYON_NUM_THREADS").is_some() {
                return;
            }
            share_of_cores(cores(), local)
        }
    };
    if let Err(e) = ThreadPoolBuilder::new().num_threads(threads).build_global() {
        tracing::warn!("{threads} CPU worker threads not applied: {e}");
    }
}

/// Workers per thread rank: `runtime.threads`, else the process's cores shared out evenly.
pub(crate) fn threads_per_rank(plan: &Plan, ranks: u32) -> usize {
    match plan.recipe.runtime.threads {
        Some(threads) => threads as usize,
        None => share_of_cores(cores(), ranks),
    }
}

/// The cores this process may use.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// One of `ways` equal shares of `cores`, at least one.
fn share_of_cores(cores: usize, ways: u32) -> usize {
    (cores / ways.max(1) as usize).max(1)
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

#[cfg(test)]
mod tests {
    use super::share_of_cores;

    #[test]
    fn ranks_share_the_cores_and_each_gets_at_least_one() {
        assert_eq!(share_of_cores(16, 1), 16);
        assert_eq!(share_of_cores(16, 4), 4);
        assert_eq!(share_of_cores(16, 3), 5);
        assert_eq!(share_of_cores(2, 8), 1);
        assert_eq!(share_of_cores(8, 0), 8);
    }
}
