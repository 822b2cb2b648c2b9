//! A run, from the caller's plan to its summary: the entry (`train_rank`, or every rank as a
//! thread with `train_threads`), what is prepared once per process (`setup.rs`: data,
//! schedule, checkpoint store), the resume point, the loop and what it needs beside the model
//! (evaluation batches, the queued steps' statistics, signals, injected faults, CPU threads).
//!
//! The run sees a rank only through [`training_loop::RankStep`], so the loop is the algorithm of
//! Megatron's `train()` — data, schedule, step, log, evaluate, save, stop — compiled once, not
//! once per backend; how a rank holds its model lives in `crate::rank`, what one step does in
//! `crate::step`.

pub(crate) mod cpu_threads;
pub(crate) mod entry;
pub(crate) mod eval_batches;
mod fault;
pub(crate) mod host_read;
pub(crate) mod pending;
pub(crate) mod resume;
pub(crate) mod setup;
mod signal;
pub(crate) mod threads;
pub(crate) mod training_loop;

pub use entry::train_rank;
pub use fault::FaultInjection;
pub use resume::{ResumeState, load_for_inference};
pub use signal::StopFlag;
pub use threads::train_threads;
#[cfg(test)]
pub(crate) use threads::train_threads_detailed;
pub use training_loop::{RunOptions, RunSummary, StopReason};
