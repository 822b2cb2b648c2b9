//! The distributed runtime: one rank's share of a parallel training step (pipeline schedule,
//! gradient synchronisation, global-norm clipping, the ZeRO-1 optimizer) and the loop around it.
//!
//! Every piece is written against communicators, never against "how many ranks there are", so
//! any layout of groups runs the same code. A rank alone in its world (every group of size 1,
//! one chunk) is the exception: it steps its whole model with the one-rank step (`rank_model.rs`
//! says why), and that run is the reference the N-rank layouts are compared with, step by step.
//! Pure data parallelism of a dense model is the one-rank device step too, with its flat gradient
//! buffers averaged over the group on the device (`crate::replicas`).

mod device_exchange;
mod host;
mod pipeline;
mod plan_groups;
mod rank_checkpoint;
mod rank_loop;
mod rank_model;
pub(crate) mod schedule;
mod threads;

#[cfg(test)]
mod tests;

pub use plan_groups::group_members;
pub use rank_loop::train_rank;
pub use threads::train_threads;
#[cfg(test)]
pub(crate) use threads::train_threads_detailed;
