//! One rank's share of the model: its chunks cut from the seeded one-rank model, their
//! parameter roles, the optimizer state that goes with them, the pipeline schedule that runs
//! them, and the glue to checkpoints. A rank is written against communicators, never against
//! "how many ranks there are", so any layout of groups runs the same code; a rank alone in its
//! world (every group of size 1, one chunk) keeps the whole model and is the reference the
//! N-rank layouts are compared with, step by step.
//!
//! What a step does with these pieces (gradients, their exchange, clipping, the update) is
//! `crate::step`'s; this module decides which step a rank takes, once, when it is built.

mod checkpointing;
pub(crate) mod fp8;
pub(crate) mod host;
pub(crate) mod init;
mod model;
pub(crate) mod pipeline;
mod plan_groups;
pub(crate) mod schedule;

pub(crate) use model::RankModel;
pub use plan_groups::group_members;
