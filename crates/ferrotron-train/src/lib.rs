//! The training runtime: the step (microbatches, global-norm clipping, AdamW), LR schedules,
//! atomic checkpoints and the loop that ties them to data, evaluation and telemetry.
//!
//! The step is a function of rank-local state (model, optimizer, the rank's microbatches) and
//! the model is built from a `Plan`, so the parallel layouts can add communication around the
//! same pieces without reshaping them. Randomness is re-seeded from `seed ^ iteration` before
//! every step: resuming needs nothing beyond the iteration, and CPU runs are bit-reproducible.

mod adamw;
mod backend;
mod backward;
pub mod checkpoint;
mod clip;
mod cpu_threads;
mod error;
mod eval_batches;
mod fault;
mod flat_adamw;
mod fp8;
mod host_read;
mod init;
mod lr_schedule;
mod offload;
mod parallel;
mod params;
mod pending;
pub mod precision;
mod replicas;
mod resume;
mod rng;
mod run_loop;
mod setup;
mod signal;
mod step;

pub use adamw::{AdamW, AdamWConfig};
pub use backend::TrainBackend;
pub use error::TrainError;
pub use fault::FaultInjection;
pub use parallel::{group_members, train_rank, train_threads};
pub use params::{NamedTensor, ParamEntry, load_named_tensors, named_tensors, param_entries};
pub use resume::{ResumeState, load_for_inference};
pub use run_loop::{RunOptions, RunSummary, StopReason};
pub use signal::StopFlag;
pub use step::{Microbatch, StepContext, StepStats, evaluate, train_step};

// Shared between the crate's modules, not part of its API.
pub(crate) use adamw::{EXP_AVG, EXP_AVG_SQ};
pub(crate) use clip::{clip_coefficient, global_grad_norm};
pub(crate) use lr_schedule::LrSchedule;
#[cfg(test)]
pub(crate) use parallel::train_threads_detailed;
pub(crate) use pending::PendingStats;

/// The CPU backend (burn-flex) used for inference and evaluation.
pub type CpuBackend = burn::backend::Flex;
/// The CPU backend with autodiff, for training.
pub type CpuTrainBackend = burn::backend::Autodiff<burn::backend::Flex>;
