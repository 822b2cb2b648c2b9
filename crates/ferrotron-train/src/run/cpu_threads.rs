//! The CPU worker pools: where burn-flex's GEMMs and reductions and our CPU kernels
//! (`ferrotron-ops`' `cpu` module) run. They all run on "the current rayon pool", so
//! sizing that pool is what `runtime.threads` means.
//!
//! Every CPU rank's loop runs inside its own pool (`ThreadPool::install`), so the thread that
//! drives the step is one of the pool's workers: a kernel it starts is pushed to its own queue
//! and the other workers steal from it, where a thread outside the pool injects the job and
//! sleeps on a latch until a worker finishes it (about 400 such wake-ups a quick-start step,
//! each tens of microseconds that no CPU profile shows). A process running one rank sizes its
//! pool by `runtime.threads`, else `RAYON_NUM_THREADS`, else the cores the process may use,
//! shared out among the processes of its machine when a launcher says how many there are
//! (`LOCAL_WORLD_SIZE`: `recipe run --nproc-per-node`, torchrun). Thread ranks of one process
//! each get a pool of their own, `runtime.threads` or an equal share of the cores: with one
//! shared pool every rank's kernels would queue behind the others' and a rank's work would run
//! on whichever cores happened to be free, and a pool per rank of every core would run
//! `world × cores` threads. A device (GPU) rank keeps its loop on its own thread and sizes the
//! process-wide pool alike.

use std::num::NonZeroUsize;

use ferrotron_plan::Plan;
use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::TrainError;

/// Size the process-wide pool of a device rank, whose loop stays on the calling thread (its
/// kernels run on the device; the pool serves host-side work), to [`process_threads`]. The pool
/// can be sized only before its first use; a later request is reported and ignored.
pub(crate) fn use_cpu_threads(plan: &Plan) {
    let threads = process_threads(plan);
    if let Err(e) = ThreadPoolBuilder::new().num_threads(threads).build_global() {
        tracing::warn!("{threads} CPU worker threads not applied: {e}");
    }
}

/// Workers of a process running one rank: `runtime.threads`, else `RAYON_NUM_THREADS`, else this
/// process's share of the cores (`LOCAL_WORLD_SIZE` processes on this machine).
pub(crate) fn process_threads(plan: &Plan) -> usize {
    if let Some(threads) = plan.recipe.runtime.threads {
        return threads as usize;
    }
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    match env("RAYON_NUM_THREADS").filter(|&n| n > 0) {
        Some(threads) => threads as usize,
        None => share_of_cores(cores(), env("LOCAL_WORLD_SIZE").unwrap_or(1)),
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

/// A pool of `threads` workers for rank `rank`; the rank's loop runs inside it
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
    use super::{rank_pool, share_of_cores};
    use crate::{AdamW, AdamWConfig, CpuTrainBackend, Microbatch, StepContext, train_step};
    use burn::tensor::backend::Backend;
    use ferrotron_model::{GptModel, ModelConfig};

    #[test]
    fn ranks_share_the_cores_and_each_gets_at_least_one() {
        assert_eq!(share_of_cores(16, 1), 16);
        assert_eq!(share_of_cores(16, 4), 4);
        assert_eq!(share_of_cores(16, 3), 5);
        assert_eq!(share_of_cores(2, 8), 1);
        assert_eq!(share_of_cores(8, 0), 8);
    }

    /// Three steps of a model whose vocabulary, rows and attention split into several tasks of
    /// the CPU kernels, on a pool of `threads` workers.
    fn steps_on(threads: usize) -> Vec<crate::StepStats> {
        type B = CpuTrainBackend;
        const SEQ: usize = 8;
        rank_pool(0, threads).expect("a pool").install(|| {
            let device = Default::default();
            <B as Backend>::seed(&device, 7);
            let section: ferrotron_recipe::Model = serde_json::from_value(serde_json::json!({
                "num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                "seq_length": SEQ, "vocab_size": 1100
            }))
            .expect("model section parses");
            let mut model: GptModel<B> = ModelConfig::from_model(&section, 1152)
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
            let mut optimizer = AdamW::new(config, model.no_weight_decay_params());
            (1..=3u64)
                .map(|iteration| {
                    let samples: Vec<Vec<u32>> = (0..9u64)
                        .map(|s| {
                            (0..=SEQ as u64)
                                .map(|t| ((iteration * 131 + s * 37 + t * 17) % 1100) as u32)
                                .collect()
                        })
                        .collect();
                    let batch = Microbatch::from_samples(&samples, SEQ).expect("samples");
                    let context = StepContext {
                        iteration,
                        seed: 3,
                        lr: 1e-2,
                        clip_grad: 0.5,
                    };
                    let (next, stats) =
                        train_step(model.clone(), &mut optimizer, &[batch], context, &device)
                            .expect("a finite step");
                    model = next;
                    stats
                })
                .collect()
        })
    }

    #[test]
    fn training_steps_do_not_depend_on_the_number_of_threads() {
        let one = steps_on(1);
        assert!(one[0].clip_coefficient < 1.0, "the test must clip");
        for threads in [2, 3] {
            assert_eq!(steps_on(threads), one, "{threads} threads");
        }
    }
}
