//! The training runtime: the step (microbatches, global-norm clipping, AdamW), LR schedules,
//! atomic checkpoints and the loop that ties them to data, evaluation and telemetry.
//!
//! The step is a function of rank-local state (model, optimizer, the rank's microbatches) and
//! the model is built from a `Plan`, so the parallel layouts can add communication around the
//! same pieces without reshaping them. Randomness is re-seeded from `seed ^ iteration` before
//! every step: resuming needs nothing beyond the iteration, and CPU runs are bit-reproducible.

mod backend;
pub mod checkpoint;
mod error;
mod optim;
mod params;
pub mod precision;
mod rank;
mod rng;
mod run;
mod step;

#[cfg(test)]
mod tests;

pub use backend::TrainBackend;
pub use error::TrainError;
pub use optim::{AdamW, AdamWConfig};
pub use params::{NamedTensor, ParamEntry, load_named_tensors, named_tensors, param_entries};
pub use rank::group_members;
pub use run::{
    FaultInjection, ResumeState, RunOptions, RunSummary, StopFlag, StopReason, load_for_inference,
    train_rank, train_threads,
};
pub use step::{Microbatch, StepContext, StepStats, evaluate, train_step};

// Shared between the crate's modules, not part of its API.
pub(crate) use optim::adamw::{EXP_AVG, EXP_AVG_SQ};
pub(crate) use optim::lr_schedule::LrSchedule;
pub(crate) use run::pending::PendingStats;
#[cfg(test)]
pub(crate) use run::train_threads_detailed;
pub(crate) use step::clip::clip_coefficient;
#[cfg(test)]
pub(crate) use step::clip::per_tensor::global_grad_norm;

/// The CPU backend (burn-flex) used for inference and evaluation.
pub type CpuBackend = burn::backend::Flex;
/// The CPU backend with autodiff, for training.
pub type CpuTrainBackend = burn::backend::Autodiff<burn::backend::Flex>;
